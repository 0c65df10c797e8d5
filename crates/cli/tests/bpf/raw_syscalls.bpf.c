// System call tracepoints seeing calls made outside libc (targets/raw_syscalls_target.c).
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

struct exit_common {
	__u64 common;
	long nr;
	long ret;
};
struct raw_enter {
	__u64 common;
	long id;
	unsigned long args[6];
};

struct counts {
	long enter, exit_ok, exit_bad, raw_getppid, raw_write_len;
};
struct counts counts;

SEC("tracepoint/syscalls/sys_enter_getppid")
int on_enter(void *ctx)
{
	__sync_fetch_and_add(&counts.enter, 1);
	return 0;
}

SEC("tracepoint/syscalls/sys_exit_getppid")
int on_exit(struct exit_common *ctx)
{
	if (ctx->ret > 1 && ctx->nr == 110)
		__sync_fetch_and_add(&counts.exit_ok, 1);
	else
		__sync_fetch_and_add(&counts.exit_bad, 1);
	return 0;
}

SEC("tracepoint/raw_syscalls/sys_enter")
int on_raw(struct raw_enter *ctx)
{
	if (ctx->id == 110)
		__sync_fetch_and_add(&counts.raw_getppid, 1);
	if (ctx->id == 1 && ctx->args[0] == 1 && ctx->args[2] == 10)
		__sync_fetch_and_add(&counts.raw_write_len, 1);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
