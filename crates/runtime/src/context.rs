//! The context of one program run on one thread: which CPU slot it holds, the probe's
//! registers, function address and cookie. Helpers read it through [`current`].
//!
//! **CPU slots.** The kernel runs a program with preemption disabled, so per-CPU data is
//! private to the run. Threads in user space can be preempted and migrate mid-run, so a run
//! *claims* the slot of the CPU it starts on (one atomic compare-and-swap on a word shared by
//! every process of the session); if another run holds it, the next free slot is taken. Two
//! runs never share a slot, so per-CPU values see no lost updates.
//!
//! The CPU is the `cpu_id` of the thread's restartable-sequences area, which glibc registers
//! for every thread (`__rseq_offset`): a load, no system call. The claim is the only atomic
//! read-modify-write of a run; JIT'd programs that call no helper (or only per-CPU hash
//! lookups and updates and `get_current_pid_tgid`, which need no run context) make the same
//! claim in generated code (the JIT's claiming entry, described by [`CpuSlots::claim_desc`]),
//! and defer to [`enter`] when they cannot. Measured on this project's 2-core EPYC VM
//! (2026-11-25), the compare-and-swap is not what a hit costs: the same builds with the
//! `lock` prefix removed from the claim and from the hash element lock (unsound, for the
//! measurement only) ran bpftrace's `count()` and `@x[1] = count()` at the same speed
//! (15.1/14.9 and 18.3/18.4 ns a call), so no rseq-based claim was built (its argument: a
//! claim inside an rseq critical section is atomic only against claims made on the same CPU;
//! a run whose CPU's slot is held takes another CPU's slot, and that claim would race with
//! the slot's own CPU's plain claims unless every process of the session registered for
//! `MEMBARRIER_CMD_GLOBAL_EXPEDITED` and remote claims issued that barrier between publishing
//! their claim and checking the home claim, Dekker-style).
//!
//! **Why a compare-and-swap.** Reading `cpu_id` and using that CPU's values without a claim
//! would lose updates: a thread preempted between loading a per-CPU counter and storing it
//! back, while another thread runs on that CPU and increments the same counter, stores a
//! stale value (the kernel rules this out by disabling preemption; user space cannot). An
//! rseq critical section can make the claim itself a plain load and store (restarted if the
//! thread is preempted or migrated between them), but only against other claims made on the
//! same CPU: a run that finds its CPU's slot held takes another slot from a different CPU,
//! and that claim races with the slot's own CPU's claims unless both sides order their store
//! before their load (a full fence on each side, what the compare-and-swap is, or an
//! asymmetric fence, `membarrier`, across every process of the session, since the slots and
//! per-CPU values are shared by all of them). A per-thread slot would not bound the slots by
//! the CPUs, as per-CPU values are. So the claim stays one uncontended compare-and-swap on a
//! cache line only runs on that CPU touch.
//!
//! **Every slot busy.** With more threads than CPUs, a thread is often preempted in the middle
//! of a run, holding its slot, while the CPU runs the others (in a loop of probe hits most of
//! a thread's time is spent in runs). Skipping their runs would lose whole threads' events,
//! which the kernel never does: a run that finds every slot held *waits* for one (spinning,
//! then yielding the CPU to the holder, then sleeping briefly), as the kernel's preempted-off
//! run would have ended before another began on that CPU. A slot whose holder has died (a
//! process killed mid-run) is taken over. Only when no slot is given back within
//! [`SLOT_WAIT_LIMIT_NS`] (a holder stopped by a signal or a debugger) is the run skipped and
//! counted as missed.
//!
//! **Recursion.** A probe hit on a thread already running a program (a probed function called
//! from a helper, a signal handler) is skipped and counted as missed, as in the kernel.

use std::cell::Cell;
use std::io;
use std::mem::MaybeUninit;
use std::path::Path;
use std::sync::atomic::{AtomicIsize, AtomicU32, Ordering};

use userbpf_maps::shm::{Shm, possible_cpus};

