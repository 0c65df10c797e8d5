//! Synchronisation inside shared memory, between threads of several processes.
//!
//! * [`SpinLock`]: a 32-bit lock word holding 0 (free) or the thread id (`gettid`) of the
//!   thread that holds it. Linux thread ids are unique system-wide (within a pid namespace)
//!   and below `PID_MAX_LIMIT` (2^22), and a process's main thread id is its pid, so a word
//!   written by an older build (which stored the pid) still names a live thread.
//!
//!   Taking the lock:
//!   1. If the word already holds our own thread id, this is re-entry on the same thread (a
//!      probe that fired inside a map operation): fail at once with `EBUSY`, as the kernel
//!      does for re-entry on the same CPU. Waiting could never succeed.
//!   2. Otherwise spin (`spin_loop` hints only, no system call) for a bounded number of
//!      attempts. A critical section is a few hundred nanoseconds, so this is where every
//!      ordinary contended acquisition ends.
//!   3. **Slow path, with system calls.** Unlike the kernel's, a user-space critical section
//!      can be preempted by the scheduler (or its thread stopped by a signal, a page fault,
//!      a debugger); its holder then keeps the lock for a whole time slice or more. Giving up
//!      with `EBUSY` then would be a spurious failure the kernel never produces (its bucket
//!      locks disable preemption), so the waiter checks once whether the holder still exists
//!      (below), then yields the CPU (`sched_yield`) in a loop bounded in time: windows of
//!      20 ms for programs' helpers ([`Wait::Hot`]), 50 ms for the syscall-style API
//!      ([`Wait::Sys`]). At the end of a window it checks again for a dead holder, and reads
//!      the holder's scheduler state (`/proc/<tid>/stat`): a holder that is runnable but
//!      waiting for a CPU (an overloaded machine) gets further windows, up to 500 ms / 1 s in
//!      all; a stopped or sleeping one does not, and the waiter gives up with `EBUSY`.
//!
//!   Dead holders: `kill(tid, 0)` (Linux's `kill` accepts any thread id, not only a thread
//!   group leader's, and reports `ESRCH` once that thread is gone) tells whether the holder
//!   still exists; if it is gone, it died inside the critical section (its process was
//!   killed) and the lock is taken over, so a crashed process never blocks a map forever.
//!   The data structures are written so that a critical section cut short at any point
//!   leaves them traversable (at worst an element leaks or a count is off by one).
//! * [`FreeList`]: a lock-free stack of element indices (Treiber stack with a 32-bit tag
//!   against ABA) whose links live in the elements. Hash maps keep one per CPU and pool.
//! * [`current_cpu`]: the CPU the calling thread runs on (rseq or vDSO, no system call).
//! * [`my_tid`]: this thread's id, cached in an initial-exec thread-local word (no allocation,
//!   no `__tls_get_addr`; reset in a fork's child by a `pthread_atfork` hook).

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::types::MapError;

// This thread's words: zero-filled thread-local storage (`.tbss`, hidden: one per linked
// image), reached with the initial-exec model (one load of its offset from the thread
// pointer, `@GOTTPOFF`, and an add). Rust's `thread_local!` in a `cdylib` (the agent, the
// syscall server) calls `__tls_get_addr` on every access, and the lock of every in-place hash
// update asks for the thread's id (profiled: ~2 ns of a probe hit). As for the runtime's
// thread block, the linker marks the image as needing static TLS, which glibc gives to
// preloaded objects and, from its reserved surplus, to objects loaded later. No initialiser
// and no destructor: usable at any point of a thread's life, async-signal-safe.
//   +0 tid: u32        the thread's id, 0 until first asked
//   +4 memo_idx: u32   the element the thread's last program-side hash lookup found
//   +8 memo_map: u64   that lookup's map (0: none); see `hash::HashMap::update_impl`
//   +16 memo_key: u64  the first 8 bytes of that lookup's key (zero-padded), compared before
//                      the element is touched
//   +24 sweep_map: u64 the LRU map whose CLOCK hand the thread took a stretch of (0: none)
//   +32 sweep_pos: u32 the next position of that stretch, +36 sweep_end: u32 its end; see
//                      `hash::HashMap::sweep_step`
//   +40 memo2_idx: u32, +48 memo2_map: u64, +56 memo2_key: u64: the lookup memo the thread
//                      had before its last lookup of another map (its second memo: a thread
//                      alternating between two maps, as sslsniff's probes do, finds both)
std::arch::global_asm!(
    ".pushsection .tbss,\"awT\",@nobits",
    ".p2align 3",
    ".globl userbpf_maps_thread_words",
    ".hidden userbpf_maps_thread_words",
    ".type userbpf_maps_thread_words,@object",
    ".size userbpf_maps_thread_words, 64",
    "userbpf_maps_thread_words:",
    ".zero 64",
    ".popsection",
);

