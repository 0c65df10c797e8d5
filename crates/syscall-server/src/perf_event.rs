//! `perf_event_open(2)` for the uprobe PMU, syscall tracepoints, the BPF output software event
//! and the CPU/task clocks, and the ioctls on those events.
//!
//! Each event is a FIFO in the session directory (`perf/ID`), registered with the fd table as
//! [`Kind::PerfEvent`]: a real descriptor that `close`, `dup`, `poll` and `epoll` accept
//! (the FIFO is made readable while the event's ring holds data, see [`crate::mmap`]).
//!
//! What an event does once a program is attached (`PERF_EVENT_IOC_SET_BPF` or
//! `LINK_CREATE(BPF_PERF_EVENT)`) and it is enabled:
//! - uprobe/uretprobe: a session link (`kind` `uprobe`/`uretprobe`, the file's offset turned
//!   into `FUNCTION+DELTA` from its symbol table, or, where no function symbol covers it, into
//!   the address its segment maps it at; the event's pid); agents attach it in every process
//!   the link is for, the loader included ([`crate::attach`]);
//! - tracepoint (`syscalls/*`, `raw_syscalls/*` by their tracefs ids): a `tracepoint` link;
//! - `PERF_COUNT_SW_CPU_CLOCK`/`TASK_CLOCK`: a timer thread in the loader runs the program
//!   every period (or at the frequency) with a `struct bpf_perf_event_data` context;
//! - `PERF_COUNT_SW_BPF_OUTPUT`: nothing runs; the event's ring is where
//!   `bpf_perf_event_output` writes once the event is stored in a perf event array.
//!
//! Other event types (hardware counters, other software events, ...) are not eBPF: they go to
//! the kernel untouched. kprobes are refused (`EOPNOTSUPP`): there is no kernel here.

use std::collections::HashMap;
use std::ffi::CStr;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use crate::error::{Context, Error};
use crate::objects::{self, Kind};
use crate::sys;

pub const PERF_TYPE_HARDWARE: u32 = 0;
pub const PERF_TYPE_SOFTWARE: u32 = 1;
pub const PERF_TYPE_TRACEPOINT: u32 = 2;
pub const PERF_COUNT_SW_CPU_CLOCK: u64 = 0;
pub const PERF_COUNT_SW_TASK_CLOCK: u64 = 1;
pub const PERF_COUNT_SW_BPF_OUTPUT: u64 = 10;
pub const PERF_FLAG_FD_CLOEXEC: libc::c_ulong = 8;

pub const PERF_EVENT_IOC_ENABLE: u64 = 0x2400;
pub const PERF_EVENT_IOC_DISABLE: u64 = 0x2401;
pub const PERF_EVENT_IOC_REFRESH: u64 = 0x2402;
pub const PERF_EVENT_IOC_RESET: u64 = 0x2403;
pub const PERF_EVENT_IOC_PERIOD: u64 = 0x4008_2404;
pub const PERF_EVENT_IOC_SET_OUTPUT: u64 = 0x2405;
pub const PERF_EVENT_IOC_SET_FILTER: u64 = 0x4008_2406;
pub const PERF_EVENT_IOC_ID: u64 = 0x8008_2407;
pub const PERF_EVENT_IOC_SET_BPF: u64 = 0x4004_2408;
pub const PERF_EVENT_IOC_PAUSE_OUTPUT: u64 = 0x4004_2409;
pub const PERF_EVENT_IOC_QUERY_BPF: u64 = 0xc008_240a;

/// `PERF_ATTR_SIZE_VER0`: what `size == 0` means.
const ATTR_SIZE_VER0: usize = 64;

/// The head of `struct perf_event_attr` (linux/perf_event.h), up to `config2`: what is read
/// here.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct PerfEventAttr {
    r#type: u32,
    size: u32,
    config: u64,
    /// Or `sample_freq` (a union), with the `freq` flag.
    sample_period: u64,
    sample_type: u64,
    read_format: u64,
    /// The bit fields `disabled`, `inherit`, ... (`FLAG_*`).
    flags: u64,
    /// Or `wakeup_watermark` (a union).
    wakeup_events: u32,
    bp_type: u32,
    /// Or `bp_addr`, `kprobe_func`, `uprobe_path` (a union).
    config1: u64,
    /// Or `bp_len`, `kprobe_addr`, `probe_offset` (a union).
    config2: u64,
}

