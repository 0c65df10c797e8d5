//! Differential testing: random valid programs, run by the interpreter and by the JIT, must
//! end with the same r0 (or the same error) and leave the same bytes in their memory buffer.
//!
//! The generator keeps these invariants so that both executors have one defined answer:
//! - r9 holds the address of the buffer (in every function; a callee sets it from r1) and is
//!   never overwritten except by a callee's epilogue, which clobbers r6-r9 on purpose;
//! - r0-r8 hold scalars only: a register that holds an address (a temporary of address
//!   arithmetic) counts as undefined until it is written with a scalar again, and no register is
//!   read before it is written (registers r1-r5 count as undefined after every call);
//! - every memory access is in bounds: the first `BUF_LEN` bytes of the buffer or one of two
//!   64-byte windows of the frame's stack, which every function fills in its prologue before
//!   it reads them; computed addresses are masked into range. After those bytes, the main
//!   function's epilogue dumps its registers and stack windows; callees fold theirs into r0;
//! - loops have a counter register no instruction in their body writes, so every program ends.
//!
//! Environment:
//! - `DIFF_SEED=N` (decimal or 0x-hex): the seed of the first case (case i uses seed N + i);
//! - `DIFF_COUNT=N`: number of cases (default 10000; the validity test runs 2000 by default);
//! - `DIFF_PRINT=1`: print each program before running it.
//!
//! The generator also feeds the verifier (`verifier_judges_mutants_of_generated_programs`):
//! its programs, mutated into mostly invalid ones, are verified as syscall programs (whose
//! context is the buffer); the verifier must never panic, and every program it accepts must
//! run in both executors without an error.
//!
//! A mismatch prints the case seed, both outcomes and the program; `DIFF_SEED=<seed>
//! DIFF_COUNT=1` reproduces it. A crash of JIT code (a signal) prints the seed before the
//! process dies.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Once};

use userbpf_isa::disasm::format_insn;
use userbpf_isa::*;
use userbpf_vm::{Helper, HelperRegistry, Interpreter, JitProgram, LoadOptions, Program, Region, VmError};

// ---------------------------------------------------------------------------------------------
// Configuration

/// Bytes of the buffer the program works on.
const BUF_LEN: usize = 256;
/// After them, where the main function's epilogue stores its registers r0-r8 (those that hold
/// scalars) and then its two stack windows, so that a mismatch names what differs.
const DUMP: usize = BUF_LEN;
const DUMP_STACK: usize = DUMP + 9 * 8;
const MEM_LEN: usize = DUMP_STACK + 128;
/// An odd multiplier for folding values into r0.
const FOLD: i32 = 0x9e37_79b1_u32 as i32;
const DEFAULT_SEED: u64 = 0x005e_ed0f_d1ff;
const DEFAULT_COUNT: u64 = 10_000;
/// Most loop iterations nested around any instruction (product of the counts).
const MAX_MULT: u64 = 64;
/// A call is generated only while the function's estimated executed instructions stay below this.
const CALL_COST_CAP: u64 = 3000;

const HELPER_MIX: u32 = 100;
const HELPER_CONST: u32 = 101;
const CONST_VALUE: u64 = 0x0123_4567_89ab_cdef;
/// Helper ids `callx` may name that are not registered.
const UNREGISTERED_IDS: [u64; 6] = [102, 0, 99, 0x1_0000_0064, u64::MAX, 1 << 16];

unsafe extern "C" fn helper_mix(a: u64, b: u64, c: u64, d: u64, e: u64) -> u64 {
    let mut x = a
        .wrapping_mul(0x9e37_79b9_7f4a_7c15)
        .wrapping_add(b.wrapping_mul(0xc2b2_ae3d_27d4_eb4f))
        .wrapping_add(c.wrapping_mul(0x1656_67b1_9e37_79f9))
        .wrapping_add(d.wrapping_mul(0x85eb_ca77_c2b2_ae63))
        .wrapping_add(e.wrapping_mul(0x27d4_eb2f_1656_67c5));
    x ^= x >> 29;
    x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    // The System V ABI has the stack 16-byte aligned at a call; the compiler places this
    // 16-aligned local relative to the stack pointer assuming so. If a caller misaligned the
    // stack, the result shows it.
    let probe = 0u128;
    let misalign = std::hint::black_box(&probe) as *const u128 as usize as u64 & 15;
    (x ^ (x >> 32)) ^ (misalign << 56)
}

unsafe extern "C" fn helper_const(_: u64, _: u64, _: u64, _: u64, _: u64) -> u64 {
    CONST_VALUE
}

fn load_options() -> LoadOptions {
    let mut reg = HelperRegistry::new();
    reg.register(Helper { id: HELPER_MIX, name: "test_mix", func: helper_mix, may_exit: false });
    reg.register(Helper { id: HELPER_CONST, name: "test_const", func: helper_const, may_exit: false });
    LoadOptions { helpers: Arc::new(reg), memory: None, allow_callx: true }
}

// ---------------------------------------------------------------------------------------------
// Draws of interesting values from the shared PRNG

use userbpf_testutil::Rng;

/// Values that hit the edge cases of ALU, shift and comparison instructions more often than
/// uniform draws would.
trait Interesting {
    fn interesting_u64(&mut self) -> u64;
    fn interesting_i32(&mut self) -> i32;
}

