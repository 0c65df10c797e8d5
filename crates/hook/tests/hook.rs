use std::ffi::c_void;
use std::hint::black_box;
use std::ptr::null_mut;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::*};

use userbpf_hook::*;

#[path = "support/asm_funcs.rs"]
mod asm_funcs;
use asm_funcs::*;

fn addr_of_sym(name: &str) -> (usize, Option<usize>) {
    let r = symbols::resolve(name).expect("resolve");
    (r.addr, r.size)
}

fn bytes_at(addr: usize) -> [u8; 8] {
    let mut b = [0u8; 8];
    // SAFETY: test functions are at least 8 bytes long (or padded).
    unsafe { std::ptr::copy_nonoverlapping(addr as *const u8, b.as_mut_ptr(), 8) };
    b
}

// --------------------------------------------------------- arguments ----

#[inline(never)]
#[unsafe(no_mangle)]
pub extern "C" fn t_args(a: u64, b: u64, c: u64, d: u64, e: u64, f: u64) -> u64 {
    black_box(a + 2 * b + 3 * c + 4 * d + 5 * e + 6 * f)
}

static ARGS: [AtomicU64; 6] = [const { AtomicU64::new(0) }; 6];
static ARGS_IP: AtomicU64 = AtomicU64::new(0);
static ARGS_SP_OK: AtomicBool = AtomicBool::new(false);

unsafe extern "C" fn args_handler(_d: *mut c_void, regs: *mut PtRegs) -> u32 {
    // SAFETY: the engine passes a valid pt_regs for the duration of the call.
    let r = unsafe { &*regs };
    for (i, a) in ARGS.iter().enumerate() {
        a.store(r.arg(i).unwrap(), SeqCst);
    }
    ARGS_IP.store(r.ip, SeqCst);
    // At the entry, [sp] is the return address: inside this test binary's text.
    // SAFETY: at a function entry sp points at the return address on the live stack.
    let ra = unsafe { *(r.sp as *const u64) };
    ARGS_SP_OK.store(r.sp % 16 == 8 && ra != 0, SeqCst);
    HOOK_CONTINUE
}

#[test]
fn uprobe_reads_arguments() {
    let (addr, size) = addr_of_sym("t_args");
    assert!(size.is_some());
    let id = attach_symbol("t_args", ProbeKind::Entry, args_handler, null_mut()).unwrap();
    let r = t_args(black_box(11), 22, 33, 44, 55, 66);
    assert_eq!(r, 11 + 44 + 99 + 176 + 275 + 396);
    let got: Vec<u64> = ARGS.iter().map(|a| a.load(SeqCst)).collect();
    assert_eq!(got, vec![11, 22, 33, 44, 55, 66]);
    assert_eq!(ARGS_IP.load(SeqCst), addr as u64);
    assert!(ARGS_SP_OK.load(SeqCst));
    detach(id).unwrap();
}

// ------------------------------------------------------------ return ----

#[inline(never)]
#[unsafe(no_mangle)]
pub extern "C" fn t_ret(x: u64) -> u64 {
    black_box(x * 3 + 1)
}

static RET_AX: AtomicU64 = AtomicU64::new(0);
static RET_HITS: AtomicU64 = AtomicU64::new(0);

unsafe extern "C" fn ret_handler(_d: *mut c_void, regs: *mut PtRegs) -> u32 {
    // SAFETY: the engine passes a valid pt_regs for the duration of the call.
    RET_AX.store(unsafe { (*regs).rc() }, SeqCst);
    RET_HITS.fetch_add(1, SeqCst);
    HOOK_CONTINUE
}

#[test]
fn uretprobe_reads_return_value() {
    let id = attach_symbol("t_ret", ProbeKind::Return, ret_handler, null_mut()).unwrap();
    for i in 0..10u64 {
        assert_eq!(t_ret(black_box(i)), i * 3 + 1);
        assert_eq!(RET_AX.load(SeqCst), i * 3 + 1);
    }
    assert_eq!(RET_HITS.load(SeqCst), 10);
    detach(id).unwrap();
    t_ret(5);
    assert_eq!(RET_HITS.load(SeqCst), 10);
}

// ------------------------------------------- both kinds, many handlers ----

