// A `const volatile` (.rodata) flag, 0, gates code the verifier refuses (a read past the end
// of the context): as in the kernel, where libbpf freezes .rodata, the frozen value is a
// constant, the branch is never taken and the program is accepted.
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

const volatile int debug_past_the_end = 0;

SEC("uprobe")
int rodata_gate(void *ctx)
{
	if (debug_past_the_end)
		return *(volatile long *)(ctx + 4096);
	return 7;
}

char LICENSE[] SEC("license") = "GPL";
