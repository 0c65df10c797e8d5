//! Lean handlers (`attach_lean`): called directly by the stubs while their probe is alone of
//! its kind at a function entry (or return) and their gate is closed; the general handler runs
//! otherwise. What they see (pt_regs), failures counted, the gate, sharing a site, return
//! probes (recursion included), detach.

use std::ffi::c_void;
use std::hint::black_box;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering::*};

use userbpf_hook::*;

#[path = "support/asm_funcs.rs"]
#[allow(dead_code)]
mod asm_funcs;

std::arch::global_asm!(
    ".pushsection .text.userbpf_lean_test,\"ax\",@progbits",
    // u64 t_lean_entry(u64 x): x * 2 + 1.
    ".globl t_lean_entry",
    "t_lean_entry:",
    "    nop dword ptr [rax + rax * 1 + 0]",
    "    lea rax, [rdi + rdi + 1]",
    "    ret",
    // u64 t_lean_rec(u64 n): n == 0 ? 0 : t_lean_rec(n - 1) + 3 (recursive: return probes).
    ".globl t_lean_rec",
    "t_lean_rec:",
    "    nop dword ptr [rax + rax * 1 + 0]",
    "    test rdi, rdi",
    "    jz 2f",
    "    sub rsp, 8",
    "    dec rdi",
    "    call t_lean_rec",
    "    add rsp, 8",
    "    add rax, 3",
    "    ret",
    "2:  xor eax, eax",
    "    ret",
    // The lean handler: u64 (PtRegs *regs, Rec *arg, u64 record[3]); touches no vector
    // register. arg: [0] hits (locked add), [8] regs.di, [16] regs.ax, [24] regs.ip,
    // [32] regs.sp. di == 77777 at an entry: the run fails (record[0] = 1).
    ".globl t_lean_handler",
    "t_lean_handler:",
    "    lock inc qword ptr [rsi]",
    "    mov rax, [rdi + 112]",
    "    mov [rsi + 8], rax",
    "    mov rax, [rdi + 80]",
    "    mov [rsi + 16], rax",
    "    mov rax, [rdi + 128]",
    "    mov [rsi + 24], rax",
    "    mov rax, [rdi + 152]",
    "    mov [rsi + 32], rax",
    "    cmp qword ptr [rdi + 112], 77777",
    "    jne 3f",
    "    mov qword ptr [rdx], 1",
    "3:  xor eax, eax",
    "    ret",
    ".popsection",
);

unsafe extern "C" {
    fn t_lean_entry(x: u64) -> u64;
    fn t_lean_rec(n: u64) -> u64;
    fn t_lean_handler();
}

#[repr(C)]
#[derive(Default)]
struct Rec {
    hits: AtomicU64,
    di: AtomicU64,
    ax: AtomicU64,
    ip: AtomicU64,
    sp: AtomicU64,
}

/// The general handler: counts its hits in the u64 its data points at.
unsafe extern "C" fn general(d: *mut c_void, _r: *mut PtRegs) -> u32 {
    // SAFETY: the tests pass a leaked AtomicU64.
    unsafe { &*(d as *const AtomicU64) }.fetch_add(1, SeqCst);
    HOOK_CONTINUE
}

/// One test at a time: they share the probed functions.
static SERIAL: Mutex<()> = Mutex::new(());

struct Probe {
    rec: &'static Rec,
    general: &'static AtomicU64,
    gate: &'static AtomicU8,
    failures: &'static AtomicU64,
    lean: &'static LeanHandler,
}

/// `t_lean_handler` as a lean handler writing to `rec`; `reads_all`: it may read all of the
/// pt_regs, else only the registers (which a site alone at a function entry serves with a stub
/// generated for it).
fn handler(rec: &'static Rec, gate: &'static AtomicU8, failures: &'static AtomicU64, reads_all: bool) -> LeanHandler {
    LeanHandler {
        func: t_lean_handler as *const () as usize,
        arg: rec as *const Rec as u64,
        gate: gate.as_ptr(),
        failures,
        calls_out: 0,
        reads_all: u64::from(reads_all),
        regs_read: LEAN_READS_GPRS,
    }
}

fn probe() -> Probe {
    let rec: &'static Rec = Box::leak(Box::default());
    let gate: &'static AtomicU8 = Box::leak(Box::new(AtomicU8::new(0)));
    let failures: &'static AtomicU64 = Box::leak(Box::new(AtomicU64::new(0)));
    let lean = Box::leak(Box::new(handler(rec, gate, failures, true)));
    Probe { rec, general: Box::leak(Box::new(AtomicU64::new(0))), gate, failures, lean }
}

