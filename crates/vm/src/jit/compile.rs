//! Translation of a checked [`Program`] into x86-64 code: one function per instruction class.
//!
//! # Register map
//!
//! | eBPF | x86-64 | | eBPF | x86-64 |
//! |------|--------|-|------|--------|
//! | r0   | rax    | | r6   | rbx    |
//! | r1   | rdi    | | r7   | r13    |
//! | r2   | rsi    | | r8   | r14    |
//! | r3   | rdx    | | r9   | r15    |
//! | r4   | rcx    | | r10  | rbp    |
//! | r5   | r8     | |      |        |
//!
//! r1..r5 are the SysV argument registers in order, so helpers and subprograms are called
//! with no shuffling, and r6..r10 are SysV callee-saved, so helpers preserve them. x86 r9,
//! r10 and r11 are scratch; r12 holds the *abort stack pointer* for the whole run.
//!
//! # Code layout
//!
//! ```text
//! Entry(k)   for every subprogram k: an `extern "C" fn(u64 x5) -> u64`
//!            push the callee-saved registers the run may change (`entry_saves`: r12, rbp
//!            and the r6..r9 some subprogram saves or the entry zeroes); push 0 x5 (run
//!            slots); mov r12, rsp; r0 = r6..r9 = 0 (those named);
//!            call Func(k); jmp Epilogue
//! FastEntry  `extern "C" fn(r1, r2, abort, cpu) -> u64`, see [`Output::fast_entry`]: the same
//!            with the run slots [r12] = abort, [r12+8] = cpu
//! CpuEntry   `extern "C" fn(r1, r2, cpu) -> u64`: `Entry(0)` with [r12+8] = cpu
//! ClaimEntry `extern "C" fn(r1, claim, abort) -> u64`, see [`Output::claim_entry`]: claims
//!            the CPU slot itself; [r12+16] = the slot's word, [r12+24] = the TLS offset of
//!            the thread's "run in progress" byte (compiled with the process's claim,
//!            `Options::claim`: placed after the functions, with its own copy of Func(0)'s
//!            body run in the entry's frame, see "One frame for claimed runs")
//! Abort:     mov rsp, r12; record_abort(r9 = kind, r10 = pc, r11 = id); eax = 1
//! Unwind:    mov rsp, r12               (the result is in rax)
//! Epilogue:  (a slot claimed by ClaimEntry: given back); add rsp, 40;
//!            pop what the entry pushed; ret
//! Func(k)    for every subprogram k: the body, with its own frame:
//!            push (rbp if it uses r10) (rbx, r13, r14, r15 if it writes r6..r9)
//!            mov rbp, rsp; sub rsp, 512 (+ 8 to keep rsp 16-aligned at calls)
//!            ... one instruction after another ...; each exit: mov rsp, rbp; pops; ret
//!            then the function's cold code (memo misses, see "Per-CPU hash memo hits")
//! ```
//!
//! The entries zero r0 and the r2..r9 they do not pass only where the subprogram may read
//! them before writing them (`live_at_start`, a liveness analysis; the interpreter starts
//! every register at zero, and a register written before every read cannot tell).
//!
//! A bpf-to-bpf call is a native `call Func(k)`: the arguments are already in place, the
//! callee saves the r6..r9 it writes and sets up its own 512-byte stack below the caller's.
//!
//! The run's entry is `Entry(0)`; `lddw rX, BPF_PSEUDO_FUNC` loads the address of `Entry(k)`,
//! so a helper can call a callback as a plain C function. Each entry sets r12 to its own
//! stack pointer; [`Label::Abort`] unwinds to the innermost entry (`mov rsp, r12`), records
//! the error and returns 1 from that entry. `callx` to an unknown id jumps there, and so does
//! the SIGSEGV/SIGBUS handler (guard.rs) for a fault inside an instruction's code: it sets
//! rip to the abort code with r9 = kind, r10 = pc, r11 = the faulting address, finding the pc
//! in the table of [`Output::pc_map`]. (r12 is the innermost entry's stack pointer everywhere
//! in the functions' code: only entries write it, and helpers preserve it.)
//!
//! # Ending the run from a helper
//!
//! After a call to a helper marked `may_exit` (and after every `callx`, whose target is not
//! known here), the code calls `jit_after_helper(r0)` (run.rs), which returns r0 in rax and
//! in rdx whether the run ends (an exit request or an error is pending). If it does, the code
//! jumps to [`Label::Unwind`], which returns rax from the innermost entry; the caller of that
//! entry (`JitProgram::run`, or `callback::invoke`, which reports the ending to its helper,
//! after which the outer code's own check unwinds further) takes it from there.
//!
//! # Inlined array lookups
//!
//! A `call 1` (map_lookup_elem) that [`Program`] found to look up an array map the relocator
//! described ([`Program::inline_lookup_at`]) is not a call: `r11d = *(u32 *)r2; r0 = 0; if
//! r11d < max_entries: r0 = values + r11 * elem_size` (the kernel's `array_map_gen_lookup`).
//! For a per-CPU array (`cpu_stride` non-zero) the run's CPU slot, which the fast entry keeps
//! at `[r12+8]`, adds `cpu * cpu_stride` (the kernel's `percpu_array_map_gen_lookup`, which
//! reads the CPU's offset). Such lookups are only made in programs with no callback, no
//! `callx` and no helper that may end the run (`Program` checks), whose runs enter through
//! the fast entry or `CpuEntry`, both given the CPU, so `[r12+8]` is the run's CPU; compiling
//! one into a program that needs run state is an error.
//!
//! A `call 2` (map_update_elem) on an array whose values are whole 8-byte words
//! ([`Program::inline_update_at`], up to 64 bytes) is inline too: the helper's checks in its
//! order (`-EINVAL` for unknown flags, `-E2BIG` for an index out of the array, `-EEXIST` for
//! `BPF_NOEXIST`, `-EINVAL` for `BPF_F_LOCK`), then the value copied 8 bytes at a time into
//! the element (the run's CPU's), r0 = 0. With both inlined, bpftrace's `count()` (a per-CPU
//! array lookup and update) calls no helper.
//!
//! # Direct map calls
//!
//! A `call 1`, `call 2` or `call 3` on a map whose type has functions of its own
//! ([`Program::direct_call_at`], hash maps) calls that function instead of the helper: r1 =
//! its argument (the map's implementation), r5 = the run's CPU slot from `[r12+8]`, as for
//! inlined per-CPU lookups (and under the same conditions: the program's runs go through the
//! fast entry). The helper would find the map by address in the registry, dispatch on its
//! type and key size and read the run's CPU from thread-local state on every call.
//!
//! # Per-CPU hash memo hits and cached helpers, inline
//!
//! A direct lookup or update of a per-CPU hash map whose keys are 1, 2, 4 or 8 bytes
//! ([`crate::program::HashMemo`]) first tries the thread's lookup memo inline: the memo (in
//! the maps crate's static TLS words) names this map and the key, its element is linked and
//! holds the key: a lookup's result is the element's value for the run's CPU; an update
//! (`BPF_ANY`/`BPF_EXIST`, values of whole words up to 64 bytes) takes the element's lock with
//! one compare-and-swap, checks again, stores the value and gives the lock back, as the maps
//! crate's own fast path does. Anything else (a miss, a held lock, other flags) makes the
//! direct call. bpftrace's `@x[tid] = count()`, `sum()` and `hist()` repeat one key per thread,
//! so their lookups and updates are these few instructions. When the update follows the
//! lookup of the same key with nothing in between that could change the key or the JIT's
//! scratch registers ([`memo_pairs`]: bpftrace's lookup, compute, update), the lookup's hit
//! hands the element, its key word and the value's address to the update in r10, r9 and r11,
//! and the update takes the element's lock without checking the memo again (the checks under
//! the lock stay). Flags set to `BPF_ANY` or `BPF_EXIST` right before an update are checked
//! when compiling, and an `lddw r1` of the map that no such call reads emits nothing. A
//! helper whose result the thread caches ([`crate::program::CachedHelper`]:
//! `get_current_pid_tgid`) is read inline while the cache's fork generation is current, and
//! called otherwise.
//!
//! The hit falls through: the call made on a miss, the unlock when the element changed under
//! the lock and a paired update's fallback are cold code after the function (`emit_cold`),
//! which jumps back; the fault table names the call instruction for it.
//!
//! # One frame for claimed runs
//!
//! Compiled with the process's claim (`Options::claim`), the claiming entry is placed after
//! the functions and runs its own copy of subprogram 0's body in its own frame: the run
//! slots, then rbp = rsp and the 512 bytes of stack, no call and no prologue (the entry
//! pushes every register a frame saves, see [`entry_saves`]); the copy's exits give the slot
//! back and return (`claim_return`), its aborts and exit requests end through the shared
//! epilogue like any run's. The copy's instructions have labels of their own
//! ([`Label::Insn`] while `claim_copy`) and entries of their own in the fault table.
//!
//! # Calls out of claimed runs
//!
//! A program whose only calls are those (direct map calls, cached helpers) reads nothing of
//! the run context, so it gets the claiming entry too (`Output::calls_out`). A probe's stub
//! calls that entry without saving any vector register (it only holds the recursion guard:
//! the calls may reach probed functions), so from such a run the calls go through
//! `preserve.rs`'s thunk, which keeps vector registers 0-7 (the ones live at a function's
//! entry or return) around them; runs from the other entries (whose callers saved the vector
//! state) call directly. The run's entry is told by its slot word at `[r12+16]`, set only by
//! the claiming entry. Faults: the key and the value are read before the element's lock is
//! taken, so a bad pointer aborts the run with no lock held.
//!
//! # Instruction count
//!
//! A probe hit through the claiming entry is bound by how many instructions it issues (on
//! the machine of issue 16, ~250 instructions in ~40 cycles), so the entries count them:
//! compiled with the process's claim (`Options::claim`, `JitProgram::compile_claiming`) the
//! claiming entry reads its thread-local words at their static-TLS offsets (`fs:[disp32]`)
//! and the slots' address is an immediate; the memo checks and cached helpers address their
//! thread words the same way; the entries zero only the registers some instruction names.
//!
//! # Jumps
//!
//! Jumps are laid out by relaxation: pass 0 makes every jump long (rel32); each later pass
//! makes a jump short (rel8) when it fitted in the previous pass's layout. Code only shrinks,
//! so a short jump stays short, and once a pass lays out everything as the previous one did,
//! its displacements (computed from the previous layout) are exact. After
//! `max_passes` (16) a final pass keeps the previous decisions, which reproduces that layout.
//!
//! # Calls
//!
//! Helpers, direct map operations and the runtime's functions are called at absolute
//! addresses. Compiled without knowing where its code will lie, a call is `mov rax, func;
//! call rax` (up to 12 bytes, an indirect call); `JitProgram::compile_with` then maps the
//! code and compiles it again at that address (`Options::code_base`), where every call whose
//! target is within ±2 GiB (the JIT's mappings usually lie next to the libraries that hold
//! the helpers) is a `call rel32`: 5 bytes, and a target the processor knows from the
//! instruction's bytes, before anything ran (see [`Emitter::call_abs`]). The second layout is
//! never longer than the first (the same code, some calls shorter), so it fits the mapping.

use userbpf_isa::*;

use super::emit::{Alu, Asm, Cond, Mem, Reg, Shift, Width};
use crate::program::{Program, STACK_SIZE};

/// What `ClaimEntry` stores in `abort[0]` when it could not claim the slot and ran nothing
/// (all ones: no abort kind).
pub const CLAIM_RETRY: u64 = u64::MAX;

/// Kind of abort: `callx` to an id with no helper (r10 = pc, r11 = id).
pub(crate) const ABORT_UNKNOWN_HELPER: u64 = 1;
/// Kind of abort: a fault in an instruction's code (r10 = pc, r11 = faulting address); set by
/// the fault handler.
pub(crate) const ABORT_FAULT: u64 = 2;
/// `pc` of [`Output::pc_map`] entries that start code belonging to no instruction (prologues).
pub(crate) const NO_PC: u32 = u32::MAX;

/// Addresses of the run-time functions the code calls.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Runtime {
    /// `extern "C" fn(kind, pc, detail)`: records an abort.
    pub abort_fn: u64,
    /// `extern "C" fn(r0) -> (r0, end)`: after a helper that may end the run.
    pub after_helper_fn: u64,
    /// `preserve.rs`'s thunk: calls r11 keeping vector registers 0-7.
    pub preserving_call: u64,
}

/// A [`super::SlotClaim`] the claiming entry can take as constants: its thread-local words'
/// offsets fit a 32-bit displacement (static TLS lies just below the thread pointer).
#[derive(Clone, Copy)]
struct ConstClaim {
    slots: u64,
    nr: u32,
    have_rseq: bool,
    rseq_cpu: i32,
    active: i32,
    tid: i32,
}

impl ConstClaim {
    fn of(c: super::SlotClaim) -> Option<ConstClaim> {
        Some(ConstClaim {
            slots: c.slots,
            nr: c.nr,
            have_rseq: c.have_rseq != 0,
            rseq_cpu: i32::try_from(c.rseq_cpu).ok()?,
            active: i32::try_from(c.active).ok()?,
            tid: i32::try_from(c.tid).ok()?,
        })
    }
}

/// Layout passes before the last, freezing one.
const MAX_PASSES: usize = 16;

/// eBPF register number to x86 register. Entries 11..15 are never used: registers are
/// checked before compiling.
const REG_MAP: [Reg; 16] = [
    Reg::RAX,
    Reg::RDI,
    Reg::RSI,
    Reg::RDX,
    Reg::RCX,
    Reg::R8,
    Reg::RBX,
    Reg::R13,
    Reg::R14,
    Reg::R15,
    Reg::RBP,
    Reg::R11,
    Reg::R11,
    Reg::R11,
    Reg::R11,
    Reg::R11,
];

fn reg(r: u8) -> Reg {
    REG_MAP[(r & 15) as usize]
}

