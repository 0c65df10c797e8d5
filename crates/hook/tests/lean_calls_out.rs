//! Lean handlers that call out (`LeanHandler::calls_out`): the stubs keep the vector
//! registers the probe point may have live (0-7 at an entry, 0-1 at a return) at their full
//! width whether their upper halves are in use or not, and hold the recursion guard (a probed
//! function the handler calls runs no handler); `LEAN_RETRY` hands a hit to the general path.

use std::ffi::c_void;
use std::hint::black_box;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering::*};

use userbpf_hook::*;

std::arch::global_asm!(
    ".pushsection .text.userbpf_calls_out_test,\"ax\",@progbits",
    // void t_co_store_ymm(u8 *out): stores ymm0-7 (32 bytes each) at out.
    ".globl t_co_store_ymm",
    "t_co_store_ymm:",
    "    nop dword ptr [rax + rax * 1 + 0]",
    "    vmovdqu [rdi], ymm0",
    "    vmovdqu [rdi + 32], ymm1",
    "    vmovdqu [rdi + 64], ymm2",
    "    vmovdqu [rdi + 96], ymm3",
    "    vmovdqu [rdi + 128], ymm4",
    "    vmovdqu [rdi + 160], ymm5",
    "    vmovdqu [rdi + 192], ymm6",
    "    vmovdqu [rdi + 224], ymm7",
    "    ret",
    // void t_co_call_ymm(u8 *out, const u8 *in): ymm0-7 = in, then t_co_store_ymm(out).
    ".globl t_co_call_ymm",
    "t_co_call_ymm:",
    "    vmovdqu ymm0, [rsi]",
    "    vmovdqu ymm1, [rsi + 32]",
    "    vmovdqu ymm2, [rsi + 64]",
    "    vmovdqu ymm3, [rsi + 96]",
    "    vmovdqu ymm4, [rsi + 128]",
    "    vmovdqu ymm5, [rsi + 160]",
    "    vmovdqu ymm6, [rsi + 192]",
    "    vmovdqu ymm7, [rsi + 224]",
    "    sub rsp, 8",
    "    call t_co_store_ymm",
    "    add rsp, 8",
    "    vzeroupper",
    "    ret",
    // u64 t_co_inner(u64 x): x + 5 (called by the lean handler: probed, must run no handler).
    ".globl t_co_inner",
    "t_co_inner:",
    "    nop dword ptr [rax + rax * 1 + 0]",
    "    lea rax, [rdi + 5]",
    "    ret",
    // u64 t_co_plain(u64 x): x * 2 (a return probe).
    ".globl t_co_plain",
    "t_co_plain:",
    "    nop dword ptr [rax + rax * 1 + 0]",
    "    lea rax, [rdi + rdi]",
    "    ret",
    // A lean handler that calls nothing and touches no vector register, always giving the
    // hit to the general path: u64 (PtRegs *regs, u64 *hits, u64 record[3]).
    ".globl t_co_retry",
    "t_co_retry:",
    "    lock inc qword ptr [rsi]",
    "    mov qword ptr [rdx], -1",
    "    xor eax, eax",
    "    ret",
    // __m256 x2 t_co_ret_ymm(const u8 *in): returns ymm0 = in[0..32], ymm1 = in[32..64].
    ".globl t_co_ret_ymm",
    "t_co_ret_ymm:",
    "    nop dword ptr [rax + rax * 1 + 0]",
    "    vmovdqu ymm0, [rdi]",
    "    vmovdqu ymm1, [rdi + 32]",
    "    ret",
    // void t_co_call_ret(u8 *out, const u8 *in): out = what t_co_ret_ymm(in) returned.
    ".globl t_co_call_ret",
    "t_co_call_ret:",
    "    push rdi",
    "    mov rdi, rsi",
    "    call t_co_ret_ymm",
    "    pop rdi",
    "    vmovdqu [rdi], ymm0",
    "    vmovdqu [rdi + 32], ymm1",
    "    vzeroupper",
    "    ret",
    ".popsection",
);

