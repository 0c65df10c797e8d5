//! userbpf's io_uring helpers, for hot patches that hand a target's I/O to io_uring:
//! `bpf_io_uring_write`, `bpf_io_uring_fsync`, `bpf_io_uring_fdatasync`, `bpf_io_uring_wait`
//! and `bpf_io_uring_wait_timeout` (ids from [`USERBPF_HELPER_BASE`], declared for C programs in
//! `include/userbpf/helpers.h`). The kernel has no such helpers: a program run by the kernel
//! may not call them (see `crate::loader::check_kernel_helpers`).
//!
//! # One ring per thread
//!
//! Each thread that calls one of these helpers gets its own ring ([`DEPTH`] entries), set up
//! the first time it calls one (`io_uring_setup` and its `mmap`s, one allocation: the
//! one-time cost of that first call). Operations are counted per thread: a thread waits only
//! for its own. Submitting is a system call by nature (`io_uring_enter`, which the kernel
//! needs to see the entry; no SQPOLL thread is started behind the target's back), and so is
//! waiting for a completion that has not arrived; reaping completions already there is not.
//! No lock, no allocation after the setup.
//!
//! - A write copies its data (at most [`MAX_WRITE`] bytes, read through the VM's guard: a bad
//!   address gives `-EFAULT`) into a slot of the thread's buffer area, mapped on the first
//!   write, so the program's or the target's buffer may change as soon as the helper returns.
//! - Results are the kernel's, as a negative errno: submission errors at once (`-EBUSY` when
//!   [`DEPTH`] operations are in flight, `-E2BIG`, `-EFAULT`, or the setup's error, which is
//!   kept: a thread whose setup failed is not retried), the operation's own result from
//!   `bpf_io_uring_wait` (`-EBADF` for a descriptor that is not open, `-EIO`, ...). A write
//!   that wrote less than it was given reports `-EIO`.
//! - A thread that exits first waits for its operations (their buffers stay valid until the
//!   kernel is done with them), at most 5 s (a write into a pipe nobody reads never
//!   completes: it is then cancelled, its buffer left mapped), then closes its ring; `exit()`
//!   runs the calling thread's destructors, so this covers the main thread too.
//! - After `fork`, the child does not share its parent's ring: ring and buffers are mapped
//!   `MADV_DONTFORK`, and a thread of the child starts a ring of its own (the parent's
//!   operations are the parent's to wait for).
//!
//! # The kernel's worker runs at once
//!
//! An fsync (and a buffered write the kernel cannot do at once) runs in one of the ring's
//! io-wq worker threads, which the kernel creates from the submitting thread and which then
//! sleeps on each of the operation's I/Os. Woken on a busy CPU with the scheduler's default
//! slice (EEVDF, 1.4 ms on the 2-CPU test machine), it waits for the running thread's slice
//! to end: measured with redis, up to 250 µs per fdatasync before it even started, and more
//! after each I/O. So a submission runs with [`WORKER_SLICE_NS`] as the calling thread's
//! slice (`sched_setattr`'s `sched_runtime`, a request the kernel honours from 6.12 on),
//! which a worker created meanwhile inherits; the thread's own attributes are restored
//! right after. A shorter slice lets a woken worker preempt at once; it takes no more CPU
//! than it did. Where the kernel refuses (older, or a real-time thread), nothing changes.

use std::cell::RefCell;
use std::mem::ManuallyDrop;

use io_uring::{IoUring, opcode, squeue, types};
use userbpf_isa::helper_names::USERBPF_HELPER_BASE;
use userbpf_vm::HelperRegistry;

use super::{EINVAL, helper, neg, read_from};

