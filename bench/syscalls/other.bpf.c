// The system call tracepoint benchmark's other program: counts getpid() calls, so that the
// target's getppid() calls are made while a system call tracepoint is attached but have no
// program of their own.
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

long calls;

SEC("tracepoint/syscalls/sys_enter_getpid")
int on_getpid(void *ctx)
{
	__sync_fetch_and_add(&calls, 1);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
