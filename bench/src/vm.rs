//! `vm-bench`: nanoseconds per executed eBPF instruction, interpreter and JIT side by side.
//!
//! Each workload is a loop whose iteration count the program takes from r1. The number of
//! instructions one run executes is counted exactly once by `Interpreter::run_counted`; each
//! executor is then timed over several runs after a warm-up run, and the median is reported.
//! The program only reports: it never fails because of timing.

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use userbpf_isa::*;
use userbpf_vm::{Helper, HelperRegistry, Interpreter, JitProgram, LoadOptions, Program, Region, VmError};

/// Timed runs per executor (after one warm-up run).
const REPS: usize = 7;
/// Timed runs of the JIT (its runs are short).
const JIT_REPS: usize = 15;
/// Longest an interpreter run of one workload should take (the iteration count shrinks to fit).
const TARGET_RUN: Duration = Duration::from_millis(250);
/// Size of the buffer the memory workload works on.
const BUF_LEN: usize = 64;
const HELPER_ID: u32 = 1;

const TARGET_INTERP_NS: f64 = 3.0;
const TARGET_JIT_NS: f64 = 0.3;
const TARGET_SPEEDUP: f64 = 20.0;

#[inline(never)]
unsafe extern "C" fn helper_add(a: u64, b: u64, _: u64, _: u64, _: u64) -> u64 {
    a.wrapping_add(b)
}

// Instruction builders.
fn alu64_k(op: u8, dst: u8, imm: i32) -> Insn {
    Insn::new(BPF_ALU64 | BPF_K | op, dst, 0, 0, imm)
}
fn alu64_x(op: u8, dst: u8, src: u8) -> Insn {
    Insn::new(BPF_ALU64 | BPF_X | op, dst, src, 0, 0)
}
fn alu32_x(op: u8, dst: u8, src: u8) -> Insn {
    Insn::new(BPF_ALU | BPF_X | op, dst, src, 0, 0)
}
fn ldx(size: u8, dst: u8, src: u8, off: i16) -> Insn {
    Insn::new(BPF_LDX | BPF_MEM | size, dst, src, off, 0)
}
fn stx(size: u8, dst: u8, src: u8, off: i16) -> Insn {
    Insn::new(BPF_STX | BPF_MEM | size, dst, src, off, 0)
}
fn st(size: u8, dst: u8, off: i16, imm: i32) -> Insn {
    Insn::new(BPF_ST | BPF_MEM | size, dst, 0, off, imm)
}
fn exit() -> Insn {
    Insn::new(OP_EXIT, 0, 0, 0, 0)
}

/// Appends the loop end: `r6 -= 1; if r6 != 0 goto top`.
fn close_loop(p: &mut Vec<Insn>, top: usize) {
    p.push(alu64_k(BPF_ADD, 6, -1));
    let rel = top as i64 - (p.len() as i64 + 1);
    p.push(Insn::new(BPF_JMP | BPF_K | BPF_JNE, 6, 0, rel as i16, 0));
}

/// A tight loop of ALU operations on four independent accumulators (r0, r2, r3, r4), as
/// hashing or checksum code has them: the CPU can overlap the chains.
fn alu_loop() -> Vec<Insn> {
    let mut p = vec![
        alu64_x(BPF_MOV, 6, 1),
        alu64_k(BPF_MOV, 0, 0),
        alu64_k(BPF_MOV, 2, 1),
        alu64_k(BPF_MOV, 3, 0x12345),
        alu64_k(BPF_MOV, 4, 7),
    ];
    let top = p.len();
    p.extend([
        alu64_x(BPF_ADD, 0, 6),
        alu64_k(BPF_ADD, 2, 0x1234),
        alu64_x(BPF_XOR, 3, 6),
        alu64_k(BPF_SUB, 4, 7),
        alu64_k(BPF_XOR, 0, 0x5a5a),
        alu64_k(BPF_LSH, 2, 3),
        alu64_k(BPF_ADD, 3, 0x777),
        alu64_k(BPF_OR, 4, 0x100),
        alu64_k(BPF_RSH, 0, 1),
        alu64_x(BPF_XOR, 2, 6),
        alu32_x(BPF_ADD, 3, 6),
        alu64_x(BPF_XOR, 4, 6),
    ]);
    close_loop(&mut p, top);
    p.extend([alu64_x(BPF_ADD, 0, 2), alu64_x(BPF_ADD, 0, 3), alu64_x(BPF_ADD, 0, 4), exit()]);
    p
}

