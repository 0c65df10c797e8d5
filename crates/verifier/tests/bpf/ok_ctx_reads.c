#include "common.h"
SEC("uprobe") int prog(struct pt_regs *ctx) {
	return PT_REGS_PARM1(ctx) + PT_REGS_PARM2(ctx) + PT_REGS_PARM3(ctx) + PT_REGS_PARM4(ctx) + PT_REGS_PARM5(ctx) + PT_REGS_RC(ctx) + PT_REGS_SP(ctx) + PT_REGS_IP(ctx) + ctx->ss;
}
