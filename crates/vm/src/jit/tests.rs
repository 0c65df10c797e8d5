//! Register-aliasing sweeps: every ALU, jump and atomic form with every pair of registers and
//! edge values, checked against a small model of the semantics, with and without BMI2 for
//! shifts. (Hand-written per-instruction tests are in crates/vm/tests/jit.rs.)
//!
//! Each program sets r0..r9 to known values, runs the instruction under test, and writes all
//! ten registers to the buffer it got in r1, so a clobbered neighbour is caught too.

use std::sync::Arc;

use userbpf_isa::*;

use super::JitProgram;
use super::compile::Options;
use crate::{HelperRegistry, LoadOptions, Program};

fn jit(insns: &[Insn], bmi2: bool) -> JitProgram {
    let opts = LoadOptions { helpers: Arc::new(HelperRegistry::new()), allow_callx: true, ..Default::default() };
    let prog = Program::load(insns, &opts, None).unwrap_or_else(|e| panic!("load failed: {e}\n{insns:?}"));
    JitProgram::compile_with(Arc::new(prog), Options { bmi2, max_passes: 16, claim: None, code_base: None })
        .expect("compile")
}

fn lddw(dst: u8, v: u64) -> [Insn; 2] {
    [Insn::new(OP_LDDW, dst, 0, 0, v as u32 as i32), Insn::new(0, 0, 0, 0, (v >> 32) as u32 as i32)]
}

const fn stx_dw(dst: u8, src: u8, off: i16) -> Insn {
    Insn::new(BPF_STX | BPF_MEM | BPF_DW, dst, src, off, 0)
}
const fn ldx_dw(dst: u8, src: u8, off: i16) -> Insn {
    Insn::new(BPF_LDX | BPF_MEM | BPF_DW, dst, src, off, 0)
}
const EXIT: Insn = Insn::new(OP_EXIT, 0, 0, 0, 0);

/// Offset in the output buffer of the atomic tests' memory cell.
const CELL: usize = 80;
/// Stack offset of the memory cell when the base register is r10.
const STACK_CELL: i16 = -200;

/// Builds the harness around `body`. `pre` runs before the registers are set (it may use r1).
fn harness(pre: &[Insn], vals: &[u64; 10], body: &[Insn], post: &[Insn]) -> Vec<Insn> {
    let mut p = vec![stx_dw(10, 1, -8)];
    p.extend_from_slice(pre);
    for (i, &v) in vals.iter().enumerate() {
        p.extend(lddw(i as u8, v));
    }
    p.extend_from_slice(body);
    for i in 0..10u8 {
        p.push(stx_dw(10, i, -16 - 8 * i as i16));
    }
    p.push(ldx_dw(0, 10, -8));
    for i in 0..10u8 {
        p.push(ldx_dw(1, 10, -16 - 8 * i as i16));
        p.push(stx_dw(0, 1, 8 * i as i16));
    }
    p.extend_from_slice(post);
    p.push(EXIT);
    p
}

/// Runs `insns` with r1 = a 128-byte buffer (cell at CELL initialised to `cell`); returns the
/// ten registers and the cell.
fn run_harness(insns: &[Insn], bmi2: bool, cell: u64) -> ([u64; 10], u64, u64) {
    let j = jit(insns, bmi2);
    let mut buf = [0u64; 16];
    buf[CELL / 8] = cell;
    let base = buf.as_mut_ptr() as u64;
    // SAFETY: the harness only writes the 80 bytes at r1 and its own stack, plus the cell.
    let r = unsafe { j.run(base, 0) }.expect("run");
    assert_eq!(r, base, "harness returns the buffer");
    let mut regs = [0u64; 10];
    regs.copy_from_slice(&buf[..10]);
    (regs, buf[CELL / 8], base)
}

