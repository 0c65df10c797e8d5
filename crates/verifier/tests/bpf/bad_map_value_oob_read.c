#include "common.h"
SEC("uprobe") int prog(struct pt_regs *ctx) {
	__u32 k = 0;
	__u64 *v = bpf_map_lookup_elem(&arr, &k);
	if (!v) return 0;
	return v[1];
}
