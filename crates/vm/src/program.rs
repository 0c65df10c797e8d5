//! A checked program: instructions that passed the load-time checks, pseudo `lddw`s
//! resolved, helpers bound, subprograms found. Nothing runs a program that is not one.

use std::sync::Arc;

use thiserror::Error;
use userbpf_isa::helper_names::helper_name;
use userbpf_isa::validate;
use userbpf_isa::*;

use crate::helpers::HelperRegistry;
use crate::memory::MemoryPolicy;

/// Most instruction slots in one program (the kernel's BPF_COMPLEXITY_LIMIT_INSNS).
pub const MAX_INSNS: usize = 1_000_000;
/// Most frames on the call stack at once, the entry frame included (the kernel's MAX_CALL_FRAMES).
pub const MAX_CALL_FRAMES: usize = 8;
/// Bytes of stack each frame gets; r10 points one past its end.
pub const STACK_SIZE: usize = 512;

/// Why a program was refused, with the index of the instruction at fault.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum LoadError {
    #[error("program is empty")]
    Empty,
    #[error("program has {0} instructions, more than the limit of {MAX_INSNS}")]
    TooLong(usize),
    #[error("instruction {index}: {message}")]
    Insn { index: usize, message: String },
}

fn err<T>(index: usize, message: impl Into<String>) -> Result<T, LoadError> {
    Err(LoadError::Insn { index, message: message.into() })
}

/// Resolves pseudo `lddw` instructions (map by fd, map value, map by index, BTF ids) to the
/// 64-bit value the program sees. The object loader implements it over its maps.
pub trait Relocator {
    /// `src` is the pseudo kind (`BPF_PSEUDO_MAP_FD`, ...), `imm` and `next_imm` the two
    /// immediates as the instruction has them (for map values, `next_imm` is the offset).
    fn resolve_lddw(&self, index: usize, src: u8, imm: i32, next_imm: i32) -> Result<u64, String>;

    /// Whether `bpf_map_lookup_elem` on the map at `map_addr` (a value `resolve_lddw` returned
    /// for `BPF_PSEUDO_MAP_FD` or `BPF_PSEUDO_MAP_IDX`) may be done inline, as an index check
    /// and an address computation, instead of calling helper 1, and how. Returning `Some`
    /// promises that helper 1 on this map, with any key, returns exactly what
    /// [`InlineArray::lookup`] computes, for as long as the program lives (as the kernel's
    /// `array_map_gen_lookup`: plain, not per-CPU, arrays). The default inlines nothing.
    fn inline_lookup(&self, map_addr: u64) -> Option<InlineArray> {
        let _ = map_addr;
        None
    }

    /// Whether `bpf_map_update_elem` on the map at `map_addr` may be done inline, and how:
    /// returning `Some` promises that helper 2 on this map, with any key, value and flags, does
    /// exactly what an array's update does (flags beyond `BPF_EXIST` but `BPF_F_LOCK`:
    /// `-EINVAL`; an index `>= max_entries`: `-E2BIG`; `BPF_NOEXIST`: `-EEXIST`; `BPF_F_LOCK`:
    /// `-EINVAL`; else the `elem_size` bytes of the value copied to the element, 8 at a time,
    /// and 0), for as long as the program lives: arrays whose values are a multiple of 8 bytes.
    /// The JIT inlines such updates of up to 64 bytes. The default inlines nothing.
    fn inline_update(&self, map_addr: u64) -> Option<InlineArray> {
        let _ = map_addr;
        None
    }

    /// Whether the JIT may call a function of the map's own for helper `helper_id`
    /// (`map_lookup_elem`, `map_update_elem` or `map_delete_elem`) on the map at `map_addr`,
    /// instead of the helper: returning `Some` promises that `func(arg, r2, r3, r4, cpu)`
    /// returns exactly what the helper returns with r1 = `map_addr` and the same r2..r4 in a
    /// run holding CPU slot `cpu`, reads nothing of the run's state besides its arguments and
    /// never ends the run, for as long as the program lives. The default calls the helpers.
    fn direct_call(&self, map_addr: u64, helper_id: u32) -> Option<DirectCall> {
        let _ = (map_addr, helper_id);
        None
    }

    /// Whether helper `helper_id` returns a per-thread cached word the JIT may read inline
    /// (see [`CachedHelper`]): returning `Some` promises that, while the process's generation
    /// equals the thread's cached one, the helper returns the cached value and does nothing
    /// else, and that the helper reads nothing of the run's state. The default inlines none.
    fn cached_helper(&self, helper_id: u32) -> Option<CachedHelper> {
        let _ = helper_id;
        None
    }
}

/// A map operation the JIT calls directly (see [`Relocator::direct_call`]): the helper's
/// call with `arg` in r1 in place of the map and the run's CPU slot in r5. What the kernel
/// gets by resolving `map->ops->map_lookup_elem` at verification time (its JIT then calls the
/// map type's function, with no dispatch at run time).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DirectCall {
    /// Address of an `unsafe extern "C" fn(arg, r2, r3, r4, cpu) -> u64`.
    pub func: u64,
    pub arg: u64,
    /// For lookups and updates of a per-CPU hash map: where the JIT finds the thread's
    /// lookup memo and the map's elements, to do a memo hit inline and call `func` only on a
    /// miss (see [`HashMemo`]). None: always call `func`.
    pub memo: Option<HashMemo>,
}

