// redis with `appendfsync always`, made fast without touching redis: the fdatasync redis
// issues on its append-only file after each event-loop batch becomes an io_uring fdatasync,
// with group commit. Run as
//   userbpf run target/bpf/redis-fsync.bpf.o -- redis-server --appendonly yes --appendfsync always ...
//
// At most one fdatasync is in flight: redis's next fdatasync first waits for the previous one
// to complete, then submits its own and returns at once (bpf_override_return: libc's
// fdatasync does not run). redis replies to a batch's clients right after its fdatasync
// returns, so a crash of the machine (or a power loss) loses at most the writes acknowledged
// since the last completed fdatasync: one batch. `everysec` loses up to a second's worth. A
// crash of redis alone loses nothing acknowledged: the data is in the page cache. A failed fdatasync is reported to redis at its next fdatasync (-1), and
// redis stops, as it does when a plain fdatasync fails under `always`.
//
// Only the fdatasync called inside redis's flushAppendOnlyFile() is patched (a uprobe and a
// uretprobe mark the thread inside it): the fsyncs of the AOF manifest, of RDB files and the
// one redis makes at shutdown (after flushing the AOF a last time) stay synchronous, so a
// clean shutdown leaves every acknowledged write on disk.
//
// The probes name Debian's redis-server (/usr/bin/redis-server); for another build, change
// the path in the two flushAppendOnlyFile sections.
#include <linux/bpf.h>
#include <linux/ptrace.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <userbpf/helpers.h>

// The thread inside flushAppendOnlyFile (redis's main thread), 0 when none.
__u32 flushing_tid;
// An io_uring fdatasync submitted and not yet waited for.
__u32 in_flight;

// Counters, printed by `userbpf run` when redis exits.
__u64 patched;   // fdatasyncs handed to io_uring
__u64 waited;    // ... that first waited for the previous one
__u64 failed;    // previous fdatasyncs that failed (reported to redis as -1)
__u64 fallback;  // submissions refused: the real fdatasync ran instead

SEC("uprobe//usr/bin/redis-server:flushAppendOnlyFile")
int BPF_KPROBE(flush_enter)
{
	flushing_tid = (__u32)bpf_get_current_pid_tgid();
	return 0;
}

SEC("uretprobe//usr/bin/redis-server:flushAppendOnlyFile")
int BPF_KRETPROBE(flush_leave)
{
	flushing_tid = 0;
	return 0;
}

SEC("uprobe/libc.so.6:fdatasync")
int BPF_KPROBE(fdatasync_enter, int fd)
{
	long err;

	if ((__u32)bpf_get_current_pid_tgid() != flushing_tid)
		return 0;
	// Group commit: the previous fdatasync completes before the next starts.
	if (in_flight) {
		in_flight = 0;
		waited++;
		err = bpf_io_uring_wait(1);
		if (err < 0) {
			failed++;
			bpf_override_return(ctx, -1);
			return 0;
		}
	}
	err = bpf_io_uring_fdatasync(fd);
	if (err < 0) {
		fallback++;
		return 0;
	}
	in_flight = 1;
	patched++;
	bpf_override_return(ctx, 0);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