const SETS: [[u64; 10]; 3] = [
    [0, u64::MAX, 1 << 63, 0xffff_ffff, 0x8000_0000, 7, i64::MAX as u64, 64, 33, (-128i64) as u64],
    [
        0x0123_4567_89ab_cdef,
        0xfedc_ba98_7654_3210,
        0x8000_0000_0000_0001,
        0xffff_ffff_8000_0000,
        0x1_0000_0003,
        3,
        0x7f,
        0xff80,
        0xffff_fffe,
        0x1234_5678,
    ],
    [5, 2, 0, 1, (-2i64) as u64, 3, 100, 31, 63, 0x1_0000_0000],
];

/// The value sets: each base set and some rotations of the first, so edge pairs meet in
/// several register pairs.
fn value_sets() -> Vec<[u64; 10]> {
    let mut v = SETS.to_vec();
    for rot in [3, 7] {
        let mut s = SETS[0];
        s.rotate_left(rot);
        v.push(s);
    }
    v
}

/// The result of an ALU instruction on `d` with source value `s` (the register, or the
/// immediate already extended as the class reads it).
fn alu_model(insn: Insn, d: u64, s: u64) -> u64 {
    let signed = insn.off == 1;
    if insn.class() == BPF_ALU64 {
        match insn.code() {
            BPF_ADD => d.wrapping_add(s),
            BPF_SUB => d.wrapping_sub(s),
            BPF_MUL => d.wrapping_mul(s),
            BPF_DIV if signed => {
                if s == 0 {
                    0
                } else {
                    (d as i64).wrapping_div(s as i64) as u64
                }
            }
            BPF_DIV => d.checked_div(s).unwrap_or(0),
            BPF_MOD if signed => {
                if s == 0 {
                    d
                } else {
                    (d as i64).wrapping_rem(s as i64) as u64
                }
            }
            BPF_MOD => d.checked_rem(s).unwrap_or(d),
            BPF_OR => d | s,
            BPF_AND => d & s,
            BPF_XOR => d ^ s,
            BPF_LSH => d << (s & 63),
            BPF_RSH => d >> (s & 63),
            BPF_ARSH => ((d as i64) >> (s & 63)) as u64,
            BPF_NEG => d.wrapping_neg(),
            BPF_MOV => match insn.off {
                8 => s as i8 as i64 as u64,
                16 => s as i16 as i64 as u64,
                32 => s as i32 as i64 as u64,
                _ => s,
            },
            BPF_END => match insn.imm {
                16 => (d as u16).swap_bytes() as u64,
                32 => (d as u32).swap_bytes() as u64,
                _ => d.swap_bytes(),
            },
            c => panic!("no model for {c:#x}"),
        }
    } else {
        let (d32, s32) = (d as u32, s as u32);
        let r: u32 = match insn.code() {
            BPF_ADD => d32.wrapping_add(s32),
            BPF_SUB => d32.wrapping_sub(s32),
            BPF_MUL => d32.wrapping_mul(s32),
            BPF_DIV if signed => {
                if s32 == 0 {
                    0
                } else {
                    (d32 as i32).wrapping_div(s32 as i32) as u32
                }
            }
            BPF_DIV => d32.checked_div(s32).unwrap_or(0),
            BPF_MOD if signed => {
                if s32 == 0 {
                    d32
                } else {
                    (d32 as i32).wrapping_rem(s32 as i32) as u32
                }
            }
            BPF_MOD => d32.checked_rem(s32).unwrap_or(d32),
            BPF_OR => d32 | s32,
            BPF_AND => d32 & s32,
            BPF_XOR => d32 ^ s32,
            BPF_LSH => d32 << (s32 & 31),
            BPF_RSH => d32 >> (s32 & 31),
            BPF_ARSH => ((d32 as i32) >> (s32 & 31)) as u32,
            BPF_NEG => d32.wrapping_neg(),
            BPF_MOV => match insn.off {
                8 => s32 as i8 as i32 as u32,
                16 => s32 as i16 as i32 as u32,
                _ => s32,
            },
            BPF_END => {
                return match (insn.source() == BPF_TO_BE, insn.imm) {
                    (false, 16) => d as u16 as u64,
                    (false, 32) => d as u32 as u64,
                    (false, _) => d,
                    (true, 16) => (d as u16).swap_bytes() as u64,
                    (true, 32) => (d as u32).swap_bytes() as u64,
                    (true, _) => d.swap_bytes(),
                };
            }
            c => panic!("no model for {c:#x}"),
        };
        r as u64
    }
}

