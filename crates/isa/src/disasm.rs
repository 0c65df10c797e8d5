//! Disassembler printing what `llvm-objdump -d` prints for BPF (LLVM's BPF assembly syntax).
//!
//! The reference is LLVM 14's llvm-objdump in its default mode: every instruction it decodes is
//! printed as it prints it, with the same tolerance of fields the instruction does not use
//! (LLVM ignores most of them) and the same `<unknown>` for slots it cannot decode. Where
//! LLVM 14 has no decoding, the text is what newer LLVM (17 and later) prints:
//!
//! - ISA v4: `w1 s/= w2`, `r1 s%= 3`, `r1 = (s8)r2`, `w1 = (s16)w2`, `r1 = bswap16 r1`,
//!   `r0 = *(s8 *)(r1 + 0)`, `gotol +5`;
//! - `r1 %= r2` (modulo), `if r1 & 3 goto +1` (jset), `*(u32 *)(r10 - 4) = 7` (store
//!   immediate), `callx r2` (register in `dst`, as bpf_conformance and LLVM 19 encode it);
//! - 32-bit atomics other than the plain add, which LLVM 14 decodes only with
//!   `--mattr=+alu32`: `w2 = atomic_fetch_or((u32 *)(r1 + 0), w2)`, `w0 = cmpxchg32_32(...)`.
//!
//! Two choices go with those: `div`, `mod` and `mov` with an offset that selects no v4
//! operation print `<unknown>` (LLVM 14 ignores their offset, newer LLVM does not), and a
//! branch target is printed without the ` <section+offset>` annotation llvm-objdump adds
//! from the object's symbols.

use crate::*;

/// What llvm-objdump prints for a slot it cannot decode.
pub const UNKNOWN: &str = "<unknown>";

/// The text LLVM prints for `insn` (no index, no bytes). `next` is the slot after it, which
/// only `lddw` reads; an `lddw` without one prints `<unknown>`.
pub fn format_insn(insn: Insn, next: Option<Insn>) -> String {
    text(insn, next).unwrap_or_else(|| UNKNOWN.to_string())
}

/// The body of `llvm-objdump -d` for a program: one line per instruction, each the slot
/// index right-aligned in 8 columns, `:`, a tab, the instruction's bytes as hex pairs, a tab
/// and the text; `lddw` is one line with its 16 bytes. As llvm-objdump does, a run of 8 or
/// more zero bytes prints as a `\t\t...` line, and bytes that cannot start an instruction
/// (a trailing `lddw` without its second slot) print one per line as `<unknown>`.
pub fn disassemble(insns: &[Insn]) -> String {
    let bytes = encode(insns);
    let mut out = String::new();
    let mut pos = 0;
    while pos < bytes.len() {
        let rest = &bytes[pos..];
        let zeros = rest.iter().take_while(|&&b| b == 0).count();
        if zeros >= 8 {
            // llvm-objdump skips zeros in multiples of 4 so as not to cut an instruction.
            out.push_str("\t\t...\n");
            pos += zeros & !3;
            continue;
        }
        let (size, text) = decode_at(rest);
        // A failed decode that consumed nothing advances by one byte, as llvm-objdump does.
        let size = size.max(1);
        let hex: Vec<String> = rest[..size].iter().map(|b| format!("{b:02x}")).collect();
        out.push_str(&format!("{:>8}:\t{}\t{}\n", pos / INSN_SIZE, hex.join(" "), text.as_deref().unwrap_or(UNKNOWN)));
        pos += size;
    }
    out
}

/// Decodes the instruction at the start of `bytes` as LLVM's BPF disassembler does: the byte
/// count it takes (0 when it cannot take any) and its text (`None` for `<unknown>`).
fn decode_at(bytes: &[u8]) -> (usize, Option<String>) {
    let Some(insn) = slot(bytes, 0) else {
        return (0, None);
    };
    if lddw_decodes(insn) {
        return match slot(bytes, 1) {
            Some(next) => (2 * INSN_SIZE, text(insn, Some(next))),
            None => (0, None),
        };
    }
    (INSN_SIZE, text(insn, None))
}

