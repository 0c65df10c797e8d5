//! Stubs generated per site (`stubs::fast_stub`): a lean entry handler alone at its site gets
//! one, which keeps every register of the probed code, builds only the registers the handler
//! reads, keeps the recursion guard and "ours" state, the gate, failures and the retry, and is
//! switched away (and back) as the site's probes change, with detach still waiting for it.

use std::ffi::c_void;
use std::hint::black_box;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering::*};

use userbpf_hook::*;

std::arch::global_asm!(
    ".pushsection .text.userbpf_sitestub_test,\"ax\",@progbits",
    // void t_ss_target(void): stores every register but rsp, as it finds them, in t_ss_seen
    // (pt_regs order: r15 r14 r13 r12 rbp rbx r11 r10 r9 r8 rax rcx rdx rsi rdi).
    ".globl t_ss_target",
    "t_ss_target:",
    "    nop dword ptr [rax + rax * 1 + 0]",
    "    mov [rip + t_ss_seen + 0], r15",
    "    mov [rip + t_ss_seen + 8], r14",
    "    mov [rip + t_ss_seen + 16], r13",
    "    mov [rip + t_ss_seen + 24], r12",
    "    mov [rip + t_ss_seen + 32], rbp",
    "    mov [rip + t_ss_seen + 40], rbx",
    "    mov [rip + t_ss_seen + 48], r11",
    "    mov [rip + t_ss_seen + 56], r10",
    "    mov [rip + t_ss_seen + 64], r9",
    "    mov [rip + t_ss_seen + 72], r8",
    "    mov [rip + t_ss_seen + 80], rax",
    "    mov [rip + t_ss_seen + 88], rcx",
    "    mov [rip + t_ss_seen + 96], rdx",
    "    mov [rip + t_ss_seen + 104], rsi",
    "    mov [rip + t_ss_seen + 112], rdi",
    "    ret",
    // void t_ss_call(const u64 vals[15]): loads every register but rsp from vals (pt_regs
    // order) and calls t_ss_target.
    ".globl t_ss_call",
    "t_ss_call:",
    "    push rbx",
    "    push rbp",
    "    push r12",
    "    push r13",
    "    push r14",
    "    push r15",
    "    sub rsp, 8",
    "    mov r15, [rdi + 0]",
    "    mov r14, [rdi + 8]",
    "    mov r13, [rdi + 16]",
    "    mov r12, [rdi + 24]",
    "    mov rbp, [rdi + 32]",
    "    mov rbx, [rdi + 40]",
    "    mov r11, [rdi + 48]",
    "    mov r10, [rdi + 56]",
    "    mov r9, [rdi + 64]",
    "    mov r8, [rdi + 72]",
    "    mov rax, [rdi + 80]",
    "    mov rcx, [rdi + 88]",
    "    mov rdx, [rdi + 96]",
    "    mov rsi, [rdi + 104]",
    "    mov rdi, [rdi + 112]",
    "    call t_ss_target",
    "    add rsp, 8",
    "    pop r15",
    "    pop r14",
    "    pop r13",
    "    pop r12",
    "    pop rbp",
    "    pop rbx",
    "    ret",
    // u64 t_ss_plain(u64 x): x + 9 (the function of the threads and guard tests).
    ".globl t_ss_plain",
    "t_ss_plain:",
    "    nop dword ptr [rax + rax * 1 + 0]",
    "    lea rax, [rdi + 9]",
    "    ret",
    // The lean handler: u64 (PtRegs *regs, u64 arg[4], u64 record[3]), reading di, bx and
    // r12 (pt_regs words 14, 5, 3), clobbering every caller-saved register. di == 88888: runs
    // nothing, asks for the general path; di == 77777: counted, then fails (the whole record
    // written, as the JIT's abort path writes it).
    ".globl t_ss_handler",
    "t_ss_handler:",
    "    cmp qword ptr [rdi + 112], 88888",
    "    jne 2f",
    "    mov qword ptr [rdx], -1",
    "    ret",
    "2:  lock inc qword ptr [rsi]",
    "    mov rax, [rdi + 112]",
    "    mov [rsi + 8], rax",
    "    mov rax, [rdi + 40]",
    "    mov [rsi + 16], rax",
    "    mov rax, [rdi + 24]",
    "    mov [rsi + 24], rax",
    "    cmp qword ptr [rdi + 112], 77777",
    "    jne 3f",
    "    mov qword ptr [rdx], 1",
    "    mov qword ptr [rdx + 8], 2",
    "    mov qword ptr [rdx + 16], 3",
    "3:  mov rax, -1",
    "    mov rcx, -1",
    "    mov rdx, -1",
    "    mov rsi, -1",
    "    mov rdi, -1",
    "    mov r8, -1",
    "    mov r9, -1",
    "    mov r10, -1",
    "    mov r11, -1",
    "    ret",
    ".popsection",
    ".pushsection .bss.userbpf_sitestub_test,\"aw\",@nobits",
    ".globl t_ss_seen",
    "t_ss_seen:",
    ".zero 120",
    ".popsection",
);

