//! The eBPF virtual machine.
//!
//! A program is checked once ([`Program::load`]): opcodes, registers, jumps, calls and
//! helpers. It then runs in the [`interp`]reter, which bounds-checks every memory access, or
//! as native code from the x86-64 [`jit`]. Both follow RFC 9669 (no trap on division by zero
//! or overflow) and agree bit for bit.

pub mod error;
pub mod guard;
pub mod helpers;
pub mod interp;
pub mod jit;
pub mod memory;
pub mod program;

pub use error::VmError;
pub use helpers::{Helper, HelperFn, HelperRegistry};

pub use interp::Interpreter;
pub use jit::JitProgram;
pub use memory::{MemoryPolicy, Region};
pub use program::{LoadError, LoadOptions, Program, Relocator, MAX_CALL_FRAMES, STACK_SIZE};
