//! Shared test support: compiling the eBPF C sources in tests/bpf with clang (at test time,
//! into the build directory) and a private session per test.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use userbpf_runtime::context::CpuSlots;
use userbpf_runtime::loader::LoadOptions;
use userbpf_runtime::{Engine, LoadedObject, Session, load_object};

/// Compiles tests/bpf/NAME.bpf.c to an object in the target directory; returns its path.
pub fn compile(name: &str) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/bpf").join(format!("{name}.bpf.c"));
    userbpf_testutil::compile_bpf(&src, &Path::new(env!("CARGO_TARGET_TMPDIR")).join("bpf"))
}

/// A session of its own for one test (its directory is removed when the test ends).
pub fn session(test: &str) -> Session {
    let dir = std::env::temp_dir().join(format!("userbpf-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // SAFETY: (of the environment change) every test of this binary sets the same value.
    unsafe { std::env::set_var(userbpf_runtime::session::SHM_DIR_ENV, &dir) };
    Session::open(test).unwrap()
}

/// Loads an object's programs (all, or `only`) into `session`.
pub fn load(session: &Session, path: &Path, engine: Engine, only: Option<&[String]>) -> LoadedObject {
    let obj = userbpf_object::Object::open(path).unwrap();
    let slots = Arc::new(CpuSlots::open(&session.layout().cpus()).unwrap());
    let opts = LoadOptions { engine, helpers: userbpf_runtime::helpers::registry(), only };
    load_object(session, obj, &opts, slots).unwrap_or_else(|e| panic!("{e}"))
}

/// Runs a program once on a zeroed pt_regs; returns r0.
pub fn run(obj: &LoadedObject, prog: &str) -> u64 {
    run_args(obj, prog, &[])
}

/// Index of each argument register in the x86-64 `struct pt_regs` (di, si, dx, cx, r8, r9).
const ARG_REGS: [usize; 6] = [14, 13, 12, 11, 9, 8];

/// Runs a program once on a pt_regs holding `args` in the argument registers; returns r0.
pub fn run_args(obj: &LoadedObject, prog: &str, args: &[u64]) -> u64 {
    let p = obj.program(prog).unwrap_or_else(|| panic!("no program {prog}"));
    let mut regs = [0u8; 168];
    for (i, a) in args.iter().enumerate() {
        regs[ARG_REGS[i] * 8..ARG_REGS[i] * 8 + 8].copy_from_slice(&a.to_ne_bytes());
    }
    let info = userbpf_runtime::context::RunContext { regs: regs.as_mut_ptr() as u64, ..Default::default() };
    p.run(regs.as_mut_ptr(), regs.len(), info).unwrap().expect("run skipped")
}

/// The memory a test's program may touch besides its stack and context: what the helpers'
/// registry holds (the registered maps' memory, as map lookups return it).
pub struct Registered;

impl userbpf_vm::MemoryPolicy for Registered {
    fn allows(&self, addr: u64, len: u64, _write: bool) -> bool {
        userbpf_runtime::helpers::registry_contains(addr, len)
    }
}

/// `lddw dst, v` (a map's address, as a program of the tests refers to it).
pub fn lddw(dst: u8, v: u64) -> [userbpf_isa::Insn; 2] {
    [
        userbpf_isa::Insn::new(0x18, dst, 0, 0, v as u32 as i32),
        userbpf_isa::Insn::new(0, 0, 0, 0, (v >> 32) as u32 as i32),
    ]
}

/// Runs `prog` once in the interpreter or (`jit`) the JIT, inside a run context holding a CPU
/// slot, on a 64-byte packet of zeros (what the kernel's socket filters of the difference
/// tests run on); its memory policy must allow what it touches besides ([`Registered`]).
pub fn run_on_packet(prog: &Arc<userbpf_vm::Program>, jit: bool, slots: &CpuSlots) -> u64 {
    let mut packet = [0u8; 64];
    let g = userbpf_runtime::context::enter(slots, userbpf_runtime::context::RunContext::default()).unwrap();
    let r = if jit {
        let jit = userbpf_vm::JitProgram::compile(prog.clone()).unwrap();
        // SAFETY: the tests' programs touch their stack, the packet and memory of registered
        // maps (which the interpreter's policy checks when it runs them).
        unsafe { jit.run(packet.as_mut_ptr() as u64, 0) }
    } else {
        userbpf_vm::Interpreter::new(prog.clone()).run(
            packet.as_mut_ptr() as u64,
            0,
            &[userbpf_vm::Region::of_mut(&mut packet)],
        )
    };
    drop(g);
    r.unwrap()
}
