//! Differential testing against the kernel: random programs of ALU, jump, stack, atomic and
//! sign-extending instructions (the v4 ISA's included: `sdiv`, `smod`, `movsx`, `bswap`,
//! `ldsx`), half of them calling a subprogram (bpf-to-bpf calls: arguments in r1-r5, a frame
//! and registers r6-r9 of its own, a return value), run in the kernel and in our interpreter
//! and JIT must end with the same registers, stack and return value.
//!
//! The kernel runs each program as a `BPF_PROG_TYPE_SYSCALL` program (sleepable, as the
//! kernel requires of that type) through `BPF_PROG_TEST_RUN`, whose context is a buffer the
//! kernel copies in and back out; our executors run it with the same buffer as `r1`. A
//! program starts by keeping the context in r6 and setting every other register and the 64
//! bytes of stack it uses to drawn values, runs its random body, then stores r0-r9 (but r6)
//! and the stack words into the context: the buffers compared after the run hold every
//! register's and stack word's final value, and the kernel's return value (the low 32 bits of
//! r0) is compared too.
//!
//! The body keeps to what the kernel's verifier accepts from any drawn values: registers hold
//! scalars only (r6 and r10 are never written or read as data), stack accesses are aligned and
//! inside the initialised 64 bytes, immediate divisors are not zero and immediate shifts are
//! below the width (a register divisor may be zero and a register shift amount anything: the
//! ISA defines both), jumps go forward (at most [`MAX_BRANCHES`] conditional ones, so that the
//! verifier's walk of the paths stays small), and atomics work on the stack's top 16 bytes.
//! It also steers clear of two places where the kernel departs from the ISA, which this test
//! found (see [`body_insn`]).
//!
//! Environment:
//! - `KDIFF_SEED=N` (decimal or 0x-hex, or `time`): the seed of the first case (case i uses
//!   seed N + i);
//! - `KDIFF_COUNT=N`: number of cases (default 3000, about 2 s; 200,000 took 90 s);
//! - `KDIFF_PRINT=1`: print each program before running it;
//! - `KDIFF_KERNEL_QUIRKS=1`: do not steer around the kernel's departures from the ISA (the
//!   test then finds them, reduced to reproducers);
//! - `KDIFF_DUMP=FILE`, `KDIFF_DUMP_REDUCED=FILE`: write the last case's program, or the last
//!   failing case's reduced program, as raw instructions (for `bpftool` and the verifier's log
//!   at level 2).
//!
//! A case the kernel refuses fails the test with the verifier's log (the generator must only
//! make programs the kernel accepts); a difference prints the seed, the three outcomes and the
//! program, then the program again with the body's instructions the difference does not need
//! turned into no-ops; `KDIFF_SEED=<seed> KDIFF_COUNT=1` reproduces it.

use std::sync::Arc;

use userbpf_isa::disasm::format_insn;
use userbpf_isa::*;
use userbpf_testutil::{Rng, kernel};
use userbpf_vm::{HelperRegistry, Interpreter, JitProgram, LoadOptions, Program};

/// Registers the body reads and writes (all but r6, the context, and r10).
const REGS: [u8; 9] = [0, 1, 2, 3, 4, 5, 7, 8, 9];
/// Bytes of stack the program uses, below r10.
const STACK: i16 = 64;
/// The context: r0-r9 (r6's word stays zero), then the stack's eight words.
const CTX_LEN: usize = 80 + STACK as usize;
/// Instructions in the body.
const BODY: usize = 48;
/// Instructions in the subprogram's body (half the programs have one, called 1-3 times).
const CALLEE_BODY: usize = 24;
/// Conditional jumps at most in a body.
const MAX_BRANCHES: usize = 10;
const DEFAULT_SEED: u64 = 0x6b64_6966;
const DEFAULT_COUNT: u64 = 3000;

/// Loads `insns` into the kernel as a syscall program: its descriptor, or the verifier's log.
fn kernel_load(insns: &[Insn]) -> Result<kernel::Fd, String> {
    kernel::prog_load(kernel::PROG_SYSCALL, &encode(insns), kernel::F_SLEEPABLE).map_err(|(err, log)| {
        // The log's last lines say why.
        let tail: Vec<&str> = log.lines().rev().take(12).collect();
        format!("{err}; the verifier's log ends:\n{}", tail.into_iter().rev().collect::<Vec<_>>().join("\n"))
    })
}

