//! `map-bench`: nanoseconds per map operation called from JIT-compiled programs, with one
//! and two threads; per-CPU counters checked for lost updates; ring buffer events per second.
//!
//! Every workload is a program looping N times (N from the context, r1) around one helper
//! call. The same program with the call replaced by a `mov` of a successful result (the
//! "empty loop of the same shape") is timed in the same run, interleaved with it, and its
//! time is subtracted: what is left is the helper call and the map operation. Each thread
//! runs through `LoadedProgram::run`, so it holds its own CPU slot for the whole run, as a
//! program run does. One warm-up run, then the median of the timed runs. The program only
//! reports: it never fails because of timing, but it says so when a result is wrong (a
//! lookup that misses a populated key, an update that fails, a lost per-CPU update).
//!
//! The two-thread figures show what sharing costs only when both threads really run at once:
//! on a machine busy with other work (more runnable threads than CPUs) they mostly take turns
//! and the column reads like the one-thread one. There, run it with a real-time priority
//! (`chrt -f 10 target/release/map-bench`, as root) so that the two threads preempt the rest.

use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use userbpf_isa::*;
use userbpf_maps::ringbuf::RingBufConsumer;
use userbpf_maps::{BPF_ANY, BPF_NOEXIST, Map, MapSpec, MapType};
use userbpf_runtime::context::{self, CpuSlots, RunContext};
use userbpf_runtime::helpers;
use userbpf_runtime::program::{Engine, LoadedProgram};

/// Timed runs per measurement (after one warm-up run).
const REPS: usize = 9;
/// About how long one timed run of a loop program should take.
const TARGET_RUN: Duration = Duration::from_millis(6);

const HASH_MAX: u32 = 128 * 1024;
/// Keys in the hashes: half of max_entries.
const HASH_KEYS: u64 = 64 * 1024;
/// Keys of the "hot" hash row: a set that stays in L1/L2.
const HOT_KEYS: u64 = 1024;
const ARRAY_MAX: u32 = 1024;
/// Delete/insert cycles per timed repetition of the hash write workloads.
const CYCLES: usize = 4;

const TARGET_ARRAY_LOOKUP_NS: f64 = 2.0;
const TARGET_HASH_LOOKUP_NS: f64 = 20.0;
const TARGET_PERCPU_INC_NS: f64 = 5.0;

// Map ids given to the resolver (and to the helpers' registry).
const ID_HASH: u32 = 1;
const ID_LRU: u32 = 2;
const ID_ARRAY: u32 = 3;
const ID_PERCPU: u32 = 4;
const ID_CNT_ARRAY: u32 = 5;
const ID_CNT_PERCPU: u32 = 6;
const ID_RINGBUF: u32 = 7;
const ID_CNT_PCPU_HASH: u32 = 8;
const ID_LRU_FULL: u32 = 9;
/// Entries of the LRU map kept full for the evicting-insert row.
const LRU_FULL_MAX: u32 = 4096;
/// sslsniff's `BPF_HASH`es: 4-byte keys (thread ids), 8-byte values, BCC's default size.
const ID_SSL_HASH: u32 = 10;
const SSL_HASH_MAX: u32 = 10240;

const FN_LOOKUP: i32 = 1;
const FN_UPDATE: i32 = 2;
const FN_DELETE: i32 = 3;
const FN_SMP_PROCESSOR_ID: i32 = 8;
const FN_RINGBUF_OUTPUT: i32 = 130;
const FN_RINGBUF_RESERVE: i32 = 131;
const FN_RINGBUF_SUBMIT: i32 = 132;

// ---- a small assembler with labels ----

