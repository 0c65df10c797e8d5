//! Attaching and detaching probes leaves the process's blocked system calls alone: the
//! live-patching protocol signals only threads that may be inside the displaced
//! instructions, so a thread in `nanosleep`, `poll` or `read` elsewhere sleeps on (the
//! kernel's uprobes never interrupt them either).

use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use userbpf_hook::*;

std::arch::global_asm!(
    ".pushsection .text.userbpf_sleepers_test,\"ax\",@progbits",
    // A function with room for the patch and no system call in it.
    ".globl t_sl_probe",
    ".type t_sl_probe, @function",
    "t_sl_probe:",
    "    nop dword ptr [rax + rax * 1 + 0]",
    "    lea rax, [rdi + 1]",
    "    ret",
    ".size t_sl_probe, . - t_sl_probe",
    // long t_sl_read(int fd, void *buf, size_t n): read(2) with its `syscall` among the first
    // five bytes (the ones a probe displaces): a thread blocked in it resumes inside them.
    ".globl t_sl_read",
    ".type t_sl_read, @function",
    "t_sl_read:",
    "    xor eax, eax",
    "    syscall",
    "    nop",
    "    nop dword ptr [rax + rax * 1 + 0]",
    "    ret",
    ".size t_sl_read, . - t_sl_read",
    ".popsection",
);

unsafe extern "C" {
    fn t_sl_probe(x: u64) -> u64;
    fn t_sl_read(fd: i32, buf: *mut u8, n: usize) -> i64;
}

/// One test at a time: each counts on the other threads of the process being its own.
static SERIAL: Mutex<()> = Mutex::new(());

static HITS: AtomicU64 = AtomicU64::new(0);

unsafe extern "C" fn count(_d: *mut c_void, _r: *mut PtRegs) -> u32 {
    HITS.fetch_add(1, SeqCst);
    HOOK_CONTINUE
}

fn gettid() -> i32 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() }
}

/// `/proc/self/task/TID/syscall` of thread `tid`: the system call number it is blocked in.
fn blocked_in(tid: i32) -> Option<i64> {
    let text = std::fs::read_to_string(format!("/proc/self/task/{tid}/syscall")).ok()?;
    text.split_whitespace().next()?.parse().ok().filter(|nr| *nr >= 0)
}