/// What helpers may ask about the run in progress.
#[derive(Debug, Clone, Copy)]
pub struct RunContext {
    /// The CPU slot this run holds (what `bpf_get_smp_processor_id` returns and which per-CPU
    /// value the run uses).
    pub cpu: u32,
    /// Address of a `struct pt_regs` (x86-64 layout) for probes, or 0.
    pub regs: u64,
    /// Address of the probed function (`bpf_get_func_ip`), or 0.
    pub func_ip: u64,
    /// The attachment's cookie (`bpf_get_attach_cookie`).
    pub cookie: u64,
    /// Number of function arguments known to the probe (`bpf_get_func_arg_cnt`), or 0.
    pub nr_args: u32,
    /// The function's return value for return probes (`bpf_get_func_ret`).
    pub retval: Option<u64>,
    /// An entry probe whose probed instruction is `push %rbp` or `endbr64`: the kernel's
    /// `is_uprobe_at_func_entry`, under which user stacks take the return address at `[sp]`
    /// before the frame-pointer walk (see `helpers::stack`).
    pub at_func_entry: bool,
    /// Opaque pointer to the running program, for helpers that need it (tail calls).
    pub prog: *const (),
    /// The context the program was given (r1) and its length: tail-called programs get it too.
    pub ctx: u64,
    pub ctx_len: u64,
}

impl RunContext {
    pub const EMPTY: RunContext = RunContext {
        cpu: 0,
        regs: 0,
        func_ip: 0,
        cookie: 0,
        nr_args: 0,
        retval: None,
        at_func_entry: false,
        prog: std::ptr::null(),
        ctx: 0,
        ctx_len: 0,
    };
}

impl Default for RunContext {
    fn default() -> Self {
        Self::EMPTY
    }
}

/// This thread's runtime state, in one thread-local block, reached without a call: an
/// initial-exec TLS variable (see [`thread_run`]), whose all-zero initial state is a thread
/// with no run. No initialiser to run and no destructor: usable from any point of a thread's
/// life, also inside a probed `malloc`.
#[repr(C)]
struct ThreadRun {
    /// A run is in progress (`ctx` is meaningful).
    active: Cell<bool>,
    /// Tail calls made by the run in progress.
    tail_calls: Cell<u32>,
    /// The thread's id (0: not read yet).
    tid: Cell<u32>,
    /// `bpf_get_current_pid_tgid`'s cache (`helpers::task`): the fork generation it was read
    /// in (0: never) and `tgid << 32 | tid`.
    pid_tgid_gen: Cell<u64>,
    pid_tgid: Cell<u64>,
    /// `bpf_get_current_comm`'s and `bpf_get_current_uid_gid`'s caches (`helpers::task`):
    /// the fork generation each was read in (0: never), when (`helpers::time`'s coarse
    /// clock), and the value (the NUL-padded name; `gid << 32 | uid`).
    comm_gen: Cell<u64>,
    comm_at: Cell<u64>,
    comm: Cell<[u8; 16]>,
    uid_gid_gen: Cell<u64>,
    uid_gid_at: Cell<u64>,
    uid_gid: Cell<u64>,
    /// The run in progress looked up values of kernel maps reached through `bpf()`
    /// (`userbpf_maps::kernel`): they are written back when it ends.
    kernel_values: Cell<bool>,
    /// The stack pointer where the run in progress began: its program's frames (the JIT's
    /// on the thread's stack, the interpreter's array) lie below it, down to a helper's own
    /// stack pointer (see [`run_stack`]).
    stack_top: Cell<u64>,
    /// `bpf_get_current_task`'s slot in its pool (`helpers::current_task`), plus one (0: none
    /// taken yet).
    task_slot: Cell<usize>,
    /// The context of the run in progress: written before `active` is set, read only while
    /// it is (uninitialised, i.e. zero, in a new thread).
    ctx: Cell<MaybeUninit<RunContext>>,
}

