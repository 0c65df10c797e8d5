//! Direct map calls: a `call 1`, `call 2` or `call 3` (map lookup, update, delete) whose r1 is
//! an `lddw` of a map the relocator offers with `direct_call` is, in JIT code, a call of the
//! map's own function with its argument in r1 and the run's CPU slot in r5 (r2..r4 as the
//! program set them); the interpreter calls the helper. Sites are those of inlined lookups
//! (same window, same conditions): a program whose runs may lack the CPU (a helper ending
//! runs, a callback) keeps the helper calls.
//!
//! The maps are fakes: the helpers and the direct functions record what they were called
//! with (per thread) and return values that tell them apart.

mod common;

use std::cell::Cell;
use std::sync::Arc;

use common::Asm;
use userbpf_isa::*;
use userbpf_vm::{
    DirectCall, Helper, HelperRegistry, Interpreter, JitProgram, LoadOptions, Program, Region, Relocator,
};

/// What the last call saw: (which, r1, r2, r3, r4, r5).
type Seen = (u64, u64, u64, u64, u64, u64);

thread_local! {
    static SEEN: Cell<Seen> = const { Cell::new((0, 0, 0, 0, 0, 0)) };
}

fn seen() -> Seen {
    SEEN.with(|c| c.get())
}

/// Helpers 1, 2 and 3 (`which` 1..3) and the direct functions (`which` 11..13): record the
/// call, return `which << 32 | low 32 bits of r1`.
fn record(which: u64, r1: u64, r2: u64, r3: u64, r4: u64, r5: u64) -> u64 {
    SEEN.with(|c| c.set((which, r1, r2, r3, r4, r5)));
    which << 32 | (r1 & 0xffff_ffff)
}
unsafe extern "C" fn h1(a: u64, b: u64, c: u64, d: u64, e: u64) -> u64 {
    record(1, a, b, c, d, e)
}
unsafe extern "C" fn h2(a: u64, b: u64, c: u64, d: u64, e: u64) -> u64 {
    record(2, a, b, c, d, e)
}
unsafe extern "C" fn h3(a: u64, b: u64, c: u64, d: u64, e: u64) -> u64 {
    record(3, a, b, c, d, e)
}
unsafe extern "C" fn d1(a: u64, b: u64, c: u64, d: u64, e: u64) -> u64 {
    record(11, a, b, c, d, e)
}
unsafe extern "C" fn d2(a: u64, b: u64, c: u64, d: u64, e: u64) -> u64 {
    record(12, a, b, c, d, e)
}
unsafe extern "C" fn d3(a: u64, b: u64, c: u64, d: u64, e: u64) -> u64 {
    record(13, a, b, c, d, e)
}

fn registry() -> HelperRegistry {
    let mut r = HelperRegistry::new();
    r.register(Helper::new(1, "map_lookup_elem", h1));
    r.register(Helper::new(2, "map_update_elem", h2));
    r.register(Helper::new(3, "map_delete_elem", h3));
    r
}

/// A test map: what its direct calls get as their argument, and whether it has any.
struct FakeMap {
    arg: u64,
    direct: bool,
}

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
    fn direct_call(&self, map_addr: u64, helper_id: u32) -> Option<DirectCall> {
        let m = self.maps.iter().find(|&m| m as *const FakeMap as u64 == map_addr && m.direct)?;
        let func = match helper_id {
            1 => d1 as unsafe extern "C" fn(u64, u64, u64, u64, u64) -> u64,
            2 => d2,
            3 => d3,
            _ => return None,
        };
        Some(DirectCall { func: func as usize as u64, arg: m.arg, memo: None })
    }
}

fn ld_map(a: &mut Asm, dst: u8, k: i32) -> &mut Asm {
    a.i(Insn::new(OP_LDDW, dst, BPF_PSEUDO_MAP_IDX, 0, k));
    a.i(Insn::new(0, 0, 0, 0, 0))
}

/// `r0 = helper(map k, r10 - 8, r10 - 16, flags 2)`, as clang emits a map call, with r5 set to
/// a marker first (the direct call replaces it with the CPU).
fn call_prog(k: i32, helper: u32, tail: &[Insn]) -> Vec<Insn> {
    let mut a = Asm::new();
    a.st(BPF_DW, 10, -8, 7).st(BPF_DW, 10, -16, 9).mov(5, 0x55);
    ld_map(&mut a, 1, k);
    a.movx(2, 10).add(2, -8).movx(3, 10).add(3, -16).mov(4, 2).call(helper);
    for &i in tail {
        a.i(i);
    }
    a.exit();
    a.build()
}

