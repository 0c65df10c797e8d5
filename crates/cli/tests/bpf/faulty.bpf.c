// A uprobe that dereferences a null pointer on every tenth call, and counts the others.
#include <linux/bpf.h>
#include <linux/ptrace.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

__u64 counted;

SEC("uprobe")
int BPF_KPROBE(faulty, unsigned long n)
{
	if (n % 10 == 0)
		return *(volatile int *)(long)(n - n);  /* null dereference */
	__sync_fetch_and_add(&counted, 1);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
