//! The interpreter: pre-decoded instructions, one `match` per instruction, every memory
//! access checked against the stack, the run's regions and the program's memory policy.
//!
//! An out-of-bounds access ends the run with [`VmError::OutOfBounds`]; nothing a checked
//! program does can make the interpreter itself fault.
//!
//! All frames of a run share one stack area of `MAX_CALL_FRAMES` × 512 bytes, frame `d`
//! below frame `d - 1`. A callback run by [`callback::invoke`](crate::callback::invoke)
//! re-enters the interpreter (through the run's state, which a thread-local points to) in
//! the frame above the helper's caller, so it counts toward the depth limit like a
//! bpf-to-bpf call and its accesses are checked against the same stack, regions and policy.

use std::cell::Cell;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use userbpf_isa::*;

use crate::error::AccessKind;
use crate::helpers::HelperFn;
use crate::program::{MAX_CALL_FRAMES, STACK_SIZE};
use crate::run::{RunCtx, RunKind, Status};
use crate::{InlineArray, Program, Region, VmError};

/// Value an `lddw` of a function (BPF_PSEUDO_FUNC) gives in the interpreter: this tag ORed
/// with the instruction index of the function. (The JIT gives a native address instead.)
pub const INTERP_FUNC_TAG: u64 = 0xbf00_0000_0000_0000;

/// Private opcode of a pre-decoded inlined array lookup (`call 1` that [`Program`] found to
/// look up an array map it may compute inline); `imm` indexes [`Interpreter::inline`].
/// (0xf5 is no eBPF opcode: `Program::load` refuses it.)
const OP_INLINE_LOOKUP: u8 = 0xf5;

/// One pre-decoded slot. `imm` is what the instruction needs at run time: the sign-extended
/// immediate, the whole 64-bit value of an `lddw`, the helper's address for a call, or the
/// target index of a local call or `gotol`. For a helper call, `off` is 1 when the helper is
/// marked `may_exit`.
#[derive(Clone, Copy, Debug)]
struct Op {
    op: u8,
    dst: u8,
    src: u8,
    off: i16,
    imm: i64,
}

/// Runs a checked program instruction by instruction, checking every memory access.
pub struct Interpreter {
    prog: Arc<Program>,
    ops: Box<[Op]>,
    /// The arrays of the inlined lookups, by the `imm` of their [`OP_INLINE_LOOKUP`].
    inline: Box<[InlineArray]>,
}

#[derive(Clone, Copy, Default)]
struct Frame {
    ret_pc: usize,
    saved: [u64; 4],
    r10: u64,
}

const STACK_WORDS: usize = STACK_SIZE * MAX_CALL_FRAMES / 8;

impl Interpreter {
    pub fn new(prog: Arc<Program>) -> Interpreter {
        let insns = prog.insns();
        let mut ops = Vec::with_capacity(insns.len());
        let mut inline = Vec::new();
        let mut pc = 0;
        while pc < insns.len() {
            let i = insns[pc];
            let mut op = Op { op: i.op, dst: i.dst, src: i.src, off: i.off, imm: i.imm as i64 };
            if i.is_lddw() {
                op.imm = if i.src == BPF_PSEUDO_FUNC {
                    (INTERP_FUNC_TAG | (pc as i64 + 1 + i.imm as i64) as u64) as i64
                } else {
                    i.wide_imm(insns[pc + 1]) as i64
                };
                ops.push(op);
                ops.push(Op { op: 0, dst: 0, src: 0, off: 0, imm: 0 });
                pc += 2;
                continue;
            }
            // Per-CPU lookups are the JIT's only (the interpreter has no CPU slot at hand).
            if let Some(a) = prog.inline_lookup_at(pc).filter(|a| a.cpu_stride == 0) {
                op.op = OP_INLINE_LOOKUP;
                op.imm = inline.len() as i64;
                inline.push(a);
            } else if i.op == OP_CALL {
                op.imm = match i.src {
                    // Checked at load: the helper is registered.
                    0 => {
                        let h = prog.helpers().get(i.imm as u32);
                        op.off = i16::from(h.is_some_and(|h| h.may_exit));
                        h.map_or(0, |h| h.func as usize as i64)
                    }
                    _ => pc as i64 + 1 + i.imm as i64,
                };
            } else if i.op == OP_JA32 {
                op.imm = pc as i64 + 1 + i.imm as i64;
            }
            ops.push(op);
            pc += 1;
        }
        Interpreter { prog, ops: ops.into_boxed_slice(), inline: inline.into_boxed_slice() }
    }

