#include "common.h"
SEC("uprobe") int prog(struct pt_regs *ctx) {
	char buf[64] = {};
	long i = PT_REGS_PARM1(ctx);
	buf[i] = 1;
	__u32 k = 0;
	bpf_map_update_elem(&bigarr, &k, buf, 0);
	return 0;
}
