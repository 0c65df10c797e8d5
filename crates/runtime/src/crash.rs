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

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::sync::OnceLock;

use crate::program::LoadedProgram;
use crate::session::layout::Layout;

/// `…/crashes/` as a C string (with the trailing slash): the file name is the pid at the
/// time of the fault (forks inherit the agent).
static DIR: OnceLock<CString> = OnceLock::new();

/// Arms the report for this process in the session laid out by `layout` (the agent calls it
/// when it starts).
pub fn arm(layout: &Layout) {
    let dir = layout.crashes_dir();
    let _ = std::fs::create_dir_all(&dir);
    let mut bytes = dir.as_os_str().as_bytes().to_vec();
    bytes.push(b'/');
    if let Ok(c) = CString::new(bytes) {
        let _ = DIR.set(c);
        userbpf_vm::guard::set_fatal_hook(on_fatal);
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
    let text = std::fs::read_to_string(&path).ok()?;
    let _ = std::fs::remove_file(&path);
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