/// The SysV callee-saved registers, in the order the entry trampolines push those they save
/// (see [`entry_saves`]).
const CALLEE_SAVED: [Reg; 6] = [Reg::RBP, Reg::RBX, Reg::R12, Reg::R13, Reg::R14, Reg::R15];

/// The eBPF registers some instruction names (as destination or source; r1-r5 too when the
/// program calls anything, since a call reads its arguments there; r6 for the legacy packet
/// loads, which read it unnamed).
fn named_regs(insns: &[Insn]) -> [bool; 16] {
    let mut named = [false; 16];
    for i in insns {
        named[(i.dst & 15) as usize] = true;
        named[(i.src & 15) as usize] = true;
        let (class, code) = (i.op & 0x07, i.op & 0xf0);
        if class == BPF_JMP && code == BPF_CALL {
            named[1..=5].iter_mut().for_each(|n| *n = true);
        }
        if class == BPF_LD && (code & 0xe0 == BPF_ABS || code & 0xe0 == BPF_IND) {
            named[6] = true;
        }
    }
    named
}

/// The eBPF registers r0..r9 that subprogram `f` may read before writing them, on some path
/// from its start (a backward liveness analysis): only those need their start value (zero)
/// set by an entry; the others are written before any read, so their start value is
/// unobservable. Conservative: anything not understood reads every register (a jump out of
/// the subprogram, falling off its end, legacy packet loads), a call reads r1..r5 (a
/// bpf-to-bpf call r1..r9) and writes only r0, except the calls the JIT replaces by its own
/// code or a map's function, whose reads are the map helpers' (`map_lookup_elem` and
/// `map_delete_elem` read the key at r2, `map_update_elem` r2..r4; the JIT sets r1 and r5
/// itself); an atomic operation reads r0, its base and its source and writes nothing.
fn live_at_start(prog: &Program, f: &Frame) -> [bool; 16] {
    const ALL: u16 = 0x3ff;
    let insns = prog.insns();
    let bit = |r: u8| 1u16 << (r & 15);
    let n = f.end - f.start;
    // (uses, defs, successors) of each instruction.
    let step = |pc: usize| -> Option<(u16, u16, [Option<usize>; 2])> {
        let i = insns[pc];
        let next = pc + if i.is_lddw() { 2 } else { 1 };
        let fall = [Some(next), None];
        let (class, code) = (i.class(), i.code());
        Some(match class {
            BPF_LD if i.is_lddw() => (0, bit(i.dst), fall),
            BPF_LD => return None,
            BPF_LDX => (bit(i.src), bit(i.dst), fall),
            BPF_ST => (bit(i.dst), 0, fall),
            BPF_STX if i.mode() == BPF_ATOMIC => (bit(i.dst) | bit(i.src) | 1, 0, fall),
            BPF_STX => (bit(i.dst) | bit(i.src), 0, fall),
            BPF_ALU | BPF_ALU64 => {
                let src = if i.source() == BPF_X { bit(i.src) } else { 0 };
                let uses = match code {
                    BPF_MOV => src,
                    BPF_NEG | BPF_END => bit(i.dst),
                    _ => bit(i.dst) | src,
                };
                (uses, bit(i.dst), fall)
            }
            BPF_JMP | BPF_JMP32 => match code {
                BPF_EXIT if class == BPF_JMP => (1, 0, [None, None]),
                BPF_CALL if class == BPF_JMP => {
                    let uses = if i.op == OP_CALLX {
                        0x3e | bit(i.dst)
                    } else if i.src == BPF_PSEUDO_CALL {
                        ALL
                    } else if prog.inline_lookup_at(pc).is_some() {
                        bit(2)
                    } else if prog.inline_update_at(pc).is_some() {
                        bit(2) | bit(3) | bit(4)
                    } else if prog.direct_call_at(pc).is_some() {
                        match i.imm {
                            1 | 3 => bit(2),
                            2 => bit(2) | bit(3) | bit(4),
                            _ => 0x3e,
                        }
                    } else {
                        0x3e
                    };
                    (uses, 1, fall)
                }
                _ => {
                    let rel = if class == BPF_JMP32 && code == BPF_JA { i.imm as i64 } else { i.off as i64 };
                    let t = usize::try_from(pc as i64 + 1 + rel).ok()?;
                    if code == BPF_JA {
                        (0, 0, [Some(t), None])
                    } else {
                        let src = if i.source() == BPF_X { bit(i.src) } else { 0 };
                        (bit(i.dst) | src, 0, [Some(next), Some(t)])
                    }
                }
            },
            _ => return None,
        })
    };
    // A jump into the second half of an lddw: everything (the JIT would not run it).
    let mut facts = vec![(ALL, 0u16, [None, None]); n];
    let mut pc = f.start;
    while pc < f.end {
        let Some(fact) = step(pc) else { return [true; 16] };
        if fact.2.iter().flatten().any(|&t| t < f.start || t >= f.end) {
            return [true; 16];
        }
        facts[pc - f.start] = fact;
        pc += if insns[pc].is_lddw() { 2 } else { 1 };
    }
    // live[pc]: registers live before pc (lddw's second slot never visited). Iterate to the
    // fixed point, backwards (jumps are mostly forward: few rounds).
    let mut live = vec![0u16; n];
    loop {
        let mut changed = false;
        for k in (0..n).rev() {
            let (uses, defs, succ) = facts[k];
            let out = succ.iter().flatten().fold(0u16, |a, &t| a | live[t - f.start]);
            let l = (uses | (out & !defs)) & ALL;
            if l != live[k] {
                live[k] = l;
                changed = true;
            }
        }
        if !changed {
            break;
        }
    }
    std::array::from_fn(|r| r > 9 || live[0] & (1 << r) != 0)
}

/// The callee-saved registers the entries save and the shared epilogue restores, in push
/// order: those something between an entry and its epilogue may change without restoring
/// them on every way out, and no others (each push and pop counts on a probe hit). That is
/// r12 (the entries set it), the r6..r9 registers the entries zero (`zero_regs`: the named
/// ones), and every register some subprogram's prologue saves (rbp when it uses the stack,
/// the r6..r9 it writes): an abort or an exit request unwinds straight to the innermost
/// entry's frame (`mov rsp, r12`), skipping the pops of the frames in between. Nothing else
/// in the code writes a callee-saved register (scratch is r9..r11, helpers and the
/// preserving thunk keep callee-saved registers, and tail calls run the next program through
/// its own entry). An even count, so that the entries keep rsp 16-aligned (r12 again when
/// needed).
fn entry_saves(insns: &[Insn], frames: &[Frame]) -> Vec<Reg> {
    let named = named_regs(insns);
    let zeroed = |r: Reg| (6..=9u8).any(|k| named[k as usize] && reg(k) == r);
    let mut saves: Vec<Reg> = CALLEE_SAVED
        .into_iter()
        .filter(|&r| r == Reg::R12 || zeroed(r) || frames.iter().any(|f| f.saves.contains(&r)))
        .collect();
    if saves.len() % 2 == 1 {
        saves.push(Reg::R12);
    }
    saves
}

/// Choices made once per compilation.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Options {
    /// Use BMI2 `shlx/shrx/sarx` for shifts by a register.
    pub bmi2: bool,
    /// Layout passes before the final one that keeps the previous pass's jump sizes.
    pub max_passes: usize,
    /// The slot claim every run of the claiming entry will be given, known when compiling:
    /// its words become constants of the code (see `claim_entry`).
    pub claim: Option<super::SlotClaim>,
    /// Where the code will be mapped, when known (see "Calls"): calls to the runtime's
    /// functions within reach of a `call rel32` are made with one.
    pub code_base: Option<u64>,
}

impl Options {
    /// What this CPU supports.
    pub fn detect() -> Options {
        #[cfg(target_arch = "x86_64")]
        let bmi2 = std::arch::is_x86_feature_detected!("bmi2");
        #[cfg(not(target_arch = "x86_64"))]
        let bmi2 = false;
        Options { bmi2, max_passes: MAX_PASSES, claim: None, code_base: None }
    }
}

/// Native code and where its entries are.
pub(crate) struct Output {
    pub code: Vec<u8>,
    /// Offset of `Entry(k)` for each subprogram, in `Program::subprogs` order.
    pub entries: Vec<usize>,
    /// Offset of the abort path.
    pub abort: usize,
    /// Offset of the fast run entry, for programs that call no helper marked `may_exit`, no
    /// `callx` and load no callback (`BPF_PSEUDO_FUNC`): nothing in their run reads the run
    /// state of `run.rs` (the other helpers never end a run: an exit request a helper not
    /// marked `may_exit` made would be ignored). An `extern "C" fn(r1, r2, abort: *mut [u64;
    /// 3], cpu: u64) -> u64` (r3..r5 = 0); an abort stores `[kind, pc, detail]` at `abort`
    /// (kind != 0) instead of calling `Runtime::abort_fn`; `cpu` is the run's CPU slot, which
    /// inlined per-CPU lookups use. None for other programs.
    pub fast_entry: Option<usize>,
    /// The code calls helpers (other than inlined lookups) or inlines per-CPU lookups: its
    /// runs need a run context (a CPU slot, what helpers read).
    pub needs_context: bool,
    /// Offset of `Entry(0)` for a run holding a CPU slot: an `extern "C" fn(r1, r2, cpu) ->
    /// u64` with the run state of `run.rs` (r3..r5 = 0).
    pub cpu_entry: usize,
    /// Offset of the claiming entry, for programs that call no helper at all (inlined lookups
    /// aside), no `callx` and load no callback: `extern "C" fn(r1, claim: *const SlotClaim,
    /// abort: *mut [u64; 3]) -> u64` (see `SlotClaim`). It claims the CPU slot of the CPU the
    /// thread runs on (restartable sequences' `cpu_id`) with one compare-and-swap, marks the
    /// thread's run in progress, runs with r2..r5 = 0 and gives both back. When it cannot
    /// (no rseq, the thread's id not known yet, a run in progress, the slot held) it runs
    /// nothing and stores [`CLAIM_RETRY`] in `abort[0]`. Programs whose only calls are direct
    /// map calls and cached helpers have one too (see `calls_out`).
    pub claim_entry: Option<usize>,
    /// The code may call out of the run without needing its run context: direct map calls
    /// (on a memo miss, when the memo is inlined) and cached helpers' refills. Called from a
    /// claimed run, they go through the preserving thunk (see "Calls out of claimed runs").
    pub calls_out: bool,
    /// `(offset, pc)`, ascending by offset: the code from `offset` up to the next entry's is
    /// instruction `pc`'s ([`NO_PC`]: a function's prologue). Code before the first entry
    /// (entries, abort path, epilogue) belongs to no instruction.
    pub pc_map: Vec<(u32, u32)>,
    /// The lookup-update pairs whose update skips the lookup's memo checks (see
    /// [`memo_pairs`]): `(lookup pc, update pc)`.
    pub memo_pairs: Vec<(usize, usize)>,
}

/// What a subprogram's frame needs.
struct Frame {
    start: usize,
    end: usize,
    /// Registers pushed by the prologue, in order.
    saves: Vec<Reg>,
    /// Whether r10 is used, so rbp is set and 512 bytes of stack are reserved.
    uses_stack: bool,
    /// Bytes subtracted from rsp after the pushes.
    stack: i32,
}

#[derive(Clone, Copy, Debug)]
enum Label {
    Insn(usize),
    Func(usize),
    Entry(usize),
    Abort,
    Epilogue,
    Unwind,
    /// The run entry of programs that need no run state (see [`Output::fast_entry`]).
    FastEntry,
    /// `Entry(0)` with the run's CPU (see [`Output::cpu_entry`]).
    CpuEntry,
    /// The claiming entry (see [`Output::claim_entry`]).
    ClaimEntry,
    /// The start of the claiming entry's "not claimed" code, when it has its own copy of
    /// subprogram 0 (see [`Emitter::claim_const`]): code of no instruction after the functions.
    ClaimBusy,
}

/// Positions of one pass: labels, jump sites and which jumps were short.
#[derive(Default)]
struct Layout {
    labels: Vec<usize>,
    sites: Vec<usize>,
    short: Vec<bool>,
}

const UNBOUND: usize = usize::MAX;

fn fits_i8(v: i64) -> bool {
    (-128..=127).contains(&v)
}

/// Compiles `prog`; the code calls the functions of `rt`.
pub(crate) fn compile(prog: &Program, opts: Options, rt: Runtime) -> Result<Output, String> {
    let frames = frames(prog)?;
    let mut prev: Option<Layout> = None;
    let max_passes = opts.max_passes.max(1);
    for pass in 0..=max_passes {
        let freeze = pass == max_passes;
        let mut e = Emitter::new(prog, opts, &frames, prev.as_ref(), freeze, rt);
        e.emit_all();
        if let Some(err) = e.err {
            return Err(err);
        }
        if e.a.overflowed() {
            return Err("internal error: a short jump inside an instruction's code is out of range".into());
        }
        let converged = match &prev {
            Some(p) => !e.inexact && p.labels == e.cur.labels && p.sites == e.cur.sites,
            None => false,
        };
        if converged {
            let nsub = frames.len();
            let n = prog.insns().len();
            let labels = &e.cur.labels;
            let entries = (0..nsub).map(|k| labels[n + nsub + k]).collect();
            let abort = labels[e.label_index(Label::Abort)];
            let fast_entry = (!e.needs_run_state).then(|| labels[e.label_index(Label::FastEntry)]);
            if e.needs_run_state && e.percpu_inline {
                return Err("internal error: a per-CPU lookup is inlined in a program that needs run state".into());
            }
            let needs_context = e.calls_helpers || e.percpu_inline || e.calls_out;
            let cpu_entry = labels[e.label_index(Label::CpuEntry)];
            let claim_entry =
                (!e.needs_run_state && !e.calls_helpers).then(|| labels[e.label_index(Label::ClaimEntry)]);
            let calls_out = e.calls_out;
            let copy = e.const_claim().map(|k| {
                let base = n + 2 * nsub + 7;
                (labels[e.label_index(Label::ClaimBusy)], k.have_rseq.then(|| &labels[base..base + n]))
            });
            let pc_map = pc_map(prog, &frames, labels, copy, &e.cold_map)?;
            let memo_pairs = e.paired_lookups.iter().copied().zip(e.paired_updates.iter().copied()).collect();
            return Ok(Output {
                code: e.a.into_code(),
                entries,
                abort,
                fast_entry,
                needs_context,
                cpu_entry,
                claim_entry,
                calls_out,
                pc_map,
                memo_pairs,
            });
        }
        if freeze {
            break;
        }
        prev = Some(e.cur);
    }
    Err("internal error: jump layout did not converge".into())
}