/// A per-CPU hash map's lookup memo as generated code reads it (the maps crate's
/// `MemoLayout`, whose documentation is the contract): the thread's words at `thread_words`
/// from the thread pointer (+0 thread id u32, +4 element index u32, +8 map u64, +16 key word
/// u64), element `i` at `elems + i * elem_size` (state byte at `+state`, `linked` when in its
/// chain; lock word at `+lock`; key word at `+key`), its value for CPU slot `c` at `pcpu + c *
/// pcpu_stride + i * value_size`. Keys of `key_size` 1, 2, 4 or 8 bytes; values of
/// `value_size` a multiple of 8, at most 64.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HashMemo {
    pub map: u64,
    pub thread_words: i64,
    pub n_elems: u32,
    pub elems: u64,
    pub elem_size: u32,
    pub state: u32,
    pub linked: u8,
    pub lock: u32,
    pub key: u32,
    pub key_size: u32,
    pub pcpu: u64,
    pub pcpu_stride: u32,
    pub value_size: u32,
}

/// A helper whose result is a word the calling thread caches in its static TLS, valid while
/// a process-wide generation (bumped after a fork) equals the one cached beside it (see
/// [`Relocator::cached_helper`]): the JIT reads the cache inline and calls the helper only
/// when the generations differ.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CachedHelper {
    /// Address of the process's current generation (a u64, never 0).
    pub generation: u64,
    /// Offsets from the thread pointer of the thread's cached generation (u64, 0: none) and
    /// of the cached result (u64).
    pub tls_generation: i64,
    pub tls_value: i64,
}

/// Most bytes of an update the JIT inlines (see [`Relocator::inline_update`]).
pub const INLINE_UPDATE_MAX: u32 = 64;

/// An array map whose lookups are inlined: element `i < max_entries` is at
/// `values + i * elem_size` (plus `cpu * cpu_stride` for a per-CPU array, `cpu` being the
/// run's CPU slot); any other index gives null (0).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct InlineArray {
    /// Address of element 0 (of CPU 0's values for a per-CPU array).
    pub values: u64,
    pub max_entries: u32,
    /// Bytes from one element to the next, 1 to `i32::MAX` (other sizes are not inlined).
    pub elem_size: u32,
    /// Per-CPU arrays: bytes from one CPU's values to the next's, 1 to `i32::MAX`, for every
    /// CPU slot a run can hold. 0: a plain array. Per-CPU lookups are inlined only by the
    /// JIT, and only in programs that load no callback, make no `callx` and call no helper
    /// marked `may_exit` (their runs always go through the fast entry, which is given the
    /// CPU); the interpreter calls the helper.
    pub cpu_stride: u32,
}

impl InlineArray {
    /// What the lookup of index `idx` (the key's 4 bytes, native order) gives.
    #[inline(always)]
    pub fn lookup(&self, idx: u32) -> u64 {
        if idx < self.max_entries { self.values.wrapping_add(idx as u64 * self.elem_size as u64) } else { 0 }
    }
}

/// The helper id of `bpf_map_lookup_elem`.
const MAP_LOOKUP_ELEM: i32 = 1;
/// The helper id of `bpf_map_update_elem`.
const MAP_UPDATE_ELEM: i32 = 2;
/// The helper id of `bpf_map_delete_elem`.
const MAP_DELETE_ELEM: i32 = 3;
/// Most instructions between the `lddw r1, map` and the `call 1` an inlined lookup looks at
/// (clang emits two: `r2 = r10; r2 += -4`).
const INLINE_WINDOW: usize = 8;

/// What a program is loaded with besides its instructions.
#[derive(Clone, Default)]
pub struct LoadOptions {
    /// Helpers the program may call; `call N` to an id not here is refused.
    pub helpers: Arc<HelperRegistry>,
    /// Memory the interpreter lets the program touch besides its stack and the regions of
    /// each run (map values, for example).
    pub memory: Option<Arc<dyn MemoryPolicy>>,
    /// Allow `callx REG` (bpf_conformance's call-by-register; not in the kernel's ISA).
    pub allow_callx: bool,
}

/// A program that passed the checks. Both executors take it.
pub struct Program {
    /// The instruction slots. Pseudo `lddw`s other than `BPF_PSEUDO_FUNC` are rewritten to
    /// plain ones (src 0) holding the resolved value.
    pub(crate) insns: Vec<Insn>,
    pub(crate) helpers: Arc<HelperRegistry>,
    pub(crate) memory: Option<Arc<dyn MemoryPolicy>>,
    /// Start indices of the subprograms, the entry (0) first, ascending.
    pub(crate) subprogs: Vec<usize>,
    /// Deepest chain of frames a run can build, the entry frame included.
    pub(crate) max_depth: usize,
    /// `call 1` sites (ascending pc) that look up an array map the relocator described for
    /// inlining: executors compute the lookup instead of calling the helper.
    pub(crate) inline_lookups: Vec<(usize, InlineArray)>,
    /// The `call 2` (map_update_elem) sites done inline by the JIT, ascending.
    pub(crate) inline_updates: Vec<(usize, InlineArray)>,
    /// The `call 1`, `call 2` and `call 3` sites whose map the JIT calls directly (not
    /// inlined), ascending.
    pub(crate) direct_calls: Vec<(usize, DirectCall)>,
    /// The helper call sites whose cached result the JIT reads inline, ascending.
    pub(crate) cached_helpers: Vec<(usize, CachedHelper)>,
}

