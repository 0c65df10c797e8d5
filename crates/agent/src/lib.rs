//! The agent: a shared library that a target process loads (`LD_PRELOAD`, set by
//! `userbpf run` and `userbpf start`). At load it starts its thread (`watcher`), which opens
//! the session named by `USERBPF_SESSION`, prepares the session's programs and attaches its
//! links with inline hooks while the loading thread waits, then watches the session's
//! `links/` directory (inotify: notified, never polled on the hot path), attaching links added
//! later and detaching removed ones. The program cannot tell it is there (issue 18): the
//! thread's descriptors are in a table of its own and its signals blocked (`watcher`), and it
//! keeps the program's credentials through set*id calls (`creds`). A process that drops root
//! after it joined reaches the session's files through the session's broker
//! (`userbpf_runtime::session::broker`; see `watcher`).
//!
//! Which links apply here: a uprobe, uretprobe or USDT link names a file (empty: the
//! executable); it is attached in a process where that file is mapped, and waits silently
//! otherwise: the agent runs in every process of the command tree (`sh -c`, wrappers), and
//! only the ones mapping the target say anything. A library loaded later with dlopen is
//! seen before dlopen returns (`userbpf_hook::dlnotify`: the loader's debugger
//! notification), and its links are attached then, before its constructors run; when it is
//! unloaded its probes are forgotten and its links wait for it again. A link naming no file
//! attaches only in a process whose executable has the function (or USDT probe). System call
//! tracepoints attach in every process. A link restricted to a pid attaches only there.
//!
//! fork (`fork`): the child keeps the parent's hooks (they are in the copied address space)
//! and starts an agent thread of its own, which joins the session as a member of its own and
//! detaches links meant for another pid. exec: `LD_PRELOAD` and `USERBPF_SESSION` are
//! inherited, so the new image loads the agent and attaches again.
//!
//! No probe fires for the agent's own work: its threads are userbpf's
//! (`userbpf_hook::mark_thread_ours`), and its work on the target's threads (start-up, syncs
//! from dlopen notifications, fork handlers, the exit handler) runs in a `userbpf_hook::ours`
//! scope; neither its calls of probed functions (malloc...) nor its system calls are seen.
//!
//! A probe hit runs the program on the hook's `struct pt_regs`; nothing on that path
//! allocates, locks or makes a system call. The program may change what the process does
//! there: `bpf_override_return` (the function skipped, or its return value replaced) and, in
//! `uprobe.w` programs, argument registers; a program calling `bpf_override_return` is
//! attached only at a function's entry or return (the kernel's rule), never inside a function
//! or at a USDT probe. Errors are printed once per link to the program's
//! stderr,
//! prefixed `userbpf-agent:`, and the target runs on without the probe; each link's outcome
//! is also reported to the session (`userbpf_runtime::loader::report_attach`), where
//! `userbpf run` reads it. With a program, the agent prepares the programs its prog arrays
//! hold (`prepare_tail_targets`), so that tail calls land.

use std::collections::{HashMap, HashSet};
use std::ffi::c_void;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, TryLockError};

use userbpf_hook::symbols::{self, MappedObject, ObjectChanges};
use userbpf_hook::{HOOK_CONTINUE, ProbeId, ProbeKind, PtRegs};
use userbpf_runtime::context::{CpuSlots, RunContext};
use userbpf_runtime::loader::prepare_record;
use userbpf_runtime::session::{Layout, SemaphoreRecord, broker, handshake};
use userbpf_runtime::{Engine, LinkRecord, LoadedProgram, Session};

mod creds;
mod detach;
mod fork;
mod tracepoint;
mod usdt;
mod watcher;

use fork::install_fork_handlers;
pub use tracepoint::exec_returned;
pub use watcher::environ_before_libc;
use watcher::{kick, log};

/// The objects a probe hit reads (the probes' handlers and run arguments, the programs, the
/// maps' and CPU slots' descriptors, the hook's sites) are allocated together, inside
/// `userbpf_arena::scope`s; everything else as before, by the system allocator.
#[global_allocator]
static ALLOC: userbpf_arena::HitAlloc = userbpf_arena::HitAlloc;

/// Environment variable choosing the interpreter (`1`) over the JIT.
pub const INTERPRETER_ENV: &str = "USERBPF_INTERPRETER";

/// What a hook's handler gets as its data: the program and what the run context needs.
struct Attached {
    prog: Arc<LoadedProgram>,
    cookie: u64,
    func_ip: u64,
    retprobe: bool,
    /// The probed address when the hook sits before it (USDT probes sharing a hook at the
    /// first of consecutive `nop`s): the program sees a copy of the registers with this `ip`.
    /// 0: the hook's own.
    ip: u64,
    /// The run context's `at_func_entry` (see [`at_func_entry`]).
    at_func_entry: bool,
}

