//! `userbpf tool NAME`: ready tools in the spirit of BCC's (`funclatency`, `calls` like
//! funccount, `trace`), each an eBPF object built from `tools/NAME.bpf.c` by the Makefile
//! plus a front-end here that picks the functions, makes the links (with a cookie telling
//! the program which function or probe it runs for), starts the command or enters a
//! running process, and prints what the maps hold, at intervals and at the end.
//!
//! This module holds what the tools share: finding the objects, resolving `BIN` (a path, a
//! command in `PATH`, a library name as `ldconfig -p` or the process's mappings know it) and
//! globs over its function symbols, and [`Tracer`]: a session of the tool's own, or the one
//! named by `--session`/`USERBPF_SESSION` (so that `userbpf export` serves the tool's maps
//! while it runs); for `-p PID`, the session the process already belongs to, else the named
//! one or a `tool-pid-PID` session, the agent injected as `userbpf attach` does; the links,
//! the run loop (intervals, duration, Ctrl-C, the command's or the process's end) and the
//! clean-up (links removed so that a process entered with `-p` runs on unprobed; the agent a
//! tool injected leaves with the last tool or loader tracing the process, see
//! [`Tracer::finish`]; links a killed tool left in a `tool-pid-PID` session are removed by the
//! next tool on that process).

mod aiocost;
mod calls;
mod funclatency;
mod iolatency;
mod trace;

use std::path::{Path, PathBuf};
use std::process::{Child, ExitStatus};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use userbpf_maps::Map;
use userbpf_object::Object;
use userbpf_runtime::context::CpuSlots;
use userbpf_runtime::loader::LoadOptions;
use userbpf_runtime::session::handshake;
use userbpf_runtime::{Engine, LinkRecord, LoadedObject, Session, load_object};

#[derive(Subcommand)]
pub enum ToolCmd {
    /// Latency of user functions as log2 histograms (BCC's funclatency): `BIN:FUNC`, globs
    /// allowed in FUNC.
    Funclatency(funclatency::Args),
    /// Call counts per function, top-N refreshed each interval (BCC's funccount):
    /// `BIN:PATTERN`.
    Calls(calls::Args),
    /// One line per call or return, with arguments, return values and a filter (BCC's trace):
    /// `'BIN:FUNC (arg1 > 10) "n=%d", arg1'`, `'r:BIN:FUNC "ret %d", retval'`.
    Trace(trace::Args),
    /// Block I/O latency histograms per user function, device and operation: uprobes on the
    /// application's I/O functions mark the thread, the kernel's block tracepoints time the
    /// requests (examples/bpf/iolatency.bpf.c).
    Iolatency(iolatency::Args),
    /// What each async-I/O interface costs (io_uring, native aio, POSIX aio), phase by phase,
    /// from the bundled benchmark's USDT probes, through userbpf and through the kernel.
    Aiocost(aiocost::Args),
}

/// The session named with `--session` or `USERBPF_SESSION`, if any: the tools use it instead
/// of one of their own, so that `userbpf export` or `map dump` can read their maps live.
static NAMED_SESSION: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();

pub fn run(session: Option<String>, cmd: ToolCmd) -> Result<()> {
    let _ = NAMED_SESSION.set(session);
    match cmd {
        ToolCmd::Funclatency(a) => funclatency::run(a),
        ToolCmd::Calls(a) => calls::run(a),
        ToolCmd::Trace(a) => trace::run(a),
        ToolCmd::Aiocost(a) => aiocost::run(a),
        ToolCmd::Iolatency(a) => iolatency::run(a),
    }
}

fn named_session() -> Option<String> {
    NAMED_SESSION.get().cloned().flatten()
}

