//! The interpreter. (being written: API fixed, body placeholder)

use std::sync::Arc;

use crate::{Program, Region, VmError};

/// Runs a checked program instruction by instruction, checking every memory access.
pub struct Interpreter {
    #[allow(dead_code)]
    prog: Arc<Program>,
}

impl Interpreter {
    pub fn new(prog: Arc<Program>) -> Interpreter {
        Interpreter { prog }
    }

    /// Runs with r1 and r2 set; the program may touch its stack, `regions` and what the
    /// program's memory policy allows. Returns r0.
    pub fn run(&self, r1: u64, r2: u64, regions: &[Region]) -> Result<u64, VmError> {
        self.run_counted(r1, r2, regions).0
    }

    /// Runs on a buffer: r1 = its address (0 when empty), r2 = its length; the buffer is writable.
    pub fn run_mem(&self, mem: &mut [u8]) -> Result<u64, VmError> {
        let r1 = if mem.is_empty() { 0 } else { mem.as_mut_ptr() as u64 };
        let len = mem.len() as u64;
        self.run(r1, len, &[Region::of_mut(mem)])
    }

    /// Like [`run`](Self::run), and also counts the instructions executed (for benchmarks).
    pub fn run_counted(&self, r1: u64, r2: u64, regions: &[Region]) -> (Result<u64, VmError>, u64) {
        let _ = (r1, r2, regions);
        unimplemented!()
    }
}
