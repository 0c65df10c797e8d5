//! Probes wherever the kernel places them: one- to four-byte functions (with and without
//! alignment padding after them), every instruction boundary of a function, loop heads,
//! `endbr64` prologues, entry and return probes, from several threads at once; each count is
//! compared with the kernel's own uprobe (a perf `uprobe` counter on the same file offset,
//! counting the same calls) and with the number of calls. Also: a kernel uprobe already at
//! the address is named; the program's own `SIGTRAP` handler (installed after the engine's)
//! still gets its traps, and `sigaction` reports it.
//!
//! The target is a shared library compiled at test time (C and top-level assembly, so the
//! byte sizes and layout are exact) and loaded with `dlopen`.

use std::ffi::{CString, c_void};
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering::*};
use std::sync::{Mutex, OnceLock};

use userbpf_hook::*;

const C_SRC: &str = r#"
__asm__(
    ".intel_syntax noprefix\n"
    ".text\n"
    /* One- to four-byte functions, each followed by alignment padding (nops or int3). */
    ".p2align 4\n.globl f1_pad\n.type f1_pad,@function\nf1_pad:\n ret\n.size f1_pad,.-f1_pad\n"
    ".p2align 4, 0xcc\n.globl f2_pad\n.type f2_pad,@function\nf2_pad:\n xchg eax, edi\n ret\n.size f2_pad,.-f2_pad\n"
    ".p2align 4\n.globl f3_pad\n.type f3_pad,@function\nf3_pad:\n mov eax, edi\n ret\n.size f3_pad,.-f3_pad\n"
    ".p2align 4, 0xcc\n.globl f4_pad\n.type f4_pad,@function\nf4_pad:\n lea eax, [rdi + rdi * 2]\n ret\n.size f4_pad,.-f4_pad\n"
    /* The same with no byte between one function and the next: a breakpoint. */
    ".p2align 4\n"
    ".globl f1_bp\n.type f1_bp,@function\nf1_bp:\n ret\n.size f1_bp,.-f1_bp\n"
    ".globl f2_bp\n.type f2_bp,@function\nf2_bp:\n xchg eax, edi\n ret\n.size f2_bp,.-f2_bp\n"
    ".globl f3_bp\n.type f3_bp,@function\nf3_bp:\n mov eax, edi\n ret\n.size f3_bp,.-f3_bp\n"
    ".globl f4_bp\n.type f4_bp,@function\nf4_bp:\n lea eax, [rdi + rdi * 2]\n ret\n.size f4_bp,.-f4_bp\n"
    ".globl f_after\n.type f_after,@function\nf_after:\n ret\n.size f_after,.-f_after\n"
    /* A loop whose head is at offset 2, inside the first five bytes: returns rdi (> 0). */
    ".p2align 4\n.globl loop_head\n.type loop_head,@function\nloop_head:\n"
    " xor eax, eax\n"
    "1: inc rax\n dec rdi\n jnz 1b\n ret\n.size loop_head,.-loop_head\n"
    /* Instructions at +0 +3 +7 +10 +12 +15: rdi + 1, doubled when rdi != 0. */
    ".p2align 4\n.globl mid\n.type mid,@function\nmid:\n"
    " mov rax, rdi\n add rax, 1\n test rdi, rdi\n jz 2f\n add rax, rax\n"
    "2: ret\n.size mid,.-mid\n"
    /* A call at the entry (5 bytes): moved as a push of the return address and a jump. */
    ".p2align 4\n.globl call_first\n.type call_first,@function\ncall_first:\n"
    " call mid\n add rax, 5\n ret\n.size call_first,.-call_first\n"
    /* int3 in the program's own code, for its own SIGTRAP handler. */
    ".p2align 4\n.globl own_trap\n.type own_trap,@function\nown_trap:\n int3\n ret\n.size own_trap,.-own_trap\n"
    ".att_syntax\n");

