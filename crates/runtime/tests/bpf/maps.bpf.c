// Programs exercising every map type from C, as libbpf programs use them. Each program
// returns 0 on success or the line number of the first check that failed.
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#define CHECK(c) do { if (!(c)) return __LINE__; } while (0)

struct { __uint(type, BPF_MAP_TYPE_HASH); __uint(max_entries, 64); __type(key, __u32); __type(value, __u64); } hash SEC(".maps");
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __uint(max_entries, 4); __type(key, __u32); __type(value, __u64); } array SEC(".maps");
struct { __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY); __uint(max_entries, 1); __type(key, __u32); __type(value, __u64); } pcpu SEC(".maps");
struct { __uint(type, BPF_MAP_TYPE_PERCPU_HASH); __uint(max_entries, 8); __type(key, __u32); __type(value, __u64); } pcpu_hash SEC(".maps");
struct { __uint(type, BPF_MAP_TYPE_LRU_HASH); __uint(max_entries, 4); __type(key, __u32); __type(value, __u64); } lru SEC(".maps");
struct { __uint(type, BPF_MAP_TYPE_LRU_PERCPU_HASH); __uint(max_entries, 4); __type(key, __u32); __type(value, __u64); } lru_pcpu SEC(".maps");
struct { __uint(type, BPF_MAP_TYPE_QUEUE); __uint(max_entries, 4); __type(value, __u32); } queue SEC(".maps");
struct { __uint(type, BPF_MAP_TYPE_STACK); __uint(max_entries, 4); __type(value, __u32); } stack SEC(".maps");
struct { __uint(type, BPF_MAP_TYPE_BLOOM_FILTER); __uint(max_entries, 16); __type(value, __u32); } bloom SEC(".maps");

struct lpm_key { __u32 prefixlen; __u8 addr[4]; };
struct { __uint(type, BPF_MAP_TYPE_LPM_TRIE); __uint(max_entries, 8); __type(key, struct lpm_key); __type(value, __u32); __uint(map_flags, BPF_F_NO_PREALLOC); } lpm SEC(".maps");

struct inner { __uint(type, BPF_MAP_TYPE_ARRAY); __uint(max_entries, 1); __type(key, __u32); __type(value, __u64); } inner_a SEC(".maps"), inner_b SEC(".maps");
struct { __uint(type, BPF_MAP_TYPE_ARRAY_OF_MAPS); __uint(max_entries, 2); __type(key, __u32); __array(values, struct inner); } outer SEC(".maps") = { .values = { &inner_a, &inner_b } };
struct { __uint(type, BPF_MAP_TYPE_HASH_OF_MAPS); __uint(max_entries, 2); __type(key, __u32); __array(values, struct inner); } outer_hash SEC(".maps") = { .values = { [1] = &inner_b } };

struct event { __u32 pid; char comm[16]; __u64 seq; };
struct { __uint(type, BPF_MAP_TYPE_RINGBUF); __uint(max_entries, 4096); } events SEC(".maps");
struct { __uint(type, BPF_MAP_TYPE_PERF_EVENT_ARRAY); __uint(key_size, 4); __uint(value_size, 4); } perf SEC(".maps");

__u64 counter = 5;               /* .data */
const volatile __u32 factor = 3; /* .rodata */
__u64 zeroed;                    /* .bss */

SEC("uprobe")
int hash_and_array(void *ctx)
{
	__u32 k = 7, missing = 8, idx = 2, big = 4;
	__u64 v = 100, *p;

	CHECK(bpf_map_update_elem(&hash, &k, &v, BPF_NOEXIST) == 0);
	CHECK(bpf_map_update_elem(&hash, &k, &v, BPF_NOEXIST) == -17);   /* EEXIST */
	CHECK(bpf_map_update_elem(&hash, &missing, &v, BPF_EXIST) == -2); /* ENOENT */
	p = bpf_map_lookup_elem(&hash, &k);
	CHECK(p && *p == 100);
	__sync_fetch_and_add(p, 5);
	p = bpf_map_lookup_elem(&hash, &k);
	CHECK(p && *p == 105);
	CHECK(bpf_map_lookup_elem(&hash, &missing) == 0);
	CHECK(bpf_map_delete_elem(&hash, &missing) == -2);

	p = bpf_map_lookup_elem(&array, &idx);
	CHECK(p && *p == 0);
	*p = 42;
	CHECK(bpf_map_lookup_elem(&array, &big) == 0);
	CHECK(bpf_map_update_elem(&array, &big, &v, 0) == -7);             /* E2BIG */
	CHECK(bpf_map_delete_elem(&array, &idx) == -22);                   /* EINVAL */
	return 0;
}

