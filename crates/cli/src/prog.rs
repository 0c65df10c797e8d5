//! `userbpf prog list` and `userbpf prog run`.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use serde_json::json;
use userbpf_object::Object;
use userbpf_runtime::context::{CpuSlots, RunContext};
use userbpf_runtime::loader::LoadOptions;
use userbpf_runtime::{Engine, Session, load_object};

use crate::dump::{Typed, dump_json, dump_text, hist_lines, is_log2_hist};

#[derive(Subcommand)]
pub enum ProgCmd {
    /// List the programs of the session.
    List {
        #[arg(long)]
        json: bool,
    },
    /// Run one program of an object N times on a context, as BPF_PROG_TEST_RUN does; print
    /// r0, the time per run and the object's maps.
    Run(RunArgs),
}

#[derive(Args)]
pub struct RunArgs {
    /// The object (clang -target bpf -g -O2).
    object: PathBuf,
    /// Run the programs unverified (for experiments; as USERBPF_VERIFY=0): a faulty program
    /// can then crash the process it runs in. A warning is printed for every program.
    #[arg(long)]
    pub no_verify: bool,
    /// The program (function name); default: the object's first program.
    prog: Option<String>,
    /// Runs.
    #[arg(long, default_value_t = 1)]
    repeat: u64,
    /// Context bytes (default: a zeroed struct pt_regs, 168 bytes).
    #[arg(long)]
    ctx: Option<PathBuf>,
    /// Run in the interpreter instead of the JIT.
    #[arg(long)]
    interpreter: bool,
    #[arg(long)]
    json: bool,
}

/// Size of the x86-64 `struct pt_regs`.
const PT_REGS_SIZE: usize = 21 * 8;

pub fn run(session: &str, cmd: ProgCmd) -> Result<()> {
    match cmd {
        ProgCmd::List { json } => list(session, json),
        ProgCmd::Run(args) => run_prog(session, args),
    }
}

fn list(session: &str, as_json: bool) -> Result<()> {
    let s = Session::open(session).with_context(|| format!("opening session {session}"))?;
    let progs = s.progs()?;
    if as_json {
        let v: Vec<_> = progs
            .iter()
            .map(|p| json!({"id": p.id, "name": p.name, "type": p.prog_type, "section": p.section, "object": p.object, "map_ids": p.map_ids, "insns": p.insns_hex.len() / 16}))
            .collect();
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    for p in progs {
        println!(
            "{}: {}  name {}  section {}  insns {}  map_ids {:?}",
            p.id,
            p.prog_type,
            p.name,
            p.section,
            p.insns_hex.len() / 16,
            p.map_ids
        );
    }
    Ok(())
}

fn run_prog(session: &str, args: RunArgs) -> Result<()> {
    let object = Object::open(&args.object)?;
    let name = match &args.prog {
        Some(n) => {
            if object.program(n).is_none() {
                let names: Vec<&str> = object.programs.iter().map(|p| p.name.as_str()).collect();
                bail!("{}: no program named `{n}` (it has: {})", args.object.display(), names.join(", "));
            }
            n.clone()
        }
        None => match object.programs.first() {
            Some(p) => p.name.clone(),
            None => bail!("{}: the object has no programs", args.object.display()),
        },
    };
    let mut ctx = match &args.ctx {
        Some(p) => std::fs::read(p).with_context(|| format!("reading the context {}", p.display()))?,
        None => vec![0u8; PT_REGS_SIZE],
    };
    let s = Session::open(session).with_context(|| format!("opening session {session}"))?;
    let slots = Arc::new(CpuSlots::open(&s.layout().cpus())?);
    // Its runs count in the session's run statistics, as a target's do (`userbpf export`).
    userbpf_runtime::prog_stats::bind(s.layout())?;
    let engine = if args.interpreter { Engine::Interpreter } else { Engine::Jit };
    let only = [name.clone()];
    let opts = LoadOptions { engine, helpers: userbpf_runtime::helpers::registry(), only: Some(&only) };
    let loaded = load_object(&s, object, &opts, slots)?;
    let prog = loaded.program(&name).context("program was not loaded")?.clone();

    let started = Instant::now();
    let mut r0 = 0;
    let mut skipped = 0u64;
    for _ in 0..args.repeat {
        let info = RunContext { regs: ctx.as_mut_ptr() as u64, ..Default::default() };
        match prog.run(ctx.as_mut_ptr(), ctx.len(), info)? {
            Some(v) => r0 = v,
            None => skipped += 1,
        }
    }
    let per_run = started.elapsed().as_nanos() as f64 / args.repeat.max(1) as f64;

    let trace = s.read_trace_pipe().unwrap_or_default();
    let btf = loaded.object.btf.as_ref();
    if args.json {
        let maps: Vec<_> = loaded
            .maps
            .iter()
            .map(|m| {
                let t = Typed { btf, key_type: m.def.key_type_id, value_type: m.def.value_type_id };
                json!({"id": m.record.id, "name": m.def.name, "type": m.map.map_type().name(), "entries": dump_json(&m.map, &t)})
            })
            .collect();
        let v = json!({"program": name, "engine": format!("{engine:?}"), "retval": r0, "runs": args.repeat, "skipped": skipped, "ns_per_run": per_run, "trace": trace, "maps": maps});
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    println!("{name}: r0 = {r0} ({r0:#x}); {} runs, {per_run:.1} ns per run ({engine:?})", args.repeat);
    if skipped > 0 {
        println!("({skipped} runs skipped: no CPU slot free)");
    }
    for line in &trace {
        println!("{line}");
    }
    for m in &loaded.maps {
        let t = Typed { btf, key_type: m.def.key_type_id, value_type: m.def.value_type_id };
        println!("map {} ({}, id {}):", m.def.name, m.map.map_type().name(), m.record.id);
        let lines = if is_log2_hist(&m.map) { hist_lines(&m.map) } else { dump_text(&m.map, &t) };
        for line in lines {
            println!("  {line}");
        }
    }
    Ok(())
}
