#include "common.h"
SEC("uprobe") int prog(struct pt_regs *ctx) {
	__u32 k = 0;
	__u64 *v = bpf_map_lookup_elem(&arr, &k);
	if (!v) return 0;
	__sync_fetch_and_add(v, 2);
	__sync_fetch_and_or(v, 1);
	return __sync_val_compare_and_swap(v, 3, 4);
}
