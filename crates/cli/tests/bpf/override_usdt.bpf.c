// bpf_override_return on a USDT probe: refused at attach, as the kernel refuses an override
// anywhere but at a function's entry (crates/cli/tests/override.rs).
#include <linux/bpf.h>
#include <linux/ptrace.h>
#include <bpf/bpf_helpers.h>

// On a USDT probe: refused at attach (no function to skip).
SEC("usdt")
int usdt_ov(struct pt_regs *ctx)
{
	bpf_override_return(ctx, 1);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