/// This thread's words (see above). The pointer is valid while the thread runs and only used
/// on it.
#[inline(always)]
fn thread_words() -> *mut u8 {
    let p: usize;
    // SAFETY: reads the block's offset from the thread pointer (a GOT word the dynamic linker
    // filled at load) and adds the thread pointer (`fs:[0]`, the TCB's self pointer on x86-64
    // glibc and musl): the address of this thread's copy.
    unsafe {
        std::arch::asm!(
            "mov {p}, qword ptr [rip + userbpf_maps_thread_words@GOTTPOFF]",
            "add {p}, qword ptr fs:[0]",
            p = out(reg) p,
            options(nostack, readonly, pure),
        )
    };
    p as *mut u8
}

/// The offset of this thread's words (see above) from the thread pointer (`fs:[0]`): the same
/// in every thread (static TLS), for generated code that reads the lookup memo and the
/// thread's id itself (`HashMap::memo_layout`). Layout: +0 tid (u32, 0: not read yet), +4
/// memo element index (u32), +8 memo map (u64), +16 memo key word (u64).
pub fn thread_words_tls_offset() -> i64 {
    let fs0: usize;
    // SAFETY: reads the thread pointer (the TCB's self pointer at fs:[0]).
    unsafe { std::arch::asm!("mov {}, qword ptr fs:[0]", out(reg) fs0, options(nostack, readonly, preserves_flags)) };
    thread_words() as usize as i64 - fs0 as i64
}

#[inline(always)]
fn tid_word() -> *mut u32 {
    thread_words().cast()
}

/// Where a lookup memo lies in the thread's words: (map, element index, key word) offsets.
type MemoAt = (usize, usize, usize);
/// The first memo (the one the JIT reads: see `thread_words_tls_offset`).
const MEMO1: MemoAt = (8, 4, 16);
/// The second (see `set_lookup_memo`).
const MEMO2: MemoAt = (48, 40, 56);

#[inline(always)]
fn read_memo((map, idx, key): MemoAt) -> (u64, u32, u64) {
    let w = thread_words();
    // SAFETY: this thread's words, 8-aligned, 64 bytes; the offsets are MEMO1's or MEMO2's,
    // aligned for their types; nothing else uses them.
    unsafe { (w.add(map).cast::<u64>().read(), w.add(idx).cast::<u32>().read(), w.add(key).cast::<u64>().read()) }
}

#[inline(always)]
fn write_memo((map, idx, key): MemoAt, (m, i, k): (u64, u32, u64)) {
    let w = thread_words();
    // SAFETY: as in `read_memo`.
    unsafe {
        w.add(map).cast::<u64>().write(m);
        w.add(idx).cast::<u32>().write(i);
        w.add(key).cast::<u64>().write(k);
    }
}

/// The thread's memo of its last program-side hash lookup: (map, element index, the key's
/// first 8 bytes), map 0 for none. A hint only: whoever uses it checks the element.
#[inline(always)]
pub(crate) fn lookup_memo() -> (u64, u32, u64) {
    read_memo(MEMO1)
}

