//! Differential testing of the map helpers against the kernel: random sequences of a
//! program's map operations (lookups, updates with every flag, deletes; pushes, pops and peeks)
//! on hash, array, per-CPU hash and array, LPM trie, queue and stack maps, run by the kernel (a `BPF_PROG_TYPE_SYSCALL`
//! program through `BPF_PROG_TEST_RUN`, on maps of its own) and by userbpf's interpreter and
//! JIT (on shared-memory maps of the same spec), must give each operation the same result
//! (return value, and the value a lookup, pop or peek found) and leave the maps holding the
//! same elements (for the per-CPU kinds: the same values over the CPUs, as the kernel's run
//! and ours may take different CPUs).
//!
//! The maps are small (4 entries) and the keys few (7, or for the trie 4 addresses and 5
//! prefix lengths, one of them invalid), so that operations meet full maps, missing and present
//! keys. Each case draws a map kind and 24 operations; the program stores operation i's result
//! at context offset 16 i (the helper's return value, then what a lookup's value pointer
//! pointed to, or the value a pop or peek wrote).
//!
//! Environment: `KMAPS_SEED=N` (decimal or 0x-hex, or `time`), `KMAPS_COUNT=N` (default 1000).
//! A difference prints the case's seed, map kind, operations and both results;
//! `KMAPS_SEED=<seed> KMAPS_COUNT=1` reproduces it.

mod common;

use std::sync::Arc;

use common::{Registered, lddw};
use userbpf_isa::Insn;
use userbpf_maps::{Map, MapSpec, MapType};
use userbpf_runtime::context::CpuSlots;
use userbpf_runtime::helpers::{self, maps::register_map};
use userbpf_testutil::kernel::{self, Fd};
use userbpf_testutil::{Rng, TmpDir};
use userbpf_vm::{LoadOptions, Program};

const OPS: usize = 24;
/// The output array's element: 16 bytes an operation.
const OUT_LEN: usize = 16 * OPS;
const MAX_ENTRIES: u32 = 4;
/// What a lookup that found nothing, or a pop or peek that wrote nothing, leaves as its value.
const NOTHING: i32 = -12345;
const BPF_F_NO_PREALLOC: u32 = 1;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Hash,
    Array,
    PercpuHash,
    PercpuArray,
    Lpm,
    Queue,
    Stack,
}

impl Kind {
    fn spec(self) -> MapSpec {
        let (map_type, key_size, map_flags) = match self {
            Kind::Hash => (MapType::BPF_MAP_TYPE_HASH, 4, 0),
            Kind::Array => (MapType::BPF_MAP_TYPE_ARRAY, 4, 0),
            Kind::PercpuHash => (MapType::BPF_MAP_TYPE_PERCPU_HASH, 4, 0),
            Kind::PercpuArray => (MapType::BPF_MAP_TYPE_PERCPU_ARRAY, 4, 0),
            Kind::Lpm => (MapType::BPF_MAP_TYPE_LPM_TRIE, 8, BPF_F_NO_PREALLOC),
            Kind::Queue => (MapType::BPF_MAP_TYPE_QUEUE, 0, 0),
            Kind::Stack => (MapType::BPF_MAP_TYPE_STACK, 0, 0),
        };
        MapSpec {
            map_type,
            key_size,
            value_size: 8,
            max_entries: MAX_ENTRIES,
            map_flags,
            map_extra: 0,
            name: "d".into(),
        }
    }

    fn keyed(self) -> bool {
        !matches!(self, Kind::Queue | Kind::Stack)
    }

    /// Bytes of a value as the system call side reads and writes it: one 8-byte value per
    /// possible CPU for the per-CPU kinds.
    fn value_len(self) -> usize {
        match self {
            Kind::PercpuHash | Kind::PercpuArray => 8 * userbpf_maps::shm::possible_cpus() as usize,
            _ => 8,
        }
    }
}

/// One operation: `key` is the key's bytes (the trie's: prefix length, then 4 address bytes).
#[derive(Clone, Debug)]
enum Op {
    Lookup { key: u64 },
    Update { key: u64, value: i32, flags: i32 },
    Delete { key: u64 },
    Push { value: i32, flags: i32 },
    Pop,
    Peek,
}

