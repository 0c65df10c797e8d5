#include "common.h"
SEC("uprobe") int prog(struct pt_regs *ctx) {
	__u64 *e = bpf_ringbuf_reserve(&rb, 8, 0);
	if (!e) return 0;
	if (PT_REGS_PARM1(ctx) == 5) { bpf_ringbuf_discard(e, 0); return 1; }
	*e = 1;
	bpf_ringbuf_submit(e, 0);
	return 0;
}
