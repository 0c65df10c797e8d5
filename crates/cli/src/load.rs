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

/// Environment variable naming the server library (default: beside the `userbpf` binary).
pub const SERVER_ENV: &str = "USERBPF_SYSCALL_SERVER";

#[derive(Args)]
#[command(after_help = "The loader's bpf(), perf_event_open, ioctl and mmap calls are served in the session; \
programs for other processes run in those started with `userbpf start` in the same session. \
bpftrace itself insists on euid 0; libbpf tools run as any user. \
USERBPF_TRACE_BPF=1 prints every served bpf() call and its result; \
USERBPF_SYSCALL_SERVER names the server library (default: beside this binary).")]
pub struct LoadArgs {
    /// Run the loaded programs in the interpreter instead of the JIT.
    #[arg(long)]
    interpreter: bool,
    /// Which side runs system call tracepoints: the processes started with `userbpf start`
    /// (their own calls) or the kernel (every process's calls, as without userbpf).
    #[arg(long, value_enum, default_value = "process")]
    syscalls: crate::kernel_side::SyscallSide,
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
    if args.syscalls == crate::kernel_side::SyscallSide::Kernel {
        cmd.env("USERBPF_SYSCALLS", "kernel");
    }
    Ok(cmd)
}

/// `userbpf load`: execs the loader in place of this process.
pub fn load(session: &str, args: LoadArgs) -> Result<()> {
    // Check the session name now, with a clear error, rather than in the loader.
    drop(userbpf_runtime::Session::open(session).with_context(|| format!("session {session:?}"))?);
    let err = loader_command(session, &args)?.exec();
    bail!("cannot run {}: {err}", args.command[0])
}