/// Makes (map, element index, key word) the thread's memo; the memo it replaces becomes the
/// second one (`lookup_memo2`) if it was another map's.
#[inline(always)]
pub(crate) fn set_lookup_memo(map: u64, idx: u32, key_word: u64) {
    let old = read_memo(MEMO1);
    if old.0 != map {
        write_memo(MEMO2, old);
    }
    write_memo(MEMO1, (map, idx, key_word));
}

/// The thread's second lookup memo (see `set_lookup_memo`): (map, element index, key word),
/// map 0 for none. A hint only, as the first.
#[inline(always)]
pub(crate) fn lookup_memo2() -> (u64, u32, u64) {
    read_memo(MEMO2)
}

/// Swaps the thread's two lookup memos (a lookup found its element through the second: it
/// becomes the first, the one an update of the same key then checks).
#[inline(always)]
pub(crate) fn swap_lookup_memos() {
    let (first, second) = (read_memo(MEMO1), read_memo(MEMO2));
    write_memo(MEMO1, second);
    write_memo(MEMO2, first);
}

/// The thread's stretch of an LRU map's CLOCK hand: (map, next position, end), map 0 for none.
#[inline(always)]
pub(crate) fn sweep_stretch() -> (u64, u32, u32) {
    let w = thread_words();
    // SAFETY: as in `lookup_memo`.
    unsafe { (w.add(24).cast::<u64>().read(), w.add(32).cast::<u32>().read(), w.add(36).cast::<u32>().read()) }
}

#[inline(always)]
pub(crate) fn set_sweep_stretch(map: u64, pos: u32, end: u32) {
    let w = thread_words();
    // SAFETY: as in `lookup_memo`.
    unsafe {
        w.add(24).cast::<u64>().write(map);
        w.add(32).cast::<u32>().write(pos);
        w.add(36).cast::<u32>().write(end);
    }
}

static ATFORK: std::sync::Once = std::sync::Once::new();

extern "C" fn reset_tid_in_child() {
    // Runs in the child's only thread, whose id differs from the forking thread's.
    // SAFETY: this thread's word; nothing else uses it.
    unsafe { tid_word().write(0) };
}

/// This thread's id (`gettid`), without a system call after the first.
#[inline]
pub(crate) fn my_tid() -> u32 {
    // SAFETY: this thread's word (see `tid_word`).
    let t = unsafe { tid_word().read() };
    if t != 0 {
        return t;
    }
    my_tid_slow()
}

#[cold]
fn my_tid_slow() -> u32 {
    ATFORK.call_once(|| {
        // SAFETY: registers a plain function that only stores to a const-initialised
        // thread-local (async-signal-safe, as a fork child handler must be); the handler
        // lives for the whole program.
        unsafe { libc::pthread_atfork(None, None, Some(reset_tid_in_child)) };
    });
    // SAFETY: gettid takes no arguments and cannot fail.
    let t = unsafe { libc::syscall(libc::SYS_gettid) } as u32;
    // SAFETY: this thread's word (see `tid_word`).
    unsafe { tid_word().write(t) };
    t
}

/// The CPU this thread runs on now, 0 if unknown. glibc's `sched_getcpu` reads the `cpu_id`
/// the kernel keeps in the thread's registered rseq area (glibc 2.35+ registers one for every
/// thread), or else asks the vDSO: no system call, no allocation, async-signal-safe. The
/// answer may be stale by the time it is used (the thread can migrate): callers use it only
/// to pick which of several correct places to work on.
#[inline]
pub(crate) fn current_cpu() -> u32 {
    // SAFETY: no arguments; reads thread-local state or calls the vDSO.
    let c = unsafe { libc::sched_getcpu() };
    if c < 0 { 0 } else { c as u32 }
}

/// Whether the thread `tid` (taken from a lock word) is certainly gone.
#[cold]
fn holder_is_dead(tid: u32) -> bool {
    let p = tid as i32;
    if p <= 0 {
        // Not a thread id at all (a corrupt lock word): nobody can be holding it.
        return true;
    }
    // SAFETY: signal 0 only checks for existence and permission; no signal is delivered and
    // no memory is touched. `p > 0`, so it never addresses a process group. On Linux, `kill`
    // finds the task by any thread id (not only a thread group leader's).
    let r = unsafe { libc::kill(p, 0) };
    r != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
}

