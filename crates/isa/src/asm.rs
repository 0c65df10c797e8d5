//! Assembler for the bpf_conformance / uBPF assembly syntax, as the conformance suite's
//! reference assembler (`run.py` in the shared conformance directory) accepts it, with the
//! same encodings:
//!
//! ```text
//! # a comment, to the end of the line
//! mov %r0, 1                  ALU: add sub mul div sdiv mod smod or and xor lsh rsh arsh mov;
//! add32 %r1, %r2                64-bit as is, 32-bit with the suffix 32; the second operand
//!                               is a register or an immediate
//! neg %r1 / neg32 %r1
//! movsx832 %r1, %r2           sign extension: movsx864 movsx832 movsx1664 movsx1632 movsx3264
//! be16 %r1 / le32 %r1         byte swaps, also bswap16..64 (swap16..64 alike)
//! lddw %r1, 0x1122334455667788
//! ldxw %r0, [%r1+4]           ldxb ldxh ldxw ldxdw, sign-extending ldxsb ldxsh ldxsw
//! stw [%r10-4], 7             stb sth stw stdw
//! stxdw [%r10-8], %r1         stxb stxh stxw stxdw
//! jeq %r1, 5, +2              jeq jgt jge jset jne jsgt jsge jlt jle jslt jsle, JMP32 with
//! jne32 %r1, %r2, label         the suffix 32; the target is +N, -N or a label
//! ja +1 / ja label            unconditional jump; ja32 (gotol) has a 32-bit offset
//! loop:                       a label, on a line of its own
//! call 5                      helper call (also `call helper 5`)
//! call local func             call of a local function
//! call runtime 7              call with source 2 (kfunc)
//! call %r2                    callx: the register goes in dst
//! lock add [%r1+0], %r2       lock [fetch] add|or|and|xor|xchg|cmpxchg, suffix 32 for 32 bits
//! exit                        the first exit also defines the label `exit`
//! ```
//!
//! Numbers are decimal or `0x` hex, with an optional sign. Immediates must fit in 32 bits
//! (signed decimal, or hex up to `0xffffffff`), offsets in 16 bits (hex up to `0xffff`),
//! `lddw` values in 64 bits.
//!
//! What run.py accepts and this assembler refuses: registers `%r11` to `%r15`, instructions
//! whose encoding [`check_insn`] refuses (`movsx` with an immediate), text after a label on
//! its line (run.py drops it silently), jumps to a label further than a 16-bit offset reaches
//! (run.py truncates the offset), empty programs, and sloppy operands run.py's C-style number
//! parsing lets through (`[%r1+8` without `]`, `5abc`, `0X10`).

use std::collections::HashMap;

use thiserror::Error;

use crate::validate::check_insn;
use crate::*;

/// Why a text does not assemble.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum AsmError {
    /// A problem with one line of the text (numbered from 1).
    #[error("line {line}: {message}")]
    Line { line: usize, message: String },
    /// The text has no instructions.
    #[error("the program has no instructions")]
    Empty,
}

impl AsmError {
    /// The 1-based line at fault, if the error is about one line.
    pub fn line(&self) -> Option<usize> {
        match self {
            AsmError::Line { line, .. } => Some(*line),
            AsmError::Empty => None,
        }
    }
}

/// Assembles a program. `lddw` takes two slots of the result.
pub fn assemble(text: &str) -> Result<Vec<Insn>, AsmError> {
    let mut asm = Assembler::default();
    for (i, line) in text.lines().enumerate() {
        let code = line.split('#').next().unwrap_or_default();
        asm.line(i + 1, code).map_err(|message| AsmError::Line { line: i + 1, message })?;
    }
    asm.finish()
}

type Res<T> = Result<T, String>;

/// An instruction slot waiting for its label to be resolved.
struct Slot {
    insn: Insn,
    line: usize,
    label: Option<String>,
}

/// Where a label points and where it was defined.
struct Label {
    index: usize,
    line: usize,
    /// Defined by the first `exit` rather than by `name:`.
    implicit: bool,
}

