//! The verifier under fuzzing, on the load path the runtime uses.
//!
//! - Program mutants: the programs of tests/bpf/fuzz_seed.bpf.c (clang-built, loaded into a
//!   session with their maps) mutated (fields changed, instructions deleted, inserted, swapped,
//!   random ones among them, invalid opcodes too) are given to the verifier, which must never
//!   panic; every mutant it accepts is run in the interpreter and in the JIT (on a context of
//!   random argument registers) and must run without a fault in either: no out-of-bounds
//!   access, no memory fault, no error. Mutants calling the helpers that act on this process
//!   itself (`bpf_send_signal*`, `bpf_probe_write_user`, `bpf_override_return`) are verified but
//!   not run.
//! - Object mutants: the seed object truncated and bit-flipped goes through the object loader
//!   and, when that accepts it, every program through the verifier: an error, never a panic.
//!
//! `USERBPF_VERIFY_FUZZ_COUNT` (default 10,000 program mutants; `make bench` runs a million)
//! and `USERBPF_VERIFY_FUZZ_SEED` choose the campaign; a failure prints the case's seed and
//! program, and `USERBPF_VERIFY_FUZZ_SEED=S USERBPF_VERIFY_FUZZ_COUNT=1` reproduces it.

mod common;

use std::collections::BTreeMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use userbpf_isa::*;
use userbpf_maps::Map;
use userbpf_runtime::context::{CpuSlots, RunContext};
use userbpf_runtime::{Engine, LoadedProgram};
use userbpf_testutil::Rng;
use userbpf_verifier::{MapInfo, Options, ProgType};

/// Helpers whose runs act on this process (signals, writes to its memory, its return path).
const NOT_RUN: &[i32] = &[36, 58, 109, 117];

/// Opcodes of every valid instruction form (as [`random_insn`] draws them).
fn opcodes() -> Vec<u8> {
    let mut v = Vec::new();
    for class in [BPF_ALU, BPF_ALU64] {
        for op in [0x00, 0x10, 0x20, 0x30, 0x40, 0x50, 0x60, 0x70, 0x90, 0xa0, 0xb0, 0xc0] {
            v.push(class | op | BPF_K);
            v.push(class | op | BPF_X);
        }
        v.push(class | 0x80); // neg
        v.push(class | 0xd0); // byte swaps
    }
    for class in [BPF_JMP, BPF_JMP32] {
        for op in [0x10, 0x20, 0x30, 0x40, 0x50, 0x60, 0x70, 0xa0, 0xb0, 0xc0, 0xd0] {
            v.push(class | op | BPF_K);
            v.push(class | op | BPF_X);
        }
    }
    v.extend_from_slice(&[0x05, 0x85, 0x95]);
    for size in [BPF_B, BPF_H, BPF_W, BPF_DW] {
        v.push(BPF_LDX | BPF_MEM | size);
        v.push(BPF_STX | BPF_MEM | size);
        v.push(BPF_ST | BPF_MEM | size);
    }
    v.extend_from_slice(&[BPF_STX | BPF_ATOMIC | BPF_W, BPF_STX | BPF_ATOMIC | BPF_DW]);
    v
}

fn interesting_imm(rng: &mut Rng) -> i32 {
    match rng.below(10) {
        0 => 0,
        1 => 1,
        2 => -1,
        3 => rng.range(-16, 16) as i32,
        4 => rng.pick(&[4, 8, 16, 32, 63, 64, 255, 256, 512, 4096]),
        5 => rng.pick(&[i32::MIN, i32::MAX, -512, -8, -4]),
        _ => rng.next_u64() as i32,
    }
}

fn interesting_off(rng: &mut Rng) -> i16 {
    match rng.below(6) {
        0 => rng.range(-8, 8) as i16,
        1 => -(8 * rng.range(1, 65) as i16),
        2 => 8 * rng.range(0, 22) as i16,
        3 => rng.pick(&[-513, -512, -520, 168, 4096, i16::MIN, i16::MAX]),
        _ => rng.range(-32, 32) as i16,
    }
}

