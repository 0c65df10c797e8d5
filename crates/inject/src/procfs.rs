//! What /proc says about the target: whether it may be traced, where its libc is, which of its
//! threads to borrow; and the address of a libc function in the libc file.

use std::path::{Path, PathBuf};

use object::{Object, ObjectSymbol};

use crate::InjectError;

/// A field of /proc/PID/status (`Name:\tvalue`).
fn status_field(pid: i32, name: &str) -> Result<Option<String>, InjectError> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).map_err(|_| InjectError::NoProcess(pid))?;
    Ok(text.lines().find_map(|l| l.strip_prefix(name).and_then(|v| v.strip_prefix(':')).map(|v| v.trim().to_string())))
}

/// Refuses, with the reason, what ptrace would refuse: a gone process, another user's, one
/// already traced, one Yama's ptrace_scope keeps from us.
pub fn check_can_trace(pid: i32) -> Result<(), InjectError> {
    if pid <= 0 {
        return Err(InjectError::NoProcess(pid));
    }
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    let uids = status_field(pid, "Uid")?.unwrap_or_default();
    let owner: u32 = uids.split_whitespace().nth(1).and_then(|u| u.parse().ok()).unwrap_or(u32::MAX);
    if me != 0 && owner != me {
        return Err(InjectError::OtherUser { pid, owner });
    }
    let tracer: i32 = status_field(pid, "TracerPid")?.and_then(|t| t.parse().ok()).unwrap_or(0);
    if tracer != 0 {
        return Err(InjectError::AlreadyTraced { pid, tracer });
    }
    if me != 0 {
        match std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope")
            .ok()
            .and_then(|s| s.trim().parse::<u32>().ok())
        {
            Some(3) => {
                return Err(InjectError::NotAllowed(
                    "Yama's kernel.yama.ptrace_scope is 3: no process may be traced".into(),
                ));
            }
            Some(2) => {
                return Err(InjectError::NotAllowed(
                    "Yama's kernel.yama.ptrace_scope is 2: only root (CAP_SYS_PTRACE) may trace".into(),
                ));
            }
            Some(1) if !is_descendant(pid) => {
                return Err(InjectError::NotAllowed(format!(
                    "Yama's kernel.yama.ptrace_scope is 1: only a parent may trace process {pid} (run as root, or set it to 0)"
                )));
            }
            _ => {}
        }
    }
    Ok(())
}

/// Whether `pid` descends from this process (Yama's ptrace_scope 1 lets ancestors trace).
fn is_descendant(pid: i32) -> bool {
    let me = std::process::id() as i32;
    let mut p = pid;
    for _ in 0..4096 {
        let Ok(Some(pp)) = status_field(p, "PPid") else { return false };
        let Ok(pp) = pp.parse::<i32>() else { return false };
        if pp == me {
            return true;
        }
        if pp <= 1 {
            return false;
        }
        p = pp;
    }
    false
}

/// The target's libc.so.6: its file and its load bias (the address its offset 0 is mapped
/// at, minus nothing: glibc's first PT_LOAD has vaddr 0).
pub fn libc_of(pid: i32) -> Result<(PathBuf, u64), InjectError> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).map_err(|_| InjectError::NoProcess(pid))?;
    for line in maps.lines() {
        // start-end perms offset dev inode path
        let mut f = line.split_whitespace();
        let (Some(range), Some(_perms), Some(off), Some(_dev), Some(_ino)) =
            (f.next(), f.next(), f.next(), f.next(), f.next())
        else {
            continue;
        };
        let path: String = f.collect::<Vec<_>>().join(" ");
        let name = Path::new(&path).file_name().and_then(|n| n.to_str()).unwrap_or("");
        if !(name == "libc.so.6" || (name.starts_with("libc-") && name.ends_with(".so")))
            || !off.trim_start_matches('0').is_empty()
        {
            continue;
        }
        let start = u64::from_str_radix(range.split('-').next().unwrap_or(""), 16).unwrap_or(0);
        // The file as the target sees it (its mount namespace and root).
        let in_target = PathBuf::from(format!("/proc/{pid}/root{path}"));
        let file = if in_target.exists() { in_target } else { PathBuf::from(&path) };
        let bias = start.wrapping_sub(first_load_vaddr(&file).unwrap_or(0));
        return Ok((file, bias));
    }
    Err(InjectError::NoLibc { pid })
}

/// The lowest PT_LOAD virtual address of an ELF file (rounded down to its page).
fn first_load_vaddr(path: &Path) -> Option<u64> {
    let data = std::fs::read(path).ok()?;
    let file = object::read::elf::ElfFile64::<object::Endianness>::parse(&*data).ok()?;
    use object::read::elf::ProgramHeader;
    let endian = file.endian();
    file.elf_program_headers()
        .iter()
        .filter(|p| p.p_type(endian) == object::elf::PT_LOAD)
        .map(|p| p.p_vaddr(endian) & !0xfff)
        .min()
}

/// The address of the dynamic symbol `name` (a function) in the libc file at `path`, relative
/// to its load bias.
pub fn libc_symbol(path: &Path, name: &str) -> Result<u64, InjectError> {
    let not_found = || InjectError::NoSymbol { what: format!("function `{name}`"), lib: path.to_path_buf() };
    let data = std::fs::read(path)?;
    let file = object::File::parse(&*data).map_err(|_| not_found())?;
    file.dynamic_symbols()
        .filter(|s| s.is_definition() && s.kind() == object::SymbolKind::Text)
        .find(|s| s.name().is_ok_and(|n| n == name))
        .map(|s| s.address())
        .ok_or_else(not_found)
}

/// The thread to borrow: one blocked in a system call other than a futex wait (it holds no
/// lock of libc's, so dlopen on it cannot deadlock), else the main thread (or the first thread
/// still running, when the main thread has exited).
pub fn safe_thread(pid: i32) -> i32 {
    let Ok(rd) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return pid };
    let mut tids: Vec<i32> = rd.flatten().filter_map(|e| e.file_name().to_str()?.parse().ok()).collect();
    tids.sort_unstable();
    // The main thread first: it is the usual choice and the one a user expects to pause.
    tids.sort_by_key(|&t| t != pid);
    let blocked_safely = |tid: i32| {
        let sc = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/syscall")).unwrap_or_default();
        match sc.split_whitespace().next().and_then(|n| n.parse::<i64>().ok()) {
            // futex (202): maybe waiting for a lock held by another thread, maybe inside one.
            Some(nr) => nr >= 0 && nr != 202,
            None => false,
        }
    };
    let alive = |tid: i32| {
        std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat"))
            .ok()
            .and_then(|s| s.rfind(')').and_then(|i| s.get(i + 2..i + 3)).map(|st| st != "Z" && st != "X"))
            .unwrap_or(false)
    };
    tids.iter()
        .copied()
        .find(|&t| alive(t) && blocked_safely(t))
        .or_else(|| tids.iter().copied().find(|&t| alive(t)))
        .unwrap_or(pid)
}