#[derive(Default)]
struct Assembler {
    slots: Vec<Slot>,
    labels: HashMap<String, Label>,
    exit_seen: bool,
}

/// One assembled instruction: its slot, the label its offset or immediate is relative to,
/// and for `lddw` the second slot.
struct Encoded {
    insn: Insn,
    label: Option<String>,
    second: Option<Insn>,
}

impl From<Insn> for Encoded {
    fn from(insn: Insn) -> Encoded {
        Encoded { insn, label: None, second: None }
    }
}

impl Assembler {
    fn line(&mut self, line: usize, code: &str) -> Res<()> {
        let mut tokens = code.split_whitespace();
        let Some(mnem) = tokens.next() else {
            return Ok(());
        };
        // Operands are separated by whitespace; one trailing comma each is dropped.
        let ops: Vec<&str> = tokens.map(|t| t.strip_suffix(',').unwrap_or(t)).collect();
        if let Some(name) = mnem.strip_suffix(':') {
            return self.define(line, name, &ops);
        }
        if mnem == "exit" && !self.exit_seen {
            self.exit_seen = true;
            let index = self.slots.len();
            self.labels.insert("exit".to_string(), Label { index, line, implicit: true });
        }
        let Encoded { insn, label, second } = assemble_insn(mnem, &ops)?;
        check_insn(insn)?;
        self.slots.push(Slot { insn, line, label });
        if let Some(insn) = second {
            self.slots.push(Slot { insn, line, label: None });
        }
        Ok(())
    }

    fn define(&mut self, line: usize, name: &str, rest: &[&str]) -> Res<()> {
        if name.is_empty() {
            return Err("empty label name".to_string());
        }
        if !rest.is_empty() {
            return Err(format!("unexpected {:?} after label {name}: (put it on a line of its own)", rest.join(" ")));
        }
        if let Some(first) = self.labels.get(name) {
            let how = if first.implicit { "the first exit, on line" } else { "line" };
            return Err(format!("duplicate label {name} (already defined by {how} {})", first.line));
        }
        self.labels.insert(name.to_string(), Label { index: self.slots.len(), line, implicit: false });
        Ok(())
    }

    fn finish(self) -> Result<Vec<Insn>, AsmError> {
        if self.slots.is_empty() {
            return Err(AsmError::Empty);
        }
        let mut insns = Vec::with_capacity(self.slots.len());
        for (i, slot) in self.slots.iter().enumerate() {
            let mut insn = slot.insn;
            if let Some(name) = &slot.label {
                let err = |message: String| AsmError::Line { line: slot.line, message };
                let label = self.labels.get(name).ok_or_else(|| err(format!("undefined label {name}")))?;
                let rel = label.index as i64 - i as i64 - 1;
                if insn.op == OP_CALL || insn.op == OP_JA32 {
                    insn.imm = i32::try_from(rel).map_err(|_| err(format!("label {name} is out of reach ({rel})")))?;
                } else {
                    insn.off = i16::try_from(rel).map_err(|_| {
                        err(format!("jump to label {name} needs offset {rel}, beyond the 16-bit range"))
                    })?;
                }
            }
            insns.push(insn);
        }
        Ok(insns)
    }
}

/// What a mnemonic assembles to.
#[derive(Clone, Copy)]
enum Kind {
    Alu { class: u8, code: u8, off: i16, movsx: bool },
    Neg { class: u8 },
    End { op: u8, width: i32 },
    Jmp { class: u8, code: u8 },
    Ja,
    Ja32,
    Call,
    Exit,
    Lddw,
    Ldx(u8),
    St(u8),
    Stx(u8),
}

impl Kind {
    /// Operand count (`call` takes 1 or 2 and is checked on its own).
    fn arity(self) -> usize {
        match self {
            Kind::Exit => 0,
            Kind::Neg { .. } | Kind::End { .. } | Kind::Ja | Kind::Ja32 => 1,
            Kind::Jmp { .. } => 3,
            _ => 2,
        }
    }
}

