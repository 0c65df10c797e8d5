// bpf_override_return at entries and returns, and argument writes (crates/cli/tests/override.rs).
#include <linux/bpf.h>
#include <linux/ptrace.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

long hits;

// Odd arguments: the function does not run, the caller gets 1000 + x.
SEC("uprobe")
int odd(struct pt_regs *ctx)
{
	long x = PT_REGS_PARM1(ctx);
	__sync_fetch_and_add(&hits, 1);
	if (x & 1)
		bpf_override_return(ctx, 1000 + x);
	return 0;
}

// Every call: 5 (the first of two overrides on one function: it runs last, so its value wins).
SEC("uprobe")
int first(struct pt_regs *ctx)
{
	bpf_override_return(ctx, 5);
	return 0;
}

// Every call: 6 (attached after `first`: it runs first, and `first` overrides it).
SEC("uprobe")
int second(struct pt_regs *ctx)
{
	bpf_override_return(ctx, 6);
	return 0;
}

// ov_rec: the call with n == 5 returns 1000 without recursing.
SEC("uprobe")
int rec(struct pt_regs *ctx)
{
	if (PT_REGS_PARM1(ctx) == 5)
		bpf_override_return(ctx, 1000);
	return 0;
}

// fdatasync(999) returns 0 instead of failing with EBADF; other descriptors sync.
SEC("uprobe")
int sync_bad(struct pt_regs *ctx)
{
	if (PT_REGS_PARM1(ctx) == 999)
		bpf_override_return(ctx, 0);
	return 0;
}

// Return values that are multiples of 9 become 7777.
SEC("uretprobe")
int ret9(struct pt_regs *ctx)
{
	if (PT_REGS_RC(ctx) % 9 == 0)
		bpf_override_return(ctx, 7777);
	return 0;
}

// Counts the returns it sees and sums the values (after the entry's override).
long ret_seen, ret_sum;

SEC("uretprobe")
int ret_count(struct pt_regs *ctx)
{
	__sync_fetch_and_add(&ret_seen, 1);
	__sync_fetch_and_add(&ret_sum, PT_REGS_RC(ctx));
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
