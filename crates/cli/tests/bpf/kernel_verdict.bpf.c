// A tracepoint program the kernel's verifier refuses (a map value read past its end), for
// tests/passthrough.rs: under `userbpf load --no-verify` (userbpf's own verifier off) the
// refusal still comes at BPF_PROG_LOAD, with the kernel's log in the loader's buffer.
#include <linux/bpf.h>
#include <linux/types.h>
#include <bpf/bpf_helpers.h>

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} m SEC(".maps");

SEC("tracepoint/task/task_rename")
int oob_value(void *ctx)
{
	__u32 k = 0;
	__u64 *v = bpf_map_lookup_elem(&m, &k);

	if (v)
		return (int)v[1];
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
