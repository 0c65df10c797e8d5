//! `userbpf detach PID`: the agent leaves a running process as it found it.
//!
//! [`userbpf_agent_detach`] (called by the injector on a borrowed thread of the process, as
//! `userbpf_agent_attach` is) only asks: it sets [`REQUESTED`] and wakes the agent's thread
//! (a touch of the acknowledgement file it watches), then returns, so the borrowed thread is
//! paused for microseconds and never waits for a thread (it may itself have been stopped
//! inside a trampoline). The agent's thread then waits until the injector has let the borrowed
//! thread go (patching signals every thread running user code and waits for each, and a thread
//! in a ptrace stop answers only once released), and, in its own descriptor table ([`run`]):
//! 1. detaches every link (probes removed, USDT semaphores it raised lowered, system call
//!    tracepoints' raw probes removed), stops acknowledging link changes (its
//!    `agents/PID.START` file goes, so loaders stop waiting for it) and leaves the session
//!    (its `members/` entry goes);
//! 2. has the hook engine let go of the process (`userbpf_hook::release`): system call
//!    dispatch off in every thread, the loader's notification taken out of
//!    `_dl_debug_state`, every remaining probe (the engine's own on libc's `sigaction`,
//!    `pthread_sigmask`, `sigprocmask`) removed with the live-patching protocol (a thread
//!    between displaced instructions is moved to their copy; running handlers are waited
//!    for), then `SIGTRAP`, `SIGSYS` and the engine's two real-time signals given back;
//! 3. frees what the probes' handlers used (their data: no thread can run a handler any
//!    more), gives `SIGSEGV` and `SIGBUS` (the fault guard) and `SIGSETXID` (see `creds`)
//!    back as they were before the agent. The programs, their maps and the CPU slots stay
//!    mapped (the runtime keeps every program and map it prepared until the process exits:
//!    `userbpf_runtime::program_table`, `helpers::maps`); a later attach to the same
//!    session takes them up again, so attach/detach cycles map nothing new (while the session
//!    lives on: a program only while its record is the same file, the slots while the `cpus`
//!    file is, as a wiped or re-made session gives its ids out again);
//! 4. ends: its private descriptor table, and every descriptor of the agent in it, goes with
//!    it. `userbpf detach` waits for the thread to be gone.
//!
//! `USERBPF_TRACE_DETACH=1` in the process's environment prints (on its stderr) how long each
//! step took, from the request on.
//!
//! The library itself stays mapped: a thread may still be about to return through its code
//! (a handler's last instructions after the engine's wait, the loader notification's stub
//! entered just before it was taken out), and `dlclose` of a Rust library with thread-local
//! destructors and `atexit` handlers registered is unsafe. Its fork and exit handlers stay
//! registered and do nothing while it is detached. A later `userbpf attach` finds the
//! library with the process's `dlopen` (already loaded: nothing is mapped) and starts the
//! agent again in place: the engine takes its signals again, the guard's and `creds`'s
//! handlers go back in ([`reclaim`]).

use std::ffi::c_void;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::{Agent, lock, watcher};

/// When the detach was asked for (CLOCK_MONOTONIC ns), for `USERBPF_TRACE_DETACH`.
static REQUESTED_AT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