/// What every tool takes: the process to trace and when to print and stop.
#[derive(Args, Clone)]
pub struct Common {
    /// Trace this running process: the agent is put into it (as `userbpf attach` does) unless
    /// it already runs it, and when the tool ends its probes are removed and the agent it put
    /// there is taken out again (once no other tool or loader traces the process; one the
    /// process ran before stays).
    #[arg(short = 'p', long = "pid", conflicts_with = "command")]
    pub pid: Option<i32>,
    /// Print (and, for counts, start over) every SECS seconds.
    #[arg(short = 'i', long = "interval", value_name = "SECS")]
    pub interval: Option<f64>,
    /// Stop after SECS seconds (a command still running is sent SIGTERM).
    #[arg(short = 'd', long = "duration", value_name = "SECS")]
    pub duration: Option<f64>,
    /// Print the time of day before each interval's output.
    #[arg(short = 'T', long = "timestamp")]
    pub timestamp: bool,
    /// Run the programs in the interpreter instead of the JIT.
    #[arg(long)]
    pub interpreter: bool,
    /// The command to start under userbpf (as `userbpf run` does), and its arguments.
    #[arg(last = true)]
    pub command: Vec<String>,
}

/// The object of tool `name` (see [`tool_file`]).
pub fn object_path(name: &str) -> Result<PathBuf> {
    tool_file(&format!("{name}.bpf.o"))
}

/// A file of the tools (an object, aiocost's benchmark): in `$USERBPF_TOOLS_DIR`, else in
/// `tools/` beside the `userbpf` binary or one directory up (`target/release/userbpf` finds
/// `target/tools/`, where the Makefile builds them).
pub fn tool_file(file: &str) -> Result<PathBuf> {
    if let Some(d) = std::env::var_os("USERBPF_TOOLS_DIR") {
        let p = Path::new(&d).join(file);
        if p.exists() {
            return Ok(p);
        }
        bail!("{} not found ($USERBPF_TOOLS_DIR)", p.display());
    }
    let exe = std::env::current_exe().context("locating the userbpf binary")?;
    let dir = exe.parent().context("the userbpf binary has no directory")?;
    for cand in [dir.join("tools").join(file), dir.join("../tools").join(file)] {
        if cand.exists() {
            return Ok(cand);
        }
    }
    bail!(
        "{file} not found in tools/ beside {} or one directory up (build it with `make`, or set USERBPF_TOOLS_DIR)",
        exe.display()
    )
}

/// `BIN:FUNC` split at its last `:` (FUNC may not hold one; BIN may, as a path may).
pub fn split_spec(spec: &str) -> Result<(&str, &str)> {
    match spec.rsplit_once(':') {
        Some((b, f)) if !b.is_empty() && !f.is_empty() => Ok((b, f)),
        _ => bail!("`{spec}`: expected BIN:FUNC (BIN a path, a command in PATH or a library name such as libc or c)"),
    }
}

/// The file `bin` names: a path (with a `/`); for `-p PID`, a file the process maps whose
/// name is `bin`, `bin.so*` or `libbin.so*`; a command in `PATH`; a library `ldconfig -p`
/// knows by those names (`c` and `libc` are libc.so.6, as BCC reads them).
pub fn resolve_bin(bin: &str, pid: Option<i32>) -> Result<PathBuf> {
    if bin.contains('/') {
        let p = Path::new(bin);
        if !p.exists() {
            bail!("{bin} does not exist");
        }
        return std::fs::canonicalize(p).with_context(|| format!("resolving {bin}"));
    }
    let names_lib = |file: &str| -> bool {
        file == bin
            || file.strip_prefix(bin).is_some_and(|r| r.starts_with(".so"))
            || file.strip_prefix("lib").and_then(|f| f.strip_prefix(bin)).is_some_and(|r| r.starts_with(".so"))
    };
    if let Some(pid) = pid
        && let Ok(maps) = std::fs::read_to_string(format!("/proc/{pid}/maps"))
    {
        for line in maps.lines() {
            let Some(path) = line.split_whitespace().nth(5).filter(|p| p.starts_with('/')) else { continue };
            let file = Path::new(path).file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default();
            if names_lib(&file) {
                return Ok(PathBuf::from(path));
            }
        }
    }
    if let Some(exe) = crate::run::command_executable(bin) {
        return Ok(exe);
    }
    if let Ok(out) = std::process::Command::new("ldconfig").arg("-p").output() {
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let Some((name, path)) = line.trim().split_once(" => ") else { continue };
            let name = name.split_whitespace().next().unwrap_or("");
            if names_lib(name) && line.contains("x86-64") {
                return Ok(PathBuf::from(path.trim()));
            }
        }
    }
    bail!("`{bin}`: not a path, not a command in PATH, and no library of that name (ldconfig -p)")
}