/// `bpf_io_uring_write(fd, buf, len, offset)`.
pub const IO_URING_WRITE: u32 = USERBPF_HELPER_BASE;
/// `bpf_io_uring_fsync(fd)`.
pub const IO_URING_FSYNC: u32 = USERBPF_HELPER_BASE + 1;
/// `bpf_io_uring_fdatasync(fd)`.
pub const IO_URING_FDATASYNC: u32 = USERBPF_HELPER_BASE + 2;
/// `bpf_io_uring_wait(nr)`.
pub const IO_URING_WAIT: u32 = USERBPF_HELPER_BASE + 3;
/// `bpf_io_uring_wait_timeout(nr, timeout_ns)`.
pub const IO_URING_WAIT_TIMEOUT: u32 = USERBPF_HELPER_BASE + 4;

/// Entries of each thread's ring, and the most operations a thread may have in flight.
pub const DEPTH: u32 = 32;
/// The largest write one call may submit (its data is copied into one slot).
pub const MAX_WRITE: u32 = 64 << 10;

/// The scheduler slice (ns) io-wq workers created by a submission inherit: the kernel's
/// smallest (0.1 ms).
pub const WORKER_SLICE_NS: u64 = 100_000;

/// How long a thread's exit waits for its operations.
const EXIT_WAIT_NS: u64 = 5_000_000_000;

/// `user_data` of an entry: the slot (+1, 0 for none) in bits 32..40, and for a write its
/// length in bits 0..32 and [`UD_WRITE`].
const UD_WRITE: u64 = 1 << 40;

struct Ring {
    /// Dropped by hand: in a child of fork it must not be (see the `Drop` of `Ring`).
    ring: ManuallyDrop<IoUring>,
    /// The fork generation the ring was made in.
    generation: u64,
    /// Submitted operations not yet reaped by a wait.
    inflight: u32,
    /// [`DEPTH`] slots of [`MAX_WRITE`] bytes for writes' data; null until the first write.
    arena: *mut u8,
    /// Bit i set: slot i is free.
    free: u32,
}

enum State {
    /// No helper was called on this thread yet.
    Unset,
    Ready(Box<Ring>),
    /// The setup failed with this errno; not retried.
    Failed(i32),
}

thread_local! {
    static RING: RefCell<State> = const { RefCell::new(State::Unset) };
}

fn errno_of(e: &std::io::Error) -> i32 {
    e.raw_os_error().unwrap_or(libc::EIO)
}

/// `struct sched_attr` as `sched_getattr`/`sched_setattr` take it (its first version, 48 bytes).
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct SchedAttr {
    size: u32,
    policy: u32,
    flags: u64,
    nice: i32,
    priority: u32,
    runtime: u64,
    deadline: u64,
    period: u64,
}

fn sched_attr(attr: &mut SchedAttr, set: bool) -> bool {
    attr.size = std::mem::size_of::<SchedAttr>() as u32;
    let ptr: *mut SchedAttr = attr;
    // SAFETY: `attr` is a valid, writable sched_attr of the size passed (pid 0: the calling
    // thread); the kernel reads or fills at most that many bytes.
    let r = unsafe {
        if set {
            libc::syscall(libc::SYS_sched_setattr, 0, ptr, 0)
        } else {
            libc::syscall(libc::SYS_sched_getattr, 0, ptr, std::mem::size_of::<SchedAttr>() as u32, 0)
        }
    };
    r == 0
}

/// Runs `f` (a submission) with [`WORKER_SLICE_NS`] as the calling thread's slice, so an
/// io-wq worker the kernel creates meanwhile inherits it (see the module's docs); restores
/// the thread's attributes after.
fn with_worker_slice<R>(f: impl FnOnce() -> R) -> R {
    let mut saved = SchedAttr::default();
    let fair = sched_attr(&mut saved, false)
        && matches!(saved.policy as i32, libc::SCHED_OTHER | libc::SCHED_BATCH | libc::SCHED_IDLE)
        && saved.runtime != WORKER_SLICE_NS;
    let mut short = SchedAttr { runtime: WORKER_SLICE_NS, ..saved };
    // Only the policy, nice and slice: no reset-on-fork or clamp flags carried over.
    short.flags = 0;
    let changed = fair && sched_attr(&mut short, true);
    let r = f();
    if changed {
        saved.flags &= libc::SCHED_FLAG_RESET_ON_FORK as u64;
        sched_attr(&mut saved, true);
    }
    r
}

