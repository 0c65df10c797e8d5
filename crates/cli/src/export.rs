//! `userbpf export --listen ADDR [--session NAME] [--config FILE] [--run-stats]`: a Prometheus
//! endpoint. `GET /metrics` answers in the Prometheus text format (0.0.4) from the session's
//! maps as they are at the scrape, read from shared memory as `userbpf map dump` reads them,
//! without stopping the programs that write them (ebpf_exporter's job, for userbpf's sessions).
//!
//! Without a config file, every map by these defaults:
//! - A map's integer values are gauges named `userbpf_map_NAME` (`NAME` with characters
//!   Prometheus does not allow turned into `_`; a struct value or a global-data section gives
//!   one gauge per integer member or variable, `userbpf_map_NAME_MEMBER`), labelled from the
//!   key's BTF: a struct key's members by their names, enums by their enumerator's name, char
//!   arrays as strings, other integers in decimal (`key` when the key is not a struct; hex
//!   bytes without BTF). Per-CPU values are summed over the CPUs, as ebpf_exporter does.
//!   Array entries that are zero are left out (arrays have every index); global-data
//!   sections (`.bss`, `.data`: one entry, no key type) have no key label. Pointers, floats and
//!   arrays inside values are not exported.
//! - An array (or per-CPU array) of 8-byte counters with `hist` in its name is a log2
//!   histogram as bpftrace and BCC keep them (slot k counts values in [2^k, 2^(k+1)), slot 0
//!   the values 0 and 1): a Prometheus histogram with cumulative buckets whose `le` is the
//!   largest integer of the slot (2^(k+1) - 1), `+Inf`, `_count`, and `_sum` as the lower
//!   bound the buckets allow (each count times its slot's smallest value: log2 slots do not
//!   keep the values themselves).
//!
//! With `--config FILE` (see [`config`]), the maps the file names become the metrics it
//! describes (names, help, counter/gauge/histogram, labels decoded from the key), and the
//! others are not exported unless it says `other_maps: true`. The file is read and checked
//! before the exporter listens: a bad one is an error naming the file, the entry and the
//! problem.
//!
//! Always, userbpf's own:
//! - per program (labels `id`, `program`, `type` as `bpftool prog show` prints them), summed
//!   over the session's processes, those gone included (their last values are folded into the
//!   session when they die, see `userbpf_runtime::prog_stats`, so the counters never go down
//!   while the session lives): `userbpf_program_runs_total` and
//!   `userbpf_program_run_time_seconds_total` (bpftool's `run_cnt` and `run_time_ns`, counted
//!   only while the session's run statistics are on: `--run-stats` holds them on while the
//!   exporter runs, as `kernel.bpf_stats_enabled` does for the kernel's),
//!   `userbpf_program_misses_total` (runs skipped: recursion on a thread or no CPU slot,
//!   bpftool's `recursion_misses`), `userbpf_program_errors_total` (runs ended by a fault or an
//!   out-of-bounds access), and the gauge `userbpf_program_processes` (live processes that
//!   prepared it). Read from the processes' counters files in the session: no signal, no
//!   system call and no lock in the programs' processes;
//! - per map: `userbpf_map_entries`, `userbpf_map_max_entries`, and for perf event arrays
//!   `userbpf_map_lost_samples_total` (samples dropped because a ring was full);
//! - `userbpf_session_processes`, `userbpf_programs`, `userbpf_links`,
//!   `userbpf_run_stats_enabled`, and the scrape's own duration.
//!
//! Not exported: the hook engine's process-wide counters (hits skipped because the thread was
//! already in a handler, return probes dropped on a full shadow stack), which are not per
//! program and stay in each process.
//!
//! The exporter joins the session (creating it if needed, so it can start before the
//! programs are loaded), which keeps the maps for scrapes after their loader has left.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::Args;
use userbpf_maps::{Map, MapType};
use userbpf_object::Btf;
use userbpf_object::btf::TypeKind;
use userbpf_runtime::Session;

use userbpf_runtime::prog_stats;

use crate::dump::{entries, is_log2_hist};

mod config;
use config::{BucketType, Config, Kind, Source};

#[derive(Args)]
#[command(after_long_help = AFTER_HELP)]
pub struct ExportArgs {
    /// Address to listen on (`127.0.0.1:9435`; port 0 picks a free one, printed at start).
    #[arg(long, value_name = "ADDR:PORT")]
    listen: String,
    /// Which maps become which metrics: a YAML file in ebpf_exporter's spirit (names, help,
    /// counter/gauge/histogram, labels decoded from the key). Without it every map is
    /// exported by the defaults below.
    #[arg(long, value_name = "FILE")]
    config: Option<std::path::PathBuf>,
    /// Count the programs' runs and their time in every process of the session while the
    /// exporter runs (the kernel's `kernel.bpf_stats_enabled`). Not free: runs then leave the
    /// probes' lean path and read the clock twice (about 90 ns more a hit on this machine).
    #[arg(long)]
    run_stats: bool,
}