/* As a C compiler makes them (gcc -O2: `ret`, `lea eax,[rdi+rdi*2]; ret`). */
void done(long acc) { (void)acc; }
int triple(int i) { return i * 3; }
"#;

/// Compiled with -fcf-protection=full: `endbr64` prologues.
const C_CET: &str = r#"
void cet_done(long acc) { (void)acc; }
int cet_triple(int i) { return i * 3; }
long cet_sum(long n) { long s = 0; for (long i = 0; i < n; i++) s += i ^ (s >> 3); return s; }
"#;

struct Lib {
    path: PathBuf,
}

fn lib() -> &'static Lib {
    static LIB: OnceLock<Lib> = OnceLock::new();
    LIB.get_or_init(|| {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("placement-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (a, b) = (dir.join("a.c"), dir.join("cet.c"));
        std::fs::write(&a, C_SRC).unwrap();
        std::fs::write(&b, C_CET).unwrap();
        let (oa, ob) = (dir.join("a.o"), dir.join("cet.o"));
        let path = dir.join("libplacement.so");
        for (args, what) in [
            (
                vec!["-O2", "-fPIC", "-fcf-protection=none", "-c", "-o", oa.to_str().unwrap(), a.to_str().unwrap()],
                "a.c",
            ),
            (
                vec!["-O2", "-fPIC", "-fcf-protection=full", "-c", "-o", ob.to_str().unwrap(), b.to_str().unwrap()],
                "cet.c",
            ),
            (vec!["-shared", "-o", path.to_str().unwrap(), oa.to_str().unwrap(), ob.to_str().unwrap()], "the library"),
        ] {
            let out = Command::new("cc").args(&args).output().expect("running cc (make build installs it)");
            assert!(out.status.success(), "compiling {what}: {}", String::from_utf8_lossy(&out.stderr));
        }
        let c = CString::new(path.to_str().unwrap()).unwrap();
        // SAFETY: loading a library we just built; it has no constructors.
        let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW) };
        assert!(!h.is_null(), "dlopen {}", path.display());
        Lib { path }
    })
}

fn spec(func: &str) -> String {
    format!("{}:{func}", lib().path.display())
}

fn fn_ptr(func: &str) -> extern "C" fn(i64) -> i64 {
    let r = symbols::resolve(&spec(func)).unwrap();
    // SAFETY: every test function takes one integer argument and returns an integer (or
    // nothing: rax is then ignored by the callers).
    unsafe { std::mem::transmute::<usize, extern "C" fn(i64) -> i64>(r.func_start) }
}

/// One test at a time: the kernel's counters are system-wide per file offset, and the
/// SIGTRAP test changes the process's disposition.
static SERIAL: Mutex<()> = Mutex::new(());

// ------------------------------------------------------------- kernel uprobes ----

#[repr(C)]
#[derive(Default)]
struct PerfAttr {
    kind: u32,
    size: u32,
    config: u64,
    sample_period: u64,
    sample_type: u64,
    read_format: u64,
    flags: u64,
    wakeup_events: u32,
    bp_type: u32,
    config1: u64,
    config2: u64,
    rest: [u64; 8],
}

/// A kernel uprobe (or uretprobe) at `addr` of this process, counting hits on every CPU.
struct KernelProbe {
    fds: Vec<i32>,
    _path: CString,
}

