//! Programs ready to run in this process: checked, map references resolved to the maps this
//! process has mapped, compiled by the JIT (or left to the interpreter), with run statistics.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use userbpf_isa::*;
use userbpf_maps::Map;
use userbpf_vm::{
    HelperRegistry, InlineArray, Interpreter, JitProgram, LoadError, LoadOptions, MemoryPolicy, Program, Region,
    Relocator, VmError,
};

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
    /// The program's `get_current_pid_tgid` (helper 14), if it has one.
    pid_tgid: Option<userbpf_vm::HelperFn>,
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
                    return Err(format!(
                        "instruction {index}: map value of map {id} ({}) taken, but it is not an array with an element 0",
                        map.spec().name
                    ));
                }
                let off = next_imm as u32 as u64;
                if off >= map.spec().value_size as u64 {
                    return Err(format!(
                        "instruction {index}: offset {off} is past the value of map {id} ({} bytes)",
                        map.spec().value_size
                    ));
                }
                base as u64 + off
            }
            _ => return Err(format!("instruction {index}: lddw pseudo source {src} cannot be resolved by userbpf")),
        };
        self.found.borrow_mut().push((map, readonly));
        Ok(value)
    }

    /// Arrays registered with the helpers' map registry: their lookups are inlined, as the
    /// kernel's `array_map_gen_lookup` inlines them; per-CPU arrays too (the kernel's
    /// `percpu_array_map_gen_lookup`), by the JIT, with the run's CPU slot (the slots are the
    /// possible CPUs, as the map's values: checked here). An unregistered map is left to the
    /// helper (which refuses it), so both paths keep agreeing.
    ///
    /// Coupling with the maps crate: the element address is computed from the ARRAY layout
    /// of `userbpf_maps::array` (values of `round_up(value_size, 8)` bytes each, contiguous
    /// from the address of element 0, which never moves while the map is mapped; per-CPU: one
    /// such block per CPU, `cpu_stride` bytes apart). The layout is checked here on each map,
    /// through the lookups of the first and last elements (of the first, second and last
    /// CPUs): if it ever changes, lookups are simply not inlined.
    fn inline_lookup(&self, map_addr: u64) -> Option<InlineArray> {
        use userbpf_maps::MapType;
        // Registered maps are never unmapped (the registry leaks them), so the addresses stay
        // valid for as long as the program.
        let (map, _) = crate::helpers::maps::map_at(map_addr)?;
        let percpu = match map.map_type() {
            MapType::BPF_MAP_TYPE_ARRAY => false,
            MapType::BPF_MAP_TYPE_PERCPU_ARRAY => true,
            _ => return None,
        };
        if !matches!(map, Map::Array(_)) {
            return None;
        }
        let spec = map.spec();
        let elem_size = u32::try_from((spec.value_size as u64 + 7) & !7).ok()?;
        let max_entries = spec.max_entries;
        let at = |i: u32, cpu: u32| {
            let key = i.to_ne_bytes();
            // SAFETY: the key buffer is 4 valid bytes, what an array map reads.
            unsafe { map.lookup(key.as_ptr(), cpu) as u64 }
        };
        let values = at(0, 0);
        let last = max_entries.checked_sub(1)?;
        let nr_cpus = if percpu { map.nr_cpus() } else { 1 };
        if percpu && nr_cpus != userbpf_maps::shm::possible_cpus() {
            return None;
        }
        let cpu_stride = if nr_cpus > 1 { at(0, 1).checked_sub(values)? } else { 0 };
        let cpu_stride = u32::try_from(cpu_stride).ok().filter(|&s| s <= i32::MAX as u32)?;
        let layout_holds = values != 0
            && [0, 1.min(nr_cpus - 1), nr_cpus - 1].into_iter().all(|cpu| {
                let base = values + cpu as u64 * cpu_stride as u64;
                at(0, cpu) == base && at(last, cpu) == base + last as u64 * elem_size as u64
            })
            && at(max_entries, 0) == 0
            && at(u32::MAX, 0) == 0;
        layout_holds.then_some(InlineArray { values, max_entries, elem_size, cpu_stride })
    }

    /// Updates of the same arrays, when their values are whole 8-byte words: the helper's
    /// `Array::update` copies them 8 bytes at a time into the element (this run's CPU's for a
    /// per-CPU array) after the checks `Relocator::inline_update` lists, which the JIT's inline
    /// form repeats (`userbpf_maps::array`'s `check_update`: coupled as the layout is).
    fn inline_update(&self, map_addr: u64) -> Option<InlineArray> {
        let (map, _) = crate::helpers::maps::map_at(map_addr)?;
        if map.spec().value_size % 8 != 0 {
            return None;
        }
        self.inline_lookup(map_addr)
    }

    /// Hash maps registered with the helpers' map registry (hashes of maps aside): the JIT
    /// calls their own lookup, update and delete (`userbpf_maps::hash::ProgOps`), which is
    /// what the helpers call after finding the map in the registry and dispatching on its
    /// type, with the run's CPU slot the helpers would read from the run context. Registered
    /// maps are never unmapped (the registry leaks them), so the functions' argument stays
    /// valid for as long as the program. An unregistered map is left to the helper (which
    /// refuses it). Not once a program was loaded unverified (the helpers then distrust
    /// their pointers, [`crate::helpers::maps::distrust_pointers`]).
    fn direct_call(&self, map_addr: u64, helper_id: u32) -> Option<userbpf_vm::DirectCall> {
        // The map's own functions trust their key and value: only for verified programs.
        if !crate::helpers::maps::pointers_trusted() {
            return None;
        }
        let (map, _) = crate::helpers::maps::map_at(map_addr)?;
        let ops = map.prog_ops()?;
        let func = match helper_id {
            1 => ops.lookup,
            2 => ops.update,
            3 => ops.delete,
            _ => return None,
        };
        // Per-CPU hash lookups and updates: the memo's hits inline (see
        // `userbpf_maps::hash::MemoLayout`, whose contract `HashMemo` restates).
        let memo = matches!(helper_id, 1 | 2).then(|| map.memo_layout()).flatten().map(|m| userbpf_vm::HashMemo {
            map: m.map,
            thread_words: m.thread_words,
            n_elems: m.n_elems,
            elems: m.elems,
            elem_size: m.elem_size,
            state: m.state,
            linked: m.linked,
            lock: m.lock,
            key: m.key,
            key_size: m.key_size,
            pcpu: m.pcpu,
            pcpu_stride: m.pcpu_stride,
            value_size: m.value_size,
        });
        Some(userbpf_vm::DirectCall { func: func as usize as u64, arg: ops.arg, memo })
    }

    /// `get_current_pid_tgid`'s per-thread cache, read inline (bpftrace's `tid` and `pid`).
    fn cached_helper(&self, helper_id: u32) -> Option<userbpf_vm::CachedHelper> {
        match helper_id {
            14 => crate::helpers::task::pid_tgid_cache(self.pid_tgid?),
            _ => None,
        }
    }
}

