// A map far beyond any sane size.
#include <linux/types.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1 << 30);
	__type(key, __u64);
	__type(value, __u64);
} huge SEC(".maps");

SEC("uprobe")
int p(void *ctx)
{
	__u64 k = 0;
	return bpf_map_lookup_elem(&huge, &k) != 0;
}
