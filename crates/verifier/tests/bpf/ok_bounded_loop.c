#include "common.h"
SEC("uprobe") int prog(struct pt_regs *ctx) {
	__u64 sum = 0;
	for (int i = 0; i < 100; i++)
		sum += i * PT_REGS_PARM1(ctx);
	return sum;
}
