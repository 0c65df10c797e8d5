// Counts the calls of a probed function per process (a helper call: its runs go through the
// run context, which keeps the last program of each thread).
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

__u64 calls, last_pid;

SEC("uprobe")
int last_prog(void *ctx)
{
	last_pid = bpf_get_current_pid_tgid() >> 32;
	__sync_fetch_and_add(&calls, 1);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