impl std::fmt::Debug for Program {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Program")
            .field("insns", &self.insns.len())
            .field("subprogs", &self.subprogs)
            .field("max_depth", &self.max_depth)
            .field("inline_lookups", &self.inline_lookups.len())
            .finish()
    }
}

impl Program {
    /// Checks `insns` and builds a program. `relocator` resolves pseudo `lddw`s; without one
    /// they are refused.
    pub fn load(
        insns: &[Insn],
        options: &LoadOptions,
        relocator: Option<&dyn Relocator>,
    ) -> Result<Program, LoadError> {
        let mut insns = insns.to_vec();
        if insns.is_empty() {
            return Err(LoadError::Empty);
        }
        if insns.len() > MAX_INSNS {
            return Err(LoadError::TooLong(insns.len()));
        }
        // Pass 1: each instruction on its own; find subprogram starts and lddw halves.
        let n = insns.len();
        let mut second_half = vec![false; n];
        let mut subprogs = vec![0usize];
        // Indices of lddws that load a map (by fd or index), ascending.
        let mut map_lddws = Vec::new();
        let mut pc = 0;
        while pc < n {
            let insn = insns[pc];
            check_fields(pc, insn, options)?;
            if insn.is_lddw() {
                if pc + 1 >= n {
                    return err(pc, "lddw is missing its second half at the end of the program");
                }
                let next = insns[pc + 1];
                if next.op != 0 || next.dst != 0 || next.src != 0 || next.off != 0 {
                    return err(pc + 1, "second half of lddw has non-zero opcode, register or offset fields");
                }
                second_half[pc + 1] = true;
                match insn.src {
                    0 => {}
                    BPF_PSEUDO_FUNC => {
                        if next.imm != 0 {
                            return err(pc, "lddw of a function has a non-zero upper immediate");
                        }
                        let target = jump_target(pc, insn.imm as i64);
                        if target < 0 || target >= n as i64 {
                            return err(
                                pc,
                                format!("lddw of a function points to instruction {target}, outside the program"),
                            );
                        }
                        subprogs.push(target as usize);
                    }
                    BPF_PSEUDO_MAP_FD
                    | BPF_PSEUDO_MAP_VALUE
                    | BPF_PSEUDO_BTF_ID
                    | BPF_PSEUDO_MAP_IDX
                    | BPF_PSEUDO_MAP_IDX_VALUE => {
                        let Some(r) = relocator else {
                            return err(
                                pc,
                                format!(
                                    "lddw with pseudo source {} ({}) needs a relocation, and none was given",
                                    insn.src,
                                    pseudo_name(insn.src)
                                ),
                            );
                        };
                        let value = r.resolve_lddw(pc, insn.src, insn.imm, next.imm).or_else(|m| err(pc, m))?;
                        insns[pc] = Insn { src: 0, imm: value as u32 as i32, ..insn };
                        insns[pc + 1].imm = (value >> 32) as u32 as i32;
                        if matches!(insn.src, BPF_PSEUDO_MAP_FD | BPF_PSEUDO_MAP_IDX) {
                            map_lddws.push(pc);
                        }
                    }
                    s => return err(pc, format!("lddw with unknown pseudo source {s}")),
                }
                pc += 2;
                continue;
            }
            if insn.op == OP_CALL && insn.src == BPF_PSEUDO_CALL {
                let target = jump_target(pc, insn.imm as i64);
                if target < 0 || target >= n as i64 {
                    return err(pc, format!("call to instruction {target}, outside the program of {n} instructions"));
                }
                subprogs.push(target as usize);
            }
            pc += 1;
        }
        subprogs.sort_unstable();
        subprogs.dedup();
        for &s in &subprogs {
            if second_half[s] {
                return err(s, "a call target is the second half of an lddw");
            }
        }
        // Pass 2: control flow within each subprogram.
        let sub_of = |pc: usize| subprogs.partition_point(|&s| s <= pc) - 1;
        for (k, &start) in subprogs.iter().enumerate() {
            let end = subprogs.get(k + 1).copied().unwrap_or(n);
            let mut last = end - 1;
            if second_half[last] {
                last -= 1;
            }
            let l = insns[last];
            if !(l.op == OP_EXIT || l.op == OP_JA || l.op == OP_JA32) {
                return err(
                    last,
                    format!(
                        "the last instruction of the {} is not exit or an unconditional jump, so execution could fall off its end",
                        if start == 0 { "program".to_string() } else { format!("function at instruction {start}") }
                    ),
                );
            }
        }
        for pc in 0..n {
            let insn = insns[pc];
            if second_half[pc] || !insn.is_jump() {
                continue;
            }
            let rel = if insn.op == OP_JA32 { insn.imm as i64 } else { insn.off as i64 };
            let target = jump_target(pc, rel);
            if target < 0 || target >= n as i64 {
                return err(pc, format!("jump to instruction {target}, outside the program of {n} instructions"));
            }
            let target = target as usize;
            if second_half[target] {
                return err(pc, format!("jump into the middle of the lddw at instruction {}", target - 1));
            }
            if sub_of(target) != sub_of(pc) {
                return err(
                    pc,
                    format!(
                        "jump to instruction {target} leaves the function that starts at instruction {}",
                        subprogs[sub_of(pc)]
                    ),
                );
            }
        }
        // Pass 3: call graph depth; recursion is refused as the kernel refuses it.
        let mut callees: Vec<Vec<(usize, usize)>> = vec![Vec::new(); subprogs.len()];
        for pc in 0..n {
            let insn = insns[pc];
            if !second_half[pc] && insn.op == OP_CALL && insn.src == BPF_PSEUDO_CALL {
                let t = jump_target(pc, insn.imm as i64) as usize;
                callees[sub_of(pc)].push((sub_of(t), pc));
            }
        }
        let max_depth = call_depth(&subprogs, &callees)?;
        let (inline_lookups, inline_updates, direct_calls) = match relocator {
            Some(r) if !map_lddws.is_empty() => {
                let fits = |a: InlineArray| {
                    a.elem_size != 0 && a.elem_size <= i32::MAX as u32 && a.cpu_stride <= i32::MAX as u32
                };
                let site = |id, name, f: &dyn Fn(u64) -> Option<InlineArray>| {
                    inline_sites(&insns, &second_half, &subprogs, &map_lddws, options, id, name, &|m| {
                        f(m).filter(|&a| fits(a))
                    })
                };
                let mut lookups = site(MAP_LOOKUP_ELEM, "map_lookup_elem", &|m| r.inline_lookup(m));
                let mut updates = site(MAP_UPDATE_ELEM, "map_update_elem", &|m| {
                    r.inline_update(m).filter(|a| a.elem_size <= INLINE_UPDATE_MAX && a.elem_size % 8 == 0)
                });
                let mut direct = Vec::new();
                if percpu_inline_allowed(&insns, &second_half, options) {
                    // Direct calls need the run's CPU, which only the fast entry's runs keep.
                    for (id, name) in [
                        (MAP_LOOKUP_ELEM, "map_lookup_elem"),
                        (MAP_UPDATE_ELEM, "map_update_elem"),
                        (MAP_DELETE_ELEM, "map_delete_elem"),
                    ] {
                        direct.extend(
                            inline_sites(&insns, &second_half, &subprogs, &map_lddws, options, id, name, &|m| {
                                r.direct_call(m, id as u32)
                            })
                            .into_iter()
                            .filter(|(pc, _)| !lookups.iter().chain(&updates).any(|(p, _)| p == pc)),
                        );
                    }
                    direct.sort_unstable_by_key(|&(pc, _)| pc);
                } else {
                    lookups.retain(|(_, a)| a.cpu_stride == 0);
                    updates.retain(|(_, a)| a.cpu_stride == 0);
                }
                (lookups, updates, direct)
            }
            _ => (Vec::new(), Vec::new(), Vec::new()),
        };
        let mut cached_helpers = Vec::new();
        if let Some(r) = relocator {
            for pc in 0..n {
                let insn = insns[pc];
                if second_half[pc] || insn.op != OP_CALL || insn.src != 0 {
                    continue;
                }
                if let Some(c) = r.cached_helper(insn.imm as u32).filter(|c| c.generation != 0) {
                    cached_helpers.push((pc, c));
                }
            }
        }
        Ok(Program {
            insns,
            helpers: options.helpers.clone(),
            memory: options.memory.clone(),
            subprogs,
            max_depth,
            inline_lookups,
            inline_updates,
            direct_calls,
            cached_helpers,
        })
    }

