// A NUMA node that is not online, with BPF_F_NUMA_NODE: the kernel refuses the map.
#include <linux/types.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4);
	__type(key, __u32);
	__type(value, __u32);
	__uint(map_flags, BPF_F_NUMA_NODE);
	__uint(numa_node, 4000);
} far_node SEC(".maps");

SEC("uprobe")
int p(void *ctx)
{
	__u32 zero = 0;
	return bpf_map_lookup_elem(&far_node, &zero) != 0;
}

char LICENSE[] SEC("license") = "GPL";
