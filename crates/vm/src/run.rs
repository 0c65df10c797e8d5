//! Per-run state shared by the executors and the helpers they call: exit requests
//! ([`request_exit`], for `bpf_tail_call`), errors that end the run from inside a helper (an
//! error in a callback run by [`callback::invoke`](crate::callback::invoke), an abort of JIT
//! code), and which program is running (so that `invoke` can find it).
//!
//! Every run (of either executor) has a [`RunCtx`] on its own stack; a thread-local points to
//! the innermost one. A run saves the pointer it found and puts it back when it ends, so a run
//! nested inside a helper of another run neither sees nor clobbers the outer run's state.

use std::cell::Cell;
use std::ptr;

use crate::interp::InterpRun;
use crate::{JitProgram, VmError};

/// Something that ends the run as soon as an executor looks (after a helper marked
/// [`may_exit`](crate::Helper::may_exit)), or at the latest when the run returns.
#[derive(Debug, Default)]
pub(crate) enum Pending {
    #[default]
    None,
    /// A helper asked the run to end with this r0.
    Exit(u64),
    /// The run fails with this error (the first one is kept).
    Error(VmError),
}

/// Which executor runs, and what `callback::invoke` needs to re-enter it.
#[derive(Clone, Copy)]
pub(crate) enum RunKind<'a> {
    Interp(&'a InterpRun<'a>),
    Jit(&'a JitProgram),
}

/// The state of one run.
pub(crate) struct RunCtx<'a> {
    pending: Cell<Pending>,
    pub(crate) kind: RunKind<'a>,
    /// Callbacks of this run being executed now, nested (JIT runs count them for the depth limit).
    pub(crate) callbacks: Cell<usize>,
}

thread_local! {
    /// The innermost run on this thread, or null. (A plain pointer in a `const` thread-local:
    /// no lazy initialisation, no destructor, so it can be read from anywhere.)
    static CURRENT: Cell<*const RunCtx<'static>> = const { Cell::new(ptr::null()) };
}

/// What [`RunCtx::status`] finds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Status {
    Running,
    Exit(u64),
    Error,
}

