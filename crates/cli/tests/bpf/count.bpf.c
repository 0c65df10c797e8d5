// Counts the hits of one probe (tests of libraries loaded later, fork and exec, wrappers).
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

long hits;

SEC("uprobe")
int hit(void *ctx)
{
	__sync_fetch_and_add(&hits, 1);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