unsafe extern "C" {
    fn t_co_store_ymm(out: *mut u8);
    fn t_co_call_ymm(out: *mut u8, input: *const u8);
    fn t_co_inner(x: u64) -> u64;
    fn t_co_plain(x: u64) -> u64;
    fn t_co_ret_ymm(input: *const u8);
    fn t_co_retry();
    fn t_co_call_ret(out: *mut u8, input: *const u8);
}

/// What the calling-out handler does: counts, clobbers every vector register it may
/// (all of ymm0-15), calls a probed function, and (with `retry` set) asks for the general path.
#[repr(C)]
#[derive(Default)]
struct Rec {
    hits: AtomicU64,
    inner: AtomicU64,
    retry: AtomicU8,
}

unsafe extern "C" fn calls_out(_regs: *mut PtRegs, arg: u64, record: *mut [u64; 3]) -> u64 {
    // SAFETY: the tests pass a leaked Rec; `record` is the stub's.
    let rec = unsafe { &*(arg as *const Rec) };
    rec.hits.fetch_add(1, SeqCst);
    if rec.retry.load(SeqCst) != 0 {
        // SAFETY: the stub's three-word record.
        unsafe { (*record)[0] = LEAN_RETRY };
        return 0;
    }
    // SAFETY: AVX is checked by the tests; clobbers only caller-saved vector registers,
    // declared.
    unsafe {
        std::arch::asm!(
            "vpcmpeqd ymm0, ymm0, ymm0",
            "vpcmpeqd ymm1, ymm1, ymm1",
            "vpcmpeqd ymm2, ymm2, ymm2",
            "vpcmpeqd ymm3, ymm3, ymm3",
            "vpcmpeqd ymm4, ymm4, ymm4",
            "vpcmpeqd ymm5, ymm5, ymm5",
            "vpcmpeqd ymm6, ymm6, ymm6",
            "vpcmpeqd ymm7, ymm7, ymm7",
            "vpcmpeqd ymm8, ymm8, ymm8",
            "vpcmpeqd ymm15, ymm15, ymm15",
            out("ymm0") _, out("ymm1") _, out("ymm2") _, out("ymm3") _, out("ymm4") _,
            out("ymm5") _, out("ymm6") _, out("ymm7") _, out("ymm8") _, out("ymm15") _,
            options(nostack, nomem),
        )
    };
    // SAFETY: plain function (probed: its hit must run nothing, the guard being held).
    rec.inner.store(unsafe { t_co_inner(black_box(10)) }, SeqCst);
    0
}

unsafe extern "C" fn general(d: *mut c_void, _r: *mut PtRegs) -> u32 {
    // SAFETY: the tests pass a leaked AtomicU64.
    unsafe { &*(d as *const AtomicU64) }.fetch_add(1, SeqCst);
    HOOK_CONTINUE
}

static SERIAL: Mutex<()> = Mutex::new(());

fn leak<T>(v: T) -> &'static T {
    Box::leak(Box::new(v))
}

struct Probe {
    rec: &'static Rec,
    general: &'static AtomicU64,
    failures: &'static AtomicU64,
    lean: &'static LeanHandler,
}

fn probe() -> Probe {
    let rec: &'static Rec = leak(Rec::default());
    let gate: &'static AtomicU8 = leak(AtomicU8::new(0));
    let failures: &'static AtomicU64 = leak(AtomicU64::new(0));
    let lean = leak(LeanHandler {
        func: calls_out as *const () as usize,
        arg: rec as *const Rec as u64,
        gate: gate.as_ptr(),
        failures,
        calls_out: 1,
        reads_all: 1,
        regs_read: LEAN_READS_GPRS,
    });
    Probe { rec, general: leak(AtomicU64::new(0)), failures, lean }
}

fn attach_p(f: usize, kind: ProbeKind, p: &Probe) -> ProbeId {
    attach_lean(f, kind, general, p.general as *const AtomicU64 as *mut c_void, None, Some(p.lean)).unwrap()
}

