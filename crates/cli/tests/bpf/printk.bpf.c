// Prints the first argument of each call with bpf_printk (tests of the session's trace pipe).
#include <linux/bpf.h>
#include <linux/ptrace.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

SEC("uprobe")
int BPF_KPROBE(say, long n)
{
	bpf_printk("work called with %ld", n);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