/// Whether the kernel would take an entry probe at `addr` to be at a function's entry
/// (`push %rbp`, or `endbr64` on IBT kernels: see
/// `userbpf_runtime::helpers::stack::uprobe_at_func_entry`); a user stack taken by the
/// probe's program then includes the return address at `[sp]`. The instruction is read
/// before the probe is placed (or from the bytes the hook saved, if the address is hooked).
fn at_func_entry(addr: usize) -> bool {
    let b = match userbpf_hook::original_bytes(addr) {
        Some(b) => b,
        None => {
            let mut b = [0u8; 5];
            // SAFETY: the guard's copy tolerates an unreadable `addr` (it then fails).
            if unsafe { userbpf_vm::guard::copy(b.as_mut_ptr(), addr as *const u8, 4) } != 0 {
                return false;
            }
            b
        }
    };
    userbpf_runtime::helpers::stack::uprobe_at_func_entry([b[0], b[1], b[2], b[3]])
}
/// The agent's state in this process.
pub struct Agent {
    session: Session,
    /// The inode of the session's directory when the agent joined it.
    session_ino: u64,
    /// The CPU slots (taken by a start after a detach).
    slots: Option<Arc<CpuSlots>>,
    engine: Engine,
    /// Programs prepared, by id, with the identity of the record each was prepared from (see
    /// [`FileStamp`]): a program kept across a detach is used again only for that record.
    programs: HashMap<u32, (Arc<LoadedProgram>, Option<FileStamp>)>,
    /// The identity of the session's `cpus` file the slots map (see [`FileStamp`]).
    cpus_stamp: Option<FileStamp>,
    /// Attached links: their probes (none when attaching failed, so it is reported once).
    links: HashMap<u32, AttachedLink>,
    /// This process's acknowledgement file, when it has a watcher (see [`Ack`]).
    ack: Option<Ack>,
    /// USDT semaphores of loader links (see [`Agent::sync_semaphores`]), by link id: the
    /// one this process raised, or `None` when another did (the loader, at link time).
    semas: HashMap<u32, Option<Sema>>,
    /// The session's program records, read once per sync (a sync attaching N links of N
    /// programs reads them once, not N times).
    prog_records: Option<Vec<userbpf_runtime::ProgRecord>>,
}

/// Which file a path names, and which version of it: its inode and its modification time
/// (records are written once, to a temporary file renamed into place) or, for a file made once
/// and changed in place (the CPU slots), its birth time. A session's life can end while its
/// directory stays (a session whose members are all gone is wiped when it is opened again:
/// its ids start again at 1) or the directory can be removed and made anew (its inode number
/// reused by the file system): the id of a program, and the directory's inode, then name
/// something else than they did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct FileStamp {
    ino: u64,
    time: Option<std::time::SystemTime>,
}

impl FileStamp {
    fn of(path: &std::path::Path, birth: bool) -> Option<FileStamp> {
        // Through the broker once this process dropped privileges (see `watcher`).
        let m = broker::metadata(path).ok()?;
        let time = if birth { m.created().or_else(|_| m.modified()) } else { m.modified() };
        Some(FileStamp { ino: std::os::unix::fs::MetadataExt::ino(&m), time: time.ok() })
    }
}

/// A USDT semaphore this agent raised for a loader's link: at `addr`, file offset `off` of
/// the file `(dev, ino)`.
#[derive(Clone, Copy)]
struct Sema {
    addr: usize,
    dev: u64,
    ino: u64,
    off: u64,
}

/// The agent's acknowledgement of link changes (the handshake, both halves:
/// `userbpf_runtime::session::handshake`).
///
/// Only an agent with a watcher thread (which syncs when `links/gen` is renamed in) keeps a
/// file; it is removed when the process exits or the watcher ends.
struct Ack {
    file: handshake::Ack,
    /// The generation last written.
    done: u32,
}

/// The process that keeps an acknowledgement file (a forked child has its own; 0: none).
static ACK_PID: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// The session directory of the acknowledgement file (for the exit handler: the directory
/// the process joined, whatever its uid is at exit).
static ACK_DIR: Mutex<Option<std::path::PathBuf>> = Mutex::new(None);

impl Ack {
    /// Creates this process's file in session directory `dir`, holding 0 (the loader waits
    /// for the agent from now on: the first sync follows).
    fn create(dir: &std::path::Path) -> Option<Ack> {
        let me = std::process::id();
        let a = Ack { file: handshake::Ack::create(&Layout::new(dir)).ok()?, done: 0 };
        ACK_PID.store(me, Ordering::SeqCst);
        *ACK_DIR.lock().unwrap_or_else(|e| e.into_inner()) = Some(dir.to_path_buf());
        watcher::set_kick_path(Some(a.file.path()));
        install_ack_exit();
        Some(a)
    }

    /// Removes this process's file, if a previous image (before exec) left one.
    fn stale(dir: &std::path::Path) {
        handshake::remove_ack_of_self(&Layout::new(dir));
    }

    fn write(&mut self, generation: u32) -> std::io::Result<()> {
        self.file.write(generation)?;
        self.done = generation;
        Ok(())
    }

    /// The generation in `links/` of session directory `dir` (none yet: 0).
    fn current(dir: &std::path::Path) -> u32 {
        handshake::current(&Layout::new(dir))
    }

    /// Removes the file (the process can no longer acknowledge): the loader stops waiting.
    fn remove(self) {
        watcher::set_kick_path(None);
        self.file.remove();
        let _ = ACK_PID.compare_exchange(std::process::id(), 0, Ordering::SeqCst, Ordering::SeqCst);
    }
}

/// At the start of an image: claims of USDT semaphores (see [`Agent::sync_semaphores`])
/// for this pid and start time are a previous image's (before an exec, which keeps both):
/// this image's semaphores are in their initial state, raised by nobody yet.
fn forget_own_semaphore_claims(dir: &std::path::Path) {
    let me = std::process::id();
    let Some(start) = userbpf_runtime::session::start_time(me) else { return };
    let perf = Layout::new(dir).perf_dir();
    let Ok(names) = broker::read_dir_names(&perf) else { return };
    for name in names.into_iter().filter(|n| Layout::is_claim_of_process(n, me, start)) {
        let _ = broker::remove_file(&perf.join(name));
    }
}

/// Registers (once) the exit handler removing the acknowledgement file of the exiting
/// process (inherited by forked children, which keep files of their own).
fn install_ack_exit() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    extern "C" fn ack_exit() {
        let _ = std::panic::catch_unwind(|| {
            let _ours = userbpf_hook::ours();
            let me = std::process::id();
            if ACK_PID.load(Ordering::SeqCst) != me {
                return;
            }
            let Some(start) = userbpf_runtime::session::start_time(me) else { return };
            let dir = match ACK_DIR.try_lock() {
                Ok(d) => d.clone(),
                Err(_) => None,
            };
            let dir = dir.unwrap_or_else(|| Session::dir_of(&Session::default_name()));
            handshake::remove_ack_of(&Layout::new(dir), me, start);
        });
    }
    ONCE.call_once(|| {
        // SAFETY: registers a function that catches its panics and has no preconditions.
        unsafe { libc::atexit(ack_exit) };
    });
}

