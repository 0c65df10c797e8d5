// A kernel-only program (kprobe) beside a user-space one.
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

SEC("uprobe")
int user_side(void *ctx)
{
	return 0;
}

SEC("kprobe/do_sys_open")
int kernel_side(void *ctx)
{
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