/// Runs the kernel's program on a copy of `ctx`: its return value and the context after.
fn kernel_run(prog: &kernel::Fd, ctx: &[u8]) -> Result<(u32, Vec<u8>), String> {
    let mut buf = ctx.to_vec();
    let ret = kernel::test_run_ctx(prog, &mut buf).map_err(|e| format!("BPF_PROG_TEST_RUN: {e}"))?;
    Ok((ret, buf))
}

fn imm(rng: &mut Rng) -> i32 {
    rng.edge_u64() as i32
}

fn reg(rng: &mut Rng) -> u8 {
    rng.pick(&REGS)
}

/// Bytes of stack at the top (r10 - 16 .. r10) that only atomic operations write (see
/// [`Case::new`]).
const ATOMIC_BYTES: i16 = 16;

/// An aligned stack offset for a load of `size` bytes: anywhere in the 64 bytes.
fn stack_off(rng: &mut Rng, size: i16) -> i16 {
    -(size * (1 + rng.below((STACK / size) as u64) as i16))
}

/// `KDIFF_KERNEL_QUIRKS=1`: the generator does not steer around the kernel's departures from
/// the ISA (see [`body_insn`]), so that the test finds them again and reduces them to
/// reproducers (for a report, or to see whether a kernel still has them).
fn quirks() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("KDIFF_KERNEL_QUIRKS").is_some_and(|v| v != "0"))
}

/// An aligned stack offset for a store of `size` bytes: below the atomics' words.
fn store_off(rng: &mut Rng, size: i16) -> i16 {
    if quirks() {
        return stack_off(rng, size);
    }
    -ATOMIC_BYTES - size * rng.below(((STACK - ATOMIC_BYTES) / size) as u64) as i16 - size
}

/// An aligned stack offset for an atomic operation of `size` bytes: in the atomics' words.
fn atomic_off(rng: &mut Rng, size: i16) -> i16 {
    if quirks() {
        return stack_off(rng, size);
    }
    -(size * (1 + rng.below((ATOMIC_BYTES / size) as u64) as i16))
}

fn size_code(size: i16) -> u8 {
    match size {
        1 => BPF_B,
        2 => BPF_H,
        4 => BPF_W,
        _ => BPF_DW,
    }
}

/// One body instruction at `pc` of a body ending at `end` (where the epilogue starts);
/// `branches` counts the conditional jumps drawn so far.
///
/// The generator steers clear of two places where the kernel (6.18, x86-64) departs from the
/// ISA, both found by this test (userbpf's interpreter and JIT follow the ISA there):
///
/// - After a 32-bit `cmpxchg` that succeeds, the ISA loads r0 with the old value
///   zero-extended; x86's `cmpxchg` writes eax only when the compare fails, and the
///   zero-extension the verifier patches in after a 32-bit `cmpxchg` was missing from drawn
///   programs (two paths to the `cmpxchg`; `bpftool prog dump xlated` showed no `w0 = w0`
///   after it), leaving r0's upper half as it was. So a 32-bit `cmpxchg` comes
///   with a `w0 = w0` before it, and jumps to it land on that instead ([`Case::new`]).
/// - The verifier pruned a path whose stack word differed from an explored one's where an
///   atomic operation loaded that word (`xchg`, `cmpxchg`: the word's precision is not
///   tracked through the atomic load), then judged a later branch on the loaded value one-sided
///   and removed the other side as dead code, which the pruned path would have run. So atomic
///   operations work on the top 16 bytes of the stack only, which plain stores never write and
///   which the prologue passes through an atomic add (the verifier then holds them as unknown
///   on every path).
fn body_insn(rng: &mut Rng, pc: usize, end: usize, branches: &mut usize) -> Vec<Insn> {
    let one = body_one(rng, pc, end, branches);
    if is_cmpxchg32(one) && !quirks() {
        if pc + 2 <= end {
            return vec![Insn::new(BPF_ALU | BPF_MOV | BPF_X, 0, 0, 0, 0), one];
        }
        // No room for the zero-extension before it: a 64-bit one instead.
        return vec![Insn { op: BPF_STX | BPF_ATOMIC | BPF_DW, off: one.off & !7, ..one }];
    }
    vec![one]
}

