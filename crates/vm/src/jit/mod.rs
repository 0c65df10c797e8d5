//! The x86-64 JIT.
//!
//! [`JitProgram::compile`] translates a checked [`Program`] into native code
//! (`compile.rs` drives the `emit.rs` encoder) and maps it executable (`exec.rs`). The
//! generated code follows the same semantics as the interpreter (RFC 9669, no trap on division
//! by zero or overflow) but does not check memory accesses: the caller of
//! [`JitProgram::run`] vouches for them.
//!
//! See `compile.rs` for the register map, the frame layout and the abort path.
//! In short: eBPF registers live in x86 registers (r0 = rax, r1..r5 = rdi, rsi, rdx, rcx, r8,
//! r6..r9 = rbx, r13, r14, r15, r10 = rbp); every subprogram is a native function with its
//! own 512-byte stack, reached by `call`; every subprogram also has a C-callable entry
//! (`extern "C" fn(u64, u64, u64, u64, u64) -> u64`), which is how runs start and how
//! helpers call callbacks; r12 holds the stack pointer of the innermost entry, to which the
//! abort path unwinds.
//!
//! # Faults
//!
//! JIT code does not check memory accesses, but a fault does not kill the process: each
//! program's code is registered with the fault handler of [`guard`], with a
//! table from native offsets to eBPF instruction indices. A SIGSEGV or SIGBUS whose
//! instruction pointer is inside an instruction's code resumes at the abort path, and the run
//! returns [`VmError::Fault`] with the instruction's index and the faulting address. Faults
//! elsewhere (in a helper the code called, in Rust code) are not the JIT's and go to the
//! handler that was installed before (by default, the process dies as it would without us).
//! At most [`guard::MAX_RANGES`] (minus 2) programs can be
//! compiled at once; `compile` fails beyond that.
//!
//! # Callbacks and depth
//!
//! [`callback::invoke`](crate::callback::invoke) calls a subprogram's entry directly. The
//! JIT does not count frames at run time (the load-time check bounds bpf-to-bpf chains), so
//! it limits callbacks by nesting instead: a callback may run while fewer than
//! `MAX_CALL_FRAMES - 1` callbacks of the same run are active, which bounds the native stack.
//! (The interpreter counts every frame, so a callback nested inside deep bpf-to-bpf chains
//! may get [`VmError::CallDepth`] there and not here.)

mod compile;
mod emit;
mod exec;
mod preserve;

use std::sync::Arc;

use crate::guard::{self, FaultContext, RangeId};
use crate::run::{self, RunCtx, RunKind};
use crate::{Program, VmError};

use compile::{ABORT_FAULT, ABORT_UNKNOWN_HELPER, NO_PC, Options, Runtime};
use exec::ExecMemory;

/// A program compiled to native code, mapped executable and never writable at once.
pub struct JitProgram {
    /// Kept alive for the code: `callx` reads the helper registry's `fn_table` and calls
    /// embed helper addresses.
    prog: Arc<Program>,
    mem: ExecMemory,
    /// Offset of each subprogram's C-callable entry, in `Program::subprogs` order (ascending).
    entries: Vec<usize>,
    /// Offset of the fast run entry, for programs whose runs need no run state (compile.rs,
    /// `Output::fast_entry`).
    fast_entry: Option<usize>,
    /// Runs call helpers or inline per-CPU lookups (`Output::needs_context`).
    needs_context: bool,
    /// Offset of `Entry(0)` taking the run's CPU (`Output::cpu_entry`).
    cpu_entry: usize,
    /// Offset of the claiming entry (`Output::claim_entry`).
    claim_entry: Option<usize>,
    /// The claiming entry's runs may call out (`Output::calls_out`).
    calls_out: bool,
    /// `Output::memo_pairs`.
    memo_pairs: Vec<(usize, usize)>,
    /// Read by the fault handler through the registered range; boxed so that its address
    /// stays put when the `JitProgram` moves.
    _faults: Box<FaultMap>,
    /// The code's range in the fault handler's table; removed on drop.
    range: Option<RangeId>,
}

