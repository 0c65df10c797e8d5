//! Hand-written tests of the x86-64 JIT, one group per instruction class, with exact expected
//! values. (Register-aliasing sweeps against a model are unit tests in src/jit/tests.rs.)

use std::sync::Arc;

use userbpf_isa::*;
use userbpf_vm::{Helper, HelperFn, HelperRegistry, JitProgram, LoadOptions, Program, VmError};

// ---- building programs ----

/// A sequence of instruction slots, so `prog![..]` can mix one- and two-slot instructions.
struct Seq(Vec<Insn>);
impl From<Insn> for Seq {
    fn from(i: Insn) -> Seq {
        Seq(vec![i])
    }
}
impl From<[Insn; 2]> for Seq {
    fn from(i: [Insn; 2]) -> Seq {
        Seq(i.to_vec())
    }
}
impl From<Vec<Insn>> for Seq {
    fn from(i: Vec<Insn>) -> Seq {
        Seq(i)
    }
}

macro_rules! prog {
    ($($e:expr_2021),* $(,)?) => {{
        let mut v: Vec<Insn> = Vec::new();
        $( v.extend(Seq::from($e).0); )*
        v
    }};
}

const fn alu64(op: u8, dst: u8, imm: i32) -> Insn {
    Insn::new(BPF_ALU64 | BPF_K | op, dst, 0, 0, imm)
}
const fn alu64x(op: u8, dst: u8, src: u8) -> Insn {
    Insn::new(BPF_ALU64 | BPF_X | op, dst, src, 0, 0)
}
const fn alu32(op: u8, dst: u8, imm: i32) -> Insn {
    Insn::new(BPF_ALU | BPF_K | op, dst, 0, 0, imm)
}
const fn alu32x(op: u8, dst: u8, src: u8) -> Insn {
    Insn::new(BPF_ALU | BPF_X | op, dst, src, 0, 0)
}
const fn mov(dst: u8, imm: i32) -> Insn {
    alu64(BPF_MOV, dst, imm)
}
const fn movx(dst: u8, src: u8) -> Insn {
    alu64x(BPF_MOV, dst, src)
}
fn lddw(dst: u8, v: u64) -> [Insn; 2] {
    [Insn::new(OP_LDDW, dst, 0, 0, v as u32 as i32), Insn::new(0, 0, 0, 0, (v >> 32) as u32 as i32)]
}
fn ld_func(dst: u8, rel: i32) -> [Insn; 2] {
    [Insn::new(OP_LDDW, dst, BPF_PSEUDO_FUNC, 0, rel), Insn::new(0, 0, 0, 0, 0)]
}
const fn exit() -> Insn {
    Insn::new(OP_EXIT, 0, 0, 0, 0)
}
const fn jmp(op: u8, dst: u8, imm: i32, off: i16) -> Insn {
    Insn::new(BPF_JMP | BPF_K | op, dst, 0, off, imm)
}
const fn ja(off: i16) -> Insn {
    Insn::new(OP_JA, 0, 0, off, 0)
}
const fn gotol(imm: i32) -> Insn {
    Insn::new(OP_JA32, 0, 0, 0, imm)
}
const fn ldx(size: u8, dst: u8, src: u8, off: i16) -> Insn {
    Insn::new(BPF_LDX | BPF_MEM | size, dst, src, off, 0)
}
const fn ldxsx(size: u8, dst: u8, src: u8, off: i16) -> Insn {
    Insn::new(BPF_LDX | BPF_MEMSX | size, dst, src, off, 0)
}
const fn st(size: u8, dst: u8, off: i16, imm: i32) -> Insn {
    Insn::new(BPF_ST | BPF_MEM | size, dst, 0, off, imm)
}
const fn stx(size: u8, dst: u8, src: u8, off: i16) -> Insn {
    Insn::new(BPF_STX | BPF_MEM | size, dst, src, off, 0)
}
const fn atomic(size: u8, dst: u8, src: u8, off: i16, op: i32) -> Insn {
    Insn::new(BPF_STX | BPF_ATOMIC | size, dst, src, off, op)
}
const fn call(id: i32) -> Insn {
    Insn::new(OP_CALL, 0, 0, 0, id)
}
const fn call_local(rel: i32) -> Insn {
    Insn::new(OP_CALL, 0, BPF_PSEUDO_CALL, 0, rel)
}
const fn callx(reg: u8) -> Insn {
    Insn::new(OP_CALLX, reg, 0, 0, 0)
}

// ---- helpers ----

const H_SUM5: i32 = 1;
const H_ALIGN: i32 = 2;
const H_CALL_CB: i32 = 5;
const H_LOOP: i32 = 6;
const H_CLOBBER: i32 = 7;

unsafe extern "C" fn h_sum5(a: u64, b: u64, c: u64, d: u64, e: u64) -> u64 {
    a.wrapping_add(b.wrapping_mul(10))
        .wrapping_add(c.wrapping_mul(100))
        .wrapping_add(d.wrapping_mul(1000))
        .wrapping_add(e.wrapping_mul(10000))
}

/// Returns the stack misalignment (0 when the caller kept rsp 16-aligned at the call).
unsafe extern "C" fn h_align(_: u64, _: u64, _: u64, _: u64, _: u64) -> u64 {
    #[repr(align(16))]
    struct A([u8; 16]);
    let a = std::hint::black_box(A([0; 16]));
    let addr = std::hint::black_box(&a) as *const A as usize;
    (addr % 16) as u64 + u64::from(a.0[0])
}

/// Calls the callback `cb` with (arg, 1, 2, 3, 4).
unsafe extern "C" fn h_call_cb(cb: u64, arg: u64, _: u64, _: u64, _: u64) -> u64 {
    // SAFETY: the program passes the address lddw BPF_PSEUDO_FUNC gave it, a C-callable entry.
    let f: HelperFn = unsafe { std::mem::transmute::<usize, HelperFn>(cb as usize) };
    // SAFETY: the callback's memory accesses are the test's own.
    unsafe { f(arg, 1, 2, 3, 4) }
}

/// bpf_loop-like: calls cb(i, ctx) for i in 0..n until it returns non-zero; returns the
/// number of calls.
unsafe extern "C" fn h_loop(n: u64, cb: u64, ctx: u64, _: u64, _: u64) -> u64 {
    // SAFETY: as in h_call_cb.
    let f: HelperFn = unsafe { std::mem::transmute::<usize, HelperFn>(cb as usize) };
    for i in 0..n {
        // SAFETY: as in h_call_cb.
        if unsafe { f(i, ctx, 0, 0, 0) } != 0 {
            return i + 1;
        }
    }
    n
}

