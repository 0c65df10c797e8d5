//! `data-pages`: the data a stepped stretch of code touched, by mapping: distinct 64-byte
//! lines and 4 KiB pages (what a run on cold caches has to fetch, and the TLB entries it
//! needs). Reads the states `bench/uprobe/steps/stepper.c` writes (each instruction's
//! registers before it ran and its first 16 bytes), decodes each instruction (iced-x86) and
//! computes the addresses of the memory it read or wrote, explicit operands and implicit ones
//! (the stack of `push`, `call`, `ret`; the strings of `rep movs`, one byte a step), then
//! names each by the target's /proc/PID/maps. Instructions of the target's own code (the
//! executable and the objects given with `--skip`) are left out: what remains is the probes'.
//!
//! ```text
//! data-pages [--skip NAME]... [--pages] [--lines] STATES MAPS [STATES MAPS ...] -- LABEL [LABEL ...]
//! ```
//!
//! `--pages` also lists every page with its lines and the first instruction that touched it;
//! `--lines`, every line with the offsets reached in it and the instructions that touched it
//! (to tell which objects share a page: the offsets named with the object's symbols, the
//! instructions with the target's maps and perf map).

use std::collections::{BTreeMap, BTreeSet};

use anyhow::{Context, Result, bail};
use iced_x86::{Decoder, DecoderOptions, InstructionInfoFactory, Register};

/// `struct user_regs_struct` (x86-64) as 27 words, then 16 bytes of code.
const REGS: usize = 27;
const RECORD: usize = REGS * 8 + 16;

/// Word indices in `struct user_regs_struct`.
const R15: usize = 0;
const R14: usize = 1;
const R13: usize = 2;
const R12: usize = 3;
const RBP: usize = 4;
const RBX: usize = 5;
const R11: usize = 6;
const R10: usize = 7;
const R9: usize = 8;
const R8: usize = 9;
const RAX: usize = 10;
const RCX: usize = 11;
const RDX: usize = 12;
const RSI: usize = 13;
const RDI: usize = 14;
const RIP: usize = 16;
const RSP: usize = 19;
const FS_BASE: usize = 21;
const GS_BASE: usize = 22;

struct Mapping {
    lo: u64,
    hi: u64,
    name: String,
}

fn read_maps(path: &str) -> Result<Vec<Mapping>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {path}"))?;
    let mut maps = Vec::new();
    for line in text.lines() {
        let mut f = line.split_whitespace();
        let Some((lo, hi)) = f.next().and_then(|r| r.split_once('-')) else { continue };
        let name = f.nth(4).unwrap_or("[anon]").to_string();
        maps.push(Mapping { lo: u64::from_str_radix(lo, 16)?, hi: u64::from_str_radix(hi, 16)?, name });
    }
    Ok(maps)
}

/// A mapping's name as the table shows it: the session's files by their place in the session
/// directory (`maps/3`), other files by their base name.
fn short(name: &str) -> String {
    if let Some(i) = name.find("/userbpf-") {
        let rest = &name[i + 1..];
        return rest.split_once('/').map_or(rest, |(_, r)| r).to_string();
    }
    if name.starts_with('/') {
        return name.rsplit('/').next().unwrap_or(name).to_string();
    }
    name.to_string()
}

fn value(regs: &[u64; REGS], r: Register) -> Option<u64> {
    let full = r.full_register();
    let v = match full {
        Register::RAX => regs[RAX],
        Register::RBX => regs[RBX],
        Register::RCX => regs[RCX],
        Register::RDX => regs[RDX],
        Register::RSI => regs[RSI],
        Register::RDI => regs[RDI],
        Register::RBP => regs[RBP],
        Register::RSP => regs[RSP],
        Register::R8 => regs[R8],
        Register::R9 => regs[R9],
        Register::R10 => regs[R10],
        Register::R11 => regs[R11],
        Register::R12 => regs[R12],
        Register::R13 => regs[R13],
        Register::R14 => regs[R14],
        Register::R15 => regs[R15],
        Register::RIP => regs[RIP],
        Register::FS => regs[FS_BASE],
        Register::GS => regs[GS_BASE],
        Register::ES | Register::CS | Register::SS | Register::DS => 0,
        _ => return None,
    };
    // The low 32 bits for a 32-bit register used as an address part.
    Some(if r.size() == 4 { v & 0xffff_ffff } else { v })
}

/// Distinct lines and pages a run touched, by mapping name.
type Touched = BTreeMap<String, (BTreeSet<u64>, BTreeSet<u64>)>;

/// Every page touched: its mapping, its lines, the first instruction to touch it.
type PageLog = BTreeMap<u64, (String, BTreeSet<u64>, u64)>;

/// Every line touched: its mapping, the instructions that touched it and the offsets in the
/// line they reached (each access's first byte).
type LineLog = BTreeMap<u64, (String, BTreeSet<u64>, BTreeSet<u64>)>;