impl Ring {
    fn new(generation: u64) -> Result<Ring, i32> {
        let mut builder = IoUring::builder();
        builder.dontfork();
        let ring = builder.build(DEPTH).map_err(|e| errno_of(&e))?;
        Ok(Ring { ring: ManuallyDrop::new(ring), generation, inflight: 0, arena: std::ptr::null_mut(), free: u32::MAX })
    }

    /// Maps the writes' buffer area (once per ring).
    fn arena(&mut self) -> Result<*mut u8, i32> {
        if !self.arena.is_null() {
            return Ok(self.arena);
        }
        let len = DEPTH as usize * MAX_WRITE as usize;
        let Some(p) = super::anonymous_memory(len) else {
            return Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::ENOMEM));
        };
        // SAFETY: `p` is the mapping just made, `len` long. A child of fork must not see
        // it: its slots belong to the parent's operations.
        unsafe { libc::madvise(p.cast(), len, libc::MADV_DONTFORK) };
        self.arena = p.cast();
        Ok(self.arena)
    }

    /// Queues `entry` and hands it to the kernel. 0 or a negative errno.
    fn submit(&mut self, entry: squeue::Entry) -> u64 {
        // SAFETY: the entry's buffer (a write's slot) stays mapped and untouched until its
        // completion is reaped (slots are freed only then; the ring's drop waits for every
        // operation in flight).
        if unsafe { self.ring.submission().push(&entry) }.is_err() {
            return neg(libc::EBUSY);
        }
        self.inflight += 1;
        loop {
            match with_worker_slice(|| self.ring.submit()) {
                Ok(_) => return 0,
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                // The entry stays queued: the next io_uring_enter (the next submission
                // or wait) hands it to the kernel, and a wait counts it.
                Err(e) if matches!(e.raw_os_error(), Some(libc::EAGAIN | libc::EBUSY)) => return 0,
                Err(e) => return neg(errno_of(&e)),
            }
        }
    }

    /// Waits until `nr` operations completed and reaps them: 0, or the first failure's
    /// negative errno.
    fn wait(&mut self, nr: u32) -> u64 {
        self.wait_until(nr, None)
    }

    /// [`Ring::wait`], giving up at `deadline` (CLOCK_MONOTONIC ns) with `-ETIME`; what
    /// completed by then is reaped.
    fn wait_until(&mut self, nr: u32, deadline: Option<u64>) -> u64 {
        if nr > self.inflight {
            return EINVAL;
        }
        let mut first_err = 0u64;
        let mut got = 0u32;
        while got < nr {
            for cqe in self.ring.completion().take((nr - got) as usize) {
                got += 1;
                self.inflight -= 1;
                let ud = cqe.user_data();
                let slot = (ud >> 32) as u8;
                if slot != 0 {
                    self.free |= 1 << (slot - 1);
                }
                let res = cqe.result();
                let err = if res < 0 {
                    neg(-res)
                } else if ud & UD_WRITE != 0 && res as u32 != ud as u32 {
                    neg(libc::EIO)
                } else {
                    0
                };
                if first_err == 0 {
                    first_err = err;
                }
            }
            if got == nr {
                break;
            }
            let want = (nr - got) as usize;
            let entered = match deadline {
                None => self.ring.submit_and_wait(want),
                Some(deadline) => {
                    let now = super::time::clock_ns(libc::CLOCK_MONOTONIC);
                    if now >= deadline {
                        return neg(libc::ETIME);
                    }
                    let left = deadline - now;
                    let ts = types::Timespec::new().sec(left / 1_000_000_000).nsec((left % 1_000_000_000) as u32);
                    let args = types::SubmitArgs::new().timespec(&ts);
                    match self.ring.submitter().submit_with_args(want, &args) {
                        // Reap what arrived in time; the loop then returns -ETIME.
                        Err(e) if e.raw_os_error() == Some(libc::ETIME) => Ok(0),
                        r => r,
                    }
                }
            };
            match entered {
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
                Err(e) => return neg(errno_of(&e)),
            }
        }
        first_err
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        if self.generation != super::task::fork_generation() {
            // A child of fork: the ring's and the arena's mappings were not inherited
            // (MADV_DONTFORK) and their addresses may have been reused since, so nothing is
            // unmapped; only the descriptor is ours to close. The parent's operations are
            // the parent's.
            // SAFETY: closing the child's copy of the ring's descriptor, used by nothing else.
            unsafe { libc::close(std::os::fd::AsRawFd::as_raw_fd(&*self.ring)) };
            return;
        }
        // The kernel may still read writes' slots: wait for everything in flight, at most
        // EXIT_WAIT_NS (a write into a pipe nobody reads never completes). What is still in
        // flight then is cancelled by the ring's release, and its slots are left mapped.
        let deadline = super::time::clock_ns(libc::CLOCK_MONOTONIC).saturating_add(EXIT_WAIT_NS);
        while self.inflight > 0 {
            let before = self.inflight;
            self.wait_until(before, Some(deadline));
            if self.inflight == before {
                break;
            }
        }
        // SAFETY: dropped once, here; the ring is not used after this.
        unsafe { ManuallyDrop::drop(&mut self.ring) };
        if !self.arena.is_null() && self.inflight == 0 {
            // SAFETY: the arena mapping made in `arena()`; no operation uses it any more.
            unsafe { libc::munmap(self.arena.cast(), DEPTH as usize * MAX_WRITE as usize) };
        }
    }
}