/// What attaching one link made: its probes and the USDT semaphores it raised.
#[derive(Default)]
struct AttachedLink {
    probes: Vec<ProbeId>,
    semaphores: Vec<usize>,
    /// Hook addresses of USDT probes (see `usdt::claim`).
    anchors: Vec<usize>,
    /// The library holding the probes, when it is not the executable (it may be unloaded).
    object: Option<MappedObject>,
    /// Probes of system calls made outside libc (see `tracepoint`).
    raw: Vec<usize>,
}

impl AttachedLink {
    fn detach(self) {
        tracepoint::raw_remove(&self.raw);
        for p in self.probes {
            let _ = userbpf_hook::detach(p);
        }
        for s in self.semaphores {
            usdt::semaphore_add(s, -1);
        }
        for a in self.anchors {
            usdt::release(a);
        }
    }

    /// Drops a link whose library was unmapped: the hook engine already forgot its probes
    /// (`userbpf_hook::dlnotify`) and its semaphores are gone with the library, so nothing is
    /// written to memory.
    fn forget(self) {
        for a in self.anchors {
            usdt::release(a);
        }
    }
}

/// Whether a link was attached here.
enum Outcome {
    Attached(AttachedLink),
    /// Its file is not mapped in this process, or the executable is not its target: nothing
    /// to say, try again when libraries change.
    NotHere,
    /// Only possible once the loader is done (see `symbols::DEFERRED`): the watcher retries.
    Deferred,
}

static AGENT: OnceLock<Mutex<Agent>> = OnceLock::new();

/// The hit path: run the program on the probe's registers.
unsafe extern "C" fn on_hit(data: *mut c_void, regs: *mut PtRegs) -> u32 {
    // SAFETY: `data` is the `Attached` leaked for this probe when it was attached; it is
    // freed only when the agent detaches from the process, after the hook engine waited for
    // every running handler (a single link's detach leaves it: see `detach`).
    let a = unsafe { &*(data as *const Attached) };
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        // SAFETY: `regs` points to the hook's saved registers for this hit.
        let ax = unsafe { (*regs).ax };
        let mut copy;
        let regs = if a.ip != 0 {
            // SAFETY: as above; the copy lives until the program returns.
            copy = unsafe { *regs };
            copy.ip = a.ip;
            &mut copy as *mut PtRegs
        } else {
            regs
        };
        let info = RunContext {
            regs: regs as u64,
            func_ip: a.func_ip,
            cookie: a.cookie,
            nr_args: 6,
            retval: a.retprobe.then_some(ax),
            at_func_entry: a.at_func_entry,
            ..Default::default()
        };
        let _ = a.prog.run(regs.cast::<u8>(), std::mem::size_of::<PtRegs>(), info);
    }));
    drop(r);
    HOOK_CONTINUE
}
/// What the hook's stubs may call instead of [`on_hit`], when the program sees the hook's own
/// registers (no `ip` copy) and is JIT'd without state of the VM's (no helper ending runs, no
/// `callx`, no callback: every program but those using tail calls or `bpf_loop`):
///
/// * a program calling no helper (`LoadedProgram::native_entry`): its native entry itself.
///   Such a run reads nothing of the run context `on_hit` sets up, claims no CPU slot, calls
///   nothing and cannot panic.
/// * a program calling no helper but using per-CPU arrays, or whose only calls are direct map
///   calls and `get_current_pid_tgid` (`LoadedProgram::claim_entry`): its claiming entry,
///   which claims the CPU slot itself (no call) or, when it cannot, makes the hit take the
///   general path (`CLAIM_RETRY`, see `userbpf_hook::LeanHandler`). Per-CPU hash lookups and
///   updates whose thread memo hits and a cached `get_current_pid_tgid` are inline; their
///   misses call out through the JIT's vector-preserving thunk, with the stub holding the
///   recursion guard (`LEAN_GUARD_ONLY`).
/// * any other ([`LoadedProgram::context_entry`]): [`lean_run`], which does what `on_hit`
///   does in a few instructions (`calls_out`: the stub keeps the live vector registers and
///   holds the recursion guard).
///
/// Either goes through `on_hit` while run statistics are on (the gate). A probe alone at its
/// function entry whose handler is one of the first two and reads only registers gets a stub
/// generated for it by the hook (`LeanHandler::regs_read`: the registers it reads). Leaked, as
/// the `Attached` it belongs to: a thread may still be calling it after detach.
fn lean_handler(a: &'static Attached) -> Option<&'static userbpf_hook::LeanHandler> {
    if a.ip != 0 || std::env::var_os("USERBPF_NO_LEAN").is_some_and(|v| !v.is_empty() && v != "0") {
        return None;
    }
    // A program whose context reads all fall in the registers' part of the pt_regs (and
    // which writes none of it) lets the stub skip the rest (see `LeanHandler::reads_all`).
    let gprs_only = a.prog.program().ctx_read_extent().is_some_and(|e| e <= userbpf_hook::PT_REGS_GPR_BYTES);
    // Which registers it reads (a stub generated for the site stores only those of the
    // callee-saved ones).
    let regs_read = a.prog.program().ctx_read_words().unwrap_or(userbpf_hook::LEAN_READS_GPRS);
    let (func, arg, calls_out) = if let Some(f) = a.prog.native_entry() {
        (f, 0, 0)
    } else if let Some((f, claim)) = a.prog.claim_entry() {
        let claim: &'static userbpf_vm::jit::SlotClaim = detach::leak(claim);
        // Calls out of the run (memo misses, cache refills) keep the vector registers
        // themselves; the stub holds the recursion guard around them.
        let calls_out = if a.prog.claim_calls_out() { userbpf_hook::LEAN_GUARD_ONLY } else { 0 };
        (f, claim as *const userbpf_vm::jit::SlotClaim as u64, calls_out)
    } else if let Some(entry) = a.prog.context_entry() {
        let run: &'static LeanRun = detach::leak(LeanRun { a, entry });
        (lean_run as *const () as usize, run as *const LeanRun as u64, 1)
    } else {
        return None;
    };
    Some(detach::leak(userbpf_hook::LeanHandler {
        func,
        arg,
        gate: userbpf_runtime::program::stats_gate(),
        failures: &a.prog.stats.errors,
        calls_out,
        // `lean_run` hands the registers to helpers: stack walks read ip and sp, an override
        // writes ip (the stub then looks for the change), usdt.bpf.h reads sp.
        reads_all: u64::from(!gprs_only || (calls_out == 1 && !a.prog.helpers_read_only_gprs())),
        regs_read,
    }))
}

// The claiming entry's "ran nothing" is the hook's "take the general path".
const _: () = assert!(userbpf_vm::jit::CLAIM_RETRY == userbpf_hook::LEAN_RETRY);

/// The argument of [`lean_run`]: the probe and its program's `context_entry`.
struct LeanRun {
    a: &'static Attached,
    entry: usize,
}

/// The lean handler of programs that need a run context (see [`lean_handler`]): what
/// [`on_hit`] does, through `LoadedProgram::run_fast` (a CPU slot and the run context, then the
/// program's native code; no FP state saved by the stub beyond the live vector registers, no
/// Rust handler dispatch, no statistics).
#[unsafe(link_section = ".text.hot.userbpf")]
unsafe extern "C" fn lean_run(regs: *mut PtRegs, arg: u64, record: *mut [u64; 3]) -> u64 {
    // SAFETY: `arg` is the `LeanRun` leaked for this probe by `lean_handler` (never freed).
    let run = unsafe { &*(arg as *const LeanRun) };
    let a = run.a;
    // Nothing below panics (`run_fast` says so); the catch keeps that true at this boundary
    // whatever changes (a panic must not unwind into the stub).
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let info = RunContext {
            regs: regs as u64,
            func_ip: a.func_ip,
            cookie: a.cookie,
            nr_args: 6,
            // SAFETY: `regs` points to the hook's saved registers for this hit.
            retval: a.retprobe.then(|| unsafe { (*regs).ax }),
            at_func_entry: a.at_func_entry,
            ..RunContext::EMPTY
        };
        // SAFETY: `run.entry` is the program's context_entry; `record` is the stub's zeroed
        // failure record; the program's context is the hook's pt_regs, as in `on_hit`.
        unsafe { a.prog.run_fast(run.entry, regs.cast::<u8>(), std::mem::size_of::<PtRegs>(), info, record) };
    }));
    0
}