const _: () = {
    assert!(std::mem::size_of::<PerfEventAttr>() == ATTR_READ);
    assert!(std::mem::offset_of!(PerfEventAttr, flags) == 40 && std::mem::offset_of!(PerfEventAttr, config1) == 56);
};
/// The part of `struct perf_event_attr` we read (up to and including `config2`).
const ATTR_READ: usize = 72;
/// `attr.disabled` is bit 0 of the flags word at offset 40, `attr.freq` bit 10.
const FLAG_DISABLED: u64 = 1;
const FLAG_FREQ: u64 = 1 << 10;

/// What an event is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Spec {
    Uprobe {
        path: String,
        func: Option<String>,
        offset: u64,
        file_offset: u64,
        retprobe: bool,
        pid: Option<u32>,
        ref_ctr_offset: u64,
    },
    Tracepoint {
        func: String,
        pid: Option<u32>,
    },
    Output {
        cpu: i32,
    },
    /// `period` in ns, or with `freq` samples per second.
    Clock {
        cpu: i32,
        period: u64,
        freq: bool,
        task: bool,
    },
}

/// One perf event of the loader.
#[derive(Debug)]
pub struct Event {
    pub id: u32,
    pub spec: Spec,
    pub fifo: PathBuf,
    pub enabled: bool,
    /// The program attached by `PERF_EVENT_IOC_SET_BPF`.
    pub prog: Option<u32>,
    /// Session link made for `prog` while enabled.
    pub link: Option<u32>,
    /// Links made by `LINK_CREATE` on this event.
    pub bpf_links: Vec<u32>,
}

/// The loader's perf events (kept in [`crate::server::Server`]).
pub(crate) fn with_events<T>(f: impl FnOnce(&mut Vec<Event>) -> T) -> T {
    f(&mut crate::server::server().events.lock().unwrap_or_else(|e| e.into_inner()))
}

/// The spec of event `id`, if it exists.
pub fn event_spec(id: u32) -> Option<Spec> {
    with_events(|ev| ev.iter().find(|e| e.id == id).map(|e| e.spec.clone()))
}

fn read_sys(path: &str) -> Option<String> {
    std::fs::read_to_string(path).ok().map(|s| s.trim().to_string())
}

/// The uprobe PMU's type and its retprobe bit (`config:N`).
fn uprobe_pmu() -> Option<(u32, u32)> {
    static PMU: OnceLock<Option<(u32, u32)>> = OnceLock::new();
    *PMU.get_or_init(|| {
        let t = read_sys("/sys/bus/event_source/devices/uprobe/type")?.parse().ok()?;
        let bit = read_sys("/sys/bus/event_source/devices/uprobe/format/retprobe")
            .and_then(|s| s.strip_prefix("config:").and_then(|b| b.parse().ok()))
            .unwrap_or(0);
        Some((t, bit))
    })
}

fn kprobe_pmu() -> Option<u32> {
    static PMU: OnceLock<Option<u32>> = OnceLock::new();
    *PMU.get_or_init(|| read_sys("/sys/bus/event_source/devices/kprobe/type")?.parse().ok())
}

/// Tracepoint ids of the system call tracepoints (what the agent can run), from tracefs.
fn tracepoint_name(id: u64) -> Option<String> {
    static IDS: OnceLock<HashMap<u64, String>> = OnceLock::new();
    IDS.get_or_init(|| {
        let mut m = HashMap::new();
        for root in ["/sys/kernel/tracing/events", "/sys/kernel/debug/tracing/events"] {
            for cat in ["syscalls", "raw_syscalls"] {
                let Ok(rd) = std::fs::read_dir(Path::new(root).join(cat)) else { continue };
                for e in rd.flatten() {
                    let name = e.file_name().to_string_lossy().into_owned();
                    if let Some(id) =
                        std::fs::read_to_string(e.path().join("id")).ok().and_then(|s| s.trim().parse().ok())
                    {
                        m.entry(id).or_insert(format!("{cat}/{name}"));
                    }
                }
            }
            if !m.is_empty() {
                break;
            }
        }
        m
    })
    .get(&id)
    .cloned()
}