unsafe extern "C" {
    fn t_ss_target();
    fn t_ss_call(vals: *const u64);
    fn t_ss_plain(x: u64) -> u64;
    fn t_ss_handler();
    static t_ss_seen: [u64; 15];
}

/// One test at a time: they share the probed functions.
static SERIAL: Mutex<()> = Mutex::new(());

/// The general handler: counts its hits in the AtomicU64 its data points at.
unsafe extern "C" fn general(d: *mut c_void, _r: *mut PtRegs) -> u32 {
    // SAFETY: the tests pass a leaked AtomicU64.
    unsafe { &*(d as *const AtomicU64) }.fetch_add(1, SeqCst);
    HOOK_CONTINUE
}

fn leak<T>(v: T) -> &'static T {
    Box::leak(Box::new(v))
}

struct Probe {
    /// hits, di, bx, r12 as the lean handler saw them
    rec: &'static [AtomicU64; 4],
    general: &'static AtomicU64,
    gate: &'static AtomicU8,
    failures: &'static AtomicU64,
    lean: &'static LeanHandler,
}

fn probe(regs_read: u64) -> Probe {
    let rec: &'static [AtomicU64; 4] = leak(Default::default());
    let gate = leak(AtomicU8::new(0));
    let failures = leak(AtomicU64::new(0));
    let lean = leak(LeanHandler {
        func: t_ss_handler as *const () as usize,
        arg: rec.as_ptr() as u64,
        gate: gate.as_ptr(),
        failures,
        calls_out: 0,
        reads_all: 0,
        regs_read,
    });
    Probe { rec, general: leak(AtomicU64::new(0)), gate, failures, lean }
}

fn attach_p(addr: usize, p: &Probe) -> ProbeId {
    attach_lean(addr, ProbeKind::Entry, general, p.general as *const AtomicU64 as *mut c_void, None, Some(p.lean))
        .unwrap()
}

fn call_with(vals: &[u64; 15]) -> [u64; 15] {
    // SAFETY: t_ss_call loads 15 words from vals and calls t_ss_target, which writes
    // t_ss_seen (read after, on this thread; tests are serialised).
    unsafe {
        t_ss_call(vals.as_ptr());
        std::ptr::read_volatile(&raw const t_ss_seen)
    }
}

fn vals(i: u64) -> [u64; 15] {
    std::array::from_fn(|k| 0x1000_0000_0000 * (k as u64 + 1) + i)
}

