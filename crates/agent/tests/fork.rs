//! The hook engine across fork(2): the child of a process whose other thread is inside a
//! probe handler (its RCU read section open) when it forks can still attach and detach
//! probes (which wait for read sections), and the probes it inherited keep firing.

use std::ffi::c_void;
use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::time::Duration;

use userbpf_hook::{HOOK_CONTINUE, ProbeKind, PtRegs, attach_symbol, detach};

#[inline(never)]
#[unsafe(no_mangle)]
pub extern "C" fn fork_t_slow(a: u64, b: u64) -> u64 {
    black_box(a.wrapping_mul(31) ^ b.rotate_left(7))
}

#[inline(never)]
#[unsafe(no_mangle)]
pub extern "C" fn fork_t_other(a: u64, b: u64) -> u64 {
    black_box(a.wrapping_mul(17) ^ b.rotate_left(3))
}

static IN_HANDLER: AtomicBool = AtomicBool::new(false);
static HITS: AtomicU64 = AtomicU64::new(0);

/// Holds the caller inside its read section for a while.
unsafe extern "C" fn slow(_: *mut c_void, _: *mut PtRegs) -> u32 {
    IN_HANDLER.store(true, SeqCst);
    std::thread::sleep(Duration::from_millis(300));
    IN_HANDLER.store(false, SeqCst);
    HITS.fetch_add(1, SeqCst);
    HOOK_CONTINUE
}

unsafe extern "C" fn count(_: *mut c_void, _: *mut PtRegs) -> u32 {
    HITS.fetch_add(1, SeqCst);
    HOOK_CONTINUE
}

#[test]
fn a_child_forked_while_a_handler_runs_can_patch_and_its_probes_fire() {
    userbpf_hook::fork::install();
    let _slow = attach_symbol("fork_t_slow", ProbeKind::Entry, slow, std::ptr::null_mut()).unwrap();
    let t = std::thread::spawn(|| fork_t_slow(1, 2));
    while !IN_HANDLER.load(SeqCst) {
        std::thread::yield_now();
    }
    // SAFETY: fork in a test process; the child only runs the code below and _exits.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        // The other thread is gone here, its read section left open in the copy.
        let hits0 = HITS.load(SeqCst);
        let code = (|| {
            let id = attach_symbol("fork_t_other", ProbeKind::Entry, count, std::ptr::null_mut()).ok()?;
            fork_t_other(3, 4);
            detach(id).ok()?;
            fork_t_other(3, 4);
            fork_t_slow(5, 6); // inherited probe: runs `slow` here
            (HITS.load(SeqCst) == hits0 + 2).then_some(())
        })()
        .map_or(1, |_| 0);
        // SAFETY: leaving the child without running the test harness's exit path.
        unsafe { libc::_exit(code) };
    }
    assert!(pid > 0);
    let mut status = 0;
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        // SAFETY: waiting for our own child without blocking.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if r == pid {
            break;
        }
        if std::time::Instant::now() > deadline {
            // SAFETY: killing our own stuck child.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            panic!("the forked child hangs attaching or detaching a probe");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "child status {status:#x}");
    t.join().unwrap();
}
