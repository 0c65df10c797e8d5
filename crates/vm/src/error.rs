//! Errors that end a run.

use thiserror::Error;

/// Why a run stopped without a result. Both executors report the same errors for the same
/// program and input, except [`VmError::OutOfBounds`], which only the interpreter detects, and
/// [`VmError::Fault`], which only the JIT reports (for an access the interpreter would have
/// refused as out of bounds).
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum VmError {
    #[error("instruction {pc}: {kind} of {len} bytes at {addr:#x} is outside the memory the program may access")]
    OutOfBounds { pc: usize, addr: u64, len: u64, kind: AccessKind },
    #[error("instruction {pc}: atomic operation on {addr:#x}, which is not aligned to its width")]
    MisalignedAtomic { pc: usize, addr: u64 },
    #[error("instruction {pc}: callx to helper id {id}, which is not registered")]
    UnknownHelper { pc: usize, id: u64 },
    #[error("instruction {pc}: call chain deeper than {max} frames")]
    CallDepth { pc: usize, max: usize },
    #[error("could not compile: {0}")]
    Jit(String),
    /// JIT code faulted (SIGSEGV or SIGBUS) at eBPF instruction `pc`, on `addr` as the kernel
    /// reported it (0 for a general-protection fault, such as a non-canonical address).
    #[error("instruction {pc}: memory fault at {addr:#x}")]
    Fault { pc: usize, addr: u64 },
    /// [`callback::invoke`](crate::callback::invoke) was given something that is not a
    /// function of the program running on this thread; nothing ran.
    #[error("{func:#x} cannot be called back: {reason}")]
    InvalidCallback { func: u64, reason: &'static str },
    /// Returned by [`callback::invoke`](crate::callback::invoke) only: a helper inside the
    /// callback asked the run to end ([`request_exit`](crate::request_exit)); the run returns
    /// `Ok(r0)`.
    #[error("the run is ending with r0 = {r0} at a helper's request")]
    Exited { r0: u64 },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AccessKind {
    Read,
    Write,
}

impl std::fmt::Display for AccessKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            AccessKind::Read => "read",
            AccessKind::Write => "write",
        })
    }
}
