#include "common.h"
SEC("uprobe") int prog(struct pt_regs *ctx) {
	ctx->rax = 1;
	return 0;
}
