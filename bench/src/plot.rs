//! `bench-plot TEXT DIR`: the charts of `make bench`. The benchmarks print Markdown (a `##`
//! heading per benchmark, `###` per measurement, tables with a `|---|` line); `make bench`
//! keeps that text in target/bench/bench.md and this program draws every table of it into
//! DIR/NN-SLUG.svg (crate `userbpf-plot`: grouped horizontal bars, a logarithmic axis when
//! the values span more than 50×, e.g. the kernel's uprobe beside userbpf's), then writes
//! DIR/charts.md, the list of charts with their titles, as Markdown image links. The NN-*.svg
//! files of an earlier run are removed first.
//!
//! How a table becomes a chart:
//! - each row is a group of bars, labelled with the text cells before the first number
//!   (`bench_fn (executable) · uprobe`); text cells after the numbers (notes) are left out;
//! - a column is a series when every non-empty cell is a number (`9,332`, `11.6`, `27.2×`,
//!   `90.1%`; `–`, `n/a` and empty cells draw no bar);
//! - the series are grouped into panels by what they measure, so that one axis holds
//!   comparable values: the unit the header names (`ns/op`, `ns`, `IOPS`; a header naming
//!   none takes the heading's `ns per ...`), ratios (`×` cells, or headers `A / B`), shares
//!   (`%`), and counts (headers naming instructions, hits, calls, ...), in that order.
//!
//! The table's title is its nearest heading: the `###` line, else the `##` one.

use std::path::{Path, PathBuf};

use userbpf_plot::{Bars, Chart, Series};

/// A table as printed: its heading, the benchmark's `##` heading, header and rows.
#[derive(Debug, Default)]
struct Table {
    heading: String,
    section: String,
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

fn cells(line: &str) -> Vec<String> {
    let l = line.trim();
    let l = l.strip_prefix('|').unwrap_or(l);
    let l = l.strip_suffix('|').unwrap_or(l);
    l.split('|').map(|c| c.trim().to_string()).collect()
}

fn is_separator(line: &str) -> bool {
    let c = cells(line);
    !c.is_empty() && c.iter().all(|c| !c.is_empty() && c.chars().all(|ch| matches!(ch, '-' | ':' | ' ')))
}

/// The Markdown tables of `text`, each with the headings above it.
fn tables(text: &str) -> Vec<Table> {
    let lines: Vec<&str> = text.lines().collect();
    let (mut section, mut heading) = (String::new(), String::new());
    // The text above a table (see below), and whether a table came already under this heading.
    let (mut para, mut para_open, mut seen) = (String::new(), false, false);
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let l = lines[i].trim();
        if let Some(h) = l.strip_prefix("### ") {
            heading = h.trim().to_string();
            (para, seen) = (String::new(), false);
        } else if let Some(h) = l.strip_prefix("## ") {
            section = h.trim().to_string();
            heading = section.clone();
            (para, seen) = (String::new(), false);
        } else if l.starts_with('|') && i + 1 < lines.len() && is_separator(lines[i + 1]) {
            // A second table under one heading is named by the text just above it.
            let title = if seen && !para.is_empty() { para.clone() } else { heading.clone() };
            (para, seen) = (String::new(), true);
            let header = cells(l);
            let mut rows = Vec::new();
            i += 2;
            while i < lines.len() && lines[i].trim().starts_with('|') {
                let mut r = cells(lines[i]);
                r.resize(header.len(), String::new());
                rows.push(r);
                i += 1;
            }
            out.push(Table { heading: title, section: section.clone(), header, rows });
            para_open = false;
            continue;
        } else if l.is_empty() {
            para_open = false;
        } else {
            // The last line above the table that starts a sentence (a paragraph's first, or
            // one after a line ending a sentence), up to its first colon or parenthesis.
            if !para_open || lines[i - 1].trim_end().ends_with('.') {
                para = l.split([':', '(']).next().unwrap_or(l).trim().trim_end_matches('.').to_string();
            }
            para_open = true;
        }
        i += 1;
    }
    out
}

/// What a cell's number is.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Kind {
    Plain,
    Ratio,
    Percent,
}