/// Runs `f` on the calling thread's ring, setting it up on first use (or in a child of
/// fork). A negative errno if there is none.
#[inline]
fn with_ring(f: impl FnOnce(&mut Ring) -> u64) -> u64 {
    let generation = super::task::fork_generation();
    RING.try_with(|cell| {
        // Busy only if a helper re-entered on this thread (a signal handler's probe).
        let Ok(mut state) = cell.try_borrow_mut() else { return neg(libc::EBUSY) };
        let stale = matches!(&*state, State::Ready(r) if r.generation != generation);
        if stale || matches!(&*state, State::Unset) {
            // The old ring (a parent's, after fork) is dropped here: its descriptor closed.
            *state = match Ring::new(generation) {
                Ok(r) => State::Ready(Box::new(r)),
                Err(errno) => State::Failed(errno),
            };
        }
        match &mut *state {
            State::Ready(r) => f(r),
            State::Failed(errno) => neg(*errno),
            State::Unset => neg(libc::ENOSYS),
        }
    })
    // The thread is exiting (its ring is already gone).
    .unwrap_or(neg(libc::ESRCH))
}

/// `long bpf_io_uring_write(int fd, const void *buf, __u32 len, __s64 offset)`: submits a
/// write of a copy of `len` bytes at `buf` (program or target memory) to `fd` at `offset`
/// (-1: at the file position, as `write(2)`). 0 once submitted, or a negative errno; the
/// write's own result comes from `bpf_io_uring_wait`.
unsafe extern "C" fn io_uring_write(fd: u64, buf: u64, len: u64, offset: u64, _: u64) -> u64 {
    if len > MAX_WRITE as u64 {
        return neg(libc::E2BIG);
    }
    with_ring(|r| {
        if r.free == 0 || r.inflight >= DEPTH {
            return neg(libc::EBUSY);
        }
        let arena = match r.arena() {
            Ok(a) => a,
            Err(errno) => return neg(errno),
        };
        let slot = r.free.trailing_zeros();
        // SAFETY: slot < DEPTH (a free bit of a DEPTH-bit mask): the slot lies in the arena.
        let data = unsafe { arena.add(slot as usize * MAX_WRITE as usize) };
        // SAFETY: the slot is free (no operation reads it) and MAX_WRITE >= len bytes long.
        let dst = unsafe { std::slice::from_raw_parts_mut(data, len as usize) };
        if !read_from(dst, buf) {
            return super::EFAULT;
        }
        let entry = opcode::Write::new(types::Fd(fd as i32), data, len as u32)
            .offset(offset)
            .build()
            .user_data(UD_WRITE | ((slot as u64 + 1) << 32) | len);
        let r0 = r.submit(entry);
        if r0 == 0 {
            r.free &= !(1 << slot);
        }
        r0
    })
}

