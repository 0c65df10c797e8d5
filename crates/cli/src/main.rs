//! `userbpf`: the command line of the userspace eBPF runtime.

mod attach;
mod dump;
mod exec;
mod export;
mod kernel_side;
mod load;
mod map;
mod prog;
mod run;
mod session;
mod tool;
mod tools;
mod tracelog;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "userbpf", version, about = "A userspace eBPF runtime")]
struct Cli {
    /// The session (default: $USERBPF_SESSION, or `default`).
    #[arg(long, global = true)]
    session: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run one program given as hex text on stdin; print r0 in hex.
    ///
    /// This is the plugin protocol of the bpf_conformance suite: MEM, if given, is the
    /// memory as hex bytes; r1 holds its address and r2 its length.
    Exec(exec::ExecArgs),
    /// Assemble bpf_conformance syntax into hex text (what `exec` reads).
    Asm(tools::AsmArgs),
    /// Disassemble hex text (or raw bytes) as llvm-objdump prints BPF.
    Disasm(tools::DisasmArgs),
    /// Start a command with an object's programs attached to it; print the maps at exit.
    Run(run::RunArgs),
    /// Start a command in the session, with the agent that runs the session's programs.
    Start(run::StartArgs),
    /// Put the agent into a running process, as a member of the session (ptrace).
    Attach(attach::AttachArgs),
    /// Take the agent out of a running process: probes removed, original code and signal
    /// handlers back, the agent's thread ended (ptrace).
    Detach(attach::DetachArgs),
    /// Run an unmodified eBPF loader (bpftrace, libbpf tools) on the userspace runtime.
    Load(load::LoadArgs),
    /// Programs: list, run.
    #[command(subcommand)]
    Prog(prog::ProgCmd),
    /// Maps: list, dump.
    #[command(subcommand)]
    Map(map::MapCmd),
    /// Sessions: list.
    #[command(subcommand)]
    Session(session::SessionCmd),
    /// Print the session's bpf_trace_printk lines as they come (as `bpftool prog tracelog`).
    Tracelog(tracelog::TracelogArgs),
    /// Serve the session's maps as Prometheus metrics (`GET /metrics`).
    Export(export::ExportArgs),
    /// Ready tools: funclatency, calls, trace (as BCC's), aiocost; on a command or a running process.
    ///
    /// Each tool uses a session of its own unless `--session` or `USERBPF_SESSION` names one
    /// (then `userbpf export` and `userbpf map dump` read its maps while it runs).
    #[command(subcommand)]
    Tool(tool::ToolCmd),
}

fn main() {
    // A closed stdout (`userbpf map dump | head`) ends the command quietly, as for other Unix
    // tools, instead of a panic in println!.
    // SAFETY: setting a signal's disposition to the default has no preconditions; no other
    // thread exists yet.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    let cli = Cli::parse_from(conformance_order(std::env::args().collect()));
    let no_verify = match &cli.command {
        Command::Run(a) => a.no_verify,
        Command::Start(a) => a.no_verify,
        Command::Load(a) => a.no_verify,
        Command::Prog(prog::ProgCmd::Run(a)) => a.no_verify,
        _ => false,
    };
    if no_verify {
        // What turns verification off, here and in the processes this one starts (targets,
        // loaders): every load then warns.
        // SAFETY: no other thread exists yet, so nothing reads the environment concurrently.
        unsafe { std::env::set_var(userbpf_runtime::verify::VERIFY_ENV, "0") };
        eprintln!(
            "userbpf: warning: --no-verify: programs run unverified; a faulty program can crash the process it runs in"
        );
    }
    // The tools make sessions of their own unless one is named.
    let named_session = cli.session.clone().or_else(|| std::env::var("USERBPF_SESSION").ok().filter(|s| !s.is_empty()));
    let session = cli.session.unwrap_or_else(userbpf_runtime::Session::default_name);
    // Sessions whose processes are all gone (killed without leaving) go first, whatever the
    // command: nothing else would remove them.
    userbpf_runtime::Session::reap();
    let result = match cli.command {
        Command::Exec(args) => exec::run(args),
        Command::Asm(args) => tools::asm(args),
        Command::Disasm(args) => tools::disasm(args),
        Command::Run(args) => run::run(args),
        Command::Start(args) => run::start(&session, args),
        Command::Load(args) => load::load(&session, args),
        Command::Attach(args) => attach::run(&session, args),
        Command::Detach(args) => attach::detach(&session, args),
        Command::Prog(cmd) => prog::run(&session, cmd),
        Command::Map(cmd) => map::run(&session, cmd),
        Command::Session(cmd) => session::run(cmd),
        Command::Tracelog(args) => tracelog::run(&session, args),
        Command::Tool(cmd) => tool::run(named_session, cmd),
        Command::Export(args) => export::run(&session, args),
    };
    if let Err(e) = result {
        eprintln!("userbpf: {e:#}");
        std::process::exit(1);
    }
}

/// The conformance runner puts the memory argument right after the program name
/// (`userbpf MEM exec ...`); move it behind the subcommand.
fn conformance_order(mut args: Vec<String>) -> Vec<String> {
    if args.len() >= 3 && args[2] == "exec" && !args[1].starts_with('-') && args[1] != "exec" {
        let mem = args.remove(1);
        args.push(mem);
    }
    args
}

#[cfg(test)]
mod tests {
    use super::conformance_order;

    #[test]
    fn memory_before_subcommand_moves_behind_it() {
        let v = |s: &[&str]| s.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        assert_eq!(
            conformance_order(v(&["u", "00 01", "exec", "--interpreter"])),
            v(&["u", "exec", "--interpreter", "00 01"])
        );
        assert_eq!(conformance_order(v(&["u", "exec", "00"])), v(&["u", "exec", "00"]));
        assert_eq!(conformance_order(v(&["u", "exec"])), v(&["u", "exec"]));
    }
}
