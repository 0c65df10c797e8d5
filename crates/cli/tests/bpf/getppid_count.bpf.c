// Counts getppid's entries and returns (targets/syscalls_stress.c), from every thread at once.
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

long enter, exit_ok;

SEC("tp/syscalls/sys_enter_getppid")
int on_enter(void *ctx)
{
	__sync_fetch_and_add(&enter, 1);
	return 0;
}

struct exit_rec {
	__u64 common;
	long nr;
	long ret;
};

SEC("tp/syscalls/sys_exit_getppid")
int on_exit(struct exit_rec *ctx)
{
	if (ctx->ret > 0)
		__sync_fetch_and_add(&exit_ok, 1);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
