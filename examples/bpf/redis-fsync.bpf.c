// redis with `appendfsync always`, made fast without touching redis: the fdatasync redis
// issues on its append-only file after each event-loop batch becomes an io_uring fdatasync,
// with group commit. Run as
//   userbpf run target/bpf/redis-fsync.bpf.o -- redis-server --appendonly yes --appendfsync always ...
//
// The durability rule (the issue's): at most one fdatasync in flight; the next one starts
// only after the previous one completed; redis replies to a command only once an fdatasync
// covering its AOF write has been submitted. So a crash of the machine (or a power loss)
// loses at most the writes acknowledged since the last completed fdatasync: the writes
// covered by the one in flight, at most one command per connection (N for a client
// pipelining N). `everysec` loses up to a second's worth. A crash of redis alone loses
// nothing acknowledged: the data is in the page cache.
//
// How (redis 7.0's event loop: read and run commands, then beforeSleep(): write the AOF and
// fdatasync it in flushAppendOnlyFile(), then send the replies in
// handleClientsWithPendingWritesUsingThreads(), then epoll_wait):
// - flushAppendOnlyFile's fdatasync, when none is in flight: submitted to io_uring, and
//   bpf_override_return makes libc's fdatasync return 0 without running; redis replies.
// - ... while the previous one is still in flight: nothing is submitted (it would have to
//   wait), the fdatasync returns 0, and the replies are held: the reply-sending function is
//   skipped (bpf_override_return; its clients stay on redis's pending list, untouched) until
//   the previous fdatasync completed and a new one covering the held writes is submitted.
//   Meanwhile redis keeps reading and running the commands that arrive, so the next
//   fdatasync covers all of them: the batch is every client whose command arrived while the
//   previous fdatasync ran (instead of the few that were ready when redis last polled), and
//   the commands run while the disk works.
// - while replies are held, redis's epoll_wait must not sleep past the completion: the
//   program waits for the in-flight fdatasync there (at most HOLD_POLL_NS at a time, so
//   commands arriving meanwhile are read) and sets epoll_wait's timeout to 0 (an argument
//   write: SEC("uprobe.w/...")); the next beforeSleep submits and replies.
// - writeToClient (the reply path of a client whose earlier reply did not fit its socket) is
//   skipped while replies are held too, so no reply bypasses the hold.
// - before redis switches or closes its AOF descriptor (openNewIncrAofForAppend at a rewrite,
//   stopAppendOnly), the in-flight fdatasync is waited for and the held writes are synced.
//
// A failed fdatasync is reported to redis at its next fdatasync (-1), and redis stops, as it
// does when a plain fdatasync fails under `always`; the replies held meanwhile are never
// sent. Only the fdatasync called inside flushAppendOnlyFile() is patched (a uprobe and a
// uretprobe mark the thread inside it): the fsyncs of the AOF manifest, of RDB files and the
// one redis makes at shutdown (after flushing the AOF a last time) stay synchronous, so a
// clean shutdown leaves every acknowledged write on disk.
//
// The probes name Debian's redis-server (/usr/bin/redis-server); for another build, change
// the path in the sections below.
#include <linux/bpf.h>
#include <linux/ptrace.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <userbpf/helpers.h>

#define REDIS "/usr/bin/redis-server"
#define ETIME 62

// How long one wait in epoll_wait's probe lasts at most while replies are held (then redis
// polls its sockets without sleeping, reads what arrived, and comes back).
#ifndef HOLD_POLL_NS
#define HOLD_POLL_NS 0
#endif

// redis's main thread (the one running flushAppendOnlyFile), 0 until it first did.
__u32 main_tid;
// The thread inside flushAppendOnlyFile, 0 when none.
__u32 flushing_tid;
// An io_uring fdatasync submitted and not yet reaped.
__u32 in_flight;
// Replies held: AOF writes not yet covered by a submitted fdatasync, on this descriptor.
__u32 held;
__s32 held_fd;
// A reaped fdatasync failed: redis's next fdatasync returns -1.
__u32 pending_err;

