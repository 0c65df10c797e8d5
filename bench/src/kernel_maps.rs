//! `kernel-map-bench`: what each way of reaching a map shared with the kernel costs a
//! user-space program, side by side in one run:
//!
//! - a session array (shared memory, the baseline) and the same array whose values are a
//!   kernel `BPF_F_MMAPABLE` array mapped over them (`userbpf_runtime::kernel_map`, what
//!   `userbpf run` does for arrays used on both sides): lookups (inlined by the JIT), atomic
//!   adds on the looked-up value, updates (the helper), from JIT-compiled programs;
//! - `bpf()` from user space on kernel maps (an array and a hash): lookups and updates, the
//!   price of every access to a kernel map that cannot be mapped;
//! - the kinds shared through `bpf()` (`userbpf_maps::kernel`: hash, LRU hash, per-CPU hash,
//!   LRU per-CPU hash, per-CPU array) against the session map of the same kind, one operation
//!   per run as a probe makes it (lookup and load; lookup and atomic add, written back at the
//!   run's end; update), from JIT-compiled programs: ns per run, the run's entry and exit
//!   included, the empty program's run beside them.
//!
//! Each program loops N times (N in the context); ns per iteration, median of 9 timed runs
//! after a warm-up, the session and kernel programs run alternately, the empty loop of the
//! same shape printed beside them. Needs root (kernel maps). Reports, never fails on timing;
//! on a busy machine run it a few times and read the lowest rows.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use userbpf_isa::*;
use userbpf_maps::{BPF_ANY, Map, MapSpec, MapType};
use userbpf_runtime::context::{CpuSlots, RunContext};
use userbpf_runtime::helpers;
use userbpf_runtime::kernel_map::{KernelBacking, map_info};
use userbpf_runtime::program::{Engine, LoadedProgram};

const MAX: u32 = 1024;
const REPS: usize = 9;
const ITERS: u64 = 2_000_000;
const SYS_ITERS: u64 = 200_000;
const BPF_F_MMAPABLE: u32 = 1 << 10;

fn ins(op: u8, dst: u8, src: u8, off: i16, imm: i32) -> Insn {
    Insn::new(op, dst, src, off, imm)
}

#[derive(Clone, Copy, PartialEq)]
enum Op {
    Empty,
    Lookup,
    LookupXadd,
    Update,
}

