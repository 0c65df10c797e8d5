//! An `int3` of the engine always reaches the engine's `SIGTRAP` handler, whatever the program
//! does with `SIGTRAP`, and the program's own traps still reach the program's handler.
//!
//! The order of bpftrace under `userbpf load`: the engine starts early (the loader
//! notification, `dlnotify`, installs its `SIGTRAP` handler) and the program installs its own
//! handler through libc before any probe exists (LLVM's crash-recovery handlers, set up by
//! libclang). Then breakpoint probes are hit from several threads; the program replaces the
//! handler again with a raw `rt_sigaction` system call (which no libc probe sees), through
//! libc's `signal`, and from inside a probe handler (where the engine runs no probe); and it
//! gives back the disposition it was handed as the "old" one (the engine's handler), as
//! LLVM's handlers do when they disable themselves.
//!
//! A program handler that gets an `int3` of the engine ends the process with a message (what
//! would otherwise happen is LLVM's endless re-raise, or the process killed).
//!
//! One test: the process-wide `SIGTRAP` disposition is the subject.

use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::SeqCst};

use userbpf_hook::*;

std::arch::global_asm!(
    ".pushsection .text.userbpf_sigtrap_owner_test,\"ax\",@progbits",
    // Four-byte functions, one after the other with no padding between them: only a
    // breakpoint can be placed.
    ".p2align 4",
    ".globl t_so_a",
    ".type t_so_a, @function",
    "t_so_a:",
    "    mov rax, rdi",
    "    ret",
    ".size t_so_a, . - t_so_a",
    ".globl t_so_b",
    ".type t_so_b, @function",
    "t_so_b:",
    "    lea eax, [rdi + 1]",
    "    ret",
    ".size t_so_b, . - t_so_b",
    ".globl t_so_c",
    ".type t_so_c, @function",
    "t_so_c:",
    "    lea eax, [rdi + rdi]",
    "    ret",
    ".size t_so_c, . - t_so_c",
    ".globl t_so_d",
    ".type t_so_d, @function",
    "t_so_d:",
    "    lea eax, [rdi + 2]",
    "    ret",
    ".size t_so_d, . - t_so_d",
    // The program's own int3.
    ".globl t_so_own_trap",
    ".type t_so_own_trap, @function",
    "t_so_own_trap:",
    "    int3",
    "    ret",
    ".size t_so_own_trap, . - t_so_own_trap",
    ".popsection",
);

unsafe extern "C" {
    fn t_so_a(x: i64) -> i64;
    fn t_so_b(x: i64) -> i64;
    fn t_so_c(x: i64) -> i64;
    fn t_so_d(x: i64) -> i64;
    fn t_so_own_trap();
}

fn addr_of(f: unsafe extern "C" fn(i64) -> i64) -> usize {
    f as *const () as usize
}

/// Each program handler's count of traps (the program's own int3 and raise).
static PROG: [AtomicU64; 4] = [const { AtomicU64::new(0) }; 4];

/// The program's handlers (SA_SIGINFO): a trap at an address other than the program's own
/// int3 (or not from an int3) is one of the engine's that reached the program.
fn program_trap(which: usize, info: *mut libc::siginfo_t, ctx: *mut c_void) {
    // SAFETY: the siginfo and ucontext the kernel passed to this SA_SIGINFO handler.
    let (code, rip) = unsafe {
        ((*info).si_code, (*(ctx as *mut libc::ucontext_t)).uc_mcontext.gregs[libc::REG_RIP as usize] as usize)
    };
    if code == libc::SI_KERNEL && rip.wrapping_sub(1) != t_so_own_trap as *const () as usize {
        let msg = b"sigtrap_owner: an int3 of the engine reached the program's SIGTRAP handler\n";
        // SAFETY: write(2) and _exit(2) of a static message: async-signal-safe.
        unsafe {
            libc::write(2, msg.as_ptr().cast(), msg.len());
            libc::_exit(101);
        }
    }
    PROG[which].fetch_add(1, SeqCst);
}

extern "C" fn h0(_s: i32, i: *mut libc::siginfo_t, c: *mut c_void) {
    program_trap(0, i, c)
}
extern "C" fn h1(_s: i32, i: *mut libc::siginfo_t, c: *mut c_void) {
    program_trap(1, i, c)
}
extern "C" fn h2(_s: i32, i: *mut libc::siginfo_t, c: *mut c_void) {
    program_trap(2, i, c)
}
extern "C" fn h3(_s: i32, i: *mut libc::siginfo_t, c: *mut c_void) {
    program_trap(3, i, c)
}

type SigHandler = extern "C" fn(i32, *mut libc::siginfo_t, *mut c_void);

