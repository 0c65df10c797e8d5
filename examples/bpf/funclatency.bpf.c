// Latency of a user function as a log2 histogram of nanoseconds: a uprobe records the entry
// time per thread, a uretprobe computes the delta. Attach with
//   userbpf run funclatency.bpf.o --attach enter=FUNC --attach leave=FUNC -- CMD
#include <linux/bpf.h>
#include <linux/ptrace.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

struct { __uint(type, BPF_MAP_TYPE_HASH); __uint(max_entries, 1024); __type(key, __u32); __type(value, __u64); } start SEC(".maps");
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __uint(max_entries, 64); __type(key, __u32); __type(value, __u64); } latency_hist SEC(".maps");

__u64 calls;
__u64 total_ns;

SEC("uprobe")
int BPF_KPROBE(enter)
{
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	__u64 ts = bpf_ktime_get_ns();

	bpf_map_update_elem(&start, &tid, &ts, BPF_ANY);
	return 0;
}

SEC("uretprobe")
int BPF_KRETPROBE(leave, long ret)
{
	__u32 tid = (__u32)bpf_get_current_pid_tgid(), slot = 0;
	__u64 *ts = bpf_map_lookup_elem(&start, &tid), delta, *count;

	if (!ts)
		return 0;
	delta = bpf_ktime_get_ns() - *ts;
	bpf_map_delete_elem(&start, &tid);
	while (slot < 63 && (delta >> (slot + 1)))
		slot++;
	count = bpf_map_lookup_elem(&latency_hist, &slot);
	if (count)
		__sync_fetch_and_add(count, 1);
	__sync_fetch_and_add(&calls, 1);
	__sync_fetch_and_add(&total_ns, delta);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
