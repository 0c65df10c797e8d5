// Argument writes (a userbpf extension, crates/cli/tests/override.rs): ov_args(a, b) runs
// with a + 1 and b * 2.
#include <linux/bpf.h>
#include <linux/ptrace.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

SEC("uprobe.w")
int args(struct pt_regs *ctx)
{
	PT_REGS_PARM1(ctx) = PT_REGS_PARM1(ctx) + 1;
	PT_REGS_PARM2(ctx) = PT_REGS_PARM2(ctx) * 2;
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