fn action(h: SigHandler) -> libc::sigaction {
    // SAFETY: a zeroed struct sigaction is valid; fields set below.
    let mut sa: libc::sigaction = unsafe { std::mem::zeroed() };
    sa.sa_sigaction = h as usize;
    sa.sa_flags = libc::SA_SIGINFO;
    sa
}

/// The handler the kernel runs for SIGTRAP (a raw query: libc's `sigaction` reports what the
/// program set).
fn kernel_handler() -> usize {
    let mut k = [0u64; 4];
    // SAFETY: a raw query into a local buffer of the kernel's struct sigaction size.
    let rc =
        unsafe { libc::syscall(libc::SYS_rt_sigaction, libc::SIGTRAP, std::ptr::null::<u64>(), k.as_mut_ptr(), 8) };
    assert_eq!(rc, 0);
    k[0] as usize
}

/// What libc's `sigaction` reports as SIGTRAP's handler.
fn reported_handler() -> usize {
    // SAFETY: a query into a local struct.
    let mut now: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: sigaction only writes the current disposition into `now`.
    assert_eq!(unsafe { libc::sigaction(libc::SIGTRAP, std::ptr::null(), &mut now) }, 0);
    now.sa_sigaction
}

unsafe extern "C" fn count(d: *mut c_void, _r: *mut PtRegs) -> u32 {
    // SAFETY: data is a &'static AtomicU64.
    unsafe { (*(d as *const AtomicU64)).fetch_add(1, SeqCst) };
    HOOK_CONTINUE
}

fn data(c: &'static AtomicU64) -> *mut c_void {
    c as *const AtomicU64 as *mut c_void
}

/// A breakpoint probe on one of the functions above (asserted to be one).
fn probe(f: unsafe extern "C" fn(i64) -> i64, len: usize, h: Handler, c: *mut c_void) -> ProbeId {
    let addr = addr_of(f);
    let id = attach_with(addr, ProbeKind::Entry, h, c, Some(FuncExtent { start: addr, len })).unwrap();
    assert_eq!(probe_method(addr).unwrap().0, Method::Breakpoint, "the test needs a breakpoint at {addr:#x}");
    id
}

const THREADS: usize = 4;
const CALLS: i64 = 300;