const AFTER_HELP: &str = "\
Metrics:
  userbpf_map_NAME[_MEMBER]          a map's integer values (gauges), labels from the key's BTF
  userbpf_map_NAME_bucket/_sum/_count  arrays with `hist` in their name (log2 histograms)
  userbpf_program_runs_total         runs per program (id, program, type), summed over the
                                     session's processes, those gone included (--run-stats)
  userbpf_program_run_time_seconds_total  time in the programs (--run-stats)
  userbpf_program_misses_total       runs skipped (recursion, no CPU slot): bpftool's recursion_misses
  userbpf_program_errors_total       runs ended by a fault or an out-of-bounds access
  userbpf_program_processes          live processes running the program
  userbpf_map_entries, userbpf_map_max_entries, userbpf_map_lost_samples_total (perf event arrays),
  userbpf_programs, userbpf_links, userbpf_session_processes, userbpf_run_stats_enabled

Config file (--config), for example:
  prefix: app_
  metrics:
    counters:
      - name: calls_total
        help: Calls per function.
        map: counts
        labels:
          - name: function
            field: key
            decoders:
              - name: static_map
                static_map: {0: alpha, 1: beta}
    histograms:
      - name: latency_seconds
        map: hist
        bucket_type: log2          # or linear
        bucket_multiplier: 0.000000001
Decoders: uint, int, hex, string, inet_ip, syscall (read the key's bytes: first in a list),
static_map (allow_unknown: keep values not in the table), regexp (regexps: keep matching values).
A label reads a BTF member of the key (field, default: its name) or size bytes at offset.
Only the maps the file names are exported (other_maps: true exports the rest by the defaults).";

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_stop(_: libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

pub fn run(session: &str, args: ExportArgs) -> Result<()> {
    let config = match &args.config {
        Some(path) => Some(config::load(path)?),
        None => None,
    };
    let s = Session::open(session).with_context(|| format!("opening session {session}"))?;
    let _hold = if args.run_stats {
        Some(prog_stats::hold_run_stats(s.layout()).context("turning the session's run statistics on")?)
    } else {
        None
    };
    let listener = TcpListener::bind(&args.listen).with_context(|| format!("listening on {}", args.listen))?;
    let addr = listener.local_addr()?;
    println!("userbpf export: serving session {session} at http://{addr}/metrics");
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: the handler only stores to an atomic (async-signal-safe); sigaction reads a
        // zeroed struct with the handler set.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_stop as extern "C" fn(libc::c_int) as usize;
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
    let mut cache = Cache { config, ..Default::default() };
    while !STOP.load(Ordering::Relaxed) {
        let mut pfd = libc::pollfd { fd: listener.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd for the duration of the call.
        if unsafe { libc::poll(&mut pfd, 1, 200) } <= 0 {
            continue;
        }
        let Ok((stream, _)) = listener.accept() else { continue };
        if let Err(e) = serve(stream, &s, &mut cache) {
            eprintln!("userbpf export: {e:#}");
        }
    }
    Ok(())
}

fn serve(mut stream: TcpStream, s: &Session, cache: &mut Cache) -> Result<()> {
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut req = Vec::new();
    let mut buf = [0u8; 1024];
    while !req.windows(4).any(|w| w == b"\r\n\r\n") && req.len() < 16384 {
        let n = stream.read(&mut buf)?;
        if n == 0 {
            break;
        }
        req.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8_lossy(&req);
    let mut first = text.lines().next().unwrap_or("").split_whitespace();
    let (method, path) = (first.next().unwrap_or(""), first.next().unwrap_or(""));
    let (status, ctype, body) = match (method, path.split('?').next().unwrap_or("")) {
        ("GET", "/metrics") => ("200 OK", "text/plain; version=0.0.4; charset=utf-8", metrics(s, cache)),
        ("GET", "/") => (
            "200 OK",
            "text/html; charset=utf-8",
            format!(
                "<html><body><h1>userbpf export</h1><p>session {}: <a href=\"/metrics\">/metrics</a></p></body></html>\n",
                s.name()
            ),
        ),
        ("GET", _) => ("404 Not Found", "text/plain; charset=utf-8", "not found: try /metrics\n".to_string()),
        _ => ("405 Method Not Allowed", "text/plain; charset=utf-8", "only GET\n".to_string()),
    };
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes())?;
    stream.write_all(body.as_bytes())?;
    Ok(())
}

/// Maps and BTF opened by earlier scrapes (a map's file and its id stay the same while the
/// session lives).
#[derive(Default)]
struct Cache {
    maps: BTreeMap<u32, Map>,
    btf: BTreeMap<u32, Option<Btf>>,
    config: Option<Config>,
    /// Problems already reported (each is printed once).
    reported: std::collections::HashSet<String>,
}

impl Cache {
    fn report(&mut self, msg: String) {
        if self.reported.insert(msg.clone()) {
            eprintln!("userbpf export: {msg}");
        }
    }
}

/// One metric family: its type, help and sample lines.
struct Family {
    kind: &'static str,
    help: String,
    lines: Vec<String>,
}

#[derive(Default)]
struct Out {
    families: BTreeMap<String, Family>,
}

impl Out {
    fn sample(
        &mut self,
        name: &str,
        kind: &'static str,
        help: &str,
        labels: &[(String, String)],
        value: impl std::fmt::Display,
    ) {
        self.sample_suffix(name, "", kind, help, labels, value);
    }

    fn sample_suffix(
        &mut self,
        name: &str,
        suffix: &str,
        kind: &'static str,
        help: &str,
        labels: &[(String, String)],
        value: impl std::fmt::Display,
    ) {
        let f = self.families.entry(name.to_string()).or_insert_with(|| Family {
            kind,
            help: help.to_string(),
            lines: Vec::new(),
        });
        let mut line = format!("{name}{suffix}");
        if !labels.is_empty() {
            let l: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{}\"", escape(v))).collect();
            let _ = write!(line, "{{{}}}", l.join(","));
        }
        let _ = write!(line, " {value}");
        f.lines.push(line);
    }

    /// Declares a family (HELP and TYPE lines) that may have no sample yet.
    fn declare(&mut self, name: &str, kind: &'static str, help: &str) {
        self.families.entry(name.to_string()).or_insert_with(|| Family {
            kind,
            help: help.to_string(),
            lines: Vec::new(),
        });
    }

    fn text(&self) -> String {
        let mut s = String::new();
        for (name, f) in &self.families {
            let _ = writeln!(s, "# HELP {name} {}", f.help.replace('\\', "\\\\").replace('\n', "\\n"));
            let _ = writeln!(s, "# TYPE {name} {}", f.kind);
            for l in &f.lines {
                let _ = writeln!(s, "{l}");
            }
        }
        s
    }
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// A metric or label name made of what Prometheus allows (`[a-zA-Z0-9_]`, no leading digit).
fn sanitize(s: &str) -> String {
    let mut out: String = s.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' { c } else { '_' }).collect();
    if out.is_empty() || out.starts_with(|c: char| c.is_ascii_digit()) {
        out.insert(0, '_');
    }
    out
}

/// One map of the session at a scrape, with what describes it.
struct MapView<'a> {
    rec: &'a userbpf_runtime::session::MapRecord,
    map: &'a Map,
    btf: Option<&'a Btf>,
    all: &'a [(Vec<u8>, Vec<u8>)],
}

impl MapView<'_> {
    /// A value's integer leaves, per-CPU values summed over the CPUs.
    fn sums(&self, v: &[u8]) -> Vec<(String, Num)> {
        let spec = self.map.spec();
        let vs = spec.value_size as usize;
        let stride = vs.div_ceil(8) * 8;
        let slots: Vec<&[u8]> = if spec.map_type.is_percpu() {
            (0..self.map.nr_cpus() as usize).filter_map(|c| v.get(c * stride..c * stride + vs)).collect()
        } else {
            vec![&v[..vs.min(v.len())]]
        };
        let mut sums: Vec<(String, Num)> = Vec::new();
        for slot in slots {
            let mut leaves = Vec::new();
            value_leaves(self.btf, self.rec.value_type_id, slot, String::new(), &mut leaves);
            if sums.is_empty() {
                sums = leaves;
            } else {
                for ((_, acc), (_, x)) in sums.iter_mut().zip(leaves) {
                    *acc = acc.add(x);
                }
            }
        }
        sums
    }

    fn is_array(&self) -> bool {
        matches!(self.map.spec().map_type, MapType::BPF_MAP_TYPE_ARRAY | MapType::BPF_MAP_TYPE_PERCPU_ARRAY)
    }
}

