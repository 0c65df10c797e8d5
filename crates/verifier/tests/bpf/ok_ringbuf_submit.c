#include "common.h"
SEC("uprobe") int prog(struct pt_regs *ctx) {
	__u64 *e = bpf_ringbuf_reserve(&rb, 16, 0);
	if (!e) return 0;
	e[0] = PT_REGS_PARM1(ctx);
	e[1] = bpf_get_current_pid_tgid();
	bpf_ringbuf_submit(e, 0);
	return 0;
}