impl KernelProbe {
    fn new(addr: usize, ret: bool) -> KernelProbe {
        let kind: u32 = std::fs::read_to_string("/sys/bus/event_source/devices/uprobe/type")
            .expect("the kernel's uprobe PMU")
            .trim()
            .parse()
            .unwrap();
        let bit: u32 = std::fs::read_to_string("/sys/bus/event_source/devices/uprobe/format/retprobe")
            .unwrap()
            .trim()
            .trim_start_matches("config:")
            .parse()
            .unwrap();
        let (file, off) = file_offset(addr);
        let path = CString::new(file).unwrap();
        let mut attr = PerfAttr { kind, size: std::mem::size_of::<PerfAttr>() as u32, ..Default::default() };
        attr.config = if ret { 1 << bit } else { 0 };
        attr.config1 = path.as_ptr() as u64;
        attr.config2 = off;
        // SAFETY: sysconf has no memory arguments.
        let ncpu = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_CONF) } as i32;
        let mut fds = Vec::new();
        for cpu in 0..ncpu {
            // SAFETY: perf_event_open with a fully initialised attr that outlives the call.
            let fd = unsafe { libc::syscall(libc::SYS_perf_event_open, &attr as *const PerfAttr, -1, cpu, -1, 0) };
            assert!(fd >= 0, "perf_event_open(uprobe) failed: {}", std::io::Error::last_os_error());
            fds.push(fd as i32);
        }
        KernelProbe { fds, _path: path }
    }

    fn count(&self) -> u64 {
        let mut sum = 0;
        for fd in &self.fds {
            let mut v = 0u64;
            // SAFETY: reading the 8-byte counter value into a local.
            let n = unsafe { libc::read(*fd, &mut v as *mut u64 as *mut c_void, 8) };
            assert_eq!(n, 8);
            sum += v;
        }
        sum
    }
}

impl Drop for KernelProbe {
    fn drop(&mut self) {
        for fd in &self.fds {
            // SAFETY: our own descriptors.
            unsafe { libc::close(*fd) };
        }
    }
}

/// The file and file offset of `addr` (from /proc/self/maps).
fn file_offset(addr: usize) -> (String, u64) {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    for line in maps.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        let (s, e) = f[0].split_once('-').unwrap();
        let (s, e) = (usize::from_str_radix(s, 16).unwrap(), usize::from_str_radix(e, 16).unwrap());
        if addr >= s && addr < e && f.len() >= 6 {
            let off = u64::from_str_radix(f[2], 16).unwrap();
            return (f[5].to_string(), (addr - s) as u64 + off);
        }
    }
    panic!("{addr:#x} is not in a file mapping");
}

// ------------------------------------------------------------------ workload ----

const THREADS: usize = 4;
const CALLS: i64 = 500;

/// Calls `f` from THREADS threads, CALLS times each, with arguments 0..CALLS; returns the
/// sum of the results (to check the function still computes what it did).
fn workload(f: extern "C" fn(i64) -> i64) -> i64 {
    let hs: Vec<_> = (0..THREADS)
        .map(|_| {
            std::thread::spawn(move || {
                (0..CALLS).map(|i| f(std::hint::black_box(i))).fold(0i64, |a, b| a.wrapping_add(b))
            })
        })
        .collect();
    hs.into_iter().map(|h| h.join().unwrap()).fold(0, i64::wrapping_add)
}

unsafe extern "C" fn count(d: *mut c_void, _r: *mut PtRegs) -> u32 {
    // SAFETY: data is a &'static AtomicU64.
    unsafe { (*(d as *const AtomicU64)).fetch_add(1, SeqCst) };
    HOOK_CONTINUE
}

fn data(c: &'static AtomicU64) -> *mut c_void {
    c as *const AtomicU64 as *mut c_void
}

