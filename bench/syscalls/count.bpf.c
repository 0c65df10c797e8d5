// The system call tracepoint benchmark's program: counts getppid() calls (the same program
// runs in the kernel through bpftrace's equivalent).
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

long calls;

SEC("tracepoint/syscalls/sys_enter_getppid")
int on_getppid(void *ctx)
{
	__sync_fetch_and_add(&calls, 1);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