/// Calls `t_co_store_ymm` through `t_co_call_ymm` with `input` in ymm0-7; what it saw.
fn call_ymm(input: &[u8; 256]) -> [u8; 256] {
    let mut out = [0u8; 256];
    // SAFETY: AVX checked by the callers; 256-byte buffers.
    unsafe { t_co_call_ymm(out.as_mut_ptr(), input.as_ptr()) };
    out
}

#[test]
fn vector_registers_survive_a_handler_that_calls_out() {
    if !std::arch::is_x86_feature_detected!("avx2") {
        eprintln!("no AVX2 here: the full-width part of this test needs it");
        return;
    }
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let p = probe();
    let inner_general = leak(AtomicU64::new(0));
    let inner = attach(
        t_co_inner as *const () as usize,
        ProbeKind::Entry,
        general,
        inner_general as *const AtomicU64 as *mut c_void,
    )
    .unwrap();
    let id = attach_p(t_co_store_ymm as *const () as usize, ProbeKind::Entry, &p);
    let missed0 = stats().missed_recursion;
    // Upper halves in use (full-width arguments), then only the xmm parts (upper halves zero).
    let wide: [u8; 256] = std::array::from_fn(|i| (i * 7 + 3) as u8);
    let mut narrow = [0u8; 256];
    for r in 0..8 {
        for b in 0..16 {
            narrow[32 * r + b] = (r * 16 + b + 1) as u8;
        }
    }
    for round in 0..200 {
        let input = if round % 2 == 0 { &wide } else { &narrow };
        assert_eq!(&call_ymm(input)[..], &input[..], "round {round}: ymm0-7 as the caller set them");
    }
    let (lean, general) = (p.rec.hits.load(SeqCst), p.general.load(SeqCst));
    assert_eq!(lean + general, 200);
    assert!(lean >= 199, "lean {lean} general {general}");
    // The probed function the handler called ran (x + 5) but none of its handlers: the
    // thread's guard was held, and the hook counted the missed hits.
    assert_eq!(p.rec.inner.load(SeqCst), 15);
    assert_eq!(inner_general.load(SeqCst), 0, "no handler ran inside the lean handler");
    assert!(stats().missed_recursion - missed0 >= lean, "nested hits counted as missed");
    // Outside the handler the inner probe fires as usual.
    // SAFETY: plain function.
    assert_eq!(unsafe { t_co_inner(1) }, 6);
    assert_eq!(inner_general.load(SeqCst), 1);
    assert_eq!(p.failures.load(SeqCst), 0);
    detach(id).unwrap();
    detach(inner).unwrap();
    // SAFETY: plain function, unprobed now.
    unsafe { t_co_store_ymm([0u8; 256].as_mut_ptr()) };
}

#[test]
fn lean_retry_takes_the_general_path_at_entries_and_returns() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let f = t_co_plain as *const () as usize;
    for kind in [ProbeKind::Entry, ProbeKind::Return] {
        let p = probe();
        p.rec.retry.store(1, SeqCst);
        let id = attach_p(f, kind, &p);
        for i in 0..100u64 {
            // SAFETY: plain function.
            assert_eq!(unsafe { t_co_plain(black_box(i)) }, 2 * i, "{kind:?}");
        }
        // Every hit ran the general handler (the lean one gave up, or the thread's first hit
        // took the general path anyway); no failure counted.
        assert_eq!(p.general.load(SeqCst), 100, "{kind:?}");
        assert!(p.rec.hits.load(SeqCst) >= 99, "{kind:?}: the lean handler was tried");
        assert_eq!(p.failures.load(SeqCst), 0, "{kind:?}");
        // Not retrying: the lean handler runs.
        p.rec.retry.store(0, SeqCst);
        // SAFETY: plain function.
        assert_eq!(unsafe { t_co_plain(black_box(7)) }, 14);
        assert_eq!(p.general.load(SeqCst), 100, "{kind:?}");
        detach(id).unwrap();
    }
}

