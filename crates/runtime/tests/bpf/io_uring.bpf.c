// userbpf's io_uring helpers called by name (include/userbpf/helpers.h), from a uprobe
// program run on a pt_regs holding (fd, buffer address, length).
#include <linux/bpf.h>
#include <linux/ptrace.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <userbpf/helpers.h>

long submit_err, wait_err;

// Writes PARM3 bytes at PARM2 to PARM1 at offset 0, then fdatasyncs it; returns the wait's
// result (0, or the first failure's negative errno).
SEC("uprobe")
int write_and_sync(struct pt_regs *ctx)
{
	int fd = PT_REGS_PARM1(ctx);
	long err;

	err = bpf_io_uring_write(fd, (void *)PT_REGS_PARM2(ctx), PT_REGS_PARM3(ctx), 0);
	if (err < 0) {
		submit_err = err;
		return err;
	}
	err = bpf_io_uring_fdatasync(fd);
	if (err < 0) {
		submit_err = err;
		bpf_io_uring_wait(1);
		return err;
	}
	wait_err = bpf_io_uring_wait(2);
	return wait_err;
}

// An fsync of PARM1; returns the wait's result.
SEC("uprobe")
int fsync_fd(struct pt_regs *ctx)
{
	long err = bpf_io_uring_fsync(PT_REGS_PARM1(ctx));

	if (err < 0)
		return err;
	return bpf_io_uring_wait(1);
}

// Waits with nothing in flight.
SEC("uprobe")
int wait_idle(struct pt_regs *ctx)
{
	return bpf_io_uring_wait(1);
}

// The same helpers in a program the kernel would run: refused.
SEC("kprobe/do_sys_open")
int kernel_side(struct pt_regs *ctx)
{
	return bpf_io_uring_fdatasync(1);
}

char LICENSE[] SEC("license") = "GPL";