/// What the fault handler needs to turn a fault in the code into an abort.
struct FaultMap {
    /// Address of the first byte of code.
    start: usize,
    /// Address of the abort path.
    abort: usize,
    /// Offsets where instructions' code starts, ascending, and the instruction there
    /// (`NO_PC`: code of no instruction).
    offs: Box<[u32]>,
    pcs: Box<[u32]>,
}

/// The fault handler's fixup for JIT code (see [`guard::DynamicFixup`]): finds the instruction
/// whose code faulted and resumes at the abort path with r9 = `ABORT_FAULT`, r10 = its index,
/// r11 = the faulting address. Faults outside instructions' code are not handled.
/// Async-signal-safe: a binary search and register writes, no allocation, no panics.
///
/// # Safety
/// `data` is the address of the `FaultMap` of a live `JitProgram` (it is, from registration
/// until `drop` removes the range).
unsafe fn on_fault(data: usize, fault: &mut FaultContext) -> bool {
    // SAFETY: per the contract above, `data` points to a FaultMap that outlives this call.
    let map = unsafe { &*(data as *const FaultMap) };
    let Some(off) = fault.ip().checked_sub(map.start) else { return false };
    let i = map.offs.partition_point(|&o| o as usize <= off);
    let Some(&pc) = i.checked_sub(1).and_then(|i| map.pcs.get(i)) else { return false };
    if pc == NO_PC {
        return false;
    }
    let addr = fault.fault_addr() as u64;
    fault.set_reg(libc::REG_R9, ABORT_FAULT);
    fault.set_reg(libc::REG_R10, pc as u64);
    fault.set_reg(libc::REG_R11, addr);
    fault.set_ip(map.abort);
    true
}

/// Called by the JIT's abort path (after it unwound to the innermost entry) to record why
/// the run stops. Only the first error of a run is kept.
extern "C" fn record_abort(kind: u64, pc: u64, detail: u64) {
    run::record_error(abort_error(kind, pc, detail));
}

fn abort_error(kind: u64, pc: u64, detail: u64) -> VmError {
    let pc = pc as usize;
    match kind {
        ABORT_UNKNOWN_HELPER => VmError::UnknownHelper { pc, id: detail },
        ABORT_FAULT => VmError::Fault { pc, addr: detail },
        k => VmError::Jit(format!("run aborted at instruction {pc} for an unknown reason ({k})")),
    }
}

pub use compile::CLAIM_RETRY;

/// What the claiming entry ([`JitProgram::claim_entry_address`]) needs to claim a CPU slot by
/// itself, with no call: where the slots are, and the thread-local words it reads and writes,
/// as offsets from the thread pointer (`fs`) valid in every thread (static TLS).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct SlotClaim {
    /// Address of slot 0's 32-bit owner word (0: free, else the holder's thread id); slot `i`'s
    /// is `64 * i` bytes further. Only ever changed by a compare-and-swap from 0 to a thread
    /// id (claim) and a store of 0 by the holder (give back).
    pub slots: u64,
    /// Slots (the possible CPUs).
    pub nr: u32,
    /// Non-zero: glibc registered restartable sequences, and `rseq_cpu` is valid.
    pub have_rseq: u32,
    /// TLS offset of the `cpu_id` field of the thread's `struct rseq` (`__rseq_offset + 4`):
    /// the CPU the thread runs on, kept current by the kernel.
    pub rseq_cpu: i64,
    /// TLS offset of the byte saying a run is in progress on the thread (non-zero), which the
    /// entry sets while it runs.
    pub active: i64,
    /// TLS offset of the thread's id as a 32-bit word (0: not known yet).
    pub tid: i64,
}

/// The fast entry's signature: r1, r2, where an abort is recorded (`[kind, pc, detail]`), the
/// run's CPU slot.
type FastEntry = unsafe extern "C" fn(u64, u64, *mut [u64; 3], u64) -> u64;

impl JitProgram {
    /// Compiles a checked program.
    pub fn compile(prog: Arc<Program>) -> Result<JitProgram, VmError> {
        Self::compile_with(prog, Options::detect())
    }

