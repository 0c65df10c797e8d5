//! Inlined array lookups: a `call 1` (map_lookup_elem) whose r1 is an `lddw` of a map the
//! relocator describes with `inline_lookup` runs as an index check and an address computation
//! in both executors, never calling the helper, and gives what the helper would.
//!
//! The maps here are fakes: the "map address" an `lddw` resolves to points to a [`FakeMap`],
//! which helper 1 of the test registry reads (and counts its calls, per thread).

mod common;

use std::cell::Cell;
use std::sync::Arc;

use common::Asm;
use userbpf_isa::*;
use userbpf_vm::{
    Helper, HelperRegistry, InlineArray, Interpreter, JitProgram, LoadOptions, Program, Region, Relocator, VmError,
};

thread_local! {
    static HELPER_CALLS: Cell<u64> = const { Cell::new(0) };
}

fn helper_calls() -> u64 {
    HELPER_CALLS.with(|c| c.get())
}

/// What an `lddw` of a test map resolves to.
struct FakeMap {
    array: InlineArray,
    /// Whether the relocator offers it for inlining.
    inline: bool,
}

/// Helper 1: the lookup an array map's helper does, counted.
unsafe extern "C" fn lookup_helper(map: u64, key: u64, _: u64, _: u64, _: u64) -> u64 {
    HELPER_CALLS.with(|c| c.set(c.get() + 1));
    // SAFETY: the tests' programs pass the address of a live FakeMap and a 4-byte key on
    // their stack.
    let (m, idx) = unsafe { (&*(map as *const FakeMap), (key as *const u32).read_unaligned()) };
    m.array.lookup(idx)
}

fn registry(name: &'static str) -> HelperRegistry {
    let mut r = HelperRegistry::new();
    r.register(Helper::new(1, name, lookup_helper));
    r
}

/// Resolves `lddw rX, BPF_PSEUDO_MAP_IDX, k` to the address of `maps[k]`.
struct Maps<'a> {
    maps: &'a [FakeMap],
}

impl Relocator for Maps<'_> {
    fn resolve_lddw(&self, index: usize, src: u8, imm: i32, _next_imm: i32) -> Result<u64, String> {
        match (src, self.maps.get(imm as usize)) {
            (BPF_PSEUDO_MAP_IDX, Some(m)) => Ok(m as *const FakeMap as u64),
            _ => Err(format!("instruction {index}: no map {imm}")),
        }
    }
    fn inline_lookup(&self, map_addr: u64) -> Option<InlineArray> {
        self.maps.iter().find(|&m| m as *const FakeMap as u64 == map_addr && m.inline).map(|m| m.array)
    }
}

fn ld_map(a: &mut Asm, dst: u8, k: i32) -> &mut Asm {
    a.i(Insn::new(OP_LDDW, dst, BPF_PSEUDO_MAP_IDX, 0, k));
    a.i(Insn::new(0, 0, 0, 0, 0))
}

/// `r0 = bpf_map_lookup_elem(map k, &(u32)ctx[0])`, as clang emits it; then `tail`.
fn lookup_prog(k: i32, tail: &[Insn]) -> Vec<Insn> {
    let mut a = Asm::new();
    a.ldx(BPF_W, 6, 1, 0).stx(BPF_W, 10, 6, -4);
    ld_map(&mut a, 1, k);
    a.movx(2, 10).add(2, -4).call(1);
    for &i in tail {
        a.i(i);
    }
    a.exit();
    a.build()
}

/// After the lookup: r0 = the value's first byte, or -1 for null.
fn read_first_byte() -> Vec<Insn> {
    vec![
        Insn::new(BPF_JMP | BPF_JEQ | BPF_K, 0, 0, 2, 0),
        Insn::new(BPF_LDX | BPF_MEM | BPF_B, 0, 0, 0, 0),
        Insn::new(OP_EXIT, 0, 0, 0, 0),
        Insn::new(BPF_ALU64 | BPF_MOV | BPF_K, 0, 0, 0, -1),
    ]
}

fn load(insns: &[Insn], maps: &[FakeMap], helper_name: &'static str) -> Arc<Program> {
    let opts = LoadOptions { helpers: Arc::new(registry(helper_name)), ..Default::default() };
    Arc::new(Program::load(insns, &opts, Some(&Maps { maps })).unwrap_or_else(|e| panic!("load failed: {e}")))
}