/// Slot `n` of `bytes`, if all its bytes are there.
fn slot(bytes: &[u8], n: usize) -> Option<Insn> {
    let b = bytes.get(n * INSN_SIZE..(n + 1) * INSN_SIZE)?;
    Some(Insn::from_bytes(b.try_into().ok()?))
}

/// True when LLVM decodes the slot as a 16-byte `lddw` (`LD_imm64` or `ld_pseudo`).
fn lddw_decodes(insn: Insn) -> bool {
    insn.op == OP_LDDW && insn.off == 0 && insn.dst <= MAX_LLVM_REG
}

/// LLVM's BPF register file has r0 to r11 (r11 is internal); higher numbers do not decode.
const MAX_LLVM_REG: u8 = 11;

fn r(n: u8) -> Option<String> {
    (n <= MAX_LLVM_REG).then(|| format!("r{n}"))
}

fn w(n: u8) -> Option<String> {
    (n <= MAX_LLVM_REG).then(|| format!("w{n}"))
}

/// A memory operand: `r2 + 8`, `r10 - 8`.
fn mem(base: u8, off: i16) -> Option<String> {
    let sign = if off < 0 { '-' } else { '+' };
    Some(format!("{} {sign} {}", r(base)?, off.unsigned_abs()))
}

/// A branch target relative to the next instruction: `+3`, `+0`, `-2`.
fn target(rel: i32) -> String {
    if rel >= 0 { format!("+{rel}") } else { rel.to_string() }
}

/// Size names of loads and stores.
fn bits(insn: Insn) -> u32 {
    match insn.size() {
        BPF_B => 8,
        BPF_H => 16,
        BPF_W => 32,
        _ => 64,
    }
}

fn text(insn: Insn, next: Option<Insn>) -> Option<String> {
    match insn.class() {
        BPF_ALU | BPF_ALU64 => alu(insn),
        BPF_JMP | BPF_JMP32 => jmp(insn),
        BPF_LD => ld(insn, next),
        BPF_LDX => {
            let sign = match insn.mode() {
                BPF_MEM => 'u',
                BPF_MEMSX if insn.size() != BPF_DW => 's',
                _ => return None,
            };
            Some(format!("{} = *({sign}{} *)({})", r(insn.dst)?, bits(insn), mem(insn.src, insn.off)?))
        }
        BPF_ST if insn.mode() == BPF_MEM => {
            Some(format!("*(u{} *)({}) = {}", bits(insn), mem(insn.dst, insn.off)?, insn.imm))
        }
        BPF_STX => match insn.mode() {
            BPF_MEM => Some(format!("*(u{} *)({}) = {}", bits(insn), mem(insn.dst, insn.off)?, r(insn.src)?)),
            BPF_ATOMIC => atomic(insn),
            _ => None,
        },
        _ => None,
    }
}

fn alu(insn: Insn) -> Option<String> {
    let is64 = insn.class() == BPF_ALU64;
    let reg = if is64 { r } else { w };
    let x = insn.source() == BPF_X;
    let dst = reg(insn.dst)?;
    let operand = || if x { reg(insn.src) } else { Some(insn.imm.to_string()) };
    let op = match insn.code() {
        BPF_ADD => "+=",
        BPF_SUB => "-=",
        BPF_MUL => "*=",
        BPF_OR => "|=",
        BPF_AND => "&=",
        BPF_LSH => "<<=",
        BPF_RSH => ">>=",
        BPF_XOR => "^=",
        BPF_ARSH => "s>>=",
        BPF_DIV | BPF_MOD => {
            let signed = match insn.off {
                0 => "",
                1 => "s",
                _ => return None,
            };
            let sym = if insn.code() == BPF_DIV { '/' } else { '%' };
            return Some(format!("{dst} {signed}{sym}= {}", operand()?));
        }
        BPF_MOV => {
            return match (x, insn.off) {
                (_, 0) => Some(format!("{dst} = {}", operand()?)),
                (true, 8 | 16) => Some(format!("{dst} = (s{}){}", insn.off, reg(insn.src)?)),
                (true, 32) if is64 => Some(format!("{dst} = (s32){}", reg(insn.src)?)),
                _ => None,
            };
        }
        BPF_NEG if !x => return Some(format!("{dst} = -{dst}")),
        BPF_END => {
            let name = match (is64, x) {
                (false, false) => "le",
                (false, true) => "be",
                (true, false) => "bswap",
                (true, true) => return None,
            };
            if !matches!(insn.imm, 16 | 32 | 64) {
                return None;
            }
            // Byte swaps name the 64-bit register whatever the class.
            let d = r(insn.dst)?;
            return Some(format!("{d} = {name}{} {d}", insn.imm));
        }
        _ => return None,
    };
    Some(format!("{dst} {op} {}", operand()?))
}

