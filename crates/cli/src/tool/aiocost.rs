//! `userbpf tool aiocost`: what each async-I/O interface costs. The bundled benchmark
//! (tools/aiocost/aiobench.c, built by the Makefile beside the tools' objects) does the same
//! batched random 4 KiB reads of a file opened with O_DIRECT through io_uring, native aio
//! (libaio) and POSIX aio (glibc), with USDT probes at the boundaries of each iteration's
//! phases (submit, poll, and for io_uring clear). After a short warm-up run that creates the
//! file, it runs rounds (`--rounds`) of three runs side by side: untraced, with the probes
//! served by userbpf inside the process (tools/aiocost.bpf.c), and with the same probes
//! through the kernel (bpftrace's USDT uprobes, on a private copy of the benchmark so that no
//! other process mapping it gets the kernel's breakpoints). For each tracer it prints, per
//! interface, the mean time of an iteration over every round and each phase's share of it
//! (the shares add up to at most 1: the phases partition the iteration); then the medians of
//! the benchmark's own time per iteration in each kind of run, so that what each tracer adds
//! shows (on a disk whose times wander, only beyond that noise). `--svg FILE` draws both as
//! charts (crate `userbpf-plot`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};

use super::{Common, Target, Tracer, conclude, tool_file};

#[derive(clap::Args)]
pub struct Args {
    /// Iterations per interface.
    #[arg(short = 'n', long, default_value_t = 200)]
    iterations: u32,
    /// Reads per iteration (the batch submitted at once).
    #[arg(short = 'b', long, default_value_t = 32)]
    batch: u32,
    /// The file to read (created, SIZE_MB long, when missing or shorter; its file system must
    /// support O_DIRECT, which tmpfs does not).
    #[arg(long, default_value = "aiocost.dat")]
    file: PathBuf,
    /// Size of the file, in MiB.
    #[arg(long, default_value_t = 64)]
    size_mb: u32,
    /// Interfaces to measure, among io_uring, libaio, posix.
    #[arg(long, default_value = "io_uring,libaio,posix")]
    interfaces: String,
    /// Rounds of the three runs (untraced, userbpf, kernel), side by side; the benchmark's own
    /// times are compared as medians, the tables cover every round's iterations.
    #[arg(long, default_value_t = 3)]
    rounds: u32,
    /// Leave out the kernel's run (bpftrace, which needs root).
    #[arg(long)]
    no_kernel: bool,
    /// Run the programs in the interpreter instead of the JIT.
    #[arg(long)]
    interpreter: bool,
    /// At the end, draw the results into FILE (SVG): the benchmark's own time per iteration
    /// untraced, through userbpf and through the kernel, per interface; then each phase's
    /// share of an iteration per interface and tracer.
    #[arg(long, value_name = "FILE")]
    svg: Option<PathBuf>,
}

const IFACES: [&str; 3] = ["io_uring", "native aio", "posix aio"];
const PHASES: [&str; 3] = ["submit", "poll", "clear"];
/// Slot of the whole iteration (after the three phases) in each interface's four.
const ITER: usize = 3;

/// Nanoseconds and counts by slot (interface * 4 + phase, phase 3 the iteration).
type Costs = BTreeMap<usize, (u64, u64)>;

/// The benchmark's own times of every run, by interface.
type Own = BTreeMap<usize, Vec<f64>>;

fn collect(all: &mut Own, one: BTreeMap<usize, f64>) {
    for (i, v) in one {
        all.entry(i).or_default().push(v);
    }
}

fn merge(all: &mut Costs, one: Costs) {
    for (k, (ns, n)) in one {
        let e = all.entry(k).or_default();
        e.0 += ns;
        e.1 += n;
    }
}