    /// Compiles a checked program whose claiming entry will only ever be given `claim` (the
    /// process's, see [`SlotClaim`]): that entry then reads its words at constant offsets and
    /// ignores the `SlotClaim` argument (fewer instructions on every probe hit).
    pub fn compile_claiming(prog: Arc<Program>, claim: SlotClaim) -> Result<JitProgram, VmError> {
        Self::compile_with(prog, Options { claim: Some(claim), ..Options::detect() })
    }

    pub(crate) fn compile_with(prog: Arc<Program>, opts: Options) -> Result<JitProgram, VmError> {
        if !cfg!(all(target_arch = "x86_64", unix)) {
            return Err(VmError::Jit("the JIT only supports x86-64 on Unix".into()));
        }
        let rt = Runtime {
            abort_fn: record_abort as extern "C" fn(u64, u64, u64) as usize as u64,
            after_helper_fn: run::jit_after_helper as extern "C" fn(u64) -> run::AfterHelper as usize as u64,
            preserving_call: preserve::address(),
        };
        // Compiled once without knowing where it will lie, then again for the mapping made
        // for that length, with direct calls (see compile.rs, "Calls"): never longer.
        let first = compile::compile(&prog, opts, rt).map_err(VmError::Jit)?;
        let reserved = ExecMemory::reserve(first.code.len(), rt.abort_fn as usize)?;
        let placed = Options { code_base: Some(reserved.addr() as u64), ..opts };
        let out = match compile::compile(&prog, placed, rt) {
            Ok(o) if o.code.len() <= reserved.capacity() => o,
            _ => first,
        };
        let mem = reserved.place(&out.code)?;
        let (offs, pcs): (Vec<u32>, Vec<u32>) = out.pc_map.into_iter().unzip();
        let faults = Box::new(FaultMap {
            start: mem.addr(),
            abort: mem.addr() + out.abort,
            offs: offs.into_boxed_slice(),
            pcs: pcs.into_boxed_slice(),
        });
        let code = mem.as_slice().as_ptr_range();
        // SAFETY: `on_fault` is async-signal-safe, and `data` is the address of the boxed
        // FaultMap, which the JitProgram owns and frees only after `drop` removed the range.
        let range = unsafe {
            guard::add_dynamic_range(
                code.start as usize,
                code.end as usize,
                on_fault,
                &*faults as *const FaultMap as usize,
            )
        };
        let Some(range) = range else {
            return Err(VmError::Jit(format!(
                "the fault handler's table is full ({} code ranges): too many JIT programs at once",
                guard::MAX_RANGES
            )));
        };
        Ok(JitProgram {
            prog,
            mem,
            entries: out.entries,
            fast_entry: out.fast_entry,
            needs_context: out.needs_context,
            cpu_entry: out.cpu_entry,
            claim_entry: out.claim_entry,
            calls_out: out.calls_out,
            memo_pairs: out.memo_pairs,
            _faults: faults,
            range: Some(range),
        })
    }

    /// The program this was compiled from.
    pub fn program(&self) -> &Arc<Program> {
        &self.prog
    }

    /// The subprogram whose C-callable entry is at `addr`, if any.
    pub(crate) fn entry_index(&self, addr: usize) -> Option<usize> {
        let off = addr.checked_sub(self.mem.addr())?;
        self.entries.binary_search(&off).ok()
    }

    /// Address of the fast run entry, for programs that call no helper marked `may_exit`, no
    /// `callx` and no callback (None otherwise): an `extern "C" fn(r1: u64, r2: u64, abort:
    /// *mut [u64; 3], cpu: u64) -> u64` returning r0, which needs no run state of this crate
    /// (no thread-local access), follows the C convention for the general-purpose registers
    /// and, itself, touches no vector, x87 or MXCSR state. `cpu` is the run's CPU slot (below
    /// the possible CPUs), which inlined per-CPU lookups use. An abort (a fault in the
    /// program's code, contained by the fault handler) writes `[kind, pc, detail]` (kind
    /// non-zero) to `abort`.
    ///
    /// When [`needs_context`](Self::needs_context) is false the run also calls nothing and
    /// ignores `cpu`. Otherwise it calls helpers (which follow the C convention and may use
    /// vector registers) and the caller must provide what they read (the runtime's run
    /// context, a CPU slot held for the run). Valid while `self` lives; the same safety
    /// contract as [`run`](Self::run) applies to its calls.
    pub fn fast_entry_address(&self) -> Option<usize> {
        self.fast_entry.map(|off| self.mem.addr() + off)
    }

