// The override benchmark's programs (bench/override/bench.py), attached to bench/uprobe's
// target functions. -DALWAYS: every call is overridden (the function does not run, the caller
// gets 7). Without it the same program never overrides (its arguments are never negative):
// the cost of the probe and the program alone, the function running.
#include <linux/bpf.h>
#include <linux/ptrace.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

SEC("uprobe")
int ov(struct pt_regs *ctx)
{
#ifdef ALWAYS
	bpf_override_return(ctx, 7);
#else
	if ((long)PT_REGS_PARM1(ctx) < 0)
		bpf_override_return(ctx, 7);
#endif
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
