//! The kernel side of the oracle tests: maps created and programs loaded with the real
//! bpf(2) system call, so that the kernel's verifier judges the same instructions as
//! userbpf's, in the same test run. Objects are parsed with userbpf-object; its map
//! references (`BPF_PSEUDO_MAP_IDX[_VALUE]`) become the file descriptors of maps created
//! from the object's definitions (global data maps filled with their initial values and
//! `.rodata` frozen, as libbpf does).

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use userbpf_isa::*;
use userbpf_object::{MapDef, MapKind, Object, ProgramKind, ProgramSpec};
use userbpf_verifier::{MapInfo, Options, ProgType};

const BPF_MAP_CREATE: libc::c_long = 0;
const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_MAP_FREEZE: libc::c_long = 22;
const BPF_BTF_LOAD: libc::c_long = 18;

/// Loads the object's BTF into the kernel (needed for callbacks' `func_info`); `None` when
/// the object has none or the kernel refuses it.
fn load_btf(obj: &Object) -> Option<OwnedFd> {
    let bytes = obj.btf.as_ref()?.to_bytes();
    let mut a = [0u8; 160];
    put64(&mut a, 0, bytes.as_ptr() as u64);
    put32(&mut a, 16, bytes.len() as u32);
    let fd = bpf(BPF_BTF_LOAD, &mut a);
    // SAFETY: a new file descriptor we own.
    (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

fn bpf(cmd: libc::c_long, attr: &mut [u8; 160]) -> libc::c_long {
    // SAFETY: `attr` is a zero-padded `union bpf_attr` of 160 bytes, larger than every
    // command's part of it; the kernel reads (and for PROG_LOAD writes the log through a
    // pointer we own) only within it.
    unsafe { libc::syscall(libc::SYS_bpf, cmd, attr.as_mut_ptr(), attr.len() as u32) }
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

/// Creates one map in the kernel.
fn create_map(def: &MapDef) -> Result<OwnedFd, String> {
    let inner = def.inner.as_deref().map(create_map).transpose()?;
    let mut a = [0u8; 160];
    if let Some(i) = &inner {
        put32(&mut a, 20, i.as_raw_fd() as u32);
    }
    let max_entries = if def.max_entries == 0 && def.map_type == 4 { ncpus() } else { def.max_entries };
    put32(&mut a, 0, def.map_type);
    put32(&mut a, 4, def.key_size);
    put32(&mut a, 8, def.value_size);
    put32(&mut a, 12, max_entries);
    put32(&mut a, 16, def.map_flags);
    let name: Vec<u8> =
        def.name.bytes().filter(|b| b.is_ascii_alphanumeric() || *b == b'_' || *b == b'.').take(15).collect();
    a[28..28 + name.len()].copy_from_slice(&name);
    put64(&mut a, 64, def.map_extra);
    let fd = bpf(BPF_MAP_CREATE, &mut a);
    if fd < 0 {
        return Err(format!("creating map {}: {}", def.name, std::io::Error::last_os_error()));
    }
    // SAFETY: the kernel returned a new file descriptor we now own.
    let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    if let Some(init) = &def.initial {
        let key = 0u32;
        let mut a = [0u8; 160];
        put32(&mut a, 0, fd.as_raw_fd() as u32);
        put64(&mut a, 8, &key as *const u32 as u64);
        put64(&mut a, 16, init.as_ptr() as u64);
        if bpf(BPF_MAP_UPDATE_ELEM, &mut a) < 0 {
            return Err(format!("initialising map {}: {}", def.name, std::io::Error::last_os_error()));
        }
        if def.is_readonly() {
            let mut a = [0u8; 160];
            put32(&mut a, 0, fd.as_raw_fd() as u32);
            if bpf(BPF_MAP_FREEZE, &mut a) < 0 {
                return Err(format!("freezing map {}: {}", def.name, std::io::Error::last_os_error()));
            }
        }
    }
    Ok(fd)
}

/// The program type a program is verified as (kernel and userbpf), `None` for programs
/// userbpf does not run.
pub fn prog_type(kind: &ProgramKind) -> Option<(u32, ProgType)> {
    match kind {
        ProgramKind::Uprobe { .. } | ProgramKind::Usdt { .. } => Some((2, ProgType::Kprobe)),
        ProgramKind::Tracepoint { .. } => Some((5, ProgType::Tracepoint { record_size: None })),
        ProgramKind::RawTracepoint { .. } => Some((17, ProgType::RawTracepoint { args: None })),
        _ => None,
    }
}

/// The kernel's verdict: `Ok(())` or `Err(last lines of the log)`.
pub struct KernelObject {
    maps: Vec<OwnedFd>,
    btf: Option<OwnedFd>,
}

impl KernelObject {
    pub fn new(obj: &Object) -> Result<KernelObject, String> {
        let maps = obj.maps.iter().map(create_map).collect::<Result<Vec<_>, _>>()?;
        Ok(KernelObject { maps, btf: load_btf(obj) })
    }

    pub fn load(&self, prog: &ProgramSpec, license: &str) -> Result<(), String> {
        let Some((ptype, _)) = prog_type(&prog.kind) else { return Err("not a userbpf program type".into()) };
        let mut insns = prog.insns.clone();
        let mut i = 0;
        while i < insns.len() {
            if insns[i].is_lddw() {
                match insns[i].src {
                    BPF_PSEUDO_MAP_IDX => {
                        insns[i].src = BPF_PSEUDO_MAP_FD;
                        insns[i].imm = self.maps[insns[i].imm as usize].as_raw_fd();
                    }
                    BPF_PSEUDO_MAP_IDX_VALUE => {
                        insns[i].src = BPF_PSEUDO_MAP_VALUE;
                        insns[i].imm = self.maps[insns[i].imm as usize].as_raw_fd();
                    }
                    _ => {}
                }
                i += 1;
            }
            i += 1;
        }
        let bytes = encode(&insns);
        let license = std::ffi::CString::new(if license.is_empty() { "GPL" } else { license }).unwrap_or_default();
        let mut log = vec![0u8; 1 << 22];
        let mut a = [0u8; 160];
        put32(&mut a, 0, ptype);
        put32(&mut a, 4, insns.len() as u32);
        put64(&mut a, 8, bytes.as_ptr() as u64);
        put64(&mut a, 16, license.as_ptr() as u64);
        put32(&mut a, 24, 1);
        put32(&mut a, 28, log.len() as u32);
        put64(&mut a, 32, log.as_mut_ptr() as u64);
        let func_info: Vec<[u32; 2]> = prog.func_info.iter().map(|f| [f.insn_off, f.type_id]).collect();
        if let (Some(btf), false) = (&self.btf, func_info.is_empty()) {
            put32(&mut a, 72, btf.as_raw_fd() as u32);
            put32(&mut a, 76, 8);
            put64(&mut a, 80, func_info.as_ptr() as u64);
            put32(&mut a, 88, func_info.len() as u32);
        }
        let fd = bpf(BPF_PROG_LOAD, &mut a);
        if fd >= 0 {
            // SAFETY: a new file descriptor we own; closing it unloads the program.
            drop(unsafe { OwnedFd::from_raw_fd(fd as i32) });
            return Ok(());
        }
        let err = std::io::Error::last_os_error();
        let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
        let text = String::from_utf8_lossy(&log[..end]).to_string();
        let tail: Vec<&str> =
            text.lines().rev().filter(|l| !l.starts_with("processed") && !l.trim().is_empty()).take(2).collect();
        Err(format!("{err}: {}", tail.into_iter().rev().collect::<Vec<_>>().join(" | ")))
    }
}

/// userbpf's options for a program of `obj`: maps by index, as the object's `lddw`s name them.
/// The verifier's description of a map definition (inner template included).
pub fn map_info(m: &MapDef) -> MapInfo {
    let frozen = match (&m.kind, m.is_readonly()) {
        (MapKind::Data { .. }, true) => m.initial.clone(),
        _ => None,
    };
    let max_entries = if m.max_entries == 0 && m.map_type == 4 { ncpus() } else { m.max_entries };
    MapInfo {
        name: m.name.clone(),
        map_type: m.map_type,
        key_size: m.key_size,
        value_size: m.value_size,
        max_entries,
        readonly: m.is_readonly(),
        frozen,
        inner: m.inner.as_deref().map(|i| Box::new(map_info(i))),
    }
}

/// userbpf's options for a program of `obj`: maps by index, as the object's `lddw`s name them.
pub fn options(obj: &Object, ptype: ProgType) -> Options {
    let gpl_compatible = userbpf_verifier::helpers::license_is_gpl_compatible(&obj.license);
    let maps = obj.maps.iter().enumerate().map(|(i, m)| (i as u32, map_info(m))).collect::<BTreeMap<_, _>>();
    Options {
        prog_type: ptype,
        maps,
        privileged: true,
        gpl_compatible,
        writable_args: false,
        log_level: 0,
        snprintf_format: None,
    }
}

/// One program judged by both verifiers.
pub struct Verdicts {
    pub file: String,
    pub program: String,
    pub kernel: Result<(), String>,
    pub userbpf: Result<(), String>,
    /// The errno of each refusal (the kernel's from `bpf()`, userbpf's from
    /// `VerifyError::errno`, what `userbpf load` returns).
    pub kernel_errno: Option<i32>,
    pub userbpf_errno: Option<i32>,
}

impl Verdicts {
    pub fn agree(&self) -> bool {
        self.kernel.is_ok() == self.userbpf.is_ok()
    }
}

fn show(r: &Result<(), String>) -> String {
    match r {
        Ok(()) => "accepted".into(),
        Err(e) => format!("refused ({e})"),
    }
}

impl std::fmt::Display for Verdicts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}: kernel {}; userbpf {}", self.file, self.program, show(&self.kernel), show(&self.userbpf))
    }
}

