//! fork(2) in a process with the agent: the child keeps the parent's hooks (they are in the
//! copied address space); `pthread_atfork` handlers keep the agent's and the hook engine's
//! locks consistent, and the child starts an agent thread of its own
//! (`watcher::child_thread`), which joins the session as a member of its own and detaches
//! links meant for another pid.
//!
//! The agent's descriptors live in its thread's own table (see `watcher`), which fork does
//! not copy: the child gets the forking thread's table, the program's. So the prepare handler
//! notes which descriptors the agent's thread holds (`/proc/self/task/TID/fd`), and the
//! child's agent thread puts the same files at the same numbers in its own table (reopened
//! through the parent's `/proc/PID/task/TID/fd/N` while the parent lives, else `/dev/null`):
//! the agent's objects copied with the memory (maps, the session, the CPU slots) find their
//! descriptors where they left them, and closing one never closes a file of the program's.

use std::cell::UnsafeCell;
use std::ffi::c_void;
use std::sync::atomic::{AtomicI32, AtomicU32, Ordering};
use std::sync::{MutexGuard, TryLockError};

use crate::{AGENT, Agent, watcher};

struct Held(UnsafeCell<Option<MutexGuard<'static, Agent>>>);
// SAFETY: only the forking thread touches it, between its prepare handler and its parent or
// child handler; another forking thread waits in `fork_prepare` for the agent's lock, which
// is released only after the slot was emptied.
unsafe impl Sync for Held {}
static HELD: Held = Held(UnsafeCell::new(None));

pub(crate) fn install_fork_handlers() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // The runtime's own work on the program's threads (its fork child handler) runs in
        // the hook engine's `ours` scope: no probe or system call tracepoint sees it.
        userbpf_runtime::own_work::set(userbpf_hook::ours_begin, userbpf_hook::ours_end);
        // SAFETY: registers the handlers below, which follow the rules of their comments.
        unsafe { libc::pthread_atfork(Some(fork_prepare), Some(fork_parent), Some(fork_child)) };
    });
}

/// Set when `fork_prepare` could not take the agent's lock: the child then leaves the agent
/// alone (its hooks, copied with the address space, still run).
static FORK_UNLOCKED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Before fork: no sync is half done when the address space is copied. The lock is waited for
/// up to 2 s: a fork from a library constructor (inside dlopen, the loader's lock held) while
/// the watcher waits for the loader must not hang.
extern "C" fn fork_prepare() {
    let _ours = userbpf_hook::ours();
    let Some(cell) = AGENT.get() else { return };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    loop {
        match cell.try_lock() {
            Ok(g) => {
                FORK_UNLOCKED.store(false, Ordering::SeqCst);
                note_agent_fds();
                // SAFETY: see `Held`; this thread owns the agent's lock now.
                unsafe { *HELD.0.get() = Some(g) };
                return;
            }
            Err(TryLockError::Poisoned(p)) => {
                FORK_UNLOCKED.store(false, Ordering::SeqCst);
                note_agent_fds();
                // SAFETY: as above.
                unsafe { *HELD.0.get() = Some(p.into_inner()) };
                return;
            }
            Err(TryLockError::WouldBlock) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_micros(200))
            }
            Err(TryLockError::WouldBlock) => {
                FORK_UNLOCKED.store(true, Ordering::SeqCst);
                return;
            }
        }
    }
}

extern "C" fn fork_parent() {
    let _ours = userbpf_hook::ours();
    // SAFETY: see `Held`; releases the lock taken in `fork_prepare`.
    drop(unsafe { (*HELD.0.get()).take() });
}

/// The agent thread's descriptors when the process last forked (numbers; -1: none).
static FDS: [AtomicI32; 256] = [const { AtomicI32::new(-1) }; 256];
/// The process and agent thread that held them.
static FDS_PID: AtomicU32 = AtomicU32::new(0);
static FDS_TID: AtomicI32 = AtomicI32::new(0);

