//! `userbpf run OBJ -- CMD ARGS...`: starts CMD with the object's programs attached where
//! their sections point, streams trace_printk lines and ring buffer events while it runs, and
//! prints the maps when it exits.
//!
//! Each program runs where it belongs (`crate::kernel_side`): uprobes, USDT probes and system
//! call tracepoints in the command's processes, the kernel's kinds (other tracepoints, raw
//! and BTF tracepoints, kprobes, fentry, perf events) loaded and attached in the kernel by
//! libbpf before the command starts, arrays used by both sides shared (the kernel's values
//! mapped into the processes), maps only kernel programs use read back at the end.
//!
//! A program that cannot be attached is an error, as a failed attach is for a libbpf tool:
//! the kernel's refusal (its verifier's log, its attach error), a kind `run` does not attach
//! in a process (an unknown section, a kernel kind forced there with `--side`) or a target
//! file that is missing or lacks the function or probe refuses to start
//! CMD; a failure the agent inside CMD reports (see `userbpf_runtime::loader::report_attach`)
//! stops CMD with SIGTERM; a target without a path that the command's executable lacks and
//! no process of the command attached fails at exit. `run` then exits 1 naming the program,
//! its target and the reason. `--allow-partial` turns all of these into warnings (for
//! tools that probe optional functions). Programs naming no target are loaded, not
//! attached (libbpf's auto-attach skips them), and `?` sections are not loaded at all.

use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Args;
use userbpf_object::{Object, ProgramKind};
use userbpf_runtime::context::CpuSlots;
use userbpf_runtime::loader::LoadOptions;
use userbpf_runtime::{Engine, LinkRecord, Session, load_object};

use crate::dump::{Typed, dump_text, hist_lines, is_log2_hist};
use crate::kernel_side::{Selection, SyscallSide};

#[derive(Args)]
pub struct RunArgs {
    /// The object (clang -target bpf -g -O2).
    object: PathBuf,
    /// Run the programs unverified (for experiments; as USERBPF_VERIFY=0): a faulty program
    /// can then crash the process it runs in. A warning is printed for every program.
    #[arg(long)]
    pub no_verify: bool,
    /// Run the programs in the interpreter instead of the JIT.
    #[arg(long)]
    interpreter: bool,
    /// Attach PROG at TARGET, for sections without a target: `[PATH:]FUNC[+OFFSET]` for
    /// uprobes, `[PATH:]PROVIDER:NAME` for USDT probes (no PATH: the command's executable),
    /// `CATEGORY/NAME` for tracepoints, `NAME` for raw tracepoints.
    #[arg(long = "attach", value_name = "PROG=TARGET")]
    attach: Vec<String>,
    /// Carry on when a program cannot be attached (a target that is not there, a kind `run`
    /// does not attach): warn and run the command with the programs that could be. Without
    /// it such a program is an error: `run` refuses to start the command, or stops it and
    /// exits non-zero when the agent in the command reports a failure.
    #[arg(long)]
    allow_partial: bool,
    /// Which side runs system call tracepoints: the traced processes (their own calls,
    /// through Syscall User Dispatch) or the kernel (every process's calls).
    #[arg(long, value_enum, default_value = "process")]
    syscalls: SyscallSide,
    /// Run PROG on one side whatever its kind: `PROG=kernel` or `PROG=process` (PROG may be a
    /// glob; the last match wins).
    #[arg(long = "side", value_name = "PROG=SIDE")]
    sides: Vec<String>,
    /// Leave programs whose name matches the glob unloaded (also `USERBPF_NOT_LOAD_PATTERN`,
    /// as bpftime's `BPFTIME_NOT_LOAD_PATTERN`).
    #[arg(long = "not-load", value_name = "PATTERN")]
    not_load: Vec<String>,
    /// The command to start, and its arguments.
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

/// The agent library: beside the `userbpf` binary, or `$USERBPF_AGENT`.
pub fn agent_path() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("USERBPF_AGENT") {
        return Ok(PathBuf::from(p));
    }
    let exe = std::env::current_exe().context("locating the userbpf binary")?;
    let dir = exe.parent().context("the userbpf binary has no directory")?;
    for cand in [dir.join("libuserbpf_agent.so"), dir.join("../libuserbpf_agent.so")] {
        if cand.exists() {
            return Ok(cand);
        }
    }
    bail!("libuserbpf_agent.so not found beside {} (build the workspace, or set USERBPF_AGENT)", exe.display())
}