#[inline(never)]
#[unsafe(no_mangle)]
pub extern "C" fn t_both(x: u64) -> u64 {
    black_box(x ^ 0x5555)
}

unsafe extern "C" fn count_handler(d: *mut c_void, _regs: *mut PtRegs) -> u32 {
    // SAFETY: data is the &'static AtomicU64 passed to attach.
    unsafe { (*(d as *const AtomicU64)).fetch_add(1, SeqCst) };
    HOOK_CONTINUE
}

unsafe extern "C" fn sum_ret_handler(d: *mut c_void, regs: *mut PtRegs) -> u32 {
    // SAFETY: data is the &'static AtomicU64 passed to attach.
    unsafe { (*(d as *const AtomicU64)).fetch_add((*regs).ax, SeqCst) };
    HOOK_CONTINUE
}

#[test]
fn entry_and_return_with_several_handlers() {
    static A: AtomicU64 = AtomicU64::new(0);
    static B: AtomicU64 = AtomicU64::new(0);
    static R: AtomicU64 = AtomicU64::new(0);
    let d = |s: &'static AtomicU64| s as *const AtomicU64 as *mut c_void;
    let ia = attach_symbol("t_both", ProbeKind::Entry, count_handler, d(&A)).unwrap();
    let ib = attach_symbol("t_both", ProbeKind::Entry, count_handler, d(&B)).unwrap();
    let ir = attach_symbol("t_both", ProbeKind::Return, sum_ret_handler, d(&R)).unwrap();
    let mut expect = 0;
    for i in 0..100u64 {
        let v = t_both(black_box(i));
        assert_eq!(v, i ^ 0x5555);
        expect += v;
    }
    assert_eq!((A.load(SeqCst), B.load(SeqCst), R.load(SeqCst)), (100, 100, expect));
    detach(ib).unwrap();
    t_both(1);
    assert_eq!((A.load(SeqCst), B.load(SeqCst)), (101, 100));
    detach(ia).unwrap();
    detach(ir).unwrap();
    assert_eq!(detach(ir), Err(HookError::UnknownProbe(ir)));
}

// ------------------------------------------------- detach restores bytes ----

#[inline(never)]
#[unsafe(no_mangle)]
pub extern "C" fn t_detach(x: u64) -> u64 {
    black_box(x.wrapping_mul(7))
}

#[test]
fn detach_restores_bytes_and_behaviour() {
    static N: AtomicU64 = AtomicU64::new(0);
    let (addr, _) = addr_of_sym("t_detach");
    let before = bytes_at(addr);
    let id = attach_symbol("t_detach", ProbeKind::Entry, count_handler, &N as *const _ as *mut c_void).unwrap();
    let during = bytes_at(addr);
    assert_eq!(during[0], 0xE9);
    assert_eq!(&during[5..], &before[5..]);
    assert_eq!(t_detach(black_box(3)), 21);
    detach(id).unwrap();
    assert_eq!(bytes_at(addr), before);
    assert_eq!(t_detach(black_box(4)), 28);
    assert_eq!(N.load(SeqCst), 1);
    // Re-attach reuses the site.
    let id = attach_symbol("t_detach", ProbeKind::Entry, count_handler, &N as *const _ as *mut c_void).unwrap();
    assert_eq!(t_detach(black_box(5)), 35);
    assert_eq!(N.load(SeqCst), 2);
    detach(id).unwrap();
    assert_eq!(bytes_at(addr), before);
}

// ------------------------------------------ register writes and skipping ----

#[inline(never)]
#[unsafe(no_mangle)]
pub extern "C" fn t_override(x: u64) -> u64 {
    OVERRIDE_BODY.fetch_add(1, SeqCst);
    black_box(x + 1)
}
static OVERRIDE_BODY: AtomicU64 = AtomicU64::new(0);

unsafe extern "C" fn skip_handler(_d: *mut c_void, regs: *mut PtRegs) -> u32 {
    // SAFETY: the engine passes a valid pt_regs for the duration of the call.
    let r = unsafe { &mut *regs };
    if r.di == 100 {
        r.ax = 777;
        return HOOK_SKIP;
    }
    if r.di == 200 {
        r.di = 1000; // change the argument
    }
    HOOK_CONTINUE
}

