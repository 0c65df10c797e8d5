// A map pinned by name in an object whose load then fails (a GPL-only helper under a
// license that is not GPL-compatible): libbpf unpins what it pinned during the failed load.
#include <linux/types.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} doomed_pin SEC(".maps");

SEC("uprobe")
int p(void *ctx)
{
	__u32 zero = 0;
	__u64 *v = bpf_map_lookup_elem(&doomed_pin, &zero);
	if (v)
		bpf_probe_read_user(v, sizeof(*v), ctx);
	return 0;
}

char LICENSE[] SEC("license") = "Proprietary";
