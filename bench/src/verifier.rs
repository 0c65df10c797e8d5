//! Verification time, userbpf's verifier beside the kernel's, for the largest programs:
//! the project's objects (given on the command line), libbpf-tools' (the objects embedded in
//! /usr/sbin's tools by their skeletons, relocated against the running kernel's BTF) and
//! bpftrace's (recorded in a session by `userbpf load`, given as `--session NAME`).
//!
//! Then what verification buys the map helpers: their cost trusting their key and value
//! pointers (every program verified) beside distrusting them (verification off).
//!
//! Each program is loaded into the kernel (`BPF_PROG_LOAD` with `BPF_LOG_STATS`: the
//! kernel's own "verification time N usec") and verified by userbpf's verifier in the same
//! run, alternately, `ROUNDS` times; medians are printed side by side for the programs both
//! accept, largest (by instructions processed) first.

use std::collections::BTreeMap;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Instant;

use userbpf_isa::*;
use userbpf_object::{MapDef, MapKind, Object, ProgramKind};
use userbpf_verifier::{MapInfo, Options, ProgType};

const ROUNDS: usize = 7;
const BPF_MAP_CREATE: libc::c_long = 0;
const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_MAP_FREEZE: libc::c_long = 22;
const BPF_BTF_LOAD: libc::c_long = 18;