fn touched(states: &str, maps: &[Mapping], skip: &[String], log: &mut PageLog, lines: &mut LineLog) -> Result<Touched> {
    let data = std::fs::read(states).with_context(|| format!("reading {states}"))?;
    if data.len() % RECORD != 0 {
        bail!("{states}: {} bytes, not whole records of {RECORD}", data.len());
    }
    let exe = maps.iter().find(|m| m.name.starts_with('/')).map(|m| m.name.clone());
    let skipped = |name: &str| Some(name) == exe.as_deref() || skip.iter().any(|s| name.ends_with(s.as_str()));
    let find = |a: u64| maps.iter().find(|m| m.lo <= a && a < m.hi);
    let mut info = InstructionInfoFactory::new();
    let mut out = Touched::new();
    // The last record is the stop after the stepped stretch.
    for rec in data.chunks_exact(RECORD).take((data.len() / RECORD).saturating_sub(1)) {
        let mut regs = [0u64; REGS];
        for (k, w) in regs.iter_mut().enumerate() {
            *w = u64::from_ne_bytes(rec[8 * k..8 * k + 8].try_into()?);
        }
        let rip = regs[RIP];
        if find(rip).is_none_or(|m| skipped(&m.name)) {
            continue;
        }
        let mut d = Decoder::with_ip(64, &rec[REGS * 8..], rip, DecoderOptions::NONE);
        let insn = d.decode();
        if insn.is_invalid() {
            continue;
        }
        for (k, m) in info.info(&insn).used_memory().iter().enumerate() {
            let Some(addr) = m.virtual_address(k, |r, _, _| value(&regs, r)) else { continue };
            let size = m.memory_size().size().max(1) as u64;
            let name = find(addr).map_or("?".to_string(), |m| short(&m.name));
            let e = out.entry(name.clone()).or_default();
            lines
                .entry(addr >> 6)
                .or_insert_with(|| (name.clone(), BTreeSet::new(), BTreeSet::new()))
                .2
                .insert(addr & 63);
            for a in [addr, addr.saturating_add(size - 1)] {
                e.0.insert(a >> 6);
                e.1.insert(a >> 12);
                log.entry(a >> 12).or_insert_with(|| (name.clone(), BTreeSet::new(), rip)).1.insert(a >> 6);
                lines.entry(a >> 6).or_insert_with(|| (name.clone(), BTreeSet::new(), BTreeSet::new())).1.insert(rip);
            }
        }
    }
    Ok(out)
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut skip = Vec::new();
    let mut rest = Vec::new();
    let mut pages = false;
    let mut by_line = false;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if a == "--pages" {
            pages = true;
        } else if a == "--lines" {
            by_line = true;
        } else if a == "--skip" {
            skip.push(it.next().context("--skip needs a name")?.clone());
        } else {
            rest.push(a.clone());
        }
    }
    let Some(sep) = rest.iter().position(|a| a == "--") else {
        bail!(
            "usage: data-pages [--skip NAME]... [--pages] [--lines] STATES MAPS [STATES MAPS ...] -- LABEL [LABEL ...]"
        );
    };
    let (files, labels) = (&rest[..sep], &rest[sep + 1..]);
    if files.len() % 2 != 0 || files.len() / 2 != labels.len() {
        bail!("give STATES MAPS pairs and one label each");
    }
    let mut logs = Vec::new();
    let mut line_logs = Vec::new();
    let mut runs = Vec::new();
    for p in files.chunks(2) {
        let mut log = PageLog::new();
        let mut lines = LineLog::new();
        runs.push(touched(&p[0], &read_maps(&p[1])?, &skip, &mut log, &mut lines)?);
        logs.push(log);
        line_logs.push(lines);
    }
    println!("Distinct data lines (64 bytes) / pages (4 KiB) the probes' instructions touched, by mapping:");
    println!();
    println!("| mapping | {} |", labels.join(" | "));
    println!("| --- |{}", " ---: |".repeat(labels.len()));
    let names: BTreeSet<&String> = runs.iter().flat_map(|r| r.keys()).collect();
    for n in names {
        let cells: Vec<String> = runs
            .iter()
            .map(|r| r.get(n).map_or("0 / 0".into(), |(l, p)| format!("{} / {}", l.len(), p.len())))
            .collect();
        println!("| {} | {} |", n.replace('|', "/"), cells.join(" | "));
    }
    let totals: Vec<String> = runs
        .iter()
        .map(|r| {
            let lines: usize = r.values().map(|(l, _)| l.len()).sum();
            let pages: usize = r.values().map(|(_, p)| p.len()).sum();
            format!("**{lines} / {pages}**")
        })
        .collect();
    println!("| **total** | {} |", totals.join(" | "));
    if pages {
        for (label, log) in labels.iter().zip(&logs) {
            println!();
            println!("Pages of {label}: page, mapping, lines, the first instruction to touch it");
            for (page, (name, lines, rip)) in log {
                println!("{:#x} {name} {} {rip:#x}", page << 12, lines.len());
            }
        }
    }
    if by_line {
        for (label, log) in labels.iter().zip(&line_logs) {
            println!();
            println!("Lines of {label}: line, mapping, offsets reached in it, the instructions that touched it");
            for (line, (name, rips, offsets)) in log {
                let rips: Vec<String> = rips.iter().map(|r| format!("{r:#x}")).collect();
                let offsets: Vec<String> = offsets.iter().map(|o| format!("+{o}")).collect();
                println!("{:#x} {name} {} {}", line << 6, offsets.join(","), rips.join(" "));
            }
        }
    }
    Ok(())
}
