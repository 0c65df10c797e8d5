// System call tracepoints of targets/syscalls_target.c: per-syscall records (openat with
// its path and AT_FDCWD, its return value), raw_syscalls records, and raw tracepoints.
#include <linux/bpf.h>
#include <linux/ptrace.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

/* As /sys/kernel/tracing/events/syscalls/sys_enter_openat/format lays it out. */
struct enter_openat {
	__u64 common;
	int nr;
	long dfd;
	const char *filename;
	long flags;
	long mode;
};
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
	long null_opens, null_fdcwd, null_wronly, missing_opens, openat_nr;
	long exit_enoent, exit_fd;
	long last_ret, raw_writes5, getppid, raw_tp_write_ret5, raw_tp_orig_ax_ok;
};
struct counts counts;
int pending;

static __always_inline int is(const char *s, const char *lit, int n)
{
	for (int i = 0; i < n; i++)
		if (s[i] != lit[i])
			return 0;
	return 1;
}

SEC("tracepoint/syscalls/sys_enter_openat")
int enter_openat(struct enter_openat *ctx)
{
	char path[32] = {};
	bpf_probe_read_user_str(path, sizeof(path), ctx->filename);
	counts.openat_nr = ctx->nr;
	if (is(path, "/dev/null", 10)) {
		counts.null_opens++;
		/* The kernel records the register: glibc passes AT_FDCWD as a 32-bit value. */
		if ((int)ctx->dfd == -100)
			counts.null_fdcwd++;
		if (ctx->flags == 1)
			counts.null_wronly++;
		pending = 1;
	} else if (is(path, "/nonexistent/userbpf", 21)) {
		counts.missing_opens++;
		pending = 2;
	}
	return 0;
}

SEC("tracepoint/syscalls/sys_exit_openat")
int exit_openat(struct exit_common *ctx)
{
	if (pending == 2)
		counts.last_ret = ctx->ret;
	if (pending == 2 && ctx->ret == -2)
		counts.exit_enoent++;
	if (pending == 1 && ctx->ret >= 3)
		counts.exit_fd++;
	pending = 0;
	return 0;
}

SEC("tracepoint/raw_syscalls/sys_enter")
int raw_enter(struct raw_enter *ctx)
{
	if (ctx->id == 1 && ctx->args[2] == 5)
		counts.raw_writes5++;
	return 0;
}

SEC("tp/syscalls/sys_enter_getppid")
int enter_getppid(void *ctx)
{
	counts.getppid++;
	return 0;
}

SEC("raw_tracepoint/sys_exit")
int raw_exit(struct bpf_raw_tracepoint_args *ctx)
{
	struct pt_regs *regs = (struct pt_regs *)ctx->args[0];
	long orig_ax = 0;
	bpf_probe_read_kernel(&orig_ax, sizeof(orig_ax), &regs->orig_rax);
	if (orig_ax == 1 && (long)ctx->args[1] == 5) {
		counts.raw_tp_write_ret5++;
		counts.raw_tp_orig_ax_ok++;
	}
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
