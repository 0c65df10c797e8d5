#include "common.h"
SEC("uprobe") int prog(struct pt_regs *ctx) {
	__u32 k = PT_REGS_PARM1(ctx);
	__u64 *v = bpf_map_lookup_elem(&hmap, &k);
	if (!v) { __u64 one = 1; bpf_map_update_elem(&hmap, &k, &one, BPF_ANY); return 0; }
	__sync_fetch_and_add(v, 1);
	return 0;
}