/// `bpf_probe_read_kernel` as the runtime has it.
static READ_KERNEL: OnceLock<userbpf_vm::HelperFn> = OnceLock::new();

/// `bpf_probe_read_kernel` for probes: the probe's `struct pt_regs` is kernel memory in the
/// kernel, and libbpf's `usdt.bpf.h` reads registers from `ctx` with this helper. A read
/// lying inside the run's `pt_regs` is a copy; any other goes to the runtime's helper.
unsafe extern "C" fn probe_read_kernel(dst: u64, size: u64, src: u64, a4: u64, a5: u64) -> u64 {
    let size = size as u32 as u64;
    if let Some(c) = userbpf_runtime::context::current() {
        let regs = c.regs;
        if regs != 0
            && src >= regs
            && src.checked_add(size).is_some_and(|e| e <= regs + std::mem::size_of::<PtRegs>() as u64)
        {
            // SAFETY: the source lies inside the probe's pt_regs (live for the run); `dst` is
            // the program's buffer of `size` bytes, as for the runtime's own helper.
            unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst as *mut u8, size as usize) };
            return 0;
        }
    }
    match READ_KERNEL.get() {
        // SAFETY: the runtime's helper, called as the VM would.
        Some(f) => unsafe { f(dst, size, src, a4, a5) },
        None => (-libc::EFAULT) as i64 as u64,
    }
}

/// The runtime's helpers, with [`probe_read_kernel`] in place of its own.
fn helpers() -> Arc<userbpf_vm::HelperRegistry> {
    static REG: OnceLock<Arc<userbpf_vm::HelperRegistry>> = OnceLock::new();
    REG.get_or_init(|| {
        let base = userbpf_runtime::helpers::registry();
        let mut reg = (*base).clone();
        if let Some(h) = base.get(113) {
            let _ = READ_KERNEL.set(h.func);
            reg.register(userbpf_vm::Helper { func: probe_read_kernel, ..*h });
        }
        Arc::new(reg)
    })
    .clone()
}

/// Names a program's JIT'd code for profilers (`USERBPF_PERF_MAP`, see
/// `userbpf_hook::perfmap`), as the kernel's `bpf_prog_<tag>_<name>` symbols name its JIT'd
/// programs.
fn name_code(prog: &LoadedProgram) {
    if let Some((at, len)) = prog.native_code() {
        userbpf_hook::perfmap::note(at, len, &format!("bpf_prog_{}", prog.name));
    }
}

