#include "common.h"
struct lctx { __u64 sum; };
static int cb(__u32 i, struct lctx *c) { c->sum += i; return 0; }
SEC("uprobe") int prog(struct pt_regs *ctx) {
	struct lctx c = { 0 };
	bpf_loop(10, cb, &c, 0);
	return c.sum;
}
