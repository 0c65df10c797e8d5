//! Programs ready to run in this process: checked, map references resolved to the maps this
//! process has mapped, compiled by the JIT (or left to the interpreter), with run statistics.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use userbpf_isa::*;
use userbpf_maps::Map;
use userbpf_vm::{HelperRegistry, Interpreter, JitProgram, LoadError, LoadOptions, MemoryPolicy, Program, Region, Relocator, VmError};

use crate::context::{self, CpuSlots, Missed, RunContext};

/// Which executor runs a program.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Engine {
    #[default]
    Jit,
    Interpreter,
}

/// Resolves a map id (the `imm` of `BPF_PSEUDO_MAP_IDX` loads in session records) to a map
/// this process has open.
pub trait MapResolver {
    fn map(&self, id: u32) -> Option<Arc<Map>>;
}

impl MapResolver for &[(u32, Arc<Map>)] {
    fn map(&self, id: u32) -> Option<Arc<Map>> {
        self.iter().find(|(i, _)| *i == id).map(|(_, m)| m.clone())
    }
}

/// Why a program could not be prepared.
#[derive(Debug, thiserror::Error)]
pub enum PrepareError {
    #[error("{0}")]
    Load(#[from] LoadError),
    #[error("{0}")]
    Jit(VmError),
}

/// The maps a program references: where its interpreter runs may read and write.
struct ProgramMaps {
    maps: Vec<(Arc<Map>, bool)>,
}

impl MemoryPolicy for ProgramMaps {
    fn allows(&self, addr: u64, len: u64, write: bool) -> bool {
        self.maps.iter().any(|(m, readonly)| m.contains(addr, len) && !(write && *readonly))
            || crate::helpers::maps::registry_contains(addr, len)
    }
}

struct Resolve<'a> {
    maps: &'a dyn MapResolver,
    found: std::cell::RefCell<Vec<(Arc<Map>, bool)>>,
}

impl Relocator for Resolve<'_> {
    fn resolve_lddw(&self, index: usize, src: u8, imm: i32, next_imm: i32) -> Result<u64, String> {
        let id = imm as u32;
        let Some(map) = self.maps.map(id) else {
            return Err(format!("lddw refers to map {id}, which this session does not have"));
        };
        let readonly = map.spec().map_flags & userbpf_maps::BPF_F_RDONLY_PROG != 0;
        let value = match src {
            BPF_PSEUDO_MAP_IDX | BPF_PSEUDO_MAP_FD => Arc::as_ptr(&map) as u64,
            BPF_PSEUDO_MAP_IDX_VALUE | BPF_PSEUDO_MAP_VALUE => {
                let key = 0u32.to_ne_bytes();
                // SAFETY: the key buffer is 4 valid bytes, what an array map reads.
                let base = unsafe { map.lookup(key.as_ptr(), 0) };
                if base.is_null() || map.map_type() != userbpf_maps::MapType::BPF_MAP_TYPE_ARRAY {
                    return Err(format!("instruction {index}: map value of map {id} ({}) taken, but it is not an array with an element 0", map.spec().name));
                }
                let off = next_imm as u32 as u64;
                if off >= map.spec().value_size as u64 {
                    return Err(format!("instruction {index}: offset {off} is past the value of map {id} ({} bytes)", map.spec().value_size));
                }
                base as u64 + off
            }
            _ => return Err(format!("instruction {index}: lddw pseudo source {src} cannot be resolved by userbpf")),
        };
        self.found.borrow_mut().push((map, readonly));
        Ok(value)
    }
}

/// Run statistics, as the kernel keeps them with `kernel.bpf_stats_enabled`.
#[derive(Default, Debug)]
pub struct RunStats {
    pub run_cnt: AtomicU64,
    pub run_time_ns: AtomicU64,
    /// Runs skipped: recursion on a thread, or no CPU slot free.
    pub missed: AtomicU64,
    /// Runs ended by an error (out-of-bounds access, fault).
    pub errors: AtomicU64,
}

/// A program ready to run.
pub struct LoadedProgram {
    pub id: u32,
    pub name: String,
    interp: Interpreter,
    jit: Option<JitProgram>,
    slots: Arc<CpuSlots>,
    pub stats: RunStats,
}

impl LoadedProgram {
    /// Checks, relocates and (for [`Engine::Jit`]) compiles `insns`.
    pub fn prepare(
        id: u32,
        name: &str,
        insns: &[Insn],
        helpers: Arc<HelperRegistry>,
        maps: &dyn MapResolver,
        engine: Engine,
        slots: Arc<CpuSlots>,
    ) -> Result<LoadedProgram, PrepareError> {
        let resolve = Resolve { maps, found: Default::default() };
        // The policy needs the maps the relocation finds; load once to find them, then build
        // the program with the policy (loading is cheap next to compiling).
        Program::load(insns, &LoadOptions { helpers: helpers.clone(), ..Default::default() }, Some(&resolve))?;
        let policy = Arc::new(ProgramMaps { maps: resolve.found.take() });
        let options = LoadOptions { helpers, memory: Some(policy), allow_callx: false };
        let prog = Arc::new(Program::load(insns, &options, Some(&resolve))?);
        let jit = match engine {
            Engine::Jit => Some(JitProgram::compile(prog.clone()).map_err(PrepareError::Jit)?),
            Engine::Interpreter => None,
        };
        Ok(LoadedProgram { id, name: name.to_string(), interp: Interpreter::new(prog), jit, slots, stats: RunStats::default() })
    }

    pub fn engine(&self) -> Engine {
        if self.jit.is_some() {
            Engine::Jit
        } else {
            Engine::Interpreter
        }
    }

    pub fn program(&self) -> &Arc<Program> {
        self.interp.program()
    }

    /// Runs the executor alone, inside a run that is already in progress on this thread (a
    /// tail call).
    pub(crate) fn execute(&self, ctx: u64, ctx_len: u64) -> Result<u64, VmError> {
        match &self.jit {
            // SAFETY: JIT code does not check accesses; programs run here were checked at
            // load and faults in JIT code are contained by the VM's fault handler.
            Some(j) => unsafe { j.run(ctx, 0) },
            None => self.interp.run(ctx, 0, &[Region::new(ctx, ctx_len, true)]),
        }
    }

    /// Runs the program on a context of `ctx_len` bytes at `ctx` (r1 = ctx, r2 = 0), inside a
    /// run context (CPU slot, probe information). Returns `Ok(None)` when the run was skipped.
    pub fn run(&self, ctx: *mut u8, ctx_len: usize, mut info: RunContext) -> Result<Option<u64>, VmError> {
        info.prog = self as *const LoadedProgram as *const ();
        info.ctx = ctx as u64;
        info.ctx_len = ctx_len as u64;
        crate::control::start_run();
        let _guard = match context::enter(&self.slots, info) {
            Ok(g) => g,
            Err(Missed::Recursion | Missed::NoSlot) => {
                self.stats.missed.fetch_add(1, Ordering::Relaxed);
                return Ok(None);
            }
        };
        let r = self.execute(ctx as u64, ctx_len as u64);
        self.stats.run_cnt.fetch_add(1, Ordering::Relaxed);
        match r {
            Ok(v) => Ok(Some(v)),
            Err(e) => {
                self.stats.errors.fetch_add(1, Ordering::Relaxed);
                Err(e)
            }
        }
    }
}