fn lock(m: &Mutex<Agent>) -> MutexGuard<'_, Agent> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Agent {
    /// Opens the session of this process and attaches its links.
    pub fn start() -> Result<&'static Mutex<Agent>, String> {
        Self::start_with(false)
    }

    /// As [`Agent::start`]; `ack`: this process will have a watcher thread, so it keeps an
    /// acknowledgement file (see [`Ack`]) from before its first sync.
    fn start_with(ack: bool) -> Result<&'static Mutex<Agent>, String> {
        // The agent's work on the calling thread (the target's): no probe fires for it.
        let _ours = userbpf_hook::ours();
        if let Some(a) = AGENT.get() {
            return Ok(a);
        }
        let session = match Session::from_env() {
            Some(s) => s.map_err(|e| format!("opening the session: {e}"))?,
            None => return Err("USERBPF_SESSION is not set".into()),
        };
        Self::start_in(session, ack)
    }

    /// As [`Agent::start_with`], in `session`.
    fn start_in(session: Session, ack: bool) -> Result<&'static Mutex<Agent>, String> {
        if let Some(a) = AGENT.get()
            && !detach::is_detached()
        {
            return Ok(a);
        }
        // Started again after a detach in the same session (the same directory, not one made
        // anew under its name): its programs and CPU slots are taken up again, as the
        // runtime keeps programs and maps mapped until the process exits (see
        // `userbpf_runtime::program_table`): nothing is mapped twice.
        // Which session life, though, is only known per file: programs are checked against
        // their records when used again (`program`), the slots against the `cpus` file.
        let session_ino = dir_inode(session.dir());
        let cpus_now = FileStamp::of(&session.layout().cpus(), true);
        let kept = AGENT.get().map(|c| {
            let mut g = lock(c);
            if g.session_ino == session_ino && session_ino != 0 && g.session.name() == session.name() {
                let slots = g.slots.take().filter(|_| cpus_now.is_some() && g.cpus_stamp == cpus_now);
                (std::mem::take(&mut g.programs), slots)
            } else {
                (HashMap::new(), None)
            }
        });
        let (programs, slots) = kept.unwrap_or_default();
        let slots = match slots {
            Some(s) => s,
            // Every run reads the slots' descriptor: with the hit path's other objects.
            None => userbpf_arena::scope(|| CpuSlots::open(&session.layout().cpus()).map(Arc::new))
                .map_err(|e| format!("CPU slots: {e}"))?,
        };
        let cpus_stamp = FileStamp::of(&session.layout().cpus(), true);
        // While the process can still read the session: what it needs to reach it through the
        // broker once it dropped privileges (see `userbpf_runtime::session::broker`).
        if let Err(e) = broker::remember(session.dir()) {
            log(&format!("a privilege drop will hide later links from this process: {e}"));
        }
        // The programs' run statistics go to the session, where `userbpf export` reads them.
        if let Err(e) = userbpf_runtime::prog_stats::bind(session.layout()) {
            log(&format!("run statistics stay in this process: {e}"));
        }
        let engine =
            if std::env::var(INTERPRETER_ENV).is_ok_and(|v| v == "1") { Engine::Interpreter } else { Engine::Jit };
        detach::before_guard();
        userbpf_vm::guard::install();
        // A fatal fault outside eBPF code leaves the last program of its thread in the session.
        userbpf_runtime::crash::arm(session.layout());
        let ack = if ack {
            Ack::create(session.dir())
        } else {
            // No watcher here: a file of this pid and start time is a previous image's (an
            // exec keeps both), which can no longer acknowledge anything.
            Ack::stale(session.dir());
            None
        };
        if ack.is_some() {
            forget_own_semaphore_claims(session.dir());
        }
        let agent = Agent {
            session,
            session_ino,
            slots: Some(slots),
            cpus_stamp,
            engine,
            programs,
            links: HashMap::new(),
            ack,
            semas: HashMap::new(),
            prog_records: None,
        };
        let cell = match AGENT.get() {
            // Started again after a detach (`userbpf attach` of a process detached before):
            // the detached agent's session was left and its objects dropped.
            Some(cell) => {
                *lock(cell) = agent;
                detach::reclaim();
                cell
            }
            None => AGENT.get_or_init(|| Mutex::new(agent)),
        };
        // Fork handlers: the hook engine's first, so its prepare handler runs after ours (the
        // agent's lock is taken before the registry's, as `sync` does).
        userbpf_hook::fork::install();
        install_fork_handlers();
        if let Err(e) = userbpf_hook::dlnotify::install(on_objects_changed) {
            log(&format!("libraries loaded later (dlopen) will only be probed when links change: {e}"));
        }
        lock(cell).sync();
        Ok(cell)
    }

    /// The CPU slots (an error once detached).
    fn slots(&self) -> Result<Arc<CpuSlots>, String> {
        self.slots.clone().ok_or_else(|| "the agent is detached from this process".to_string())
    }

    /// For `detach`: every link detached, the semaphores this process raised lowered, its
    /// acknowledgement file removed (loaders stop waiting for it), and the session left.
    fn leave_session(&mut self) {
        for (_, l) in std::mem::take(&mut self.links) {
            l.detach();
        }
        self.sync_semaphores(&HashSet::new());
        if let Some(ack) = self.ack.take() {
            ack.remove();
        }
        match self.session.leave() {
            // Dropped privileges and no broker: the membership ends with the process (a member
            // that is gone no longer counts, see `Session::live_members`).
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {}
            Err(e) => log(&format!("detach: leaving session {}: {e}", self.session.name())),
            Ok(()) => {}
        }
        broker::forget();
    }

    /// Attaches links that appeared and detaches links that are gone.
    pub fn sync(&mut self) {
        if detach::is_detached() {
            return;
        }
        let _ours = userbpf_hook::ours();
        // SAFETY: gettid has no preconditions.
        let me = unsafe { libc::gettid() };
        let outer = SYNCING.swap(me, Ordering::SeqCst);
        // The generation first, then the listing (see `Ack`).
        let generation = self.ack.is_some().then(|| Ack::current(self.session.dir()));
        let complete = self.sync_inner();
        if let (Some(a), Some(generation)) = (self.ack.as_mut(), generation) {
            // A forked child syncing before its watcher made its own file leaves the
            // parent's alone.
            if complete && generation > a.done && ACK_PID.load(Ordering::SeqCst) == std::process::id() {
                let _ = a.write(generation);
            }
        }
        SYNCING.store(outer, Ordering::SeqCst);
    }

    /// Whether every link was acted on (false: some wait for the dynamic loader, the watcher
    /// syncs again).
    fn sync_inner(&mut self) -> bool {
        self.prog_records = None;
        let links = match self.session.links() {
            Ok(l) => l,
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied && retry_broker(self.session.dir()) => {
                // A broker listens but did not answer (busy, or stopped): the watcher tries
                // again shortly (a few times, see `retry_broker`).
                return false;
            }
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
                // The process changed its credentials since it joined (a daemon dropping
                // privileges, su's child) and no broker serves the session now (see
                // `userbpf_runtime::session::broker`): the probes in place keep firing, as the
                // kernel's would, and nothing is said. The watch of `links/` (made before the
                // drop) still names the links removed: those are detached; links added wait
                // for a broker.
                let gone = std::mem::take(&mut *watcher::GONE_LINKS.lock().unwrap_or_else(|e| e.into_inner()));
                for id in gone {
                    if let Some(l) = self.links.remove(&id) {
                        l.detach();
                    }
                }
                return true;
            }
            Err(e) => {
                log(&format!("reading links: {e}"));
                return true;
            }
        };
        // The listing says which links are gone.
        watcher::GONE_LINKS.lock().unwrap_or_else(|e| e.into_inner()).clear();
        BROKER_RETRIES.store(0, Ordering::Relaxed);
        let me = std::process::id();
        let objs = symbols::loaded_objects();
        // Links gone from the session, and (in a forked child) links for another process.
        let mine: HashSet<u32> = links.iter().filter(|l| l.pid.is_none_or(|p| p == me)).map(|l| l.id).collect();
        let gone: Vec<u32> = self.links.keys().copied().filter(|id| !mine.contains(id)).collect();
        for id in gone {
            if let Some(l) = self.links.remove(&id) {
                l.detach();
            }
        }
        // Links whose library was unloaded wait for it to be loaded again.
        let gone_since = std::mem::take(&mut *UNMAPPED.lock().unwrap_or_else(|e| e.into_inner()));
        let unmapped: Vec<u32> = self
            .links
            .iter()
            .filter(|(_, l)| l.object.as_ref().is_some_and(|o| !objs.contains(o) || gone_since.contains(o)))
            .map(|(id, _)| *id)
            .collect();
        for id in unmapped {
            if let Some(l) = self.links.remove(&id) {
                l.forget();
            }
        }
        let mut deferred = false;
        for link in links {
            if self.links.contains_key(&link.id) || !mine.contains(&link.id) {
                continue;
            }
            match self.attach(&link, &objs) {
                Ok(Outcome::Attached(l)) => {
                    userbpf_runtime::loader::report_attach(&self.session, link.id, Ok(()));
                    self.links.insert(link.id, l);
                }
                Ok(Outcome::NotHere) => {}
                Ok(Outcome::Deferred) => deferred = true,
                Err(e) => {
                    log(&format!("link {} ({} {}): {e}", link.id, link.kind, target_spec(&link)));
                    userbpf_runtime::loader::report_attach(&self.session, link.id, Err(&e));
                    // Remember the failure so it is reported once.
                    self.links.insert(link.id, AttachedLink::default());
                }
            }
        }
        if deferred {
            kick();
        }
        self.sync_semaphores(&mine);
        !deferred
    }

    /// USDT semaphores of a loader's links (uprobe events with a `ref_ctr_offset`: the
    /// syscall-server records them as `perf/sema-LINK` = "PATH\nFILE_OFFSET\nPID or -1\n"),
    /// as the kernel keeps them: raised by one in every process mapping the file while the
    /// link exists. The loader raises them in the processes that exist when it makes the
    /// link; a process started (or a library mapped) later raises its own here. Exactly one
    /// of them does, for each process and link: the one creating
    /// `perf/sema-LINK.PID.STARTTIME` (O_EXCL). What this process raised it lowers when the
    /// link goes (or is not for this process any more); a semaphore whose library was
    /// unmapped is forgotten (raised again if the library comes back).
    fn sync_semaphores(&mut self, mine: &HashSet<u32>) {
        let layout = self.session.layout().clone();
        let me = std::process::id();
        let start = userbpf_runtime::session::start_time(me).unwrap_or(0);
        let claim_path = |link: u32| layout.semaphore_claim(link, me, start);
        let mut maps: Option<String> = None;
        let mut maps =
            || maps.get_or_insert_with(|| std::fs::read_to_string("/proc/self/maps").unwrap_or_default()).clone();
        let known: Vec<u32> = self.semas.keys().copied().collect();
        for id in known {
            let Some(Some(s)) = self.semas.get(&id).copied() else {
                if !mine.contains(&id) {
                    self.semas.remove(&id);
                }
                continue;
            };
            let live = userbpf_hook::usdt::semaphore_address(&maps(), s.dev, s.ino, s.off) == Some(s.addr as u64);
            if !mine.contains(&id) {
                self.semas.remove(&id);
                if live {
                    usdt::semaphore_add(s.addr, -1);
                }
                let _ = broker::remove_file(&claim_path(id));
            } else if !live {
                self.semas.remove(&id);
                let _ = broker::remove_file(&claim_path(id));
            }
        }
        for r in SemaphoreRecord::all(self.session.layout()) {
            let (id, off) = (r.link, r.offset);
            if !mine.contains(&id) || self.semas.contains_key(&id) || !r.is_for(me) {
                continue;
            }
            let Ok(md) = std::fs::metadata(&r.path) else { continue };
            let (dev, ino) = (std::os::unix::fs::MetadataExt::dev(&md), std::os::unix::fs::MetadataExt::ino(&md));
            let Some(addr) = userbpf_hook::usdt::semaphore_address(&maps(), dev, ino, off).map(|a| a as usize) else {
                continue;
            };
            let claimed = broker::open(&claim_path(id), libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL, 0o600).is_ok();
            if claimed {
                usdt::semaphore_add(addr, 1);
            }
            self.semas.insert(id, claimed.then_some(Sema { addr, dev, ino, off }));
        }
    }

    fn program(&mut self, id: u32) -> Result<Arc<LoadedProgram>, String> {
        let layout = self.session.layout().clone();
        let stamp = |id: u32| FileStamp::of(&layout.prog(id), false);
        if let Some((p, was)) = self.programs.get(&id) {
            // Kept across a detach: the same program only while its record is the same file
            // (the session may have been wiped or made anew since, its ids given out again).
            if was.is_some() && *was == stamp(id) {
                return Ok(p.clone());
            }
            self.programs.remove(&id);
        }
        if self.prog_records.is_none() {
            self.prog_records = Some(self.session.progs().map_err(|e| e.to_string())?);
        }
        let rec = self
            .prog_records
            .iter()
            .flatten()
            .find(|p| p.id == id)
            .cloned()
            .ok_or(format!("program {id} is not in the session"))?;
        let prog = prepare_record(&self.session, &rec, helpers(), self.engine, self.slots()?)?;
        // Every run reads the program's descriptor: with the hit path's other objects.
        let prog = userbpf_arena::scope(|| Arc::new(prog));
        if !userbpf_runtime::program_table::register(prog.clone()) {
            return Err(userbpf_runtime::program_table::full_message(&rec.name));
        }
        name_code(&prog);
        self.programs.insert(id, (prog.clone(), stamp(id)));
        // The programs it may tail-call (statically initialised prog arrays included).
        for (tid, t) in
            userbpf_runtime::loader::prepare_tail_targets(&self.session, &rec, helpers(), self.engine, self.slots()?)?
        {
            name_code(&t);
            self.programs.insert(tid, (t, stamp(tid)));
        }
        Ok(prog)
    }

    fn attach(&mut self, link: &LinkRecord, objs: &[MappedObject]) -> Result<Outcome, String> {
        if link.kind == "tracepoint" || link.kind == "raw_tracepoint" {
            let prog = self.program(link.prog_id)?;
            return tracepoint::attach(link, prog).map(Outcome::Attached);
        }
        // The object the link names, if it is mapped here.
        let obj = if link.path.is_empty() {
            objs.first()
        } else {
            objs.iter().find(|o| symbols::same_file(&o.path, &link.path))
        };
        let Some(obj) = obj.cloned() else { return Ok(Outcome::NotHere) };
        let library = (objs.first() != Some(&obj)).then(|| obj.clone());
        if link.kind == "usdt" {
            if link.path.is_empty() && !usdt::has_probe(&obj, link) {
                return Ok(Outcome::NotHere);
            }
            let prog = self.program(link.prog_id)?;
            let mut l = usdt::attach(&self.session, link, prog)?;
            l.object = library;
            return Ok(Outcome::Attached(l));
        }
        if link.kind != "uprobe" && link.kind != "uretprobe" {
            return Err(format!("links of kind `{}` cannot be attached in a process", link.kind));
        }
        let kind = if link.kind == "uretprobe" { ProbeKind::Return } else { ProbeKind::Entry };
        let resolved = match &link.func {
            Some(f) => {
                let func = if link.offset != 0 { format!("{f}+{}", link.offset) } else { f.clone() };
                match symbols::resolve(&format!("{}:{func}", obj.path.display())) {
                    Ok(r) => r,
                    Err(userbpf_hook::HookError::Symbol(m)) if m.starts_with(symbols::DEFERRED) => {
                        return Ok(Outcome::Deferred);
                    }
                    // Not the target: an executable without the function.
                    Err(_) if link.path.is_empty() && !symbols::has_function(&obj.path, f).unwrap_or(false) => {
                        return Ok(Outcome::NotHere);
                    }
                    Err(e) => return Err(e.to_string()),
                }
            }
            // An address in the file (as its symbols give them).
            None => {
                let addr = obj.bias.wrapping_add(link.offset as usize);
                symbols::resolve(&format!("{addr:#x}")).map_err(|e| e.to_string())?
            }
        };
        let prog = self.program(link.prog_id)?;
        overrides_at_entry(&prog, kind, &resolved, &target_spec(link))?;
        let entry = kind == ProbeKind::Entry && at_func_entry(resolved.addr);
        let data: *mut Attached = detach::leak(Attached {
            prog,
            cookie: link.cookie,
            func_ip: resolved.func_start as u64,
            retprobe: kind == ProbeKind::Return,
            ip: 0,
            at_func_entry: entry,
        });
        let ext =
            resolved.size.filter(|s| *s > 0).map(|len| userbpf_hook::FuncExtent { start: resolved.func_start, len });
        // SAFETY: `data` was just leaked above; it is freed only at detach, once no handler
        // can run (`detach::run`).
        let lean = lean_handler(unsafe { &*data });
        let id = userbpf_hook::attach_lean(resolved.addr, kind, on_hit, data.cast(), ext, lean)
            .map_err(|e| e.to_string())?;
        Ok(Outcome::Attached(AttachedLink { probes: vec![id], object: library, ..Default::default() }))
    }

    /// What the agent did in this process, on stderr (`USERBPF_EXIT_REPORT`, a diagnostic for
    /// runs whose probes seem not to have fired): the hook engine's counters, the links
    /// attached (with their probes) and each program's skipped and failed runs.
    fn exit_report(&self) {
        let pid = std::process::id();
        let mut lines = vec![format!("hook {:?}", userbpf_hook::stats())];
        let mut ids: Vec<&u32> = self.links.keys().collect();
        ids.sort();
        for id in ids {
            let l = &self.links[id];
            lines.push(format!("link {id}: probes {:?}, system call probes {}", l.probes, l.raw.len()));
        }
        let mut progs: Vec<&(Arc<LoadedProgram>, Option<FileStamp>)> = self.programs.values().collect();
        progs.sort_by_key(|(p, _)| p.id);
        for (p, _) in progs {
            lines.push(format!(
                "program {} `{}`: runs {} (counted only with statistics on), missed {}, errors {}",
                p.id,
                p.name,
                p.stats.run_cnt.load(Ordering::Relaxed),
                p.stats.missed.load(Ordering::Relaxed),
                p.stats.errors.load(Ordering::Relaxed)
            ));
        }
        for l in lines {
            eprintln!("userbpf exit report (pid {pid}): {l}");
        }
    }
}