/// The process (thread group) of task `tid`, as the kernel's uprobe filter takes the event's
/// task's whole process: `ESRCH` when there is none, `EACCES` for another user's process
/// unless the loader is root (the kernel asks for ptrace access).
fn process_of(tid: u32) -> Result<u32, Error> {
    let status = std::fs::read_to_string(format!("/proc/{tid}/status"))
        .map_err(|_| Error::new(libc::ESRCH, format!("process {tid} does not exist")))?;
    let field = |name: &str| {
        status.lines().find_map(|l| l.strip_prefix(name)).and_then(|v| v.split_whitespace().next()?.parse::<u32>().ok())
    };
    let tgid = field("Tgid:").unwrap_or(tid);
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    if me != 0 && field("Uid:").is_some_and(|uid| uid != me) {
        return Err(Error::new(libc::EACCES, format!("process {tid} belongs to another user")));
    }
    Ok(tgid)
}

/// Makes a path absolute as the loader meant it (`/proc/self/exe` is the loader itself).
fn absolute(path: &str) -> String {
    if (path == "/proc/self/exe" || path == format!("/proc/{}/exe", std::process::id()))
        && let Ok(p) = std::fs::read_link("/proc/self/exe")
    {
        return p.to_string_lossy().into_owned();
    }
    let p = Path::new(path);
    if p.is_absolute() {
        return path.to_string();
    }
    match std::env::current_dir() {
        Ok(d) => d.join(p).to_string_lossy().into_owned(),
        Err(_) => path.to_string(),
    }
}

/// The function containing file offset `off` of ELF file `path`: `(name, delta)` (from
/// `.symtab`, else `.dynsym`; a sized symbol preferred), through the hook engine's
/// symbolizer. `None` when no function symbol covers it (or the file is not an ELF object
/// the symbolizer reads); the file's errno when it cannot be read.
pub fn symbolize_file_offset(path: &str, off: u64) -> Result<Option<(String, u64)>, i32> {
    std::fs::File::open(path).map_err(|e| e.raw_os_error().unwrap_or(libc::ENOENT))?;
    Ok(userbpf_elf::symbols::function_at_file_offset(Path::new(path), off).ok().flatten())
}

fn new_fifo() -> Result<(u32, PathBuf), i32> {
    let s = objects::session()?;
    std::fs::create_dir_all(s.layout().perf_dir()).map_err(|e| e.raw_os_error().unwrap_or(libc::EIO))?;
    let id = s.alloc_id().map_err(|e| e.raw_os_error().unwrap_or(libc::EIO))?;
    let path = s.layout().perf_event(id);
    let _ = std::fs::remove_file(&path);
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).map_err(|_| libc::EINVAL)?;
    // SAFETY: `c` is a NUL-terminated path.
    if unsafe { libc::mkfifo(c.as_ptr(), 0o600) } != 0 {
        return Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO));
    }
    Ok((id, path))
}

/// Serves `perf_event_open(attr, pid, cpu, group_fd, flags)`: the descriptor, or the errno
/// (printed with its reason when `USERBPF_TRACE_BPF` is set, as the bpf calls are).
///
/// # Safety
/// As for [`open_event`].
pub unsafe fn perf_event_open(
    attr: *const u8,
    pid: i32,
    cpu: i32,
    group_fd: i32,
    flags: libc::c_ulong,
) -> Result<i64, i32> {
    // SAFETY: the caller's arguments, under this function's contract.
    let r = unsafe { open_event(attr, pid, cpu, group_fd, flags) };
    if crate::bpf::trace_enabled() {
        let what = match &r {
            Ok(v) => format!("{v}"),
            Err(e) => format!("-1 {e}"),
        };
        eprintln!("userbpf: perf_event_open({attr:p}, {pid}, {cpu}, {group_fd}, {flags:#x}) = {what}");
    }
    r.map_err(|e| e.errno)
}