impl Interesting for Rng {
    fn interesting_u64(&mut self) -> u64 {
        match self.below(16) {
            0 => 0,
            1 => 1,
            2 => u64::MAX,
            3 => i64::MIN as u64,
            4 => i64::MAX as u64,
            5 => 0x8000_0000,
            6 => 0xffff_ffff,
            7 => 0xffff_ffff_8000_0000,
            8 => 0x1_0000_0000,
            9 | 10 => self.below(70),
            11 => self.next_u64() as u32 as u64,
            12 => self.next_u64() as i32 as i64 as u64,
            13 => self.pick(&[0x7f, 0x80, 0xff, 0x7fff, 0x8000, 0xffff, 0x8080_8080_8080_8080]),
            _ => self.next_u64(),
        }
    }
    fn interesting_i32(&mut self) -> i32 {
        match self.below(12) {
            0 => 0,
            1 => 1,
            2 => -1,
            3 => i32::MIN,
            4 => i32::MAX,
            5 | 6 => self.below(70) as i32,
            7 => -(self.below(70) as i32),
            8 => self.pick(&[0x7f, 0x80, 0xff, 0x7fff, 0x8000, 0xffff, 0x8000_0001u32 as i32]),
            _ => self.next_u64() as i32,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Generator

/// Registers that may hold data.
const DATA: u16 = 0x1ff;
const ARGS: u16 = 0b11_1110;
const CALLEE_SAVED: u16 = 0b1_1100_0000;
const ALU_OPS: [u8; 12] =
    [BPF_ADD, BPF_SUB, BPF_MUL, BPF_DIV, BPF_OR, BPF_AND, BPF_LSH, BPF_RSH, BPF_MOD, BPF_XOR, BPF_MOV, BPF_ARSH];
const JMP_OPS: [u8; 11] =
    [BPF_JEQ, BPF_JGT, BPF_JGE, BPF_JSET, BPF_JNE, BPF_JSGT, BPF_JSGE, BPF_JLT, BPF_JLE, BPF_JSLT, BPF_JSLE];
const SIZES: [u8; 4] = [BPF_B, BPF_H, BPF_W, BPF_DW];
const ATOMIC_OPS: [i32; 10] =
    [0x00, 0x40, 0x50, 0xa0, BPF_FETCH, 0x40 | BPF_FETCH, 0x50 | BPF_FETCH, 0xa0 | BPF_FETCH, BPF_XCHG, BPF_CMPXCHG];

fn bit(r: u8) -> u16 {
    1 << r
}

fn size_bytes(size: u8) -> i64 {
    match size {
        BPF_B => 1,
        BPF_H => 2,
        BPF_W => 4,
        _ => 8,
    }
}

/// Where an access goes: the base register and the allowed range of offsets from it.
#[derive(Clone, Copy)]
enum Area {
    Buf,
    StackHi,
    StackLo,
}

impl Area {
    /// (base register, lowest offset, one past the highest).
    fn bounds(self) -> (u8, i64, i64) {
        match self {
            Area::Buf => (9, 0, BUF_LEN as i64),
            Area::StackHi => (10, -64, 0),
            Area::StackLo => (10, -512, -448),
        }
    }
}

/// Program-wide choices.
struct Opts {
    /// Whether this program may contain a `callx` to an unregistered id.
    bad_callx: bool,
}

/// What a caller needs to know of a function it may call.
#[derive(Clone, Copy)]
struct Callee {
    index: usize,
    /// Upper estimate of the instructions one call executes.
    cost: u64,
    /// Whether the function takes in r2 the address of the caller's upper stack window
    /// (64 bytes below the caller's r10), which it reads and writes.
    stack_arg: bool,
}

struct Func {
    code: Vec<Insn>,
    /// (index in `code`, called function) of each bpf-to-bpf call.
    calls: Vec<(usize, usize)>,
    /// Upper estimate of the instructions one call of the function executes.
    cost: u64,
    stack_arg: bool,
    /// Functions it calls at its top level (whenever it runs, unless a `callx` stops the run).
    always_calls: Vec<usize>,
}

struct FnGen<'a> {
    rng: &'a mut Rng,
    opts: &'a Opts,
    /// Functions this one may call.
    callees: Vec<Callee>,
    /// Whether this function takes a pointer into its caller's stack in r2.
    stack_arg: bool,
    code: Vec<Insn>,
    calls: Vec<(usize, usize)>,
    always_calls: Vec<usize>,
    /// Registers holding a scalar that may be read.
    defined: u16,
    /// Registers that must not be written: r9, r10 and the counters of the enclosing loops.
    reserved: u16,
    /// Registers holding an address in use by the instruction being generated.
    busy: u16,
    stack_ready: bool,
    mult: u64,
    cost: u64,
    nest: u32,
    loop_depth: u32,
    max_loop_depth: u32,
}

impl<'a> FnGen<'a> {
    fn emit(&mut self, i: Insn) -> usize {
        self.code.push(i);
        self.cost += self.mult;
        self.code.len() - 1
    }

    fn lddw(&mut self, dst: u8, v: u64) {
        self.emit(Insn::new(OP_LDDW, dst, 0, 0, v as u32 as i32));
        self.emit(Insn::new(0, 0, 0, 0, (v >> 32) as u32 as i32));
        self.defined |= bit(dst);
    }

    fn writable(&self) -> u16 {
        DATA & !self.reserved & !self.busy
    }

    fn pick_mask(&mut self, m: u16) -> Option<u8> {
        let n = m.count_ones();
        if n == 0 {
            return None;
        }
        let mut k = self.rng.below(n as u64);
        for r in 0..16u8 {
            if m & bit(r) != 0 {
                if k == 0 {
                    return Some(r);
                }
                k -= 1;
            }
        }
        unreachable!()
    }

    fn pick_writable(&mut self) -> u8 {
        let m = self.writable();
        self.pick_mask(m).expect("r0-r5 are always writable")
    }

    /// A register holding a scalar (initialising one if there is none).
    fn pick_defined(&mut self) -> u8 {
        match self.pick_mask(self.defined & !self.busy) {
            Some(r) if !self.rng.chance(1, 16) => r,
            _ => {
                let r = self.pick_writable();
                self.init_reg(r);
                r
            }
        }
    }

    /// A register that holds a scalar and may be written.
    fn pick_defined_writable(&mut self) -> u8 {
        match self.pick_mask(self.defined & self.writable()) {
            Some(r) => r,
            None => {
                let r = self.pick_writable();
                self.init_reg(r);
                r
            }
        }
    }

    fn ensure_defined(&mut self, r: u8) {
        if self.defined & bit(r) == 0 {
            self.init_reg(r);
        }
    }

    fn pick_size(&mut self) -> u8 {
        self.rng.pick(&SIZES)
    }

    /// Writes a fresh scalar into `r`.
    fn init_reg(&mut self, r: u8) {
        debug_assert!(self.writable() & bit(r) != 0, "init of reserved r{r}");
        match self.rng.below(if self.stack_ready { 7 } else { 6 }) {
            0 | 1 => {
                let imm = self.rng.interesting_i32();
                self.emit(Insn::new(BPF_ALU64 | BPF_K | BPF_MOV, r, 0, 0, imm));
            }
            2 => {
                let imm = self.rng.interesting_i32();
                self.emit(Insn::new(BPF_ALU | BPF_K | BPF_MOV, r, 0, 0, imm));
            }
            3 => {
                let v = self.rng.interesting_u64();
                self.lddw(r, v);
            }
            4 | 5 => {
                let size = self.pick_size();
                let sx = size != BPF_DW && self.rng.chance(1, 3);
                let off = self.rng.below(BUF_LEN as u64 - size_bytes(size) as u64 + 1) as i16;
                let mode = if sx { BPF_MEMSX } else { BPF_MEM };
                self.emit(Insn::new(BPF_LDX | mode | size, r, 9, off, 0));
            }
            _ => {
                let size = self.pick_size();
                let area = if self.rng.chance(1, 2) { Area::StackHi } else { Area::StackLo };
                let (_, lo, hi) = area.bounds();
                let off = self.rng.range(lo, hi - size_bytes(size)) as i16;
                self.emit(Insn::new(BPF_LDX | BPF_MEM | size, r, 10, off, 0));
            }
        }
        self.defined |= bit(r);
    }

    fn patch(&mut self, at: usize, target: usize) {
        let rel = target as i64 - (at as i64 + 1);
        let i = &mut self.code[at];
        if i.op == OP_JA32 {
            i.imm = rel as i32;
        } else {
            i.off = i16::try_from(rel).expect("jump offset fits in 16 bits");
        }
    }

    /// An unconditional jump (`ja` or `gotol`) to be patched.
    fn emit_goto(&mut self) -> usize {
        if self.rng.chance(1, 3) {
            self.emit(Insn::new(OP_JA32, 0, 0, 0, 0))
        } else {
            self.emit(Insn::new(OP_JA, 0, 0, 0, 0))
        }
    }

    /// A conditional jump on random operands, to be patched.
    fn emit_cond(&mut self) -> usize {
        let class = if self.rng.chance(1, 2) { BPF_JMP } else { BPF_JMP32 };
        let op = self.rng.pick(&JMP_OPS);
        let dst = self.pick_defined();
        if self.rng.chance(1, 2) {
            let imm = self.rng.interesting_i32();
            self.emit(Insn::new(class | BPF_K | op, dst, 0, 0, imm))
        } else {
            let src = if self.rng.chance(1, 8) { dst } else { self.pick_defined() };
            self.emit(Insn::new(class | BPF_X | op, dst, src, 0, 0))
        }
    }

    // --- statements ---

    fn block(&mut self, budget: usize) {
        let end = self.code.len() + budget;
        while self.code.len() < end {
            debug_assert_eq!(self.busy, 0);
            let room = end - self.code.len();
            self.stmt(room);
        }
    }

    fn sub_budget(&mut self, room: usize) -> usize {
        let cap = room.clamp(1, 24) as i64;
        self.rng.range(1, cap) as usize
    }

    fn stmt(&mut self, room: usize) {
        let w = self.rng.below(100);
        let can_nest = self.nest < 4 && room >= 3;
        match w {
            0..=27 => self.alu(),
            28..=31 => self.divmod_special(),
            32..=35 => {
                let r = self.pick_writable();
                self.init_reg(r);
            }
            36..=43 => self.unary(),
            44..=57 => self.mem(),
            58..=63 => self.atomic(),
            64..=70 if can_nest => {
                let b = self.sub_budget(room);
                self.if_block(b);
            }
            71..=73 if can_nest => {
                let b1 = self.sub_budget(room / 2);
                let b2 = self.sub_budget(room / 2);
                self.if_else(b1, b2);
            }
            74..=78 if can_nest && self.loop_depth < self.max_loop_depth => {
                let b = self.sub_budget(room);
                self.do_loop(b);
            }
            79..=80 => {
                let b = if self.rng.chance(1, 4) { 0 } else { self.sub_budget(room.min(8)) };
                self.dead_jump(b);
            }
            81..=85 => self.helper_call(),
            86..=91 if !self.callees.is_empty() => self.bpf_call(),
            92..=93 => self.callx(false),
            94 if self.opts.bad_callx && self.rng.chance(1, 3) => self.callx(true),
            _ => self.alu(),
        }
    }

    fn alu(&mut self) {
        let class = if self.rng.chance(1, 2) { BPF_ALU64 } else { BPF_ALU };
        let op = self.rng.pick(&ALU_OPS);
        let dst = self.pick_writable();
        if op != BPF_MOV {
            self.ensure_defined(dst);
        }
        let off = if (op == BPF_DIV || op == BPF_MOD) && self.rng.chance(1, 2) { 1 } else { 0 };
        if self.rng.chance(1, 2) {
            let imm = if matches!(op, BPF_LSH | BPF_RSH | BPF_ARSH) {
                match self.rng.below(6) {
                    0 | 1 => self.rng.below(32) as i32,
                    2 => self.rng.below(64) as i32,
                    3 => self.rng.pick(&[31, 32, 33, 63, 64, 65, 127, 128, -1, i32::MIN]),
                    _ => self.rng.interesting_i32(),
                }
            } else {
                self.rng.interesting_i32()
            };
            self.emit(Insn::new(class | BPF_K | op, dst, 0, off, imm));
        } else {
            let src = if self.rng.chance(1, 10) {
                self.ensure_defined(dst);
                dst
            } else {
                self.pick_defined()
            };
            // Shift amounts in and beyond the width.
            if matches!(op, BPF_LSH | BPF_RSH | BPF_ARSH)
                && src != dst
                && self.writable() & bit(src) != 0
                && self.rng.chance(1, 2)
            {
                let amount = self.rng.below(140) as i32;
                self.emit(Insn::new(BPF_ALU64 | BPF_K | BPF_MOV, src, 0, 0, amount));
            }
            self.emit(Insn::new(class | BPF_X | op, dst, src, off, 0));
        }
        self.defined |= bit(dst);
    }

    /// Division and modulo (signed and unsigned) by 0, 1 and -1, of INT_MIN and others.
    fn divmod_special(&mut self) {
        let is64 = self.rng.chance(1, 2);
        let class = if is64 { BPF_ALU64 } else { BPF_ALU };
        let op = if self.rng.chance(1, 2) { BPF_DIV } else { BPF_MOD };
        let off = if self.rng.chance(2, 3) { 1 } else { 0 };
        let dst = self.pick_writable();
        if self.rng.chance(1, 2) {
            if is64 {
                self.lddw(dst, i64::MIN as u64);
            } else {
                // Upper half garbage: the 32-bit op must ignore it.
                let v = 0x8000_0000 | (self.rng.next_u64() << 32);
                self.lddw(dst, v);
            }
        } else {
            self.ensure_defined(dst);
        }
        let divisor = self.rng.pick(&[0i32, -1, 1, -1, 0]);
        if self.rng.chance(1, 2) {
            self.emit(Insn::new(class | BPF_K | op, dst, 0, off, divisor));
        } else {
            let mut m = self.writable() & !bit(dst);
            if m == 0 {
                m = bit(dst);
            }
            let src = self.pick_mask(m).unwrap();
            match self.rng.below(4) {
                0 => self.lddw(src, 0xffff_ffff),
                1 => self.lddw(src, 0xdead_beef_0000_0000),
                _ => {
                    self.emit(Insn::new(BPF_ALU64 | BPF_K | BPF_MOV, src, 0, 0, divisor));
                }
            }
            self.defined |= bit(src);
            self.emit(Insn::new(class | BPF_X | op, dst, src, off, 0));
        }
        self.defined |= bit(dst);
    }

    /// neg, movsx, byte swaps.
    fn unary(&mut self) {
        let dst = self.pick_writable();
        match self.rng.below(3) {
            0 => {
                self.ensure_defined(dst);
                let class = if self.rng.chance(1, 2) { BPF_ALU64 } else { BPF_ALU };
                self.emit(Insn::new(class | BPF_K | BPF_NEG, dst, 0, 0, 0));
            }
            1 => {
                let src = self.pick_defined();
                let (class, off) = if self.rng.chance(1, 2) {
                    (BPF_ALU64, self.rng.pick(&[8i16, 16, 32]))
                } else {
                    (BPF_ALU, self.rng.pick(&[8i16, 16]))
                };
                self.emit(Insn::new(class | BPF_X | BPF_MOV, dst, src, off, 0));
            }
            _ => {
                self.ensure_defined(dst);
                let width = self.rng.pick(&[16, 32, 64]);
                let op = match self.rng.below(3) {
                    0 => BPF_ALU | BPF_END | BPF_TO_LE,
                    1 => BPF_ALU | BPF_END | BPF_TO_BE,
                    _ => BPF_ALU64 | BPF_END | BPF_K,
                };
                self.emit(Insn::new(op, dst, 0, 0, width));
            }
        }
        self.defined |= bit(dst);
    }

    /// An address for an access of `size` bytes aligned to `align`: (base register, offset).
    /// Either r9/r10 with an offset in range, or a temporary register computed from a scalar
    /// by masking and adding the base (marked busy; the caller frees it).
    fn address(&mut self, size: i64, align: i64, avoid: u16) -> (u8, i16) {
        let area = match self.rng.below(4) {
            0 | 1 => Area::Buf,
            2 => Area::StackHi,
            _ => Area::StackLo,
        };
        let (base, lo, hi) = area.bounds();
        let span = hi - lo - size;
        let aligned = |v: i64| v & !(align - 1);
        if self.rng.chance(2, 5) {
            let t = self.pick_mask(self.writable() & !avoid).expect("a temporary register");
            let s = self.pick_defined();
            if s != t {
                let class = if self.rng.chance(1, 4) { BPF_ALU } else { BPF_ALU64 };
                self.emit(Insn::new(class | BPF_X | BPF_MOV, t, s, 0, 0));
            }
            let m = aligned(self.rng.below(span as u64 + 1) as i64);
            let class = if self.rng.chance(1, 4) { BPF_ALU } else { BPF_ALU64 };
            self.emit(Insn::new(class | BPF_K | BPF_AND, t, 0, 0, m as i32));
            self.emit(Insn::new(BPF_ALU64 | BPF_X | BPF_ADD, t, base, 0, 0));
            self.defined &= !bit(t);
            self.busy |= bit(t);
            let mut extra = 0;
            if self.rng.chance(1, 3) {
                extra = aligned(self.rng.range(-64, 64));
                if self.rng.chance(1, 2) {
                    self.emit(Insn::new(BPF_ALU64 | BPF_K | BPF_ADD, t, 0, 0, extra as i32));
                } else {
                    self.emit(Insn::new(BPF_ALU64 | BPF_K | BPF_SUB, t, 0, 0, -extra as i32));
                }
            }
            let off = lo + aligned(self.rng.below((span - m) as u64 + 1) as i64) - extra;
            (t, off as i16)
        } else {
            let off = lo + aligned(self.rng.below(span as u64 + 1) as i64);
            (base, off as i16)
        }
    }

    fn release(&mut self) {
        self.busy = 0;
    }

    fn mem(&mut self) {
        let size = self.pick_size();
        let sb = size_bytes(size);
        let align = if self.rng.chance(1, 2) { sb } else { 1 };
        let (base, off) = self.address(sb, align, 0);
        match self.rng.below(5) {
            0 | 1 => {
                let dst = self.pick_mask((self.writable() | self.busy) & !self.reserved).unwrap();
                self.emit(Insn::new(BPF_LDX | BPF_MEM | size, dst, base, off, 0));
                self.release();
                self.defined |= bit(dst);
            }
            2 => {
                let size = if size == BPF_DW { BPF_W } else { size };
                let dst = self.pick_mask((self.writable() | self.busy) & !self.reserved).unwrap();
                self.emit(Insn::new(BPF_LDX | BPF_MEMSX | size, dst, base, off, 0));
                self.release();
                self.defined |= bit(dst);
            }
            3 => {
                let imm = self.rng.interesting_i32();
                self.emit(Insn::new(BPF_ST | BPF_MEM | size, base, 0, off, imm));
                self.release();
            }
            _ => {
                let src = self.pick_defined();
                self.emit(Insn::new(BPF_STX | BPF_MEM | size, base, src, off, 0));
                self.release();
            }
        }
    }

    fn atomic(&mut self) {
        let size = if self.rng.chance(1, 2) { BPF_W } else { BPF_DW };
        let sb = size_bytes(size);
        let op = self.rng.pick(&ATOMIC_OPS);
        if op == BPF_CMPXCHG {
            self.ensure_defined(0);
        }
        let (base, off) = self.address(sb, sb, bit(0));
        if op == BPF_CMPXCHG && self.rng.chance(1, 2) {
            // Make the comparison succeed.
            self.emit(Insn::new(BPF_LDX | BPF_MEM | size, 0, base, off, 0));
        }
        let src =
            if op & BPF_FETCH != 0 && op != BPF_CMPXCHG { self.pick_defined_writable() } else { self.pick_defined() };
        self.emit(Insn::new(BPF_STX | BPF_ATOMIC | size, base, src, off, op));
        self.release();
        if op == BPF_CMPXCHG {
            self.defined |= bit(0);
        }
    }

    fn if_block(&mut self, budget: usize) {
        let j = self.emit_cond();
        let before = self.defined;
        self.nest += 1;
        self.block(budget);
        self.nest -= 1;
        let end = self.code.len();
        self.patch(j, end);
        self.defined &= before;
    }

    fn if_else(&mut self, b1: usize, b2: usize) {
        let j = self.emit_cond();
        let before = self.defined;
        self.nest += 1;
        self.block(b1);
        let after_then = self.defined;
        let g = self.emit_goto();
        let else_start = self.code.len();
        self.patch(j, else_start);
        self.defined = before;
        self.block(b2);
        self.nest -= 1;
        let end = self.code.len();
        self.patch(g, end);
        self.defined &= after_then;
    }

    fn do_loop(&mut self, budget: usize) {
        let free = CALLEE_SAVED & !self.reserved;
        let max_n = (MAX_MULT / self.mult).min(8);
        let Some(c) = self.pick_mask(free).filter(|_| max_n >= 2) else {
            return self.alu();
        };
        let n = self.rng.range(1, max_n as i64) as i32;
        let class = if self.rng.chance(1, 2) { BPF_ALU64 } else { BPF_ALU };
        self.emit(Insn::new(class | BPF_K | BPF_MOV, c, 0, 0, n));
        self.defined |= bit(c);
        self.reserved |= bit(c);
        let before = self.defined;
        let top = self.code.len();
        let top_test = self.rng.chance(1, 3);
        let exit_jump = if top_test {
            let class = if self.rng.chance(1, 2) { BPF_JMP } else { BPF_JMP32 };
            let op = self.rng.pick(&[BPF_JEQ, BPF_JLE, BPF_JSLE]);
            Some(self.emit(Insn::new(class | BPF_K | op, c, 0, 0, 0)))
        } else {
            None
        };
        self.mult *= n as u64;
        self.loop_depth += 1;
        self.nest += 1;
        self.block(budget);
        // Whatever the body left undefined that was defined at the top, define again.
        let lost = before & !self.defined;
        for r in 0..9u8 {
            if lost & bit(r) != 0 {
                self.init_reg(r);
            }
        }
        match self.rng.below(4) {
            0 => self.emit(Insn::new(BPF_ALU64 | BPF_K | BPF_ADD, c, 0, 0, -1)),
            1 => self.emit(Insn::new(BPF_ALU64 | BPF_K | BPF_SUB, c, 0, 0, 1)),
            2 => self.emit(Insn::new(BPF_ALU | BPF_K | BPF_SUB, c, 0, 0, 1)),
            _ => self.emit(Insn::new(BPF_ALU | BPF_K | BPF_ADD, c, 0, 0, -1)),
        };
        if let Some(e) = exit_jump {
            let g = self.emit_goto();
            self.patch(g, top);
            let end = self.code.len();
            self.patch(e, end);
        } else {
            let class = if self.rng.chance(1, 2) { BPF_JMP } else { BPF_JMP32 };
            let (op, imm) = self.rng.pick(&[(BPF_JNE, 0), (BPF_JGT, 0), (BPF_JSGT, 0), (BPF_JGE, 1), (BPF_JSGE, 1)]);
            let j = self.emit(Insn::new(class | BPF_K | op, c, 0, 0, imm));
            self.patch(j, top);
        }
        self.nest -= 1;
        self.loop_depth -= 1;
        self.mult /= n as u64;
        self.reserved &= !bit(c);
        if top_test {
            self.defined = before;
        }
    }

    /// `ja`/`gotol` over code that never runs.
    fn dead_jump(&mut self, budget: usize) {
        let g = self.emit_goto();
        let (defined, nest) = (self.defined, self.nest);
        self.nest = 4; // keep dead code flat
        self.block(budget);
        self.nest = nest;
        let end = self.code.len();
        self.patch(g, end);
        self.defined = defined;
    }

    fn after_call(&mut self) {
        self.defined = (self.defined & !ARGS) | bit(0);
    }

    fn set_args(&mut self, from: u8) {
        let fresh = self.rng.chance(1, 4);
        for r in from..=5 {
            if fresh && self.rng.chance(1, 2) {
                self.init_reg(r);
            } else {
                self.ensure_defined(r);
            }
        }
    }

    fn helper_call(&mut self) {
        self.set_args(1);
        let id = if self.rng.chance(3, 4) { HELPER_MIX } else { HELPER_CONST };
        self.emit(Insn::new(OP_CALL, 0, 0, 0, id as i32));
        self.after_call();
    }

    fn bpf_call(&mut self) {
        let callee = self.rng.pick(&self.callees);
        if self.cost + self.mult * callee.cost > CALL_COST_CAP {
            return self.alu();
        }
        self.call_to(callee);
    }

    fn call_to(&mut self, callee: Callee) {
        if self.nest == 0 {
            self.always_calls.push(callee.index);
        }
        if callee.stack_arg {
            self.set_args(3);
            self.emit(Insn::new(BPF_ALU64 | BPF_X | BPF_MOV, 2, 10, 0, 0));
            self.emit(Insn::new(BPF_ALU64 | BPF_K | BPF_ADD, 2, 0, 0, -64));
            self.defined &= !bit(2);
        } else {
            self.set_args(2);
        }
        self.emit(Insn::new(BPF_ALU64 | BPF_X | BPF_MOV, 1, 9, 0, 0));
        let pc = self.emit(Insn::new(OP_CALL, 0, BPF_PSEUDO_CALL, 0, 0));
        self.calls.push((pc, callee.index));
        self.cost += self.mult * callee.cost;
        self.after_call();
    }

    fn callx(&mut self, unregistered: bool) {
        let r = self.pick_writable();
        self.set_args(1);
        let id = if unregistered {
            self.rng.pick(&UNREGISTERED_IDS)
        } else if self.rng.chance(1, 2) {
            HELPER_MIX as u64
        } else {
            HELPER_CONST as u64
        };
        if id > i32::MAX as u64 || self.rng.chance(1, 4) {
            self.lddw(r, id);
        } else {
            self.emit(Insn::new(BPF_ALU64 | BPF_K | BPF_MOV, r, 0, 0, id as i32));
            self.defined |= bit(r);
        }
        self.emit(Insn::new(OP_CALLX, r, 0, 0, 0));
        self.after_call();
    }

    // --- prologue and epilogue ---

    fn prologue(&mut self, is_main: bool) {
        self.emit(Insn::new(BPF_ALU64 | BPF_X | BPF_MOV, 9, 1, 0, 0));
        // Main: r1 = buffer, r2 = its length. Callee: r1 = buffer, r2-r5 arguments (r2 may
        // be the address of 64 bytes of the caller's stack).
        self.defined = if is_main { bit(2) } else { 0b11_1100 };
        if self.stack_arg {
            self.defined &= !bit(2);
            self.busy = bit(2);
            for _ in 0..self.rng.range(1, 4) {
                let size = self.pick_size();
                let sb = size_bytes(size);
                let off = self.rng.below(64 - sb as u64 + 1) as i16;
                match self.rng.below(4) {
                    0 | 1 => {
                        let dst = self.pick_writable();
                        self.emit(Insn::new(BPF_LDX | BPF_MEM | size, dst, 2, off, 0));
                        self.defined |= bit(dst);
                    }
                    2 => {
                        let src = self.pick_defined();
                        self.emit(Insn::new(BPF_STX | BPF_MEM | size, 2, src, off, 0));
                    }
                    _ => {
                        let op = self.rng.pick(&[0x00, BPF_FETCH, BPF_XCHG]);
                        let src = self.pick_defined_writable();
                        let off = off & !7 & 0x38;
                        self.emit(Insn::new(BPF_STX | BPF_ATOMIC | BPF_DW, 2, src, off, op));
                    }
                }
            }
            self.busy = 0;
        }
        // Fill both stack windows, 8 bytes at a time (sometimes in smaller pieces).
        let mut slots: Vec<i64> = (0..8).map(|k| -64 + 8 * k).chain((0..8).map(|k| -512 + 8 * k)).collect();
        for i in (1..slots.len()).rev() {
            let j = self.rng.below(i as u64 + 1) as usize;
            slots.swap(i, j);
        }
        for slot in slots {
            let (size, n) = self.rng.pick(&[(BPF_DW, 1), (BPF_DW, 1), (BPF_DW, 1), (BPF_W, 2), (BPF_H, 4), (BPF_B, 8)]);
            let step = 8 / n;
            for k in 0..n {
                let off = (slot + k * step) as i16;
                if self.rng.chance(1, 2) {
                    let imm = self.rng.interesting_i32();
                    self.emit(Insn::new(BPF_ST | BPF_MEM | size, 10, 0, off, imm));
                } else {
                    let src = self.pick_defined();
                    self.emit(Insn::new(BPF_STX | BPF_MEM | size, 10, src, off, 0));
                }
            }
        }
        self.stack_ready = true;
        for r in 0..9u8 {
            if self.rng.chance(2, 3) && (self.defined & bit(r) == 0 || self.rng.chance(1, 4)) {
                self.init_reg(r);
            }
        }
    }

    fn epilogue(&mut self, is_main: bool) {
        let windows = || (0..8).map(|k| -64 + 8 * k).chain((0..8).map(|k| -512 + 8 * k));
        if is_main {
            // Dump the registers that hold scalars and the stack windows after the buffer.
            for r in 0..9u8 {
                if self.defined & bit(r) != 0 {
                    self.emit(Insn::new(BPF_STX | BPF_MEM | BPF_DW, 9, r, (DUMP + 8 * r as usize) as i16, 0));
                }
            }
            for (k, slot) in windows().enumerate() {
                let t = self.pick_writable();
                self.emit(Insn::new(BPF_LDX | BPF_MEM | BPF_DW, t, 10, slot as i16, 0));
                self.emit(Insn::new(BPF_STX | BPF_MEM | BPF_DW, 9, t, (DUMP_STACK + 8 * k) as i16, 0));
                self.defined |= bit(t);
            }
            self.ensure_defined(0);
        } else {
            // Fold the registers (and sometimes the stack windows) into the result.
            self.ensure_defined(0);
            for r in 1..9u8 {
                if self.defined & bit(r) != 0 {
                    let op = self.rng.pick(&[BPF_ADD, BPF_XOR, BPF_SUB]);
                    self.emit(Insn::new(BPF_ALU64 | BPF_K | BPF_MUL, 0, 0, 0, FOLD));
                    self.emit(Insn::new(BPF_ALU64 | BPF_X | op, 0, r, 0, 0));
                }
            }
            if self.rng.chance(1, 2) {
                for slot in windows() {
                    let t = self.pick_mask(self.writable() & !bit(0)).unwrap();
                    self.emit(Insn::new(BPF_LDX | BPF_MEM | BPF_DW, t, 10, slot as i16, 0));
                    self.emit(Insn::new(BPF_ALU64 | BPF_K | BPF_MUL, 0, 0, 0, FOLD));
                    self.emit(Insn::new(BPF_ALU64 | BPF_X | BPF_ADD, 0, t, 0, 0));
                }
            }
            // Clobber the callee-saved registers: the caller's must survive.
            for r in 6..10u8 {
                if self.rng.chance(3, 4) {
                    let imm = self.rng.next_u64() as i32;
                    self.emit(Insn::new(BPF_ALU64 | BPF_K | BPF_MOV, r, 0, 0, imm));
                }
            }
        }
        self.emit(Insn::new(OP_EXIT, 0, 0, 0, 0));
    }
}

/// `always[j]`: what function j calls at its top level (for functions after this one).
fn gen_function(
    rng: &mut Rng,
    opts: &Opts,
    is_main: bool,
    stack_arg: bool,
    callees: Vec<Callee>,
    always: &[Vec<usize>],
    budget: usize,
) -> Func {
    let mut g = FnGen {
        rng,
        opts,
        callees,
        stack_arg,
        code: Vec::new(),
        calls: Vec::new(),
        always_calls: Vec::new(),
        defined: 0,
        reserved: bit(9) | bit(10),
        busy: 0,
        stack_ready: false,
        mult: 1,
        cost: 0,
        nest: 0,
        loop_depth: 0,
        max_loop_depth: if is_main { 2 } else { 1 },
    };
    g.prologue(is_main);
    g.block(budget);
    if is_main {
        // Call every function that no call made whenever main runs reaches, so that all
        // functions run.
        let mut reached = vec![false; always.len()];
        let mut todo = g.always_calls.clone();
        for callee in g.callees.clone() {
            while let Some(f) = todo.pop() {
                if !reached[f] {
                    reached[f] = true;
                    todo.extend_from_slice(&always[f]);
                }
            }
            if !reached[callee.index] {
                g.call_to(callee);
                todo.push(callee.index);
            }
        }
    }
    g.epilogue(is_main);
    Func { code: g.code, calls: g.calls, cost: g.cost, stack_arg, always_calls: g.always_calls }
}

/// A random valid program.
fn generate(rng: &mut Rng) -> Vec<Insn> {
    let opts = Opts { bad_callx: rng.chance(1, 12) };
    let nsub = match rng.below(10) {
        0..=3 => 0,
        4..=8 => rng.range(1, 3) as usize,
        _ => rng.range(4, 7) as usize,
    };
    // Functions 1..=nsub; function k calls only functions above k (no recursion, at most
    // 8 frames). Generate callees first so their costs are known.
    let mut funcs: Vec<Option<Func>> = (0..=nsub).map(|_| None).collect();
    for k in (0..=nsub).rev() {
        let callees: Vec<Callee> = (k + 1..=nsub)
            .map(|j| {
                let f = funcs[j].as_ref().unwrap();
                Callee { index: j, cost: f.cost, stack_arg: f.stack_arg }
            })
            .collect();
        let budget = if k == 0 { rng.range(5, 120) } else { rng.range(3, 40) } as usize;
        let stack_arg = k > 0 && rng.chance(1, 3);
        let always: Vec<Vec<usize>> =
            funcs.iter().map(|f| f.as_ref().map_or(Vec::new(), |f| f.always_calls.clone())).collect();
        funcs[k] = Some(gen_function(rng, &opts, k == 0, stack_arg, callees, &always, budget));
    }
    let funcs: Vec<Func> = funcs.into_iter().map(Option::unwrap).collect();
    let mut starts = Vec::new();
    let mut code = Vec::new();
    for f in &funcs {
        starts.push(code.len());
        code.extend_from_slice(&f.code);
    }
    for (k, f) in funcs.iter().enumerate() {
        for &(pc, callee) in &f.calls {
            let at = starts[k] + pc;
            code[at].imm = (starts[callee] as i64 - (at as i64 + 1)) as i32;
        }
    }
    code
}

/// The initial buffer: random bytes with some interesting 8-byte values.
fn gen_buffer(rng: &mut Rng) -> Vec<u8> {
    let mut buf = vec![0u8; MEM_LEN];
    for chunk in buf.chunks_exact_mut(8) {
        let v = if rng.chance(1, 3) { rng.interesting_u64() } else { rng.next_u64() };
        chunk.copy_from_slice(&v.to_le_bytes());
    }
    buf
}

// ---------------------------------------------------------------------------------------------
// Printing

fn listing(insns: &[Insn]) -> String {
    let mut out = String::new();
    let mut pc = 0;
    while pc < insns.len() {
        let i = insns[pc];
        let hex: String = i.to_bytes().iter().map(|b| format!("{b:02x}")).collect();
        out += &format!("{pc:4}: {hex}  {}\n", format_insn(i, insns.get(pc + 1).copied()));
        if i.is_lddw() && pc + 1 < insns.len() {
            let h: String = insns[pc + 1].to_bytes().iter().map(|b| format!("{b:02x}")).collect();
            out += &format!("{:4}: {h}\n", pc + 1);
            pc += 1;
        }
        pc += 1;
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Running

static CURRENT_SEED: AtomicU64 = AtomicU64::new(0);

/// On a crash of JIT code, print the seed of the case before the process dies.
extern "C" fn on_fatal_signal(sig: libc::c_int) {
    let seed = CURRENT_SEED.load(Ordering::Relaxed);
    let mut msg = [0u8; 160];
    let mut n = 0;
    let mut put = |s: &[u8]| {
        for &b in s {
            if n < msg.len() {
                msg[n] = b;
                n += 1;
            }
        }
    };
    put(b"\ndifferential: fatal signal ");
    let sig_digits = [b'0' + (sig / 10 % 10) as u8, b'0' + (sig % 10) as u8];
    put(&sig_digits);
    put(b" while running the case of seed 0x");
    let mut hex = [0u8; 16];
    for (k, h) in hex.iter_mut().enumerate() {
        let d = ((seed >> (60 - 4 * k)) & 0xf) as u8;
        *h = if d < 10 { b'0' + d } else { b'a' + d - 10 };
    }
    put(&hex);
    put(b"; reproduce with DIFF_SEED=0x");
    put(&hex);
    put(b" DIFF_COUNT=1\n");
    // SAFETY: write(2) is async-signal-safe; the buffer is valid for n bytes.
    unsafe {
        libc::write(2, msg.as_ptr().cast(), n);
    }
    // SA_RESETHAND restored the default action: returning re-executes the faulting
    // instruction, which now ends the process.
}

fn install_crash_reporter() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        for sig in [libc::SIGSEGV, libc::SIGBUS, libc::SIGILL, libc::SIGFPE, libc::SIGTRAP] {
            // SAFETY: installing a handler that only calls async-signal-safe functions.
            unsafe {
                let mut sa: libc::sigaction = std::mem::zeroed();
                sa.sa_sigaction = on_fatal_signal as extern "C" fn(libc::c_int) as usize;
                sa.sa_flags = libc::SA_ONSTACK | libc::SA_RESETHAND;
                libc::sigemptyset(&mut sa.sa_mask);
                libc::sigaction(sig, &sa, std::ptr::null_mut());
            }
        }
    });
}

struct Case {
    seed: u64,
    insns: Vec<Insn>,
    mem: Vec<u8>,
}

impl Case {
    fn new(seed: u64) -> Case {
        let mut rng = Rng::new(seed);
        let insns = generate(&mut rng);
        let mem = gen_buffer(&mut rng);
        Case { seed, insns, mem }
    }