/// Bytes reserved for [`ThreadRun`] in every thread's static TLS block.
const THREAD_RUN_BYTES: usize = 256;
const _: () = assert!(std::mem::size_of::<ThreadRun>() <= THREAD_RUN_BYTES && std::mem::align_of::<ThreadRun>() <= 64);

// The block: zero-filled thread-local storage (`.tbss`), `THREAD_RUN_BYTES` bytes, 64-aligned,
// hidden (one per linked image, not exported). Rust's `thread_local!` in a `cdylib` (the
// agent) uses the general-dynamic model: each access calls `__tls_get_addr`, several times a
// probe hit (the run's start and end, every helper asking for the CPU). The initial-exec
// model used here is one load of the variable's offset from the thread pointer (the GOT
// entry, `@GOTTPOFF`) and an add: the linker marks a shared object using it as needing
// static TLS (`DF_STATIC_TLS`), which glibc gives to every object loaded at start-up (the
// agent is preloaded) and, from its reserved surplus, to objects loaded later.
std::arch::global_asm!(
    ".pushsection .tbss,\"awT\",@nobits",
    ".p2align 6",
    ".globl userbpf_runtime_thread_run",
    ".hidden userbpf_runtime_thread_run",
    ".type userbpf_runtime_thread_run,@object",
    ".size userbpf_runtime_thread_run, 256",
    "userbpf_runtime_thread_run:",
    ".zero 256",
    ".popsection",
);

/// This thread's block. The pointer is valid for as long as the thread runs and is only used
/// on it (`ThreadRun` is made of `Cell`s).
#[inline(always)]
fn thread_run() -> *const ThreadRun {
    let p: usize;
    // SAFETY: reads the block's offset from the thread pointer (a GOT word the dynamic linker
    // filled at load) and adds the thread pointer (`fs:[0]`, the TCB's self pointer on
    // x86-64 glibc and musl): the address of this thread's copy of the block.
    unsafe {
        std::arch::asm!(
            "mov {p}, qword ptr [rip + userbpf_runtime_thread_run@GOTTPOFF]",
            "add {p}, qword ptr fs:[0]",
            p = out(reg) p,
            options(nostack, readonly, pure),
        )
    };
    p as *const ThreadRun
}

/// This thread's block, as a reference.
#[inline(always)]
fn run_block() -> &'static ThreadRun {
    // SAFETY: the block lives as long as the thread, and is only used by it (made of Cells,
    // so ThreadRun is not Sync: the reference cannot leave the thread). Its all-zero initial
    // state is valid (no run, no tail calls, no id, an empty context).
    unsafe { &*thread_run() }
}

/// The run in progress on this thread, if any.
#[inline]
pub fn current() -> Option<RunContext> {
    let r = run_block();
    if r.active.get() {
        // SAFETY: `active` is set only after `ctx` was written (enter).
        Some(unsafe { r.ctx.get().assume_init() })
    } else {
        None
    }
}

/// The stack pointer (of the caller, where this is inlined).
#[inline(always)]
fn stack_pointer() -> u64 {
    let sp: u64;
    // SAFETY: copies rsp into a register; touches no memory.
    unsafe { std::arch::asm!("mov {}, rsp", out(reg) sp, options(nomem, nostack, preserves_flags)) };
    sp
}

/// The stack of the run in progress on this thread, as `[low, high)`: from the caller's stack
/// pointer (a helper's, below the program's frames) up to where the run began. What the
/// kernel's eBPF has as kernel memory (the program's stack) lies in it; so do the frames of
/// the runtime between (the run's set-up, the helper's callers), never the target's own.
/// None outside a run.
#[inline(never)]
pub fn run_stack() -> Option<(u64, u64)> {
    let r = run_block();
    let low = stack_pointer();
    let high = r.stack_top.get();
    (r.active.get() && low < high).then_some((low, high))
}