/// Counts `spec` (entry and return probes) with the kernel, then with the engine, over the
/// same workload; checks both against `want_entry`/`want_ret` and the results against the
/// unprobed run. Returns the method the engine used.
fn compare(func: &str, off: usize, want_entry: u64, want_ret: Option<u64>) -> Method {
    let f = fn_ptr(func);
    let r = symbols::resolve(&spec(func)).unwrap();
    let addr = r.func_start + off;
    let plain = workload(f);
    // The kernel.
    let (k_entry, k_ret) = {
        let ke = KernelProbe::new(addr, false);
        let kr = want_ret.map(|_| KernelProbe::new(addr, true));
        assert_eq!(workload(f), plain);
        (ke.count(), kr.map(|k| k.count()))
    };
    // The engine.
    static E: AtomicU64 = AtomicU64::new(0);
    static R: AtomicU64 = AtomicU64::new(0);
    E.store(0, SeqCst);
    R.store(0, SeqCst);
    let target = if off == 0 { spec(func) } else { format!("{}+{off}", spec(func)) };
    let ie = attach_symbol(&target, ProbeKind::Entry, count, data(&E)).unwrap_or_else(|e| panic!("{target}: {e}"));
    let ir = want_ret.map(|_| attach_symbol(&target, ProbeKind::Return, count, data(&R)).unwrap());
    let (method, _) = probe_method(addr).unwrap();
    assert_eq!(workload(f), plain, "{func}+{off} ({method:?}) computes the same with the probe");
    detach(ie).unwrap();
    if let Some(ir) = ir {
        detach(ir).unwrap();
    }
    let (u_entry, u_ret) = (E.load(SeqCst), want_ret.map(|_| R.load(SeqCst)));
    assert_eq!(k_entry, want_entry, "{func}+{off}: the kernel's uprobe count");
    assert_eq!(k_ret, want_ret, "{func}+{off}: the kernel's uretprobe count");
    assert_eq!((u_entry, u_ret), (k_entry, k_ret), "{func}+{off} ({method:?}): userbpf's counts against the kernel's");
    // Detached: nothing counts any more.
    workload(f);
    assert_eq!(E.load(SeqCst), u_entry);
    method
}

const ALL: u64 = (THREADS as u64) * CALLS as u64;

fn size_of(func: &str) -> usize {
    symbols::resolve(&spec(func)).unwrap().size.unwrap()
}

#[test]
fn one_to_four_byte_functions_with_padding_after_them() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    for (n, func) in [(1, "f1_pad"), (2, "f2_pad"), (3, "f3_pad"), (4, "f4_pad")] {
        assert_eq!(size_of(func), n, "{func} is {n} bytes long");
        assert_eq!(compare(func, 0, ALL, Some(ALL)), Method::Padding, "{func}");
    }
}

#[test]
fn one_to_four_byte_functions_without_padding_take_a_breakpoint() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    for (n, func) in [(1, "f1_bp"), (2, "f2_bp"), (3, "f3_bp"), (4, "f4_bp")] {
        assert_eq!(size_of(func), n, "{func} is {n} bytes long");
        assert_eq!(compare(func, 0, ALL, Some(ALL)), Method::Breakpoint, "{func}");
    }
}

#[test]
fn short_functions_as_the_compiler_makes_them() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    assert_eq!(size_of("done"), 1);
    assert_eq!(size_of("triple"), 4);
    for func in ["done", "triple"] {
        assert_ne!(compare(func, 0, ALL, Some(ALL)), Method::Jump, "{func}");
    }
}

#[test]
fn endbr64_prologues_keep_their_endbr64() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    for func in ["cet_done", "cet_triple", "cet_sum"] {
        let r = symbols::resolve(&spec(func)).unwrap();
        // SAFETY: reading 4 bytes of the function's code.
        let head = unsafe { std::slice::from_raw_parts(r.func_start as *const u8, 4) }.to_vec();
        assert_eq!(head, [0xF3, 0x0F, 0x1E, 0xFA], "{func} starts with endbr64");
        static E: AtomicU64 = AtomicU64::new(0);
        let id = attach_symbol(&spec(func), ProbeKind::Entry, count, data(&E)).unwrap();
        let (_, at) = probe_method(r.func_start).unwrap();
        assert_eq!(at, r.func_start + 4, "{func}: the patch goes after the endbr64");
        // SAFETY: as above.
        let now = unsafe { std::slice::from_raw_parts(r.func_start as *const u8, 4) }.to_vec();
        assert_eq!(now, head, "{func}: the endbr64 is still there");
        detach(id).unwrap();
        compare(func, 0, ALL, Some(ALL));
    }
}

#[test]
fn loop_head_in_the_first_bytes() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // The jump back lands at +2, inside the five bytes a jump at the entry would take.
    assert_eq!(compare_loop(), Method::Breakpoint);
}

