//! Loaders naming a running process: a uprobe (or tracepoint) event opened with `pid = PID`
//! (`bpftrace -p PID`, libbpf's `bpf_program__attach_uprobe(prog, false, PID, ...)`) applies
//! to that process only, as the kernel's does, and the process may have been started without
//! userbpf. When such a link starts, the process is made a member of the session: nothing to
//! do if it is one (`userbpf start`, an earlier `userbpf attach`), else the agent is injected
//! by `userbpf attach PID` (run as a child of the loader, so the loader's own threads, wait
//! calls and signal handlers never see a ptrace stop). With `userbpf load --running`, a link
//! with `pid = -1` does the same for every running process of the user that maps the probed
//! file (the kernel's meaning of -1, for processes that already run).
//!
//! The session remembers which processes loaders injected, and for which links:
//! `perf/injected-PID.START` lists the link ids (one a line), changed under the flock of
//! `perf/injected.lock`, which is also held across the injection and the link's creation (so
//! another loader's last link going cannot detach a process between the two). When a link
//! goes (closed, `LINK_DETACH`, the loader exiting), its id leaves the lists; a list left
//! with no live link (ids whose record is gone, a killed loader's, count as dead) is removed
//! and the process detached with `userbpf detach PID`: every probe out, its code as the file
//! holds it. Processes that were members already are never detached by a loader.

use std::collections::HashMap;
use std::io::Write;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use userbpf_runtime::Session;
use userbpf_runtime::session::layout::Layout;

use crate::error::Error;
use crate::objects;

/// `userbpf load --running`'s switch: links with `pid = -1` also go into running processes.
pub const RUNNING_ENV: &str = "USERBPF_LOAD_RUNNING";
/// `userbpf load --pid PID,...`: links with `pid = -1` also go into these processes.
pub const PIDS_ENV: &str = "USERBPF_LOAD_PIDS";
/// The `userbpf` binary that injects and detaches (set by `userbpf load`; else the one beside
/// this library).
pub const BIN_ENV: &str = "USERBPF_BIN";

/// A process a link was injected into: its pid and start time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Proc {
    pid: u32,
    start: u64,
}

/// The processes each link of this loader holds a place in (`perf/injected-*` lists).
fn held<T>(f: impl FnOnce(&mut HashMap<u32, Vec<Proc>>) -> T) -> T {
    let mut g = crate::server::server().attach.targets.lock().unwrap_or_else(|e| e.into_inner());
    f(g.get_or_insert_with(HashMap::new))
}

/// The flock of `perf/injected.lock`, released on drop.
pub(super) struct Locked {
    _file: std::fs::File,
}

fn lock(l: &Layout) -> Result<Locked, Error> {
    let path = l.injected_lock();
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| Error::new(e.raw_os_error().unwrap_or(libc::EIO), format!("{}: {e}", path.display())))?;
    loop {
        // SAFETY: flock on the descriptor we own.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } == 0 {
            break;
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(Error::new(e.raw_os_error().unwrap_or(libc::EIO), format!("flock {}: {e}", path.display())));
        }
    }
    Ok(Locked { _file: file })
}

/// The processes a link must be a member for, besides the loader: `(required, optional)`.
/// Required: the one it names (`pid > 0`), or for `pid = -1` those named by `userbpf load
/// --pid` (bpftrace 0.17's `-p PID` opens its uprobes with -1, as the kernel sees them too)
/// that map `path`. Optional: with `--running` and `pid = -1`, every process of the user
/// mapping `path` (one that cannot be attached is skipped with a warning).
pub(super) fn wanted(pid: Option<u32>, path: Option<&str>) -> (Vec<u32>, Vec<u32>) {
    let me = std::process::id();
    match pid {
        Some(p) if p != me => (vec![p], Vec::new()),
        Some(_) => (Vec::new(), Vec::new()),
        None => {
            let maps_it = |p: u32| path.is_none_or(|path| maps_file(p, path));
            let named: Vec<u32> = std::env::var(PIDS_ENV)
                .unwrap_or_default()
                .split(',')
                .filter_map(|w| w.trim().parse::<u32>().ok())
                .filter(|&p| p != me && maps_it(p))
                .collect();
            let running = match path {
                Some(path) if std::env::var(RUNNING_ENV).is_ok_and(|v| v == "1") => {
                    mapping(path).into_iter().filter(|p| !named.contains(p)).collect()
                }
                _ => Vec::new(),
            };
            (named, running)
        }
    }
}