#[test]
fn handlers_can_change_registers_and_skip_the_function() {
    let id = attach_symbol("t_override", ProbeKind::Entry, skip_handler, null_mut()).unwrap();
    assert_eq!(t_override(black_box(1)), 2);
    assert_eq!(OVERRIDE_BODY.load(SeqCst), 1);
    assert_eq!(t_override(black_box(100)), 777);
    assert_eq!(OVERRIDE_BODY.load(SeqCst), 1);
    assert_eq!(t_override(black_box(200)), 1001);
    detach(id).unwrap();
    assert_eq!(t_override(black_box(100)), 101);
}

// ----------------------------------------------------- relocation cases ----

#[test]
fn rip_relative_first_instruction_is_relocated() {
    static N: AtomicU64 = AtomicU64::new(0);
    static R: AtomicU64 = AtomicU64::new(0);
    let ie = attach_symbol("t_riprel", ProbeKind::Entry, count_handler, &N as *const _ as *mut c_void).unwrap();
    let ir = attach_symbol("t_riprel", ProbeKind::Return, sum_ret_handler, &R as *const _ as *mut c_void).unwrap();
    // SAFETY: asm test function.
    assert_eq!(unsafe { t_riprel(black_box(5)) }, 1005);
    assert_eq!((N.load(SeqCst), R.load(SeqCst)), (1, 1005));
    detach(ie).unwrap();
    detach(ir).unwrap();
}

#[test]
fn short_jcc_in_first_bytes_is_relocated() {
    static N: AtomicU64 = AtomicU64::new(0);
    let id = attach_symbol("t_jcc", ProbeKind::Entry, count_handler, &N as *const _ as *mut c_void).unwrap();
    // SAFETY: asm test function.
    unsafe {
        assert_eq!(t_jcc(black_box(0)), u64::MAX);
        assert_eq!(t_jcc(black_box(9)), 10);
    }
    assert_eq!(N.load(SeqCst), 2);
    detach(id).unwrap();
}

unsafe extern "C" fn nop_handler(_d: *mut c_void, _r: *mut PtRegs) -> u32 {
    HOOK_CONTINUE
}

#[test]
fn short_function_uses_the_padding_after_it() {
    static N: AtomicU64 = AtomicU64::new(0);
    let (addr, _) = addr_of_sym("t_short");
    let before = bytes_at(addr);
    let id = attach_symbol("t_short", ProbeKind::Entry, count_handler, &N as *const _ as *mut c_void).unwrap();
    assert_eq!(probe_method(addr), Some((Method::Padding, addr)));
    // SAFETY: asm test function.
    assert_eq!(unsafe { t_short() }, 0);
    assert_eq!(N.load(SeqCst), 1);
    detach(id).unwrap();
    assert_eq!(bytes_at(addr), before);
}

#[test]
fn branch_into_patched_bytes_takes_a_breakpoint() {
    static N: AtomicU64 = AtomicU64::new(0);
    let (addr, _) = addr_of_sym("t_loop");
    let id = attach_symbol("t_loop", ProbeKind::Entry, count_handler, &N as *const _ as *mut c_void).unwrap();
    assert_eq!(probe_method(addr), Some((Method::Breakpoint, addr)));
    // SAFETY: asm test function.
    assert_eq!(unsafe { t_loop(black_box(5)) }, 5);
    assert_eq!(N.load(SeqCst), 1);
    detach(id).unwrap();
    // +2 is the loop head: the jump back lands on the patch's first byte, the probe fires on
    // each iteration.
    let id = attach_symbol("t_loop+2", ProbeKind::Entry, count_handler, &N as *const _ as *mut c_void).unwrap();
    // SAFETY: asm test function.
    assert_eq!(unsafe { t_loop(black_box(5)) }, 5);
    assert_eq!(N.load(SeqCst), 6);
    detach(id).unwrap();
    let e = attach_symbol("t_loop+1", ProbeKind::Entry, nop_handler, null_mut()).unwrap_err();
    assert!(e.to_string().contains("not an instruction boundary"), "{e}");
}

