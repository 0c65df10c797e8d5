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
//! the agent (the `userbpf-agent` crate linked in), which attaches the session's links.

use std::ffi::c_long;
use std::sync::OnceLock;

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

/// Whether this process is the loader whose calls are served.
pub fn serving() -> bool {
    static SERVING: OnceLock<bool> = OnceLock::new();
    *SERVING.get_or_init(|| {
        std::env::var(LOADER_PID_ENV).ok().and_then(|v| v.parse::<u32>().ok()) == Some(std::process::id())
    })
}