/// Notes the descriptors of the agent's thread (before fork, see the module's documentation).
fn note_agent_fds() {
    for f in &FDS {
        f.store(-1, Ordering::SeqCst);
    }
    let tid = watcher::agent_tid();
    FDS_TID.store(tid, Ordering::SeqCst);
    FDS_PID.store(std::process::id(), Ordering::SeqCst);
    if tid == 0 {
        return;
    }
    let Ok(rd) = std::fs::read_dir(format!("/proc/self/task/{tid}/fd")) else { return };
    let mut n = 0;
    for e in rd.flatten() {
        if let Some(fd) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok())
            && fd > 2
            && n < FDS.len()
        {
            FDS[n].store(fd, Ordering::SeqCst);
            n += 1;
        }
    }
}

/// In the child's agent thread (its table emptied): the parent's agent descriptors again, at
/// their numbers.
pub(crate) fn restore_agent_fds() {
    let (pid, tid) = (FDS_PID.load(Ordering::SeqCst), FDS_TID.load(Ordering::SeqCst));
    for f in &FDS {
        let fd = f.load(Ordering::SeqCst);
        if fd < 0 {
            continue;
        }
        let path = format!("/proc/{pid}/task/{tid}/fd/{fd}");
        // Only files with a path are reopened (an inotify or eventfd descriptor is the
        // parent's: the child makes its own).
        let named = std::fs::read_link(&path).is_ok_and(|t| t.is_absolute());
        let c = std::ffi::CString::new(if named { path } else { "/dev/null".into() }).unwrap_or_default();
        // SAFETY: a NUL-terminated path; the descriptor is moved to `fd` in this thread's own
        // table (nothing of the program's is there).
        unsafe {
            let mut nfd = libc::open(c.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC);
            if nfd < 0 {
                // A directory, or a file the agent only reads.
                nfd = libc::open(c.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC);
            }
            if nfd < 0 {
                nfd = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC);
            }
            if nfd >= 0 && nfd != fd {
                libc::dup3(nfd, fd, libc::O_CLOEXEC);
                libc::close(nfd);
            }
        }
    }
}

/// In the child: release the agent's lock and start the child's agent thread.
extern "C" fn fork_child() {
    let _ours = userbpf_hook::ours();
    // SAFETY: see `Held`. Releasing a futex mutex in the single-threaded child is an atomic
    // store (plus a wake if a parent thread was waiting, a harmless system call).
    drop(unsafe { (*HELD.0.get()).take() });
    let starting = AGENT.get().is_some() && !crate::detach::is_detached() && !FORK_UNLOCKED.load(Ordering::SeqCst);
    watcher::forget_after_fork(starting);
    if !starting {
        return;
    }
    // SAFETY: pthread_create in the child of fork: glibc has made its thread list, stack
    // cache and malloc usable in the child before running this handler, our own locks are
    // released above, and the handler allocates nothing itself (the thread's start routine
    // does the work once the handler has returned). The attribute lives on this stack for
    // the call only. The thread is created with the program's signals blocked (quiet).
    unsafe {
        let mut attr: libc::pthread_attr_t = std::mem::zeroed();
        libc::pthread_attr_init(&mut attr);
        libc::pthread_attr_setdetachstate(&mut attr, libc::PTHREAD_CREATE_DETACHED);
        libc::pthread_attr_setstacksize(&mut attr, 1 << 20);
        let mut t: libc::pthread_t = 0;
        if userbpf_hook::quiet::with_quiet_mask(|| {
            libc::pthread_create(&mut t, &attr, child_thread, std::ptr::null_mut())
        }) != 0
        {
            watcher::forget_after_fork(false);
        }
        libc::pthread_attr_destroy(&mut attr);
    }
}

extern "C" fn child_thread(_: *mut c_void) -> *mut c_void {
    let _ = std::panic::catch_unwind(|| {
        let _ = std::thread::current(); // named by the thread's handle: "userbpf-agent"
        // SAFETY: prctl(PR_SET_NAME) with a NUL-terminated name of at most 16 bytes.
        unsafe { libc::prctl(libc::PR_SET_NAME, c"userbpf-agent".as_ptr() as libc::c_ulong, 0, 0, 0) };
        watcher::child_thread();
    });
    std::ptr::null_mut()
}
