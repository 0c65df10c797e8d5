// BTF-defined maps of several kinds, inner maps and initialised prog arrays / maps of maps.
#include <linux/types.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

struct key_t {
	__u32 pid;
	__u32 tid;
};

struct val_t {
	__u64 count;
	char comm[16];
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, struct key_t);
	__type(value, struct val_t);
	__uint(map_flags, BPF_F_NO_PREALLOC);
} by_type SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 4);
	__uint(key_size, sizeof(__u32));
	__uint(value_size, 24);
} by_size SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 5000);
} events SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 128);
	__type(key, __u64);
	__type(value, __u32);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__uint(numa_node, 1);
} pinned SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_BLOOM_FILTER);
	__uint(max_entries, 100);
	__type(value, __u32);
	__uint(map_extra, 3);
} bloom SEC(".maps");

struct inner_map {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 8);
	__type(key, __u32);
	__type(value, __u64);
} inner1 SEC(".maps"), inner2 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY_OF_MAPS);
	__uint(max_entries, 4);
	__type(key, __u32);
	__array(values, struct inner_map);
} outer SEC(".maps") = {
	.values = { [0] = &inner1, [2] = &inner2 },
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH_OF_MAPS);
	__uint(max_entries, 4);
	__type(key, __u32);
	__array(values, struct {
		__uint(type, BPF_MAP_TYPE_HASH);
		__uint(max_entries, 16);
		__type(key, __u32);
		__type(value, __u32);
	});
} outer_hash SEC(".maps");

int tail_a(void *ctx);
int tail_b(void *ctx);

struct {
	__uint(type, BPF_MAP_TYPE_PROG_ARRAY);
	__uint(max_entries, 8);
	__type(key, __u32);
	__array(values, int (void *));
} jumps SEC(".maps") = {
	.values = { [1] = (void *)&tail_a, [3] = (void *)&tail_b },
};

SEC("uprobe")
int tail_a(void *ctx)
{
	return 1;
}

SEC("uprobe")
int tail_b(void *ctx)
{
	return 2;
}

SEC("uprobe")
int use_maps(void *ctx)
{
	struct key_t k = { 1, 2 };
	struct val_t *v = bpf_map_lookup_elem(&by_type, &k);
	__u32 zero = 0;
	void *inner = bpf_map_lookup_elem(&outer, &zero);
	__u64 *p = bpf_map_lookup_elem(&by_size, &zero);
	bpf_ringbuf_output(&events, &zero, sizeof(zero), 0);
	bpf_map_lookup_elem(&pinned, &zero);
	bpf_map_push_elem(&bloom, &zero, 0);
	bpf_map_lookup_elem(&outer_hash, &zero);
	if (inner)
		bpf_map_lookup_elem(inner, &zero);
	bpf_tail_call(ctx, &jumps, 1);
	return v ? v->count : (p ? *p : 0);
}

char LICENSE[] SEC("license") = "GPL";
