// User stacks at uprobes and a uretprobe (tests/ustack.rs): every stack each probe sees, by
// bpf_get_stackid, and the last one the leaf probe saw, by bpf_get_stack.
#include <linux/bpf.h>
#include <linux/ptrace.h>
#include <bpf/bpf_helpers.h>

// Stack ids are hashes of the frames, and libc's frames move with ASLR: room enough that two of
// the few distinct stacks seldom share a bucket (that gives EEXIST, as in the kernel).
#define DEPTH 5

#define STACKS(name)                                    \
	struct {                                        \
		__uint(type, BPF_MAP_TYPE_STACK_TRACE); \
		__uint(max_entries, 16384);             \
		__uint(key_size, 4);                    \
		__uint(value_size, DEPTH * 8);          \
	} name SEC(".maps")

STACKS(leaf_stacks);
STACKS(inner_stacks);
STACKS(ebr_stacks);
STACKS(ret_stacks);

__u64 leaf_last[DEPTH];
long errors;

static void take(struct pt_regs *ctx, void *map)
{
	if (bpf_get_stackid(ctx, map, BPF_F_USER_STACK) < 0)
		errors++;
}

SEC("uprobe")
int leaf(struct pt_regs *ctx)
{
	take(ctx, &leaf_stacks);
	if (bpf_get_stack(ctx, leaf_last, sizeof(leaf_last), BPF_F_USER_STACK) < 0)
		errors++;
	return 0;
}

SEC("uprobe")
int inner(struct pt_regs *ctx)
{
	take(ctx, &inner_stacks);
	return 0;
}

SEC("uprobe")
int ebr(struct pt_regs *ctx)
{
	take(ctx, &ebr_stacks);
	return 0;
}

SEC("uretprobe")
int leaf_ret(struct pt_regs *ctx)
{
	take(ctx, &ret_stacks);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
