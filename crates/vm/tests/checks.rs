//! Load-time checks: every refusal names the instruction at fault.

use std::sync::Arc;

use userbpf_isa::*;
use userbpf_vm::{Helper, HelperRegistry, LoadError, LoadOptions, Program, Relocator};

const EXIT: Insn = Insn::new(OP_EXIT, 0, 0, 0, 0);
const MOV0: Insn = Insn::new(BPF_ALU64 | BPF_MOV | BPF_K, 0, 0, 0, 0);

extern "C" fn nop(_: u64, _: u64, _: u64, _: u64, _: u64) -> u64 {
    0
}

fn options() -> LoadOptions {
    let mut helpers = HelperRegistry::new();
    helpers.register(Helper { id: 1, name: "map_lookup_elem", func: nop, may_exit: false });
    LoadOptions { helpers: Arc::new(helpers), ..Default::default() }
}

fn refused(insns: &[Insn]) -> (usize, String) {
    match Program::load(insns, &options(), None) {
        Err(LoadError::Insn { index, message }) => (index, message),
        Err(e) => panic!("refused without an index: {e}"),
        Ok(_) => panic!("accepted: {insns:?}"),
    }
}

fn assert_refused(insns: &[Insn], index: usize, needle: &str) {
    let (i, m) = refused(insns);
    assert_eq!(i, index, "wrong index for {m}");
    assert!(m.contains(needle), "message {m:?} lacks {needle:?}");
}

#[test]
fn empty_and_minimal() {
    assert_eq!(Program::load(&[], &options(), None).unwrap_err(), LoadError::Empty);
    Program::load(&[MOV0, EXIT], &options(), None).unwrap();
}

#[test]
fn unknown_opcodes() {
    for op in [0xff, 0x8f, 0xe7, 0x01, 0x02, 0x20, 0xf5, 0x96] {
        let (i, m) = refused(&[Insn::new(op, 0, 0, 0, 0), EXIT]);
        assert_eq!(i, 0, "{op:#x}: {m}");
    }
    assert_refused(&[Insn::new(0x20, 0, 0, 0, 0), EXIT], 0, "legacy packet");
}

#[test]
fn bad_registers() {
    assert_refused(&[Insn::new(BPF_ALU64 | BPF_MOV | BPF_K, 11, 0, 0, 0), EXIT], 0, "register r11");
    assert_refused(&[MOV0, Insn::new(BPF_ALU64 | BPF_MOV | BPF_X, 0, 12, 0, 0), EXIT], 1, "register r12");
    assert_refused(&[Insn::new(BPF_ALU64 | BPF_ADD | BPF_K, 10, 0, 0, 1), EXIT], 0, "r10");
    assert_refused(&[Insn::new(BPF_LDX | BPF_MEM | BPF_DW, 10, 1, 0, 0), EXIT], 0, "r10");
    // Stores through r10 are fine.
    Program::load(&[Insn::new(BPF_ST | BPF_MEM | BPF_DW, 10, 0, -8, 1), MOV0, EXIT], &options(), None).unwrap();
}

#[test]
fn reserved_fields() {
    assert_refused(&[Insn::new(BPF_ALU64 | BPF_ADD | BPF_K, 0, 0, 3, 1), EXIT], 0, "offset");
    assert_refused(&[Insn::new(BPF_ALU64 | BPF_ADD | BPF_K, 0, 1, 0, 1), EXIT], 0, "source register is not used");
    assert_refused(&[MOV0, Insn::new(OP_EXIT, 0, 0, 0, 1)], 1, "immediate is not used");
    assert_refused(&[Insn::new(BPF_ALU64 | BPF_END, 0, 0, 0, 24), EXIT], 0, "byte swap width 24");
    assert_refused(&[MOV0, Insn::new(BPF_STX | BPF_ATOMIC | BPF_DW, 10, 0, -8, 0x30), EXIT], 1, "atomic");
    assert_refused(&[MOV0, Insn::new(BPF_STX | BPF_ATOMIC | BPF_B, 10, 0, -8, 0), EXIT], 1, "unknown opcode 0xd3");
}

#[test]
fn jumps() {
    assert_refused(&[Insn::new(OP_JA, 0, 0, 5, 0), EXIT], 0, "outside the program");
    assert_refused(&[Insn::new(OP_JA, 0, 0, -2, 0), EXIT], 0, "outside the program");
    assert_refused(&[Insn::new(OP_JA32, 0, 0, 0, 9), EXIT], 0, "outside the program");
    // Into the second half of an lddw.
    assert_refused(
        &[Insn::new(OP_JA, 0, 0, 1, 0), Insn::new(OP_LDDW, 0, 0, 0, 1), Insn::new(0, 0, 0, 0, 0), EXIT],
        0,
        "middle of the lddw",
    );
    // Falling off the end.
    assert_refused(&[MOV0], 0, "fall off");
    assert_refused(&[MOV0, Insn::new(BPF_JMP | BPF_JEQ | BPF_K, 0, 0, -2, 0)], 1, "fall off");
}