fn metrics(s: &Session, cache: &mut Cache) -> String {
    let started = Instant::now();
    let mut out = Out::default();
    let records = s.maps().unwrap_or_default();
    // Maps gone from the session (their object unloaded) are let go.
    cache.maps.retain(|id, _| records.iter().any(|r| r.id == *id));
    for r in &records {
        if let std::collections::btree_map::Entry::Vacant(e) = cache.maps.entry(r.id)
            && let Ok(m) = s.open_map(r.id)
        {
            e.insert(m);
        }
        if let Some(id) = r.btf_id {
            cache.btf.entry(id).or_insert_with(|| s.btf(id).ok().and_then(|b| Btf::parse(&b).ok()));
        }
    }
    let mut used_names = std::collections::HashSet::new();
    let mut contents = Vec::new();
    for r in &records {
        let Some(map) = cache.maps.get(&r.id) else { continue };
        let iterable = crate::dump::iterable(map);
        contents.push(if iterable { Some(entries(map)) } else { None });
    }
    let mut notes = Vec::new();
    {
        let mut it = contents.iter();
        for r in &records {
            let Some(map) = cache.maps.get(&r.id) else { continue };
            let all = it.next().and_then(|c| c.as_ref());
            let btf = r.btf_id.and_then(|id| cache.btf.get(&id)).and_then(|b| b.as_ref());
            let spec = map.spec();
            let mlabels = [("map".to_string(), r.name.clone()), ("type".to_string(), spec.map_type.name().to_string())];
            out.sample("userbpf_map_max_entries", "gauge", "The map's max_entries.", &mlabels, spec.max_entries);
            if let Map::PerfEventArray(p) = map {
                let rings = spec.max_entries.max(map.nr_cpus());
                let lost: u64 = (0..rings).map(|i| p.lost_total(i)).sum();
                out.sample(
                    "userbpf_map_lost_samples_total",
                    "counter",
                    "Samples a perf event array could not take (its ring full), over its rings.",
                    &mlabels,
                    lost,
                );
            }
            let Some(all) = all else { continue };
            out.sample(
                "userbpf_map_entries",
                "gauge",
                "Keys present in the map (arrays: every index).",
                &mlabels,
                all.len(),
            );
            let view = MapView { rec: r, map, btf, all };
            match &cache.config {
                Some(cfg) => {
                    for m in cfg.metrics.iter().filter(|m| m.map == r.name) {
                        if let Err(e) = configured(&mut out, m, &view) {
                            notes.push(format!("{} (map {}): {e}", m.at, r.name));
                        }
                    }
                    if cfg.other_maps && !cfg.names_map(&r.name) {
                        default_map(&mut out, &view, s.name(), &mut used_names);
                    }
                }
                None => default_map(&mut out, &view, s.name(), &mut used_names),
            }
        }
    }
    if let Some(cfg) = &cache.config {
        for m in &cfg.metrics {
            if !records.iter().any(|r| r.name == m.map) {
                notes.push(format!("{}: no map `{}` in session {} (yet)", m.at, m.map, s.name()));
            }
        }
    }
    for n in notes {
        cache.report(n);
    }
    if let Err(e) = programs(&mut out, s) {
        cache.report(format!("the programs' counters: {e}"));
    }
    let links = s.links().map(|l| l.len()).unwrap_or(0);
    let members = s.live_members().map(|m| m.len()).unwrap_or(0);
    out.sample("userbpf_links", "gauge", "Links (attachments) in the session.", &[], links);
    out.sample(
        "userbpf_session_processes",
        "gauge",
        "Live processes using the session (targets, loaders, this exporter).",
        &[],
        members,
    );
    out.sample(
        "userbpf_scrape_duration_seconds",
        "gauge",
        "Time this scrape took to read the maps.",
        &[],
        format!("{:.6}", started.elapsed().as_secs_f64()),
    );
    out.text()
}