/// `for (i = 0; i < ctx[0]; i++) { key = i & (MAX-1); OP }`.
fn program(map: u32, op: Op) -> Vec<Insn> {
    let mut p = vec![
        ins(BPF_LDX | BPF_MEM | BPF_DW, 8, 1, 0, 0),  // r8 = n
        ins(BPF_ALU64 | BPF_K | BPF_MOV, 6, 0, 0, 0), // r6 = i = 0
        ins(BPF_ALU64 | BPF_K | BPF_MOV, 7, 0, 0, 0), // r7 = sum
    ];
    let top = p.len();
    p.push(ins(BPF_ALU64 | BPF_X | BPF_MOV, 1, 6, 0, 0));
    p.push(ins(BPF_ALU64 | BPF_K | BPF_AND, 1, 0, 0, MAX as i32 - 1));
    p.push(ins(BPF_STX | BPF_MEM | BPF_W, 10, 1, -4, 0)); // key
    p.push(ins(BPF_STX | BPF_MEM | BPF_DW, 10, 6, -16, 0)); // value = i
    match op {
        Op::Empty => {
            p.push(ins(BPF_ALU64 | BPF_X | BPF_MOV, 0, 10, 0, 0));
            p.push(ins(BPF_ALU64 | BPF_K | BPF_ADD, 0, 0, 0, -16));
        }
        Op::Lookup | Op::LookupXadd => {
            p.push(ins(OP_LDDW, 1, BPF_PSEUDO_MAP_IDX, 0, map as i32));
            p.push(ins(0, 0, 0, 0, 0));
            p.push(ins(BPF_ALU64 | BPF_X | BPF_MOV, 2, 10, 0, 0));
            p.push(ins(BPF_ALU64 | BPF_K | BPF_ADD, 2, 0, 0, -4));
            p.push(ins(OP_CALL, 0, 0, 0, 1));
        }
        Op::Update => {
            p.push(ins(OP_LDDW, 1, BPF_PSEUDO_MAP_IDX, 0, map as i32));
            p.push(ins(0, 0, 0, 0, 0));
            p.push(ins(BPF_ALU64 | BPF_X | BPF_MOV, 2, 10, 0, 0));
            p.push(ins(BPF_ALU64 | BPF_K | BPF_ADD, 2, 0, 0, -4));
            p.push(ins(BPF_ALU64 | BPF_X | BPF_MOV, 3, 10, 0, 0));
            p.push(ins(BPF_ALU64 | BPF_K | BPF_ADD, 3, 0, 0, -16));
            p.push(ins(BPF_ALU64 | BPF_K | BPF_MOV, 4, 0, 0, BPF_ANY as i32));
            p.push(ins(OP_CALL, 0, 0, 0, 2));
        }
    }
    match op {
        Op::Update => p.push(ins(BPF_ALU64 | BPF_X | BPF_ADD, 7, 0, 0, 0)),
        _ => {
            // if (r0 == 0) skip; else read (or atomically add to) the value.
            let skip = if op == Op::LookupXadd { 3 } else { 2 };
            p.push(ins(BPF_JMP | BPF_K | BPF_JEQ, 0, 0, skip, 0));
            if op == Op::LookupXadd {
                p.push(ins(BPF_ALU64 | BPF_K | BPF_MOV, 1, 0, 0, 1));
                p.push(ins(BPF_STX | BPF_ATOMIC | BPF_DW, 0, 1, 0, BPF_ADD as i32));
            } else {
                p.push(ins(BPF_LDX | BPF_MEM | BPF_DW, 1, 0, 0, 0));
            }
            p.push(ins(BPF_ALU64 | BPF_X | BPF_ADD, 7, 1, 0, 0));
        }
    }
    p.push(ins(BPF_ALU64 | BPF_K | BPF_ADD, 6, 0, 0, 1));
    let back = top as i64 - p.len() as i64 - 1;
    p.push(ins(BPF_JMP | BPF_X | BPF_JLT, 6, 8, back as i16, 0));
    p.push(ins(BPF_ALU64 | BPF_X | BPF_MOV, 0, 7, 0, 0));
    p.push(ins(OP_EXIT, 0, 0, 0, 0));
    p
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// ns per iteration of one run of `p`.
fn once(p: &LoadedProgram) -> f64 {
    let mut ctx = [ITERS, 0, 0, 0];
    let t = Instant::now();
    p.run(ctx.as_mut_ptr().cast(), 32, RunContext::default()).expect("run");
    t.elapsed().as_nanos() as f64 / ITERS as f64
}

fn time_prog(p: &LoadedProgram) -> f64 {
    once(p);
    median((0..REPS).map(|_| once(p)).collect())
}

/// Medians of `a` and `b` run alternately (so that the machine's noise falls on both).
fn time_pair(a: &LoadedProgram, b: &LoadedProgram) -> (f64, f64) {
    once(a);
    once(b);
    let (mut ta, mut tb) = (Vec::new(), Vec::new());
    for _ in 0..REPS {
        ta.push(once(a));
        tb.push(once(b));
    }
    (median(ta), median(tb))
}

fn sys_bpf(cmd: libc::c_long, attr: &mut [u64; 9]) -> std::io::Result<libc::c_long> {
    // SAFETY: `attr` is a writable 72-byte buffer laid out as the command's part of `union
    // bpf_attr`; the pointers in it point to live buffers of the map's key and value sizes.
    let r = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr.as_mut_ptr(), 72usize) };
    if r < 0 { Err(std::io::Error::last_os_error()) } else { Ok(r) }
}

/// `BPF_MAP_CREATE`: type, 4-byte keys, 8-byte values, MAX entries.
fn kernel_map(map_type: u32, flags: u32) -> OwnedFd {
    let mut attr = [0u64; 9];
    attr[0] = map_type as u64 | (4u64 << 32);
    attr[1] = 8 | ((MAX as u64) << 32);
    attr[2] = flags as u64;
    let fd = sys_bpf(0, &mut attr).expect("BPF_MAP_CREATE (run as root)");
    // SAFETY: a new descriptor the kernel returned, owned by nobody else.
    unsafe { OwnedFd::from_raw_fd(fd as i32) }
}

/// ns per `bpf()` call of `cmd` (1 lookup, 2 update) on `fd`.
fn time_sys(fd: &OwnedFd, cmd: libc::c_long) -> f64 {
    let mut value = 0u64;
    let mut once = || {
        let t = Instant::now();
        for i in 0..SYS_ITERS {
            let key = (i as u32) & (MAX - 1);
            let mut attr = [0u64; 9];
            attr[0] = fd.as_raw_fd() as u64;
            attr[1] = (&raw const key) as u64;
            attr[2] = (&raw mut value) as u64;
            sys_bpf(cmd, &mut attr).expect("bpf() on the kernel map");
        }
        t.elapsed().as_nanos() as f64 / SYS_ITERS as f64
    };
    once();
    median((0..REPS).map(|_| once()).collect())
}