fn sync(fd: u64, flags: types::FsyncFlags) -> u64 {
    with_ring(|r| {
        if r.inflight >= DEPTH {
            return neg(libc::EBUSY);
        }
        r.submit(opcode::Fsync::new(types::Fd(fd as i32)).flags(flags).build().user_data(0))
    })
}

/// `long bpf_io_uring_fsync(int fd)`: submits an fsync of `fd`. 0 once submitted, or a
/// negative errno; the fsync's own result comes from `bpf_io_uring_wait`.
unsafe extern "C" fn io_uring_fsync(fd: u64, _: u64, _: u64, _: u64, _: u64) -> u64 {
    sync(fd, types::FsyncFlags::empty())
}

/// `long bpf_io_uring_fdatasync(int fd)`: as `bpf_io_uring_fsync`, with `fdatasync(2)`'s
/// semantics (metadata not needed to read the data back is not flushed).
unsafe extern "C" fn io_uring_fdatasync(fd: u64, _: u64, _: u64, _: u64, _: u64) -> u64 {
    sync(fd, types::FsyncFlags::DATASYNC)
}

/// `long bpf_io_uring_wait(__u32 nr)`: waits until `nr` of the calling thread's operations
/// have completed (any `nr` of them, in completion order) and reaps them. 0 if they all
/// succeeded, else the first failure's negative errno; `-EINVAL` if fewer than `nr` are in
/// flight (waiting would never end). `nr` = 0 returns 0 at once.
unsafe extern "C" fn io_uring_wait(nr: u64, _: u64, _: u64, _: u64, _: u64) -> u64 {
    let Ok(nr) = u32::try_from(nr) else { return EINVAL };
    if nr == 0 {
        return 0;
    }
    with_ring(|r| r.wait(nr))
}

/// `long bpf_io_uring_wait_timeout(__u32 nr, __u64 timeout_ns)`: as `bpf_io_uring_wait`,
/// giving up after `timeout_ns` nanoseconds with `-ETIME`; the operations that completed by
/// then are reaped (with `nr` = 1: none was). A timeout of 0 only reaps what has completed.
unsafe extern "C" fn io_uring_wait_timeout(nr: u64, timeout_ns: u64, _: u64, _: u64, _: u64) -> u64 {
    let Ok(nr) = u32::try_from(nr) else { return EINVAL };
    if nr == 0 {
        return 0;
    }
    let deadline = super::time::clock_ns(libc::CLOCK_MONOTONIC).saturating_add(timeout_ns);
    with_ring(|r| r.wait_until(nr, Some(deadline)))
}

