//! The x86-64 JIT.
//!
//! [`JitProgram::compile`] translates a checked [`Program`] into native code
//! (`compile.rs` drives the `emit.rs` encoder) and maps it executable (`exec.rs`). The
//! generated code follows the same semantics as the interpreter (RFC 9669, no trap on division
//! by zero or overflow) but does not check memory accesses: the caller of
//! [`JitProgram::run`] vouches for them.
//!
//! See `compile.rs` for the register map, the frame layout and the abort path.
//! In short: eBPF registers live in x86 registers (r0 = rax, r1..r5 = rdi, rsi, rdx, rcx, r8,
//! r6..r9 = rbx, r13, r14, r15, r10 = rbp); every subprogram is a native function with its
//! own 512-byte stack, reached by `call`; every subprogram also has a C-callable entry
//! (`extern "C" fn(u64, u64, u64, u64, u64) -> u64`), which is how runs start and how
//! helpers call callbacks; r12 holds the stack pointer of the innermost entry, to which the
//! abort path unwinds.

mod compile;
mod emit;
mod exec;

use std::cell::Cell;
use std::sync::Arc;

use crate::{HelperFn, Program, VmError};

use compile::{Options, ABORT_UNKNOWN_HELPER};
use exec::ExecMemory;

/// A program compiled to native code, mapped executable and never writable at once.
pub struct JitProgram {
    /// Kept alive for the code: `callx` reads the helper registry's `fn_table` and calls
    /// embed helper addresses.
    _prog: Arc<Program>,
    mem: ExecMemory,
    /// Offset of each subprogram's C-callable entry, in `Program::subprogs` order.
    entries: Vec<usize>,
}

thread_local! {
    /// The first abort of the current run on this thread: `[kind, pc, detail]`, kind 0 = none.
    static ABORT_STATE: Cell<[u64; 3]> = const { Cell::new([0; 3]) };
}

/// Called by the JIT's abort path (after it unwound to the innermost entry) to record why
/// the run stops. Only the first abort of a run is kept.
extern "C" fn record_abort(kind: u64, pc: u64, detail: u64) {
    let _ = ABORT_STATE.try_with(|s| {
        if s.get()[0] == 0 {
            s.set([kind, pc, detail]);
        }
    });
}

impl JitProgram {
    /// Compiles a checked program.
    pub fn compile(prog: Arc<Program>) -> Result<JitProgram, VmError> {
        Self::compile_with(prog, Options::detect())
    }

    pub(crate) fn compile_with(prog: Arc<Program>, opts: Options) -> Result<JitProgram, VmError> {
        if !cfg!(all(target_arch = "x86_64", unix)) {
            return Err(VmError::Jit("the JIT only supports x86-64 on Unix".into()));
        }
        let out = compile::compile(&prog, opts, record_abort as extern "C" fn(u64, u64, u64) as usize as u64)
            .map_err(VmError::Jit)?;
        let mem = ExecMemory::new(&out.code)?;
        Ok(JitProgram { _prog: prog, mem, entries: out.entries })
    }

    /// The native code, for inspection (disassembly, size).
    pub fn code(&self) -> &[u8] {
        self.mem.as_slice()
    }

    /// Address of the C-callable entry of subprogram `index` (an index into
    /// [`Program::subprogs`]; 0 is the program's entry). It can be called as a
    /// [`HelperFn`] with r1..r5 as arguments, returning r0, on the thread
    /// of a [`run`](Self::run) of this program or of another; if it aborts (for example a
    /// `callx` to an unknown id) it returns 1 and the enclosing `run` reports the error.
    /// This is the address `lddw rX, BPF_PSEUDO_FUNC` loads.
    ///
    /// # Panics
    /// If `index` is not below `subprogs().len()`.
    pub fn subprog_address(&self, index: usize) -> usize {
        match self.entries.get(index) {
            Some(off) => self.mem.addr() + off,
            None => panic!("subprogram index {index} out of range ({} subprograms)", self.entries.len()),
        }
    }

    /// Runs the program with r1 and r2 set, returning r0.
    ///
    /// # Safety
    /// JIT code does not check memory accesses: the caller guarantees that every load and
    /// store the program can make with these arguments touches valid memory.
    pub unsafe fn run(&self, r1: u64, r2: u64) -> Result<u64, VmError> {
        // SAFETY: entry 0 is the code of `Entry(0)`, a function following the C calling
        // convention with this signature (see compile.rs), in memory mapped read+execute for
        // as long as `self` lives.
        let entry: HelperFn = unsafe { std::mem::transmute::<usize, HelperFn>(self.subprog_address(0)) };
        // A run inside a helper of another run (or an earlier callback abort of the enclosing
        // run) must not see, or lose, the other's state.
        let outer = ABORT_STATE.replace([0; 3]);
        // SAFETY: the code reads and writes only its own stack frames and the memory the
        // program's accesses name, which the caller vouches for; it calls only registered
        // helpers and its own functions, and returns with the callee-saved registers restored.
        let r0 = unsafe { entry(r1, r2, 0, 0, 0) };
        let [kind, pc, detail] = ABORT_STATE.replace(outer);
        match kind {
            0 => Ok(r0),
            ABORT_UNKNOWN_HELPER => Err(VmError::UnknownHelper { pc: pc as usize, id: detail }),
            k => Err(VmError::Jit(format!("run aborted at instruction {pc} for an unknown reason ({k})"))),
        }
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

impl std::fmt::Debug for JitProgram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JitProgram")
            .field("code_len", &self.mem.as_slice().len())
            .field("entries", &self.entries)
            .finish()
    }
}

#[cfg(test)]
mod tests;