/// Whether `pattern` (shell wildcards `*`, `?`, `[...]`) has any wildcard.
pub fn is_glob(pattern: &str) -> bool {
    pattern.contains(['*', '?', '['])
}

fn fnmatch(pattern: &str, name: &str) -> bool {
    let (Ok(p), Ok(n)) = (std::ffi::CString::new(pattern), std::ffi::CString::new(name)) else { return false };
    // SAFETY: both are NUL-terminated strings that live across the call; fnmatch only reads them.
    unsafe { libc::fnmatch(p.as_ptr(), n.as_ptr(), 0) == 0 }
}

/// A function to probe.
#[derive(Clone, Debug)]
pub struct Func {
    /// The symbol's name without a version (`memcpy`, not `memcpy@@GLIBC_2.14`).
    pub name: String,
}

/// The most functions one tool run probes (BCC's funccount stops at 1000 as well).
pub const MAX_FUNCS: usize = 1000;

/// The functions of `path` whose names match `pattern` (exact, or shell wildcards), one per
/// address (aliases such as `__libc_malloc`/`malloc` are one function, probed once, named by
/// its public name), GNU indirect-function resolvers left out of globs. Sorted by name.
pub fn match_functions(path: &Path, pattern: &str) -> Result<Vec<Func>> {
    let syms = userbpf_elf::symbols::function_symbols(path).map_err(|e| anyhow::anyhow!("{e}"))?;
    let glob = is_glob(pattern);
    // One name per address: aliases (`_IO_printf`/`printf`) are one function; the name shown
    // is the public one (no leading `_`), then the shortest.
    let mut by_addr: std::collections::BTreeMap<usize, String> = std::collections::BTreeMap::new();
    for s in syms {
        let base = s.name.split('@').next().unwrap_or(&s.name);
        let hit = if glob { !s.ifunc && fnmatch(pattern, base) } else { base == pattern };
        if !hit || s.value == 0 {
            continue;
        }
        let rank = |n: &str| (n.starts_with('_'), n.len());
        by_addr
            .entry(s.value)
            .and_modify(|n| {
                if rank(base) < rank(n) {
                    *n = base.to_string()
                }
            })
            .or_insert_with(|| base.to_string());
    }
    let mut out: Vec<Func> = Vec::new();
    for name in by_addr.into_values() {
        // The same name at two addresses (static functions of two files): the agent resolves
        // a name once, so it is probed once.
        if !out.iter().any(|f| f.name == name) {
            out.push(Func { name });
        }
    }
    if out.is_empty() {
        bail!("no function of {} matches `{pattern}`", path.display());
    }
    if out.len() > MAX_FUNCS {
        bail!(
            "`{pattern}` matches {} functions of {}; at most {MAX_FUNCS} are probed at once (narrow the pattern)",
            out.len(),
            path.display()
        );
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_interrupt(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::Relaxed);
}

/// Ctrl-C (SIGINT) and SIGTERM end the tool's tracing (then it prints and cleans up).
fn catch_interrupts() {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: a handler that only stores to an atomic is async-signal-safe; sigaction gets
        // a zeroed struct with the handler set and no other memory.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_interrupt as extern "C" fn(libc::c_int) as usize;
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
}

/// Where the tool's probes go.
pub enum Target {
    Command(Vec<String>),
    Pid(i32),
}

impl Target {
    pub fn from(common: &Common) -> Result<Target> {
        match (common.pid, common.command.is_empty()) {
            (Some(pid), true) => Ok(Target::Pid(pid)),
            (None, false) => Ok(Target::Command(common.command.clone())),
            (Some(_), false) => bail!("give either -p PID or -- CMD, not both"),
            (None, true) => {
                bail!("nothing to trace: give -p PID (a running process) or -- CMD ARGS (a command to start)")
            }
        }
    }

    pub fn pid(&self) -> Option<i32> {
        match self {
            Target::Pid(p) => Some(*p),
            Target::Command(_) => None,
        }
    }
}

/// A tool's session, object and links (see the module's documentation).
pub struct Tracer {
    pub session: Session,
    pub loaded: LoadedObject,
    target: Target,
    interpreter: bool,
    links: Vec<(u32, String)>,
    /// For `-p`: whether the process already runs the agent (in this session).
    has_agent: bool,
    /// For `-p` into a process a tool or loader injected the agent into: the process (pid,
    /// start time), whose list of links (`perf/injected-PID.START`) holds this tool's; the
    /// last to leave it takes the agent out.
    injected: Option<(u32, u64)>,
    finished: bool,
    /// Where the command's stdout goes (default: the tool's).
    pub stdout: Option<std::process::Stdio>,
    /// The object's kernel half (programs only the kernel runs: `crate::kernel_side`).
    kernel: Option<userbpf_kernel::KernelObject>,
}

/// How tracing ended.
pub enum End {
    /// The command exited (its status).
    Exited(ExitStatus),
    /// The process given with `-p` is gone.
    Gone,
    /// `-d` elapsed.
    Duration,
    /// Ctrl-C or SIGTERM.
    Interrupted,
    /// The tool had what it wanted (`trace -M`).
    Done,
}

impl Tracer {
    /// Opens the session for `target` and loads tool `tool`'s object into it.
    pub fn new(tool: &str, target: Target, interpreter: bool) -> Result<Tracer> {
        let object_path = object_path(tool)?;
        let mut object = Object::open(&object_path)?;
        // Each program where it belongs: the kernel's kinds to the kernel.
        let plan = crate::kernel_side::plan(
            &mut object,
            &crate::kernel_side::Selection {
                syscalls: crate::kernel_side::SyscallSide::Process,
                sides: &[],
                not_load: Vec::new(),
            },
        )?;
        let (name, has_agent) = match &target {
            Target::Command(_) => {
                (named_session().unwrap_or_else(|| format!("tool-{tool}-{}", std::process::id())), false)
            }
            Target::Pid(pid) => {
                if !Path::new(&format!("/proc/{pid}")).exists() {
                    bail!("process {pid} does not exist");
                }
                // A process that already runs the agent is reached through its session.
                match Session::list().into_iter().find(|s| s.members.iter().any(|(p, _)| *p as i32 == *pid)) {
                    Some(s) => {
                        if let Some(n) = named_session().filter(|n| *n != s.name) {
                            bail!(
                                "process {pid} runs the agent in session {} (not {n}): name that session, or none",
                                s.name
                            );
                        }
                        (s.name, true)
                    }
                    None => (named_session().unwrap_or_else(|| format!("tool-pid-{pid}")), false),
                }
            }
        };
        if interpreter && has_agent {
            eprintln!(
                "userbpf: process already runs the agent: its engine is the one it started with (--interpreter ignored)"
            );
        }
        let session = Session::open(&name).with_context(|| format!("opening session {name}"))?;
        // The tool adds links: a member that dropped root reaches them through it.
        crate::run::serve_broker(&session);
        if let Target::Pid(pid) = &target {
            remove_stale_links(&session, *pid);
        }
        let slots = Arc::new(CpuSlots::open(&session.layout().cpus())?);
        let engine = if interpreter { Engine::Interpreter } else { Engine::Jit };
        let opts = LoadOptions { engine, helpers: userbpf_runtime::helpers::registry(), only: Some(&plan.process) };
        let loaded = load_object(&session, object, &opts, slots)
            .with_context(|| format!("loading {}", object_path.display()))?;
        let mut kernel = crate::kernel_side::load_kernel(&object_path, &plan, &session, &loaded)?;
        if let Some(k) = kernel.as_mut() {
            for note in k.attach().map_err(|e| anyhow::anyhow!("{}: {e}", object_path.display()))? {
                eprintln!("userbpf: {note}");
            }
        }
        catch_interrupts();
        Ok(Tracer {
            session,
            loaded,
            target,
            interpreter,
            links: Vec::new(),
            has_agent,
            injected: None,
            finished: false,
            stdout: None,
            kernel,
        })
    }

    /// The entries of map `name` of the object's kernel half, read through `bpf()`.
    pub fn kernel_map_entries(&self, name: &str) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let k = self.kernel.as_ref().context("the tool's object has no kernel programs")?;
        let fd = k.map_fd(name).with_context(|| format!("the kernel has no map `{name}` of the tool's object"))?;
        let m = self.map(name)?;
        userbpf_kernel::sys::entries(fd, m.spec().key_size as usize, m.value_buf_size())
            .with_context(|| format!("reading kernel map `{name}`"))
    }

    /// The kernel half's programs the kernel skipped runs of, with how many
    /// ([`userbpf_kernel::KernelObject::recursion_misses`]).
    pub fn kernel_recursion_misses(&self) -> Vec<(String, u64)> {
        self.kernel.as_ref().map(|k| k.recursion_misses()).unwrap_or_default()
    }

    /// The object's map `name`.
    pub fn map(&self, name: &str) -> Result<&Map> {
        self.loaded.map(name).map(|m| &*m.map).with_context(|| format!("the tool's object has no map `{name}`"))
    }

    /// The id the session gave program `prog`.
    fn prog_id(&self, prog: &str) -> Result<u32> {
        self.loaded
            .programs
            .iter()
            .find(|(r, _)| r.name == prog)
            .map(|(r, _)| r.id)
            .with_context(|| format!("the tool's object has no program `{prog}`"))
    }

    /// Attaches program `prog` at entry (or, `ret`, return) of `func` in `path`, with `cookie`.
    pub fn probe(&mut self, prog: &str, ret: bool, path: &Path, func: &Func, cookie: u64) -> Result<()> {
        let kind = if ret { "uretprobe" } else { "uprobe" };
        let rec = LinkRecord {
            id: 0,
            prog_id: self.prog_id(prog)?,
            kind: kind.into(),
            path: path.display().to_string(),
            func: Some(func.name.clone()),
            offset: 0,
            cookie,
            // With -p, the process's session may have other members (`userbpf start`): the
            // link is for that process only, as the kernel's pid means.
            pid: self.target.pid().map(|p| p as u32),
        };
        let l = self.session.add_link(rec)?;
        self.links.push((l.id, format!("{kind} {}:{}", path.display(), func.name)));
        Ok(())
    }

    /// Attaches program `prog` at USDT probe `provider:name` of `path`.
    pub fn probe_usdt(&mut self, prog: &str, path: &Path, probe: &str) -> Result<()> {
        let rec = LinkRecord {
            id: 0,
            prog_id: self.prog_id(prog)?,
            kind: "usdt".into(),
            path: path.display().to_string(),
            func: Some(probe.to_string()),
            offset: 0,
            cookie: 0,
            pid: self.target.pid().map(|p| p as u32),
        };
        let l = self.session.add_link(rec)?;
        self.links.push((l.id, format!("usdt {}:{probe}", path.display())));
        Ok(())
    }

    /// Starts the command (with the agent) or puts the probes into the running process, and
    /// returns once they are in place.
    pub fn start(&mut self) -> Result<Running> {
        match &self.target {
            Target::Command(cmd) => {
                let mut c = crate::run::target_command(cmd, self.session.name(), self.interpreter)?;
                c.env(userbpf_runtime::loader::ATTACH_REPORTS_ENV, "1");
                if let Some(out) = self.stdout.take() {
                    c.stdout(out);
                }
                let child = c.spawn().with_context(|| format!("starting {}", cmd[0]))?;
                Ok(Running { child: Some(child), pid: None, started: Instant::now(), name: cmd[0].clone() })
            }
            Target::Pid(pid) => {
                let pid = *pid;
                let generation = publish_links_gen(&self.session)?;
                self.join_injected(pid)?;
                wait_acked(&self.session, pid, generation, Duration::from_secs(10));
                Ok(Running { child: None, pid: Some(pid), started: Instant::now(), name: format!("process {pid}") })
            }
        }
    }

    /// Puts the agent into process `pid` unless it runs it, under the session's injected lock
    /// (as loaders do: `userbpf load bpftrace -p`): a process injected (now, or by another tool
    /// or loader still tracing it) gets this tool's link ids in its list, so that the agent is
    /// taken out when the last of them goes ([`Tracer::finish`]). A process that ran the agent
    /// on its own (`userbpf start`, `userbpf attach`) keeps it.
    fn join_injected(&mut self, pid: i32) -> Result<()> {
        let l = self.session.layout();
        let _lock = crate::attach::lock_injected(l)?;
        let start =
            userbpf_runtime::session::start_time(pid as u32).with_context(|| format!("process {pid} is gone"))?;
        let list = l.injected(pid as u32, start);
        if !self.has_agent {
            let msg = crate::attach::inject_agent(&self.session, pid)?;
            eprintln!("userbpf: {msg} (taken out again when the tool ends)");
            if let Err(e) = std::fs::write(&list, b"") {
                eprintln!("userbpf: {}: {e} (the agent will stay in process {pid})", list.display());
            }
        }
        if !list.exists() {
            return Ok(());
        }
        let ids: String = self.links.iter().map(|(id, _)| format!("{id}\n")).collect();
        let appended = std::fs::OpenOptions::new()
            .append(true)
            .open(&list)
            .and_then(|mut f| std::io::Write::write_all(&mut f, ids.as_bytes()));
        match appended {
            Ok(()) => self.injected = Some((pid as u32, start)),
            Err(e) => eprintln!("userbpf: {}: {e} (the agent will stay in process {pid})", list.display()),
        }
        Ok(())
    }

    /// This tool's links are gone: they leave the process's injected list, and the agent
    /// leaves the process with the last of them.
    fn leave_injected(&mut self, gone: &[u32]) {
        let Some((pid, start)) = self.injected.take() else { return };
        let l = self.session.layout();
        let Ok(_lock) = crate::attach::lock_injected(l) else { return };
        let list = l.injected(pid, start);
        let live = crate::attach::live_injected_links(l, pid, start, gone);
        if !live.is_empty() {
            let body: String = live.iter().map(|id| format!("{id}\n")).collect();
            let _ = userbpf_runtime::session::layout::write_atomic(&list, body.as_bytes());
            return;
        }
        let _ = std::fs::remove_file(&list);
        if userbpf_runtime::session::start_time(pid) != Some(start) {
            return; // gone, or its pid reused
        }
        match crate::attach::detach_one(pid as i32) {
            Ok(line) => eprintln!("userbpf: {line}"),
            // Detached meanwhile by hand (`userbpf detach PID`).
            Err(e) if format!("{e:#}").contains("nothing to detach") => {}
            Err(e) => eprintln!("userbpf: {e:#}"),
        }
    }

    /// Errors the agents reported for the links (a function that cannot be probed), one
    /// line each, for warnings.
    pub fn attach_errors(&self) -> Vec<String> {
        let reports = userbpf_runtime::loader::attach_reports(self.session.dir());
        let mut out = Vec::new();
        for (id, what) in &self.links {
            for r in reports.iter().filter(|r| r.link == *id) {
                if let Some(e) = &r.error {
                    out.push(format!("{what}: {e} (process {})", r.pid));
                }
            }
        }
        out.sort();
        out.dedup();
        out
    }

    /// Removes the tool's links; for `-p`, waits (bounded) until the process has let go of
    /// the probes, so that it runs on unprobed once the tool has exited.
    pub fn finish(&mut self) {
        if std::mem::replace(&mut self.finished, true) {
            return;
        }
        let mut gone = Vec::new();
        for (id, _) in self.links.drain(..) {
            let _ = self.session.remove_link(id);
            gone.push(id);
        }
        if let Some(k) = self.kernel.as_mut() {
            k.detach();
        }
        if let Target::Pid(pid) = self.target
            && let Ok(generation) = publish_links_gen(&self.session)
        {
            wait_acked(&self.session, pid, generation, Duration::from_secs(5));
        }
        self.leave_injected(&gone);
    }
}