/// Whether process `pid` maps file `path`.
fn maps_file(pid: u32, path: &str) -> bool {
    use std::os::unix::fs::MetadataExt;
    let Ok(md) = std::fs::metadata(path) else { return false };
    std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .is_ok_and(|maps| maps.lines().any(|l| maps_line_is(l, md.dev(), md.ino())))
}

/// The running processes of this user (other than the loader and its watchdog) that map
/// file `path`.
fn mapping(path: &str) -> Vec<u32> {
    use std::os::unix::fs::MetadataExt;
    let Ok(md) = std::fs::metadata(path) else { return Vec::new() };
    let (dev, ino) = (md.dev(), md.ino());
    let (me, uid) = (std::process::id(), own_uid());
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir("/proc") else { return out };
    for e in rd.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
        if pid == me || !e.metadata().is_ok_and(|m| m.uid() == uid) {
            continue;
        }
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        if comm.trim_end() == "userbpf-watch" {
            continue;
        }
        let Ok(maps) = std::fs::read_to_string(format!("/proc/{pid}/maps")) else { continue };
        if maps.lines().any(|l| maps_line_is(l, dev, ino)) {
            out.push(pid);
        }
    }
    out
}

fn own_uid() -> u32 {
    // SAFETY: getuid has no preconditions.
    unsafe { libc::getuid() }
}

/// Whether a `/proc/PID/maps` line maps the file `(dev, ino)`.
fn maps_line_is(line: &str, dev: u64, ino: u64) -> bool {
    let mut f = line.split_whitespace();
    let (Some(_), Some(_), Some(_), Some(d), Some(i)) = (f.next(), f.next(), f.next(), f.next(), f.next()) else {
        return false;
    };
    let Some((maj, min)) = d.split_once(':') else { return false };
    let (Ok(maj), Ok(min)) = (u64::from_str_radix(maj, 16), u64::from_str_radix(min, 16)) else { return false };
    i.parse::<u64>().is_ok_and(|i| i == ino) && libc::makedev(maj as u32, min as u32) == dev
}

/// Whether process `pid` (started at `start`) is a member of the session.
fn is_member(l: &Layout, pid: u32, start: u64) -> bool {
    let prefix = Layout::member_prefix(pid, start);
    std::fs::read_dir(l.members_dir())
        .is_ok_and(|rd| rd.flatten().any(|e| e.file_name().to_string_lossy().starts_with(&prefix)))
}

/// The session of this user that process `pid` (started at `start`) is a member of, if any.
fn session_of(pid: u32, start: u64) -> Option<String> {
    let prefix = Layout::dir_name_prefix();
    let member = Layout::member_prefix(pid, start);
    std::fs::read_dir(Session::root()).ok()?.flatten().find_map(|e| {
        let name = e.file_name().to_str()?.strip_prefix(&prefix)?.to_string();
        let l = Layout::new(e.path());
        let rd = std::fs::read_dir(l.members_dir()).ok()?;
        rd.flatten().any(|m| m.file_name().to_string_lossy().starts_with(&member)).then_some(name)
    })
}

/// The `userbpf` binary: `$USERBPF_BIN`, else `userbpf` beside this library (or one level up,
/// as in a cargo target directory's `deps/`).
pub(super) fn userbpf_bin() -> Result<PathBuf, Error> {
    if let Some(p) = std::env::var_os(BIN_ENV).filter(|p| !p.is_empty()) {
        return Ok(PathBuf::from(p));
    }
    let mut info: libc::Dl_info = zeroed_dl_info();
    // SAFETY: dladdr reads the address of a function of this library and writes `info`.
    let ok = unsafe { libc::dladdr(userbpf_bin as *const libc::c_void, &mut info) } != 0;
    if ok && !info.dli_fname.is_null() {
        // SAFETY: dladdr's dli_fname is a NUL-terminated path owned by the dynamic linker.
        let lib = unsafe { std::ffi::CStr::from_ptr(info.dli_fname) }.to_string_lossy().into_owned();
        if let Some(dir) = Path::new(&lib).parent() {
            for cand in [dir.join("userbpf"), dir.join("../userbpf")] {
                if cand.is_file() {
                    return Ok(cand);
                }
            }
        }
    }
    Err(Error::new(libc::ENOENT, format!("the userbpf binary was not found (set {BIN_ENV})")))
}