/// A tight loop of ALU operations forming one chain of dependent operations (with a
/// multiply): bound by the latency of each operation, not by instruction throughput.
fn alu_chain_loop() -> Vec<Insn> {
    let mut p =
        vec![alu64_x(BPF_MOV, 6, 1), alu64_k(BPF_MOV, 0, 0), alu64_k(BPF_MOV, 2, 1), alu64_k(BPF_MOV, 3, 0x12345)];
    let top = p.len();
    p.extend([
        alu64_x(BPF_ADD, 0, 2),
        alu64_x(BPF_XOR, 2, 0),
        alu64_k(BPF_LSH, 2, 5),
        alu64_x(BPF_ADD, 2, 6),
        alu64_k(BPF_MUL, 3, 33),
        alu32_x(BPF_ADD, 3, 0),
        alu64_k(BPF_RSH, 0, 1),
        alu64_x(BPF_SUB, 0, 3),
    ]);
    close_loop(&mut p, top);
    p.push(exit());
    p
}

/// Loads and stores of several sizes on the stack.
fn stack_loop() -> Vec<Insn> {
    let mut p = vec![alu64_x(BPF_MOV, 6, 1), alu64_k(BPF_MOV, 0, 0), st(BPF_DW, 10, -8, 0), st(BPF_DW, 10, -16, 1)];
    let top = p.len();
    p.extend([
        ldx(BPF_DW, 2, 10, -8),
        alu64_x(BPF_ADD, 2, 6),
        stx(BPF_DW, 10, 2, -8),
        ldx(BPF_W, 3, 10, -16),
        alu32_x(BPF_XOR, 3, 2),
        stx(BPF_W, 10, 3, -16),
        stx(BPF_B, 10, 3, -24),
        ldx(BPF_B, 4, 10, -24),
        alu64_x(BPF_ADD, 0, 4),
    ]);
    close_loop(&mut p, top);
    p.push(exit());
    p
}

/// Loads and stores through a computed pointer into a buffer (r2) the run is given.
fn buffer_loop() -> Vec<Insn> {
    let mut p = vec![alu64_x(BPF_MOV, 6, 1), alu64_x(BPF_MOV, 9, 2), alu64_k(BPF_MOV, 0, 0)];
    let top = p.len();
    p.extend([
        alu64_x(BPF_MOV, 3, 6),
        alu64_k(BPF_AND, 3, (BUF_LEN - 8) as i32 & !7),
        alu64_x(BPF_ADD, 3, 9),
        ldx(BPF_DW, 4, 3, 0),
        alu64_x(BPF_ADD, 4, 6),
        stx(BPF_DW, 3, 4, 0),
        alu64_x(BPF_ADD, 0, 4),
    ]);
    close_loop(&mut p, top);
    p.push(exit());
    p
}

/// A helper call per iteration.
fn helper_loop() -> Vec<Insn> {
    let mut p = vec![alu64_x(BPF_MOV, 6, 1), alu64_k(BPF_MOV, 7, 0)];
    let top = p.len();
    p.extend([
        alu64_x(BPF_MOV, 1, 7),
        alu64_x(BPF_MOV, 2, 6),
        Insn::new(OP_CALL, 0, 0, 0, HELPER_ID as i32),
        alu64_x(BPF_ADD, 7, 0),
    ]);
    close_loop(&mut p, top);
    p.extend([alu64_x(BPF_MOV, 0, 7), exit()]);
    p
}

/// A bpf-to-bpf call per iteration, to a function that uses its stack.
fn call_loop() -> Vec<Insn> {
    let mut p = vec![alu64_x(BPF_MOV, 6, 1), alu64_k(BPF_MOV, 7, 0)];
    let top = p.len();
    p.extend([alu64_x(BPF_MOV, 1, 7), alu64_x(BPF_MOV, 2, 6)]);
    let call_at = p.len();
    p.push(Insn::new(OP_CALL, 0, BPF_PSEUDO_CALL, 0, 0));
    p.push(alu64_x(BPF_MOV, 7, 0));
    close_loop(&mut p, top);
    p.extend([alu64_x(BPF_MOV, 0, 7), exit()]);
    let func = p.len();
    p[call_at].imm = (func - (call_at + 1)) as i32;
    p.extend([
        stx(BPF_DW, 10, 2, -8),
        alu64_x(BPF_MOV, 0, 1),
        ldx(BPF_DW, 3, 10, -8),
        alu64_x(BPF_ADD, 0, 3),
        alu64_k(BPF_XOR, 0, 0x55),
        exit(),
    ]);
    p
}