/// Runs `prog` in both executors with the key in the context; the interpreter may read
/// `backing`. Returns (interpreter, JIT) results.
fn run_both(prog: &Arc<Program>, key: u32, backing: &[u8]) -> (Result<u64, VmError>, Result<u64, VmError>) {
    let mut ctx = key.to_ne_bytes();
    let interp = Interpreter::new(prog.clone());
    let jit = JitProgram::compile(prog.clone()).expect("compile");
    let r1 = ctx.as_mut_ptr() as u64;
    let regions = [Region::of_mut(&mut ctx), Region::of(backing)];
    let i = interp.run(r1, 4, &regions);
    // SAFETY: the programs read the 4-byte context, their stack, and (when they dereference
    // the lookup's result) elements inside `backing`.
    let j = unsafe { jit.run(r1, 4) };
    (i, j)
}

fn keys(max: u32) -> Vec<u32> {
    vec![0, 1, max / 2, max - 1, max, max.wrapping_add(1), 0x7fff_ffff, 0x8000_0000, u32::MAX]
}

#[test]
fn inlined_lookups_agree_and_skip_the_helper() {
    for elem_size in [1u32, 2, 4, 8, 16, 24, 40, 64, 72] {
        for max_entries in [1u32, 5, 64] {
            let backing: Vec<u8> = (0..(elem_size * max_entries) as usize).map(|i| (i * 7 + 3) as u8).collect();
            let array = InlineArray { values: backing.as_ptr() as u64, max_entries, elem_size, cpu_stride: 0 };
            let maps = [FakeMap { array, inline: true }, FakeMap { array, inline: false }];
            for tail in [Vec::new(), read_first_byte()] {
                let inlined = load(&lookup_prog(0, &tail), &maps, "map_lookup_elem");
                assert_eq!(inlined.inline_lookups(), &[(6, array)], "the call site is inlined");
                let called = load(&lookup_prog(1, &tail), &maps, "map_lookup_elem");
                assert!(called.inline_lookups().is_empty());
                for key in keys(max_entries) {
                    let expect = if tail.is_empty() {
                        array.lookup(key)
                    } else if key < max_entries {
                        backing[(key * elem_size) as usize] as u64
                    } else {
                        u64::MAX
                    };
                    let ctx = format!(
                        "elem_size {elem_size}, max_entries {max_entries}, key {key:#x}, deref {}",
                        !tail.is_empty()
                    );
                    let before = helper_calls();
                    let (i, j) = run_both(&inlined, key, &backing);
                    assert_eq!(helper_calls(), before, "{ctx}: the inlined lookup called the helper");
                    assert_eq!(i, Ok(expect), "{ctx}: interpreter");
                    assert_eq!(j, Ok(expect), "{ctx}: jit");
                    let (hi, hj) = run_both(&called, key, &backing);
                    assert_eq!(helper_calls(), before + 2, "{ctx}: the helper path");
                    assert_eq!((hi, hj), (Ok(expect), Ok(expect)), "{ctx}: helper path");
                }
            }
        }
    }
}

/// Bounds that do not fit a sign-extended imm8, or are negative as an i32, and sizes that
/// need a multiply: only the addresses are computed, nothing is read.
#[test]
fn large_bounds_and_odd_sizes() {
    for max_entries in [127u32, 128, 255, 256, 0x7fff_ffff, 0x8000_0000, 0x8000_0001, u32::MAX - 1, u32::MAX] {
        for elem_size in [8u32, 24, 1 << 20, 0x7fff_fff8] {
            let array = InlineArray { values: 0x7000_1234_5000, max_entries, elem_size, cpu_stride: 0 };
            let maps = [FakeMap { array, inline: true }];
            let prog = load(&lookup_prog(0, &[]), &maps, "map_lookup_elem");
            assert_eq!(prog.inline_lookups().len(), 1);
            for key in keys(max_entries) {
                let before = helper_calls();
                let (i, j) = run_both(&prog, key, &[]);
                assert_eq!(helper_calls(), before);
                let expect = Ok(array.lookup(key));
                assert_eq!(
                    (i, j),
                    (expect.clone(), expect),
                    "max_entries {max_entries:#x} elem_size {elem_size:#x} key {key:#x}"
                );
            }
        }
    }
}

