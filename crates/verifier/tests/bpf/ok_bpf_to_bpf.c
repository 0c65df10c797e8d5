#include "common.h"
static __attribute__((noinline)) __u64 add(__u64 *p, __u64 x) { *p += x; return *p; }
static __attribute__((noinline)) __u64 twice(__u64 x) { __u64 acc = 0; add(&acc, x); return add(&acc, x); }
SEC("uprobe") int prog(struct pt_regs *ctx) {
	return twice(PT_REGS_PARM1(ctx));
}