fn is_cmpxchg32(i: Insn) -> bool {
    i.class() == BPF_STX && i.mode() == BPF_ATOMIC && i.size() == BPF_W && i.imm == BPF_CMPXCHG
}

fn body_one(rng: &mut Rng, pc: usize, end: usize, branches: &mut usize) -> Insn {
    const OPS: [u8; 12] =
        [BPF_ADD, BPF_SUB, BPF_MUL, BPF_DIV, BPF_OR, BPF_AND, BPF_LSH, BPF_RSH, BPF_MOD, BPF_XOR, BPF_MOV, BPF_ARSH];
    const CONDS: [u8; 11] =
        [BPF_JEQ, BPF_JGT, BPF_JGE, BPF_JSET, BPF_JNE, BPF_JSGT, BPF_JSGE, BPF_JLT, BPF_JLE, BPF_JSLT, BPF_JSLE];
    loop {
        match rng.below(16) {
            // ALU with an immediate, 64- or 32-bit.
            0..=3 => {
                let class = if rng.chance(1, 2) { BPF_ALU64 } else { BPF_ALU };
                let width = if class == BPF_ALU64 { 64 } else { 32 };
                let op = rng.pick(&OPS);
                let mut k = imm(rng);
                // sdiv and smod (off 1) exist for div and mod only.
                let signed = matches!(op, BPF_DIV | BPF_MOD) && rng.chance(1, 2);
                match op {
                    BPF_DIV | BPF_MOD if k == 0 => k = 1 + rng.below(7) as i32,
                    BPF_LSH | BPF_RSH | BPF_ARSH => k = rng.below(width) as i32,
                    _ => {}
                }
                return Insn::new(class | op | BPF_K, reg(rng), 0, i16::from(signed), k);
            }
            // ALU with a register: division by zero and any shift amount included.
            4..=7 => {
                let class = if rng.chance(1, 2) { BPF_ALU64 } else { BPF_ALU };
                let op = rng.pick(&OPS);
                let off = match op {
                    BPF_DIV | BPF_MOD if rng.chance(1, 2) => 1,
                    // movsx: from 8, 16 (and for the 64-bit form 32) bits.
                    BPF_MOV if rng.chance(1, 2) => {
                        if class == BPF_ALU64 {
                            rng.pick(&[8, 16, 32])
                        } else {
                            rng.pick(&[8, 16])
                        }
                    }
                    _ => 0,
                };
                return Insn::new(class | op | BPF_X, reg(rng), reg(rng), off, 0);
            }
            8 => {
                let class = if rng.chance(1, 2) { BPF_ALU64 } else { BPF_ALU };
                return Insn::new(class | BPF_NEG, reg(rng), 0, 0, 0);
            }
            // Byte swaps: to_le / to_be (32-bit class), bswap (64-bit class, v4).
            9 => {
                let class = if rng.chance(1, 2) { BPF_ALU64 } else { BPF_ALU };
                let src = if class == BPF_ALU64 || rng.chance(1, 2) { BPF_TO_LE } else { BPF_TO_BE };
                return Insn::new(class | BPF_END | src, reg(rng), 0, 0, rng.pick(&[16, 32, 64]));
            }
            // A forward conditional jump, 64- or 32-bit, against an immediate or a register.
            10 | 11 if *branches < MAX_BRANCHES && pc + 1 < end => {
                *branches += 1;
                let class = if rng.chance(1, 2) { BPF_JMP } else { BPF_JMP32 };
                let off = 1 + rng.below((end - pc - 1) as u64) as i16 - 1;
                let cond = rng.pick(&CONDS);
                return if rng.chance(1, 2) {
                    Insn::new(class | cond | BPF_K, reg(rng), 0, off, imm(rng))
                } else {
                    Insn::new(class | cond | BPF_X, reg(rng), reg(rng), off, 0)
                };
            }
            // Stores: a register or an immediate.
            12 => {
                let size = rng.pick(&[1, 2, 4, 8]);
                let off = store_off(rng, size);
                return if rng.chance(1, 2) {
                    Insn::new(BPF_STX | BPF_MEM | size_code(size), 10, reg(rng), off, 0)
                } else {
                    Insn::new(BPF_ST | BPF_MEM | size_code(size), 10, 0, off, imm(rng))
                };
            }
            // Loads, zero- or (v4, not 64-bit) sign-extending.
            13 => {
                let size = rng.pick(&[1, 2, 4, 8]);
                let mode = if size < 8 && rng.chance(1, 2) { BPF_MEMSX } else { BPF_MEM };
                return Insn::new(BPF_LDX | mode | size_code(size), reg(rng), 10, stack_off(rng, size), 0);
            }
            // Atomics on a stack word: add, or, and, xor (with or without fetch), xchg, cmpxchg.
            14 | 15 => {
                let size = rng.pick(&[4, 8]);
                let op = rng.pick(&[BPF_ADD, BPF_OR, BPF_AND, BPF_XOR]) as i32;
                let imm = match rng.below(4) {
                    0 => BPF_XCHG,
                    1 => BPF_CMPXCHG,
                    2 => op | BPF_FETCH,
                    _ => op,
                };
                return Insn::new(BPF_STX | BPF_ATOMIC | size_code(size), 10, reg(rng), atomic_off(rng, size), imm);
            }
            _ => {}
        }
    }
}

