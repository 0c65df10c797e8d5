//! userbpf's own work is not probed: no handler runs for a call made inside an `ours` scope,
//! nor on a thread of userbpf's (`quiet::spawn`, `mark_thread_ours`); scopes nest and give the
//! thread back as it was.

use std::ffi::c_void;
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering::*};

use userbpf_hook::*;

std::arch::global_asm!(
    ".pushsection .text.userbpf_ours_test,\"ax\",@progbits",
    // u64 t_ours_lean(u64 x): x + 5.
    ".globl t_ours_lean",
    "t_ours_lean:",
    "    nop dword ptr [rax + rax * 1 + 0]",
    "    lea rax, [rdi + 5]",
    "    ret",
    // A lean handler: u64 (PtRegs *regs, u64 *hits, u64 record[3]) counting its hits.
    ".globl t_ours_lean_handler",
    "t_ours_lean_handler:",
    "    lock inc qword ptr [rsi]",
    "    xor eax, eax",
    "    ret",
    ".popsection",
);

unsafe extern "C" {
    fn t_ours_lean(x: u64) -> u64;
    fn t_ours_lean_handler();
}

#[inline(never)]
#[unsafe(no_mangle)]
pub extern "C" fn t_ours(x: u64) -> u64 {
    black_box(x.wrapping_mul(7) ^ 0x33)
}

static ENTRIES: AtomicU64 = AtomicU64::new(0);
static RETURNS: AtomicU64 = AtomicU64::new(0);

unsafe extern "C" fn count(d: *mut c_void, _regs: *mut PtRegs) -> u32 {
    // SAFETY: data is one of the &'static AtomicU64 above.
    unsafe { (*(d as *const AtomicU64)).fetch_add(1, SeqCst) };
    HOOK_CONTINUE
}

fn counts() -> (u64, u64) {
    (ENTRIES.load(SeqCst), RETURNS.load(SeqCst))
}

#[test]
fn no_probe_fires_for_our_own_work() {
    let d = |s: &'static AtomicU64| s as *const AtomicU64 as *mut c_void;
    let e = attach_symbol("t_ours", ProbeKind::Entry, count, d(&ENTRIES)).unwrap();
    let r = attach_symbol("t_ours", ProbeKind::Return, count, d(&RETURNS)).unwrap();
    t_ours(1);
    assert_eq!(counts(), (1, 1), "the target's call");
    assert!(!probes_off());
    {
        let _a = ours();
        assert!(probes_off());
        t_ours(2);
        {
            let _b = ours();
            t_ours(3);
        }
        // The inner scope gave back the outer one's state.
        assert!(probes_off());
        t_ours(4);
    }
    assert!(!probes_off());
    assert_eq!(counts(), (1, 1), "calls inside ours scopes");
    t_ours(5);
    assert_eq!(counts(), (2, 2), "the target's call after the scope");
    // A thread of userbpf's: never; a thread of the target's: as usual.
    let t = quiet::spawn("ours-test", || {
        for i in 0..10 {
            t_ours(i);
        }
        (is_thread_ours(), probes_off())
    })
    .unwrap();
    assert_eq!(t.join().unwrap(), (true, true));
    assert_eq!(counts(), (2, 2), "calls on userbpf's thread");
    std::thread::spawn(|| {
        // A scope on a thread that has no state yet.
        {
            let _a = ours();
            t_ours(6);
        }
        t_ours(7);
    })
    .join()
    .unwrap();
    assert_eq!(counts(), (3, 3), "a target thread: its own call only");
    assert!(!is_thread_ours());
    detach(e).unwrap();
    detach(r).unwrap();
}

/// Both kinds of lean handler (one that touches no state, one that calls out and so runs
/// with the recursion guard held) run nothing for userbpf's own work.
#[test]
fn no_lean_handler_fires_for_our_own_work() {
    for calls_out in [0, 1] {
        lean_handler_and_our_work(calls_out);
    }
}

fn lean_handler_and_our_work(calls_out: u64) {
    static LEAN: AtomicU64 = AtomicU64::new(0);
    static GENERAL: AtomicU64 = AtomicU64::new(0);
    static GATE: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);
    static FAILURES: AtomicU64 = AtomicU64::new(0);
    LEAN.store(0, SeqCst);
    GENERAL.store(0, SeqCst);
    let lean: &'static LeanHandler = Box::leak(Box::new(LeanHandler {
        func: t_ours_lean_handler as *const () as usize,
        arg: &LEAN as *const AtomicU64 as u64,
        gate: GATE.as_ptr(),
        failures: &FAILURES,
        calls_out,
        reads_all: 1,
        regs_read: LEAN_READS_GPRS,
    }));
    let addr = t_ours_lean as *const () as usize;
    let id = attach_lean(addr, ProbeKind::Entry, count, &GENERAL as *const AtomicU64 as *mut c_void, None, Some(lean))
        .unwrap();
    let hits = || LEAN.load(SeqCst) + GENERAL.load(SeqCst);
    // SAFETY: (every call below) a plain function.
    assert_eq!(unsafe { t_ours_lean(black_box(1)) }, 6);
    assert_eq!(hits(), 1, "the target's call");
    {
        let _o = ours();
        for i in 0..10 {
            // SAFETY: a plain function.
            assert_eq!(unsafe { t_ours_lean(black_box(i)) }, i + 5);
        }
    }
    assert_eq!(hits(), 1, "calls inside an ours scope (lean path included)");
    // SAFETY: a plain function.
    quiet::spawn("ours-lean", || unsafe { t_ours_lean(black_box(2)) }).unwrap().join().unwrap();
    assert_eq!(hits(), 1, "a call on userbpf's thread");
    // SAFETY: a plain function.
    unsafe { t_ours_lean(black_box(3)) };
    assert_eq!(hits(), 2, "the target's call after the scope");
    detach(id).unwrap();
}
