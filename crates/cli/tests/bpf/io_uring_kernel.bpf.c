// A tracepoint only the kernel runs (task_rename) calling one of userbpf's io_uring helpers:
// userbpf run must refuse to hand it to the kernel, naming the helper.
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <userbpf/helpers.h>

SEC("tracepoint/task/task_rename")
int on_rename(void *ctx)
{
	bpf_io_uring_fdatasync(3);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
