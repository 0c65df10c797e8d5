//! The eBPF instruction: its 8-byte encoding and the opcode fields (RFC 9669).

use thiserror::Error;

/// Number of the frame pointer register (read-only).
pub const FRAME_REG: u8 = 10;
/// Highest register number an instruction may name.
pub const MAX_REG: u8 = 10;

// Instruction classes (low 3 bits of the opcode).
pub const BPF_LD: u8 = 0x00;
pub const BPF_LDX: u8 = 0x01;
pub const BPF_ST: u8 = 0x02;
pub const BPF_STX: u8 = 0x03;
pub const BPF_ALU: u8 = 0x04;
pub const BPF_JMP: u8 = 0x05;
pub const BPF_JMP32: u8 = 0x06;
pub const BPF_ALU64: u8 = 0x07;

// Source bit of ALU and JMP opcodes.
pub const BPF_K: u8 = 0x00;
pub const BPF_X: u8 = 0x08;
/// For `BPF_END` with class `BPF_ALU`: convert to little endian (`BPF_K`) or big endian.
pub const BPF_TO_LE: u8 = 0x00;
pub const BPF_TO_BE: u8 = 0x08;

// ALU operations (high 4 bits).
pub const BPF_ADD: u8 = 0x00;
pub const BPF_SUB: u8 = 0x10;
pub const BPF_MUL: u8 = 0x20;
pub const BPF_DIV: u8 = 0x30;
pub const BPF_OR: u8 = 0x40;
pub const BPF_AND: u8 = 0x50;
pub const BPF_LSH: u8 = 0x60;
pub const BPF_RSH: u8 = 0x70;
pub const BPF_NEG: u8 = 0x80;
pub const BPF_MOD: u8 = 0x90;
pub const BPF_XOR: u8 = 0xa0;
pub const BPF_MOV: u8 = 0xb0;
pub const BPF_ARSH: u8 = 0xc0;
pub const BPF_END: u8 = 0xd0;

// Jump operations (high 4 bits).
pub const BPF_JA: u8 = 0x00;
pub const BPF_JEQ: u8 = 0x10;
pub const BPF_JGT: u8 = 0x20;
pub const BPF_JGE: u8 = 0x30;
pub const BPF_JSET: u8 = 0x40;
pub const BPF_JNE: u8 = 0x50;
pub const BPF_JSGT: u8 = 0x60;
pub const BPF_JSGE: u8 = 0x70;
pub const BPF_CALL: u8 = 0x80;
pub const BPF_EXIT: u8 = 0x90;
pub const BPF_JLT: u8 = 0xa0;
pub const BPF_JLE: u8 = 0xb0;
pub const BPF_JSLT: u8 = 0xc0;
pub const BPF_JSLE: u8 = 0xd0;

// Sizes of loads and stores (bits 3-4).
pub const BPF_W: u8 = 0x00;
pub const BPF_H: u8 = 0x08;
pub const BPF_B: u8 = 0x10;
pub const BPF_DW: u8 = 0x18;

// Modes of loads and stores (high 3 bits).
pub const BPF_IMM: u8 = 0x00;
pub const BPF_ABS: u8 = 0x20;
pub const BPF_IND: u8 = 0x40;
pub const BPF_MEM: u8 = 0x60;
pub const BPF_MEMSX: u8 = 0x80;
pub const BPF_ATOMIC: u8 = 0xc0;

// Atomic operations (in `imm`).
pub const BPF_FETCH: i32 = 0x01;
pub const BPF_XCHG: i32 = 0xe0 | BPF_FETCH;
pub const BPF_CMPXCHG: i32 = 0xf0 | BPF_FETCH;

// `src` values of `lddw` (the kernel's BPF_PSEUDO_*).
pub const BPF_PSEUDO_MAP_FD: u8 = 1;
pub const BPF_PSEUDO_MAP_VALUE: u8 = 2;
pub const BPF_PSEUDO_BTF_ID: u8 = 3;
pub const BPF_PSEUDO_FUNC: u8 = 4;
pub const BPF_PSEUDO_MAP_IDX: u8 = 5;
pub const BPF_PSEUDO_MAP_IDX_VALUE: u8 = 6;

// `src` values of `call`.
pub const BPF_PSEUDO_CALL: u8 = 1;
pub const BPF_PSEUDO_KFUNC_CALL: u8 = 2;

// Whole opcodes used often enough to name.
pub const OP_LDDW: u8 = BPF_LD | BPF_IMM | BPF_DW;
pub const OP_CALL: u8 = BPF_JMP | BPF_CALL;
/// `callx`: call the helper whose id is in `dst` (bpf_conformance's extension).
pub const OP_CALLX: u8 = BPF_JMP | BPF_CALL | BPF_X;
pub const OP_EXIT: u8 = BPF_JMP | BPF_EXIT;
pub const OP_JA: u8 = BPF_JMP | BPF_JA;
/// `gotol`: unconditional jump with a 32-bit offset in `imm`.
pub const OP_JA32: u8 = BPF_JMP32 | BPF_JA;

/// Byte length of one instruction slot.
pub const INSN_SIZE: usize = 8;

/// One 8-byte instruction slot. `lddw` takes two slots; the second has opcode 0 and carries
/// the upper 32 bits of the immediate in its `imm`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default, Debug)]
pub struct Insn {
    pub op: u8,
    pub dst: u8,
    pub src: u8,
    pub off: i16,
    pub imm: i32,
}

/// Errors turning bytes into instructions.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum DecodeError {
    #[error("program length {0} is not a multiple of 8 bytes")]
    BadLength(usize),
}

impl Insn {
    pub const fn new(op: u8, dst: u8, src: u8, off: i16, imm: i32) -> Insn {
        Insn { op, dst, src, off, imm }
    }