/// The programs' counters: from the processes' counters files in the session (see
/// `userbpf_runtime::prog_stats`), summed per program over the processes live and gone.
/// Counters that cannot be read are left out (never exported as zeros: a counter that went
/// down would look like a reset).
fn programs(out: &mut Out, s: &Session) -> std::io::Result<()> {
    let progs = s.progs()?;
    out.sample("userbpf_programs", "gauge", "Programs loaded in the session.", &[], progs.len());
    let snap = prog_stats::read(s.layout())?;
    out.sample(
        "userbpf_run_stats_enabled",
        "gauge",
        "1 while the session counts runs and their time (userbpf export --run-stats).",
        &[],
        snap.switch_on as u8,
    );
    let totals = snap.totals();
    let mut ids: Vec<u32> = progs.iter().map(|p| p.id).chain(totals.keys().copied()).collect();
    ids.sort_unstable();
    ids.dedup();
    for id in ids {
        let rec = progs.iter().find(|p| p.id == id);
        let t = totals.get(&id).cloned().unwrap_or_default();
        let name = rec.map(|r| r.name.clone()).unwrap_or_else(|| t.name.clone());
        let kind = rec.map(|r| r.prog_type.clone()).unwrap_or_else(|| "unknown".to_string());
        let labels = [("id".to_string(), id.to_string()), ("program".to_string(), name), ("type".to_string(), kind)];
        let live = snap.processes.iter().filter(|p| p.progs.iter().any(|x| x.id == id)).count();
        out.sample(
            "userbpf_program_runs_total",
            "counter",
            "Runs of the program in the session's processes (bpftool's run_cnt; counted while run statistics are on).",
            &labels,
            t.run_cnt,
        );
        out.sample(
            "userbpf_program_run_time_seconds_total",
            "counter",
            "Time spent in the program (bpftool's run_time_ns; counted while run statistics are on).",
            &labels,
            format!("{:.9}", t.run_time_ns as f64 / 1e9),
        );
        out.sample(
            "userbpf_program_misses_total",
            "counter",
            "Runs skipped: recursion on a thread or no CPU slot free (bpftool's recursion_misses).",
            &labels,
            t.missed,
        );
        out.sample(
            "userbpf_program_errors_total",
            "counter",
            "Runs ended by an error (a fault, an out-of-bounds access).",
            &labels,
            t.errors,
        );
        out.sample(
            "userbpf_program_processes",
            "gauge",
            "Live processes of the session that prepared the program.",
            &labels,
            live,
        );
    }
    Ok(())
}

