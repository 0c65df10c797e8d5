// faulty_percpu.bpf.c with a helper call (the lean path of programs calling helpers): a uprobe
// that dereferences a null pointer on every tenth call and counts the others in a per-CPU array.
#include <linux/bpf.h>
#include <linux/ptrace.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} counted SEC(".maps");

static __always_inline int count(unsigned long n)
{
	__u32 key = 0;
	__u64 *v;

	if (n % 10 == 0)
		return *(volatile int *)(long)(n - n);  /* null dereference */
	v = bpf_map_lookup_elem(&counted, &key);
	if (v)
		*v += 1;
	return 0;
}

SEC("uprobe")
int BPF_KPROBE(faulty_helper, unsigned long n)
{
	/* A helper call: the run needs its context (bpf_get_smp_processor_id reads it). */
	if (bpf_get_smp_processor_id() > 100000)
		return 1;
	return count(n);
}

char LICENSE[] SEC("license") = "GPL";
