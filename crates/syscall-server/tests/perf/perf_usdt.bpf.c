// A libbpf USDT program (usdt.bpf.h: argument specs read through the attach cookie) for the
// semaphore-guarded probe app:guarded of perf_usdt_target.c.
#include <stdbool.h>
#include <linux/bpf.h>
#include <linux/ptrace.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/usdt.bpf.h>

struct {
	__u64 fired;
	__u64 sum;
} usdt_counters = {};

SEC("usdt")
int BPF_USDT(on_guarded, long n)
{
	__sync_fetch_and_add(&usdt_counters.fired, 1);
	__sync_fetch_and_add(&usdt_counters.sum, n);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
