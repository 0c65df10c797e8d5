//! `userbpf tool funclatency BIN:FUNC`: how long user functions take, as log2 histograms
//! (BCC's funclatency). A uprobe and a uretprobe on each function matched by FUNC (a name or
//! a glob); the link's cookie carries the function's index and how to key the histogram
//! (one combined, per function with `-F`, per process with `-P`, per thread with `--tids`)
//! and the unit (ns, `-u` us, `-m` ms), so one object serves every mode (tools/funclatency.bpf.c):
//! arrays (lookups inlined by the JIT) unless keyed by process or thread (hash maps).
//! The maps only grow: each interval prints the difference from the last one, so no count
//! is lost between a read and a clear. `--svg FILE` draws the histograms of the whole run
//! (not only the last interval) at the end, one chart each (crate `userbpf-plot`).

use std::collections::BTreeMap;

use anyhow::Result;

use super::{Common, Target, Tracer, conclude, match_functions, resolve_bin, split_spec, time_of_day};
use crate::dump::{entries, hist_lines_of};

#[derive(clap::Args)]
pub struct Args {
    /// `BIN:FUNC`: BIN a path, a command in PATH or a library (`c`, `libc`, `libpthread`);
    /// FUNC a function name or a glob (`read*`, `*alloc`).
    spec: String,
    /// Microsecond histogram.
    #[arg(short = 'u', long = "microseconds", conflicts_with = "milliseconds")]
    microseconds: bool,
    /// Millisecond histogram.
    #[arg(short = 'm', long = "milliseconds")]
    milliseconds: bool,
    /// One histogram per function (default: one for all the functions matched).
    #[arg(short = 'F', long = "function")]
    per_function: bool,
    /// One histogram per process.
    #[arg(short = 'P', long = "pids", visible_alias = "pid-hist", conflicts_with = "tids")]
    pids: bool,
    /// One histogram per thread.
    #[arg(long = "tids", visible_alias = "tid-hist")]
    tids: bool,
    /// At the end, draw the histograms of the whole run into FILE (SVG, one chart per
    /// histogram, stacked in that order).
    #[arg(long, value_name = "FILE")]
    svg: Option<std::path::PathBuf>,
    #[command(flatten)]
    common: Common,
}

const BY_FUNC: u64 = 1 << 32;
const BY_PID: u64 = 1 << 33;
const BY_TID: u64 = 1 << 34;
const UNIT_SHIFT: u32 = 36;
const SLOTS: usize = 64;

/// One histogram's numbers.
#[derive(Clone)]
struct Hist {
    slots: [u64; SLOTS],
    count: u64,
    sum: u64,
}

impl Default for Hist {
    fn default() -> Self {
        Hist { slots: [0; SLOTS], count: 0, sum: 0 }
    }
}

/// Histograms by (function index, pid or tid); 0 where not keyed by it.
type Snapshot = BTreeMap<(u32, u32), Hist>;

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_ne_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[at..at + 8]);
    u64::from_ne_bytes(x)
}

/// The histograms so far: from the arrays (`funcs` of them: 1 combined, else one per
/// function) when not keyed by process or thread, else from the hash maps.
fn snapshot(t: &Tracer, keyed: bool, funcs: usize) -> Result<Snapshot> {
    let mut snap = Snapshot::new();
    if !keyed {
        let (slots, sums) = (t.map("slots")?, t.map("sums")?);
        let mut v = [0u8; 8];
        let mut s = [0u8; 16];
        for f in 0..funcs as u32 {
            let mut h = Hist::default();
            for (i, c) in h.slots.iter_mut().enumerate() {
                slots.lookup_elem(&(f * SLOTS as u32 + i as u32).to_ne_bytes(), &mut v)?;
                *c = u64::from_ne_bytes(v);
            }
            sums.lookup_elem(&f.to_ne_bytes(), &mut s)?;
            (h.count, h.sum) = (u64_at(&s, 0), u64_at(&s, 8));
            if h.count > 0 || h.slots.iter().any(|&c| c > 0) {
                snap.insert((f, 0), h);
            }
        }
        return Ok(snap);
    }
    for (k, v) in entries(t.map("latency")?) {
        let (func, pid, slot) = (u32_at(&k, 0), u32_at(&k, 4), u32_at(&k, 8) as usize);
        if slot < SLOTS {
            snap.entry((func, pid)).or_default().slots[slot] += u64_at(&v, 0);
        }
    }
    for (k, v) in entries(t.map("totals")?) {
        let h = snap.entry((u32_at(&k, 0), u32_at(&k, 4))).or_default();
        h.count = u64_at(&v, 0);
        h.sum = u64_at(&v, 8);
    }
    Ok(snap)
}

