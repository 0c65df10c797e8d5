#include "common.h"
SEC("uprobe") int prog(struct pt_regs *ctx) {
	volatile __u64 *e = bpf_ringbuf_reserve(&rb, 8, 0);
	if (!e) return 0;
	bpf_ringbuf_submit((void *)e, 0);
	*e = 2;
	return 0;
}
