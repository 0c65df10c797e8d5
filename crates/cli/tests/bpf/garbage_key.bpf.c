// A uprobe program the verifier refuses: it gives map helpers garbage key and value
// pointers (its argument as an address). Run unverified, the helpers must distrust them.
#include <linux/bpf.h>
#include <linux/ptrace.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16);
	__type(key, __u64);
	__type(value, __u64);
} h SEC(".maps");

__u64 survived, found;

SEC("uprobe")
int BPF_KPROBE(garbage_key, unsigned long n)
{
	__u64 one = 1;
	if (bpf_map_lookup_elem(&h, (void *)n))
		__sync_fetch_and_add(&found, 1);
	bpf_map_update_elem(&h, (void *)n, &one, BPF_ANY);
	bpf_map_update_elem(&h, &one, (void *)n, BPF_ANY);
	bpf_map_delete_elem(&h, (void *)n);
	__sync_fetch_and_add(&survived, 1);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