fn check_alu(insn: Insn, vals: &[u64; 10], bmi2: bool) {
    let prog = harness(&[], vals, &[insn], &[]);
    let (got, _, _) = run_harness(&prog, bmi2, 0);
    let s = if insn.source() == BPF_X && !matches!(insn.code(), BPF_NEG | BPF_END) {
        vals[insn.src as usize]
    } else if insn.class() == BPF_ALU64 {
        insn.imm as i64 as u64
    } else {
        insn.imm as u32 as u64
    };
    let mut want = *vals;
    want[insn.dst as usize] = alu_model(insn, vals[insn.dst as usize], s);
    assert_eq!(got, want, "{insn:?} ({}) with {vals:x?}, bmi2 {bmi2}", disasm::mnemonic(insn));
}

/// (operation, offset) pairs taking a register or immediate source.
const BINARY_OPS: [(u8, i16); 13] = [
    (BPF_ADD, 0),
    (BPF_SUB, 0),
    (BPF_MUL, 0),
    (BPF_DIV, 0),
    (BPF_DIV, 1),
    (BPF_MOD, 0),
    (BPF_MOD, 1),
    (BPF_OR, 0),
    (BPF_AND, 0),
    (BPF_XOR, 0),
    (BPF_LSH, 0),
    (BPF_RSH, 0),
    (BPF_ARSH, 0),
];

fn is_shift(code: u8) -> bool {
    matches!(code, BPF_LSH | BPF_RSH | BPF_ARSH)
}