const ALU_OPS: [(&str, u8, i16); 14] = [
    ("add", BPF_ADD, 0),
    ("sub", BPF_SUB, 0),
    ("mul", BPF_MUL, 0),
    ("div", BPF_DIV, 0),
    ("sdiv", BPF_DIV, 1),
    ("or", BPF_OR, 0),
    ("and", BPF_AND, 0),
    ("lsh", BPF_LSH, 0),
    ("rsh", BPF_RSH, 0),
    ("mod", BPF_MOD, 0),
    ("smod", BPF_MOD, 1),
    ("xor", BPF_XOR, 0),
    ("mov", BPF_MOV, 0),
    ("arsh", BPF_ARSH, 0),
];

const MOVSX: [(&str, u8, i16); 5] = [
    ("movsx864", BPF_ALU64, 8),
    ("movsx832", BPF_ALU, 8),
    ("movsx1664", BPF_ALU64, 16),
    ("movsx1632", BPF_ALU, 16),
    ("movsx3264", BPF_ALU64, 32),
];

const JMP_OPS: [(&str, u8); 11] = [
    ("jeq", BPF_JEQ),
    ("jgt", BPF_JGT),
    ("jge", BPF_JGE),
    ("jset", BPF_JSET),
    ("jne", BPF_JNE),
    ("jsgt", BPF_JSGT),
    ("jsge", BPF_JSGE),
    ("jlt", BPF_JLT),
    ("jle", BPF_JLE),
    ("jslt", BPF_JSLT),
    ("jsle", BPF_JSLE),
];

const LDX_OPS: [(&str, u8); 7] = [
    ("ldxb", BPF_LDX | BPF_MEM | BPF_B),
    ("ldxh", BPF_LDX | BPF_MEM | BPF_H),
    ("ldxw", BPF_LDX | BPF_MEM | BPF_W),
    ("ldxdw", BPF_LDX | BPF_MEM | BPF_DW),
    ("ldxsb", BPF_LDX | BPF_MEMSX | BPF_B),
    ("ldxsh", BPF_LDX | BPF_MEMSX | BPF_H),
    ("ldxsw", BPF_LDX | BPF_MEMSX | BPF_W),
];

const ST_OPS: [(&str, u8); 4] = [
    ("stb", BPF_ST | BPF_MEM | BPF_B),
    ("sth", BPF_ST | BPF_MEM | BPF_H),
    ("stw", BPF_ST | BPF_MEM | BPF_W),
    ("stdw", BPF_ST | BPF_MEM | BPF_DW),
];

const STX_OPS: [(&str, u8); 4] = [
    ("stxb", BPF_STX | BPF_MEM | BPF_B),
    ("stxh", BPF_STX | BPF_MEM | BPF_H),
    ("stxw", BPF_STX | BPF_MEM | BPF_W),
    ("stxdw", BPF_STX | BPF_MEM | BPF_DW),
];

fn lookup<T: Copy>(table: &[(&str, T)], name: &str) -> Option<T> {
    table.iter().find(|(n, _)| *n == name).map(|&(_, v)| v)
}