/// The scheduler state of thread `tid` (the letter in `/proc/<tid>/stat`: `R` running or
/// runnable, `D` uninterruptible wait, `S` sleeping, `T`/`t` stopped, ...), or None if it
/// cannot be read. `/proc/<tid>` exists for every thread id, not only thread group leaders.
/// A few system calls, no allocation.
#[cold]
fn thread_state(tid: u32) -> Option<u8> {
    let mut path = [0u8; 32];
    path[..6].copy_from_slice(b"/proc/");
    let mut digits = [0u8; 10];
    let (mut n, mut t) = (0, tid);
    loop {
        digits[n] = b'0' + (t % 10) as u8;
        n += 1;
        t /= 10;
        if t == 0 {
            break;
        }
    }
    for k in 0..n {
        path[6 + k] = digits[n - 1 - k];
    }
    path[6 + n..6 + n + 5].copy_from_slice(b"/stat"); // NUL-terminated by the zeroed array
    // SAFETY: `path` is a NUL-terminated string on the stack.
    let fd = unsafe { libc::open(path.as_ptr().cast(), libc::O_RDONLY | libc::O_CLOEXEC) };
    if fd < 0 {
        return None;
    }
    let mut buf = [0u8; 128];
    // SAFETY: reads at most buf.len() bytes into the local buffer; fd is ours, closed once.
    let r = unsafe {
        let r = libc::read(fd, buf.as_mut_ptr().cast(), buf.len());
        libc::close(fd);
        r
    };
    let buf = &buf[..usize::try_from(r).ok()?];
    // "tid (comm) S ...": comm may hold ')' but the fields after the state are numbers, so
    // the last ')' read closes comm (comm is at most 15 bytes: it lies within 128 bytes).
    let close = buf.iter().rposition(|&c| c == b')')?;
    buf.get(close + 2).copied()
}

/// How long a lock waiter may wait.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Wait {
    /// A program's helper: spins, then yields the CPU for up to [`HOT_WAIT`], then `EBUSY`.
    Hot,
    /// The syscall-style API (CLI, loaders): spins, then yields the CPU for up to [`SYS_WAIT`].
    Sys,
    /// One attempt only (LRU eviction taking another bucket's lock while holding one).
    Try,
}

/// Spin attempts before the slow path (tens to hundreds of microseconds depending on the
/// CPU's `pause` latency): far longer than any critical section that is not preempted.
const HOT_SPINS: u32 = 1 << 12;
const SYS_SPINS: u32 = 1 << 10;
/// How long a program's helper keeps yielding for a busy lock (its holder may have been
/// preempted: user-space critical sections, unlike the kernel's, can be descheduled).
const HOT_WAIT: Duration = Duration::from_millis(20);
/// The same for the syscall-style API.
const SYS_WAIT: Duration = Duration::from_millis(50);
/// On an overloaded machine a preempted holder can wait for a CPU longer than the windows
/// above. So at the end of each window the waiter looks at the holder's scheduler state:
/// while it is runnable (`R`) or in an uninterruptible wait (`D`, e.g. a page fault on the
/// map file) it is making its way through the critical section, and the waiter grants it
/// another window, up to these totals. A holder that is stopped (`T`, a debugger or
/// SIGSTOP) or sleeping is not coming back soon: the waiter gives up with `EBUSY`.
const HOT_MAX_WAIT: Duration = Duration::from_millis(500);
const SYS_MAX_WAIT: Duration = Duration::from_secs(1);

pub(crate) const EBUSY: MapError = MapError::new(libc::EBUSY, "map lock is busy");

/// A spinlock whose word lives in shared memory.
pub(crate) struct SpinLock<'a> {
    word: &'a AtomicU32,
}

/// Releases the lock when dropped.
pub(crate) struct LockGuard<'a> {
    word: &'a AtomicU32,
}

