#include "common.h"
const volatile int enabled = 0;
SEC("uprobe") int prog(struct pt_regs *ctx) {
	if (enabled)
		return *(volatile long *)((char *)ctx + 4096);
	return 0;
}
