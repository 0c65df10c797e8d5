#include "common.h"
__u64 counter;
const volatile __u64 step = 3;
SEC("uprobe") int prog(struct pt_regs *ctx) {
	__sync_fetch_and_add(&counter, step);
	return 0;
}