impl Drop for LockGuard<'_> {
    #[inline]
    fn drop(&mut self) {
        self.word.store(0, Ordering::Release);
    }
}

impl<'a> SpinLock<'a> {
    #[inline]
    pub(crate) fn new(word: &'a AtomicU32) -> Self {
        SpinLock { word }
    }

    #[inline]
    fn try_once(&self, me: u32) -> bool {
        self.word.load(Ordering::Relaxed) == 0
            && self.word.compare_exchange_weak(0, me, Ordering::Acquire, Ordering::Relaxed).is_ok()
    }

    /// Takes the lock if it is free, with one compare-and-swap and no waiting (None
    /// otherwise: the caller goes a way that waits as `lock` does).
    #[inline(always)]
    pub(crate) fn try_lock_once(&self) -> Option<LockGuard<'a>> {
        let me = my_tid();
        self.word
            .compare_exchange(0, me, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
            .then_some(LockGuard { word: self.word })
    }

    /// Takes the lock, or gives up with `EBUSY`: at once on re-entry by the holding thread,
    /// otherwise after the bounded wait `wait` allows.
    #[inline]
    pub(crate) fn lock(&self, wait: Wait) -> Result<LockGuard<'a>, MapError> {
        let me = my_tid();
        if self.word.compare_exchange(0, me, Ordering::Acquire, Ordering::Relaxed).is_ok() {
            return Ok(LockGuard { word: self.word });
        }
        self.lock_slow(me, wait)
    }

    /// Takes the lock over from `holder` if that thread no longer exists.
    #[cold]
    fn take_over_dead(&self, holder: u32, me: u32) -> bool {
        holder != 0
            && holder != me
            && holder_is_dead(holder)
            && self.word.compare_exchange(holder, me, Ordering::Acquire, Ordering::Relaxed).is_ok()
    }

    #[cold]
    fn lock_slow(&self, me: u32, wait: Wait) -> Result<LockGuard<'a>, MapError> {
        let (spins, patience, max_wait) = match wait {
            Wait::Hot => (HOT_SPINS, HOT_WAIT, HOT_MAX_WAIT),
            Wait::Sys => (SYS_SPINS, SYS_WAIT, SYS_MAX_WAIT),
            Wait::Try => (16, Duration::ZERO, Duration::ZERO),
        };
        for _ in 0..spins {
            let w = self.word.load(Ordering::Relaxed);
            if w == me {
                // Re-entry: this thread holds the lock further up its own stack.
                return Err(EBUSY);
            }
            if w == 0 && self.word.compare_exchange_weak(0, me, Ordering::Acquire, Ordering::Relaxed).is_ok() {
                return Ok(LockGuard { word: self.word });
            }
            std::hint::spin_loop();
        }
        if wait == Wait::Try {
            return Err(EBUSY);
        }
        // Slow path: the holder has kept the lock far longer than a critical section takes,
        // so it was most likely preempted (or it died). System calls from here on.
        let holder = self.word.load(Ordering::Relaxed);
        if self.take_over_dead(holder, me) {
            return Ok(LockGuard { word: self.word });
        }
        let start = Instant::now();
        let mut window_end = patience;
        loop {
            for _ in 0..16 {
                if self.try_once(me) {
                    return Ok(LockGuard { word: self.word });
                }
                // SAFETY: no arguments; gives the CPU to another runnable thread (perhaps
                // the preempted holder).
                unsafe { libc::sched_yield() };
            }
            let waited = start.elapsed();
            if waited < window_end {
                continue;
            }
            // End of a window: a dead holder's lock is taken over; a holder still on its way
            // (runnable, or in an uninterruptible wait) gets another window, up to max_wait.
            let holder = self.word.load(Ordering::Relaxed);
            if self.take_over_dead(holder, me) || self.try_once(me) {
                return Ok(LockGuard { word: self.word });
            }
            if waited < max_wait && holder != 0 && matches!(thread_state(holder), Some(b'R' | b'D')) {
                window_end = waited + patience;
                continue;
            }
            return Err(EBUSY);
        }
    }
}

