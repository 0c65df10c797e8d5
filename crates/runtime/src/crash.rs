//! What an agent leaves when its process dies of a fault outside eBPF code (a SIGSEGV or
//! SIGBUS in a helper, in map code given a bad pointer by an unverified program, or in the
//! target's own code): the faulting thread, the signal and address, and the program running
//! or last run on that thread, in the session's `crashes/PID`, for `userbpf run` and
//! `userbpf start` to report beside the signal.
//!
//! Nothing is added to the hot path: the last program is the run context every run already
//! writes into the thread's block ([`crate::context::last_program`]); the report is written
//! by the fault handler of [`userbpf_vm::guard`] (its fatal hook), with async-signal-safe
//! calls only, before the signal takes its course. Faults inside JIT code are not fatal (the
//! run ends with an error) and leave nothing.
//!
//! The report's file is made when the agent starts ([`arm`]: `crashes/PID`, one page, empty,
//! mapped shared, through the session's broker when the process may not create files there)
//! and the fault handler writes into the mapping: a process that dropped root after it joined
//! its session could not open the file at the time of the fault (and a descriptor the broker
//! would hand to the agent's thread lives in that thread's own table, not the faulting
//! thread's). A file left
//! empty means no crash: [`take`] and [`disarm`] (at the process's exit) remove it. A forked
//! child, which shares its parent's mapping but not its pid, opens `crashes/CHILD` at the time
//! of the fault instead, as before.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicPtr, AtomicU32, Ordering};

use crate::program::LoadedProgram;
use crate::session::layout::Layout;

/// `…/crashes/` as a C string (with the trailing slash): the file name is the pid at the
/// time of the fault (forks inherit the agent).
static DIR: OnceLock<CString> = OnceLock::new();

/// Bytes of a report's mapped file (a report is one short line).
const REPORT_BYTES: usize = 4096;
/// The mapped report file of process [`MAPPED_PID`] (null: none).
static MAPPED: AtomicPtr<u8> = AtomicPtr::new(std::ptr::null_mut());
static MAPPED_PID: AtomicU32 = AtomicU32::new(0);

/// Arms the report for this process in the session laid out by `layout` (the agent calls it
/// when it starts): the file made and mapped now (see the module docs); when that fails, the
/// fault handler tries to open it at the time of the fault.
pub fn arm(layout: &Layout) {
    let dir = layout.crashes_dir();
    let _ = crate::session::broker::make_dir(&dir);
    let pid = std::process::id();
    if let Some(p) = map_report(&layout.crash(pid)) {
        let old = MAPPED.swap(p, Ordering::SeqCst);
        MAPPED_PID.store(pid, Ordering::SeqCst);
        if !old.is_null() {
            // SAFETY: a mapping of REPORT_BYTES made by an earlier `arm` (an agent started
            // again), no longer published: the handler reads MAPPED afresh.
            unsafe { libc::munmap(old.cast(), REPORT_BYTES) };
        }
    }
    let mut bytes = dir.as_os_str().as_bytes().to_vec();
    bytes.push(b'/');
    if let Ok(c) = CString::new(bytes) {
        let _ = DIR.set(c);
        userbpf_vm::guard::set_fatal_hook(on_fatal);
    }
}

/// `path` made empty and one page long, mapped shared (the descriptor closed).
fn map_report(path: &std::path::Path) -> Option<*mut u8> {
    let fd = crate::session::broker::open(path, libc::O_RDWR | libc::O_CREAT | libc::O_TRUNC, 0o600).ok()?;
    let f = std::fs::File::from(fd);
    f.set_len(REPORT_BYTES as u64).ok()?;
    // SAFETY: a fresh shared mapping of a file we hold open and sized; no memory is affected.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            REPORT_BYTES,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            std::os::fd::AsRawFd::as_raw_fd(&f),
            0,
        )
    };
    (p != libc::MAP_FAILED).then_some(p.cast())
}

/// At the exit of the process: its report file goes when it holds no report (the process did
/// not crash). Best effort (a process invited into another user's session may find no broker
/// serving by then: the session's removal takes the file).
pub fn disarm(layout: &Layout) {
    let pid = std::process::id();
    let p = MAPPED.load(Ordering::SeqCst);
    if p.is_null() || MAPPED_PID.load(Ordering::SeqCst) != pid {
        return;
    }
    // SAFETY: the mapping of REPORT_BYTES `arm` made, alive until unmapped (never, but by a
    // later `arm`, which this exiting process does not run).
    let empty = unsafe { std::slice::from_raw_parts(p, REPORT_BYTES) }.iter().all(|&b| b == 0);
    if empty {
        let _ = crate::session::broker::remove_file(&layout.crash(pid));
    }
}