/// The program running or last run on this thread (its [`RunContext::prog`], a
/// `*const LoadedProgram`; null if none ran here through [`enter`]) and whether it is still
/// running. Async-signal-safe (the crash report reads it in a signal handler): the context
/// is kept after a run ends, and the block is zero-filled before the first.
pub fn last_program() -> (*const (), bool) {
    let r = run_block();
    // SAFETY: a read of one field of this thread's context cell (all-zero before the first
    // run: a null pointer), which nothing else references.
    let prog = unsafe { std::ptr::addr_of!((*(r.ctx.as_ptr() as *const RunContext)).prog).read() };
    (prog, r.active.get())
}

/// This thread's cached `tgid << 32 | tid` and the fork generation it was read in (0: never),
/// from the thread block (no `__tls_get_addr`).
#[inline(always)]
pub(crate) fn cached_pid_tgid() -> (u64, u64) {
    let r = run_block();
    (r.pid_tgid_gen.get(), r.pid_tgid.get())
}

/// The offsets from the thread pointer of the thread block's cached fork generation and
/// `tgid << 32 | tid` (the same in every thread: static TLS), for generated code reading them.
pub(crate) fn pid_tgid_tls_offsets() -> (i64, i64) {
    let block = thread_run() as usize as i64 - thread_pointer() as i64;
    (
        block + std::mem::offset_of!(ThreadRun, pid_tgid_gen) as i64,
        block + std::mem::offset_of!(ThreadRun, pid_tgid) as i64,
    )
}

/// The thread pointer (`fs:[0]`, the TCB's self pointer).
fn thread_pointer() -> usize {
    let fs0: usize;
    // SAFETY: reads the thread pointer (the TCB's self pointer at fs:[0]).
    unsafe { std::arch::asm!("mov {}, qword ptr fs:[0]", out(reg) fs0, options(nostack, readonly, preserves_flags)) };
    fs0
}

/// Caches `value` as this thread's `tgid << 32 | tid` for fork generation `gen`.
pub(crate) fn set_cached_pid_tgid(generation: u64, value: u64) {
    let r = run_block();
    r.pid_tgid.set(value);
    r.pid_tgid_gen.set(generation);
}

/// A per-thread cache of the thread block: (fork generation, time read, value).
pub(crate) type Cached<T> = (u64, u64, T);

/// This thread's cached name (see [`ThreadRun`]), from the thread block (no `__tls_get_addr`).
#[inline(always)]
/// The slot of `bpf_get_current_task`'s pool this thread last took, if any.
pub(crate) fn task_slot() -> Option<usize> {
    run_block().task_slot.get().checked_sub(1)
}

pub(crate) fn set_task_slot(slot: usize) {
    run_block().task_slot.set(slot + 1);
}

pub(crate) fn cached_comm() -> Cached<[u8; 16]> {
    let r = run_block();
    (r.comm_gen.get(), r.comm_at.get(), r.comm.get())
}

pub(crate) fn set_cached_comm(generation: u64, at: u64, name: [u8; 16]) {
    let r = run_block();
    r.comm.set(name);
    r.comm_at.set(at);
    r.comm_gen.set(generation);
}

/// This thread's cached `gid << 32 | uid` (see [`ThreadRun`]).
#[inline(always)]
pub(crate) fn cached_uid_gid() -> Cached<u64> {
    let r = run_block();
    (r.uid_gid_gen.get(), r.uid_gid_at.get(), r.uid_gid.get())
}

pub(crate) fn set_cached_uid_gid(generation: u64, at: u64, value: u64) {
    let r = run_block();
    r.uid_gid.set(value);
    r.uid_gid_at.set(at);
    r.uid_gid_gen.set(generation);
}

/// Tail calls made so far by the run in progress on this thread.
pub(crate) fn tail_calls() -> u32 {
    run_block().tail_calls.get()
}

pub(crate) fn set_tail_calls(n: u32) {
    run_block().tail_calls.set(n)
}

