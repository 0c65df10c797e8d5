// The most common counting pattern of libbpf programs: a uprobe adds one to a per-CPU array
// slot (BPF_MAP_TYPE_PERCPU_ARRAY, bpf_map_lookup_elem, then `*v += 1`: no atomic needed, each
// CPU has its own slot). User space sums the slots over CPUs.
#include <linux/bpf.h>
#include <linux/ptrace.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} counts SEC(".maps");

SEC("uprobe")
int count_call(struct pt_regs *ctx)
{
	__u32 key = 0;
	__u64 *v = bpf_map_lookup_elem(&counts, &key);

	if (v)
		*v += 1;
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