fn kind(mnem: &str) -> Option<Kind> {
    match mnem {
        "exit" => return Some(Kind::Exit),
        "ja" => return Some(Kind::Ja),
        "ja32" => return Some(Kind::Ja32),
        "call" => return Some(Kind::Call),
        "lddw" => return Some(Kind::Lddw),
        "neg" => return Some(Kind::Neg { class: BPF_ALU64 }),
        "neg32" => return Some(Kind::Neg { class: BPF_ALU }),
        _ => {}
    }
    if let Some(op) = lookup(&LDX_OPS, mnem) {
        return Some(Kind::Ldx(op));
    }
    if let Some(op) = lookup(&ST_OPS, mnem) {
        return Some(Kind::St(op));
    }
    if let Some(op) = lookup(&STX_OPS, mnem) {
        return Some(Kind::Stx(op));
    }
    if let Some(&(_, class, off)) = MOVSX.iter().find(|(n, ..)| *n == mnem) {
        return Some(Kind::Alu { class, code: BPF_MOV, off, movsx: true });
    }
    for (prefix, op) in [("be", 0xdc), ("le", 0xd4), ("swap", 0xd7), ("bswap", 0xd7)] {
        if let Some(width) = mnem.strip_prefix(prefix).and_then(|w| lookup(&[("16", 16), ("32", 32), ("64", 64)], w)) {
            return Some(Kind::End { op, width });
        }
    }
    let (base, is32) = match mnem.strip_suffix("32") {
        Some(base) => (base, true),
        None => (mnem, false),
    };
    if let Some(&(_, code, off)) = ALU_OPS.iter().find(|(n, ..)| *n == base) {
        let class = if is32 { BPF_ALU } else { BPF_ALU64 };
        return Some(Kind::Alu { class, code, off, movsx: false });
    }
    let code = lookup(&JMP_OPS, base)?;
    Some(Kind::Jmp { class: if is32 { BPF_JMP32 } else { BPF_JMP }, code })
}

/// Assembles one instruction.
fn assemble_insn(mnem: &str, ops: &[&str]) -> Res<Encoded> {
    if mnem == "lock" {
        return lock(ops).map(Encoded::from);
    }
    let kind = kind(mnem).ok_or_else(|| format!("invalid mnemonic {mnem}"))?;
    if !matches!(kind, Kind::Call) && ops.len() != kind.arity() {
        let n = kind.arity();
        return Err(format!("{mnem} takes {n} operand{}, found {}", if n == 1 { "" } else { "s" }, ops.len()));
    }
    let with_label = |insn: Insn, (off_or_imm, label): (i16, Option<String>), in_imm: bool| {
        let insn = if in_imm { Insn { imm: off_or_imm.into(), ..insn } } else { Insn { off: off_or_imm, ..insn } };
        Encoded { insn, label, second: None }
    };
    Ok(match kind {
        Kind::Alu { class, code, off, movsx } => {
            let dst = reg(ops[0])?;
            if ops[1].starts_with('%') {
                Insn::new(class | code | BPF_X, dst, reg(ops[1])?, off, 0).into()
            } else if movsx {
                return Err(format!("{mnem} takes a source register, not an immediate"));
            } else {
                Insn::new(class | code | BPF_K, dst, 0, off, imm32(ops[1])?).into()
            }
        }
        Kind::Neg { class } => Insn::new(class | BPF_NEG, reg(ops[0])?, 0, 0, 0).into(),
        Kind::End { op, width } => Insn::new(op, reg(ops[0])?, 0, 0, width).into(),
        Kind::Jmp { class, code } => {
            let dst = reg(ops[0])?;
            let insn = if ops[1].starts_with('%') {
                Insn::new(class | code | BPF_X, dst, reg(ops[1])?, 0, 0)
            } else {
                Insn::new(class | code | BPF_K, dst, 0, 0, imm32(ops[1])?)
            };
            with_label(insn, target(ops[2])?, false)
        }
        Kind::Ja => with_label(Insn::new(OP_JA, 0, 0, 0, 0), target(ops[0])?, false),
        Kind::Ja32 => with_label(Insn::new(OP_JA32, 0, 0, 0, 0), target(ops[0])?, true),
        Kind::Exit => Insn::new(OP_EXIT, 0, 0, 0, 0).into(),
        Kind::Call => {
            let (mode, callee) = match *ops {
                [callee] => ("helper", callee),
                [mode, callee] => (mode, callee),
                _ => return Err(format!("call takes 1 or 2 operands, found {}", ops.len())),
            };
            match mode {
                "helper" if callee.starts_with('%') => Insn::new(OP_CALLX, reg(callee)?, 0, 0, 0).into(),
                "helper" => Insn::new(OP_CALL, 0, 0, 0, imm32(callee)?).into(),
                "local" => with_label(Insn::new(OP_CALL, 0, BPF_PSEUDO_CALL, 0, 0), target(callee)?, true),
                "runtime" => Insn::new(OP_CALL, 0, BPF_PSEUDO_KFUNC_CALL, 0, imm32(callee)?).into(),
                _ => return Err(format!("invalid call mode {mode}, expected helper, local or runtime")),
            }
        }
        Kind::Lddw => {
            let value = imm64(ops[1])?;
            Encoded {
                insn: Insn::new(OP_LDDW, reg(ops[0])?, 0, 0, value as u32 as i32),
                label: None,
                second: Some(Insn::new(0, 0, 0, 0, (value >> 32) as u32 as i32)),
            }
        }
        Kind::Ldx(op) => {
            let dst = reg(ops[0])?;
            let (src, off) = mem(ops[1])?;
            Insn::new(op, dst, src, off, 0).into()
        }
        Kind::St(op) => {
            let (dst, off) = mem(ops[0])?;
            Insn::new(op, dst, 0, off, imm32(ops[1])?).into()
        }
        Kind::Stx(op) => {
            let (dst, off) = mem(ops[0])?;
            Insn::new(op, dst, reg(ops[1])?, off, 0).into()
        }
    })
}

