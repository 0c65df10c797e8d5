//! Disassembler printing llvm-objdump's BPF syntax. (placeholder, being written)
use crate::Insn;

/// A short name of the instruction's operation, for error messages (`add64`, `ldxw`, ...).
pub fn mnemonic(insn: Insn) -> String {
    format!("opcode {:#04x}", insn.op)
}