fn split_target(target: &str) -> (String, Option<String>, u64) {
    let (path, func) = match target.rsplit_once(':') {
        Some((p, f)) => (p.to_string(), f),
        None => (String::new(), target),
    };
    let (func, off) = match func.split_once('+') {
        Some((f, o)) => {
            (f, o.strip_prefix("0x").map_or_else(|| o.parse().ok(), |h| u64::from_str_radix(h, 16).ok()).unwrap_or(0))
        }
        None => (func, 0),
    };
    (path, Some(func.to_string()), off)
}

/// CMD set up to run with the agent preloaded, in `session`.
pub(crate) fn target_command(command: &[String], session: &str, interpreter: bool) -> Result<Command> {
    let agent = agent_path()?;
    let mut preload = agent.display().to_string();
    if let Some(old) = std::env::var_os("LD_PRELOAD") {
        preload = format!("{preload}:{}", old.to_string_lossy());
    }
    let mut cmd = Command::new(&command[0]);
    cmd.args(&command[1..]).env("LD_PRELOAD", preload).env("USERBPF_SESSION", session);
    if interpreter {
        cmd.env(INTERPRETER_ENV, "1");
    }
    if let Some(d) = std::env::var_os(userbpf_runtime::session::SHM_DIR_ENV) {
        cmd.env(userbpf_runtime::session::SHM_DIR_ENV, d);
    }
    Ok(cmd)
}

#[derive(Args)]
pub struct StartArgs {
    /// Run the programs unverified (for experiments; as USERBPF_VERIFY=0): a faulty program
    /// can then crash the process it runs in. A warning is printed for every program.
    #[arg(long)]
    pub no_verify: bool,
    /// Run the session's programs in the interpreter instead of the JIT.
    #[arg(long)]
    interpreter: bool,
    /// The command to start, and its arguments.
    #[arg(trailing_var_arg = true, required = true)]
    command: Vec<String>,
}

/// `userbpf start CMD ARGS...`: starts CMD in an existing session (`--session`); the programs
/// and links come from whoever loads them (another `userbpf` command, a loader), before or
/// after CMD starts. Exits with CMD's status.
pub fn start(session: &str, args: StartArgs) -> Result<()> {
    // Held while CMD runs, so that a crash report its agent leaves is still there to read.
    let held = Session::open(session).ok();
    if let Some(s) = &held {
        serve_broker(s);
    }
    let mut child = target_command(&args.command, session, args.interpreter)?
        .spawn()
        .with_context(|| format!("starting {}", args.command[0]))?;
    let status = child.wait().with_context(|| format!("waiting for {}", args.command[0]))?;
    let code = exit_code(&args.command[0], status);
    if let Some(s) = &held {
        report_crash(s, child.id(), status);
    }
    drop(held);
    std::process::exit(code);
}

/// Serves the session's members that drop privileges (see `userbpf_runtime::session::broker`)
/// while this command lives; without it they go on with the links they have.
pub(crate) fn serve_broker(s: &Session) {
    let spawn =
        |f: Box<dyn FnOnce() + Send>| std::thread::Builder::new().name("userbpf-broker".into()).spawn(f).map(drop);
    if let Err(e) = userbpf_runtime::session::broker::serve(s.dir(), spawn) {
        eprintln!("userbpf: warning: serving processes of session {} that drop privileges: {e}", s.name());
    }
}

/// After a target died of a signal: what its agent left about the fault (the thread, and the
/// program running or last run on it), said on stderr.
pub fn report_crash(session: &Session, pid: u32, status: std::process::ExitStatus) {
    use std::os::unix::process::ExitStatusExt;
    if status.signal().is_none() {
        return;
    }
    let Some(c) = userbpf_runtime::crash::take(session.layout(), pid) else { return };
    let name = session
        .progs()
        .ok()
        .and_then(|ps| ps.into_iter().find(|p| p.id == c.prog))
        .map(|p| format!("`{}` (id {})", p.name, p.id));
    let at = format!("{} at {:#x} on thread {}", signal_name(c.sig), c.addr, c.tid);
    match (name, c.running) {
        (Some(n), true) => eprintln!("userbpf: the fault ({at}) came while program {n} was running there"),
        (Some(n), false) => {
            eprintln!("userbpf: the fault ({at}) came outside eBPF code; the last program that ran on that thread: {n}")
        }
        (None, _) if c.prog != 0 => {
            eprintln!("userbpf: the fault ({at}) came after program id {} ran on that thread", c.prog)
        }
        (None, _) => eprintln!("userbpf: the fault ({at}) came on a thread where no eBPF program had run"),
    }
}

