#include "common.h"
SEC("uprobe") int prog(struct pt_regs *ctx) {
	__u32 k = 0;
	struct big *v = bpf_map_lookup_elem(&bigarr, &k);
	if (!v) return 0;
	long n = bpf_get_stack(ctx, v, sizeof(*v), BPF_F_USER_STACK);
	return n;
}