#[test]
fn a_bad_key_pointer_ends_the_run_in_both_executors() {
    let array = InlineArray { values: 0x1000, max_entries: 4, elem_size: 8, cpu_stride: 0 };
    let maps = [FakeMap { array, inline: true }];
    let mut a = Asm::new();
    ld_map(&mut a, 1, 0);
    a.mov(2, 16).call(1).exit();
    let prog = load(&a.build(), &maps, "map_lookup_elem");
    assert_eq!(prog.inline_lookups().len(), 1);
    let (i, j) = run_both(&prog, 0, &[]);
    assert!(matches!(i, Err(VmError::OutOfBounds { pc: 3, addr: 16, len: 4, .. })), "interpreter: {i:?}");
    assert!(matches!(j, Err(VmError::Fault { .. })), "jit: {j:?}");
}

fn inline_sites(insns: &[Insn], helper_name: &'static str) -> Vec<usize> {
    let array = InlineArray { values: 0x1000, max_entries: 4, elem_size: 8, cpu_stride: 0 };
    let maps = [FakeMap { array, inline: true }];
    load(insns, &maps, helper_name).inline_lookups().iter().map(|&(pc, _)| pc).collect()
}

#[test]
fn which_sites_are_inlined() {
    // Other registers' ALU, loads and plain stores in between: inlined. The lddw may be a
    // jump target.
    let mut a = Asm::new();
    a.mov(6, 0).jmp(BPF_JEQ, 6, 0, "lddw").label("lddw");
    ld_map(&mut a, 1, 0);
    a.st(BPF_W, 10, -4, 3).movx(2, 10).ldx(BPF_DW, 3, 10, -8).stx(BPF_DW, 10, 3, -16).add(2, -4).call(1).exit();
    assert_eq!(inline_sites(&a.build(), "map_lookup_elem"), vec![a.here() - 2]);

    // In a function of its own, twice.
    let mut a = Asm::new();
    a.call_fn("f").exit().label("f");
    for _ in 0..2 {
        ld_map(&mut a, 1, 0);
        a.movx(2, 10).add(2, -4).call(1);
    }
    a.exit();
    assert_eq!(inline_sites(&a.build(), "map_lookup_elem"), vec![6, 11]);

    // A jump target between the lddw and the call: r1 may come from elsewhere.
    let mut a = Asm::new();
    a.movx(2, 10).mov(6, 0).jmp(BPF_JEQ, 6, 0, "mid");
    ld_map(&mut a, 1, 0);
    a.label("mid").add(2, -4).call(1).exit();
    assert!(inline_sites(&a.build(), "map_lookup_elem").is_empty());

    // The call itself a jump target.
    let mut a = Asm::new();
    a.movx(2, 10).add(2, -4).mov(6, 0).jmp(BPF_JEQ, 6, 0, "call");
    ld_map(&mut a, 1, 0);
    a.label("call").call(1).exit();
    assert!(inline_sites(&a.build(), "map_lookup_elem").is_empty());

    // r1 written in between (by ALU, a load, an atomic fetch into r1).
    for write in [
        Insn::new(BPF_ALU64 | BPF_ADD | BPF_K, 1, 0, 0, 8),
        Insn::new(BPF_ALU | BPF_MOV | BPF_X, 1, 1, 0, 0),
        Insn::new(BPF_LDX | BPF_MEM | BPF_DW, 1, 10, -8, 0),
        Insn::new(BPF_STX | BPF_ATOMIC | BPF_DW, 10, 1, -8, BPF_XCHG),
    ] {
        let mut a = Asm::new();
        a.st(BPF_DW, 10, -8, 0);
        ld_map(&mut a, 1, 0);
        a.i(write).movx(2, 10).add(2, -4).call(1).exit();
        assert!(inline_sites(&a.build(), "map_lookup_elem").is_empty(), "{write:?}");
    }

    // The map in another register, moved to r1: not followed (conservative).
    let mut a = Asm::new();
    ld_map(&mut a, 3, 0);
    a.movx(1, 3).movx(2, 10).add(2, -4).call(1).exit();
    assert!(inline_sites(&a.build(), "map_lookup_elem").is_empty());

    // Too far apart.
    let mut a = Asm::new();
    ld_map(&mut a, 1, 0);
    for _ in 0..9 {
        a.mov(3, 0);
    }
    a.movx(2, 10).add(2, -4).call(1).exit();
    assert!(inline_sites(&a.build(), "map_lookup_elem").is_empty());

    // A call in between (it clobbers r1).
    let mut a = Asm::new();
    ld_map(&mut a, 1, 0);
    a.movx(2, 10).add(2, -4).call(1).call(1).exit();
    assert_eq!(inline_sites(&a.build(), "map_lookup_elem"), vec![4]);

    // Helper 1 that is not map_lookup_elem: nothing is inlined.
    let mut a = Asm::new();
    ld_map(&mut a, 1, 0);
    a.movx(2, 10).add(2, -4).call(1).exit();
    assert!(inline_sites(&a.build(), "something_else").is_empty());
    assert_eq!(inline_sites(&a.build(), "map_lookup_elem"), vec![4]);
}