    /// Address of the claiming entry, for programs that call no helper (inlined lookups, direct
    /// map calls and cached helpers aside, see [`claim_calls_out`](Self::claim_calls_out)), no
    /// `callx` and no callback (None otherwise): an `extern "C" fn(r1: u64, claim: *const
    /// SlotClaim, abort: *mut [u64; 3]) -> u64`. It claims the slot of the CPU the thread runs
    /// on, as the runtime's runs do (a compare-and-swap of the slot's word from 0 to the
    /// thread's id), when restartable sequences are registered, the thread's id is known, no
    /// run is in progress on the thread and the slot is free; marks the run in progress; runs
    /// the program (r2..r5 = 0) with that CPU for its inlined per-CPU lookups; then clears the
    /// mark and frees the slot (also after an abort). Otherwise it runs nothing and stores
    /// [`CLAIM_RETRY`] in `abort[0]`: the caller runs the program its general way. Like the
    /// fast entry, it follows the C convention for the general-purpose registers, touches no
    /// vector, x87 or MXCSR state and calls nothing, unless
    /// [`claim_calls_out`](Self::claim_calls_out) says it may. Valid while `self` lives; the
    /// same safety contract as [`run`](Self::run) applies; `claim` must describe the slots and
    /// thread-local words the caller's own runs use.
    pub fn claim_entry_address(&self) -> Option<usize> {
        self.claim_entry.map(|off| self.mem.addr() + off)
    }

    /// Whether a run through the claiming entry may call out (a direct map call on a memo
    /// miss, a helper refilling its cache): compiled code that may reach probed functions,
    /// so the caller must hold its recursion guard around the run (vector registers 0-7 are
    /// kept by the calls themselves, see `preserve.rs`). Such calls read nothing of the run
    /// context and never end the run.
    pub fn claim_calls_out(&self) -> bool {
        self.calls_out
    }

    /// The per-CPU hash lookups and updates of the same key, one right after the other, whose
    /// update takes the element the lookup's memo hit found without checking the memo again
    /// (the checks under the element's lock stay): `(lookup pc, update pc)`.
    pub fn memo_pairs(&self) -> &[(usize, usize)] {
        &self.memo_pairs
    }

    /// Whether runs call helpers or inline per-CPU lookups (see
    /// [`fast_entry_address`](Self::fast_entry_address)).
    pub fn needs_context(&self) -> bool {
        self.needs_context
    }

    /// The native code, for inspection (disassembly, size).
    pub fn code(&self) -> &[u8] {
        self.mem.as_slice()
    }

    /// Address of the C-callable entry of subprogram `index` (an index into
    /// [`Program::subprogs`]; 0 is the program's entry). It can be called as a
    /// [`HelperFn`](crate::HelperFn) with r1..r5 as arguments, returning r0, on the thread
    /// of a [`run`](Self::run) of this program or of another; if it aborts (for example a
    /// `callx` to an unknown id, or a fault) it returns 1 and the enclosing `run` reports the
    /// error. This is the address `lddw rX, BPF_PSEUDO_FUNC` loads; helpers should run it
    /// with [`callback::invoke`](crate::callback::invoke), which checks it and makes the run
    /// end when the callback fails.
    ///
    /// # Panics
    /// If `index` is not below `subprogs().len()`.
    pub fn subprog_address(&self, index: usize) -> usize {
        match self.entries.get(index) {
            Some(off) => self.mem.addr() + off,
            None => panic!("subprogram index {index} out of range ({} subprograms)", self.entries.len()),
        }
    }

