//! `userbpf attach PID`: the agent put into a process that is already running (through
//! ptrace, by the process's own dlopen: see the userbpf-inject crate), where it joins the
//! session, so that every link of the session, and later ones, apply to it as to a process
//! started with `userbpf start`.
//!
//! `userbpf detach PID`: the agent taken out again (see the agent's `detach` module): the
//! process's own `dlopen(RTLD_NOLOAD)` finds the agent it loaded (or that `userbpf start`
//! preloaded), `userbpf_agent_detach` there asks the agent's thread to remove every probe,
//! give the signals back and end; this command waits until that thread is gone. Children the
//! process forked while attached (they carry the agent, not preloaded) are detached after it.
//! `userbpf detach --unused` detaches the processes loaders injected the agent into
//! (`bpftrace -p PID` through `userbpf load`) whose links are all gone: a killed loader's
//! watchdog runs it.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Args;
use userbpf_runtime::Session;

#[derive(Args)]
pub struct AttachArgs {
    /// The process to attach to.
    pid: i32,
}

pub fn run(session: &str, args: AttachArgs) -> Result<()> {
    // The session must exist for the agent to join it; opening it here also checks the name.
    let s = Session::open(session).with_context(|| format!("opening session {session}"))?;
    println!("{}", inject_agent(&s, args.pid)?);
    Ok(())
}