/// The offset → instruction table of the final layout (see [`Output::pc_map`]).
/// `copy`: where the claiming entry's code after the functions starts and the labels of its
/// copy of subprogram 0's instructions (see `Emitter::claim_const`); `cold`: where each
/// function's cold blocks start and their instructions (see `Emitter::emit_cold`).
fn pc_map(
    prog: &Program,
    frames: &[Frame],
    labels: &[usize],
    copy: Option<(usize, Option<&[usize]>)>,
    cold: &[(usize, u32)],
) -> Result<Vec<(u32, u32)>, String> {
    let insns = prog.insns();
    let n = insns.len();
    let off = |l: usize| u32::try_from(l).map_err(|_| "code too large".to_string());
    let mut map = Vec::with_capacity(n + frames.len());
    for (k, f) in frames.iter().enumerate() {
        map.push((off(labels[n + k])?, NO_PC));
        let mut pc = f.start;
        while pc < f.end {
            map.push((off(labels[pc])?, pc as u32));
            pc += if insns[pc].is_lddw() { 2 } else { 1 };
        }
    }
    if let Some((start, copy)) = copy {
        map.push((off(start)?, NO_PC));
        if let Some(copy) = copy {
            let f = &frames[0];
            let mut pc = f.start;
            while pc < f.end {
                map.push((off(copy[pc])?, pc as u32));
                pc += if insns[pc].is_lddw() { 2 } else { 1 };
            }
        }
    }
    // Cold blocks sit after their function's last instruction (`Emitter::emit_cold`).
    for &(o, pc) in cold {
        map.push((off(o)?, pc));
    }
    map.sort_by_key(|e| e.0);
    if !map.windows(2).all(|w| w[0].0 <= w[1].0) {
        return Err("internal error: instruction offsets are not ascending".into());
    }
    Ok(map)
}

/// Finds the subprograms' ranges and what their frames need; checks register numbers.
fn frames(prog: &Program) -> Result<Vec<Frame>, String> {
    let insns = prog.insns();
    let n = insns.len();
    let subs = prog.subprogs();
    if subs.first() != Some(&0) {
        return Err("internal error: the program has no entry subprogram".into());
    }
    let mut frames = Vec::with_capacity(subs.len());
    for (k, &start) in subs.iter().enumerate() {
        let end = subs.get(k + 1).copied().unwrap_or(n);
        if start >= end || end > n {
            return Err(format!("internal error: bad subprogram range {start}..{end}"));
        }
        let mut written = [false; 16];
        let mut uses_stack = false;
        let mut calls = false;
        let mut pc = start;
        while pc < end {
            let i = insns[pc];
            let is_call = i.class() == BPF_JMP && i.code() == BPF_CALL;
            if i.dst > MAX_REG || (i.src > MAX_REG && !i.is_lddw() && !is_call) {
                return Err(format!("instruction {pc}: register number out of range"));
            }
            match i.class() {
                BPF_ALU | BPF_ALU64 | BPF_LDX | BPF_LD => written[i.dst as usize] = true,
                BPF_STX if i.mode() == BPF_ATOMIC && i.imm & BPF_FETCH != 0 => written[i.src as usize] = true,
                _ => {}
            }
            if is_call {
                calls = true;
            }
            if i.dst == FRAME_REG || (i.src == FRAME_REG && !i.is_lddw() && !is_call) {
                uses_stack = true;
            }
            pc += if i.is_lddw() { 2 } else { 1 };
        }
        let mut saves = Vec::new();
        if uses_stack {
            saves.push(Reg::RBP);
        }
        for r in 6..=9u8 {
            if written[r as usize] {
                saves.push(reg(r));
            }
        }
        let mut stack = if uses_stack { STACK_SIZE as i32 } else { 0 };
        // At entry rsp is 8 below a 16-byte boundary (the return address).
        if calls && (8 + 8 * saves.len() as i32 + stack) % 16 != 0 {
            stack += 8;
        }
        frames.push(Frame { start, end, saves, uses_stack, stack });
    }
    Ok(frames)
}

/// Instructions some jump (or bpf-to-bpf call: function starts) lands on.
fn jump_targets(insns: &[Insn], subprogs: &[usize]) -> Vec<bool> {
    let mut t = vec![false; insns.len()];
    for &s in subprogs {
        if let Some(x) = t.get_mut(s) {
            *x = true;
        }
    }
    for (pc, i) in insns.iter().enumerate() {
        let (class, code) = (i.op & 0x07, i.op & 0xf0);
        if !(class == BPF_JMP || class == BPF_JMP32) || code == BPF_CALL || code == BPF_EXIT {
            continue;
        }
        let rel = if class == BPF_JMP32 && code == BPF_JA { i.imm as i64 } else { i.off as i64 };
        if let Some(x) = usize::try_from(pc as i64 + 1 + rel).ok().and_then(|d| t.get_mut(d)) {
            *x = true;
        }
    }
    t
}

/// The memo of the direct map call at `pc` when the JIT does its hit inline (see
/// `Emitter::direct_map_call`): `(memo, is_update)`.
fn inline_memo(prog: &Program, pc: usize) -> Option<(crate::program::HashMemo, bool)> {
    let i = *prog.insns().get(pc)?;
    if i.op != (BPF_JMP | BPF_CALL)
        || i.src != 0
        || prog.inline_lookup_at(pc).is_some()
        || prog.inline_update_at(pc).is_some()
    {
        return None;
    }
    let m = prog.direct_call_at(pc)?.memo.filter(|m| matches!(m.key_size, 1 | 2 | 4 | 8))?;
    match i.imm {
        1 => Some((m, false)),
        2 if m.value_size.is_multiple_of(8) && m.value_size <= 64 => Some((m, true)),
        _ => None,
    }
}

/// The constant `k` of `r2 = r10 + k` as it stands at the call at `pc`: set by `r2 = r10; r2
/// += k` with nothing after it (up to the call) writing r2, and no jump landing on the `+=`
/// or after it (every way to the call goes through both). None otherwise.
fn key_slot(insns: &[Insn], targets: &[bool], pc: usize) -> Option<i32> {
    let landed = |q: usize| targets.get(q).copied().unwrap_or(true);
    let mut q = pc;
    loop {
        if landed(q) || q == 0 {
            return None;
        }
        q -= 1;
        if q > 0 && insns[q - 1].is_lddw() {
            q -= 1; // the lddw's first half (which writes its register)
        }
        let i = insns[q];
        let (class, code) = (i.op & 0x07, i.op & 0xf0);
        match class {
            BPF_ALU | BPF_ALU64 | BPF_LDX if i.dst == 2 => {
                let mov = q > 0 && insns[q - 1].op == (BPF_ALU64 | BPF_X | BPF_MOV);
                let from_fp = mov && insns[q - 1].dst == 2 && insns[q - 1].src == 10 && insns[q - 1].off == 0;
                let is_lddw_half = q > 1 && insns[q - 2].is_lddw();
                return (i.op == (BPF_ALU64 | BPF_K | BPF_ADD) && from_fp && !is_lddw_half && !landed(q))
                    .then_some(i.imm);
            }
            BPF_ALU | BPF_ALU64 | BPF_LDX => {}
            BPF_LD if i.is_lddw() => {
                if i.dst == 2 {
                    return None;
                }
            }
            BPF_ST => {}
            BPF_STX if i.mode() == BPF_MEM => {}
            BPF_JMP | BPF_JMP32 if !matches!(code, BPF_CALL | BPF_EXIT | BPF_JA) => {}
            _ => return None,
        }
    }
}

/// The constant eBPF register `r` holds at instruction `pc`, when the straight code before it
/// sets it with `r = imm` (64-bit `mov`) and nothing lands after that `mov` (every way to `pc`
/// goes through it) or writes `r` again.
fn const_reg(insns: &[Insn], targets: &[bool], pc: usize, r: u8) -> Option<i32> {
    let landed = |q: usize| targets.get(q).copied().unwrap_or(true);
    let mut q = pc;
    loop {
        if q == 0 || (q != pc && landed(q)) || landed(pc) {
            return None;
        }
        q -= 1;
        if q > 0 && insns[q - 1].is_lddw() {
            q -= 1;
        }
        let i = insns[q];
        let (class, code) = (i.op & 0x07, i.op & 0xf0);
        match class {
            BPF_ALU | BPF_ALU64 | BPF_LDX if i.dst == r => {
                return (i.op == (BPF_ALU64 | BPF_K | BPF_MOV) && i.off == 0).then_some(i.imm);
            }
            BPF_ALU | BPF_ALU64 | BPF_LDX | BPF_ST => {}
            BPF_LD if i.is_lddw() && i.dst != r => {}
            BPF_STX if i.mode() == BPF_MEM => {}
            BPF_JMP | BPF_JMP32 if !matches!(code, BPF_CALL | BPF_EXIT | BPF_JA) => {}
            _ => return None,
        }
    }
}

/// Whether the `lddw r1, imm` at `pc` only feeds a map call the JIT does without reading r1
/// (an inline array lookup or update, a direct map call, which sets r1 itself): the straight
/// code after it names r1 nowhere up to that call.
fn feeds_map_call_only(prog: &Program, pc: usize) -> bool {
    let insns = prog.insns();
    let mut q = pc + 2;
    while let Some(&i) = insns.get(q) {
        let (class, code) = (i.op & 0x07, i.op & 0xf0);
        if (class == BPF_JMP || class == BPF_JMP32) && code == BPF_CALL {
            return i.src == 0
                && (prog.inline_lookup_at(q).is_some()
                    || prog.inline_update_at(q).is_some()
                    || prog.direct_call_at(q).is_some());
        }
        let plain = matches!(class, BPF_ALU | BPF_ALU64 | BPF_LDX | BPF_ST)
            || (class == BPF_STX && i.mode() == BPF_MEM)
            || i.is_lddw();
        if !plain || i.dst == 1 || (i.src == 1 && !i.is_lddw()) {
            return false;
        }
        q += if i.is_lddw() { 2 } else { 1 };
    }
    false
}

/// Pairs of a per-CPU hash lookup and the update of the same key in the same map right after
/// it, both with their memo hit inline (bpftrace's `count()`, `sum()`, `hist()` on a key:
/// lookup, compute, update): `(lookup pc, update pc)`. The lookup's hit leaves the element
/// (r10), its key word (r9) and its value's address (r11, 0 after a miss) for the update,
/// which then skips the memo checks the lookup just made and takes the element's lock
/// straight away (the checks under the lock stay). Only when nothing between them can change
/// those registers or the key: the instructions in between are ALU operations that use no
/// scratch register, loads, stores through r10 that miss the key's bytes, `lddw` of a
/// constant and conditional jumps forward inside the stretch (no other call, no exit, no
/// jump into the stretch from outside), and the key is `r10 + k` at both calls with the same
/// `k`.
fn memo_pairs(prog: &Program, targets: &[bool]) -> Vec<(usize, usize)> {
    const MAX_GAP: usize = 64;
    let insns = prog.insns();
    let mut pairs = Vec::new();
    for (lpc, _) in insns.iter().enumerate() {
        let Some((lm, false)) = inline_memo(prog, lpc) else { continue };
        // The thread's words at a `[disp32]` from the thread pointer (else r11 addresses them).
        if i32::try_from(lm.thread_words).ok().and_then(|b| b.checked_add(32)).is_none() {
            continue;
        }
        let Some(k) = key_slot(insns, targets, lpc) else { continue };
        let key = (k as i64, k as i64 + lm.key_size as i64);
        let mut pc = lpc + 1;
        let upc = loop {
            if pc >= insns.len() || pc > lpc + MAX_GAP {
                break None;
            }
            let i = insns[pc];
            let (class, code) = (i.op & 0x07, i.op & 0xf0);
            let ok = match class {
                BPF_ALU | BPF_ALU64 => match code {
                    BPF_ADD | BPF_SUB | BPF_OR | BPF_AND | BPF_XOR | BPF_NEG => true,
                    BPF_MOV => i.off == 0,
                    BPF_LSH | BPF_RSH | BPF_ARSH => i.source() == BPF_K,
                    _ => false,
                },
                BPF_LDX => i.mode() == BPF_MEM,
                BPF_ST | BPF_STX => {
                    let w = match i.size() {
                        BPF_B => 1,
                        BPF_H => 2,
                        BPF_W => 4,
                        _ => 8,
                    };
                    let (lo, hi) = (i.off as i64, i.off as i64 + w);
                    i.mode() == BPF_MEM && i.dst == 10 && (hi <= key.0 || lo >= key.1)
                }
                BPF_LD => i.is_lddw() && i.src == 0,
                BPF_JMP | BPF_JMP32 if code == BPF_CALL => {
                    break (inline_memo(prog, pc) == Some((lm, true))).then_some(pc);
                }
                BPF_JMP | BPF_JMP32 => {
                    let t = pc as i64 + 1 + i.off as i64;
                    !matches!(code, BPF_JA | BPF_EXIT) && t > pc as i64 + 1
                }
                _ => false,
            };
            if !ok {
                break None;
            }
            pc += if i.is_lddw() { 2 } else { 1 };
        };
        let Some(upc) = upc else { continue };
        if key_slot(insns, targets, upc) != Some(k) {
            continue;
        }
        // No jump from outside lands in the stretch (function starts count as landing), and
        // the jumps inside stay inside (before or at the update).
        let inside = |t: usize| t > lpc && t <= upc;
        let mut entered = prog.subprogs().iter().any(|&f| inside(f));
        for (pc, i) in insns.iter().enumerate() {
            let (class, code) = (i.op & 0x07, i.op & 0xf0);
            if !(class == BPF_JMP || class == BPF_JMP32) || code == BPF_CALL || code == BPF_EXIT {
                continue;
            }
            if pc > 0 && insns[pc - 1].is_lddw() {
                continue;
            }
            let rel = if class == BPF_JMP32 && code == BPF_JA { i.imm as i64 } else { i.off as i64 };
            let t = pc as i64 + 1 + rel;
            let from_inside = pc > lpc && pc < upc;
            if usize::try_from(t).is_ok_and(inside) != from_inside || (from_inside && t > upc as i64) {
                entered = true;
            }
        }
        if !entered {
            pairs.push((lpc, upc));
        }
    }
    pairs
}