#[test]
fn bad_targets_are_errors() {
    static DATA: u64 = 0;
    let e = attach(&DATA as *const u64 as usize, ProbeKind::Entry, nop_handler, null_mut()).unwrap_err();
    assert!(matches!(e, HookError::NotCode { .. }), "{e}");
    assert!(matches!(attach(0, ProbeKind::Entry, nop_handler, null_mut()), Err(HookError::NotCode { .. })));
    assert!(symbols::resolve("no_such_function_xyz").is_err());
    assert!(symbols::resolve("libc.so.6:no_such_function_xyz").is_err());
    assert!(symbols::resolve("libnotloaded.so:foo").is_err());
    assert!(symbols::resolve("t_args+zz").is_err());
    assert!(symbols::resolve("t_args+100000").is_err());
    assert!(symbols::resolve("0xzz").is_err());
    assert!(symbols::resolve(":").is_err());
    // Return probes need a function entry.
    let r = symbols::resolve("t_args").unwrap();
    let ext = FuncExtent { start: r.func_start, len: r.size.unwrap() };
    let e = attach_with(r.addr + 1, ProbeKind::Return, nop_handler, null_mut(), Some(ext));
    assert!(e.is_err());
}

// ---------------------------------------------------------- threading ----

#[inline(never)]
#[unsafe(no_mangle)]
pub extern "C" fn t_stress(x: u64) -> u64 {
    STRESS_CALLS.fetch_add(1, Relaxed);
    black_box(x + 1)
}
static STRESS_CALLS: AtomicU64 = AtomicU64::new(0);

#[test]
fn four_threads_while_attaching_and_detaching() {
    static HITS: AtomicU64 = AtomicU64::new(0);
    static RETS: AtomicU64 = AtomicU64::new(0);
    static DONE: AtomicUsize = AtomicUsize::new(0);
    static GO: AtomicBool = AtomicBool::new(false);
    const N: u64 = 100_000;
    let r = symbols::resolve("t_stress").unwrap();
    let ext = Some(FuncExtent { start: r.func_start, len: r.size.unwrap() });
    let workers: Vec<_> = (0..4)
        .map(|t| {
            std::thread::spawn(move || {
                while !GO.load(SeqCst) {
                    std::hint::spin_loop();
                }
                for i in 0..N {
                    let x = t * N + i;
                    assert_eq!(t_stress(black_box(x)), x + 1);
                }
                DONE.fetch_add(1, SeqCst);
            })
        })
        .collect();
    let mut rounds = 0;
    let hits_data = &HITS as *const _ as *mut c_void;
    let rets_data = &RETS as *const _ as *mut c_void;
    while DONE.load(SeqCst) < 4 {
        let e = attach_with(r.addr, ProbeKind::Entry, count_handler, hits_data, ext).unwrap();
        let rr = attach_with(r.addr, ProbeKind::Return, count_handler, rets_data, ext).unwrap();
        GO.store(true, SeqCst);
        std::thread::yield_now();
        detach(e).unwrap();
        detach(rr).unwrap();
        rounds += 1;
    }
    for w in workers {
        w.join().unwrap();
    }
    let hits = HITS.load(SeqCst);
    let rets = RETS.load(SeqCst);
    assert_eq!(STRESS_CALLS.load(SeqCst), 4 * N);
    assert!(hits <= 4 * N && rets <= 4 * N, "hits {hits} rets {rets}");
    assert!(rounds >= 1);
    eprintln!("stress: {rounds} attach/detach rounds, {hits} entry hits, {rets} return hits, {:?}", stats());
}

// ------------------------------------------------- patch in progress ----

#[inline(never)]
#[unsafe(no_mangle)]
pub extern "C" fn t_window(x: u64) -> u64 {
    WINDOW_CALLS.fetch_add(1, SeqCst);
    black_box(x * 3)
}
static WINDOW_CALLS: AtomicU64 = AtomicU64::new(0);
static WINDOW_RESULT: AtomicU64 = AtomicU64::new(0);

/// Called by the engine while a jump's int3 is in place: when it is t_window's, another thread
/// calls t_window, meeting the patch in progress.
fn call_t_window_in_the_window(addr: usize) {
    if addr == symbols::resolve("t_window").unwrap().addr {
        let r = std::thread::spawn(|| t_window(black_box(7))).join().unwrap();
        WINDOW_RESULT.store(r, SeqCst);
    }
}