/// Consecutive syncs that found a broker listening for the session but got no answer.
static BROKER_RETRIES: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// After permission was denied on the session in `dir`: whether to sync again shortly (a
/// broker listens, so its failure is taken as passing; 20 tries, a few hundred milliseconds,
/// then the next change of the session's links).
fn retry_broker(dir: &std::path::Path) -> bool {
    if !broker::served(dir) || BROKER_RETRIES.fetch_add(1, Ordering::Relaxed) >= 20 {
        return false;
    }
    kick();
    true
}

/// A program calling `bpf_override_return` is attached, as the kernel attaches one, only at a
/// function's entry (an entry probe: the function is skipped) or return (a return probe: its
/// value replaced); anywhere else the override would have no function to skip.
fn overrides_at_entry(
    prog: &LoadedProgram,
    kind: ProbeKind,
    resolved: &symbols::Resolved,
    spec: &str,
) -> Result<(), String> {
    if kind == ProbeKind::Entry
        && resolved.addr != resolved.func_start
        && prog.calls_helper(userbpf_runtime::helpers::overrides::OVERRIDE_RETURN)
    {
        return Err(format!(
            "program `{}` calls bpf_override_return, which needs a probe at a function's entry; {spec} is {} bytes into its function",
            prog.name,
            resolved.addr - resolved.func_start
        ));
    }
    Ok(())
}

