// The name of features.bpf.c's pinned map with another size: libbpf refuses to reuse the pin.
#include <linux/types.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 4);
	__type(key, __u32);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} pinned_runs SEC(".maps");

SEC("uprobe")
int p(void *ctx)
{
	__u32 zero = 0;
	return bpf_map_lookup_elem(&pinned_runs, &zero) != 0;
}

char LICENSE[] SEC("license") = "GPL";
