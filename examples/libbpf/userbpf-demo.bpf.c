// A libbpf program with a skeleton (`bpftool gen skeleton`): a uprobe on a function taking
// (const char *name, int n, unsigned x, ...) sends each call through a BPF ring buffer, a
// uretprobe sends each return value through a perf buffer, and global variables count calls
// (.bss, read by user space through its mmap) and filter them (.rodata, set before loading).
#include <linux/bpf.h>
#include <linux/ptrace.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include "userbpf-demo.h"

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 64 * 1024);
} calls_rb SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERF_EVENT_ARRAY);
	__uint(key_size, sizeof(__u32));
	__uint(value_size, sizeof(__u32));
} returns_pb SEC(".maps");

/* Calls seen per thread, so that a return carries the sequence number of its call. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, __u32);
	__type(value, __u32);
} pending SEC(".maps");

/* Only calls whose second argument is at least min_n (set by user space before loading). */
const volatile long long min_n = 0;

__u64 calls;
__u64 returns;
__u64 dropped;

SEC("uprobe")
int BPF_KPROBE(on_call, const char *name, int n, unsigned int x)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tid = (__u32)id, seq;
	struct call_event *e;

	if (n < min_n)
		return 0;
	seq = __sync_fetch_and_add(&calls, 1);
	bpf_map_update_elem(&pending, &tid, &seq, BPF_ANY);
	e = bpf_ringbuf_reserve(&calls_rb, sizeof(*e), 0);
	if (!e) {
		__sync_fetch_and_add(&dropped, 1);
		return 0;
	}
	e->pid = id >> 32;
	e->seq = seq;
	e->arg1 = n;
	e->arg2 = x;
	bpf_get_current_comm(e->comm, sizeof(e->comm));
	if (bpf_probe_read_user_str(e->name, sizeof(e->name), name) < 0)
		e->name[0] = 0;
	bpf_ringbuf_submit(e, 0);
	return 0;
}

SEC("uretprobe")
int BPF_KRETPROBE(on_return, long long ret)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tid = (__u32)id, *seq = bpf_map_lookup_elem(&pending, &tid);
	struct ret_event e = {};

	if (!seq)
		return 0;
	e.pid = id >> 32;
	e.seq = *seq;
	e.ret = ret;
	bpf_map_delete_elem(&pending, &tid);
	__sync_fetch_and_add(&returns, 1);
	bpf_perf_event_output(ctx, &returns_pb, BPF_F_CURRENT_CPU, &e, sizeof(e));
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
