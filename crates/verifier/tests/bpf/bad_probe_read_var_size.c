#include "common.h"
SEC("uprobe") int prog(struct pt_regs *ctx) {
	char buf[64];
	bpf_probe_read_user(buf, PT_REGS_PARM2(ctx), (void *)PT_REGS_PARM1(ctx));
	__u32 k = 0;
	bpf_map_update_elem(&bigarr, &k, buf, 0);
	return 0;
}
