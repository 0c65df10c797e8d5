// The attach-pause benchmark: a counter on the target's work().
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

long hits;

SEC("uprobe")
int on_work(void *ctx)
{
	__sync_fetch_and_add(&hits, 1);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
