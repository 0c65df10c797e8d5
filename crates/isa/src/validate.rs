//! Encoding checks: every slot is an instruction RFC 9669 defines (legacy packet loads
//! included, plus bpf_conformance's `callx`), its registers exist, and the fields it does not
//! use are zero. These are checks of the encoding alone; what a verifier checks (jump targets,
//! writes to r10, helper ids, ...) is left to the loader.

use thiserror::Error;

use crate::disasm::mnemonic;
use crate::*;

/// An invalid slot: its index and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("instruction {index}: {message}")]
pub struct EncodingError {
    pub index: usize,
    pub message: String,
}

/// Checks every slot of a program, and that each `lddw` has a second slot whose opcode,
/// registers and offset are zero.
pub fn check_program(insns: &[Insn]) -> Result<(), EncodingError> {
    let err = |index: usize, message: String| EncodingError { index, message };
    let mut pc = 0;
    while pc < insns.len() {
        let insn = insns[pc];
        check_insn(insn).map_err(|m| err(pc, m))?;
        if insn.is_lddw() {
            let Some(&next) = insns.get(pc + 1) else {
                return Err(err(pc, "lddw is missing its second slot at the end of the program".into()));
            };
            if next.op != 0 || next.dst != 0 || next.src != 0 || next.off != 0 {
                return Err(err(pc + 1, "the second slot of lddw must have opcode, registers and offset 0".into()));
            }
            pc += 1;
        }
        pc += 1;
    }
    Ok(())
}

/// How an instruction uses a field.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Use {
    /// Not used: must be zero.
    No,
    /// A register (or, for the immediate and offset, any value).
    Yes,
}
use Use::{No, Yes};