fn median(v: Option<&Vec<f64>>) -> Option<f64> {
    let mut v = v?.clone();
    if v.is_empty() {
        return None;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    Some(v[v.len() / 2])
}

/// The benchmark's own report: microseconds per iteration, by interface.
fn own_times(out: &str) -> BTreeMap<usize, f64> {
    let mut m = BTreeMap::new();
    for line in out.lines() {
        let Some(rest) = line.strip_prefix("aiobench: ") else { continue };
        let Some((name, tail)) = rest.split_once(": ") else { continue };
        let Some(i) = IFACES.iter().position(|n| *n == name) else { continue };
        if let Some(us) = tail.split(", ").nth(1).and_then(|t| t.split_whitespace().next()).and_then(|v| v.parse().ok())
        {
            m.insert(i, us);
        }
    }
    m
}

fn table(title: &str, costs: &Costs) -> String {
    let mut s = format!("{title}\n");
    for (i, name) in IFACES.iter().enumerate() {
        let Some(&(iter_ns, n)) = costs.get(&(i * 4 + ITER)) else { continue };
        if n == 0 {
            continue;
        }
        let phases: Vec<usize> = (0..3).filter(|p| costs.get(&(i * 4 + p)).is_some_and(|&(_, c)| c > 0)).collect();
        s += &format!("{name}   ({n} iterations)\n      total cost(us)");
        for &p in &phases {
            s += &format!("   {:>11}", format!("{} cost", PHASES[p]));
        }
        s += &format!("\n      {:>14.0}", iter_ns as f64 / n as f64 / 1e3);
        for &p in &phases {
            let share = costs[&(i * 4 + p)].0 as f64 / iter_ns as f64;
            s += &format!("   {share:>11.4}");
        }
        s.push('\n');
    }
    s
}

fn bench_args(a: &Args, file: &Path) -> Vec<String> {
    vec![
        "-n".into(),
        a.iterations.to_string(),
        "-b".into(),
        a.batch.to_string(),
        "-s".into(),
        a.size_mb.to_string(),
        "-i".into(),
        a.interfaces.clone(),
        file.display().to_string(),
    ]
}

fn run_plain(bench: &Path, args: &[String]) -> Result<String> {
    let out = Command::new(bench)
        .args(args)
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("running {}", bench.display()))?;
    if !out.status.success() {
        bail!("{} failed ({})", bench.display(), out.status);
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The benchmark with its probes served by userbpf: the costs and the benchmark's output.
fn run_userbpf(a: &Args, bench: &Path, args: &[String]) -> Result<(Costs, String)> {
    let mut cmd = vec![bench.display().to_string()];
    cmd.extend(args.iter().cloned());
    let mut tracer = Tracer::new("aiocost", Target::Command(cmd), a.interpreter)?;
    for probe in ["phase", "done"] {
        tracer.probe_usdt(probe, bench, &format!("aiocost:{probe}"))?;
    }
    let out_path = std::env::temp_dir().join(format!("userbpf-aiocost-{}.out", std::process::id()));
    let out_file = std::fs::File::create(&out_path).with_context(|| format!("creating {}", out_path.display()))?;
    tracer.stdout = Some(Stdio::from(out_file));
    let mut running = tracer.start()?;
    let common = Common {
        pid: None,
        interval: None,
        duration: None,
        timestamp: false,
        interpreter: a.interpreter,
        command: Vec::new(),
    };
    let end = running.run(
        &common,
        |d| {
            std::thread::sleep(d);
            Ok(false)
        },
        || Ok(()),
    )?;
    let failed = conclude(&mut tracer, &mut running, end);
    let out = std::fs::read_to_string(&out_path).unwrap_or_default();
    let _ = std::fs::remove_file(&out_path);
    if failed.is_some() {
        bail!("the benchmark failed under userbpf:\n{out}");
    }
    let map = tracer.map("cost")?;
    let mut costs = Costs::new();
    let mut v = [0u8; 16];
    for slot in 0..12u32 {
        map.lookup_elem(&slot.to_ne_bytes(), &mut v)?;
        let ns = u64::from_ne_bytes(v[..8].try_into().unwrap_or([0; 8]));
        let n = u64::from_ne_bytes(v[8..].try_into().unwrap_or([0; 8]));
        costs.insert(slot as usize, (ns, n));
    }
    Ok((costs, out))
}

/// The same probes through the kernel: bpftrace on a private copy of the benchmark.
fn run_kernel(bench: &Path, args: &[String]) -> Result<(Costs, String)> {
    let dir = std::env::temp_dir().join(format!("userbpf-aiocost-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let copy = dir.join("aiobench");
    std::fs::copy(bench, &copy).with_context(|| format!("copying {} to {}", bench.display(), copy.display()))?;
    let c = copy.display();
    let script = format!(
        "usdt:{c}:aiocost:phase {{ if (arg1 == 0) {{ @start[tid] = nsecs; }} else {{ $d = nsecs - @since[tid]; @ns[arg0 * 4 + @phase[tid]] = sum($d); @n[arg0 * 4 + @phase[tid]] = count(); }} @phase[tid] = arg1; @since[tid] = nsecs; }}
usdt:{c}:aiocost:done {{ $now = nsecs; @ns[arg0 * 4 + @phase[tid]] = sum($now - @since[tid]); @n[arg0 * 4 + @phase[tid]] = count(); @ns[arg0 * 4 + 3] = sum($now - @start[tid]); @n[arg0 * 4 + 3] = count(); }}
END {{ clear(@start); clear(@since); clear(@phase); }}"
    );
    let mut cmdline = format!("{c}");
    for a in args {
        cmdline += &format!(" {a}");
    }
    let out = Command::new("bpftrace").arg("-e").arg(&script).arg("-c").arg(&cmdline).output();
    let _ = std::fs::remove_dir_all(&dir);
    let out = out.context("running bpftrace (Debian's bpftrace package)")?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        bail!("bpftrace failed ({}): {}", out.status, String::from_utf8_lossy(&out.stderr).trim());
    }
    let mut costs = Costs::new();
    for line in text.lines() {
        let parse = |prefix: &str| -> Option<(usize, u64)> {
            let rest = line.strip_prefix(prefix)?;
            let (slot, v) = rest.split_once("]: ")?;
            Some((slot.parse().ok()?, v.trim().parse().ok()?))
        };
        if let Some((slot, ns)) = parse("@ns[") {
            costs.entry(slot).or_default().0 = ns;
        } else if let Some((slot, n)) = parse("@n[") {
            costs.entry(slot).or_default().1 = n;
        }
    }
    if costs.is_empty() {
        bail!("bpftrace printed no costs:\n{text}{}", String::from_utf8_lossy(&out.stderr));
    }
    Ok((costs, text))
}

pub fn run(a: Args) -> Result<()> {
    for i in a.interfaces.split(',') {
        if !["io_uring", "libaio", "posix"].contains(&i) {
            bail!("--interfaces: `{i}` is not one of io_uring, libaio, posix");
        }
    }
    if let Some(path) = &a.svg {
        userbpf_plot::check_writable(path)?;
    }
    let bench = std::fs::canonicalize(tool_file("aiobench")?)?;
    let file = if a.file.is_absolute() { a.file.clone() } else { std::env::current_dir()?.join(&a.file) };
    let args = bench_args(&a, &file);
    println!(
        "aiocost: {} iterations of {} random 4 KiB O_DIRECT reads of {} ({} MiB) per interface",
        a.iterations,
        a.batch,
        file.display(),
        a.size_mb
    );
    // A short run first creates the file and warms the caches, outside the measured runs.
    let mut warm = args.clone();
    warm[1] = a.iterations.min(5).to_string();
    run_plain(&bench, &warm)?;
    // Rounds of untraced, userbpf, kernel runs, side by side: a disk's times wander more
    // than any probe costs, so the benchmark's own times are compared as medians.
    let (mut base, mut ours_own, mut kern_own): (Own, Own, Own) = Default::default();
    let (mut ours, mut kern) = (Costs::new(), Costs::new());
    let mut kernel_error = a.no_kernel.then(|| "--no-kernel".to_string());
    for _ in 0..a.rounds.max(1) {
        collect(&mut base, own_times(&run_plain(&bench, &args)?));
        let (c, out) = run_userbpf(&a, &bench, &args)?;
        merge(&mut ours, c);
        collect(&mut ours_own, own_times(&out));
        if kernel_error.is_none() {
            match run_kernel(&bench, &args) {
                Ok((c, out)) => {
                    merge(&mut kern, c);
                    collect(&mut kern_own, own_times(&out));
                }
                Err(e) => kernel_error = Some(format!("{e:#}")),
            }
        }
    }
    println!();
    print!("{}", table("through userbpf (USDT probes run in the process):", &ours));
    match &kernel_error {
        None => {
            println!();
            print!("{}", table("through the kernel (bpftrace, USDT uprobes):", &kern));
        }
        Some(e) => println!("\nthe kernel's run was not made: {e}"),
    }
    println!(
        "\nthe benchmark's own time per iteration (us), median of {} run{} each:",
        a.rounds.max(1),
        if a.rounds > 1 { "s" } else { "" }
    );
    println!(
        "{:<12} {:>10} {:>18} {:>18}",
        "",
        "untraced",
        "userbpf",
        if kernel_error.is_none() { "kernel" } else { "" }
    );
    let rel = |v: Option<f64>, b: f64| {
        v.map_or_else(|| "-".to_string(), |v| format!("{v:.1} ({:+.1}%)", (v / b - 1.0) * 100.0))
    };
    for (i, name) in IFACES.iter().enumerate() {
        let Some(b) = median(base.get(&i)) else { continue };
        let k = if kernel_error.is_none() { rel(median(kern_own.get(&i)), b) } else { String::new() };
        println!("{name:<12} {b:>10.1} {:>18} {k:>18}", rel(median(ours_own.get(&i)), b));
    }
    if let Some(path) = &a.svg {
        let kernel = kernel_error.is_none();
        let charts = charts(a.rounds.max(1), &[&base, &ours_own, &kern_own], &ours, kernel.then_some(&kern));
        userbpf_plot::write_svg(path, &charts)?;
        eprintln!("userbpf: {} charts written to {}", charts.len(), path.display());
    }
    Ok(())
}

/// `--svg`'s charts: the benchmark's own medians per interface (untraced, userbpf, kernel),
/// then the phases' shares per interface and tracer.
fn charts(rounds: u32, own: &[&Own; 3], ours: &Costs, kern: Option<&Costs>) -> Vec<userbpf_plot::Chart> {
    use userbpf_plot::{Bars, Chart, Series};
    let ifaces: Vec<usize> = (0..IFACES.len()).filter(|i| own[0].contains_key(i)).collect();
    let runs = ["untraced", "userbpf", "kernel"];
    let series = (0..if kern.is_some() { 3 } else { 2 })
        .map(|r| Series { name: runs[r].to_string(), values: ifaces.iter().map(|i| median(own[r].get(i))).collect() })
        .collect();
    let times = Bars {
        title: format!(
            "aiocost: the benchmark's own time per iteration, median of {rounds} run{}",
            if rounds == 1 { "" } else { "s" }
        ),
        unit: "us per iteration".into(),
        categories: ifaces.iter().map(|&i| IFACES[i].to_string()).collect(),
        series,
        log: Some(false),
    };
    let mut rows: Vec<(String, &Costs, usize)> = Vec::new();
    for &i in &ifaces {
        rows.push((format!("{} · userbpf", IFACES[i]), ours, i));
        if let Some(k) = kern {
            rows.push((format!("{} · kernel", IFACES[i]), k, i));
        }
    }
    let rows: Vec<_> =
        rows.into_iter().filter(|(_, c, i)| c.get(&(i * 4 + ITER)).is_some_and(|&(ns, _)| ns > 0)).collect();
    let shares = Bars {
        title: "aiocost: each phase's share of an iteration, through userbpf and the kernel".into(),
        unit: "% of the iteration".into(),
        categories: rows.iter().map(|r| r.0.clone()).collect(),
        series: PHASES
            .iter()
            .enumerate()
            .map(|(p, name)| Series {
                name: name.to_string(),
                values: rows
                    .iter()
                    .map(|(_, c, i)| {
                        let iter_ns = c[&(i * 4 + ITER)].0 as f64;
                        c.get(&(i * 4 + p)).filter(|&&(_, n)| n > 0).map(|&(ns, _)| ns as f64 / iter_ns * 100.0)
                    })
                    .collect(),
            })
            .collect(),
        log: Some(false),
    };
    vec![Chart::Bars(times), Chart::Bars(shares)]
}