struct Workload {
    name: &'static str,
    insns: Vec<Insn>,
    /// Iterations of the loop before scaling down to fit `TARGET_RUN`.
    iterations: u64,
    /// Whether r2 is a buffer the program reads and writes.
    uses_buffer: bool,
}

struct Row {
    name: &'static str,
    insns: u64,
    interp_ns: Option<f64>,
    jit_ns: Option<f64>,
    note: Option<String>,
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn time_runs(reps: usize, mut f: impl FnMut() -> Result<u64, VmError>) -> (Duration, Result<u64, VmError>) {
    let mut last = f(); // warm-up
    let mut times = Vec::with_capacity(reps);
    for _ in 0..reps {
        let t = Instant::now();
        last = black_box(f());
        times.push(t.elapsed());
    }
    (median(times), last)
}

fn bench(w: &Workload, options: &LoadOptions) -> Row {
    let prog = match Program::load(&w.insns, options, None) {
        Ok(p) => Arc::new(p),
        Err(e) => {
            return Row {
                name: w.name,
                insns: 0,
                interp_ns: None,
                jit_ns: None,
                note: Some(format!("does not load: {e}")),
            };
        }
    };
    let interp = Interpreter::new(prog.clone());
    let mut buf = vec![0u8; BUF_LEN];
    let buf_ptr = buf.as_mut_ptr();
    let regions = if w.uses_buffer { vec![Region::of_mut(&mut buf)] } else { Vec::new() };
    let r2 = if w.uses_buffer { buf_ptr as u64 } else { 0 };
    // Every run starts from a zeroed buffer, so that all runs compute the same result.
    // SAFETY: `buf` lives (and is not otherwise borrowed) until the end of this function.
    let reset = || unsafe { std::ptr::write_bytes(buf_ptr, 0, BUF_LEN) };

    // Scale the iteration count so that one interpreter run takes about TARGET_RUN.
    let probe = (w.iterations / 100).max(1000);
    let fastest = (0..3)
        .map(|_| {
            reset();
            let t = Instant::now();
            let _ = black_box(interp.run(black_box(probe), r2, &regions));
            t.elapsed()
        })
        .min()
        .unwrap();
    let per_iter = fastest.as_secs_f64() / probe as f64;
    let fit = (TARGET_RUN.as_secs_f64() / per_iter.max(1e-12)) as u64;
    let n = w.iterations.min(fit).max(probe);
    let n = if n >= 100_000 { n / 100_000 * 100_000 } else { n };

    reset();
    let (counted, insns) = interp.run_counted(n, r2, &regions);
    let mut note = None;
    if let Err(e) = &counted {
        note = Some(format!("interpreter: {e}"));
    }
    let (t_interp, r_interp) = time_runs(REPS, || {
        reset();
        interp.run(black_box(n), black_box(r2), &regions)
    });
    let interp_ns = Some(t_interp.as_nanos() as f64 / insns as f64);

    let jit_ns = match JitProgram::compile(prog) {
        Ok(jit) => {
            // SAFETY: the workloads touch only their stack and, for the memory workload, the
            // BUF_LEN bytes at r2 (masked offsets), which `buf` provides.
            let (t_jit, r_jit) = time_runs(JIT_REPS, || {
                reset();
                // SAFETY: as said above: the workload stays inside `buf` and its stack.
                unsafe { jit.run(black_box(n), black_box(r2)) }
            });
            if r_jit != r_interp {
                note = Some(format!("results differ: interpreter {r_interp:x?}, JIT {r_jit:x?}"));
            }
            Some(t_jit.as_nanos() as f64 / insns as f64)
        }
        Err(e) => {
            note = Some(format!("JIT: {e}"));
            None
        }
    };
    drop(regions);
    black_box(&mut buf);
    Row { name: w.name, insns, interp_ns, jit_ns, note }
}

fn fmt_ns(v: Option<f64>) -> String {
    v.map_or("n/a".to_string(), |v| format!("{v:.3}"))
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

fn main() {
    let started = Instant::now();
    let mut reg = HelperRegistry::new();
    reg.register(Helper { id: HELPER_ID, name: "bench_add", func: helper_add, may_exit: false });
    let options = LoadOptions { helpers: Arc::new(reg), memory: None, allow_callx: false };

    let workloads = [
        Workload {
            name: "ALU loop (4 independent chains)",
            insns: alu_loop(),
            iterations: 10_000_000,
            uses_buffer: false,
        },
        Workload {
            name: "ALU loop (1 dependent chain)",
            insns: alu_chain_loop(),
            iterations: 10_000_000,
            uses_buffer: false,
        },
        Workload { name: "stack load/store loop", insns: stack_loop(), iterations: 10_000_000, uses_buffer: false },
        Workload { name: "buffer load/store loop", insns: buffer_loop(), iterations: 10_000_000, uses_buffer: true },
        Workload { name: "helper call loop", insns: helper_loop(), iterations: 10_000_000, uses_buffer: false },
        Workload { name: "bpf-to-bpf call loop", insns: call_loop(), iterations: 10_000_000, uses_buffer: false },
    ];

    let rows: Vec<Row> = workloads.iter().map(|w| bench(w, &options)).collect();

    println!("## userbpf VM: ns per executed eBPF instruction (median of {REPS} interpreter / {JIT_REPS} JIT runs)");
    println!();
    if let Ok(load) = std::fs::read_to_string("/proc/loadavg") {
        let load: Vec<&str> = load.split_whitespace().take(3).collect();
        let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
        println!("Load average {} on {cpus} CPUs (timings are noisy on a busy machine).", load.join(" "));
        println!();
    }
    println!("| workload | instructions | interpreter ns/insn | JIT ns/insn | JIT speed-up |");
    println!("|---|---:|---:|---:|---:|");
    for r in &rows {
        let speedup = match (r.interp_ns, r.jit_ns) {
            (Some(i), Some(j)) if j > 0.0 => format!("{:.1}×", i / j),
            _ => "n/a".to_string(),
        };
        println!(
            "| {} | {} | {} | {} | {} |",
            r.name,
            fmt_count(r.insns),
            fmt_ns(r.interp_ns),
            fmt_ns(r.jit_ns),
            speedup
        );
    }
    let notes: Vec<String> =
        rows.iter().filter_map(|r| r.note.as_ref().map(|n| format!("- {}: {n}", r.name))).collect();
    if !notes.is_empty() {
        println!();
        println!("Notes:");
        for n in notes {
            println!("{n}");
        }
    }

    let alu = &rows[0];
    let verdict = |ok: Option<bool>| match ok {
        Some(true) => "met",
        Some(false) => "NOT met",
        None => "not measured",
    };
    let interp_ok = alu.interp_ns.map(|v| v <= TARGET_INTERP_NS);
    let jit_ok = alu.jit_ns.map(|v| v <= TARGET_JIT_NS);
    let speedup = alu.interp_ns.zip(alu.jit_ns).map(|(i, j)| i / j);
    let speedup_ok = speedup.map(|s| s >= TARGET_SPEEDUP);
    let all = match (interp_ok, jit_ok, speedup_ok) {
        (Some(a), Some(b), Some(c)) => Some(a && b && c),
        (Some(false), _, _) | (_, Some(false), _) | (_, _, Some(false)) => Some(false),
        _ => None,
    };
    println!();
    println!(
        "Targets on the ALU loop (4 independent chains): interpreter ≤ {TARGET_INTERP_NS} ns/insn ({}: {}), JIT ≤ {TARGET_JIT_NS} ns/insn ({}: {}), \
         JIT ≥ {TARGET_SPEEDUP}× faster ({}: {}). This run: {}.",
        fmt_ns(alu.interp_ns),
        verdict(interp_ok),
        fmt_ns(alu.jit_ns),
        verdict(jit_ok),
        speedup.map_or("n/a".to_string(), |s| format!("{s:.1}×")),
        verdict(speedup_ok),
        match all {
            Some(true) => "all targets met",
            Some(false) => "targets NOT all met",
            None => "targets not all measured",
        }
    );
    println!("(whole benchmark: {:.1} s)", started.elapsed().as_secs_f64());
}