/// A case: the program and its seed.
#[derive(Clone)]
struct Case {
    seed: u64,
    insns: Vec<Insn>,
    /// Where the bodies (the main function's, the subprogram's) start and end.
    bodies: Vec<std::ops::Range<usize>>,
}

/// Sets `regs` to drawn values and the frame's 64 bytes of stack from them, the atomics'
/// words through an atomic add: the verifier then holds them as unknown on every path (see
/// [`body_insn`]).
fn frame_prologue(rng: &mut Rng, insns: &mut Vec<Insn>, regs: &[u8]) {
    for &r in regs {
        let v = rng.edge_u64();
        insns.push(Insn::new(OP_LDDW, r, 0, 0, v as u32 as i32));
        insns.push(Insn::new(0, 0, 0, 0, (v >> 32) as u32 as i32));
    }
    for k in 1..=STACK / 8 {
        insns.push(Insn::new(BPF_STX | BPF_MEM | BPF_DW, 10, rng.pick(regs), -8 * k, 0));
    }
    for k in (1..=ATOMIC_BYTES / 8).filter(|_| !quirks()) {
        insns.push(Insn::new(BPF_STX | BPF_ATOMIC | BPF_DW, 10, rng.pick(regs), -8 * k, BPF_ADD as i32));
    }
}

/// Draws a body up to `end`; with `calls`, sometimes a call of the subprogram (its offset set
/// later; the call's position is noted) followed by r1-r5 set again (a call leaves them
/// undefined). A jump to a 32-bit cmpxchg lands on the zero-extension before it (see
/// [`body_insn`]).
fn body(rng: &mut Rng, insns: &mut Vec<Insn>, end: usize, mut calls: Option<&mut Vec<usize>>) {
    let start = insns.len();
    let mut branches = 0;
    while insns.len() < end {
        let pc = insns.len();
        if let Some(calls) = calls.as_deref_mut()
            && calls.len() < 3
            && pc + 6 <= end
            && rng.chance(1, 16)
        {
            calls.push(pc);
            insns.push(Insn::new(OP_CALL, 0, BPF_PSEUDO_CALL, 0, 0));
            for r in 1..=5 {
                insns.push(Insn::new(BPF_ALU64 | BPF_MOV | BPF_K, r, 0, 0, rng.edge_u64() as i32));
            }
            continue;
        }
        insns.extend(body_insn(rng, pc, end, &mut branches));
    }
    for pc in start..end {
        let i = insns[pc];
        if i.class() == BPF_JMP || i.class() == BPF_JMP32 {
            let target = (pc as i64 + 1 + i64::from(i.off)) as usize;
            if target < end && is_cmpxchg32(insns[target]) && !quirks() {
                insns[pc].off -= 1;
            }
        }
    }
}