/// The CPU slot of the run in progress (0 outside runs).
#[inline]
pub fn current_cpu() -> u32 {
    let r = run_block();
    if r.active.get() {
        // SAFETY: a read of a field of this thread's context cell, which nothing else
        // references (the block is this thread's; `Cell::get` would copy the whole context),
        // written before `active` was set (enter).
        unsafe { (*(*r.ctx.as_ptr()).as_ptr()).cpu }
    } else {
        0
    }
}

/// Slots shared by every process of a session, one cache line per possible CPU.
pub struct CpuSlots {
    shm: Shm,
    nr: u32,
}

/// glibc's `__rseq_offset` (the offset of the thread's `struct rseq` from the thread
/// pointer) when glibc registered rseq for its threads (`__rseq_size` > 0), else
/// `RSEQ_NONE`. Set once, when the first slot file is opened; every claim reads it (the CPU
/// number from the thread's `struct rseq`).
// The hit path reads it: with its other statics on one page (see `userbpf_arena`).
#[unsafe(link_section = "userbpf_hot")]
static RSEQ_OFFSET: AtomicIsize = AtomicIsize::new(RSEQ_UNKNOWN);
const RSEQ_UNKNOWN: isize = isize::MIN;
const RSEQ_NONE: isize = isize::MIN + 1;

fn init_rseq() {
    if RSEQ_OFFSET.load(Ordering::Relaxed) != RSEQ_UNKNOWN {
        return;
    }
    // SAFETY: dlsym with a NUL-terminated name; the symbols, when glibc has them, are a
    // `const ptrdiff_t` and a `const unsigned int` that never change after start-up.
    let off = unsafe {
        let off = libc::dlsym(libc::RTLD_DEFAULT, c"__rseq_offset".as_ptr());
        let size = libc::dlsym(libc::RTLD_DEFAULT, c"__rseq_size".as_ptr());
        if off.is_null() || size.is_null() || (size as *const u32).read() < 8 {
            RSEQ_NONE
        } else {
            (off as *const isize).read()
        }
    };
    RSEQ_OFFSET.store(off, Ordering::Relaxed);
}

/// The CPU this thread runs on: the `cpu_id` field of its rseq area (what glibc's
/// `sched_getcpu` reads, without the call), else `sched_getcpu`.
#[inline]
fn this_cpu() -> u32 {
    let off = RSEQ_OFFSET.load(Ordering::Relaxed);
    if off > RSEQ_NONE {
        let cpu: i32;
        // SAFETY: glibc registered an rseq area for every thread at the thread pointer + off;
        // its `cpu_id` (offset 4) is a 32-bit word the kernel keeps up to date.
        unsafe {
            std::arch::asm!("mov {c:e}, dword ptr fs:[{o} + 4]", o = in(reg) off, c = out(reg) cpu,
                options(nostack, readonly, preserves_flags))
        };
        if cpu >= 0 {
            return cpu as u32;
        }
    }
    // SAFETY: sched_getcpu has no preconditions (glibc reads it from rseq or the vDSO).
    unsafe { libc::sched_getcpu() }.max(0) as u32
}

const SLOT_STRIDE: usize = 64;

/// Where slot 0 starts in the slot file: not at the page's start. A level-1 data cache is
/// indexed by the address bits just above the line (bits 6-11 on x86-64, within the page),
/// so every page-aligned object of a process competes for the same set; a probe adding its
/// own page-aligned lines there evicts the target's (measured in fio under callgrind's
/// cache model, 2026-11-26: each of the probe's lines at page offset 0 cost fio a miss per
/// I/O in lines of its own). The probe's per-hit lines each get their own set instead
/// (`userbpf_hook`'s thread state and site stubs, the run-statistics switch, these slots).
pub const SLOTS_OFFSET: usize = 0x5c0;