/// The inode of directory `dir` (0: none).
fn dir_inode(dir: &std::path::Path) -> u64 {
    std::fs::metadata(dir).map(|m| std::os::unix::fs::MetadataExt::ino(&m)).unwrap_or(0)
}

/// A link's target as the user wrote it (USDT links: `PATH:PROVIDER:NAME`): `PATH:FUNC+OFF`,
/// `FUNC+OFF`, or `PATH:0xADDR` for an address in the file.
fn target_spec(link: &LinkRecord) -> String {
    let func = match &link.func {
        Some(f) if link.offset != 0 => format!("{f}+{}", link.offset),
        Some(f) => f.clone(),
        None => format!("{:#x}", link.offset),
    };
    if link.path.is_empty() { func } else { format!("{}:{func}", link.path) }
}

/// The loader mapped or unmapped libraries (called inside dlopen/dlclose, see
/// `userbpf_hook::dlnotify`): sync now, so that a library's probes are in place when dlopen
/// returns. If the agent is busy (its lock may be held by a thread waiting for the loader),
/// the watcher thread syncs instead.
fn on_objects_changed(c: &ObjectChanges) {
    let _ours = userbpf_hook::ours();
    let Some(cell) = AGENT.get() else { return };
    if detach::is_detached() {
        return;
    }
    // SAFETY: gettid has no preconditions.
    let me = unsafe { libc::gettid() };
    // The agent's thread syncs (its descriptors are its own, not the program's); this thread
    // waits for it as it would for the lock below.
    if !watcher::is_agent_thread() {
        UNMAPPED.lock().unwrap_or_else(|e| e.into_inner()).extend(c.removed.iter().map(|(o, _)| o.clone()));
        if watcher::request_sync(std::time::Duration::from_millis(500)) {
            return;
        }
    }
    // The agent's lock is usually held by a sync of the watcher thread, soon done: wait for it
    // a while, but not for ever (that sync may be waiting for the loader), and not when this
    // thread is the one syncing (a library loaded by the sync itself).
    let deadline = std::time::Instant::now() + std::time::Duration::from_millis(500);
    loop {
        match cell.try_lock() {
            Ok(mut a) => return a.sync(),
            Err(TryLockError::Poisoned(p)) => return p.into_inner().sync(),
            Err(TryLockError::WouldBlock)
                if SYNCING.load(Ordering::SeqCst) != me && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(std::time::Duration::from_micros(100));
            }
            Err(TryLockError::WouldBlock) => {
                // The library may be mapped again at the same place before the watcher
                // syncs: remember that its probes were forgotten.
                UNMAPPED.lock().unwrap_or_else(|e| e.into_inner()).extend(c.removed.iter().map(|(o, _)| o.clone()));
                kick();
                return;
            }
        }
    }
}