/// A call that meets the `int3` of a jump being written fires the probe, as a kernel uprobe
/// fires from its `int3` on (a test harness that starts its workload once the probed bytes
/// changed saw both calls of a function missed, once, under load: the patch was in
/// progress). Here the return probe's attach makes the patch; its return handler sees the
/// call made in the window.
#[test]
fn a_call_meeting_the_patch_in_progress_fires_the_probe() {
    static RETS: AtomicU64 = AtomicU64::new(0);
    static HITS: AtomicU64 = AtomicU64::new(0);
    let r = symbols::resolve("t_window").unwrap();
    let ext = Some(FuncExtent { start: r.func_start, len: r.size.unwrap() });
    let orig = bytes_at(r.addr);
    let traps = stats().traps;
    set_patch_pause(Some(call_t_window_in_the_window));
    let rr = attach_with(r.addr, ProbeKind::Return, sum_ret_handler, &RETS as *const _ as *mut c_void, ext);
    set_patch_pause(None);
    let rr = rr.unwrap();
    assert_eq!(WINDOW_CALLS.load(SeqCst), 1, "the call in the window ran the function once");
    assert_eq!(WINDOW_RESULT.load(SeqCst), 21, "and returned its value");
    assert!(stats().traps > traps, "the call met the int3: {:?}", stats());
    assert_eq!(RETS.load(SeqCst), 21, "the return probe saw the call made while the jump was written");
    let e = attach_with(r.addr, ProbeKind::Entry, count_handler, &HITS as *const _ as *mut c_void, ext).unwrap();
    assert_eq!(t_window(black_box(5)), 15);
    assert_eq!((HITS.load(SeqCst), RETS.load(SeqCst)), (1, 36));
    detach(e).unwrap();
    detach(rr).unwrap();
    assert_eq!(bytes_at(r.addr), orig);
    assert_eq!(t_window(black_box(1)), 3);
    assert_eq!((HITS.load(SeqCst), RETS.load(SeqCst)), (1, 36));
}

// ---------------------------------------------------------- recursion ----

#[inline(never)]
#[unsafe(no_mangle)]
pub extern "C" fn t_rec(n: u64) -> u64 {
    if n == 0 { 0 } else { black_box(t_rec(black_box(n - 1))) + 1 }
}

#[test]
fn deep_recursion_with_uretprobe() {
    static E: AtomicU64 = AtomicU64::new(0);
    static R: AtomicU64 = AtomicU64::new(0);
    let ie = attach_symbol("t_rec", ProbeKind::Entry, count_handler, &E as *const _ as *mut c_void).unwrap();
    let ir = attach_symbol("t_rec", ProbeKind::Return, count_handler, &R as *const _ as *mut c_void).unwrap();
    let full_before = stats().shadow_full;
    // Run on a thread with a big stack: 10000 frames.
    let v = std::thread::Builder::new().stack_size(64 << 20).spawn(|| t_rec(black_box(9999))).unwrap().join().unwrap();
    assert_eq!(v, 9999);
    assert_eq!(E.load(SeqCst), 10000);
    assert_eq!(R.load(SeqCst), SHADOW_CAPACITY as u64);
    assert!(stats().shadow_full - full_before >= 10000 - SHADOW_CAPACITY as u64);
    // Shallow recursion: every return seen.
    R.store(0, SeqCst);
    assert_eq!(t_rec(black_box(99)), 99);
    assert_eq!(R.load(SeqCst), 100);
    detach(ie).unwrap();
    detach(ir).unwrap();
}

// ------------------------------------------------------------ longjmp ----

