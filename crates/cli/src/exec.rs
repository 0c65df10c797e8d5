//! `userbpf exec`: run one program from hex text (the bpf_conformance plugin protocol).

use std::io::Read;
use std::sync::Arc;

use anyhow::{Context, Result};
use clap::Args;
use userbpf_isa::{decode, parse_hex};
use userbpf_vm::{HelperRegistry, Interpreter, JitProgram, LoadOptions, Program};

#[derive(Args)]
pub struct ExecArgs {
    /// Run in the interpreter instead of the JIT.
    #[arg(long)]
    interpreter: bool,
    /// Memory handed to the program, as hex bytes ("00 01 ff" or "0001ff").
    mem: Option<String>,
}

pub fn run(args: ExecArgs) -> Result<()> {
    let mut text = String::new();
    std::io::stdin().read_to_string(&mut text).context("reading the program from stdin")?;
    let bytes = parse_hex(&text).map_err(|e| anyhow::anyhow!("program on stdin: {e}"))?;
    let insns = decode(&bytes).context("program on stdin")?;
    let mut mem = match &args.mem {
        Some(m) => parse_hex(m).map_err(|e| anyhow::anyhow!("memory argument: {e}"))?,
        None => Vec::new(),
    };
    let options = LoadOptions { helpers: Arc::new(basic_helpers()), allow_callx: true, ..Default::default() };
    let prog = Arc::new(Program::load(&insns, &options, None).context("program refused")?);
    let r0 = if args.interpreter {
        Interpreter::new(prog).run_mem(&mut mem)?
    } else {
        let jit = JitProgram::compile(prog)?;
        // SAFETY: `exec` runs a program the user handed to this very process; its memory
        // accesses are the user's responsibility, as with any native code they run. The
        // interpreter (`--interpreter`) checks every access instead.
        unsafe { jit.run_mem(&mut mem)? }
    };
    println!("{r0:#x}");
    Ok(())
}

/// Helpers that need no runtime around them, with the kernel's ids.
fn basic_helpers() -> HelperRegistry {
    use userbpf_vm::Helper;
    let mut r = HelperRegistry::new();
    r.register(Helper { id: 5, name: "ktime_get_ns", func: ktime_get_ns, may_exit: false });
    r
}

extern "C" fn ktime_get_ns(_: u64, _: u64, _: u64, _: u64, _: u64) -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec into the valid, exclusively borrowed `ts`.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64).wrapping_mul(1_000_000_000).wrapping_add(ts.tv_nsec as u64)
}
