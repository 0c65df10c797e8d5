//! fork(2): the child of a process with probes keeps its hooks (the patched code and the
//! trampolines are copied with the address space) and must find the engine's state sane.
//!
//! [`install`] registers `pthread_atfork` handlers: before the fork the registry lock is
//! taken, so no other thread is in the middle of patching when the address space is copied;
//! after it the lock is released in both processes, and the child forgets the per-thread
//! states of the threads that did not follow it (their shadow stacks, and their RCU
//! generations, which could be stuck odd if they were running a handler) and registers for
//! membarrier and for system call dispatch (`sud`) again. The forking thread's state is kept: its shadow stack still describes its
//! stack, which the child continues.

use std::cell::UnsafeCell;
use std::sync::{MutexGuard, Once};

struct Held(UnsafeCell<Option<MutexGuard<'static, Option<crate::Registry>>>>);
// SAFETY: only touched by the forking thread between its prepare handler and its parent or
// child handler; a second forking thread waits in `prepare` for the registry lock, which is
// released only after the slot was emptied.
unsafe impl Sync for Held {}
static HELD: Held = Held(UnsafeCell::new(None));

static ONCE: Once = Once::new();

/// Registers the fork handlers (once per process).
pub fn install() {
    ONCE.call_once(|| {
        // SAFETY: registers handlers that follow the rules of the comments below.
        unsafe { libc::pthread_atfork(Some(prepare), Some(parent), Some(child)) };
    });
}

extern "C" fn prepare() {
    let g = crate::registry();
    // SAFETY: see `Held`: this thread now owns the registry lock and the slot is empty.
    unsafe { *HELD.0.get() = Some(g) };
}

extern "C" fn parent() {
    // SAFETY: see `Held`; dropping the guard releases the lock taken in `prepare`.
    drop(unsafe { (*HELD.0.get()).take() });
}

extern "C" fn child() {
    // userbpf's work on the program's thread: its system calls (membarrier's registration)
    // are not the program's.
    let _ours = crate::thread::ours();
    // SAFETY: see `Held`. In the child only this thread exists; releasing the lock is an atomic
    // store (and a futex wake if a parent thread was waiting: a system call, harmless here).
    drop(unsafe { (*HELD.0.get()).take() });
    crate::thread::after_fork_in_child();
    crate::patch::after_fork_in_child();
    crate::sud::after_fork_in_child();
}