impl Case {
    fn new(seed: u64) -> Case {
        let mut rng = Rng::new(seed);
        let with_call = rng.chance(1, 2);
        let mut insns = vec![Insn::new(BPF_ALU64 | BPF_MOV | BPF_X, 6, 1, 0, 0)];
        frame_prologue(&mut rng, &mut insns, &REGS);
        let start = insns.len();
        let end = start + BODY;
        let mut calls = Vec::new();
        body(&mut rng, &mut insns, end, with_call.then_some(&mut calls));
        for (i, r) in (0u8..10).enumerate() {
            if r != 6 {
                insns.push(Insn::new(BPF_STX | BPF_MEM | BPF_DW, 6, r, 8 * i as i16, 0));
            }
        }
        for k in 1..=STACK / 8 {
            insns.push(Insn::new(BPF_LDX | BPF_MEM | BPF_DW, 2, 10, -8 * k, 0));
            insns.push(Insn::new(BPF_STX | BPF_MEM | BPF_DW, 6, 2, 80 + 8 * (k - 1), 0));
        }
        insns.push(Insn::new(OP_EXIT, 0, 0, 0, 0));
        let mut bodies = Vec::with_capacity(2);
        bodies.push(start..end);
        if !calls.is_empty() {
            // The subprogram: r1-r5 are its arguments; its own registers and stack, then a
            // return value folded from all of them.
            let entry = insns.len();
            frame_prologue(&mut rng, &mut insns, &[0, 7, 8, 9]);
            let start = insns.len();
            let end = start + CALLEE_BODY;
            body(&mut rng, &mut insns, end, None);
            for r in [1, 2, 3, 4, 5, 7, 8, 9] {
                insns.push(Insn::new(BPF_ALU64 | BPF_MUL | BPF_K, 0, 0, 0, 31));
                insns.push(Insn::new(BPF_ALU64 | BPF_XOR | BPF_X, 0, r, 0, 0));
            }
            for k in 1..=STACK / 8 {
                insns.push(Insn::new(BPF_LDX | BPF_MEM | BPF_DW, 1, 10, -8 * k, 0));
                insns.push(Insn::new(BPF_ALU64 | BPF_MUL | BPF_K, 0, 0, 0, 31));
                insns.push(Insn::new(BPF_ALU64 | BPF_ADD | BPF_X, 0, 1, 0, 0));
            }
            insns.push(Insn::new(OP_EXIT, 0, 0, 0, 0));
            for &c in &calls {
                insns[c].imm = (entry - (c + 1)) as i32;
            }
            bodies.push(start..end);
        }
        Case { seed, insns, bodies }
    }

    /// The same case with the body's instructions that the difference does not need turned
    /// into no-ops (`goto +0`, which keeps every jump's target), one at a time, as long as
    /// `differs` still holds.
    fn reduced(&self, differs: impl Fn(&Case) -> bool) -> Case {
        let mut best = self.clone();
        let nop = Insn::new(OP_JA, 0, 0, 0, 0);
        loop {
            let mut changed = false;
            for pc in best.bodies.iter().flat_map(|b| b.clone()).collect::<Vec<_>>() {
                // The zero-extension before a 32-bit cmpxchg stays (see `body_insn`).
                let zext_of_cmpxchg = best.insns.get(pc + 1).is_some_and(|&n| is_cmpxchg32(n));
                if best.insns[pc] == nop || zext_of_cmpxchg {
                    continue;
                }
                let mut c = best.clone();
                c.insns[pc] = nop;
                if differs(&c) {
                    best = c;
                    changed = true;
                }
            }
            if !changed {
                return best;
            }
        }
    }

    fn listing(&self) -> String {
        let mut out = String::new();
        let mut i = 0;
        while i < self.insns.len() {
            let insn = self.insns[i];
            let next = self.insns.get(i + 1).copied();
            out += &format!("  {i:3}: {}\n", format_insn(insn, next));
            i += if insn.is_lddw() { 2 } else { 1 };
        }
        out
    }

    fn report(&self, what: &str) -> String {
        format!(
            "case seed {:#x}: {what}\n  reproduce: KDIFF_SEED={:#x} KDIFF_COUNT=1\n{}",
            self.seed,
            self.seed,
            self.listing()
        )
    }
}