fn draw_key(rng: &mut Rng, kind: Kind) -> u64 {
    if kind == Kind::Lpm {
        // Prefix lengths 0, 8, 16, 24, 32 and the invalid 33; addresses sharing prefixes.
        let len = rng.pick(&[0u64, 8, 16, 24, 32, 33]);
        // The address's bytes in network order, as the key holds them.
        let addr = u32::from_ne_bytes(rng.pick(&[0x0a00_0000u32, 0x0a01_0000, 0x0a01_0200, 0xc0a8_0101]).to_be_bytes());
        len | u64::from(addr) << 32
    } else {
        rng.below(7)
    }
}

fn draw_ops(rng: &mut Rng, kind: Kind) -> Vec<Op> {
    (0..OPS)
        .map(|_| {
            let value = rng.range(-1000, 1000) as i32;
            if kind.keyed() {
                let key = draw_key(rng, kind);
                match rng.below(8) {
                    0..=2 => Op::Lookup { key },
                    3..=5 => Op::Update { key, value, flags: rng.pick(&[0, 0, 1, 2, 4]) },
                    _ => Op::Delete { key },
                }
            } else {
                match rng.below(3) {
                    0 => Op::Push { value, flags: rng.pick(&[0, 0, 2, 1]) },
                    1 => Op::Pop,
                    _ => Op::Peek,
                }
            }
        })
        .collect()
}

/// The program for `ops`; `map` and `out` give the two instructions that load a reference
/// to the map under test, or to the output array (one element of [`OUT_LEN`] bytes), into r1
/// (the kernel's: the map's descriptor; ours: the map's address). It finds the output element
/// first (r6), and returns 0 after its operations, 1 when it could not find it.
fn program(kind: Kind, ops: &[Op], map: impl Fn() -> [Insn; 2], out: [Insn; 2]) -> Vec<Insn> {
    let mov_x = |d, s| Insn::new(0xbf, d, s, 0, 0);
    let mov_k = |d, k| Insn::new(0xb7, d, 0, 0, k);
    let add_k = |d, k| Insn::new(0x07, d, 0, 0, k);
    let call = |id| Insn::new(0x85, 0, 0, 0, id);
    let st_dw = |off, k| Insn::new(0x7a, 10, 0, off, k);
    let st_w = |off, k| Insn::new(0x62, 10, 0, off, k);
    let stx_ctx = |off, r| Insn::new(0x7b, 6, r, off, 0);
    let mut p = Vec::new();
    let null_check = common::output_frame_start(&mut p, out, -8);
    for (i, op) in ops.iter().enumerate() {
        let out = 16 * i as i16;
        let key = |p: &mut Vec<Insn>, key: u64| {
            if kind == Kind::Lpm {
                p.push(st_w(-8, key as u32 as i32));
                p.push(st_w(-4, (key >> 32) as u32 as i32));
            } else {
                p.push(st_w(-8, key as i32));
            }
            p.extend(map());
            p.push(mov_x(2, 10));
            p.push(add_k(2, -8));
        };
        match *op {
            Op::Lookup { key: k } => {
                key(&mut p, k);
                p.push(call(1));
                // Its return value is an address: kept as found (1) or not (0).
                p.push(Insn::new(0x15, 0, 0, 3, 0)); // if r0 == 0 goto +3
                p.push(Insn::new(0x79, 7, 0, 0, 0)); // r7 = *(u64 *)(r0 + 0)
                p.push(mov_k(8, 1));
                p.push(Insn::new(0x05, 0, 0, 2, 0)); // goto +2
                p.push(mov_k(7, NOTHING));
                p.push(mov_k(8, 0));
                p.push(stx_ctx(out, 8));
                p.push(stx_ctx(out + 8, 7));
            }
            Op::Update { key: k, value, flags } => {
                p.push(st_dw(-16, value));
                key(&mut p, k);
                p.push(mov_x(3, 10));
                p.push(add_k(3, -16));
                p.push(mov_k(4, flags));
                p.push(call(2));
                p.push(stx_ctx(out, 0));
            }
            Op::Delete { key: k } => {
                key(&mut p, k);
                p.push(call(3));
                p.push(stx_ctx(out, 0));
            }
            Op::Push { value, flags } => {
                p.push(st_dw(-16, value));
                p.extend(map());
                p.push(mov_x(2, 10));
                p.push(add_k(2, -16));
                p.push(mov_k(3, flags));
                p.push(call(87));
                p.push(stx_ctx(out, 0));
            }
            Op::Pop | Op::Peek => {
                p.push(st_dw(-16, NOTHING));
                p.extend(map());
                p.push(mov_x(2, 10));
                p.push(add_k(2, -16));
                p.push(call(if matches!(op, Op::Pop) { 88 } else { 89 }));
                p.push(stx_ctx(out, 0));
                p.push(Insn::new(0x79, 7, 10, -16, 0)); // r7 = *(u64 *)(r10 - 16)
                p.push(stx_ctx(out + 8, 7));
            }
        }
    }
    common::output_frame_end(&mut p, null_check);
    p
}