    /// The inlined array lookup of the `call 1` at `pc`, if it is one.
    pub fn inline_lookup_at(&self, pc: usize) -> Option<InlineArray> {
        self.inline_lookups.binary_search_by_key(&pc, |&(p, _)| p).ok().map(|i| self.inline_lookups[i].1)
    }

    /// The update of the `call 2` at `pc` the JIT does inline, if it is one.
    pub fn inline_update_at(&self, pc: usize) -> Option<InlineArray> {
        self.inline_updates.binary_search_by_key(&pc, |&(p, _)| p).ok().map(|i| self.inline_updates[i].1)
    }

    /// The direct call the JIT makes for the map helper call at `pc`, if it makes one (see
    /// [`Relocator::direct_call`]).
    pub fn direct_call_at(&self, pc: usize) -> Option<DirectCall> {
        self.direct_calls.binary_search_by_key(&pc, |&(p, _)| p).ok().map(|i| self.direct_calls[i].1)
    }

    /// The cached helper read inline at the `call` at `pc`, if it is one (see
    /// [`Relocator::cached_helper`]).
    pub fn cached_helper_at(&self, pc: usize) -> Option<CachedHelper> {
        self.cached_helpers.binary_search_by_key(&pc, |&(p, _)| p).ok().map(|i| self.cached_helpers[i].1)
    }

