//! The syscall server: a shared library that `userbpf load` preloads into an eBPF loader
//! (bpftrace, a libbpf tool). It defines libc's `syscall`, `ioctl`, `mmap`, `mmap64` and
//! `munmap`, so the loader's `bpf()` and `perf_event_open` calls (libbpf and bcc make them
//! through `syscall()`), its ioctls on perf event descriptors and its mmaps of rings and
//! maps are served by the userspace runtime, in the session named by `USERBPF_SESSION`.
//! Everything else goes to the kernel untouched.
//!
//! Objects (maps, programs, BTF, links, perf events) are files in the session directory and
//! the descriptors the loader gets are real descriptors of those files ([`objects`]), so
//! `close`, `dup`, `fcntl`, `poll` and `epoll` work on them as on any file.
//!
//! The library: [`bpf`] (the bpf(2) commands), [`perf_event`] (perf_event_open and its
//! ioctls), [`mmap`] (rings and maps mapped, wakeups), [`attach`] (where programs run),
//! [`objects`] (the loader's descriptors of session objects), [`trace_pipe`]; the C entry
//! points that hand the loader's calls to it are [`shim`] (and [`dlsym`]).
//!
//! Roles: in the loader (`USERBPF_LOADER_PID` is this process) the library serves the calls;
//! in any other process (a child the loader starts, e.g. bpftrace's `-c`) it only acts as
//! the agent (the `userbpf-agent` crate linked in), which attaches the session's links,
//! until that child makes a `bpf()` call of its own: then it is a loader too ([`adopt`]: a
//! tool that a wrapper script runs).

use std::ffi::c_long;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

pub mod attach;
pub mod bpf;
pub mod dlsym;
pub mod error;
pub mod mmap;
pub mod objects;
pub mod perf_event;
pub mod server;
pub mod shim;
pub mod sys;
pub mod trace_pipe;

/// Environment variable: the pid of the loader whose calls are served.
pub const LOADER_PID_ENV: &str = "USERBPF_LOADER_PID";

/// `__NR_bpf` on x86-64.
pub const SYS_BPF: c_long = 321;
/// `__NR_perf_event_open` on x86-64.
pub const SYS_PERF_EVENT_OPEN: c_long = 298;

/// Whether this process is the loader whose calls are served: the process `userbpf load`
/// started, or a process it started that took the loader's role ([`adopt`]).
pub fn serving() -> bool {
    static SERVING: OnceLock<bool> = OnceLock::new();
    ADOPTED.load(Ordering::Relaxed)
        || *SERVING.get_or_init(|| {
            std::env::var(LOADER_PID_ENV).ok().and_then(|v| v.parse::<u32>().ok()) == Some(std::process::id())
        })
}

/// Set when this process took the loader's role ([`adopt`]).
static ADOPTED: AtomicBool = AtomicBool::new(false);

/// Called on a `bpf()` call this library does not serve: when the process descends from the
/// loader (it inherited `USERBPF_LOADER_PID`, which the processes userbpf itself starts do
/// not), it takes the loader's role, and this call and all its later ones are served. So a
/// loader that a wrapper runs as its child is served as the wrapper would be (Debian's
/// `pythoncalls-bpfcc` is a shell script running `ucalls -l python`), where its eBPF would
/// otherwise go to the kernel. A child that makes no `bpf()` call (bpftrace's `-c` command)
/// stays a target. Returns whether the process now serves.
pub fn adopt() -> bool {
    static UNDER_LOAD: OnceLock<bool> = OnceLock::new();
    if !*UNDER_LOAD.get_or_init(|| std::env::var(LOADER_PID_ENV).is_ok_and(|v| v.parse::<u32>().is_ok())) {
        return false;
    }
    ADOPTED.store(true, Ordering::Relaxed);
    true
}