#[test]
fn return_registers_survive_a_return_handler_that_calls_out() {
    if !std::arch::is_x86_feature_detected!("avx2") {
        eprintln!("no AVX2 here: this test needs it");
        return;
    }
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let p = probe();
    let f = t_co_ret_ymm as *const () as usize;
    let id = attach_p(f, ProbeKind::Return, &p);
    let wide: [u8; 64] = std::array::from_fn(|i| (i * 5 + 1) as u8);
    let mut narrow = [0u8; 64];
    for b in 0..16 {
        narrow[b] = b as u8 + 1;
        narrow[32 + b] = b as u8 + 101;
    }
    for round in 0..200 {
        let input = if round % 2 == 0 { &wide } else { &narrow };
        let mut out = [0u8; 64];
        // SAFETY: AVX2 checked; 64-byte buffers.
        unsafe { t_co_call_ret(out.as_mut_ptr(), input.as_ptr()) };
        assert_eq!(&out[..], &input[..], "round {round}: ymm0-1 as the function returned them");
    }
    let (lean, general) = (p.rec.hits.load(SeqCst), p.general.load(SeqCst));
    assert_eq!(lean + general, 200);
    assert!(lean >= 199, "lean {lean} general {general}");
    detach(id).unwrap();
    // SAFETY: unprobed now; reads 64 bytes.
    unsafe { t_co_ret_ymm([0u8; 64].as_ptr()) };
}

/// `LEAN_RETRY` from a lean handler that does not call out (the claiming entry's case).
#[test]
fn lean_retry_from_a_handler_that_does_not_call_out() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let f = t_co_plain as *const () as usize;
    for kind in [ProbeKind::Entry, ProbeKind::Return] {
        let hits: &'static AtomicU64 = leak(AtomicU64::new(0));
        let gate: &'static AtomicU8 = leak(AtomicU8::new(0));
        let failures: &'static AtomicU64 = leak(AtomicU64::new(0));
        let lean = leak(LeanHandler {
            func: t_co_retry as *const () as usize,
            arg: hits as *const AtomicU64 as u64,
            gate: gate.as_ptr(),
            failures,
            calls_out: 0,
            reads_all: 1,
            regs_read: LEAN_READS_GPRS,
        });
        let general_hits: &'static AtomicU64 = leak(AtomicU64::new(0));
        let id =
            attach_lean(f, kind, general, general_hits as *const AtomicU64 as *mut c_void, None, Some(lean)).unwrap();
        for i in 0..100u64 {
            // SAFETY: plain function.
            assert_eq!(unsafe { t_co_plain(black_box(i)) }, 2 * i, "{kind:?}");
        }
        assert_eq!(general_hits.load(SeqCst), 100, "{kind:?}: every hit ran the general handler");
        assert!(hits.load(SeqCst) >= 99, "{kind:?}: the lean handler was tried");
        assert_eq!(failures.load(SeqCst), 0, "{kind:?}");
        detach(id).unwrap();
    }
}

/// A guard-only handler (`LEAN_GUARD_ONLY`, the JIT's claiming entry calling out through its
/// own vector-keeping thunk): no vector register touched by it.
unsafe extern "C" fn guard_only(_regs: *mut PtRegs, arg: u64, record: *mut [u64; 3]) -> u64 {
    // SAFETY: the test passes a leaked Rec; `record` is the stub's.
    let rec = unsafe { &*(arg as *const Rec) };
    rec.hits.fetch_add(1, SeqCst);
    if rec.retry.load(SeqCst) != 0 {
        // SAFETY: the stub's three-word record.
        unsafe { (*record)[0] = LEAN_RETRY };
        return 0;
    }
    // SAFETY: plain function (probed: its hit must run nothing, the guard being held).
    rec.inner.store(unsafe { t_co_inner(black_box(10)) }, SeqCst);
    0
}

