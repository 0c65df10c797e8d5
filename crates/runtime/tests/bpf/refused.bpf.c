// An object userbpf must refuse clearly: a map type it lacks.
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

struct { __uint(type, BPF_MAP_TYPE_SOCKMAP); __uint(max_entries, 4); __type(key, __u32); __type(value, __u32); } socks SEC(".maps");

SEC("uprobe")
int user_side(void *ctx)
{
	__u32 k = 0;
	return bpf_map_lookup_elem(&socks, &k) != 0;
}

char LICENSE[] SEC("license") = "GPL";
