// Like faulty.bpf.c, on the probe paths of programs using per-CPU arrays: a uprobe that
// dereferences a null pointer on every tenth call and counts the others in a per-CPU array,
// calling no helper (its lookup is inlined: the JIT's claiming entry). faulty_helper.bpf.c
// is the same with a helper call.
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
int BPF_KPROBE(faulty_percpu, unsigned long n)
{
	return count(n);
}

char LICENSE[] SEC("license") = "GPL";
