// A `.maps` attribute libbpf does not know.
#include <linux/types.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
	__uint(prealloc_pages, 4);
} odd_field SEC(".maps");

SEC("uprobe")
int p(void *ctx)
{
	__u32 zero = 0;
	return bpf_map_lookup_elem(&odd_field, &zero) != 0;
}