#[test]
fn alu_register_sources_all_register_pairs() {
    let sets = value_sets();
    let mut ops: Vec<(u8, i16)> = BINARY_OPS.to_vec();
    ops.extend([(BPF_MOV, 0), (BPF_MOV, 8), (BPF_MOV, 16), (BPF_MOV, 32)]);
    for class in [BPF_ALU, BPF_ALU64] {
        for &(code, off) in &ops {
            if class == BPF_ALU && code == BPF_MOV && off == 32 {
                continue;
            }
            for dst in 0..10u8 {
                for src in 0..10u8 {
                    let insn = Insn::new(class | BPF_X | code, dst, src, off, 0);
                    for vals in &sets {
                        check_alu(insn, vals, true);
                        if is_shift(code) {
                            check_alu(insn, vals, false);
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn alu_immediate_sources_all_registers() {
    let imms = [
        0,
        1,
        -1,
        2,
        3,
        5,
        7,
        8,
        9,
        31,
        32,
        33,
        63,
        64,
        -128,
        i32::MIN,
        i32::MAX,
        0x10000,
        1 << 30,
        17,
        0x4000_0001,
        0x1001,
    ];
    let mut ops: Vec<(u8, i16)> = BINARY_OPS.to_vec();
    ops.push((BPF_MOV, 0));
    for class in [BPF_ALU, BPF_ALU64] {
        for &(code, off) in &ops {
            for dst in 0..10u8 {
                for &imm in &imms {
                    let insn = Insn::new(class | BPF_K | code, dst, 0, off, imm);
                    for vals in &SETS[..2] {
                        check_alu(insn, vals, true);
                    }
                }
            }
        }
    }
}

#[test]
fn neg_and_byte_swaps_all_registers() {
    for vals in &SETS {
        for dst in 0..10u8 {
            for class in [BPF_ALU, BPF_ALU64] {
                check_alu(Insn::new(class | BPF_NEG, dst, 0, 0, 0), vals, true);
                for width in [16, 32, 64] {
                    check_alu(Insn::new(class | BPF_END, dst, 0, 0, width), vals, true);
                    if class == BPF_ALU {
                        check_alu(Insn::new(class | BPF_END | BPF_TO_BE, dst, 0, 0, width), vals, true);
                    }
                }
            }
        }
    }
}

/// Whether a conditional jump is taken.
fn jump_model(insn: Insn, a: u64, b: u64) -> bool {
    let (a, b, sa, sb) = if insn.class() == BPF_JMP32 {
        (a as u32 as u64, b as u32 as u64, a as u32 as i32 as i64, b as u32 as i32 as i64)
    } else {
        (a, b, a as i64, b as i64)
    };
    match insn.code() {
        BPF_JEQ => a == b,
        BPF_JNE => a != b,
        BPF_JGT => a > b,
        BPF_JGE => a >= b,
        BPF_JLT => a < b,
        BPF_JLE => a <= b,
        BPF_JSET => a & b != 0,
        BPF_JSGT => sa > sb,
        BPF_JSGE => sa >= sb,
        BPF_JSLT => sa < sb,
        BPF_JSLE => sa <= sb,
        c => panic!("no model for {c:#x}"),
    }
}

const CONDS: [u8; 11] =
    [BPF_JEQ, BPF_JNE, BPF_JGT, BPF_JGE, BPF_JLT, BPF_JLE, BPF_JSET, BPF_JSGT, BPF_JSGE, BPF_JSLT, BPF_JSLE];

/// `body` is a jump over one instruction that sets r0 to 0; runs it and returns whether it
/// was taken (r0 keeps its marker value).
fn taken(jump: Insn, vals: &[u64; 10]) -> bool {
    let marker = 0xdead_beef_u64;
    let mut p = Vec::new();
    for (i, &v) in vals.iter().enumerate() {
        p.extend(lddw(i as u8, v));
    }
    p.extend(lddw(0, marker));
    p.push(jump);
    p.push(Insn::new(BPF_ALU64 | BPF_MOV, 0, 0, 0, 0));
    p.push(EXIT);
    // r0 is the marker, not vals[0]: use r0 only as a source for K jumps (dst = 0 reads the
    // marker, which the model is given below).
    let j = jit(&p, true);
    // SAFETY: no memory access.
    let r = unsafe { j.run(0, 0) }.expect("run");
    assert!(r == 0 || r == marker);
    r == marker
}

#[test]
fn conditional_jumps_all_register_pairs() {
    for class in [BPF_JMP, BPF_JMP32] {
        for &code in &CONDS {
            for dst in 0..10u8 {
                for src in 0..10u8 {
                    for vals in &SETS {
                        let mut v = *vals;
                        v[0] = 0xdead_beef;
                        let insn = Insn::new(class | BPF_X | code, dst, src, 1, 0);
                        let want = jump_model(insn, v[dst as usize], v[src as usize]);
                        assert_eq!(taken(insn, &v), want, "{} with {v:x?}", disasm::mnemonic(insn));
                    }
                }
                for imm in [0, 1, -1, 7, 0x7fff_ffff, i32::MIN, 64] {
                    let mut v = SETS[0];
                    v[0] = 0xdead_beef;
                    let insn = Insn::new(class | BPF_K | code, dst, 0, 1, imm);
                    let b = if class == BPF_JMP { imm as i64 as u64 } else { imm as u32 as u64 };
                    let want = jump_model(insn, v[dst as usize], b);
                    assert_eq!(taken(insn, &v), want, "{} with {v:x?}", disasm::mnemonic(insn));
                }
            }
        }
    }
}

/// Model of an atomic operation on `cell` (for 32 bits, only the low half changes).
fn atomic_model(insn: Insn, regs: &mut [u64; 10], cell: &mut u64) {
    let w64 = insn.size() == BPF_DW;
    let mask = if w64 { u64::MAX } else { 0xffff_ffff };
    let old = *cell & mask;
    let src = insn.src as usize;
    let s = regs[src] & mask;
    let mut store = |v: u64| *cell = (*cell & !mask) | (v & mask);
    match insn.imm {
        BPF_XCHG => {
            store(s);
            regs[src] = old;
        }
        BPF_CMPXCHG => {
            if regs[0] & mask == old {
                store(s);
            }
            regs[0] = old;
        }
        imm => {
            let new = match imm & !BPF_FETCH {
                0x00 => old.wrapping_add(s),
                0x40 => old | s,
                0x50 => old & s,
                0xa0 => old ^ s,
                _ => panic!("no model for {imm:#x}"),
            };
            store(new);
            if imm & BPF_FETCH != 0 {
                regs[src] = old;
            }
        }
    }
}

#[test]
fn atomics_all_register_pairs() {
    let ops = [0x00, 0x01, 0x40, 0x41, 0x50, 0x51, 0xa0, 0xa1, BPF_XCHG, BPF_CMPXCHG];
    let cells = [0x8765_4321_ffff_fff0u64, 0x0123_4567_89ab_cdef];
    for size in [BPF_W, BPF_DW] {
        for &imm in &ops {
            for base in 0..=10u8 {
                for src in 0..10u8 {
                    for (k, vals) in SETS[..2].iter().enumerate() {
                        let mut vals = *vals;
                        let cell0 = cells[k];
                        if k == 1 {
                            // Make some cmpxchg succeed: r0 equal to the cell (low half for W).
                            vals[0] = if size == BPF_W { 0xaaaa_0000_89ab_cdef } else { cell0 };
                        }
                        let (pre, body, post, off): (Vec<Insn>, Vec<Insn>, Vec<Insn>, i16) = if base == 10 {
                            let mut pre = lddw(1, cell0).to_vec();
                            pre.push(stx_dw(10, 1, STACK_CELL));
                            (pre, vec![], vec![ldx_dw(1, 10, STACK_CELL), stx_dw(0, 1, CELL as i16)], STACK_CELL)
                        } else {
                            (vec![], vec![ldx_dw(base, 10, -8)], vec![], CELL as i16)
                        };
                        let insn = Insn::new(BPF_STX | BPF_ATOMIC | size, base, src, off, imm);
                        let mut body = body;
                        body.push(insn);
                        let prog = harness(&pre, &vals, &body, &post);
                        let (got, got_cell, buf) = run_harness(&prog, true, cell0);
                        let mut want = vals;
                        if base != 10 {
                            want[base as usize] = buf;
                        }
                        let mut want_cell = cell0;
                        atomic_model(insn, &mut want, &mut want_cell);
                        assert_eq!(
                            (got, got_cell),
                            (want, want_cell),
                            "{} with {vals:x?}, cell {cell0:#x}",
                            disasm::mnemonic(insn)
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn tight_loop_is_one_x86_instruction_per_alu_instruction() {
    // r0 = 0; r1 = 1000; loop: r0 += r1; r0 ^= 5; r1 -= 1; if r1 != 0 goto loop; exit
    let p = [
        Insn::new(BPF_ALU64 | BPF_MOV, 0, 0, 0, 0),
        Insn::new(BPF_ALU64 | BPF_MOV, 1, 0, 0, 1000),
        Insn::new(BPF_ALU64 | BPF_X | BPF_ADD, 0, 1, 0, 0),
        Insn::new(BPF_ALU64 | BPF_XOR, 0, 0, 0, 5),
        Insn::new(BPF_ALU64 | BPF_SUB, 1, 0, 0, 1),
        Insn::new(BPF_JMP | BPF_JNE, 1, 0, -4, 0),
        EXIT,
    ];
    let j = jit(&p, true);
    let code = j.code();
    // add rdi to rax; xor rax, 5; sub rdi, 1; test rdi, rdi; jne short back.
    let body: [u8; 15] = [
        0x48, 0x01, 0xf8, // add rax, rdi
        0x48, 0x83, 0xf0, 0x05, // xor rax, 5
        0x48, 0x83, 0xef, 0x01, // sub rdi, 1
        0x48, 0x85, 0xff, // test rdi, rdi
        0x75, // jne rel8
    ];
    assert!(code.windows(body.len()).any(|w| w == body), "{code:02x?}");
    let mut want = 0u64;
    for i in (1..=1000u64).rev() {
        want = (want + i) ^ 5;
    }
    // SAFETY: no memory access.
    assert_eq!(unsafe { j.run(0, 0) }, Ok(want));
}

#[test]
fn jump_layout_with_few_passes_is_still_exact() {
    // Forward and backward jumps of many lengths, some just around the rel8 limit; compiled
    // with the final "keep the previous sizes" pass coming after 1, 2, 3 passes or 16.
    let mut p = vec![Insn::new(BPF_ALU64 | BPF_MOV, 0, 0, 0, 0), Insn::new(BPF_ALU64 | BPF_MOV, 1, 0, 0, 3)];
    let top = p.len();
    for i in 0..120 {
        // Each: `jeq r0, -1, +k` (never taken) and `add r0, i` (4 bytes).
        p.push(Insn::new(BPF_JMP | BPF_JEQ, 0, 0, (i % 40) as i16 * 2 + 1, -1));
        p.push(Insn::new(BPF_ALU64 | BPF_ADD, 0, 0, 0, i));
    }
    p.extend(vec![Insn::new(OP_JA, 0, 0, 0, 0); 80]);
    p.push(Insn::new(BPF_ALU64 | BPF_SUB, 1, 0, 0, 1));
    let back = top as i64 - (p.len() as i64 + 1);
    p.push(Insn::new(BPF_JMP | BPF_JNE, 1, 0, back as i16, 0));
    // Short backward loop and a taken forward jump of exactly 127 bytes? (31 adds + 3 bytes)
    p.push(Insn::new(BPF_JMP | BPF_JEQ, 1, 0, 31, 0));
    for _ in 0..31 {
        p.push(Insn::new(BPF_ALU64 | BPF_ADD, 0, 0, 0, 1_000_000));
    }
    p.push(EXIT);
    let want = 3 * (0..120).sum::<i32>() as u64;
    let opts = LoadOptions { helpers: Arc::new(HelperRegistry::new()), ..Default::default() };
    let prog = Arc::new(Program::load(&p, &opts, None).expect("load"));
    let mut sizes = Vec::new();
    for max_passes in [1, 2, 3, 16] {
        let j =
            JitProgram::compile_with(prog.clone(), Options { bmi2: true, max_passes, claim: None, code_base: None })
                .expect("compile");
        // SAFETY: no memory access.
        assert_eq!(unsafe { j.run(0, 0) }, Ok(want), "max_passes {max_passes}");
        sizes.push(j.code().len());
    }
    // More passes never make the code longer, and relaxation shortened it.
    assert!(sizes.windows(2).all(|w| w[0] >= w[1]), "{sizes:?}");
    assert!(sizes[0] > sizes[3], "{sizes:?}");
}

#[test]
fn code_is_registered_with_the_fault_handler_while_the_program_lives() {
    let j = jit(&[Insn::new(BPF_LDX | BPF_MEM | BPF_DW, 0, 1, 0, 0), EXIT], false);
    let code = j.code().as_ptr_range();
    let (start, end) = (code.start as usize, code.end as usize);
    assert!(crate::guard::covers(start) && crate::guard::covers(end - 1));
    drop(j);
    assert!(!crate::guard::covers(start));
}

#[test]
fn the_pc_map_covers_every_instruction_in_order() {
    let mut p = vec![Insn::new(BPF_ALU64 | BPF_MOV | BPF_K, 0, 0, 0, 1)];
    p.extend(lddw(2, 0x1234_5678_9abc_def0));
    p.push(Insn::new(OP_CALL, 0, BPF_PSEUDO_CALL, 0, 1));
    p.push(EXIT);
    p.push(ldx_dw(0, 1, 0));
    p.push(EXIT);
    let opts = LoadOptions { helpers: Arc::new(HelperRegistry::new()), ..Default::default() };
    let prog = Program::load(&p, &opts, None).unwrap();
    let rt = super::compile::Runtime { abort_fn: 0, after_helper_fn: 0, preserving_call: 0 };
    let out = super::compile::compile(&prog, Options::detect(), rt).unwrap();
    let pcs: Vec<u32> = out.pc_map.iter().map(|&(_, pc)| pc).collect();
    let none = super::compile::NO_PC;
    assert_eq!(pcs, vec![none, 0, 1, 3, 4, none, 5, 6]);
    assert!(out.pc_map.windows(2).all(|w| w[0].0 <= w[1].0));
    assert!(out.pc_map[0].0 as usize > out.abort, "functions come after the abort path");
}

/// A program calling no helper runs through the fast entry (no run state); one with a
/// `callx` does not. Both end an aborted run with the error of the instruction at fault.
#[test]
fn fast_entry_is_used_without_helpers_and_reports_aborts() {
    use crate::VmError;
    let load = [Insn::new(BPF_LDX | BPF_MEM | BPF_DW, 0, 1, 16, 0), EXIT];
    let j = jit(&load, false);
    assert!(j.fast_entry.is_some());
    let mut buf = [0u8; 24];
    buf[16] = 7;
    // SAFETY: r1 = a 24-byte buffer; then null, whose fault the guard contains.
    unsafe {
        assert_eq!(j.run(buf.as_mut_ptr() as u64, 0), Ok(7));
        assert_eq!(j.run(0, 0), Err(VmError::Fault { pc: 0, addr: 16 }));
        assert_eq!(j.run(buf.as_mut_ptr() as u64, 0), Ok(7), "a run after an abort");
    }
    let callx = [Insn::new(BPF_ALU64 | BPF_MOV | BPF_K, 1, 0, 0, 5), Insn::new(OP_CALLX, 1, 0, 0, 0), EXIT];
    let j = jit(&callx, false);
    assert!(j.fast_entry.is_none());
    // SAFETY: the program touches no memory.
    assert_eq!(unsafe { j.run(0, 0) }, Err(VmError::UnknownHelper { pc: 1, id: 5 }));
}

/// `rD = rS; rD += imm` becomes one `lea` (see `lea_pair`), and not when a jump lands on the
/// add: both give the interpreter's result.
#[test]
fn mov_add_pairs_give_the_same_result_fused_or_not() {
    let movx = |d: u8, s: u8| Insn::new(BPF_ALU64 | BPF_X | BPF_MOV, d, s, 0, 0);
    let addk = |d: u8, k: i32| Insn::new(BPF_ALU64 | BPF_K | BPF_ADD, d, 0, 0, k);
    let movk = |d: u8, k: i32| Insn::new(BPF_ALU64 | BPF_K | BPF_MOV, d, 0, 0, k);
    // *(r10 - 16) = 5 through r2 = r10 - 16; r0 = *(r10 - 16) + r2 - r10 (= 5 - 16).
    let fused = [
        movk(3, 5),
        movx(2, 10),
        addk(2, -16),
        stx_dw(2, 3, 0),
        ldx_dw(0, 10, -16),
        Insn::new(BPF_ALU64 | BPF_X | BPF_ADD, 0, 2, 0, 0),
        Insn::new(BPF_ALU64 | BPF_X | BPF_SUB, 0, 10, 0, 0),
        EXIT,
    ];
    // SAFETY: the program only touches its stack.
    assert_eq!(unsafe { jit(&fused, true).run(0, 0) }, Ok((5i64 - 16) as u64));
    // A jump onto the add: r2 = 100 there when r1 == 0 (the context is 0), so the pair must
    // not be fused: r0 = 100 - 16.
    let split =
        [movk(2, 100), Insn::new(BPF_JMP | BPF_K | BPF_JEQ, 1, 0, 1, 0), movx(2, 10), addk(2, -16), movx(0, 2), EXIT];
    // SAFETY: as above.
    assert_eq!(unsafe { jit(&split, true).run(0, 0) }, Ok(84));
}

/// The helper of the call-form tests: r0 = r1 * 3 + r2.
extern "C" fn triple_plus(a: u64, b: u64, _: u64, _: u64, _: u64) -> u64 {
    a.wrapping_mul(3).wrapping_add(b)
}

/// `r0 = triple_plus(r1, 7); exit`, with `triple_plus` as helper 1.
fn calling_program() -> Arc<Program> {
    let mut helpers = HelperRegistry::new();
    helpers.register(crate::Helper::new(1, "triple_plus", triple_plus));
    let opts = LoadOptions { helpers: Arc::new(helpers), ..Default::default() };
    let insns = [Insn::new(BPF_ALU64 | BPF_MOV | BPF_K, 2, 0, 0, 7), Insn::new(OP_CALL, 0, 0, 0, 1), EXIT];
    Arc::new(Program::load(&insns, &opts, None).expect("load"))
}

/// Where the code's `call rel32`s (E8) go, read from every offset (the scan may also decode
/// bytes inside other instructions: the tests look for one target or its absence).
fn rel32_targets(code: &[u8], base: usize) -> Vec<usize> {
    (0..code.len().saturating_sub(4))
        .filter(|&i| code[i] == 0xe8)
        .map(|i| {
            (base as i64 + i as i64 + 5 + i32::from_le_bytes(code[i + 1..i + 5].try_into().unwrap()) as i64) as usize
        })
        .collect()
}

/// Whether the code holds `func`'s address as an immediate (the indirect form's `mov`).
fn holds_address(code: &[u8], func: usize) -> bool {
    code.windows(8).any(|w| w == (func as u64).to_le_bytes())
}

#[test]
fn a_helper_within_reach_is_called_with_call_rel32() {
    let j = JitProgram::compile_with(calling_program(), Options::detect()).expect("compile");
    let func = triple_plus as extern "C" fn(u64, u64, u64, u64, u64) -> u64 as usize;
    let (code, base) = (j.code(), j.code().as_ptr() as usize);
    // The mapping was asked for next to the runtime's code, which is this test binary's, as
    // the helper is.
    assert!((func as i64 - base as i64).unsigned_abs() < 1 << 31, "code at {base:#x}, the helper at {func:#x}");
    assert!(rel32_targets(code, base).contains(&func), "no call rel32 to the helper in {code:02x?}");
    assert!(!holds_address(code, func), "the helper's address is still loaded as an immediate");
    // SAFETY: the program only calls `triple_plus`, which reads no memory.
    assert_eq!(unsafe { j.run(5, 0) }, Ok(22));
}

#[test]
fn programs_compiled_while_others_hold_the_range_below_are_still_within_reach() {
    let func = triple_plus as extern "C" fn(u64, u64, u64, u64, u64) -> u64 as usize;
    // Each holds its mapping while the next is placed (a process's programs, or other tests'
    // on other threads): the range asked for first is taken after the first of them.
    let progs: Vec<JitProgram> =
        (0..24).map(|_| JitProgram::compile_with(calling_program(), Options::detect()).expect("compile")).collect();
    for (k, j) in progs.iter().enumerate() {
        let base = j.code().as_ptr() as usize;
        assert!(
            rel32_targets(j.code(), base).contains(&func),
            "program {k}: no call rel32 to the helper (at {base:#x})"
        );
        // SAFETY: the program only calls `triple_plus`, which reads no memory.
        assert_eq!(unsafe { j.run(5, 0) }, Ok(22));
    }
}

#[test]
fn a_helper_out_of_reach_is_called_through_a_register() {
    let func = triple_plus as extern "C" fn(u64, u64, u64, u64, u64) -> u64 as usize;
    // Code said to lie 4 GiB away from the helper: no rel32 reaches it.
    let far = (func as u64).wrapping_add(1 << 32);
    let rt = super::compile::Runtime { abort_fn: 0, after_helper_fn: 0, preserving_call: 0 };
    let opts = Options { code_base: Some(far), ..Options::detect() };
    let out = super::compile::compile(&calling_program(), opts, rt).expect("compile");
    assert!(holds_address(&out.code, func), "the helper's address is not loaded: {:02x?}", out.code);
    assert!(!rel32_targets(&out.code, far as usize).contains(&func));
    // And the same program compiled for where it lies is never longer.
    let near = Options { code_base: Some(func as u64 + 4096), ..Options::detect() };
    let short = super::compile::compile(&calling_program(), near, rt).expect("compile");
    assert!(short.code.len() < out.code.len(), "{} bytes direct, {} indirect", short.code.len(), out.code.len());
}
