// A prog array slot naming a `?` (no autoload) program: libbpf fails the load, since the
// program it should put in the slot is not loaded.
#include <linux/types.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

int lazy_target(void *ctx);

struct {
	__uint(type, BPF_MAP_TYPE_PROG_ARRAY);
	__uint(max_entries, 2);
	__type(key, __u32);
	__array(values, int (void *));
} lazy_jmp SEC(".maps") = {
	.values = { [0] = (void *)&lazy_target },
};

SEC("?uprobe")
int lazy_target(void *ctx)
{
	return 1;
}

SEC("uprobe")
int caller(void *ctx)
{
	bpf_tail_call(ctx, &lazy_jmp, 0);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
