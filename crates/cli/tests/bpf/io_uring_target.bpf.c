// userbpf's io_uring helpers in a real target (crates/cli/tests/io_uring.rs): on every call
// of work(), operations that must fail, each counted by the errno it returned.
#include <linux/bpf.h>
#include <linux/ptrace.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <userbpf/helpers.h>

#define EBADF 9
#define EFAULT 14
#define EINVAL 22

__u64 calls, ebadf_sync, ebadf_write, efault, einval, idle, other;

SEC("uprobe")
int BPF_KPROBE(probe)
{
	char data[8] = "payload";
	long err;

	calls++;
	// A descriptor that is not open: submitted, then -EBADF from the wait.
	if (bpf_io_uring_fdatasync(-1) == 0 && bpf_io_uring_wait(1) == -EBADF)
		ebadf_sync++;
	else
		other++;
	if (bpf_io_uring_write(1000000, data, sizeof(data), 0) == 0 && bpf_io_uring_wait(1) == -EBADF)
		ebadf_write++;
	else
		other++;
	// An unreadable buffer: -EFAULT at once, nothing submitted.
	if (bpf_io_uring_write(1, (void *)8, 8, 0) == -EFAULT)
		efault++;
	else
		other++;
	// fsync of a pipe (the target's stdout under the test): -EINVAL.
	err = bpf_io_uring_fsync(1);
	if (err == 0 && bpf_io_uring_wait(1) == -EINVAL)
		einval++;
	else
		other++;
	// Nothing left in flight.
	if (bpf_io_uring_wait(1) == -EINVAL)
		idle++;
	else
		other++;
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
