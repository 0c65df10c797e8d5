//! Which side runs each program of an object under `userbpf run`, and the kernel half.
//!
//! **Which side runs what** (defaults; `--side PROG=kernel|process` forces one, PROG a glob):
//! - in the processes (userbpf): uprobes, uretprobes, USDT probes, and the system call
//!   tracepoints (`syscalls/sys_enter_*`, `sys_exit_*`, `raw_syscalls/*`, raw `sys_enter` /
//!   `sys_exit`) unless `--syscalls kernel`;
//! - in the kernel (loaded and attached by libbpf with real `bpf()` calls): every other
//!   tracepoint and raw tracepoint, and every kernel-only kind (`tp_btf`, kprobe, fentry,
//!   perf_event, ...). The kernel's refusal (its verifier's log, or its attach error: this
//!   kernel has no kprobes and refuses fentry) is passed on.
//!
//! `--not-load PATTERN` (or `USERBPF_NOT_LOAD_PATTERN`, as bpftime's `BPFTIME_NOT_LOAD_PATTERN`,
//! but a shell glob rather than a regular expression) leaves matching programs unloaded.
//!
//! **Maps**: a map used by programs of one side stays on that side (a kernel-only map is read
//! back through `bpf()` when `run` prints the maps). A map used by both sides is the kernel's:
//! an array is created `BPF_F_MMAPABLE` and its values mapped into every process of the
//! session (`userbpf_runtime::kernel_map`), so user-space programs read, write and update it
//! atomically with no system call and see the kernel programs' writes as they happen. Hash,
//! LRU hash and per-CPU kinds cannot be mapped: user-space programs reach them with
//! a `bpf()` call per operation (`userbpf_maps::kernel`: values looked up are copies written
//! back when the run ends). Other kinds (ring and perf buffers, queues, LPM tries, maps of
//! maps) are refused when shared, naming the map and the programs.
//! `.rodata` and `.kconfig` are constants: each side keeps its own copy.

use std::collections::BTreeSet;

use anyhow::{Result, bail};
use userbpf_isa::insn::{BPF_PSEUDO_MAP_IDX, BPF_PSEUDO_MAP_IDX_VALUE};
use userbpf_object::{InitSlot, Object, ProgramKind};

/// Where a program runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    Process,
    Kernel,
}

/// Which side runs system call tracepoints.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum SyscallSide {
    /// In the traced processes (Syscall User Dispatch): only their own calls.
    Process,
    /// In the kernel: every process's calls.
    Kernel,
}

/// The selection options of `run`.
pub struct Selection<'a> {
    pub syscalls: SyscallSide,
    /// `PROG=kernel|process` (PROG a glob).
    pub sides: &'a [String],
    /// Globs of programs left unloaded.
    pub not_load: Vec<String>,
}

/// Shell glob match (fnmatch).
pub fn glob(pattern: &str, name: &str) -> bool {
    let (Ok(p), Ok(n)) = (std::ffi::CString::new(pattern), std::ffi::CString::new(name)) else { return false };
    // SAFETY: both are NUL-terminated strings; fnmatch only reads them.
    unsafe { libc::fnmatch(p.as_ptr(), n.as_ptr(), 0) == 0 }
}

/// The system call tracepoints a process runs (see `run::is_syscall_tracepoint`).
fn is_syscall_kind(kind: &ProgramKind) -> bool {
    match kind {
        ProgramKind::Tracepoint { category, name } => {
            category == "raw_syscalls" && (name == "sys_enter" || name == "sys_exit")
                || category == "syscalls"
                    && (name.strip_prefix("sys_enter_").or_else(|| name.strip_prefix("sys_exit_")))
                        .is_some_and(|c| !c.is_empty())
        }
        ProgramKind::RawTracepoint { name } => name == "sys_enter" || name == "sys_exit",
        _ => false,
    }
}

/// The default side of a program kind.
pub fn default_side(kind: &ProgramKind, syscalls: SyscallSide) -> Side {
    match kind {
        ProgramKind::Uprobe { .. } | ProgramKind::Usdt { .. } | ProgramKind::Unknown => Side::Process,
        k if is_syscall_kind(k) => match syscalls {
            SyscallSide::Process => Side::Process,
            SyscallSide::Kernel => Side::Kernel,
        },
        // Bare `tracepoint`/`raw_tp` sections name no target: only `--attach` gives one, in a
        // process.
        ProgramKind::Tracepoint { category, .. } if category.is_empty() => Side::Process,
        ProgramKind::RawTracepoint { name } if name.is_empty() => Side::Process,
        ProgramKind::Tracepoint { .. } | ProgramKind::RawTracepoint { .. } | ProgramKind::KernelOnly { .. } => {
            Side::Kernel
        }
    }
}