    fn report(&self, what: &str) -> String {
        format!(
            "case seed {:#x} (reproduce: DIFF_SEED={:#x} DIFF_COUNT=1): {what}\nprogram ({} slots):\n{}",
            self.seed,
            self.seed,
            self.insns.len(),
            listing(&self.insns)
        )
    }
}

/// The differing bytes of the two buffers; in the dump area, by register or stack slot.
fn mem_diff(a: &[u8], b: &[u8]) -> String {
    let mut out = Vec::new();
    let word = |m: &[u8], at: usize| u64::from_le_bytes(m[at..at + 8].try_into().unwrap());
    for k in (0..BUF_LEN).filter(|&k| a[k] != b[k]).take(16) {
        out.push(format!("byte {k}: interpreter {:#04x}, jit {:#04x}", a[k], b[k]));
    }
    for r in 0..9 {
        let at = DUMP + 8 * r;
        if a[at..at + 8] != b[at..at + 8] {
            out.push(format!("final r{r}: interpreter {:#x}, jit {:#x}", word(a, at), word(b, at)));
        }
    }
    for k in 0..16 {
        let at = DUMP_STACK + 8 * k;
        if a[at..at + 8] != b[at..at + 8] {
            let slot = if k < 8 { -64 + 8 * k as i64 } else { -512 + 8 * (k as i64 - 8) };
            out.push(format!("final stack [r10{slot}]: interpreter {:#x}, jit {:#x}", word(a, at), word(b, at)));
        }
    }
    out.join("\n    ")
}

#[derive(Default)]
struct Stats {
    slots: u64,
    executed: u64,
    ok: u64,
    unknown_helper: u64,
}

/// Runs one case through both executors; a description of the disagreement, if any.
fn run_case(case: &Case, options: &LoadOptions, stats: &mut Stats) -> Result<(), String> {
    let prog = match Program::load(&case.insns, options, None) {
        Ok(p) => Arc::new(p),
        Err(e) => return Err(case.report(&format!("generated program fails to load (generator bug): {e}"))),
    };
    let interp = Interpreter::new(prog.clone());
    let mut mem_i = case.mem.clone();
    let (res_i, executed) = {
        let region = Region::of_mut(&mut mem_i);
        let r1 = mem_i.as_mut_ptr() as u64;
        interp.run_counted(r1, MEM_LEN as u64, &[region])
    };
    stats.slots += case.insns.len() as u64;
    stats.executed += executed;
    match &res_i {
        Ok(_) => stats.ok += 1,
        Err(VmError::UnknownHelper { .. }) => stats.unknown_helper += 1,
        Err(_) => {}
    }
    if let Err(e @ VmError::OutOfBounds { .. }) = &res_i {
        // The generator keeps accesses in bounds: either it or the interpreter is wrong. The
        // JIT is not run (it would touch memory out of bounds).
        return Err(case.report(&format!("the interpreter reports an out-of-bounds access: {e}")));
    }
    let jit = match JitProgram::compile(prog) {
        Ok(j) => j,
        Err(e) => return Err(case.report(&format!("the JIT cannot compile it: {e}"))),
    };
    let mut mem_j = case.mem.clone();
    CURRENT_SEED.store(case.seed, Ordering::Relaxed);
    // SAFETY: the generator keeps every access inside the buffer and the stack windows (and
    // the interpreter, which checks them, agreed for this input).
    let res_j = unsafe { jit.run_mem(&mut mem_j) };
    if res_i != res_j || mem_i != mem_j {
        let mut what = format!(
            "executors disagree ({executed} instructions executed by the interpreter)\n  interpreter: {res_i:x?}\n  jit:         {res_j:x?}"
        );
        if mem_i != mem_j {
            what += &format!("\n  memory differs:\n    {}", mem_diff(&mem_i, &mem_j));
        }
        return Err(case.report(&what));
    }
    Ok(())
}

fn seeds(default_count: u64) -> (u64, u64) {
    (
        userbpf_testutil::seed_from_env("DIFF_SEED", DEFAULT_SEED),
        userbpf_testutil::env_u64("DIFF_COUNT").unwrap_or(default_count),
    )
}

/// What a register holds, for [`check_registers`].
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    Uninit,
    Scalar,
    Ptr,
}