/// A map by the defaults (see the module's documentation).
fn default_map(out: &mut Out, v: &MapView, session: &str, used_names: &mut std::collections::HashSet<String>) {
    let r = v.rec;
    // libbpf's USDT bookkeeping is not data.
    if r.name.starts_with("__bpf_usdt_") {
        return;
    }
    let mut base = format!("userbpf_map_{}", sanitize(&r.name));
    if !used_names.insert(base.clone()) {
        base = format!("{base}_{}", r.id);
    }
    if is_log2_hist(v.map) {
        histogram(out, &base, &r.name, v.all);
        return;
    }
    let spec = v.map.spec();
    let is_array = v.is_array();
    for (k, val) in v.all {
        let sums = v.sums(val);
        if is_array && sums.iter().all(|(_, n)| n.is_zero()) {
            continue;
        }
        let mut labels = Vec::new();
        // A global-data section (`.bss`, `.data`): one entry, no key worth a label.
        let global_data = r.key_type_id.is_none() && spec.max_entries == 1 && is_array;
        if !global_data {
            key_labels(v.btf, r.key_type_id, k, &mut labels);
        }
        for (suffix, n) in sums {
            let name = if suffix.is_empty() { base.clone() } else { format!("{base}_{suffix}") };
            out.sample(&name, "gauge", &format!("Values of map {} (userbpf session {session}).", r.name), &labels, n);
        }
    }
}

/// Where a key's part is: its bytes and the key's BTF rendering of them; `end` is where it
/// ends (the default offset of a `size` label after it).
fn key_part(v: &MapView, source: &Source, key: &[u8], end: &mut usize) -> Result<(Vec<u8>, String), String> {
    match source {
        Source::Bytes { offset, size } => {
            let off = offset.unwrap_or(*end);
            let b = key
                .get(off..off + size)
                .ok_or_else(|| format!("bytes {off}..{} are past the key's {} bytes", off + size, key.len()))?;
            *end = off + size;
            let text = match size {
                1 | 2 | 4 | 8 => int_at(b, *size, false).map(|n| n.to_string()).unwrap_or_default(),
                _ => hex(b),
            };
            Ok((b.to_vec(), text))
        }
        Source::Field(f) => {
            let (Some(btf), Some(ty)) = (v.btf, v.rec.key_type_id) else {
                if f == "key" {
                    *end = key.len();
                    let mut l = Vec::new();
                    key_labels(None, None, key, &mut l);
                    return Ok((key.to_vec(), l.pop().map(|x| x.1).unwrap_or_default()));
                }
                return Err(format!(
                    "the key has no BTF, so field `{f}` cannot be found: read it with `size` (and `offset`)"
                ));
            };
            let id = btf.skip_mods_and_typedefs(ty).map_err(|e| e.to_string())?;
            let t = btf.get(id).map_err(|e| e.to_string())?;
            match &t.kind {
                TypeKind::Struct(c) | TypeKind::Union(c) => {
                    let mut names = Vec::new();
                    for m in &c.members {
                        let n = btf.name_of(m.name_off);
                        if n == f.as_str() {
                            let off = m.bit_offset as usize / 8;
                            let size = btf.resolve_size(m.type_id).map_err(|e| e.to_string())? as usize;
                            let b = key.get(off..off + size).ok_or("the key is shorter than its BTF")?;
                            *end = off + size;
                            return Ok((b.to_vec(), label_text(btf, m.type_id, b)));
                        }
                        names.push(n.to_string());
                    }
                    Err(format!("the key has no member `{f}` (its members: {})", names.join(", ")))
                }
                _ if f == "key" => {
                    *end = key.len();
                    Ok((key.to_vec(), label_text(btf, ty, key)))
                }
                _ => Err(format!("the key is not a struct, so it has no member `{f}`: use `field: key`")),
            }
        }
    }
}

/// A configured key's labels; None: a decoder left the sample out.
fn config_labels(v: &MapView, labels: &[config::Label], key: &[u8]) -> Result<Option<Vec<(String, String)>>, String> {
    let mut out = Vec::new();
    let mut end = 0;
    for l in labels {
        let (bytes, text) = key_part(v, &l.source, key, &mut end).map_err(|e| format!("label `{}`: {e}", l.name))?;
        match config::decode(&l.decoders, &bytes, text).map_err(|e| format!("label `{}`: {e}", l.name))? {
            Some(x) => out.push((l.name.clone(), x)),
            None => return Ok(None),
        }
    }
    Ok(Some(out))
}

/// The one value a configured metric takes from a value's leaves.
fn pick_value(sums: &[(String, Num)], member: Option<&str>) -> Result<Num, String> {
    match member {
        Some(m) => {
            let want = m.replace('.', "_");
            sums.iter().find(|(n, _)| *n == want).map(|x| x.1).ok_or_else(|| {
                let names: Vec<&str> = sums.iter().map(|x| x.0.as_str()).collect();
                format!("the value has no integer member `{m}` (its members: {})", names.join(", "))
            })
        }
        None => match sums {
            [(_, n)] => Ok(*n),
            [] => Err("the value holds no integer".to_string()),
            _ => {
                let names: Vec<&str> = sums.iter().map(|x| x.0.as_str()).collect();
                Err(format!("the value has several integers ({}): name one with `value:`", names.join(", ")))
            }
        },
    }
}