#[test]
fn a_lone_lean_handler_gets_a_generated_stub_that_keeps_every_register() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let addr = t_ss_target as *const () as usize;
    // Reads di, bx, r12: the stub stores those two callee-saved registers too.
    let p = probe((1 << 14) | (1 << 5) | (1 << 3));
    let id = attach_p(addr, &p);
    assert_eq!(uses_generated_stub(addr), Some(true));
    for i in 0..1000 {
        let v = vals(i);
        assert_eq!(call_with(&v), v, "call {i}: the function saw other registers");
    }
    // The thread's first hit may take the general path (it creates the thread's state).
    let (lean, gen0) = (p.rec[0].load(SeqCst), p.general.load(SeqCst));
    assert_eq!(lean + gen0, 1000, "lean {lean} general {gen0}");
    assert!(lean >= 999, "lean {lean} general {gen0}");
    let v = vals(999);
    assert_eq!([1, 2, 3].map(|k| p.rec[k].load(SeqCst)), [v[14], v[5], v[3]]);

    // A failed run is counted; the function still runs with its registers.
    let mut v = vals(5);
    v[14] = 77777;
    assert_eq!(call_with(&v), v);
    assert_eq!(p.failures.load(SeqCst), 1);
    assert_eq!(p.rec[0].load(SeqCst), lean + 1);
    // A run asking for the general path: the general handler runs, registers kept.
    v[14] = 88888;
    assert_eq!(call_with(&v), v);
    assert_eq!((p.rec[0].load(SeqCst), p.general.load(SeqCst)), (lean + 1, gen0 + 1));
    // Gate open: the general handler.
    p.gate.store(1, SeqCst);
    let v = vals(6);
    assert_eq!(call_with(&v), v);
    assert_eq!((p.rec[0].load(SeqCst), p.general.load(SeqCst)), (lean + 1, gen0 + 2));
    p.gate.store(0, SeqCst);
    // userbpf's own work is not probed.
    {
        let _o = ours();
        assert_eq!(call_with(&v), v);
    }
    assert_eq!((p.rec[0].load(SeqCst), p.general.load(SeqCst)), (lean + 1, gen0 + 2));
    assert_eq!(call_with(&v), v);
    assert_eq!(p.rec[0].load(SeqCst), lean + 2);

    // A second entry probe: the shared path, both general handlers run.
    let q = probe(LEAN_READS_GPRS);
    let id2 = attach_p(addr, &q);
    assert_eq!(uses_generated_stub(addr), Some(false));
    assert_eq!(call_with(&v), v);
    assert_eq!((p.general.load(SeqCst), q.general.load(SeqCst)), (gen0 + 3, 1));
    // The first one detached: the second alone gets its own generated stub.
    detach(id).unwrap();
    assert_eq!(uses_generated_stub(addr), Some(true));
    let v = vals(7);
    assert_eq!(call_with(&v), v);
    assert_eq!(q.rec[0].load(SeqCst), 1);
    assert_eq!([1, 2, 3].map(|k| q.rec[k].load(SeqCst)), [v[14], v[5], v[3]]);
    // A return probe beside it: the shared path (which plants the return trampoline).
    let r = leak(AtomicU64::new(0));
    let rid = attach(addr, ProbeKind::Return, general, r as *const AtomicU64 as *mut c_void).unwrap();
    assert_eq!(uses_generated_stub(addr), Some(false));
    assert_eq!(call_with(&v), v);
    assert_eq!((q.rec[0].load(SeqCst) + q.general.load(SeqCst), r.load(SeqCst)), (3, 1));
    detach(rid).unwrap();
    assert_eq!(uses_generated_stub(addr), Some(true));
    detach(id2).unwrap();
    assert_eq!(call_with(&v), v);
    assert_eq!(q.rec[0].load(SeqCst) + q.general.load(SeqCst), 3);
    assert_eq!(p.rec[0].load(SeqCst), lean + 2);
}

/// Handlers that read no register, or a handler the stub cannot serve (reads the fields after
/// the registers): the first gets a generated stub, the second the shared path; both see the
/// registers the function gets.
#[test]
fn what_the_handler_reads_decides_the_stub() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let addr = t_ss_target as *const () as usize;
    let p = probe(0);
    let id = attach_p(addr, &p);
    assert_eq!(uses_generated_stub(addr), Some(true));
    for i in 0..100 {
        let v = vals(i);
        assert_eq!(call_with(&v), v);
    }
    assert_eq!(p.rec[0].load(SeqCst) + p.general.load(SeqCst), 100);
    detach(id).unwrap();
    let mut q = probe(LEAN_READS_GPRS);
    let lean = leak(LeanHandler { reads_all: 1, ..*q.lean });
    q.lean = lean;
    let id = attach_p(addr, &q);
    assert_eq!(uses_generated_stub(addr), Some(false));
    let v = vals(3);
    assert_eq!(call_with(&v), v);
    assert_eq!(q.rec[0].load(SeqCst) + q.general.load(SeqCst), 1);
    detach(id).unwrap();
}