SEC("uprobe")
int percpu_and_lru(void *ctx)
{
	__u32 zero = 0, k;
	__u64 one = 1, *p;

	p = bpf_map_lookup_elem(&pcpu, &zero);
	CHECK(p);
	*p += 1;
	CHECK(bpf_map_update_elem(&pcpu_hash, &zero, &one, 0) == 0);
	p = bpf_map_lookup_elem(&pcpu_hash, &zero);
	CHECK(p && *p == 1);
	for (k = 0; k < 6; k++) /* more than max_entries: the LRU evicts */
		CHECK(bpf_map_update_elem(&lru, &k, &one, 0) == 0);
	k = 5;
	CHECK(bpf_map_lookup_elem(&lru, &k));
	CHECK(bpf_map_update_elem(&lru_pcpu, &k, &one, 0) == 0);
	return 0;
}

SEC("uprobe")
int queue_stack_bloom(void *ctx)
{
	__u32 v, i;

	for (i = 1; i <= 4; i++) {
		CHECK(bpf_map_push_elem(&queue, &i, 0) == 0);
		CHECK(bpf_map_push_elem(&stack, &i, 0) == 0);
	}
	i = 5;
	CHECK(bpf_map_push_elem(&queue, &i, 0) == -7);                     /* E2BIG when full */
	CHECK(bpf_map_push_elem(&queue, &i, BPF_EXIST) == 0);              /* overwrites the oldest */
	CHECK(bpf_map_peek_elem(&queue, &v) == 0 && v == 2);
	CHECK(bpf_map_pop_elem(&stack, &v) == 0 && v == 4);
	i = 99;
	CHECK(bpf_map_push_elem(&bloom, &i, 0) == 0);
	CHECK(bpf_map_peek_elem(&bloom, &i) == 0);
	return 0;
}

SEC("uprobe")
int lpm_and_map_in_map(void *ctx)
{
	struct lpm_key k = { .prefixlen = 16, .addr = { 10, 1, 0, 0 } };
	__u32 val = 16, *vp, zero = 0, one = 1;
	__u64 *ip;
	void *m;

	CHECK(bpf_map_update_elem(&lpm, &k, &val, 0) == 0);
	k.prefixlen = 24; k.addr[2] = 2; val = 24;
	CHECK(bpf_map_update_elem(&lpm, &k, &val, 0) == 0);
	k.prefixlen = 32; k.addr[3] = 9;
	vp = bpf_map_lookup_elem(&lpm, &k);
	CHECK(vp && *vp == 24);
	k.addr[2] = 3;
	vp = bpf_map_lookup_elem(&lpm, &k);
	CHECK(vp && *vp == 16);

	m = bpf_map_lookup_elem(&outer, &one);
	CHECK(m);
	ip = bpf_map_lookup_elem(m, &zero);
	CHECK(ip);
	*ip = 77;
	m = bpf_map_lookup_elem(&outer_hash, &one);
	CHECK(m);
	ip = bpf_map_lookup_elem(m, &zero);
	CHECK(ip && *ip == 77);   /* the same inner map, inner_b */
	return 0;
}

SEC("uprobe")
int globals(void *ctx)
{
	counter += factor;
	zeroed = counter * 2;
	return counter == 8 && zeroed == 16 ? 0 : __LINE__;
}

SEC("uprobe")
int ring_and_perf(void *ctx)
{
	struct event *e, ev = {};

	e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	CHECK(e);
	e->pid = bpf_get_current_pid_tgid() >> 32;
	bpf_get_current_comm(e->comm, sizeof(e->comm));
	e->seq = 1;
	bpf_ringbuf_submit(e, 0);
	ev.seq = 2;
	CHECK(bpf_ringbuf_output(&events, &ev, sizeof(ev), 0) == 0);
	CHECK(bpf_ringbuf_query(&events, BPF_RB_AVAIL_DATA) == 2 * (8 + sizeof(ev)));
	ev.seq = 3;
	CHECK(bpf_perf_event_output(ctx, &perf, BPF_F_CURRENT_CPU, &ev, sizeof(ev)) == 0);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