/// The plan: programs per side and maps per use.
#[derive(Debug, Default)]
pub struct Plan {
    /// Programs userbpf loads (into the session).
    pub process: Vec<String>,
    /// Programs handed to the kernel.
    pub kernel: Vec<String>,
    /// Programs left unloaded (`--not-load`).
    pub skipped: Vec<String>,
    /// Maps (names) kernel programs use.
    pub kernel_maps: Vec<String>,
    /// Of those, maps also used in processes: their contents are the kernel's (arrays
    /// mapped, other kinds through `bpf()`).
    pub shared: Vec<String>,
    /// Of those, the arrays: created `BPF_F_MMAPABLE`.
    pub mmapable: Vec<String>,
}

/// Map indexes each program of `object` references (`lddw` of a map or its value), with the
/// maps their map-in-map slots name.
fn maps_used(object: &Object, prog: usize) -> BTreeSet<usize> {
    let mut used = BTreeSet::new();
    let insns = &object.programs[prog].insns;
    let mut i = 0;
    while i < insns.len() {
        let insn = &insns[i];
        if insn.op == 0x18 {
            if insn.src == BPF_PSEUDO_MAP_IDX || insn.src == BPF_PSEUDO_MAP_IDX_VALUE {
                used.insert(insn.imm as u32 as usize);
            }
            i += 2;
            continue;
        }
        i += 1;
    }
    let mut todo: Vec<usize> = used.iter().copied().collect();
    while let Some(m) = todo.pop() {
        let Some(def) = object.maps.get(m) else { continue };
        for s in def.init_slots.iter().flatten() {
            if let InitSlot::Map(j) = s
                && used.insert(*j)
            {
                todo.push(*j);
            }
        }
    }
    used
}

/// Constants each side keeps a copy of (frozen by libbpf, never written by programs).
fn is_constant_data(name: &str) -> bool {
    name.find('.').is_some_and(|d| {
        let s = &name[d..];
        s == ".rodata" || s.starts_with(".rodata.") || s == ".kconfig"
    })
}

/// Decides each program's side and each map's, and marks the shared arrays of `object`
/// `BPF_F_MMAPABLE` (the kernel creates them so; the session's copy has the same layout).
pub fn plan(object: &mut Object, sel: &Selection<'_>) -> Result<Plan> {
    let mut forced: Vec<(&str, Side)> = Vec::new();
    for s in sel.sides {
        let (p, side) = match s.split_once('=') {
            Some((p, "kernel")) if !p.is_empty() => (p, Side::Kernel),
            Some((p, "process" | "user")) if !p.is_empty() => (p, Side::Process),
            _ => bail!("--side {s}: expected PROG=kernel or PROG=process (PROG may be a glob)"),
        };
        if !object.programs.iter().any(|pr| glob(p, &pr.name)) {
            let names: Vec<&str> = object.programs.iter().map(|p| p.name.as_str()).collect();
            bail!("--side {s}: {} has no program matching `{p}` (it has: {})", object.file, names.join(", "));
        }
        forced.push((p, side));
    }
    let mut plan = Plan::default();
    let mut sides: Vec<Option<Side>> = Vec::new();
    for p in &object.programs {
        if !p.autoload {
            sides.push(None);
            continue;
        }
        if sel.not_load.iter().any(|pat| glob(pat, &p.name)) {
            plan.skipped.push(p.name.clone());
            sides.push(None);
            continue;
        }
        let side = forced
            .iter()
            .rev()
            .find(|(pat, _)| glob(pat, &p.name))
            .map_or_else(|| default_side(&p.kind, sel.syscalls), |(_, s)| *s);
        match side {
            Side::Process => plan.process.push(p.name.clone()),
            Side::Kernel => {
                // userbpf's own helpers (io_uring) run only in user space.
                userbpf_runtime::loader::check_kernel_helpers(&p.insns)
                    .map_err(|e| anyhow::anyhow!("{}: program `{}` runs in the kernel: {e}", object.file, p.name))?;
                plan.kernel.push(p.name.clone())
            }
        }
        sides.push(Some(side));
    }
    // Map use per side.
    let n = object.maps.len();
    let mut users: Vec<(Vec<&str>, Vec<&str>)> = vec![(Vec::new(), Vec::new()); n];
    for (pi, side) in sides.iter().enumerate() {
        let Some(side) = side else { continue };
        for m in maps_used(object, pi) {
            if m >= n {
                continue;
            }
            let name = object.programs[pi].name.as_str();
            match side {
                Side::Process => users[m].0.push(name),
                Side::Kernel => users[m].1.push(name),
            }
        }
    }
    let mut mmapable = Vec::new();
    for (m, (procs, kerns)) in users.iter().enumerate() {
        let def = &object.maps[m];
        if kerns.is_empty() {
            continue;
        }
        plan.kernel_maps.push(def.name.clone());
        if procs.is_empty() || is_constant_data(&def.name) {
            continue;
        }
        if let Err(why) = userbpf_runtime::kernel_map::shareable(def.map_type) {
            bail!(
                "{}: map `{}` ({}) is used by kernel program{} {} and by user-space program{} {}, and cannot be shared: {why}; keep its programs on one side (--side PROG=kernel|process) or leave some unloaded (--not-load)",
                object.file,
                def.name,
                userbpf_object::map_type_name(def.map_type).unwrap_or("unknown type"),
                if kerns.len() > 1 { "s" } else { "" },
                kerns.iter().map(|k| format!("`{k}`")).collect::<Vec<_>>().join(", "),
                if procs.len() > 1 { "s" } else { "" },
                procs.iter().map(|k| format!("`{k}`")).collect::<Vec<_>>().join(", "),
            );
        }
        if userbpf_runtime::kernel_map::shareable_by_mmap(def.map_type) {
            mmapable.push(m);
            plan.mmapable.push(def.name.clone());
        }
        plan.shared.push(def.name.clone());
    }
    for m in mmapable {
        object.maps[m].map_flags |= userbpf_kernel::BPF_F_MMAPABLE;
    }
    Ok(plan)
}