    pub fn program(&self) -> &Arc<Program> {
        &self.prog
    }

    /// Runs with r1 and r2 set; the program may touch its stack, `regions` and what the
    /// program's memory policy allows. Returns r0.
    pub fn run(&self, r1: u64, r2: u64, regions: &[Region]) -> Result<u64, VmError> {
        self.exec::<false>(r1, r2, regions).0
    }

    /// Runs on a buffer: r1 = its address (0 when empty), r2 = its length; the buffer is writable.
    pub fn run_mem(&self, mem: &mut [u8]) -> Result<u64, VmError> {
        let r1 = if mem.is_empty() { 0 } else { mem.as_mut_ptr() as u64 };
        let len = mem.len() as u64;
        self.run(r1, len, &[Region::of_mut(mem)])
    }

    /// Like [`run`](Self::run), and also counts the instructions executed (for benchmarks).
    pub fn run_counted(&self, r1: u64, r2: u64, regions: &[Region]) -> (Result<u64, VmError>, u64) {
        self.exec::<true>(r1, r2, regions)
    }

    #[inline(always)]
    fn check(
        &self,
        stack: &Region,
        regions: &[Region],
        pc: usize,
        addr: u64,
        len: u64,
        write: bool,
    ) -> Result<(), VmError> {
        if stack.contains(addr, len, write) || regions.iter().any(|r| r.contains(addr, len, write)) {
            return Ok(());
        }
        if let Some(p) = self.prog.memory_policy()
            && p.allows(addr, len, write)
        {
            return Ok(());
        }
        Err(VmError::OutOfBounds { pc, addr, len, kind: if write { AccessKind::Write } else { AccessKind::Read } })
    }

    fn exec<const COUNT: bool>(&self, r1: u64, r2: u64, regions: &[Region]) -> (Result<u64, VmError>, u64) {
        let mut stack = [0u64; STACK_WORDS];
        let stack_region = Region::of_mut(bytemuck_u8(&mut stack));
        let run = InterpRun {
            interp: self,
            regions,
            stack: stack_region,
            depth: Cell::new(0),
            count: Cell::new(0),
            counting: COUNT,
        };
        let ctx = RunCtx::new(RunKind::Interp(&run));
        let result = {
            let _scope = ctx.enter();
            self.exec_at::<COUNT>(&ctx, &run, 0, [r1, r2, 0, 0, 0], 0)
        };
        (ctx.finish(result), run.count.get())
    }