/// A cell as a number: `None` for an empty cell, `Some(None)` for text.
fn number(cell: &str) -> Option<Option<(f64, Kind)>> {
    let c = cell.trim().trim_matches('*').trim();
    if c.is_empty() || matches!(c, "–" | "-" | "—" | "n/a") {
        return None;
    }
    let (c, kind) = if let Some(c) = c.strip_suffix('×').or_else(|| c.strip_suffix('x')) {
        (c, Kind::Ratio)
    } else if let Some(c) = c.strip_suffix('%') {
        (c, Kind::Percent)
    } else {
        (c, Kind::Plain)
    };
    let c: String = c.chars().filter(|&ch| ch != ',' && ch != '\u{202f}' && ch != '_').collect();
    Some(c.trim().parse::<f64>().ok().filter(|v| v.is_finite()).map(|v| (v, kind)))
}

/// Words of a header that make its column a count rather than a cost.
const COUNT_WORDS: &[&str] = &[
    "instructions",
    "hits",
    "calls",
    "expected",
    "counted",
    "runs",
    "requests",
    "entries",
    "keys",
    "programs",
    "events",
];

/// The unit a header or heading names: `ns/op`, `ns`, `ns per call`, `IOPS`, ...
fn unit_of(text: &str) -> Option<String> {
    let words: Vec<&str> = text.split(|c: char| c.is_whitespace() || matches!(c, '(' | ')' | ',' | ';')).collect();
    for (i, w) in words.iter().enumerate() {
        let base = w.split('/').next().unwrap_or("");
        if matches!(base, "ns" | "us" | "µs" | "ms" | "s" | "cycles") || *w == "IOPS" {
            if !w.contains('/') && words.get(i + 1) == Some(&"per") && i + 2 < words.len() {
                return Some(format!("{w} per {}", words[i + 2]));
            }
            return Some(w.to_string());
        }
    }
    None
}

/// One panel's columns: (axis title, column indices).
fn panels(t: &Table, numeric: &[(usize, Kind)]) -> Vec<(String, Vec<usize>)> {
    let mut units: Vec<(String, Vec<usize>)> = Vec::new();
    let (mut ratios, mut shares, mut counts) = (Vec::new(), Vec::new(), Vec::new());
    let default_unit = unit_of(&t.heading).unwrap_or_else(|| "value".to_string());
    for &(c, kind) in numeric {
        let h = &t.header[c];
        let lower = h.to_lowercase();
        if kind == Kind::Ratio || h.contains(" / ") {
            ratios.push(c);
        } else if kind == Kind::Percent {
            shares.push(c);
        } else if unit_of(h).is_none() && lower.split_whitespace().any(|w| COUNT_WORDS.contains(&w)) {
            counts.push(c);
        } else {
            let u = unit_of(h).unwrap_or_else(|| default_unit.clone());
            match units.iter_mut().find(|(n, _)| *n == u) {
                Some((_, v)) => v.push(c),
                None => units.push((u, vec![c])),
            }
        }
    }
    for (name, cols) in [("ratio (×)", ratios), ("share (%)", shares), ("count", counts)] {
        if !cols.is_empty() {
            units.push((name.to_string(), cols));
        }
    }
    units
}

/// The charts of a table: one panel per kind of value (see the module's documentation).
fn charts(t: &Table) -> Vec<Chart> {
    let mut numeric = Vec::new();
    for c in 1..t.header.len() {
        let vals: Vec<Option<Option<(f64, Kind)>>> = t.rows.iter().map(|r| number(&r[c])).collect();
        if vals.iter().all(|v| !matches!(v, Some(None))) && vals.iter().any(Option::is_some) {
            let kind = vals.iter().flatten().flatten().map(|v| v.1).next().unwrap_or(Kind::Plain);
            numeric.push((c, kind));
        }
    }
    let Some(&(first_num, _)) = numeric.first() else { return Vec::new() };
    let labels: Vec<String> = t.rows.iter().map(|r| r[..first_num].join(" · ")).collect();
    let title = if t.heading.chars().count() > 110 {
        format!("{}…", t.heading.chars().take(110).collect::<String>())
    } else {
        t.heading.clone()
    };
    panels(t, &numeric)
        .into_iter()
        .map(|(unit, cols)| {
            // One series has no legend: the axis names its column.
            let unit = match cols.as_slice() {
                [c] if t.header[*c].contains(unit.as_str()) => t.header[*c].clone(),
                [c] => format!("{} — {unit}", t.header[*c]),
                _ => unit,
            };
            let series = cols
                .iter()
                .map(|&c| Series {
                    name: t.header[c].clone(),
                    values: t.rows.iter().map(|r| number(&r[c]).flatten().map(|v| v.0)).collect(),
                })
                .collect();
            Chart::Bars(Bars { title: title.clone(), unit, categories: labels.clone(), series, log: None })
        })
        .collect()
}