/// Run statistics. `run_cnt` and `run_time_ns` are kept only while [`set_stats_enabled`] is
/// on, or the session's switch (see [`crate::prog_stats`]), as the kernel keeps them only with
/// `kernel.bpf_stats_enabled`. In a process bound to a session they live in its counters file
/// in the session (`crate::prog_stats`), where `userbpf export` reads them.
#[derive(Default, Debug)]
#[repr(C)]
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
    pub stats: crate::prog_stats::StatsRef,
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
        let resolve = Resolve { maps, found: Default::default(), pid_tgid: helpers.get(14).map(|h| h.func) };
        // The policy needs the maps the relocation finds; load once to find them, then build
        // the program with the policy (loading is cheap next to compiling).
        Program::load(insns, &LoadOptions { helpers: helpers.clone(), ..Default::default() }, Some(&resolve))?;
        if insns.iter().any(|i| i.op == OP_CALL && i.src == 0 && i.imm == 35) {
            // bpf_get_current_task: the kernel's task_struct layout, found once per process.
            let _ = crate::helpers::current_task::prepare();
        }
        let policy = Arc::new(ProgramMaps { maps: resolve.found.take() });
        let options = LoadOptions { helpers, memory: Some(policy), allow_callx: false };
        let prog = Arc::new(Program::load(insns, &options, Some(&resolve))?);
        let jit = match engine {
            // The claiming entry is only ever given this process's claim (`claim_entry`): the
            // JIT takes it as constants.
            Engine::Jit => {
                Some(JitProgram::compile_claiming(prog.clone(), slots.claim_desc()).map_err(PrepareError::Jit)?)
            }
            Engine::Interpreter => None,
        };
        Ok(LoadedProgram {
            id,
            name: name.to_string(),
            interp: Interpreter::new(prog),
            jit,
            slots,
            stats: crate::prog_stats::slot(id, name),
        })
    }

    /// Whether the program calls helper `id` (bpf-to-bpf callees included).
    pub fn calls_helper(&self, id: u32) -> bool {
        self.program().insns().iter().any(|i| i.op == OP_CALL && i.src == 0 && i.imm as u32 == id)
    }

    /// Whether every helper the program calls reads nothing of a probe's `pt_regs` but the
    /// general-purpose registers (arguments, return value): none of the stack walks (ip, sp),
    /// `bpf_override_return` (ip), the kernel-memory reads (`usdt.bpf.h` reads registers, sp
    /// among them, through them) and tail calls (another program's reads). A probe whose
    /// program reads only registers itself and calls only these may leave the rest of the
    /// pt_regs unwritten (`userbpf_hook::LeanHandler::reads_all`).
    pub fn helpers_read_only_gprs(&self) -> bool {
        const GPRS_ONLY: [&str; 34] = [
            "map_lookup_elem",
            "map_update_elem",
            "map_delete_elem",
            "ktime_get_ns",
            "trace_printk",
            "get_prandom_u32",
            "get_smp_processor_id",
            "get_current_pid_tgid",
            "get_current_uid_gid",
            "get_current_comm",
            "perf_event_output",
            "map_push_elem",
            "map_pop_elem",
            "map_peek_elem",
            "probe_read_user",
            "probe_read_user_str",
            "ktime_get_boot_ns",
            "ringbuf_output",
            "ringbuf_reserve",
            "ringbuf_submit",
            "ringbuf_discard",
            "ringbuf_query",
            "ktime_get_coarse_ns",
            "get_func_ip",
            "get_attach_cookie",
            "get_func_arg",
            "get_func_ret",
            "get_func_arg_cnt",
            "map_lookup_percpu_elem",
            "trace_vprintk",
            "snprintf",
            "ktime_get_tai_ns",
            "get_current_cgroup_id",
            "spin_lock",
        ];
        self.program()
            .insns()
            .iter()
            .filter(|i| i.op == OP_CALL && i.src == 0)
            .all(|i| userbpf_isa::helper_names::helper_name(i.imm as u32).is_some_and(|n| GPRS_ONLY.contains(&n)))
    }

    pub fn engine(&self) -> Engine {
        if self.jit.is_some() { Engine::Jit } else { Engine::Interpreter }
    }

    pub fn program(&self) -> &Arc<Program> {
        self.interp.program()
    }

    /// The native entry a probe may call directly instead of [`run`](Self::run): the JIT's
    /// fast entry (see `JitProgram::fast_entry_address`), for JIT'd programs that call no
    /// helper, no `callx` and no callback and inline no per-CPU lookup. Such a run needs none
    /// of what `run` sets up: no helper reads the run context, and no per-CPU state is
    /// touched, so no CPU slot is claimed. While
    /// [`stats_gate`] reads non-zero, runs must go through `run` (it counts them). A failed
    /// run (its abort record's first word non-zero) must be added to `stats.errors`. Valid
    /// while `self` lives.
    pub fn native_entry(&self) -> Option<usize> {
        let j = self.jit.as_ref()?;
        if j.needs_context() { None } else { j.fast_entry_address() }
    }

    /// The JIT'd native code, as `(address, length)` (for profilers' symbol maps); None when
    /// the program runs in the interpreter. Valid while `self` lives.
    pub fn native_code(&self) -> Option<(usize, usize)> {
        let code = self.jit.as_ref()?.code();
        Some((code.as_ptr() as usize, code.len()))
    }

    /// The native entry of a JIT'd program whose runs need a run context (it calls helpers
    /// or inlines per-CPU lookups) but no run state of the VM (no helper that may end the run,
    /// no `callx`, no callback): the JIT's fast entry, for [`run_fast`](Self::run_fast). None
    /// for other programs ([`native_entry`](Self::native_entry) serves those needing neither).
    pub fn context_entry(&self) -> Option<usize> {
        let j = self.jit.as_ref()?;
        if j.needs_context() { j.fast_entry_address() } else { None }
    }

    /// The claiming entry of a JIT'd program whose runs need a CPU slot but call no helper
    /// (per-CPU array lookups, inlined; or direct per-CPU hash operations and a cached
    /// `get_current_pid_tgid`, which need no run context: see
    /// [`claim_calls_out`](Self::claim_calls_out)), with what it needs to claim the slot
    /// itself (see `JitProgram::claim_entry_address`): `extern "C" fn(ctx, claim, record) -> u64`, which
    /// stores `userbpf_vm::jit::CLAIM_RETRY` in `record[0]` when the caller must [`run`](Self::run)
    /// the program instead. Runs it makes are not counted in statistics (callers take `run`
    /// while [`stats_gate`] is set). None for other programs.
    pub fn claim_entry(&self) -> Option<(usize, userbpf_vm::jit::SlotClaim)> {
        let j = self.jit.as_ref()?;
        if !j.needs_context() {
            return None;
        }
        Some((j.claim_entry_address()?, self.slots.claim_desc()))
    }

    /// Whether runs through [`claim_entry`](Self::claim_entry) may call out (direct map calls
    /// on a memo miss, `get_current_pid_tgid` refilling its cache: see
    /// `JitProgram::claim_calls_out`): the caller then holds its recursion guard around them.
    pub fn claim_calls_out(&self) -> bool {
        self.jit.as_ref().is_some_and(|j| j.claim_calls_out())
    }

    /// [`run`](Self::run) through `entry` (this program's [`context_entry`](Self::context_entry)),
    /// for a probe's lean handler: claims a CPU slot and makes `info` the thread's run context,
    /// as `run` does, then calls the native code directly (no state of the VM, no statistics:
    /// callers take [`run`](Self::run) while [`stats_gate`] is set). A failed run writes
    /// `[kind, pc, detail]` (kind non-zero) to `record`, which the caller counts in
    /// `stats.errors`; a skipped one (recursion, no CPU slot) counts as missed. Nothing here
    /// panics, allocates, locks or makes a system call (but the thread's id, once per thread).
    ///
    /// # Safety
    /// `entry` is `self.context_entry()`; `record` points to three writable words that are
    /// zero; `ctx`/`ctx_len` are what the program may read (and write) as its context, as for
    /// [`run`](Self::run).
    #[inline]
    pub unsafe fn run_fast(
        &self,
        entry: usize,
        ctx: *mut u8,
        ctx_len: usize,
        mut info: RunContext,
        record: *mut [u64; 3],
    ) {
        type FastEntry = unsafe extern "C" fn(u64, u64, *mut [u64; 3], u64) -> u64;
        info.prog = self as *const LoadedProgram as *const ();
        info.ctx = ctx as u64;
        info.ctx_len = ctx_len as u64;
        match context::enter(&self.slots, info) {
            Ok(guard) => {
                // SAFETY: `entry` is the JIT's fast entry of this program (caller), a C function
                // of this signature in code mapped while `self` lives; the run holds CPU slot
                // `guard.cpu()` and its context is the thread's, which is what its helpers and
                // inlined per-CPU lookups read; its accesses are the caller's guarantee.
                unsafe {
                    let f = std::mem::transmute::<usize, FastEntry>(entry);
                    f(ctx as u64, 0, record, guard.cpu() as u64);
                }
                drop(guard);
            }
            Err(Missed::Recursion | Missed::NoSlot) => {
                self.stats.missed.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Runs the executor alone, inside a run that is already in progress on this thread (a
    /// tail call).
    #[inline]
    pub(crate) fn execute(&self, ctx: u64, ctx_len: u64, cpu: u32) -> Result<u64, VmError> {
        match &self.jit {
            // SAFETY: JIT code does not check accesses; programs run here were checked at
            // load and faults in JIT code are contained by the VM's fault handler. `cpu` is
            // the slot the run holds.
            Some(j) => unsafe { j.run_on_cpu(ctx, 0, cpu) },
            None => self.interp.run(ctx, 0, &[Region::new(ctx, ctx_len, true)]),
        }
    }

    /// Runs the program on a context of `ctx_len` bytes at `ctx` (r1 = ctx, r2 = 0), inside a
    /// run context (CPU slot, probe information). Returns `Ok(None)` when the run was skipped.
    ///
    /// The hit path of every probe: no allocation, no lock, no system call (but the thread's
    /// id, once per thread), no thread-local call, one atomic read-modify-write (the CPU
    /// slot's claim). `run_cnt` and `run_time_ns` are counted only while
    /// [`set_stats_enabled`] is on, as the kernel counts them only with
    /// `kernel.bpf_stats_enabled`.
    #[inline]
    pub fn run(&self, ctx: *mut u8, ctx_len: usize, mut info: RunContext) -> Result<Option<u64>, VmError> {
        info.prog = self as *const LoadedProgram as *const ();
        info.ctx = ctx as u64;
        info.ctx_len = ctx_len as u64;
        let guard = match context::enter(&self.slots, info) {
            Ok(g) => g,
            Err(Missed::Recursion | Missed::NoSlot) => {
                self.stats.missed.fetch_add(1, Ordering::Relaxed);
                return Ok(None);
            }
        };
        let cpu = guard.cpu();
        let r = if counting() {
            self.run_counted(ctx as u64, ctx_len as u64, cpu)
        } else {
            self.execute(ctx as u64, ctx_len as u64, cpu)
        };
        drop(guard);
        match r {
            Ok(v) => Ok(Some(v)),
            Err(e) => {
                self.stats.errors.fetch_add(1, Ordering::Relaxed);
                Err(e)
            }
        }
    }

    #[cold]
    fn run_counted(&self, ctx: u64, ctx_len: u64, cpu: u32) -> Result<u64, VmError> {
        let t0 = monotonic_ns();
        let r = self.execute(ctx, ctx_len, cpu);
        self.stats.run_time_ns.fetch_add(monotonic_ns().saturating_sub(t0), Ordering::Relaxed);
        self.stats.run_cnt.fetch_add(1, Ordering::Relaxed);
        r
    }
}

/// Whether runs are counted and timed (`RunStats::run_cnt`, `run_time_ns`); off by default.
// The hit path reads it: with its other statics on one page (see `userbpf_arena`).
#[unsafe(link_section = "userbpf_hot")]
static STATS_ENABLED: AtomicBool = AtomicBool::new(false);

/// Turns the counting of runs and their time on or off for this process (the kernel's
/// `kernel.bpf_stats_enabled` / `BPF_ENABLE_STATS`). Misses and errors are always counted.
pub fn set_stats_enabled(on: bool) {
    STATS_ENABLED.store(on, Ordering::Relaxed);
}

pub fn stats_enabled() -> bool {
    STATS_ENABLED.load(Ordering::Relaxed)
}

/// Whether runs are counted now: this process's switch or its session's.
#[inline]
fn counting() -> bool {
    STATS_ENABLED.load(Ordering::Relaxed)
        || crate::prog_stats::session_switch().is_some_and(|s| s.load(Ordering::Relaxed))
}

/// The byte that is non-zero while runs are counted (see
/// [`LoadedProgram::native_entry`]): for generated code that checks it on each hit. In a
/// process bound to a session (`crate::prog_stats::bind`), the session's switch, which
/// `userbpf export --run-stats` turns on; else this process's ([`set_stats_enabled`]).
pub fn stats_gate() -> *const u8 {
    match crate::prog_stats::session_switch() {
        Some(s) => s.as_ptr() as *const u8,
        None => STATS_ENABLED.as_ptr() as *const u8,
    }
}

fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes the timespec we own (the vDSO: no system call).
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use userbpf_isa::*;
    use userbpf_maps::{Map, MapSpec, MapType};

    use super::{Engine, LoadedProgram, MapResolver};
    use crate::context::{CpuSlots, RunContext};

    fn spec(t: MapType, value: u32, max: u32) -> MapSpec {
        MapSpec {
            map_type: t,
            key_size: 4,
            value_size: value,
            max_entries: max,
            map_flags: 0,
            map_extra: 0,
            name: "m".into(),
        }
    }

    /// `insns` prepared as program 1 twice, for the JIT and for the interpreter.
    fn jit_and_interpreter(
        insns: &[Insn],
        helpers: &Arc<super::HelperRegistry>,
        resolver: &[(u32, Arc<Map>)],
        slots: &Arc<CpuSlots>,
    ) -> (LoadedProgram, LoadedProgram) {
        let load = |engine| {
            LoadedProgram::prepare(1, "t", insns, helpers.clone(), &resolver as &dyn MapResolver, engine, slots.clone())
                .unwrap()
        };
        (load(Engine::Jit), load(Engine::Interpreter))
    }

    /// `r0 = bpf_map_lookup_elem(map 1, &(u32)ctx[0])`; with `deref`, then r0 = the u32 at
    /// offset 4 of the value, or -1 for null.
    fn prog(deref: bool) -> Vec<Insn> {
        let mut p = vec![
            Insn::new(BPF_LDX | BPF_MEM | BPF_W, 6, 1, 0, 0),
            Insn::new(BPF_STX | BPF_MEM | BPF_W, 10, 6, -4, 0),
            Insn::new(OP_LDDW, 1, BPF_PSEUDO_MAP_IDX, 0, 1),
            Insn::new(0, 0, 0, 0, 0),
            Insn::new(BPF_ALU64 | BPF_MOV | BPF_X, 2, 10, 0, 0),
            Insn::new(BPF_ALU64 | BPF_ADD | BPF_K, 2, 0, 0, -4),
            Insn::new(OP_CALL, 0, 0, 0, 1),
        ];
        if deref {
            p.extend([
                Insn::new(BPF_JMP | BPF_JEQ | BPF_K, 0, 0, 2, 0),
                Insn::new(BPF_LDX | BPF_MEM | BPF_W, 0, 0, 4, 0),
                Insn::new(OP_EXIT, 0, 0, 0, 0),
                Insn::new(BPF_ALU64 | BPF_MOV | BPF_K, 0, 0, 0, -1),
            ]);
        }
        p.push(Insn::new(OP_EXIT, 0, 0, 0, 0));
        p
    }

    /// For each kind of map: whether its lookups are inlined, and that both engines give
    /// what helper 1 gives.
    #[test]
    fn array_lookups_are_inlined_and_agree_with_the_helper() {
        let dir = std::env::temp_dir().join(format!("userbpf-inline-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let helpers = crate::helpers::registry();
        let lookup = helpers.get(1).unwrap().func;
        let slots = Arc::new(CpuSlots::private().unwrap());
        // Every run below claims the slot of the CPU the thread runs on: keep it on one CPU,
        // so that the per-CPU values the JIT, the interpreter and the helper find are the same.
        // SAFETY: sched_getcpu has no preconditions; a zeroed cpu_set_t with that CPU set,
        // for this thread only.
        unsafe {
            let cpu = libc::sched_getcpu().max(0) as usize;
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cpu, &mut set);
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
        }
        let cases = [
            (MapType::BPF_MAP_TYPE_ARRAY, 12, 8, true, true),
            (MapType::BPF_MAP_TYPE_ARRAY, 8, 1, true, true),
            (MapType::BPF_MAP_TYPE_ARRAY, 100, 3, true, true),
            // Unregistered: the helper refuses it, and so the lookup is not inlined.
            (MapType::BPF_MAP_TYPE_ARRAY, 12, 8, false, false),
            // Per-CPU: inlined (the JIT's only), with the run's CPU slot.
            (MapType::BPF_MAP_TYPE_PERCPU_ARRAY, 12, 8, true, true),
            (MapType::BPF_MAP_TYPE_HASH, 12, 8, true, false),
        ];
        for (n, &(t, value_size, max, register, inlined)) in cases.iter().enumerate() {
            let m = Arc::new(Map::create(&dir.join(n.to_string()), &spec(t, value_size, max)).unwrap());
            m.set_id(1);
            if register {
                assert!(crate::helpers::register_map(1, m.clone()));
            }
            for k in 0..max {
                let mut v = vec![0u8; m.value_buf_size()];
                v[4..8].copy_from_slice(&(k * 1000 + 7).to_ne_bytes());
                m.update_elem(&k.to_ne_bytes(), &v, 0).unwrap();
            }
            let maps = [(1u32, m.clone())];
            let resolver: &[(u32, Arc<Map>)] = &maps;
            for deref in [false, true] {
                let insns = prog(deref);
                let (jit, interp) = jit_and_interpreter(&insns, &helpers, resolver, &slots);
                assert_eq!(jit.program().inline_lookups().len(), usize::from(inlined), "case {n}");
                for key in [0, 1, max / 2, max - 1, max, max + 1, 0x8000_0000, u32::MAX] {
                    let mut ctx = key.to_ne_bytes();
                    let r = |p: &LoadedProgram, ctx: &mut [u8; 4]| {
                        p.run(ctx.as_mut_ptr(), 4, RunContext::default()).unwrap()
                    };
                    let (j, i) = (r(&jit, &mut ctx), r(&interp, &mut ctx));
                    let expect = {
                        let _g = crate::context::enter(&slots, RunContext::default()).unwrap();
                        // SAFETY: helper 1 with a map address and a 4-byte key.
                        let p = unsafe { lookup(Arc::as_ptr(&m) as u64, ctx.as_ptr() as u64, 0, 0, 0) };
                        if !deref {
                            p
                        } else if p == 0 {
                            u64::MAX
                        } else {
                            // SAFETY: a non-null lookup result is a value of 12+ bytes.
                            unsafe { (p as *const u32).add(1).read_unaligned() as u64 }
                        }
                    };
                    let what = format!("case {n}, key {key:#x}, deref {deref}");
                    assert_eq!(j, Some(expect), "{what}: jit");
                    assert_eq!(i, Some(expect), "{what}: interpreter");
                    if deref && register && key < max && t != MapType::BPF_MAP_TYPE_PERCPU_ARRAY {
                        assert_eq!(expect, (key * 1000 + 7) as u64, "{what}");
                    }
                }
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// bpftrace's keyed `count()`/`sum()` in one program: `v = lookup(&key);
    /// n = (v ? *v : 0) + inc; r9 = update(&key, &n, BPF_ANY);
    /// r0 = r9 ? r9 : bpf_get_current_pid_tgid()`, the key and the increment read from the
    /// context (two u64s).
    fn keyed_sum() -> Vec<Insn> {
        vec![
            Insn::new(BPF_ALU64 | BPF_MOV | BPF_X, 6, 1, 0, 0),
            Insn::new(BPF_LDX | BPF_MEM | BPF_DW, 7, 6, 0, 0),
            Insn::new(BPF_STX | BPF_MEM | BPF_DW, 10, 7, -8, 0),
            Insn::new(OP_LDDW, 1, BPF_PSEUDO_MAP_IDX, 0, 1),
            Insn::new(0, 0, 0, 0, 0),
            Insn::new(BPF_ALU64 | BPF_MOV | BPF_X, 2, 10, 0, 0),
            Insn::new(BPF_ALU64 | BPF_ADD | BPF_K, 2, 0, 0, -8),
            Insn::new(OP_CALL, 0, 0, 0, 1),
            Insn::new(BPF_LDX | BPF_MEM | BPF_DW, 8, 6, 8, 0),
            Insn::new(BPF_JMP | BPF_JEQ | BPF_K, 0, 0, 2, 0),
            Insn::new(BPF_LDX | BPF_MEM | BPF_DW, 1, 0, 0, 0),
            Insn::new(BPF_ALU64 | BPF_ADD | BPF_X, 8, 1, 0, 0),
            Insn::new(BPF_STX | BPF_MEM | BPF_DW, 10, 8, -16, 0),
            Insn::new(OP_LDDW, 1, BPF_PSEUDO_MAP_IDX, 0, 1),
            Insn::new(0, 0, 0, 0, 0),
            Insn::new(BPF_ALU64 | BPF_MOV | BPF_X, 2, 10, 0, 0),
            Insn::new(BPF_ALU64 | BPF_ADD | BPF_K, 2, 0, 0, -8),
            Insn::new(BPF_ALU64 | BPF_MOV | BPF_X, 3, 10, 0, 0),
            Insn::new(BPF_ALU64 | BPF_ADD | BPF_K, 3, 0, 0, -16),
            Insn::new(BPF_ALU64 | BPF_MOV | BPF_K, 4, 0, 0, 0),
            Insn::new(OP_CALL, 0, 0, 0, 2),
            Insn::new(BPF_ALU64 | BPF_MOV | BPF_X, 9, 0, 0, 0),
            Insn::new(OP_CALL, 0, 0, 0, 14),
            Insn::new(BPF_JMP | BPF_JEQ | BPF_K, 9, 0, 1, 0),
            Insn::new(BPF_ALU64 | BPF_MOV | BPF_X, 0, 9, 0, 0),
            Insn::new(OP_EXIT, 0, 0, 0, 0),
        ]
    }

    /// The JIT pairs a lookup with the update after it only when nothing between them can
    /// change the key: not when a store in between overlaps the key's bytes, nor when the
    /// update's key is elsewhere on the stack; such programs still agree with the interpreter.
    #[test]
    fn memo_pairs_only_where_the_key_stays() {
        let dir = std::env::temp_dir().join(format!("userbpf-memo-pairs-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let helpers = crate::helpers::registry();
        let slots = Arc::new(CpuSlots::private().unwrap());
        let spec = MapSpec { key_size: 8, value_size: 8, ..spec(MapType::BPF_MAP_TYPE_PERCPU_HASH, 8, 64) };
        // The value written at r10-12 (overlapping the key at r10-8); the update's key at r10-16.
        let mut overlap = keyed_sum();
        overlap[12].off = -12;
        overlap[18].imm = -12;
        let mut elsewhere = keyed_sum();
        elsewhere[16].imm = -16;
        for (name, insns, id) in [("overlap", overlap, 11), ("elsewhere", elsewhere, 13)] {
            // Each engine its own map (the helpers find maps by id).
            let mk = |engine: &str, id: u32| {
                let m = Arc::new(Map::create(&dir.join(format!("{name}-{engine}")), &spec).unwrap());
                m.set_id(id);
                assert!(crate::helpers::register_map(id, m.clone()));
                m
            };
            let (mj, mi) = (mk("jit", id), mk("interp", id + 1));
            let with_map = |id: i32| {
                let mut p = insns.clone();
                p[3].imm = id;
                p[13].imm = id;
                p
            };
            let rj: &[(u32, Arc<Map>)] = &[(id, mj.clone())];
            let ri: &[(u32, Arc<Map>)] = &[(id + 1, mi.clone())];
            let (jit, _) = jit_and_interpreter(&with_map(id as i32), &helpers, rj, &slots);
            let (_, interp) = jit_and_interpreter(&with_map(id as i32 + 1), &helpers, ri, &slots);
            assert_eq!(jit.jit.as_ref().unwrap().memo_pairs(), [], "{name}: paired");
            for i in 0..20u64 {
                let mut cj = [5 + (i / 4) % 2, i + 1];
                let mut ci = cj;
                let a = jit.run(cj.as_mut_ptr().cast(), 16, RunContext::default()).unwrap().unwrap();
                let b = interp.run(ci.as_mut_ptr().cast(), 16, RunContext::default()).unwrap().unwrap();
                assert_eq!(a, b, "{name}: step {i}");
            }
            let dump = |m: &Map| {
                let mut keys = Vec::new();
                let mut k: Option<Vec<u8>> = None;
                let mut next = vec![0u8; 8];
                while m.get_next_key(k.as_deref(), &mut next).is_ok() {
                    let mut v = vec![0u8; m.value_buf_size()];
                    m.lookup_elem(&next, &mut v).unwrap();
                    keys.push((next.clone(), v));
                    k = Some(next.clone());
                }
                keys.sort();
                keys
            };
            assert_eq!(dump(&mj), dump(&mi), "{name}: the maps");
            assert!(!dump(&mj).is_empty(), "{name}: nothing written");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Calls a claiming entry `f(r1, claim, record)` with vector registers 0-7 (ymm, or xmm
    /// without AVX) loaded from `vin`, and stores them into `vout` after the call.
    ///
    /// # Safety
    /// `f` is a claiming entry and `r1` a context it may read.
    unsafe fn call_with_vectors(
        f: usize,
        r1: u64,
        claim: *const userbpf_vm::jit::SlotClaim,
        record: *mut [u64; 3],
        vin: &[u8; 256],
        vout: &mut [u8; 256],
    ) -> u64 {
        let r: u64;
        if std::arch::is_x86_feature_detected!("avx") {
            // SAFETY: loads and stores of the two 256-byte buffers (r12, r13: callee-saved, so
            // kept by the call); the call is to a C function of this signature, on a stack
            // aligned for calls (no `nostack`); every register the C ABI lets it clobber is
            // declared clobbered.
            unsafe {
                std::arch::asm!(
                    "vmovdqu ymm0, [r12]", "vmovdqu ymm1, [r12 + 32]", "vmovdqu ymm2, [r12 + 64]",
                    "vmovdqu ymm3, [r12 + 96]", "vmovdqu ymm4, [r12 + 128]", "vmovdqu ymm5, [r12 + 160]",
                    "vmovdqu ymm6, [r12 + 192]", "vmovdqu ymm7, [r12 + 224]",
                    "call {f}",
                    "vmovdqu [r13], ymm0", "vmovdqu [r13 + 32], ymm1", "vmovdqu [r13 + 64], ymm2",
                    "vmovdqu [r13 + 96], ymm3", "vmovdqu [r13 + 128], ymm4", "vmovdqu [r13 + 160], ymm5",
                    "vmovdqu [r13 + 192], ymm6", "vmovdqu [r13 + 224], ymm7",
                    "vzeroupper",
                    f = in(reg) f,
                    in("rdi") r1, in("rsi") claim, in("rdx") record,
                    in("r12") vin.as_ptr(), in("r13") vout.as_mut_ptr(),
                    lateout("rax") r,
                    clobber_abi("C"),
                )
            };
        } else {
            // SAFETY: as above, with the xmm registers (16 bytes each).
            unsafe {
                std::arch::asm!(
                    "movdqu xmm0, [r12]", "movdqu xmm1, [r12 + 32]", "movdqu xmm2, [r12 + 64]",
                    "movdqu xmm3, [r12 + 96]", "movdqu xmm4, [r12 + 128]", "movdqu xmm5, [r12 + 160]",
                    "movdqu xmm6, [r12 + 192]", "movdqu xmm7, [r12 + 224]",
                    "call {f}",
                    "movdqu [r13], xmm0", "movdqu [r13 + 32], xmm1", "movdqu [r13 + 64], xmm2",
                    "movdqu [r13 + 96], xmm3", "movdqu [r13 + 128], xmm4", "movdqu [r13 + 160], xmm5",
                    "movdqu [r13 + 192], xmm6", "movdqu [r13 + 224], xmm7",
                    f = in(reg) f,
                    in("rdi") r1, in("rsi") claim, in("rdx") record,
                    in("r12") vin.as_ptr(), in("r13") vout.as_mut_ptr(),
                    lateout("rax") r,
                    clobber_abi("C"),
                )
            };
            for k in 0..8 {
                vout[32 * k + 16..32 * k + 32].copy_from_slice(&vin[32 * k + 16..32 * k + 32]);
            }
        }
        r
    }

    /// A per-CPU hash program calling only lookup, update and `get_current_pid_tgid` runs
    /// through the claiming entry (memo hits and the pid cache inline; misses, inserts and
    /// refills call out through the vector-keeping thunk): its sums agree with a model and
    /// with the interpreter's, across keys changing, deletes from the syscall side and an
    /// element reused for another key, and vector registers 0-7 come back as they were.
    #[test]
    fn keyed_percpu_hash_runs_claimed_with_inline_memo_hits() {
        let dir = std::env::temp_dir().join(format!("userbpf-memo-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let helpers = crate::helpers::registry();
        let slots = Arc::new(CpuSlots::private().unwrap());
        let spec = MapSpec { key_size: 8, value_size: 8, ..spec(MapType::BPF_MAP_TYPE_PERCPU_HASH, 8, 64) };
        let m = Arc::new(Map::create(&dir.join("h"), &spec).unwrap());
        m.set_id(1);
        assert!(crate::helpers::register_map(1, m.clone()));
        let maps = [(1u32, m.clone())];
        let resolver: &[(u32, Arc<Map>)] = &maps;
        let insns = keyed_sum();
        let (jit, interp) = jit_and_interpreter(&insns, &helpers, resolver, &slots);
        let direct = jit.program().direct_calls();
        assert_eq!(direct.len(), 2);
        assert!(direct.iter().all(|(_, d)| d.memo.is_some()), "{direct:?}");
        assert!(jit.program().cached_helper_at(insns.len() - 4).is_some());
        let (entry, claim) = jit.claim_entry().expect("a claiming entry");
        assert!(jit.claim_calls_out());
        // The update takes the element the lookup's memo hit found (no second memo check).
        assert_eq!(jit.jit.as_ref().unwrap().memo_pairs(), [(7, 20)], "the lookup-update pair");
        // SAFETY: getpid and gettid have no preconditions.
        let me = unsafe { (libc::getpid() as u64) << 32 | libc::gettid() as u64 };
        let total = |key: u64| {
            let mut v = vec![0u8; m.value_buf_size()];
            match m.lookup_elem(&key.to_ne_bytes(), &mut v) {
                Ok(()) => Some(v.chunks(8).map(|c| u64::from_ne_bytes(c.try_into().unwrap())).sum::<u64>()),
                Err(_) => None,
            }
        };
        let mut model = std::collections::HashMap::<u64, u64>::new();
        let vin: [u8; 256] = std::array::from_fn(|i| (i as u8).wrapping_mul(37).wrapping_add(1));
        let mut claimed = 0;
        // Keys repeated (memo hits), changing (misses), deleted from the syscall side, and a
        // key inserted into the element a deleted one left (its memo must not match).
        let steps: Vec<(u64, u64, bool)> = (0..400u64)
            .map(|i| {
                let key = [5, 5, 5, 9, 9, 5, 1000 + i % 7, 5][(i % 8) as usize];
                (key, i + 1, i % 50 == 49)
            })
            .collect();
        for (i, &(key, inc, delete_after)) in steps.iter().enumerate() {
            let mut ctx = [key, inc];
            let engine_jit = i % 3 != 2;
            let r0 = if engine_jit {
                let mut record = [0u64; 3];
                let mut vout = [0u8; 256];
                // SAFETY: the program's claiming entry, its slots' claim and a 16-byte context.
                let r =
                    unsafe { call_with_vectors(entry, ctx.as_mut_ptr() as u64, &claim, &mut record, &vin, &mut vout) };
                assert_eq!(vout, vin, "step {i}: vector registers 0-7 changed by the run");
                if record[0] == userbpf_vm::jit::CLAIM_RETRY {
                    jit.run(ctx.as_mut_ptr().cast(), 16, RunContext::default()).unwrap().unwrap()
                } else {
                    assert_eq!(record[0], 0, "step {i}: {record:?}");
                    claimed += 1;
                    r
                }
            } else {
                interp.run(ctx.as_mut_ptr().cast(), 16, RunContext::default()).unwrap().unwrap()
            };
            assert_eq!(r0, me, "step {i}: r0 (an update failing gives -errno)");
            *model.entry(key).or_default() += inc;
            assert_eq!(total(key), model.get(&key).copied(), "step {i}: key {key}");
            if delete_after {
                m.delete_elem(&key.to_ne_bytes()).unwrap();
                model.remove(&key);
                // Another key takes the freed element (the free list is LIFO per CPU).
                let other = 77_000 + i as u64;
                let mut ctx = [other, 3];
                jit.run(ctx.as_mut_ptr().cast(), 16, RunContext::default()).unwrap();
                model.insert(other, 3);
            }
        }
        assert!(claimed > 200, "only {claimed} runs were claimed");
        for (k, v) in &model {
            assert_eq!(total(*k), Some(*v), "key {k}");
        }

        // A key pointer that faults in the inline memo check (the program takes it from its
        // context): the claimed run ends with the fault at the call, its CPU slot and the
        // thread's run given back (the next claimed run goes ahead), no lock left held.
        let bad = vec![
            Insn::new(BPF_ALU64 | BPF_MOV | BPF_X, 6, 1, 0, 0),
            Insn::new(BPF_LDX | BPF_MEM | BPF_DW, 2, 6, 0, 0),
            Insn::new(OP_LDDW, 1, BPF_PSEUDO_MAP_IDX, 0, 1),
            Insn::new(0, 0, 0, 0, 0),
            Insn::new(OP_CALL, 0, 0, 0, 1),
            Insn::new(BPF_ALU64 | BPF_MOV | BPF_K, 0, 0, 0, 0),
            Insn::new(OP_EXIT, 0, 0, 0, 0),
        ];
        let bad = LoadedProgram::prepare(
            2,
            "bad",
            &bad,
            helpers.clone(),
            &resolver as &dyn MapResolver,
            Engine::Jit,
            slots.clone(),
        )
        .unwrap();
        let (bad_entry, bad_claim) = bad.claim_entry().expect("a claiming entry");
        type Claiming = unsafe extern "C" fn(u64, *const userbpf_vm::jit::SlotClaim, *mut [u64; 3]) -> u64;
        // SAFETY: the program's claiming entry, of this signature.
        let bad_fn = unsafe { std::mem::transmute::<usize, Claiming>(bad_entry) };
        let mut faults = 0;
        for k in 0..20u64 {
            let mut ctx = [if k % 2 == 0 { 8 } else { &k as *const u64 as u64 }, 0];
            let mut record = [0u64; 3];
            // SAFETY: as above; the program reads its key at ctx[0] (a fault is contained).
            unsafe { bad_fn(ctx.as_mut_ptr() as u64, &bad_claim, &mut record) };
            if record[0] == userbpf_vm::jit::CLAIM_RETRY {
                continue;
            }
            if k % 2 == 0 {
                assert_eq!(record[..2], [2, 4], "a fault at the call (instruction 4)");
                faults += 1;
            } else {
                assert_eq!(record[0], 0, "{record:?}");
            }
            assert!(crate::context::current().is_none(), "the run was given back");
        }
        assert!(faults >= 5, "{faults} faulting runs were claimed");
        // The element locks are free: an update through the claimed entry still writes.
        let mut ctx = [5u64, 1];
        let before = total(5).unwrap_or(0);
        let mut record = [0u64; 3];
        let mut vout = [0u8; 256];
        // SAFETY: as above.
        unsafe { call_with_vectors(entry, ctx.as_mut_ptr() as u64, &claim, &mut record, &vin, &mut vout) };
        if record[0] == userbpf_vm::jit::CLAIM_RETRY {
            jit.run(ctx.as_mut_ptr().cast(), 16, RunContext::default()).unwrap();
        }
        assert_eq!(total(5), Some(before + 1));
        let _ = std::fs::remove_dir_all(&dir);
    }
    /// Which helpers let a probe's stub leave the pt_regs past the registers unwritten: the
    /// stack walks, the override, kernel reads (usdt.bpf.h's sp) and tail calls do not.
    #[test]
    fn helpers_reading_only_registers_are_told_apart() {
        let helpers = crate::helpers::registry();
        let slots = Arc::new(CpuSlots::private().unwrap());
        let calling = |ids: &[i32]| {
            let mut p: Vec<Insn> = ids.iter().map(|&id| Insn::new(OP_CALL, 0, 0, 0, id)).collect();
            p.push(Insn::new(OP_EXIT, 0, 0, 0, 0));
            LoadedProgram::prepare(
                1,
                "t",
                &p,
                helpers.clone(),
                &(&[] as &[(u32, Arc<Map>)]) as &dyn MapResolver,
                Engine::Interpreter,
                slots.clone(),
            )
            .unwrap()
            .helpers_read_only_gprs()
        };
        assert!(calling(&[]));
        // ktime_get_ns, get_current_pid_tgid, get_current_uid_gid, get_current_comm (sslsniff's)
        assert!(calling(&[5, 14, 15]));
        // get_stack, get_stackid, override_return, probe_read_kernel, probe_read, tail_call
        for id in [67, 27, 58, 113, 4, 12] {
            assert!(!calling(&[5, id]), "helper {id}");
        }
    }
}
