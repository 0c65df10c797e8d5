/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * userbpf's extensions for eBPF C programs, beside libbpf's <bpf/bpf_helpers.h>:
 *
 *     #include <bpf/bpf_helpers.h>
 *     #include <userbpf/helpers.h>
 *
 * (`make install` puts this file in $(PREFIX)/include/userbpf/; the Makefile builds the
 * bundled examples with -Iinclude.)
 *
 * Helpers with ids from USERBPF_HELPER_BASE, above the kernel's helper range, exist only in
 * userbpf: a program calling one is refused by the kernel's verifier, and userbpf refuses
 * to hand such a program to the kernel.
 *
 * Overrides (the kernel's own helper and context, userbpf's rules):
 * - bpf_override_return(ctx, value) (helper 58, declared by libbpf's <bpf/bpf_helper_defs.h>)
 *   works in uprobe programs on any user-space function: the function does not run and its
 *   caller gets *value*; in uretprobe programs it replaces the return value.
 * - Argument writes: a program in a section spelled SEC("uprobe.w/PATH:FUNC") (or
 *   SEC("uprobe.w") attached with --attach) may store into the argument registers of its
 *   context (PT_REGS_PARM1(ctx) = ...), and the function runs with the new values. Elsewhere
 *   such stores are refused at load, as the kernel refuses them. libbpf loaders register
 *   the section with <userbpf/libbpf.h>.
 *
 * io_uring helpers: each thread that calls one gets its own ring (32 entries), set up by its
 * first call. Submissions return 0 once the kernel has the operation, or a negative errno
 * (-EBUSY: 32 operations in flight on this thread; -E2BIG; -EFAULT; the ring setup's error).
 * The operation's own result (-EBADF, -EIO, ...) comes from bpf_io_uring_wait. A thread
 * waits only for its own operations; a thread that exits waits for its operations first.
 */
#ifndef __USERBPF_HELPERS_H
#define __USERBPF_HELPERS_H

#include <linux/types.h>

#define USERBPF_HELPER_BASE 1000

/* The largest write bpf_io_uring_write accepts, in bytes. */
#define USERBPF_IO_URING_MAX_WRITE (64 * 1024)

/*
 * bpf_io_uring_write
 *
 *	Submits a write of *len* bytes from *buf* to *fd* at *offset* (-1: at the file
 *	position, as write(2)). *buf* may be the program's memory or the target's (a probed
 *	function's argument): the helper copies the data, so it may change once the call
 *	returns. A write shorter than *len* reports -EIO at its wait.
 *
 * Returns
 *	0 once submitted, or a negative errno (-EFAULT: *buf* unreadable; -E2BIG: *len* above
 *	USERBPF_IO_URING_MAX_WRITE; -EBUSY: the ring is full).
 */
static long (* const bpf_io_uring_write)(int fd, const void *buf, __u32 len, __s64 offset) = (void *) 1000;

/*
 * bpf_io_uring_fsync
 *
 *	Submits an fsync(2) of *fd*.
 *
 * Returns
 *	0 once submitted, or a negative errno.
 */
static long (* const bpf_io_uring_fsync)(int fd) = (void *) 1001;

/*
 * bpf_io_uring_fdatasync
 *
 *	Submits an fdatasync(2) of *fd*: the data, and only the metadata needed to read it back.
 *
 * Returns
 *	0 once submitted, or a negative errno.
 */
static long (* const bpf_io_uring_fdatasync)(int fd) = (void *) 1002;

/*
 * bpf_io_uring_wait
 *
 *	Waits until *nr* of the calling thread's submitted operations have completed (in
 *	completion order) and reaps them. *nr* = 0 returns at once.
 *
 * Returns
 *	0 if they all succeeded, else the negative errno of the first that failed; -EINVAL if
 *	fewer than *nr* operations are in flight on this thread.
 */
static long (* const bpf_io_uring_wait)(__u32 nr) = (void *) 1003;

/*
 * bpf_io_uring_wait_timeout
 *
 *	As bpf_io_uring_wait, giving up after *timeout_ns* nanoseconds. The operations that
 *	completed by then are reaped (with *nr* = 1: none was, and it is still in flight). A
 *	timeout of 0 only reaps what has already completed.
 *
 * Returns
 *	As bpf_io_uring_wait, or -ETIME if fewer than *nr* completed in time.
 */
static long (* const bpf_io_uring_wait_timeout)(__u32 nr, __u64 timeout_ns) = (void *) 1004;

#endif /* __USERBPF_HELPERS_H */