/// `perf_event_open`: the descriptor, or the error and why.
///
/// # Safety
/// `attr` is null or points to a `struct perf_event_attr` of the size its `size` field says
/// (64 bytes if 0), and a uprobe event's `config1` to a NUL-terminated path (the kernel's
/// contract for the system call).
pub unsafe fn open_event(
    attr: *const u8,
    pid: i32,
    cpu: i32,
    group_fd: i32,
    flags: libc::c_ulong,
) -> Result<i64, Error> {
    if attr.is_null() {
        return Err(Error::new(libc::EFAULT, "attr is null"));
    }
    let mut a = [0u8; ATTR_READ];
    // SAFETY: the caller's attr holds at least its `size` field (offset 4); we read the type
    // and size first, then at most the size it declares.
    let (typ, size) = unsafe { (attr.cast::<u32>().read_unaligned(), attr.add(4).cast::<u32>().read_unaligned()) };
    let size = if size == 0 { ATTR_SIZE_VER0 } else { size as usize };
    if !(ATTR_SIZE_VER0..=4096).contains(&size) {
        return Err(Error::new(libc::E2BIG, format!("attr.size {size}: {ATTR_SIZE_VER0} to 4096 bytes")));
    }
    // SAFETY: the loader's attr is `size` bytes long (the kernel's contract).
    unsafe { std::ptr::copy_nonoverlapping(attr, a.as_mut_ptr(), size.min(ATTR_READ)) };
    // SAFETY: PerfEventAttr is integers only (any bytes are a valid value), ATTR_READ bytes
    // (asserted above), read unaligned from the array of that size.
    let pa: PerfEventAttr = unsafe { a.as_ptr().cast::<PerfEventAttr>().read_unaligned() };
    let (config, period, aflags, config1, config2) = (pa.config, pa.sample_period, pa.flags, pa.config1, pa.config2);
    let pid_opt = if pid == -1 {
        None
    } else if pid == 0 {
        Some(std::process::id())
    } else if pid > 0 {
        Some(process_of(pid as u32)?)
    } else {
        return Err(Error::inval(format!("pid {pid}")));
    };
    let kernel = || {
        // SAFETY: the caller's arguments, passed on unchanged.
        let r = unsafe {
            sys::raw6(crate::SYS_PERF_EVENT_OPEN, attr as i64, pid as i64, cpu as i64, group_fd as i64, flags as i64, 0)
        };
        if r < 0 { Err(Error::new(-r as i32, "the kernel's event")) } else { Ok(r) }
    };
    let spec = if uprobe_pmu().is_some_and(|(t, _)| t == typ) {
        let bit = uprobe_pmu().map_or(0, |(_, b)| b);
        if config1 == 0 {
            return Err(Error::inval("a uprobe without a path (config1)"));
        }
        // SAFETY: config1 is the loader's pointer to a NUL-terminated path (the uprobe PMU's
        // contract, as the kernel reads it with strndup_user).
        let raw = unsafe { CStr::from_ptr(config1 as *const libc::c_char) }.to_string_lossy().into_owned();
        let path = absolute(&raw);
        match std::fs::metadata(&path) {
            Ok(m) if m.is_file() => {
                // The kernel refuses an offset beyond the file (uprobe_register).
                if config2 >= m.len() {
                    return Err(Error::inval(format!(
                        "uprobe {path}: offset {config2:#x} is beyond the file ({} bytes)",
                        m.len()
                    )));
                }
            }
            Ok(_) => return Err(Error::inval(format!("uprobe {path}: not a regular file"))),
            Err(e) => return Err(Error::new(e.raw_os_error().unwrap_or(libc::ENOENT), format!("uprobe {path}: {e}"))),
        }
        let (func, offset) = match symbolize_file_offset(&path, config2).context(|| format!("uprobe {path}"))? {
            Some((f, d)) => (Some(f), d),
            // No function symbol covers it (a USDT site in a stripped function, say): the
            // link takes the address its segment maps it at (a link without a function names
            // an address in the file). File offset and address differ in most executables
            // (e.g. non-PIE ones loaded at 0x400000).
            None => match userbpf_elf::symbols::offset_to_vaddr(Path::new(&path), config2) {
                Some(va) => (None, va),
                None => {
                    return Err(Error::inval(format!(
                        "uprobe {path}: offset {config2:#x} is in none of its loadable segments (not code)"
                    )));
                }
            },
        };
        Spec::Uprobe {
            path,
            func,
            offset,
            file_offset: config2,
            retprobe: config >> bit & 1 == 1,
            pid: pid_opt,
            ref_ctr_offset: config >> 32,
        }
    } else if kprobe_pmu().is_some_and(|t| t == typ) {
        // Kernel functions: the kernel's event (kernel passthrough loads the program there).
        return kernel();
    } else if typ == PERF_TYPE_TRACEPOINT {
        // Tracepoints only the kernel has (kernel passthrough): the kernel's event.
        if crate::bpf::passthrough::syscalls_in_kernel() || tracepoint_name(config).is_none() {
            return kernel();
        }
        match tracepoint_name(config) {
            Some(func) => Spec::Tracepoint { func, pid: pid_opt },
            None => {
                return Err(Error::new(
                    libc::EOPNOTSUPP,
                    format!("tracepoint id {config}: only system call tracepoints are served"),
                ));
            }
        }
    } else if typ == PERF_TYPE_SOFTWARE && config == PERF_COUNT_SW_BPF_OUTPUT {
        // Perf buffers of kernel perf event arrays are the kernel's (kernel passthrough).
        if crate::bpf::passthrough::kernel_outputs() {
            return kernel();
        }
        Spec::Output { cpu }
    } else if typ == PERF_TYPE_SOFTWARE && (config == PERF_COUNT_SW_CPU_CLOCK || config == PERF_COUNT_SW_TASK_CLOCK) {
        let freq = aflags & FLAG_FREQ != 0;
        if period == 0 {
            // A counting clock (no sampling): nothing of ours, the kernel's.
            return kernel();
        }
        Spec::Clock { cpu, period, freq, task: config == PERF_COUNT_SW_TASK_CLOCK }
    } else {
        return kernel();
    };
    let (id, fifo) = new_fifo().context(|| "the event's file in the session")?;
    let fd = match objects::install(Kind::PerfEvent, id, &fifo) {
        Ok(fd) => fd,
        Err(e) => {
            let _ = std::fs::remove_file(&fifo);
            return Err(Error::new(e, format!("opening {}", fifo.display())));
        }
    };
    if flags & PERF_FLAG_FD_CLOEXEC == 0 {
        // The kernel's descriptor is close-on-exec only when asked.
        // SAFETY: F_SETFD on the descriptor just opened.
        unsafe { sys::raw6(libc::SYS_fcntl, fd as i64, libc::F_SETFD as i64, 0, 0, 0, 0) };
    }
    crate::mmap::event_created(id, &fifo);
    with_events(|ev| {
        ev.push(Event {
            id,
            spec,
            fifo,
            enabled: aflags & FLAG_DISABLED == 0,
            prog: None,
            link: None,
            bpf_links: Vec::new(),
        })
    });
    crate::attach::watch_closes();
    Ok(fd as i64)
}