// Counters, printed by `userbpf run` when redis exits.
__u64 patched;   // fdatasyncs handed to io_uring
__u64 waited;    // ... that found the previous one reaped only then (group commit)
__u64 deferred;  // fdatasync calls that found one in flight: replies held instead
__u64 held_skips;// reply-sending calls skipped while replies were held
__u64 failed;    // fdatasyncs that failed (reported to redis as -1)
__u64 fallback;  // submissions refused: the real fdatasync ran instead

static __always_inline int on_main(void)
{
	__u32 tid = (__u32)bpf_get_current_pid_tgid();

	return main_tid && tid == main_tid;
}

// Reaps the in-flight fdatasync if it completed (timeout_ns 0: without waiting). 1 if none
// is in flight any more.
static __always_inline int reap(__u64 timeout_ns, int block)
{
	long err;

	if (!in_flight)
		return 1;
	err = block ? bpf_io_uring_wait(1) : bpf_io_uring_wait_timeout(1, timeout_ns);
	if (err == -ETIME)
		return 0;
	in_flight = 0;
	if (err < 0) {
		failed++;
		pending_err = 1;
	}
	return 1;
}

// Submits an fdatasync of `fd`: 0, or -1 if io_uring refused it.
static __always_inline int submit(int fd)
{
	if (bpf_io_uring_fdatasync(fd) < 0) {
		fallback++;
		return -1;
	}
	in_flight = 1;
	patched++;
	return 0;
}

// Nothing in flight and writes held: submit the fdatasync covering them; the replies may go.
static __always_inline void release(void)
{
	if (held && !in_flight && !pending_err && submit(held_fd) == 0)
		held = 0;
}

SEC("uprobe/" REDIS ":flushAppendOnlyFile")
int BPF_KPROBE(flush_enter)
{
	flushing_tid = (__u32)bpf_get_current_pid_tgid();
	main_tid = flushing_tid;
	return 0;
}

SEC("uretprobe/" REDIS ":flushAppendOnlyFile")
int BPF_KRETPROBE(flush_leave)
{
	flushing_tid = 0;
	return 0;
}

SEC("uprobe/libc.so.6:fdatasync")
int BPF_KPROBE(fdatasync_enter, int fd)
{
	if ((__u32)bpf_get_current_pid_tgid() != flushing_tid)
		return 0;
	if (in_flight) {
		if (!reap(0, 0)) {
			// The previous one is still running: hold the replies, submit later.
			held = 1;
			held_fd = fd;
			deferred++;
			bpf_override_return(ctx, 0);
			return 0;
		}
		waited++;
	}
	if (pending_err) {
		// Redis stops; the held replies are never sent.
		pending_err = 0;
		bpf_override_return(ctx, -1);
		return 0;
	}
	if (submit(fd) < 0) {
		// The real fdatasync runs, after the previous held writes' (same descriptor).
		held = 0;
		return 0;
	}
	held = 0;
	bpf_override_return(ctx, 0);
	return 0;
}

SEC("uprobe/" REDIS ":handleClientsWithPendingWritesUsingThreads")
int BPF_KPROBE(replies_enter)
{
	if (!held || !on_main())
		return 0;
	reap(0, 0);
	release();
	if (held) {
		held_skips++;
		bpf_override_return(ctx, 0);
	}
	return 0;
}

SEC("uprobe/" REDIS ":writeToClient")
int BPF_KPROBE(write_client_enter)
{
	// C_OK (0): nothing written yet; the client's write handler stays installed.
	if (held && on_main())
		bpf_override_return(ctx, 0);
	return 0;
}

SEC("uprobe.w/libc.so.6:epoll_wait")
int BPF_KPROBE(epoll_enter)
{
	if (!held || !in_flight || !on_main())
		return 0;
	reap(HOLD_POLL_NS, HOLD_POLL_NS == 0);
	// Back at once: the next beforeSleep submits and replies (or holds on).
	PT_REGS_PARM4(ctx) = 0;
	return 0;
}

// Before redis switches or closes its AOF descriptor: everything written so far on disk.
static __always_inline void drain(void)
{
	if (!on_main())
		return;
	reap(0, 1);
	release();
	reap(0, 1);
}

SEC("uprobe/" REDIS ":openNewIncrAofForAppend")
int BPF_KPROBE(aof_switch_enter)
{
	drain();
	return 0;
}

SEC("uprobe/" REDIS ":stopAppendOnly")
int BPF_KPROBE(aof_stop_enter)
{
	drain();
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
