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

/// The start of a difference test's program: element 0 of the output array (`out` loads its
/// reference into r1; the key at `fp + key_at`) in r6. Returns where the null check is, for
/// [`output_frame_end`].
pub fn output_frame_start(p: &mut Vec<userbpf_isa::Insn>, out: [userbpf_isa::Insn; 2], key_at: i16) -> usize {
    use userbpf_isa::Insn;
    p.push(Insn::new(0x62, 10, 0, key_at, 0)); // *(u32 *)(fp + key_at) = 0
    p.extend(out);
    p.push(Insn::new(0xbf, 2, 10, 0, 0));
    p.push(Insn::new(0x07, 2, 0, 0, i32::from(key_at)));
    p.push(Insn::new(0x85, 0, 0, 0, 1)); // map_lookup_elem
    let null_check = p.len();
    p.push(Insn::new(0x15, 0, 0, 0, 0)); // if r0 == 0 goto the end (set by output_frame_end)
    p.push(Insn::new(0xbf, 6, 0, 0, 0));
    null_check
}

/// The end of a difference test's program: returns 0, or 1 where the output element was not
/// found (the null check's target).
pub fn output_frame_end(p: &mut Vec<userbpf_isa::Insn>, null_check: usize) {
    use userbpf_isa::Insn;
    p.push(Insn::new(0xb7, 0, 0, 0, 0));
    p.push(Insn::new(0x95, 0, 0, 0, 0));
    p[null_check].off = (p.len() - null_check - 1) as i16;
    p.push(Insn::new(0xb7, 0, 0, 0, 1));
    p.push(Insn::new(0x95, 0, 0, 0, 0));
}

/// Runs `insns` in the kernel as a socket filter (`BPF_PROG_TEST_RUN` on a 64-byte packet of
/// zeros: a program type that may use every map kind and the callbacks of these tests; with
/// `funcs`, the functions' starts for the BTF callbacks need) after zeroing element 0 of the
/// kernel's output array `out`, and returns that element. `Err`: the kernel refused the
/// program (the error and the verifier's log).
pub fn kernel_run_output(
    insns: &[userbpf_isa::Insn],
    out: &userbpf_testutil::kernel::Fd,
    out_len: usize,
    funcs: Option<&[u32]>,
) -> Result<Vec<u8>, (std::io::Error, String)> {
    use userbpf_testutil::kernel;
    userbpf_kernel::sys::update(out.0, &0u32.to_ne_bytes(), &vec![0; out_len], 0).expect("zeroing the output element");
    let code = userbpf_isa::encode(insns);
    let prog = match funcs {
        Some(starts) => kernel::prog_load_with_funcs(kernel::PROG_SOCKET_FILTER, &code, 0, starts)?,
        None => kernel::prog_load(kernel::PROG_SOCKET_FILTER, &code, 0)?,
    };
    let ret = kernel::test_run_packet(&prog, &[0; 64]).unwrap_or_else(|e| panic!("BPF_PROG_TEST_RUN: {e}"));
    assert_eq!(ret, 0, "the kernel's run returned non-zero");
    let mut value = vec![0u8; out_len];
    userbpf_kernel::sys::lookup(out.0, &0u32.to_ne_bytes(), &mut value).expect("the output element");
    Ok(value)
}

/// The output array of a difference test's programs on our side (one element of `len`
/// bytes, registered for the helpers), and the spec the kernel's twin is made from.
pub struct Output {
    pub map: Arc<userbpf_maps::Map>,
    /// The map's address, as the programs load it.
    pub addr: u64,
    len: usize,
}

impl Output {
    pub fn spec(len: usize) -> userbpf_maps::MapSpec {
        userbpf_maps::MapSpec {
            map_type: userbpf_maps::MapType::BPF_MAP_TYPE_ARRAY,
            key_size: 4,
            value_size: len as u32,
            max_entries: 1,
            map_flags: 0,
            map_extra: 0,
            name: "out".into(),
        }
    }

    /// Creates it in `dir` and registers it under `id`.
    pub fn new(dir: &userbpf_testutil::TmpDir, len: usize, id: u32) -> Output {
        let map = Arc::new(userbpf_maps::Map::create(&dir.path("out"), &Output::spec(len)).unwrap());
        map.set_id(id);
        assert!(userbpf_runtime::helpers::maps::register_map(id, map.clone()));
        let addr = Arc::as_ptr(&map) as u64;
        Output { map, addr, len }
    }

    /// Zeroes the element, runs `prog` ([`run_on_packet`]: it must return 0) and returns the
    /// element.
    pub fn run(&self, prog: &Arc<userbpf_vm::Program>, jit: bool, slots: &CpuSlots) -> Vec<u8> {
        self.map.update_elem(&0u32.to_ne_bytes(), &vec![0; self.len], 0).unwrap();
        assert_eq!(run_on_packet(prog, jit, slots), 0, "{}", if jit { "JIT" } else { "interpreter" });
        let mut o = vec![0u8; self.len];
        self.map.lookup_elem(&0u32.to_ne_bytes(), &mut o).unwrap();
        o
    }
}

/// The kernel's map of `spec` (`BPF_MAP_CREATE`).
pub fn kernel_map(spec: &userbpf_maps::MapSpec) -> userbpf_testutil::kernel::Fd {
    userbpf_testutil::kernel::map_create(
        spec.map_type as u32,
        spec.key_size,
        spec.value_size,
        spec.max_entries,
        spec.map_flags,
    )
    .unwrap_or_else(|e| panic!("BPF_MAP_CREATE {:?}: {e}", spec.map_type))
}