/// Appends the decimal digits of `v` to `buf` at `*n`.
fn put_num(buf: &mut [u8], n: &mut usize, mut v: u64) {
    let mut digits = [0u8; 20];
    let mut k = 0;
    loop {
        digits[k] = b'0' + (v % 10) as u8;
        k += 1;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    while k > 0 && *n < buf.len() {
        k -= 1;
        buf[*n] = digits[k];
        *n += 1;
    }
}

fn put(buf: &mut [u8], n: &mut usize, s: &[u8]) {
    for &b in s {
        if *n < buf.len() {
            buf[*n] = b;
            *n += 1;
        }
    }
}

/// The fatal hook: `tid=T sig=S addr=A prog=ID running=0|1` into `crashes/PID`.
extern "C" fn on_fatal(sig: libc::c_int, addr: usize) {
    let Some(dir) = DIR.get() else { return };
    let (prog, running) = crate::context::last_program();
    let mut id = 0u32;
    if !prog.is_null() {
        let field = (prog as *const u8).wrapping_add(std::mem::offset_of!(LoadedProgram, id));
        // SAFETY: `prog` was a live LoadedProgram's address; the read goes through the guard,
        // so a program freed since gives EFAULT (id 0) instead of a second fault.
        let _ = unsafe { userbpf_vm::guard::copy((&raw mut id).cast(), field, 4) };
    }
    let mut path = [0u8; 4200];
    let mut n = 0;
    put(&mut path, &mut n, dir.as_bytes());
    // SAFETY: getpid and gettid have no preconditions.
    let (pid, tid) = unsafe { (libc::getpid(), libc::gettid()) };
    put_num(&mut path, &mut n, pid as u64);
    if n >= path.len() {
        return;
    }
    path[n] = 0;
    let mut text = [0u8; 160];
    let mut m = 0;
    put(&mut text, &mut m, b"tid=");
    put_num(&mut text, &mut m, tid as u64);
    put(&mut text, &mut m, b" sig=");
    put_num(&mut text, &mut m, sig as u64);
    put(&mut text, &mut m, b" addr=");
    put_num(&mut text, &mut m, addr as u64);
    put(&mut text, &mut m, b" prog=");
    put_num(&mut text, &mut m, id as u64);
    put(&mut text, &mut m, if running { b" running=1\n" } else { b" running=0\n" });
    let mapped = MAPPED.load(Ordering::SeqCst);
    if !mapped.is_null() && MAPPED_PID.load(Ordering::SeqCst) == pid as u32 {
        // SAFETY: the report's mapping of REPORT_BYTES (`arm`), shared with the file; the
        // text (at most 160 bytes) fits. Plain stores: async-signal-safe.
        unsafe { std::ptr::copy_nonoverlapping(text.as_ptr(), mapped, m.min(REPORT_BYTES)) };
        return;
    }
    // SAFETY: a NUL-terminated path in our buffer; open, write and close are
    // async-signal-safe, and the buffers are ours.
    unsafe {
        let fd =
            libc::open(path.as_ptr().cast(), libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC | libc::O_CLOEXEC, 0o600);
        if fd >= 0 {
            libc::write(fd, text.as_ptr().cast(), m);
            libc::close(fd);
        }
    }
}

/// A crash report an agent left.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Crash {
    pub tid: u32,
    pub sig: i32,
    pub addr: u64,
    /// The session id of the program running or last run on the thread (0: none known).
    pub prog: u32,
    /// Whether the program was running when the fault came.
    pub running: bool,
}

/// Takes (reads and removes) the report process `pid` left in the session, if any.
pub fn take(layout: &Layout, pid: u32) -> Option<Crash> {
    let path = layout.crash(pid);
    let bytes = crate::session::broker::read(&path).ok()?;
    let _ = crate::session::broker::remove_file(&path);
    // A mapped report file is a page of NULs after the line (all NULs: no crash).
    let text = String::from_utf8_lossy(&bytes);
    let text = text.trim_end_matches('\0');
    let field = |k: &str| -> Option<u64> {
        text.split_whitespace().find_map(|w| w.strip_prefix(k)?.strip_prefix('=')?.parse().ok())
    };
    Some(Crash {
        tid: field("tid")? as u32,
        sig: field("sig")? as i32,
        addr: field("addr")?,
        prog: field("prog")? as u32,
        running: field("running")? == 1,
    })
}
