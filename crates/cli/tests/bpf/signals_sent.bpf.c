// Counts the signals a process sends to single threads (tgkill, tkill), for
// targets/setxid_target.c: glibc's setxid broadcast signals every other thread of the process,
// userbpf's own threads included, which the kernel's tracepoints would never see.
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

/* As /sys/kernel/tracing/events/syscalls/sys_enter_tgkill/format lays it out. */
struct enter_tgkill {
	__u64 common;
	int nr;
	long tgid;
	long pid;
	long sig;
};
struct enter_tkill {
	__u64 common;
	int nr;
	long pid;
	long sig;
};

struct counts {
	long tgkill, tgkill_setxid, tkill;
};
struct counts counts;

SEC("tracepoint/syscalls/sys_enter_tgkill")
int on_tgkill(struct enter_tgkill *ctx)
{
	__sync_fetch_and_add(&counts.tgkill, 1);
	if (ctx->sig == 33)
		__sync_fetch_and_add(&counts.tgkill_setxid, 1);
	return 0;
}

SEC("tracepoint/syscalls/sys_enter_tkill")
int on_tkill(struct enter_tkill *ctx)
{
	__sync_fetch_and_add(&counts.tkill, 1);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
