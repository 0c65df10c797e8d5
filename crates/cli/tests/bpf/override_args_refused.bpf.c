// The same argument write as override_args.bpf.c in a plain uprobe section: refused at load.
#include <linux/bpf.h>
#include <linux/ptrace.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

SEC("uprobe")
int args(struct pt_regs *ctx)
{
	PT_REGS_PARM1(ctx) = PT_REGS_PARM1(ctx) + 1;
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