/// An independent check of the generator's register invariants, by a forward data-flow
/// analysis over each function: no register is read before it is written, r1-r5 are not read
/// after a call before they are written again, and addresses (r10, the buffer address and
/// what is computed from them) never flow into data: not into stored values, comparisons,
/// helper arguments or r0 at exit, and only `add`/`sub` of a scalar keep them addresses.
/// A function starts with what its callers pass in r1-r5 (joined over the call sites).
fn check_registers(insns: &[Insn]) -> Result<(), String> {
    use Kind::*;
    type State = [Kind; 11];
    let n = insns.len();
    let join = |a: &State, b: &State| -> State {
        let mut out = *a;
        for r in 0..11 {
            if a[r] != b[r] {
                out[r] = Uninit;
            }
        }
        out
    };
    let mut states: Vec<Option<State>> = vec![None; n];
    let mut work = Vec::new();
    let mut entry = [Uninit; 11];
    entry[1] = Ptr;
    entry[2] = Scalar;
    entry[10] = Ptr;
    states[0] = Some(entry);
    work.push(0);
    let merge = |states: &mut Vec<Option<State>>, work: &mut Vec<usize>, t: usize, st: State| {
        let merged = match &states[t] {
            None => st,
            Some(old) => join(old, &st),
        };
        if states[t] != Some(merged) {
            states[t] = Some(merged);
            work.push(t);
        }
    };
    while let Some(pc) = work.pop() {
        let mut st = states[pc].unwrap();
        let i = insns[pc];
        let err = |what: String| {
            Err(format!("instruction {pc} ({}): {what}; registers {st:?}", format_insn(i, insns.get(pc + 1).copied())))
        };
        let need = |st: &State, r: u8, k: Kind| st[r as usize] == k;
        let (d, s) = (i.dst, i.src);
        let mut succ = vec![pc + 1];
        match i.class() {
            BPF_ALU | BPF_ALU64 => {
                let code = i.code();
                let x = i.source() == BPF_X && code != BPF_END;
                let is64 = i.class() == BPF_ALU64;
                if code == BPF_MOV {
                    st[d as usize] = if !x || need(&st, s, Scalar) {
                        Scalar
                    } else if need(&st, s, Ptr) && is64 && i.off == 0 {
                        Ptr
                    } else {
                        return err(format!("mov from r{s}, which holds {:?}", st[s as usize]));
                    };
                } else if is64 && (code == BPF_ADD || code == BPF_SUB) && need(&st, d, Ptr) {
                    if x && !need(&st, s, Scalar) {
                        return err("pointer arithmetic with a non-scalar".into());
                    }
                } else if is64 && code == BPF_ADD && x && need(&st, d, Scalar) && need(&st, s, Ptr) {
                    st[d as usize] = Ptr;
                } else {
                    if !need(&st, d, Scalar) || (x && !need(&st, s, Scalar)) {
                        return err("ALU operation on a register that is not a scalar".into());
                    }
                }
            }
            BPF_JMP | BPF_JMP32 => match i.code() {
                BPF_JA => {
                    let rel = if i.op == OP_JA32 { i.imm as i64 } else { i.off as i64 };
                    succ = vec![(pc as i64 + 1 + rel) as usize];
                }
                BPF_EXIT => {
                    if !need(&st, 0, Scalar) {
                        return err("exit without a scalar in r0".into());
                    }
                    succ.clear();
                }
                BPF_CALL => {
                    if i.src == BPF_PSEUDO_CALL {
                        let mut callee = st;
                        for r in [0, 6, 7, 8, 9] {
                            callee[r] = Uninit;
                        }
                        merge(&mut states, &mut work, (pc as i64 + 1 + i.imm as i64) as usize, callee);
                    } else if (1..=5).any(|r| !need(&st, r, Scalar)) || (i.source() == BPF_X && !need(&st, d, Scalar)) {
                        return err("helper call with a non-scalar argument".into());
                    }
                    st[1..=5].fill(Uninit);
                    st[0] = Scalar;
                }
                _ => {
                    if !need(&st, d, Scalar) || (i.source() == BPF_X && !need(&st, s, Scalar)) {
                        return err("comparison of a register that is not a scalar".into());
                    }
                    succ.push((pc as i64 + 1 + i.off as i64) as usize);
                }
            },
            BPF_LD => {
                st[d as usize] = Scalar;
                succ = vec![pc + 2];
            }
            BPF_LDX => {
                if !need(&st, s, Ptr) {
                    return err("load through a register that is not an address".into());
                }
                st[d as usize] = Scalar;
            }
            BPF_ST => {
                if !need(&st, d, Ptr) {
                    return err("store through a register that is not an address".into());
                }
            }
            _ => {
                if !need(&st, d, Ptr) || !need(&st, s, Scalar) {
                    return err("store of a non-scalar or through a non-address".into());
                }
                if i.mode() == BPF_ATOMIC && i.imm == BPF_CMPXCHG && !need(&st, 0, Scalar) {
                    return err("cmpxchg without a scalar in r0".into());
                }
            }
        }
        for t in succ {
            merge(&mut states, &mut work, t, st);
        }
    }
    Ok(())
}