fn monotonic_ns() -> u64 {
    // SAFETY: an all-zero timespec is valid; clock_gettime writes it.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: as above, a pointer to our local.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// A detach was asked for: the agent's thread runs [`run`] and ends.
static REQUESTED: AtomicBool = AtomicBool::new(false);
/// The agent was detached (and not started again since).
static DETACHED: AtomicBool = AtomicBool::new(false);

/// Whether a detach was asked for.
pub(crate) fn requested() -> bool {
    REQUESTED.load(Ordering::SeqCst)
}

/// Whether the agent is detached: its fork, exit and loader handlers do nothing.
pub(crate) fn is_detached() -> bool {
    DETACHED.load(Ordering::SeqCst)
}

/// The kernel's `struct sigaction` (x86-64).
#[repr(C)]
#[derive(Clone, Copy, Default, PartialEq, Eq, Debug)]
struct KSigaction {
    handler: usize,
    flags: u64,
    restorer: usize,
    mask: u64,
}

fn k_sigaction(sig: i32, new: Option<&KSigaction>) -> Option<KSigaction> {
    let mut old = KSigaction::default();
    let newp = new.map_or(std::ptr::null(), |n| n as *const KSigaction);
    // SAFETY: rt_sigaction with pointers to structs of the kernel's layout and its 8-byte set.
    let r = unsafe {
        libc::syscall(libc::SYS_rt_sigaction, sig as libc::c_long, newp, &mut old as *mut KSigaction, 8 as libc::c_long)
    };
    (r == 0).then_some(old)
}

/// The fault guard's signals (`userbpf_vm::guard`).
const GUARD_SIGNALS: [i32; 2] = [libc::SIGSEGV, libc::SIGBUS];

/// The guard's signals as the process had them before the guard's handler, and the guard's
/// own dispositions while detached (put back by [`reclaim`]).
struct GuardSignals {
    before: [KSigaction; 2],
    ours: Option<[KSigaction; 2]>,
}

static GUARD: Mutex<Option<GuardSignals>> = Mutex::new(None);

/// Called where the agent installs the fault guard (`Agent::start_in`), just before: the first
/// time, records the dispositions the guard is about to replace; after a detach, puts the
/// guard's handler back (its installation runs once per process).
pub(crate) fn before_guard() {
    let mut g = GUARD.lock().unwrap_or_else(|e| e.into_inner());
    match g.as_mut() {
        None => {
            let before = GUARD_SIGNALS.map(|s| k_sigaction(s, None).unwrap_or_default());
            *g = Some(GuardSignals { before, ours: None });
        }
        Some(gs) => {
            if let Some(ours) = gs.ours.take() {
                for (s, a) in GUARD_SIGNALS.iter().zip(ours.iter()) {
                    // The disposition found is the program's (it may have changed it while
                    // detached): the guard hands other faults to the one it recorded first.
                    k_sigaction(*s, Some(a));
                }
            }
        }
    }
}

/// Gives the guard's signals back (the guard's handler is kept for [`before_guard`]).
fn release_guard() {
    let mut g = GUARD.lock().unwrap_or_else(|e| e.into_inner());
    let Some(gs) = g.as_mut() else { return };
    if gs.ours.is_some() {
        return;
    }
    let ours = GUARD_SIGNALS.map(|s| k_sigaction(s, None).unwrap_or_default());
    for (s, b) in GUARD_SIGNALS.iter().zip(gs.before.iter()) {
        k_sigaction(*s, Some(b));
    }
    gs.ours = Some(ours);
}

/// The agent starts again after a detach (`Agent::start_in`).
pub(crate) fn reclaim() {
    REQUESTED.store(false, Ordering::SeqCst);
    DETACHED.store(false, Ordering::SeqCst);
}

/// Something the probes' handlers use, freed once no handler can run ([`run`], after the
/// hook engine let go): a leaked box and its destructor.
struct Reclaim {
    ptr: *mut c_void,
    free: unsafe fn(*mut c_void),
}

// SAFETY: the pointer is only dereferenced by `free`, once, on the agent's thread, after every
// handler that could use it has finished.
unsafe impl Send for Reclaim {}

static LEAKED: Mutex<Vec<Reclaim>> = Mutex::new(Vec::new());

/// Boxes `value` for a probe's handler where the hit path's objects sit together (see
/// `userbpf_arena`) and remembers it to be freed at detach; returns it.
pub(crate) fn leak<T: Send + Sync + 'static>(value: T) -> &'static mut T {
    unsafe fn free<T>(p: *mut c_void) {
        // SAFETY: `p` came from `Box::into_raw` of a `Box<T>` (see `leak`), freed once.
        drop(unsafe { Box::from_raw(p.cast::<T>()) });
    }
    let p = Box::into_raw(userbpf_arena::scope(|| Box::new(value)));
    LEAKED.lock().unwrap_or_else(|e| e.into_inner()).push(Reclaim { ptr: p.cast(), free: free::<T> });
    // SAFETY: just leaked; freed only by `run` once no handler can use it.
    unsafe { &mut *p }
}

/// Asks the agent to leave this process (see the module's documentation). `arg` is unused
/// (the injector passes a string). 0: the agent's thread was told and detaches now; 1: no
/// agent runs here (never started, or detached already); -1: it could not be told.
///
/// # Safety
/// None beyond being called once the library is loaded; `arg` is not read.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn userbpf_agent_detach(_arg: *const std::ffi::c_char) -> i32 {
    let _ours = userbpf_hook::ours();
    std::panic::catch_unwind(|| {
        if crate::AGENT.get().is_none() || is_detached() || watcher::agent_tid() == 0 {
            return 1;
        }
        watcher::note_borrowed();
        REQUESTED_AT.store(monotonic_ns(), Ordering::SeqCst);
        REQUESTED.store(true, Ordering::SeqCst);
        // A thread serving requests only (no watch) sees the flag within its 20 ms sleep.
        watcher::kick();
        0
    })
    .unwrap_or(-1)
}

/// The detach itself, on the agent's thread (see the module's documentation). Errors are
/// printed on the program's stderr; the rest goes on.
pub(crate) fn run(a: &'static Mutex<Agent>) {
    let _ours = userbpf_hook::ours();
    // `USERBPF_TRACE_DETACH=1` in the process's environment: how long each step took.
    let trace = std::env::var_os("USERBPF_TRACE_DETACH").is_some_and(|v| v == "1");
    let t0 = std::time::Instant::now();
    let woken = monotonic_ns().saturating_sub(REQUESTED_AT.load(Ordering::SeqCst));
    let mut steps: Vec<(&str, std::time::Duration)> = Vec::new();
    let step = |name, steps: &mut Vec<_>| {
        if trace {
            steps.push((name, t0.elapsed()));
        }
    };
    // The probes come out once the injector let its borrowed thread go (see
    // `watcher::wait_borrowed_released`).
    watcher::wait_borrowed_released();
    step("borrowed thread released", &mut steps);
    {
        let mut g = lock(a);
        step("agent locked", &mut steps);
        g.leave_session();
    }
    step("links detached, session left", &mut steps);
    DETACHED.store(true, Ordering::SeqCst);
    if let Err(e) = userbpf_hook::release() {
        watcher::log(&format!("detach: {e}"));
    }
    step("hook engine released", &mut steps);
    // No handler runs any more: what they used can go, then the programs (maps unmapped).
    let leaked = std::mem::take(&mut *LEAKED.lock().unwrap_or_else(|e| e.into_inner()));
    for r in leaked {
        // SAFETY: see `Reclaim`.
        unsafe { (r.free)(r.ptr) };
    }
    release_guard();
    crate::creds::uninstall();
    step("handlers' data freed, signals given back", &mut steps);
    if trace {
        let text: Vec<String> = steps.iter().map(|(n, d)| format!("{n} at {:.1} ms", d.as_secs_f64() * 1e3)).collect();
        let woken = woken as f64 / 1e6;
        watcher::log(&format!("detach: started {woken:.1} ms after the request; {}", text.join(", ")));
    }
}