pub(crate) fn register(reg: &mut HelperRegistry) {
    reg.register(helper(IO_URING_WRITE, "io_uring_write", io_uring_write));
    reg.register(helper(IO_URING_FSYNC, "io_uring_fsync", io_uring_fsync));
    reg.register(helper(IO_URING_FDATASYNC, "io_uring_fdatasync", io_uring_fdatasync));
    reg.register(helper(IO_URING_WAIT, "io_uring_wait", io_uring_wait));
    reg.register(helper(IO_URING_WAIT_TIMEOUT, "io_uring_wait_timeout", io_uring_wait_timeout));
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Seek};
    use std::os::fd::AsRawFd;

    use super::*;

    fn call(f: unsafe extern "C" fn(u64, u64, u64, u64, u64) -> u64, a: [u64; 4]) -> i64 {
        // SAFETY: the helpers tolerate any argument values.
        unsafe { f(a[0], a[1], a[2], a[3], 0) as i64 }
    }
    fn wait(nr: u64) -> i64 {
        call(io_uring_wait, [nr, 0, 0, 0])
    }
    const E: fn(i32) -> i64 = |e| -(e as i64);

    fn temp_file(name: &str) -> (std::path::PathBuf, std::fs::File) {
        let path = std::env::temp_dir().join(format!("userbpf-io-uring-{}-{name}", std::process::id()));
        let f = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&path).unwrap();
        (path, f)
    }

    #[test]
    fn bad_descriptors_complete_with_ebadf() {
        for fd in [-1i64 as u64, 1_000_000, i32::MAX as u64] {
            assert_eq!(call(io_uring_fdatasync, [fd, 0, 0, 0]), 0, "fd {fd}");
            assert_eq!(wait(1), E(libc::EBADF), "fdatasync fd {fd}");
            assert_eq!(call(io_uring_fsync, [fd, 0, 0, 0]), 0, "fd {fd}");
            assert_eq!(wait(1), E(libc::EBADF), "fsync fd {fd}");
            let data = *b"abc";
            assert_eq!(call(io_uring_write, [fd, data.as_ptr() as u64, 3, 0]), 0);
            assert_eq!(wait(1), E(libc::EBADF), "write fd {fd}");
        }
        // A descriptor open for reading only.
        let f = std::fs::File::open("/proc/self/exe").unwrap();
        let data = *b"abc";
        assert_eq!(call(io_uring_write, [f.as_raw_fd() as u64, data.as_ptr() as u64, 3, 0]), 0);
        assert_eq!(wait(1), E(libc::EBADF));
    }

    #[test]
    fn submission_errors() {
        // Nothing in flight: waiting would never end.
        assert_eq!(wait(1), E(libc::EINVAL));
        assert_eq!(wait(u64::MAX), E(libc::EINVAL));
        assert_eq!(wait(0), 0);
        let (path, f) = temp_file("errors");
        let fd = f.as_raw_fd() as u64;
        // Unreadable source memory: -EFAULT at once, nothing submitted.
        assert_eq!(call(io_uring_write, [fd, 8, 4, 0]), E(libc::EFAULT));
        assert_eq!(call(io_uring_write, [fd, u64::MAX - 2, 4, 0]), E(libc::EFAULT));
        assert_eq!(call(io_uring_write, [fd, 0, MAX_WRITE as u64 + 1, 0]), E(libc::E2BIG));
        assert_eq!(wait(1), E(libc::EINVAL));
        // A full ring.
        for i in 0..DEPTH {
            assert_eq!(call(io_uring_fdatasync, [fd, 0, 0, 0]), 0, "{i}");
        }
        assert_eq!(call(io_uring_fdatasync, [fd, 0, 0, 0]), E(libc::EBUSY));
        let byte = 1u8;
        assert_eq!(call(io_uring_write, [fd, &byte as *const u8 as u64, 1, 0]), E(libc::EBUSY));
        assert_eq!(wait(DEPTH as u64 + 1), E(libc::EINVAL));
        assert_eq!(wait(DEPTH as u64), 0);
        assert_eq!(wait(1), E(libc::EINVAL));
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn writes_and_syncs_reach_the_file() {
        let (path, mut f) = temp_file("data");
        let fd = f.as_raw_fd() as u64;
        let mut a = *b"hello, ";
        assert_eq!(call(io_uring_write, [fd, a.as_ptr() as u64, 7, 0]), 0);
        // The data was copied: the buffer may change at once.
        a.fill(b'X');
        let b = vec![b'w'; MAX_WRITE as usize];
        assert_eq!(call(io_uring_write, [fd, b.as_ptr() as u64, b.len() as u64, 7]), 0);
        assert_eq!(call(io_uring_fdatasync, [fd, 0, 0, 0]), 0);
        assert_eq!(wait(2), 0);
        assert_eq!(wait(1), 0);
        assert_eq!(call(io_uring_fsync, [fd, 0, 0, 0]), 0);
        assert_eq!(wait(1), 0);
        let mut got = Vec::new();
        f.rewind().unwrap();
        f.read_to_end(&mut got).unwrap();
        assert_eq!(got.len(), 7 + MAX_WRITE as usize);
        assert_eq!(&got[..7], b"hello, ");
        assert!(got[7..].iter().all(|&c| c == b'w'));
        // Offset -1: at the file position (which read_to_end left at the end).
        let c = *b"!";
        assert_eq!(call(io_uring_write, [fd, c.as_ptr() as u64, 1, u64::MAX]), 0);
        assert_eq!(wait(1), 0);
        assert_eq!(std::fs::read(&path).unwrap().last(), Some(&b'!'));
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn waits_with_a_timeout() {
        let wait_t = |nr: u64, ns: u64| call(io_uring_wait_timeout, [nr, ns, 0, 0]);
        assert_eq!(wait_t(1, 1_000_000), E(libc::EINVAL));
        assert_eq!(wait_t(0, 0), 0);
        // A read of a pipe nobody writes to never completes: the wait times out, and the
        // operation stays in flight.
        let mut fds = [0i32; 2];
        // SAFETY: pipe(2) fills the two descriptors of the array we own.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        let mut buf = [0u8; 8];
        let read = opcode::Read::new(types::Fd(fds[0]), buf.as_mut_ptr(), 8).build().user_data(0);
        assert_eq!(with_ring(|r| r.submit(read)), 0);
        let t = std::time::Instant::now();
        assert_eq!(wait_t(1, 20_000_000), E(libc::ETIME));
        assert!(t.elapsed() >= std::time::Duration::from_millis(20), "{:?}", t.elapsed());
        assert_eq!(wait_t(1, 0), E(libc::ETIME));
        // A completed fsync beside it is reaped in time; the read is still in flight.
        let (path, f) = temp_file("timeout");
        assert_eq!(call(io_uring_fdatasync, [f.as_raw_fd() as u64, 0, 0, 0]), 0);
        assert_eq!(wait_t(1, 10_000_000_000), 0);
        assert_eq!(wait_t(2, 0), E(libc::EINVAL));
        // The write end closed: the read completes (0 bytes) and the wait returns.
        // SAFETY: closing the pipe's write end, which we own.
        unsafe { libc::close(fds[1]) };
        assert_eq!(wait_t(1, 10_000_000_000), 0);
        assert_eq!(wait(1), E(libc::EINVAL));
        // SAFETY: closing the pipe's read end, which we own.
        unsafe { libc::close(fds[0]) };
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn a_thread_that_exits_waits_for_its_writes() {
        let (path, f) = temp_file("exit");
        let fd = f.as_raw_fd() as u64;
        std::thread::spawn(move || {
            let data = vec![b'z'; 4096];
            for i in 0..8u64 {
                assert_eq!(call(io_uring_write, [fd, data.as_ptr() as u64, 4096, i * 4096]), 0);
            }
            // No wait: the thread's exit does it.
        })
        .join()
        .unwrap();
        let got = std::fs::read(&path).unwrap();
        assert_eq!(got.len(), 8 * 4096);
        assert!(got.iter().all(|&c| c == b'z'));
        // Each thread has its own ring: this one has nothing in flight.
        assert_eq!(wait(1), E(libc::EINVAL));
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn threads_use_their_own_rings_concurrently() {
        let (path, f) = temp_file("threads");
        let fd = f.as_raw_fd() as u64;
        std::thread::scope(|s| {
            for t in 0..4u64 {
                s.spawn(move || {
                    let data = [b'a' + t as u8; 64];
                    for i in 0..200u64 {
                        let at = (i * 4 + t) * 64;
                        assert_eq!(call(io_uring_write, [fd, data.as_ptr() as u64, 64, at]), 0);
                        assert_eq!(call(io_uring_fdatasync, [fd, 0, 0, 0]), 0);
                        // Only this thread's two operations are waited for.
                        assert_eq!(wait(2), 0, "thread {t} round {i}");
                        assert_eq!(wait(1), E(libc::EINVAL));
                    }
                });
            }
        });
        let got = std::fs::read(&path).unwrap();
        assert_eq!(got.len(), 800 * 64);
        for (n, chunk) in got.chunks(64).enumerate() {
            assert!(chunk.iter().all(|&c| c == b'a' + (n % 4) as u8), "chunk {n}");
        }
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn a_thread_exits_even_if_a_write_never_completes() {
        let mut fds = [0i32; 2];
        // SAFETY: pipe(2) fills the two descriptors of the array we own.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        let w = fds[1] as u64;
        let t = std::time::Instant::now();
        std::thread::spawn(move || {
            // Fill the pipe (64 KiB), then one more write that blocks in the kernel.
            let data = vec![0u8; MAX_WRITE as usize];
            assert_eq!(call(io_uring_write, [w, data.as_ptr() as u64, MAX_WRITE as u64, u64::MAX]), 0);
            assert_eq!(wait(1), 0);
            assert_eq!(call(io_uring_write, [w, data.as_ptr() as u64, 1, u64::MAX]), 0);
        })
        .join()
        .unwrap();
        assert!(t.elapsed() < std::time::Duration::from_secs(30), "{:?}", t.elapsed());
        for fd in fds {
            // SAFETY: closing the pipe's descriptors, which we own.
            unsafe { libc::close(fd) };
        }
    }

    /// The slice (ns) thread `tid` of this process runs with, as sched_getattr reports it.
    fn slice_of(tid: i32) -> Option<u64> {
        let mut attr = SchedAttr { size: std::mem::size_of::<SchedAttr>() as u32, ..Default::default() };
        let ptr: *mut SchedAttr = &mut attr;
        // SAFETY: a valid, writable sched_attr of the size passed.
        let r = unsafe { libc::syscall(libc::SYS_sched_getattr, tid, ptr, attr.size, 0) };
        (r == 0).then_some(attr.runtime)
    }

    #[test]
    fn workers_inherit_a_short_slice_and_the_thread_keeps_its_own() {
        std::thread::spawn(|| {
            // SAFETY: gettid has no preconditions.
            let me = unsafe { libc::gettid() };
            let before = slice_of(me).expect("sched_getattr on this thread");
            let (path, f) = temp_file("slice");
            assert_eq!(call(io_uring_fdatasync, [f.as_raw_fd() as u64, 0, 0, 0]), 0);
            assert_eq!(wait(1), 0);
            assert_eq!(slice_of(me), Some(before), "the submitting thread's slice is restored");
            // The kernel ran the fdatasync in an io-wq worker it created for this process
            // (idle workers stay 5 s): every such worker has the short slice.
            let workers: Vec<u64> = std::fs::read_dir("/proc/self/task")
                .unwrap()
                .flatten()
                .filter(|t| std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.starts_with("iou-wrk-")))
                .filter_map(|t| slice_of(t.file_name().to_string_lossy().parse().ok()?))
                .collect();
            assert!(!workers.is_empty(), "no io-wq worker after an fdatasync");
            assert!(workers.iter().all(|&s| s == WORKER_SLICE_NS), "worker slices {workers:?}");
            std::fs::remove_file(path).unwrap();
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_forked_child_gets_its_own_ring() {
        let (path, f) = temp_file("fork");
        let fd = f.as_raw_fd() as u64;
        // The parent's ring exists and has an operation in flight across the fork.
        assert_eq!(call(io_uring_fdatasync, [fd, 0, 0, 0]), 0);
        // SAFETY: the child only calls the helpers (no locks held by other threads are
        // needed: the ring setup's allocation goes through malloc, fork-safe in glibc) and
        // leaves with _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            let data = *b"child";
            let ok = wait(1) == E(libc::EINVAL)
                && call(io_uring_write, [fd, data.as_ptr() as u64, 5, 0]) == 0
                && wait(1) == 0;
            // SAFETY: ends the child without running the test harness's code.
            unsafe { libc::_exit(if ok { 0 } else { 1 }) };
        }
        let mut status = 0;
        // SAFETY: waits for the child just forked.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "child status {status:#x}");
        assert_eq!(wait(1), 0);
        assert_eq!(std::fs::read(&path).unwrap(), b"child");
        std::fs::remove_file(path).unwrap();
    }
}