/// A metric of the config file from its map.
fn configured(out: &mut Out, m: &config::Metric, v: &MapView) -> Result<(), String> {
    match m.kind {
        Kind::Counter | Kind::Gauge => {
            let kind = if m.kind == Kind::Counter { "counter" } else { "gauge" };
            let mut series: BTreeMap<Vec<(String, String)>, Num> = BTreeMap::new();
            for (k, val) in v.all {
                let n = pick_value(&v.sums(val), m.value.as_deref())?;
                if v.is_array() && n.is_zero() {
                    continue;
                }
                let Some(labels) = config_labels(v, &m.labels, k)? else { continue };
                let e = series.entry(labels).or_insert(Num::U(0));
                *e = e.add(n);
            }
            // The family is declared even while empty.
            out.declare(&m.name, kind, &m.help);
            for (labels, n) in series {
                out.sample(&m.name, kind, &m.help, &labels, n);
            }
        }
        Kind::Histogram { buckets, multiplier } => {
            let mut groups: BTreeMap<Vec<(String, String)>, BTreeMap<u64, u64>> = BTreeMap::new();
            let bucket_source = match &m.bucket_field {
                Some(f) => Source::Field(f.clone()),
                None => match (v.btf, v.rec.key_type_id) {
                    (Some(btf), Some(ty)) => match btf.skip_mods_and_typedefs(ty).ok().and_then(|i| btf.get(i).ok()) {
                        Some(t) => match &t.kind {
                            TypeKind::Struct(c) | TypeKind::Union(c) => match c.members.last() {
                                Some(last) => Source::Field(btf.name_of(last.name_off).to_string()),
                                None => return Err("the key is an empty struct".to_string()),
                            },
                            _ => Source::Field("key".to_string()),
                        },
                        None => Source::Field("key".to_string()),
                    },
                    _ => Source::Field("key".to_string()),
                },
            };
            for (k, val) in v.all {
                let n = pick_value(&v.sums(val), None)?;
                let count = match n {
                    Num::U(x) => x,
                    Num::I(x) => x.max(0) as u64,
                };
                let mut end = 0;
                let (bytes, _) = key_part(v, &bucket_source, k, &mut end).map_err(|e| format!("the bucket: {e}"))?;
                let slot = match bytes.len() {
                    1 | 2 | 4 | 8 => int_at(&bytes, bytes.len(), false).map(|n| match n {
                        Num::U(x) => x,
                        Num::I(x) => x as u64,
                    }),
                    _ => None,
                }
                .ok_or_else(|| format!("the bucket is {} bytes, not an integer", bytes.len()))?;
                let Some(labels) = config_labels(v, &m.labels, k)? else { continue };
                *groups.entry(labels).or_default().entry(slot).or_default() += count;
            }
            out.declare(&m.name, "histogram", &m.help);
            for (labels, slots) in groups {
                let last = slots.keys().next_back().copied().unwrap_or(0).min(4096);
                let (mut cum, mut sum) = (0u64, 0f64);
                let with = |le: String| {
                    let mut l = labels.clone();
                    l.push(("le".to_string(), le));
                    l
                };
                for k in 0..=last {
                    let c = slots.get(&k).copied().unwrap_or(0);
                    cum += c;
                    let (lo, le) = match buckets {
                        BucketType::Log2 => {
                            let lo = if k == 0 { 0.0 } else { 2f64.powi(k as i32) };
                            (lo, 2f64.powi(k as i32 + 1) - 1.0)
                        }
                        BucketType::Linear => (k as f64, k as f64 + 1.0),
                    };
                    sum += lo * multiplier * c as f64;
                    out.sample_suffix(&m.name, "_bucket", "histogram", &m.help, &with(float(le * multiplier)), cum);
                }
                out.sample_suffix(&m.name, "_bucket", "histogram", &m.help, &with("+Inf".to_string()), cum);
                out.sample_suffix(&m.name, "_sum", "histogram", &m.help, &labels, float(sum));
                out.sample_suffix(&m.name, "_count", "histogram", &m.help, &labels, cum);
            }
        }
    }
    Ok(())
}

/// A float as the text format takes it: integers as such, others with 15 significant digits
/// (`2.55e-7`, not the `2.5500000000000004e-7` that the product of a multiplier can be).
fn float(x: f64) -> String {
    if x.fract() == 0.0 && x.abs() < 9.0e15 {
        return format!("{}", x as i64);
    }
    let s = format!("{x:.14e}");
    match s.split_once('e') {
        Some((m, e)) => {
            let m = if m.contains('.') { m.trim_end_matches('0').trim_end_matches('.') } else { m };
            format!("{m}e{e}")
        }
        None => s,
    }
}

