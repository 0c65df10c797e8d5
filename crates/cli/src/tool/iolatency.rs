//! `userbpf tool iolatency [-f BIN:FUNC]... -- CMD`: block request latency histograms per
//! device and operation, each request attributed to the user function that issued it, beside
//! the kernel's totals (examples/bpf/iolatency.bpf.c). The uprobes run in the command's
//! processes (userbpf's inline hooks) and mark the thread in an array shared with the kernel
//! (its values mapped into the processes: no system call per mark); the block tracepoints run
//! in the kernel, read the mark when a bio is queued, and fill the histograms, which are read
//! back through `bpf()`.
//!
//! Functions: `-f BIN:FUNC` (globs allowed), each a histogram of its own; by default libc's
//! `pread64`, `pwrite64`, `preadv`, `pwritev`, `preadv2`, `pwritev2`, `read`, `write`,
//! `fsync`, `fdatasync`, and fio's `td_io_queue` when the command is fio. The outermost probed
//! function on a thread keeps the mark (fio's `td_io_queue` calling `pwrite64`:
//! `td_io_queue`). Requests issued by no probed function (the kernel's own writeback, a loop
//! device's worker) count only in the kernel's totals. `--svg FILE` draws the histograms of
//! the whole run at the end, one chart each, the functions' then the kernel's totals (crate
//! `userbpf-plot`).

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::{Result, bail};

use super::{Common, Func, Target, Tracer, conclude, match_functions, resolve_bin, split_spec, time_of_day};

#[derive(clap::Args)]
pub struct Args {
    /// `BIN:FUNC` whose I/O to attribute (repeatable; FUNC may be a glob). Default: libc's
    /// read/write family and sync calls, and fio's `td_io_queue` for fio.
    #[arg(short = 'f', long = "func", value_name = "BIN:FUNC")]
    funcs: Vec<String>,
    /// At the end, draw the histograms of the whole run into FILE (SVG, one chart per
    /// function, disk and operation, then the kernel's totals).
    #[arg(long, value_name = "FILE")]
    svg: Option<PathBuf>,
    #[command(flatten)]
    common: Common,
}

/// The id the program counts the kernel's totals under.
const KERNEL_TOTAL: u32 = u32::MAX;
const DEFAULT_LIBC: &[&str] =
    &["pread64", "pwrite64", "preadv", "pwritev", "preadv2", "pwritev2", "read", "write", "fsync", "fdatasync"];

fn op_name(op: u32) -> &'static str {
    match op {
        1 => "read",
        2 => "write",
        3 => "flush",
        4 => "discard",
        _ => "other",
    }
}

/// A device's name from its kernel `dev_t` (major << 20 | minor), as /sys/dev/block knows it.
fn dev_name(dev: u32) -> String {
    let (major, minor) = (dev >> 20, dev & 0xfffff);
    std::fs::read_to_string(format!("/sys/dev/block/{major}:{minor}/uevent"))
        .ok()
        .and_then(|u| u.lines().find_map(|l| l.strip_prefix("DEVNAME=").map(str::to_string)))
        .unwrap_or_else(|| format!("{major}:{minor}"))
}

/// `(func, dev, op) -> slot counts`.
type Hists = BTreeMap<(u32, u32, u32), Vec<u64>>;

fn read_hists(t: &Tracer) -> Result<Hists> {
    let mut h: Hists = BTreeMap::new();
    for (k, v) in t.kernel_map_entries("hist")? {
        let w = |i: usize| u32::from_ne_bytes(k[i * 4..i * 4 + 4].try_into().unwrap_or([0; 4]));
        let (func, dev, op, slot) = (w(0), w(1), w(2), w(3) as usize);
        let count = u64::from_ne_bytes(v[..8].try_into().unwrap_or([0; 8]));
        let e = h.entry((func, dev, op)).or_default();
        if e.len() <= slot {
            e.resize(slot + 1, 0);
        }
        e[slot] += count;
    }
    Ok(h)
}

/// A log2 histogram as libbpf-tools' biolatency prints it.
fn print_log2(vals: &[u64], unit: &str) {
    let max = vals.iter().copied().max().unwrap_or(0);
    println!("{:>5}{unit:<19} : count    distribution", "");
    let mut last = vals.len();
    while last > 0 && vals[last - 1] == 0 {
        last -= 1;
    }
    for (i, &c) in vals.iter().enumerate().take(last) {
        let (lo, hi) = if i == 0 { (0u64, 1u64) } else { (1u64 << i, (1u64 << (i + 1)) - 1) };
        let stars = if max == 0 { 0 } else { (c * 40).div_ceil(max).min(40) as usize };
        let stars = if c == 0 { 0 } else { stars.max(1) };
        println!("{lo:>10} -> {hi:<10} : {c:<8} |{:<40}|", "*".repeat(stars));
    }
}