/// Loads BTF into the kernel; `None` when it refuses it.
fn load_btf(bytes: &[u8]) -> Option<OwnedFd> {
    let mut a = [0u8; 160];
    put64(&mut a, 0, bytes.as_ptr() as u64);
    put32(&mut a, 16, bytes.len() as u32);
    let fd = bpf(BPF_BTF_LOAD, &mut a);
    // SAFETY: a new file descriptor we own.
    (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

fn bpf(cmd: libc::c_long, attr: &mut [u8; 160]) -> libc::c_long {
    // SAFETY: the attribute buffer is 160 bytes (larger than every command's attributes) and
    // the pointers in it point to live buffers of the sizes given.
    unsafe { libc::syscall(libc::SYS_bpf, cmd, attr.as_mut_ptr(), attr.len()) }
}

fn put32(a: &mut [u8; 160], off: usize, v: u32) {
    a[off..off + 4].copy_from_slice(&v.to_ne_bytes());
}

fn put64(a: &mut [u8; 160], off: usize, v: u64) {
    a[off..off + 8].copy_from_slice(&v.to_ne_bytes());
}

fn ncpus() -> u32 {
    std::thread::available_parallelism().map_or(1, |n| n.get() as u32)
}

/// A map as both verifiers need it.
#[derive(Clone)]
struct MapSpec {
    name: String,
    map_type: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
    flags: u32,
    /// The contents of a frozen read-only map (`.rodata`).
    frozen: Option<Vec<u8>>,
    inner: Option<Box<MapSpec>>,
}

impl MapSpec {
    fn of(d: &MapDef) -> MapSpec {
        let frozen = match (&d.kind, d.is_readonly()) {
            (MapKind::Data { .. }, true) => d.initial.clone(),
            _ => None,
        };
        MapSpec {
            name: d.name.clone(),
            map_type: d.map_type,
            key_size: d.key_size,
            value_size: d.value_size,
            max_entries: if d.max_entries == 0 && d.map_type == 4 { ncpus() } else { d.max_entries },
            flags: d.map_flags,
            frozen,
            inner: d.inner.as_deref().map(|i| Box::new(MapSpec::of(i))),
        }
    }

    fn info(&self) -> MapInfo {
        MapInfo {
            name: self.name.clone(),
            map_type: self.map_type,
            key_size: self.key_size,
            value_size: self.value_size,
            max_entries: self.max_entries,
            readonly: self.flags & (1 << 7) != 0,
            frozen: self.frozen.clone(),
            inner: self.inner.as_ref().map(|i| Box::new(i.info())),
        }
    }

    fn create(&self) -> Result<OwnedFd, String> {
        let inner = self.inner.as_ref().map(|i| i.create()).transpose()?;
        let mut a = [0u8; 160];
        if let Some(i) = &inner {
            put32(&mut a, 20, i.as_raw_fd() as u32);
        }
        put32(&mut a, 0, self.map_type);
        put32(&mut a, 4, self.key_size);
        put32(&mut a, 8, self.value_size);
        put32(&mut a, 12, self.max_entries.max(1));
        put32(&mut a, 16, self.flags);
        let fd = bpf(BPF_MAP_CREATE, &mut a);
        if fd < 0 {
            return Err(format!("map {}: {}", self.name, std::io::Error::last_os_error()));
        }
        // SAFETY: the kernel returned a new descriptor, ours alone.
        let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
        if let Some(v) = &self.frozen {
            let key = 0u32;
            let mut a = [0u8; 160];
            put32(&mut a, 0, fd.as_raw_fd() as u32);
            put64(&mut a, 8, &key as *const u32 as u64);
            put64(&mut a, 16, v.as_ptr() as u64);
            bpf(BPF_MAP_UPDATE_ELEM, &mut a);
            let mut a = [0u8; 160];
            put32(&mut a, 0, fd.as_raw_fd() as u32);
            bpf(BPF_MAP_FREEZE, &mut a);
        }
        Ok(fd)
    }
}

/// One program: instructions whose `lddw`s name maps by index into `maps`.
struct Prog {
    source: String,
    name: String,
    kernel_type: u32,
    prog_type: ProgType,
    insns: Vec<Insn>,
    maps: Vec<MapSpec>,
    gpl: bool,
    /// The object's BTF (loaded into the kernel for `func_info`: callbacks need it) and the
    /// program's func_info records (insn_off, type_id).
    btf: Option<std::rc::Rc<Vec<u8>>>,
    func_info: Vec<[u32; 2]>,
}

fn kinds(kind: &ProgramKind) -> Option<(u32, ProgType)> {
    match kind {
        ProgramKind::Uprobe { .. } | ProgramKind::Usdt { .. } => Some((2, ProgType::Kprobe)),
        ProgramKind::KernelOnly { kind } if kind.starts_with("kprobe") || kind.starts_with("kretprobe") => {
            Some((2, ProgType::Kprobe))
        }
        ProgramKind::Tracepoint { .. } => Some((5, ProgType::Tracepoint { record_size: None })),
        ProgramKind::RawTracepoint { .. } => Some((17, ProgType::RawTracepoint { args: None })),
        _ => None,
    }
}

fn programs_of(obj: &Object, source: &str) -> Vec<Prog> {
    let maps: Vec<MapSpec> = obj.maps.iter().map(MapSpec::of).collect();
    let gpl = userbpf_verifier::helpers::license_is_gpl_compatible(&obj.license);
    let btf = obj.btf.as_ref().map(|b| std::rc::Rc::new(b.to_bytes()));
    obj.programs
        .iter()
        .filter_map(|p| {
            let (kernel_type, prog_type) = kinds(&p.kind)?;
            Some(Prog {
                source: source.to_string(),
                name: p.name.clone(),
                kernel_type,
                prog_type,
                insns: p.insns.clone(),
                maps: maps.clone(),
                gpl,
                btf: btf.clone(),
                func_info: p.func_info.iter().map(|f| [f.insn_off, f.type_id]).collect(),
            })
        })
        .collect()
}

/// The BPF objects libbpf skeletons embed in the binaries of `dir` (ELF, machine 247).
fn embedded_objects(dir: &str) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir(dir) else { return out };
    let mut paths: Vec<_> = rd.flatten().map(|e| e.path()).collect();
    paths.sort();
    for p in paths {
        let Ok(data) = std::fs::read(&p) else { continue };
        if data.len() < 64 || &data[..4] != b"\x7fELF" {
            continue;
        }
        let mut at = 64;
        while let Some(k) = data[at..].windows(4).position(|w| w == b"\x7fELF") {
            let s = at + k;
            at = s + 4;
            if s + 64 > data.len() || data[s + 18] != 247 || data[s + 4] != 2 {
                continue;
            }
            let u16_at = |o: usize| u16::from_le_bytes([data[s + o], data[s + o + 1]]) as usize;
            let shoff = u64::from_le_bytes(data[s + 40..s + 48].try_into().unwrap()) as usize;
            let end = s + shoff + u16_at(60) * u16_at(58);
            if end <= data.len() && shoff > 0 {
                let name = p.file_name().unwrap().to_string_lossy().to_string();
                out.push((name, data[s..end].to_vec()));
            }
        }
    }
    out
}

/// bpftrace's programs (or any loader's) recorded in session `name`, with their maps.
fn session_programs(name: &str) -> Vec<Prog> {
    let Ok(s) = userbpf_runtime::Session::open(name) else { return Vec::new() };
    let Ok(records) = s.progs() else { return Vec::new() };
    let mut out = Vec::new();
    for r in records {
        let Some(bytes) = userbpf_isa::parse_hex(&r.insns_hex).ok() else { continue };
        let Ok(mut insns) = userbpf_isa::decode(&bytes) else { continue };
        let mut maps = Vec::new();
        let mut index: BTreeMap<u32, u32> = BTreeMap::new();
        for &id in &r.map_ids {
            let Ok(m) = s.open_map(id) else { continue };
            let sp = m.spec();
            index.insert(id, maps.len() as u32);
            maps.push(MapSpec {
                name: sp.name.clone(),
                map_type: sp.map_type as u32,
                key_size: sp.key_size,
                value_size: sp.value_size,
                max_entries: sp.max_entries,
                flags: sp.map_flags,
                frozen: None,
                inner: None,
            });
        }
        let mut ok = true;
        for i in insns.iter_mut() {
            if i.is_lddw() && matches!(i.src, BPF_PSEUDO_MAP_IDX | BPF_PSEUDO_MAP_IDX_VALUE) {
                match index.get(&(i.imm as u32)) {
                    Some(&k) => i.imm = k as i32,
                    None => ok = false,
                }
            }
        }
        let Some(prog_type) = userbpf_runtime::verify::prog_type(&r.prog_type) else { continue };
        let kernel_type = match r.prog_type.as_str() {
            "kprobe" => 2,
            "tracepoint" => 5,
            "perf_event" => 7,
            "raw_tracepoint" => 17,
            _ => continue,
        };
        if ok {
            out.push(Prog {
                source: "bpftrace".to_string(),
                name: r.name.clone(),
                kernel_type,
                prog_type,
                insns,
                maps,
                gpl: userbpf_verifier::helpers::license_is_gpl_compatible(&r.license),
                btf: None,
                func_info: Vec::new(),
            });
        }
    }
    out
}

/// bpftrace one-liners whose programs the bench verifies (printf, str, hist, lhist, stacks,
/// maps keyed by strings: bpftrace's larger programs).
const BPFTRACE_SCRIPTS: &[&str] = &[
    "uprobe:WORKLOAD:work { @h[comm, tid] = hist(arg0); @l = lhist(arg1, 0, 1000, 10); @s[ustack] = count(); printf(\"%s %d %d %d\\n\", comm, pid, arg0, arg1); }",
    "uretprobe:WORKLOAD:work { @ret[comm, retval] = count(); @avg = avg(retval); @mx = max(retval); @mn = min(retval); @st = stats(retval); }",
    "tracepoint:syscalls:sys_enter_openat { printf(\"%s %s %d\\n\", comm, str(args->filename), args->flags); @files[str(args->filename)] = count(); }",
    "uprobe:WORKLOAD:work { @path[str(arg0), str(arg1)] = count(); if (arg2 > 10) { printf(\"%s\\n\", str(arg0)); } }",
];

/// Runs each bpftrace script through `userbpf load` in session `name` (held open by this
/// process, so that the programs it recorded stay), interrupting it once it has attached.
fn capture_bpftrace(name: &str) -> Option<userbpf_runtime::Session> {
    let session = userbpf_runtime::Session::open(name).ok()?;
    // target/release/verifier-bench, or target/release/deps/verifier-HASH under `cargo test`.
    let mut dir = std::env::current_exe().ok()?.parent()?.to_path_buf();
    if dir.ends_with("deps") {
        dir.pop();
    }
    let userbpf = dir.join("userbpf");
    // The bundled target (target/examples/workload, built by `make build`): its `work()`.
    let workload = userbpf.parent()?.parent()?.join("examples/workload");
    for script in BPFTRACE_SCRIPTS {
        let script = script.replace("WORKLOAD", &workload.to_string_lossy());
        let mut child = std::process::Command::new(&userbpf)
            .args(["load", "--session", name, "--", "bpftrace", "-e", &script])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .ok()?;
        let mut out = std::io::BufReader::new(child.stdout.take()?);
        let mut line = String::new();
        // "Attaching N probes...": the programs are loaded.
        while std::io::BufRead::read_line(&mut out, &mut line).map(|n| n > 0).unwrap_or(false) {
            if line.contains("Attaching") {
                break;
            }
            line.clear();
        }
        let started = Instant::now();
        while child.try_wait().ok().flatten().is_none() && started.elapsed().as_secs() < 10 {
            // SAFETY: signalling our own child; bpftrace may miss a SIGINT sent before its
            // event loop, so it is resent.
            unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
    Some(session)
}

/// userbpf's verifier options for `p`: its type, license and maps.
fn options_of(p: &Prog) -> Options {
    let mut opts = Options::new(p.prog_type);
    opts.gpl_compatible = p.gpl;
    opts.maps = p.maps.iter().enumerate().map(|(k, m)| (k as u32, m.info())).collect();
    opts
}

/// What both verifiers need for `p`: its maps created in the kernel, its BTF loaded there,
/// and userbpf's options (`None` when the kernel refuses one of its maps).
fn prepared(p: &Prog) -> Option<(Vec<OwnedFd>, Option<OwnedFd>, Options)> {
    let fds: Vec<OwnedFd> = p.maps.iter().map(|m| m.create()).collect::<Result<_, String>>().ok()?;
    let btf = p.btf.as_ref().and_then(|b| load_btf(b));
    Some((fds, btf, options_of(p)))
}

/// The kernel's verdict and its own verification time (µs), and the instructions processed.
fn kernel_load(p: &Prog, fds: &[OwnedFd], btf: Option<&OwnedFd>) -> Result<(u64, u64), String> {
    let mut insns = p.insns.clone();
    for i in insns.iter_mut() {
        if i.is_lddw() {
            match i.src {
                BPF_PSEUDO_MAP_IDX => (i.src, i.imm) = (BPF_PSEUDO_MAP_FD, fds[i.imm as usize].as_raw_fd()),
                BPF_PSEUDO_MAP_IDX_VALUE => (i.src, i.imm) = (BPF_PSEUDO_MAP_VALUE, fds[i.imm as usize].as_raw_fd()),
                _ => {}
            }
        }
    }
    let bytes = encode(&insns);
    let license = if p.gpl { c"GPL" } else { c"Proprietary" };
    let mut log = vec![0u8; 1 << 16];
    let mut a = [0u8; 160];
    put32(&mut a, 0, p.kernel_type);
    put32(&mut a, 4, insns.len() as u32);
    put64(&mut a, 8, bytes.as_ptr() as u64);
    put64(&mut a, 16, license.as_ptr() as u64);
    put32(&mut a, 24, 4); // BPF_LOG_STATS
    put32(&mut a, 28, log.len() as u32);
    put64(&mut a, 32, log.as_mut_ptr() as u64);
    if let (Some(btf), false) = (btf, p.func_info.is_empty()) {
        put32(&mut a, 72, btf.as_raw_fd() as u32);
        put32(&mut a, 76, 8);
        put64(&mut a, 80, p.func_info.as_ptr() as u64);
        put32(&mut a, 88, p.func_info.len() as u32);
    }
    let fd = bpf(BPF_PROG_LOAD, &mut a);
    let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
    let text = String::from_utf8_lossy(&log[..end]).to_string();
    if fd < 0 {
        let why = text
            .lines()
            .rev()
            .find(|l| !l.starts_with("processed") && !l.starts_with("verification time"))
            .unwrap_or("");
        return Err(format!("{}: {why}", std::io::Error::last_os_error()));
    }
    // SAFETY: a new descriptor we own; closing it unloads the program.
    drop(unsafe { OwnedFd::from_raw_fd(fd as i32) });
    let num = |key: &str| -> u64 {
        text.split(key).nth(1).and_then(|r| r.split_whitespace().next()).and_then(|n| n.parse().ok()).unwrap_or(0)
    };
    Ok((num("verification time "), num("processed ")))
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

struct Row {
    source: String,
    name: String,
    insns: usize,
    kernel_processed: u64,
    processed: usize,
    kernel_us: f64,
    userbpf_us: f64,
}

/// Nanoseconds per call of map helper `id` on `map` with key `key` (and `value`), best of
/// five runs of 2 million calls.
fn helper_ns(id: u32, map: &userbpf_maps::Map, key: &[u8], value: &[u8]) -> f64 {
    let registry = userbpf_runtime::helpers::registry();
    let f = registry.get(id).expect("map helper").func;
    let m = map as *const userbpf_maps::Map as u64;
    let (k, v) = (key.as_ptr() as u64, value.as_ptr() as u64);
    let mut best = f64::MAX;
    for _ in 0..5 {
        let t = Instant::now();
        for _ in 0..2_000_000 {
            // SAFETY: a registered map, a key and value of its sizes.
            std::hint::black_box(unsafe { f(std::hint::black_box(m), k, v, 0, 0) });
        }
        best = best.min(t.elapsed().as_nanos() as f64 / 2e6);
    }
    best
}

/// What verification buys the map helpers: their cost trusting key and value pointers (every
/// program verified) and distrusting them (a program loaded unverified), side by side.
fn map_helper_costs() {
    use userbpf_maps::{Map, MapSpec, MapType};
    let dir = std::env::temp_dir().join(format!("userbpf-verifier-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a directory for the maps");
    let create = |id: u32, name: &str, map_type: MapType, value_size: u32| {
        let spec = MapSpec {
            map_type,
            key_size: 8,
            value_size,
            max_entries: 1024,
            map_flags: 0,
            map_extra: 0,
            name: name.into(),
        };
        let map = std::sync::Arc::new(Map::create(&dir.join(name), &spec).expect("creating a map"));
        assert!(userbpf_runtime::helpers::maps::register_map(id, map.clone()));
        map
    };
    let hash = create(900_001, "vb_hash", MapType::BPF_MAP_TYPE_HASH, 8);
    let big = create(900_002, "vb_hash_big", MapType::BPF_MAP_TYPE_HASH, 256);
    let key = 7u64.to_ne_bytes();
    let value = [1u8; 256];
    for m in [&hash, &big] {
        // SAFETY: key and value of the map's sizes.
        unsafe { m.update(key.as_ptr(), value.as_ptr(), 0, 0) }.expect("an element");
    }
    let ops: [(&str, u32, &Map); 4] = [
        ("lookup (hash, 8-byte key, hit)", 1, &hash),
        ("update (hash, existing key, 8-byte value)", 2, &hash),
        ("update (hash, existing key, 256-byte value)", 2, &big),
        ("lookup (hash, missing key)", 1, &hash),
    ];
    let missing = 9u64.to_ne_bytes();
    let trusted: Vec<f64> = ops
        .iter()
        .map(|(n, id, m)| helper_ns(*id, m, if n.contains("missing") { &missing } else { &key }, &value))
        .collect();
    userbpf_runtime::helpers::maps::distrust_pointers();
    let distrusted: Vec<f64> = ops
        .iter()
        .map(|(n, id, m)| helper_ns(*id, m, if n.contains("missing") { &missing } else { &key }, &value))
        .collect();
    println!();
    println!(
        "map helpers, pointers trusted (verified programs) and distrusted (verification off; guarded copies), ns per call, best of 5 × 2M:"
    );
    println!("| helper call | trusted ns | distrusted ns | distrusted / trusted |");
    println!("|---|---:|---:|---:|");
    for (k, (name, _, _)) in ops.iter().enumerate() {
        println!("| {name} | {:.1} | {:.1} | {:.2}× |", trusted[k], distrusted[k], distrusted[k] / trusted[k]);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--map-helpers") {
        map_helper_costs();
        return;
    }
    let mut progs: Vec<Prog> = Vec::new();
    let mut i = 0;
    // `--bpftrace`: bpftrace's programs, recorded through `userbpf load` (the session is
    // held until the end).
    let mut _held = None;
    while i < args.len() {
        if args[i] == "--bpftrace" {
            let name = format!("verifier-bench-{}", std::process::id());
            _held = capture_bpftrace(&name);
            let before = progs.len();
            progs.extend(session_programs(&name));
            eprintln!("bpftrace: {} programs recorded", progs.len() - before);
            i += 1;
            continue;
        }
        if args[i] == "--session" && i + 1 < args.len() {
            progs.extend(session_programs(&args[i + 1]));
            i += 2;
            continue;
        }
        match Object::open(&args[i]) {
            Ok(o) => {
                let shown = std::path::Path::new(&args[i]).file_name().unwrap().to_string_lossy().to_string();
                progs.extend(programs_of(&o, &shown));
            }
            Err(e) => eprintln!("skipped {}: {e}", args[i]),
        }
        i += 1;
    }
    let target = std::fs::read("/sys/kernel/btf/vmlinux").ok().and_then(|b| userbpf_object::Btf::parse(&b).ok());
    let mut tools = 0;
    for (name, bytes) in embedded_objects("/usr/sbin") {
        if let Ok(o) = Object::parse_with(&bytes, &format!("{name}.bpf.o"), target.as_ref()) {
            tools += 1;
            progs.extend(programs_of(&o, &format!("libbpf-tools {name}")));
        }
    }
    // VERIFIER_BENCH_PROFILE=SUBSTRING: only verify (userbpf) the programs whose source and
    // name contain it, 100 times each, for a profiler.
    if let Ok(only) = std::env::var("VERIFIER_BENCH_PROFILE") {
        for p in progs.iter().filter(|p| format!("{} {}", p.source, p.name).contains(&only)) {
            let opts = options_of(p);
            let t = Instant::now();
            for _ in 0..100 {
                let _ = std::hint::black_box(userbpf_verifier::verify(&p.insns, &opts));
            }
            println!("{} {}: {:.1?} per verification", p.source, p.name, t.elapsed() / 100);
        }
        return;
    }
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "verification time: userbpf's verifier beside the kernel's ({} programs; {tools} libbpf-tools objects), {ROUNDS} rounds, medians; load average {}",
        progs.len(),
        load.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
    );
    let mut rows = Vec::new();
    let (mut both, mut kernel_only, mut userbpf_only, mut neither) = (0, 0, 0, 0);
    let mut refusals: Vec<String> = Vec::new();
    for p in &progs {
        let Some((fds, btf, opts)) = prepared(p) else { continue };
        let ours = userbpf_verifier::verify(&p.insns, &opts);
        let theirs = kernel_load(p, &fds, btf.as_ref());
        match (&ours, &theirs) {
            (Ok(_), Ok(_)) => both += 1,
            (Err(e), Ok(_)) => {
                kernel_only += 1;
                refusals.push(format!("  {} {}: kernel accepts, userbpf refuses: {e}", p.source, p.name));
                continue;
            }
            (Ok(_), Err(e)) => {
                userbpf_only += 1;
                refusals.push(format!("  {} {}: userbpf accepts, kernel refuses: {e}", p.source, p.name));
                continue;
            }
            (Err(_), Err(_)) => {
                neither += 1;
                continue;
            }
        }
        let processed = ours.map(|s| s.insns_processed).unwrap_or(0);
        let (mut k, mut u) = (Vec::new(), Vec::new());
        let mut kernel_processed = 0;
        for _ in 0..ROUNDS {
            if let Ok((us, n)) = kernel_load(p, &fds, btf.as_ref()) {
                k.push(us as f64);
                kernel_processed = n;
            }
            let t = Instant::now();
            let r = userbpf_verifier::verify(&p.insns, &opts);
            u.push(t.elapsed().as_nanos() as f64 / 1000.0);
            assert!(r.is_ok());
        }
        rows.push(Row {
            source: p.source.clone(),
            name: p.name.clone(),
            insns: p.insns.len(),
            kernel_processed,
            processed,
            kernel_us: median(&mut k),
            userbpf_us: median(&mut u),
        });
    }
    rows.sort_by(|a, b| b.kernel_processed.cmp(&a.kernel_processed).then(b.insns.cmp(&a.insns)));
    println!(
        "| source | program | insns | processed (kernel) | processed (userbpf) | kernel µs | userbpf µs | userbpf / kernel |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|");
    // The largest programs of each origin: the project's, libbpf-tools', bpftrace's.
    let origin = |r: &Row| {
        if r.source.starts_with("libbpf-tools") {
            1
        } else if r.source.starts_with("bpftrace") {
            2
        } else {
            0
        }
    };
    for o in 0..3 {
        for r in rows.iter().filter(|r| origin(r) == o).take(6) {
            println!(
                "| {} | {} | {} | {} | {} | {:.0} | {:.1} | {:.2}× |",
                r.source,
                r.name,
                r.insns,
                r.kernel_processed,
                r.processed,
                r.kernel_us,
                r.userbpf_us,
                r.userbpf_us / r.kernel_us.max(1.0)
            );
        }
    }
    let shown = "the 6 largest of each origin";
    let (ks, us): (f64, f64) = rows.iter().fold((0.0, 0.0), |(a, b), r| (a + r.kernel_us, b + r.userbpf_us));
    let slower: Vec<&Row> = rows.iter().filter(|r| r.userbpf_us > r.kernel_us.max(1.0)).collect();
    println!(
        "{} programs accepted by both ({shown} shown): kernel {:.0} µs in all, userbpf {:.0} µs ({:.2}×); userbpf slower than the kernel on {}: {}",
        rows.len(),
        ks,
        us,
        us / ks.max(1.0),
        slower.len(),
        slower.iter().map(|r| format!("{} {}", r.source, r.name)).collect::<Vec<_>>().join(", ")
    );
    println!(
        "verdicts: {both} accepted by both, {neither} refused by both, {kernel_only} accepted only by the kernel, {userbpf_only} only by userbpf"
    );
    for r in refusals.iter().take(40) {
        println!("{r}");
    }
    map_helper_costs();
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kernel as the oracle for programs nobody here wrote: every program of Debian's
    /// libbpf-tools (the objects embedded in /usr/sbin, relocated against the running kernel's
    /// BTF) and the programs bpftrace 0.17 generates (recorded through `userbpf load`), each
    /// given to the kernel's verifier and to userbpf's in this run: the same verdict.
    #[test]
    fn libbpf_tools_and_bpftrace_programs_get_the_kernels_verdict() {
        let root = euid() == 0;
        if !userbpf_testutil::require(root, "root, to load programs into the kernel") {
            return;
        }
        let target = std::fs::read("/sys/kernel/btf/vmlinux").ok().and_then(|b| userbpf_object::Btf::parse(&b).ok());
        let mut progs = Vec::new();
        let mut tools = 0;
        for (name, bytes) in embedded_objects("/usr/sbin") {
            if let Ok(o) = Object::parse_with(&bytes, &format!("{name}.bpf.o"), target.as_ref()) {
                tools += 1;
                progs.extend(programs_of(&o, &format!("libbpf-tools {name}")));
            }
        }
        if !userbpf_testutil::require(tools >= 20, "Debian's libbpf-tools in /usr/sbin") {
            return;
        }
        let name = format!("verifier-oracle-{}", std::process::id());
        let held = capture_bpftrace(&name);
        let recorded = session_programs(&name);
        assert!(
            held.is_some() && recorded.len() >= BPFTRACE_SCRIPTS.len(),
            "bpftrace's programs recorded: {}",
            recorded.len()
        );
        progs.extend(recorded);
        let (mut judged, mut differ) = (0, Vec::new());
        for p in &progs {
            let Some((fds, btf, opts)) = prepared(p) else { continue };
            let ours = userbpf_verifier::verify(&p.insns, &opts);
            let theirs = kernel_load(p, &fds, btf.as_ref());
            judged += 1;
            if ours.is_ok() != theirs.is_ok() {
                differ.push(format!(
                    "{} {}: kernel {}, userbpf {}",
                    p.source,
                    p.name,
                    theirs.err().unwrap_or_else(|| "accepts".into()),
                    ours.err().map_or_else(|| "accepts".into(), |e| e.to_string())
                ));
            }
        }
        println!("{judged} programs judged ({tools} libbpf-tools objects, bpftrace's)");
        assert!(judged >= 100, "only {judged} programs judged");
        assert!(differ.is_empty(), "{} verdicts differ:\n{}", differ.len(), differ.join("\n"));
    }

    fn euid() -> u32 {
        // SAFETY: geteuid has no preconditions and cannot fail.
        unsafe { libc::geteuid() }
    }
}