/// Index meaning "none" in free lists and links.
pub(crate) const NIL: u32 = u32::MAX;

/// How many times a lock-free operation retries its compare-and-swap before giving up. Each
/// failure means another thread made progress, so reaching this is practically impossible.
const CAS_RETRIES: u32 = 1 << 20;

/// A lock-free stack of element indices. `head` packs (tag << 32 | index); the links are
/// 32-bit words inside the elements, returned by `link(idx)` (None when out of range).
pub(crate) struct FreeList<'a, F: Fn(u32) -> Option<&'a AtomicU32>> {
    pub head: &'a AtomicU64,
    pub link: F,
}

impl<'a, F: Fn(u32) -> Option<&'a AtomicU32>> FreeList<'a, F> {
    /// Takes an element, or None if the list is empty (or contended beyond reason).
    #[inline]
    pub(crate) fn pop(&self) -> Option<u32> {
        for _ in 0..CAS_RETRIES {
            let h = self.head.load(Ordering::Acquire);
            let idx = h as u32;
            // A corrupt or out-of-range index ends the list.
            let link = (self.link)(idx)?;
            let next = link.load(Ordering::Relaxed);
            let new = ((h >> 32).wrapping_add(1) << 32) | next as u64;
            if self.head.compare_exchange_weak(h, new, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
                return Some(idx);
            }
            std::hint::spin_loop();
        }
        None
    }

    /// Gives an element back. Returns false if it could not (the element then leaks).
    #[inline]
    pub(crate) fn push(&self, idx: u32) -> bool {
        let Some(link) = (self.link)(idx) else { return false };
        for _ in 0..CAS_RETRIES {
            let h = self.head.load(Ordering::Acquire);
            link.store(h as u32, Ordering::Relaxed);
            let new = ((h >> 32).wrapping_add(1) << 32) | idx as u64;
            if self.head.compare_exchange_weak(h, new, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
                return true;
            }
            std::hint::spin_loop();
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_unlock_busy() {
        let w = AtomicU32::new(0);
        let l = SpinLock::new(&w);
        let g = l.lock(Wait::Hot).unwrap();
        assert_eq!(w.load(Ordering::Relaxed), my_tid());
        assert_eq!(l.lock(Wait::Try).err(), Some(EBUSY));
        drop(g);
        assert_eq!(w.load(Ordering::Relaxed), 0);
        assert!(l.lock(Wait::Try).is_ok());
    }

    #[test]
    fn tid_is_per_thread() {
        let me = my_tid();
        assert_eq!(me, my_tid());
        // SAFETY: gettid has no arguments.
        assert_eq!(me as i64, unsafe { libc::syscall(libc::SYS_gettid) } as i64);
        let other = std::thread::spawn(my_tid).join().unwrap();
        assert_ne!(me, other);
    }

    #[test]
    fn self_reentry_fails_at_once() {
        let w = AtomicU32::new(0);
        let l = SpinLock::new(&w);
        let g = l.lock(Wait::Hot).unwrap();
        for wait in [Wait::Hot, Wait::Sys, Wait::Try] {
            // No spinning budget, no yielding: well under the 20 ms slow path (the best of a
            // few tries, in case this thread is descheduled on a loaded machine).
            let best = (0..5)
                .map(|_| {
                    let t = Instant::now();
                    assert_eq!(l.lock(wait).err(), Some(EBUSY));
                    t.elapsed()
                })
                .min()
                .unwrap();
            assert!(best < Duration::from_millis(5), "{wait:?}: {best:?}");
        }
        drop(g);
        assert!(l.lock(Wait::Hot).is_ok());
    }

    #[test]
    fn waits_for_a_holder_that_is_descheduled() {
        // The holder keeps the lock 5 ms (as a preempted holder would), far beyond the spin
        // budget: a program-side waiter must wait for it, not fail.
        let w = AtomicU32::new(0);
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::scope(|s| {
            s.spawn(|| {
                let g = SpinLock::new(&w).lock(Wait::Hot).unwrap();
                tx.send(()).unwrap();
                std::thread::sleep(Duration::from_millis(5));
                drop(g);
            });
            rx.recv().unwrap();
            let g = SpinLock::new(&w).lock(Wait::Hot).expect("waited, not EBUSY");
            assert_eq!(w.load(Ordering::Relaxed), my_tid());
            drop(g);
        });
    }

    #[test]
    fn thread_states() {
        assert_eq!(thread_state(my_tid()), Some(b'R'));
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let (tid_tx, tid_rx) = std::sync::mpsc::channel();
        let h = std::thread::spawn(move || {
            tid_tx.send(my_tid()).unwrap();
            let _ = rx.recv();
        });
        let tid = tid_rx.recv().unwrap();
        // Blocked on the channel (give it a moment to get there).
        let mut st = None;
        for _ in 0..200 {
            st = thread_state(tid);
            if st == Some(b'S') {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(st, Some(b'S'));
        drop(tx);
        h.join().unwrap();
        assert_eq!(thread_state(0x7fff_fff0), None);
    }

    #[test]
    fn waits_beyond_the_window_for_a_runnable_holder() {
        // The holder stays runnable (spinning) for 3 windows: a waiter keeps waiting.
        let w = AtomicU32::new(0);
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::scope(|s| {
            s.spawn(|| {
                let g = SpinLock::new(&w).lock(Wait::Hot).unwrap();
                tx.send(()).unwrap();
                let t = Instant::now();
                while t.elapsed() < 3 * HOT_WAIT {
                    std::hint::spin_loop();
                }
                drop(g);
            });
            rx.recv().unwrap();
            let g = SpinLock::new(&w).lock(Wait::Hot).expect("waited, not EBUSY");
            drop(g);
        });
    }

    #[test]
    fn live_holder_thread_is_not_taken_over_and_dead_one_is() {
        // A live thread other than the main one: kill(tid, 0) must find it.
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let (tid_tx, tid_rx) = std::sync::mpsc::channel();
        let h = std::thread::spawn(move || {
            tid_tx.send(my_tid()).unwrap();
            let _ = rx.recv();
        });
        let tid = tid_rx.recv().unwrap();
        let w = AtomicU32::new(tid);
        let t = Instant::now();
        assert_eq!(SpinLock::new(&w).lock(Wait::Hot).err(), Some(EBUSY));
        let waited = t.elapsed();
        assert!(waited >= HOT_WAIT && waited < Duration::from_secs(2), "{waited:?}");
        assert_eq!(w.load(Ordering::Relaxed), tid);
        // Once that thread has exited (its process lives on), its lock is taken over.
        drop(tx);
        h.join().unwrap();
        let g = SpinLock::new(&w).lock(Wait::Hot).unwrap();
        assert_eq!(w.load(Ordering::Relaxed), my_tid());
        drop(g);
    }

    #[test]
    fn dead_holder_is_taken_over() {
        // A pid that cannot exist (above pid_max's ceiling of 2^22).
        let w = AtomicU32::new(0x7fff_fff0);
        let l = SpinLock::new(&w);
        let g = l.lock(Wait::Hot).unwrap();
        drop(g);
        // Garbage that is not a pid at all.
        let w = AtomicU32::new(0xffff_ffff);
        assert!(SpinLock::new(&w).lock(Wait::Hot).is_ok());
    }

    #[test]
    fn freelist() {
        let links: Vec<AtomicU32> = (0..4).map(|i| AtomicU32::new(if i < 3 { i + 1 } else { NIL })).collect();
        let head = AtomicU64::new(0);
        let fl = FreeList { head: &head, link: |i: u32| links.get(i as usize) };
        assert_eq!(fl.pop(), Some(0));
        assert_eq!(fl.pop(), Some(1));
        assert!(fl.push(0));
        assert_eq!(fl.pop(), Some(0));
        assert_eq!(fl.pop(), Some(2));
        assert_eq!(fl.pop(), Some(3));
        assert_eq!(fl.pop(), None);
        assert!(!fl.push(9));
    }
}