    /// Runs the program with r1 and r2 set, returning r0.
    ///
    /// A run ends early when a helper marked `may_exit` asks it to
    /// ([`request_exit`](crate::request_exit): `Ok` with the requested r0) or when a callback
    /// it ran failed; a fault in the program's code ends it with [`VmError::Fault`] and leaves
    /// the process as it was (memory the program wrote before stays written).
    ///
    /// # Safety
    /// JIT code does not check memory accesses: the caller guarantees that every store the
    /// program can make with these arguments (callbacks run by its helpers included) either
    /// touches memory the program may change or faults, and that its loads read memory that
    /// is valid or fault.
    ///
    /// A program that calls no helper marked `may_exit`, no `callx` and no callback runs
    /// without the per-run state of `run.rs` (no thread-local access).
    pub unsafe fn run(&self, r1: u64, r2: u64) -> Result<u64, VmError> {
        // SAFETY: forwarded to the caller's guarantee.
        unsafe { self.run_on_cpu(r1, r2, 0) }
    }

    /// [`run`](Self::run) for a run holding CPU slot `cpu` (what inlined per-CPU lookups
    /// use; it must be below the possible CPUs).
    ///
    /// # Safety
    /// As for [`run`](Self::run).
    pub unsafe fn run_on_cpu(&self, r1: u64, r2: u64, cpu: u32) -> Result<u64, VmError> {
        // Runs calling helpers keep the run state (a helper not marked `may_exit` may still
        // ask the run to end when it returns): only callers that know their helpers never do
        // call the fast entry of those (`fast_entry_address`).
        if let Some(off) = self.fast_entry.filter(|_| !self.needs_context) {
            // Nothing in this program's run reads the run state (no helper ending runs, no
            // callx, no callback), so none is set up: an abort is recorded in `abort`.
            let mut abort = [0u64; 3];
            // SAFETY: the fast entry is a C function with this signature (compile.rs,
            // `fast_entry`) in code mapped read+execute while `self` lives.
            let entry: FastEntry = unsafe { std::mem::transmute::<usize, FastEntry>(self.mem.addr() + off) };
            // SAFETY: as for the code below; `abort` is ours, written only on an abort.
            let r0 = unsafe { entry(r1, r2, &mut abort, cpu as u64) };
            return match abort {
                [0, ..] => Ok(r0),
                [kind, pc, detail] => Err(abort_error(kind, pc, detail)),
            };
        }
        type CpuEntry = unsafe extern "C" fn(u64, u64, u64) -> u64;
        // SAFETY: `CpuEntry` is `Entry(0)` with the run's CPU in its run slot, a function
        // following the C calling convention with this signature (see compile.rs), in memory
        // mapped read+execute for as long as `self` lives.
        let entry: CpuEntry = unsafe { std::mem::transmute::<usize, CpuEntry>(self.mem.addr() + self.cpu_entry) };
        // A run inside a helper of another run must not see, or lose, the other's state: each
        // run has its own, and the thread's innermost run is put back when this one ends.
        let ctx = RunCtx::new(RunKind::Jit(self));
        let r0 = {
            let _scope = ctx.enter();
            // SAFETY: the code reads and writes only its own stack frames and the memory the
            // program's accesses name, which the caller vouches for (a fault there resumes at
            // the abort path); it calls only registered helpers and its own functions, and
            // returns with the callee-saved registers restored.
            unsafe { entry(r1, r2, cpu as u64) }
        };
        ctx.finish(Ok(r0))
    }
}

impl JitProgram {
    /// Runs on a buffer: r1 = its address (0 when empty), r2 = its length.
    ///
    /// # Safety
    /// As for [`run`](Self::run): the program's accesses must stay in memory that is valid.
    pub unsafe fn run_mem(&self, mem: &mut [u8]) -> Result<u64, VmError> {
        let r1 = if mem.is_empty() { 0 } else { mem.as_mut_ptr() as u64 };
        // SAFETY: forwarded to the caller's guarantee.
        unsafe { self.run(r1, mem.len() as u64) }
    }
}

impl Drop for JitProgram {
    fn drop(&mut self) {
        // No run of this program is in progress (they borrow it), so no fault handler is
        // inside the range; after this no handler reads the FaultMap, freed next.
        if let Some(r) = self.range.take() {
            guard::remove(r);
        }
    }
}

impl std::fmt::Debug for JitProgram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JitProgram")
            .field("code_len", &self.mem.as_slice().len())
            .field("entries", &self.entries)
            .finish()
    }
}

#[cfg(test)]
mod tests;