    /// Runs the function at `start` with r1..r5 = `args` in frame `base` (0 for the program's
    /// entry, deeper for a callback) until it returns, or until the run ends (a pending exit or
    /// error after a `may_exit` helper: then it returns `Ok` with a value the run's `finish`
    /// overrides).
    fn exec_at<const COUNT: bool>(
        &self,
        ctx: &RunCtx<'_>,
        run: &InterpRun<'_>,
        start: usize,
        args: [u64; 5],
        base: usize,
    ) -> Result<u64, VmError> {
        let stack_region = &run.stack;
        let regions = run.regions;
        let mut reg = [0u64; 16];
        reg[1..6].copy_from_slice(&args);
        reg[10] = stack_region.start + stack_region.len - (base * STACK_SIZE) as u64;
        let mut frames = [Frame::default(); MAX_CALL_FRAMES];
        let mut depth = 0usize;
        let mut count = 0u64;
        let ops = &*self.ops;
        let mut pc = start;

        macro_rules! fail {
            ($e:expr_2021) => {
                break Err($e)
            };
        }
        macro_rules! chk {
            ($addr:expr_2021, $len:expr_2021, $write:expr_2021) => {
                if let Err(e) = self.check(stack_region, regions, pc - 1, $addr, $len, $write) {
                    fail!(e)
                }
            };
        }
        /// After a helper that may end the run: stop if it does.
        macro_rules! stop_if_ending {
            () => {
                match ctx.status() {
                    Status::Running => {}
                    Status::Exit(v) => break Ok(v),
                    Status::Error => break Ok(reg[0]),
                }
            };
        }
        let result = loop {
            // SAFETY: `Program::load` checked that every jump and call targets an instruction
            // inside the program and that every function ends in exit or an unconditional
            // jump, so `pc` is always a valid index of `ops`.
            let op = unsafe { *ops.get_unchecked(pc) };
            if COUNT {
                count += 1;
            }
            let d = (op.dst & 15) as usize;
            let s = (op.src & 15) as usize;
            let imm = op.imm as u64;
            pc += 1;
            match op.op {
                // ALU64, immediate and register.
                0x07 => reg[d] = reg[d].wrapping_add(imm),
                0x0f => reg[d] = reg[d].wrapping_add(reg[s]),
                0x17 => reg[d] = reg[d].wrapping_sub(imm),
                0x1f => reg[d] = reg[d].wrapping_sub(reg[s]),
                0x27 => reg[d] = reg[d].wrapping_mul(imm),
                0x2f => reg[d] = reg[d].wrapping_mul(reg[s]),
                0x37 => reg[d] = div64(reg[d], imm, op.off),
                0x3f => reg[d] = div64(reg[d], reg[s], op.off),
                0x47 => reg[d] |= imm,
                0x4f => reg[d] |= reg[s],
                0x57 => reg[d] &= imm,
                0x5f => reg[d] &= reg[s],
                0x67 => reg[d] = reg[d].wrapping_shl(imm as u32),
                0x6f => reg[d] = reg[d].wrapping_shl(reg[s] as u32),
                0x77 => reg[d] = reg[d].wrapping_shr(imm as u32),
                0x7f => reg[d] = reg[d].wrapping_shr(reg[s] as u32),
                0x87 => reg[d] = reg[d].wrapping_neg(),
                0x97 => reg[d] = mod64(reg[d], imm, op.off),
                0x9f => reg[d] = mod64(reg[d], reg[s], op.off),
                0xa7 => reg[d] ^= imm,
                0xaf => reg[d] ^= reg[s],
                0xb7 => reg[d] = imm,
                0xbf => {
                    reg[d] = match op.off {
                        8 => reg[s] as i8 as i64 as u64,
                        16 => reg[s] as i16 as i64 as u64,
                        32 => reg[s] as i32 as i64 as u64,
                        _ => reg[s],
                    }
                }
                0xc7 => reg[d] = (reg[d] as i64).wrapping_shr(imm as u32) as u64,
                0xcf => reg[d] = (reg[d] as i64).wrapping_shr(reg[s] as u32) as u64,
                0xd7 => {
                    reg[d] = match op.imm {
                        16 => (reg[d] as u16).swap_bytes() as u64,
                        32 => (reg[d] as u32).swap_bytes() as u64,
                        _ => reg[d].swap_bytes(),
                    }
                }

                // ALU (32-bit), results zero-extended.
                0x04 => reg[d] = (reg[d] as u32).wrapping_add(imm as u32) as u64,
                0x0c => reg[d] = (reg[d] as u32).wrapping_add(reg[s] as u32) as u64,
                0x14 => reg[d] = (reg[d] as u32).wrapping_sub(imm as u32) as u64,
                0x1c => reg[d] = (reg[d] as u32).wrapping_sub(reg[s] as u32) as u64,
                0x24 => reg[d] = (reg[d] as u32).wrapping_mul(imm as u32) as u64,
                0x2c => reg[d] = (reg[d] as u32).wrapping_mul(reg[s] as u32) as u64,
                0x34 => reg[d] = div32(reg[d] as u32, imm as u32, op.off) as u64,
                0x3c => reg[d] = div32(reg[d] as u32, reg[s] as u32, op.off) as u64,
                0x44 => reg[d] = (reg[d] as u32 | imm as u32) as u64,
                0x4c => reg[d] = (reg[d] as u32 | reg[s] as u32) as u64,
                0x54 => reg[d] = (reg[d] as u32 & imm as u32) as u64,
                0x5c => reg[d] = (reg[d] as u32 & reg[s] as u32) as u64,
                0x64 => reg[d] = (reg[d] as u32).wrapping_shl(imm as u32) as u64,
                0x6c => reg[d] = (reg[d] as u32).wrapping_shl(reg[s] as u32) as u64,
                0x74 => reg[d] = (reg[d] as u32).wrapping_shr(imm as u32) as u64,
                0x7c => reg[d] = (reg[d] as u32).wrapping_shr(reg[s] as u32) as u64,
                0x84 => reg[d] = (reg[d] as u32).wrapping_neg() as u64,
                0x94 => reg[d] = mod32(reg[d] as u32, imm as u32, op.off) as u64,
                0x9c => reg[d] = mod32(reg[d] as u32, reg[s] as u32, op.off) as u64,
                0xa4 => reg[d] = (reg[d] as u32 ^ imm as u32) as u64,
                0xac => reg[d] = (reg[d] as u32 ^ reg[s] as u32) as u64,
                0xb4 => reg[d] = imm as u32 as u64,
                0xbc => {
                    reg[d] = match op.off {
                        8 => reg[s] as i8 as i32 as u32 as u64,
                        16 => reg[s] as i16 as i32 as u32 as u64,
                        _ => reg[s] as u32 as u64,
                    }
                }
                0xc4 => reg[d] = (reg[d] as i32).wrapping_shr(imm as u32) as u32 as u64,
                0xcc => reg[d] = (reg[d] as i32).wrapping_shr(reg[s] as u32) as u32 as u64,
                0xd4 => {
                    reg[d] = match op.imm {
                        16 => reg[d] as u16 as u64,
                        32 => reg[d] as u32 as u64,
                        _ => reg[d],
                    }
                }
                0xdc => {
                    reg[d] = match op.imm {
                        16 => (reg[d] as u16).swap_bytes() as u64,
                        32 => (reg[d] as u32).swap_bytes() as u64,
                        _ => reg[d].swap_bytes(),
                    }
                }

                // lddw: the value was resolved at load time.
                0x18 => {
                    reg[d] = imm;
                    pc += 1;
                }

                // Loads.
                0x71 | 0x69 | 0x61 | 0x79 | 0x91 | 0x89 | 0x81 => {
                    let addr = reg[s].wrapping_add(op.off as i64 as u64);
                    let len = 1u64
                        << (match op.op & 0x18 {
                            BPF_B => 0,
                            BPF_H => 1,
                            BPF_W => 2,
                            _ => 3,
                        });
                    chk!(addr, len, false);
                    // SAFETY: `check` found [addr, addr+len) inside the stack, a region of the
                    // run or memory the runtime's policy vouches for; unaligned reads are fine.
                    let v = unsafe { load(addr, len) };
                    reg[d] = if op.op & 0xe0 == BPF_MEMSX {
                        match len {
                            1 => v as i8 as i64 as u64,
                            2 => v as i16 as i64 as u64,
                            _ => v as i32 as i64 as u64,
                        }
                    } else {
                        v
                    };
                }
                // Stores.
                0x72 | 0x6a | 0x62 | 0x7a | 0x73 | 0x6b | 0x63 | 0x7b => {
                    let addr = reg[d].wrapping_add(op.off as i64 as u64);
                    let len = 1u64
                        << (match op.op & 0x18 {
                            BPF_B => 0,
                            BPF_H => 1,
                            BPF_W => 2,
                            _ => 3,
                        });
                    let v = if op.op & 0x07 == BPF_ST { imm } else { reg[s] };
                    chk!(addr, len, true);
                    // SAFETY: as for loads, checked writable.
                    unsafe { store(addr, len, v) };
                }
                // Atomics.
                0xc3 | 0xdb => {
                    let addr = reg[d].wrapping_add(op.off as i64 as u64);
                    let wide = op.op == 0xdb;
                    let len = if wide { 8 } else { 4 };
                    chk!(addr, len, true);
                    if addr % len != 0 {
                        fail!(VmError::MisalignedAtomic { pc: pc - 1, addr });
                    }
                    let (src_val, r0) = (reg[s], reg[0]);
                    // SAFETY: checked writable and aligned above; other threads may access the
                    // same memory only through atomic operations or racy plain accesses that
                    // eBPF allows (as in the kernel), never through Rust references.
                    let (old, write_src, write_r0) = unsafe { atomic(addr, wide, op.imm as i32, src_val, r0) };
                    if write_src {
                        reg[s] = old;
                    }
                    if write_r0 {
                        reg[0] = old;
                    }
                }

                // Jumps.
                0x05 => pc = jmp(pc, op.off),
                0x06 => pc = op.imm as usize,
                0x15 => {
                    if reg[d] == imm {
                        pc = jmp(pc, op.off)
                    }
                }
                0x1d => {
                    if reg[d] == reg[s] {
                        pc = jmp(pc, op.off)
                    }
                }
                0x25 => {
                    if reg[d] > imm {
                        pc = jmp(pc, op.off)
                    }
                }
                0x2d => {
                    if reg[d] > reg[s] {
                        pc = jmp(pc, op.off)
                    }
                }
                0x35 => {
                    if reg[d] >= imm {
                        pc = jmp(pc, op.off)
                    }
                }
                0x3d => {
                    if reg[d] >= reg[s] {
                        pc = jmp(pc, op.off)
                    }
                }
                0x45 => {
                    if reg[d] & imm != 0 {
                        pc = jmp(pc, op.off)
                    }
                }
                0x4d => {
                    if reg[d] & reg[s] != 0 {
                        pc = jmp(pc, op.off)
                    }
                }
                0x55 => {
                    if reg[d] != imm {
                        pc = jmp(pc, op.off)
                    }
                }
                0x5d => {
                    if reg[d] != reg[s] {
                        pc = jmp(pc, op.off)
                    }
                }
                0x65 => {
                    if (reg[d] as i64) > imm as i64 {
                        pc = jmp(pc, op.off)
                    }
                }
                0x6d => {
                    if (reg[d] as i64) > reg[s] as i64 {
                        pc = jmp(pc, op.off)
                    }
                }
                0x75 => {
                    if (reg[d] as i64) >= imm as i64 {
                        pc = jmp(pc, op.off)
                    }
                }
                0x7d => {
                    if (reg[d] as i64) >= reg[s] as i64 {
                        pc = jmp(pc, op.off)
                    }
                }
                0xa5 => {
                    if reg[d] < imm {
                        pc = jmp(pc, op.off)
                    }
                }
                0xad => {
                    if reg[d] < reg[s] {
                        pc = jmp(pc, op.off)
                    }
                }
                0xb5 => {
                    if reg[d] <= imm {
                        pc = jmp(pc, op.off)
                    }
                }
                0xbd => {
                    if reg[d] <= reg[s] {
                        pc = jmp(pc, op.off)
                    }
                }
                0xc5 => {
                    if (reg[d] as i64) < imm as i64 {
                        pc = jmp(pc, op.off)
                    }
                }
                0xcd => {
                    if (reg[d] as i64) < reg[s] as i64 {
                        pc = jmp(pc, op.off)
                    }
                }
                0xd5 => {
                    if (reg[d] as i64) <= imm as i64 {
                        pc = jmp(pc, op.off)
                    }
                }
                0xdd => {
                    if (reg[d] as i64) <= reg[s] as i64 {
                        pc = jmp(pc, op.off)
                    }
                }

                // 32-bit compares.
                0x16 => {
                    if reg[d] as u32 == imm as u32 {
                        pc = jmp(pc, op.off)
                    }
                }
                0x1e => {
                    if reg[d] as u32 == reg[s] as u32 {
                        pc = jmp(pc, op.off)
                    }
                }
                0x26 => {
                    if reg[d] as u32 > imm as u32 {
                        pc = jmp(pc, op.off)
                    }
                }
                0x2e => {
                    if reg[d] as u32 > reg[s] as u32 {
                        pc = jmp(pc, op.off)
                    }
                }
                0x36 => {
                    if reg[d] as u32 >= imm as u32 {
                        pc = jmp(pc, op.off)
                    }
                }
                0x3e => {
                    if reg[d] as u32 >= reg[s] as u32 {
                        pc = jmp(pc, op.off)
                    }
                }
                0x46 => {
                    if reg[d] as u32 & imm as u32 != 0 {
                        pc = jmp(pc, op.off)
                    }
                }
                0x4e => {
                    if reg[d] as u32 & reg[s] as u32 != 0 {
                        pc = jmp(pc, op.off)
                    }
                }
                0x56 => {
                    if reg[d] as u32 != imm as u32 {
                        pc = jmp(pc, op.off)
                    }
                }
                0x5e => {
                    if reg[d] as u32 != reg[s] as u32 {
                        pc = jmp(pc, op.off)
                    }
                }
                0x66 => {
                    if (reg[d] as i32) > imm as i32 {
                        pc = jmp(pc, op.off)
                    }
                }
                0x6e => {
                    if (reg[d] as i32) > reg[s] as i32 {
                        pc = jmp(pc, op.off)
                    }
                }
                0x76 => {
                    if (reg[d] as i32) >= imm as i32 {
                        pc = jmp(pc, op.off)
                    }
                }
                0x7e => {
                    if (reg[d] as i32) >= reg[s] as i32 {
                        pc = jmp(pc, op.off)
                    }
                }
                0xa6 => {
                    if (reg[d] as u32) < imm as u32 {
                        pc = jmp(pc, op.off)
                    }
                }
                0xae => {
                    if (reg[d] as u32) < reg[s] as u32 {
                        pc = jmp(pc, op.off)
                    }
                }
                0xb6 => {
                    if reg[d] as u32 <= imm as u32 {
                        pc = jmp(pc, op.off)
                    }
                }
                0xbe => {
                    if reg[d] as u32 <= reg[s] as u32 {
                        pc = jmp(pc, op.off)
                    }
                }
                0xc6 => {
                    if (reg[d] as i32) < imm as i32 {
                        pc = jmp(pc, op.off)
                    }
                }
                0xce => {
                    if (reg[d] as i32) < reg[s] as i32 {
                        pc = jmp(pc, op.off)
                    }
                }
                0xd6 => {
                    if reg[d] as i32 <= imm as i32 {
                        pc = jmp(pc, op.off)
                    }
                }
                0xde => {
                    if reg[d] as i32 <= reg[s] as i32 {
                        pc = jmp(pc, op.off)
                    }
                }

                // Calls.
                0x85 => {
                    if op.src == 0 {
                        // SAFETY: `imm` is the address of a registered helper (resolved in
                        // `new` from the load-time check); helpers are `HelperFn`s.
                        let f: HelperFn = unsafe { std::mem::transmute::<usize, HelperFn>(op.imm as usize) };
                        run.depth.set(base + depth);
                        // SAFETY: a registered helper is trusted code taking five u64s.
                        reg[0] = unsafe { f(reg[1], reg[2], reg[3], reg[4], reg[5]) };
                        if op.off != 0 {
                            stop_if_ending!();
                        }
                    } else {
                        if base + depth + 1 >= MAX_CALL_FRAMES {
                            fail!(VmError::CallDepth { pc: pc - 1, max: MAX_CALL_FRAMES });
                        }
                        frames[depth] = Frame { ret_pc: pc, saved: [reg[6], reg[7], reg[8], reg[9]], r10: reg[10] };
                        depth += 1;
                        reg[10] -= STACK_SIZE as u64;
                        pc = op.imm as usize;
                    }
                }
                0x8d => {
                    let id = reg[d];
                    let Some(h) = self.prog.helpers().get_u64(id) else {
                        fail!(VmError::UnknownHelper { pc: pc - 1, id });
                    };
                    run.depth.set(base + depth);
                    // SAFETY: a registered helper is trusted code taking five u64s.
                    reg[0] = unsafe { (h.func)(reg[1], reg[2], reg[3], reg[4], reg[5]) };
                    // As the JIT does: after `callx` the check is unconditional.
                    stop_if_ending!();
                }
                OP_INLINE_LOOKUP => {
                    // `bpf_map_lookup_elem(array, r2)` inline, as the JIT does it; the key is
                    // read like any 4-byte load.
                    let a = self.inline[op.imm as usize];
                    let key = reg[2];
                    chk!(key, 4, false);
                    // SAFETY: checked readable just above.
                    let idx = unsafe { load(key, 4) } as u32;
                    reg[0] = a.lookup(idx);
                }
                0x95 => {
                    if depth == 0 {
                        break Ok(reg[0]);
                    }
                    depth -= 1;
                    let f = frames[depth];
                    [reg[6], reg[7], reg[8], reg[9]] = f.saved;
                    reg[10] = f.r10;
                    pc = f.ret_pc;
                }
                _ => unreachable!("opcode {:#04x} at {} passed the load-time checks", op.op, pc - 1),
            }
        };
        if COUNT {
            run.count.set(run.count.get() + count);
        }
        result
    }
}