fn zeroed_dl_info() -> libc::Dl_info {
    // SAFETY: Dl_info is pointers only, for which null is a valid value.
    unsafe { std::mem::zeroed() }
}

/// Runs `userbpf ARGS` without this library preloaded; its stderr, trimmed, on failure.
fn userbpf(args: &[&str]) -> Result<(), String> {
    let bin = userbpf_bin().map_err(|e| e.to_string())?;
    let mut cmd = Command::new(&bin);
    cmd.args(args).stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped());
    cmd.env_remove("USERBPF_LOADER_PID").env_remove(RUNNING_ENV).env_remove(PIDS_ENV);
    // The loader's preloads minus this library.
    if let Some(pre) = std::env::var_os("LD_PRELOAD") {
        let kept: Vec<&str> = pre
            .to_str()
            .unwrap_or("")
            .split([':', ' '])
            .filter(|p| !p.is_empty() && !p.contains("libuserbpf_syscall_server"))
            .collect();
        if kept.is_empty() {
            cmd.env_remove("LD_PRELOAD");
        } else {
            cmd.env("LD_PRELOAD", kept.join(":"));
        }
    }
    let _ours = userbpf_hook::ours();
    let mut child = cmd.spawn().map_err(|e| format!("running {}: {e}", bin.display()))?;
    // Its stderr read to the end, then waited for: blocking reads, no poll (a loader's
    // thread waiting in poll looks as if it were in its event loop).
    let mut err = Vec::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = std::io::Read::read_to_end(&mut e, &mut err);
    }
    let status = child.wait().map_err(|e| format!("waiting for {}: {e}", bin.display()))?;
    if status.success() {
        return Ok(());
    }
    let text = String::from_utf8_lossy(&err);
    let text = text.trim();
    Err(text.strip_prefix("userbpf: ").unwrap_or(text).to_string())
}

/// What [`prepare`] found or did, to be completed by [`commit`] once the link exists (or
/// dropped, which gives the places back).
pub(super) struct Prepared {
    lock: Option<Locked>,
    /// Processes injected by loaders (listed in `perf/injected-*`) the link will hold.
    procs: Vec<Proc>,
}

/// Before a link is made for processes `required` and `optional` (see [`wanted`]): each is
/// made a member of the session (the agent injected unless it is one). A required process
/// that cannot be is the call's error (printed, as the errno alone says little); an optional
/// one is skipped with a warning.
pub(super) fn prepare(s: &Session, required: &[u32], optional: &[u32]) -> Result<Prepared, Error> {
    if required.is_empty() && optional.is_empty() {
        return Ok(Prepared { lock: None, procs: Vec::new() });
    }
    let l = s.layout();
    let locked = lock(l)?;
    let mut procs = Vec::new();
    for &pid in required {
        match ensure_member(s, pid) {
            Ok(Some(p)) => procs.push(p),
            Ok(None) => {}
            Err(e) => {
                eprintln!("userbpf: {}", e.reason);
                // Processes injected for this link already go out again.
                release_procs(l, &procs, None);
                return Err(e);
            }
        }
    }
    for &pid in optional {
        match ensure_member(s, pid) {
            Ok(Some(p)) => procs.push(p),
            Ok(None) => {}
            Err(e) => eprintln!("userbpf: not tracing process {pid}: {}", e.reason),
        }
    }
    Ok(Prepared { lock: Some(locked), procs })
}

