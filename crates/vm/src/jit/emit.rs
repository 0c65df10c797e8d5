//! An x86-64 instruction encoder: one function per instruction form the JIT uses.
//!
//! Everything here only appends bytes to a buffer; nothing is executed. Operands are general
//! purpose registers ([`Reg`]) and memory operands `[base + index*scale + disp]` ([`Mem`]).
//! Operand size is chosen by a `w` flag: `true` for 64 bits (REX.W), `false` for 32 bits
//! (which zero-extends the destination register, as eBPF's 32-bit ALU needs).

/// A general purpose register by its hardware number (0 = rax .. 15 = r15).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) struct Reg(u8);

impl Reg {
    pub const RAX: Reg = Reg(0);
    pub const RCX: Reg = Reg(1);
    pub const RDX: Reg = Reg(2);
    pub const RBX: Reg = Reg(3);
    pub const RSP: Reg = Reg(4);
    pub const RBP: Reg = Reg(5);
    pub const RSI: Reg = Reg(6);
    pub const RDI: Reg = Reg(7);
    pub const R8: Reg = Reg(8);
    pub const R9: Reg = Reg(9);
    pub const R10: Reg = Reg(10);
    pub const R11: Reg = Reg(11);
    pub const R12: Reg = Reg(12);
    pub const R13: Reg = Reg(13);
    pub const R14: Reg = Reg(14);
    pub const R15: Reg = Reg(15);

    /// The low three bits, as they go in ModRM, SIB or the opcode.
    const fn low(self) -> u8 {
        self.0 & 7
    }
    /// The fourth bit, as it goes in REX.R, REX.X or REX.B.
    const fn high(self) -> u8 {
        (self.0 >> 3) & 1
    }
    /// Whether naming this register's low byte needs a REX prefix (spl, bpl, sil, dil:
    /// without REX, the same numbers mean ah, ch, dh, bh).
    const fn byte_needs_rex(self) -> bool {
        self.0 >= 4 && self.0 <= 7
    }
}

/// A memory operand `[base + index*scale + disp]`.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) struct Mem {
    base: Reg,
    /// Index register and log2 of the scale. rsp cannot be an index.
    index: Option<(Reg, u8)>,
    disp: i32,
    /// No base and no index: `[disp32]` (with an `fs` prefix, a thread-local word at a
    /// static-TLS offset).
    abs: bool,
}

impl Mem {
    /// `[base + disp]`.
    pub const fn base(base: Reg, disp: i32) -> Mem {
        Mem { base, index: None, disp, abs: false }
    }
    /// `[base + index * 8]`.
    pub const fn indexed8(base: Reg, index: Reg) -> Mem {
        Mem { base, index: Some((index, 3)), disp: 0, abs: false }
    }
    /// `[base + index << scale]`, scale 0..=3. `index` must not be rsp.
    pub const fn indexed(base: Reg, index: Reg, scale: u8) -> Mem {
        Mem { base, index: Some((index, scale & 3)), disp: 0, abs: false }
    }
    /// `[disp]`, the sign-extended 32-bit address (ModRM with a SIB of no base, no index).
    pub const fn abs(disp: i32) -> Mem {
        Mem { base: Reg::RBP, index: None, disp, abs: true }
    }
}

/// Condition codes (the low nibble of `jcc`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Cond {
    /// Below (unsigned <).
    B = 0x2,
    /// Above or equal (unsigned >=).
    Ae = 0x3,
    E = 0x4,
    Ne = 0x5,
    /// Below or equal (unsigned <=).
    Be = 0x6,
    /// Above (unsigned >).
    A = 0x7,
    /// Less (signed <).
    L = 0xc,
    /// Greater or equal (signed >=).
    Ge = 0xd,
    /// Less or equal (signed <=).
    Le = 0xe,
    /// Greater (signed >).
    G = 0xf,
}

/// The eight classic ALU operations, by their `/digit` in the `81`/`83` group.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Alu {
    Add = 0,
    Or = 1,
    And = 4,
    Sub = 5,
    Xor = 6,
    Cmp = 7,
}

/// Shifts and rotates, by their `/digit` in the `C1`/`D1`/`D3` group.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Shift {
    Rol = 0,
    Shl = 4,
    Shr = 5,
    Sar = 7,
}

/// Access width of a load or store.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Width {
    B,
    H,
    W,
    Dw,
}

/// The register/memory operand of a ModRM byte.
#[derive(Clone, Copy)]
enum Rm {
    Reg(Reg),
    Mem(Mem),
}

/// Which operand of [`Asm::op`] is a byte register (naming spl, bpl, sil or dil needs REX).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Bytes {
    None,
    Reg,
    Rm,
}

/// A forward short jump waiting for its target: the position of its rel8 byte.
#[must_use]
pub(crate) struct ShortFixup(usize);

/// A forward long jump waiting for its target: the position of its rel32.
#[must_use]
pub(crate) struct LongFixup(usize);

/// The output buffer and the encoder.
#[derive(Default)]
pub(crate) struct Asm {
    buf: Vec<u8>,
    /// Set when a short local jump was bound too far away (an internal error).
    overflow: bool,
}

fn fits_i8(v: i64) -> bool {
    (-128..=127).contains(&v)
}

impl Asm {
    pub fn new() -> Asm {
        Asm::default()
    }
    /// Bytes emitted so far.
    pub fn pos(&self) -> usize {
        self.buf.len()
    }
    #[cfg(test)]
    pub fn code(&self) -> &[u8] {
        &self.buf
    }
    pub fn into_code(self) -> Vec<u8> {
        self.buf
    }
    /// Whether a short local jump could not reach its label.
    pub fn overflowed(&self) -> bool {
        self.overflow
    }