impl Drop for Tracer {
    fn drop(&mut self) {
        self.finish();
        let _ = userbpf_runtime::loader::unpin_maps(&self.session, &self.loaded);
    }
}

/// A `tool-pid-PID` session is the tools' own: when no process but the target (and this one)
/// uses it, its links are left over from a tool that was killed before it could remove them
/// (SIGKILL); they are removed, so that the process stops running their probes.
fn remove_stale_links(s: &Session, pid: i32) {
    if s.name() != format!("tool-pid-{pid}") {
        return;
    }
    let me = std::process::id();
    let Ok(members) = s.live_members() else { return };
    if members.iter().any(|&m| m != me && m != pid as u32) {
        return; // another tool is tracing the process
    }
    let Ok(links) = s.links() else { return };
    if links.is_empty() {
        return;
    }
    for l in &links {
        let _ = s.remove_link(l.id);
    }
    eprintln!(
        "userbpf: removed {} probe{} left in process {pid} by a tool that did not end cleanly",
        links.len(),
        if links.len() == 1 { "" } else { "s" }
    );
    if let Ok(generation) = publish_links_gen(s) {
        wait_acked(s, pid, generation, Duration::from_secs(5));
    }
}

/// Publishes a new links generation (the handshake: `userbpf_runtime::session::handshake`).
fn publish_links_gen(s: &Session) -> Result<u32> {
    handshake::advance(s).context("publishing the links' generation")
}

