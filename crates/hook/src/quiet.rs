//! Threads of ours inside a target or loader process, kept out of its signals.
//!
//! The kernel delivers a process-directed signal (SIGCHLD, SIGINT from the terminal, a POSIX
//! timer's signal, ...) to any one thread that does not block it. A program that blocks a
//! signal in all its threads to take it from a `signalfd` or `sigwaitinfo` (`script`, systemd
//! tools, bpftrace's children...) would never see it if one of our threads left it
//! unblocked: the kernel would pick ours (default action: nothing, or the program's handler
//! run on a thread it does not know). So every thread userbpf creates blocks every signal,
//! but those it must take itself:
//! - synchronous faults (SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGTRAP, SIGSYS): the kernel forces
//!   them on the faulting thread anyway, but a *blocked* forced signal kills the process
//!   instead of running the handler (the VM's fault guard, the hook's int3 and system call
//!   dispatch handlers);
//! - the hook's own thread-directed signals (`patch::fixup_signal` while code is
//!   patched, [`crate::sud::switch_signal`] for system call dispatch): a thread blocking them
//!   would stall every attach for the broadcast's timeout.
//!
//! Every such thread is also marked as userbpf's own (`thread::mark_thread_ours`): no probe
//! fires for its work and system call dispatch is off for it.
//!
//! The new thread gets the mask at creation (it is inherited from the creating thread, which
//! blocks it for the moment of the call): no signal can reach it before it runs.

use std::io;
use std::thread::JoinHandle;

/// The signals our threads block: all but those listed in the module's documentation.
pub fn quiet_set() -> libc::sigset_t {
    // SAFETY: sigset operations on a local set.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut set);
        for s in [libc::SIGSEGV, libc::SIGBUS, libc::SIGILL, libc::SIGFPE, libc::SIGTRAP, libc::SIGSYS] {
            libc::sigdelset(&mut set, s);
        }
        libc::sigdelset(&mut set, crate::patch::fixup_signal());
        libc::sigdelset(&mut set, crate::sud::switch_signal());
        set
    }
}

/// Blocks [`quiet_set`] in the calling thread (one of ours). Async-signal-safe.
pub fn block_signals() {
    let set = quiet_set();
    // SAFETY: pthread_sigmask on the calling thread with a set we own.
    unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
}

/// Runs `f` (which creates a thread) with [`quiet_set`] blocked in the calling thread, then
/// gives the caller its own mask back: the thread created inherits the blocked set from its
/// first instruction. Signals arriving meanwhile stay pending for the caller's threads.
/// Async-signal-safe itself (for `pthread_create` in a fork handler).
pub fn with_quiet_mask<R>(f: impl FnOnce() -> R) -> R {
    let set = quiet_set();
    // SAFETY: a zeroed sigset_t is a valid value for pthread_sigmask to overwrite.
    let mut old: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: pthread_sigmask on the calling thread with sets we own.
    let ok = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old) } == 0;
    let r = f();
    if ok {
        // SAFETY: as above; restores the mask read above.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut()) };
    }
    r
}

/// Spawns a named thread of ours that blocks every signal it does not need (see the module's
/// documentation). Use it for every thread userbpf starts in a target or loader.
pub fn spawn<F, T>(name: impl Into<String>, f: F) -> io::Result<JoinHandle<T>>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    let builder = std::thread::Builder::new().name(name.into());
    // Creating it is userbpf's work too: the new thread's first system calls (glibc's, before
    // it marks itself) are not the target's, and it gets no system call dispatch.
    let _ours = crate::thread::ours();
    with_quiet_mask(move || {
        builder.spawn(move || {
            // Already inherited; again in case a wrapper of pthread_create changed it.
            block_signals();
            // No probe fires for the work of our threads, nor are their system calls traced.
            crate::thread::mark_thread_ours();
            f()
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blocked(sig: i32) -> bool {
        // SAFETY: reading the calling thread's mask into a set we own.
        unsafe {
            let mut cur: libc::sigset_t = std::mem::zeroed();
            libc::pthread_sigmask(libc::SIG_BLOCK, std::ptr::null(), &mut cur);
            libc::sigismember(&cur, sig) == 1
        }
    }

    #[test]
    fn spawned_threads_block_async_signals_and_keep_faults_and_ours() {
        let caller_before = blocked(libc::SIGCHLD);
        let t = spawn("quiet-test", || {
            let async_sigs =
                [libc::SIGCHLD, libc::SIGINT, libc::SIGTERM, libc::SIGALRM, libc::SIGUSR1, libc::SIGRTMIN()];
            let kept = [
                libc::SIGSEGV,
                libc::SIGBUS,
                libc::SIGILL,
                libc::SIGFPE,
                libc::SIGTRAP,
                libc::SIGSYS,
                crate::patch::fixup_signal(),
                crate::sud::switch_signal(),
            ];
            (
                async_sigs.iter().all(|&s| blocked(s)),
                kept.iter().all(|&s| !blocked(s)),
                std::thread::current().name().map(String::from),
            )
        })
        .unwrap();
        let (all_blocked, none_kept_blocked, name) = t.join().unwrap();
        assert!(all_blocked, "an asynchronous signal is deliverable to our thread");
        assert!(none_kept_blocked, "a fault or the hook's own signal is blocked in our thread");
        assert_eq!(name.as_deref(), Some("quiet-test"));
        // The caller's mask is given back.
        assert_eq!(blocked(libc::SIGCHLD), caller_before);
    }
}