fn wait_blocked(tid: i32, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while blocked_in(tid).is_none() {
        assert!(Instant::now() < deadline, "{what} (tid {tid}) never blocked in a system call");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn pipe() -> (i32, i32) {
    let mut p = [0i32; 2];
    // SAFETY: pipe2 writes two descriptors into `p`.
    assert_eq!(unsafe { libc::pipe2(p.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    (p[0], p[1])
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// What a blocked call returned: (return value, errno), set once it returned.
#[derive(Default)]
struct Outcome {
    done: AtomicBool,
    ret: AtomicI64,
    errno: AtomicI64,
    tid: AtomicI64,
}

impl Outcome {
    fn set(&self, ret: i64, err: i32) {
        self.ret.store(ret, SeqCst);
        self.errno.store(err as i64, SeqCst);
        self.done.store(true, SeqCst);
    }
    fn tid(&self) -> i32 {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let t = self.tid.load(SeqCst);
            if t != 0 {
                return t as i32;
            }
            assert!(Instant::now() < deadline, "thread did not start");
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    fn describe(&self) -> String {
        format!("returned {} (errno {})", self.ret.load(SeqCst), self.errno.load(SeqCst))
    }
}

fn spawn(f: impl FnOnce(&Outcome) -> (i64, i32) + Send + 'static) -> Arc<Outcome> {
    let o = Arc::new(Outcome::default());
    let o2 = o.clone();
    std::thread::spawn(move || {
        o2.tid.store(gettid() as i64, SeqCst);
        let (r, e) = f(&o2);
        o2.set(r, e);
    });
    o
}

#[test]
fn threads_blocked_elsewhere_sleep_through_attach_and_detach() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // A nanosleep far longer than the test (it must still be sleeping at the end: glibc's
    // nanosleep/sleep return early on any handled signal), a poll and a read on pipes.
    let sleeper = spawn(|_| {
        let req = libc::timespec { tv_sec: 3600, tv_nsec: 0 };
        let mut rem = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: both timespecs live across the call.
        let r = unsafe { libc::nanosleep(&req, &mut rem) };
        (r as i64, errno())
    });
    let (poll_r, poll_w) = pipe();
    let poller = spawn(move |_| {
        let mut p = libc::pollfd { fd: poll_r, events: libc::POLLIN, revents: 0 };
        // SAFETY: one pollfd, living across the call.
        let r = unsafe { libc::poll(&mut p, 1, -1) };
        (if r == 1 { p.revents as i64 } else { r as i64 }, errno())
    });
    let (read_r, read_w) = pipe();
    let reader = spawn(move |_| {
        let mut b = [0u8; 4];
        // SAFETY: reading into a local buffer of its length.
        let r = unsafe { libc::read(read_r, b.as_mut_ptr().cast(), b.len()) };
        (r as i64, errno())
    });
    for (o, what) in [(&sleeper, "nanosleep"), (&poller, "poll"), (&reader, "read")] {
        wait_blocked(o.tid(), what);
    }

    let addr = t_sl_probe as *const () as usize;
    let ext = Some(FuncExtent { start: addr, len: 10 });
    let before = HITS.load(SeqCst);
    for _ in 0..3 {
        let entry = attach_with(addr, ProbeKind::Entry, count, std::ptr::null_mut(), ext).expect("attach entry");
        let ret = attach_with(addr, ProbeKind::Return, count, std::ptr::null_mut(), ext).expect("attach return");
        // SAFETY: the test function follows the C ABI.
        assert_eq!(unsafe { t_sl_probe(41) }, 42);
        detach(ret).expect("detach return");
        detach(entry).expect("detach entry");
    }
    assert_eq!(HITS.load(SeqCst) - before, 6, "entry and return hits while attached");
    // SAFETY: as above; no probe any more.
    assert_eq!(unsafe { t_sl_probe(1) }, 2);
    assert_eq!(HITS.load(SeqCst) - before, 6, "no hit once detached");

    for (o, what) in [(&sleeper, "nanosleep(3600 s)"), (&poller, "poll"), (&reader, "read")] {
        assert!(!o.done.load(SeqCst), "{what} came back while probes were attached and detached: {}", o.describe());
        assert!(blocked_in(o.tid()).is_some(), "{what} is no longer blocked");
    }
    // The poll and the read end with their data, as if nothing had happened.
    // SAFETY: one-byte writes from a constant into pipes we own.
    unsafe {
        assert_eq!(libc::write(poll_w, b"p".as_ptr().cast(), 1), 1);
        assert_eq!(libc::write(read_w, b"r".as_ptr().cast(), 1), 1);
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while !(poller.done.load(SeqCst) && reader.done.load(SeqCst)) {
        assert!(Instant::now() < deadline, "poll/read did not return with their data");
        std::thread::sleep(Duration::from_millis(2));
    }
    assert_eq!(poller.ret.load(SeqCst), libc::POLLIN as i64, "poll: {}", poller.describe());
    assert_eq!(reader.ret.load(SeqCst), 1, "read: {}", reader.describe());
    // The sleeper is left asleep (the process ends with the test binary).
}

/// Why a thread blocked in a system call never needs the move to the relocated copy: a
/// `syscall` among the displaced instructions of a jump is refused like a call (the thread
/// would resume inside them), so a blocked thread's `PC` can only lie inside displaced bytes
/// when it is stopped there otherwise (a fault, a stop), and such a thread is still
/// signalled. Such a function gets a breakpoint instead; a breakpoint on the `syscall` itself
/// runs it from the relocated copy.
#[test]
fn a_system_call_among_the_displaced_bytes_takes_a_breakpoint() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let addr = t_sl_read as *const () as usize;
    let ext = Some(FuncExtent { start: addr, len: 11 });
    let before = HITS.load(SeqCst);
    for at in [addr, addr + 2] {
        let id = attach_with(at, ProbeKind::Entry, count, std::ptr::null_mut(), ext).expect("attach");
        assert_eq!(probe_method(at), Some((Method::Breakpoint, at)));
        let (r, w) = pipe();
        // SAFETY: a one-byte write from a constant into a pipe we own, then read(2) in
        // assembly into a local buffer.
        unsafe {
            assert_eq!(libc::write(w, b"y".as_ptr().cast(), 1), 1);
            let mut b = [0u8; 1];
            assert_eq!(t_sl_read(r, b.as_mut_ptr(), 1), 1);
            assert_eq!(b[0], b'y');
        }
        detach(id).expect("detach");
    }
    assert_eq!(HITS.load(SeqCst) - before, 2);
    // Inside an instruction (`xor eax, eax` is two bytes): refused.
    let e = attach_with(addr + 1, ProbeKind::Entry, count, std::ptr::null_mut(), ext).unwrap_err();
    assert!(e.to_string().contains("not an instruction boundary"), "{e}");
}
