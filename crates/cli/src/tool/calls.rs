//! `userbpf tool calls BIN:PATTERN`: how often each matched function is called (BCC's
//! funccount), the top N by count; with `-i`, the counts of each interval. One uprobe per
//! function, counting into a per-CPU array slot named by the link's cookie
//! (tools/calls.bpf.c): no lock and no lost update on the hot path. The counts only grow;
//! each interval prints the difference from the last. `--svg FILE` draws the top N of the
//! whole run as a bar chart at the end (crate `userbpf-plot`).

use anyhow::Result;

use super::{Common, Target, Tracer, conclude, match_functions, resolve_bin, split_spec, time_of_day};

#[derive(clap::Args)]
pub struct Args {
    /// `BIN:PATTERN`: BIN a path, a command in PATH or a library (`c`, `libc`); PATTERN a
    /// function name or a glob (`str*`, `*alloc`).
    spec: String,
    /// Show the N most called functions.
    #[arg(short = 'n', long = "top", default_value_t = 10)]
    top: usize,
    /// At the end, draw the N most called functions of the whole run into FILE (SVG bars).
    #[arg(long, value_name = "FILE")]
    svg: Option<std::path::PathBuf>,
    #[command(flatten)]
    common: Common,
}

/// Each function's count so far, by index.
fn counts(t: &Tracer, n: usize) -> Result<Vec<u64>> {
    let map = t.map("counts")?;
    let mut v = vec![0u8; map.value_buf_size()];
    let stride = (map.spec().value_size as usize).div_ceil(8) * 8;
    let mut out = Vec::with_capacity(n);
    for i in 0..n as u32 {
        v.fill(0);
        map.lookup_elem(&i.to_ne_bytes(), &mut v)?;
        out.push(v.chunks(stride).map(|c| u64::from_ne_bytes(c[..8].try_into().unwrap_or([0; 8]))).sum());
    }
    Ok(out)
}

pub fn run(args: Args) -> Result<()> {
    let target = Target::from(&args.common)?;
    if let Some(path) = &args.svg {
        userbpf_plot::check_writable(path)?;
    }
    let (bin, pattern) = split_spec(&args.spec)?;
    let path = resolve_bin(bin, target.pid())?;
    let funcs = match_functions(&path, pattern)?;
    let mut tracer = Tracer::new("calls", target, args.common.interpreter)?;
    for (i, f) in funcs.iter().enumerate() {
        tracer.probe("count", false, &path, f, i as u64)?;
    }
    let mut running = tracer.start()?;
    println!(
        "Tracing {} function{} for \"{}\"... Hit Ctrl-C to end.",
        funcs.len(),
        if funcs.len() == 1 { "" } else { "s" },
        args.spec
    );
    // The functions called since `before`, most called first.
    let ranked = |now: &[u64], before: &[u64]| {
        let mut rows: Vec<(u64, &str)> = now
            .iter()
            .enumerate()
            .map(|(i, &c)| (c.saturating_sub(before.get(i).copied().unwrap_or(0)), funcs[i].name.as_str()))
            .filter(|&(c, _)| c > 0)
            .collect();
        rows.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(b.1)));
        rows
    };
    let print = |now: &[u64], before: &[u64]| {
        let rows = ranked(now, before);
        // With -T the time of day's line (after a blank one) heads the table.
        if !args.common.timestamp {
            println!();
        }
        println!("{:<40} {:>12}", "FUNC", "COUNT");
        for (c, name) in rows.iter().take(args.top) {
            println!("{name:<40} {c:>12}");
        }
        if rows.len() > args.top {
            let more = rows.len() - args.top;
            println!("({more} more function{} called; -n shows more)", if more == 1 { "" } else { "s" });
        }
    };
    let mut last = vec![0u64; funcs.len()];
    let end = running.run_intervals(
        &args.common,
        &mut last,
        || counts(&tracer, funcs.len()),
        |now, before| print(now, before),
    )?;
    let code = conclude(&mut tracer, &mut running, end);
    let now = counts(&tracer, funcs.len())?;
    if args.common.interval.is_some() && args.common.timestamp {
        println!("\n{}", time_of_day());
    }
    print(&now, &last);
    if let Some(path) = &args.svg {
        let rows = ranked(&now, &[]);
        let top = &rows[..rows.len().min(args.top)];
        let more = rows.len() - top.len();
        let chart = userbpf_plot::Bars {
            title: format!(
                "calls {}: top {} of {} function{} called{}",
                args.spec.rsplit('/').next().unwrap_or(&args.spec),
                top.len(),
                rows.len(),
                if rows.len() == 1 { "" } else { "s" },
                if more > 0 { " (-n shows more)" } else { "" }
            ),
            unit: "calls".into(),
            categories: top.iter().map(|(_, n)| n.to_string()).collect(),
            series: vec![userbpf_plot::Series {
                name: "calls".into(),
                values: top.iter().map(|&(c, _)| Some(c as f64)).collect(),
            }],
            log: Some(false),
        };
        userbpf_plot::write_svg(path, &[userbpf_plot::Chart::Bars(chart)])?;
        eprintln!("userbpf: top {} functions written to {}", top.len(), path.display());
    }
    if let Some(code) = code {
        drop(tracer);
        std::process::exit(code);
    }
    Ok(())
}