/// Puts the agent into process `pid` as a member of session `s` and waits until it has
/// joined; returns the line `attach` prints (the process, the thread borrowed, its pause).
/// Shared with `userbpf tool -p`.
pub fn inject_agent(s: &Session, pid: i32) -> Result<String> {
    let session = s.name();
    let agent = crate::run::agent_path()?;
    let root = Session::root();
    let mut arg = format!("{}\n{session}", root.display());
    // A process of another user cannot read the session: it is invited (a membership record
    // written here, the secret handed to its agent) and joins through the broker, which this
    // command serves while it lives (as `tool` and the loaders do).
    let _invite = match cannot_read_session(s, pid) {
        true => {
            let (secret, record) = userbpf_runtime::session::broker::invite(s.layout(), pid as u32)
                .with_context(|| format!("inviting process {pid} (another user's) into session {session}"))?;
            crate::run::serve_broker(s);
            // The CPU slots' file, which the process could not make itself.
            userbpf_runtime::context::CpuSlots::open(&s.layout().cpus())
                .with_context(|| format!("the CPU slots of session {session}"))?;
            arg.push('\n');
            arg.extend(secret.iter().map(|b| format!("{b:02x}")));
            arg.push('\n');
            arg.push_str(&s.dir().to_string_lossy());
            Some(RemoveOnDrop(record))
        }
        false => None,
    };
    let done = userbpf_inject::inject(pid, &agent, "userbpf_agent_attach", arg.as_bytes())
        .with_context(|| format!("attaching to process {pid}"))?;
    match done.ret as i32 {
        0 => {}
        1 => bail!("process {pid} already runs the agent (started under userbpf, or attached before)"),
        2 => bail!("process {pid} is still being detached: try again"),
        r => bail!("the agent in process {pid} could not start (status {r}); its stderr may say why"),
    }
    // The agent joins from a thread of its own: wait until it is a member.
    let members = s.layout().members_dir();
    let deadline = Instant::now() + Duration::from_secs(10);
    // A member, with an acknowledgement file (created before its first sync).
    let agents = s.layout().agents_dir();
    while !is_member(&members, pid) || !has_ack_file(&agents, pid) {
        if Instant::now() > deadline {
            bail!(
                "the agent was loaded into process {pid} but did not join session {session} within 10 s (see the process's stderr)"
            );
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    // Then until its probes are in place: a new links generation, which its watcher syncs
    // on and acknowledges (the loaders' handshake), as the kernel's attach returns with them.
    if let Some(generation) = userbpf_runtime::session::handshake::publish(s)
        && !userbpf_runtime::session::handshake::wait(
            s.layout(),
            generation,
            std::process::id(),
            Duration::from_secs(10),
        )
    {
        bail!(
            "the agent joined session {session} in process {pid} but did not attach its links within 10 s (see the process's stderr)"
        );
    }
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
    Ok(format!(
        "attached to process {pid} ({}) in session {session}: thread {} paused {:.2} ms",
        comm.trim(),
        done.tid,
        done.pause.as_secs_f64() * 1e3
    ))
}

/// Whether `agents/` holds process `pid`'s acknowledgement file (not a temporary file being
/// renamed into place).
fn has_ack_file(agents: &Path, pid: i32) -> bool {
    std::fs::read_dir(agents).is_ok_and(|rd| {
        rd.flatten().any(|e| {
            e.file_name()
                .to_str()
                .and_then(userbpf_runtime::session::Layout::parse_agent)
                .is_some_and(|(p, _)| p == pid as u32)
        })
    })
}

/// A membership record of its own (an invitation's is not: see `broker::invite`).
fn is_member(members: &Path, pid: i32) -> bool {
    let prefix = format!("{pid}.");
    let invite = format!(".{}", userbpf_runtime::session::broker::INVITE_HANDLE);
    std::fs::read_dir(members).is_ok_and(|rd| {
        rd.flatten().any(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            name.starts_with(&prefix) && !name.ends_with(&invite)
        })
    })
}

/// Whether process `pid` runs with credentials that cannot open the session's files: an
/// effective uid other than root and the session directory's owner.
fn cannot_read_session(s: &Session, pid: i32) -> bool {
    use std::os::unix::fs::MetadataExt;
    let owner = std::fs::metadata(s.dir()).map(|m| m.uid()).unwrap_or(0);
    userbpf_runtime::session::effective_uid(pid as u32).is_some_and(|u| u != 0 && u != owner)
}

/// A file removed when this goes out of scope (an invitation's membership record, once the
/// agent joined with its own or failed to).
struct RemoveOnDrop(std::path::PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[derive(Args)]
pub struct DetachArgs {
    /// The process to detach from (and its children forked while it was attached).
    #[arg(required_unless_present = "unused")]
    pid: Option<i32>,
    /// Instead of one process: every process that loaders of the session (`userbpf load
    /// bpftrace -p PID`) injected the agent into and whose links are all gone (a loader killed
    /// before it could detach them; its watchdog runs this).
    #[arg(long, conflicts_with = "pid")]
    unused: bool,
}

/// The agent's thread in process `pid` (named `userbpf-agent`), if any.
fn agent_thread(pid: i32) -> Option<i32> {
    let rd = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    rd.flatten().filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok()).find(|tid| {
        std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/comm")).is_ok_and(|c| c.trim_end() == "userbpf-agent")
    })
}

pub fn detach(session: &str, args: DetachArgs) -> Result<()> {
    if args.unused {
        return detach_unused(session);
    }
    let pid = args.pid.context("no process given")?;
    // Children forked while the process was attached carry the agent too (the same library,
    // not preloaded): they follow it, as the kernel's uprobes leave every process at once.
    let children = forked_children(pid);
    println!("{}", detach_one(pid)?);
    for c in children {
        match detach_one(c) {
            Ok(line) => println!("{line} (a child of process {pid})"),
            Err(e) => eprintln!("userbpf: {e:#} (a child of process {pid})"),
        }
    }
    Ok(())
}

/// The descendants of process `pid` running the agent without having it preloaded (forked
/// from an attached process), children before their own children.
fn forked_children(pid: i32) -> Vec<i32> {
    let mut parent_of: Vec<(i32, i32)> = Vec::new();
    if let Ok(rd) = std::fs::read_dir("/proc") {
        for e in rd.flatten() {
            let Some(p) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else { continue };
            let status = std::fs::read_to_string(format!("/proc/{p}/status")).unwrap_or_default();
            if let Some(pp) = status.lines().find_map(|l| l.strip_prefix("PPid:")).and_then(|v| v.trim().parse().ok()) {
                parent_of.push((p, pp));
            }
        }
    }
    let mut out = Vec::new();
    let mut next = vec![pid];
    while let Some(parent) = next.pop() {
        for &(p, pp) in &parent_of {
            if pp != parent || out.contains(&p) {
                continue;
            }
            next.push(p);
            let environ = std::fs::read(format!("/proc/{p}/environ")).unwrap_or_default();
            let preloaded = environ
                .split(|b| *b == 0)
                .any(|v| v.starts_with(b"LD_PRELOAD=") && v.windows(16).any(|w| w == b"libuserbpf_agent"));
            if !preloaded && agent_thread(p).is_some() {
                out.push(p);
            }
        }
    }
    out
}

/// `userbpf detach --unused`: the processes loaders injected (`perf/injected-PID.START`)
/// whose links are all gone are detached, their lists removed.
fn detach_unused(session: &str) -> Result<()> {
    let l = userbpf_runtime::session::Layout::new(Session::dir_of(session));
    let Ok(rd) = std::fs::read_dir(l.perf_dir()) else { return Ok(()) };
    let _lock = lock_injected(&l)?;
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some((pid, start)) = name
            .strip_prefix("injected-")
            .and_then(|r| r.split_once('.'))
            .and_then(|(p, s)| Some((p.parse::<u32>().ok()?, s.parse::<u64>().ok()?)))
        else {
            continue;
        };
        if !live_injected_links(&l, pid, start, &[]).is_empty() {
            continue;
        }
        let _ = std::fs::remove_file(e.path());
        if userbpf_runtime::session::start_time(pid) != Some(start) {
            continue;
        }
        match detach_one(pid as i32) {
            Ok(line) => println!("{line}"),
            Err(e) => eprintln!("userbpf: {e:#}"),
        }
    }
    Ok(())
}