impl CpuSlots {
    /// Opens (creating if needed) the slot file of a session.
    pub fn open(path: &Path) -> io::Result<CpuSlots> {
        init_rseq();
        static AT_FORK: std::sync::Once = std::sync::Once::new();
        // SAFETY: registers a child handler that only writes this thread's block.
        AT_FORK.call_once(|| unsafe {
            libc::pthread_atfork(None, None, Some(forget_tid_in_child));
        });
        let nr = possible_cpus();
        let len = SLOTS_OFFSET + nr as usize * SLOT_STRIDE;
        let shm = match Shm::create(path, len) {
            Ok(s) => s,
            // PermissionDenied: a member that cannot create files in the session (another
            // user's process, or one that dropped privileges) opens the file the session's
            // owner made, through the broker (`session::broker`, the maps' open fallback).
            Err(e) if matches!(e.kind(), io::ErrorKind::AlreadyExists | io::ErrorKind::PermissionDenied) => {
                Shm::open(path)?
            }
            Err(e) => return Err(e),
        };
        if shm.len() < len {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{}: too short for {nr} CPUs", path.display()),
            ));
        }
        Ok(CpuSlots { shm, nr })
    }

    /// Slots private to this process (for runs outside any session, e.g. tests).
    pub fn private() -> io::Result<CpuSlots> {
        let dir = std::env::temp_dir().join(format!("userbpf-cpus-{}-{:p}", std::process::id(), thread_run()));
        let s = Self::open(&dir);
        let _ = std::fs::remove_file(&dir);
        s
    }

    pub fn nr_cpus(&self) -> u32 {
        self.nr
    }

    /// What JIT code needs to claim a slot of these by itself, as [`enter`] does (see
    /// `userbpf_vm::jit::SlotClaim`): these slots' words, this process's rseq `cpu_id` and the
    /// calling thread's block's `active` and `tid`, as offsets from the thread pointer (the same
    /// in every thread: the block is in static TLS). `have_rseq` is 0 without rseq, and the
    /// claiming code then always defers to [`enter`].
    pub fn claim_desc(&self) -> userbpf_vm::jit::SlotClaim {
        let fs0: usize;
        // SAFETY: reads the thread pointer (the TCB's self pointer at fs:[0]).
        unsafe {
            std::arch::asm!("mov {}, qword ptr fs:[0]", out(reg) fs0, options(nostack, readonly, preserves_flags))
        };
        let block = thread_run() as usize as i64 - fs0 as i64;
        let rseq = RSEQ_OFFSET.load(Ordering::Relaxed);
        userbpf_vm::jit::SlotClaim {
            // SAFETY: the mapping holds SLOTS_OFFSET bytes then the slots (checked at open).
            slots: unsafe { self.shm.as_ptr().add(SLOTS_OFFSET) } as u64,
            nr: self.nr,
            have_rseq: u32::from(rseq > RSEQ_NONE),
            rseq_cpu: if rseq > RSEQ_NONE { rseq as i64 + 4 } else { 0 },
            active: block + std::mem::offset_of!(ThreadRun, active) as i64,
            tid: block + std::mem::offset_of!(ThreadRun, tid) as i64,
        }
    }

    #[inline]
    fn word(&self, i: u32) -> &AtomicU32 {
        // SAFETY: i < nr and the mapping holds SLOTS_OFFSET bytes then nr slots of SLOT_STRIDE
        // bytes; the offset is 4-aligned in a page-aligned mapping; the word is only accessed
        // atomically.
        unsafe { AtomicU32::from_ptr(self.shm.as_ptr().add(SLOTS_OFFSET + i as usize * SLOT_STRIDE).cast()) }
    }
}

/// Why a run did not start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Missed {
    /// This thread is already running a program.
    Recursion,
    /// Every CPU slot stayed held by other runs for [`SLOT_WAIT_LIMIT_NS`] (their threads
    /// stopped).
    NoSlot,
}

/// A run in progress: holds its CPU slot, and its context is this thread's current one,
/// until dropped. Not `Send`: it belongs to the thread that entered.
pub struct RunGuard<'a> {
    slots: &'a CpuSlots,
    cpu: u32,
    thread: *const ThreadRun,
}