/// The instruction forms a program contains, as keys: the opcode and what else selects the
/// operation (offset of div/mod/movsx, width of byte swaps, atomic operation, call kind).
fn forms(insns: &[Insn], into: &mut std::collections::BTreeSet<(u8, i64)>) {
    let mut pc = 0;
    while pc < insns.len() {
        let i = insns[pc];
        let extra = match i.class() {
            BPF_ALU | BPF_ALU64 => match i.code() {
                BPF_DIV | BPF_MOD | BPF_MOV => i.off as i64,
                BPF_END => i.imm as i64,
                _ => 0,
            },
            BPF_STX if i.mode() == BPF_ATOMIC => i.imm as i64,
            BPF_JMP if i.code() == BPF_CALL => i.src as i64,
            _ => 0,
        };
        into.insert((i.op, extra));
        pc += if i.is_lddw() { 2 } else { 1 };
    }
}

/// Every form the generator is meant to produce.
fn expected_forms() -> Vec<(u8, i64)> {
    let mut v = Vec::new();
    for class in [BPF_ALU, BPF_ALU64] {
        for op in ALU_OPS {
            for src in [BPF_K, BPF_X] {
                v.push((class | src | op, 0));
                if op == BPF_DIV || op == BPF_MOD {
                    v.push((class | src | op, 1));
                }
            }
        }
        v.push((class | BPF_NEG, 0));
        for off in [8, 16] {
            v.push((class | BPF_X | BPF_MOV, off));
        }
        for w in [16, 32, 64] {
            v.push((class | BPF_END, w));
        }
    }
    v.push((BPF_ALU64 | BPF_X | BPF_MOV, 32));
    for w in [16, 32, 64] {
        v.push((BPF_ALU | BPF_END | BPF_TO_BE, w));
    }
    for class in [BPF_JMP, BPF_JMP32] {
        for op in JMP_OPS {
            v.push((class | BPF_K | op, 0));
            v.push((class | BPF_X | op, 0));
        }
    }
    v.extend([(OP_JA, 0), (OP_JA32, 0), (OP_CALL, 0), (OP_CALL, 1), (OP_CALLX, 0), (OP_EXIT, 0), (OP_LDDW, 0)]);
    for size in SIZES {
        v.push((BPF_LDX | BPF_MEM | size, 0));
        v.push((BPF_ST | BPF_MEM | size, 0));
        v.push((BPF_STX | BPF_MEM | size, 0));
        if size != BPF_DW {
            v.push((BPF_LDX | BPF_MEMSX | size, 0));
        }
    }
    for size in [BPF_W, BPF_DW] {
        for op in ATOMIC_OPS {
            v.push((BPF_STX | BPF_ATOMIC | size, op as i64));
        }
    }
    v
}