/// What a run of the interpreter shares with the callbacks [`callback::invoke`](crate::callback::invoke)
/// runs inside it.
pub(crate) struct InterpRun<'a> {
    interp: &'a Interpreter,
    regions: &'a [Region],
    /// All frames' stacks; frame `d` has r10 = end - d * 512.
    stack: Region,
    /// Frame (0 = the entry's) that is calling a helper, set before each helper call.
    depth: Cell<usize>,
    /// Instructions executed, when counting.
    count: Cell<u64>,
    counting: bool,
}

impl InterpRun<'_> {
    pub(crate) fn interp(&self) -> &Interpreter {
        self.interp
    }

    /// Runs the function at `pc` (checked to start one) as a callback of the helper being
    /// called, in the frame above the helper's caller.
    pub(crate) fn invoke(&self, ctx: &RunCtx<'_>, pc: usize, args: [u64; 5]) -> Result<u64, VmError> {
        let caller = self.depth.get();
        if caller + 1 >= MAX_CALL_FRAMES {
            return Err(VmError::CallDepth { pc, max: MAX_CALL_FRAMES });
        }
        let result = if self.counting {
            self.interp.exec_at::<true>(ctx, self, pc, args, caller + 1)
        } else {
            self.interp.exec_at::<false>(ctx, self, pc, args, caller + 1)
        };
        // The same helper may call back again: from the same frame.
        self.depth.set(caller);
        result
    }
}

