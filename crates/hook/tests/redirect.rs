//! Entry handlers that change `regs.ip` at a function entry, as `bpf_override_return` does
//! (ip = a bare `ret`, ax = the value): the function is skipped and its caller gets ax, on the
//! lean path and the general one; the site's return probes still fire for such calls, with
//! the overridden value (as the kernel's kretprobes do after an override), also after
//! `HOOK_SKIP`.

use std::ffi::c_void;
use std::hint::black_box;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering::*};

use userbpf_hook::*;

std::arch::global_asm!(
    ".pushsection .text.userbpf_redirect_test,\"ax\",@progbits",
    // u64 t_redir(u64 x): x * 2 + 1.
    ".globl t_redir",
    "t_redir:",
    "    nop dword ptr [rax + rax * 1 + 0]",
    "    lea rax, [rdi + rdi + 1]",
    "    ret",
    ".globl t_just_ret",
    "t_just_ret:",
    "    ret",
    // The lean handler: u64 (PtRegs *regs, u64 *hits, u64 record[3]); odd di: ax = 5000 + di,
    // ip = t_just_ret.
    ".globl t_redir_lean",
    "t_redir_lean:",
    "    lock inc qword ptr [rsi]",
    "    mov rax, [rdi + 112]",
    "    test al, 1",
    "    jz 2f",
    "    add rax, 5000",
    "    mov [rdi + 80], rax",
    "    lea rax, [rip + t_just_ret]",
    "    mov [rdi + 128], rax",
    "2:  xor eax, eax",
    "    ret",
    ".popsection",
);

unsafe extern "C" {
    fn t_redir(x: u64) -> u64;
    fn t_just_ret();
    fn t_redir_lean();
}

/// One test at a time: they share the probed function.
static SERIAL: Mutex<()> = Mutex::new(());

fn expected(x: u64) -> u64 {
    if x % 2 == 1 { 5000 + x } else { 2 * x + 1 }
}

/// The general entry handler: what the lean one does, counted in its data.
unsafe extern "C" fn redirect_general(d: *mut c_void, regs: *mut PtRegs) -> u32 {
    // SAFETY: the tests pass a leaked AtomicU64 and the engine a live pt_regs.
    let (hits, r) = unsafe { (&*(d as *const AtomicU64), &mut *regs) };
    hits.fetch_add(1, SeqCst);
    if r.di % 2 == 1 {
        r.ax = 5000 + r.di;
        r.ip = t_just_ret as *const () as usize as u64;
    }
    HOOK_CONTINUE
}

/// HOOK_SKIP for odd arguments, ax = 5000 + di.
unsafe extern "C" fn skip_odd(d: *mut c_void, regs: *mut PtRegs) -> u32 {
    // SAFETY: as above.
    let (hits, r) = unsafe { (&*(d as *const AtomicU64), &mut *regs) };
    hits.fetch_add(1, SeqCst);
    if r.di % 2 == 1 {
        r.ax = 5000 + r.di;
        return HOOK_SKIP;
    }
    HOOK_CONTINUE
}

/// Return handler: counts returns, sums ax, checks ip is a return address (not the `ret`).
#[repr(C)]
#[derive(Default)]
struct Returns {
    n: AtomicU64,
    sum: AtomicU64,
    bad_ip: AtomicU64,
}

unsafe extern "C" fn on_return(d: *mut c_void, regs: *mut PtRegs) -> u32 {
    // SAFETY: the tests pass a leaked Returns and the engine a live pt_regs.
    let (rets, r) = unsafe { (&*(d as *const Returns), &*regs) };
    rets.n.fetch_add(1, SeqCst);
    rets.sum.fetch_add(r.ax, SeqCst);
    if r.ip == t_just_ret as *const () as usize as u64 || r.ip == t_redir as *const () as usize as u64 {
        rets.bad_ip.fetch_add(1, SeqCst);
    }
    HOOK_CONTINUE
}

fn leak<T>(v: T) -> &'static T {
    Box::leak(Box::new(v))
}

/// Calls t_redir(0..n) and checks every result.
fn calls(n: u64) {
    for i in 0..n {
        // SAFETY: plain function.
        assert_eq!(unsafe { t_redir(black_box(i)) }, expected(i), "t_redir({i})");
    }
}

#[test]
fn a_lean_handler_skips_the_function_and_the_return_probe_sees_the_value() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let addr = t_redir as *const () as usize;
    let lean_hits: &'static AtomicU64 = leak(AtomicU64::new(0));
    let general_hits: &'static AtomicU64 = leak(AtomicU64::new(0));
    let gate: &'static AtomicU8 = leak(AtomicU8::new(0));
    let lean = leak(LeanHandler {
        func: t_redir_lean as *const () as usize,
        arg: lean_hits as *const AtomicU64 as u64,
        gate: gate.as_ptr(),
        failures: leak(AtomicU64::new(0)),
        calls_out: 0,
        reads_all: 1,
        regs_read: LEAN_READS_GPRS,
    });
    let e = attach_lean(
        addr,
        ProbeKind::Entry,
        redirect_general,
        general_hits as *const _ as *mut c_void,
        None,
        Some(lean),
    )
    .unwrap();
    // Entry alone: the lean handler's ip is resumed directly.
    calls(1000);
    let (l, g) = (lean_hits.load(SeqCst), general_hits.load(SeqCst));
    assert_eq!(l + g, 1000);
    assert!(l >= 999, "the lean path ran: lean {l} general {g}");
    // With a return probe: the overridden calls go through the general path to plant it.
    let rets: &'static Returns = leak(Returns::default());
    let r = attach(addr, ProbeKind::Return, on_return, rets as *const Returns as *mut c_void).unwrap();
    calls(1000);
    assert_eq!(lean_hits.load(SeqCst) + general_hits.load(SeqCst), 2000);
    assert!(lean_hits.load(SeqCst) >= 1999, "the lean handler ran every entry");
    assert_eq!(rets.n.load(SeqCst), 1000, "every return seen, overridden ones included");
    assert_eq!(rets.sum.load(SeqCst), (0..1000).map(expected).sum::<u64>());
    assert_eq!(rets.bad_ip.load(SeqCst), 0, "return probes see the caller's return address");
    detach(r).unwrap();
    detach(e).unwrap();
    calls_plain(100);
}

fn calls_plain(n: u64) {
    for i in 0..n {
        // SAFETY: plain function.
        assert_eq!(unsafe { t_redir(black_box(i)) }, 2 * i + 1);
    }
}

#[test]
fn the_general_path_skips_the_function_and_the_return_probe_sees_the_value() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let addr = t_redir as *const () as usize;
    for handler in [redirect_general as Handler, skip_odd as Handler] {
        let hits: &'static AtomicU64 = leak(AtomicU64::new(0));
        let rets: &'static Returns = leak(Returns::default());
        let e = attach(addr, ProbeKind::Entry, handler, hits as *const _ as *mut c_void).unwrap();
        let r = attach(addr, ProbeKind::Return, on_return, rets as *const Returns as *mut c_void).unwrap();
        calls(1000);
        assert_eq!(hits.load(SeqCst), 1000);
        assert_eq!(rets.n.load(SeqCst), 1000, "every return seen, overridden ones included");
        assert_eq!(rets.sum.load(SeqCst), (0..1000).map(expected).sum::<u64>());
        assert_eq!(rets.bad_ip.load(SeqCst), 0);
        // Recursion guard and shadow stack are balanced: a plain call after detaching.
        detach(r).unwrap();
        detach(e).unwrap();
        calls_plain(100);
        assert_eq!(stats().shadow_full, 0);
    }
}
