//! Keeping userbpf's own work on a program's thread (outside a program run: a fork's child
//! handler) from its probes and system call tracepoints. The agent, which knows how (the hook
//! engine's `ours` scope), sets the two functions; without them nothing is done.

use std::sync::OnceLock;

/// How a scope of userbpf's own work starts (returning what its end restores) and ends.
struct Scope {
    begin: fn() -> u32,
    end: fn(u32),
}

static SCOPE: OnceLock<Scope> = OnceLock::new();

/// Sets how a scope of userbpf's own work starts and ends (once a process; later calls do
/// nothing).
pub fn set(begin: fn() -> u32, end: fn(u32)) {
    let _ = SCOPE.set(Scope { begin, end });
}

/// Runs `f` as userbpf's own work. Async-signal-safe when the functions set are (the hook
/// engine's only read and write the thread's state): reading the pair is an atomic load.
pub fn run<T>(f: impl FnOnce() -> T) -> T {
    let Some(s) = SCOPE.get() else { return f() };
    let prev = (s.begin)();
    let r = f();
    (s.end)(prev);
    r
}
