#include "common.h"
SEC("uprobe") int prog(struct pt_regs *ctx) {
	__u32 k = 1;
	__u64 *v = bpf_map_lookup_elem(&arr, &k);
	__u64 *w = v;
	if (v) return *w;
	return 0;
}