/// The thread running `Agent::sync` (0: none).
static SYNCING: AtomicI32 = AtomicI32::new(0);

/// Objects unmapped while the agent was busy (see `on_objects_changed`).
static UNMAPPED: Mutex<Vec<MappedObject>> = Mutex::new(Vec::new());

/// At exit: this process leaves its session, which goes with it when no other process uses it
/// (see `Session::leave_process`). The agent's lock stays held from here on: the watcher must
/// not sync against a session directory that is gone; the process is ending.
extern "C" fn leave_at_exit() {
    // userbpf's own work on the exiting thread: no probe fires for it.
    let _ours = userbpf_hook::ours();
    let _ = std::panic::catch_unwind(|| {
        if let Some(a) = AGENT.get().filter(|_| !detach::is_detached()) {
            let agent = lock(a);
            if std::env::var_os("USERBPF_EXIT_REPORT").is_some_and(|v| !v.is_empty() && v != "0") {
                agent.exit_report();
            }
            userbpf_runtime::crash::disarm(agent.session.layout());
            let _ = agent.session.leave_process();
            std::mem::forget(agent);
        }
    });
}

/// Runs when the library is loaded (LD_PRELOAD or dlopen).
#[used]
#[unsafe(link_section = ".init_array")]
static AGENT_INIT: extern "C" fn(libc::c_int, *const *const libc::c_char, *mut *mut libc::c_char) = watcher::agent_init;