    /// Every map helper call the JIT makes directly: `(pc of the call, call)`, ascending.
    pub fn direct_calls(&self) -> &[(usize, DirectCall)] {
        &self.direct_calls
    }

    /// Every update site the JIT does inline: `(pc of the call, map)`, ascending.
    pub fn inline_updates(&self) -> &[(usize, InlineArray)] {
        &self.inline_updates
    }

    /// Every inlined lookup site: `(pc of the call, map)`, ascending.
    pub fn inline_lookups(&self) -> &[(usize, InlineArray)] {
        &self.inline_lookups
    }

    /// The instruction slots as the executors run them.
    pub fn insns(&self) -> &[Insn] {
        &self.insns
    }
    pub fn helpers(&self) -> &Arc<HelperRegistry> {
        &self.helpers
    }
    pub fn memory_policy(&self) -> Option<&Arc<dyn MemoryPolicy>> {
        self.memory.as_ref()
    }
    /// Start indices of the subprograms, 0 first.
    pub fn subprogs(&self) -> &[usize] {
        &self.subprogs
    }
    /// Deepest chain of frames a run can build, the entry frame included.
    pub fn max_depth(&self) -> usize {
        self.max_depth
    }

    /// How far into its context (the r1 it starts with) the program can read, when every use
    /// of the context is a load at a known non-negative offset: the end of the furthest byte
    /// it loads (0: it never reads it). `None` when the context escapes that analysis: it is
    /// written, stored to memory, passed to a call (but to a helper that takes no argument),
    /// changed by arithmetic, read by a legacy packet load, or the program has subprograms or
    /// `callx`. A forward data-flow over the instructions (which registers may hold the
    /// context at each one), so a register that held the context and was overwritten (as r1
    /// is, by the first map pointer) no longer counts. Probe stubs use it to leave unwritten what a program cannot read.
    pub fn ctx_read_extent(&self) -> Option<u32> {
        ctx_read_extent(&self.insns)
    }

    /// Which 8-byte words of its context the program can read, under the same analysis as
    /// [`Self::ctx_read_extent`]: bit `i` set when some load touches bytes `8*i..8*i+8` (a
    /// load straddling two words sets both). `None` when that analysis gives up, or a load
    /// reaches past the first 512 bytes. A probe's stub stores only those registers of the
    /// `pt_regs` (`userbpf_hook::LeanHandler::regs_read`).
    pub fn ctx_read_words(&self) -> Option<u64> {
        ctx_reads(&self.insns).and_then(|(_, words)| words)
    }
}

/// See [`Program::ctx_read_extent`].
fn ctx_read_extent(insns: &[Insn]) -> Option<u32> {
    ctx_reads(insns).map(|(extent, _)| extent)
}

