#include "common.h"
SEC("uprobe") int prog(struct pt_regs *ctx) {
	__u32 k = 0;
	struct big *v = bpf_map_lookup_elem(&bigarr, &k);
	if (!v) return 0;
	for (int i = 0; i < 8; i++)
		v->v[i] = i;
	return 0;
}
