#include "common.h"
SEC("uprobe") int prog(struct pt_regs *ctx) {
	return *(volatile long *)((char *)ctx + 4096);
}