/// ns per run of `p` making one operation (ctx n = 1), median of REPS batches of `runs`.
fn per_run(p: &LoadedProgram, runs: u64) -> f64 {
    let batch = || {
        let mut ctx = [1u64, 0, 0, 0];
        let t = Instant::now();
        for _ in 0..runs {
            p.run(ctx.as_mut_ptr().cast(), 32, RunContext::default()).expect("run");
        }
        t.elapsed().as_nanos() as f64 / runs as f64
    };
    batch();
    median((0..REPS).map(|_| batch()).collect())
}

/// The bpf() kinds: one operation per run, session map against the kernel map reached
/// through bpf(), side by side.
fn bpf_kinds(dir: &std::path::Path, slots: &Arc<CpuSlots>) {
    let ncpu = userbpf_maps::shm::possible_cpus() as usize;
    println!();
    println!("| one operation per run (JIT), ns per run | session map | kernel map through bpf() | kernel / session |");
    println!("|---|---:|---:|---:|");
    let mut id = 100u32;
    for t in [
        MapType::BPF_MAP_TYPE_HASH,
        MapType::BPF_MAP_TYPE_LRU_HASH,
        MapType::BPF_MAP_TYPE_PERCPU_HASH,
        MapType::BPF_MAP_TYPE_LRU_PERCPU_HASH,
        MapType::BPF_MAP_TYPE_PERCPU_ARRAY,
    ] {
        let spec = MapSpec {
            map_type: t,
            key_size: 4,
            value_size: 8,
            max_entries: MAX,
            map_flags: 0,
            map_extra: 0,
            name: t.name().into(),
        };
        let session = Arc::new(Map::create(&dir.join(format!("s-{}", t as u32)), &spec).expect("session map"));
        let kpath = dir.join(format!("k-{}", t as u32));
        drop(Map::create(&kpath, &spec).expect("session file of the kernel map"));
        let kfd = kernel_map(t as u32, 0);
        let kernel = Arc::new(Map::open_kernel(&kpath, kfd, None).expect("the kernel map through bpf()"));
        let values: Vec<u8> = (0..if t.is_percpu() { ncpu } else { 1 }).flat_map(|_| 1u64.to_ne_bytes()).collect();
        // 64 elements (an LRU hash filled to its size evicts some: the runs use key 0).
        for m in [&session, &kernel] {
            for k in 0..64u32 {
                m.update_elem(&k.to_ne_bytes(), &values, BPF_ANY).expect("filling");
            }
        }
        let (sid, kid) = (id, id + 1);
        id += 2;
        assert!(
            helpers::register_map(sid, session.clone()) && helpers::register_map(kid, kernel.clone()),
            "registry full"
        );
        let resolver: Vec<(u32, Arc<Map>)> = vec![(sid, session.clone()), (kid, kernel.clone())];
        let prog = |map: u32, op: Op| {
            LoadedProgram::prepare(
                map * 10 + op as u32,
                "bpf-kind",
                &program(map, op),
                helpers::registry(),
                &resolver.as_slice(),
                Engine::Jit,
                slots.clone(),
            )
            .expect("program")
        };
        let empty = per_run(&prog(sid, Op::Empty), 200_000);
        println!("| {}: empty program | {empty:.1} | {empty:.1} | 1.00 |", t.name());
        for (what, op) in
            [("lookup + load", Op::Lookup), ("lookup + atomic add", Op::LookupXadd), ("update (BPF_ANY)", Op::Update)]
        {
            let s = per_run(&prog(sid, op), 200_000);
            let k = per_run(&prog(kid, op), 20_000);
            println!("| {}: {what} | {s:.1} | {k:.1} | {:.0} |", t.name(), k / s);
            if op == Op::LookupXadd {
                // The kernel saw the adds (written back at each run's end): element 0 read
                // through bpf(), per-CPU values summed.
                let mut v = vec![0u8; values.len()];
                kernel.lookup_elem(&0u32.to_ne_bytes(), &mut v).expect("lookup");
                let sum: u64 = v.chunks(8).map(|c| u64::from_ne_bytes(c.try_into().unwrap())).sum();
                let want = (values.len() / 8) as u64 + 20_000 * (REPS as u64 + 1);
                assert_eq!(sum, want, "{}: every atomic add reached the kernel map", t.name());
            }
        }
    }
}

