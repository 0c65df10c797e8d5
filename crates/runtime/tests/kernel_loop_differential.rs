//! Differential testing of `bpf_loop` against the kernel: random iteration counts (none, a
//! few, many, the kernel's limit of 2^23 and one past it, counts whose upper 32 bits are set),
//! flags (0, or not), and a callback that folds each index into an accumulator and stops at a
//! drawn index, run by the kernel (a socket filter through `BPF_PROG_TEST_RUN`) and by
//! userbpf's interpreter and JIT, must give the same return value and accumulator.
//!
//! The flags are added to a value the verifier cannot know (the packet's `mark`, 0), so that
//! the kernel calls its helper: with flags it knows to be 0 the kernel's verifier inlines
//! `bpf_loop`, and the inlined loop departs from the helper (found by this test, 6.18): its
//! `-E2BIG` is a 32-bit value (r0 = 0xfffffff9, where the helper returns -7 as a `long`), and
//! it compares the whole 64-bit count with the limit where the helper takes the count as a
//! `u32` (a count of 2^32 + 7 is `-E2BIG` inlined, 7 iterations by the helper). userbpf
//! follows the helper.
//!
//! Environment: `KLOOP_SEED=N` (decimal or 0x-hex, or `time`), `KLOOP_COUNT=N` (default 200).

mod common;

use std::sync::Arc;

use common::{Registered, lddw};
use userbpf_isa::{BPF_PSEUDO_FUNC, Insn};
use userbpf_runtime::context::CpuSlots;
use userbpf_runtime::helpers;
use userbpf_testutil::kernel::{self, Fd};
use userbpf_testutil::{Rng, TmpDir};
use userbpf_vm::{LoadOptions, Program};

const OUT_LEN: usize = 16;

/// A case: `nr_loops`, `flags`, the index the callback stops at, the accumulator's start.
#[derive(Debug)]
struct Case {
    nr_loops: u64,
    flags: i32,
    stop_at: u64,
    acc: u64,
}

impl Case {
    fn new(rng: &mut Rng) -> Case {
        let nr_loops = match rng.below(10) {
            0 => 0,
            // The limit itself (rarely: 2^23 callbacks take a while in the interpreter).
            1 if rng.chance(1, 5) => 1 << 23,
            1 | 2 => (1 << 23) + 1 + rng.below(2),
            // bpf_loop takes the count as a u32: upper bits are ignored.
            3 => 0x1_0000_0000 | rng.below(50),
            4 => rng.below(100_000),
            _ => rng.below(50),
        };
        let flags = if rng.chance(1, 10) { rng.pick(&[1, 2, -1]) } else { 0 };
        let stop_at = if rng.chance(1, 2) { rng.below(nr_loops.max(1) + 2) } else { u64::MAX };
        Case { nr_loops, flags, stop_at, acc: rng.edge_u64() }
    }

