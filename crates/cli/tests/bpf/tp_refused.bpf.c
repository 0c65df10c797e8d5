// Tracepoints a process cannot have: a scheduler event (the kernel's under `run`; refused when
// forced into the process). A system call
// whose libc function is not a plain wrapper (clone) is attached (seen through system call
// dispatch), and getppid still counts.
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

long switches, clones, getppids;

SEC("tracepoint/sched/sched_switch")
int on_switch(void *ctx)
{
	switches++;
	return 0;
}

SEC("tracepoint/syscalls/sys_enter_clone")
int on_clone(void *ctx)
{
	clones++;
	return 0;
}

SEC("tracepoint/syscalls/sys_exit_getppid")
int on_getppid(void *ctx)
{
	getppids++;
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