/// Checks one slot on its own. An `lddw`'s second slot is not an instruction; use
/// [`check_program`] for whole programs. The message names the instruction and the problem,
/// e.g. `add64: the offset is not used and must be 0, found 1`.
pub fn check_insn(insn: Insn) -> Result<(), String> {
    let name = mnemonic(insn);
    let unknown = || Err(format!("unknown opcode {:#04x}", insn.op));
    let x = insn.source() == BPF_X;
    // (dst, src, off, imm); special values are checked in the match arms.
    let uses = match insn.class() {
        BPF_ALU | BPF_ALU64 => {
            let is64 = insn.class() == BPF_ALU64;
            match insn.code() {
                BPF_NEG if !x => (Yes, No, No, No),
                BPF_END if !(is64 && x) => {
                    if !matches!(insn.imm, 16 | 32 | 64) {
                        return Err(format!("{name}: invalid byte swap width {}, must be 16, 32 or 64", insn.imm));
                    }
                    (Yes, No, No, Yes)
                }
                BPF_ADD | BPF_SUB | BPF_MUL | BPF_DIV | BPF_OR | BPF_AND | BPF_LSH | BPF_RSH | BPF_MOD | BPF_XOR
                | BPF_MOV | BPF_ARSH => {
                    let off = match insn.code() {
                        BPF_DIV | BPF_MOD if insn.off != 0 && insn.off != 1 => {
                            return Err(format!(
                                "{name}: invalid offset {}, must be 0 (unsigned) or 1 (signed)",
                                insn.off
                            ));
                        }
                        BPF_DIV | BPF_MOD => Yes,
                        BPF_MOV if x => {
                            if !(matches!(insn.off, 0 | 8 | 16) || (is64 && insn.off == 32)) {
                                let widths = if is64 { "8, 16 or 32" } else { "8 or 16" };
                                return Err(format!(
                                    "{name}: invalid offset {}, must be 0 or a sign extension width ({widths})",
                                    insn.off
                                ));
                            }
                            Yes
                        }
                        _ => No,
                    };
                    if x { (Yes, Yes, off, No) } else { (Yes, No, off, Yes) }
                }
                _ => return unknown(),
            }
        }
        BPF_JMP | BPF_JMP32 => {
            let is32 = insn.class() == BPF_JMP32;
            match insn.code() {
                BPF_JA if !x && is32 => (No, No, No, Yes),
                BPF_JA if !x => (No, No, Yes, No),
                BPF_CALL if !is32 && x => (Yes, No, No, No),
                BPF_CALL if !is32 => {
                    if insn.src > BPF_PSEUDO_KFUNC_CALL {
                        return Err(format!(
                            "{name}: invalid source {}, must be 0 (helper), 1 (local function) or 2 (kfunc)",
                            insn.src
                        ));
                    }
                    (No, Yes, No, Yes)
                }
                BPF_EXIT if !is32 && !x => (No, No, No, No),
                BPF_JEQ | BPF_JGT | BPF_JGE | BPF_JSET | BPF_JNE | BPF_JSGT | BPF_JSGE | BPF_JLT | BPF_JLE
                | BPF_JSLT | BPF_JSLE => {
                    if x {
                        (Yes, Yes, Yes, No)
                    } else {
                        (Yes, No, Yes, Yes)
                    }
                }
                _ => return unknown(),
            }
        }
        BPF_LD => match insn.mode() {
            BPF_IMM if insn.is_lddw() => {
                if insn.src > BPF_PSEUDO_MAP_IDX_VALUE {
                    return Err(format!("{name}: invalid pseudo source {}, must be 0 to 6", insn.src));
                }
                (Yes, Yes, No, Yes)
            }
            BPF_ABS if insn.size() != BPF_DW => (No, No, No, Yes),
            BPF_IND if insn.size() != BPF_DW => (No, Yes, No, Yes),
            _ => return unknown(),
        },
        BPF_LDX => match insn.mode() {
            BPF_MEM => (Yes, Yes, Yes, No),
            BPF_MEMSX if insn.size() != BPF_DW => (Yes, Yes, Yes, No),
            _ => return unknown(),
        },
        BPF_ST if insn.mode() == BPF_MEM => (Yes, No, Yes, Yes),
        BPF_STX => match insn.mode() {
            BPF_MEM => (Yes, Yes, Yes, No),
            BPF_ATOMIC if insn.size() == BPF_W || insn.size() == BPF_DW => {
                const NO_FETCH: [i32; 4] = [0x00, 0x40, 0x50, 0xa0];
                let ok = NO_FETCH.contains(&(insn.imm & !BPF_FETCH)) || insn.imm == BPF_XCHG || insn.imm == BPF_CMPXCHG;
                if !ok {
                    return Err(format!("invalid atomic operation {:#x}", insn.imm));
                }
                (Yes, Yes, Yes, Yes)
            }
            _ => return unknown(),
        },
        _ => return unknown(),
    };
    let (dst, src, off, imm) = uses;
    // The source field of lddw and call is a kind, checked above, not a register.
    let src_is_reg = !(insn.is_lddw() || insn.op == OP_CALL);
    for (what, field, value) in [("destination", dst, insn.dst), ("source", src, insn.src)] {
        match field {
            No if value != 0 => {
                return Err(format!("{name}: the {what} register is not used and must be 0, found {value}"));
            }
            Yes if value > MAX_REG && (what == "destination" || src_is_reg) => {
                return Err(format!("{name}: invalid {what} register r{value}"));
            }
            _ => {}
        }
    }
    if off == No && insn.off != 0 {
        return Err(format!("{name}: the offset is not used and must be 0, found {}", insn.off));
    }
    if imm == No && insn.imm != 0 {
        return Err(format!("{name}: the immediate is not used and must be 0, found {}", insn.imm));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(op: u8, dst: u8, src: u8, off: i16, imm: i32) -> Result<(), String> {
        check_insn(Insn::new(op, dst, src, off, imm))
    }

    #[test]
    fn valid() {
        for (op, dst, src, off, imm) in [
            (0x07, 1, 0, 0, -1),
            (0x0f, 1, 2, 0, 0),
            (0x3f, 1, 2, 1, 0),
            (0x94, 1, 0, 1, 3),
            (0xbf, 1, 2, 32, 0),
            (0xbc, 1, 2, 16, 0),
            (0x87, 1, 0, 0, 0),
            (0xd4, 1, 0, 0, 64),
            (0xd7, 1, 0, 0, 16),
            (0x05, 0, 0, -1, 0),
            (0x06, 0, 0, 0, -100000),
            (0x85, 0, 1, 0, 3),
            (0x8d, 3, 0, 0, 0),
            (0x95, 0, 0, 0, 0),
            (0x4e, 1, 2, 3, 0),
            (0x18, 1, 4, 0, 7),
            (0x20, 0, 0, 0, 12),
            (0x50, 0, 3, 0, 0),
            (0x89, 1, 10, -2, 0),
            (0x72, 10, 0, -1, 255),
            (0x7b, 10, 1, -8, 0),
            (0xc3, 1, 2, 0, 0xa1),
            (0xdb, 1, 2, 0, 0xf1),
        ] {
            assert_eq!(check(op, dst, src, off, imm), Ok(()), "{op:#04x}");
        }
    }

    #[test]
    fn invalid() {
        for (op, dst, src, off, imm, message) in [
            (0x07, 0, 0, 1, 1, "add64: the offset is not used and must be 0, found 1"),
            (0x04, 0, 1, 0, 1, "add32: the source register is not used and must be 0, found 1"),
            (0x0f, 0, 0, 0, 1, "add64: the immediate is not used and must be 0, found 1"),
            (0x95, 0, 1, 0, 0, "exit: the source register is not used and must be 0, found 1"),
            (0x95, 1, 0, 0, 0, "exit: the destination register is not used and must be 0, found 1"),
            (0x85, 1, 0, 0, 0, "call: the destination register is not used and must be 0, found 1"),
            (0x05, 0, 0, 0, 1, "ja: the immediate is not used and must be 0, found 1"),
            (0xdc, 0, 0, 1, 16, "be16: the offset is not used and must be 0, found 1"),
            (0xdc, 0, 0, 0, 17, "be: invalid byte swap width 17, must be 16, 32 or 64"),
            (0x37, 0, 0, 2, 1, "div64: invalid offset 2, must be 0 (unsigned) or 1 (signed)"),
            (0xbc, 0, 1, 32, 0, "mov32: invalid offset 32, must be 0 or a sign extension width (8 or 16)"),
            (0xb7, 0, 0, 8, 0, "mov64: the offset is not used and must be 0, found 8"),
            (0x07, 11, 0, 0, 0, "add64: invalid destination register r11"),
            (0x0f, 1, 15, 0, 0, "add64: invalid source register r15"),
            (0x85, 0, 3, 0, 0, "call: invalid source 3, must be 0 (helper), 1 (local function) or 2 (kfunc)"),
            (0xdb, 1, 2, 0, 0x02, "invalid atomic operation 0x2"),
            (0xff, 0, 0, 0, 0, "unknown opcode 0xff"),
            (0x8f, 0, 0, 0, 0, "unknown opcode 0x8f"),
            (0x99, 0, 0, 0, 0, "unknown opcode 0x99"),
        ] {
            assert_eq!(check(op, dst, src, off, imm), Err(message.to_string()), "{op:#04x}");
        }
    }

    #[test]
    fn programs() {
        let lddw = Insn::new(OP_LDDW, 1, 0, 0, 1);
        let exit = Insn::new(OP_EXIT, 0, 0, 0, 0);
        assert_eq!(check_program(&[lddw, Insn::new(0, 0, 0, 0, 5), exit]), Ok(()));
        assert_eq!(check_program(&[exit, lddw]).unwrap_err().index, 1);
        assert_eq!(check_program(&[lddw, Insn::new(0, 1, 0, 0, 0), exit]).unwrap_err().index, 1);
        let e = check_program(&[exit, Insn::new(0x07, 0, 0, 1, 1)]).unwrap_err();
        assert_eq!(e.to_string(), "instruction 1: add64: the offset is not used and must be 0, found 1");
        assert_eq!(check_program(&[]), Ok(()));
    }
}