fn attach_p(addr: usize, kind: ProbeKind, p: &Probe) -> ProbeId {
    attach_lean(addr, kind, general, p.general as *const AtomicU64 as *mut c_void, None, Some(p.lean)).unwrap()
}

#[test]
fn lean_entry_probe_runs_the_lean_handler_with_the_registers() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let addr = t_lean_entry as *const () as usize;
    let p = probe();
    let id = attach_p(addr, ProbeKind::Entry, &p);
    for i in 0..1000u64 {
        // SAFETY: plain function.
        assert_eq!(unsafe { t_lean_entry(black_box(i)) }, 2 * i + 1);
    }
    // The thread's first hit may take the general path (it creates the thread's state).
    let (lean, general) = (p.rec.hits.load(SeqCst), p.general.load(SeqCst));
    assert_eq!(lean + general, 1000, "lean {lean} general {general}");
    assert!(lean >= 999, "lean {lean} general {general}");
    assert_eq!(p.rec.di.load(SeqCst), 999);
    assert_eq!(p.rec.ip.load(SeqCst), addr as u64);
    // At a function entry sp points at the return address (8 mod 16 by the ABI).
    assert_eq!(p.rec.sp.load(SeqCst) % 16, 8);

    // A failed run is counted; the function still runs.
    // SAFETY: plain function.
    assert_eq!(unsafe { t_lean_entry(black_box(77777)) }, 155555);
    assert_eq!(p.failures.load(SeqCst), 1);

    // Gate open: the general handler runs instead.
    p.gate.store(1, SeqCst);
    // SAFETY: plain function.
    unsafe { t_lean_entry(black_box(1)) };
    assert_eq!(p.general.load(SeqCst), general + 1);
    assert_eq!(p.rec.hits.load(SeqCst), lean + 1);
    p.gate.store(0, SeqCst);

    // A second entry probe: both run their general handlers.
    let q = probe();
    let id2 = attach_p(addr, ProbeKind::Entry, &q);
    // SAFETY: plain function.
    unsafe { t_lean_entry(black_box(2)) };
    assert_eq!(p.general.load(SeqCst), general + 2);
    assert_eq!(q.general.load(SeqCst), 1);
    assert_eq!(q.rec.hits.load(SeqCst), 0);
    detach(id).unwrap();
    // Alone again: the second probe's lean handler.
    // SAFETY: plain function.
    unsafe { t_lean_entry(black_box(3)) };
    assert_eq!(q.rec.hits.load(SeqCst), 1);
    assert_eq!(q.rec.di.load(SeqCst), 3);
    detach(id2).unwrap();
    // SAFETY: plain function.
    unsafe { t_lean_entry(black_box(4)) };
    assert_eq!(q.rec.hits.load(SeqCst) + q.general.load(SeqCst), 2);
    assert_eq!(p.rec.hits.load(SeqCst), lean + 1);
}

/// The general handler of `registers_only_handler_sees_the_registers_and_falls_back_whole`:
/// counts, and records the flags and ip it was given.
unsafe extern "C" fn general_flags(d: *mut c_void, r: *mut PtRegs) -> u32 {
    // SAFETY: the test passes a leaked [AtomicU64; 3]; the hook passes this hit's registers.
    let (rec, regs) = unsafe { (&*(d as *const [AtomicU64; 3]), &*r) };
    rec[0].fetch_add(1, SeqCst);
    rec[1].store(regs.flags, SeqCst);
    rec[2].store(regs.ip, SeqCst);
    HOOK_CONTINUE
}