/// Serves `ioctl(fd, req, arg)` when `fd` is one of our perf events (or another object of
/// ours: `ENOTTY`, as the kernel answers for bpf descriptors); `None`: not ours.
///
/// # Safety
/// As for libc's `ioctl`: for `PERF_EVENT_IOC_ID` `arg` points to a writable `u64`, for
/// `PERF_EVENT_IOC_PERIOD` to a readable one.
pub unsafe fn ioctl(fd: i32, req: libc::c_ulong, arg: libc::c_ulong) -> Option<Result<i64, i32>> {
    let Some((kind, id)) = objects::kind_of(fd) else {
        // One of our programs on a kernel event (kernel passthrough).
        return crate::bpf::passthrough::ioctl(fd, req, arg);
    };
    if kind != Kind::PerfEvent {
        return Some(Err(libc::ENOTTY));
    }
    Some(event_ioctl(id, req, arg))
}

fn event_ioctl(id: u32, req: u64, arg: u64) -> Result<i64, i32> {
    match req {
        PERF_EVENT_IOC_ENABLE => set_enabled(id, true).map(|_| 0),
        PERF_EVENT_IOC_DISABLE => set_enabled(id, false).map(|_| 0),
        PERF_EVENT_IOC_RESET | PERF_EVENT_IOC_PAUSE_OUTPUT => Ok(0),
        PERF_EVENT_IOC_REFRESH => set_enabled(id, true).map(|_| 0),
        PERF_EVENT_IOC_ID => {
            if arg == 0 {
                return Err(libc::EFAULT);
            }
            // SAFETY: the loader's pointer to a u64, as the ioctl's contract says.
            unsafe { (arg as *mut u64).write_unaligned(id as u64) };
            Ok(0)
        }
        PERF_EVENT_IOC_SET_OUTPUT => {
            if arg as i32 == -1 {
                Ok(0)
            } else {
                Err(libc::EINVAL)
            }
        }
        PERF_EVENT_IOC_SET_FILTER => Err(libc::EINVAL),
        PERF_EVENT_IOC_PERIOD => {
            if arg == 0 {
                return Err(libc::EFAULT);
            }
            // SAFETY: the loader's pointer to the new u64 period.
            let p = unsafe { (arg as *const u64).read_unaligned() };
            if p == 0 {
                return Err(libc::EINVAL);
            }
            with_events(|ev| match ev.iter_mut().find(|e| e.id == id) {
                Some(Event { spec: Spec::Clock { period, .. }, .. }) => {
                    *period = p;
                    Ok(0)
                }
                Some(_) => Err(libc::EINVAL),
                None => Err(libc::EBADF),
            })?;
            crate::attach::refresh_timer(id);
            Ok(0)
        }
        PERF_EVENT_IOC_SET_BPF => {
            let prog = objects::get_kind(arg as i32, Kind::Prog)?;
            set_bpf(id, prog.id).map(|_| 0)
        }
        PERF_EVENT_IOC_QUERY_BPF => {
            if arg == 0 {
                return Err(libc::EFAULT);
            }
            let progs: Vec<u32> = with_events(|ev| {
                ev.iter().find(|e| e.id == id).map(|e| e.prog.into_iter().collect()).unwrap_or_default()
            });
            // struct perf_event_query_bpf { u32 ids_len; u32 prog_cnt; u32 ids[]; }
            // SAFETY: the loader's struct, ids_len entries long, as the ioctl's contract says.
            unsafe {
                let p = arg as *mut u32;
                let len = p.read_unaligned() as usize;
                p.add(1).write_unaligned(progs.len() as u32);
                for (i, id) in progs.iter().take(len).enumerate() {
                    p.add(2 + i).write_unaligned(*id);
                }
                if len < progs.len() {
                    return Err(libc::ENOSPC);
                }
            }
            Ok(0)
        }
        _ => Err(libc::ENOTTY),
    }
}

