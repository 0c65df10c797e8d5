// A uprobe program the kernel's verifier refuses: it writes past the end of a map value.
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} values SEC(".maps");

SEC("uprobe")
int past_the_end(void *ctx)
{
	__u32 k = 0;
	__u64 *v = bpf_map_lookup_elem(&values, &k);
	if (!v)
		return 0;
	v[1] = 7;
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