/// Starts a run: claims a CPU slot and makes `ctx` (with its `cpu` filled in) the thread's
/// current context. No allocation, no lock; one system call the first time on a thread (its
/// id). The thread's block is reached without a call (initial-exec TLS).
#[inline]
pub fn enter(slots: &CpuSlots, mut ctx: RunContext) -> Result<RunGuard<'_>, Missed> {
    let thread = thread_run();
    // SAFETY: this thread's block, alive while the thread runs; only this thread uses it.
    let t = unsafe { &*thread };
    if t.active.get() {
        return Err(Missed::Recursion);
    }
    let cpu = claim(slots, t)?;
    ctx.cpu = cpu;
    t.stack_top.set(stack_pointer());
    t.ctx.set(MaybeUninit::new(ctx));
    t.tail_calls.set(0);
    t.active.set(true);
    Ok(RunGuard { slots, cpu, thread })
}

/// Claims a free slot for this thread: the slot of the CPU it runs on, else the next free one.
#[inline]
fn claim(slots: &CpuSlots, t: &ThreadRun) -> Result<u32, Missed> {
    // CPU numbers are below the possible CPUs: no division (tens of cycles) on the hit path.
    let cpu = this_cpu();
    let start = if cpu < slots.nr { cpu } else { cpu % slots.nr };
    let me = match t.tid.get() {
        0 => {
            // SAFETY: gettid has no preconditions.
            let v = unsafe { libc::gettid() } as u32;
            t.tid.set(v);
            v
        }
        v => v,
    };
    if slots.word(start).compare_exchange(0, me, Ordering::Acquire, Ordering::Relaxed).is_ok() {
        return Ok(start);
    }
    claim_other(slots, start, me)
}

/// How long a run waits for a CPU slot when every slot is held, before it is skipped. Holders
/// that are merely preempted give their slot back within a scheduling period; this bounds
/// the wait for holders that do not run at all (stopped by SIGSTOP or a debugger).
pub const SLOT_WAIT_LIMIT_NS: u64 = 50_000_000;

/// Takes the first free slot, from `start` on.
#[inline]
fn try_claim_any(slots: &CpuSlots, start: u32, me: u32) -> Option<u32> {
    (0..slots.nr).map(|k| (start + k) % slots.nr).find(|&i| {
        let w = slots.word(i);
        w.load(Ordering::Relaxed) == 0 && w.compare_exchange(0, me, Ordering::Acquire, Ordering::Relaxed).is_ok()
    })
}

/// Takes over a slot whose holder (a thread id) no longer exists: a process killed in the
/// middle of a run never gives its slot back.
#[cold]
fn take_over_dead(slots: &CpuSlots, me: u32) -> Option<u32> {
    (0..slots.nr).find(|&i| {
        let w = slots.word(i);
        let owner = w.load(Ordering::Relaxed);
        // SAFETY: kill with signal 0 sends nothing; it only checks that the thread exists (a
        // thread id names its thread for kill(2)).
        let dead = owner != 0
            && owner != me
            && unsafe { libc::kill(owner as libc::pid_t, 0) } != 0
            && io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
        dead && w.compare_exchange(owner, me, Ordering::Acquire, Ordering::Relaxed).is_ok()
    })
}