#[test]
fn interpreter_and_jit_agree() {
    install_crash_reporter();
    let options = load_options();
    let (seed, count) = seeds(DEFAULT_COUNT);
    let print = std::env::var_os("DIFF_PRINT").is_some();
    let started = std::time::Instant::now();
    let mut failures = Vec::new();
    let mut failed_seeds = Vec::new();
    let mut stats = Stats::default();
    for k in 0..count {
        let case = Case::new(seed.wrapping_add(k));
        if print {
            eprintln!("{}", case.report("running"));
        }
        if let Err(msg) = run_case(&case, &options, &mut stats) {
            failed_seeds.push(case.seed);
            if failures.len() < 3 {
                failures.push(msg);
            }
        }
    }
    eprintln!(
        "differential: {count} programs from seed {seed:#x} in {:.1?}: {} slots, {} instructions executed \
         (interpreter), {} ended Ok, {} with UnknownHelper; {} mismatches",
        started.elapsed(),
        stats.slots,
        stats.executed,
        stats.ok,
        stats.unknown_helper,
        failed_seeds.len()
    );
    if !failed_seeds.is_empty() {
        let seeds: Vec<String> = failed_seeds.iter().take(50).map(|s| format!("{s:#x}")).collect();
        panic!(
            "{} of {count} programs disagree (seeds: {}{})\n\n{}",
            failed_seeds.len(),
            seeds.join(" "),
            if failed_seeds.len() > 50 { " ..." } else { "" },
            failures.join("\n\n")
        );
    }
}

