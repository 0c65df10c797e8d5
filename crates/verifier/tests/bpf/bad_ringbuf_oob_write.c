#include "common.h"
SEC("uprobe") int prog(struct pt_regs *ctx) {
	__u64 *e = bpf_ringbuf_reserve(&rb, 8, 0);
	if (!e) return 0;
	e[1] = 3;
	bpf_ringbuf_submit(e, 0);
	return 0;
}