/// Waits until the agent of process `pid` acknowledged generation `gen`, at most `limit`.
fn wait_acked(s: &Session, pid: i32, generation: u32, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if handshake::acked_by(s.layout(), pid as u32).is_some_and(|a| a >= generation) {
            return true;
        }
        if Instant::now() >= deadline || !Path::new(&format!("/proc/{pid}")).exists() {
            return false;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// The traced command or process while the tool runs.
pub struct Running {
    child: Option<Child>,
    pid: Option<i32>,
    started: Instant,
    name: String,
}

impl Running {
    /// Runs until the command exits, the process is gone, `-d` elapses or Ctrl-C; calls
    /// `poll(d)` to wait (at most `d`: a tool with events reads them there, others sleep;
    /// `true` ends the run) and `tick()` at each interval (`-i`).
    pub fn run(
        &mut self,
        common: &Common,
        mut poll: impl FnMut(Duration) -> Result<bool>,
        mut tick: impl FnMut() -> Result<()>,
    ) -> Result<End> {
        let interval = common.interval.map(secs).transpose()?;
        let duration = common.duration.map(secs).transpose()?;
        let mut next_tick = interval.map(|i| self.started + i);
        loop {
            if INTERRUPTED.load(Ordering::Relaxed) {
                return Ok(End::Interrupted);
            }
            if let Some(child) = &mut self.child
                && let Some(status) = child.try_wait().with_context(|| format!("waiting for {}", self.name))?
            {
                self.child = None;
                return Ok(End::Exited(status));
            }
            if let Some(pid) = self.pid {
                // SAFETY: kill with signal 0 only checks that the process exists.
                if unsafe { libc::kill(pid, 0) } != 0
                    && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
                {
                    return Ok(End::Gone);
                }
            }
            let now = Instant::now();
            if duration.is_some_and(|d| now >= self.started + d) {
                return Ok(End::Duration);
            }
            if let Some(t) = next_tick
                && now >= t
            {
                tick()?;
                next_tick = interval.map(|i| t + i);
            }
            let mut wait = Duration::from_millis(50);
            if let Some(t) = next_tick {
                wait = wait.min(t.saturating_duration_since(Instant::now()));
            }
            if let Some(d) = duration {
                wait = wait.min((self.started + d).saturating_duration_since(Instant::now()));
            }
            if poll(wait)? {
                return Ok(End::Done);
            }
        }
    }

    /// [`Running::run`] for a tool with nothing to poll: at each interval, a blank line and the
    /// time of day (with `-T`, as BCC's tools print it), then `print(now, last)` of a fresh reading against the previous one, which `last`
    /// then holds (the counts a tool shows per interval are what changed since the last).
    pub fn run_intervals<S>(
        &mut self,
        common: &Common,
        last: &mut S,
        mut read: impl FnMut() -> Result<S>,
        mut print: impl FnMut(&S, &S),
    ) -> Result<End> {
        self.run(
            common,
            |d| {
                std::thread::sleep(d);
                Ok(false)
            },
            || {
                let now = read()?;
                if common.timestamp {
                    println!("\n{}", time_of_day());
                }
                print(&now, last);
                *last = now;
                Ok(())
            },
        )
    }

    /// Stops a command still running (SIGTERM, then SIGKILL after 5 s) and returns its status.
    pub fn stop(&mut self) -> Option<ExitStatus> {
        let mut child = self.child.take()?;
        // SAFETY: kill has no memory arguments; the child is not reaped yet, so its pid is its own.
        unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            if let Ok(Some(s)) = child.try_wait() {
                return Some(s);
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                return child.wait().ok();
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

fn secs(v: f64) -> Result<Duration> {
    if !(v > 0.0 && v.is_finite()) {
        bail!("{v}: expected a positive number of seconds");
    }
    Ok(Duration::from_secs_f64(v))
}

/// `HH:MM:SS` of the local time, as BCC's tools print `-T`.
pub fn time_of_day() -> String {
    // SAFETY: time and localtime_r write only into the given, valid structs.
    unsafe {
        let t = libc::time(std::ptr::null_mut());
        let mut tm: libc::tm = std::mem::zeroed();
        libc::localtime_r(&t, &mut tm);
        format!("{:02}:{:02}:{:02}", tm.tm_hour, tm.tm_min, tm.tm_sec)
    }
}

/// What ends a tool: warnings for probes that could not be placed, the command stopped if
/// still running, and the exit status to pass on (the command's, as `userbpf run` does).
pub fn conclude(tracer: &mut Tracer, running: &mut Running, end: End) -> Option<i32> {
    let status = match end {
        End::Exited(s) => Some(s),
        _ => running.stop(),
    };
    for e in tracer.attach_errors() {
        eprintln!("userbpf: could not probe {e}");
    }
    tracer.finish();
    for (prog, n) in tracer.kernel_recursion_misses() {
        eprintln!(
            "userbpf: the kernel skipped {n} run{} of {prog}: another eBPF program was running on that CPU \
             (the kernel does not nest them); its counts may be short by as many",
            if n == 1 { "" } else { "s" }
        );
    }
    match status {
        Some(s) if !s.success() && matches!(end, End::Exited(_)) => Some(crate::run::exit_code(&running.name, s)),
        _ => None,
    }
}
