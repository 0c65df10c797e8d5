// The agent-start benchmark: one uprobe, so one inline hook placed while the target starts.
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

long entries;

SEC("uprobe")
int on_entry(void *ctx)
{
	__sync_fetch_and_add(&entries, 1);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