#[derive(Default)]
struct Asm {
    p: Vec<Insn>,
    labels: Vec<(&'static str, usize)>,
    fixups: Vec<(usize, &'static str)>,
}

impl Asm {
    fn i(&mut self, x: Insn) -> &mut Self {
        self.p.push(x);
        self
    }
    fn label(&mut self, l: &'static str) -> &mut Self {
        self.labels.push((l, self.p.len()));
        self
    }
    fn mov_k(&mut self, dst: u8, imm: i32) -> &mut Self {
        self.i(Insn::new(BPF_ALU64 | BPF_K | BPF_MOV, dst, 0, 0, imm))
    }
    fn mov_x(&mut self, dst: u8, src: u8) -> &mut Self {
        self.i(Insn::new(BPF_ALU64 | BPF_X | BPF_MOV, dst, src, 0, 0))
    }
    fn alu_k(&mut self, op: u8, dst: u8, imm: i32) -> &mut Self {
        self.i(Insn::new(BPF_ALU64 | BPF_K | op, dst, 0, 0, imm))
    }
    fn alu_x(&mut self, op: u8, dst: u8, src: u8) -> &mut Self {
        self.i(Insn::new(BPF_ALU64 | BPF_X | op, dst, src, 0, 0))
    }
    fn ldx(&mut self, size: u8, dst: u8, src: u8, off: i16) -> &mut Self {
        self.i(Insn::new(BPF_LDX | BPF_MEM | size, dst, src, off, 0))
    }
    fn stx(&mut self, size: u8, dst: u8, src: u8, off: i16) -> &mut Self {
        self.i(Insn::new(BPF_STX | BPF_MEM | size, dst, src, off, 0))
    }
    fn st(&mut self, size: u8, dst: u8, off: i16, imm: i32) -> &mut Self {
        self.i(Insn::new(BPF_ST | BPF_MEM | size, dst, 0, off, imm))
    }
    /// `lddw dst, map` (BPF_PSEUDO_MAP_IDX, resolved through the MapResolver).
    fn ld_map(&mut self, dst: u8, id: u32) -> &mut Self {
        self.i(Insn::new(OP_LDDW, dst, BPF_PSEUDO_MAP_IDX, 0, id as i32));
        self.i(Insn::new(0, 0, 0, 0, 0))
    }
    fn call(&mut self, id: i32) -> &mut Self {
        self.i(Insn::new(OP_CALL, 0, 0, 0, id))
    }
    /// A conditional jump against an immediate (`code`: BPF_JEQ, BPF_JNE, ...).
    fn j_k(&mut self, code: u8, dst: u8, imm: i32, l: &'static str) -> &mut Self {
        self.fixups.push((self.p.len(), l));
        self.i(Insn::new(BPF_JMP | BPF_K | code, dst, 0, 0, imm))
    }
    fn j_x(&mut self, code: u8, dst: u8, src: u8, l: &'static str) -> &mut Self {
        self.fixups.push((self.p.len(), l));
        self.i(Insn::new(BPF_JMP | BPF_X | code, dst, src, 0, 0))
    }
    fn ja(&mut self, l: &'static str) -> &mut Self {
        self.fixups.push((self.p.len(), l));
        self.i(Insn::new(OP_JA, 0, 0, 0, 0))
    }
    fn exit(&mut self) -> &mut Self {
        self.i(Insn::new(OP_EXIT, 0, 0, 0, 0))
    }
    fn finish(&mut self) -> Vec<Insn> {
        for &(at, l) in &self.fixups {
            let target = self.labels.iter().find(|(n, _)| *n == l).unwrap_or_else(|| panic!("label {l}")).1;
            self.p[at].off = (target as i64 - at as i64 - 1) as i16;
        }
        std::mem::take(&mut self.p)
    }
}

/// What the loop body calls.
#[derive(Clone, Copy, PartialEq)]
enum Op {
    Lookup,
    Update(u64),
    Delete,
    /// `bpf_get_smp_processor_id`: the cost of a helper call alone.
    CpuId,
}

/// The loop every map workload runs. Context (u64 words): N, key base, key mask, and the
/// result of the last failed call (written by the program).
/// Per iteration: key = base + (i & mask) stored on the stack (4 bytes for arrays, 8 for
/// hashes), then the helper. Returns the number of failed calls (NULL lookups, non-zero
/// update/delete results). `empty`: the call is replaced by a mov of a successful result.
fn op_loop(map: u32, key_size: u8, op: Op, empty: bool) -> Vec<Insn> {
    let mut a = Asm::default();
    a.stx(BPF_DW, 10, 1, -40) // the context, where failures leave their result
        .ldx(BPF_DW, 6, 1, 0) // r6 = N
        .ldx(BPF_DW, 2, 1, 8)
        .stx(BPF_DW, 10, 2, -32) // base
        .ldx(BPF_DW, 9, 1, 16) // r9 = mask
        .mov_k(7, 0) // r7 = i
        .mov_k(8, 0) // r8 = failures
        .st(BPF_DW, 10, -16, 7) // the value updates write
        .st(BPF_DW, 10, -8, 0);
    a.label("top").mov_x(1, 7).alu_x(BPF_AND, 1, 9).ldx(BPF_DW, 2, 10, -32).alu_x(BPF_ADD, 1, 2).stx(
        if key_size == 4 { BPF_W } else { BPF_DW },
        10,
        1,
        -8,
    );
    if op != Op::CpuId {
        a.ld_map(1, map).mov_x(2, 10).alu_k(BPF_ADD, 2, -8);
    }
    if let Op::Update(flags) = op {
        a.mov_x(3, 10).alu_k(BPF_ADD, 3, -16).mov_k(4, flags as i32);
    }
    let (id, ok_is_nonzero) = match op {
        Op::Lookup => (FN_LOOKUP, true),
        Op::Update(_) => (FN_UPDATE, false),
        Op::Delete => (FN_DELETE, false),
        Op::CpuId => (FN_SMP_PROCESSOR_ID, false),
    };
    if empty {
        if ok_is_nonzero {
            a.mov_x(0, 10);
        } else {
            a.mov_k(0, 0);
        }
    } else {
        a.call(id);
    }
    if op == Op::CpuId {
        // Results are CPU slots: anything but a small number is a failure.
        a.j_k(BPF_JLT, 0, 8192, "ok");
    } else if ok_is_nonzero {
        a.j_k(BPF_JNE, 0, 0, "ok");
    } else {
        a.j_k(BPF_JEQ, 0, 0, "ok");
    }
    // A failure: counted, and its result left in context word 3.
    a.alu_k(BPF_ADD, 8, 1).ldx(BPF_DW, 1, 10, -40).stx(BPF_DW, 1, 0, 24);
    a.label("ok").alu_k(BPF_ADD, 7, 1).j_x(BPF_JNE, 7, 6, "top").mov_x(0, 8).exit();
    a.finish()
}

/// N times what BCC's sslsniff does to each of its `BPF_HASH`es per SSL call: the entry
/// probe's `bpf_map_update_elem(map, &tid, &v, BPF_ANY)` of a key not present, the return
/// probe's `bpf_map_delete_elem(map, &tid)`. Context (u64 words): N, the key (4 bytes), -,
/// the result of the last failed call (written by the program). Returns the failed calls.
/// `empty`: both calls replaced by a mov of 0.
fn insert_delete_loop(map: u32, empty: bool) -> Vec<Insn> {
    let mut a = Asm::default();
    a.stx(BPF_DW, 10, 1, -40).ldx(BPF_DW, 6, 1, 0).ldx(BPF_DW, 2, 1, 8).stx(BPF_W, 10, 2, -8);
    a.mov_k(7, 0).mov_k(8, 0).st(BPF_DW, 10, -16, 7);
    a.label("top");
    if empty {
        a.mov_k(0, 0);
    } else {
        a.ld_map(1, map).mov_x(2, 10).alu_k(BPF_ADD, 2, -8).mov_x(3, 10).alu_k(BPF_ADD, 3, -16).mov_k(4, 0);
        a.call(FN_UPDATE);
    }
    a.j_k(BPF_JEQ, 0, 0, "inserted").alu_k(BPF_ADD, 8, 1).ldx(BPF_DW, 1, 10, -40).stx(BPF_DW, 1, 0, 24);
    a.label("inserted");
    if empty {
        a.mov_k(0, 0);
    } else {
        a.ld_map(1, map).mov_x(2, 10).alu_k(BPF_ADD, 2, -8).call(FN_DELETE);
    }
    a.j_k(BPF_JEQ, 0, 0, "next").alu_k(BPF_ADD, 8, 1).ldx(BPF_DW, 1, 10, -40).stx(BPF_DW, 1, 0, 24);
    a.label("next").alu_k(BPF_ADD, 7, 1).j_x(BPF_JNE, 7, 6, "top").mov_x(0, 8).exit();
    a.finish()
}

/// How a counter program increments.
#[derive(Clone, Copy, PartialEq)]
enum Inc {
    /// `*v += 1` as clang emits it for `(*v)++`: load, add, store.
    Plain,
    /// `__sync_fetch_and_add(v, 1)`: BPF_STX | BPF_ATOMIC | BPF_DW, imm BPF_ADD.
    Atomic,
    /// bpftrace's keyed `count()` on a per-CPU hash (an 8-byte key): `n = v ? *v + 1 : 1;
    /// bpf_map_update_elem(map, &key, &n, BPF_ANY)` (the JIT does the thread's memo hits of
    /// both inline).
    Keyed,
}

/// N times: `v = bpf_map_lookup_elem(map, &zero); if (v) inc(*v)`. Returns the NULL count.
/// `empty`: neither the lookup nor the increment (the bare loop).
fn counter_loop(map: u32, inc: Inc, empty: bool) -> Vec<Insn> {
    if inc == Inc::Keyed {
        return keyed_counter_loop(map, empty);
    }
    let mut a = Asm::default();
    a.ldx(BPF_DW, 6, 1, 0).mov_k(7, 0).mov_k(8, 0).st(BPF_W, 10, -4, 0);
    a.label("top");
    a.ld_map(1, map).mov_x(2, 10).alu_k(BPF_ADD, 2, -4);
    if !empty {
        a.call(FN_LOOKUP).j_k(BPF_JNE, 0, 0, "found").alu_k(BPF_ADD, 8, 1).ja("next").label("found");
        if inc == Inc::Atomic {
            a.mov_k(1, 1).i(Insn::new(BPF_STX | BPF_ATOMIC | BPF_DW, 0, 1, 0, BPF_ADD as i32));
        } else {
            a.ldx(BPF_DW, 1, 0, 0).alu_k(BPF_ADD, 1, 1).stx(BPF_DW, 0, 1, 0);
        }
    }
    a.label("next").alu_k(BPF_ADD, 7, 1).j_x(BPF_JNE, 7, 6, "top").mov_x(0, 8).exit();
    a.finish()
}

/// N times bpftrace's keyed `count()` of key 0 (see [`Inc::Keyed`]). Returns the failed
/// updates. `empty`: the bare loop.
fn keyed_counter_loop(map: u32, empty: bool) -> Vec<Insn> {
    let mut a = Asm::default();
    a.ldx(BPF_DW, 6, 1, 0).mov_k(7, 0).mov_k(8, 0).st(BPF_DW, 10, -8, 0);
    a.label("top");
    if !empty {
        a.ld_map(1, map).mov_x(2, 10).alu_k(BPF_ADD, 2, -8).call(FN_LOOKUP);
        a.mov_k(1, 1).j_k(BPF_JEQ, 0, 0, "upd").ldx(BPF_DW, 1, 0, 0).alu_k(BPF_ADD, 1, 1);
        a.label("upd").stx(BPF_DW, 10, 1, -16);
        a.ld_map(1, map).mov_x(2, 10).alu_k(BPF_ADD, 2, -8).mov_x(3, 10).alu_k(BPF_ADD, 3, -16).mov_k(4, 0);
        a.call(FN_UPDATE).j_k(BPF_JEQ, 0, 0, "next").alu_k(BPF_ADD, 8, 1);
    }
    a.label("next").alu_k(BPF_ADD, 7, 1).j_x(BPF_JNE, 7, 6, "top").mov_x(0, 8).exit();
    a.finish()
}

/// N ring buffer records of `size` bytes (the first 8 bytes: the iteration number), by
/// `bpf_ringbuf_output` from the stack or by reserve + submit. Returns the failures (drops).
fn ringbuf_loop(map: u32, size: i32, reserve: bool) -> Vec<Insn> {
    let mut a = Asm::default();
    a.ldx(BPF_DW, 6, 1, 0).mov_k(7, 0).mov_k(8, 0);
    for off in (8..=64).step_by(8) {
        a.st(BPF_DW, 10, -(off as i16), 0x55);
    }
    a.label("top");
    if reserve {
        a.ld_map(1, map).mov_k(2, size).mov_k(3, 0).call(FN_RINGBUF_RESERVE);
        a.j_k(BPF_JNE, 0, 0, "got").alu_k(BPF_ADD, 8, 1).ja("next").label("got");
        a.stx(BPF_DW, 0, 7, 0).mov_x(1, 0).mov_k(2, 0).call(FN_RINGBUF_SUBMIT);
    } else {
        a.stx(BPF_DW, 10, 7, -64).ld_map(1, map).mov_x(2, 10).alu_k(BPF_ADD, 2, -64).mov_k(3, size).mov_k(4, 0);
        a.call(FN_RINGBUF_OUTPUT).j_k(BPF_JEQ, 0, 0, "next").alu_k(BPF_ADD, 8, 1);
    }
    a.label("next").alu_k(BPF_ADD, 7, 1).j_x(BPF_JNE, 7, 6, "top").mov_x(0, 8).exit();
    a.finish()
}

// ---- environment: maps, programs, runs ----

struct Env {
    dir: PathBuf,
    slots: Arc<CpuSlots>,
    maps: Vec<(u32, Arc<Map>)>,
    next_prog: u32,
}

impl Drop for Env {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Env {
    fn new() -> Env {
        let root = if Path::new("/dev/shm").is_dir() { PathBuf::from("/dev/shm") } else { std::env::temp_dir() };
        let dir = root.join(format!("userbpf-map-bench-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("creating the map directory");
        let slots = Arc::new(CpuSlots::private().expect("CPU slots"));
        Env { dir, slots, maps: Vec::new(), next_prog: 1 }
    }

    fn create(
        &mut self,
        id: u32,
        name: &str,
        map_type: MapType,
        key_size: u32,
        value_size: u32,
        max_entries: u32,
    ) -> Arc<Map> {
        let spec =
            MapSpec { map_type, key_size, value_size, max_entries, map_flags: 0, map_extra: 0, name: name.to_string() };
        let map = Arc::new(Map::create(&self.dir.join(name), &spec).unwrap_or_else(|e| panic!("creating {name}: {e}")));
        assert!(helpers::register_map(id, map.clone()), "map registry full");
        self.maps.push((id, map.clone()));
        map
    }

    fn prog(&mut self, name: &str, insns: &[Insn]) -> LoadedProgram {
        self.next_prog += 1;
        let resolver = self.maps.as_slice();
        LoadedProgram::prepare(
            self.next_prog,
            name,
            insns,
            helpers::registry(),
            &resolver,
            Engine::Jit,
            self.slots.clone(),
        )
        .unwrap_or_else(|e| panic!("preparing {name}: {e}"))
    }
}

/// One run inside a run context (CPU slot claimed). `None`: skipped (no free slot).
fn run(p: &LoadedProgram, ctx: &mut [u64; 4]) -> Option<u64> {
    match p.run(ctx.as_mut_ptr().cast(), 32, RunContext::default()) {
        Ok(r) => r,
        Err(e) => panic!("{}: {e}", p.name),
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Runs `f(thread index, barrier)` on `threads` threads at once.
fn in_threads<R: Send>(threads: usize, f: impl Fn(usize, &Barrier) -> R + Sync) -> Vec<R> {
    let barrier = Barrier::new(threads);
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                let (f, b) = (&f, &barrier);
                s.spawn(move || f(t, b))
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("benchmark thread panicked")).collect()
    })
}

/// A measurement: net ns per operation (mean over threads of each thread's median), failed
/// calls in the last run of each thread, skipped runs.
#[derive(Clone, Copy, Default)]
struct Measured {
    ns: f64,
    gross_ns: f64,
    fails: u64,
    ops: u64,
    skipped: u64,
    /// Runs of the measured program (warm-up included) that were not skipped.
    prog_runs: u64,
    /// The result of a failed call (context word 3), 0 if none failed.
    last_err: u64,
    /// Involuntary context switches of the benchmark threads during the runs.
    preempted: u64,
    /// CPU time stolen by the hypervisor (all CPUs) during the runs, ms.
    steal_ms: u64,
}

/// Times `prog` against `empty` (same shape, no call) on `threads` threads, each with the
/// context `ctx_of(thread)` (words 1.. ; word 0 is set to `n`).
fn measure(
    prog: &LoadedProgram,
    empty: &LoadedProgram,
    threads: usize,
    n: u64,
    ctx_of: &(dyn Fn(usize) -> [u64; 4] + Sync),
) -> Measured {
    let steal0 = steal_ms();
    let per_thread = in_threads(threads, |t, b| {
        let mut ctx = ctx_of(t);
        ctx[0] = n;
        let switches0 = involuntary_switches();
        let (mut skipped, mut prog_skipped) = (0u64, 0u64);
        let timed = |p: &LoadedProgram, ctx: &mut [u64; 4]| {
            let t0 = Instant::now();
            let r = run(p, ctx);
            (t0.elapsed().as_secs_f64() * 1e9, r)
        };
        if timed(prog, &mut ctx).1.is_none() {
            prog_skipped += 1;
        }
        if timed(empty, &mut ctx).1.is_none() {
            skipped += 1;
        }
        let (mut tp, mut te) = (Vec::new(), Vec::new());
        let mut fails = 0;
        for _ in 0..REPS {
            b.wait();
            let (dt, r) = timed(prog, &mut ctx);
            tp.push(dt);
            match r {
                Some(f) => fails = f,
                None => prog_skipped += 1,
            }
            b.wait();
            let (dt, r) = timed(empty, &mut ctx);
            te.push(dt);
            if r.is_none() {
                skipped += 1;
            }
        }
        skipped += prog_skipped;
        let (p, e) = (median(tp) / n as f64, median(te) / n as f64);
        let preempted = involuntary_switches() - switches0;
        Measured {
            ns: p - e,
            gross_ns: p,
            fails,
            ops: n,
            skipped,
            prog_runs: 1 + REPS as u64 - prog_skipped,
            last_err: ctx[3],
            preempted,
            steal_ms: 0,
        }
    });
    Measured { steal_ms: steal_ms() - steal0, ..combine(&per_thread) }
}

fn combine(v: &[Measured]) -> Measured {
    let k = v.len() as f64;
    Measured {
        ns: v.iter().map(|m| m.ns).sum::<f64>() / k,
        gross_ns: v.iter().map(|m| m.gross_ns).sum::<f64>() / k,
        fails: v.iter().map(|m| m.fails).sum(),
        ops: v.iter().map(|m| m.ops).sum(),
        skipped: v.iter().map(|m| m.skipped).sum(),
        prog_runs: v.iter().map(|m| m.prog_runs).sum(),
        last_err: v.iter().map(|m| m.last_err).find(|&e| e != 0).unwrap_or(0),
        preempted: v.iter().map(|m| m.preempted).sum(),
        steal_ms: 0,
    }
}

/// An iteration count that makes one run of `prog` take about TARGET_RUN.
fn calibrate(prog: &LoadedProgram, ctx: [u64; 4]) -> u64 {
    let probe = 20_000u64;
    let mut ctx = ctx;
    ctx[0] = probe;
    let best = (0..3)
        .map(|_| {
            let t = Instant::now();
            run(prog, &mut ctx);
            t.elapsed()
        })
        .min()
        .unwrap();
    let per = best.as_secs_f64() / probe as f64;
    let n = (TARGET_RUN.as_secs_f64() / per.max(1e-10)) as u64;
    (n.clamp(50_000, 20_000_000) / 10_000) * 10_000
}

/// Hash write workloads: each thread deletes every key of its share (all present), then
/// inserts them back (BPF_NOEXIST), CYCLES times per repetition; both timed separately, each
/// against its empty loop. Returns (delete, insert).
#[allow(clippy::too_many_arguments)]
fn measure_cycle(
    del: &LoadedProgram,
    del_empty: &LoadedProgram,
    ins: &LoadedProgram,
    ins_empty: &LoadedProgram,
    threads: usize,
    ctx_of: &(dyn Fn(usize) -> [u64; 4] + Sync),
) -> (Measured, Measured) {
    let steal0 = steal_ms();
    let per_thread = in_threads(threads, |t, b| {
        let switches0 = involuntary_switches();
        let mut ctx = ctx_of(t);
        ctx[0] = ctx[2] + 1; // every key of the share once
        let n = ctx[0] as f64;
        let mut skipped = 0u64;
        let (mut derr, mut ierr) = (0u64, 0u64);
        let mut timed = |p: &LoadedProgram, ctx: &mut [u64; 4]| {
            ctx[3] = 0;
            let t0 = Instant::now();
            let r = run(p, ctx);
            let dt = t0.elapsed().as_secs_f64() * 1e9;
            if r.is_none() {
                skipped += 1;
            }
            (dt, r.unwrap_or(0))
        };
        let (mut d, mut de, mut i, mut ie) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        // Warm-up cycle (failures counted too).
        let (_, mut dfail) = timed(del, &mut ctx);
        if dfail != 0 {
            derr = ctx[3];
        }
        let (_, mut ifail) = timed(ins, &mut ctx);
        if ifail != 0 {
            ierr = ctx[3];
        }
        for _ in 0..REPS {
            b.wait();
            let (mut sd, mut sde, mut si, mut sie) = (0.0, 0.0, 0.0, 0.0);
            for _ in 0..CYCLES {
                let (x, f) = timed(del, &mut ctx);
                sd += x;
                dfail += f;
                if f != 0 && derr == 0 {
                    derr = ctx[3];
                }
                sde += timed(del_empty, &mut ctx).0;
                let (x, f) = timed(ins, &mut ctx);
                si += x;
                ifail += f;
                if f != 0 && ierr == 0 {
                    ierr = ctx[3];
                }
                sie += timed(ins_empty, &mut ctx).0;
            }
            let k = CYCLES as f64 * n;
            d.push(sd / k);
            de.push(sde / k);
            i.push(si / k);
            ie.push(sie / k);
        }
        let ops = (REPS * CYCLES) as u64 * ctx[0];
        let (d, de, i, ie) = (median(d), median(de), median(i), median(ie));
        let preempted = involuntary_switches() - switches0;
        (
            Measured {
                ns: d - de,
                gross_ns: d,
                fails: dfail,
                ops,
                skipped,
                prog_runs: 0,
                last_err: derr,
                preempted,
                steal_ms: 0,
            },
            Measured {
                ns: i - ie,
                gross_ns: i,
                fails: ifail,
                ops,
                skipped: 0,
                prog_runs: 0,
                last_err: ierr,
                preempted,
                steal_ms: 0,
            },
        )
    });
    let steal = steal_ms() - steal0;
    let (dv, iv): (Vec<Measured>, Vec<Measured>) = per_thread.into_iter().unzip();
    (Measured { steal_ms: steal, ..combine(&dv) }, Measured { steal_ms: steal, ..combine(&iv) })
}

struct Row {
    map: &'static str,
    op: String,
    one: Measured,
    two: Measured,
    /// Failures are the expected result (delete on an array).
    failures_expected: bool,
    note: Option<String>,
}

fn fmt_ns(v: f64) -> String {
    format!("{v:.2}")
}

fn fmt_count(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (k, c) in s.chars().enumerate() {
        if k > 0 && (s.len() - k).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A helper's result as `-ERRNO` (or NULL / the value).
fn errno_name(r: u64) -> String {
    let e = -(r as i64);
    let name = match e as i32 {
        libc_consts::ENOENT => "ENOENT",
        libc_consts::EEXIST => "EEXIST",
        libc_consts::E2BIG => "E2BIG",
        libc_consts::EINVAL => "EINVAL",
        libc_consts::ENOMEM => "ENOMEM",
        libc_consts::EBUSY => "EBUSY",
        libc_consts::EAGAIN => "EAGAIN",
        _ => return format!("{r:#x}"),
    };
    format!("-{name}")
}

mod libc_consts {
    pub const ENOENT: i32 = 2;
    pub const EAGAIN: i32 = 11;
    pub const ENOMEM: i32 = 12;
    pub const EBUSY: i32 = 16;
    pub const EEXIST: i32 = 17;
    pub const EINVAL: i32 = 22;
    pub const E2BIG: i32 = 7;
}

/// Involuntary context switches of the calling thread so far.
fn involuntary_switches() -> u64 {
    std::fs::read_to_string("/proc/thread-self/status")
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| l.strip_prefix("nonvoluntary_ctxt_switches:")).and_then(|v| v.trim().parse().ok())
        })
        .unwrap_or(0)
}

/// Steal time of all CPUs so far (ms), from /proc/stat (USER_HZ = 100).
fn steal_ms() -> u64 {
    std::fs::read_to_string("/proc/stat")
        .ok()
        .and_then(|s| s.lines().next().and_then(|l| l.split_whitespace().nth(8)).and_then(|v| v.parse::<u64>().ok()))
        .map_or(0, |ticks| ticks * 10)
}

fn loadavg() -> String {
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    load.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
}

/// A loop workload in 1 and 2 threads.
fn loop_row(
    env: &mut Env,
    map: &'static str,
    op_name: &str,
    id: u32,
    key_size: u8,
    op: Op,
    ctx_of: &(dyn Fn(usize, usize) -> [u64; 4] + Sync),
) -> Row {
    let prog = env.prog(&format!("{map}_{op_name}"), &op_loop(id, key_size, op, false));
    let empty = env.prog(&format!("{map}_{op_name}_empty"), &op_loop(id, key_size, op, true));
    let n = calibrate(&prog, ctx_of(1, 0));
    let one = measure(&prog, &empty, 1, n, &|t| ctx_of(1, t));
    let two = measure(&prog, &empty, 2, n, &|t| ctx_of(2, t));
    Row { map, op: op_name.to_string(), one, two, failures_expected: false, note: None }
}

/// Rust-side costs of the pieces of `map_lookup_elem` (no JIT, no helper call).
struct Pieces {
    map_at: f64,
    current_cpu: f64,
    array_lookup: f64,
    hash_lookup: f64,
    hash_lookup_hot: f64,
}

fn pieces(env: &Env, array: &Map, hash: &Map) -> Pieces {
    const M: u64 = 4_000_000;
    let _g = context::enter(&env.slots, RunContext::default()).ok();
    let time = |f: &mut dyn FnMut(u64)| {
        let mut best = f64::MAX;
        for _ in 0..3 {
            let t = Instant::now();
            for i in 0..M {
                f(i);
            }
            best = best.min(t.elapsed().as_secs_f64() * 1e9 / M as f64);
        }
        best
    };
    let empty = time(&mut |i| {
        black_box(i);
    });
    let addr = array as *const Map as u64;
    let map_at = time(&mut |_| {
        black_box(helpers::maps::map_at(black_box(addr)));
    }) - empty;
    let current_cpu = time(&mut |_| {
        black_box(context::current_cpu());
    }) - empty;
    let cpu = context::current_cpu();
    let array_lookup = time(&mut |i| {
        let k = ((i as u32) & (ARRAY_MAX - 1)).to_ne_bytes();
        // SAFETY: a 4-byte key, the array's key size.
        black_box(unsafe { black_box(array).lookup(k.as_ptr(), cpu) });
    }) - empty;
    let hash_lookup = time(&mut |i| {
        let k = (i & (HASH_KEYS - 1)).to_ne_bytes();
        // SAFETY: an 8-byte key, the hash's key size.
        black_box(unsafe { black_box(hash).lookup(k.as_ptr(), cpu) });
    }) - empty;
    let hash_lookup_hot = time(&mut |i| {
        let k = (i & (HOT_KEYS - 1)).to_ne_bytes();
        // SAFETY: as above.
        black_box(unsafe { black_box(hash).lookup(k.as_ptr(), cpu) });
    }) - empty;
    Pieces { map_at, current_cpu, array_lookup, hash_lookup, hash_lookup_hot }
}

struct Counter {
    name: &'static str,
    one: Measured,
    two: Measured,
    expected: u64,
    counted: u64,
}

/// Counter programs: timed in 1 and 2 threads, then every increment counted.
fn counter(env: &mut Env, name: &'static str, map: &Map, id: u32, inc: Inc) -> Counter {
    let prog = env.prog(name, &counter_loop(id, inc, false));
    let empty = env.prog(&format!("{name}_empty"), &counter_loop(id, inc, true));
    let n = calibrate(&prog, [0; 4]);
    // Zero the counter(s) now: every run from here on is counted.
    let zeros = vec![0u8; map.value_buf_size()];
    let key = vec![0u8; map.spec().key_size as usize];
    map.update_elem(&key, &zeros, BPF_ANY).expect("zeroing the counter");
    let one = measure(&prog, &empty, 1, n, &|_| [0; 4]);
    let two = measure(&prog, &empty, 2, n, &|_| [0; 4]);
    // Runs of `prog` that were not skipped (the empty loop does not increment).
    let runs = one.prog_runs + two.prog_runs;
    let mut buf = vec![0u8; map.value_buf_size()];
    map.lookup_elem(&key, &mut buf).expect("reading the counter");
    let counted: u64 = buf.chunks_exact(8).map(|c| u64::from_ne_bytes(c.try_into().unwrap())).sum();
    Counter { name, one, two, expected: runs * n, counted }
}

struct RbResult {
    name: String,
    attempted: u64,
    produced: u64,
    dropped: u64,
    consumed: u64,
    bad_records: u64,
    producer_s: f64,
    consumer_s: f64,
    wakeups: u64,
    skipped: u64,
}

/// How the ring buffer is drained.
#[derive(Clone, Copy, PartialEq)]
enum Drain {
    /// A consumer thread calling `consume` in a loop (yielding when the ring is empty).
    Busy,
    /// A consumer thread in `poll`, sleeping on the futex when the ring is empty.
    Poll,
    /// No consumer while the program runs: the producer thread drains between runs,
    /// untimed (the producer's cost alone).
    BetweenRuns,
}

/// One producer thread running `prog` (N records per run) for `dur`, the ring drained as
/// `drain` says.
fn ringbuf_run(map: &Map, prog: &LoadedProgram, name: String, size: usize, dur: Duration, drain: Drain) -> RbResult {
    let Map::RingBuf(rb) = map else { panic!("not a ring buffer") };
    let wakeups0 = rb.wakeups();
    let done = AtomicBool::new(false);
    let threads = if drain == Drain::BetweenRuns { 1 } else { 2 };
    let barrier = Barrier::new(threads);
    // Between runs, a run's records must fit the ring (1 MiB): 10,000 of up to 72 bytes.
    let n = if drain == Drain::BetweenRuns { 10_000u64 } else { 20_000 };
    let consume_all = |c: &mut RingBufConsumer, count: &mut u64, bad: &mut u64| {
        c.consume(|rec: &[u8]| {
            *count += 1;
            if rec.len() != size {
                *bad += 1;
            }
        })
        .expect("consume")
    };
    let (prod, cons) = std::thread::scope(|s| {
        let consumer = (drain != Drain::BetweenRuns).then(|| {
            s.spawn(|| {
                let mut c = RingBufConsumer::new(rb).expect("ring buffer consumer");
                let (mut count, mut bad) = (0u64, 0u64);
                barrier.wait();
                let t0 = Instant::now();
                loop {
                    let got = if drain == Drain::Poll {
                        c.poll(Duration::from_millis(20), |rec: &[u8]| {
                            count += 1;
                            if rec.len() != size {
                                bad += 1;
                            }
                        })
                        .expect("poll")
                    } else {
                        consume_all(&mut c, &mut count, &mut bad)
                    };
                    if got == 0 {
                        if done.load(Ordering::Acquire) && consume_all(&mut c, &mut count, &mut bad) == 0 {
                            break;
                        }
                        if drain == Drain::Busy {
                            std::thread::yield_now();
                        }
                    }
                }
                (count, bad, t0.elapsed().as_secs_f64())
            })
        });
        let producer = s.spawn(|| {
            let mut ctx = [n, 0, 0, 0];
            let (mut attempted, mut dropped, mut skipped) = (0u64, 0u64, 0u64);
            let mut own =
                (drain == Drain::BetweenRuns).then(|| RingBufConsumer::new(rb).expect("ring buffer consumer"));
            let (mut count, mut bad, mut drain_s) = (0u64, 0u64, 0.0f64);
            barrier.wait();
            let t0 = Instant::now();
            let mut busy_s = 0.0;
            while t0.elapsed() < dur {
                let t = Instant::now();
                let r = run(prog, &mut ctx);
                busy_s += t.elapsed().as_secs_f64();
                match r {
                    Some(d) => {
                        attempted += n;
                        dropped += d;
                    }
                    None => skipped += 1,
                }
                if let Some(c) = own.as_mut() {
                    let t = Instant::now();
                    consume_all(c, &mut count, &mut bad);
                    drain_s += t.elapsed().as_secs_f64();
                }
            }
            done.store(true, Ordering::Release);
            ((attempted, dropped, skipped, busy_s), (count, bad, drain_s))
        });
        let (prod, own_cons) = producer.join().expect("producer");
        let cons = match consumer {
            Some(c) => c.join().expect("consumer"),
            None => own_cons,
        };
        (prod, cons)
    });
    let (attempted, dropped, skipped, producer_s) = prod;
    let (consumed, bad_records, consumer_s) = cons;
    RbResult {
        name,
        attempted,
        produced: attempted - dropped,
        dropped,
        consumed,
        bad_records,
        producer_s,
        consumer_s,
        wakeups: rb.wakeups() - wakeups0,
        skipped,
    }
}

fn main() {
    let started = Instant::now();
    let load_start = loadavg();
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let _ = helpers::registry();
    let mut env = Env::new();

    // Maps. Values are 8 bytes everywhere.
    let hash = env.create(ID_HASH, "hash", MapType::BPF_MAP_TYPE_HASH, 8, 8, HASH_MAX);
    let lru = env.create(ID_LRU, "lru_hash", MapType::BPF_MAP_TYPE_LRU_HASH, 8, 8, HASH_MAX);
    let array = env.create(ID_ARRAY, "array", MapType::BPF_MAP_TYPE_ARRAY, 4, 8, ARRAY_MAX);
    let _percpu = env.create(ID_PERCPU, "percpu_array", MapType::BPF_MAP_TYPE_PERCPU_ARRAY, 4, 8, ARRAY_MAX);
    let cnt_array = env.create(ID_CNT_ARRAY, "cnt_array", MapType::BPF_MAP_TYPE_ARRAY, 4, 8, 1);
    let cnt_percpu = env.create(ID_CNT_PERCPU, "cnt_percpu", MapType::BPF_MAP_TYPE_PERCPU_ARRAY, 4, 8, 1);
    let cnt_pcpu_hash = env.create(ID_CNT_PCPU_HASH, "cnt_pcpu_hash", MapType::BPF_MAP_TYPE_PERCPU_HASH, 8, 8, 1024);
    let ringbuf = env.create(ID_RINGBUF, "ringbuf", MapType::BPF_MAP_TYPE_RINGBUF, 0, 0, 1 << 20);
    let lru_full = env.create(ID_LRU_FULL, "lru_full", MapType::BPF_MAP_TYPE_LRU_HASH, 8, 8, LRU_FULL_MAX);
    let ssl_hash = env.create(ID_SSL_HASH, "ssl_hash", MapType::BPF_MAP_TYPE_HASH, 4, 8, SSL_HASH_MAX);
    for k in 0..u64::from(LRU_FULL_MAX) {
        lru_full.update_elem(&((1u64 << 40) + k).to_ne_bytes(), &7u64.to_ne_bytes(), BPF_ANY).expect("filling the LRU");
    }
    for m in [&hash, &lru] {
        for k in 0..HASH_KEYS {
            m.update_elem(&k.to_ne_bytes(), &7u64.to_ne_bytes(), BPF_ANY).expect("filling the hash");
        }
    }

    // Lookups of every populated key, by every thread; writes: each thread its own half of
    // the keys (one thread: the first half).
    let all_hash = |_: usize, _: usize| [0, 0, HASH_KEYS - 1, 0];
    let hot_hash = |_: usize, _: usize| [0, 0, HOT_KEYS - 1, 0];
    let half_hash = |_: usize, t: usize| [0, t as u64 * HASH_KEYS / 2, HASH_KEYS / 2 - 1, 0];
    let all_array = |_: usize, _: usize| [0, 0, ARRAY_MAX as u64 - 1, 0];

    let mut rows = Vec::new();
    rows.push(loop_row(&mut env, "(none)", "helper call: get_smp_processor_id", 0, 8, Op::CpuId, &all_array));
    for (name, id, key) in [("array", ID_ARRAY, 4u8), ("percpu_array", ID_PERCPU, 4)] {
        rows.push(loop_row(&mut env, name, "lookup", id, key, Op::Lookup, &all_array));
        rows.push(loop_row(&mut env, name, "update (BPF_ANY)", id, key, Op::Update(BPF_ANY), &all_array));
        let mut r =
            loop_row(&mut env, name, "delete (-EINVAL: call + map check only)", id, key, Op::Delete, &all_array);
        r.failures_expected = true;
        rows.push(r);
    }
    for (name, id) in [("hash", ID_HASH), ("lru_hash", ID_LRU)] {
        rows.push(loop_row(&mut env, name, "lookup (64k keys of 128k)", id, 8, Op::Lookup, &all_hash));
        rows.push(loop_row(&mut env, name, "lookup (1k hot keys)", id, 8, Op::Lookup, &hot_hash));
        rows.push(loop_row(&mut env, name, "update existing (BPF_ANY)", id, 8, Op::Update(BPF_ANY), &half_hash));
        let del = env.prog(&format!("{name}_delete"), &op_loop(id, 8, Op::Delete, false));
        let del_e = env.prog(&format!("{name}_delete_empty"), &op_loop(id, 8, Op::Delete, true));
        let ins = env.prog(&format!("{name}_insert"), &op_loop(id, 8, Op::Update(BPF_NOEXIST), false));
        let ins_e = env.prog(&format!("{name}_insert_empty"), &op_loop(id, 8, Op::Update(BPF_NOEXIST), true));
        let (d1, i1) = measure_cycle(&del, &del_e, &ins, &ins_e, 1, &|t| half_hash(1, t));
        let (d2, i2) = measure_cycle(&del, &del_e, &ins, &ins_e, 2, &|t| half_hash(2, t));
        rows.push(Row {
            map: name,
            op: "delete (present key)".into(),
            one: d1,
            two: d2,
            failures_expected: false,
            note: None,
        });
        rows.push(Row {
            map: name,
            op: "update new key (BPF_NOEXIST)".into(),
            one: i1,
            two: i2,
            failures_expected: false,
            note: None,
        });
        let mut left = 0u64;
        let mut k = [0u8; 8];
        let mut cur: Option<[u8; 8]> = None;
        while map_next(if name == "hash" { &hash } else { &lru }, cur.as_ref(), &mut k) {
            left += 1;
            cur = Some(k);
        }
        if left != HASH_KEYS {
            rows.last_mut().unwrap().note =
                Some(format!("{left} keys in the map after the cycles, {HASH_KEYS} expected"));
        }
    }
    // sslsniff's pattern: each thread inserts its own key (its "tid") and deletes it again.
    {
        let prog = env.prog("ssl_insert_delete", &insert_delete_loop(ID_SSL_HASH, false));
        let empty = env.prog("ssl_insert_delete_empty", &insert_delete_loop(ID_SSL_HASH, true));
        let ctx_of = |t: usize| [0, 1000 + t as u64, 0, 0];
        let n = calibrate(&prog, ctx_of(0));
        let one = measure(&prog, &empty, 1, n, &ctx_of);
        let two = measure(&prog, &empty, 2, n, &ctx_of);
        let left = ssl_hash.get_next_key(None, &mut [0u8; 4]).is_ok();
        rows.push(Row {
            map: "hash",
            op: "insert new key (BPF_ANY) + delete it, 4-byte key per thread (sslsniff's pattern; ns per pair)".into(),
            one,
            two,
            failures_expected: false,
            note: left.then(|| "keys left in the map after the runs, none expected".to_string()),
        });
    }
    // Inserts into a full LRU map: each thread cycles through 1M keys of its own (evicted long
    // before they come round again), so every update evicts an element.
    let evicting = |_: usize, t: usize| [0, (t as u64) << 32, (1 << 20) - 1, 0];
    rows.push(loop_row(
        &mut env,
        "lru_hash",
        "update new key, full map (evicting)",
        ID_LRU_FULL,
        8,
        Op::Update(BPF_ANY),
        &evicting,
    ));
    let mut full = 0u64;
    let mut k = [0u8; 8];
    let mut cur: Option<[u8; 8]> = None;
    while map_next(&lru_full, cur.as_ref(), &mut k) {
        full += 1;
        cur = Some(k);
    }
    if full != u64::from(LRU_FULL_MAX) {
        rows.last_mut().unwrap().note =
            Some(format!("{full} keys in the map after the inserts, {LRU_FULL_MAX} expected"));
    }
    for r in rows.iter_mut() {
        let bad = |m: &Measured| if r.failures_expected { m.fails != m.ops } else { m.fails != 0 };
        let mut notes = Vec::new();
        if bad(&r.one) || bad(&r.two) {
            let err = if r.one.last_err != 0 { r.one.last_err } else { r.two.last_err };
            notes.push(format!(
                "FAILED calls: {} (1 thread), {} (2 threads), result {}; meanwhile the threads were preempted {} times \
                 (1 thread) / {} times (2 threads), hypervisor steal {} / {} ms",
                r.one.fails,
                r.two.fails,
                errno_name(err),
                r.one.preempted,
                r.two.preempted,
                r.one.steal_ms,
                r.two.steal_ms
            ));
        }
        if r.one.skipped + r.two.skipped > 0 {
            notes.push(format!("{} runs skipped (no CPU slot)", r.one.skipped + r.two.skipped));
        }
        if let Some(n) = r.note.take() {
            notes.push(n);
        }
        if !notes.is_empty() {
            r.note = Some(notes.join("; "));
        }
    }

    let p = pieces(&env, &array, &hash);

    let counters = [
        counter(&mut env, "percpu_array, *v += 1", &cnt_percpu, ID_CNT_PERCPU, Inc::Plain),
        counter(&mut env, "array, *v += 1", &cnt_array, ID_CNT_ARRAY, Inc::Plain),
        counter(&mut env, "array, __sync_fetch_and_add", &cnt_array, ID_CNT_ARRAY, Inc::Atomic),
        counter(
            &mut env,
            "percpu_hash, bpftrace's @x[key] = count() (lookup + update)",
            &cnt_pcpu_hash,
            ID_CNT_PCPU_HASH,
            Inc::Keyed,
        ),
    ];

    let mut rb_results = Vec::new();
    let rb_dur = Duration::from_millis(500);
    let rb_runs = [
        (16, false, Drain::BetweenRuns),
        (64, false, Drain::BetweenRuns),
        (64, true, Drain::BetweenRuns),
        (16, false, Drain::Busy),
        (64, false, Drain::Busy),
        (64, true, Drain::Busy),
        (64, false, Drain::Poll),
    ];
    for (size, reserve, drain) in rb_runs {
        let prog = env.prog("rb", &ringbuf_loop(ID_RINGBUF, size, reserve));
        let name = format!(
            "{} {size} B, {}",
            if reserve { "reserve + submit" } else { "ringbuf_output" },
            match drain {
                Drain::BetweenRuns => "drained between runs (producer alone)",
                Drain::Busy => "consumer thread: busy consume",
                Drain::Poll => "consumer thread: poll (futex)",
            }
        );
        rb_results.push(ringbuf_run(&ringbuf, &prog, name, size as usize, rb_dur, drain));
    }

    // ---- report ----
    println!("## userbpf maps: ns per operation from JIT-compiled programs");
    println!();
    println!(
        "Load average {load_start} at the start, {} at the end, on {cpus} CPUs (timings are noisy on a busy machine). \
         Each figure is the median of {REPS} runs minus the median of an empty loop of the same shape (the call replaced by a mov); \
         with 2 threads both run at once, each in its own CPU slot, and the figure is their mean. Keys vary over the populated \
         set: arrays {ARRAY_MAX} entries; hashes {}k keys of {}k max_entries, 8-byte keys and values (writes: each thread its own half).",
        loadavg(),
        HASH_KEYS / 1024,
        HASH_MAX / 1024
    );
    println!();
    println!("| map type | operation | 1 thread ns/op | 2 threads ns/op | 2 threads / 1 thread | notes |");
    println!("|---|---|---:|---:|---:|---|");
    for r in &rows {
        // The ratio only where the one-thread figure is large enough to divide by.
        let ratio = if r.one.ns >= 5.0 { format!("{:.2}", r.two.ns / r.one.ns) } else { String::new() };
        println!(
            "| {} | {} | {} | {} | {} | {} |",
            r.map,
            r.op,
            fmt_ns(r.one.ns),
            fmt_ns(r.two.ns),
            ratio,
            r.note.as_deref().unwrap_or("")
        );
    }
    println!();
    println!("Pieces of `map_lookup_elem`, called from Rust inside a run context (1 thread, no JIT, no helper call):");
    println!();
    println!("| piece | ns |");
    println!("|---|---:|");
    println!("| registry validation `map_at(addr)` | {} |", fmt_ns(p.map_at));
    println!("| `current_cpu()` | {} |", fmt_ns(p.current_cpu));
    println!("| `Map::lookup` array | {} |", fmt_ns(p.array_lookup));
    println!("| `Map::lookup` hash, 64k keys | {} |", fmt_ns(p.hash_lookup));
    println!("| `Map::lookup` hash, 1k hot keys | {} |", fmt_ns(p.hash_lookup_hot));

    println!();
    println!("## Counters: lookup of key 0 + increment (the keyed one: + update), N per run");
    println!();
    println!("| counter | 1 thread ns/inc | 2 threads ns/inc | increments expected | counted | lost |");
    println!("|---|---:|---:|---:|---:|---|");
    for c in &counters {
        let lost = if c.counted == c.expected {
            "no lost updates".to_string()
        } else if c.counted < c.expected {
            format!(
                "{} lost ({:.1}%)",
                fmt_count(c.expected - c.counted),
                100.0 * (c.expected - c.counted) as f64 / c.expected as f64
            )
        } else {
            format!("{} too many", fmt_count(c.counted - c.expected))
        };
        println!(
            "| {} | {} | {} | {} | {} | {} |",
            c.name,
            fmt_ns(c.one.ns),
            fmt_ns(c.two.ns),
            fmt_count(c.expected),
            fmt_count(c.counted),
            lost
        );
    }
    println!();
    println!(
        "(Lost updates on the plain array with a plain add are expected: two threads read-modify-write one word.)"
    );

    println!();
    println!("## Ring buffer: one producer program ({} ms per row, 1 MiB ring)", rb_dur.as_millis());
    println!();
    println!(
        "Produced events/s: records written per second of program run time; consumed events/s: records read per second \
         of the consumer's time (drained between runs: per second of draining). A record that finds no room is dropped \
         (the helper returns -EAGAIN / reserve returns NULL)."
    );
    println!();
    println!(
        "| workload | produced events/s | consumed events/s | ns per produce call | dropped (no room) | consumed = produced | futex wakeups |"
    );
    println!("|---|---:|---:|---:|---:|---|---:|");
    for r in &rb_results {
        let ok = if r.consumed == r.produced && r.bad_records == 0 {
            "yes".to_string()
        } else {
            format!("NO: {} consumed, {} produced, {} bad lengths", r.consumed, r.produced, r.bad_records)
        };
        println!(
            "| {} | {} | {} | {} | {} ({:.2}%) | {}{} | {} |",
            r.name,
            fmt_count((r.produced as f64 / r.producer_s) as u64),
            fmt_count((r.consumed as f64 / r.consumer_s) as u64),
            fmt_ns(r.producer_s * 1e9 / r.attempted.max(1) as f64),
            fmt_count(r.dropped),
            100.0 * r.dropped as f64 / r.attempted.max(1) as f64,
            ok,
            if r.skipped > 0 { format!(", {} runs skipped", r.skipped) } else { String::new() },
            fmt_count(r.wakeups),
        );
    }

    // ---- targets ----
    let find = |map: &str, op: &str| rows.iter().find(|r| r.map == map && r.op.starts_with(op));
    let verdict = |ok: bool| if ok { "met" } else { "NOT met" };
    let arr = find("array", "lookup").unwrap();
    let hl = find("hash", "lookup (64k").unwrap();
    let pc = &counters[0];
    let arr_ok = arr.one.ns <= TARGET_ARRAY_LOOKUP_NS;
    let hash_ok = hl.one.ns <= TARGET_HASH_LOOKUP_NS;
    let no_loss = pc.counted == pc.expected;
    let pc_ok = pc.two.ns <= TARGET_PERCPU_INC_NS && no_loss;
    println!();
    println!("Targets (this run):");
    println!(
        "- array lookup ≤ {TARGET_ARRAY_LOOKUP_NS} ns: {} ns (1 thread), {} ns (2 threads): {}",
        fmt_ns(arr.one.ns),
        fmt_ns(arr.two.ns),
        verdict(arr_ok)
    );
    println!(
        "- hash lookup, 8-byte key, half load ≤ {TARGET_HASH_LOOKUP_NS} ns: {} ns (1 thread), {} ns (2 threads): {}",
        fmt_ns(hl.one.ns),
        fmt_ns(hl.two.ns),
        verdict(hash_ok)
    );
    println!(
        "- per-CPU counter increment ≤ {TARGET_PERCPU_INC_NS} ns with no lost updates across 2 threads: {} ns (2 threads), {}: {}",
        fmt_ns(pc.two.ns),
        if no_loss {
            "no lost updates".to_string()
        } else {
            format!("{} updates LOST", pc.expected.abs_diff(pc.counted))
        },
        verdict(pc_ok)
    );
    println!("This run: {}.", if arr_ok && hash_ok && pc_ok { "all targets met" } else { "targets NOT all met" });
    println!("(whole benchmark: {:.1} s)", started.elapsed().as_secs_f64());
}

/// `get_next_key` iteration step: the key after `cur` (the first key if None) into `out`.
fn map_next(m: &Map, cur: Option<&[u8; 8]>, out: &mut [u8; 8]) -> bool {
    m.get_next_key(cur.map(|k| &k[..]), out).is_ok()
}