/// loop_head with arguments 1..=CALLS from each thread: the entry fires once a call, the
/// loop head (+2, a branch target) once an iteration, the return once a call.
fn compare_loop() -> Method {
    let f = fn_ptr("loop_head");
    let r = symbols::resolve(&spec("loop_head")).unwrap();
    let run = || -> i64 {
        let hs: Vec<_> = (0..THREADS)
            .map(|_| std::thread::spawn(move || (1..=CALLS).map(|i| f(std::hint::black_box(i))).sum::<i64>()))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).sum()
    };
    let iters = THREADS as u64 * (CALLS as u64 * (CALLS as u64 + 1) / 2);
    assert_eq!(run() as u64, iters);
    let (ke, kh, kr) = {
        let a = KernelProbe::new(r.func_start, false);
        let b = KernelProbe::new(r.func_start + 2, false);
        let c = KernelProbe::new(r.func_start, true);
        run();
        (a.count(), b.count(), c.count())
    };
    assert_eq!((ke, kh, kr), (ALL, iters, ALL), "the kernel's counts");
    static E: AtomicU64 = AtomicU64::new(0);
    static H: AtomicU64 = AtomicU64::new(0);
    static R: AtomicU64 = AtomicU64::new(0);
    let ie = attach_symbol(&spec("loop_head"), ProbeKind::Entry, count, data(&E)).unwrap();
    let ir = attach_symbol(&spec("loop_head"), ProbeKind::Return, count, data(&R)).unwrap();
    let ih = attach_symbol(&format!("{}+2", spec("loop_head")), ProbeKind::Entry, count, data(&H)).unwrap();
    let m = probe_method(r.func_start).unwrap().0;
    assert_eq!(run() as u64, iters);
    for id in [ie, ir, ih] {
        detach(id).unwrap();
    }
    assert_eq!((E.load(SeqCst), H.load(SeqCst), R.load(SeqCst)), (ke, kh, kr), "userbpf's counts against the kernel's");
    m
}

#[test]
fn every_instruction_boundary_of_a_function() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // mid(i): i in 0..CALLS, so the `add rax, rax` at +12 runs for all but i == 0.
    let nonzero = THREADS as u64 * (CALLS as u64 - 1);
    assert_eq!(size_of("mid"), 16);
    for (off, want) in [(0, ALL), (3, ALL), (7, ALL), (10, ALL), (12, nonzero), (15, ALL)] {
        let m = compare("mid", off, want, None);
        // +0, +3, +7, +10: a jump over whole instructions (at +10, `jz` + `add` end just
        // before the branch target +15); +12 (`add` + `ret` are four bytes, the `ret` a
        // branch target from outside them) and +15 (the last `ret`; `mid` is 16 bytes, the
        // next function starts right after it): a breakpoint.
        let expect = match off {
            0 | 3 | 7 | 10 => Method::Jump,
            _ => Method::Breakpoint,
        };
        assert_eq!(m, expect, "mid+{off}");
    }
    for off in [1, 2, 4, 5, 6, 8, 9, 11, 13, 14] {
        let e = attach_symbol(&format!("{}+{off}", spec("mid")), ProbeKind::Entry, count, std::ptr::null_mut())
            .unwrap_err();
        assert!(e.to_string().contains("not an instruction boundary"), "mid+{off}: {e}");
    }
}

#[test]
fn a_call_in_the_first_bytes_is_moved() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // call_first(i) = mid(i) + 5: the call is the whole first five bytes.
    assert_eq!(compare("call_first", 0, ALL, Some(ALL)), Method::Jump);
}

#[test]
fn a_kernel_uprobe_at_the_address_is_named() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let r = symbols::resolve(&spec("f4_pad")).unwrap();
    let k = KernelProbe::new(r.func_start, false);
    let e = attach_symbol(&spec("f4_pad"), ProbeKind::Entry, count, std::ptr::null_mut()).unwrap_err();
    assert!(e.to_string().contains("kernel uprobe"), "{e}");
    assert_eq!(fn_ptr("f4_pad")(5), 15);
    assert_eq!(k.count(), 1);
}