/// [`Program::ctx_read_extent`] and [`Program::ctx_read_words`] (`None` in the second: a load
/// past 512 bytes).
fn ctx_reads(insns: &[Insn]) -> Option<(u32, Option<u64>)> {
    let n = insns.len();
    // Per instruction: the registers (bit r) that may hold the context on entry to it; None
    // when not reached yet.
    let mut state: Vec<Option<u16>> = vec![None; n];
    let mut work = vec![0usize];
    if n == 0 {
        return Some((0, Some(0)));
    }
    state[0] = Some(1 << 1);
    let mut extent = 0u32;
    let mut words = Some(0u64);
    let bit = |r: u8| 1u16 << (r & 15);
    while let Some(pc) = work.pop() {
        let m = state[pc]?;
        let i = insns[pc];
        let class = i.op & 0x07;
        let (dst, src) = (bit(i.dst), bit(i.src));
        let mut out = m & !dst;
        let mut next: [Option<usize>; 2] = [Some(pc + 1), None];
        match class {
            BPF_ALU | BPF_ALU64 => {
                let is_x = i.op & BPF_X != 0;
                if i.op & 0xf0 == BPF_MOV {
                    // A move overwrites dst; only a plain 64-bit copy keeps the context.
                    if is_x && m & src != 0 {
                        if class != BPF_ALU64 || i.off != 0 {
                            return None;
                        }
                        out = m | dst;
                    }
                } else if m & dst != 0 || (is_x && m & src != 0) {
                    return None;
                }
            }
            BPF_LDX => {
                let mode = i.op & 0xe0;
                if mode != BPF_MEM && mode != BPF_MEMSX {
                    return None;
                }
                if m & src != 0 {
                    let size = match i.op & 0x18 {
                        BPF_B => 1,
                        BPF_H => 2,
                        BPF_W => 4,
                        _ => 8,
                    };
                    if i.off < 0 {
                        return None;
                    }
                    let (first, last) = (i.off as u32 / 8, (i.off as u32 + size - 1) / 8);
                    extent = extent.max(i.off as u32 + size);
                    words = words.filter(|_| last < 64).map(|w| w | ((u64::MAX >> (63 - last)) & (u64::MAX << first)));
                }
            }
            BPF_LD => {
                if i.op != (BPF_LD | BPF_IMM | BPF_DW) {
                    // Legacy packet loads: read r6 as the context, clobber r0-r5.
                    return None;
                }
                next[0] = Some(pc + 2);
            }
            BPF_ST => {
                if m & dst != 0 {
                    return None;
                }
                out = m;
            }
            BPF_STX => {
                if m & (dst | src) != 0 {
                    return None;
                }
                out = m;
                if i.op & 0xe0 == BPF_ATOMIC {
                    // Fetching atomics write src (or r0).
                    out = m & !(src | 1);
                }
            }
            _ => {
                // BPF_JMP, BPF_JMP32.
                let code = i.op & 0xf0;
                out = m;
                match code {
                    BPF_CALL => {
                        // Helpers that take no argument read none of r1-r5 (ktime_get_ns,
                        // get_prandom_u32, get_smp_processor_id, get_current_pid_tgid,
                        // get_current_uid_gid, ktime_get_boot_ns).
                        let no_args = i.src == 0 && matches!(i.imm, 5 | 7 | 8 | 14 | 15 | 125);
                        if class != BPF_JMP
                            || i.op & BPF_X != 0
                            || i.src == BPF_PSEUDO_CALL
                            || (!no_args && m & 0b11_1110 != 0)
                        {
                            return None;
                        }
                        out = m & !0b11_1111;
                    }
                    BPF_EXIT => next[0] = None,
                    BPF_JA => {
                        let rel = if class == BPF_JMP32 { i.imm as i64 } else { i.off as i64 };
                        next[0] = Some(usize::try_from(pc as i64 + 1 + rel).ok()?);
                    }
                    _ => next[1] = Some(usize::try_from(pc as i64 + 1 + i.off as i64).ok()?),
                }
            }
        }
        for t in next.into_iter().flatten() {
            if t >= n {
                return None;
            }
            let merged = state[t].map_or(out, |s| s | out);
            if state[t] != Some(merged) {
                state[t] = Some(merged);
                work.push(t);
            }
        }
    }
    Some((extent, words))
}

/// The `call 1` (map_lookup_elem) sites whose map is known for certain and described by the
/// relocator for inlining. A site qualifies when r1 was set by an `lddw` of a map at most
/// [`INLINE_WINDOW`] instructions before it, in a straight line: nothing in between (the call
/// included) is a jump target or a function start, and everything in between is an ALU
/// operation, a load or a plain store that does not write r1. Only when helper 1 of the
/// registry is `map_lookup_elem` and does not end runs (its inline form never does).
#[allow(clippy::too_many_arguments)]
fn inline_sites<T>(
    insns: &[Insn],
    second_half: &[bool],
    subprogs: &[usize],
    map_lddws: &[usize],
    options: &LoadOptions,
    helper_id: i32,
    helper_name: &str,
    describe: &dyn Fn(u64) -> Option<T>,
) -> Vec<(usize, T)> {
    match options.helpers.get(helper_id as u32) {
        Some(h) if h.name == helper_name && !h.may_exit => {}
        _ => return Vec::new(),
    }
    let n = insns.len();
    let mut target = vec![false; n];
    for &s in subprogs {
        target[s] = true;
    }
    for pc in 0..n {
        let insn = insns[pc];
        if second_half[pc] || !insn.is_jump() {
            continue;
        }
        let rel = if insn.op == OP_JA32 { insn.imm as i64 } else { insn.off as i64 };
        // Checked in range by `load`.
        target[jump_target(pc, rel) as usize] = true;
    }
    let mut sites = Vec::new();
    for &l in map_lddws {
        if insns[l].dst != 1 {
            continue;
        }
        let mut pc = l + 2;
        while pc < n && pc <= l + 2 + INLINE_WINDOW && !target[pc] {
            let i = insns[pc];
            if i.op == OP_CALL && i.src == 0 && i.imm == helper_id {
                let map = insns[l].wide_imm(insns[l + 1]);
                if let Some(a) = describe(map) {
                    sites.push((pc, a));
                }
                break;
            }
            let keeps_r1 = match i.class() {
                BPF_ALU | BPF_ALU64 | BPF_LDX => i.dst != 1,
                BPF_ST => true,
                BPF_STX => i.mode() == BPF_MEM,
                _ => false,
            };
            if !keeps_r1 {
                break;
            }
            pc += 1;
        }
    }
    sites
}

/// Whether per-CPU lookups may be inlined (see [`InlineArray::cpu_stride`]): the program loads
/// no callback, makes no `callx` and calls no helper marked `may_exit`, so the JIT gives it a
/// fast entry, which knows the run's CPU.
fn percpu_inline_allowed(insns: &[Insn], second_half: &[bool], options: &LoadOptions) -> bool {
    insns.iter().enumerate().all(|(pc, i)| {
        if second_half[pc] {
            return true;
        }
        if i.is_lddw() {
            return i.src != BPF_PSEUDO_FUNC;
        }
        if i.op == OP_CALLX {
            return false;
        }
        if i.op == OP_CALL && i.src == 0 {
            return !options.helpers.get(i.imm as u32).is_some_and(|h| h.may_exit);
        }
        true
    })
}