/// Compiles `src` and judges every userbpf program in it with both verifiers.
pub fn judge_source(src: &Path, out: &Path) -> Result<Vec<Verdicts>, String> {
    let o = userbpf_testutil::compile_bpf(src, out);
    judge_object(&o, &src.display().to_string())
}

pub fn judge_object(path: &Path, shown: &str) -> Result<Vec<Verdicts>, String> {
    let obj = Object::open(path).map_err(|e| e.to_string())?;
    let kernel = KernelObject::new(&obj)?;
    let mut out = Vec::new();
    for prog in &obj.programs {
        let Some((_, ptype)) = prog_type(&prog.kind) else { continue };
        let k = kernel.load(prog, &obj.license);
        let kernel_errno = k.as_ref().err().and_then(|e| {
            let n = e.split("(os error ").nth(1)?.split(')').next()?;
            n.parse::<i32>().ok()
        });
        let mut opts = options(&obj, ptype);
        // userbpf's SEC("uprobe.w") (argument writes), as the runtime verifies it.
        opts.writable_args = userbpf_object::section::writable_args(&prog.section);
        let u = userbpf_verifier::verify(&prog.insns, &opts);
        let userbpf_errno = u.as_ref().err().map(|e| e.errno());
        let u = u.map(|_| ()).map_err(|e| e.to_string());
        out.push(Verdicts {
            file: shown.to_string(),
            program: prog.name.clone(),
            kernel: k,
            userbpf: u,
            kernel_errno,
            userbpf_errno,
        });
    }
    Ok(out)
}

pub fn out_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("verifier-oracle")
}