// ------------------------------------------------------------------- SIGTRAP ----

static OWN_TRAPS: AtomicU64 = AtomicU64::new(0);

extern "C" fn own_handler(_sig: i32) {
    OWN_TRAPS.fetch_add(1, SeqCst);
}

#[test]
fn the_programs_own_sigtrap_handler_is_chained() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // A breakpoint probe first (the engine's handler is in place), then the program installs
    // its own handler through libc, as a program does at any time.
    static E: AtomicU64 = AtomicU64::new(0);
    let id = attach_symbol(&spec("f2_bp"), ProbeKind::Entry, count, data(&E)).unwrap();
    assert_eq!(probe_method(symbols::resolve(&spec("f2_bp")).unwrap().func_start).unwrap().0, Method::Breakpoint);
    // SAFETY: installing a plain handler that only counts; reading back the disposition.
    let prev = unsafe { libc::signal(libc::SIGTRAP, own_handler as extern "C" fn(i32) as usize) };
    // SAFETY: as for `prev`.
    let mut now: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: a query into a local struct.
    assert_eq!(unsafe { libc::sigaction(libc::SIGTRAP, std::ptr::null(), &mut now) }, 0);
    assert_eq!(now.sa_sigaction, own_handler as extern "C" fn(i32) as usize, "sigaction reports the program's handler");
    let own_trap = fn_ptr("own_trap");
    for i in 0..10 {
        own_trap(0);
        assert_eq!(fn_ptr("f2_bp")(i), i);
        // SAFETY: raising a signal whose handler is the program's counter.
        unsafe { libc::raise(libc::SIGTRAP) };
    }
    assert_eq!(OWN_TRAPS.load(SeqCst), 20, "the program's handler got its int3 and its raise");
    assert_eq!(E.load(SeqCst), 10, "the probe still fires");
    // The program's handler with sigaction flags: SA_SIGINFO + SA_RESETHAND.
    // SAFETY: restore the previous disposition through libc (recorded, ours stays).
    unsafe { libc::signal(libc::SIGTRAP, prev) };
    detach(id).unwrap();
    // The engine's handler is still the installed one.
    let mut k = [0u64; 4];
    // SAFETY: a raw query of the kernel's disposition into a local buffer.
    let rc =
        unsafe { libc::syscall(libc::SYS_rt_sigaction, libc::SIGTRAP, std::ptr::null::<u64>(), k.as_mut_ptr(), 8) };
    assert_eq!(rc, 0);
    assert_ne!(k[0] as usize, own_handler as extern "C" fn(i32) as usize);
    assert_ne!(k[0], 0);
}

static INFO_TRAPS: AtomicU64 = AtomicU64::new(0);
static INFO_CODE: AtomicU64 = AtomicU64::new(0);
static MASKED: AtomicU64 = AtomicU64::new(0);

extern "C" fn info_handler(_sig: i32, info: *mut libc::siginfo_t, _ctx: *mut c_void) {
    INFO_TRAPS.fetch_add(1, SeqCst);
    // SAFETY: the siginfo of this delivery; a query of this thread's mask into a local set.
    unsafe {
        INFO_CODE.store((*info).si_code as u64, SeqCst);
        let mut cur: libc::sigset_t = std::mem::zeroed();
        libc::pthread_sigmask(libc::SIG_BLOCK, std::ptr::null(), &mut cur);
        if libc::sigismember(&cur, libc::SIGUSR2) == 1 && libc::sigismember(&cur, libc::SIGTRAP) == 0 {
            MASKED.fetch_add(1, SeqCst);
        }
    }
}