/// Takes the session's `perf/injected.lock` (held while the returned file is open): the lists
/// of processes injected for links (`perf/injected-PID.START`) change only under it.
pub fn lock_injected(l: &userbpf_runtime::session::Layout) -> Result<std::fs::File> {
    use std::os::unix::io::AsRawFd;
    std::fs::create_dir_all(l.perf_dir()).with_context(|| format!("creating {}", l.perf_dir().display()))?;
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(l.injected_lock())
        .with_context(|| format!("opening {}", l.injected_lock().display()))?;
    // SAFETY: flock on the descriptor we own (released when it closes).
    while unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) } != 0 {
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            bail!("flock {}: {e}", l.injected_lock().display());
        }
    }
    Ok(lock)
}

/// Link ids of process `pid`'s injected list (`perf/injected-PID.START`) whose links still
/// exist, leaving out `gone`.
pub fn live_injected_links(l: &userbpf_runtime::session::Layout, pid: u32, start: u64, gone: &[u32]) -> Vec<u32> {
    std::fs::read_to_string(l.injected(pid, start))
        .unwrap_or_default()
        .lines()
        .filter_map(|w| w.trim().parse::<u32>().ok())
        .filter(|id| !gone.contains(id) && l.link(*id).exists())
        .collect()
}

/// Detaches process `pid`: the line `detach` prints.
/// Touches process `pid`'s acknowledgement files in this user's sessions (wakes its agent's
/// thread, see `detach_one`).
fn touch_ack(pid: u32) {
    let Some(start) = userbpf_runtime::session::start_time(pid) else { return };
    for l in own_sessions() {
        let ack = l.agent(pid, start);
        if let Ok(c) = std::ffi::CString::new(ack.as_os_str().as_encoded_bytes()) {
            // SAFETY: a NUL-terminated path; NULL times: now (a file that is not there fails).
            unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), std::ptr::null(), 0) };
        }
    }
}

/// The layouts of this user's sessions.
fn own_sessions() -> Vec<userbpf_runtime::session::Layout> {
    let prefix = userbpf_runtime::session::Layout::dir_name_prefix();
    std::fs::read_dir(Session::root())
        .map(|rd| {
            rd.flatten()
                .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
                .map(|e| userbpf_runtime::session::Layout::new(e.path()))
                .collect()
        })
        .unwrap_or_default()
}

/// After process `pid`'s agent ended: what it could not remove itself when it left its
/// session (a process that is not the session owner's and found no broker serving: its
/// membership records and acknowledgement file), removed here, so that the session is not
/// kept by a process that no longer runs the agent.
fn remove_leftover_membership(pid: u32) {
    let Some(start) = userbpf_runtime::session::start_time(pid) else { return };
    let prefix = userbpf_runtime::session::Layout::member_prefix(pid, start);
    for l in own_sessions() {
        let _ = std::fs::remove_file(l.agent(pid, start));
        let dir = l.members_dir();
        for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            if e.file_name().to_string_lossy().starts_with(&prefix) {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
}

pub fn detach_one(pid: i32) -> Result<String> {
    let agent = crate::run::agent_path()?;
    let started = Instant::now();
    let done = match userbpf_inject::call_loaded(pid, &agent, "userbpf_agent_detach", b"") {
        Ok(d) => d,
        Err(userbpf_inject::InjectError::NotLoaded { .. }) => {
            bail!("process {pid} has no userbpf agent: nothing to detach")
        }
        Err(e) => return Err(e).with_context(|| format!("detaching from process {pid}")),
    };
    match done.ret as i32 {
        0 => {}
        1 => bail!("process {pid} has no userbpf agent running (detached already?): nothing to detach"),
        r => bail!("the agent in process {pid} could not be asked to detach (status {r})"),
    }
    // The agent's thread removes the probes and ends: wait until it is gone. It is woken by a
    // touch of its acknowledgement file, which the borrowed thread could not make in a
    // process that dropped privileges since it joined (and no broker serving it): made here.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut touched = Instant::now();
    while agent_thread(pid).is_some() {
        if touched.elapsed() > Duration::from_millis(100) {
            touch_ack(pid as u32);
            touched = Instant::now();
        }
        if !Path::new(&format!("/proc/{pid}")).exists() {
            bail!("process {pid} exited while being detached");
        }
        if Instant::now() > deadline {
            bail!("the agent in process {pid} was asked to detach but its thread did not end within 10 s");
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    remove_leftover_membership(pid as u32);
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
    Ok(format!(
        "detached from process {pid} ({}): thread {} paused {:.2} ms, probes removed in {:.1} ms",
        comm.trim(),
        done.tid,
        done.pause.as_secs_f64() * 1e3,
        started.elapsed().as_secs_f64() * 1e3
    ))
}