    /// Decodes one slot (little-endian, as the kernel and clang on x86 use).
    pub fn from_bytes(b: [u8; 8]) -> Insn {
        Insn {
            op: b[0],
            dst: b[1] & 0x0f,
            src: b[1] >> 4,
            off: i16::from_le_bytes([b[2], b[3]]),
            imm: i32::from_le_bytes([b[4], b[5], b[6], b[7]]),
        }
    }

    pub fn to_bytes(self) -> [u8; 8] {
        let off = self.off.to_le_bytes();
        let imm = self.imm.to_le_bytes();
        [self.op, (self.src << 4) | (self.dst & 0x0f), off[0], off[1], imm[0], imm[1], imm[2], imm[3]]
    }

    /// The instruction class (`BPF_LD` .. `BPF_ALU64`).
    pub const fn class(self) -> u8 {
        self.op & 0x07
    }
    /// The operation of an ALU or JMP instruction (`BPF_ADD`, `BPF_JEQ`, ...).
    pub const fn code(self) -> u8 {
        self.op & 0xf0
    }
    /// `BPF_K` or `BPF_X` for ALU and JMP instructions.
    pub const fn source(self) -> u8 {
        self.op & 0x08
    }
    /// The size of a load or store (`BPF_W`, `BPF_H`, `BPF_B`, `BPF_DW`).
    pub const fn size(self) -> u8 {
        self.op & 0x18
    }
    /// The mode of a load or store (`BPF_IMM`, `BPF_MEM`, `BPF_MEMSX`, `BPF_ATOMIC`, ...).
    pub const fn mode(self) -> u8 {
        self.op & 0xe0
    }
    pub const fn is_lddw(self) -> bool {
        self.op == OP_LDDW
    }
    /// Byte count of a load/store size field.
    pub const fn size_bytes(self) -> usize {
        match self.size() {
            BPF_B => 1,
            BPF_H => 2,
            BPF_W => 4,
            _ => 8,
        }
    }
    /// True for any jump that transfers control by its `off` (or `imm` for `gotol`).
    pub const fn is_jump(self) -> bool {
        let c = self.class();
        (c == BPF_JMP || c == BPF_JMP32) && self.code() != BPF_CALL && self.code() != BPF_EXIT
    }
    /// The 64-bit immediate of an `lddw` from its two slots.
    pub fn wide_imm(self, next: Insn) -> u64 {
        (self.imm as u32 as u64) | ((next.imm as u32 as u64) << 32)
    }
}

/// Decodes a program's bytes into instruction slots.
pub fn decode(bytes: &[u8]) -> Result<Vec<Insn>, DecodeError> {
    if !bytes.len().is_multiple_of(INSN_SIZE) {
        return Err(DecodeError::BadLength(bytes.len()));
    }
    Ok(bytes
        .chunks_exact(INSN_SIZE)
        .map(|c| Insn::from_bytes(c.try_into().expect("chunks_exact yields 8 bytes")))
        .collect())
}

/// Encodes instruction slots into bytes.
pub fn encode(insns: &[Insn]) -> Vec<u8> {
    insns.iter().flat_map(|i| i.to_bytes()).collect()
}

/// Parses the conformance suite's hex text ("b7  00  00 ..." or "b70000...") into bytes.
pub fn parse_hex(text: &str) -> Result<Vec<u8>, String> {
    let digits: Vec<u8> = text.bytes().filter(|b| !b.is_ascii_whitespace()).collect();
    let mut digits = digits.as_slice();
    if digits.starts_with(b"0x") {
        digits = &digits[2..];
    }
    if !digits.len().is_multiple_of(2) {
        return Err(format!("odd number of hex digits ({})", digits.len()));
    }
    digits
        .chunks_exact(2)
        .enumerate()
        .map(|(i, p)| {
            let s = std::str::from_utf8(p).map_err(|_| format!("non-ASCII byte at pair {i}"))?;
            u8::from_str_radix(s, 16).map_err(|_| format!("bad hex byte {s:?} at byte {i}"))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_bytes() {
        let i = Insn::new(0xb7, 3, 0, -5, -1);
        assert_eq!(Insn::from_bytes(i.to_bytes()), i);
        let j = Insn::new(0x7b, 10, 1, -8, 0);
        assert_eq!(j.to_bytes(), [0x7b, 0x1a, 0xf8, 0xff, 0, 0, 0, 0]);
    }

    #[test]
    fn decode_rejects_partial_slots() {
        assert_eq!(decode(&[0; 12]), Err(DecodeError::BadLength(12)));
        assert_eq!(decode(&[0; 16]).unwrap().len(), 2);
    }

    #[test]
    fn hex_text() {
        assert_eq!(parse_hex("b7  00\n 01").unwrap(), vec![0xb7, 0, 1]);
        assert!(parse_hex("b7 0").is_err());
        assert!(parse_hex("zz").is_err());
    }

    #[test]
    fn fields() {
        let i = Insn::new(BPF_ALU64 | BPF_X | BPF_ADD, 1, 2, 0, 0);
        assert_eq!(i.class(), BPF_ALU64);
        assert_eq!(i.source(), BPF_X);
        assert_eq!(i.code(), BPF_ADD);
        let l = Insn::new(BPF_LDX | BPF_MEM | BPF_H, 1, 2, 0, 0);
        assert_eq!(l.size_bytes(), 2);
        assert_eq!(l.mode(), BPF_MEM);
        assert!(Insn::new(OP_JA32, 0, 0, 0, 4).is_jump());
        assert!(!Insn::new(OP_CALL, 0, 0, 0, 4).is_jump());
    }
}
