// Loaded by a libbpf loader through `userbpf load` (crates/cli/tests/override.rs, with
// -DTARGET="\"PATH\"" naming bt_target's copy): an override in a plain SEC("uprobe") and an
// argument write in userbpf's SEC("uprobe.w").
#include <linux/bpf.h>
#include <linux/ptrace.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

#ifndef TARGET
#define TARGET "bt_target"
#endif

unsigned long long add_hits, six_hits;

// add(105, 5) returns 1000000 instead of 110.
SEC("uprobe/" TARGET ":add")
int ov_add(struct pt_regs *ctx)
{
	__sync_fetch_and_add(&add_hits, 1);
	if (PT_REGS_PARM1(ctx) == 105)
		bpf_override_return(ctx, 1000000);
	return 0;
}

// six(a, ...) runs with a + 1 (each call adds 100000 to its result).
SEC("uprobe.w/" TARGET ":six")
int w_six(struct pt_regs *ctx)
{
	__sync_fetch_and_add(&six_hits, 1);
	PT_REGS_PARM1(ctx) = PT_REGS_PARM1(ctx) + 1;
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
