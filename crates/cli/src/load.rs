//! `userbpf load [--interpreter] CMD ARGS...`: runs an unmodified eBPF loader (bpftrace, a
//! libbpf tool) with the syscall server preloaded, so its `bpf()`, `perf_event_open`, ioctls
//! and mmaps are served by the userspace runtime in the session. The loader replaces this
//! process (same pid: the server serves the process whose pid is `USERBPF_LOADER_PID`).

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::Command;

use anyhow::{Context, Result, bail};
use clap::Args;

/// The agent's switch to the interpreter (`userbpf_agent::INTERPRETER_ENV`).
const INTERPRETER_ENV: &str = "USERBPF_INTERPRETER";

/// `userbpf load --running` (`userbpf_syscall_server::attach::targets::RUNNING_ENV`).
const RUNNING_ENV: &str = "USERBPF_LOAD_RUNNING";
/// `userbpf load --pid` (`userbpf_syscall_server::attach::targets::PIDS_ENV`).
const PIDS_ENV: &str = "USERBPF_LOAD_PIDS";
/// The binary the loader runs to attach and detach processes
/// (`userbpf_syscall_server::attach::targets::BIN_ENV`).
const BIN_ENV: &str = "USERBPF_BIN";

/// Environment variable naming the server library (default: beside the `userbpf` binary).
pub const SERVER_ENV: &str = "USERBPF_SYSCALL_SERVER";

#[derive(Args)]
#[command(after_help = "The loader's bpf(), perf_event_open, ioctl and mmap calls are served in the session; \
programs for other processes run in those started with `userbpf start` in the same session, \
and in a running process a loader names (`bpftrace -p PID`: the agent is injected, and taken out again when \
the loader's last link for it goes). \
bpftrace itself insists on euid 0; libbpf tools run as any user. \
USERBPF_TRACE_BPF=1 prints every served bpf() call and its result; \
USERBPF_SYSCALL_SERVER names the server library (default: beside this binary).")]
pub struct LoadArgs {
    /// Run the programs unverified (for experiments; as USERBPF_VERIFY=0): a faulty program
    /// can then crash the process it runs in. A warning is printed for every program.
    #[arg(long)]
    pub no_verify: bool,
    /// Run the loaded programs in the interpreter instead of the JIT.
    #[arg(long)]
    interpreter: bool,
    /// Links for every process (`pid = -1`) also go into the running processes of this user
    /// that map the probed file, the agent injected as `userbpf attach` does (the kernel's
    /// meaning of -1); they are detached again when the link goes.
    #[arg(long)]
    running: bool,
    /// Links for every process (`pid = -1`) on a file this running process maps also go into
    /// it, the agent injected as `userbpf attach` does, and taken out when the loader's last
    /// link goes (repeatable). bpftrace's own `-p PID` counts as this option: bpftrace 0.17
    /// opens its uprobes with pid -1.
    #[arg(long = "pid", value_name = "PID")]
    pids: Vec<u32>,
    /// Which side runs system call tracepoints: the processes started with `userbpf start`
    /// (their own calls) or the kernel (every process's calls, as without userbpf).
    #[arg(long, value_enum, default_value = "process")]
    syscalls: crate::kernel_side::SyscallSide,
    /// Force a side for the programs whose name (as the loader gives it: libbpf cuts function
    /// names to 15 characters) matches PROG, a glob: `PROG=kernel` loads a tracepoint or raw
    /// tracepoint program into the kernel (a system call tracepoint then counts every
    /// process's calls), `PROG=process` keeps it in the processes (refused for kinds only the
    /// kernel runs). Repeatable; the last match wins.
    #[arg(long = "side", value_name = "PROG=kernel|process")]
    sides: Vec<String>,
    /// Leave out the programs whose name matches the glob (also `USERBPF_NOT_LOAD_PATTERN`):
    /// the loader gets an empty program (`r0 = 0; exit`) that attaches and does nothing.
    /// Repeatable.
    #[arg(long = "not-load", value_name = "GLOB")]
    not_load: Vec<String>,
    /// The loader to run, and its arguments.
    #[arg(trailing_var_arg = true, required = true)]
    command: Vec<String>,
}

/// The syscall server library: `$USERBPF_SYSCALL_SERVER`, or beside the `userbpf` binary.
pub fn server_path() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os(SERVER_ENV) {
        return Ok(PathBuf::from(p));
    }
    let exe = std::env::current_exe().context("locating the userbpf binary")?;
    let dir = exe.parent().context("the userbpf binary has no directory")?;
    for cand in [dir.join("libuserbpf_syscall_server.so"), dir.join("../libuserbpf_syscall_server.so")] {
        if cand.exists() {
            return Ok(cand);
        }
    }
    bail!("libuserbpf_syscall_server.so not found beside {} (build the workspace, or set {SERVER_ENV})", exe.display())
}

