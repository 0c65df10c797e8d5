// Legacy map definitions (struct bpf_map_def in SEC("maps")), as pre-BTF libbpf and
// iproute2 objects have them, with BPF_ANNOTATE_KV_PAIR-style key/value types.
#include <linux/types.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

struct bpf_map_def {
	unsigned int type;
	unsigned int key_size;
	unsigned int value_size;
	unsigned int max_entries;
	unsigned int map_flags;
};

struct pair {
	__u32 a;
	__u64 b;
};

struct bpf_map_def SEC("maps") legacy_hash = {
	.type = BPF_MAP_TYPE_HASH,
	.key_size = sizeof(__u32),
	.value_size = sizeof(struct pair),
	.max_entries = 64,
	.map_flags = 0,
};

struct bpf_map_def SEC("maps") legacy_array = {
	.type = BPF_MAP_TYPE_ARRAY,
	.key_size = sizeof(__u32),
	.value_size = sizeof(__u64),
	.max_entries = 8,
	.map_flags = BPF_F_MMAPABLE,
};

/* What BPF_ANNOTATE_KV_PAIR(legacy_hash, __u32, struct pair) expands to. */
struct ____btf_map_legacy_hash {
	__u32 key;
	struct pair value;
};
struct ____btf_map_legacy_hash __attribute__((section(".maps.legacy_hash"), used)) ____btf_map_legacy_hash = {};

SEC("tp/syscalls/sys_enter_write")
int legacy_user(void *ctx)
{
	__u32 k = 0;
	struct pair *p = bpf_map_lookup_elem(&legacy_hash, &k);
	__u64 *v = bpf_map_lookup_elem(&legacy_array, &k);
	return (p ? p->a : 0) + (v ? *v : 0);
}

char LICENSE[] SEC("license") = "GPL";