/// Loads the plan's kernel programs (none: `None`) and makes the shared arrays' values the
/// kernel's in the session (every process opening them maps the kernel's values).
pub fn load_kernel(
    path: &std::path::Path,
    plan: &Plan,
    session: &userbpf_runtime::Session,
    loaded: &userbpf_runtime::LoadedObject,
) -> Result<Option<userbpf_kernel::KernelObject>> {
    if plan.kernel.is_empty() {
        return Ok(None);
    }
    let k = userbpf_kernel::KernelObject::load(&userbpf_kernel::LoadSpec {
        path,
        programs: &plan.kernel,
        maps: &plan.kernel_maps,
        mmapable: &plan.mmapable,
    })
    .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    for name in &plan.shared {
        let Some(lm) = loaded.map(name) else {
            bail!("{}: map `{name}` was not created in the session", path.display())
        };
        let Some(fd) = k.map_fd(name) else {
            bail!("{}: libbpf did not create map `{name}` in the kernel", path.display())
        };
        let info = userbpf_kernel::sys::map_info(fd)
            .map_err(|e| anyhow::anyhow!("{}: reading kernel map `{name}`'s id: {e}", path.display()))?;
        // SAFETY: `fd` is the kernel map's descriptor, owned by `k`, open for this call.
        let bfd = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
        session
            .set_kernel_backing(lm.record.id, &lm.map, info.id, bfd)
            .map_err(|e| anyhow::anyhow!("{}: sharing map `{name}` with the kernel: {e}", path.display()))?;
    }
    Ok(Some(k))
}

/// Copies the kernel maps that are not mapped arrays (used by kernel programs only, or shared
/// through `bpf()`) into their session twins, through `bpf()`, so that `run` prints them with
/// the rest.
pub fn read_back(k: &userbpf_kernel::KernelObject, plan: &Plan, loaded: &userbpf_runtime::LoadedObject) -> Result<()> {
    for name in &plan.kernel_maps {
        if plan.mmapable.contains(name) {
            continue;
        }
        let (Some(lm), Some(fd)) = (loaded.map(name), k.map_fd(name)) else { continue };
        if !crate::dump::iterable(&lm.map) {
            continue;
        }
        let key_size = lm.map.spec().key_size as usize;
        let entries = userbpf_kernel::sys::entries(fd, key_size, lm.map.value_buf_size())
            .map_err(|e| anyhow::anyhow!("reading kernel map `{name}`: {e}"))?;
        for (key, value) in entries {
            lm.map.update_elem(&key, &value, 0).map_err(|e| anyhow::anyhow!("copying kernel map `{name}`: {e}"))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sides_by_kind() {
        let tp = |c: &str, n: &str| ProgramKind::Tracepoint { category: c.into(), name: n.into() };
        assert_eq!(default_side(&tp("task", "task_rename"), SyscallSide::Process), Side::Kernel);
        assert_eq!(default_side(&tp("syscalls", "sys_enter_openat"), SyscallSide::Process), Side::Process);
        assert_eq!(default_side(&tp("syscalls", "sys_enter_openat"), SyscallSide::Kernel), Side::Kernel);
        assert_eq!(default_side(&tp("raw_syscalls", "sys_exit"), SyscallSide::Process), Side::Process);
        assert_eq!(default_side(&tp("", ""), SyscallSide::Kernel), Side::Process);
        let raw = |n: &str| ProgramKind::RawTracepoint { name: n.into() };
        assert_eq!(default_side(&raw("sched_switch"), SyscallSide::Process), Side::Kernel);
        assert_eq!(default_side(&raw("sys_enter"), SyscallSide::Process), Side::Process);
        assert_eq!(
            default_side(&ProgramKind::KernelOnly { kind: "kprobe".into() }, SyscallSide::Process),
            Side::Kernel
        );
        assert_eq!(
            default_side(&ProgramKind::Uprobe { retprobe: false, target: None }, SyscallSide::Kernel),
            Side::Process
        );
    }

    #[test]
    fn globs_and_constants() {
        assert!(glob("on_*", "on_rename"));
        assert!(!glob("on_*", "count"));
        assert!(glob("c?unt", "count"));
        assert!(is_constant_data("shared.rodata"));
        assert!(is_constant_data("shared.rodata.str1.1"));
        assert!(is_constant_data("x.kconfig"));
        assert!(!is_constant_data("shared.bss"));
        assert!(!is_constant_data("counts"));
    }
}