// ---- the kernel's side ----

fn kernel_run(insns: &[Insn], out: &Fd) -> Vec<u8> {
    common::kernel_run_output(insns, out, OUT_LEN, None)
        .unwrap_or_else(|(e, log)| panic!("the kernel refuses the program: {e}\n{log}"))
}

/// A map's elements: each key with its value, or for the per-CPU kinds its values on every
/// CPU sorted (the kernel's run and ours may hold different CPUs); or a queue's or stack's
/// values in the order pops give them, with empty keys.
type Contents = Vec<(Vec<u8>, Vec<u64>)>;

fn values(buf: &[u8]) -> Vec<u64> {
    let mut v: Vec<u64> = buf.chunks(8).map(|c| u64::from_ne_bytes(c.try_into().unwrap())).collect();
    v.sort();
    v
}

/// The kernel map's [`Contents`] (a queue or stack is emptied).
fn kernel_contents(fd: &Fd, kind: Kind) -> Contents {
    if !kind.keyed() {
        let mut out = Vec::new();
        let mut value = vec![0u8; kind.value_len()];
        while kernel::map_pop(fd, &mut value).is_ok() {
            out.push((Vec::new(), values(&value)));
        }
        return out;
    }
    let entries = userbpf_kernel::sys::entries(fd.0, kind.spec().key_size as usize, kind.value_len());
    let mut out: Contents =
        entries.expect("the kernel map's elements").into_iter().map(|(k, v)| (k, values(&v))).collect();
    out.sort();
    out
}

// ---- ours ----

/// Empties one of our maps (an array's elements back to zero).
fn clear(map: &Map, kind: Kind) {
    let ks = kind.spec().key_size as usize;
    let mut v = vec![0u8; kind.value_len()];
    match kind {
        Kind::Array | Kind::PercpuArray => {
            for i in 0..MAX_ENTRIES {
                map.update_elem(&i.to_ne_bytes(), &v, 0).unwrap();
            }
        }
        Kind::Queue | Kind::Stack => while map.lookup_and_delete_elem(&[], &mut v).is_ok() {},
        Kind::Hash | Kind::PercpuHash | Kind::Lpm => loop {
            let mut k = vec![0u8; ks];
            if map.get_next_key(None, &mut k).is_err() {
                break;
            }
            map.delete_elem(&k).unwrap();
        },
    }
}

/// Our map's [`Contents`] (a queue or stack is emptied).
fn our_contents(map: &Map, kind: Kind) -> Contents {
    let ks = kind.spec().key_size as usize;
    let mut out = Vec::new();
    let mut v = vec![0u8; kind.value_len()];
    if !kind.keyed() {
        while map.lookup_and_delete_elem(&[], &mut v).is_ok() {
            out.push((Vec::new(), values(&v)));
        }
        return out;
    }
    let mut key: Option<Vec<u8>> = None;
    loop {
        let mut next = vec![0u8; ks];
        if map.get_next_key(key.as_deref(), &mut next).is_err() {
            break;
        }
        map.lookup_elem(&next, &mut v).expect("lookup of a key get_next_key gave");
        out.push((next.clone(), values(&v)));
        key = Some(next);
    }
    out.sort();
    out
}

fn words(ctx: &[u8]) -> Vec<i64> {
    ctx.chunks(8).map(|c| i64::from_ne_bytes(c.try_into().unwrap())).collect()
}

