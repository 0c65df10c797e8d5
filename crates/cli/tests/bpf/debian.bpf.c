// Probes on Debian's own programs (tests/debian.rs): a uprobe on fio's td_io_queue, python3's
// gc__start USDT probe (a semaphore-guarded probe with a stack argument), and dd's read and
// write system calls of one block size.
#include <stdbool.h>
#include <linux/bpf.h>
#include <linux/ptrace.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/usdt.bpf.h>

struct rw_args {
	__u64 common;
	long nr;
	long fd;
	const void *buf;
	long count;
};

long io_queued;
long py_gc_1;
long dd_reads, dd_writes;

SEC("uprobe")
int queue(void *ctx)
{
	__sync_fetch_and_add(&io_queued, 1);
	return 0;
}

SEC("usdt")
int BPF_USDT(py_gc, int generation)
{
	/* The script collects generation 1 only; start-up and shutdown collect 0 and 2. */
	if (generation == 1)
		__sync_fetch_and_add(&py_gc_1, 1);
	return 0;
}

SEC("tracepoint/syscalls/sys_enter_read")
int dd_read(struct rw_args *a)
{
	if (a->count == 1536)
		__sync_fetch_and_add(&dd_reads, 1);
	return 0;
}

SEC("tracepoint/syscalls/sys_enter_write")
int dd_write(struct rw_args *a)
{
	if (a->count == 1536)
		__sync_fetch_and_add(&dd_writes, 1);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