fn jmp(insn: Insn) -> Option<String> {
    let is32 = insn.class() == BPF_JMP32;
    let x = insn.source() == BPF_X;
    let op = match insn.code() {
        BPF_JA => {
            return match (is32, x) {
                (false, false) => Some(format!("goto {}", target(insn.off.into()))),
                (true, false) => Some(format!("gotol {}", target(insn.imm))),
                _ => None,
            };
        }
        BPF_CALL if !is32 => {
            return if x { Some(format!("callx {}", r(insn.dst)?)) } else { Some(format!("call {}", insn.imm)) };
        }
        BPF_EXIT if !is32 && !x && insn.imm == 0 => return Some("exit".to_string()),
        BPF_JEQ => "==",
        BPF_JGT => ">",
        BPF_JGE => ">=",
        BPF_JSET => "&",
        BPF_JNE => "!=",
        BPF_JSGT => "s>",
        BPF_JSGE => "s>=",
        BPF_JLT => "<",
        BPF_JLE => "<=",
        BPF_JSLT => "s<",
        BPF_JSLE => "s<=",
        _ => return None,
    };
    let reg = if is32 { w } else { r };
    let rhs = if x { reg(insn.src)? } else { insn.imm.to_string() };
    Some(format!("if {} {op} {rhs} goto {}", reg(insn.dst)?, target(insn.off.into())))
}

fn ld(insn: Insn, next: Option<Insn>) -> Option<String> {
    if insn.op == OP_LDDW {
        if !lddw_decodes(insn) {
            return None;
        }
        let (dst, next) = (r(insn.dst)?, next?);
        return Some(if insn.src == 0 {
            format!("{dst} = {} ll", insn.wide_imm(next) as i64)
        } else {
            // LLVM prints pseudo loads (map fds, ...) with its internal mnemonic and only the
            // low half of the immediate.
            format!("ld_pseudo\t{dst}, {}, {}", insn.src, insn.imm as u32)
        });
    }
    if insn.size() == BPF_DW {
        return None;
    }
    match insn.mode() {
        BPF_ABS => Some(format!("r0 = *(u{} *)skb[{}]", bits(insn), insn.imm)),
        BPF_IND => Some(format!("r0 = *(u{} *)skb[{}]", bits(insn), r(insn.src)?)),
        _ => None,
    }
}

fn atomic(insn: Insn) -> Option<String> {
    let is64 = match insn.size() {
        BPF_DW => true,
        BPF_W => false,
        _ => return None,
    };
    let addr = mem(insn.dst, insn.off)?;
    // LLVM decodes bits 4-7 of the immediate as the operation and, for the fetching forms,
    // bits 0-3 as BPF_FETCH; it ignores the rest.
    let fetch = insn.imm & 0x0f == BPF_FETCH;
    let (ty, val) = if is64 { ("u64", r(insn.src)?) } else { ("u32", w(insn.src)?) };
    let (sym, name) = match (insn.imm >> 4) & 0x0f {
        0x0 => ('+', "add"),
        0x4 => ('|', "or"),
        0x5 => ('&', "and"),
        0xa => ('^', "xor"),
        0xe if fetch && is64 => return Some(format!("{val} = xchg_64({addr}, {val})")),
        0xe if fetch => return Some(format!("{val} = xchg32_32({addr}, {val})")),
        0xf if fetch && is64 => return Some(format!("r0 = cmpxchg_64({addr}, r0, {val})")),
        0xf if fetch => return Some(format!("w0 = cmpxchg32_32({addr}, w0, {val})")),
        _ => return None,
    };
    Some(if fetch {
        format!("{val} = atomic_fetch_{name}(({ty} *)({addr}), {val})")
    } else if !is64 && sym == '+' {
        // The one 32-bit atomic LLVM 14 decodes by default, with a 64-bit register name.
        format!("lock *(u32 *)({addr}) += {}", r(insn.src)?)
    } else {
        format!("lock *({ty} *)({addr}) {sym}= {val}")
    })
}

