// `userbpf tool calls`: call counts per function, as BCC's funccount keeps them. One uprobe
// per matched function; the link's cookie is the function's index into a per-CPU array
// (one increment, no lock, no lost update).
#include <linux/bpf.h>
#include <linux/ptrace.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

#define MAX_FUNCS 4096

struct { __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY); __uint(max_entries, MAX_FUNCS); __type(key, __u32); __type(value, __u64); } counts SEC(".maps");

SEC("uprobe")
int count(struct pt_regs *ctx)
{
	__u32 idx = (__u32)bpf_get_attach_cookie(ctx);
	__u64 *c = bpf_map_lookup_elem(&counts, &idx);

	if (c)
		*c += 1;
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
