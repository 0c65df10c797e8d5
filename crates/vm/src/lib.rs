//! The eBPF virtual machine.
//!
//! A program is checked once ([`Program::load`]): opcodes, registers, jumps, calls and
//! helpers. It then runs in the [`interp`]reter, which bounds-checks every memory access, or
//! as native code from the x86-64 [`jit`]. Both follow RFC 9669 (no trap on division by zero
//! or overflow) and agree bit for bit.
//!
//! Helpers reach back into the run that called them:
//! - [`request_exit`] ends the run (from any depth) with a given r0, for `bpf_tail_call`;
//! - [`callback::invoke`] runs a function of the program (`lddw BPF_PSEUDO_FUNC`), for
//!   `bpf_loop`, `bpf_for_each_map_elem` and the like; an error inside it ends the run.
//!
//! Both take effect right after helpers registered with [`Helper::may_exit`]. A fault in JIT
//! code ends the run with [`VmError::Fault`] instead of killing the process (see [`guard`]).

pub mod callback;
pub mod error;
pub mod guard;
pub mod helpers;
pub mod interp;
pub mod jit;
pub mod memory;
pub mod program;
mod run;

pub use error::VmError;
pub use helpers::{Helper, HelperFn, HelperRegistry};

pub use interp::Interpreter;
pub use jit::JitProgram;
pub use memory::{MemoryPolicy, Region};
pub use program::{
    CachedHelper, DirectCall, HashMemo, InlineArray, LoadError, LoadOptions, MAX_CALL_FRAMES, Program, Relocator,
    STACK_SIZE,
};
pub use run::request_exit;