/// Without a relocator's `inline_lookup` (the trait's default), nothing is inlined.
#[test]
fn the_default_relocator_inlines_nothing() {
    struct Plain;
    impl Relocator for Plain {
        fn resolve_lddw(&self, _: usize, _: u8, _: i32, _: i32) -> Result<u64, String> {
            Ok(0x1000)
        }
    }
    let opts = LoadOptions { helpers: Arc::new(registry("map_lookup_elem")), ..Default::default() };
    let prog = Program::load(&lookup_prog(0, &[]), &opts, Some(&Plain)).unwrap();
    assert!(prog.inline_lookups().is_empty());
}

/// The interpreter marks inlined sites with opcode 0xf5, which no loaded program may have.
#[test]
fn opcode_0xf5_is_refused() {
    let opts = LoadOptions::default();
    let insns = [Insn::new(0xf5, 0, 0, 0, 0), Insn::new(OP_EXIT, 0, 0, 0, 0)];
    assert!(Program::load(&insns, &opts, None).is_err());
}

/// Per-CPU arrays: the JIT adds the run's CPU times `cpu_stride` (through the fast entry and
/// through the entry keeping the run state, with a helper ending runs); the interpreter calls
/// the helper; a program loading a callback, or calling a helper that may end runs, keeps
/// the call.
#[test]
fn per_cpu_lookups_are_inlined_by_the_jit_with_the_run_cpu() {
    let array = InlineArray { values: 0x7000_0000_1000, max_entries: 5, elem_size: 16, cpu_stride: 0x140 };
    let maps = [FakeMap { array, inline: true }];
    let prog = load(&lookup_prog(0, &[]), &maps, "map_lookup_elem");
    assert_eq!(prog.inline_lookups().len(), 1);
    let jit = JitProgram::compile(prog.clone()).expect("compile");
    assert!(jit.needs_context(), "a per-CPU lookup needs the run's CPU");
    let interp = Interpreter::new(prog.clone());
    for cpu in [0u32, 1, 3, 200] {
        for key in [0u32, 4, 5, u32::MAX] {
            let mut ctx = key.to_ne_bytes();
            let r1 = ctx.as_mut_ptr() as u64;
            let before = helper_calls();
            // SAFETY: the program reads its 4-byte context and its stack only.
            let j = unsafe { jit.run_on_cpu(r1, 4, cpu) };
            assert_eq!(helper_calls(), before, "the JIT inlines it");
            let want = if key < 5 { array.values + key as u64 * 16 + cpu as u64 * 0x140 } else { 0 };
            assert_eq!(j, Ok(want), "cpu {cpu} key {key}");
            let regions = [Region::of_mut(&mut ctx)];
            // The interpreter calls helper 1 (the fake's lookup ignores CPUs).
            assert_eq!(interp.run(r1, 4, &regions), Ok(array.lookup(key)), "interpreter, key {key}");
            assert_eq!(helper_calls(), before + 1, "the interpreter calls the helper");
        }
    }
    // A callback loaded, or a helper that may end the run called: not inlined.
    unsafe extern "C" fn ends(_: u64, _: u64, _: u64, _: u64, _: u64) -> u64 {
        0
    }
    let mut r = registry("map_lookup_elem");
    r.register(Helper { id: 12, name: "ends", func: ends, may_exit: true });
    let opts = LoadOptions { helpers: Arc::new(r), ..Default::default() };
    let with_exit = lookup_prog(0, &[Insn::new(OP_CALL, 0, 0, 0, 12)]);
    let p = Program::load(&with_exit, &opts, Some(&Maps { maps: &maps })).unwrap();
    assert!(p.inline_lookups().is_empty(), "with a helper ending runs");
    let plain = [FakeMap { array: InlineArray { cpu_stride: 0, ..array }, inline: true }];
    let p = Program::load(&with_exit, &opts, Some(&Maps { maps: &plain })).unwrap();
    assert_eq!(p.inline_lookups().len(), 1, "a plain array is inlined there");
}