#[test]
fn lddw_forms() {
    assert_refused(&[Insn::new(OP_LDDW, 0, 0, 0, 1)], 0, "second half");
    assert_refused(&[Insn::new(OP_LDDW, 0, 0, 0, 1), Insn::new(0x07, 0, 0, 0, 0), EXIT], 1, "second half");
    assert_refused(
        &[Insn::new(OP_LDDW, 1, BPF_PSEUDO_MAP_FD, 0, 3), Insn::new(0, 0, 0, 0, 0), MOV0, EXIT],
        0,
        "needs a relocation",
    );
    assert_refused(
        &[Insn::new(OP_LDDW, 1, 9, 0, 3), Insn::new(0, 0, 0, 0, 0), MOV0, EXIT],
        0,
        "invalid pseudo source 9",
    );

    struct Maps;
    impl Relocator for Maps {
        fn resolve_lddw(&self, _: usize, src: u8, imm: i32, next: i32) -> Result<u64, String> {
            match (src, imm) {
                (BPF_PSEUDO_MAP_VALUE, 7) => Ok(0x1000_0000_0000 + next as u64),
                _ => Err(format!("no map with fd {imm}")),
            }
        }
    }
    let prog = [Insn::new(OP_LDDW, 1, BPF_PSEUDO_MAP_VALUE, 0, 7), Insn::new(0, 0, 0, 0, 16), MOV0, EXIT];
    let p = Program::load(&prog, &options(), Some(&Maps)).unwrap();
    assert_eq!(p.insns()[0].src, 0);
    assert_eq!(p.insns()[0].wide_imm(p.insns()[1]), 0x1000_0000_0010);
    let bad = [Insn::new(OP_LDDW, 1, BPF_PSEUDO_MAP_FD, 0, 4), Insn::new(0, 0, 0, 0, 0), MOV0, EXIT];
    let e = Program::load(&bad, &options(), Some(&Maps)).unwrap_err().to_string();
    assert_eq!(e, "instruction 0: no map with fd 4");
}

#[test]
fn helpers_and_calls() {
    Program::load(&[Insn::new(OP_CALL, 0, 0, 0, 1), EXIT], &options(), None).unwrap();
    assert_refused(&[Insn::new(OP_CALL, 0, 0, 0, 6), EXIT], 0, "bpf_trace_printk (id 6) is not supported");
    assert_refused(&[Insn::new(OP_CALL, 0, 0, 0, 100_000), EXIT], 0, "unknown helper id 100000");
    assert_refused(&[Insn::new(OP_CALL, 0, BPF_PSEUDO_KFUNC_CALL, 0, 1), EXIT], 0, "kfunc");
    assert_refused(&[Insn::new(OP_CALL, 0, BPF_PSEUDO_CALL, 0, 5), EXIT], 0, "outside the program");
    assert_refused(&[Insn::new(OP_CALLX, 2, 0, 0, 0), EXIT], 0, "callx");
    // A jump may not leave its function.
    let prog = [
        Insn::new(OP_CALL, 0, BPF_PSEUDO_CALL, 0, 2),
        Insn::new(OP_JA, 0, 0, 1, 0),
        EXIT,
        MOV0, // function at 3
        EXIT,
    ];
    assert_refused(&prog, 1, "leaves the function");
}

#[test]
fn recursion_and_depth() {
    // main calls f, f calls itself.
    let rec = [Insn::new(OP_CALL, 0, 1, 0, 1), EXIT, Insn::new(OP_CALL, 0, 1, 0, -1), EXIT];
    assert_refused(&rec, 2, "recursive");
    // A chain of n functions, each calling the next: n + 1 frames.
    let chain = |n: usize| {
        let mut v = Vec::new();
        for k in 0..=n {
            if k < n {
                v.push(Insn::new(OP_CALL, 0, 1, 0, 1));
            } else {
                v.push(MOV0);
            }
            v.push(EXIT);
        }
        v
    };
    let p = Program::load(&chain(7), &options(), None).unwrap();
    assert_eq!(p.max_depth(), 8);
    let (_, m) = refused(&chain(8));
    assert!(m.contains("more than 8"), "{m}");
}