/// A lean handler that reads only the registers (`reads_all == 0`): the stub skips the fields
/// after them, the handler still sees every argument register, and a hit handed to the
/// general path (gate open) gets a whole pt_regs (rflags' layout: bit 1 set; the ip).
#[test]
fn registers_only_handler_sees_the_registers_and_falls_back_whole() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let addr = t_lean_entry as *const () as usize;
    let rec: &'static Rec = Box::leak(Box::default());
    let gate: &'static AtomicU8 = Box::leak(Box::new(AtomicU8::new(0)));
    let failures: &'static AtomicU64 = Box::leak(Box::new(AtomicU64::new(0)));
    let lean = Box::leak(Box::new(handler(rec, gate, failures, false)));
    let g: &'static [AtomicU64; 3] = Box::leak(Box::new([AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)]));
    let id =
        attach_lean(addr, ProbeKind::Entry, general_flags, g as *const _ as *mut c_void, None, Some(lean)).unwrap();
    for i in 0..1000u64 {
        // SAFETY: plain function.
        assert_eq!(unsafe { t_lean_entry(black_box(i)) }, 2 * i + 1);
    }
    let (hits, general) = (rec.hits.load(SeqCst), g[0].load(SeqCst));
    assert_eq!(hits + general, 1000, "lean {hits} general {general}");
    assert!(hits >= 999, "lean {hits} general {general}");
    assert_eq!(rec.di.load(SeqCst), 999);
    // A failed run is still counted.
    // SAFETY: plain function.
    assert_eq!(unsafe { t_lean_entry(black_box(77777)) }, 155555);
    assert_eq!(failures.load(SeqCst), 1);
    // Gate open: the general handler gets the flags in rflags' layout and the ip.
    gate.store(1, SeqCst);
    // SAFETY: plain function.
    assert_eq!(unsafe { t_lean_entry(black_box(5)) }, 11);
    assert_eq!(g[0].load(SeqCst), general + 1);
    let flags = g[1].load(SeqCst);
    assert_eq!(flags & 0x2, 0x2, "flags {flags:#x}");
    assert_eq!(flags & !0xfd7, 0x200 & !0xfd7, "flags {flags:#x}: only status flags, bit 1 and IF");
    assert_eq!(g[2].load(SeqCst), addr as u64);
    detach(id).unwrap();
}

/// A lean handler freed at detach and made again at the same address with other contents (as
/// the agent's allocator hands its block out again at the next attach) is what runs: the stub
/// generated for the site the first time is not taken for the second handler's.
#[test]
fn a_handler_made_again_at_a_freed_ones_address_runs_with_its_own_argument() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let addr = t_lean_entry as *const () as usize;
    let gate: &'static AtomicU8 = Box::leak(Box::new(AtomicU8::new(0)));
    let failures: &'static AtomicU64 = Box::leak(Box::new(AtomicU64::new(0)));
    let registers_only = |rec: &'static Rec| handler(rec, gate, failures, false);
    let first: &'static Rec = Box::leak(Box::default());
    let second: &'static Rec = Box::leak(Box::default());
    let lean: *mut LeanHandler = Box::into_raw(Box::new(registers_only(first)));
    let g: &'static AtomicU64 = Box::leak(Box::new(AtomicU64::new(0)));
    let attach = || {
        // SAFETY: `lean` stays allocated for the test's life; it is only rewritten while
        // detached (no hit can read it then).
        let l: &'static LeanHandler = unsafe { &*lean };
        attach_lean(addr, ProbeKind::Entry, general, g as *const AtomicU64 as *mut c_void, None, Some(l)).unwrap()
    };
    let id = attach();
    for i in 0..100u64 {
        // SAFETY: plain function.
        assert_eq!(unsafe { t_lean_entry(black_box(i)) }, 2 * i + 1);
    }
    assert_eq!(first.hits.load(SeqCst) + g.load(SeqCst), 100);
    assert!(first.hits.load(SeqCst) >= 99);
    detach(id).unwrap();
    let before = (first.hits.load(SeqCst), g.load(SeqCst));
    // The next attach's handler, at the freed one's address.
    // SAFETY: detached: nothing reads the handler; same type, a plain overwrite.
    unsafe { lean.write(registers_only(second)) };
    let id = attach();
    for i in 0..100u64 {
        // SAFETY: plain function.
        assert_eq!(unsafe { t_lean_entry(black_box(i)) }, 2 * i + 1);
    }
    assert_eq!(first.hits.load(SeqCst), before.0, "the first handler's argument was used after its detach");
    assert_eq!(second.hits.load(SeqCst) + g.load(SeqCst) - before.1, 100);
    assert_eq!(second.di.load(SeqCst), 99);
    detach(id).unwrap();
}