/// A short name of the instruction's operation for error messages, in the conformance
/// assembler's vocabulary with the ALU width spelled out: `add64`, `mov32`, `movsx1632`,
/// `sdiv64`, `neg32`, `le16`, `bswap64`, `jsgt`, `jsgt32`, `ja`, `ja32`, `call`, `callx`,
/// `exit`, `lddw`, `ldabsw`, `ldindh`, `ldxw`, `ldxsb`, `stw`, `stxdw`, `lock add32`,
/// `lock fetch or64`, `lock xchg64`, `lock cmpxchg32`. Opcodes with no meaning give
/// `unknown opcode 0xNN`.
pub fn mnemonic(insn: Insn) -> String {
    name(insn).unwrap_or_else(|| format!("unknown opcode {:#04x}", insn.op))
}

fn name(insn: Insn) -> Option<String> {
    let size = match insn.size() {
        BPF_B => "b",
        BPF_H => "h",
        BPF_W => "w",
        _ => "dw",
    };
    let x = insn.source() == BPF_X;
    match insn.class() {
        BPF_ALU | BPF_ALU64 => {
            let width = if insn.class() == BPF_ALU64 { 64 } else { 32 };
            let op = match insn.code() {
                BPF_ADD => "add",
                BPF_SUB => "sub",
                BPF_MUL => "mul",
                BPF_DIV if insn.off == 1 => "sdiv",
                BPF_DIV => "div",
                BPF_OR => "or",
                BPF_AND => "and",
                BPF_LSH => "lsh",
                BPF_RSH => "rsh",
                BPF_NEG => "neg",
                BPF_MOD if insn.off == 1 => "smod",
                BPF_MOD => "mod",
                BPF_XOR => "xor",
                BPF_MOV if x && (matches!(insn.off, 8 | 16) || (width == 64 && insn.off == 32)) => {
                    return Some(format!("movsx{}{width}", insn.off));
                }
                BPF_MOV => "mov",
                BPF_ARSH => "arsh",
                BPF_END => {
                    let op = match (width, x) {
                        (32, false) => "le",
                        (32, true) => "be",
                        (_, false) => "bswap",
                        _ => return None,
                    };
                    return Some(match insn.imm {
                        16 | 32 | 64 => format!("{op}{}", insn.imm),
                        _ => op.to_string(),
                    });
                }
                _ => return None,
            };
            Some(format!("{op}{width}"))
        }
        BPF_JMP | BPF_JMP32 => {
            let is32 = insn.class() == BPF_JMP32;
            let op = match insn.code() {
                BPF_JA if !x => return Some(if is32 { "ja32" } else { "ja" }.to_string()),
                BPF_CALL if !is32 => return Some(if x { "callx" } else { "call" }.to_string()),
                BPF_EXIT if !is32 && !x => return Some("exit".to_string()),
                BPF_JEQ => "jeq",
                BPF_JGT => "jgt",
                BPF_JGE => "jge",
                BPF_JSET => "jset",
                BPF_JNE => "jne",
                BPF_JSGT => "jsgt",
                BPF_JSGE => "jsge",
                BPF_JLT => "jlt",
                BPF_JLE => "jle",
                BPF_JSLT => "jslt",
                BPF_JSLE => "jsle",
                _ => return None,
            };
            Some(format!("{op}{}", if is32 { "32" } else { "" }))
        }
        BPF_LD => match insn.mode() {
            BPF_IMM if insn.op == OP_LDDW => Some("lddw".to_string()),
            BPF_ABS if insn.size() != BPF_DW => Some(format!("ldabs{size}")),
            BPF_IND if insn.size() != BPF_DW => Some(format!("ldind{size}")),
            _ => None,
        },
        BPF_LDX => match insn.mode() {
            BPF_MEM => Some(format!("ldx{size}")),
            BPF_MEMSX if insn.size() != BPF_DW => Some(format!("ldxs{size}")),
            _ => None,
        },
        BPF_ST => (insn.mode() == BPF_MEM).then(|| format!("st{size}")),
        BPF_STX => match insn.mode() {
            BPF_MEM => Some(format!("stx{size}")),
            BPF_ATOMIC => {
                let width = match insn.size() {
                    BPF_W => 32,
                    BPF_DW => 64,
                    _ => return None,
                };
                let fetch = if insn.imm & BPF_FETCH != 0 { "fetch " } else { "" };
                let op = match insn.imm & !BPF_FETCH {
                    0x00 => "add",
                    0x40 => "or",
                    0x50 => "and",
                    0xa0 => "xor",
                    0xe0 => return Some(format!("lock xchg{width}")),
                    0xf0 => return Some(format!("lock cmpxchg{width}")),
                    _ => return Some(format!("lock {:#x}{width}", insn.imm)),
                };
                Some(format!("lock {fetch}{op}{width}"))
            }
            _ => None,
        },
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(op: u8, dst: u8, src: u8, off: i16, imm: i32) -> String {
        format_insn(Insn::new(op, dst, src, off, imm), None)
    }

    #[test]
    fn llvm14_syntax() {
        assert_eq!(t(0xb7, 0, 0, 0, 1), "r0 = 1");
        assert_eq!(t(0xb4, 1, 0, 0, -1), "w1 = -1");
        assert_eq!(t(0x0c, 0, 1, 0, 0), "w0 += w1");
        assert_eq!(t(0xcf, 3, 4, 0, 0), "r3 s>>= r4");
        assert_eq!(t(0x61, 1, 2, 8, 0), "r1 = *(u32 *)(r2 + 8)");
        assert_eq!(t(0x7b, 10, 1, -8, 0), "*(u64 *)(r10 - 8) = r1");
        assert_eq!(t(0x65, 1, 0, 3, 5), "if r1 s> 5 goto +3");
        assert_eq!(t(0x1e, 1, 2, -2, 0), "if w1 == w2 goto -2");
        assert_eq!(t(0x85, 0, 0, 0, 12), "call 12");
        assert_eq!(t(0x85, 0, 1, 0, -1), "call -1");
        assert_eq!(t(0x95, 0, 0, 0, 0), "exit");
        assert_eq!(t(0x05, 0, 0, 5, 0), "goto +5");
        assert_eq!(t(0x05, 0, 0, 0, 0), "goto +0");
        assert_eq!(t(0x87, 0, 0, 0, 0), "r0 = -r0");
        assert_eq!(t(0x84, 3, 0, 0, 0), "w3 = -w3");
        assert_eq!(t(0xdc, 1, 0, 0, 16), "r1 = be16 r1");
        assert_eq!(t(0xd4, 1, 0, 0, 64), "r1 = le64 r1");
        assert_eq!(t(0xdb, 1, 2, 0, 0), "lock *(u64 *)(r1 + 0) += r2");
        assert_eq!(t(0xdb, 1, 0, 0, 1), "r0 = atomic_fetch_add((u64 *)(r1 + 0), r0)");
        assert_eq!(t(0xdb, 1, 2, -4, 0xe1), "r2 = xchg_64(r1 - 4, r2)");
        assert_eq!(t(0xdb, 1, 2, 0, 0xf1), "r0 = cmpxchg_64(r1 + 0, r0, r2)");
        assert_eq!(t(0xc3, 1, 2, 0, 0), "lock *(u32 *)(r1 + 0) += r2");
        assert_eq!(t(0x20, 0, 0, 0, 4), "r0 = *(u32 *)skb[4]");
        assert_eq!(t(0x48, 0, 3, 0, 0), "r0 = *(u16 *)skb[r3]");
        let lddw = Insn::new(OP_LDDW, 1, 0, 0, 0x1234567);
        assert_eq!(format_insn(lddw, Some(Insn::default())), "r1 = 19088743 ll");
        assert_eq!(format_insn(Insn { imm: -1, ..lddw }, Some(Insn::new(0, 0, 0, 0, -1))), "r1 = -1 ll");
        assert_eq!(format_insn(Insn { src: 1, ..lddw }, Some(Insn::default())), "ld_pseudo\tr1, 1, 19088743");
    }

    #[test]
    fn newer_llvm_syntax() {
        assert_eq!(t(0xbf, 1, 2, 8, 0), "r1 = (s8)r2");
        assert_eq!(t(0xbf, 1, 2, 32, 0), "r1 = (s32)r2");
        assert_eq!(t(0xbc, 1, 2, 16, 0), "w1 = (s16)w2");
        assert_eq!(t(0x3f, 0, 1, 1, 0), "r0 s/= r1");
        assert_eq!(t(0x94, 0, 0, 1, 3), "w0 s%= 3");
        assert_eq!(t(0x97, 0, 0, 1, 3), "r0 s%= 3");
        assert_eq!(t(0x9c, 0, 1, 0, 0), "w0 %= w1");
        assert_eq!(t(0xd7, 1, 0, 0, 16), "r1 = bswap16 r1");
        assert_eq!(t(0x91, 0, 1, 0, 0), "r0 = *(s8 *)(r1 + 0)");
        assert_eq!(t(0x81, 0, 1, -4, 0), "r0 = *(s32 *)(r1 - 4)");
        assert_eq!(t(0x06, 0, 0, 0, 70000), "gotol +70000");
        assert_eq!(t(0x06, 0, 0, 0, -1), "gotol -1");
        assert_eq!(t(0x8d, 2, 0, 0, 0), "callx r2");
        assert_eq!(t(0x45, 1, 0, 1, 3), "if r1 & 3 goto +1");
        assert_eq!(t(0x4e, 1, 2, 1, 0), "if w1 & w2 goto +1");
        assert_eq!(t(0x62, 10, 0, -4, 7), "*(u32 *)(r10 - 4) = 7");
        assert_eq!(t(0x7a, 1, 0, 0, -1), "*(u64 *)(r1 + 0) = -1");
        assert_eq!(t(0xc3, 1, 2, 0, 0x41), "w2 = atomic_fetch_or((u32 *)(r1 + 0), w2)");
        assert_eq!(t(0xc3, 1, 2, 0, 0xa0), "lock *(u32 *)(r1 + 0) ^= w2");
        assert_eq!(t(0xc3, 1, 2, 0, 0xe1), "w2 = xchg32_32(r1 + 0, w2)");
        assert_eq!(t(0xc3, 1, 2, 0, 0xf1), "w0 = cmpxchg32_32(r1 + 0, w0, w2)");
    }

    #[test]
    fn unknown() {
        for (op, dst, src, off, imm) in [
            (0xff, 0, 0, 0, 0),
            (0x00, 0, 0, 0, 0),
            (0x95, 0, 0, 0, 1),    // exit with an immediate
            (0x9d, 0, 0, 0, 0),    // exit with the X bit
            (0xbf, 1, 2, 3, 0),    // mov with an offset that is no movsx
            (0xbc, 1, 2, 32, 0),   // 32-bit movsx from 32 bits
            (0xb7, 1, 0, 8, 0),    // movsx has no immediate form
            (0x37, 1, 0, 2, 1),    // div with an offset other than 0 or 1
            (0xdc, 1, 0, 0, 17),   // byte swap width
            (0xdf, 1, 0, 0, 16),   // 64-bit be
            (0x07, 12, 0, 0, 1),   // register 12
            (0x99, 0, 1, 0, 0),    // sign-extending 64-bit load
            (0xdb, 1, 2, 0, 0xe0), // xchg without fetch
            (0xd3, 1, 2, 0, 0),    // atomic on a byte
            (0x18, 1, 0, 1, 0),    // lddw with an offset
        ] {
            assert_eq!(t(op, dst, src, off, imm), UNKNOWN, "{op:#04x}");
        }
        assert_eq!(format_insn(Insn::new(OP_LDDW, 1, 0, 0, 1), None), UNKNOWN);
    }

    #[test]
    fn llvm_ignores_unused_fields() {
        assert_eq!(t(0x07, 1, 5, 3, 4), "r1 += 4");
        assert_eq!(t(0x0f, 1, 2, 3, 4), "r1 += r2");
        assert_eq!(t(0x95, 1, 2, 3, 0), "exit");
        assert_eq!(t(0x05, 1, 2, 3, 4), "goto +3");
        assert_eq!(t(0x87, 1, 2, 3, 4), "r1 = -r1");
        assert_eq!(t(0x07, 11, 0, 0, 1), "r11 += 1");
    }

    #[test]
    fn listing() {
        let insns = [
            Insn::new(0xb7, 0, 0, 0, 1),
            Insn::new(OP_LDDW, 1, 0, 0, 5),
            Insn::new(0, 0, 0, 0, 1),
            Insn::new(0x95, 0, 0, 0, 0),
        ];
        assert_eq!(
            disassemble(&insns),
            "       0:\tb7 00 00 00 01 00 00 00\tr0 = 1\n\
             \x20      1:\t18 01 00 00 05 00 00 00 00 00 00 00 01 00 00 00\tr1 = 4294967301 ll\n\
             \x20      3:\t95 00 00 00 00 00 00 00\texit\n"
        );
        // A zero slot is skipped with "...", and a trailing lddw prints byte by byte.
        let insns = [Insn::new(0xb7, 0, 0, 0, 1), Insn::default(), Insn::new(OP_LDDW, 0, 0, 0, 0)];
        let text = disassemble(&insns);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 10);
        assert_eq!(lines[1], "\t\t...");
        assert_eq!(lines[2], "       2:\t18\t<unknown>");
        assert_eq!(lines[9], "       2:\t00\t<unknown>");
        assert_eq!(disassemble(&[]), "");
    }

    #[test]
    fn mnemonics() {
        for (insn, name) in [
            (Insn::new(0x07, 0, 0, 0, 1), "add64"),
            (Insn::new(0x04, 0, 0, 0, 1), "add32"),
            (Insn::new(0x61, 0, 1, 0, 0), "ldxw"),
            (Insn::new(0x91, 0, 1, 0, 0), "ldxsb"),
            (Insn::new(0x66, 0, 0, 0, 0), "jsgt32"),
            (Insn::new(0x65, 0, 0, 0, 0), "jsgt"),
            (Insn::new(OP_LDDW, 0, 0, 0, 0), "lddw"),
            (Insn::new(OP_CALL, 0, 0, 0, 1), "call"),
            (Insn::new(OP_CALLX, 1, 0, 0, 0), "callx"),
            (Insn::new(OP_EXIT, 0, 0, 0, 0), "exit"),
            (Insn::new(OP_JA32, 0, 0, 0, 1), "ja32"),
            (Insn::new(0xc3, 1, 2, 0, 0), "lock add32"),
            (Insn::new(0xdb, 1, 2, 0, 0x51), "lock fetch and64"),
            (Insn::new(0xdb, 1, 2, 0, 0xf1), "lock cmpxchg64"),
            (Insn::new(0xbf, 1, 2, 16, 0), "movsx1664"),
            (Insn::new(0x3c, 1, 2, 1, 0), "sdiv32"),
            (Insn::new(0xd7, 1, 0, 0, 32), "bswap32"),
            (Insn::new(0xdc, 1, 0, 0, 16), "be16"),
            (Insn::new(0x28, 0, 0, 0, 0), "ldabsh"),
            (Insn::new(0x7a, 1, 0, 0, 0), "stdw"),
            (Insn::new(0xff, 0, 0, 0, 0), "unknown opcode 0xff"),
        ] {
            assert_eq!(mnemonic(insn), name);
        }
    }

    /// Any bytes disassemble without a panic.
    #[test]
    fn any_bytes() {
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut insns = Vec::new();
        for op in 0..=255u8 {
            for _ in 0..64 {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                let b = state.to_le_bytes();
                insns.push(Insn::from_bytes([op, b[1], b[2], b[3], b[4], b[5], b[6], b[7]]));
            }
        }
        assert!(disassemble(&insns).lines().count() >= insns.len() / 2);
        for (i, &insn) in insns.iter().enumerate() {
            let _ = format_insn(insn, insns.get(i + 1).copied());
            let _ = mnemonic(insn);
        }
    }
}
