// A statically initialised prog array (libbpf fills slot 1 with tail_target at load time):
// `entry` tail-calls through it. tail_target counts in hits[1] and returns 42; entry counts
// in hits[0] and returns 7 only when the tail call falls through. `lazy` is autoload-off
// (`?`): libbpf neither loads nor attaches it unless asked, so it never counts hits[2].
#include <linux/types.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

__u64 hits[3];

int tail_target(void *ctx);

struct {
	__uint(type, BPF_MAP_TYPE_PROG_ARRAY);
	__uint(max_entries, 4);
	__type(key, __u32);
	__array(values, int (void *));
} jmp SEC(".maps") = {
	.values = { [1] = (void *)&tail_target },
};

SEC("uprobe")
int tail_target(void *ctx)
{
	__sync_fetch_and_add(&hits[1], 1);
	return 42;
}

SEC("uprobe")
int entry(void *ctx)
{
	__sync_fetch_and_add(&hits[0], 1);
	bpf_tail_call(ctx, &jmp, 1);
	return 7;
}

SEC("?uprobe/./workload:work")
int lazy(void *ctx)
{
	__sync_fetch_and_add(&hits[2], 1);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
