#include "common.h"
struct {
	__uint(type, BPF_MAP_TYPE_STACK_TRACE);
	__uint(max_entries, 16);
	__uint(key_size, sizeof(__u32));
	__uint(value_size, 127 * sizeof(__u64));
} stacks SEC(".maps");
SEC("uprobe") int prog(struct pt_regs *ctx) {
	__u32 k = 0;
	__u64 id = bpf_get_stackid(ctx, &stacks, BPF_F_USER_STACK);
	bpf_map_update_elem(&arr, &k, &id, 0);
	return 0;
}
