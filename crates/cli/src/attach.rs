//! `userbpf attach PID`: the agent put into a process that is already running (through
//! ptrace, by the process's own dlopen: see the userbpf-inject crate), where it joins the
//! session, so that every link of the session, and later ones, apply to it as to a process
//! started with `userbpf start`.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
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
    let arg = format!("{}\n{session}", root.display());
    let done = userbpf_inject::inject(pid, &agent, "userbpf_agent_attach", arg.as_bytes())
        .with_context(|| format!("attaching to process {pid}"))?;
    match done.ret as i32 {
        0 => {}
        1 => bail!("process {pid} already runs the agent (started under userbpf, or attached before)"),
        r => bail!("the agent in process {pid} could not start (status {r}); its stderr may say why"),
    }
    // The agent joins from a thread of its own: wait until it is a member.
    let members = s.layout().members_dir();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !is_member(&members, pid) {
        if Instant::now() > deadline {
            bail!("the agent was loaded into process {pid} but did not join session {session} within 10 s (see the process's stderr)");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
    Ok(format!(
        "attached to process {pid} ({}) in session {session}: thread {} paused {:.2} ms",
        comm.trim(),
        done.tid,
        done.pause.as_secs_f64() * 1e3
    ))
}

fn is_member(members: &Path, pid: i32) -> bool {
    let prefix = format!("{pid}.");
    std::fs::read_dir(members).is_ok_and(|rd| rd.flatten().any(|e| e.file_name().to_string_lossy().starts_with(&prefix)))
}