/// The program type an event of this spec accepts (the kernel's perf_event_set_bpf_prog).
fn prog_type_ok(spec: &Spec, prog_type: &str) -> bool {
    match spec {
        Spec::Uprobe { .. } => prog_type == "kprobe",
        Spec::Tracepoint { .. } => prog_type == "tracepoint",
        Spec::Clock { .. } => prog_type == "perf_event",
        Spec::Output { .. } => false,
    }
}

fn prog_type_of(prog_id: u32) -> Result<String, i32> {
    let s = objects::session()?;
    let progs = s.progs().map_err(|e| e.raw_os_error().unwrap_or(libc::EIO))?;
    progs.into_iter().find(|p| p.id == prog_id).map(|p| p.prog_type).ok_or(libc::EBADF)
}

fn set_bpf(id: u32, prog_id: u32) -> Result<(), i32> {
    let ptype = prog_type_of(prog_id)?;
    with_events(|ev| {
        let e = ev.iter_mut().find(|e| e.id == id).ok_or(libc::EBADF)?;
        if e.prog.is_some() || !e.bpf_links.is_empty() {
            return Err(libc::EEXIST);
        }
        if !prog_type_ok(&e.spec, &ptype) {
            return Err(libc::EINVAL);
        }
        e.prog = Some(prog_id);
        Ok(())
    })?;
    crate::attach::update_event(id)
}

fn set_enabled(id: u32, on: bool) -> Result<(), i32> {
    with_events(|ev| {
        let e = ev.iter_mut().find(|e| e.id == id).ok_or(libc::EBADF)?;
        e.enabled = on;
        Ok::<(), i32>(())
    })?;
    crate::attach::update_event(id)
}

/// `LINK_CREATE` with `BPF_PERF_EVENT`: attaches program `prog_id` to the event of `event_fd`
/// with `cookie`; returns the link's id (see [`crate::attach::link_file`] for the file its
/// descriptor opens). `EBADF`/`EINVAL` for a descriptor that is not a perf event, `EEXIST`
/// if the event has a program, `EINVAL` for a program of the wrong type.
pub fn attach(event_fd: i32, prog_id: u32, cookie: u64) -> Result<u32, i32> {
    let ev = objects::get_kind(event_fd, Kind::PerfEvent)?;
    let ptype = prog_type_of(prog_id)?;
    with_events(|evs| {
        let e = evs.iter().find(|e| e.id == ev.id).ok_or(libc::EBADF)?;
        if e.prog.is_some() || !e.bpf_links.is_empty() {
            return Err(libc::EEXIST);
        }
        if !prog_type_ok(&e.spec, &ptype) {
            return Err(libc::EINVAL);
        }
        Ok(())
    })?;
    crate::attach::create_bpf_link(ev.id, prog_id, cookie)
}

/// `LINK_DETACH` (or the last descriptor of the link closed): the link's program stops.
pub fn detach_link(link_id: u32) -> Result<(), i32> {
    crate::attach::remove_bpf_link(link_id)
}