    /// The program: `out` loads the output array's reference into r1.
    fn program(&self, out: [Insn; 2]) -> Vec<Insn> {
        let mov_x = |d, s| Insn::new(0xbf, d, s, 0, 0);
        let mov_k = |d, k| Insn::new(0xb7, d, 0, 0, k);
        let add_k = |d, k| Insn::new(0x07, d, 0, 0, k);
        let lddw_k = |d: u8, v: u64| lddw(d, v);
        // r7 = the packet's mark (0; the kernel's context is a __sk_buff, whose `mark` is at 8,
        // ours the packet itself): the flags added to it are unknown to the verifier.
        let mut p = vec![Insn::new(0x61, 7, 1, 8, 0)];
        let null_check = common::output_frame_start(&mut p, out, -20);
        // The callback's context at fp - 16: the index to stop at, then the accumulator.
        p.extend(lddw_k(1, self.stop_at));
        p.push(Insn::new(0x7b, 10, 1, -16, 0));
        p.extend(lddw_k(1, self.acc));
        p.push(Insn::new(0x7b, 10, 1, -8, 0));
        p.extend(lddw_k(1, self.nr_loops));
        let func = p.len();
        p.push(Insn::new(0x18, 2, BPF_PSEUDO_FUNC, 0, 0)); // r2 = the callback (offset below)
        p.push(Insn::new(0, 0, 0, 0, 0));
        p.push(mov_x(3, 10));
        p.push(add_k(3, -16));
        p.push(mov_x(4, 7));
        p.push(add_k(4, self.flags));
        p.push(Insn::new(0x85, 0, 0, 0, 181));
        p.push(Insn::new(0x7b, 6, 0, 0, 0));
        p.push(Insn::new(0x79, 1, 10, -8, 0));
        p.push(Insn::new(0x7b, 6, 1, 8, 0));
        common::output_frame_end(&mut p, null_check);
        // callback(index r1, ctx r2): acc = acc * 31 + index; 1 (stop) at the index drawn.
        p[func].imm = (p.len() - func - 1) as i32;
        p.push(Insn::new(0x79, 3, 2, 8, 0));
        p.push(Insn::new(0x27, 3, 0, 0, 31));
        p.push(Insn::new(0x0f, 3, 1, 0, 0));
        p.push(Insn::new(0x7b, 2, 3, 8, 0));
        p.push(mov_k(0, 0));
        p.push(Insn::new(0x79, 4, 2, 0, 0));
        p.push(Insn::new(0x5d, 1, 4, 1, 0)); // if r1 != r4 goto +1
        p.push(mov_k(0, 1));
        p.push(Insn::new(0x95, 0, 0, 0, 0));
        p
    }
}

#[test]
fn bpf_loop_agrees_with_the_kernel() {
    let Some((seed, count)) = kernel::fuzz_setup("KLOOP_SEED", 0x6b6c_6f6f, "KLOOP_COUNT", 200) else { return };
    let dir = TmpDir::new("kernel-loop-differential");
    let out = common::Output::new(&dir, OUT_LEN, 1);
    let kout = common::kernel_map(&common::Output::spec(OUT_LEN));
    let opts = LoadOptions { helpers: helpers::registry(), memory: Some(Arc::new(Registered)), allow_callx: false };
    let slots = CpuSlots::private().unwrap();
    let mut failures = Vec::new();
    for c in 0..count {
        let case_seed = seed.wrapping_add(c);
        let case = Case::new(&mut Rng::new(case_seed));
        let k_out = kernel_run(&case, &kout);
        let prog = Arc::new(Program::load(&case.program(lddw(1, out.addr)), &opts, None).unwrap());
        for (e, engine) in ["interpreter", "JIT"].iter().enumerate() {
            let o = out.run(&prog, e == 1, &slots);
            if o != k_out {
                let w = |b: &[u8], at: usize| i64::from_ne_bytes(b[at..at + 8].try_into().unwrap());
                failures.push(format!(
                    "case seed {case_seed:#x} (reproduce: KLOOP_SEED={case_seed:#x} KLOOP_COUNT=1): {case:?}\n  kernel: returned {}, accumulator {:#x}\n  {engine}: returned {}, accumulator {:#x}",
                    w(&k_out, 0),
                    w(&k_out, 8),
                    w(&o, 0),
                    w(&o, 8)
                ));
            }
        }
        if failures.len() >= 6 {
            break;
        }
    }
    println!("{count} bpf_loop calls (first seed {seed:#x}) run by the kernel, the interpreter and the JIT");
    assert!(failures.is_empty(), "{} difference(s):\n\n{}", failures.len(), failures.join("\n\n"));
}

/// Runs the case in the kernel as a socket filter: the output element.
fn kernel_run(case: &Case, out: &Fd) -> Vec<u8> {
    let insns = case.program([Insn::new(0x18, 1, 1, 0, out.0), Insn::new(0, 0, 0, 0, 0)]);
    // The callback is the function after the main one's two exits.
    let callback = insns.iter().rposition(|i| i.op == 0x79 && i.dst == 3 && i.src == 2).unwrap() as u32;
    common::kernel_run_output(&insns, out, OUT_LEN, Some(&[0, callback]))
        .unwrap_or_else(|(e, log)| panic!("the kernel refuses the program: {e}\n{log}"))
}
