#include "common.h"
struct {
	__uint(type, BPF_MAP_TYPE_PROG_ARRAY);
	__uint(max_entries, 4);
	__type(key, __u32);
	__type(value, __u32);
} jt SEC(".maps");
SEC("uprobe") int prog(struct pt_regs *ctx) {
	bpf_tail_call(ctx, &jt, PT_REGS_PARM1(ctx) & 3);
	return 0;
}
