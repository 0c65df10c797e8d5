//! userbpf's runtime: sessions (programs, maps and links in shared memory), the helpers with
//! the kernel's ids and semantics, and programs loaded from objects.

pub mod context;
pub mod control;
pub mod crash;
pub mod helpers;
pub mod kernel_map;
pub mod loader;
pub mod prog_stats;
pub mod program;
pub mod program_table;
pub mod session;
pub mod verify;

pub use loader::{LoadObjectError, LoadedObject, load_object};

/// Keeping userbpf's own work on a program's thread (outside a program run: a fork's child
/// handler) from its probes and system call tracepoints. The agent, which knows how (the hook
/// engine's `ours` scope), sets the two functions; without them nothing is done.
pub mod own_work {
    use std::sync::atomic::{AtomicUsize, Ordering};

    static BEGIN: AtomicUsize = AtomicUsize::new(0);
    static END: AtomicUsize = AtomicUsize::new(0);

    /// Sets how a scope of userbpf's own work starts (returning what its end restores) and
    /// ends.
    pub fn set(begin: fn() -> u32, end: fn(u32)) {
        BEGIN.store(begin as usize, Ordering::Release);
        END.store(end as usize, Ordering::Release);
    }

    /// Runs `f` as userbpf's own work. Async-signal-safe when the functions set are (the hook
    /// engine's only read and write the thread's state).
    pub fn run<T>(f: impl FnOnce() -> T) -> T {
        let (b, e) = (BEGIN.load(Ordering::Acquire), END.load(Ordering::Acquire));
        if b == 0 || e == 0 {
            return f();
        }
        // SAFETY: both were stored from `fn` pointers of these types by `set`.
        let (begin, end) =
            unsafe { (std::mem::transmute::<usize, fn() -> u32>(b), std::mem::transmute::<usize, fn(u32)>(e)) };
        let prev = begin();
        let r = f();
        end(prev);
        r
    }
}
pub use program::{Engine, LoadedProgram};
pub use session::{LinkRecord, MapRecord, ProgRecord, Session, SessionError};