fn jump_target(pc: usize, rel: i64) -> i64 {
    pc as i64 + 1 + rel
}

fn pseudo_name(src: u8) -> &'static str {
    match src {
        BPF_PSEUDO_MAP_FD => "map by fd",
        BPF_PSEUDO_MAP_VALUE => "map value",
        BPF_PSEUDO_BTF_ID => "BTF id",
        BPF_PSEUDO_FUNC => "function",
        BPF_PSEUDO_MAP_IDX => "map by index",
        BPF_PSEUDO_MAP_IDX_VALUE => "map value by index",
        _ => "unknown",
    }
}

/// Longest chain of frames from the entry, or an error for recursion or too deep a chain.
fn call_depth(subprogs: &[usize], callees: &[Vec<(usize, usize)>]) -> Result<usize, LoadError> {
    // Iterative DFS over subprograms; depth counts frames.
    fn visit(
        s: usize,
        depth: usize,
        on_path: &mut Vec<bool>,
        best: &mut Vec<usize>,
        subprogs: &[usize],
        callees: &[Vec<(usize, usize)>],
    ) -> Result<usize, LoadError> {
        if best[s] != 0 {
            // Deepest chain below s is known.
            let d = depth + best[s] - 1;
            return Ok(d);
        }
        on_path[s] = true;
        let mut below = 1usize;
        for &(t, pc) in &callees[s] {
            if on_path[t] {
                return err(pc, format!("recursive call to the function at instruction {}", subprogs[t]));
            }
            if depth + 1 > MAX_CALL_FRAMES {
                return err(pc, format!("call chain is more than {MAX_CALL_FRAMES} frames deep"));
            }
            let d = visit(t, depth + 1, on_path, best, subprogs, callees)?;
            below = below.max(d - depth + 1);
        }
        on_path[s] = false;
        best[s] = below;
        Ok(depth + below - 1)
    }
    let mut on_path = vec![false; subprogs.len()];
    let mut best = vec![0usize; subprogs.len()];
    let deepest = visit(0, 1, &mut on_path, &mut best, subprogs, callees)?;
    if deepest > MAX_CALL_FRAMES {
        return err(0, format!("call chain is {deepest} frames deep, more than {MAX_CALL_FRAMES}"));
    }
    // Functions reached only as callbacks (lddw of a function) are entries of their own.
    for s in 0..subprogs.len() {
        if best[s] == 0 {
            let d = visit(s, 1, &mut on_path, &mut best, subprogs, callees)?;
            if d > MAX_CALL_FRAMES {
                return err(subprogs[s], format!("call chain is {d} frames deep, more than {MAX_CALL_FRAMES}"));
            }
        }
    }
    Ok(deepest.max(best.iter().copied().max().unwrap_or(1)))
}

