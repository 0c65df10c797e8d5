#include "common.h"
SEC("uprobe") int prog(struct pt_regs *ctx) {
	__u32 k = 0;
	return bpf_map_lookup_elem(&rb, &k) != 0;
}
