// A program whose license is not GPL-compatible: it may call map helpers, but not a
// GPL-only helper such as bpf_probe_read_user (the kernel's verifier refuses that too).
#include <linux/types.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} counter SEC(".maps");

SEC("uprobe")
int counts(void *ctx)
{
	__u32 zero = 0;
	__u64 *c = bpf_map_lookup_elem(&counter, &zero);
	if (c)
		*c += 1;
	return 0;
}

SEC("uprobe")
int reads(void *ctx)
{
	__u64 v = 0;
	bpf_probe_read_user(&v, sizeof(v), ctx);
	return v;
}

char LICENSE[] SEC("license") = "Proprietary";
