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

impl JitProgram {
    /// Runs on a buffer: r1 = its address (0 when empty), r2 = its length.
    ///
    /// # Safety
    /// As for [`run`](Self::run): the program's accesses must stay in memory that is valid.
    pub unsafe fn run_mem(&self, mem: &mut [u8]) -> Result<u64, VmError> {
        let r1 = if mem.is_empty() { 0 } else { mem.as_mut_ptr() as u64 };
        // SAFETY: forwarded to the caller's guarantee.
        unsafe { self.run(r1, mem.len() as u64) }
    }
}
