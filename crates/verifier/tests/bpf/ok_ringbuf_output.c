#include "common.h"
SEC("uprobe") int prog(struct pt_regs *ctx) {
	__u64 d[2] = { PT_REGS_PARM1(ctx), PT_REGS_PARM2(ctx) };
	return bpf_ringbuf_output(&rb, d, sizeof(d), 0);
}