/// The checks one instruction passes on its own: a valid encoding (known opcode, registers in
/// range, unused fields zero), no write to r10, and calls this VM can make.
fn check_fields(pc: usize, insn: Insn, options: &LoadOptions) -> Result<(), LoadError> {
    validate::check_insn(insn).or_else(|m| err(pc, m))?;
    let writes_dst = match insn.class() {
        BPF_ALU | BPF_ALU64 | BPF_LDX => true,
        BPF_LD => insn.is_lddw(),
        _ => false,
    };
    if writes_dst && insn.dst == FRAME_REG {
        return err(pc, "r10 is the read-only frame pointer and cannot be written");
    }
    if insn.class() == BPF_LD && !insn.is_lddw() {
        return err(pc, "legacy packet loads (BPF_LD_ABS/BPF_LD_IND) are not supported");
    }
    if insn.op == OP_CALLX && !options.allow_callx {
        return err(pc, "callx (call by register) is not part of the kernel's instruction set");
    }
    if insn.op == OP_CALL {
        match insn.src {
            0 => {
                let id = insn.imm as u32;
                if options.helpers.get(id).is_none() {
                    return err(
                        pc,
                        match helper_name(id) {
                            Some(name) => format!("helper bpf_{name} (id {id}) is not supported"),
                            None => format!("call to unknown helper id {}", insn.imm),
                        },
                    );
                }
            }
            BPF_PSEUDO_KFUNC_CALL => return err(pc, format!("kfunc calls (BTF id {}) are not supported", insn.imm)),
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod ctx_extent_tests {
    use super::ctx_read_extent;
    use userbpf_isa::*;

    const EXIT: Insn = Insn { op: BPF_JMP | BPF_EXIT, dst: 0, src: 0, off: 0, imm: 0 };
    fn ldx(dst: u8, src: u8, off: i16) -> Insn {
        Insn::new(BPF_LDX | BPF_MEM | BPF_DW, dst, src, off, 0)
    }
    fn mov(dst: u8, src: u8) -> Insn {
        Insn::new(BPF_ALU64 | BPF_X | BPF_MOV, dst, src, 0, 0)
    }
    fn movk(dst: u8, imm: i32) -> Insn {
        Insn::new(BPF_ALU64 | BPF_K | BPF_MOV, dst, 0, 0, imm)
    }
    fn call(id: i32) -> Insn {
        Insn::new(BPF_JMP | BPF_CALL, 0, 0, 0, id)
    }

    #[test]
    fn loads_at_known_offsets_give_their_extent() {
        // bpftrace's `hist(arg0)` shape: arg0 read, then r1 reused for a map.
        let lddw = [Insn::new(BPF_LD | BPF_IMM | BPF_DW, 1, 1, 0, 7), Insn::new(0, 0, 0, 0, 0)];
        let p = [ldx(6, 1, 112), lddw[0], lddw[1], movk(2, 0), call(1), ldx(0, 1, 200), movk(0, 0), EXIT];
        // r1 after the call is no longer the context: only the first load counts.
        assert_eq!(ctx_read_extent(&p), Some(120));
        assert_eq!(ctx_read_extent(&[movk(0, 0), EXIT]), Some(0));
        // bpftrace's count(): r1 = 0 first (the context overwritten, never read).
        assert_eq!(ctx_read_extent(&[movk(1, 0), ldx(0, 1, 200), EXIT]), Some(0));
        // Through a copy, and a 4-byte load.
        let p = [mov(6, 1), Insn::new(BPF_LDX | BPF_MEM | BPF_W, 0, 6, 128, 0), EXIT];
        assert_eq!(ctx_read_extent(&p), Some(132));
    }

    #[test]
    fn the_words_read_are_those_the_loads_touch() {
        use super::ctx_reads;
        let words = |p: &[Insn]| ctx_reads(p).and_then(|(_, w)| w);
        // arg0 (di, word 14), then r1 reused.
        assert_eq!(words(&[ldx(6, 1, 112), movk(1, 0), ldx(0, 1, 8), EXIT]), Some(1 << 14));
        assert_eq!(words(&[movk(1, 0), ldx(0, 1, 200), EXIT]), Some(0));
        // Two loads, one of them 4 bytes into word 16 (ip).
        let p = [ldx(2, 1, 40), Insn::new(BPF_LDX | BPF_MEM | BPF_W, 0, 1, 132, 0), EXIT];
        assert_eq!(words(&p), Some((1 << 5) | (1 << 16)));
        // A load straddling two words sets both.
        assert_eq!(words(&[Insn::new(BPF_LDX | BPF_MEM | BPF_W, 0, 1, 6, 0), EXIT]), Some(0b11));
        // Past 512 bytes: no mask, the extent still known.
        assert_eq!(ctx_reads(&[ldx(0, 1, 512), EXIT]), Some((520, None)));
        // A store to the context: nothing.
        assert_eq!(words(&[Insn::new(BPF_STX | BPF_MEM | BPF_DW, 1, 0, 0, 0), EXIT]), None);
    }

    #[test]
    fn paths_merge() {
        // if r0 == 0 { r2 = r1 } else { r2 = 0 }; r0 = *(r2 + 144)
        let p = [
            movk(0, 0),
            Insn::new(BPF_JMP | BPF_K | BPF_JEQ, 0, 0, 2, 0),
            movk(2, 0),
            Insn::new(BPF_JMP | BPF_JA, 0, 0, 1, 0),
            mov(2, 1),
            ldx(0, 2, 144),
            EXIT,
        ];
        assert_eq!(ctx_read_extent(&p), Some(152));
    }

    #[test]
    fn escapes_are_unknown() {
        // Passed to a helper.
        assert_eq!(ctx_read_extent(&[call(14), EXIT]), Some(0), "get_current_pid_tgid takes no argument");
        assert_eq!(ctx_read_extent(&[call(1), EXIT]), None);
        assert_eq!(ctx_read_extent(&[mov(6, 1), call(14), mov(3, 6), call(2), EXIT]), None);
        // Spilled to the stack.
        assert_eq!(ctx_read_extent(&[Insn::new(BPF_STX | BPF_MEM | BPF_DW, 10, 1, -8, 0), movk(0, 0), EXIT]), None);
        // Pointer arithmetic.
        assert_eq!(ctx_read_extent(&[Insn::new(BPF_ALU64 | BPF_K | BPF_ADD, 1, 0, 0, 8), movk(0, 0), EXIT]), None);
        // Written (a register write through the context).
        assert_eq!(ctx_read_extent(&[Insn::new(BPF_ST | BPF_MEM | BPF_DW, 1, 0, 112, 5), movk(0, 0), EXIT]), None);
        // A negative offset.
        assert_eq!(ctx_read_extent(&[ldx(0, 1, -8), EXIT]), None);
        // A bpf-to-bpf call.
        assert_eq!(
            ctx_read_extent(&[Insn::new(BPF_JMP | BPF_CALL, 0, BPF_PSEUDO_CALL, 0, 1), EXIT, movk(0, 0), EXIT]),
            None
        );
    }
}