/// Makes process `pid` a member: `Some` when loaders injected it (now or before, its
/// `perf/injected-*` list exists), `None` when it was a member on its own.
fn ensure_member(s: &Session, pid: u32) -> Result<Option<Proc>, Error> {
    let l = s.layout();
    let start = userbpf_runtime::session::start_time(pid)
        .ok_or_else(|| Error::new(libc::ESRCH, format!("process {pid} does not exist")))?;
    let marker = l.injected(pid, start);
    if is_member(l, pid, start) {
        return Ok(marker.exists().then_some(Proc { pid, start }));
    }
    // The agent runs with the process's credentials and opens the session's files (this
    // user's, mode 0600): root's `userbpf attach` invites another user's process (it joins
    // through the session's broker: `userbpf_runtime::session::broker::invite`); another
    // user's loader could not even ptrace it.
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    if let Some(uid) = userbpf_runtime::session::effective_uid(pid).filter(|u| *u != me && me != 0) {
        return Err(Error::new(
            libc::EPERM,
            format!(
                "process {pid} runs as uid {uid}: the agent injected there could not open the session of uid {me}; run the loader as uid {uid} (`userbpf load` needs no root for libbpf loaders)"
            ),
        ));
    }
    let pid_s = pid.to_string();
    if let Err(why) = userbpf(&["--session", s.name(), "attach", &pid_s]) {
        // It may have joined meanwhile (a process starting under `userbpf start`).
        if is_member(l, pid, start) {
            return Ok(marker.exists().then_some(Proc { pid, start }));
        }
        if let Some(other) = session_of(pid, start) {
            return Err(Error::new(
                libc::EBUSY,
                format!(
                    "process {pid} runs the userbpf agent in session {other}, not {}: run the loader in that session (--session {other})",
                    s.name()
                ),
            ));
        }
        return Err(Error::new(libc::EPERM, format!("cannot attach to process {pid}: {why}")));
    }
    // A list left by an earlier injection of the same process (a killed loader's) is stale.
    if let Err(e) = std::fs::write(&marker, b"") {
        let _ = userbpf(&["detach", &pid_s]);
        return Err(Error::new(e.raw_os_error().unwrap_or(libc::EIO), format!("{}: {e}", marker.display())));
    }
    Ok(Some(Proc { pid, start }))
}

/// The link `link` exists: its id joins the lists of the processes [`prepare`] found.
pub(super) fn commit(p: Prepared, link: u32) {
    let Ok(s) = objects::session() else { return };
    for pr in &p.procs {
        let path = s.layout().injected(pr.pid, pr.start);
        if let Ok(mut f) = std::fs::OpenOptions::new().append(true).open(&path) {
            let _ = writeln!(f, "{link}");
        }
    }
    if !p.procs.is_empty() {
        held(|m| m.insert(link, p.procs.clone()));
    }
    drop(p.lock);
}

/// The link could not be made: the processes injected for it go out again.
pub(super) fn abort(p: Prepared) {
    if let Ok(s) = objects::session() {
        release_procs(s.layout(), &p.procs, None);
    }
}

/// Link `link` is gone: its places go, and processes left without a live link are detached.
pub(super) fn release(link: u32) {
    let Some(procs) = held(|m| m.remove(&link)) else { return };
    let Ok(s) = objects::session() else { return };
    let Ok(_locked) = lock(s.layout()) else { return };
    release_procs(s.layout(), &procs, Some(link));
}

/// Under the lock: `link` leaves each process's list; a list with no live link left is
/// removed and its process detached.
fn release_procs(l: &Layout, procs: &[Proc], link: Option<u32>) {
    for p in procs {
        let path = l.injected(p.pid, p.start);
        let Ok(text) = std::fs::read_to_string(&path) else { continue };
        let live: Vec<u32> = text
            .lines()
            .filter_map(|w| w.trim().parse::<u32>().ok())
            .filter(|id| Some(*id) != link && l.link(*id).exists())
            .collect();
        if !live.is_empty() {
            let body: String = live.iter().map(|id| format!("{id}\n")).collect();
            let _ = userbpf_runtime::session::layout::write_atomic(&path, body.as_bytes());
            continue;
        }
        let _ = std::fs::remove_file(&path);
        if userbpf_runtime::session::start_time(p.pid) != Some(p.start) {
            continue; // gone (or its pid reused)
        }
        match userbpf(&["detach", &p.pid.to_string()]) {
            // Detached meanwhile by hand (`userbpf detach PID`): nothing left to do.
            Err(why) if why.contains("nothing to detach") => {}
            Err(why) => eprintln!("userbpf: detaching from process {}: {why}", p.pid),
            Ok(()) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_lines_match_by_device_and_inode() {
        let dev = libc::makedev(0x08, 0x01);
        let line = "555555554000-555555556000 r-xp 00000000 08:01 1234 /tmp/x (deleted)";
        assert!(maps_line_is(line, dev, 1234));
        assert!(!maps_line_is(line, dev, 123));
        assert!(!maps_line_is(line, libc::makedev(0x08, 0x02), 1234));
        assert!(!maps_line_is("7ffd0000-7ffd1000 rw-p 00000000 00:00 0", dev, 1234));
    }
}