#[inline(always)]
fn jmp(pc: usize, off: i16) -> usize {
    (pc as isize + off as isize) as usize
}

fn bytemuck_u8(words: &mut [u64]) -> &mut [u8] {
    // SAFETY: u64 has no padding and any byte pattern is a valid u8; the length is exact and
    // the lifetime is the borrow's.
    unsafe { std::slice::from_raw_parts_mut(words.as_mut_ptr().cast::<u8>(), std::mem::size_of_val(words)) }
}

/// Reads `len` (1, 2, 4 or 8) bytes at `addr`, zero-extended.
///
/// # Safety
/// `[addr, addr+len)` must be readable memory.
#[inline(always)]
unsafe fn load(addr: u64, len: u64) -> u64 {
    debug_assert!(matches!(len, 1 | 2 | 4 | 8) && addr != 0, "load of {len} bytes at {addr:#x}");
    let p = addr as *const u8;
    // SAFETY: the caller guarantees the range is readable; reads are unaligned-safe.
    unsafe {
        match len {
            1 => p.read() as u64,
            2 => p.cast::<u16>().read_unaligned() as u64,
            4 => p.cast::<u32>().read_unaligned() as u64,
            _ => p.cast::<u64>().read_unaligned(),
        }
    }
}

/// Writes the low `len` bytes of `v` at `addr`.
///
/// # Safety
/// `[addr, addr+len)` must be writable memory.
#[inline(always)]
unsafe fn store(addr: u64, len: u64, v: u64) {
    debug_assert!(matches!(len, 1 | 2 | 4 | 8) && addr != 0, "store of {len} bytes at {addr:#x}");
    let p = addr as *mut u8;
    // SAFETY: the caller guarantees the range is writable; writes are unaligned-safe.
    unsafe {
        match len {
            1 => p.write(v as u8),
            2 => p.cast::<u16>().write_unaligned(v as u16),
            4 => p.cast::<u32>().write_unaligned(v as u32),
            _ => p.cast::<u64>().write_unaligned(v),
        }
    }
}

