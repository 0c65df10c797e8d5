// BPF_F_MMAPABLE on a hash map: the kernel refuses the flag for that type.
#include <linux/types.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4);
	__type(key, __u32);
	__type(value, __u32);
	__uint(map_flags, BPF_F_MMAPABLE);
} mmap_hash SEC(".maps");

SEC("uprobe")
int p(void *ctx)
{
	__u32 zero = 0;
	return bpf_map_lookup_elem(&mmap_hash, &zero) != 0;
}

char LICENSE[] SEC("license") = "GPL";
