#include "common.h"
SEC("uprobe") int prog(struct pt_regs *ctx) {
	return *(volatile long *)PT_REGS_PARM1(ctx);
}
