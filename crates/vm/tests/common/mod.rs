//! Shared by the tests of exit requests, callbacks and JIT faults: a tiny assembler with
//! labels, and one way to load and run a program in either executor.
#![allow(dead_code)]

use std::collections::HashMap;
use std::sync::Arc;

use userbpf_isa::*;
use userbpf_vm::{HelperRegistry, Interpreter, JitProgram, LoadOptions, Program, Region, VmError};

/// A program under construction; jumps, calls and function addresses name labels.
#[derive(Default)]
pub struct Asm {
    insns: Vec<Insn>,
    labels: HashMap<&'static str, usize>,
    /// (slot, label, true for `off` (jumps), false for `imm` (calls, lddw of a function)).
    fixups: Vec<(usize, &'static str, bool)>,
}

impl Asm {
    pub fn new() -> Asm {
        Asm::default()
    }
    /// Index of the next slot.
    pub fn here(&self) -> usize {
        self.insns.len()
    }
    pub fn label(&mut self, l: &'static str) -> &mut Self {
        assert!(self.labels.insert(l, self.insns.len()).is_none(), "label {l} twice");
        self
    }
    pub fn i(&mut self, insn: Insn) -> &mut Self {
        self.insns.push(insn);
        self
    }
    pub fn mov(&mut self, dst: u8, imm: i32) -> &mut Self {
        self.i(Insn::new(BPF_ALU64 | BPF_MOV | BPF_K, dst, 0, 0, imm))
    }
    pub fn movx(&mut self, dst: u8, src: u8) -> &mut Self {
        self.i(Insn::new(BPF_ALU64 | BPF_MOV | BPF_X, dst, src, 0, 0))
    }
    pub fn add(&mut self, dst: u8, imm: i32) -> &mut Self {
        self.i(Insn::new(BPF_ALU64 | BPF_ADD | BPF_K, dst, 0, 0, imm))
    }
    pub fn addx(&mut self, dst: u8, src: u8) -> &mut Self {
        self.i(Insn::new(BPF_ALU64 | BPF_ADD | BPF_X, dst, src, 0, 0))
    }
    pub fn alu(&mut self, op: u8, dst: u8, imm: i32) -> &mut Self {
        self.i(Insn::new(BPF_ALU64 | op | BPF_K, dst, 0, 0, imm))
    }
    pub fn alux(&mut self, op: u8, dst: u8, src: u8) -> &mut Self {
        self.i(Insn::new(BPF_ALU64 | op | BPF_X, dst, src, 0, 0))
    }
    pub fn lddw(&mut self, dst: u8, v: u64) -> &mut Self {
        self.i(Insn::new(OP_LDDW, dst, 0, 0, v as u32 as i32));
        self.i(Insn::new(0, 0, 0, 0, (v >> 32) as u32 as i32))
    }
    /// `lddw dst, BPF_PSEUDO_FUNC` of the function at `l`.
    pub fn ld_fn(&mut self, dst: u8, l: &'static str) -> &mut Self {
        self.fixups.push((self.here(), l, false));
        self.i(Insn::new(OP_LDDW, dst, BPF_PSEUDO_FUNC, 0, 0));
        self.i(Insn::new(0, 0, 0, 0, 0))
    }
    pub fn ldx(&mut self, size: u8, dst: u8, src: u8, off: i16) -> &mut Self {
        self.i(Insn::new(BPF_LDX | BPF_MEM | size, dst, src, off, 0))
    }
    pub fn st(&mut self, size: u8, dst: u8, off: i16, imm: i32) -> &mut Self {
        self.i(Insn::new(BPF_ST | BPF_MEM | size, dst, 0, off, imm))
    }
    pub fn stx(&mut self, size: u8, dst: u8, src: u8, off: i16) -> &mut Self {
        self.i(Insn::new(BPF_STX | BPF_MEM | size, dst, src, off, 0))
    }
    pub fn atomic(&mut self, size: u8, dst: u8, src: u8, off: i16, op: i32) -> &mut Self {
        self.i(Insn::new(BPF_STX | BPF_ATOMIC | size, dst, src, off, op))
    }
    pub fn call(&mut self, helper: u32) -> &mut Self {
        self.i(Insn::new(OP_CALL, 0, 0, 0, helper as i32))
    }
    pub fn callx(&mut self, reg: u8) -> &mut Self {
        self.i(Insn::new(OP_CALLX, reg, 0, 0, 0))
    }
    /// bpf-to-bpf call of the function at `l`.
    pub fn call_fn(&mut self, l: &'static str) -> &mut Self {
        self.fixups.push((self.here(), l, false));
        self.i(Insn::new(OP_CALL, 0, BPF_PSEUDO_CALL, 0, 0))
    }
    /// `if dst <op> imm goto l`.
    pub fn jmp(&mut self, op: u8, dst: u8, imm: i32, l: &'static str) -> &mut Self {
        self.fixups.push((self.here(), l, true));
        self.i(Insn::new(BPF_JMP | BPF_K | op, dst, 0, 0, imm))
    }
    pub fn ja(&mut self, l: &'static str) -> &mut Self {
        self.fixups.push((self.here(), l, true));
        self.i(Insn::new(OP_JA, 0, 0, 0, 0))
    }
    pub fn exit(&mut self) -> &mut Self {
        self.i(Insn::new(OP_EXIT, 0, 0, 0, 0))
    }
    /// Slot index of a label.
    pub fn at(&self, l: &'static str) -> usize {
        self.labels[l]
    }
    pub fn build(&self) -> Vec<Insn> {
        let mut v = self.insns.clone();
        for &(slot, l, is_off) in &self.fixups {
            let t = *self.labels.get(l).unwrap_or_else(|| panic!("no label {l}"));
            let rel = t as i64 - (slot as i64 + 1);
            if is_off {
                v[slot].off = rel as i16;
            } else {
                v[slot].imm = rel as i32;
            }
        }
        v
    }
}

/// A program loaded for one of the executors.
pub enum Exec {
    Interp(Interpreter),
    Jit(JitProgram),
}

impl Exec {
    pub fn load(insns: &[Insn], helpers: HelperRegistry, jit: bool) -> Exec {
        let opts = LoadOptions { helpers: Arc::new(helpers), allow_callx: true, ..Default::default() };
        let prog = Arc::new(Program::load(insns, &opts, None).unwrap_or_else(|e| panic!("load failed: {e}")));
        if jit { Exec::Jit(JitProgram::compile(prog).expect("compile")) } else { Exec::Interp(Interpreter::new(prog)) }
    }

    pub fn name(&self) -> &'static str {
        match self {
            Exec::Interp(_) => "interpreter",
            Exec::Jit(_) => "jit",
        }
    }

    /// Runs with r1 = the buffer (0 if empty), r2 = its length; the interpreter may touch the
    /// buffer.
    pub fn run(&self, buf: &mut [u8]) -> Result<u64, VmError> {
        match self {
            Exec::Interp(i) => i.run_mem(buf),
            // SAFETY: the tests' programs touch only their stack and the buffer, or fault on
            // purpose (which the JIT contains).
            Exec::Jit(j) => unsafe { j.run_mem(buf) },
        }
    }

    /// Runs with r1 and r2 as given and `regions` for the interpreter.
    pub fn run_with(&self, r1: u64, r2: u64, regions: &[Region]) -> Result<u64, VmError> {
        match self {
            Exec::Interp(i) => i.run(r1, r2, regions),
            // SAFETY: as in `run`.
            Exec::Jit(j) => unsafe { j.run(r1, r2) },
        }
    }
}

pub fn u64_at(buf: &[u8], off: usize) -> u64 {
    u64::from_le_bytes(buf[off..off + 8].try_into().unwrap())
}