static GUARD_HITS: AtomicU64 = AtomicU64::new(0);
static IN_SIGNAL: AtomicBool = AtomicBool::new(false);

/// A lean handler that calls out (`LEAN_GUARD_ONLY`): calls the probed function itself, and
/// raises a signal whose handler calls it too; neither nested hit may run a handler.
unsafe extern "C" fn guard_handler(_regs: *mut PtRegs, _arg: u64, _record: *mut [u64; 3]) -> u64 {
    GUARD_HITS.fetch_add(1, SeqCst);
    // SAFETY: plain function.
    black_box(unsafe { t_ss_plain(black_box(1)) });
    // SAFETY: raising a signal whose handler (below) only calls a plain function.
    unsafe { libc::raise(libc::SIGUSR1) };
    0
}

extern "C" fn on_usr1(_sig: i32) {
    IN_SIGNAL.store(true, SeqCst);
    // SAFETY: plain function.
    black_box(unsafe { t_ss_plain(black_box(2)) });
}

#[test]
fn a_handler_that_calls_out_holds_the_recursion_guard() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // SAFETY: installs a handler that only calls a plain function.
    unsafe { libc::signal(libc::SIGUSR1, on_usr1 as *const () as libc::sighandler_t) };
    let addr = t_ss_plain as *const () as usize;
    let gen0 = leak(AtomicU64::new(0));
    let lean = leak(LeanHandler {
        func: guard_handler as *const () as usize,
        arg: 0,
        gate: leak(AtomicU8::new(0)).as_ptr(),
        failures: leak(AtomicU64::new(0)),
        calls_out: LEAN_GUARD_ONLY,
        reads_all: 0,
        regs_read: 0,
    });
    let id = attach_lean(addr, ProbeKind::Entry, general, gen0 as *const AtomicU64 as *mut c_void, None, Some(lean))
        .unwrap();
    assert_eq!(uses_generated_stub(addr), Some(true));
    let missed = stats().missed_recursion;
    for i in 0..100 {
        // SAFETY: plain function.
        assert_eq!(unsafe { t_ss_plain(black_box(i)) }, i + 9);
    }
    assert!(IN_SIGNAL.load(SeqCst));
    // Each outer call ran one handler (the first hits of the thread may be the general one,
    // which registers the thread's state); both nested calls of each lean run were missed.
    let (lean_hits, gen_hits) = (GUARD_HITS.load(SeqCst), gen0.load(SeqCst));
    assert_eq!(lean_hits + gen_hits, 100, "lean {lean_hits} general {gen_hits}");
    assert!(lean_hits >= 98, "lean {lean_hits} general {gen_hits}");
    assert_eq!(stats().missed_recursion - missed, 2 * lean_hits);
    detach(id).unwrap();
    // SAFETY: back to the default disposition.
    unsafe { libc::signal(libc::SIGUSR1, libc::SIG_DFL) };
}

/// Threads calling the probed function while the site's probes change under them: every hit
/// runs exactly one handler of a probe attached at the time, and none runs after its detach
/// returned (detach waits for generated stubs' handlers too).
#[test]
fn probes_change_under_running_threads() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let addr = t_ss_target as *const () as usize;
    let stop: &'static AtomicBool = leak(AtomicBool::new(false));
    let calls: &'static AtomicU64 = leak(AtomicU64::new(0));
    let threads: Vec<_> = (0..2)
        .map(|_| {
            std::thread::spawn(move || {
                let mut i = 0u64;
                while !stop.load(Relaxed) {
                    // SAFETY: t_ss_target only writes t_ss_seen (racy between threads, never
                    // read by this test).
                    unsafe { t_ss_target() };
                    i += 1;
                }
                calls.fetch_add(i, SeqCst);
            })
        })
        .collect();
    for round in 0..40 {
        let p = probe(1 << 14);
        let id = attach_p(addr, &p);
        std::thread::sleep(std::time::Duration::from_micros(300));
        // Every other round a second probe comes and goes meanwhile.
        if round % 2 == 1 {
            let q = probe(0);
            let id2 = attach_p(addr, &q);
            assert_eq!(uses_generated_stub(addr), Some(false));
            std::thread::sleep(std::time::Duration::from_micros(300));
            detach(id2).unwrap();
            let after = q.rec[0].load(SeqCst) + q.general.load(SeqCst);
            std::thread::sleep(std::time::Duration::from_micros(300));
            assert_eq!(q.rec[0].load(SeqCst) + q.general.load(SeqCst), after, "round {round}: a hit after detach");
            assert_eq!(uses_generated_stub(addr), Some(true));
        }
        detach(id).unwrap();
        let after = p.rec[0].load(SeqCst) + p.general.load(SeqCst);
        std::thread::sleep(std::time::Duration::from_micros(500));
        assert_eq!(p.rec[0].load(SeqCst) + p.general.load(SeqCst), after, "round {round}: a hit after detach");
        assert!(after > 0, "round {round}: no hit");
    }
    stop.store(true, SeqCst);
    for t in threads {
        t.join().unwrap();
    }
    assert!(calls.load(SeqCst) > 0);
}

