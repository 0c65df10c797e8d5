#include "common.h"
const volatile __u64 limit = 5;
SEC("uprobe") int prog(struct pt_regs *ctx) {
	*(volatile __u64 *)&limit = 6;
	return 0;
}
