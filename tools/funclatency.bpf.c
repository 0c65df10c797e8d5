// `userbpf tool funclatency`: the latency of user functions as log2 histograms, as BCC's
// funclatency keeps them. One uprobe and one uretprobe per traced function; the link's
// cookie says which function it is and how to key the histogram (the front-end sets it):
//   bits 0-31   the function's index (the front-end's list of matched functions)
//   bit 32      key by function (one histogram per function; else 0: one combined)
//   bit 33      key by process (tgid), bit 34 by thread (tid)
//   bits 36-37  unit: 0 ns, 1 us, 2 ms
// Histograms keyed by function only (the default and -F) live in arrays (`slots`, indexed
// by function * 64 + slot, and `sums`), whose lookups the JIT inlines; those keyed by
// process or thread too in hash maps (`latency`, `totals`).
#include <linux/bpf.h>
#include <linux/ptrace.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

#define BY_FUNC (1ULL << 32)
#define BY_PID (1ULL << 33)
#define BY_TID (1ULL << 34)
#define UNIT_SHIFT 36

struct start_key {
	__u32 tid;
	__u32 func;
};

struct hist_key {
	__u32 func;
	__u32 pid;
	__u32 slot;
	__u32 pad;
};

struct total_key {
	__u32 func;
	__u32 pid;
};

struct total {
	__u64 count;
	__u64 sum;
};

#define MAX_FUNCS 1024
#define SLOTS 64

struct { __uint(type, BPF_MAP_TYPE_HASH); __uint(max_entries, 16384); __type(key, struct start_key); __type(value, __u64); } start SEC(".maps");
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __uint(max_entries, MAX_FUNCS * SLOTS); __type(key, __u32); __type(value, __u64); } slots SEC(".maps");
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __uint(max_entries, MAX_FUNCS); __type(key, __u32); __type(value, struct total); } sums SEC(".maps");
struct { __uint(type, BPF_MAP_TYPE_HASH); __uint(max_entries, 65536); __type(key, struct hist_key); __type(value, __u64); } latency SEC(".maps");
struct { __uint(type, BPF_MAP_TYPE_HASH); __uint(max_entries, 16384); __type(key, struct total_key); __type(value, struct total); } totals SEC(".maps");

struct stats {
	__u64 unmatched;	// returns seen without their entry (probe attached mid-call)
	__u64 dropped;		// entries that could not be recorded (the start table is full)
} stats;

SEC("uprobe")
int entry(struct pt_regs *ctx)
{
	__u64 cookie = bpf_get_attach_cookie(ctx);
	struct start_key k = { .tid = (__u32)bpf_get_current_pid_tgid(), .func = (__u32)cookie };
	__u64 ts = bpf_ktime_get_ns();

	if (bpf_map_update_elem(&start, &k, &ts, BPF_ANY))
		__sync_fetch_and_add(&stats.dropped, 1);
	return 0;
}

static __always_inline void add_u64(void *map, void *key, __u64 v)
{
	__u64 *c = bpf_map_lookup_elem(map, key);

	if (c) {
		__sync_fetch_and_add(c, v);
		return;
	}
	if (bpf_map_update_elem(map, key, &v, BPF_NOEXIST) == 0)
		return;
	c = bpf_map_lookup_elem(map, key);	// another thread inserted it first
	if (c)
		__sync_fetch_and_add(c, v);
}

SEC("uretprobe")
int leave(struct pt_regs *ctx)
{
	__u64 cookie = bpf_get_attach_cookie(ctx), id = bpf_get_current_pid_tgid(), delta, *ts;
	struct start_key k = { .tid = (__u32)id, .func = (__u32)cookie };
	struct hist_key hk = {};
	struct total_key tk = {};
	struct total *t;
	__u32 unit = (cookie >> UNIT_SHIFT) & 3, slot = 0;

	ts = bpf_map_lookup_elem(&start, &k);
	if (!ts) {
		__sync_fetch_and_add(&stats.unmatched, 1);
		return 0;
	}
	delta = bpf_ktime_get_ns() - *ts;
	bpf_map_delete_elem(&start, &k);
	if (unit == 1)
		delta /= 1000;
	else if (unit == 2)
		delta /= 1000000;
	while (slot < 63 && (delta >> (slot + 1)))
		slot++;
	if (!(cookie & (BY_PID | BY_TID))) {
		__u32 func = (cookie & BY_FUNC) ? (__u32)cookie % MAX_FUNCS : 0, i = func * SLOTS + slot;
		__u64 *c = bpf_map_lookup_elem(&slots, &i);

		if (c)
			__sync_fetch_and_add(c, 1);
		t = bpf_map_lookup_elem(&sums, &func);
		if (t) {
			__sync_fetch_and_add(&t->count, 1);
			__sync_fetch_and_add(&t->sum, delta);
		}
		return 0;
	}
	if (cookie & BY_FUNC)
		hk.func = tk.func = (__u32)cookie;
	if (cookie & BY_TID)
		hk.pid = tk.pid = (__u32)id;
	else if (cookie & BY_PID)
		hk.pid = tk.pid = id >> 32;
	hk.slot = slot;
	add_u64(&latency, &hk, 1);
	t = bpf_map_lookup_elem(&totals, &tk);
	if (!t) {
		struct total zero = {};

		bpf_map_update_elem(&totals, &tk, &zero, BPF_NOEXIST);
		t = bpf_map_lookup_elem(&totals, &tk);
		if (!t)
			return 0;
	}
	__sync_fetch_and_add(&t->count, 1);
	__sync_fetch_and_add(&t->sum, delta);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