/// The histograms with requests since `before`, per function then the kernel's totals:
/// (header, slot counts).
fn since(h: &Hists, before: &Hists, names: &[String]) -> Vec<(String, Vec<u64>)> {
    let diff = |k: &(u32, u32, u32), v: &Vec<u64>| -> Vec<u64> {
        let b = before.get(k);
        v.iter().enumerate().map(|(i, &c)| c - b.and_then(|b| b.get(i)).copied().unwrap_or(0)).collect()
    };
    let mut out = Vec::new();
    for kernel in [false, true] {
        for (k, v) in h.iter().filter(|(k, _)| (k.0 == KERNEL_TOTAL) == kernel) {
            let d = diff(k, v);
            let total: u64 = d.iter().sum();
            if total == 0 {
                continue;
            }
            let who = if kernel {
                "all requests (the kernel's totals)".to_string()
            } else {
                names.get(k.0 as usize - 1).map_or_else(|| format!("function #{}", k.0), |n| format!("function {n}"))
            };
            out.push((format!("{who}, disk = {}, op = {}: {total} requests", dev_name(k.1), op_name(k.2)), d));
        }
    }
    out
}

fn print(h: &Hists, before: &Hists, names: &[String]) {
    let hists = since(h, before, names);
    for (header, d) in &hists {
        println!();
        println!("{header}");
        print_log2(d, UNIT);
    }
    if hists.is_empty() {
        println!("(no block requests completed)");
    }
}

const UNIT: &str = "usecs";

/// The functions to probe: `(path, function, display name)`.
fn functions(args: &Args, target: &Target) -> Result<Vec<(PathBuf, Func, String)>> {
    let mut out = Vec::new();
    if args.funcs.is_empty() {
        let libc = resolve_bin("c", target.pid())?;
        for f in DEFAULT_LIBC {
            if let Ok(fs) = match_functions(&libc, f) {
                out.extend(fs.into_iter().map(|f| (libc.clone(), f.clone(), format!("libc:{}", f.name))));
            }
        }
        if let Some(exe) = args.common.command.first().and_then(|c| crate::run::command_executable(c))
            && exe.file_name().is_some_and(|n| n == "fio")
            && let Ok(fs) = match_functions(&exe, "td_io_queue")
        {
            out.extend(fs.into_iter().map(|f| (exe.clone(), f.clone(), format!("fio:{}", f.name))));
        }
    } else {
        for spec in &args.funcs {
            let (bin, pattern) = split_spec(spec)?;
            let path = resolve_bin(bin, target.pid())?;
            for f in match_functions(&path, pattern)? {
                let name = format!("{bin}:{}", f.name);
                out.push((path.clone(), f, name));
            }
        }
    }
    if out.is_empty() {
        bail!("no function to probe (give some with -f BIN:FUNC)");
    }
    Ok(out)
}

pub fn run(args: Args) -> Result<()> {
    let target = Target::from(&args.common)?;
    if let Some(path) = &args.svg {
        userbpf_plot::check_writable(path)?;
    }
    let funcs = functions(&args, &target)?;
    let mut tracer = Tracer::new("iolatency", target, args.common.interpreter)?;
    // Cookie i + 1 names function i (0: unmarked).
    for (i, (path, f, _)) in funcs.iter().enumerate() {
        tracer.probe("io_enter", false, path, f, i as u64 + 1)?;
        tracer.probe("io_leave", true, path, f, i as u64 + 1)?;
    }
    let names: Vec<String> = funcs.iter().map(|(_, _, n)| n.clone()).collect();
    let mut running = tracer.start()?;
    println!(
        "Tracing block I/O by {} function{}... Hit Ctrl-C to end.",
        names.len(),
        if names.len() == 1 { "" } else { "s" }
    );
    let mut last: Hists = BTreeMap::new();
    let end =
        running.run_intervals(&args.common, &mut last, || read_hists(&tracer), |now, last| print(now, last, &names))?;
    let code = conclude(&mut tracer, &mut running, end);
    let now = read_hists(&tracer)?;
    if args.common.interval.is_some() && args.common.timestamp {
        println!("{}", time_of_day());
    }
    print(&now, &last, &names);
    if let Some(path) = &args.svg {
        let charts: Vec<userbpf_plot::Chart> = since(&now, &BTreeMap::new(), &names)
            .into_iter()
            .map(|(title, slots)| userbpf_plot::Chart::Hist(userbpf_plot::Log2Hist { title, unit: UNIT.into(), slots }))
            .collect();
        userbpf_plot::write_svg(path, &charts)?;
        eprintln!(
            "userbpf: {} histogram{} written to {}",
            charts.len(),
            if charts.len() == 1 { "" } else { "s" },
            path.display()
        );
    }
    if let Some(code) = code {
        drop(tracer);
        std::process::exit(code);
    }
    Ok(())
}
