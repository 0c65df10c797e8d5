//! userbpf-inject: loads a library into another process that is already running, through
//! ptrace, and calls one of its functions there — how `userbpf attach` puts the agent into a
//! process that was not started under userbpf.
//!
//! One thread of the target is borrowed; the others run on. The borrowed thread is the one
//! least likely to hold a lock the call needs: one blocked in a system call other than a futex
//! wait (a thread waiting in `poll`, `read`, `nanosleep` is at a safe point), else the main
//! thread. It is seized (`PTRACE_SEIZE`) and stopped (`PTRACE_INTERRUPT`), its registers and
//! its whole extended FP state (`NT_X86_XSTATE`) are saved, and each call runs on its own
//! stack below the thread's red zone with a return address of 0: the call's `ret` faults at
//! address 0, which stops the thread again for us (the fault never reaches the target). Then
//! everything is put back and the thread is let go. A thread that was blocked in a system call
//! resumes at that call's `syscall` instruction, which makes it again from the start, so the
//! program never sees `EINTR` (see `remote::resumed_in_syscall`).
//!
//! [`call_loaded`] calls a function of a library the process loaded before (how `userbpf
//! detach` reaches the agent): the process's `dlopen` with `RTLD_NOLOAD` finds it without
//! mapping anything (and says when it is not there), `dlsym` finds the function, and the
//! reference that `dlopen` counted is given back with `dlclose`.
//!
//! The functions called are found in the target's own libc: `dlopen`, `dlsym` and `dlerror`
//! from its dynamic symbol table (glibc 2.34 and later have them in libc.so.6), at the address
//! the target mapped libc at (`/proc/PID/maps`).
//!
//! What cannot work is refused before anything is touched, with the reason: a process that is
//! gone, another user's process, a process already traced (by a debugger, strace), Yama's
//! `ptrace_scope` forbidding it, a static binary (no libc to call `dlopen` in).

mod procfs;
mod remote;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

pub use procfs::libc_symbol;
use remote::Borrowed;

/// Why an injection did not happen (or did not complete).
#[derive(Debug, thiserror::Error)]
pub enum InjectError {
    #[error("process {0} does not exist")]
    NoProcess(i32),
    #[error("process {pid} belongs to uid {owner}: only its owner or root may attach to it")]
    OtherUser { pid: i32, owner: u32 },
    #[error("process {pid} is already traced by process {tracer} (a debugger or strace): only one tracer at a time")]
    AlreadyTraced { pid: i32, tracer: i32 },
    #[error("ptrace is not allowed here: {0}")]
    NotAllowed(String),
    #[error(
        "process {pid} has no libc.so.6 mapped (a static binary?): the agent can only be loaded through the target's own dlopen"
    )]
    NoLibc { pid: i32 },
    #[error("{what} not found in {lib}")]
    NoSymbol { what: String, lib: PathBuf },
    #[error("process {pid}: {what}")]
    Ptrace { pid: i32, what: String },
    #[error("process {pid} died during the injection ({how})")]
    Died { pid: i32, how: String },
    #[error("dlopen of {lib} in process {pid} failed: {why}")]
    Dlopen { pid: i32, lib: PathBuf, why: String },
    #[error("{lib} is not loaded in process {pid}")]
    NotLoaded { pid: i32, lib: PathBuf },
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// What an injection did and cost.
#[derive(Debug, Clone)]
pub struct Injected {
    /// The library's handle in the target (what its dlopen returned).
    pub handle: u64,
    /// What the called function returned.
    pub ret: u64,
    /// The thread that was borrowed.
    pub tid: i32,
    /// How long that thread was stopped: from the stop to the moment it was let go.
    pub pause: Duration,
}

/// Loads `lib` into process `pid` with its own `dlopen(lib, RTLD_NOW)`, then calls
/// `func(arg)` there, `arg` being a NUL-terminated copy of the given bytes in the target's
/// memory (valid during the call only), and returns what it returned.
pub fn inject(pid: i32, lib: &Path, func: &str, arg: &[u8]) -> Result<Injected, InjectError> {
    call_in(pid, lib, func, arg, libc::RTLD_NOW)
}

/// Calls `func(arg)` in library `lib` that process `pid` has loaded already (found with its
/// own `dlopen(lib, RTLD_NOW | RTLD_NOLOAD)`, which maps nothing, and `dlsym`), as [`inject`]
/// does; [`InjectError::NotLoaded`] when the process does not have it. The handle the
/// process's `dlopen` counted is given back (`dlclose`), so its reference count is as before.
pub fn call_loaded(pid: i32, lib: &Path, func: &str, arg: &[u8]) -> Result<Injected, InjectError> {
    call_in(pid, lib, func, arg, libc::RTLD_NOW | libc::RTLD_NOLOAD)
}

fn call_in(pid: i32, lib: &Path, func: &str, arg: &[u8], mode: i32) -> Result<Injected, InjectError> {
    procfs::check_can_trace(pid)?;
    let lib = std::fs::canonicalize(lib)?;
    let (libc_path, libc_base) = procfs::libc_of(pid)?;
    let dlopen = libc_symbol(&libc_path, "dlopen")?.wrapping_add(libc_base);
    let dlsym = libc_symbol(&libc_path, "dlsym")?.wrapping_add(libc_base);
    let dlerror = libc_symbol(&libc_path, "dlerror")?.wrapping_add(libc_base);
    let dlclose = libc_symbol(&libc_path, "dlclose")?.wrapping_add(libc_base);
    let noload = mode & libc::RTLD_NOLOAD != 0;

    let tid = procfs::safe_thread(pid);
    let mut t = Borrowed::seize(pid, tid)?;
    let stopped = Instant::now();
    let result = (|| {
        let mut path = lib.as_os_str().as_encoded_bytes().to_vec();
        path.push(0);
        let handle = t.call(dlopen, &[Arg::Bytes(&path), Arg::Word(mode as u64)])?;
        if handle == 0 && noload {
            return Err(InjectError::NotLoaded { pid, lib: lib.clone() });
        }
        if handle == 0 {
            let msg = t.call(dlerror, &[])?;
            let why = if msg == 0 { "no reason given".to_string() } else { t.read_cstring(msg, 4096)? };
            return Err(InjectError::Dlopen { pid, lib: lib.clone(), why });
        }
        let mut name = func.as_bytes().to_vec();
        name.push(0);
        let f = t.call(dlsym, &[Arg::Word(handle), Arg::Bytes(&name)])?;
        if f == 0 {
            return Err(InjectError::NoSymbol { what: format!("function `{func}`"), lib: lib.clone() });
        }
        let mut a = arg.to_vec();
        a.push(0);
        let ret = t.call(f, &[Arg::Bytes(&a)])?;
        if noload {
            // RTLD_NOLOAD counted a reference: give it back (the library stays: the first
            // dlopen's reference holds it).
            t.call(dlclose, &[Arg::Word(handle)])?;
        }
        Ok((handle, ret))
    })();
    let released = t.release();
    let pause = stopped.elapsed();
    let (handle, ret) = result?;
    released?;
    Ok(Injected { handle, ret, tid, pause })
}

/// An argument of a remote call: a word, or bytes copied into the target (their address is
/// passed).
#[derive(Clone, Copy, Debug)]
pub enum Arg<'a> {
    Word(u64),
    Bytes(&'a [u8]),
}