/// A random instruction: a valid form with random operands, or (rarely) random bytes.
fn random_insn(rng: &mut Rng, ops: &[u8], helpers: &[i32]) -> Insn {
    if rng.chance(1, 40) {
        return Insn::new(
            rng.next_u64() as u8,
            rng.below(16) as u8,
            rng.below(16) as u8,
            rng.next_u64() as i16,
            rng.next_u64() as i32,
        );
    }
    let op = rng.pick(ops);
    let (dst, src) = (rng.below(11) as u8, rng.below(11) as u8);
    let mut i = Insn::new(op, dst, src, 0, 0);
    match op & 0x07 {
        BPF_ALU | BPF_ALU64 => {
            if op & 0xf0 == 0xd0 {
                i.imm = rng.pick(&[16, 32, 64]);
            } else if op & BPF_X == 0 {
                i.imm = interesting_imm(rng);
            }
            if op & BPF_X == 0 {
                i.src = 0;
            }
        }
        BPF_JMP | BPF_JMP32 => {
            i.off = rng.range(-4, 8) as i16;
            if op == 0x85 {
                (i.dst, i.src, i.off, i.imm) = (0, 0, 0, rng.pick(helpers));
            } else if op == 0x95 {
                (i.dst, i.src, i.off) = (0, 0, 0);
            } else if op == 0x05 {
                (i.dst, i.src) = (0, 0);
            } else if op & BPF_X == 0 {
                i.src = 0;
                i.imm = interesting_imm(rng);
            }
        }
        BPF_LDX => i.off = interesting_off(rng),
        BPF_ST => {
            i.src = 0;
            i.off = interesting_off(rng);
            i.imm = interesting_imm(rng);
        }
        _ => {
            i.off = interesting_off(rng);
            if op & 0xe0 == BPF_ATOMIC {
                i.imm = rng.pick(&[0x00, 0x40, 0x50, 0xa0, 0x01, 0x41, 0xe1, 0xf1]);
            }
        }
    }
    i
}

/// One to four mutations of `base`.
fn mutate(rng: &mut Rng, base: &[Insn], ops: &[u8], helpers: &[i32]) -> Vec<Insn> {
    let mut p = base.to_vec();
    for _ in 0..1 + rng.below(4) {
        if p.is_empty() {
            p.push(random_insn(rng, ops, helpers));
            continue;
        }
        let at = rng.index(p.len());
        // Not the second slot of an lddw, mostly (its fields must stay zero).
        let i = p[at];
        // Most mutations keep the encoding valid (operands the form uses), so that they
        // reach the verifier's rules rather than its encoding checks.
        let uses_off = matches!(i.class(), BPF_LDX | BPF_ST | BPF_STX)
            || (matches!(i.class(), BPF_JMP | BPF_JMP32) && i.op != OP_CALL && i.op != 0x95);
        let uses_src = matches!(i.class(), BPF_LDX | BPF_STX) || (i.op & BPF_X != 0 && i.class() != BPF_LDX);
        let mut what = rng.below(10);
        if (what <= 1 && !uses_off && !rng.chance(1, 10)) || (what == 4 && !uses_src && !rng.chance(1, 10)) {
            what = 2;
        }
        match what {
            0 => p[at].off = p[at].off.wrapping_add(rng.pick(&[-8, -4, -1, 1, 4, 8])),
            1 => p[at].off = interesting_off(rng),
            2 => {
                if p[at].op == OP_CALL && p[at].src == 0 {
                    p[at].imm = rng.pick(helpers);
                } else {
                    p[at].imm = interesting_imm(rng);
                }
            }
            3 => p[at].dst = rng.below(11) as u8,
            4 => p[at].src = rng.below(11) as u8,
            5 => {
                // Another operation of the same class and operand kind.
                let same: Vec<u8> = ops.iter().copied().filter(|o| o & 0x0f == p[at].op & 0x0f).collect();
                if !same.is_empty() {
                    p[at].op = rng.pick(&same);
                }
            }
            6 => {
                p.remove(at);
            }
            7 => p.insert(at, random_insn(rng, ops, helpers)),
            8 => {
                if at + 1 < p.len() {
                    p.swap(at, at + 1);
                }
            }
            _ => {
                // A conditional jump made unconditional or dropped (a null check gone).
                if let Some(j) = (at..p.len()).find(|&k| {
                    matches!(p[k].class(), BPF_JMP | BPF_JMP32) && p[k].op & 0xf0 != 0 && p[k].op & 0xf0 < 0x80
                }) {
                    if rng.chance(1, 2) {
                        p[j] = Insn::new(0x05, 0, 0, p[j].off, 0);
                    } else {
                        p[j] = Insn::new(BPF_ALU64 | BPF_MOV | BPF_X, 0, 0, 0, 0);
                    }
                }
            }
        }
    }
    p
}

fn options(maps: &[(u32, Arc<Map>)]) -> Options {
    let mut opts = Options::new(ProgType::Kprobe);
    opts.maps =
        maps.iter().map(|(id, m)| (*id, userbpf_runtime::verify::map_info(m.spec()))).collect::<BTreeMap<_, _>>();
    opts
}