#[test]
fn the_programs_handler_gets_its_flags_and_mask() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    static E: AtomicU64 = AtomicU64::new(0);
    let id = attach_symbol(&spec("f1_bp"), ProbeKind::Entry, count, data(&E)).unwrap();
    // SAFETY: sigaction is plain data, for which all-zero is a valid value.
    let mut prev: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: installing an SA_SIGINFO | SA_RESETHAND handler with SIGUSR2 in its mask.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = info_handler as extern "C" fn(i32, *mut libc::siginfo_t, *mut c_void) as usize;
        sa.sa_flags = libc::SA_SIGINFO | libc::SA_RESETHAND;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaddset(&mut sa.sa_mask, libc::SIGUSR2);
        assert_eq!(libc::sigaction(libc::SIGTRAP, &sa, &mut prev), 0);
    }
    fn_ptr("f1_bp")(1);
    fn_ptr("own_trap")(0);
    fn_ptr("f1_bp")(1);
    assert_eq!(INFO_TRAPS.load(SeqCst), 1);
    assert_eq!(INFO_CODE.load(SeqCst), libc::SI_KERNEL as u64, "the siginfo of the int3");
    assert_eq!(
        MASKED.load(SeqCst),
        1,
        "SIGUSR2 (sa_mask) blocked in the handler, never SIGTRAP (a breakpoint probe may be hit there)"
    );
    assert_eq!(E.load(SeqCst), 2);
    // SAFETY: an all-zero struct sigaction is valid (no handler, empty mask).
    let mut now: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: a query into a local struct, then the previous disposition back.
    unsafe {
        assert_eq!(libc::sigaction(libc::SIGTRAP, std::ptr::null(), &mut now), 0);
        assert_eq!(now.sa_sigaction, libc::SIG_DFL, "SA_RESETHAND reset the program's disposition");
        assert_eq!(libc::sigaction(libc::SIGTRAP, &prev, std::ptr::null_mut()), 0);
    }
    detach(id).unwrap();
}

#[test]
fn a_thread_blocking_every_signal_still_passes_breakpoints() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    static E: AtomicU64 = AtomicU64::new(0);
    let id = attach_symbol(&spec("f3_bp"), ProbeKind::Entry, count, data(&E)).unwrap();
    let f = fn_ptr("f3_bp");
    let (blocked, asked) = std::thread::spawn(move || {
        // SAFETY: this thread's own mask, from a full local set; queried back into a local.
        unsafe {
            let mut all: libc::sigset_t = std::mem::zeroed();
            libc::sigfillset(&mut all);
            assert_eq!(libc::pthread_sigmask(libc::SIG_BLOCK, &all, std::ptr::null_mut()), 0);
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGTRAP);
            assert_eq!(libc::sigprocmask(libc::SIG_SETMASK, &set, std::ptr::null_mut()), 0);
            for i in 0..10 {
                assert_eq!(f(i), i);
            }
            let mut cur: libc::sigset_t = std::mem::zeroed();
            libc::pthread_sigmask(libc::SIG_BLOCK, std::ptr::null(), &mut cur);
            (libc::sigismember(&cur, libc::SIGTRAP), libc::sigismember(&all, libc::SIGTRAP))
        }
    })
    .join()
    .unwrap();
    assert_eq!((blocked, asked), (0, 1), "SIGTRAP is left out of the masks, the program's sets are untouched");
    assert_eq!(E.load(SeqCst), 10);
    detach(id).unwrap();
}

#[test]
fn breakpoint_hits_are_counted_apart() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    static E: AtomicU64 = AtomicU64::new(0);
    let id = attach_symbol(&spec("f4_bp"), ProbeKind::Entry, count, data(&E)).unwrap();
    let (b0, t0) = (stats().breakpoint_hits, stats().traps);
    for i in 0..7 {
        assert_eq!(fn_ptr("f4_bp")(i), 3 * i);
    }
    detach(id).unwrap();
    assert_eq!(stats().breakpoint_hits - b0, 7);
    assert_eq!(stats().traps, t0, "no patch in progress was met");
}