#[test]
fn longjmp_out_of_a_probed_function() {
    static R: AtomicU64 = AtomicU64::new(0);
    static LAST: AtomicU64 = AtomicU64::new(0);
    unsafe extern "C" fn h(_d: *mut c_void, regs: *mut PtRegs) -> u32 {
        R.fetch_add(1, SeqCst);
        // SAFETY: the engine passes a valid pt_regs for the duration of the call.
        LAST.store(unsafe { (*regs).ax }, SeqCst);
        HOOK_CONTINUE
    }
    let id = attach_symbol("lj_probed", ProbeKind::Return, h, null_mut()).unwrap();
    let stale_before = stats().shadow_stale;
    std::thread::spawn(move || {
        for _ in 0..3000 {
            // SAFETY: asm test functions; lj_probed(1) jumps back into lj_run.
            assert_eq!(unsafe { lj_run(lj_probed, 1) }, 1);
        }
        // SAFETY: as above.
        assert_eq!(unsafe { lj_run(lj_probed, 0) }, 0);
        // SAFETY: as above.
        assert_eq!(unsafe { lj_probed(black_box(0)) }, 42);
    })
    .join()
    .unwrap();
    assert_eq!(R.load(SeqCst), 2);
    assert_eq!(LAST.load(SeqCst), 42);
    assert!(stats().shadow_stale - stale_before >= 2999);
    detach(id).unwrap();
}

// -------------------------------------------------------- thread exit ----

#[test]
fn thread_exiting_inside_a_probed_call() {
    static E: AtomicU64 = AtomicU64::new(0);
    static R: AtomicU64 = AtomicU64::new(0);
    let ie = attach_symbol("t_exit", ProbeKind::Entry, count_handler, &E as *const _ as *mut c_void).unwrap();
    let ir = attach_symbol("t_exit", ProbeKind::Return, count_handler, &R as *const _ as *mut c_void).unwrap();
    extern "C" fn start(_: *mut c_void) -> *mut c_void {
        // SAFETY: t_exit(1) ends this thread with pthread_exit.
        unsafe { t_exit(1) };
        null_mut()
    }
    let freed_before = stats().thread_states_freed;
    for _ in 0..8 {
        let mut th: libc::pthread_t = 0;
        // SAFETY: plain pthread_create/join of a thread running `start`.
        unsafe {
            assert_eq!(libc::pthread_create(&mut th, std::ptr::null(), start, null_mut()), 0);
            assert_eq!(libc::pthread_join(th, null_mut()), 0);
        }
    }
    assert_eq!(E.load(SeqCst), 8);
    assert_eq!(R.load(SeqCst), 0);
    assert!(stats().thread_states_freed - freed_before >= 8);
    // The probe still works on this thread.
    // SAFETY: asm test function.
    assert_eq!(unsafe { t_exit(0) }, 7);
    assert_eq!(R.load(SeqCst), 1);
    detach(ie).unwrap();
    detach(ir).unwrap();
}

// ---------------------------------------------------------------- libc ----

#[test]
fn probe_on_libc_getpid_by_name() {
    static E: AtomicU64 = AtomicU64::new(0);
    static PID: AtomicU64 = AtomicU64::new(0);
    unsafe extern "C" fn h(_d: *mut c_void, regs: *mut PtRegs) -> u32 {
        // SAFETY: the engine passes a valid pt_regs for the duration of the call.
        PID.store(unsafe { (*regs).ax }, SeqCst);
        HOOK_CONTINUE
    }
    let r = symbols::resolve("libc.so.6:getpid").unwrap();
    assert!(r.path.to_string_lossy().contains("libc"));
    let ie = attach_symbol("libc.so.6:getpid", ProbeKind::Entry, count_handler, &E as *const _ as *mut c_void).unwrap();
    let ir = attach_symbol("libc.so.6:getpid", ProbeKind::Return, h, null_mut()).unwrap();
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() };
    assert!(E.load(SeqCst) >= 1);
    assert_eq!(PID.load(SeqCst), pid as u64);
    detach(ie).unwrap();
    detach(ir).unwrap();
    // An ifunc resolves to its implementation.
    let s = symbols::resolve("libc.so.6:strlen").unwrap();
    assert_ne!(s.addr, 0);
}

#[test]
fn library_watcher_sees_nothing_new_without_dlopen() {
    let mut w = symbols::LibraryWatcher::new();
    assert!(w.poll().is_empty());
    assert!(!symbols::loaded_objects().is_empty());
}

// ------------------------------------------- FP state across handlers ----