fn slug(s: &str) -> String {
    let mut out = String::new();
    for w in s.split(|c: char| !c.is_ascii_alphanumeric()).filter(|w| !w.is_empty()).take(6) {
        if !out.is_empty() {
            out.push('-');
        }
        out.push_str(&w.to_ascii_lowercase());
    }
    if out.is_empty() { "table".into() } else { out }
}

fn run(input: &Path, dir: &Path) -> anyhow::Result<Vec<(PathBuf, String)>> {
    use anyhow::Context;
    let text = std::fs::read_to_string(input).with_context(|| format!("reading {}", input.display()))?;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    // Charts of an earlier run (NN-*.svg) go, so that the directory holds this run's only.
    for e in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))?.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let b = name.as_bytes();
        if name.ends_with(".svg") && b.len() > 3 && b[0].is_ascii_digit() && b[1].is_ascii_digit() && b[2] == b'-' {
            std::fs::remove_file(e.path()).with_context(|| format!("removing {}", e.path().display()))?;
        }
    }
    let mut written = Vec::new();
    let mut index = String::from("# `make bench` charts\n\n");
    let mut last_section = String::new();
    for (n, t) in tables(&text).iter().enumerate() {
        let c = charts(t);
        if c.is_empty() {
            continue;
        }
        let path = dir.join(format!("{:02}-{}.svg", n + 1, slug(&t.heading)));
        userbpf_plot::write_svg(&path, &c)?;
        let name = path.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default();
        if !t.section.is_empty() && t.section != t.heading && t.section != last_section {
            index.push_str(&format!("## {}\n\n", t.section));
        }
        last_section = t.section.clone();
        index.push_str(&format!("### {}\n\n![{}]({name})\n\n", t.heading, t.heading.replace(['[', ']'], "")));
        written.push((path, t.heading.clone()));
    }
    let idx = dir.join("charts.md");
    std::fs::write(&idx, index).with_context(|| format!("writing {}", idx.display()))?;
    Ok(written)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() != 2 {
        eprintln!("usage: bench-plot BENCH-OUTPUT.md DIR (draws every Markdown table of the text into DIR/*.svg)");
        std::process::exit(2);
    }
    match run(Path::new(&args[0]), Path::new(&args[1])) {
        Ok(w) => {
            let s = if w.len() == 1 { "" } else { "s" };
            println!("## Charts: {} SVG file{s} in {} (index: charts.md)", w.len(), args[1]);
            for (p, title) in w {
                println!("- {}: {title}", p.display());
            }
        }
        Err(e) => {
            eprintln!("bench-plot: {e:#}");
            std::process::exit(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "## uprobe benchmark: 2026-11-25\n\n\
### Probe hit cost: a noinline function called in a loop (ns per call, thread CPU time)\n\n\
| function | probe | no probe | kernel | userbpf JIT | kernel hit | JIT hit | kernel hit / JIT hit |\n\
|---|---|---:|---:|---:|---:|---:|---:|\n\
| bench_fn (executable) | uprobe | 1.4 | 9,332 | 11.6 | 9,331 | 10.2 | 916.0× |\n\
| bench_fn (executable) | uretprobe | 1.4 | 9,661 | 17.1 | 9,660 | 15.7 | 614.1× |\n\n\
Hit = probed minus unprobed.\n\
Wall-clock ns per call of the same runs (includes waiting\n\
on a busy machine):\n\n\
| function | probe | kernel |\n\
|---|---|---:|\n\
| bench_fn | uprobe | 9,400 |\n\n\
Some text | not a table\n\n\
## userbpf maps\n\n\
| map type | operation | 1 thread ns/op | 2 threads ns/op | 2 threads / 1 thread | hits | notes |\n\
|---|---|---:|---:|---:|---:|---|\n\
| hash | lookup | 16.99 | 27.18 | 1.60 | 5 | slow |\n\
| array | lookup | 0.06 | n/a |  | 7 |  |\n";

    fn bars(c: &Chart) -> &Bars {
        match c {
            Chart::Bars(b) => b,
            Chart::Hist(_) => panic!("a histogram"),
        }
    }

    #[test]
    fn tables_with_their_headings() {
        let mut t = tables(TEXT);
        assert_eq!(t.len(), 3);
        assert!(t[0].heading.starts_with("Probe hit cost"));
        assert_eq!(t[0].section, "uprobe benchmark: 2026-11-25");
        assert_eq!(t[0].rows.len(), 2);
        // A second table under the same heading: named by the paragraph above it.
        let second = t.remove(1);
        assert_eq!(second.heading, "Wall-clock ns per call of the same runs");
        let c = charts(&second);
        assert_eq!(bars(&c[0]).unit, "kernel — ns per call");
        assert_eq!(t[1].heading, "userbpf maps");
        assert_eq!(t[1].rows[1][3], "n/a");
    }

    #[test]
    fn panels_by_unit_ratio_and_count() {
        let mut t = tables(TEXT);
        t.remove(1);
        let c = charts(&t[0]);
        assert_eq!(c.len(), 2);
        let (costs, ratios) = (bars(&c[0]), bars(&c[1]));
        assert_eq!(costs.unit, "ns per call");
        assert_eq!(costs.categories, ["bench_fn (executable) · uprobe", "bench_fn (executable) · uretprobe"]);
        let names: Vec<&str> = costs.series.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["no probe", "kernel", "userbpf JIT", "kernel hit", "JIT hit"]);
        assert_eq!(costs.series[1].values, [Some(9332.0), Some(9661.0)]);
        assert_eq!(ratios.unit, "kernel hit / JIT hit — ratio (×)");
        assert_eq!(ratios.series[0].values, [Some(916.0), Some(614.1)]);

        let c = charts(&t[1]);
        let units: Vec<&str> = c.iter().map(|c| bars(c).unit.as_str()).collect();
        assert_eq!(units, ["ns/op", "2 threads / 1 thread — ratio (×)", "hits — count"]);
        assert_eq!(bars(&c[0]).series[1].values, [Some(27.18), None]);
        assert_eq!(bars(&c[1]).series[0].values, [Some(1.60), None]);
        // The notes column (text) is neither a label nor a series.
        assert_eq!(bars(&c[0]).categories, ["hash · lookup", "array · lookup"]);
    }

    #[test]
    fn files_and_index_written() {
        let dir = std::env::temp_dir().join(format!("bench-plot-{}", std::process::id()));
        let input = dir.join("bench.md");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(&input, TEXT).unwrap();
        std::fs::write(dir.join("09-stale.svg"), "old").unwrap();
        std::fs::write(dir.join("keep.svg"), "mine").unwrap();
        let w = run(&input, &dir).unwrap();
        assert!(!dir.join("09-stale.svg").exists() && dir.join("keep.svg").exists());
        let names: Vec<String> = w.iter().map(|(p, _)| p.file_name().unwrap().to_string_lossy().into_owned()).collect();
        assert_eq!(
            names,
            ["01-probe-hit-cost-a-noinline-function.svg", "02-wall-clock-ns-per-call-of.svg", "03-userbpf-maps.svg"]
        );
        let index = std::fs::read_to_string(dir.join("charts.md")).unwrap();
        assert!(index.contains("](01-probe-hit-cost-a-noinline-function.svg)"), "{index}");
        assert!(std::fs::read_to_string(&w[0].0).unwrap().contains("<svg"));
        let e = run(&dir.join("missing.md"), &dir).unwrap_err();
        assert!(format!("{e:#}").contains("missing.md"), "{e:#}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