static SPIN_ENTERED: AtomicBool = AtomicBool::new(false);
static SPIN_RELEASE: AtomicBool = AtomicBool::new(true);
static SPIN_LEFT: AtomicBool = AtomicBool::new(false);

/// A lean handler that waits (spinning, at most 10 s) until the test releases it.
unsafe extern "C" fn spin_handler(_regs: *mut PtRegs, _arg: u64, _record: *mut [u64; 3]) -> u64 {
    SPIN_ENTERED.store(true, SeqCst);
    let t0 = std::time::Instant::now();
    while !SPIN_RELEASE.load(SeqCst) && t0.elapsed().as_secs() < 10 {
        std::hint::spin_loop();
    }
    SPIN_LEFT.store(true, SeqCst);
    0
}

/// `detach` returns only once a handler a generated stub is running has returned.
#[test]
fn detach_waits_for_a_generated_stubs_handler() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let addr = t_ss_plain as *const () as usize;
    let gen0 = leak(AtomicU64::new(0));
    let lean = leak(LeanHandler {
        func: spin_handler as *const () as usize,
        arg: 0,
        gate: leak(AtomicU8::new(0)).as_ptr(),
        failures: leak(AtomicU64::new(0)),
        calls_out: LEAN_GUARD_ONLY,
        reads_all: 0,
        regs_read: 0,
    });
    let id = attach_lean(addr, ProbeKind::Entry, general, gen0 as *const AtomicU64 as *mut c_void, None, Some(lean))
        .unwrap();
    assert_eq!(uses_generated_stub(addr), Some(true));
    let caller = std::thread::spawn(|| {
        // The thread's first hits may take the general path (its state, its registration).
        for i in 0..3 {
            // SAFETY: plain function.
            assert_eq!(unsafe { t_ss_plain(black_box(i)) }, i + 9);
        }
        // (Reset before the release flag drops: the test waits for "not released, entered".)
        SPIN_ENTERED.store(false, SeqCst);
        SPIN_LEFT.store(false, SeqCst);
        SPIN_RELEASE.store(false, SeqCst);
        // SAFETY: plain function.
        assert_eq!(unsafe { t_ss_plain(black_box(5)) }, 14);
    });
    let t0 = std::time::Instant::now();
    while SPIN_RELEASE.load(SeqCst) || !SPIN_ENTERED.load(SeqCst) {
        assert!(t0.elapsed().as_secs() < 10, "the handler never ran on the generated stub");
        std::thread::yield_now();
    }
    let detached: &'static AtomicBool = leak(AtomicBool::new(false));
    let detacher = std::thread::spawn(move || {
        detach(id).unwrap();
        detached.store(true, SeqCst);
        // When detach returns, the handler has returned.
        assert!(SPIN_LEFT.load(SeqCst), "detach returned while the handler ran");
    });
    std::thread::sleep(std::time::Duration::from_millis(100));
    assert!(!detached.load(SeqCst), "detach did not wait for the running handler");
    SPIN_RELEASE.store(true, SeqCst);
    detacher.join().unwrap();
    caller.join().unwrap();
    assert!(detached.load(SeqCst));
}
