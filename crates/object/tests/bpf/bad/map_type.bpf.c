// A map type no kernel defines.
#include <linux/types.h>
#include <bpf/bpf_helpers.h>

struct {
	__uint(type, 999);
	__uint(max_entries, 4);
	__type(key, __u32);
	__type(value, __u32);
} strange SEC(".maps");

SEC("uprobe")
int p(void *ctx)
{
	__u32 k = 0;
	return bpf_map_lookup_elem(&strange, &k) != 0;
}