fn diff(now: &Snapshot, before: &Snapshot) -> Snapshot {
    let mut out = Snapshot::new();
    for (k, h) in now {
        let mut d = h.clone();
        if let Some(b) = before.get(k) {
            for (s, bs) in d.slots.iter_mut().zip(b.slots.iter()) {
                *s = s.saturating_sub(*bs);
            }
            d.count = d.count.saturating_sub(b.count);
            d.sum = d.sum.saturating_sub(b.sum);
        }
        if d.count > 0 || d.slots.iter().any(|&c| c > 0) {
            out.insert(*k, d);
        }
    }
    out
}

pub fn run(args: Args) -> Result<()> {
    let target = Target::from(&args.common)?;
    if let Some(path) = &args.svg {
        userbpf_plot::check_writable(path)?;
    }
    let (bin, pattern) = split_spec(&args.spec)?;
    let path = resolve_bin(bin, target.pid())?;
    let funcs = match_functions(&path, pattern)?;
    let (unit, unit_code) = if args.microseconds {
        ("usecs", 1u64)
    } else if args.milliseconds {
        ("msecs", 2)
    } else {
        ("nsecs", 0)
    };
    let mut flags = unit_code << UNIT_SHIFT;
    if args.per_function {
        flags |= BY_FUNC;
    }
    if args.pids {
        flags |= BY_PID;
    } else if args.tids {
        flags |= BY_TID;
    }
    let keyed = args.pids || args.tids;
    let arrays = if args.per_function { funcs.len() } else { 1 };
    let mut tracer = Tracer::new("funclatency", target, args.common.interpreter)?;
    for (i, f) in funcs.iter().enumerate() {
        tracer.probe("entry", false, &path, f, i as u64 | flags)?;
        tracer.probe("leave", true, &path, f, i as u64 | flags)?;
    }
    let mut running = tracer.start()?;
    println!(
        "Tracing {} function{} for \"{}\"... Hit Ctrl-C to end.",
        funcs.len(),
        if funcs.len() == 1 { "" } else { "s" },
        args.spec
    );

    let who = if args.pids { "pid" } else { "tid" };
    let header = |func: u32, pid: u32| {
        let mut labels = Vec::new();
        if args.per_function {
            labels.push(funcs.get(func as usize).map_or_else(|| format!("function {func}"), |f| f.name.clone()));
        }
        if args.pids || args.tids {
            labels.push(format!("{who} {pid}"));
        }
        if labels.is_empty() { format!("@{unit}") } else { format!("@{unit}[{}]", labels.join(", ")) }
    };
    let print = |snap: &Snapshot| {
        for ((func, pid), h) in snap {
            println!();
            println!("{}:", header(*func, *pid));
            let counts: Vec<(u32, u64)> = h.slots.iter().enumerate().map(|(s, &c)| (s as u32, c)).collect();
            for line in hist_lines_of(&counts) {
                println!("{line}");
            }
            let avg = h.sum.checked_div(h.count).unwrap_or(0);
            println!("avg = {avg} {unit}, total: {} {unit}, count: {}", h.sum, h.count);
        }
    };
    let mut last = Snapshot::new();
    let end = running.run_intervals(
        &args.common,
        &mut last,
        || snapshot(&tracer, keyed, arrays),
        |now, last| print(&diff(now, last)),
    )?;
    let code = conclude(&mut tracer, &mut running, end);
    let now = snapshot(&tracer, keyed, arrays)?;
    if args.common.interval.is_some() && args.common.timestamp {
        println!("\n{}", time_of_day());
    }
    let shown = diff(&now, &last);
    if shown.is_empty() && args.common.interval.is_none() {
        println!("\n(no calls)");
    }
    print(&shown);
    if let Some(path) = &args.svg {
        let charts: Vec<userbpf_plot::Chart> = now
            .iter()
            .map(|((func, pid), h)| {
                let avg = h.sum.checked_div(h.count).unwrap_or(0);
                userbpf_plot::Chart::Hist(userbpf_plot::Log2Hist {
                    title: format!(
                        "{} {}: {} calls, avg {avg} {unit}",
                        args.spec.rsplit('/').next().unwrap_or(&args.spec),
                        header(*func, *pid),
                        h.count
                    ),
                    unit: unit.to_string(),
                    slots: h.slots.to_vec(),
                })
            })
            .collect();
        userbpf_plot::write_svg(path, &charts)?;
        eprintln!(
            "userbpf: {} histogram{} written to {}",
            charts.len(),
            if charts.len() == 1 { "" } else { "s" },
            path.display()
        );
    }
    let unmatched = tracer.loaded.maps.iter().find(|m| m.def.name.ends_with(".bss")).map(|m| {
        let mut v = vec![0u8; m.map.value_buf_size()];
        let _ = m.map.lookup_elem(&0u32.to_ne_bytes(), &mut v);
        (u64_at(&v, 0), u64_at(&v, 8))
    });
    if let Some((unmatched, dropped)) = unmatched
        && unmatched + dropped > 0
    {
        eprintln!(
            "userbpf: {unmatched} returns without their entry (the probe came mid-call), {dropped} entries not recorded (table full)"
        );
    }
    if let Some(code) = code {
        drop(tracer);
        std::process::exit(code);
    }
    Ok(())
}
