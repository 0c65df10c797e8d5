#include "common.h"
SEC("uprobe") int prog(struct pt_regs *ctx) {
	__u32 k = PT_REGS_PARM1(ctx);
	__u64 *v = bpf_map_lookup_elem(&hmap, &k);
	return *(volatile __u64 *)v;
}