#[inline(never)]
#[unsafe(no_mangle)]
pub extern "C" fn t_fp_args(a: f64, b: f32, c: f64, d: f32, e: f64, f: f64, g: f64, h: f64) -> f64 {
    black_box(a * 2.0 + b as f64 * 3.0 + c * 5.0 + d as f64 * 7.0 + e * 11.0 + f * 13.0 + g * 17.0 + h * 19.0)
}

static FP_CLOBBER_HITS: AtomicU64 = AtomicU64::new(0);

/// Clobbers xmm0-15 (at ymm width when AVX is available), MXCSR stays.
unsafe extern "C" fn fp_clobber_handler(_d: *mut c_void, regs: *mut PtRegs) -> u32 {
    FP_CLOBBER_HITS.fetch_add(1, SeqCst);
    // SAFETY: only scratch vector registers are written (declared clobbered).
    unsafe {
        core::arch::asm!(
            "pcmpeqd xmm0, xmm0", "pcmpeqd xmm1, xmm1", "pcmpeqd xmm2, xmm2", "pcmpeqd xmm3, xmm3",
            "pcmpeqd xmm4, xmm4", "pcmpeqd xmm5, xmm5", "pcmpeqd xmm6, xmm6", "pcmpeqd xmm7, xmm7",
            "pcmpeqd xmm8, xmm8", "pcmpeqd xmm9, xmm9", "pcmpeqd xmm10, xmm10", "pcmpeqd xmm11, xmm11",
            "pcmpeqd xmm12, xmm12", "pcmpeqd xmm13, xmm13", "pcmpeqd xmm14, xmm14", "pcmpeqd xmm15, xmm15",
            out("xmm0") _, out("xmm1") _, out("xmm2") _, out("xmm3") _, out("xmm4") _, out("xmm5") _,
            out("xmm6") _, out("xmm7") _, out("xmm8") _, out("xmm9") _, out("xmm10") _, out("xmm11") _,
            out("xmm12") _, out("xmm13") _, out("xmm14") _, out("xmm15") _,
        );
    }
    if std::is_x86_feature_detected!("avx") {
        // SAFETY: AVX is available; ymm0-15 are declared clobbered.
        unsafe {
            core::arch::asm!(
                "vpcmpeqd ymm0, ymm0, ymm0", "vpcmpeqd ymm1, ymm1, ymm1", "vpcmpeqd ymm2, ymm2, ymm2",
                "vpcmpeqd ymm3, ymm3, ymm3", "vpcmpeqd ymm4, ymm4, ymm4", "vpcmpeqd ymm5, ymm5, ymm5",
                "vpcmpeqd ymm6, ymm6, ymm6", "vpcmpeqd ymm7, ymm7, ymm7", "vpcmpeqd ymm8, ymm8, ymm8",
                "vpcmpeqd ymm15, ymm15, ymm15",
                out("ymm0") _, out("ymm1") _, out("ymm2") _, out("ymm3") _, out("ymm4") _, out("ymm5") _,
                out("ymm6") _, out("ymm7") _, out("ymm8") _, out("ymm15") _,
            );
        }
    }
    // SAFETY: the engine passes a valid pt_regs.
    let _ = unsafe { (*regs).ax };
    HOOK_CONTINUE
}

fn fp_expected() -> f64 {
    1.5 * 2.0 + 2.25 * 3.0 + 3.125 * 5.0 + 4.5 * 7.0 + 5.75 * 11.0 + 6.5 * 13.0 + 7.25 * 17.0 + 8.0 * 19.0
}

fn fp_call() -> f64 {
    black_box(t_fp_args)(
        black_box(1.5),
        black_box(2.25),
        black_box(3.125),
        black_box(4.5),
        black_box(5.75),
        black_box(6.5),
        black_box(7.25),
        black_box(8.0),
    )
}

#[test]
fn fp_args_and_return_survive_clobbering_handlers() {
    let want = fp_expected();
    assert_eq!(fp_call(), want);
    let before = FP_CLOBBER_HITS.load(SeqCst);
    let e = attach_symbol("t_fp_args", ProbeKind::Entry, fp_clobber_handler, null_mut()).unwrap();
    assert_eq!(fp_call(), want);
    let r = attach_symbol("t_fp_args", ProbeKind::Return, fp_clobber_handler, null_mut()).unwrap();
    for _ in 0..100 {
        assert_eq!(fp_call(), want);
    }
    detach(e).unwrap();
    assert_eq!(fp_call(), want);
    detach(r).unwrap();
    assert_eq!(fp_call(), want);
    assert_eq!(FP_CLOBBER_HITS.load(SeqCst) - before, 1 + 200 + 1);
}