/// `LEAN_GUARD_ONLY` at entries and returns: the stub holds the recursion guard around the
/// handler (a probed function it calls runs no handler and counts as missed, and fires again
/// once the handler is done), `LEAN_RETRY` still hands hits to the general path, and the
/// caller's vector registers come back as they were (the handler touches none).
#[test]
fn guard_only_handlers_run_with_the_recursion_guard_held() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let inner_general = leak(AtomicU64::new(0));
    let inner = attach(
        t_co_inner as *const () as usize,
        ProbeKind::Entry,
        general,
        inner_general as *const AtomicU64 as *mut c_void,
    )
    .unwrap();
    let avx = std::arch::is_x86_feature_detected!("avx2");
    for (f, kind) in [
        (t_co_store_ymm as *const () as usize, ProbeKind::Entry),
        (t_co_plain as *const () as usize, ProbeKind::Return),
    ] {
        let rec: &'static Rec = leak(Rec::default());
        let gate: &'static AtomicU8 = leak(AtomicU8::new(0));
        let failures: &'static AtomicU64 = leak(AtomicU64::new(0));
        let lean = leak(LeanHandler {
            func: guard_only as *const () as usize,
            arg: rec as *const Rec as u64,
            gate: gate.as_ptr(),
            failures,
            calls_out: LEAN_GUARD_ONLY,
            reads_all: 1,
            regs_read: LEAN_READS_GPRS,
        });
        let general_hits: &'static AtomicU64 = leak(AtomicU64::new(0));
        let id =
            attach_lean(f, kind, general, general_hits as *const AtomicU64 as *mut c_void, None, Some(lean)).unwrap();
        let missed0 = stats().missed_recursion;
        let before = inner_general.load(SeqCst);
        let input: [u8; 256] = std::array::from_fn(|i| (i * 11 + 5) as u8);
        for i in 0..100u64 {
            if kind == ProbeKind::Entry {
                if avx {
                    assert_eq!(&call_ymm(&input)[..], &input[..], "{kind:?}: ymm0-7 as the caller set them");
                } else {
                    // SAFETY: plain function, unprobed.
                    unsafe { t_co_store_ymm(black_box([0u8; 256]).as_mut_ptr()) };
                }
            } else {
                // SAFETY: plain function.
                assert_eq!(unsafe { t_co_plain(black_box(i)) }, 2 * i, "{kind:?}");
            }
        }
        let (lean_hits, general_n) = (rec.hits.load(SeqCst), general_hits.load(SeqCst));
        assert_eq!(lean_hits + general_n, 100, "{kind:?}");
        assert!(lean_hits >= 99, "{kind:?}: lean {lean_hits} general {general_n}");
        assert_eq!(rec.inner.load(SeqCst), 15, "{kind:?}");
        assert_eq!(inner_general.load(SeqCst), before, "{kind:?}: no handler ran inside the handler");
        assert!(stats().missed_recursion - missed0 >= lean_hits, "{kind:?}: nested hits counted as missed");
        // SAFETY: plain function: outside the handler the inner probe fires.
        assert_eq!(unsafe { t_co_inner(1) }, 6);
        assert_eq!(inner_general.load(SeqCst), before + 1, "{kind:?}");
        // LEAN_RETRY: the general path, with the guard given back.
        rec.retry.store(1, SeqCst);
        let g0 = general_hits.load(SeqCst);
        if kind == ProbeKind::Return {
            // SAFETY: plain function.
            assert_eq!(unsafe { t_co_plain(black_box(3)) }, 6);
        } else {
            // SAFETY: plain function, 256-byte buffer.
            unsafe { t_co_store_ymm([0u8; 256].as_mut_ptr()) };
        }
        assert_eq!(general_hits.load(SeqCst), g0 + 1, "{kind:?}: LEAN_RETRY ran the general handler");
        // SAFETY: plain function.
        assert_eq!(unsafe { t_co_inner(1) }, 6);
        assert_eq!(inner_general.load(SeqCst), before + 2, "{kind:?}: the guard was given back");
        assert_eq!(failures.load(SeqCst), 0, "{kind:?}");
        detach(id).unwrap();
    }
    detach(inner).unwrap();
}