/// Overwrites every caller-saved register it can, to show r6..r9 survive helper calls.
unsafe extern "C" fn h_clobber(a: u64, _: u64, _: u64, _: u64, _: u64) -> u64 {
    let mut v = [0u64; 64];
    for (i, x) in v.iter_mut().enumerate() {
        *x = std::hint::black_box(a ^ (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    }
    std::hint::black_box(&v).iter().fold(0, |s, x| s ^ x)
}

fn registry() -> HelperRegistry {
    let mut r = HelperRegistry::new();
    for (id, name, func) in [
        (H_SUM5, "sum5", h_sum5 as HelperFn),
        (H_ALIGN, "align", h_align as HelperFn),
        (H_CALL_CB, "call_cb", h_call_cb as HelperFn),
        (H_LOOP, "loop", h_loop as HelperFn),
        (H_CLOBBER, "clobber", h_clobber as HelperFn),
    ] {
        r.register(Helper { id: id as u32, name, func, may_exit: false });
    }
    r
}

// ---- running ----

fn compile(insns: &[Insn]) -> JitProgram {
    let opts = LoadOptions { helpers: Arc::new(registry()), allow_callx: true, ..Default::default() };
    let prog = Program::load(insns, &opts, None).unwrap_or_else(|e| panic!("load failed: {e}"));
    JitProgram::compile(Arc::new(prog)).expect("compile")
}

fn try_run(insns: &[Insn], r1: u64, r2: u64) -> Result<u64, VmError> {
    let j = compile(insns);
    // SAFETY: the tests' programs touch only their stack and the buffers they are given.
    unsafe { j.run(r1, r2) }
}

fn run(insns: &[Insn]) -> u64 {
    try_run(insns, 0, 0).expect("run")
}

fn run_buf(insns: &[Insn], buf: &mut [u8]) -> u64 {
    let j = compile(insns);
    // SAFETY: the tests' programs stay inside `buf` and their stack.
    unsafe { j.run_mem(buf) }.expect("run")
}

/// Runs `body` followed by `exit` and returns r0.
fn r0(body: Vec<Insn>) -> u64 {
    let mut p = body;
    p.push(exit());
    run(&p)
}

// ---- ALU ----

#[test]
fn registers_start_at_zero_and_args_arrive() {
    assert_eq!(run(&[exit()]), 0);
    let j = compile(&prog![movx(0, 1), alu64x(BPF_MUL, 0, 2), exit()]);
    // SAFETY: no memory access.
    assert_eq!(unsafe { j.run(6, 7) }, Ok(42));
    for r in 6..=9 {
        assert_eq!(r0(prog![movx(0, r)]), 0, "r{r}");
    }
}

/// The entries zero only the registers a path may read before writing them (the JIT's
/// liveness analysis): registers read only on some paths, around a loop's back edge, by a
/// bpf-to-bpf callee or through a jump still start at zero (the entries' argument registers
/// hold other values, e.g. the abort record's address in r3 and the CPU in r4).
#[test]
fn registers_read_before_written_on_some_path_start_at_zero() {
    // r0 = r3 when r1 is 0, else 5 (r3 written on the other path only).
    let p = prog![jmp(BPF_JEQ, 1, 0, 1), mov(3, 5), movx(0, 3), exit()];
    let j = compile(&p);
    // SAFETY: no memory access.
    assert_eq!(unsafe { (j.run(0, 9), j.run(1, 9)) }, (Ok(0), Ok(5)));
    // r6 read first around the back edge: r0 = 0 + 7.
    let p = prog![mov(0, 0), alu64x(BPF_ADD, 0, 6), mov(6, 7), jmp(BPF_JLT, 0, 7, -4), exit()];
    assert_eq!(run(&p), 7);
    // A callee reading r4, r5, r7 and r0 before any write.
    let p = prog![call_local(2), exit(), exit(), movx(0, 4), alu64x(BPF_ADD, 0, 5), alu64x(BPF_ADD, 0, 7), exit()];
    assert_eq!(run(&p), 0);
    // r0 read by exit when nothing wrote it, r2 (not an argument here) and r9 by a store.
    assert_eq!(run(&prog![jmp(BPF_JNE, 2, 0, 1), exit(), mov(0, 1), exit()]), 0);
    for r in [3, 4, 5] {
        assert_eq!(r0(prog![jmp(BPF_JEQ, 1, 0, 1), mov(r, 1), movx(0, r)]), 0, "r{r}");
    }
}

#[test]
fn alu64_arithmetic() {
    assert_eq!(r0(prog![mov(0, -1)]), u64::MAX);
    assert_eq!(r0(prog![mov(0, 10), alu64(BPF_ADD, 0, -3)]), 7);
    assert_eq!(r0(prog![mov(0, 0), alu64(BPF_SUB, 0, 1)]), u64::MAX);
    assert_eq!(r0(prog![lddw(0, u64::MAX), alu64(BPF_ADD, 0, 1)]), 0);
    assert_eq!(r0(prog![lddw(0, 0x1_0000_0001), movx(1, 0), alu64x(BPF_MUL, 0, 1)]), 0x2_0000_0001);
    assert_eq!(r0(prog![mov(0, 3), alu64(BPF_MUL, 0, -2)]), -6i64 as u64);
    assert_eq!(r0(prog![mov(0, 3), alu64(BPF_MUL, 0, 1_000_000)]), 3_000_000);
    assert_eq!(r0(prog![mov(0, 0), alu64(BPF_OR, 0, -2)]), 0xffff_ffff_ffff_fffe);
    assert_eq!(r0(prog![mov(0, -1), alu64(BPF_AND, 0, 0x7fff_ffff)]), 0x7fff_ffff);
    assert_eq!(r0(prog![mov(0, -1), alu64(BPF_AND, 0, -16)]), 0xffff_ffff_ffff_fff0);
    assert_eq!(r0(prog![lddw(0, 0xff00_ff00_ff00_ff00), alu64(BPF_XOR, 0, -1)]), 0x00ff_00ff_00ff_00ff);
    assert_eq!(r0(prog![mov(0, 5), Insn::new(BPF_ALU64 | BPF_NEG, 0, 0, 0, 0)]), -5i64 as u64);
    assert_eq!(r0(prog![lddw(0, 1 << 63), Insn::new(BPF_ALU64 | BPF_NEG, 0, 0, 0, 0)]), 1 << 63);
    assert_eq!(
        r0(prog![
            mov(3, 40),
            mov(4, 2),
            movx(0, 3),
            alu64x(BPF_ADD, 0, 4),
            alu64x(BPF_SUB, 0, 4),
            alu64x(BPF_ADD, 0, 4)
        ]),
        42
    );
}

#[test]
fn alu32_zero_extends() {
    assert_eq!(r0(prog![alu32(BPF_MOV, 0, -1)]), 0xffff_ffff);
    assert_eq!(r0(prog![lddw(0, 0xffff_ffff_0000_0001), alu32(BPF_ADD, 0, 1)]), 2);
    assert_eq!(r0(prog![mov(0, 0), alu32(BPF_SUB, 0, 1)]), 0xffff_ffff);
    assert_eq!(r0(prog![mov(0, 0x10000), alu32x(BPF_MUL, 0, 0)]), 0);
    assert_eq!(r0(prog![mov(0, 3), alu32(BPF_MUL, 0, -2)]), 0xffff_fffa);
    assert_eq!(r0(prog![mov(0, -1), alu32(BPF_AND, 0, -1)]), 0xffff_ffff);
    assert_eq!(r0(prog![mov(0, -1), alu32(BPF_OR, 0, 0)]), 0xffff_ffff);
    assert_eq!(r0(prog![lddw(0, 0x1234_5678_0000_0005), Insn::new(BPF_ALU | BPF_NEG, 0, 0, 0, 0)]), 0xffff_fffb);
    assert_eq!(r0(prog![lddw(1, 0xdead_beef_0000_0007), alu32x(BPF_MOV, 0, 1)]), 7);
    // mov w0, w0 only zero-extends.
    assert_eq!(r0(prog![mov(0, -1), alu32x(BPF_MOV, 0, 0)]), 0xffff_ffff);
    assert_eq!(r0(prog![mov(0, -1), alu32x(BPF_XOR, 0, 0)]), 0);
}

/// Divides `a` by `b` with the class, signedness and op given, with `b` both as a register
/// (r1, r0, r3 and r4 as destination) and, when it fits, as an immediate.
fn divmod(class: u8, op: u8, signed: bool, a: u64, b: u64) -> u64 {
    let off = i16::from(signed);
    let x = Insn::new(class | BPF_X | op, 0, 2, off, 0);
    let want = r0(prog![lddw(0, a), lddw(2, b), x]);
    for dst in [1u8, 3, 4, 5, 9] {
        let x = Insn::new(class | BPF_X | op, dst, 2, off, 0);
        assert_eq!(r0(prog![lddw(dst, a), lddw(2, b), x, movx(0, dst)]), want, "dst r{dst}");
    }
    // Divisor in r3 (rdx) and r0 (rax), which x86 division uses itself.
    let x = Insn::new(class | BPF_X | op, 1, 3, off, 0);
    assert_eq!(r0(prog![lddw(1, a), lddw(3, b), x, movx(0, 1)]), want, "src r3");
    let x = Insn::new(class | BPF_X | op, 3, 0, off, 0);
    assert_eq!(r0(prog![lddw(3, a), lddw(0, b), x, movx(0, 3)]), want, "src r0");
    let imm_fits = if class == BPF_ALU64 { b as i64 as i32 as i64 == b as i64 } else { true };
    if imm_fits {
        let k = Insn::new(class | BPF_K | op, 0, 0, off, b as i32);
        assert_eq!(r0(prog![lddw(0, a), k]), want, "immediate");
    }
    want
}

#[test]
fn div_mod_unsigned() {
    let (d64, d32) = (BPF_ALU64, BPF_ALU);
    assert_eq!(divmod(d64, BPF_DIV, false, 100, 7), 14);
    assert_eq!(divmod(d64, BPF_MOD, false, 100, 7), 2);
    assert_eq!(divmod(d64, BPF_DIV, false, 100, 0), 0);
    assert_eq!(divmod(d64, BPF_MOD, false, 100, 0), 100);
    assert_eq!(divmod(d64, BPF_MOD, false, u64::MAX, 0), u64::MAX);
    assert_eq!(divmod(d64, BPF_DIV, false, u64::MAX, 2), u64::MAX / 2);
    assert_eq!(divmod(d64, BPF_DIV, false, 100, 8), 12);
    assert_eq!(divmod(d64, BPF_MOD, false, 100, 8), 4);
    assert_eq!(divmod(d64, BPF_DIV, false, 100, 1), 100);
    assert_eq!(divmod(d64, BPF_MOD, false, 100, 1), 0);
    // imm -1 is 2^64 - 1 for 64-bit division.
    assert_eq!(divmod(d64, BPF_DIV, false, 100, u64::MAX), 0);
    assert_eq!(divmod(d64, BPF_DIV, false, u64::MAX, u64::MAX), 1);
    assert_eq!(divmod(d64, BPF_MOD, false, 100, u64::MAX), 100);
    // 32-bit: the upper halves are ignored, the result zero-extended.
    assert_eq!(divmod(d32, BPF_DIV, false, 0xffff_ffff_0000_0064, 7), 14);
    assert_eq!(divmod(d32, BPF_MOD, false, 0xffff_ffff_0000_0064, 0x5_0000_0007), 2);
    assert_eq!(divmod(d32, BPF_DIV, false, 0xffff_ffff_0000_0064, 0), 0);
    assert_eq!(divmod(d32, BPF_MOD, false, 0xffff_ffff_0000_0064, 0), 0x64);
    assert_eq!(divmod(d32, BPF_MOD, false, 0xffff_ffff_0000_0064, 0x1_0000_0000), 0x64);
    assert_eq!(divmod(d32, BPF_DIV, false, 0xffff_ffff, 0xffff_ffff), 1);
    assert_eq!(divmod(d32, BPF_DIV, false, 0xffff_ffff, 0x8000_0000), 1);
    assert_eq!(divmod(d32, BPF_MOD, false, 0xffff_ffff, 0x8000_0000), 0x7fff_ffff);
}

#[test]
fn div_mod_signed() {
    let (d64, d32) = (BPF_ALU64, BPF_ALU);
    let m = |v: i64| v as u64;
    assert_eq!(divmod(d64, BPF_DIV, true, m(-7), 2), m(-3));
    assert_eq!(divmod(d64, BPF_MOD, true, m(-7), 2), m(-1));
    assert_eq!(divmod(d64, BPF_MOD, true, 7, m(-2)), 1);
    assert_eq!(divmod(d64, BPF_DIV, true, 7, m(-2)), m(-3));
    assert_eq!(divmod(d64, BPF_DIV, true, m(-7), 0), 0);
    assert_eq!(divmod(d64, BPF_MOD, true, m(-7), 0), m(-7));
    assert_eq!(divmod(d64, BPF_DIV, true, 1 << 63, m(-1)), 1 << 63);
    assert_eq!(divmod(d64, BPF_MOD, true, 1 << 63, m(-1)), 0);
    assert_eq!(divmod(d64, BPF_DIV, true, 42, m(-1)), m(-42));
    assert_eq!(divmod(d64, BPF_DIV, true, 1 << 63, 8), m(i64::MIN / 8));
    // 32-bit: low halves as i32, results zero-extended.
    assert_eq!(divmod(d32, BPF_DIV, true, 0x1234_5678_ffff_fff9, 2), 0xffff_fffd);
    assert_eq!(divmod(d32, BPF_MOD, true, 0x1234_5678_ffff_fff9, 2), 0xffff_ffff);
    assert_eq!(divmod(d32, BPF_DIV, true, 0x1234_5678_ffff_fff9, 0), 0);
    assert_eq!(divmod(d32, BPF_MOD, true, 0x1234_5678_ffff_fff9, 0), 0xffff_fff9);
    assert_eq!(divmod(d32, BPF_DIV, true, 0x8000_0000, 0xffff_ffff), 0x8000_0000);
    assert_eq!(divmod(d32, BPF_MOD, true, 0x8000_0000, 0xffff_ffff), 0);
    assert_eq!(divmod(d32, BPF_DIV, true, 0x1_8000_0000, 0x7_ffff_ffff), 0x8000_0000);
    // A 64-bit -1 whose low half is not -1 is no special case for 32-bit division.
    assert_eq!(divmod(d32, BPF_DIV, true, 0x8000_0000, 0xffff_ffff_0000_0002), 0xc000_0000);
}

#[test]
fn shifts() {
    assert_eq!(r0(prog![mov(0, 1), alu64(BPF_LSH, 0, 63)]), 1 << 63);
    assert_eq!(r0(prog![mov(0, 1), alu64(BPF_LSH, 0, 64)]), 1);
    assert_eq!(r0(prog![mov(0, 1), alu64(BPF_LSH, 0, -1)]), 1 << 63);
    assert_eq!(r0(prog![mov(0, 1), mov(1, 65), alu64x(BPF_LSH, 0, 1)]), 2);
    assert_eq!(r0(prog![mov(0, 1), mov(4, -1), alu64x(BPF_LSH, 0, 4)]), 1 << 63);
    assert_eq!(r0(prog![mov(0, -1), alu64(BPF_RSH, 0, 60)]), 0xf);
    assert_eq!(r0(prog![mov(0, -16), alu64(BPF_ARSH, 0, 2)]), -4i64 as u64);
    assert_eq!(r0(prog![mov(0, -16), mov(2, 130), alu64x(BPF_ARSH, 0, 2)]), -4i64 as u64);
    // 32-bit: amount & 31, low half only, zero-extended even when the amount is 0.
    assert_eq!(r0(prog![lddw(0, 0xffff_ffff_0000_0001), alu32(BPF_LSH, 0, 32)]), 1);
    assert_eq!(r0(prog![lddw(0, 0xffff_ffff_0000_0001), mov(1, 0), alu32x(BPF_LSH, 0, 1)]), 1);
    assert_eq!(r0(prog![lddw(0, 0xffff_ffff_0000_0001), mov(4, 32), alu32x(BPF_RSH, 0, 4)]), 1);
    assert_eq!(r0(prog![lddw(0, 0xffff_ffff_0000_0001), alu32(BPF_LSH, 0, 31)]), 0x8000_0000);
    assert_eq!(r0(prog![lddw(0, 0x1_8000_0000), alu32(BPF_RSH, 0, 4)]), 0x0800_0000);
    assert_eq!(r0(prog![lddw(0, 0x1234_5678_8000_0000), alu32(BPF_ARSH, 0, 4)]), 0xf800_0000);
    assert_eq!(r0(prog![lddw(0, 0x1234_5678_8000_0000), mov(3, 36), alu32x(BPF_ARSH, 0, 3)]), 0xf800_0000);
    // The count register r4 (cl) as destination, and shifting by itself.
    assert_eq!(r0(prog![mov(4, 3), mov(1, 2), alu64x(BPF_LSH, 4, 1), movx(0, 4)]), 12);
    assert_eq!(r0(prog![mov(4, 3), alu64x(BPF_LSH, 4, 4), movx(0, 4)]), 24);
    assert_eq!(r0(prog![mov(4, 7), mov(1, 1), alu64x(BPF_LSH, 1, 4), alu64x(BPF_ADD, 4, 1), movx(0, 4)]), 7 + 128);
}

#[test]
fn movsx() {
    let sx = |class: u8, off: i16, v: u64| r0(prog![lddw(1, v), Insn::new(class | BPF_X | BPF_MOV, 0, 1, off, 0)]);
    assert_eq!(sx(BPF_ALU64, 8, 0x180), 0xffff_ffff_ffff_ff80);
    assert_eq!(sx(BPF_ALU64, 8, 0x17f), 0x7f);
    assert_eq!(sx(BPF_ALU64, 16, 0x1_8000), 0xffff_ffff_ffff_8000);
    assert_eq!(sx(BPF_ALU64, 16, 0x1_7fff), 0x7fff);
    assert_eq!(sx(BPF_ALU64, 32, 0x1_8000_0000), 0xffff_ffff_8000_0000);
    assert_eq!(sx(BPF_ALU64, 32, 0xf_7fff_ffff), 0x7fff_ffff);
    assert_eq!(sx(BPF_ALU, 8, 0xffff_0000_0000_0180), 0xffff_ff80);
    assert_eq!(sx(BPF_ALU, 8, 0xffff_0000_0000_017f), 0x7f);
    assert_eq!(sx(BPF_ALU, 16, 0xffff_0000_0001_8000), 0xffff_8000);
    // Byte registers that need a REX prefix (sil, dil) and r6..r9 as sources.
    for src in [1u8, 2, 6, 9] {
        assert_eq!(r0(prog![mov(src, 0x80), Insn::new(BPF_ALU64 | BPF_X | BPF_MOV, 0, src, 8, 0)]), u64::MAX - 0x7f);
    }
}

#[test]
fn byte_swaps() {
    let v = 0x0102_0304_0506_0708u64;
    let end = |class: u8, src: u8, imm: i32| r0(prog![lddw(0, v), Insn::new(class | BPF_END | src, 0, 0, 0, imm)]);
    assert_eq!(end(BPF_ALU, BPF_TO_LE, 16), 0x0708);
    assert_eq!(end(BPF_ALU, BPF_TO_LE, 32), 0x0506_0708);
    assert_eq!(end(BPF_ALU, BPF_TO_LE, 64), v);
    assert_eq!(end(BPF_ALU, BPF_TO_BE, 16), 0x0807);
    assert_eq!(end(BPF_ALU, BPF_TO_BE, 32), 0x0807_0605);
    assert_eq!(end(BPF_ALU, BPF_TO_BE, 64), 0x0807_0605_0403_0201);
    assert_eq!(end(BPF_ALU64, 0, 16), 0x0807);
    assert_eq!(end(BPF_ALU64, 0, 32), 0x0807_0605);
    assert_eq!(end(BPF_ALU64, 0, 64), 0x0807_0605_0403_0201);
}

#[test]
fn lddw_values() {
    for v in [
        0,
        1,
        0x7fff_ffff,
        0x8000_0000,
        0xffff_ffff,
        0x1_0000_0000,
        u64::MAX,
        0xffff_ffff_8000_0000,
        0x1234_5678_9abc_def0,
    ] {
        assert_eq!(r0(prog![lddw(0, v)]), v, "{v:#x}");
        assert_eq!(r0(prog![lddw(9, v), movx(0, 9)]), v, "{v:#x} in r9");
    }
}

// ---- loads and stores ----

#[test]
fn loads_zero_and_sign_extend() {
    let mut buf = [0x80u8, 0x81, 0x82, 0x83, 0x84, 0x85, 0x86, 0x87, 0x7f, 0x7f, 0x7f, 0x7f];
    assert_eq!(run_buf(&prog![ldx(BPF_B, 0, 1, 0), exit()], &mut buf), 0x80);
    assert_eq!(run_buf(&prog![ldx(BPF_H, 0, 1, 0), exit()], &mut buf), 0x8180);
    assert_eq!(run_buf(&prog![ldx(BPF_W, 0, 1, 0), exit()], &mut buf), 0x8382_8180);
    assert_eq!(run_buf(&prog![ldx(BPF_DW, 0, 1, 0), exit()], &mut buf), 0x8786_8584_8382_8180);
    assert_eq!(run_buf(&prog![ldxsx(BPF_B, 0, 1, 0), exit()], &mut buf), 0xffff_ffff_ffff_ff80);
    assert_eq!(run_buf(&prog![ldxsx(BPF_H, 0, 1, 0), exit()], &mut buf), 0xffff_ffff_ffff_8180);
    assert_eq!(run_buf(&prog![ldxsx(BPF_W, 0, 1, 0), exit()], &mut buf), 0xffff_ffff_8382_8180);
    assert_eq!(run_buf(&prog![ldxsx(BPF_B, 0, 1, 8), exit()], &mut buf), 0x7f);
    assert_eq!(run_buf(&prog![ldxsx(BPF_W, 0, 1, 8), exit()], &mut buf), 0x7f7f_7f7f);
    // Upper bits of the destination are replaced.
    assert_eq!(run_buf(&prog![mov(0, -1), ldx(BPF_B, 0, 1, 1), exit()], &mut buf), 0x81);
    // Negative offsets and a base in r7 (r13: needs a displacement byte) and r0 (rax).
    assert_eq!(run_buf(&prog![movx(7, 1), alu64(BPF_ADD, 7, 4), ldx(BPF_B, 0, 7, -2), exit()], &mut buf), 0x82);
    assert_eq!(run_buf(&prog![movx(7, 1), ldx(BPF_H, 0, 7, 0), exit()], &mut buf), 0x8180);
    assert_eq!(run_buf(&prog![movx(0, 1), ldx(BPF_B, 0, 0, 3), exit()], &mut buf), 0x83);
}

#[test]
fn loads_with_large_offsets() {
    let mut buf = vec![0u8; 70_000];
    buf[300] = 0x11;
    buf[65_000] = 0x22;
    let p = prog![
        ldx(BPF_B, 0, 1, 300),
        movx(2, 1),
        alu64(BPF_ADD, 2, 65_000 + 32_000),
        ldx(BPF_B, 3, 2, -32_000),
        alu64(BPF_LSH, 3, 8),
        alu64x(BPF_OR, 0, 3),
        exit()
    ];
    assert_eq!(run_buf(&p, &mut buf), 0x2211);
}

#[test]
fn stores_truncate_and_leave_neighbours() {
    let fresh = || [0xeeu8; 16];
    let mut b = fresh();
    run_buf(&prog![st(BPF_B, 1, 1, 0x1ff), exit()], &mut b);
    assert_eq!(b, [0xee, 0xff, 0xee, 0xee, 0xee, 0xee, 0xee, 0xee, 0xee, 0xee, 0xee, 0xee, 0xee, 0xee, 0xee, 0xee]);
    let mut b = fresh();
    run_buf(&prog![st(BPF_H, 1, 2, 0x12345), exit()], &mut b);
    assert_eq!(&b[..6], &[0xee, 0xee, 0x45, 0x23, 0xee, 0xee]);
    let mut b = fresh();
    run_buf(&prog![st(BPF_W, 1, 4, -2), exit()], &mut b);
    assert_eq!(&b[..10], &[0xee, 0xee, 0xee, 0xee, 0xfe, 0xff, 0xff, 0xff, 0xee, 0xee]);
    let mut b = fresh();
    run_buf(&prog![st(BPF_DW, 1, 8, -2), exit()], &mut b);
    assert_eq!(u64::from_le_bytes(b[8..].try_into().unwrap()), 0xffff_ffff_ffff_fffe);
    assert_eq!(&b[..8], &[0xee; 8]);
    let mut b = fresh();
    run_buf(&prog![st(BPF_DW, 1, 0, 0x7fff_ffff), exit()], &mut b);
    assert_eq!(u64::from_le_bytes(b[..8].try_into().unwrap()), 0x7fff_ffff);

    let v = 0x8877_6655_4433_2211u64;
    for (size, n) in [(BPF_B, 1), (BPF_H, 2), (BPF_W, 4), (BPF_DW, 8)] {
        // Sources r2 (rsi: its low byte needs REX) and r9 (r15).
        for src in [2u8, 9] {
            let mut b = fresh();
            run_buf(&prog![lddw(src, v), stx(size, 1, src, 3), exit()], &mut b);
            let mut want = fresh();
            want[3..3 + n].copy_from_slice(&v.to_le_bytes()[..n]);
            assert_eq!(b, want, "size {n} from r{src}");
        }
    }
}

#[test]
fn stack_via_r10() {
    let p = prog![
        lddw(1, 0x1122_3344_5566_7788),
        stx(BPF_DW, 10, 1, -8),
        st(BPF_W, 10, -512, 7),
        st(BPF_B, 10, -9, 0x55),
        ldx(BPF_W, 0, 10, -4),
        ldx(BPF_W, 2, 10, -512),
        alu64x(BPF_ADD, 0, 2),
        ldx(BPF_B, 2, 10, -9),
        alu64x(BPF_ADD, 0, 2),
        exit(),
    ];
    assert_eq!(run(&p), 0x1122_3344 + 7 + 0x55);
    // r10 copied into another register points at the same stack.
    assert_eq!(r0(prog![movx(1, 10), st(BPF_DW, 1, -16, 99), ldx(BPF_DW, 0, 10, -16)]), 99);
}

// ---- atomics ----

/// Runs `insns` with r1 = a 16-byte buffer holding `cell` (as u64) then `0xAAAA...`; returns
/// (r0, cell, second word).
fn run_atomic(insns: &[Insn], cell: u64) -> (u64, u64, u64) {
    let mut buf = [cell, 0xaaaa_aaaa_aaaa_aaaa];
    let j = compile(insns);
    // SAFETY: the programs only touch the 16 bytes at r1.
    let r = unsafe { j.run(buf.as_mut_ptr() as u64, 0) }.expect("run");
    (r, buf[0], buf[1])
}

#[test]
fn atomic_arithmetic_and_fetch() {
    const ADD: i32 = 0x00;
    const OR: i32 = 0x40;
    const AND: i32 = 0x50;
    const XOR: i32 = 0xa0;
    // (op, cell, src, new cell) for DW.
    for (op, cell, src, new) in [
        (ADD, 10u64, 5u64, 15u64),
        (ADD, u64::MAX, 2, 1),
        (OR, 0xf0, 0x0f, 0xff),
        (AND, 0xf0f0, 0xff00, 0xf000),
        (XOR, 0xff, 0x0f, 0xf0),
    ] {
        // No fetch: src unchanged (returned in r0).
        let p = prog![lddw(2, src), atomic(BPF_DW, 1, 2, 0, op), movx(0, 2), exit()];
        assert_eq!(run_atomic(&p, cell), (src, new, 0xaaaa_aaaa_aaaa_aaaa), "op {op:#x}");
        // Fetch: src gets the old value.
        let p = prog![lddw(2, src), atomic(BPF_DW, 1, 2, 0, op | BPF_FETCH), movx(0, 2), exit()];
        assert_eq!(run_atomic(&p, cell), (cell, new, 0xaaaa_aaaa_aaaa_aaaa), "op {op:#x} fetch");
        // Fetch into r0 itself (the cmpxchg loop uses rax).
        let p = prog![lddw(0, src), atomic(BPF_DW, 1, 0, 0, op | BPF_FETCH), exit()];
        assert_eq!(run_atomic(&p, cell).0, cell, "op {op:#x} fetch into r0");
    }
    // W: only the low half changes; fetched values are zero-extended; src's upper half ignored.
    let cell = 0x1234_5678_ffff_ffffu64;
    let p = prog![lddw(2, 0xffff_ffff_0000_0001), atomic(BPF_W, 1, 2, 0, ADD | BPF_FETCH), movx(0, 2), exit()];
    assert_eq!(run_atomic(&p, cell), (0xffff_ffff, 0x1234_5678_0000_0000, 0xaaaa_aaaa_aaaa_aaaa));
    let p = prog![lddw(2, 0xffff_ffff_0000_0001), atomic(BPF_W, 1, 2, 0, ADD), movx(0, 2), exit()];
    assert_eq!(run_atomic(&p, cell), (0xffff_ffff_0000_0001, 0x1234_5678_0000_0000, 0xaaaa_aaaa_aaaa_aaaa));
    let p = prog![lddw(2, 0xffff_ffff_0000_0f0f), atomic(BPF_W, 1, 2, 4, OR | BPF_FETCH), movx(0, 2), exit()];
    assert_eq!(run_atomic(&p, 0x0000_00f0_dead_beef), (0xf0, 0x0000_0fff_dead_beef, 0xaaaa_aaaa_aaaa_aaaa));
    let p = prog![mov(3, 0xff), atomic(BPF_W, 1, 3, 0, AND | BPF_FETCH), movx(0, 3), exit()];
    assert_eq!(run_atomic(&p, 0x1111_1111_8765_4321), (0x8765_4321, 0x1111_1111_0000_0021, 0xaaaa_aaaa_aaaa_aaaa));
    let p = prog![mov(0, -1), atomic(BPF_W, 1, 0, 0, XOR | BPF_FETCH), exit()];
    assert_eq!(run_atomic(&p, 0x1111_1111_0000_00ff), (0xff, 0x1111_1111_ffff_ff00, 0xaaaa_aaaa_aaaa_aaaa));
}

#[test]
fn atomic_xchg_and_cmpxchg() {
    let a = 0xaaaa_aaaa_aaaa_aaaa;
    // xchg: src <-> memory.
    let p = prog![lddw(2, 0x1111_2222_3333_4444), atomic(BPF_DW, 1, 2, 0, BPF_XCHG), movx(0, 2), exit()];
    assert_eq!(run_atomic(&p, 77), (77, 0x1111_2222_3333_4444, a));
    let p = prog![lddw(2, 0x1111_2222_3333_4444), atomic(BPF_W, 1, 2, 0, BPF_XCHG), movx(0, 2), exit()];
    assert_eq!(run_atomic(&p, 0x5555_6666_8000_0001), (0x8000_0001, 0x5555_6666_3333_4444, a));
    // cmpxchg success: r0 == memory, memory = src, r0 = old.
    let p = prog![mov(0, 77), mov(2, 99), atomic(BPF_DW, 1, 2, 0, BPF_CMPXCHG), exit()];
    assert_eq!(run_atomic(&p, 77), (77, 99, a));
    // failure: memory unchanged, r0 = old.
    let p = prog![mov(0, 76), mov(2, 99), atomic(BPF_DW, 1, 2, 0, BPF_CMPXCHG), exit()];
    assert_eq!(run_atomic(&p, 77), (77, 77, a));
    // W compares the low halves; r0 gets the old value zero-extended, success or not.
    let p = prog![lddw(0, 0xffff_ffff_8000_0001), mov(2, 5), atomic(BPF_W, 1, 2, 0, BPF_CMPXCHG), exit()];
    assert_eq!(run_atomic(&p, 0x1234_5678_8000_0001), (0x8000_0001, 0x1234_5678_0000_0005, a));
    let p = prog![lddw(0, 0xffff_ffff_8000_0002), mov(2, 5), atomic(BPF_W, 1, 2, 0, BPF_CMPXCHG), exit()];
    assert_eq!(run_atomic(&p, 0x1234_5678_8000_0001), (0x8000_0001, 0x1234_5678_8000_0001, a));
    // The base register is r0 itself.
    let p = prog![movx(0, 1), mov(2, 5), atomic(BPF_DW, 0, 2, 8, BPF_CMPXCHG), exit()];
    assert_eq!(run_atomic(&p, 0), (a, 0, a));
}

#[test]
fn atomics_are_atomic_across_threads() {
    // Each thread: 20000 times `lock add [r1], 1`, and 20000 times fetch-xor of its own bit
    // into [r1 + 8] (an even count, so the bits cancel unless an update is lost).
    let p = prog![
        mov(2, 20_000),
        mov(3, 1),
        movx(5, 1),
        alu64(BPF_ADD, 5, 8),
        // loop:
        atomic(BPF_DW, 1, 3, 0, 0x00),
        movx(4, 6),
        atomic(BPF_DW, 5, 4, 0, 0xa0 | BPF_FETCH),
        alu64(BPF_SUB, 2, 1),
        jmp(BPF_JNE, 2, 0, -5),
        exit(),
    ];
    // r6 = bit; set through a tiny wrapper program per thread.
    let mut full = Vec::new();
    full.push(Insn::new(BPF_ALU64 | BPF_X | BPF_MOV, 6, 2, 0, 0)); // r6 = r2 (the bit)
    full.extend(p);
    let j = Arc::new(compile(&full));
    let cells = Arc::new([std::sync::atomic::AtomicU64::new(0), std::sync::atomic::AtomicU64::new(0)]);
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let j = Arc::clone(&j);
            let cells = Arc::clone(&cells);
            std::thread::spawn(move || {
                let base = cells.as_ptr() as u64;
                // SAFETY: the program touches only the two atomics (16 bytes at r1), which
                // outlive the run, and does so with locked instructions.
                unsafe { j.run(base, 1 << t) }.expect("run")
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(cells[0].load(std::sync::atomic::Ordering::SeqCst), 80_000);
    assert_eq!(cells[1].load(std::sync::atomic::Ordering::SeqCst), 0);
}

// ---- jumps ----

fn cond_taken(class: u8, op: u8, a: u64, b: u64, x: bool) -> bool {
    let jump =
        if x { Insn::new(class | BPF_X | op, 1, 2, 1, 0) } else { Insn::new(class | BPF_K | op, 1, 0, 1, b as i32) };
    let p = prog![lddw(1, a), lddw(2, b), mov(0, 1), jump, mov(0, 0), exit()];
    run(&p) == 1
}

#[test]
fn conditional_jumps_exact() {
    let m1 = u64::MAX;
    // (op, a, b, taken for JMP, taken for JMP32), b fits an immediate.
    let cases: &[(u8, u64, u64, bool, bool)] = &[
        (BPF_JEQ, 5, 5, true, true),
        (BPF_JEQ, 5, 6, false, false),
        (BPF_JEQ, 0x1_0000_0005, 5, false, true),
        (BPF_JNE, 5, 5, false, false),
        (BPF_JNE, 0x1_0000_0005, 5, true, false),
        (BPF_JGT, 6, 5, true, true),
        (BPF_JGT, 5, 5, false, false),
        (BPF_JGT, m1, 1, true, true),
        (BPF_JGT, 0x1_0000_0000, 1, true, false),
        (BPF_JGE, 5, 5, true, true),
        (BPF_JGE, 4, 5, false, false),
        (BPF_JLT, 4, 5, true, true),
        (BPF_JLT, 5, 5, false, false),
        (BPF_JLT, 1, m1, true, true),
        (BPF_JLE, 5, 5, true, true),
        (BPF_JLE, 6, 5, false, false),
        (BPF_JSGT, m1, 1, false, false),
        (BPF_JSGT, 1, m1, true, true),
        (BPF_JSGT, 5, 5, false, false),
        (BPF_JSGT, 0xffff_ffff, 1, true, false),
        (BPF_JSGE, 5, 5, true, true),
        (BPF_JSGE, m1, 0, false, false),
        (BPF_JSLT, m1, 0, true, true),
        (BPF_JSLT, 0, 0, false, false),
        (BPF_JSLT, 0x8000_0000, 0, false, true),
        (BPF_JSLE, 5, 5, true, true),
        (BPF_JSLE, 6, 5, false, false),
        (BPF_JSLE, 1 << 63, 0x7fff_ffff, true, true),
        (BPF_JSLE, 0x8000_0000, 0x7fff_ffff, false, true),
        (BPF_JSET, 6, 2, true, true),
        (BPF_JSET, 6, 1, false, false),
        (BPF_JSET, 0x1_0000_0000, m1, true, false),
    ];
    for &(op, a, b, t64, t32) in cases {
        for x in [true, false] {
            assert_eq!(cond_taken(BPF_JMP, op, a, b, x), t64, "jmp {op:#x} {a:#x} {b:#x} x={x}");
            assert_eq!(cond_taken(BPF_JMP32, op, a, b, x), t32, "jmp32 {op:#x} {a:#x} {b:#x} x={x}");
        }
    }
    // A K operand is sign-extended for 64-bit compares: imm -1 is u64::MAX.
    assert!(cond_taken(BPF_JMP, BPF_JEQ, m1, m1, false));
    assert!(!cond_taken(BPF_JMP, BPF_JEQ, 0xffff_ffff, m1, false));
    assert!(cond_taken(BPF_JMP32, BPF_JEQ, 0xffff_ffff, m1, false));
}

#[test]
fn unconditional_jumps() {
    assert_eq!(r0(prog![mov(0, 1), ja(1), mov(0, 2), alu64(BPF_ADD, 0, 10)]), 11);
    assert_eq!(r0(prog![mov(0, 1), gotol(1), mov(0, 2), alu64(BPF_ADD, 0, 10)]), 11);
    // Jumps to the next instruction do nothing.
    assert_eq!(r0(prog![mov(0, 1), ja(0), jmp(BPF_JEQ, 0, 1, 0), gotol(0), alu64(BPF_ADD, 0, 1)]), 2);
    // Backward: a loop summing 1..=10.
    assert_eq!(
        r0(prog![mov(0, 0), mov(1, 10), alu64x(BPF_ADD, 0, 1), alu64(BPF_SUB, 1, 1), jmp(BPF_JNE, 1, 0, -3)]),
        55
    );
    // Forward and backward gotol.
    assert_eq!(r0(prog![mov(0, 0), gotol(2), alu64(BPF_ADD, 0, 100), exit(), alu64(BPF_ADD, 0, 1), gotol(-3)]), 1);
}

#[test]
fn loop_back_to_the_first_instruction() {
    // Jumping to instruction 0 must not run the prologue again.
    assert_eq!(run(&prog![alu64(BPF_ADD, 0, 1), jmp(BPF_JLT, 0, 10, -2), exit()]), 10);
    // The same in a called function that uses the stack and r6.
    let p = prog![
        call_local(1),
        exit(),
        // f:
        alu64(BPF_ADD, 6, 1),
        stx(BPF_DW, 10, 6, -8),
        ldx(BPF_DW, 0, 10, -8),
        jmp(BPF_JLT, 0, 5, -4),
        exit(),
    ];
    assert_eq!(run(&p), 5);
}

#[test]
fn long_jumps_forward_and_backward() {
    // 200 `add r0, 1` (4 bytes each) between the jumps: too far for rel8.
    let mut p = prog![mov(0, 0), mov(1, 3), ja(200)];
    for _ in 0..200 {
        p.push(alu64(BPF_ADD, 0, 1));
    }
    // Skip the adds, then loop three times over a long body.
    p.extend(prog![alu64(BPF_ADD, 0, 1000)]);
    for _ in 0..100 {
        p.push(alu64(BPF_ADD, 0, 2));
    }
    p.extend(prog![alu64(BPF_SUB, 1, 1), jmp(BPF_JNE, 1, 0, -103), exit()]);
    assert_eq!(run(&p), 3 * (1000 + 200));
    // Conditional forward jump over a long block.
    let mut p = prog![mov(0, 7), jmp(BPF_JEQ, 0, 7, 300)];
    for _ in 0..300 {
        p.push(alu64(BPF_MUL, 0, 3));
    }
    p.push(exit());
    assert_eq!(run(&p), 7);
}

#[test]
fn many_jumps_relax() {
    // A chain of jumps whose distances shrink as their neighbours become short.
    let mut p = prog![mov(0, 0)];
    for i in 0..400 {
        p.push(jmp(BPF_JEQ, 0, 12345, 40));
        p.push(alu64(BPF_ADD, 0, i));
    }
    p.extend(vec![ja(0); 40]);
    p.push(exit());
    assert_eq!(run(&p), (0..400).sum::<i32>() as u64);
}

// ---- calls ----

#[test]
fn helper_call_with_five_arguments() {
    let p = prog![mov(1, 1), mov(2, 2), mov(3, 3), mov(4, 4), mov(5, 5), call(H_SUM5), exit()];
    assert_eq!(run(&p), 54321);
}

#[test]
fn helper_calls_keep_r6_to_r9_and_the_stack() {
    let p = prog![
        lddw(6, 1 << 8),
        lddw(7, 1 << 16),
        lddw(8, 1 << 24),
        lddw(9, 1 << 32),
        st(BPF_DW, 10, -8, 0x10),
        mov(1, 123),
        call(H_CLOBBER),
        call(H_SUM5),
        movx(0, 6),
        alu64x(BPF_ADD, 0, 7),
        alu64x(BPF_ADD, 0, 8),
        alu64x(BPF_ADD, 0, 9),
        ldx(BPF_DW, 1, 10, -8),
        alu64x(BPF_ADD, 0, 1),
        exit(),
    ];
    assert_eq!(run(&p), (1 << 8) + (1 << 16) + (1 << 24) + (1 << 32) + 0x10);
}

#[test]
fn helpers_see_an_aligned_stack_at_every_depth() {
    // Frames of different shapes: no stack, stack, r6..r9 saved, both.
    let p = prog![
        call(H_ALIGN),
        movx(6, 0),
        call_local(2),
        alu64x(BPF_OR, 0, 6),
        exit(),
        // f1 (5): no stack, writes r6
        call(H_ALIGN),
        movx(6, 0),
        call_local(2),
        alu64x(BPF_OR, 0, 6),
        exit(),
        // f2 (10): stack, writes r7 and r8
        st(BPF_DW, 10, -8, 0),
        call(H_ALIGN),
        movx(7, 0),
        mov(8, 0),
        call_local(2),
        alu64x(BPF_OR, 0, 7),
        exit(),
        // f3 (17): stack, writes nothing
        stx(BPF_DW, 10, 1, -8),
        call(H_ALIGN),
        exit(),
    ];
    assert_eq!(run(&p), 0);
}

#[test]
fn callx_calls_by_id_and_reports_unknown_ids() {
    let body = |id: u64| prog![lddw(6, id), mov(1, 1), mov(2, 2), mov(3, 3), mov(4, 4), mov(5, 5), callx(6), exit()];
    assert_eq!(run(&body(H_SUM5 as u64)), 54321);
    // pc of the callx is 7 (lddw takes two slots).
    for id in [999u64, 3, 0, u64::MAX, (1 << 32) | H_SUM5 as u64] {
        assert_eq!(try_run(&body(id), 0, 0), Err(VmError::UnknownHelper { pc: 7, id }), "id {id:#x}");
    }
    // After an error the same program runs normally again.
    let j = compile(&prog![movx(6, 1), callx(6), exit()]);
    // SAFETY: no memory access.
    unsafe {
        assert_eq!(j.run(4, 0), Err(VmError::UnknownHelper { pc: 1, id: 4 }));
        assert_eq!(j.run(H_SUM5 as u64, 0), Ok(H_SUM5 as u64));
        assert_eq!(j.run(100, 0), Err(VmError::UnknownHelper { pc: 1, id: 100 }));
    }
    // From a nested function the error unwinds every frame.
    let p = prog![
        mov(6, 1),
        call_local(2),
        mov(0, 5),
        exit(),
        st(BPF_DW, 10, -8, 0),
        call_local(1),
        exit(),
        mov(7, 1234),
        callx(7),
        exit()
    ];
    assert_eq!(try_run(&p, 0, 0), Err(VmError::UnknownHelper { pc: 8, id: 1234 }));
}

#[test]
fn local_calls_pass_arguments_and_keep_callee_saved_registers_and_stacks() {
    let p = prog![
        // entry
        lddw(6, 1 << 8),
        lddw(7, 1 << 16),
        lddw(8, 1 << 24),
        lddw(9, 1 << 32),
        lddw(1, 1 << 40),
        stx(BPF_DW, 10, 1, -8),
        mov(1, 1),
        mov(2, 2),
        mov(3, 3),
        mov(4, 4),
        mov(5, 5),
        call_local(7), // f1 at 24
        alu64x(BPF_ADD, 0, 6),
        alu64x(BPF_ADD, 0, 7),
        alu64x(BPF_ADD, 0, 8),
        alu64x(BPF_ADD, 0, 9),
        ldx(BPF_DW, 1, 10, -8),
        alu64x(BPF_ADD, 0, 1),
        exit(),
        // f1 (24): r0 = r1 + 2*r2 + 3*r3 + 4*r4 + 5*r5 + f2(r1 * 100)
        mov(6, -1),
        mov(7, -1),
        mov(8, -1),
        mov(9, -1),
        st(BPF_DW, 10, -8, 1000),
        movx(6, 1),
        movx(0, 2),
        alu64(BPF_MUL, 0, 2),
        alu64x(BPF_ADD, 6, 0),
        movx(0, 3),
        alu64(BPF_MUL, 0, 3),
        alu64x(BPF_ADD, 6, 0),
        movx(0, 4),
        alu64(BPF_MUL, 0, 4),
        alu64x(BPF_ADD, 6, 0),
        movx(0, 5),
        alu64(BPF_MUL, 0, 5),
        alu64x(BPF_ADD, 6, 0),
        alu64(BPF_MUL, 1, 100),
        call_local(4), // f2 at 48
        alu64x(BPF_ADD, 0, 6),
        ldx(BPF_DW, 1, 10, -8),
        alu64x(BPF_ADD, 0, 1), // + 1000 (f1's own stack slot)
        exit(),
        // f2 (48): clobbers r6..r9 and its stack slot, returns r1 + 7
        mov(6, 0),
        mov(7, 0),
        mov(8, 0),
        mov(9, 0),
        st(BPF_DW, 10, -8, 0),
        movx(0, 1),
        alu64(BPF_ADD, 0, 7),
        exit(),
    ];
    let f1 = 1 + 4 + 9 + 16 + 25 + (100 + 7) + 1000;
    assert_eq!(run(&p), f1 + (1 << 8) + (1 << 16) + (1 << 24) + (1 << 32) + (1 << 40));
}

#[test]
fn call_chain_eight_frames_deep() {
    // f_k: store k on its stack, call f_{k+1}, add its stack slot: each frame's slot survives.
    let mut p = Vec::new();
    for k in 0..7 {
        p.extend(prog![
            st(BPF_DW, 10, -8, 1 << k),
            call_local(3),
            ldx(BPF_DW, 1, 10, -8),
            alu64x(BPF_ADD, 0, 1),
            exit()
        ]);
    }
    p.extend(prog![mov(0, 1 << 7), exit()]);
    // Function k starts at 5k; its call at 5k+1 targets 5k+1+3+1 = 5(k+1).
    let j = compile(&p);
    // SAFETY: only stack accesses.
    assert_eq!(unsafe { j.run(0, 0) }, Ok(0xff));
}

#[test]
fn pseudo_func_callbacks() {
    let p = prog![
        ld_func(1, 4), // cb at 5
        mov(2, 5),
        call(H_CALL_CB), // h_call_cb(cb, 5) calls cb(5, 1, 2, 3, 4)
        exit(),
        // cb (5): r0 = r1 * 10 + r2 + r5, through r6 and the stack
        movx(6, 1),
        alu64(BPF_MUL, 6, 10),
        stx(BPF_DW, 10, 6, -8),
        ldx(BPF_DW, 0, 10, -8),
        alu64x(BPF_ADD, 0, 2),
        alu64x(BPF_ADD, 0, 5),
        exit(),
    ];
    assert_eq!(run(&p), 5 * 10 + 1 + 4);

    // The loaded address is the subprogram's entry, callable from Rust.
    let j = compile(&prog![ld_func(0, 2), exit(), movx(0, 1), alu64x(BPF_MUL, 0, 2), alu64x(BPF_ADD, 0, 5), exit()]);
    // SAFETY: no memory access.
    let addr = unsafe { j.run(0, 0) }.unwrap();
    assert_eq!(addr as usize, j.subprog_address(1));
    let code = j.code().as_ptr_range();
    assert!(code.contains(&(addr as *const u8)));
    assert!(code.contains(&(j.subprog_address(0) as *const u8)));
    // SAFETY: a subprogram entry is a C function of this type; it touches no memory.
    let f: HelperFn = unsafe { std::mem::transmute::<usize, HelperFn>(j.subprog_address(1)) };
    // SAFETY: as above.
    assert_eq!(unsafe { f(6, 7, 0, 0, 100) }, 142);
}

#[test]
fn bpf_loop_style_callback_with_local_calls() {
    // sum = 0 on the stack; loop(10, cb, &sum); cb(i, ctx) adds sq(i) to *ctx, stops at i == 7.
    let p = prog![
        st(BPF_DW, 10, -8, 0),
        mov(1, 10),
        ld_func(2, 8), // cb at 11
        movx(3, 10),
        alu64(BPF_ADD, 3, -8),
        call(H_LOOP),
        ldx(BPF_DW, 1, 10, -8),
        alu64(BPF_LSH, 0, 32),
        alu64x(BPF_OR, 0, 1),
        exit(),
        // cb (11): r6 = ctx
        movx(6, 2),
        call_local(7), // sq at 20
        ldx(BPF_DW, 2, 6, 0),
        alu64x(BPF_ADD, 2, 0),
        stx(BPF_DW, 6, 2, 0),
        mov(0, 0),
        jmp(BPF_JNE, 2, 140, 1), // 0+1+4+...+49 = 140 after i == 7
        mov(0, 1),
        exit(),
        // sq (20)
        movx(0, 1),
        alu64x(BPF_MUL, 0, 1),
        exit(),
    ];
    assert_eq!(run(&p), (8 << 32) | 140);
}

#[test]
fn callback_abort_is_reported_by_the_run() {
    let p = prog![
        ld_func(1, 5),
        mov(2, 0),
        call(H_CALL_CB),
        mov(0, 77),
        exit(),
        // cb (6)
        mov(9, 4321),
        callx(9),
        exit(),
    ];
    assert_eq!(try_run(&p, 0, 0), Err(VmError::UnknownHelper { pc: 7, id: 4321 }));
    // Called directly from Rust, an aborting callback returns 1.
    let j = compile(&p);
    // SAFETY: a subprogram entry is a C function of this type.
    let f: HelperFn = unsafe { std::mem::transmute::<usize, HelperFn>(j.subprog_address(1)) };
    // SAFETY: the callback makes no memory access.
    assert_eq!(unsafe { f(0, 0, 0, 0, 0) }, 1);
    // The error of that call outside any run does not leak into a later run.
    let ok = compile(&prog![mov(0, 3), exit()]);
    // SAFETY: no memory access.
    assert_eq!(unsafe { ok.run(0, 0) }, Ok(3));
}

#[test]
#[should_panic(expected = "out of range")]
fn subprog_address_out_of_range_panics() {
    compile(&prog![exit()]).subprog_address(1);
}

#[test]
fn run_mem_empty_buffer() {
    let j = compile(&prog![movx(0, 1), alu64x(BPF_ADD, 0, 2), exit()]);
    // SAFETY: no memory access.
    assert_eq!(unsafe { j.run_mem(&mut []) }, Ok(0));
    let mut b = [0u8; 5];
    let addr = b.as_ptr() as u64;
    // SAFETY: no memory access.
    assert_eq!(unsafe { j.run_mem(&mut b) }, Ok(addr + 5));
}

#[test]
fn jit_program_is_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<JitProgram>();
}

#[test]
fn large_program_compiles() {
    let mut p = vec![mov(0, 0)];
    for i in 0..100_000 {
        p.push(alu64(BPF_ADD, 0, i % 7));
        if i % 50 == 0 {
            p.push(jmp(BPF_JEQ, 0, -1, 1));
            p.push(alu64(BPF_ADD, 0, 0));
        }
    }
    p.push(exit());
    let want: u64 = (0..100_000u64).map(|i| i % 7).sum();
    assert_eq!(run(&p), want);
}
