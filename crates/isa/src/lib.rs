//! eBPF instructions as RFC 9669 and clang define them.
//!
//! - [`insn`]: the 8-byte instruction, its fields and opcode constants, decode and encode.
//! - [`validate`]: checks that slots encode real instructions with their unused fields zero.
//! - [`disasm`]: a disassembler printing what `llvm-objdump -d` prints for BPF.
//! - [`asm`]: an assembler for the bpf_conformance / uBPF syntax.
//! - [`helper_names`]: the kernel's helper ids and names (`enum bpf_func_id`).

pub mod asm;
pub mod disasm;
pub mod helper_names;
pub mod insn;
pub mod validate;

pub use insn::*;