/// What a memo hit inlined by `Emitter::direct_map_call` leaves for the cold code after its
/// function (`Emitter::emit_cold`).
struct ColdMemo {
    /// The call instruction.
    pc: usize,
    m: crate::program::HashMemo,
    d: crate::program::DirectCall,
    flags_known: bool,
    /// A lookup whose update is paired: its miss sets r11 = 0.
    paired_lookup: bool,
    /// A paired update's jump to the full update, taken when its lookup missed.
    unpaired: Option<super::emit::LongFixup>,
    /// Jumps to the call.
    miss: Vec<super::emit::LongFixup>,
    /// Jumps taken with the element's lock held when the element changed: unlock, then the call.
    gone: Vec<super::emit::LongFixup>,
    /// Where the hit falls through to, where the cold code jumps back.
    done: usize,
}

/// One layout pass over the whole program.
struct Emitter<'a> {
    a: Asm,
    prog: &'a Program,
    insns: &'a [Insn],
    opts: Options,
    frames: &'a [Frame],
    prev: Option<&'a Layout>,
    freeze: bool,
    cur: Layout,
    rt: Runtime,
    /// The code reads the run state of `run.rs` (see [`Output::fast_entry`]).
    needs_run_state: bool,
    /// The code calls a helper (see [`Output::needs_context`]).
    calls_helpers: bool,
    /// The code calls out without needing the run context (see [`Output::calls_out`]).
    calls_out: bool,
    /// The code inlines a per-CPU lookup or makes a direct map call (both read the run's CPU
    /// slot at `[r12+8]`).
    percpu_inline: bool,
    /// Instructions some jump or call lands on (function starts included).
    targets: Vec<bool>,
    /// A fatal error (the program cannot be compiled).
    err: Option<String>,
    /// A displacement did not fit this pass (the layout is not final yet).
    inexact: bool,
    /// What the entries save (see [`entry_saves`]).
    entry_saves: Vec<Reg>,
    /// Lookups and updates of the same key one after the other (see [`memo_pairs`]): the
    /// lookups' pcs and the updates' pcs, sorted.
    paired_lookups: Vec<usize>,
    paired_updates: Vec<usize>,
    /// Emitting the claiming entry's own copy of subprogram 0 (see
    /// [`claim_const`](Emitter::claim_const)): its instructions' labels are the copy's, and
    /// its exits end the claimed run.
    claim_copy: bool,
    /// Each subprogram's registers that may be read before written ([`live_at_start`]).
    live_at_start: Vec<[bool; 16]>,
    /// Cold code of the function being emitted (see [`Emitter::emit_cold`]).
    cold: Vec<ColdMemo>,
    /// `(offset, pc)` of each cold block (the code of its call instruction), for `pc_map`.
    cold_map: Vec<(usize, u32)>,
}

