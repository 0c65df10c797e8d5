// The agent-start benchmark: a raw system call tracepoint, so every system call hook of the
// process is attached while the target starts.
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

long syscalls;

SEC("tracepoint/raw_syscalls/sys_enter")
int on_syscall(void *ctx)
{
	__sync_fetch_and_add(&syscalls, 1);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
