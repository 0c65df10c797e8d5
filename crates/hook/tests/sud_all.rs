//! System call dispatch sees every system call of the process's threads, libc's wrappers and
//! glibc's internal calls included, with the kernel's numbers, arguments and results; none of
//! userbpf's own (an `ours` scope, a thread of userbpf's); threads created while it is on
//! (clone3 re-run at a stub of its page) get it from their first instruction; signal
//! handlers return through it.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::*};

use userbpf_hook::{PtRegs, ours, quiet, sud};

static ENTER: AtomicU64 = AtomicU64::new(0);
static EXIT: AtomicU64 = AtomicU64::new(0);
static LAST_RET: AtomicI64 = AtomicI64::new(0);
static BAD_FD_CLOSES: AtomicU64 = AtomicU64::new(0);
static ROBUST: AtomicU64 = AtomicU64::new(0);
static CLONE3_PARENT: AtomicU64 = AtomicU64::new(0);
static CLONE3_CHILD: AtomicU64 = AtomicU64::new(0);

fn on_enter(r: &PtRegs) {
    if r.orig_ax == libc::SYS_getppid as u64 {
        ENTER.fetch_add(1, SeqCst);
    }
    if r.orig_ax == libc::SYS_set_robust_list as u64 {
        ROBUST.fetch_add(1, SeqCst);
    }
    if r.orig_ax == libc::SYS_close as u64 && r.di == 987_654 {
        BAD_FD_CLOSES.fetch_add(1, SeqCst);
    }
}

fn on_exit(r: &PtRegs) {
    if r.orig_ax == libc::SYS_clone3 as u64 {
        let c = if r.ax == 0 { &CLONE3_CHILD } else { &CLONE3_PARENT };
        c.fetch_add(1, SeqCst);
    }
    if r.orig_ax == libc::SYS_getppid as u64 {
        EXIT.fetch_add(1, SeqCst);
        LAST_RET.store(r.ax as i64, SeqCst);
    }
}

static SIGNALS: AtomicU64 = AtomicU64::new(0);
extern "C" fn on_usr1(_: i32) {
    // A system call inside the program's own handler (dispatched too).
    // SAFETY: getppid has no preconditions.
    unsafe { libc::getppid() };
    SIGNALS.fetch_add(1, SeqCst);
}

fn getppid() -> i32 {
    // SAFETY: no preconditions.
    unsafe { libc::getppid() }
}

#[test]
fn every_call_but_ours() {
    sud::set_callbacks(on_enter, on_exit);
    sud::enable().expect("system call dispatch (Linux 5.11+)");
    // SAFETY: no preconditions.
    let ppid = unsafe { libc::getppid() };
    assert_eq!((ENTER.load(SeqCst), EXIT.load(SeqCst), LAST_RET.load(SeqCst)), (1, 1, ppid as i64));
    // glibc's internal close (the error path of fclose on a bad descriptor is not it: the
    // plain wrapper is) and a raw one through syscall(): the kernel's arguments.
    // SAFETY: closing a descriptor that does not exist.
    unsafe {
        libc::close(987_654);
        libc::syscall(libc::SYS_close, 987_654);
    }
    assert_eq!(BAD_FD_CLOSES.load(SeqCst), 2);
    // File work in libc (fopen's openat and fclose's __close_nocancel) runs as before.
    assert!(std::fs::read_to_string("/proc/self/stat").unwrap().contains(&format!("{ppid}")));
    {
        let _o = ours();
        getppid();
    }
    assert_eq!(ENTER.load(SeqCst), 1, "a call in an ours scope");
    quiet::spawn("sud-ours", getppid).unwrap().join().unwrap();
    assert_eq!(ENTER.load(SeqCst), 1, "a call on userbpf's thread");
    // A target thread created while dispatch is on (pthread_create's clone3 re-run at a
    // stub), several times from the same call site.
    for _ in 0..3 {
        std::thread::spawn(getppid).join().unwrap();
    }
    assert_eq!((ENTER.load(SeqCst), EXIT.load(SeqCst)), (4, 4), "calls of new threads");
    // Their first calls, glibc's in start_thread before the start routine: each new thread
    // registers its robust list (userbpf's thread above did not count).
    assert_eq!(ROBUST.load(SeqCst), 3, "set_robust_list of the new threads");
    // clone3 returns in both, as the kernel reports it (the parent with the child's id).
    assert_eq!((CLONE3_PARENT.load(SeqCst), CLONE3_CHILD.load(SeqCst)), (3, 3), "clone3's returns");
    // A program's signal handler making a system call, and its return (rt_sigreturn from
    // libc's restorer).
    // SAFETY: installing a plain handler for SIGUSR1, then raising it on this thread.
    unsafe {
        libc::signal(libc::SIGUSR1, on_usr1 as *const () as usize);
        libc::raise(libc::SIGUSR1);
    }
    assert_eq!(SIGNALS.load(SeqCst), 1);
    assert_eq!(ENTER.load(SeqCst), 5, "the handler's call");
    // fork: the child has dispatch too and exits normally.
    // SAFETY: the child only makes system calls and exits.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        let before = ENTER.load(SeqCst);
        getppid();
        // SAFETY: leaving the child at once.
        unsafe { libc::_exit(if ENTER.load(SeqCst) == before + 1 { 0 } else { 3 }) };
    }
    let mut st = 0;
    // SAFETY: waiting for our child.
    unsafe { libc::waitpid(pid, &mut st, 0) };
    assert!(libc::WIFEXITED(st) && libc::WEXITSTATUS(st) == 0, "child status {st:#x}");
    sud::disable();
    getppid();
    assert_eq!(ENTER.load(SeqCst), 5, "dispatch off");
}