/// `lock [fetch] OP[32] [%rN+off], %rM`.
fn lock(ops: &[&str]) -> Res<Insn> {
    let (fetch, rest) = match ops.split_first() {
        Some((&"fetch", rest)) => (true, rest),
        _ => (false, ops),
    };
    let Some((&op, args)) = rest.split_first() else {
        return Err("lock needs an operation and two operands, as in lock add [%r1+0], %r2".to_string());
    };
    let (base, is32) = match op.strip_suffix("32") {
        Some(base) => (base, true),
        None => (op, false),
    };
    let imm = match base {
        "add" => i32::from(BPF_ADD),
        "or" => i32::from(BPF_OR),
        "and" => i32::from(BPF_AND),
        "xor" => i32::from(BPF_XOR),
        "xchg" => BPF_XCHG,
        "cmpxchg" => BPF_CMPXCHG,
        _ => return Err(format!("invalid atomic operation {op}")),
    };
    if args.len() != 2 {
        return Err(format!("lock {op} takes 2 operands ([%rN+offset], %rM), found {}", args.len()));
    }
    let (dst, off) = mem(args[0])?;
    let src = reg(args[1])?;
    let size = if is32 { BPF_W } else { BPF_DW };
    Ok(Insn::new(BPF_STX | BPF_ATOMIC | size, dst, src, off, imm | if fetch { BPF_FETCH } else { 0 }))
}

/// `%r0` to `%r10`.
fn reg(s: &str) -> Res<u8> {
    let n = s
        .strip_prefix("%r")
        .filter(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()) && (d.len() == 1 || !d.starts_with('0')))
        .and_then(|d| d.parse::<u8>().ok());
    match n {
        Some(n) if n <= MAX_REG => Ok(n),
        _ => Err(format!("invalid register {s}")),
    }
}

/// `[%rN]`, `[%rN+off]` or `[%rN-off]`.
fn mem(s: &str) -> Res<(u8, i16)> {
    let inner = s
        .strip_prefix('[')
        .and_then(|t| t.strip_suffix(']'))
        .ok_or_else(|| format!("invalid memory operand {s}, expected [%rN], [%rN+offset] or [%rN-offset]"))?;
    match inner.find(['+', '-']) {
        None => Ok((reg(inner)?, 0)),
        Some(i) => Ok((reg(&inner[..i])?, offset(&inner[i..])?)),
    }
}

/// A jump target: `+N` or `-N`, or a label resolved later.
fn target(s: &str) -> Res<(i16, Option<String>)> {
    if s.starts_with(['+', '-']) { Ok((offset(s)?, None)) } else { Ok((0, Some(s.to_string()))) }
}

/// A number as written: sign, base, magnitude (saturated at `u128::MAX`).
struct Number {
    negative: bool,
    hex: bool,
    magnitude: u128,
}

