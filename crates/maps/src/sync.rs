//! Synchronisation inside shared memory, between threads of several processes.
//!
//! * [`SpinLock`]: a 32-bit lock word holding 0 (free) or the pid of the process that holds it.
//!   Taking it spins a bounded number of times ([`Wait::Hot`] for programs: only `spin_loop`
//!   hints; [`Wait::Sys`] for the syscall-style API: spins, then yields the CPU for up to
//!   50 ms) and then gives
//!   up with `EBUSY`, as the kernel's htab bucket lock does on re-entry. Before giving up, a
//!   waiter checks once (`kill(pid, 0)`) whether the holder still exists; if that process is
//!   gone it died inside the critical section and the lock is taken over, so a crashed
//!   process never blocks a map forever. That probe is the only system call the hot path can
//!   make, and only after its spin budget is exhausted. The data structures are written so
//!   that a critical section cut short at any point leaves them traversable (at worst an
//!   element leaks or a count is off by one).
//! * [`FreeList`]: a lock-free stack of element indices (Treiber stack with a 32-bit tag
//!   against ABA) whose links live in the elements.
//! * [`my_pid`]: the process id, cached (reset in a fork's child by a `pthread_atfork` hook).

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use crate::types::MapError;

static PID: AtomicU32 = AtomicU32::new(0);
static ATFORK: std::sync::Once = std::sync::Once::new();

extern "C" fn reset_pid_in_child() {
    PID.store(0, Ordering::Relaxed);
}

/// This process's id, without a system call after the first.
#[inline]
pub(crate) fn my_pid() -> u32 {
    let p = PID.load(Ordering::Relaxed);
    if p != 0 {
        return p;
    }
    my_pid_slow()
}

#[cold]
fn my_pid_slow() -> u32 {
    ATFORK.call_once(|| {
        // SAFETY: registers a plain function that only stores to an atomic (async-signal-safe,
        // as a fork child handler must be); the handler lives for the whole program.
        unsafe { libc::pthread_atfork(None, None, Some(reset_pid_in_child)) };
    });
    let p = std::process::id();
    PID.store(p, Ordering::Relaxed);
    p
}

/// Whether the process `pid` (taken from a lock word) is certainly gone.
#[cold]
fn holder_is_dead(pid: u32) -> bool {
    let p = pid as i32;
    if p <= 0 {
        // Not a pid at all (a corrupt lock word): nobody can be holding it.
        return true;
    }
    // SAFETY: signal 0 only checks for existence and permission; no signal is delivered and
    // no memory is touched. `p > 0`, so it never addresses a process group.
    let r = unsafe { libc::kill(p, 0) };
    r != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
}

/// How long a lock waiter may wait.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Wait {
    /// A program's helper: spins only, then `EBUSY`.
    Hot,
    /// The syscall-style API (CLI, loaders): spins, then yields the CPU for a while.
    Sys,
    /// One attempt only (LRU eviction taking another bucket's lock while holding one).
    Try,
}

const HOT_SPINS: u32 = 1 << 15;
const SYS_SPINS: u32 = 1 << 10;
/// How long the syscall-style API keeps yielding for a busy lock (a holder may have been
/// preempted: userspace critical sections, unlike the kernel's, can be descheduled).
const SYS_WAIT: std::time::Duration = std::time::Duration::from_millis(50);

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

    /// Takes the lock, or gives up with `EBUSY` after the bounded wait `wait` allows.
    #[inline]
    pub(crate) fn lock(&self, wait: Wait) -> Result<LockGuard<'a>, MapError> {
        let me = my_pid();
        if self.word.compare_exchange(0, me, Ordering::Acquire, Ordering::Relaxed).is_ok() {
            return Ok(LockGuard { word: self.word });
        }
        self.lock_slow(me, wait)
    }

    #[cold]
    fn lock_slow(&self, me: u32, wait: Wait) -> Result<LockGuard<'a>, MapError> {
        let spins = match wait {
            Wait::Hot => HOT_SPINS,
            Wait::Sys => SYS_SPINS,
            Wait::Try => 16,
        };
        for _ in 0..spins {
            if self.try_once(me) {
                return Ok(LockGuard { word: self.word });
            }
            std::hint::spin_loop();
        }
        if wait == Wait::Sys {
            let start = std::time::Instant::now();
            while start.elapsed() < SYS_WAIT {
                for _ in 0..64 {
                    if self.try_once(me) {
                        return Ok(LockGuard { word: self.word });
                    }
                    std::thread::yield_now();
                }
            }
        }
        if wait == Wait::Try {
            return Err(EBUSY);
        }
        // The holder has kept the lock far longer than any critical section takes: if its
        // process no longer exists, take the lock over.
        let holder = self.word.load(Ordering::Relaxed);
        if holder != 0
            && holder != me
            && holder_is_dead(holder)
            && self.word.compare_exchange(holder, me, Ordering::Acquire, Ordering::Relaxed).is_ok()
        {
            return Ok(LockGuard { word: self.word });
        }
        if self.try_once(me) {
            return Ok(LockGuard { word: self.word });
        }
        Err(EBUSY)
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
        assert_eq!(w.load(Ordering::Relaxed), my_pid());
        assert_eq!(l.lock(Wait::Try).err(), Some(EBUSY));
        drop(g);
        assert_eq!(w.load(Ordering::Relaxed), 0);
        assert!(l.lock(Wait::Try).is_ok());
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