#[test]
fn lean_return_probe_sees_the_return_value_through_recursion_and_threads() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let addr = t_lean_rec as *const () as usize;
    let p = probe();
    let id = attach_p(addr, ProbeKind::Return, &p);
    // SAFETY: plain function.
    assert_eq!(unsafe { t_lean_rec(black_box(0)) }, 0);
    let base = p.rec.hits.load(SeqCst) + p.general.load(SeqCst);
    assert_eq!(base, 1);
    // SAFETY: plain function (recursion depth 200: 201 returns).
    assert_eq!(unsafe { t_lean_rec(black_box(200)) }, 600);
    assert_eq!(p.rec.hits.load(SeqCst) + p.general.load(SeqCst), base + 201);
    // The outermost return comes last: its value.
    assert_eq!(p.rec.ax.load(SeqCst), 600);
    // ip: the return address, in the caller (this test), not the function.
    let ip = p.rec.ip.load(SeqCst) as usize;
    assert!(ip < addr || ip > addr + 64, "{ip:#x}");
    let threads: Vec<_> = (0..4)
        .map(|t| {
            std::thread::spawn(move || {
                for i in 0..500u64 {
                    // SAFETY: plain function.
                    assert_eq!(unsafe { t_lean_rec(black_box((i + t) % 5)) }, 3 * ((i + t) % 5));
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let total: u64 = (0..4u64).map(|t| (0..500u64).map(|i| (i + t) % 5 + 1).sum::<u64>()).sum();
    assert_eq!(p.rec.hits.load(SeqCst) + p.general.load(SeqCst), base + 201 + total);
    assert!(p.rec.hits.load(SeqCst) > total / 2);
    // An entry probe beside it: both lean (the entry path then plants the trampoline), in
    // every thread (the first hits of a thread may take the general paths).
    let q = probe();
    let id2 = attach_p(addr, ProbeKind::Entry, &q);
    let before = p.rec.hits.load(SeqCst) + p.general.load(SeqCst);
    // SAFETY: plain function.
    assert_eq!(unsafe { t_lean_rec(black_box(3)) }, 9);
    assert_eq!(q.general.load(SeqCst), 0);
    assert_eq!(q.rec.hits.load(SeqCst), 4);
    assert_eq!(q.rec.di.load(SeqCst), 0);
    assert_eq!(p.rec.hits.load(SeqCst) + p.general.load(SeqCst), before + 4);
    assert_eq!(p.rec.ax.load(SeqCst), 9);
    let threads: Vec<_> = (0..3)
        .map(|t| {
            std::thread::spawn(move || {
                for i in 0..300u64 {
                    // SAFETY: plain function.
                    assert_eq!(unsafe { t_lean_rec(black_box((i + t) % 4)) }, 3 * ((i + t) % 4));
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let calls: u64 = (0..3u64).map(|t| (0..300u64).map(|i| (i + t) % 4 + 1).sum::<u64>()).sum();
    assert_eq!(q.rec.hits.load(SeqCst) + q.general.load(SeqCst), 4 + calls);
    assert_eq!(p.rec.hits.load(SeqCst) + p.general.load(SeqCst), before + 4 + calls);
    assert!(q.rec.hits.load(SeqCst) > calls / 2);
    detach(id2).unwrap();
    detach(id).unwrap();
    let after = p.rec.hits.load(SeqCst) + p.general.load(SeqCst);
    // SAFETY: plain function.
    assert_eq!(unsafe { t_lean_rec(black_box(3)) }, 9);
    assert_eq!(p.rec.hits.load(SeqCst) + p.general.load(SeqCst), after);
}

/// Lean entry and return probes on a function left by a longjmp, over and over: the entry
/// path's planting finds the dead frame at or below the new one and hands the hit to the
/// general path, which drops it; the entries are all seen, and the returns that happen.
#[test]
fn lean_entry_and_return_probes_survive_longjmp() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let addr = asm_funcs::lj_probed as *const () as usize;
    let (p, q) = (probe(), probe());
    let ir = attach_p(addr, ProbeKind::Return, &p);
    let ie = attach_p(addr, ProbeKind::Entry, &q);
    let stale_before = stats().shadow_stale;
    std::thread::spawn(|| {
        for _ in 0..3000 {
            // SAFETY: asm test functions; lj_probed(1) jumps back into lj_run.
            assert_eq!(unsafe { asm_funcs::lj_run(asm_funcs::lj_probed, 1) }, 1);
        }
        // SAFETY: as above.
        assert_eq!(unsafe { asm_funcs::lj_run(asm_funcs::lj_probed, 0) }, 0);
        // SAFETY: as above.
        assert_eq!(unsafe { asm_funcs::lj_probed(black_box(0)) }, 42);
    })
    .join()
    .unwrap();
    assert_eq!(q.rec.hits.load(SeqCst) + q.general.load(SeqCst), 3002);
    assert!(q.rec.hits.load(SeqCst) > 0, "the lean entry path ran");
    assert_eq!(p.rec.hits.load(SeqCst) + p.general.load(SeqCst), 2);
    assert!(stats().shadow_stale - stale_before >= 2999);
    detach(ie).unwrap();
    detach(ir).unwrap();
}