/// A log2 histogram map as a Prometheus histogram (see the module's documentation).
fn histogram(out: &mut Out, base: &str, name: &str, all: &[(Vec<u8>, Vec<u8>)]) {
    let mut counts = [0u64; 64];
    for (k, v) in all {
        let slot = u32::from_ne_bytes([k[0], k[1], k[2], k[3]]) as usize;
        if slot < 64 {
            counts[slot] += v.chunks(8).map(|c| u64::from_ne_bytes(c.try_into().unwrap_or([0; 8]))).sum::<u64>();
        }
    }
    let help = format!("Log2 histogram map {name}: slot k counts values in [2^k, 2^(k+1)).");
    let last = counts.iter().rposition(|&c| c > 0).unwrap_or(0);
    let (mut cum, mut sum) = (0u64, 0u128);
    for (k, &c) in counts.iter().enumerate().take(last + 1) {
        cum += c;
        let lo: u128 = if k == 0 { 0 } else { 1u128 << k };
        sum += lo * c as u128;
        let le = (1u128 << (k + 1)) - 1;
        out.sample_suffix(base, "_bucket", "histogram", &help, &[("le".to_string(), le.to_string())], cum);
    }
    out.sample_suffix(base, "_bucket", "histogram", &help, &[("le".to_string(), "+Inf".to_string())], cum);
    out.sample_suffix(base, "_sum", "histogram", &help, &[], sum);
    out.sample_suffix(base, "_count", "histogram", &help, &[], cum);
}

/// A number read from a map.
#[derive(Clone, Copy)]
enum Num {
    U(u64),
    I(i64),
}

impl Num {
    fn add(self, o: Num) -> Num {
        match (self, o) {
            (Num::U(a), Num::U(b)) => Num::U(a.wrapping_add(b)),
            (Num::I(a), Num::I(b)) => Num::I(a.wrapping_add(b)),
            (Num::U(a), Num::I(b)) | (Num::I(b), Num::U(a)) => Num::I((a as i64).wrapping_add(b)),
        }
    }

    fn is_zero(self) -> bool {
        matches!(self, Num::U(0) | Num::I(0))
    }
}

impl std::fmt::Display for Num {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Num::U(v) => write!(f, "{v}"),
            Num::I(v) => write!(f, "{v}"),
        }
    }
}

/// The integer of `size` bytes at the start of `data`.
fn int_at(data: &[u8], size: usize, signed: bool) -> Option<Num> {
    let b = data.get(..size)?;
    let mut x = [0u8; 8];
    x[..size.min(8)].copy_from_slice(&b[..size.min(8)]);
    let u = u64::from_ne_bytes(x);
    Some(if signed {
        let shift = 64 - 8 * size.min(8) as u32;
        Num::I(((u << shift) as i64) >> shift)
    } else {
        Num::U(u)
    })
}

/// The integer leaves of a value: `("", n)` for an integer or enum, `("member", n)` per
/// integer member of a struct (nested members joined by `_`), per variable of a section.
fn value_leaves(btf: Option<&Btf>, ty: Option<u32>, data: &[u8], prefix: String, out: &mut Vec<(String, Num)>) {
    let (Some(btf), Some(ty)) = (btf, ty) else {
        // No BTF: an 8- or 4-byte value is a counter.
        if matches!(data.len(), 4 | 8)
            && let Some(n) = int_at(data, data.len(), false)
        {
            out.push((prefix, n));
        }
        return;
    };
    let Ok(id) = btf.skip_mods_and_typedefs(ty) else { return };
    let Ok(t) = btf.get(id) else { return };
    let join = |name: &str| if prefix.is_empty() { sanitize(name) } else { format!("{prefix}_{}", sanitize(name)) };
    match &t.kind {
        TypeKind::Int(i) if i.size <= 8 && i.offset == 0 => {
            if let Some(n) = int_at(data, i.size as usize, i.is_signed()) {
                out.push((prefix, n));
            }
        }
        TypeKind::Enum(e) | TypeKind::Enum64(e) => {
            if let Some(n) = int_at(data, e.size as usize, e.signed) {
                out.push((prefix, n));
            }
        }
        TypeKind::Struct(c) | TypeKind::Union(c) => {
            for (i, m) in c.members.iter().enumerate() {
                let name = btf.name_of(m.name_off);
                let name = if name.is_empty() { format!("field{i}") } else { name.to_string() };
                if m.bitfield_size != 0 {
                    let (off, bits) = (m.bit_offset as usize, m.bitfield_size as usize);
                    if bits <= 64 {
                        let mut raw = [0u8; 16];
                        let start = off / 8;
                        let len = (data.len().saturating_sub(start)).min(16);
                        raw[..len].copy_from_slice(&data[start..start + len]);
                        let v = (u128::from_ne_bytes(raw) >> (off % 8)) & ((1u128 << bits) - 1);
                        out.push((join(&name), Num::U(v as u64)));
                    }
                    continue;
                }
                let start = m.bit_offset as usize / 8;
                if let Some(d) = data.get(start..) {
                    value_leaves(Some(btf), Some(m.type_id), d, join(&name), out);
                }
            }
        }
        TypeKind::Datasec(d) => {
            for v in &d.vars {
                let Ok(var) = btf.get(v.type_id) else { continue };
                let TypeKind::Var { type_id, .. } = var.kind else { continue };
                let name = btf.name_of(var.name_off).to_string();
                if let Some(d) = data.get(v.offset as usize..(v.offset + v.size) as usize) {
                    value_leaves(Some(btf), Some(type_id), d, join(&name), out);
                }
            }
        }
        _ => {}
    }
}