impl<'a> RunCtx<'a> {
    pub(crate) fn new(kind: RunKind<'a>) -> RunCtx<'a> {
        RunCtx { pending: Cell::new(Pending::None), kind, callbacks: Cell::new(0) }
    }

    /// Makes this the innermost run of the thread until the returned guard is dropped.
    pub(crate) fn enter(&self) -> Scope {
        let me = (self as *const RunCtx<'a>).cast::<RunCtx<'static>>();
        // One thread-local access per run (each is a call to `__tls_get_addr` in a cdylib):
        // the scope keeps the cell's address to put the outer run back.
        let cell = CURRENT.with(|c| c as *const Cell<*const RunCtx<'static>>);
        // SAFETY: this thread's cell, alive while the thread runs (no destructor).
        Scope { outer: unsafe { (*cell).replace(me) }, cell }
    }

    pub(crate) fn status(&self) -> Status {
        let p = self.pending.take();
        let s = match p {
            Pending::None => Status::Running,
            Pending::Exit(v) => Status::Exit(v),
            Pending::Error(_) => Status::Error,
        };
        self.pending.set(p);
        s
    }

    /// The pending error, if any (left pending).
    pub(crate) fn error(&self) -> Option<VmError> {
        let p = self.pending.take();
        let e = match &p {
            Pending::Error(e) => Some(e.clone()),
            _ => None,
        };
        self.pending.set(p);
        e
    }

    /// Records an error unless one is already pending (it replaces a pending exit).
    pub(crate) fn set_error(&self, e: VmError) {
        let p = self.pending.take();
        self.pending.set(match p {
            Pending::Error(first) => Pending::Error(first),
            _ => Pending::Error(e),
        });
    }

    /// Records an exit request unless an error or an earlier request is pending.
    pub(crate) fn set_exit(&self, r0: u64) {
        let p = self.pending.take();
        self.pending.set(match p {
            Pending::None => Pending::Exit(r0),
            other => other,
        });
    }

    /// What the run returns, given what the executor returned: a pending error wins, then an
    /// error of the executor, then a pending exit's r0.
    pub(crate) fn finish(&self, result: Result<u64, VmError>) -> Result<u64, VmError> {
        match (self.pending.take(), result) {
            (Pending::Error(e), _) => Err(e),
            (_, Err(e)) => Err(e),
            (Pending::Exit(v), Ok(_)) => Ok(v),
            (Pending::None, Ok(v)) => Ok(v),
        }
    }

    /// `Err` for a callback's caller when the run is ending: the pending error, or
    /// [`VmError::Exited`] for a pending exit request.
    pub(crate) fn ending(&self) -> Result<(), VmError> {
        match self.status() {
            Status::Running => Ok(()),
            Status::Exit(r0) => Err(VmError::Exited { r0 }),
            Status::Error => Err(self.error().unwrap_or(VmError::Exited { r0: 0 })),
        }
    }
}

/// Restores the outer run (or none) as the thread's innermost run when dropped.
pub(crate) struct Scope {
    outer: *const RunCtx<'static>,
    /// This thread's `CURRENT` (a raw pointer: the scope is not `Send`).
    cell: *const Cell<*const RunCtx<'static>>,
}

impl Drop for Scope {
    fn drop(&mut self) {
        // SAFETY: the cell of the thread that made the scope (it is not Send), which lives
        // as long as the thread.
        unsafe { (*self.cell).set(self.outer) };
    }
}

/// Calls `f` with the innermost run of this thread, if there is one.
pub(crate) fn with_current<R>(f: impl FnOnce(&RunCtx<'_>) -> R) -> Option<R> {
    let p = CURRENT.try_with(|c| c.get()).ok()?;
    if p.is_null() {
        return None;
    }
    // SAFETY: CURRENT points to a RunCtx on the stack of a run of this thread that is still
    // executing (each run's `Scope` puts the previous pointer back before its RunCtx goes
    // away), and RunCtx is only used through shared references (its state is in Cells).
    Some(f(unsafe { &*p }))
}

/// Ends the calling program: for a helper (a `bpf_tail_call` implementation) that has run the
/// tail-called program itself and wants the run to return that program's r0.
///
/// The request takes effect when the helper returns, if the helper is registered with
/// [`may_exit`](crate::Helper::may_exit) set: both executors then end the whole run (every
/// frame, also from inside callbacks) and it returns `Ok(r0)`. (Without the flag the program
/// goes on, and the run returns `r0` when it ends, unless it fails.) Only the first request of
/// a run counts, an error of the run wins over it, and a request made outside any run is
/// ignored. It does not allocate, lock or block.
pub fn request_exit(r0: u64) {
    with_current(|ctx| ctx.set_exit(r0));
}

/// What JIT code gets back from [`jit_after_helper`] (in rax and rdx).
#[repr(C)]
pub(crate) struct AfterHelper {
    /// r0 as the program continues with it, or the run's result when it ends.
    pub r0: u64,
    /// Non-zero: the run ends (unwind every frame and return `r0`).
    pub end: u64,
}

/// Called by JIT code after a helper marked `may_exit` (and after every `callx`).
pub(crate) extern "C" fn jit_after_helper(r0: u64) -> AfterHelper {
    match with_current(|ctx| ctx.status()) {
        None | Some(Status::Running) => AfterHelper { r0, end: 0 },
        Some(Status::Exit(v)) => AfterHelper { r0: v, end: 1 },
        Some(Status::Error) => AfterHelper { r0, end: 1 },
    }
}

/// Called by the JIT's abort path (after it unwound to the innermost entry) to record why the
/// run stops. Outside any run (an entry called directly) the error is dropped.
pub(crate) fn record_error(e: VmError) {
    with_current(|ctx| ctx.set_error(e));
}
