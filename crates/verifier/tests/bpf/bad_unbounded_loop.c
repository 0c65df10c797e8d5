#include "common.h"
SEC("uprobe") int prog(struct pt_regs *ctx) {
	__u64 n = PT_REGS_PARM1(ctx), sum = 0;
	for (__u64 i = 0; i < n; i++)
		sum += i ^ PT_REGS_PARM2(ctx);
	return sum;
}