#[test]
fn map_helpers_agree_with_the_kernel() {
    let Some((seed, count)) = kernel::fuzz_setup("KMAPS_SEED", 0x6b6d_6170, "KMAPS_COUNT", 1000) else { return };
    let dir = TmpDir::new("kernel-maps-differential");
    let kinds = [Kind::Hash, Kind::Array, Kind::PercpuHash, Kind::PercpuArray, Kind::Lpm, Kind::Queue, Kind::Stack];
    // Our maps, two of each kind (one per executor), registered once and emptied between cases.
    let ours: Vec<[Arc<Map>; 2]> = kinds
        .iter()
        .enumerate()
        .map(|(n, kind)| {
            [0, 1].map(|e| {
                let id = 100 + 2 * n as u32 + e;
                let m = Arc::new(Map::create(&dir.path(&id.to_string()), &kind.spec()).unwrap());
                m.set_id(id);
                assert!(register_map(id, m.clone()));
                m
            })
        })
        .collect();
    let out = common::Output::new(&dir, OUT_LEN, 99);
    let kout = common::kernel_map(&common::Output::spec(OUT_LEN));
    let opts = LoadOptions { helpers: helpers::registry(), memory: Some(Arc::new(Registered)), allow_callx: false };
    let slots = CpuSlots::private().unwrap();
    let mut failures = Vec::new();
    // How often each (map kind, operation, kernel result) came up: the cases' coverage.
    let mut seen: std::collections::BTreeMap<String, u64> = Default::default();
    for c in 0..count {
        let case_seed = seed.wrapping_add(c);
        let mut rng = Rng::new(case_seed);
        let k = rng.below(kinds.len() as u64) as usize;
        let kind = kinds[k];
        let ops = draw_ops(&mut rng, kind);
        let kmap = common::kernel_map(&kind.spec());
        // BPF_PSEUDO_MAP_FD loads of the kernel's maps.
        let kref = |fd: &Fd| [Insn::new(0x18, 1, 1, 0, fd.0), Insn::new(0, 0, 0, 0, 0)];
        let k_out = kernel_run(&program(kind, &ops, || kref(&kmap), kref(&kout)), &kout);
        let k_contents = kernel_contents(&kmap, kind);
        for (i, op) in ops.iter().enumerate() {
            let name = format!("{op:?}");
            let name = name.split([' ', '{']).next().unwrap_or("");
            let r = i64::from_ne_bytes(k_out[16 * i..16 * i + 8].try_into().unwrap());
            *seen.entry(format!("{kind:?} {name} {r}")).or_default() += 1;
        }
        for (e, engine) in ["interpreter", "JIT"].iter().enumerate() {
            let m = &ours[k][e];
            clear(m, kind);
            let addr = Arc::as_ptr(m) as u64;
            let insns = program(kind, &ops, || lddw(1, addr), lddw(1, out.addr));
            let prog = Arc::new(Program::load(&insns, &opts, None).unwrap());
            let o = out.run(&prog, e == 1, &slots);
            let contents = our_contents(m, kind);
            let (kw, ow) = (words(&k_out), words(&o));
            let mut what = Vec::new();
            for (i, op) in ops.iter().enumerate() {
                if kw[2 * i..2 * i + 2] != ow[2 * i..2 * i + 2] {
                    what.push(format!(
                        "op {i} {op:?}: kernel {:?}, {engine} {:?}",
                        &kw[2 * i..2 * i + 2],
                        &ow[2 * i..2 * i + 2]
                    ));
                }
            }
            if contents != k_contents {
                what.push(format!("contents after: kernel {k_contents:?}, {engine} {contents:?}"));
            }
            if !what.is_empty() {
                failures.push(format!(
                    "case seed {case_seed:#x} ({kind:?}, reproduce: KMAPS_SEED={case_seed:#x} KMAPS_COUNT=1):\n  ops: {ops:?}\n  {}",
                    what.join("\n  ")
                ));
            }
        }
        if failures.len() >= 4 {
            break;
        }
    }
    println!("{count} cases of map operations (first seed {seed:#x}) run by the kernel, the interpreter and the JIT");
    println!("map kind, operation, the kernel's result (a lookup: found 1 or not 0): times");
    for (what, n) in &seen {
        println!("  {what}: {n}");
    }
    assert!(failures.is_empty(), "{} difference(s):\n\n{}", failures.len(), failures.join("\n\n"));
}