/// The status to exit with for a command that ended with `status`, as a shell gives it: its
/// exit code, or 128 + the signal that killed it. A death by signal is said on stderr (which
/// signal, and whether it dumped core), so that a crashed target is never silent.
pub fn exit_code(cmd: &str, status: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    if let Some(code) = status.code() {
        return code;
    }
    let Some(sig) = status.signal() else { return 1 };
    let core = if status.core_dumped() { ", core dumped" } else { "" };
    eprintln!("userbpf: {cmd} was killed by signal {} ({sig}: {}){core}", signal_name(sig), signal_description(sig));
    128 + sig
}

/// The name of signal `sig` (`SIGSEGV`), or `SIGRTMIN+N`, or the number.
fn signal_name(sig: i32) -> String {
    const NAMES: [&str; 32] = [
        "",
        "SIGHUP",
        "SIGINT",
        "SIGQUIT",
        "SIGILL",
        "SIGTRAP",
        "SIGABRT",
        "SIGBUS",
        "SIGFPE",
        "SIGKILL",
        "SIGUSR1",
        "SIGSEGV",
        "SIGUSR2",
        "SIGPIPE",
        "SIGALRM",
        "SIGTERM",
        "SIGSTKFLT",
        "SIGCHLD",
        "SIGCONT",
        "SIGSTOP",
        "SIGTSTP",
        "SIGTTIN",
        "SIGTTOU",
        "SIGURG",
        "SIGXCPU",
        "SIGXFSZ",
        "SIGVTALRM",
        "SIGPROF",
        "SIGWINCH",
        "SIGIO",
        "SIGPWR",
        "SIGSYS",
    ];
    match usize::try_from(sig) {
        Ok(i) if (1..NAMES.len()).contains(&i) => NAMES[i].to_string(),
        _ if sig >= libc::SIGRTMIN() && sig <= libc::SIGRTMAX() => format!("SIGRTMIN+{}", sig - libc::SIGRTMIN()),
        _ => format!("signal {sig}"),
    }
}

