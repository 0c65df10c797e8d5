#include "common.h"
SEC("uprobe") int prog(struct pt_regs *ctx) {
	__u32 k = PT_REGS_PARM1(ctx);
	__u64 v = PT_REGS_PARM2(ctx);
	if (v == 0) return bpf_map_delete_elem(&hmap, &k);
	return bpf_map_update_elem(&hmap, &k, &v, BPF_NOEXIST);
}