impl Number {
    fn parse(s: &str) -> Option<Number> {
        let (negative, rest) = match s.as_bytes().first() {
            Some(b'-') => (true, &s[1..]),
            Some(b'+') => (false, &s[1..]),
            _ => (false, s),
        };
        let (hex, digits) = match rest.strip_prefix("0x") {
            Some(digits) => (true, digits),
            None => (false, rest),
        };
        let radix = if hex { 16 } else { 10 };
        if digits.is_empty() {
            return None;
        }
        let mut magnitude = 0u128;
        for c in digits.chars() {
            let d = c.to_digit(radix)?;
            magnitude = magnitude.saturating_mul(radix.into()).saturating_add(d.into());
        }
        Some(Number { negative, hex, magnitude })
    }

    /// The value as C's `strtoull` gives it: negation wraps modulo 2^64.
    fn wrapping_u64(&self) -> Option<u64> {
        let m = u64::try_from(self.magnitude).ok()?;
        Some(if self.negative { m.wrapping_neg() } else { m })
    }

    /// The value with its sign, if it fits an `i128`.
    fn signed(&self) -> Option<i128> {
        let m = i128::try_from(self.magnitude).ok()?;
        Some(if self.negative { -m } else { m })
    }
}

/// A 32-bit immediate: signed decimal, or hex up to `0xffffffff`.
fn imm32(s: &str) -> Res<i32> {
    let n = Number::parse(s).ok_or_else(|| format!("invalid immediate {s}"))?;
    let value = if n.hex {
        n.wrapping_u64().and_then(|v| u32::try_from(v).ok()).map(|v| v as i32)
    } else {
        n.signed().and_then(|v| i32::try_from(v).ok())
    };
    value.ok_or_else(|| format!("immediate {s} is out of 32-bit range"))
}

/// A 16-bit offset: signed decimal, or hex up to `0xffff`.
fn offset(s: &str) -> Res<i16> {
    let n = Number::parse(s).ok_or_else(|| format!("invalid offset {s}"))?;
    let value = if n.hex {
        n.wrapping_u64().and_then(|v| u16::try_from(v).ok()).map(|v| v as i16)
    } else {
        n.signed().and_then(|v| i16::try_from(v).ok())
    };
    value.ok_or_else(|| format!("offset {s} is out of 16-bit range"))
}