fn listing(insns: &[Insn]) -> String {
    let mut out = String::new();
    for (pc, i) in insns.iter().enumerate() {
        out += &format!("{pc:4}: {}\n", userbpf_isa::disasm::format_insn(*i, insns.get(pc + 1).copied()));
    }
    out
}

#[derive(Default, Debug)]
struct Tally {
    mutants: u64,
    refused: u64,
    accepted: u64,
    runs: u64,
    not_run: u64,
    refused_by_vm: u64,
}

#[test]
fn verifier_fuzz_program_mutants_never_panic_and_accepted_ones_never_fault() {
    let path = common::compile("fuzz_seed");
    let session = common::session("verify-fuzz");
    let obj = common::load(&session, &path, Engine::Jit, None);
    let maps: Vec<(u32, Arc<Map>)> = obj.maps.iter().map(|m| (m.record.id, m.map.clone())).collect();
    let seeds: Vec<(String, Vec<Insn>)> = obj
        .programs
        .iter()
        .map(|(r, _)| {
            let bytes = userbpf_isa::parse_hex(&r.insns_hex).unwrap();
            (r.name.clone(), userbpf_isa::decode(&bytes).unwrap())
        })
        .collect();
    assert!(seeds.len() >= 6, "the seed programs");
    let opts = options(&maps);
    for (name, insns) in &seeds {
        userbpf_verifier::verify(insns, &opts).unwrap_or_else(|e| panic!("seed {name} refused: {e}"));
    }
    let ops = opcodes();
    let helpers: Vec<i32> =
        (0..212).filter(|&id| userbpf_verifier::helpers::proto(id).is_some()).map(|id| id as i32).collect();
    let slots = Arc::new(CpuSlots::open(&session.layout().cpus()).unwrap());
    let registry = userbpf_runtime::helpers::registry();
    let count = userbpf_testutil::env_u64("USERBPF_VERIFY_FUZZ_COUNT").unwrap_or(10_000);
    let seed = userbpf_testutil::env_u64("USERBPF_VERIFY_FUZZ_SEED").unwrap_or(0x5eed_f022);
    // A readable string for the programs reading user memory through a context argument.
    let text = *b"fuzzing the verifier\0\0\0\0\0\0\0\0\0\0\0\0";
    let started = std::time::Instant::now();
    let mut t = Tally::default();
    let mut reasons: BTreeMap<String, u64> = BTreeMap::new();
    let mut failures: Vec<String> = Vec::new();
    let mut vm_refusals: Vec<String> = Vec::new();
    for k in 0..count {
        let case = seed.wrapping_add(k);
        let mut rng = Rng::new(case);
        let (name, base) = &seeds[rng.index(seeds.len())];
        let insns = mutate(&mut rng, base, &ops, &helpers);
        t.mutants += 1;
        let report = |what: String| {
            format!(
                "case {case:#x} (USERBPF_VERIFY_FUZZ_SEED={case:#x} USERBPF_VERIFY_FUZZ_COUNT=1), a mutant of {name}: {what}\n{}",
                listing(&insns)
            )
        };
        let verdict = match catch_unwind(AssertUnwindSafe(|| userbpf_verifier::verify(&insns, &opts))) {
            Ok(v) => v,
            Err(_) => {
                failures.push(report("the verifier panicked".into()));
                continue;
            }
        };
        if let Err(e) = verdict {
            t.refused += 1;
            // The rule, without its numbers: "R# invalid mem access 'scalar'".
            let rule: String = e.message.chars().map(|c| if c.is_ascii_digit() { '#' } else { c }).take(48).collect();
            *reasons.entry(rule).or_default() += 1;
            continue;
        }
        t.accepted += 1;
        if insns.iter().any(|i| i.op == OP_CALL && i.src == 0 && NOT_RUN.contains(&i.imm)) {
            t.not_run += 1;
            continue;
        }
        let mut regs = [0u64; 21];
        for r in regs.iter_mut() {
            *r = match rng.below(5) {
                0 => 0,
                1 => rng.below(64),
                2 => text.as_ptr() as u64,
                3 => rng.next_u64(),
                _ => rng.pick(&[u64::MAX, 1 << 63, 0xffff_ffff, 8, 4096]),
            };
        }
        for engine in [Engine::Interpreter, Engine::Jit] {
            let prog = match LoadedProgram::prepare(
                0,
                "fuzz",
                &insns,
                registry.clone(),
                &maps.as_slice(),
                engine,
                slots.clone(),
            ) {
                Ok(p) => p,
                Err(e) => {
                    // The VM's static load-time checks refuse instructions wherever they are
                    // (a write to r10, an lddw of a map the program does not have), where the
                    // verifier, as the kernel, refuses them only where the walk reaches them:
                    // such a mutant holds them in code no path runs. It does not run at all.
                    t.refused_by_vm += 1;
                    if vm_refusals.len() < 5 {
                        vm_refusals.push(format!("case {case:#x}: {e}"));
                    }
                    break;
                }
            };
            let mut ctx = regs;
            let info = RunContext { regs: ctx.as_mut_ptr() as u64, ..Default::default() };
            t.runs += 1;
            if let Err(e) = prog.run(ctx.as_mut_ptr().cast(), 168, info) {
                failures.push(report(format!("accepted, but the {engine:?} run failed: {e}")));
            }
        }
        if failures.len() > 20 {
            break;
        }
    }
    let elapsed = started.elapsed();
    let mut top: Vec<(&String, &u64)> = reasons.iter().collect();
    top.sort_by(|a, b| b.1.cmp(a.1));
    let top: Vec<String> = top.iter().take(12).map(|(r, n)| format!("{n} {r}")).collect();
    eprintln!(
        "verifier fuzz: {} mutants from seed {seed:#x} in {elapsed:.1?}: {} refused, {} accepted ({} not run: helpers acting on this process; {} refused by the VM's static checks in code no path reaches), {} runs (interpreter and JIT) without a fault, {} failures\n  refusals by rule: {}\n  VM refusals: {}",
        t.mutants,
        t.refused,
        t.accepted,
        t.not_run,
        t.refused_by_vm,
        t.runs,
        failures.len(),
        top.join("; "),
        vm_refusals.join("; ")
    );
    assert!(failures.is_empty(), "{} failures:\n\n{}", failures.len(), failures.join("\n\n"));
    // The campaign reaches both verdicts: mutants of valid programs are often still valid.
    if t.mutants >= 1000 {
        assert!(t.accepted > t.mutants / 20 && t.refused > t.mutants / 4, "{t:?}");
    }
}

