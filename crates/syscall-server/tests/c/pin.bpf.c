// A map pinned by name (libbpf's LIBBPF_PIN_BY_NAME: /sys/fs/bpf/pinned_runs), and a program
// that uses it so that the object has one.
#include <linux/bpf.h>
#include <linux/ptrace.h>
#include <bpf/bpf_helpers.h>

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} pinned_runs SEC(".maps");

SEC("uprobe")
int count_run(struct pt_regs *ctx)
{
	__u32 key = 0;
	__u64 *v = bpf_map_lookup_elem(&pinned_runs, &key);

	if (v)
		__sync_fetch_and_add(v, 1);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