/// A 64-bit `lddw` value: decimal from -2^63 to 2^64-1, or hex (a `-` negates modulo 2^64).
fn imm64(s: &str) -> Res<u64> {
    let n = Number::parse(s).ok_or_else(|| format!("invalid immediate {s}"))?;
    let value = if n.negative && !n.hex {
        n.signed().and_then(|v| i64::try_from(v).ok()).map(|v| v as u64)
    } else {
        n.wrapping_u64()
    };
    value.ok_or_else(|| format!("immediate {s} is out of 64-bit range"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(text: &str) -> String {
        let insns = assemble(text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
        encode(&insns).iter().map(|b| format!("{b:02x}")).collect()
    }

    fn error(text: &str) -> String {
        assemble(text).expect_err(text).to_string()
    }

    #[test]
    fn encodings() {
        for (text, bytes) in [
            ("mov %r0, 1", "b700000001000000"),
            ("mov32 %r1, %r2", "bc21000000000000"),
            ("add32 %r1, -1", "04010000ffffffff"),
            ("add %r1, 0xffffffff", "07010000ffffffff"),
            ("sdiv %r1, 3", "3701010003000000"),
            ("smod32 %r1, %r2", "9c21010000000000"),
            ("movsx1632 %r1, %r2", "bc21100000000000"),
            ("movsx3264 %r1, %r2", "bf21200000000000"),
            ("neg32 %r3", "8403000000000000"),
            ("neg %r3", "8703000000000000"),
            ("be16 %r1", "dc01000010000000"),
            ("le64 %r1", "d401000040000000"),
            ("bswap32 %r1", "d701000020000000"),
            ("swap16 %r1", "d701000010000000"),
            ("lddw %r1, 0x1122334455667788", "18010000887766550000000044332211"),
            ("lddw %r1, -1", "18010000ffffffff00000000ffffffff"),
            ("ldxh %r2, [%r1-2]", "6912feff00000000"),
            ("ldxsb %r2, [%r1]", "9112000000000000"),
            ("ldxb %r0, [%r1+0x10]", "7110100000000000"),
            ("stw [%r10-4], 0xffffffff", "620afcffffffffff"),
            ("stxdw [%r10-8], %r1", "7b1af8ff00000000"),
            ("jeq %r1, 5, +2", "1501020005000000"),
            ("jne32 %r1, %r2, -1", "5e21ffff00000000"),
            ("jset %r1, 0x8, +0", "4501000008000000"),
            ("ja +1", "0500010000000000"),
            ("ja32 -2", "06000000feffffff"),
            ("call 5", "8500000005000000"),
            ("call helper 5", "8500000005000000"),
            ("call runtime 7", "8520000007000000"),
            ("call %r2", "8d02000000000000"),
            ("call local -1", "85100000ffffffff"),
            ("lock add [%r1+4], %r2", "db21040000000000"),
            ("lock fetch add32 [%r1+4], %r2", "c321040001000000"),
            ("lock xor32 [%r1], %r2", "c3210000a0000000"),
            ("lock fetch or [%r1-8], %r2", "db21f8ff41000000"),
            ("lock xchg [%r1], %r2", "db210000e1000000"),
            ("lock cmpxchg32 [%r1], %r2", "c3210000f1000000"),
            ("exit", "9500000000000000"),
        ] {
            assert_eq!(hex(text), bytes, "{text}");
        }
    }

    #[test]
    fn labels_and_comments() {
        let text = "\
            # a comment\n\
            mov %r0, 0 # trailing comment\n\
            loop:\n\
            add %r0, 1\n\
            jlt %r0, 10, loop\n\
            call local func\n\
            ja exit\n\
            exit\n\
            func:\n\
            lddw %r0, 7\n\
            ja32 func\n\
            exit\n";
        let insns = assemble(text).unwrap();
        assert_eq!(insns.len(), 10);
        assert_eq!(insns[2].off, -2); // jlt back to loop
        assert_eq!(insns[3].imm, 2); // call local func (lddw at 6)
        assert_eq!(insns[4].off, 0); // ja exit: the first exit is next
        assert_eq!(insns[8].imm, -3); // ja32 back to func
    }

    #[test]
    fn errors() {
        for (text, message) in [
            ("mov %r0, 1\nor %r0, %r11\nexit", "line 2: invalid register %r11"),
            ("or %r0, %r50", "line 1: invalid register %r50"),
            ("mov %r01, 1", "line 1: invalid register %r01"),
            ("mov32 %r0, 2147483648", "line 1: immediate 2147483648 is out of 32-bit range"),
            ("mov32 %r0, 0x100000000", "line 1: immediate 0x100000000 is out of 32-bit range"),
            ("mov32 %r0, -0x1", "line 1: immediate -0x1 is out of 32-bit range"),
            ("mov32 %r0, 5abc", "line 1: invalid immediate 5abc"),
            ("ldxb %r0, [%r1+0x10000]", "line 1: offset +0x10000 is out of 16-bit range"),
            ("ldxb %r0, [%r1-32769]", "line 1: offset -32769 is out of 16-bit range"),
            ("ldxb %r0, %r1", "line 1: invalid memory operand %r1, expected [%rN], [%rN+offset] or [%rN-offset]"),
            ("ldxq %r0, %r1", "line 1: invalid mnemonic ldxq"),
            ("add64 %r0, 1", "line 1: invalid mnemonic add64"),
            ("lddw %r0", "line 1: lddw takes 2 operands, found 1"),
            ("exit %r0", "line 1: exit takes 0 operands, found 1"),
            ("ja NOT_A_LABEL\nexit", "line 1: undefined label NOT_A_LABEL"),
            ("a:\na:\nexit", "line 2: duplicate label a (already defined by line 1)"),
            ("exit\nexit:", "line 2: duplicate label exit (already defined by the first exit, on line 1)"),
            ("a: exit", "line 1: unexpected \"exit\" after label a: (put it on a line of its own)"),
            ("lock\nexit", "line 1: lock needs an operation and two operands, as in lock add [%r1+0], %r2"),
            ("lock or [%r10-8]", "line 1: lock or takes 2 operands ([%rN+offset], %rM), found 1"),
            ("lock sub [%r10-8], %r1", "line 1: invalid atomic operation sub"),
            ("call foo 5", "line 1: invalid call mode foo, expected helper, local or runtime"),
            ("call", "line 1: call takes 1 or 2 operands, found 0"),
            ("movsx864 %r0, 5", "line 1: movsx864 takes a source register, not an immediate"),
            ("lddw %r0, 0x10000000000000000", "line 1: immediate 0x10000000000000000 is out of 64-bit range"),
            ("lddw %r0, -9223372036854775809", "line 1: immediate -9223372036854775809 is out of 64-bit range"),
            ("jeq %r0, 0, 5", "line 1: undefined label 5"),
            ("", "the program has no instructions"),
            ("# only a comment\n\n", "the program has no instructions"),
        ] {
            assert_eq!(error(text), message, "{text:?}");
        }
        assert_eq!(assemble("mov %r0, %r11").unwrap_err().line(), Some(1));
        assert_eq!(assemble("").unwrap_err().line(), None);
    }

    #[test]
    fn jump_out_of_range() {
        let text = format!("ja end\n{}end:\nexit\n", "mov %r0, 0\n".repeat(40_000));
        assert_eq!(error(&text), "line 1: jump to label end needs offset 40000, beyond the 16-bit range");
        let text = format!("ja32 end\n{}end:\nexit\n", "mov %r0, 0\n".repeat(40_000));
        assert_eq!(assemble(&text).unwrap()[0].imm, 40_000);
    }

    #[test]
    fn numbers() {
        assert_eq!(hex("mov %r0, -2147483648"), "b700000000000080");
        assert_eq!(hex("mov %r0, +5"), "b700000005000000");
        assert_eq!(hex("mov %r0, 0xFFFFFFFF"), "b7000000ffffffff");
        assert_eq!(hex("ldxw %r0, [%r1+0xffff]"), "6110ffff00000000");
        assert_eq!(hex("ldxw %r0, [%r1-32768]"), "6110008000000000");
        assert_eq!(hex("lddw %r0, -0x1"), "18000000ffffffff00000000ffffffff");
        assert_eq!(hex("lddw %r0, 18446744073709551615"), "18000000ffffffff00000000ffffffff");
        assert_eq!(hex("lddw %r0, -9223372036854775808"), "18000000000000000000000000000080");
        assert!(assemble("mov %r0, 0X10").is_err());
        assert!(assemble("mov %r0, 0x").is_err());
        assert!(assemble("ldxw %r0, [%r1+8").is_err());
    }

    /// Arbitrary token soup: errors or programs, never a panic.
    #[test]
    fn never_panics() {
        const WORDS: [&str; 28] = [
            "mov",
            "add32",
            "lddw",
            "ldxw",
            "stw",
            "stxdw",
            "jeq",
            "ja",
            "ja32",
            "call",
            "local",
            "exit",
            "lock",
            "fetch",
            "xchg32",
            "be16",
            "movsx864",
            "%r1",
            "%r10",
            "%r16",
            "[%r1+8]",
            "[%r2-0x10]",
            "[%r",
            "-",
            "+3",
            "0xffffffffffffffffffff",
            "-99999999999999999999999999999999999999999",
            "l:",
        ];
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..20_000 {
            let mut line = String::new();
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let mut r = state;
            for _ in 0..(r % 5) {
                r /= 5;
                line.push_str(WORDS[(r % WORDS.len() as u64) as usize]);
                line.push_str(if r & 64 == 0 { ", " } else { " " });
                r /= WORDS.len() as u64;
            }
            let _ = assemble(&format!("{line}\nl:\nexit"));
        }
    }
}