/// Calls every function from THREADS threads, CALLS times each, checking the results.
fn hit_all() {
    let hs: Vec<_> = (0..THREADS)
        .map(|_| {
            std::thread::spawn(|| {
                for i in 0..CALLS {
                    let i = std::hint::black_box(i);
                    // SAFETY: the functions above take and return a long.
                    unsafe {
                        assert_eq!(t_so_a(i), i);
                        assert_eq!(t_so_b(i), i + 1);
                        assert_eq!(t_so_c(i), 2 * i);
                    }
                }
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
}

/// Entry handler that installs `h2` through libc from inside a probe handler (the engine runs
/// no probe there: the guard must still run).
static FROM_HANDLER: AtomicUsize = AtomicUsize::new(0);
unsafe extern "C" fn install_in_handler(_d: *mut c_void, _r: *mut PtRegs) -> u32 {
    if FROM_HANDLER.fetch_add(1, SeqCst) == 0 {
        let sa = action(h2);
        // SAFETY: a plain sigaction call with a local struct.
        assert_eq!(unsafe { libc::sigaction(libc::SIGTRAP, &sa, std::ptr::null_mut()) }, 0);
    }
    HOOK_CONTINUE
}

fn own_traps(n: usize) {
    for _ in 0..n {
        // SAFETY: the program's own int3, handled by its own handler.
        unsafe { t_so_own_trap() };
    }
}

#[test]
fn an_int3_of_the_engine_always_reaches_the_engine() {
    // 1. The engine starts without any probe (the loader notification), then the program
    //    installs its handler through libc: nothing guards sigaction yet, the kernel runs the
    //    program's handler from now on, and the program was handed the engine's as "old".
    dlnotify::install(|_| {}).expect("dlnotify::install");
    let ours = kernel_handler();
    assert_ne!(ours, libc::SIG_DFL, "the engine's handler is installed");
    // SAFETY: zeroed struct sigaction for the old disposition; the new one is ours to give.
    let mut handed: libc::sigaction = unsafe { std::mem::zeroed() };
    let sa0 = action(h0);
    // SAFETY: a valid action in, the old one written into a local struct.
    assert_eq!(unsafe { libc::sigaction(libc::SIGTRAP, &sa0, &mut handed) }, 0);
    assert_eq!(handed.sa_sigaction, ours, "the program was handed the engine's handler");
    assert_eq!(kernel_handler(), h0 as *const () as usize, "the program's handler replaced the engine's in the kernel");

    // 2. Breakpoint probes, hit from several threads: all the engine's; the program's int3
    //    goes to its handler, which sigaction still reports.
    static A: AtomicU64 = AtomicU64::new(0);
    static B: AtomicU64 = AtomicU64::new(0);
    static C: AtomicU64 = AtomicU64::new(0);
    let before = stats();
    let pa = probe(t_so_a, 4, count, data(&A));
    let pb = probe(t_so_b, 4, count, data(&B));
    assert_eq!(kernel_handler(), ours, "the engine took its handler back before writing an int3");
    assert!(stats().sigtrap_retaken > before.sigtrap_retaken);
    assert_eq!(reported_handler(), h0 as *const () as usize, "sigaction reports the program's handler");
    hit_all();
    own_traps(3);
    let all = (THREADS as u64) * CALLS as u64;
    assert_eq!((A.load(SeqCst), B.load(SeqCst)), (all, all));
    assert_eq!(PROG[0].load(SeqCst), 3, "the program's handler got its own int3s");

    // 3. A raw rt_sigaction (no libc probe sees it) while breakpoints exist: the next probe
    //    written takes the handler back.
    // The kernel's SA_RESTORER, with libc's restorer (__restore_rt) taken from the current
    // disposition.
    const SA_RESTORER: u64 = 0x0400_0000;
    let raw = [h1 as *const () as usize as u64, libc::SA_SIGINFO as u64 | SA_RESTORER, 0, 0];
    let mut cur = [0u64; 4];
    // SAFETY: raw rt_sigaction calls with local buffers of the kernel's layout.
    unsafe {
        libc::syscall(libc::SYS_rt_sigaction, libc::SIGTRAP, std::ptr::null::<u64>(), cur.as_mut_ptr(), 8);
        let raw = [raw[0], raw[1], cur[2], 0];
        assert_eq!(
            libc::syscall(libc::SYS_rt_sigaction, libc::SIGTRAP, raw.as_ptr(), std::ptr::null_mut::<u64>(), 8),
            0
        );
    }
    assert_eq!(kernel_handler(), h1 as *const () as usize);
    let pc = probe(t_so_c, 4, count, data(&C));
    assert_eq!(kernel_handler(), ours, "taken back before the new int3");
    assert_eq!(reported_handler(), h1 as *const () as usize);
    hit_all();
    own_traps(2);
    assert_eq!((A.load(SeqCst), B.load(SeqCst), C.load(SeqCst)), (2 * all, 2 * all, all));
    assert_eq!(PROG[1].load(SeqCst), 2);

    // 4. libc's signal() after the probes exist (the guard records it) and a sigaction made
    //    inside a probe handler (where the engine runs no probe, the guard runs all the same).
    // SAFETY: signal() with an SA_SIGINFO handler would lose its info: use sigaction.
    let sa3 = action(h3);
    // SAFETY: a valid action for SIGTRAP, which this test owns.
    assert_eq!(unsafe { libc::sigaction(libc::SIGTRAP, &sa3, std::ptr::null_mut()) }, 0);
    assert_eq!(kernel_handler(), ours, "a libc sigaction is recorded, not installed");
    own_traps(1);
    assert_eq!(PROG[3].load(SeqCst), 1);
    static D: AtomicU64 = AtomicU64::new(0);
    let pd_count = probe(t_so_d, 4, count, data(&D));
    let pd = attach_with(
        addr_of(t_so_d),
        ProbeKind::Entry,
        install_in_handler,
        std::ptr::null_mut(),
        Some(FuncExtent { start: addr_of(t_so_d), len: 4 }),
    )
    .unwrap();
    // SAFETY: t_so_d takes and returns a long.
    assert_eq!(unsafe { t_so_d(5) }, 7);
    assert_eq!(FROM_HANDLER.load(SeqCst), 1);
    assert_eq!(kernel_handler(), ours, "a sigaction inside a probe handler is recorded, not installed");
    assert_eq!(reported_handler(), h2 as *const () as usize);
    hit_all();
    own_traps(4);
    assert_eq!(PROG[2].load(SeqCst), 4);
    assert_eq!(PROG[3].load(SeqCst), 1);
    assert_eq!(C.load(SeqCst), 2 * all);

    // 5. The program gives back what it was handed in 1 (the engine's handler, as LLVM's
    //    handlers do when they disable themselves): that means the disposition before the
    //    engine (SIG_DFL here), never the engine's handler chained to itself.
    // SAFETY: installing the disposition the engine handed back, from a local struct.
    assert_eq!(unsafe { libc::sigaction(libc::SIGTRAP, &handed, std::ptr::null_mut()) }, 0);
    assert_eq!(reported_handler(), libc::SIG_DFL);
    assert_eq!(kernel_handler(), ours);
    hit_all();
    assert_eq!(A.load(SeqCst), 4 * all);

    for id in [pa, pb, pc, pd_count, pd] {
        detach(id).unwrap();
    }
    assert_eq!(kernel_handler(), ours, "the engine's handler stays installed");
    assert_eq!(D.load(SeqCst), 1);
}