/// Every generated program passes the load-time checks (a refusal is a generator bug), and
/// the generator's invariants hold: where the interpreter runs it, the result does not depend
/// on where the buffer is (no address leaks into data) and no access is out of bounds.
#[test]
fn generated_programs_are_valid() {
    let options = load_options();
    let (seed, count) = seeds(2000);
    let mut problems = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    for k in 0..count {
        let case = Case::new(seed.wrapping_add(k));
        forms(&case.insns, &mut seen);
        let prog = match Program::load(&case.insns, &options, None) {
            Ok(p) => Arc::new(p),
            Err(e) => {
                problems.push(case.report(&format!("fails to load: {e}")));
                continue;
            }
        };
        if prog.max_depth() > userbpf_vm::MAX_CALL_FRAMES {
            problems.push(case.report("call chain too deep"));
        }
        if let Err(e) = check_registers(&case.insns) {
            problems.push(case.report(&format!("register invariant broken: {e}")));
        }
        let interp = Interpreter::new(prog);
        // Two buffers at different addresses, same contents.
        let mut a = case.mem.clone();
        let mut big = vec![0u8; MEM_LEN + 24];
        let b = &mut big[24..];
        b.copy_from_slice(&case.mem);
        let ra = interp.run_mem(&mut a);
        let rb = interp.run_mem(b);
        if let Err(e @ VmError::OutOfBounds { .. }) = &ra {
            problems.push(case.report(&format!("out-of-bounds access: {e}")));
        } else if ra != rb || a[..] != b[..] {
            problems.push(case.report(&format!("result depends on the buffer's address: {ra:x?} vs {rb:x?}")));
        }
        if problems.len() >= 3 {
            break;
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n\n"));
    if count >= 1000 {
        let missing: Vec<String> = expected_forms()
            .into_iter()
            .filter(|f| !seen.contains(f))
            .map(|(op, extra)| format!("{op:#04x}/{extra:#x}"))
            .collect();
        assert!(missing.is_empty(), "the generator never produced these forms (opcode/variant): {missing:?}");
    }
}

/// The invariant checker refuses what it should (so that its silence means something).
#[test]
fn register_checker_catches_violations() {
    let mov_k = |d, imm| Insn::new(BPF_ALU64 | BPF_K | BPF_MOV, d, 0, 0, imm);
    let mov_x = |d, s| Insn::new(BPF_ALU64 | BPF_X | BPF_MOV, d, s, 0, 0);
    let exit = Insn::new(OP_EXIT, 0, 0, 0, 0);
    let good = [mov_x(9, 1), mov_k(0, 1), Insn::new(BPF_STX | BPF_MEM | BPF_DW, 9, 0, 0, 0), exit];
    assert_eq!(check_registers(&good), Ok(()));
    // Reading a register never written.
    assert!(check_registers(&[mov_x(0, 3), exit]).is_err());
    // Storing an address.
    assert!(check_registers(&[mov_k(0, 0), Insn::new(BPF_STX | BPF_MEM | BPF_DW, 10, 10, -8, 0), exit]).is_err());
    // Returning an address.
    assert!(check_registers(&[mov_x(0, 10), exit]).is_err());
    // r2 after a helper call.
    let call = Insn::new(OP_CALL, 0, 0, 0, HELPER_CONST as i32);
    let args: Vec<Insn> = (1..=5).map(|r| mov_k(r, 0)).collect();
    let prog: Vec<Insn> = args.iter().copied().chain([call, mov_x(0, 2), exit]).collect();
    assert!(check_registers(&prog).is_err());
    // Defined on one path only.
    let prog = [mov_k(0, 0), Insn::new(BPF_JMP | BPF_K | BPF_JEQ, 0, 0, 1, 0), mov_k(3, 1), mov_x(0, 3), exit];
    assert!(check_registers(&prog).is_err());
    // A callee reading r6, which its caller does not pass.
    let prog = [
        mov_x(9, 1),
        (2..=5).map(|r| mov_k(r, 0)).next().unwrap(),
        mov_k(3, 0),
        mov_k(4, 0),
        mov_k(5, 0),
        Insn::new(OP_CALL, 0, BPF_PSEUDO_CALL, 0, 1),
        exit,
        mov_x(0, 6),
        exit,
    ];
    assert!(check_registers(&prog).is_err());
}

// ---------------------------------------------------------------------------------------------
// The verifier on generated programs and their mutants

/// A syscall program's context may be up to 64 KiB: the buffer the verified runs get.
const VERIFIED_MEM: usize = 1 << 16;
/// The test helpers under ids the verifier knows (a scalar result, arguments unchecked).
const VERIFIED_MIX: i32 = 7; // bpf_get_prandom_u32
const VERIFIED_CONST: i32 = 5; // bpf_ktime_get_ns

/// One to three mutations: an operand, an offset, an opcode of the same class, an
/// instruction dropped, duplicated or swapped with the next.
fn mutate_program(rng: &mut Rng, insns: &mut Vec<Insn>) {
    for _ in 0..1 + rng.below(3) {
        if insns.is_empty() {
            return;
        }
        let at = rng.index(insns.len());
        match rng.below(8) {
            0 => insns[at].off = insns[at].off.wrapping_add(rng.pick(&[-8, -4, -1, 1, 4, 8, 64, -64])),
            1 => insns[at].imm = rng.interesting_i32(),
            2 => insns[at].dst = rng.below(11) as u8,
            3 => insns[at].src = rng.below(11) as u8,
            4 => {
                let class = insns[at].op & 0x07;
                insns[at].op = (insns[at].op & 0x0f) | (rng.below(14) as u8) << 4;
                insns[at].op = (insns[at].op & !0x07) | class;
            }
            5 => {
                insns.remove(at);
            }
            6 => insns.insert(at, insns[at]),
            _ => {
                if at + 1 < insns.len() {
                    insns.swap(at, at + 1);
                }
            }
        }
    }
}

#[test]
fn verifier_judges_mutants_of_generated_programs() {
    let mut reg = HelperRegistry::new();
    reg.register(Helper { id: VERIFIED_MIX as u32, name: "test_mix", func: helper_mix, may_exit: false });
    reg.register(Helper { id: VERIFIED_CONST as u32, name: "test_const", func: helper_const, may_exit: false });
    let options = LoadOptions { helpers: Arc::new(reg), memory: None, allow_callx: false };
    let opts = userbpf_verifier::Options::new(userbpf_verifier::ProgType::Syscall);
    let (seed, count) = seeds(DEFAULT_COUNT);
    let started = std::time::Instant::now();
    let (mut accepted, mut refused, mut unmutated_accepted, mut vm_refused) = (0u64, 0u64, 0u64, 0u64);
    let mut failures = Vec::new();
    let mut reasons: std::collections::BTreeMap<String, u64> = Default::default();
    // Accepted programs whose executors also agree on r0 and memory (mutants may store the
    // buffer's or the stack's address, which differs between the two runs).
    let mut agree = 0u64;
    for k in 0..count {
        let case_seed = seed.wrapping_add(k);
        let mut case = Case::new(case_seed);
        for i in case.insns.iter_mut() {
            if i.op == OP_CALL && i.src == 0 {
                i.imm = if i.imm == HELPER_MIX as i32 { VERIFIED_MIX } else { VERIFIED_CONST };
            }
        }
        // The harness gives r2 the buffer's length; a syscall program gets only r1.
        case.insns.insert(0, Insn::new(BPF_ALU64 | BPF_K | BPF_MOV, 2, 0, 0, MEM_LEN as i32));
        // One case in four unmutated (valid programs the verifier may accept as they are).
        let mut rng = Rng::new(case_seed ^ 0x5eed);
        let mutated = !rng.chance(1, 4);
        if mutated {
            mutate_program(&mut rng, &mut case.insns);
        }
        let verdict =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| userbpf_verifier::verify(&case.insns, &opts)));
        match verdict {
            Err(_) => {
                failures.push(case.report("the verifier panicked"));
                continue;
            }
            Ok(Err(e)) => {
                refused += 1;
                if !mutated {
                    let rule: String = e.message.chars().map(|c| if c.is_ascii_digit() { '#' } else { c }).collect();
                    *reasons.entry(rule).or_insert(0u64) += 1;
                }
                continue;
            }
            Ok(Ok(_)) => {
                accepted += 1;
                unmutated_accepted += u64::from(!mutated);
            }
        }
        let prog = match Program::load(&case.insns, &options, None) {
            Ok(p) => Arc::new(p),
            Err(_) => {
                // The VM's static checks refuse, wherever it is, what the verifier (as the
                // kernel) refuses only where a path reaches it: such code never runs.
                vm_refused += 1;
                continue;
            }
        };
        let mut mem_i = vec![0u8; VERIFIED_MEM];
        mem_i[..case.mem.len()].copy_from_slice(&case.mem);
        let mut mem_j = mem_i.clone();
        let res_i = Interpreter::new(prog.clone()).run_mem(&mut mem_i);
        let jit = match JitProgram::compile(prog) {
            Ok(j) => j,
            Err(e) => {
                failures.push(case.report(&format!("the JIT cannot compile an accepted program: {e}")));
                continue;
            }
        };
        CURRENT_SEED.store(case.seed, Ordering::Relaxed);
        // SAFETY: the verifier proved every access inside the 64 KiB context or the stack (and
        // the interpreter, which checks them, ran it first).
        let res_j = if res_i.is_ok() { unsafe { jit.run_mem(&mut mem_j) } } else { res_i.clone() };
        if res_i.is_err() || res_j.is_err() {
            failures.push(case.report(&format!("accepted, but: interpreter {res_i:x?}, jit {res_j:x?}")));
        } else if res_i == res_j && mem_i == mem_j {
            agree += 1;
        }
        if failures.len() >= 3 {
            break;
        }
    }
    eprintln!(
        "verifier on generated programs: {count} cases from seed {seed:#x} in {:.1?}: {refused} refused, {accepted} accepted ({unmutated_accepted} unmutated; {vm_refused} refused by the VM's static checks; {agree} with the same r0 and memory in both executors), every one run without an error; {} failures",
        started.elapsed(),
        failures.len()
    );
    let mut top: Vec<_> = reasons.into_iter().collect();
    top.sort_by_key(|e| std::cmp::Reverse(e.1));
    eprintln!("  unmutated programs refused, by rule: {:?}", &top[..top.len().min(8)]);
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}