/// The environment and command for `args` in `session` (exec'd by [`load`]).
pub fn loader_command(session: &str, args: &LoadArgs) -> Result<Command> {
    let server = server_path()?;
    let server = std::fs::canonicalize(&server).unwrap_or(server);
    let mut preload = server.display().to_string();
    if let Some(old) = std::env::var_os("LD_PRELOAD").filter(|v| !v.is_empty()) {
        preload = format!("{preload}:{}", old.to_string_lossy());
    }
    let mut cmd = Command::new(&args.command[0]);
    cmd.args(&args.command[1..])
        .env("LD_PRELOAD", preload)
        .env(userbpf_runtime::session::SESSION_ENV, session)
        .env("USERBPF_LOADER_PID", std::process::id().to_string());
    if args.interpreter {
        cmd.env(INTERPRETER_ENV, "1");
    }
    if args.running {
        cmd.env(RUNNING_ENV, "1");
    }
    let mut pids = args.pids.clone();
    pids.extend(bpftrace_pid(&args.command));
    if !pids.is_empty() {
        for p in &pids {
            if !std::path::Path::new(&format!("/proc/{p}")).exists() {
                bail!("process {p} does not exist");
            }
        }
        let list: Vec<String> = pids.iter().map(|p| p.to_string()).collect();
        cmd.env(PIDS_ENV, list.join(","));
    }
    // The loader injects the agent into processes its links name (`bpftrace -p PID`), and
    // detaches them, by running this binary.
    if let Ok(exe) = std::env::current_exe() {
        cmd.env(BIN_ENV, exe);
    }
    for s in &args.sides {
        match s.rsplit_once('=') {
            Some((p, "kernel" | "process")) if !p.is_empty() && !p.contains(',') => {}
            _ => bail!("--side {s}: expected PROG=kernel or PROG=process (PROG a glob without commas)"),
        }
    }
    if !args.sides.is_empty() {
        cmd.env("USERBPF_SIDES", args.sides.join(","));
    }
    let mut not_load = args.not_load.clone();
    if let Some(p) = std::env::var("USERBPF_NOT_LOAD_PATTERN").ok().filter(|p| !p.is_empty()) {
        not_load.push(p);
    }
    if not_load.iter().any(|p| p.contains(',')) {
        bail!("--not-load: a pattern cannot hold a comma");
    }
    if !not_load.is_empty() {
        cmd.env("USERBPF_NOT_LOAD_PATTERN", not_load.join(","));
    }
    if args.syscalls == crate::kernel_side::SyscallSide::Kernel {
        cmd.env("USERBPF_SYSCALLS", "kernel");
    }
    Ok(cmd)
}

/// The process bpftrace's `-p PID` (or `-pPID`) names, when the loader is bpftrace: it opens
/// its uprobes with pid -1 (as the kernel sees them too), so the server learns the process
/// from here.
fn bpftrace_pid(command: &[String]) -> Option<u32> {
    let name = std::path::Path::new(command.first()?).file_name()?.to_string_lossy().into_owned();
    if !name.starts_with("bpftrace") {
        return None;
    }
    let mut it = command[1..].iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--" => return None,
            "-p" => return it.next()?.parse().ok(),
            // Options taking a value: the value is not an option.
            "-e" | "-c" | "-o" | "-I" | "--include" | "-B" | "-f" => {
                it.next();
            }
            _ => {
                if let Some(p) = a.strip_prefix("-p").and_then(|v| v.parse().ok()) {
                    return Some(p);
                }
            }
        }
    }
    None
}

/// `userbpf load`: execs the loader in place of this process.
pub fn load(session: &str, args: LoadArgs) -> Result<()> {
    // Check the session name now, with a clear error, rather than in the loader.
    drop(userbpf_runtime::Session::open(session).with_context(|| format!("session {session:?}"))?);
    let err = loader_command(session, &args)?.exec();
    bail!("cannot run {}: {err}", args.command[0])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn bpftraces_pid_option_is_found() {
        assert_eq!(bpftrace_pid(&v(&["bpftrace", "-p", "42", "-e", "uprobe:x:y {}"])), Some(42));
        assert_eq!(bpftrace_pid(&v(&["/usr/bin/bpftrace", "-e", "uprobe:x:y {}", "-p42"])), Some(42));
        assert_eq!(bpftrace_pid(&v(&["bpftrace", "-e", "-p", "x.bt"])), None);
        assert_eq!(bpftrace_pid(&v(&["bpftrace", "-c", "./t -p 5", "-e", "x"])), None);
        assert_eq!(bpftrace_pid(&v(&["./tool", "-p", "42"])), None);
    }
}