/// Performs an atomic operation; returns the old value (zero-extended for 32 bits) and
/// whether it goes to the source register and/or r0.
///
/// # Safety
/// `addr` must be writable and aligned to the operation's width.
unsafe fn atomic(addr: u64, wide: bool, code: i32, src: u64, r0: u64) -> (u64, bool, bool) {
    debug_assert!(addr != 0 && addr.is_multiple_of(if wide { 8 } else { 4 }), "atomic at {addr:#x} (wide: {wide})");
    const SEQ: Ordering = Ordering::SeqCst;
    let fetch = code & BPF_FETCH != 0;
    if wide {
        // SAFETY: the caller guarantees alignment and validity for the whole operation.
        let a = unsafe { AtomicU64::from_ptr(addr as *mut u64) };
        match code {
            BPF_XCHG => (a.swap(src, SEQ), true, false),
            BPF_CMPXCHG => (a.compare_exchange(r0, src, SEQ, SEQ).unwrap_or_else(|v| v), false, true),
            _ => {
                let old = match code & !BPF_FETCH {
                    0x00 => a.fetch_add(src, SEQ),
                    0x40 => a.fetch_or(src, SEQ),
                    0x50 => a.fetch_and(src, SEQ),
                    _ => a.fetch_xor(src, SEQ),
                };
                (old, fetch, false)
            }
        }
    } else {
        // SAFETY: as above, for 4 bytes.
        let a = unsafe { AtomicU32::from_ptr(addr as *mut u32) };
        let s = src as u32;
        let old = match code {
            BPF_XCHG => return (a.swap(s, SEQ) as u64, true, false),
            BPF_CMPXCHG => {
                return (a.compare_exchange(r0 as u32, s, SEQ, SEQ).unwrap_or_else(|v| v) as u64, false, true);
            }
            _ => match code & !BPF_FETCH {
                0x00 => a.fetch_add(s, SEQ),
                0x40 => a.fetch_or(s, SEQ),
                0x50 => a.fetch_and(s, SEQ),
                _ => a.fetch_xor(s, SEQ),
            },
        };
        (old as u64, fetch, false)
    }
}

/// 64-bit division; `off` 1 is signed. Division by zero gives 0; i64::MIN / -1 gives i64::MIN.
#[inline]
pub(crate) fn div64(a: u64, b: u64, off: i16) -> u64 {
    if b == 0 {
        0
    } else if off == 1 {
        (a as i64).wrapping_div(b as i64) as u64
    } else {
        a / b
    }
}

/// 64-bit modulo; `off` 1 is signed (sign of the dividend). Modulo by zero leaves `a`.
#[inline]
pub(crate) fn mod64(a: u64, b: u64, off: i16) -> u64 {
    if b == 0 {
        a
    } else if off == 1 {
        (a as i64).wrapping_rem(b as i64) as u64
    } else {
        a % b
    }
}

#[inline]
pub(crate) fn div32(a: u32, b: u32, off: i16) -> u32 {
    if b == 0 {
        0
    } else if off == 1 {
        (a as i32).wrapping_div(b as i32) as u32
    } else {
        a / b
    }
}

#[inline]
pub(crate) fn mod32(a: u32, b: u32, off: i16) -> u32 {
    if b == 0 {
        a
    } else if off == 1 {
        (a as i32).wrapping_rem(b as i32) as u32
    } else {
        a % b
    }
}
