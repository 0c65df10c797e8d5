// What libbpf accepts in `.maps` and in code, used from a program: a map pinned by name
// (counting across loads), a bloom filter with map_extra (its number of hash functions),
// hash maps with BPF_F_NO_PREALLOC and BPF_F_NUMA_NODE (node 0), an mmapable array, a
// read-only-for-programs array, and weak and static subprograms. `features` returns 0, or
// the line of the failed check.
#include <linux/types.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#define CHECK(c) do { if (!(c)) return __LINE__; } while (0)

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} pinned_runs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_BLOOM_FILTER);
	__uint(max_entries, 64);
	__type(value, __u32);
	__uint(map_extra, 5);
} bloom SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16);
	__type(key, __u32);
	__type(value, __u32);
	__uint(map_flags, BPF_F_NO_PREALLOC | BPF_F_NUMA_NODE);
	__uint(numa_node, 0);
} sparse SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 2);
	__type(key, __u32);
	__type(value, __u64);
	__uint(map_flags, BPF_F_MMAPABLE);
} shared SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
	__uint(map_flags, BPF_F_RDONLY_PROG);
} settings SEC(".maps");

__weak __noinline int weak_twice(int x)
{
	return 2 * x;
}

static __noinline int static_plus_one(int x)
{
	return x + 1;
}

SEC("uprobe")
int features(void *ctx)
{
	__u32 zero = 0, one = 1, v = 7, seven = 7;

	__u64 *runs = bpf_map_lookup_elem(&pinned_runs, &zero);
	CHECK(runs);
	__sync_fetch_and_add(runs, 1);

	CHECK(bpf_map_push_elem(&bloom, &seven, 0) == 0);
	CHECK(bpf_map_peek_elem(&bloom, &seven) == 0);

	CHECK(bpf_map_update_elem(&sparse, &one, &v, BPF_ANY) == 0);
	__u32 *got = bpf_map_lookup_elem(&sparse, &one);
	CHECK(got && *got == 7);

	__u64 *s = bpf_map_lookup_elem(&shared, &one);
	CHECK(s);
	*s = 99;

	__u64 *conf = bpf_map_lookup_elem(&settings, &zero);
	CHECK(conf);

	CHECK(weak_twice(static_plus_one(20)) == 42);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
