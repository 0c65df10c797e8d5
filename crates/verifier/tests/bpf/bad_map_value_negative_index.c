#include "common.h"
SEC("uprobe") int prog(struct pt_regs *ctx) {
	__u32 k = 0;
	struct big *v = bpf_map_lookup_elem(&bigarr, &k);
	int i = PT_REGS_PARM1(ctx);
	if (!v || i >= 8) return 0;
	return v->v[i];
}