impl<'a> Emitter<'a> {
    fn new(
        prog: &'a Program,
        opts: Options,
        frames: &'a [Frame],
        prev: Option<&'a Layout>,
        freeze: bool,
        rt: Runtime,
    ) -> Emitter<'a> {
        let insns = prog.insns();
        // Instructions' labels twice: subprogram 0's copy in the claiming entry has its own.
        let nlabels = 2 * insns.len() + 2 * frames.len() + 7;
        let targets = jump_targets(insns, prog.subprogs());
        let pairs = memo_pairs(prog, &targets);
        Emitter {
            a: Asm::new(),
            prog,
            insns,
            opts,
            frames,
            prev,
            freeze,
            cur: Layout { labels: vec![UNBOUND; nlabels], ..Layout::default() },
            rt,
            targets,
            entry_saves: entry_saves(insns, frames),
            paired_lookups: pairs.iter().map(|p| p.0).collect(),
            paired_updates: pairs.iter().map(|p| p.1).collect(),
            err: None,
            inexact: false,
            needs_run_state: false,
            calls_helpers: false,
            calls_out: false,
            percpu_inline: false,
            claim_copy: false,
            live_at_start: frames.iter().map(|f| live_at_start(prog, f)).collect(),
            cold: Vec::new(),
            cold_map: Vec::new(),
        }
    }

    fn fail(&mut self, msg: String) {
        if self.err.is_none() {
            self.err = Some(msg);
        }
    }

    fn label_index(&self, l: Label) -> usize {
        let n = self.insns.len();
        let s = self.frames.len();
        match l {
            Label::Insn(pc) if self.claim_copy => n + 2 * s + 7 + pc,
            Label::Insn(pc) => pc,
            Label::Func(k) => n + k,
            Label::Entry(k) => n + s + k,
            Label::Abort => n + 2 * s,
            Label::Epilogue => n + 2 * s + 1,
            Label::Unwind => n + 2 * s + 2,
            Label::FastEntry => n + 2 * s + 3,
            Label::CpuEntry => n + 2 * s + 4,
            Label::ClaimEntry => n + 2 * s + 5,
            Label::ClaimBusy => n + 2 * s + 6,
        }
    }

    fn bind(&mut self, l: Label) {
        let i = self.label_index(l);
        let pos = self.a.pos();
        if let Some(slot) = self.cur.labels.get_mut(i) {
            *slot = pos;
        }
    }

    /// The label's position in the previous pass, if there was one and it was bound.
    fn prev_pos(&self, l: Label) -> Option<i64> {
        let p = self.prev?;
        let v = *p.labels.get(self.label_index(l))?;
        (v != UNBOUND).then_some(v as i64)
    }

    /// A jump (conditional or not) to a label, short when the previous layout allows.
    fn jump(&mut self, cc: Option<Cond>, to: Label) {
        let site = self.cur.sites.len();
        let here = self.a.pos();
        self.cur.sites.push(here);
        let target = self.prev_pos(to);
        let short = match (self.prev, target) {
            (Some(p), Some(t)) => {
                if self.freeze {
                    p.short.get(site).copied().unwrap_or(false)
                } else {
                    match p.sites.get(site) {
                        Some(&s) => fits_i8(t - (s as i64 + 2)),
                        None => false,
                    }
                }
            }
            _ => {
                if self.prev.is_some() {
                    self.inexact = true;
                }
                false
            }
        };
        self.cur.short.push(short);
        let len = if short {
            2
        } else if cc.is_some() {
            6
        } else {
            5
        };
        let disp = target.map_or(0, |t| t - (here as i64 + len));
        if short {
            let d = if fits_i8(disp) {
                disp as i8
            } else {
                self.inexact = true;
                0
            };
            match cc {
                Some(c) => self.a.jcc_rel8(c, d),
                None => self.a.jmp_rel8(d),
            }
        } else {
            let d = self.disp32(disp);
            match cc {
                Some(c) => self.a.jcc_rel32(c, d),
                None => self.a.jmp_rel32(d),
            }
        }
    }

    fn disp32(&mut self, disp: i64) -> i32 {
        match i32::try_from(disp) {
            Ok(d) => d,
            Err(_) => {
                self.inexact = true;
                0
            }
        }
    }

    /// Displacement to a label from the end of an instruction of `len` bytes starting here.
    fn rel32(&mut self, to: Label, len: usize) -> i32 {
        match self.prev_pos(to) {
            Some(t) => self.disp32(t - (self.a.pos() + len) as i64),
            None => {
                if self.prev.is_some() {
                    self.inexact = true;
                }
                0
            }
        }
    }

    /// `pc + 1 + rel`, if it is an instruction of the program.
    fn target(&mut self, pc: usize, rel: i64) -> Option<usize> {
        let t = pc as i64 + 1 + rel;
        if t >= 0 && (t as usize) < self.insns.len() {
            Some(t as usize)
        } else {
            self.fail(format!("instruction {pc}: jump or call target {t} is outside the program"));
            None
        }
    }

    /// Index of the subprogram that starts at `pc`.
    fn subprog_at(&mut self, from: usize, pc: usize) -> Option<usize> {
        match self.prog.subprogs().binary_search(&pc) {
            Ok(k) => Some(k),
            Err(_) => {
                self.fail(format!("instruction {from}: instruction {pc} does not start a function"));
                None
            }
        }
    }

    fn emit_all(&mut self) {
        for k in 0..self.frames.len() {
            self.entry_trampoline(k);
        }
        self.fast_entry();
        self.cpu_entry();
        self.claim_entry();
        self.abort_and_epilogue();
        for k in 0..self.frames.len() {
            self.function(k);
            if self.err.is_some() {
                return;
            }
        }
        if let Some(k) = self.const_claim() {
            self.claim_const(k);
        }
    }

    /// The claim of `Options::claim`, when the claiming entry can take it as constants.
    fn const_claim(&self) -> Option<ConstClaim> {
        self.opts.claim.and_then(ConstClaim::of)
    }

    /// `Entry(k)`: the C-callable entry of subprogram k.
    fn entry_trampoline(&mut self, k: usize) {
        self.bind(Label::Entry(k));
        self.push_entry_saves();
        // 8 (return address) + an even number of saves: 40 more keep rsp 16-aligned. Those five run
        // slots, from r12: where the abort path stores an abort (0: call `abort_fn`, see
        // `fast_entry`), the CPU (0: no program run here inlines per-CPU lookups), the CPU
        // slot's word and the TLS offset of the "run in progress" byte to give back at the
        // end (0: none, see `claim_entry`), padding.
        self.a.zero(Reg::R11);
        for _ in 0..5 {
            self.a.push(Reg::R11);
        }
        self.a.mov_rr(true, Reg::R12, Reg::RSP);
        // r0 and r6..r9 start at zero (r1..r5 are the arguments).
        self.zero_regs(k, &[0, 6, 7, 8, 9]);
        let d = self.rel32(Label::Func(k), 5);
        self.a.call_rel32(d);
        self.jump(None, Label::Epilogue);
    }

    /// `FastEntry`: `Entry(0)` for runs without run state, with the abort record's address
    /// (rdx) in the slot at r12 and the CPU (rcx) at r12+8; r3 = r4 = r5 = 0.
    fn fast_entry(&mut self) {
        self.slot_entry(Label::FastEntry, Reg::RCX, Some(Reg::RDX));
    }

    /// `CpuEntry`: `Entry(0)` with the CPU (rdx) in the slot at r12+8; r3 = r4 = r5 = 0.
    fn cpu_entry(&mut self) {
        self.slot_entry(Label::CpuEntry, Reg::RDX, None);
    }

    /// An entry at `label` that calls `Func(0)` with the CPU (register `cpu`) in the slot at
    /// r12+8 and the abort record's address (register `record`, or 0) at r12; r3 = r4 = r5 =
    /// 0.
    fn slot_entry(&mut self, label: Label, cpu: Reg, record: Option<Reg>) {
        self.bind(label);
        self.push_entry_saves();
        self.a.zero(Reg::R11);
        for _ in 0..3 {
            self.a.push(Reg::R11);
        }
        self.a.push(cpu);
        self.a.push(record.unwrap_or(Reg::R11));
        self.a.mov_rr(true, Reg::R12, Reg::RSP);
        self.zero_regs(0, &[0, 3, 4, 5, 6, 7, 8, 9]);
        let d = self.rel32(Label::Func(0), 5);
        self.a.call_rel32(d);
        self.jump(None, Label::Epilogue);
    }

    /// `ClaimEntry` (see [`Output::claim_entry`]): rdi = r1, rsi = the `SlotClaim`, rdx = the
    /// abort record.
    fn claim_entry(&mut self) {
        use super::SlotClaim as C;
        use std::mem::offset_of;
        let off = |o: usize| o as i32;
        if self.const_claim().is_some() {
            return; // after the functions: `claim_const`
        }
        self.bind(Label::ClaimEntry);
        self.push_entry_saves();
        let d = Reg::RSI;
        // Not claimed: nothing ran (placed first, so that the checks below reach it with
        // short jumps backwards).
        let start = self.a.jump_fwd(None);
        let busy = self.a.pos();
        self.a.store_imm(Width::Dw, Mem::base(Reg::RDX, 0), CLAIM_RETRY as i32);
        self.a.zero(Reg::RAX);
        self.pop_entry_saves();
        self.a.ret();
        self.a.bind(start);
        // Restartable sequences registered: their cpu_id is the CPU the thread runs on.
        self.a.load(Width::W, Reg::RAX, Mem::base(d, off(offset_of!(C, have_rseq))));
        self.a.test_rr(false, Reg::RAX, Reg::RAX);
        self.a.jcc_back(Cond::E, busy);
        // No run in progress on this thread (else the general path counts the recursion).
        self.a.load(Width::Dw, Reg::RAX, Mem::base(d, off(offset_of!(C, active))));
        self.a.fs();
        self.a.load(Width::B, Reg::RAX, Mem::base(Reg::RAX, 0));
        self.a.test_rr(false, Reg::RAX, Reg::RAX);
        self.a.jcc_back(Cond::Ne, busy);
        // The thread's id, the slot's owner mark (0: not read yet, the general path reads it).
        self.a.load(Width::Dw, Reg::RAX, Mem::base(d, off(offset_of!(C, tid))));
        self.a.fs();
        self.a.load(Width::W, Reg::R8, Mem::base(Reg::RAX, 0));
        self.a.test_rr(false, Reg::R8, Reg::R8);
        self.a.jcc_back(Cond::E, busy);
        // cpu_id, below the slots (negative: rseq not registered on this thread).
        self.a.load(Width::Dw, Reg::RAX, Mem::base(d, off(offset_of!(C, rseq_cpu))));
        self.a.fs();
        self.a.load(Width::W, Reg::RCX, Mem::base(Reg::RAX, 0));
        self.a.load(Width::W, Reg::R9, Mem::base(d, off(offset_of!(C, nr))));
        self.a.alu_rr(Alu::Cmp, false, Reg::RCX, Reg::R9);
        self.a.jcc_back(Cond::Ae, busy);
        // The slot's word: slots + cpu * 64; claimed when free (0 -> the thread's id).
        self.a.mov_rr(true, Reg::R9, Reg::RCX);
        self.a.shift_ri(Shift::Shl, true, Reg::R9, 6);
        self.a.load(Width::Dw, Reg::R10, Mem::base(d, off(offset_of!(C, slots))));
        self.a.alu_rr(Alu::Add, true, Reg::R9, Reg::R10);
        self.a.zero(Reg::RAX);
        self.a.lock();
        self.a.cmpxchg(false, Mem::base(Reg::R9, 0), Reg::R8);
        self.a.jcc_back(Cond::Ne, busy);
        // The run is in progress (a probe hit meanwhile, in a signal handler, is refused).
        self.a.load(Width::Dw, Reg::R10, Mem::base(d, off(offset_of!(C, active))));
        self.a.fs();
        self.a.store_imm(Width::B, Mem::base(Reg::R10, 0), 1);
        // Run slots: abort record, CPU, the slot's word, the active byte's offset, padding.
        self.a.push(Reg::R10);
        self.a.push(Reg::R10);
        self.a.push(Reg::R9);
        self.a.push(Reg::RCX);
        self.a.push(Reg::RDX);
        self.a.mov_rr(true, Reg::R12, Reg::RSP);
        self.zero_regs(0, &[0, 2, 3, 4, 5, 6, 7, 8, 9]);
        let d = self.rel32(Label::Func(0), 5);
        self.a.call_rel32(d);
        self.jump(None, Label::Epilogue);
    }

    /// Zeroes the eBPF registers `regs` at an entry of subprogram `k`, but only those some
    /// instruction names (as destination or source; r1-r5 too when the program calls
    /// anything, since a call reads its arguments there; r6 for the legacy packet loads,
    /// which read it unnamed) and that the subprogram may read before writing them
    /// ([`live_at_start`]): the start value of any other register is unobservable
    /// (unverified programs included) and its `xor` only costs the entry an instruction (each
    /// counts on a probe hit: the path is issue-width-bound).
    fn zero_regs(&mut self, k: usize, regs: &[u8]) {
        let named = named_regs(self.insns);
        let live = &self.live_at_start[k];
        for &r in regs {
            if live[r as usize] && (r == 0 || named[r as usize]) {
                self.a.zero(reg(r));
            }
        }
    }

    /// `ClaimEntry` with the claim known when compiling (`Options::claim`), placed after the
    /// functions: the same checks and claim as [`claim_entry`](Self::claim_entry), its words
    /// read straight from their static-TLS offsets and the slots' address an immediate (the
    /// `SlotClaim` in rsi is not read), then subprogram 0's body in a copy of its own that
    /// runs in the entry's frame (one frame a claimed run: no call, no prologue pushes, since
    /// the entry saves every register a frame saves, see [`entry_saves`]), whose exits give
    /// the slot back and return ([`claim_return`](Self::claim_return)). Aborts and exit
    /// requests end through the shared epilogue, as from the other entries (the run slots
    /// are laid out as theirs). No rseq: every run goes back.
    ///
    /// ```text
    /// busy:       abort[0] = CLAIM_RETRY; eax = 0; pops; ret    (reached by jumps only)
    /// ClaimEntry: pushes; checks (else busy); lock cmpxchg slot (else busy); active = 1
    ///             run slots; r12 = rsp; [rbp = rsp; rsp -= 512]; zeroes
    ///             subprogram 0 (copy): ... exit: claim_return
    /// ```
    fn claim_const(&mut self, k: ConstClaim) {
        // Not claimed: nothing ran (placed first, reached by jumps backwards).
        self.bind(Label::ClaimBusy);
        if !k.have_rseq {
            self.bind(Label::ClaimEntry);
        }
        let busy = self.a.pos();
        self.a.store_imm(Width::Dw, Mem::base(Reg::RDX, 0), CLAIM_RETRY as i32);
        self.a.zero(Reg::RAX);
        if !k.have_rseq {
            self.a.ret();
            return;
        }
        self.pop_entry_saves();
        self.a.ret();
        self.bind(Label::ClaimEntry);
        self.push_entry_saves();
        // No run in progress on this thread.
        self.a.fs();
        self.a.cmp_mb(Mem::abs(k.active), 0);
        self.a.jcc_back(Cond::Ne, busy);
        // The thread's id (0: not read yet).
        self.a.fs();
        self.a.load(Width::W, Reg::R8, Mem::abs(k.tid));
        self.a.test_rr(false, Reg::R8, Reg::R8);
        self.a.jcc_back(Cond::E, busy);
        // cpu_id below the slots.
        self.a.fs();
        self.a.load(Width::W, Reg::RCX, Mem::abs(k.rseq_cpu));
        self.a.alu_ri(Alu::Cmp, false, Reg::RCX, k.nr as i32);
        self.a.jcc_back(Cond::Ae, busy);
        // The slot's word: slots + cpu * 64 (cpu < nr, so no overflow).
        self.a.imul_rri(true, Reg::R9, Reg::RCX, 64);
        self.a.mov_imm(Reg::R10, k.slots);
        self.a.alu_rr(Alu::Add, true, Reg::R9, Reg::R10);
        self.a.zero(Reg::RAX);
        self.a.lock();
        self.a.cmpxchg(false, Mem::base(Reg::R9, 0), Reg::R8);
        self.a.jcc_back(Cond::Ne, busy);
        self.a.fs();
        self.a.store_imm(Width::B, Mem::abs(k.active), 1);
        // Run slots as `claim_entry` lays them out, but for the active byte's offset, which
        // the shared epilogue takes as a constant (`abort_and_epilogue`), and the padding.
        self.a.alu_ri(Alu::Sub, true, Reg::RSP, 16);
        self.a.push(Reg::R9);
        self.a.push(Reg::RCX);
        self.a.push(Reg::RDX);
        self.a.mov_rr(true, Reg::R12, Reg::RSP);
        // Subprogram 0's frame, in this one: rsp is 16-aligned here (8 for the return
        // address, an even number of saves, five slots), and the 512 bytes of stack keep it so.
        let frames = self.frames;
        let f = &frames[0];
        if f.uses_stack {
            self.a.mov_rr(true, Reg::RBP, Reg::RSP);
            self.a.alu_ri(Alu::Sub, true, Reg::RSP, STACK_SIZE as i32);
        }
        self.zero_regs(0, &[0, 2, 3, 4, 5, 6, 7, 8, 9]);
        self.claim_copy = true;
        self.body(0);
        self.claim_copy = false;
    }

    /// An exit of the claiming entry's copy of subprogram 0 (see
    /// [`claim_const`](Self::claim_const)): the shared epilogue's work with what is known
    /// here (a slot is held, the active byte at a constant offset): the run is over, then the
    /// slot free (a plain store: release order on x86, after every access of the run).
    fn claim_return(&mut self, k: ConstClaim) {
        self.a.load(Width::Dw, Reg::R11, Mem::base(Reg::R12, 16));
        self.a.fs();
        self.a.store_imm(Width::B, Mem::abs(k.active), 0);
        self.a.store_imm(Width::W, Mem::base(Reg::R11, 0), 0);
        self.a.lea(Reg::RSP, Mem::base(Reg::R12, 40));
        self.pop_entry_saves();
        self.a.ret();
    }

    /// Pushes what the entries save ([`entry_saves`]).
    fn push_entry_saves(&mut self) {
        for k in 0..self.entry_saves.len() {
            self.a.push(self.entry_saves[k]);
        }
    }

    /// Pops what [`push_entry_saves`](Self::push_entry_saves) pushed.
    fn pop_entry_saves(&mut self) {
        for k in (0..self.entry_saves.len()).rev() {
            self.a.pop(self.entry_saves[k]);
        }
    }

    /// The abort path and the entries' shared epilogue.
    fn abort_and_epilogue(&mut self) {
        self.bind(Label::Abort);
        self.a.mov_rr(true, Reg::RSP, Reg::R12);
        // Entered by the fast entry: store the abort where it says, no call.
        self.a.load(Width::Dw, Reg::RAX, Mem::base(Reg::RSP, 0));
        self.a.test_rr(true, Reg::RAX, Reg::RAX);
        let slow = self.a.jump_fwd(Some(Cond::E));
        self.a.store(Width::Dw, Mem::base(Reg::RAX, 0), Reg::R9);
        self.a.store(Width::Dw, Mem::base(Reg::RAX, 8), Reg::R10);
        self.a.store(Width::Dw, Mem::base(Reg::RAX, 16), Reg::R11);
        self.a.mov_ri32(Reg::RAX, 1);
        self.jump(None, Label::Unwind);
        self.a.bind(slow);
        self.a.mov_rr(true, Reg::RDI, Reg::R9);
        self.a.mov_rr(true, Reg::RSI, Reg::R10);
        self.a.mov_rr(true, Reg::RDX, Reg::R11);
        self.call_abs(self.rt.abort_fn, Reg::RAX);
        self.a.mov_ri32(Reg::RAX, 1);
        // The run ends with rax: unwind to the innermost entry (again, after an abort).
        self.bind(Label::Unwind);
        self.a.mov_rr(true, Reg::RSP, Reg::R12);
        self.bind(Label::Epilogue);
        // A slot claimed by `ClaimEntry`: the run is over, then the slot free (a plain store:
        // release order on x86, after every access of the run).
        self.a.load(Width::Dw, Reg::R11, Mem::base(Reg::RSP, 16));
        self.a.test_rr(true, Reg::R11, Reg::R11);
        let none = self.a.jump_fwd(Some(Cond::E));
        if let Some(k) = self.const_claim() {
            // Every claimed run of this code is `claim_const`'s: the offset is a constant.
            self.a.fs();
            self.a.store_imm(Width::B, Mem::abs(k.active), 0);
        } else {
            self.a.load(Width::Dw, Reg::R10, Mem::base(Reg::RSP, 24));
            self.a.fs();
            self.a.store_imm(Width::B, Mem::base(Reg::R10, 0), 0);
        }
        self.a.store_imm(Width::W, Mem::base(Reg::R11, 0), 0);
        self.a.bind(none);
        self.a.alu_ri(Alu::Add, true, Reg::RSP, 40);
        self.pop_entry_saves();
        self.a.ret();
    }

    /// `Func(k)`: prologue and body of subprogram k.
    fn function(&mut self, k: usize) {
        let frames = self.frames;
        let f = &frames[k];
        self.bind(Label::Func(k));
        for &r in &f.saves {
            self.a.push(r);
        }
        if f.uses_stack {
            self.a.mov_rr(true, Reg::RBP, Reg::RSP);
        }
        if f.stack > 0 {
            self.a.alu_ri(Alu::Sub, true, Reg::RSP, f.stack);
        }
        self.body(k);
    }

    /// The instructions of subprogram k, one after the other.
    fn body(&mut self, k: usize) {
        let frames = self.frames;
        let f = &frames[k];
        let (start, end) = (f.start, f.end);
        let mut pc = start;
        while pc < end {
            self.bind(Label::Insn(pc));
            let insn = self.insns[pc];
            if insn.is_lddw() {
                self.lddw(pc);
                if pc + 1 < end {
                    self.bind(Label::Insn(pc + 1));
                }
                pc += 2;
                continue;
            }
            if self.lea_pair(pc, end) {
                self.bind(Label::Insn(pc + 1));
                pc += 2;
                continue;
            }
            match insn.class() {
                BPF_ALU | BPF_ALU64 => self.alu(pc, insn),
                BPF_LDX => self.ldx(pc, insn),
                BPF_ST => self.st(pc, insn),
                BPF_STX => self.stx(pc, insn),
                BPF_JMP | BPF_JMP32 => self.jmp(pc, insn, k),
                _ => self.fail(format!("instruction {pc}: unsupported opcode {:#04x}", insn.op)),
            }
            pc += 1;
        }
        self.emit_cold();
    }

    /// `rD = rS; rD += imm` (64-bit, the pair bpftrace and clang emit for stack pointers such
    /// as `r2 = r10 - 16`) as one `lea`, when no jump lands on the add (so the pair always
    /// runs whole) and both are in this function. Neither instruction can fault. Emits it and
    /// returns true, or emits nothing.
    fn lea_pair(&mut self, pc: usize, end: usize) -> bool {
        let (a, b) = match (self.insns.get(pc), self.insns.get(pc + 1)) {
            (Some(a), Some(b)) if pc + 1 < end => (*a, *b),
            _ => return false,
        };
        if a.op != (BPF_ALU64 | BPF_X | BPF_MOV)
            || a.off != 0
            || a.dst == a.src
            || b.op != (BPF_ALU64 | BPF_K | BPF_ADD)
            || b.dst != a.dst
            || self.is_jump_target(pc + 1)
        {
            return false;
        }
        self.a.lea(reg(a.dst), Mem::base(reg(a.src), b.imm));
        true
    }

    /// Whether some jump or call of the program lands on instruction `t`.
    fn is_jump_target(&self, t: usize) -> bool {
        self.targets.get(t).copied().unwrap_or(true)
    }

    fn epilogue(&mut self, k: usize) {
        if self.claim_copy
            && let Some(c) = self.const_claim()
        {
            return self.claim_return(c);
        }
        let frames = self.frames;
        let f = &frames[k];
        if f.uses_stack {
            self.a.mov_rr(true, Reg::RSP, Reg::RBP);
        } else if f.stack > 0 {
            self.a.alu_ri(Alu::Add, true, Reg::RSP, f.stack);
        }
        for &r in f.saves.iter().rev() {
            self.a.pop(r);
        }
        self.a.ret();
    }

    // ---- ALU and ALU64 ----

    fn alu(&mut self, pc: usize, insn: Insn) {
        let w = insn.class() == BPF_ALU64;
        let dst = reg(insn.dst);
        let src = (insn.source() == BPF_X).then(|| reg(insn.src));
        let imm = insn.imm;
        match insn.code() {
            BPF_ADD => self.alu_op(Alu::Add, w, dst, src, imm),
            BPF_SUB => self.alu_op(Alu::Sub, w, dst, src, imm),
            BPF_OR => self.alu_op(Alu::Or, w, dst, src, imm),
            BPF_AND => self.alu_op(Alu::And, w, dst, src, imm),
            BPF_XOR => self.alu_op(Alu::Xor, w, dst, src, imm),
            BPF_MUL => match src {
                Some(s) => self.a.imul_rr(w, dst, s),
                None => self.mul_imm(w, dst, imm),
            },
            BPF_DIV | BPF_MOD => {
                let signed = match insn.off {
                    0 => false,
                    1 => true,
                    o => return self.fail(format!("instruction {pc}: division with offset {o}")),
                };
                self.divmod(w, signed, insn.code() == BPF_MOD, dst, src, imm)
            }
            BPF_LSH => self.shift(Shift::Shl, w, dst, src, imm),
            BPF_RSH => self.shift(Shift::Shr, w, dst, src, imm),
            BPF_ARSH => self.shift(Shift::Sar, w, dst, src, imm),
            BPF_NEG => self.a.neg(w, dst),
            BPF_MOV => self.mov(pc, w, dst, src, imm, insn.off),
            BPF_END => self.end(pc, insn),
            _ => self.fail(format!("instruction {pc}: unsupported opcode {:#04x}", insn.op)),
        }
    }

    /// add/sub/or/and/xor with a register or a (sign-extended) immediate.
    fn alu_op(&mut self, op: Alu, w: bool, dst: Reg, src: Option<Reg>, imm: i32) {
        match src {
            Some(s) => self.a.alu_rr(op, w, dst, s),
            None => self.a.alu_ri(op, w, dst, imm),
        }
    }

    /// Multiplication by a constant: a shift or an `lea` (one cycle), or a shift and an add
    /// (two), where they give the same low bits as `imul` (three cycles).
    fn mul_imm(&mut self, w: bool, dst: Reg, imm: i32) {
        match imm {
            0 => self.a.zero(dst),
            1 if w => {}
            1 => self.a.mov_rr(false, dst, dst),
            3 | 5 | 9 => {
                let m = Mem::indexed(dst, dst, (imm - 1).trailing_zeros() as u8);
                if w {
                    self.a.lea(dst, m);
                } else {
                    self.a.lea32(dst, m);
                }
            }
            _ if imm > 0 && (imm as u32).is_power_of_two() => {
                self.a.shift_ri(Shift::Shl, w, dst, imm.trailing_zeros() as u8);
            }
            _ if imm > 16 && ((imm - 1) as u32).is_power_of_two() => {
                // x * (2^k + 1) = (x << k) + x: two cycles instead of three.
                self.a.mov_rr(w, Reg::R11, dst);
                self.a.shift_ri(Shift::Shl, w, Reg::R11, (imm - 1).trailing_zeros() as u8);
                self.a.alu_rr(Alu::Add, w, dst, Reg::R11);
            }
            _ => self.a.imul_rri(w, dst, dst, imm),
        }
    }

    fn mov(&mut self, pc: usize, w: bool, dst: Reg, src: Option<Reg>, imm: i32, off: i16) {
        let Some(s) = src else {
            if imm == 0 {
                self.a.zero(dst);
            } else if w {
                self.a.mov_imm(dst, imm as i64 as u64);
            } else {
                self.a.mov_ri32(dst, imm as u32);
            }
            return;
        };
        match (off, w) {
            (0, true) => {
                if dst != s {
                    self.a.mov_rr(true, dst, s);
                }
            }
            (0, false) => self.a.mov_rr(false, dst, s),
            (8, _) => self.a.movsx_rr(w, dst, s, 8),
            (16, _) => self.a.movsx_rr(w, dst, s, 16),
            (32, true) => self.a.movsxd_rr(dst, s),
            _ => self.fail(format!("instruction {pc}: mov with offset {off}")),
        }
    }

    fn shift(&mut self, op: Shift, w: bool, dst: Reg, src: Option<Reg>, imm: i32) {
        let Some(s) = src else {
            let count = (imm as u32 & if w { 63 } else { 31 }) as u8;
            if count != 0 {
                self.a.shift_ri(op, w, dst, count);
            } else if !w {
                self.a.mov_rr(false, dst, dst);
            }
            return;
        };
        if self.opts.bmi2 {
            self.a.shiftx(op, w, dst, dst, s);
        } else if s == Reg::RCX {
            self.a.shift_cl(op, w, dst);
        } else {
            // The count must be in cl, which is r4: park r4 in r11 meanwhile.
            self.a.mov_rr(true, Reg::R11, Reg::RCX);
            self.a.mov_rr(true, Reg::RCX, s);
            if dst == Reg::RCX {
                self.a.shift_cl(op, w, Reg::R11);
            } else {
                self.a.shift_cl(op, w, dst);
            }
            self.a.mov_rr(true, Reg::RCX, Reg::R11);
        }
    }

    /// Division and modulo. x86 `div`/`idiv` fault on a zero divisor and on INT_MIN / -1;
    /// eBPF defines x / 0 = 0, x % 0 = x, INT_MIN s/ -1 = INT_MIN, INT_MIN s% -1 = 0.
    fn divmod(&mut self, w: bool, signed: bool, is_mod: bool, dst: Reg, src: Option<Reg>, imm: i32) {
        let Some(s) = src else {
            let divisor = if w { imm as i64 as u64 } else { imm as u32 as u64 };
            if imm == 0 {
                self.divmod_by_zero(w, is_mod, dst);
            } else if signed && imm == -1 {
                self.divmod_by_minus_one(w, is_mod, dst);
            } else if !signed && divisor.is_power_of_two() {
                let k = divisor.trailing_zeros() as u8;
                if is_mod {
                    // divisor - 1 < 2^31: a positive immediate either way.
                    self.a.alu_ri(Alu::And, w, dst, (divisor - 1) as i32);
                } else if k > 0 {
                    self.a.shift_ri(Shift::Shr, w, dst, k);
                } else if !w {
                    self.a.mov_rr(false, dst, dst);
                }
            } else {
                if w {
                    self.a.mov_imm(Reg::R11, divisor);
                } else {
                    self.a.mov_ri32(Reg::R11, divisor as u32);
                }
                self.div_core(w, signed, is_mod, dst);
            }
            return;
        };
        self.a.mov_rr(true, Reg::R11, s);
        self.a.test_rr(w, Reg::R11, Reg::R11);
        let zero = self.a.jump_fwd(Some(Cond::E));
        let minus_one = if signed {
            self.a.alu_ri(Alu::Cmp, w, Reg::R11, -1);
            Some(self.a.jump_fwd(Some(Cond::E)))
        } else {
            None
        };
        self.div_core(w, signed, is_mod, dst);
        let done = self.a.jump_fwd(None);
        let done2 = minus_one.map(|m| {
            self.a.bind(m);
            self.divmod_by_minus_one(w, is_mod, dst);
            self.a.jump_fwd(None)
        });
        self.a.bind(zero);
        self.divmod_by_zero(w, is_mod, dst);
        self.a.bind(done);
        if let Some(d) = done2 {
            self.a.bind(d);
        }
    }

    fn divmod_by_zero(&mut self, w: bool, is_mod: bool, dst: Reg) {
        if !is_mod {
            self.a.zero(dst);
        } else if !w {
            self.a.mov_rr(false, dst, dst);
        }
    }

    fn divmod_by_minus_one(&mut self, w: bool, is_mod: bool, dst: Reg) {
        if is_mod {
            self.a.zero(dst);
        } else {
            self.a.neg(w, dst);
        }
    }

    /// `dst = dst / r11` or `dst % r11` with `div`/`idiv`, keeping rax (r0) and rdx (r3)
    /// unless one of them is `dst`. The divisor is non-zero (and not -1 if signed).
    fn div_core(&mut self, w: bool, signed: bool, is_mod: bool, dst: Reg) {
        if dst != Reg::RAX {
            self.a.mov_rr(true, Reg::R9, Reg::RAX);
        }
        if dst != Reg::RDX {
            self.a.mov_rr(true, Reg::R10, Reg::RDX);
        }
        if dst != Reg::RAX {
            self.a.mov_rr(w, Reg::RAX, dst);
        }
        if signed {
            self.a.sign_extend_ax(w);
            self.a.idiv(w, Reg::R11);
        } else {
            self.a.zero(Reg::RDX);
            self.a.div(w, Reg::R11);
        }
        let result = if is_mod { Reg::RDX } else { Reg::RAX };
        if result != dst {
            self.a.mov_rr(w, dst, result);
        }
        if dst != Reg::RAX {
            self.a.mov_rr(true, Reg::RAX, Reg::R9);
        }
        if dst != Reg::RDX {
            self.a.mov_rr(true, Reg::RDX, Reg::R10);
        }
    }

    /// Byte order conversions: class ALU converts to little (no swap) or big (swap) endian;
    /// class ALU64 always swaps. Results are truncated to the width and zero-extended.
    fn end(&mut self, pc: usize, insn: Insn) {
        let dst = reg(insn.dst);
        let swap = insn.class() == BPF_ALU64 || insn.source() == BPF_TO_BE;
        match (insn.imm, swap) {
            (16, true) => {
                self.a.rol16_8(dst);
                self.a.movzx_rr(dst, dst, 16);
            }
            (32, true) => self.a.bswap(false, dst),
            (64, true) => self.a.bswap(true, dst),
            (16, false) => self.a.movzx_rr(dst, dst, 16),
            (32, false) => self.a.mov_rr(false, dst, dst),
            (64, false) => {}
            (b, _) => self.fail(format!("instruction {pc}: byte swap of width {b}")),
        }
    }

    // ---- loads and stores ----

    fn lddw(&mut self, pc: usize) {
        let insn = self.insns[pc];
        let Some(&next) = self.insns.get(pc + 1) else {
            return self.fail(format!("instruction {pc}: lddw without its second half"));
        };
        let dst = reg(insn.dst);
        match insn.src {
            // A map's address in r1 for a map call that does not read it: nothing to load.
            0 if insn.dst == 1 && feeds_map_call_only(self.prog, pc) => {}
            0 => {
                let v = insn.wide_imm(next);
                if v == 0 {
                    self.a.zero(dst);
                } else {
                    self.a.mov_imm(dst, v);
                }
            }
            BPF_PSEUDO_FUNC => {
                self.needs_run_state = true;
                let Some(t) = self.target(pc, insn.imm as i64) else { return };
                let Some(k) = self.subprog_at(pc, t) else { return };
                let d = self.rel32(Label::Entry(k), 7);
                self.a.lea_rip(dst, d);
            }
            s => self.fail(format!("instruction {pc}: lddw with unresolved pseudo source {s}")),
        }
    }

    fn width(insn: Insn) -> Width {
        match insn.size() {
            BPF_B => Width::B,
            BPF_H => Width::H,
            BPF_W => Width::W,
            _ => Width::Dw,
        }
    }

    fn ldx(&mut self, pc: usize, insn: Insn) {
        let m = Mem::base(reg(insn.src), insn.off as i32);
        let dst = reg(insn.dst);
        let width = Self::width(insn);
        match insn.mode() {
            BPF_MEM => self.a.load(width, dst, m),
            BPF_MEMSX if width != Width::Dw => self.a.load_sx(width, dst, m),
            _ => self.fail(format!("instruction {pc}: unsupported opcode {:#04x}", insn.op)),
        }
    }

    fn st(&mut self, pc: usize, insn: Insn) {
        if insn.mode() != BPF_MEM {
            return self.fail(format!("instruction {pc}: unsupported opcode {:#04x}", insn.op));
        }
        let m = Mem::base(reg(insn.dst), insn.off as i32);
        self.a.store_imm(Self::width(insn), m, insn.imm);
    }

    fn stx(&mut self, pc: usize, insn: Insn) {
        let m = Mem::base(reg(insn.dst), insn.off as i32);
        match insn.mode() {
            BPF_MEM => self.a.store(Self::width(insn), m, reg(insn.src)),
            BPF_ATOMIC => self.atomic(pc, insn),
            _ => self.fail(format!("instruction {pc}: unsupported opcode {:#04x}", insn.op)),
        }
    }

    /// Atomic read-modify-write of `[dst + off]` with `src`.
    fn atomic(&mut self, pc: usize, insn: Insn) {
        let w = match insn.size() {
            BPF_DW => true,
            BPF_W => false,
            _ => return self.fail(format!("instruction {pc}: atomic operation of size {}", insn.size_bytes())),
        };
        let m = Mem::base(reg(insn.dst), insn.off as i32);
        let src = reg(insn.src);
        let fetch = insn.imm & BPF_FETCH != 0;
        let op = match insn.imm & !BPF_FETCH {
            0x00 => Some(Alu::Add),
            0x40 => Some(Alu::Or),
            0x50 => Some(Alu::And),
            0xa0 => Some(Alu::Xor),
            _ => None,
        };
        match (insn.imm, op) {
            (BPF_XCHG, _) => self.a.xchg_mr(w, m, src),
            (BPF_CMPXCHG, _) => {
                self.a.lock();
                self.a.cmpxchg(w, m, src);
                if !w {
                    // r0 gets the old value zero-extended, also when the exchange succeeded
                    // (and cmpxchg did not write eax).
                    self.a.mov_rr(false, Reg::RAX, Reg::RAX);
                }
            }
            (_, Some(op)) if !fetch => {
                self.a.lock();
                self.a.alu_mr(op, w, m, src);
            }
            (_, Some(Alu::Add)) => {
                self.a.lock();
                self.a.xadd(w, m, src);
            }
            (_, Some(op)) => self.fetch_loop(op, w, reg(insn.dst), insn.off as i32, src),
            (imm, None) => self.fail(format!("instruction {pc}: unknown atomic operation {imm:#x}")),
        }
    }

    /// Fetching or/and/xor: a `lock cmpxchg` loop. `src` receives the old value.
    fn fetch_loop(&mut self, op: Alu, w: bool, base: Reg, off: i32, src: Reg) {
        let at = Mem::base(Reg::R11, 0);
        self.a.lea(Reg::R11, Mem::base(base, off));
        self.a.mov_rr(true, Reg::R10, Reg::RAX);
        let width = if w { Width::Dw } else { Width::W };
        self.a.load(width, Reg::RAX, at);
        let top = self.a.pos();
        self.a.mov_rr(w, Reg::R9, Reg::RAX);
        let operand = if src == Reg::RAX { Reg::R10 } else { src };
        self.a.alu_rr(op, w, Reg::R9, operand);
        self.a.lock();
        self.a.cmpxchg(w, at, Reg::R9);
        self.a.jcc_back(Cond::Ne, top);
        if src == Reg::RAX {
            if !w {
                self.a.mov_rr(false, Reg::RAX, Reg::RAX);
            }
        } else {
            self.a.mov_rr(w, src, Reg::RAX);
            self.a.mov_rr(true, Reg::RAX, Reg::R10);
        }
    }

    // ---- JMP and JMP32 ----

    fn jmp(&mut self, pc: usize, insn: Insn, k: usize) {
        let is32 = insn.class() == BPF_JMP32;
        match insn.code() {
            BPF_JA => {
                let rel = if is32 { insn.imm as i64 } else { insn.off as i64 };
                if let Some(t) = self.target(pc, rel)
                    && t != pc + 1
                {
                    self.jump(None, Label::Insn(t));
                }
            }
            BPF_CALL if !is32 => self.call(pc, insn),
            BPF_EXIT if !is32 => self.epilogue(k),
            _ => self.cond_jump(pc, insn),
        }
    }

    fn cond_jump(&mut self, pc: usize, insn: Insn) {
        let w = insn.class() == BPF_JMP;
        let code = insn.code();
        let cc = match code {
            BPF_JEQ => Cond::E,
            BPF_JNE | BPF_JSET => Cond::Ne,
            BPF_JGT => Cond::A,
            BPF_JGE => Cond::Ae,
            BPF_JLT => Cond::B,
            BPF_JLE => Cond::Be,
            BPF_JSGT => Cond::G,
            BPF_JSGE => Cond::Ge,
            BPF_JSLT => Cond::L,
            BPF_JSLE => Cond::Le,
            _ => return self.fail(format!("instruction {pc}: unsupported opcode {:#04x}", insn.op)),
        };
        let Some(t) = self.target(pc, insn.off as i64) else { return };
        if t == pc + 1 {
            return; // jumps to where it falls through anyway: no effect
        }
        let dst = reg(insn.dst);
        match (insn.source() == BPF_X, code == BPF_JSET) {
            (true, true) => self.a.test_rr(w, dst, reg(insn.src)),
            (true, false) => self.a.alu_rr(Alu::Cmp, w, dst, reg(insn.src)),
            (false, true) => self.a.test_ri(w, dst, insn.imm),
            (false, false) if insn.imm == 0 => self.a.test_rr(w, dst, dst),
            (false, false) => self.a.alu_ri(Alu::Cmp, w, dst, insn.imm),
        }
        self.jump(Some(cc), Label::Insn(t));
    }

    fn call(&mut self, pc: usize, insn: Insn) {
        if insn.op == OP_CALLX {
            return self.callx(pc, reg(insn.dst));
        }
        match insn.src {
            0 => {
                if let Some(a) = self.prog.inline_lookup_at(pc) {
                    return self.inline_array_lookup(a);
                }
                if let Some(a) = self.prog.inline_update_at(pc) {
                    return self.inline_array_update(pc, a);
                }
                if let Some(d) = self.prog.direct_call_at(pc) {
                    return self.direct_map_call(pc, d, insn.imm);
                }
                let id = insn.imm as u32;
                let Some(h) = self.prog.helpers().get(id) else {
                    return self.fail(format!("instruction {pc}: call to unknown helper id {id}"));
                };
                if let Some(c) = self.prog.cached_helper_at(pc).filter(|_| !h.may_exit) {
                    return self.cached_helper(c, h.func as usize as u64);
                }
                // r1..r5 are already the argument registers; the result lands in rax = r0.
                // Only helpers marked `may_exit` end runs (`end_if_requested` marks the run
                // state as needed); the others need the run context of the caller.
                self.calls_helpers = true;
                let may_exit = h.may_exit;
                self.call_abs(h.func as usize as u64, Reg::RAX);
                if may_exit {
                    self.end_if_requested();
                }
            }
            BPF_PSEUDO_CALL => {
                let Some(t) = self.target(pc, insn.imm as i64) else { return };
                let Some(k) = self.subprog_at(pc, t) else { return };
                let d = self.rel32(Label::Func(k), 5);
                self.a.call_rel32(d);
            }
            s => self.fail(format!("instruction {pc}: call with unsupported source {s}")),
        }
    }

    /// `call bpf_map_lookup_elem` on an array map, inline (the kernel's `array_map_gen_lookup`):
    /// `r0 = *(u32 *)r2 < max_entries ? values + index * elem_size : 0`. r1..r5 are left as
    /// they were (a helper call could have clobbered them, so nothing reads them after). A
    /// fault reading the key is a fault of this instruction, as for any load.
    fn inline_array_lookup(&mut self, a: crate::program::InlineArray) {
        if a.cpu_stride != 0 {
            self.percpu_inline = true;
        }
        self.a.load(Width::W, Reg::R11, Mem::base(reg(2), 0));
        self.a.zero(Reg::RAX);
        self.a.alu_ri(Alu::Cmp, false, Reg::R11, a.max_entries as i32);
        let out = self.a.jump_fwd(Some(Cond::Ae));
        let size = a.elem_size;
        self.a.mov_imm(Reg::RAX, a.values);
        if matches!(size, 1 | 2 | 4 | 8) {
            self.a.lea(Reg::RAX, Mem::indexed(Reg::RAX, Reg::R11, size.trailing_zeros() as u8));
        } else {
            if size.is_power_of_two() {
                self.a.shift_ri(Shift::Shl, true, Reg::R11, size.trailing_zeros() as u8);
            } else {
                // elem_size <= i32::MAX (checked at load); index < 2^32: no overflow.
                self.a.imul_rri(true, Reg::R11, Reg::R11, size as i32);
            }
            self.a.alu_rr(Alu::Add, true, Reg::RAX, Reg::R11);
        }
        if a.cpu_stride != 0 {
            // The run's CPU slot (below the map's CPUs: the runtime's slots are the possible
            // CPUs, as the map's), times the bytes of one CPU's values (< 2^31, checked at load).
            self.a.imul_rmi(Reg::R10, Mem::base(Reg::R12, 8), a.cpu_stride as i32);
            self.a.alu_rr(Alu::Add, true, Reg::RAX, Reg::R10);
        }
        self.a.bind(out);
    }

    /// `call bpf_map_update_elem` on an array map whose values are whole 8-byte words, inline
    /// (see `Relocator::inline_update`): r2 = &key, r3 = &value, r4 = flags; r0 = 0 or
    /// -errno, checked in the helper's order. Uses r10, r11 and rax (r1..r5 are dead after a
    /// helper call). Faults reading the key or the value are faults of this instruction.
    fn inline_array_update(&mut self, pc: usize, a: crate::program::InlineArray) {
        const EINVAL: i32 = -22;
        const E2BIG: i32 = -7;
        const EEXIST: i32 = -17;
        const BPF_NOEXIST: i32 = 1;
        const BPF_EXIST: i32 = 2;
        const BPF_F_LOCK: i32 = 4;
        if a.cpu_stride != 0 {
            self.percpu_inline = true;
        }
        let mut fail = Vec::new();
        // Flags known when compiling (`r4 = BPF_ANY` or `BPF_EXIST` just before the call, the
        // usual case): only the index is checked at run time.
        let known = const_reg(self.insns, &self.targets, pc, 4).filter(|&f| f == 0 || f == BPF_EXIST);
        if known.is_none() {
            // Flags beyond BPF_EXIST (BPF_F_LOCK aside): -EINVAL.
            self.a.mov_ri_sx(Reg::RAX, EINVAL);
            self.a.mov_rr(true, Reg::R11, reg(4));
            self.a.alu_ri(Alu::And, true, Reg::R11, !BPF_F_LOCK);
            self.a.alu_ri(Alu::Cmp, true, Reg::R11, BPF_EXIST);
            fail.push(self.a.jump_fwd32(Some(Cond::A)));
        }
        // An index beyond the array: -E2BIG.
        self.a.mov_ri_sx(Reg::RAX, E2BIG);
        self.a.load(Width::W, Reg::R11, Mem::base(reg(2), 0));
        self.a.alu_ri(Alu::Cmp, false, Reg::R11, a.max_entries as i32);
        fail.push(self.a.jump_fwd32(Some(Cond::Ae)));
        if known.is_none() {
            self.a.mov_ri_sx(Reg::RAX, EEXIST);
            self.a.test_ri(true, reg(4), BPF_NOEXIST);
            fail.push(self.a.jump_fwd32(Some(Cond::Ne)));
            self.a.mov_ri_sx(Reg::RAX, EINVAL);
            self.a.test_ri(true, reg(4), BPF_F_LOCK);
            fail.push(self.a.jump_fwd32(Some(Cond::Ne)));
        }
        // The failures jump over the copy to the end, their -errno in rax (the copy falls
        // through: no jump on the way of a successful update).
        // rax = the element (of the run's CPU).
        self.a.mov_imm(Reg::RAX, a.values);
        self.a.imul_rri(true, Reg::R11, Reg::R11, a.elem_size as i32);
        self.a.alu_rr(Alu::Add, true, Reg::RAX, Reg::R11);
        if a.cpu_stride != 0 {
            self.a.imul_rmi(Reg::R10, Mem::base(Reg::R12, 8), a.cpu_stride as i32);
            self.a.alu_rr(Alu::Add, true, Reg::RAX, Reg::R10);
        }
        for off in (0..a.elem_size as i32).step_by(8) {
            self.a.load(Width::Dw, Reg::R10, Mem::base(reg(3), off));
            self.a.store(Width::Dw, Mem::base(Reg::RAX, off), Reg::R10);
        }
        self.a.zero(Reg::RAX);
        for f in fail {
            self.a.bind32(f);
        }
    }

    /// A map helper call made directly to the map's own function (see
    /// [`Program::direct_call_at`]): r1 = the function's argument in place of the map, r5 =
    /// the run's CPU slot (`[r12+8]`, kept by the fast entry, as for inlined per-CPU
    /// lookups); r2..r4 are the helper's.
    ///
    /// With a memo ([`crate::program::HashMemo`], lookups and updates of per-CPU hash maps):
    /// the memo's hit is done inline (`memo_lookup`, `memo_update`) and falls through, taking
    /// no jump; what the hit does not need (the call made on a miss, the lock given back when
    /// the element changed under it, the paired update's fallback when its lookup missed) is
    /// cold code placed after the function ([`ColdMemo`], `emit_cold`), which jumps back. The
    /// call is made as [`out_call`](Self::out_call) makes it.
    fn direct_map_call(&mut self, pc: usize, d: crate::program::DirectCall, helper: i32) {
        self.calls_out = true;
        self.percpu_inline = true;
        let memo = d.memo.filter(|m| matches!(m.key_size, 1 | 2 | 4 | 8));
        let inline = match (memo, helper) {
            (Some(m), 1) => Some((m, false)),
            (Some(m), 2) if m.value_size.is_multiple_of(8) && m.value_size <= 64 => Some((m, true)),
            _ => None,
        };
        let Some((m, update)) = inline else {
            self.a.mov_imm(reg(1), d.arg);
            self.a.load(Width::Dw, reg(5), Mem::base(Reg::R12, 8));
            self.out_call(d.func);
            return;
        };
        let paired_lookup = !update && self.paired_lookups.binary_search(&pc).is_ok();
        let paired_update = update && self.paired_updates.binary_search(&pc).is_ok();
        // Flags known when compiling to be BPF_ANY or BPF_EXIST: no test at run time.
        let flags_known = update && const_reg(self.insns, &self.targets, pc, 4).is_some_and(|f| f == 0 || f == 2);
        let mut c = ColdMemo {
            pc,
            m,
            d,
            flags_known,
            paired_lookup,
            unpaired: None,
            miss: Vec::new(),
            gone: Vec::new(),
            done: 0,
        };
        if paired_update {
            // r11 = 0: the lookup missed, the full update (cold) checks the memo itself.
            self.a.test_rr(true, Reg::R11, Reg::R11);
            c.unpaired = Some(self.a.jump_fwd32(Some(Cond::E)));
            self.memo_store_locked(m, flags_known, Some(Reg::R11), &mut c.miss, &mut c.gone);
        } else if update {
            self.memo_check(m, &mut c.miss);
            self.memo_store_locked(m, flags_known, None, &mut c.miss, &mut c.gone);
        } else {
            self.memo_check(m, &mut c.miss);
            self.memo_value(m);
            if paired_lookup {
                self.a.mov_rr(true, Reg::R11, Reg::RAX);
            }
        }
        c.done = self.a.pos();
        self.cold.push(c);
    }

    /// The cold code of the memo hits of the function just emitted (see
    /// [`direct_map_call`](Self::direct_map_call)), each block jumping back after its call:
    ///
    /// ```text
    /// unpaired: (a paired update whose lookup missed) memo_check; memo_store_locked; jmp done
    /// gone:     the element's lock given back (it changed under the lock)
    /// miss:     r1 = the map's argument; r5 = the CPU; the call; (paired lookup: r11 = 0)
    ///           jmp done
    /// ```
    /// Each block is the code of its call instruction in the fault table (`cold_map`).
    fn emit_cold(&mut self) {
        for mut c in std::mem::take(&mut self.cold) {
            self.cold_map.push((self.a.pos(), c.pc as u32));
            if let Some(u) = c.unpaired.take() {
                self.a.bind32(u);
                self.memo_check(c.m, &mut c.miss);
                self.memo_store_locked(c.m, c.flags_known, None, &mut c.miss, &mut c.gone);
                self.a.jmp_back(c.done);
            }
            if !c.gone.is_empty() {
                for f in c.gone.drain(..) {
                    self.a.bind32(f);
                }
                self.a.store_imm(Width::W, Mem::base(Reg::R10, c.m.lock as i32), 0);
            }
            for f in c.miss.drain(..) {
                self.a.bind32(f);
            }
            // r2..r4 are intact on every way here.
            self.a.mov_imm(reg(1), c.d.arg);
            self.a.load(Width::Dw, reg(5), Mem::base(Reg::R12, 8));
            self.out_call(c.d.func);
            if c.paired_lookup {
                // A miss: the paired update checks the memo itself.
                self.a.zero(Reg::R11);
            }
            self.a.jmp_back(c.done);
        }
    }

    /// The memo checks both inline forms share: the thread's memo names this map and the key
    /// word of the key at r2, its element is in range, linked and holds that key word. Leaves
    /// r9 = the key word, r10 = the element, rdi = the
    /// element index times the value size; jumps to the miss (`miss`, bound later) otherwise.
    /// Uses rax, r8.
    fn memo_check(&mut self, m: crate::program::HashMemo, miss: &mut Vec<super::emit::LongFixup>) {
        let off = |o: u32| o as i32;
        let tw = self.thread_words(m);
        self.a.mov_imm(Reg::RAX, m.map);
        self.a.fs();
        self.a.alu_mr(Alu::Cmp, true, tw(8), Reg::RAX);
        miss.push(self.a.jump_fwd32(Some(Cond::Ne)));
        // The key word: the key's bytes, zero-extended (a fault reading the key is this
        // instruction's, as for any load).
        let w = match m.key_size {
            1 => Width::B,
            2 => Width::H,
            4 => Width::W,
            _ => Width::Dw,
        };
        self.a.load(w, Reg::R9, Mem::base(reg(2), 0));
        self.a.fs();
        self.a.alu_mr(Alu::Cmp, true, tw(16), Reg::R9);
        miss.push(self.a.jump_fwd32(Some(Cond::Ne)));
        self.a.fs();
        self.a.load(Width::W, Reg::R10, tw(4));
        self.a.alu_ri(Alu::Cmp, false, Reg::R10, m.n_elems as i32);
        miss.push(self.a.jump_fwd32(Some(Cond::Ae)));
        self.a.imul_rri(true, Reg::RDI, Reg::R10, m.value_size as i32);
        self.a.imul_rri(true, Reg::R10, Reg::R10, m.elem_size as i32);
        self.a.mov_imm(Reg::RAX, m.elems);
        self.a.alu_rr(Alu::Add, true, Reg::R10, Reg::RAX);
        self.a.cmp_mb(Mem::base(Reg::R10, off(m.state)), m.linked);
        miss.push(self.a.jump_fwd32(Some(Cond::Ne)));
        self.a.alu_mr(Alu::Cmp, true, Mem::base(Reg::R10, off(m.key)), Reg::R9);
        miss.push(self.a.jump_fwd32(Some(Cond::Ne)));
    }

    /// The address of the thread word at `+o` of the maps crate's thread words (with an `fs`
    /// prefix): `[disp32]` when the block's TLS offset fits one, else `[r11 + o]` with r11 set
    /// here to that offset.
    fn thread_words(&mut self, m: crate::program::HashMemo) -> impl Fn(i32) -> Mem + use<> {
        let base = i32::try_from(m.thread_words).ok().filter(|b| b.checked_add(32).is_some());
        if base.is_none() {
            self.a.mov_imm(Reg::R11, m.thread_words as u64);
        }
        move |o| match base {
            Some(b) => Mem::abs(b + o),
            None => Mem::base(Reg::R11, o),
        }
    }

    /// rax = the value of the element at r10 for the run's CPU slot (rdi = its index times
    /// the value size). Uses r8.
    fn memo_value(&mut self, m: crate::program::HashMemo) {
        self.a.mov_imm(Reg::RAX, m.pcpu);
        self.a.alu_rr(Alu::Add, true, Reg::RAX, Reg::RDI);
        self.a.imul_rmi(Reg::R8, Mem::base(Reg::R12, 8), m.pcpu_stride as i32);
        self.a.alu_rr(Alu::Add, true, Reg::RAX, Reg::R8);
    }

    /// The locked part of a memo update (r10 = the element, r9 = the key word, r3 = the new
    /// value, r4 = the flags, checked here unless `flags_known`: 0 or 2 only): the element's
    /// lock taken with one compare-and-swap from 0 to the thread's id (unknown yet, or the lock
    /// held: the miss), still linked and still the key under it (else `gone`: the lock given
    /// back, then the miss), the value stored word by word at `dst` (the value's address for
    /// the run's CPU; None: computed here, [`memo_value`](Self::memo_value)), the lock given
    /// back, r0 = 0, falling through. What the maps crate's `update_memo_fast` does. With `dst`
    /// (a lookup-update pair, see [`memo_pairs`]: r11 = the lookup's value address, r10 and r9
    /// its element and key word) the memo checks the lookup made are not repeated; the checks
    /// under the lock stay (the element may have been deleted or reused meanwhile).
    fn memo_store_locked(
        &mut self,
        m: crate::program::HashMemo,
        flags_known: bool,
        dst: Option<Reg>,
        miss: &mut Vec<super::emit::LongFixup>,
        gone: &mut Vec<super::emit::LongFixup>,
    ) {
        let off = |o: u32| o as i32;
        if !flags_known {
            self.a.test_ri(true, reg(4), !2);
            miss.push(self.a.jump_fwd32(Some(Cond::Ne)));
        }
        // The value's first and last words read before the lock is taken: a bad value pointer
        // faults here (this instruction's abort), never while the element's lock is held. A
        // one-word value whose address is known (`dst`, the paired form: rdi is free) is kept
        // in rdi for the store.
        let word_in_rdi = dst.is_some() && m.value_size == 8;
        self.a.load(Width::Dw, if word_in_rdi { Reg::RDI } else { Reg::R8 }, Mem::base(reg(3), 0));
        if m.value_size > 8 {
            self.a.load(Width::Dw, Reg::R8, Mem::base(reg(3), m.value_size as i32 - 8));
        }
        // The thread's id (0: not read yet).
        let tw = self.thread_words(m);
        self.a.fs();
        self.a.load(Width::W, Reg::R8, tw(0));
        self.a.test_rr(false, Reg::R8, Reg::R8);
        miss.push(self.a.jump_fwd32(Some(Cond::E)));
        self.a.zero(Reg::RAX);
        self.a.lock();
        self.a.cmpxchg(false, Mem::base(Reg::R10, off(m.lock)), Reg::R8);
        miss.push(self.a.jump_fwd32(Some(Cond::Ne)));
        // Under the lock: still linked, still the key (else unlock and take the miss).
        self.a.cmp_mb(Mem::base(Reg::R10, off(m.state)), m.linked);
        gone.push(self.a.jump_fwd32(Some(Cond::Ne)));
        self.a.alu_mr(Alu::Cmp, true, Mem::base(Reg::R10, off(m.key)), Reg::R9);
        gone.push(self.a.jump_fwd32(Some(Cond::Ne)));
        let dst = dst.unwrap_or_else(|| {
            self.memo_value(m);
            Reg::RAX
        });
        if word_in_rdi {
            self.a.store(Width::Dw, Mem::base(dst, 0), Reg::RDI);
        } else {
            for o in (0..m.value_size as i32).step_by(8) {
                self.a.load(Width::Dw, Reg::R8, Mem::base(reg(3), o));
                self.a.store(Width::Dw, Mem::base(dst, o), Reg::R8);
            }
        }
        self.a.store_imm(Width::W, Mem::base(Reg::R10, off(m.lock)), 0);
        self.a.zero(Reg::RAX);
    }

    /// A helper whose result the thread caches (see [`crate::program::CachedHelper`]): the
    /// cache read inline while its generation is the process's, else the helper called (as
    /// [`out_call`](Self::out_call) calls).
    fn cached_helper(&mut self, c: crate::program::CachedHelper, func: u64) {
        self.calls_out = true;
        self.a.mov_imm(Reg::RAX, c.generation);
        self.a.load(Width::Dw, Reg::RAX, Mem::base(Reg::RAX, 0));
        // Both words at constant offsets from the thread pointer (`[disp32]`), else through r11.
        let tls = |a: &mut Asm, off: i64| match i32::try_from(off) {
            Ok(d) => Mem::abs(d),
            Err(_) => {
                a.mov_imm(Reg::R11, off as u64);
                Mem::base(Reg::R11, 0)
            }
        };
        let m = tls(&mut self.a, c.tls_generation);
        self.a.fs();
        self.a.alu_mr(Alu::Cmp, true, m, Reg::RAX);
        let refill = self.a.jump_fwd(Some(Cond::Ne));
        let m = tls(&mut self.a, c.tls_value);
        self.a.fs();
        self.a.load(Width::Dw, Reg::RAX, m);
        let done = self.a.jump_fwd(None);
        self.a.bind(refill);
        self.out_call(func);
        self.a.bind(done);
    }

    /// A call out of the run to `func` (arguments in r1..r5) that needs nothing of the run
    /// context: from a run the claiming entry started (its slot word at `[r12+16]` is set),
    /// through the preserving thunk, which keeps vector registers 0-7 (the probe's stub saved
    /// none); from any other entry, directly (their callers keep the vector state).
    fn out_call(&mut self, func: u64) {
        self.a.load(Width::Dw, Reg::R11, Mem::base(Reg::R12, 16));
        self.a.test_rr(true, Reg::R11, Reg::R11);
        let plain = self.a.jump_fwd(Some(Cond::E));
        self.a.mov_imm(Reg::R11, func);
        self.call_abs(self.rt.preserving_call, Reg::RAX);
        let done = self.a.jump_fwd(None);
        self.a.bind(plain);
        self.call_abs(func, Reg::RAX);
        self.a.bind(done);
    }

    /// A call of the function at `func`: `call rel32` when the code's address is known
    /// (`Options::code_base`) and `func` lies within its reach (with a margin of 16 MiB, so
    /// that the form never changes between layout passes, whose positions move by far less),
    /// else `mov scratch, func; call scratch`. The direct form is 5 bytes instead of 7 to 12,
    /// and its target is known when the instruction is decoded: on a probe hit that starts
    /// on cold caches (nothing of the program in the branch predictor), an indirect call
    /// waits for its register to know where to fetch from.
    fn call_abs(&mut self, func: u64, scratch: Reg) {
        if let Some(base) = self.opts.code_base {
            let end = (base as i64).wrapping_add(self.a.pos() as i64 + 5);
            let d = (func as i64).wrapping_sub(end);
            if d.unsigned_abs() < (1 << 31) - (1 << 24) {
                self.a.call_rel32(d as i32);
                return;
            }
        }
        self.a.mov_imm(scratch, func);
        self.a.call_r(scratch);
    }

    /// `callx dst`: call `fn_table[dst]`, or abort with `UnknownHelper` when the id is out of
    /// the table or has no helper.
    fn callx(&mut self, pc: usize, dst: Reg) {
        self.needs_run_state = true;
        let table = self.prog.helpers().fn_table();
        let Ok(len) = i32::try_from(table.len()) else {
            return self.fail("helper table too large".into());
        };
        let Ok(pc32) = u32::try_from(pc) else {
            return self.fail(format!("instruction {pc}: index too large"));
        };
        self.a.mov_rr(true, Reg::R11, dst);
        self.a.alu_ri(Alu::Cmp, true, Reg::R11, len);
        let out_of_table = self.a.jump_fwd(Some(Cond::Ae));
        self.a.mov_imm(Reg::R10, table.as_ptr() as usize as u64);
        self.a.load(Width::Dw, Reg::R10, Mem::indexed8(Reg::R10, Reg::R11));
        self.a.test_rr(true, Reg::R10, Reg::R10);
        let found = self.a.jump_fwd(Some(Cond::Ne));
        self.a.bind(out_of_table);
        self.a.mov_ri32(Reg::R10, pc32);
        self.a.mov_ri32(Reg::R9, ABORT_UNKNOWN_HELPER as u32);
        self.jump(None, Label::Abort);
        self.a.bind(found);
        self.a.call_r(Reg::R10);
        self.end_if_requested();
    }

    /// After a helper that may end the run: `(rax, rdx) = jit_after_helper(rax)`; if rdx is
    /// set, unwind every frame of this entry and return rax. r1..r5 are dead after a helper
    /// call (the helper may have clobbered them), so only r0 needs keeping; rsp is as aligned
    /// as it was for the helper.
    fn end_if_requested(&mut self) {
        self.needs_run_state = true;
        self.a.mov_rr(true, Reg::RDI, Reg::RAX);
        self.call_abs(self.rt.after_helper_fn, Reg::R11);
        self.a.test_rr(true, Reg::RDX, Reg::RDX);
        self.jump(Some(Cond::Ne), Label::Unwind);
    }
}
