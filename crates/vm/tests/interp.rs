//! The interpreter's memory checks: out-of-bounds accesses end the run with an error naming
//! the instruction, never a fault.

use std::sync::Arc;

use userbpf_isa::*;
use userbpf_vm::error::AccessKind;
use userbpf_vm::{Interpreter, LoadOptions, MemoryPolicy, Program, Region, VmError};

const EXIT: Insn = Insn::new(OP_EXIT, 0, 0, 0, 0);

fn interp(insns: &[Insn], options: &LoadOptions) -> Interpreter {
    Interpreter::new(Arc::new(Program::load(insns, options, None).expect("program loads")))
}

fn ldx(size: u8, dst: u8, src: u8, off: i16) -> Insn {
    Insn::new(BPF_LDX | BPF_MEM | size, dst, src, off, 0)
}

#[test]
fn stack_bounds() {
    let opts = LoadOptions::default();
    // The last 8 bytes of the frame are readable; one past r10 is not.
    let ok = interp(&[Insn::new(BPF_ST | BPF_MEM | BPF_DW, 10, 0, -8, 42), ldx(BPF_DW, 0, 10, -8), EXIT], &opts);
    assert_eq!(ok.run(0, 0, &[]), Ok(42));
    let past = interp(&[ldx(BPF_B, 0, 10, 0), EXIT], &opts);
    match past.run(0, 0, &[]) {
        Err(VmError::OutOfBounds { pc: 0, len: 1, kind: AccessKind::Read, .. }) => {}
        other => panic!("{other:?}"),
    }
    let straddle = interp(&[ldx(BPF_DW, 0, 10, -4), EXIT], &opts);
    assert!(matches!(straddle.run(0, 0, &[]), Err(VmError::OutOfBounds { pc: 0, len: 8, .. })));
}

#[test]
fn null_and_wild_pointers() {
    let opts = LoadOptions::default();
    let p = interp(&[Insn::new(BPF_ALU64 | BPF_MOV | BPF_K, 1, 0, 0, 0), ldx(BPF_W, 0, 1, 0), EXIT], &opts);
    assert!(matches!(p.run(0, 0, &[]), Err(VmError::OutOfBounds { pc: 1, addr: 0, .. })));
    let wild = interp(
        &[
            Insn::new(OP_LDDW, 1, 0, 0, 0x1234_0000),
            Insn::new(0, 0, 0, 0, 0x7fff),
            Insn::new(BPF_ST | BPF_MEM | BPF_DW, 1, 0, 0, 7),
            EXIT,
        ],
        &opts,
    );
    let e = wild.run(0, 0, &[]).unwrap_err();
    assert!(matches!(e, VmError::OutOfBounds { pc: 2, addr: 0x7fff_1234_0000, kind: AccessKind::Write, .. }));
    assert!(e.to_string().starts_with("instruction 2: write of 8 bytes at 0x7fff12340000"), "{e}");
}

#[test]
fn regions_and_read_only_memory() {
    let opts = LoadOptions::default();
    let mut buf = [1u8, 2, 3, 4];
    let read = interp(&[ldx(BPF_W, 0, 1, 0), EXIT], &opts);
    assert_eq!(read.run_mem(&mut buf), Ok(0x0403_0201));
    let beyond = interp(&[ldx(BPF_W, 0, 1, 1), EXIT], &opts);
    assert!(matches!(beyond.run_mem(&mut buf), Err(VmError::OutOfBounds { pc: 0, .. })));
    let write = interp(&[Insn::new(BPF_ST | BPF_MEM | BPF_B, 1, 0, 0, 9), Insn::new(0xb7, 0, 0, 0, 0), EXIT], &opts);
    let ro = [5u8; 4];
    let r1 = ro.as_ptr() as u64;
    assert!(matches!(write.run(r1, 4, &[Region::of(&ro)]), Err(VmError::OutOfBounds { kind: AccessKind::Write, .. })));
    assert_eq!(ro, [5; 4]);
    assert_eq!(write.run_mem(&mut buf), Ok(0));
    assert_eq!(buf[0], 9);
}

#[test]
fn memory_policy_extends_what_is_allowed() {
    struct Allow(u64, u64);
    impl MemoryPolicy for Allow {
        fn allows(&self, addr: u64, len: u64, write: bool) -> bool {
            !write && addr >= self.0 && addr + len <= self.0 + self.1
        }
    }
    let data = Box::new(0x1122_3344_5566_7788u64);
    let addr = &*data as *const u64 as u64;
    let opts = LoadOptions { memory: Some(Arc::new(Allow(addr, 8))), ..Default::default() };
    let p = interp(&[ldx(BPF_DW, 0, 1, 0), EXIT], &opts);
    assert_eq!(p.run(addr, 0, &[]), Ok(0x1122_3344_5566_7788));
    assert!(p.run(addr + 1, 0, &[]).is_err());
}

#[test]
fn misaligned_atomic_is_an_error() {
    let opts = LoadOptions::default();
    let mut buf = [0u8; 16];
    let p = interp(
        &[
            Insn::new(0xb7, 2, 0, 0, 1),
            Insn::new(BPF_STX | BPF_ATOMIC | BPF_DW, 1, 2, 4, 0),
            Insn::new(0xb7, 0, 0, 0, 0),
            EXIT,
        ],
        &opts,
    );
    assert!(matches!(p.run_mem(&mut buf), Err(VmError::MisalignedAtomic { pc: 1, .. })));
}

#[test]
fn callx_unknown_helper() {
    let opts = LoadOptions { allow_callx: true, ..Default::default() };
    let p = interp(&[Insn::new(0xb7, 3, 0, 0, 77), Insn::new(OP_CALLX, 3, 0, 0, 0), EXIT], &opts);
    assert_eq!(p.run(0, 0, &[]), Err(VmError::UnknownHelper { pc: 1, id: 77 }));
}

#[test]
fn frames_have_their_own_stacks() {
    // main stores 1 at r10-8, calls f which stores 2 at its r10-8; main reads back 1,
    // and f's r10 is 512 bytes below main's.
    let prog = [
        Insn::new(BPF_ST | BPF_MEM | BPF_DW, 10, 0, -8, 1),
        Insn::new(BPF_ALU64 | BPF_MOV | BPF_X, 6, 10, 0, 0),
        Insn::new(OP_CALL, 0, BPF_PSEUDO_CALL, 0, 4),
        ldx(BPF_DW, 7, 10, -8),
        Insn::new(BPF_ALU64 | BPF_SUB | BPF_X, 6, 0, 0, 0), // r6 = main r10 - f r10
        Insn::new(BPF_ALU64 | BPF_MOV | BPF_X, 0, 7, 0, 0),
        Insn::new(BPF_ALU64 | BPF_LSH | BPF_K, 0, 0, 0, 32),
        Insn::new(BPF_ALU64 | BPF_OR | BPF_X, 0, 6, 0, 0),
        EXIT,
        // f: r0 = r10
        Insn::new(BPF_ST | BPF_MEM | BPF_DW, 10, 0, -8, 2),
        Insn::new(BPF_ALU64 | BPF_MOV | BPF_X, 0, 10, 0, 0),
        EXIT,
    ];
    let fixed: Vec<Insn> = prog
        .iter()
        .enumerate()
        .map(|(i, x)| if x.op == OP_CALL { Insn { imm: 9 - i as i32 - 1, ..*x } } else { *x })
        .collect();
    let p = interp(&fixed, &LoadOptions::default());
    assert_eq!(p.run(0, 0, &[]), Ok((1 << 32) | 512));
}
