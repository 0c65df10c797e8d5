//! userbpf's own work is not probed: no handler runs for a call made inside an `ours` scope,
//! nor on a thread of userbpf's (`quiet::spawn`, `mark_thread_ours`); scopes nest and give the
//! thread back as it was.

use std::ffi::c_void;
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering::*};

use userbpf_hook::*;

#[inline(never)]
#[no_mangle]
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