// x87 return value (long double): st0 must survive a return handler that
// wipes the x87 state.
std::arch::global_asm!(
    ".text",
    ".globl t_x87",
    ".type t_x87,@function",
    ".balign 16",
    "t_x87:",
    "push rdi",
    "fild qword ptr [rsp]",
    "pop rdi",
    "fld1",
    "faddp st(1), st",
    "ret",
    ".size t_x87, . - t_x87",
);

unsafe extern "C" {
    fn t_x87(x: u64);
}

/// Calls t_x87(x) and converts its st0 result back to an integer.
fn call_x87(x: u64) -> i64 {
    let mut out: i64 = 0;
    // SAFETY: t_x87 follows the ABI except that it returns a long double in
    // st0, which we pop into `out`; every caller-saved register is clobbered.
    unsafe {
        core::arch::asm!(
            "call rax",
            "fistp qword ptr [r12]",
            in("rax") t_x87 as *const () as usize,
            in("rdi") x,
            in("r12") &mut out as *mut i64,
            clobber_abi("C"),
        );
    }
    out
}

static X87_HITS: AtomicU64 = AtomicU64::new(0);

unsafe extern "C" fn x87_clobber_handler(_d: *mut c_void, _r: *mut PtRegs) -> u32 {
    X87_HITS.fetch_add(1, SeqCst);
    // SAFETY: the x87 registers are declared clobbered; the stack is left empty.
    unsafe {
        core::arch::asm!(
            "fldpi", "fldpi", "fldpi", "fninit",
            out("st(0)") _, out("st(1)") _, out("st(2)") _, out("st(3)") _,
            out("st(4)") _, out("st(5)") _, out("st(6)") _, out("st(7)") _,
        );
    }
    HOOK_CONTINUE
}

#[test]
fn x87_return_value_survives_return_handler() {
    assert_eq!(call_x87(41), 42);
    let r = attach_symbol("t_x87", ProbeKind::Return, x87_clobber_handler, null_mut()).unwrap();
    for i in 0..50u64 {
        assert_eq!(call_x87(i), i as i64 + 1);
    }
    let e = attach_symbol("t_x87", ProbeKind::Entry, x87_clobber_handler, null_mut()).unwrap();
    assert_eq!(call_x87(7), 8);
    detach(r).unwrap();
    detach(e).unwrap();
    assert_eq!(call_x87(9), 10);
    assert_eq!(X87_HITS.load(SeqCst), 50 + 2);
}

// An entry handler that changes ip: execution resumes at the new address
// with the probed rsp (here: another function with the same signature).
#[inline(never)]
#[unsafe(no_mangle)]
pub extern "C" fn t_redir_from(x: u64) -> u64 {
    black_box(x + 1000)
}

#[inline(never)]
#[unsafe(no_mangle)]
pub extern "C" fn t_redir_to(x: u64) -> u64 {
    black_box(x * 3)
}

unsafe extern "C" fn redirect_handler(_d: *mut c_void, regs: *mut PtRegs) -> u32 {
    // SAFETY: the engine passes a valid pt_regs.
    unsafe { (*regs).ip = t_redir_to as *const () as u64 };
    HOOK_CONTINUE
}

#[test]
fn entry_handler_redirects_ip() {
    assert_eq!(black_box(t_redir_from as extern "C" fn(u64) -> u64)(5), 1005);
    let id = attach_symbol("t_redir_from", ProbeKind::Entry, redirect_handler, null_mut()).unwrap();
    for i in 0..20u64 {
        assert_eq!(black_box(t_redir_from as extern "C" fn(u64) -> u64)(i), i * 3);
    }
    detach(id).unwrap();
    assert_eq!(black_box(t_redir_from as extern "C" fn(u64) -> u64)(5), 1005);
}