fn main() {
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load: Vec<&str> = load.split_whitespace().take(3).collect();
    let dir = PathBuf::from("/dev/shm").join(format!("userbpf-kernel-map-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("creating the map directory");
    let spec = |name: &str| MapSpec {
        map_type: MapType::BPF_MAP_TYPE_ARRAY,
        key_size: 4,
        value_size: 8,
        max_entries: MAX,
        map_flags: BPF_F_MMAPABLE,
        map_extra: 0,
        name: name.into(),
    };
    let shm = Arc::new(Map::create(&dir.join("shm"), &spec("shm")).expect("session array"));
    let backed = Arc::new(Map::create(&dir.join("kernel"), &spec("kernel")).expect("session array"));
    let karray = kernel_map(MapType::BPF_MAP_TYPE_ARRAY as u32, BPF_F_MMAPABLE);
    let khash = kernel_map(MapType::BPF_MAP_TYPE_HASH as u32, 0);
    let kid = map_info(&karray).expect("kernel map info").id;
    userbpf_runtime::kernel_map::map_kernel_values(&dir, &backed, KernelBacking { kernel_id: kid, holder: 0 })
        .expect("mapping the kernel array's values");
    for m in [&shm, &backed] {
        for k in 0..MAX {
            m.update_elem(&k.to_ne_bytes(), &1u64.to_ne_bytes(), BPF_ANY).expect("filling");
        }
    }
    for k in 0..MAX {
        let v = 1u64;
        let mut attr = [0u64; 9];
        attr[0] = khash.as_raw_fd() as u64;
        attr[1] = (&raw const k) as u64;
        attr[2] = (&raw const v) as u64;
        sys_bpf(2, &mut attr).expect("filling the kernel hash");
    }
    let _ = helpers::registry();
    assert!(helpers::register_map(1, shm.clone()) && helpers::register_map(2, backed.clone()), "map registry full");
    let resolver: Vec<(u32, Arc<Map>)> = vec![(1, shm.clone()), (2, backed.clone())];
    let slots = Arc::new(CpuSlots::private().expect("CPU slots"));
    let prog = |name: &str, map: u32, op: Op| {
        LoadedProgram::prepare(
            map * 10 + op as u32,
            name,
            &program(map, op),
            helpers::registry(),
            &resolver.as_slice(),
            Engine::Jit,
            slots.clone(),
        )
        .unwrap_or_else(|e| panic!("{name}: {e}"))
    };
    println!("kernel-map-bench: {ITERS} iterations per run, median of {REPS} (load average {})", load.join(" "));
    println!();
    println!(
        "| access from a user-space program (JIT) | session array ns/iter | kernel array, mapped ns/iter | mapped / session |"
    );
    println!("|---|---:|---:|---:|");
    let empty = time_prog(&prog("empty", 1, Op::Empty));
    println!("| empty loop of the same shape | {empty:.2} | {empty:.2} | 1.00 |");
    for (what, op) in [
        ("lookup + load (inlined)", Op::Lookup),
        ("lookup + atomic add (lock xadd)", Op::LookupXadd),
        ("update (helper, BPF_ANY)", Op::Update),
    ] {
        let (a, b) = time_pair(&prog(what, 1, op), &prog(what, 2, op));
        println!("| {what} | {a:.2} | {b:.2} | {:.2} |", b / a);
    }
    // The kernel saw the atomic adds: read one element back through bpf().
    let mut v = 0u64;
    let key = 0u32;
    let mut attr = [0u64; 9];
    attr[0] = karray.as_raw_fd() as u64;
    attr[1] = (&raw const key) as u64;
    attr[2] = (&raw mut v) as u64;
    sys_bpf(1, &mut attr).expect("lookup");
    let mut mine = [0u8; 8];
    backed.lookup_elem(&0u32.to_ne_bytes(), &mut mine).expect("lookup");
    println!();
    println!(
        "element 0 read through bpf(): {v}, through the mapping: {} ({})",
        u64::from_ne_bytes(mine),
        if v == u64::from_ne_bytes(mine) { "the same memory" } else { "MISMATCH" }
    );
    println!();
    println!("| bpf() from user space | ns per call |");
    println!("|---|---:|");
    for (what, fd, cmd) in [
        ("kernel array: BPF_MAP_LOOKUP_ELEM", &karray, 1),
        ("kernel array: BPF_MAP_UPDATE_ELEM", &karray, 2),
        ("kernel hash: BPF_MAP_LOOKUP_ELEM", &khash, 1),
        ("kernel hash: BPF_MAP_UPDATE_ELEM (existing key)", &khash, 2),
    ] {
        println!("| {what} | {:.1} |", time_sys(fd, cmd));
    }
    bpf_kinds(&dir, &slots);
    let _ = std::fs::remove_dir_all(&dir);
}