    fn byte(&mut self, b: u8) {
        self.buf.push(b);
    }
    fn imm16(&mut self, v: u16) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    fn imm32(&mut self, v: i32) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    fn imm64(&mut self, v: u64) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }

    /// Emits a REX prefix when any of its bits is set or `force` asks for one.
    fn rex(&mut self, w: bool, r: u8, x: u8, b: u8, force: bool) {
        let bits = (u8::from(w) << 3) | (r << 2) | (x << 1) | b;
        if bits != 0 || force {
            self.byte(0x40 | bits);
        }
    }

    /// The general form: `[66] [REX] opcode ModRM [SIB] [disp]`, with `reg` the ModRM reg
    /// field (a register number or an opcode extension `/digit`). `bytes` says which operand
    /// is a byte register, to force a REX prefix where that register needs one.
    fn op(&mut self, p66: bool, w: bool, opcode: &[u8], reg: u8, rm: Rm, bytes: Bytes) {
        if p66 {
            self.byte(0x66);
        }
        let r = (reg >> 3) & 1;
        let force_reg = bytes == Bytes::Reg && (4..=7).contains(&reg);
        match rm {
            Rm::Reg(m) => {
                self.rex(w, r, 0, m.high(), force_reg || (bytes == Bytes::Rm && m.byte_needs_rex()));
                self.buf.extend_from_slice(opcode);
                self.byte(0xc0 | ((reg & 7) << 3) | m.low());
            }
            Rm::Mem(m) => {
                let x = m.index.map_or(0, |(i, _)| i.high());
                let b = if m.abs { 0 } else { m.base.high() };
                self.rex(w, r, x, b, force_reg);
                self.buf.extend_from_slice(opcode);
                self.mem_operand(reg & 7, m);
            }
        }
    }

    /// ModRM (+ SIB + displacement) for a memory operand.
    fn mem_operand(&mut self, reg: u8, m: Mem) {
        if m.abs {
            // mod 00, rm 100 (SIB); SIB: no index (100), base 101 with mod 00 = disp32.
            self.byte((reg << 3) | 4);
            self.byte((4 << 3) | 5);
            self.imm32(m.disp);
            return;
        }
        // rbp and r13 as base with mod 00 would mean RIP-relative / no base: use disp8 0.
        let mode: u8 = if m.disp == 0 && m.base.low() != 5 {
            0
        } else if fits_i8(m.disp as i64) {
            1
        } else {
            2
        };
        let need_sib = m.base.low() == 4 || m.index.is_some();
        if need_sib {
            self.byte((mode << 6) | (reg << 3) | 4);
            let (index, scale) = match m.index {
                Some((i, s)) => (i.low(), s),
                None => (4, 0), // no index
            };
            self.byte((scale << 6) | (index << 3) | m.base.low());
        } else {
            self.byte((mode << 6) | (reg << 3) | m.base.low());
        }
        match mode {
            0 => {}
            1 => self.byte(m.disp as i8 as u8),
            _ => self.imm32(m.disp),
        }
    }

    // ---- moves ----

    /// `mov dst, src` (89 /r).
    pub fn mov_rr(&mut self, w: bool, dst: Reg, src: Reg) {
        self.op(false, w, &[0x89], src.0, Rm::Reg(dst), Bytes::None);
    }

    /// `mov dst32, imm32` (B8+r id): zero-extends to 64 bits.
    pub fn mov_ri32(&mut self, dst: Reg, imm: u32) {
        self.rex(false, 0, 0, dst.high(), false);
        self.byte(0xb8 + dst.low());
        self.imm32(imm as i32);
    }

    /// `mov dst64, simm32` (REX.W C7 /0 id): sign-extends to 64 bits.
    pub fn mov_ri_sx(&mut self, dst: Reg, imm: i32) {
        self.op(false, true, &[0xc7], 0, Rm::Reg(dst), Bytes::None);
        self.imm32(imm);
    }

    /// `movabs dst, imm64` (REX.W B8+r io).
    pub fn movabs(&mut self, dst: Reg, imm: u64) {
        self.rex(true, 0, 0, dst.high(), false);
        self.byte(0xb8 + dst.low());
        self.imm64(imm);
    }

    /// Loads a 64-bit constant with the shortest of the three `mov` forms. Flags are kept.
    pub fn mov_imm(&mut self, dst: Reg, v: u64) {
        if v <= u32::MAX as u64 {
            self.mov_ri32(dst, v as u32);
        } else if v as i64 >= i32::MIN as i64 && v as i64 <= i32::MAX as i64 {
            self.mov_ri_sx(dst, v as i64 as i32);
        } else {
            self.movabs(dst, v);
        }
    }

    /// `xor dst32, dst32`: dst = 0 (clobbers flags).
    pub fn zero(&mut self, dst: Reg) {
        self.alu_rr(Alu::Xor, false, dst, dst);
    }

    /// `movzx dst32, src8` (0F B6) or `movzx dst32, src16` (0F B7); zero-extends to 64.
    pub fn movzx_rr(&mut self, dst: Reg, src: Reg, bits: u8) {
        let op = if bits == 8 { 0xb6 } else { 0xb7 };
        self.op(false, false, &[0x0f, op], dst.0, Rm::Reg(src), if bits == 8 { Bytes::Rm } else { Bytes::None });
    }

    /// `movsx dst, src8` (0F BE) or `movsx dst, src16` (0F BF), to 32 (zero-extended) or 64 bits.
    pub fn movsx_rr(&mut self, w: bool, dst: Reg, src: Reg, bits: u8) {
        let op = if bits == 8 { 0xbe } else { 0xbf };
        self.op(false, w, &[0x0f, op], dst.0, Rm::Reg(src), if bits == 8 { Bytes::Rm } else { Bytes::None });
    }

    /// `movsxd dst64, src32` (REX.W 63 /r).
    pub fn movsxd_rr(&mut self, dst: Reg, src: Reg) {
        self.op(false, true, &[0x63], dst.0, Rm::Reg(src), Bytes::None);
    }

    /// `lea dst, [m]` (REX.W 8D /r).
    pub fn lea(&mut self, dst: Reg, m: Mem) {
        self.op(false, true, &[0x8d], dst.0, Rm::Mem(m), Bytes::None);
    }

    /// `lea dst32, [m]` (8D /r): the address truncated to 32 bits, zero-extended.
    pub fn lea32(&mut self, dst: Reg, m: Mem) {
        self.op(false, false, &[0x8d], dst.0, Rm::Mem(m), Bytes::None);
    }

    /// `lea dst, [rip + disp]` (REX.W 8D /r, mod 00 rm 101). Always 7 bytes; `disp` counts
    /// from the end of the instruction.
    pub fn lea_rip(&mut self, dst: Reg, disp: i32) {
        self.rex(true, dst.high(), 0, 0, false);
        self.byte(0x8d);
        self.byte((dst.low() << 3) | 5);
        self.imm32(disp);
    }

    // ---- loads and stores ----

    /// Zero-extending load: `movzx r32, byte/word [m]`, `mov r32, [m]`, `mov r64, [m]`.
    pub fn load(&mut self, width: Width, dst: Reg, m: Mem) {
        match width {
            Width::B => self.op(false, false, &[0x0f, 0xb6], dst.0, Rm::Mem(m), Bytes::None),
            Width::H => self.op(false, false, &[0x0f, 0xb7], dst.0, Rm::Mem(m), Bytes::None),
            Width::W => self.op(false, false, &[0x8b], dst.0, Rm::Mem(m), Bytes::None),
            Width::Dw => self.op(false, true, &[0x8b], dst.0, Rm::Mem(m), Bytes::None),
        }
    }

    /// Sign-extending load to 64 bits: `movsx r64, byte/word [m]`, `movsxd r64, [m]`.
    /// (For `Width::Dw` a plain 64-bit load.)
    pub fn load_sx(&mut self, width: Width, dst: Reg, m: Mem) {
        match width {
            Width::B => self.op(false, true, &[0x0f, 0xbe], dst.0, Rm::Mem(m), Bytes::None),
            Width::H => self.op(false, true, &[0x0f, 0xbf], dst.0, Rm::Mem(m), Bytes::None),
            Width::W => self.op(false, true, &[0x63], dst.0, Rm::Mem(m), Bytes::None),
            Width::Dw => self.op(false, true, &[0x8b], dst.0, Rm::Mem(m), Bytes::None),
        }
    }

    /// Store of a register's low bytes: `mov [m], r8/r16/r32/r64`.
    pub fn store(&mut self, width: Width, m: Mem, src: Reg) {
        match width {
            Width::B => self.op(false, false, &[0x88], src.0, Rm::Mem(m), Bytes::Reg),
            Width::H => self.op(true, false, &[0x89], src.0, Rm::Mem(m), Bytes::None),
            Width::W => self.op(false, false, &[0x89], src.0, Rm::Mem(m), Bytes::None),
            Width::Dw => self.op(false, true, &[0x89], src.0, Rm::Mem(m), Bytes::None),
        }
    }

    /// Store of an immediate: `mov byte/word/dword [m], imm`, `mov qword [m], simm32`.
    pub fn store_imm(&mut self, width: Width, m: Mem, imm: i32) {
        match width {
            Width::B => {
                self.op(false, false, &[0xc6], 0, Rm::Mem(m), Bytes::None);
                self.byte(imm as u8);
            }
            Width::H => {
                self.op(true, false, &[0xc7], 0, Rm::Mem(m), Bytes::None);
                self.imm16(imm as u16);
            }
            Width::W | Width::Dw => {
                self.op(false, width == Width::Dw, &[0xc7], 0, Rm::Mem(m), Bytes::None);
                self.imm32(imm);
            }
        }
    }

    // ---- arithmetic ----

    /// `op dst, src` for add/or/and/sub/xor/cmp (opcode digit*8 + 1, /r).
    pub fn alu_rr(&mut self, op: Alu, w: bool, dst: Reg, src: Reg) {
        self.op(false, w, &[((op as u8) << 3) | 1], src.0, Rm::Reg(dst), Bytes::None);
    }

    /// `op dst, imm` (83 /digit ib when it fits a signed byte, else 81 /digit id; for 64-bit
    /// operands the immediate is sign-extended).
    pub fn alu_ri(&mut self, op: Alu, w: bool, dst: Reg, imm: i32) {
        if fits_i8(imm as i64) {
            self.op(false, w, &[0x83], op as u8, Rm::Reg(dst), Bytes::None);
            self.byte(imm as i8 as u8);
        } else {
            self.op(false, w, &[0x81], op as u8, Rm::Reg(dst), Bytes::None);
            self.imm32(imm);
        }
    }

    /// `op [m], src` for add/or/and/xor (with [`lock`](Self::lock) before it for atomics).
    pub fn alu_mr(&mut self, op: Alu, w: bool, m: Mem, src: Reg) {
        self.op(false, w, &[((op as u8) << 3) | 1], src.0, Rm::Mem(m), Bytes::None);
    }

    /// `cmp byte [m], imm8` (80 /7 ib).
    pub fn cmp_mb(&mut self, m: Mem, imm: u8) {
        self.op(false, false, &[0x80], 7, Rm::Mem(m), Bytes::None);
        self.byte(imm);
    }

    /// `test a, b` (85 /r).
    pub fn test_rr(&mut self, w: bool, a: Reg, b: Reg) {
        self.op(false, w, &[0x85], b.0, Rm::Reg(a), Bytes::None);
    }

    /// `test r, imm32` (F7 /0 id; sign-extended for 64-bit operands).
    pub fn test_ri(&mut self, w: bool, r: Reg, imm: i32) {
        self.op(false, w, &[0xf7], 0, Rm::Reg(r), Bytes::None);
        self.imm32(imm);
    }

    /// `imul dst, src` (0F AF /r): the low half of the product, signed or not.
    pub fn imul_rr(&mut self, w: bool, dst: Reg, src: Reg) {
        self.op(false, w, &[0x0f, 0xaf], dst.0, Rm::Reg(src), Bytes::None);
    }

    /// `imul dst, src, imm` (6B /r ib or 69 /r id).
    pub fn imul_rri(&mut self, w: bool, dst: Reg, src: Reg, imm: i32) {
        if fits_i8(imm as i64) {
            self.op(false, w, &[0x6b], dst.0, Rm::Reg(src), Bytes::None);
            self.byte(imm as i8 as u8);
        } else {
            self.op(false, w, &[0x69], dst.0, Rm::Reg(src), Bytes::None);
            self.imm32(imm);
        }
    }

    /// `imul dst, qword [m], imm` (REX.W 6B /r ib or 69 /r id).
    pub fn imul_rmi(&mut self, dst: Reg, m: Mem, imm: i32) {
        if fits_i8(imm as i64) {
            self.op(false, true, &[0x6b], dst.0, Rm::Mem(m), Bytes::None);
            self.byte(imm as i8 as u8);
        } else {
            self.op(false, true, &[0x69], dst.0, Rm::Mem(m), Bytes::None);
            self.imm32(imm);
        }
    }

    /// `neg r` (F7 /3).
    pub fn neg(&mut self, w: bool, r: Reg) {
        self.op(false, w, &[0xf7], 3, Rm::Reg(r), Bytes::None);
    }

    /// `div r` (F7 /6): unsigned rdx:rax / r.
    pub fn div(&mut self, w: bool, r: Reg) {
        self.op(false, w, &[0xf7], 6, Rm::Reg(r), Bytes::None);
    }

    /// `idiv r` (F7 /7): signed rdx:rax / r.
    pub fn idiv(&mut self, w: bool, r: Reg) {
        self.op(false, w, &[0xf7], 7, Rm::Reg(r), Bytes::None);
    }

    /// `cqo` (REX.W 99) for 64 bits or `cdq` (99) for 32: sign-extend rax into rdx.
    pub fn sign_extend_ax(&mut self, w: bool) {
        self.rex(w, 0, 0, 0, false);
        self.byte(0x99);
    }

    /// `shl/shr/sar/rol r, count` (D1 /digit for 1, C1 /digit ib otherwise).
    pub fn shift_ri(&mut self, op: Shift, w: bool, r: Reg, count: u8) {
        if count == 1 {
            self.op(false, w, &[0xd1], op as u8, Rm::Reg(r), Bytes::None);
        } else {
            self.op(false, w, &[0xc1], op as u8, Rm::Reg(r), Bytes::None);
            self.byte(count);
        }
    }

    /// `shl/shr/sar r, cl` (D3 /digit).
    pub fn shift_cl(&mut self, op: Shift, w: bool, r: Reg) {
        self.op(false, w, &[0xd3], op as u8, Rm::Reg(r), Bytes::None);
    }

    /// BMI2 `shlx/shrx/sarx dst, src, count` (VEX.LZ.{66,F2,F3}.0F38.W F7 /r): the count
    /// from any register, flags untouched.
    pub fn shiftx(&mut self, op: Shift, w: bool, dst: Reg, src: Reg, count: Reg) {
        let pp = match op {
            Shift::Shl => 1, // 66
            Shift::Sar => 2, // F3
            _ => 3,          // F2: shrx
        };
        self.byte(0xc4);
        // R X B inverted, map 0F38.
        self.byte(((dst.high() ^ 1) << 7) | (1 << 6) | ((src.high() ^ 1) << 5) | 0x02);
        self.byte((u8::from(w) << 7) | ((!count.0 & 15) << 3) | pp);
        self.byte(0xf7);
        self.byte(0xc0 | (dst.low() << 3) | src.low());
    }

    /// `rol r16, 8`: swaps the two low bytes (66 C1 /0 08).
    pub fn rol16_8(&mut self, r: Reg) {
        self.op(true, false, &[0xc1], Shift::Rol as u8, Rm::Reg(r), Bytes::None);
        self.byte(8);
    }

    /// `bswap r32` or `bswap r64` (0F C8+r).
    pub fn bswap(&mut self, w: bool, r: Reg) {
        self.rex(w, 0, 0, r.high(), false);
        self.byte(0x0f);
        self.byte(0xc8 + r.low());
    }

    // ---- atomics ----

    /// The `lock` prefix (F0) for the next instruction.
    pub fn lock(&mut self) {
        self.byte(0xf0);
    }

    /// The FS segment prefix (64) for the next instruction's memory operand (thread-local
    /// storage: the address is an offset from the thread pointer).
    pub fn fs(&mut self) {
        self.byte(0x64);
    }

    /// `xadd [m], src` (0F C1 /r): src receives the old value.
    pub fn xadd(&mut self, w: bool, m: Mem, src: Reg) {
        self.op(false, w, &[0x0f, 0xc1], src.0, Rm::Mem(m), Bytes::None);
    }

    /// `xchg [m], src` (87 /r), locked by itself.
    pub fn xchg_mr(&mut self, w: bool, m: Mem, src: Reg) {
        self.op(false, w, &[0x87], src.0, Rm::Mem(m), Bytes::None);
    }

    /// `cmpxchg [m], src` (0F B1 /r): compares rax with [m].
    pub fn cmpxchg(&mut self, w: bool, m: Mem, src: Reg) {
        self.op(false, w, &[0x0f, 0xb1], src.0, Rm::Mem(m), Bytes::None);
    }

    // ---- stack and control flow ----

    /// `push r` (50+r).
    pub fn push(&mut self, r: Reg) {
        self.rex(false, 0, 0, r.high(), false);
        self.byte(0x50 + r.low());
    }

    /// `push imm32` (68 id): pushes the immediate sign-extended to 64 bits.
    #[cfg(test)]
    pub fn push_imm32(&mut self, imm: i32) {
        self.byte(0x68);
        self.imm32(imm);
    }

    /// `pop r` (58+r).
    pub fn pop(&mut self, r: Reg) {
        self.rex(false, 0, 0, r.high(), false);
        self.byte(0x58 + r.low());
    }

    /// `ret` (C3).
    pub fn ret(&mut self) {
        self.byte(0xc3);
    }

    /// `call r` (FF /2).
    pub fn call_r(&mut self, r: Reg) {
        self.op(false, false, &[0xff], 2, Rm::Reg(r), Bytes::None);
    }

    /// `call rel32` (E8 cd); `disp` counts from the end of the instruction (5 bytes).
    pub fn call_rel32(&mut self, disp: i32) {
        self.byte(0xe8);
        self.imm32(disp);
    }

    /// `jmp rel8` (EB cb).
    pub fn jmp_rel8(&mut self, disp: i8) {
        self.byte(0xeb);
        self.byte(disp as u8);
    }

    /// `jmp rel32` (E9 cd).
    pub fn jmp_rel32(&mut self, disp: i32) {
        self.byte(0xe9);
        self.imm32(disp);
    }

    /// `jcc rel8` (70+cc cb).
    pub fn jcc_rel8(&mut self, cc: Cond, disp: i8) {
        self.byte(0x70 + cc as u8);
        self.byte(disp as u8);
    }

    /// `jcc rel32` (0F 80+cc cd).
    pub fn jcc_rel32(&mut self, cc: Cond, disp: i32) {
        self.byte(0x0f);
        self.byte(0x80 + cc as u8);
        self.imm32(disp);
    }

    /// `int3` (CC).
    #[cfg(test)]
    pub fn int3(&mut self) {
        self.byte(0xcc);
    }

    // ---- short jumps inside one instruction's code ----

    /// A forward `jcc rel8` (or `jmp rel8` without a condition) to a label bound later with
    /// [`bind`](Self::bind).
    pub fn jump_fwd(&mut self, cc: Option<Cond>) -> ShortFixup {
        match cc {
            Some(cc) => self.jcc_rel8(cc, 0),
            None => self.jmp_rel8(0),
        }
        ShortFixup(self.pos() - 1)
    }

    /// Binds a forward short jump to the current position.
    pub fn bind(&mut self, f: ShortFixup) {
        let disp = self.pos() as i64 - (f.0 as i64 + 1);
        if fits_i8(disp) {
            self.buf[f.0] = disp as i8 as u8;
        } else {
            self.overflow = true;
        }
    }

    /// A backward `jcc` to `target`, a position already emitted: rel8 when it reaches, else
    /// rel32 (the choice depends only on code emitted before, so it is the same in every pass).
    pub fn jcc_back(&mut self, cc: Cond, target: usize) {
        let disp = target as i64 - (self.pos() as i64 + 2);
        if fits_i8(disp) {
            self.jcc_rel8(cc, disp as i8);
        } else {
            let disp = target as i64 - (self.pos() as i64 + 6);
            self.jcc_rel32(cc, disp as i32);
        }
    }

    /// A backward `jmp` to `target`, as [`jcc_back`](Self::jcc_back).
    pub fn jmp_back(&mut self, target: usize) {
        let disp = target as i64 - (self.pos() as i64 + 2);
        if fits_i8(disp) {
            self.jmp_rel8(disp as i8);
        } else {
            let disp = target as i64 - (self.pos() as i64 + 5);
            self.jmp_rel32(disp as i32);
        }
    }

    /// A forward `jmp rel32` (or `jcc rel32`) to a label bound later with
    /// [`bind32`](Self::bind32), for code too long for a short jump.
    pub fn jump_fwd32(&mut self, cc: Option<Cond>) -> LongFixup {
        match cc {
            Some(cc) => self.jcc_rel32(cc, 0),
            None => self.jmp_rel32(0),
        }
        LongFixup(self.pos() - 4)
    }

    /// Binds a forward long jump to the current position.
    pub fn bind32(&mut self, f: LongFixup) {
        let disp = (self.pos() as i64 - (f.0 as i64 + 4)) as i32;
        self.buf[f.0..f.0 + 4].copy_from_slice(&disp.to_le_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use iced_x86::{Decoder, DecoderOptions, Formatter, IntelFormatter, MemorySizeOptions};

    /// Disassembles `code` (at address 0) into one line per instruction.
    fn dis(code: &[u8]) -> Vec<String> {
        let mut d = Decoder::with_ip(64, code, 0, DecoderOptions::NONE);
        let mut f = IntelFormatter::new();
        f.options_mut().set_hex_prefix("0x");
        f.options_mut().set_hex_suffix("");
        f.options_mut().set_space_after_operand_separator(true);
        f.options_mut().set_uppercase_hex(false);
        f.options_mut().set_show_branch_size(false);
        f.options_mut().set_branch_leading_zeros(false);
        f.options_mut().set_small_hex_numbers_in_decimal(false);
        f.options_mut().set_memory_size_options(MemorySizeOptions::Always);
        let mut out = Vec::new();
        for i in &mut d {
            assert!(!i.is_invalid(), "invalid instruction in {code:02x?}");
            let mut s = String::new();
            f.format(&i, &mut s);
            out.push(s);
        }
        out
    }

    fn one(build: impl FnOnce(&mut Asm)) -> String {
        let mut a = Asm::new();
        build(&mut a);
        let lines = dis(a.code());
        assert_eq!(lines.len(), 1, "{lines:?}");
        lines[0].clone()
    }

    const ALL: [Reg; 16] = [
        Reg::RAX,
        Reg::RCX,
        Reg::RDX,
        Reg::RBX,
        Reg::RSP,
        Reg::RBP,
        Reg::RSI,
        Reg::RDI,
        Reg::R8,
        Reg::R9,
        Reg::R10,
        Reg::R11,
        Reg::R12,
        Reg::R13,
        Reg::R14,
        Reg::R15,
    ];
    const N64: [&str; 16] =
        ["rax", "rcx", "rdx", "rbx", "rsp", "rbp", "rsi", "rdi", "r8", "r9", "r10", "r11", "r12", "r13", "r14", "r15"];
    const N32: [&str; 16] = [
        "eax", "ecx", "edx", "ebx", "esp", "ebp", "esi", "edi", "r8d", "r9d", "r10d", "r11d", "r12d", "r13d", "r14d",
        "r15d",
    ];
    const N16: [&str; 16] =
        ["ax", "cx", "dx", "bx", "sp", "bp", "si", "di", "r8w", "r9w", "r10w", "r11w", "r12w", "r13w", "r14w", "r15w"];
    const N8: [&str; 16] = [
        "al", "cl", "dl", "bl", "spl", "bpl", "sil", "dil", "r8b", "r9b", "r10b", "r11b", "r12b", "r13b", "r14b",
        "r15b",
    ];

    fn n(w: bool, r: Reg) -> &'static str {
        if w { N64[r.0 as usize] } else { N32[r.0 as usize] }
    }

    fn mem_text(base: Reg, disp: i32) -> String {
        let b = N64[base.0 as usize];
        match disp {
            0 => format!("[{b}]"),
            d if d < 0 => format!("[{b}-0x{:x}]", -(d as i64)),
            d => format!("[{b}+0x{d:x}]"),
        }
    }

    #[test]
    fn register_register_forms() {
        for &d in &ALL {
            for &s in &ALL {
                for w in [false, true] {
                    assert_eq!(one(|a| a.mov_rr(w, d, s)), format!("mov {}, {}", n(w, d), n(w, s)));
                    assert_eq!(one(|a| a.alu_rr(Alu::Add, w, d, s)), format!("add {}, {}", n(w, d), n(w, s)));
                    assert_eq!(one(|a| a.alu_rr(Alu::Sub, w, d, s)), format!("sub {}, {}", n(w, d), n(w, s)));
                    assert_eq!(one(|a| a.alu_rr(Alu::Cmp, w, d, s)), format!("cmp {}, {}", n(w, d), n(w, s)));
                    assert_eq!(one(|a| a.alu_rr(Alu::Xor, w, d, s)), format!("xor {}, {}", n(w, d), n(w, s)));
                    assert_eq!(one(|a| a.alu_rr(Alu::And, w, d, s)), format!("and {}, {}", n(w, d), n(w, s)));
                    assert_eq!(one(|a| a.alu_rr(Alu::Or, w, d, s)), format!("or {}, {}", n(w, d), n(w, s)));
                    assert_eq!(one(|a| a.test_rr(w, d, s)), format!("test {}, {}", n(w, d), n(w, s)));
                    assert_eq!(one(|a| a.imul_rr(w, d, s)), format!("imul {}, {}", n(w, d), n(w, s)));
                    // iced prints `imul r, r, imm` with two equal registers as `imul r, imm`.
                    let ds = if d == s { n(w, d).to_string() } else { format!("{}, {}", n(w, d), n(w, s)) };
                    assert_eq!(one(|a| a.imul_rri(w, d, s, 100)), format!("imul {ds}, 0x64"));
                    assert_eq!(one(|a| a.imul_rri(w, d, s, 1000)), format!("imul {ds}, 0x3e8"));
                    assert_eq!(one(|a| a.movsx_rr(w, d, s, 8)), format!("movsx {}, {}", n(w, d), N8[s.0 as usize]));
                    assert_eq!(one(|a| a.movsx_rr(w, d, s, 16)), format!("movsx {}, {}", n(w, d), N16[s.0 as usize]));
                    for c in [&ALL[..4], &ALL[5..]].concat() {
                        assert_eq!(
                            one(|a| a.shiftx(Shift::Shl, w, d, s, c)),
                            format!("shlx {}, {}, {}", n(w, d), n(w, s), n(w, c))
                        );
                    }
                    assert_eq!(
                        one(|a| a.shiftx(Shift::Shr, w, d, s, Reg::RCX)),
                        format!("shrx {}, {}, {}", n(w, d), n(w, s), n(w, Reg::RCX))
                    );
                    assert_eq!(
                        one(|a| a.shiftx(Shift::Sar, w, d, s, Reg::R11)),
                        format!("sarx {}, {}, {}", n(w, d), n(w, s), n(w, Reg::R11))
                    );
                }
                assert_eq!(one(|a| a.movsxd_rr(d, s)), format!("movsxd {}, {}", N64[d.0 as usize], N32[s.0 as usize]));
                assert_eq!(one(|a| a.movzx_rr(d, s, 8)), format!("movzx {}, {}", N32[d.0 as usize], N8[s.0 as usize]));
                assert_eq!(
                    one(|a| a.movzx_rr(d, s, 16)),
                    format!("movzx {}, {}", N32[d.0 as usize], N16[s.0 as usize])
                );
            }
        }
    }

    #[test]
    fn register_forms() {
        for &r in &ALL {
            for w in [false, true] {
                assert_eq!(one(|a| a.alu_ri(Alu::Add, w, r, 5)), format!("add {}, 0x5", n(w, r)));
                assert_eq!(one(|a| a.alu_ri(Alu::Sub, w, r, 0x1234)), format!("sub {}, 0x1234", n(w, r)));
                let m1 = if w { "0xffffffffffffffff" } else { "0xffffffff" };
                assert_eq!(one(|a| a.alu_ri(Alu::Cmp, w, r, -1)), format!("cmp {}, {m1}", n(w, r)));
                assert_eq!(one(|a| a.alu_ri(Alu::And, w, r, 0x7fff_ffff)), format!("and {}, 0x7fffffff", n(w, r)));
                assert_eq!(one(|a| a.test_ri(w, r, 0x100)), format!("test {}, 0x100", n(w, r)));
                assert_eq!(one(|a| a.neg(w, r)), format!("neg {}", n(w, r)));
                assert_eq!(one(|a| a.div(w, r)), format!("div {}", n(w, r)));
                assert_eq!(one(|a| a.idiv(w, r)), format!("idiv {}", n(w, r)));
                assert_eq!(one(|a| a.shift_ri(Shift::Shl, w, r, 1)), format!("shl {}, 0x1", n(w, r)));
                assert_eq!(one(|a| a.shift_ri(Shift::Shr, w, r, 7)), format!("shr {}, 0x7", n(w, r)));
                assert_eq!(one(|a| a.shift_ri(Shift::Sar, w, r, 31)), format!("sar {}, 0x1f", n(w, r)));
                assert_eq!(one(|a| a.shift_cl(Shift::Sar, w, r)), format!("sar {}, cl", n(w, r)));
                assert_eq!(one(|a| a.shift_cl(Shift::Shl, w, r)), format!("shl {}, cl", n(w, r)));
                assert_eq!(one(|a| a.bswap(w, r)), format!("bswap {}", n(w, r)));
            }
            assert_eq!(one(|a| a.rol16_8(r)), format!("rol {}, 0x8", N16[r.0 as usize]));
            assert_eq!(one(|a| a.mov_ri32(r, 0xdead_beef)), format!("mov {}, 0xdeadbeef", N32[r.0 as usize]));
            assert_eq!(one(|a| a.mov_ri_sx(r, -2)), format!("mov {}, 0xfffffffffffffffe", N64[r.0 as usize]));
            assert_eq!(
                one(|a| a.movabs(r, 0x1122_3344_5566_7788)),
                format!("mov {}, 0x1122334455667788", N64[r.0 as usize])
            );
            assert_eq!(one(|a| a.push(r)), format!("push {}", N64[r.0 as usize]));
            assert_eq!(one(|a| a.pop(r)), format!("pop {}", N64[r.0 as usize]));
            assert_eq!(one(|a| a.call_r(r)), format!("call {}", N64[r.0 as usize]));
            assert_eq!(one(|a| a.zero(r)), format!("xor {0}, {0}", N32[r.0 as usize]));
            assert_eq!(one(|a| a.lea_rip(r, 0x10)), format!("lea {}, [0x17]", N64[r.0 as usize]));
        }
        assert_eq!(one(|a| a.sign_extend_ax(true)), "cqo");
        assert_eq!(one(|a| a.sign_extend_ax(false)), "cdq");
        assert_eq!(one(|a| a.ret()), "ret");
        assert_eq!(one(|a| a.push_imm32(-0x380)), "push 0xfffffffffffffc80");
    }

    #[test]
    fn memory_forms() {
        let disps = [0, 8, -8, 127, -128, 128, -129, 0x7fff, -0x8000];
        for &b in &ALL {
            for &d in &disps {
                let m = Mem::base(b, d);
                let mt = mem_text(b, d);
                for &r in &[Reg::RAX, Reg::RSI, Reg::RDI, Reg::RBP, Reg::R8, Reg::R13, Reg::R15] {
                    let i = r.0 as usize;
                    assert_eq!(one(|a| a.load(Width::B, r, m)), format!("movzx {}, byte ptr {mt}", N32[i]));
                    assert_eq!(one(|a| a.load(Width::H, r, m)), format!("movzx {}, word ptr {mt}", N32[i]));
                    assert_eq!(one(|a| a.load(Width::W, r, m)), format!("mov {}, dword ptr {mt}", N32[i]));
                    assert_eq!(one(|a| a.load(Width::Dw, r, m)), format!("mov {}, qword ptr {mt}", N64[i]));
                    assert_eq!(one(|a| a.load_sx(Width::B, r, m)), format!("movsx {}, byte ptr {mt}", N64[i]));
                    assert_eq!(one(|a| a.load_sx(Width::H, r, m)), format!("movsx {}, word ptr {mt}", N64[i]));
                    assert_eq!(one(|a| a.load_sx(Width::W, r, m)), format!("movsxd {}, dword ptr {mt}", N64[i]));
                    assert_eq!(one(|a| a.store(Width::B, m, r)), format!("mov byte ptr {mt}, {}", N8[i]));
                    assert_eq!(one(|a| a.store(Width::H, m, r)), format!("mov word ptr {mt}, {}", N16[i]));
                    assert_eq!(one(|a| a.store(Width::W, m, r)), format!("mov dword ptr {mt}, {}", N32[i]));
                    assert_eq!(one(|a| a.store(Width::Dw, m, r)), format!("mov qword ptr {mt}, {}", N64[i]));
                    assert_eq!(one(|a| a.lea(r, m)), format!("lea {}, {mt}", N64[i]));
                    for imm in [64, 0x8000] {
                        assert_eq!(
                            one(|a| a.imul_rmi(r, m, imm)),
                            format!("imul {}, qword ptr {mt}, {imm:#x}", N64[i])
                        );
                    }
                    for w in [false, true] {
                        let rn = n(w, r);
                        let sz = if w { "qword ptr " } else { "dword ptr " };
                        let mt = format!("{sz}{mt}");
                        assert_eq!(one(|a| a.xadd(w, m, r)), format!("xadd {mt}, {rn}"));
                        assert_eq!(one(|a| a.xchg_mr(w, m, r)), format!("xchg {mt}, {rn}"));
                        assert_eq!(one(|a| a.cmpxchg(w, m, r)), format!("cmpxchg {mt}, {rn}"));
                        assert_eq!(one(|a| a.alu_mr(Alu::Or, w, m, r)), format!("or {mt}, {rn}"));
                        assert_eq!(
                            one(|a| {
                                a.lock();
                                a.alu_mr(Alu::Add, w, m, r)
                            }),
                            format!("lock add {mt}, {rn}")
                        );
                    }
                }
                assert_eq!(one(|a| a.store_imm(Width::B, m, -1)), format!("mov byte ptr {mt}, 0xff"));
                assert_eq!(one(|a| a.store_imm(Width::H, m, 0x1234)), format!("mov word ptr {mt}, 0x1234"));
                assert_eq!(one(|a| a.store_imm(Width::W, m, -2)), format!("mov dword ptr {mt}, 0xfffffffe"));
                assert_eq!(one(|a| a.store_imm(Width::Dw, m, -2)), format!("mov qword ptr {mt}, 0xfffffffffffffffe"));
            }
        }
        assert_eq!(
            one(|a| a.load(Width::Dw, Reg::R10, Mem::indexed8(Reg::R10, Reg::R11))),
            "mov r10, qword ptr [r10+r11*8]"
        );
        assert_eq!(
            one(|a| a.load(Width::Dw, Reg::RAX, Mem::indexed8(Reg::R13, Reg::RBP))),
            "mov rax, qword ptr [r13+rbp*8]"
        );
        assert_eq!(
            one(|a| a.load(Width::Dw, Reg::RAX, Mem::indexed8(Reg::RSP, Reg::RCX))),
            "mov rax, qword ptr [rsp+rcx*8]"
        );
        for &r in &ALL {
            if r == Reg::RSP {
                continue;
            }
            let (r64, r32) = (N64[r.0 as usize], N32[r.0 as usize]);
            assert_eq!(one(|a| a.lea(r, Mem::indexed(r, r, 1))), format!("lea {r64}, [{r64}+{r64}*2]"));
            assert_eq!(one(|a| a.lea32(r, Mem::indexed(r, r, 3))), format!("lea {r32}, [{r64}+{r64}*8]"));
            assert_eq!(one(|a| a.lea(Reg::R11, Mem::indexed(r, r, 2))), format!("lea r11, [{r64}+{r64}*4]"));
        }
    }

    #[test]
    fn jumps() {
        assert_eq!(one(|a| a.jmp_rel8(-2)), "jmp 0x0");
        assert_eq!(one(|a| a.jmp_rel32(0x100)), "jmp 0x105");
        assert_eq!(one(|a| a.call_rel32(-5)), "call 0x0");
        assert_eq!(one(|a| a.jcc_rel8(Cond::E, 4)), "je 0x6");
        assert_eq!(one(|a| a.jcc_rel32(Cond::G, 4)), "jg 0xa");
        for (c, m) in [
            (Cond::B, "jb"),
            (Cond::Ae, "jae"),
            (Cond::E, "je"),
            (Cond::Ne, "jne"),
            (Cond::Be, "jbe"),
            (Cond::A, "ja"),
            (Cond::L, "jl"),
            (Cond::Ge, "jge"),
            (Cond::Le, "jle"),
            (Cond::G, "jg"),
        ] {
            assert_eq!(one(|a| a.jcc_rel8(c, 0)), format!("{m} 0x2"));
        }
        let mut a = Asm::new();
        let f = a.jump_fwd(Some(Cond::Ne));
        a.int3();
        a.bind(f);
        a.jcc_back(Cond::E, 0);
        assert!(!a.overflowed());
        assert_eq!(dis(a.code()), vec!["jne 0x3", "int3", "je 0x0"]);
        let mut a = Asm::new();
        let f = a.jump_fwd(None);
        for _ in 0..200 {
            a.int3();
        }
        a.bind(f);
        assert!(a.overflowed());
    }
}