/// Mutated objects (truncated, bit-flipped) through the object loader and, when it accepts
/// one, every program through the verifier: refused with an error, never a panic.
#[test]
fn verifier_fuzz_mutated_objects_are_refused_with_an_error() {
    let path = common::compile("fuzz_seed");
    let obj = std::fs::read(&path).unwrap();
    let count = userbpf_testutil::env_u64("USERBPF_VERIFY_FUZZ_OBJECTS").unwrap_or(2000);
    let mut rng = Rng::new(userbpf_testutil::env_u64("USERBPF_VERIFY_FUZZ_SEED").unwrap_or(0x00b1_ec75));
    let (mut parsed, mut refused_by_loader, mut verified, mut refused_by_verifier) = (0u64, 0u64, 0u64, 0u64);
    for k in 0..count {
        let mut b = obj.clone();
        if k % 8 == 0 {
            b.truncate(rng.index(obj.len()));
        } else {
            for _ in 0..1 + rng.index(6) {
                let i = rng.index(b.len());
                b[i] ^= 1 << rng.index(8);
            }
        }
        let o = match catch_unwind(AssertUnwindSafe(|| userbpf_object::Object::parse(&b, "f.o"))) {
            Ok(Ok(o)) => o,
            Ok(Err(e)) => {
                assert!(e.to_string().starts_with("f.o: "), "an error names the file: {e}");
                refused_by_loader += 1;
                continue;
            }
            Err(_) => panic!("the object loader panicked on mutant {k}"),
        };
        parsed += 1;
        let maps: BTreeMap<u32, MapInfo> = o
            .maps
            .iter()
            .enumerate()
            .map(|(i, m)| {
                let info = MapInfo {
                    name: m.name.clone(),
                    map_type: m.map_type,
                    key_size: m.key_size,
                    value_size: m.value_size,
                    max_entries: m.max_entries,
                    readonly: m.is_readonly(),
                    frozen: None,
                    inner: None,
                };
                (i as u32, info)
            })
            .collect();
        for p in &o.programs {
            let mut opts = Options::new(ProgType::Kprobe);
            opts.maps = maps.clone();
            match catch_unwind(AssertUnwindSafe(|| userbpf_verifier::verify(&p.insns, &opts))) {
                Ok(Ok(_)) => verified += 1,
                Ok(Err(e)) => {
                    assert!(!e.message.is_empty());
                    refused_by_verifier += 1;
                }
                Err(_) => panic!("the verifier panicked on program {} of object mutant {k}", p.name),
            }
        }
    }
    eprintln!(
        "verifier fuzz (objects): {count} mutants: {refused_by_loader} refused by the object loader, {parsed} loaded; their programs: {verified} accepted, {refused_by_verifier} refused by the verifier"
    );
    assert!(parsed > 0 && refused_by_loader > 0 && refused_by_verifier > 0, "the campaign reaches every stage");
}
