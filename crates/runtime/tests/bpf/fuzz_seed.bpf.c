// Seeds of the verifier's fuzzer (tests/verify_fuzz.rs): small valid uprobe programs using
// what the verifier tracks (context reads, stack buffers, map lookups with null checks, hash
// updates, ring buffer records, bounded loops, helper memory arguments, a local function), so
// that their mutants reach every part of it.
#include <linux/bpf.h>
#include <linux/ptrace.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 4);
	__type(key, __u32);
	__type(value, __u64[4]);
} arr SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 64);
	__type(key, __u64);
	__type(value, __u64);
} counts SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 4096);
} events SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} pc SEC(".maps");

SEC("uprobe")
int BPF_KPROBE(index_value, unsigned long i, unsigned long v)
{
	__u32 k = i & 3;
	__u64 *slot = bpf_map_lookup_elem(&arr, &k);
	if (!slot)
		return 0;
	slot[v & 3] += v;
	return slot[0] > 10;
}

SEC("uprobe")
int BPF_KPROBE(count_arg, unsigned long a)
{
	__u64 key = a & 63, one = 1;
	__u64 *c = bpf_map_lookup_elem(&counts, &key);
	if (c) {
		__sync_fetch_and_add(c, 1);
		return 1;
	}
	bpf_map_update_elem(&counts, &key, &one, BPF_NOEXIST);
	return 0;
}

struct event {
	__u64 pid;
	__u64 arg;
	char comm[16];
};

SEC("uprobe")
int BPF_KPROBE(emit, unsigned long a)
{
	struct event *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (!e)
		return 0;
	e->pid = bpf_get_current_pid_tgid() >> 32;
	e->arg = a;
	bpf_get_current_comm(e->comm, sizeof(e->comm));
	if (a & 1)
		bpf_ringbuf_discard(e, 0);
	else
		bpf_ringbuf_submit(e, 0);
	return 0;
}

SEC("uprobe")
int BPF_KPROBE(stack_loop, unsigned long n, unsigned long p)
{
	char buf[64] = {};
	__u64 sum = 0;
	bpf_probe_read_user(buf, sizeof(buf), (void *)p);
	for (int i = 0; i < 16 && i < (n & 31); i++)
		sum += buf[i * 4 % 64];
	return sum;
}

static __noinline __u64 mix(__u64 *x, __u64 y)
{
	return *x * 31 + y;
}

SEC("uprobe")
int BPF_KPROBE(calls, unsigned long a, unsigned long b)
{
	__u64 x = a;
	__u32 z = 0;
	__u64 *v = bpf_map_lookup_elem(&pc, &z);
	if (v)
		*v += mix(&x, b);
	return mix(&x, b) & 0xff;
}

SEC("uprobe")
int BPF_KPROBE(read_str, const char *s)
{
	char name[32];
	long n = bpf_probe_read_user_str(name, sizeof(name), s);
	if (n <= 0)
		return 0;
	__u64 key = name[0];
	__u64 *c = bpf_map_lookup_elem(&counts, &key);
	return c ? *c : n;
}

char LICENSE[] SEC("license") = "GPL";