/// The context's words, named, where two buffers differ.
fn ctx_diff(a: &[u8], b: &[u8]) -> String {
    let word = |m: &[u8], i: usize| u64::from_ne_bytes(m[8 * i..8 * i + 8].try_into().unwrap());
    (0..CTX_LEN / 8)
        .filter(|&i| word(a, i) != word(b, i))
        .map(|i| {
            let name = if i < 10 { format!("r{i}") } else { format!("stack[-{}]", 8 * (i - 9)) };
            format!("{name}: {:#x} against {:#x}", word(a, i), word(b, i))
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn run_case(case: &Case, options: &LoadOptions) -> Result<(), String> {
    let kprog =
        kernel_load(&case.insns).map_err(|e| case.report(&format!("the kernel refuses it (generator bug): {e}")))?;
    let ctx = vec![0u8; CTX_LEN];
    let (k_ret, k_ctx) = kernel_run(&kprog, &ctx).map_err(|e| case.report(&e))?;
    let prog = match Program::load(&case.insns, options, None) {
        Ok(p) => Arc::new(p),
        Err(e) => return Err(case.report(&format!("the kernel accepts it, we refuse it: {e}"))),
    };
    let mut i_ctx = ctx.clone();
    let i_res = Interpreter::new(prog.clone()).run_mem(&mut i_ctx);
    let jit = JitProgram::compile(prog).map_err(|e| case.report(&format!("the JIT cannot compile it: {e}")))?;
    let mut j_ctx = ctx;
    // SAFETY: every access of the program is to its stack or to the first CTX_LEN bytes of
    // the buffer (the interpreter, which checks each, ran it first).
    let j_res = unsafe { jit.run_mem(&mut j_ctx) };
    let mut problems = Vec::new();
    for (who, res, mem) in [("interpreter", &i_res, &i_ctx), ("JIT", &j_res, &j_ctx)] {
        match res {
            Ok(r0) if *r0 as u32 != k_ret => {
                problems.push(format!("{who}: return value {:#x}, the kernel's {k_ret:#x}", *r0 as u32))
            }
            Ok(_) => {}
            Err(e) => problems.push(format!("{who}: {e}")),
        }
        if *mem != k_ctx {
            problems.push(format!("{who} against the kernel: {}", ctx_diff(mem, &k_ctx)));
        }
    }
    if problems.is_empty() { Ok(()) } else { Err(case.report(&problems.join("\n  "))) }
}

#[test]
fn random_programs_agree_with_the_kernel() {
    let Some((seed, count)) = kernel::fuzz_setup("KDIFF_SEED", DEFAULT_SEED, "KDIFF_COUNT", DEFAULT_COUNT) else {
        return;
    };
    let print = std::env::var_os("KDIFF_PRINT").is_some_and(|v| v != "0");
    let options = LoadOptions { helpers: Arc::new(HelperRegistry::new()), memory: None, allow_callx: false };
    let mut failures = Vec::new();
    for i in 0..count {
        let case = Case::new(seed.wrapping_add(i));
        if print {
            println!("case seed {:#x}:\n{}", case.seed, case.listing());
        }
        if let Some(path) = std::env::var_os("KDIFF_DUMP") {
            std::fs::write(path, encode(&case.insns)).unwrap();
        }
        if let Err(e) = run_case(&case, &options) {
            // A reduction the kernel refuses (an instruction a later one needs turned into a
            // no-op) does not count as the difference.
            let small = case.reduced(|c| run_case(c, &options).is_err_and(|e| !e.contains("the kernel refuses it")));
            if let Some(path) = std::env::var_os("KDIFF_DUMP_REDUCED") {
                std::fs::write(path, encode(&small.insns)).unwrap();
            }
            let e = match run_case(&small, &options) {
                Err(s) if small.insns != case.insns => {
                    format!("{e}\n  reduced (no-ops for what it does not need):\n{s}")
                }
                _ => e,
            };
            failures.push(e);
            if failures.len() >= 5 {
                break;
            }
        }
    }
    println!("{count} random programs (first seed {seed:#x}) run by the kernel, the interpreter and the JIT");
    assert!(failures.is_empty(), "{} case(s) differ:\n\n{}", failures.len(), failures.join("\n\n"));
}