/// Every other run's slot is held: waits for one to be given back (see the module's
/// documentation). Not the hit path of an uncontended run: spinning, `sched_yield` and short
/// sleeps are fine here, as the alternative is to lose the run.
#[cold]
#[inline(never)]
fn claim_other(slots: &CpuSlots, start: u32, me: u32) -> Result<u32, Missed> {
    if let Some(i) = try_claim_any(slots, start, me) {
        return Ok(i);
    }
    let t0 = monotonic_ns();
    let mut next_dead_check = t0;
    let mut round = 0u32;
    loop {
        round = round.saturating_add(1);
        if round < 64 {
            // The holder may be running on another CPU, a few instructions from the end.
            std::hint::spin_loop();
        } else if round < 128 {
            // The holder may be waiting for this CPU.
            // SAFETY: sched_yield has no preconditions.
            unsafe { libc::sched_yield() };
        } else {
            let ts = libc::timespec { tv_sec: 0, tv_nsec: 50_000 };
            // SAFETY: nanosleep reads the timespec we own; the remainder is not wanted.
            unsafe { libc::nanosleep(&ts, std::ptr::null_mut()) };
        }
        if let Some(i) = try_claim_any(slots, this_cpu() % slots.nr, me) {
            return Ok(i);
        }
        if round >= 128 {
            let now = monotonic_ns();
            if now >= next_dead_check {
                if let Some(i) = take_over_dead(slots, me) {
                    return Ok(i);
                }
                next_dead_check = now + 1_000_000;
            }
            if now.saturating_sub(t0) >= SLOT_WAIT_LIMIT_NS {
                return Err(Missed::NoSlot);
            }
        }
    }
}

fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes the timespec we own (the vDSO: no system call).
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// In the child of a fork: the thread's cached id is its parent's; read it again (a slot's
/// holder id must name a live thread, see [`take_over_dead`]).
extern "C" fn forget_tid_in_child() {
    // SAFETY: this (the only) thread's block; only this thread uses it.
    unsafe { (*thread_run()).tid.set(0) };
}

impl RunGuard<'_> {
    pub fn cpu(&self) -> u32 {
        self.cpu
    }
}

/// The run in progress holds values of kernel maps reached through `bpf()`: they are written
/// back at its end ([`crate::helpers::maps::write_back_kernel_values`]).
#[inline]
pub fn hold_kernel_values() {
    // SAFETY: this thread's block; only this thread uses it.
    unsafe { (*thread_run()).kernel_values.set(true) };
}

impl Drop for RunGuard<'_> {
    #[inline]
    fn drop(&mut self) {
        // SAFETY: the block of the thread that entered (a RunGuard is not Send).
        let t = unsafe { &*self.thread };
        if t.kernel_values.get() {
            t.kernel_values.set(false);
            // The slot is still this run's: its buffers are written back before it is given back.
            crate::helpers::maps::write_back_kernel_values(self.cpu);
        }
        t.active.set(false);
        self.slots.word(self.cpu).store(0, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claims_distinct_slots_and_refuses_recursion() {
        let slots = CpuSlots::private().unwrap();
        assert!(current().is_none());
        let g = enter(&slots, RunContext { cookie: 7, ..Default::default() }).unwrap();
        assert_eq!(current().unwrap().cookie, 7);
        assert_eq!(current_cpu(), g.cpu());
        assert_eq!(enter(&slots, RunContext::default()).err(), Some(Missed::Recursion));
        // Another thread gets another slot while this one is held (or none, with one CPU).
        let mine = g.cpu();
        std::thread::scope(|s| {
            s.spawn(|| match enter(&slots, RunContext::default()) {
                Ok(h) => assert_ne!(h.cpu(), mine),
                Err(e) => assert!(slots.nr_cpus() == 1 && e == Missed::NoSlot),
            });
        });
        drop(g);
        assert!(current().is_none());
        let again = enter(&slots, RunContext::default()).unwrap();
        drop(again);
    }

    #[test]
    fn this_cpu_is_the_cpu_the_thread_runs_on() {
        let _slots = CpuSlots::private().unwrap();
        assert_ne!(RSEQ_OFFSET.load(Ordering::Relaxed), RSEQ_UNKNOWN);
        std::thread::spawn(|| {
            let n = possible_cpus().min(4);
            for cpu in 0..n as usize {
                // SAFETY: a zeroed cpu_set_t with one CPU set, for this thread only.
                unsafe {
                    let mut set: libc::cpu_set_t = std::mem::zeroed();
                    libc::CPU_SET(cpu, &mut set);
                    if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
                        continue; // not allowed to run there (a restricted cpuset)
                    }
                }
                assert_eq!(this_cpu(), cpu as u32);
            }
        })
        .join()
        .unwrap();
    }
}
