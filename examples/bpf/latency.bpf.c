// A latency histogram as a uprobe program would keep it, fed here by bpf_loop with
// pseudo-random durations: per-CPU counts in log2 slots, a struct-keyed hash of the slowest
// calls by caller, and a global counter. `userbpf prog run` prints the maps by their types.
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

enum kind { READ = 1, WRITE = 2 };

struct caller { __u32 pid; enum kind kind; char comm[16]; };

struct { __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY); __uint(max_entries, 32); __type(key, __u32); __type(value, __u64); } hist SEC(".maps");
struct { __uint(type, BPF_MAP_TYPE_HASH); __uint(max_entries, 16); __type(key, struct caller); __type(value, __u64); } slowest SEC(".maps");

__u64 calls;

static __u32 log2l(__u64 v)
{
	__u32 r = 0;
	while (v > 1 && r < 31) { v >>= 1; r++; }
	return r;
}

static int one_call(__u32 i, void *ctx)
{
	__u64 ns = (bpf_get_prandom_u32() & 0xffff) + 100, *slot;
	__u32 b = log2l(ns);
	struct caller c = { .pid = bpf_get_current_pid_tgid() >> 32, .kind = (i & 1) ? WRITE : READ };
	__u64 *max;

	slot = bpf_map_lookup_elem(&hist, &b);
	if (slot)
		*slot += 1;
	bpf_get_current_comm(c.comm, sizeof(c.comm));
	max = bpf_map_lookup_elem(&slowest, &c);
	if (!max)
		bpf_map_update_elem(&slowest, &c, &ns, BPF_NOEXIST);
	else if (*max < ns)
		*max = ns;
	__sync_fetch_and_add(&calls, 1);
	return 0;
}

SEC("uprobe")
int latency(void *ctx)
{
	return bpf_loop(1000, one_call, 0, 0);
}

char LICENSE[] SEC("license") = "GPL";