fn load(insns: &[Insn], maps: &[FakeMap], reg: HelperRegistry) -> Arc<Program> {
    let opts = LoadOptions { helpers: Arc::new(reg), ..Default::default() };
    Arc::new(Program::load(insns, &opts, Some(&Maps { maps })).unwrap_or_else(|e| panic!("load failed: {e}")))
}

#[test]
fn the_jit_calls_the_maps_function_with_its_argument_and_the_run_cpu() {
    let maps = [FakeMap { arg: 0x1234_5678_9abc, direct: true }];
    for helper in 1..=3u32 {
        let prog = load(&call_prog(0, helper, &[]), &maps, registry());
        assert_eq!(prog.direct_calls().len(), 1, "helper {helper}");
        let jit = JitProgram::compile(prog.clone()).expect("compile");
        assert!(jit.needs_context(), "a direct call is a call");
        let interp = Interpreter::new(prog.clone());
        for cpu in [0u32, 1, 7] {
            // SAFETY: the program touches its stack only (the fakes read nothing).
            let r0 = unsafe { jit.run_on_cpu(0, 0, cpu) }.expect("JIT run");
            let (which, r1, r2, r3, r4, r5) = seen();
            assert_eq!(
                (which, r1, r4, r5),
                (10 + helper as u64, maps[0].arg, 2, cpu as u64),
                "JIT, helper {helper}, cpu {cpu}"
            );
            assert_eq!(r2 - r3, 8, "r2 and r3 are the program's stack slots");
            assert_eq!(r0, (10 + helper as u64) << 32 | (maps[0].arg & 0xffff_ffff), "r0 is the function's result");
        }
        // The interpreter calls the helper with the map's address and the program's r5.
        let r0 = interp.run(0, 0, &[] as &[Region]).expect("interpreter run");
        let (which, r1, _, _, r4, r5) = seen();
        let map_addr = &maps[0] as *const FakeMap as u64;
        assert_eq!((which, r1, r4, r5), (helper as u64, map_addr, 2, 0x55), "interpreter, helper {helper}");
        assert_eq!(r0, (helper as u64) << 32 | (map_addr & 0xffff_ffff));
    }
}

#[test]
fn which_sites_are_called_directly() {
    let maps = [FakeMap { arg: 1, direct: true }, FakeMap { arg: 2, direct: false }];
    // A map the relocator does not offer: the helper.
    let prog = load(&call_prog(1, 1, &[]), &maps, registry());
    assert!(prog.direct_calls().is_empty());
    // Other helper ids on the map: the helper (only 1..3 are map calls).
    let mut r = registry();
    unsafe extern "C" fn other(_: u64, _: u64, _: u64, _: u64, _: u64) -> u64 {
        0
    }
    r.register(Helper::new(4, "probe_read", other));
    let prog = load(&call_prog(0, 4, &[]), &maps, r);
    assert!(prog.direct_calls().is_empty());
    // A helper 1 that is not map_lookup_elem: no direct call.
    let mut r = HelperRegistry::new();
    r.register(Helper::new(1, "something_else", h1));
    let prog = load(&call_prog(0, 1, &[]), &maps, r);
    assert!(prog.direct_calls().is_empty());
    // r1 overwritten between the lddw and the call: the helper.
    let mut a = Asm::new();
    ld_map(&mut a, 1, 0);
    a.mov(1, 0).movx(2, 10).add(2, -8).call(1).exit();
    let prog = load(&a.build(), &maps, registry());
    assert!(prog.direct_calls().is_empty());
    // A helper that may end runs elsewhere in the program (its runs may lack the CPU): none.
    let mut r = registry();
    unsafe extern "C" fn ends(_: u64, _: u64, _: u64, _: u64, _: u64) -> u64 {
        0
    }
    r.register(Helper { id: 12, name: "ends", func: ends, may_exit: true });
    let prog = load(&call_prog(0, 2, &[Insn::new(OP_CALL, 0, 0, 0, 12)]), &maps, r);
    assert!(prog.direct_calls().is_empty());
    // The default relocator calls no function directly.
    struct Plain<'a>(&'a [FakeMap]);
    impl Relocator for Plain<'_> {
        fn resolve_lddw(&self, _: usize, _: u8, imm: i32, _: i32) -> Result<u64, String> {
            Ok(&self.0[imm as usize] as *const FakeMap as u64)
        }
    }
    let opts = LoadOptions { helpers: Arc::new(registry()), ..Default::default() };
    let prog = Program::load(&call_prog(0, 1, &[]), &opts, Some(&Plain(&maps))).unwrap();
    assert!(prog.direct_calls().is_empty());
}
