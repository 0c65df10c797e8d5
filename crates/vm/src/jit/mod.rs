//! The x86-64 JIT. (placeholder, being written)

use std::sync::Arc;

use crate::{Program, VmError};

/// A program compiled to native code, mapped executable and never writable at once.
pub struct JitProgram {
    #[allow(dead_code)]
    prog: Arc<Program>,
}

impl JitProgram {
    /// Compiles a checked program.
    pub fn compile(prog: Arc<Program>) -> Result<JitProgram, VmError> {
        let _ = prog;
        Err(VmError::Jit("not written yet".into()))
    }

    /// Runs the program with r1 and r2 set, returning r0.
    ///
    /// # Safety
    /// JIT code does not check memory accesses: the caller guarantees that every load and
    /// store the program can make with these arguments touches valid memory.
    pub unsafe fn run(&self, r1: u64, r2: u64) -> Result<u64, VmError> {
        let _ = (r1, r2);
        unimplemented!()
    }
}
