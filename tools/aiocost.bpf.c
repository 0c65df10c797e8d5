// `userbpf tool aiocost`: the time of each phase of the async-I/O benchmark
// (tools/aiocost/aiobench.c), from its USDT probes (provider `aiocost`) at phase boundaries:
//   phase(iface, phase)  a phase starts, and the iteration's previous phase ends
//   done(iface)          the iteration's last phase ends
// iface 0 io_uring, 1 native aio, 2 posix aio; phase 0 submit (starts the iteration), 1 poll,
// 2 clear. Per thread: the phase in progress, since when, and when the iteration started;
// each boundary adds the elapsed nanoseconds and one count to `cost[iface * 4 + phase]`,
// and `done` adds the whole iteration to `cost[iface * 4 + 3]`.
#include <stdbool.h>
#include <linux/bpf.h>
#include <linux/ptrace.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/usdt.bpf.h>

#define IFACES 3
#define SLOTS 4
#define ITER 3

struct cur {
	__u32 iface;
	__u32 phase;
	__u64 since;
	__u64 start;
};

struct cost {
	__u64 ns;
	__u64 count;
};

struct { __uint(type, BPF_MAP_TYPE_HASH); __uint(max_entries, 1024); __type(key, __u32); __type(value, struct cur); } current SEC(".maps");
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __uint(max_entries, IFACES * SLOTS); __type(key, __u32); __type(value, struct cost); } cost SEC(".maps");

static __always_inline void add(__u32 slot, __u64 ns)
{
	struct cost *c = bpf_map_lookup_elem(&cost, &slot);

	if (c) {
		__sync_fetch_and_add(&c->ns, ns);
		__sync_fetch_and_add(&c->count, 1);
	}
}

SEC("usdt")
int BPF_USDT(phase, int iface, int phase)
{
	__u64 now = bpf_ktime_get_ns();
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	struct cur *c = bpf_map_lookup_elem(&current, &tid), n = {};

	if (iface < 0 || iface >= IFACES || phase < 0 || phase >= ITER)
		return 0;
	if (phase == 0) {
		n.iface = iface;
		n.phase = 0;
		n.since = n.start = now;
		bpf_map_update_elem(&current, &tid, &n, BPF_ANY);
		return 0;
	}
	if (!c || c->iface != (__u32)iface)
		return 0;
	add(iface * SLOTS + c->phase, now - c->since);
	c->phase = phase;
	c->since = now;
	return 0;
}

SEC("usdt")
int BPF_USDT(done, int iface)
{
	__u64 now = bpf_ktime_get_ns();
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	struct cur *c = bpf_map_lookup_elem(&current, &tid);

	if (!c || iface < 0 || iface >= IFACES || c->iface != (__u32)iface)
		return 0;
	add(iface * SLOTS + c->phase, now - c->since);
	add(iface * SLOTS + ITER, now - c->start);
	bpf_map_delete_elem(&current, &tid);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