/// Labels from a key: a struct's members by name, otherwise one label `key`.
fn key_labels(btf: Option<&Btf>, ty: Option<u32>, data: &[u8], out: &mut Vec<(String, String)>) {
    if let (Some(btf), Some(ty)) = (btf, ty)
        && let Ok(id) = btf.skip_mods_and_typedefs(ty)
        && let Ok(t) = btf.get(id)
    {
        if let TypeKind::Struct(c) | TypeKind::Union(c) = &t.kind {
            for (i, m) in c.members.iter().enumerate() {
                let name = btf.name_of(m.name_off);
                let name = if name.is_empty() { format!("field{i}") } else { sanitize(name) };
                let name = if name.starts_with("__") { format!("key{name}") } else { name };
                let start = m.bit_offset as usize / 8;
                let v = data.get(start..).map(|d| label_text(btf, m.type_id, d)).unwrap_or_default();
                out.push((name, v));
            }
            return;
        }
        out.push(("key".to_string(), label_text(btf, ty, data)));
        return;
    }
    let v = match data.len() {
        4 | 8 => int_at(data, data.len(), false).map(|n| n.to_string()).unwrap_or_default(),
        _ => hex(data),
    };
    out.push(("key".to_string(), v));
}

fn hex(d: &[u8]) -> String {
    d.iter().map(|b| format!("{b:02x}")).collect()
}

/// A key's field as a label value: integers in decimal, enums by name, char arrays as
/// strings, pointers in hex, anything else as hex bytes.
fn label_text(btf: &Btf, ty: u32, data: &[u8]) -> String {
    let Ok(id) = btf.skip_mods_and_typedefs(ty) else { return hex(data) };
    let Ok(t) = btf.get(id) else { return hex(data) };
    match &t.kind {
        TypeKind::Int(i) if i.size <= 8 => {
            int_at(data, i.size as usize, i.is_signed()).map(|n| n.to_string()).unwrap_or_default()
        }
        TypeKind::Enum(e) | TypeKind::Enum64(e) => {
            let Some(n) = int_at(data, e.size as usize, e.signed) else { return String::new() };
            let raw = match n {
                Num::U(v) => v,
                Num::I(v) => v as u64,
            };
            let mask = if e.size >= 8 { u64::MAX } else { (1u64 << (8 * e.size)) - 1 };
            e.values
                .iter()
                .find(|v| v.value & mask == raw & mask)
                .map(|v| btf.name_of(v.name_off).to_string())
                .unwrap_or_else(|| n.to_string())
        }
        TypeKind::Array(a) => {
            let elem = btf.skip_mods_and_typedefs(a.elem_type).ok().and_then(|e| btf.get(e).ok());
            let size = (a.nelems as usize).min(data.len());
            match elem.map(|e| &e.kind) {
                Some(TypeKind::Int(i)) if i.size == 1 => {
                    let b = &data[..size];
                    let n = b.iter().position(|&c| c == 0).unwrap_or(b.len());
                    String::from_utf8_lossy(&b[..n]).into_owned()
                }
                _ => btf.resolve_size(id).map(|s| hex(&data[..(s as usize).min(data.len())])).unwrap_or_default(),
            }
        }
        TypeKind::Ptr(_) => int_at(data, 8, false)
            .map(|n| {
                format!(
                    "{:#x}",
                    match n {
                        Num::U(v) => v,
                        Num::I(v) => v as u64,
                    }
                )
            })
            .unwrap_or_default(),
        _ => btf.resolve_size(id).map(|s| hex(&data[..(s as usize).min(data.len())])).unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_labels_are_what_prometheus_allows() {
        assert_eq!(sanitize("latency.bss"), "latency_bss");
        assert_eq!(sanitize("9lives"), "_9lives");
        assert_eq!(escape("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }

    #[test]
    fn floats_are_short() {
        assert_eq!(float(255.0 * 1e-9), "2.55e-7");
        assert_eq!(float(3.0 * 1e-9), "3e-9");
        assert_eq!(float(1024.0), "1024");
        assert_eq!(float(0.5), "5e-1");
        assert_eq!("2.55e-7".parse::<f64>().unwrap(), 255.0 * 1e-9_f64 + 0.0 * 1e-30);
    }

    #[test]
    fn log2_slots_become_cumulative_buckets() {
        let mut out = Out::default();
        let all: Vec<(Vec<u8>, Vec<u8>)> = [(0u32, 2u64), (1, 0), (2, 3)]
            .iter()
            .map(|&(k, v)| (k.to_ne_bytes().to_vec(), v.to_ne_bytes().to_vec()))
            .collect();
        histogram(&mut out, "h", "h", &all);
        let t = out.text();
        assert!(t.contains("h_bucket{le=\"1\"} 2\nh_bucket{le=\"3\"} 2\nh_bucket{le=\"7\"} 5\nh_bucket{le=\"+Inf\"} 5\nh_sum 12\nh_count 5\n"), "{t}");
    }
}