/// libc's description of signal `sig` (`Segmentation fault`).
fn signal_description(sig: i32) -> String {
    // SAFETY: strsignal returns a pointer to a NUL-terminated string (static, or in a
    // thread-local buffer for unknown signals) that stays valid until the next call on this
    // thread; it is copied at once.
    let p = unsafe { libc::strsignal(sig) };
    if p.is_null() {
        return format!("signal {sig}");
    }
    // SAFETY: as above: a valid NUL-terminated string.
    unsafe { std::ffi::CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// Whether the agent can attach this tracepoint (`CATEGORY/NAME`) or raw tracepoint: the
/// system call ones, at libc's wrappers.
fn is_syscall_tracepoint(kind: &str, tp: &str) -> bool {
    if kind == "raw_tracepoint" {
        return tp == "sys_enter" || tp == "sys_exit";
    }
    match tp.split_once('/') {
        Some(("raw_syscalls", n)) => n == "sys_enter" || n == "sys_exit",
        Some(("syscalls", n)) => {
            n.strip_prefix("sys_enter_").or_else(|| n.strip_prefix("sys_exit_")).is_some_and(|c| !c.is_empty())
        }
        _ => false,
    }
}

/// `[PATH:]PROVIDER:NAME` of a USDT probe: the path (empty: the executable) and
/// `PROVIDER:NAME`.
fn split_usdt(target: &str) -> Option<(String, String)> {
    let mut parts = target.rsplitn(3, ':');
    let name = parts.next().filter(|s| !s.is_empty())?;
    let provider = parts.next().filter(|s| !s.is_empty())?;
    let path = parts.next().unwrap_or("");
    Some((path.to_string(), format!("{provider}:{name}")))
}

/// A path naming an existing file, made absolute, so the agent finds it whatever the target's
/// working directory and however the library was named when loaded; other strings (library
/// names like `libc.so.6`, empty for the executable) as they are.
pub(crate) fn absolute_if_file(path: &str) -> String {
    if path.contains('/')
        && let Ok(p) = std::fs::canonicalize(path)
    {
        return p.display().to_string();
    }
    path.to_string()
}

/// The command's executable (found in `PATH` as exec finds it), when it is an ELF file.
pub(crate) fn command_executable(cmd: &str) -> Option<PathBuf> {
    use std::io::Read;
    let cands: Vec<PathBuf> = if cmd.contains('/') {
        vec![PathBuf::from(cmd)]
    } else {
        std::env::split_paths(&std::env::var_os("PATH")?).map(|d| d.join(cmd)).collect()
    };
    for c in cands {
        let Ok(mut f) = std::fs::File::open(&c) else { continue };
        let mut magic = [0u8; 4];
        if f.read_exact(&mut magic).is_ok() && magic == *b"\x7fELF" {
            return std::fs::canonicalize(&c).ok();
        }
        if c.is_file() {
            return None;
        }
    }
    None
}

/// A link `run` made, for messages: the program and where it attaches.
struct MadeLink {
    id: u32,
    prog: String,
    target: String,
    /// Why the link may attach nowhere (its target is not in the command's executable): an
    /// error at exit if no process of the command attached it.
    doubt: Option<String>,
}

/// A link target written as `run` takes it: `[PATH:]FUNC[+OFF]`, `PATH:0xADDR`,
/// `[PATH:]PROVIDER:NAME`, `CATEGORY/NAME`.
fn describe_target(kind: &str, path: &str, func: Option<&str>, offset: u64) -> String {
    let f = match func {
        Some(f) if offset != 0 => format!("{f}+{offset:#x}"),
        Some(f) => f.to_string(),
        None => format!("{offset:#x}"),
    };
    let t = if path.is_empty() { f } else { format!("{path}:{f}") };
    format!("{kind} {t}")
}

pub fn run(args: RunArgs) -> Result<()> {
    let mut object = Object::open(&args.object)?;
    let mut not_load = args.not_load.clone();
    if let Ok(p) = std::env::var("USERBPF_NOT_LOAD_PATTERN")
        && !p.is_empty()
    {
        not_load.push(p);
    }
    let plan =
        crate::kernel_side::plan(&mut object, &Selection { syscalls: args.syscalls, sides: &args.sides, not_load })?;
    for a in &args.attach {
        if let Some((p, _)) = a.split_once('=')
            && plan.kernel.iter().any(|k| k == p)
        {
            bail!("--attach {a}: program `{p}` runs in the kernel, where it attaches at its section's target");
        }
    }
    let session_name = format!("run-{}", std::process::id());
    let session = Session::open(&session_name)?;
    serve_broker(&session);
    let slots = Arc::new(CpuSlots::open(&session.layout().cpus())?);
    let engine = if args.interpreter { Engine::Interpreter } else { Engine::Jit };
    let opts = LoadOptions { engine, helpers: userbpf_runtime::helpers::registry(), only: Some(&plan.process) };
    let loaded = load_object(&session, object, &opts, slots)?;
    // The kernel half: loaded by libbpf, its shared arrays mapped over the session's.
    let mut kernel = crate::kernel_side::load_kernel(&args.object, &plan, &session, &loaded)?;
    // This session is the run's own: nobody could reuse what it pinned (LIBBPF_PIN_BY_NAME),
    // and a pin would keep it after everyone left. Unpinned however `run` ends.
    let unpin = Unpin(&session, &loaded);
    // A link without a path attaches in the processes whose executable has its function or
    // probe (the agent is loaded by every process of the command tree: `sh -c`, wrappers); say
    // so when the command's own executable does not.
    let exe = args.command.first().and_then(|c| command_executable(c));
    let doubt_of = |prog: &str, what: &str, has: Result<bool, String>| -> Option<String> {
        match (&exe, has) {
            (Some(exe), Ok(false)) => {
                eprintln!(
                    "userbpf: {what} is not in {}: program `{prog}` attaches only in processes it starts whose executable has it",
                    exe.display()
                );
                Some(format!("{what} is not in {}, and no process of the command had it", exe.display()))
            }
            _ => None,
        }
    };
    for a in &args.attach {
        match a.split_once('=') {
            Some((p, t)) if !p.is_empty() && !t.is_empty() => {
                if !loaded.programs.iter().any(|(r, _)| r.name == p) {
                    let names: Vec<&str> = loaded.programs.iter().map(|(r, _)| r.name.as_str()).collect();
                    bail!(
                        "--attach {a}: {} has no loaded program `{p}` (it has: {})",
                        args.object.display(),
                        names.join(", ")
                    );
                }
            }
            _ => bail!("--attach {a}: expected PROG=TARGET"),
        }
    }
    // Programs that cannot be attached, found before the command starts.
    let mut unattached: Vec<String> = Vec::new();
    let mut made: Vec<MadeLink> = Vec::new();

    // Links, from the section names or --attach.
    for (rec, _) in &loaded.programs {
        let spec = loaded.object.program(&rec.name).context("program vanished")?;
        let given = args
            .attach
            .iter()
            .find_map(|a| a.split_once('=').filter(|(p, _)| *p == rec.name).map(|(_, t)| t.to_string()));
        if let ProgramKind::Usdt { target } = &spec.kind {
            let (path, probe) = match (given, target) {
                (Some(t), _) => split_usdt(&t)
                    .with_context(|| format!("--attach {}={t}: expected [PATH:]PROVIDER:NAME", rec.name))?,
                (None, Some(t)) => (t.path.clone(), format!("{}:{}", t.provider, t.name)),
                (None, None) => bail!(
                    "program `{}` (section {}) has no target: give one with --attach {}=PROVIDER:NAME",
                    rec.name,
                    spec.section,
                    rec.name
                ),
            };
            let described = describe_target("usdt", &path, Some(&probe), 0);
            let mut doubt = None;
            if path.is_empty() {
                if let Some(exe) = &exe {
                    let has = userbpf_elf::usdt::read_notes(exe)
                        .map(|n| n.iter().any(|n| format!("{}:{}", n.provider, n.name) == probe));
                    doubt = doubt_of(&rec.name, &format!("USDT probe `{probe}`"), has);
                }
            } else if let Err(why) = check_file_target(
                &path,
                |p| {
                    userbpf_elf::usdt::read_notes(p)
                        .map(|n| n.iter().any(|n| format!("{}:{}", n.provider, n.name) == probe))
                },
                &format!("USDT probe `{probe}`"),
            ) {
                unattached.push(format!("program `{}` ({described}): {why}", rec.name));
                continue;
            }
            let path = absolute_if_file(&path);
            let l = session.add_link(LinkRecord {
                id: 0,
                prog_id: rec.id,
                kind: "usdt".into(),
                path,
                func: Some(probe),
                offset: 0,
                cookie: 0,
                pid: None,
            })?;
            made.push(MadeLink { id: l.id, prog: rec.name.clone(), target: described, doubt });
            continue;
        }
        let tracepoint = match &spec.kind {
            ProgramKind::Tracepoint { category, name } => {
                Some(("tracepoint", if category.is_empty() { String::new() } else { format!("{category}/{name}") }))
            }
            ProgramKind::RawTracepoint { name } => Some(("raw_tracepoint", name.clone())),
            _ => None,
        };
        if let Some((kind, tp)) = tracepoint {
            let tp = match given {
                Some(t) => t,
                None if tp.is_empty() => bail!(
                    "program `{}` (section {}) has no target: give one with --attach {}=CATEGORY/NAME",
                    rec.name,
                    spec.section,
                    rec.name
                ),
                None => tp,
            };
            if !is_syscall_tracepoint(kind, &tp) {
                unattached.push(format!(
                    "program `{}` ({kind} {tp}) cannot be attached: only system call tracepoints (syscalls/sys_enter_NAME, syscalls/sys_exit_NAME, raw_syscalls/sys_enter, raw_syscalls/sys_exit, raw_tracepoint sys_enter and sys_exit) are attached in a process",
                    rec.name
                ));
                continue;
            }
            let l = session.add_link(LinkRecord {
                id: 0,
                prog_id: rec.id,
                kind: kind.into(),
                path: String::new(),
                func: Some(tp.clone()),
                offset: 0,
                cookie: 0,
                pid: None,
            })?;
            made.push(MadeLink { id: l.id, prog: rec.name.clone(), target: format!("{kind} {tp}"), doubt: None });
            continue;
        }
        let ProgramKind::Uprobe { retprobe, target } = &spec.kind else {
            unattached.push(format!(
                "program `{}` (section {}, {}) cannot be attached: only uprobes, uretprobes, USDT probes and system call tracepoints are attached by `run`",
                rec.name,
                spec.section,
                spec.kind.describe()
            ));
            continue;
        };
        let (path, func, offset) = match (given, target) {
            (Some(t), _) => split_target(&t),
            (None, Some(t)) => (t.path.clone(), t.func.clone(), t.offset),
            (None, None) => {
                // As libbpf's auto-attach: a program without a target is loaded, not attached
                // (not an error). Tail-call targets need no word.
                if !is_tail_target(&loaded.object, &rec.name) {
                    eprintln!(
                        "userbpf: program `{}` (section {}) is not attached: it names no target (give one with --attach {}=FUNC)",
                        rec.name, spec.section, rec.name
                    );
                }
                continue;
            }
        };
        let kind = if *retprobe { "uretprobe" } else { "uprobe" };
        let described = describe_target(kind, &path, func.as_deref(), offset);
        let mut doubt = None;
        if let (true, Some(f), Some(exe)) = (path.is_empty(), &func, &exe) {
            doubt = doubt_of(&rec.name, &format!("function `{f}`"), userbpf_elf::symbols::has_function(exe, f));
        } else if let (false, Some(f)) = (path.is_empty(), &func)
            && let Err(why) =
                check_file_target(&path, |p| userbpf_elf::symbols::has_function(p, f), &format!("function `{f}`"))
        {
            unattached.push(format!("program `{}` ({described}): {why}", rec.name));
            continue;
        }
        let path = absolute_if_file(&path);
        let l = session.add_link(LinkRecord {
            id: 0,
            prog_id: rec.id,
            kind: kind.into(),
            path,
            func,
            offset,
            cookie: 0,
            pid: None,
        })?;
        made.push(MadeLink { id: l.id, prog: rec.name.clone(), target: described, doubt });
    }
    if !unattached.is_empty() {
        if !args.allow_partial {
            bail!(
                "{}: {} (--allow-partial runs the command with the programs that can be attached)",
                args.object.display(),
                unattached.join("; ")
            );
        }
        for u in &unattached {
            eprintln!("userbpf: {u}; carrying on (--allow-partial)");
        }
    }
    if let Some(k) = kernel.as_mut() {
        for note in k.attach().map_err(|e| anyhow::anyhow!("{}: {e}", args.object.display()))? {
            eprintln!("userbpf: {note}");
        }
    }
    if made.is_empty() && kernel.is_none() {
        bail!("{}: no program to attach (give targets with --attach PROG=FUNC)", args.object.display());
    }

    // Stream trace lines while the target runs.
    let done = Arc::new(AtomicBool::new(false));
    let pipe = session.trace_pipe()?;
    let streamer = {
        let done = done.clone();
        std::thread::spawn(move || {
            let userbpf_maps::Map::RingBuf(rb) = &pipe else { return };
            let Ok(mut consumer) = userbpf_maps::ringbuf::RingBufConsumer::new(rb) else { return };
            loop {
                let finished = done.load(Ordering::Acquire);
                let _ = consumer.poll(Duration::from_millis(100), |rec| print!("{}", String::from_utf8_lossy(rec)));
                if finished {
                    break;
                }
            }
        })
    };

    let mut child = target_command(&args.command, &session_name, args.interpreter)?
        .env(userbpf_runtime::loader::ATTACH_REPORTS_ENV, "1")
        .spawn()
        .with_context(|| format!("starting {}", args.command[0]))?;
    // The agents' reports: without --allow-partial, the first failure stops the command.
    let stopped = Arc::new(AtomicBool::new(false));
    let watcher = (!args.allow_partial).then(|| {
        let (done, stopped, dir, pid) = (done.clone(), stopped.clone(), session.dir().to_path_buf(), child.id());
        std::thread::spawn(move || {
            loop {
                let finished = done.load(Ordering::Acquire);
                if userbpf_runtime::loader::attach_reports(&dir).iter().any(|r| r.error.is_some()) {
                    stopped.store(true, Ordering::Release);
                    // SAFETY: kill has no memory arguments; `pid` is our child, not yet reaped
                    // (the main thread reaps it only after joining this thread).
                    unsafe { libc::kill(pid as libc::pid_t, libc::SIGTERM) };
                    return;
                }
                if finished {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    });
    // Wait for the child's end without reaping it (WNOWAIT), so that its pid stays its own
    // while the watcher may still signal it; reap it once the watcher is done.
    loop {
        // SAFETY: `info` is a writable siginfo_t; waitid has no other memory arguments.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let r = unsafe { libc::waitid(libc::P_PID, child.id(), &mut info, libc::WEXITED | libc::WNOWAIT) };
        if r == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            break;
        }
    }
    done.store(true, Ordering::Release);
    let _ = streamer.join();
    if let Some(w) = watcher {
        let _ = w.join();
    }
    let status = child.wait().with_context(|| format!("waiting for {}", args.command[0]))?;

    // The kernel programs stop with the command; the maps only they use are read back.
    if let Some(k) = kernel.as_mut() {
        k.detach();
        crate::kernel_side::read_back(k, &plan, &loaded)?;
    }
    drop(kernel);

    // Maps at exit, as bpftrace prints its own.
    let btf = loaded.object.btf.as_ref();
    for m in &loaded.maps {
        // libbpf's USDT bookkeeping (usdt.bpf.h) is not the program's data.
        if !crate::dump::iterable(&m.map) || m.def.name.starts_with("__bpf_usdt_") {
            continue;
        }
        let t = Typed { btf, key_type: m.def.key_type_id, value_type: m.def.value_type_id };
        println!();
        println!("@{}:", m.def.name);
        let lines = if is_log2_hist(&m.map) { hist_lines(&m.map) } else { dump_text(&m.map, &t) };
        for line in lines {
            println!("{line}");
        }
    }
    // How the links fared: errors the agents reported, and links whose target was in doubt
    // (not in the command's executable) that no process attached.
    let reports = userbpf_runtime::loader::attach_reports(session.dir());
    let mut failures: Vec<String> = Vec::new();
    for l in &made {
        let mine: Vec<_> = reports.iter().filter(|r| r.link == l.id).collect();
        let errors: Vec<String> =
            mine.iter().filter_map(|r| r.error.as_ref().map(|e| format!("{e} (process {})", r.pid))).collect();
        if !errors.is_empty() {
            failures.push(format!("program `{}` could not be attached at {}: {}", l.prog, l.target, errors.join("; ")));
        } else if let (Some(why), false) = (&l.doubt, mine.iter().any(|r| r.error.is_none())) {
            failures.push(format!("program `{}` was not attached at {}: {why}", l.prog, l.target));
        }
    }
    if !failures.is_empty() {
        if args.allow_partial {
            for f in &failures {
                eprintln!("userbpf: {f}; carried on (--allow-partial)");
            }
        } else {
            for f in &failures {
                eprintln!("userbpf: {f}");
            }
            if stopped.load(Ordering::Acquire) {
                eprintln!(
                    "userbpf: stopped {} (SIGTERM): a program could not be attached (--allow-partial carries on)",
                    args.command[0]
                );
            }
            drop(unpin);
            drop(loaded);
            drop(session);
            std::process::exit(1);
        }
    }
    if !status.success() {
        let code = exit_code(&args.command[0], status);
        report_crash(&session, child.id(), status);
        // Leave the session first: `exit` skips destructors.
        drop(unpin);
        drop(loaded);
        drop(session);
        std::process::exit(code);
    }
    Ok(())
}

/// Unpins an object's maps from a session when dropped (see `run`).
struct Unpin<'a>(&'a Session, &'a userbpf_runtime::loader::LoadedObject);

impl Drop for Unpin<'_> {
    fn drop(&mut self) {
        let _ = userbpf_runtime::loader::unpin_maps(self.0, self.1);
    }
}

/// Whether program `name` is in a `.values` slot of a statically initialised prog array.
fn is_tail_target(object: &Object, name: &str) -> bool {
    let Some(idx) = object.programs.iter().position(|p| p.name == name) else { return false };
    object.maps.iter().any(|m| m.init_slots.contains(&Some(userbpf_object::InitSlot::Program(idx))))
}

/// Checks a target naming a file (`PATH:...`, PATH with a `/`) before the command starts, as
/// libbpf's attach does: the file exists and has the function or probe (`has`). Library
/// names without a `/` are found by the target's dynamic loader, so only the agent can tell.
fn check_file_target(
    path: &str,
    has: impl Fn(&std::path::Path) -> Result<bool, String>,
    what: &str,
) -> Result<(), String> {
    if !path.contains('/') {
        return Ok(());
    }
    let p = std::path::Path::new(path);
    if !p.exists() {
        return Err(format!("{path} does not exist"));
    }
    match has(p) {
        Ok(false) => Err(format!("{what} is not in {path}")),
        // Unreadable symbols: the agent says what is wrong, if anything.
        _ => Ok(()),
    }
}

/// The agent's switch to the interpreter (`userbpf_agent::INTERPRETER_ENV`).
const INTERPRETER_ENV: &str = "USERBPF_INTERPRETER";
