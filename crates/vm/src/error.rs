//! Errors that end a run.

use thiserror::Error;

/// Why a run stopped without a result. Both executors report the same errors for the same
/// program and input, except [`VmError::OutOfBounds`], which only the interpreter detects.
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
