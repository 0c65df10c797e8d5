#include "common.h"
SEC("uprobe") int prog(struct pt_regs *ctx) {
	bpf_printk("x=%d y=%d", PT_REGS_PARM1(ctx), PT_REGS_PARM2(ctx));
	return 0;
}
