//! userbpf-hook: in-process inline hooks for x86-64 Linux.
//!
//! A probe patches the first 5 bytes at an address with `jmp rel32` to a
//! per-site stub on a page mapped within ±1.5 GB of the target; where 5 bytes cannot be
//! taken it uses the alignment padding after the function, or else a one-byte `int3`
//! whose `SIGTRAP` sends the thread to the same stub (`placement` explains the choice,
//! [`probe_method`] tells which was made; an `endbr64` at a function's start is kept and
//! the patch goes after it). The stub jumps through the site's switch word: to a stub
//! generated for the site when its only probe is a lean entry handler that allows one
//! (see `stubs`, "Generated stubs"; [`uses_generated_stub`]), else on: it
//! calls a shared stub that saves every GPR, the flags and the FP/vector
//! state that can be live there, builds a kernel x86-64 `struct pt_regs`
//! ([`PtRegs`]) and calls the site's handlers; then the displaced
//! instructions run from their relocated copy and jump back. Probes inside
//! a function save the whole FP/SSE/AVX state (xsave, or fxsave without
//! OSXSAVE); probes at a function entry and the return trampoline save only
//! what the System V ABI lets be live there (see `stubs::FpSave`; opt out
//! with `USERBPF_HOOK_FULL_FPSAVE=1`).
//! See `arch` for the code layout and `patch` for the live-patching protocol.
//!
//! * Entry handlers ([`ProbeKind::Entry`]) see the registers at the probed
//!   address (`ip` = that address, `sp` = the rsp there). They may change
//!   registers (written back), change `ip` (execution resumes there), or
//!   return [`HOOK_SKIP`] at a function entry: the function is not run and
//!   returns to its caller with `ax` (override-return; `bpf_override_return` instead
//!   points `ip` at a bare `ret`, as the kernel does). Either way, at a function entry the
//!   site's return probes still fire when the frame returns (they see the overridden `ax`),
//!   as the kernel's kretprobes do after an override.
//! * Return handlers ([`ProbeKind::Return`], function entries only) see the
//!   registers at the function's return (`ax` = return value, `ip` = the
//!   return address, `sp` = the caller's rsp after the return).
//!
//! The hit path takes no lock, allocates nothing and makes no syscall except
//! once per thread (mmap of the thread's state + pthread_setspecific, see
//! `thread`). Handlers run with a per-thread recursion guard: a probe hit
//! from inside a handler runs no handler and is counted in
//! [`HookStats::missed_recursion`]. The same guard keeps probes off for
//! userbpf's own work: inside an [`ours`] scope and on threads marked with
//! [`mark_thread_ours`] (such hits are counted as missed too).
//!
//! Sites and trampolines are never freed: after the last probe of an address
//! is detached the original bytes are restored but the trampoline page stays
//! mapped, because a thread may still be inside it (or hold a return address
//! into it); attaching to that address again reuses it.
//!
//! Do not call [`attach`]/[`detach`] from a handler: a detach waits for
//! running handlers (so the `data` of a detached probe can be freed as soon
//! as `detach` returns), and a handler blocked on the registry would deadlock.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering::*};
use std::sync::{Mutex, OnceLock};

pub mod dlnotify;
pub mod fork;
mod patch;
pub mod perfmap;
mod placement;
pub mod quiet;
mod relocate;
pub mod rewrite;
mod stubs;
pub mod sud;
pub mod symbols;
pub mod syscalls;
mod thread;
pub mod usdt;

pub use patch::fixup_signal;
pub use placement::Method;
pub use thread::SHADOW_CAPACITY;
pub use thread::{Ours, is_thread_ours, mark_thread_ours, ours, ours_begin, ours_end, probes_off};

/// The kernel's x86-64 `struct pt_regs` (libbpf `PT_REGS_*` work unchanged).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PtRegs {
    pub r15: u64,
    pub r14: u64,
    pub r13: u64,
    pub r12: u64,
    pub bp: u64,
    pub bx: u64,
    pub r11: u64,
    pub r10: u64,
    pub r9: u64,
    pub r8: u64,
    pub ax: u64,
    pub cx: u64,
    pub dx: u64,
    pub si: u64,
    pub di: u64,
    pub orig_ax: u64,
    pub ip: u64,
    pub cs: u64,
    pub flags: u64,
    pub sp: u64,
    pub ss: u64,
}

impl PtRegs {
    /// System V argument `n` (0-based, 0..=5: di, si, dx, cx, r8, r9), like PT_REGS_PARMn.
    pub fn arg(&self, n: usize) -> Option<u64> {
        match n {
            0 => Some(self.di),
            1 => Some(self.si),
            2 => Some(self.dx),
            3 => Some(self.cx),
            4 => Some(self.r8),
            5 => Some(self.r9),
            _ => None,
        }
    }
    /// PT_REGS_RC.
    pub fn rc(&self) -> u64 {
        self.ax
    }
}

/// What a handler is called for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ProbeKind {
    /// uprobe: at the probed address, before the instruction there runs.
    Entry,
    /// uretprobe: when the probed function returns (function entries only).
    Return,
}

/// Handler result: go on with the probed code.
pub const HOOK_CONTINUE: u32 = 0;
/// Handler result (entry probes at a function entry): do not run the
/// function, return to the caller with `regs.ax` (the other registers as the
/// handler left them). Other handlers of the hit still run.
pub const HOOK_SKIP: u32 = 1;

/// A probe handler. Runs on the probing thread, with all registers and the
/// live FP state saved (it may clobber any vector register, MXCSR or x87
/// state); must not unwind. At a function entry or return a change of
/// `regs.flags` is not applied (the status flags are dead there).
pub type Handler = unsafe extern "C" fn(data: *mut c_void, regs: *mut PtRegs) -> u32;

/// A handler the stubs call directly, without saving the FP/vector state and without
/// going through Rust (see [`attach_lean`]): a probe that is the only one of its kind
/// (entry, or return) at its site, and whose gate is closed, runs it instead of its
/// [`Handler`].
///
/// `func` is called as `extern "C" fn(regs: *mut PtRegs, arg: u64, record: *mut [u64; 3])
/// -> u64` on a 16-byte aligned stack, with `record[0] == 0`. It must follow the C calling
/// convention for the general-purpose registers, must not take a lock and must not unwind;
/// it sets `record[0]` to non-zero when its run failed, which adds one to `*failures`. Its
/// return value is ignored; a change of `regs.ip` is applied as for handlers (entry probes).
///
/// It may also run nothing and set `record[0]` to [`LEAN_RETRY`]: the hit then takes the general
/// path (the [`Handler`]), as if the lean handler were not there.
///
/// With `calls_out == 0` it must not touch any vector, opmask or x87 register nor MXCSR and
/// must not call out (nothing it runs may reach a probed function): the JIT's fast entry of a
/// program calling no helper is such a function. With `calls_out != 0` it may run compiled
/// code (Rust, libc) that uses the vector registers and may reach probed functions: the stub
/// then holds the thread's recursion guard around the call (a probe hit meanwhile runs no
/// handler and counts in [`HookStats::missed_recursion`]) and keeps the vector registers the
/// probe point may have live (0-7 at an entry, 0-1 at a return) at their full width. It must
/// still leave MXCSR, the x87 control word and the x87 stack as it found them (compiled Rust
/// does not change them), and it may clobber every other vector and opmask register, which
/// the System V ABI makes dead at function entries and returns (see `stubs::FpSave` for that
/// assumption and its opt-out, under which no lean path is used). With `calls_out ==`
/// [`LEAN_GUARD_ONLY`] the stub holds the recursion guard but keeps no vector register: the
/// handler keeps 0-7 itself around whatever it calls.
#[repr(C)]
#[derive(Debug)]
pub struct LeanHandler {
    pub func: usize,
    pub arg: u64,
    /// While the byte here is non-zero, hits take the general path (the [`Handler`]).
    pub gate: *const u8,
    /// Counts failed runs (`record[0] != 0`).
    pub failures: *const AtomicU64,
    /// Non-zero: `func` calls out (see above).
    pub calls_out: u64,
    /// Non-zero: `func` may read the fields of the pt_regs after the general-purpose
    /// registers (`orig_ax`, `ip`, `cs`, `flags`, `sp`, `ss`) or change `ip`. Zero: it reads
    /// at most the 15 registers (the first [`PT_REGS_GPR_BYTES`] bytes) and changes no `ip`;
    /// the entry stub then leaves the rest unwritten and does not look for a changed `ip` (a
    /// probe hit is issue-width bound: each of those instructions counts).
    pub reads_all: u64,
    /// With `reads_all == 0`: the 8-byte words of the pt_regs `func` may read, bit `i` for the
    /// word at byte `8 * i` (bits 0-14, the registers; [`LEAN_READS_GPRS`] for any of them). A
    /// site whose only probe is such a handler's gets a stub generated for it, which stores
    /// the callee-saved registers only when read (the caller-saved ones it always keeps).
    pub regs_read: u64,
}

/// [`LeanHandler::regs_read`] of a handler that may read any of the 15 registers.
pub const LEAN_READS_GPRS: u64 = (1 << 15) - 1;

/// The bytes of `struct pt_regs` before `orig_ax`: the 15 general-purpose registers but `sp`
/// (see [`LeanHandler::reads_all`]).
pub const PT_REGS_GPR_BYTES: u32 = 120;

// SAFETY: plain addresses of code and of 'static atomics, read by any thread.
unsafe impl Sync for LeanHandler {}
// SAFETY: as above.
unsafe impl Send for LeanHandler {}

/// What a [`LeanHandler`] stores in `record[0]` to hand the hit to the general path (all ones).
pub const LEAN_RETRY: u64 = u64::MAX;

/// [`LeanHandler::calls_out`] of a handler that may call out (compiled code that may reach
/// probed functions: the stub holds the recursion guard around it) but keeps the vector
/// registers 0-7 itself around its calls (and touches no other vector, x87 or MXCSR state
/// outside them), so the stub saves none: the JIT's claiming entry of a program whose calls
/// go through `userbpf_vm`'s preserving thunk.
pub const LEAN_GUARD_ONLY: u64 = 2;

/// Identifies one attached handler.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ProbeId(pub u64);

/// The extent of the function holding a probe: used for the
/// branch-into-the-patch check and to know whether the probe is at the
/// function's entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FuncExtent {
    pub start: usize,
    pub len: usize,
}

#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum HookError {
    #[error("cannot probe {addr:#x}: not in executable code ({reason})")]
    NotCode { addr: usize, reason: String },
    #[error("refusing to probe the function at {addr:#x}: {reason}")]
    Refused { addr: usize, reason: String },
    #[error("cannot probe {addr:#x}: no free memory within ±1.5 GB for its trampoline")]
    NoNearMemory { addr: usize },
    #[error("patching {addr:#x} failed: {reason}")]
    Patch { addr: usize, reason: String },
    #[error("return probes and HOOK_SKIP need a function entry; {addr:#x} is inside a function")]
    NotFunctionEntry { addr: usize },
    #[error("unknown probe {0:?}")]
    UnknownProbe(ProbeId),
    #[error("symbol: {0}")]
    Symbol(String),
    #[error("too many probed addresses (limit {0})")]
    TooManySites(usize),
    #[error("hook engine initialisation failed: {0}")]
    Init(String),
}

/// Counters of the engine (process-wide, monotonic).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HookStats {
    /// Hits that ran no handler because the thread was already in a handler.
    pub missed_recursion: u64,
    /// Hits that ran no handler because no per-thread state could be made.
    pub missed_no_state: u64,
    /// Return probes skipped because the thread's shadow stack was full.
    pub shadow_full: u64,
    /// Shadow-stack entries dropped because their frame was gone (longjmp, exceptions).
    pub shadow_stale: u64,
    /// Threads that hit the int3 of a patch in progress.
    pub traps: u64,
    /// Threads moved out of displaced instructions while patching.
    pub fixups: u64,
    /// Hits of probes planted as breakpoints (each one a SIGTRAP).
    pub breakpoint_hits: u64,
    /// Times the engine's `SIGTRAP` handler was found replaced in the kernel (a `sigaction`
    /// the guard probe did not see) and taken back before writing an `int3`.
    pub sigtrap_retaken: u64,
    pub thread_states_created: u64,
    pub thread_states_freed: u64,
}

static MISSED_RECURSION: AtomicU64 = AtomicU64::new(0);
static MISSED_NO_STATE: AtomicU64 = AtomicU64::new(0);
static SHADOW_FULL: AtomicU64 = AtomicU64::new(0);
static SHADOW_STALE: AtomicU64 = AtomicU64::new(0);

pub fn stats() -> HookStats {
    HookStats {
        missed_recursion: MISSED_RECURSION.load(Relaxed),
        missed_no_state: MISSED_NO_STATE.load(Relaxed),
        shadow_full: SHADOW_FULL.load(Relaxed),
        shadow_stale: SHADOW_STALE.load(Relaxed),
        traps: patch::TRAPS.load(Relaxed),
        fixups: patch::FIXUPS.load(Relaxed),
        breakpoint_hits: patch::BREAKPOINT_HITS.load(Relaxed),
        sigtrap_retaken: patch::TRAP_RETAKEN.load(Relaxed),
        thread_states_created: thread::STATES_CREATED.load(Relaxed),
        thread_states_freed: thread::STATES_FREED.load(Relaxed),
    }
}

// ---------------------------------------------------------------- sites ----

#[derive(Clone, Copy)]
struct Entry {
    id: u64,
    kind: ProbeKind,
    handler: Handler,
    data: usize,
    lean: Option<&'static LeanHandler>,
}

struct HandlerList {
    items: Vec<Entry>,
}

struct Site {
    addr: usize,
    is_entry: bool,
    page: usize,
    relocated: usize,
    len: usize,
    prot: i32,
    orig: [u8; 5],
    jmp: [u8; 5],
    fix_map: Vec<(usize, usize)>,
    /// Where the patch is written (`addr`, or after an `endbr64` there) and how.
    patch_at: usize,
    method: Method,
    list: AtomicPtr<HandlerList>,
    /// Whether the published list has entry / return handlers: lets a hit
    /// skip the read-side section when it has nothing to run.
    has_entry: AtomicBool,
    has_ret: AtomicBool,
    /// The lean handler the stubs call directly (see [`LeanHandler`]): set while the site's
    /// only entry handler has one.
    lean_entry: AtomicPtr<LeanHandler>,
    /// Set while the site's only return handler has a lean handler.
    lean_ret: AtomicPtr<LeanHandler>,
    patched: AtomicBool,
    /// The switch word the site stub jumps through (`stubs::site_stub`): the shared path
    /// (`shared`) or a stub generated for the site's lean handler (`stubs::fast_stub`).
    switch: &'static AtomicU64,
    shared: usize,
    /// The stubs generated for this site so far, by what each was generated from (registry
    /// lock held; never freed: a thread may still be in one). Not by lean handler: a handler
    /// is freed at detach, and the next attach's may be made at its address with other
    /// contents (another program's entry, another claim), which a stub found by address
    /// would not call.
    fast: Mutex<Vec<(stubs::Fast, usize)>>,
}

struct Registry {
    sites: HashMap<usize, &'static Site>,
    probes: HashMap<u64, usize>,
    next_id: u64,
}

static REGISTRY: Mutex<Option<Registry>> = Mutex::new(None);
static RET_TRAMP: AtomicUsize = AtomicUsize::new(0);
/// Whether return probes are planted by the site stub's `call` (light stubs; see
/// `stubs::site_stub`), rather than by writing the trampoline's address over the return
/// address (the full save's stubs, `USERBPF_HOOK_FULL_FPSAVE=1`).
static CALL_PLANTING: AtomicBool = AtomicBool::new(false);

struct Globals {
    /// Entry stub with the full FP save (probes inside functions).
    common_full: usize,
    /// Entry stub with the light FP save (probes at function entries).
    common_light: usize,
}
static GLOBALS: OnceLock<Result<Globals, String>> = OnceLock::new();

/// Prepares the engine on the calling thread (its signal handlers, the registration for
/// `membarrier`) without attaching anything. Call it while the process has a single thread:
/// registering for `membarrier` in a process with several costs an RCU grace period (about
/// 10 ms), where a single-threaded one registers at once.
pub fn prepare() -> Result<(), HookError> {
    init().map(|_| ())
}

fn init() -> Result<&'static Globals, HookError> {
    let g = GLOBALS.get_or_init(init_inner).as_ref().map_err(|e| HookError::Init(e.clone()))?;
    // After `release`: the engine's signal handlers go back in before anything is patched.
    patch::reclaim_signals().map_err(HookError::Init)?;
    Ok(g)
}

fn init_inner() -> Result<Globals, String> {
    let fp = stubs::detect_fpsave();
    thread::init_rcu();
    // See stubs::FpSave for why the light save is enough at function entries
    // and returns, and for the opt-out.
    let full_only = std::env::var_os("USERBPF_HOOK_FULL_FPSAVE").is_some_and(|v| !v.is_empty() && v != "0");
    let (entry_kind, ret_kind) = if full_only {
        (stubs::SaveKind::Full, stubs::SaveKind::Full)
    } else {
        (stubs::SaveKind::Light(8), stubs::SaveKind::Light(2))
    };
    // Two pages: the light entry stub's lean paths (plain, calling out, guard only) and the
    // full stub together pass one. The light stub and the return trampoline, what a function's
    // entry and return probes run, come first and share the first page (a hit on cold caches
    // pays a translation for every page of code it runs); the full stub (probes inside
    // functions) follows.
    const STUBS_LEN: usize = 8192;
    let page = thread::raw_mmap(STUBS_LEN) as usize;
    if page == 0 {
        return Err("mmap of the shared stubs failed".into());
    }
    let e = |x: iced_x86::IcedError| x.to_string();
    let align = |x: usize| (x + 63) & !63;
    let disp = entry_dispatch as *const () as usize as u64;
    // Not at the page's start: the target's page-aligned objects all compete for the level-1
    // set of offset 0 (see `stubs::SITE_STUB_AT`); the two still fit in the page after it.
    let light_at = page + 64;
    let light = stubs::common_entry(light_at as u64, fp, entry_kind, disp).map_err(e)?;
    let ret_at = light_at + align(light.len());
    let ret = stubs::ret_tramp(ret_at as u64, fp, ret_kind, ret_dispatch as *const () as usize as u64).map_err(e)?;
    let full_at = ret_at + align(ret.len());
    let full = stubs::common_entry(full_at as u64, fp, stubs::SaveKind::Full, disp).map_err(e)?;
    if full_at + full.len() > page + STUBS_LEN {
        return Err("shared stubs do not fit in their pages".into());
    }
    patch::seal_pages(page, STUBS_LEN, &[(light_at - page, &light), (ret_at - page, &ret), (full_at - page, &full)])?;
    perfmap::note(full_at, full.len(), "userbpf_entry_stub_full");
    perfmap::note(light_at, light.len(), "userbpf_entry_stub_light");
    perfmap::note(ret_at, ret.len(), "userbpf_return_trampoline");
    RET_TRAMP.store(ret_at, SeqCst);
    CALL_PLANTING.store(!full_only, SeqCst);
    let mut key: libc::pthread_key_t = 0;
    // SAFETY: creating a pthread key with a destructor that only takes the
    // pointer we store in it.
    if unsafe { libc::pthread_key_create(&mut key, Some(thread::destroy)) } != 0 {
        return Err("pthread_key_create failed".into());
    }
    thread::PTHREAD_KEY.store(key as usize, SeqCst);
    patch::install_handlers()?;
    patch::handlers_installed();
    Ok(Globals { common_full: full_at, common_light: light_at })
}

fn registry() -> std::sync::MutexGuard<'static, Option<Registry>> {
    REGISTRY.lock().unwrap_or_else(|p| p.into_inner())
}

/// Attaches `handler` at `addr` (a function entry; return probes are only
/// allowed there). Without a function extent the branch-into-patch check
/// only covers the displaced instructions: prefer [`attach_with`] or
/// [`attach_symbol`] when the function's size is known.
pub fn attach(addr: usize, kind: ProbeKind, handler: Handler, data: *mut c_void) -> Result<ProbeId, HookError> {
    attach_with(addr, kind, handler, data, None)
}

/// Resolves `spec` with [`symbols::resolve`] and attaches with its extent.
pub fn attach_symbol(spec: &str, kind: ProbeKind, handler: Handler, data: *mut c_void) -> Result<ProbeId, HookError> {
    let r = symbols::resolve(spec)?;
    let ext = r.size.filter(|s| *s > 0).map(|len| FuncExtent { start: r.func_start, len });
    attach_with(r.addr, kind, handler, data, ext)
}

/// Attaches `handler` at `addr`, inside the function `func` when given.
pub fn attach_with(
    addr: usize,
    kind: ProbeKind,
    handler: Handler,
    data: *mut c_void,
    func: Option<FuncExtent>,
) -> Result<ProbeId, HookError> {
    attach_lean(addr, kind, handler, data, func, None)
}

/// [`attach_with`], with a lean handler doing what `handler` does: the stubs of a function
/// entry (or return) run it directly while this probe is the only one of its kind there and
/// its gate is closed. `handler` runs
/// otherwise (and must stay equivalent).
pub fn attach_lean(
    addr: usize,
    kind: ProbeKind,
    handler: Handler,
    data: *mut c_void,
    func: Option<FuncExtent>,
    lean: Option<&'static LeanHandler>,
) -> Result<ProbeId, HookError> {
    let g = init()?;
    patch::guard_sigtrap();
    if let Some(f) = func
        && (addr < f.start || addr >= f.start.saturating_add(f.len))
    {
        return Err(HookError::Refused {
            addr,
            reason: format!("address outside the function extent {:#x}+{}", f.start, f.len),
        });
    }
    let mut guard = registry();
    let reg = guard.get_or_insert_with(|| Registry { sites: HashMap::new(), probes: HashMap::new(), next_id: 1 });
    let site = match reg.sites.get(&addr) {
        Some(s) => *s,
        None => {
            let s = create_site(g, addr, func, reg)?;
            reg.sites.insert(addr, s);
            s
        }
    };
    if kind == ProbeKind::Return && !site.is_entry {
        return Err(HookError::NotFunctionEntry { addr });
    }
    let id = reg.next_id;
    reg.next_id += 1;
    let old = site.list.load(SeqCst);
    let mut items = if old.is_null() {
        Vec::new()
    } else {
        // SAFETY: lists are only replaced under the registry lock, which we hold.
        unsafe { (*old).items.clone() }
    };
    // Newest first: the kernel runs the consumers of one uprobe from the last registered
    // (its list adds at the head), so programs attached to one function run in the reverse
    // of their attach order there too, and a program can tell (the order of their output,
    // or of their updates of a map they share).
    items.insert(0, Entry { id, kind, handler, data: data as usize, lean });
    publish(site, items);
    if !site.patched.load(SeqCst)
        && let Err(e) = patch_in(site)
    {
        let items = unsafe_list_items(site).into_iter().filter(|e| e.id != id).collect();
        publish(site, items);
        return Err(e);
    }
    reg.probes.insert(id, addr);
    Ok(ProbeId(id))
}

fn unsafe_list_items(site: &Site) -> Vec<Entry> {
    let p = site.list.load(SeqCst);
    if p.is_null() {
        Vec::new()
    } else {
        // SAFETY: called under the registry lock; the list stays alive until
        // the registry replaces it.
        unsafe { (*p).items.clone() }
    }
}

/// Pages of switch words (see `Site::switch`): the page and how many words it handed out.
/// Registry lock held (sites are made under it).
static SWITCH_PAGES: Mutex<Vec<(usize, usize)>> = Mutex::new(Vec::new());
const SWITCH_WORDS: usize = (4096 - stubs::SWITCH_AT) / 8;

/// A switch word within rel32 reach of code at `near` (a site stub), from a page of them
/// (RW data, never executable; never freed).
fn switch_word(near: usize) -> Option<&'static AtomicU64> {
    let reach = |w: usize| w.abs_diff(near) < (1 << 31) - 4096;
    let mut pages = SWITCH_PAGES.lock().unwrap_or_else(|p| p.into_inner());
    let i = match pages.iter().position(|&(p, used)| used < SWITCH_WORDS && reach(p)) {
        Some(i) => i,
        None => {
            let p = patch::alloc_near(near)?;
            pages.push((p, 0));
            pages.len() - 1
        }
    };
    let (p, used) = &mut pages[i];
    let w = *p + stubs::SWITCH_AT + 8 * *used;
    *used += 1;
    // SAFETY: an 8-aligned word of a private RW page of ours, handed out once and never
    // unmapped: a 'static atomic.
    Some(unsafe { &*(w as *const AtomicU64) })
}

/// Where the site's hits go (registry lock held): the stub generated for its lean entry
/// handler (made now if needed) when the site can use one (see `stubs::Fast`), else the
/// shared path.
fn switch_target(site: &Site, lean: *const LeanHandler, has_ret: bool) -> usize {
    if lean.is_null() || has_ret || !site.is_entry || !CALL_PLANTING.load(SeqCst) {
        return site.shared;
    }
    // SAFETY: lean handlers are 'static.
    let l = unsafe { &*lean };
    let guard = l.calls_out == LEAN_GUARD_ONLY;
    if l.reads_all != 0 || !(l.calls_out == 0 || guard) || l.regs_read & !LEAN_READS_GPRS != 0 {
        return site.shared;
    }
    let t = thread::table_layout();
    let f = stubs::Fast {
        func: l.func as u64,
        arg: l.arg,
        gate: l.gate as u64,
        failures: l.failures as u64,
        guard,
        regs_read: l.regs_read,
        switch: site.switch as *const AtomicU64 as u64,
        shared: site.shared as u64,
        reloc: site.relocated as u64,
        // SAFETY: the address of thread::ASYM, a static AtomicBool.
        asym: unsafe { &*(t.asym as *const AtomicBool) }.load(SeqCst),
    };
    let mut fast = site.fast.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(&(_, stub)) = fast.iter().find(|(made_from, _)| *made_from == f) {
        return stub;
    }
    let Some(page) = patch::alloc_near(site.addr) else {
        return site.shared;
    };
    let at = page + stubs::FAST_STUB_AT;
    let sealed = stubs::fast_stub(at as u64, &f).map_err(|e| e.to_string()).and_then(|code| {
        patch::seal_page(page, &[(stubs::FAST_STUB_AT, &code)])?;
        perfmap::note(at, code.len(), &format!("userbpf_generated_stub@{:#x}", site.addr));
        Ok(())
    });
    if sealed.is_err() {
        patch::free_near(page);
        return site.shared;
    }
    fast.push((f, at));
    at
}

/// Replaces the site's handler list (registry lock held) and frees the old
/// one once no hit can be reading it.
fn publish(site: &Site, items: Vec<Entry>) {
    let has_ret = items.iter().any(|e| e.kind == ProbeKind::Return);
    let has_entry = items.iter().any(|e| e.kind == ProbeKind::Entry);
    let only = |kind: ProbeKind| {
        let mut of_kind = items.iter().filter(|e| e.kind == kind);
        match (of_kind.next(), of_kind.next()) {
            (Some(e), None) => e.lean.map_or(std::ptr::null_mut(), |l| l as *const LeanHandler as *mut LeanHandler),
            _ => std::ptr::null_mut(),
        }
    };
    // The lean paths only serve function entries (the light stubs).
    let lean_entry = if site.is_entry { only(ProbeKind::Entry) } else { std::ptr::null_mut() };
    let lean_ret = if site.is_entry { only(ProbeKind::Return) } else { std::ptr::null_mut() };
    site.has_entry.store(has_entry, SeqCst);
    site.has_ret.store(has_ret, SeqCst);
    site.lean_entry.store(lean_entry, SeqCst);
    site.lean_ret.store(lean_ret, SeqCst);
    // Before the wait below: a generated stub checks the switch inside its read-side section.
    site.switch.store(switch_target(site, lean_entry, has_ret) as u64, SeqCst);
    // Hits read the list and its entries: with the hit path's other objects (the entries copied
    // into a vector made there).
    let new = if items.is_empty() {
        std::ptr::null_mut()
    } else {
        Box::into_raw(userbpf_arena::scope(|| {
            let mut placed = Vec::with_capacity(items.len());
            placed.extend(items);
            Box::new(HandlerList { items: placed })
        }))
    };
    let old = site.list.swap(new, SeqCst);
    if !old.is_null() && thread::synchronize() {
        // SAFETY: old came from Box::into_raw and no reader can hold it any more.
        drop(unsafe { Box::from_raw(old) });
    }
}

/// Detaches a probe. When it returns, the handler is not running and will
/// not run again. The last probe of an address restores its original bytes.
pub fn detach(id: ProbeId) -> Result<(), HookError> {
    let mut guard = registry();
    let Some(reg) = guard.as_mut() else {
        return Err(HookError::UnknownProbe(id));
    };
    let Some(addr) = reg.probes.remove(&id.0) else {
        return Err(HookError::UnknownProbe(id));
    };
    let Some(site) = reg.sites.get(&addr).copied() else {
        return Err(HookError::UnknownProbe(id));
    };
    let items: Vec<Entry> = unsafe_list_items(site).into_iter().filter(|e| e.id != id.0).collect();
    let empty = items.is_empty();
    if empty
        && site.patched.load(SeqCst)
        && let Err(e) = patch_out(site)
    {
        reg.probes.insert(id.0, addr);
        return Err(e);
    }
    publish(site, items);
    Ok(())
}

/// Removes every probe of the process (the program's and the engine's own: the guard probes
/// on libc's `sigaction`/`pthread_sigmask`, system call dispatch's), restoring their original
/// bytes with the same live-patching protocol as [`detach`]. Returns how many were removed
/// and the first failure, if any (a probe that failed stays).
pub fn detach_all() -> (usize, Option<HookError>) {
    let ids: Vec<u64> = registry().as_ref().map(|r| r.probes.keys().copied().collect()).unwrap_or_default();
    let mut n = 0;
    let mut first = None;
    for id in ids {
        match detach(ProbeId(id)) {
            Ok(()) => n += 1,
            Err(e) => {
                first.get_or_insert(e);
            }
        }
    }
    (n, first)
}

/// The number of probes in place.
pub fn probe_count() -> usize {
    registry().as_ref().map_or(0, |r| r.probes.len())
}

/// Leaves the process as it was before the engine (`userbpf detach`): system call dispatch
/// off in every thread and its `SIGSYS` and switch signal given back, the loader's
/// notification (`dlnotify`) taken out of `_dl_debug_state`, every probe removed (original
/// bytes back), running handlers waited for, then `SIGTRAP` and the fixup signal given back
/// (`SIGTRAP` to what the program set last). Trampoline pages and the engine's code stay
/// mapped: a thread may still return through them (a return probe's trampoline address on
/// its stack, a relocated copy it is running). The next [`attach`] takes the signals again
/// and the next `dlnotify::install` patches the loader again. Returns how many probes went.
pub fn release() -> Result<usize, HookError> {
    sud::release();
    dlnotify::uninstall().map_err(HookError::Init)?;
    let (n, err) = detach_all();
    if let Some(e) = err {
        return Err(e);
    }
    thread::synchronize();
    sud::release_signals();
    patch::release_signals();
    Ok(n)
}

/// Rewrites libc's system call sites (`rewrite::apply`), away from the probes in place.
pub(crate) fn rewrite_libc() -> Result<usize, String> {
    init().map_err(|e| e.to_string())?;
    // The engine's handlers return through dispatch's page, never through libc's restorer
    // (rewritten too, see `patch::return_through`).
    patch::return_through(sud::restorer());
    let guard = registry();
    let taken: Vec<(usize, usize)> = guard
        .as_ref()
        .map(|r| {
            r.sites
                .values()
                .filter(|s| s.patched.load(SeqCst))
                .map(|s| (s.patch_at, s.patch_at + s.len.max(s.method.patch_len())))
                .collect()
        })
        .unwrap_or_default();
    rewrite::apply(&taken)
}

/// Gives libc's rewritten system call sites their original bytes back (`rewrite::remove`).
pub(crate) fn unrewrite_libc() -> Result<(), String> {
    let _guard = registry();
    rewrite::remove()
}

/// The bytes currently at a probed address (for tests and diagnostics).
pub fn original_bytes(addr: usize) -> Option<[u8; 5]> {
    registry().as_ref()?.sites.get(&addr).map(|s| s.orig)
}

/// Whether hits of the probed address `addr` go to a stub generated for its lone lean entry
/// handler rather than to the shared stubs (for tests and diagnostics).
pub fn uses_generated_stub(addr: usize) -> Option<bool> {
    registry().as_ref()?.sites.get(&addr).map(|s| s.switch.load(SeqCst) != s.shared as u64)
}

/// How the probe at `addr` was planted, and where its patch is (see [`Method`]).
pub fn probe_method(addr: usize) -> Option<(Method, usize)> {
    registry().as_ref()?.sites.get(&addr).map(|s| (s.method, s.patch_at))
}

fn create_site(g: &Globals, addr: usize, func: Option<FuncExtent>, reg: &Registry) -> Result<&'static Site, HookError> {
    let map = patch::mapping_of(addr).ok_or_else(|| HookError::NotCode { addr, reason: "not mapped".into() })?;
    if map.prot & libc::PROT_EXEC == 0 || map.prot & libc::PROT_READ == 0 {
        return Err(HookError::NotCode { addr, reason: "mapping is not readable and executable".into() });
    }
    let refuse = |reason: String| HookError::Refused { addr, reason };
    // The function's bytes (or up to 64 from addr), plus the padding after it, with the
    // patches of other sites undone.
    let is_entry = func.map(|f| f.start == addr).unwrap_or(true);
    let func = func.filter(|f| f.start >= map.start && f.start + f.len <= map.end);
    let base = func.map_or(addr, |f| f.start);
    let end = func.map_or(map.end.min(addr + 64), |f| f.start + f.len);
    let padding = func.map_or(0, |f| symbols::gap_after(f.start + f.len));
    let stop = (end + padding).min(map.end);
    // Rewritten system call sites (`rewrite`) where this probe's patch may go are given back
    // to dispatch first.
    rewrite::yield_range(addr, addr + 24);
    // SAFETY: [base, stop) lies inside a readable mapping of this process.
    let mut bytes = unsafe { std::slice::from_raw_parts(base as *const u8, stop - base) }.to_vec();
    // The other rewritten system call sites (`rewrite`) are read as their original bytes.
    rewrite::original_bytes(base, &mut bytes);
    let mut taken = Vec::new();
    for s in reg.sites.values().filter(|s| s.patched.load(SeqCst)) {
        let n = s.method.patch_len();
        // A jump's displaced instructions run from its copy, which would not see a new patch.
        let span = if s.method == Method::Breakpoint { n } else { s.len.max(n) };
        taken.push((s.patch_at, s.patch_at + span));
        for k in 0..n {
            if let Some(b) = (s.patch_at + k).checked_sub(base).and_then(|i| bytes.get_mut(i)) {
                *b = s.orig[k];
            }
        }
    }
    let place = placement::choose(&placement::Code {
        addr,
        func,
        base,
        bytes: &bytes[..end - base],
        is_entry,
        padding: stop - end,
        taken: &taken,
    })
    .map_err(refuse)?;
    let patch_at = place.patch_at;
    let disp = place.disp;
    let page = patch::alloc_near(addr).ok_or(HookError::NoNearMemory { addr })?;
    let fail = |reason: String| {
        // Nothing refers to the page: it goes back to the pool.
        patch::free_near(page);
        HookError::Refused { addr, reason }
    };
    let relocated = page + stubs::RELOC_OFF;
    let (rcode, new_addrs) = match relocate::relocate(&disp, relocated as u64, (patch_at + disp.len) as u64) {
        Ok(r) => r,
        Err(e) => return Err(fail(e)),
    };
    let fix_map = disp.instrs.iter().zip(&new_addrs).map(|(i, n)| (i.ip() as usize - patch_at, *n as usize)).collect();
    let mut orig = [0u8; 5];
    let n = place.method.patch_len();
    orig[..n].copy_from_slice(&bytes[patch_at - base..patch_at - base + n]);
    let stub_at = page + stubs::SITE_STUB_AT;
    let rel = (stub_at as i64) - (patch_at as i64 + 5);
    let Ok(rel) = i32::try_from(rel) else {
        return Err(fail("trampoline out of rel32 range".into()));
    };
    let mut jmp = [0xE9, 0, 0, 0, 0];
    jmp[1..].copy_from_slice(&rel.to_le_bytes());
    if place.method == Method::Breakpoint {
        jmp = [0xCC, 0, 0, 0, 0];
    }
    let shared = stub_at + stubs::SHARED_AT as usize;
    let Some(switch) = switch_word(stub_at) else {
        return Err(fail("no memory for the site's switch word within rel32 reach".into()));
    };
    switch.store(shared as u64, SeqCst);
    // The stubs read the site on every hit: with the hit path's other objects.
    let site: &'static Site = Box::leak(userbpf_arena::scope(|| {
        Box::new(Site {
            addr,
            is_entry,
            page,
            relocated,
            len: disp.len,
            prot: map.prot,
            orig,
            jmp,
            fix_map,
            patch_at,
            method: place.method,
            list: AtomicPtr::new(std::ptr::null_mut()),
            has_entry: AtomicBool::new(false),
            has_ret: AtomicBool::new(false),
            lean_entry: AtomicPtr::new(std::ptr::null_mut()),
            lean_ret: AtomicPtr::new(std::ptr::null_mut()),
            patched: AtomicBool::new(false),
            switch,
            shared,
            fast: Mutex::new(Vec::new()),
        })
    }));
    let common = if site.is_entry { g.common_light } else { g.common_full };
    let stub = stubs::site_stub(
        stub_at as u64,
        switch as *const AtomicU64 as u64,
        site as *const Site as u64,
        common as u64,
        relocated as u64,
        (site.is_entry && CALL_PLANTING.load(SeqCst)).then(|| RET_TRAMP.load(SeqCst) as u64),
    );
    let res = stub.and_then(|stub| {
        if stub.len() > stubs::RELOC_OFF - stubs::SITE_STUB_AT {
            return Err("site stub too long".to_string());
        }
        patch::seal_page(page, &[(stubs::SITE_STUB_AT, &stub), (stubs::RELOC_OFF, &rcode)])?;
        perfmap::note(stub_at, stub.len(), &format!("userbpf_site_stub@{addr:#x}"));
        perfmap::note(relocated, rcode.len(), &format!("userbpf_relocated@{addr:#x}"));
        Ok(())
    });
    if let Err(e) = res {
        return Err(fail(e));
    }
    // A thread meeting the int3 of a jump being written goes to the site stub, as the jump
    // will send it (the probe fires from the moment the first byte changes, as a kernel
    // uprobe fires from its int3; while the last probe is detached, the stub's list is
    // empty and it goes on with the relocated copy); one meeting a breakpoint goes there too
    // (the low bit counts it as a breakpoint hit).
    let trap_to = if place.method == Method::Breakpoint { stub_at | 1 } else { stub_at };
    if !patch::register_trap_site(patch_at, trap_to) {
        return Err(HookError::TooManySites(patch::MAX_SITES));
    }
    let _ = site.page;
    Ok(site)
}

/// A function called by [`patch_in`] while a jump's `int3` is in place, before the rest of
/// the jump is written. For tests of that window only.
static PATCH_PAUSE: Mutex<Option<fn(usize)>> = Mutex::new(None);

/// Makes every jump patch call `f` (with the probed address) while its `int3` is in place
/// (None: stop). For tests: a thread calling the function then meets the patch in progress.
/// `f` runs on the attaching thread, with the engine's registry lock held: it must not attach
/// or detach.
#[doc(hidden)]
pub fn set_patch_pause(f: Option<fn(usize)>) {
    *PATCH_PAUSE.lock().unwrap_or_else(|p| p.into_inner()) = f;
}

fn patch_in(site: &Site) -> Result<(), HookError> {
    let perr = |reason: String| HookError::Patch { addr: site.addr, reason };
    let at = site.patch_at;
    // Our handler must be the one the kernel runs for the int3 about to be written.
    patch::own_sigtrap();
    if site.method == Method::Breakpoint {
        // One byte: a thread fetches either the old byte or the int3 (as the kernel's and
        // debuggers' breakpoints are written); no thread can be inside it.
        patch::write_text(at, &[0xCC], site.prot).map_err(perr)?;
        site.patched.store(true, SeqCst);
        return Ok(());
    }
    patch::write_text(at, &[0xCC], site.prot).map_err(perr)?;
    patch::set_fixup(at, site.len, &site.fix_map);
    patch::broadcast();
    let pause = *PATCH_PAUSE.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(f) = pause {
        f(site.addr);
    }
    if let Err(e) = patch::write_text(at + 1, &site.jmp[1..], site.prot) {
        patch::clear_fixup();
        let _ = patch::write_text(at, &site.orig[..1], site.prot);
        return Err(perr(e));
    }
    patch::broadcast();
    let r = patch::write_text(at, &site.jmp[..1], site.prot).map_err(perr);
    patch::clear_fixup();
    r?;
    site.patched.store(true, SeqCst);
    Ok(())
}

fn patch_out(site: &Site) -> Result<(), HookError> {
    let perr = |reason: String| HookError::Patch { addr: site.addr, reason };
    let at = site.patch_at;
    if site.method == Method::Breakpoint {
        // A thread that met the int3 just before is sent back to `at` by the SIGTRAP
        // handler (the byte is no longer an int3).
        patch::write_text(at, &site.orig[..1], site.prot).map_err(perr)?;
        site.patched.store(false, SeqCst);
        return Ok(());
    }
    patch::own_sigtrap();
    patch::write_text(at, &[0xCC], site.prot).map_err(perr)?;
    patch::broadcast();
    patch::write_text(at + 1, &site.orig[1..], site.prot).map_err(perr)?;
    patch::broadcast();
    patch::write_text(at, &site.orig[..1], site.prot).map_err(perr)?;
    site.patched.store(false, SeqCst);
    Ok(())
}

// ------------------------------------------------------------- hit path ----

#[repr(C)]
struct Resume {
    target: u64,
    mode: u64,
}

/// Called by the shared entry stub. No lock, no allocation, no syscall
/// (except the first hit of a thread, see `thread`).
unsafe extern "C" fn entry_dispatch(site: *const Site, regs: *mut PtRegs) -> Resume {
    // A Site* with its low bit set comes from the lean entry path (stubs::lean_entry_path):
    // the entry handler already ran, only the return trampoline is left to plant. Bit 1: the
    // same, and the handler changed `regs.ip` (stubs::lean_ip_changed), kept as it left it.
    let entry_done = site as usize & 3 != 0;
    let keep_ip = site as usize & 2 != 0;
    let site = (site as usize & !3) as *const Site;
    // SAFETY: site is the leaked Site embedded in the stub; regs points at the
    // pt_regs the stub built on this thread's stack.
    let (site, regs) = unsafe { (&*site, &mut *regs) };
    if !keep_ip {
        regs.ip = site.addr as u64;
    }
    regs.sp = (regs as *mut PtRegs as usize + stubs::ENTRY_FRAME) as u64;
    regs.cs = 0x33;
    regs.ss = 0x2b;
    regs.orig_ax = u64::MAX;
    let sp = regs.sp;
    let normal = Resume { target: site.relocated as u64, mode: 0 };
    // The SIGTRAP guard (libc's `sigaction`, `pthread_sigmask`) runs on every call, also
    // where the site's probes are skipped below (see `patch::guard_at`).
    let guard_only = |regs: &mut PtRegs| {
        if let Some(h) = patch::guard_at(site.addr) {
            // SAFETY: the guard handlers take no data and the live pt_regs of the call.
            if unsafe { h(std::ptr::null_mut(), regs) } == HOOK_SKIP && site.is_entry {
                return Resume { target: 0, mode: 1 };
            }
        }
        Resume { target: site.relocated as u64, mode: 0 }
    };
    let st = thread::current();
    if st.is_null() {
        MISSED_NO_STATE.fetch_add(1, Relaxed);
        return guard_only(regs);
    }
    // SAFETY: st is this thread's state, only touched by this thread.
    let stm = unsafe { &mut *st };
    if stm.in_handler != 0 {
        MISSED_RECURSION.fetch_add(1, Relaxed);
        return guard_only(regs);
    }
    stm.in_handler = 1;
    if stm.registered == 0 {
        thread::register_destructor(st);
    }
    let mut skip = false;
    let has_ret = site.has_ret.load(Relaxed);
    if site.has_entry.load(Relaxed) && !entry_done {
        let idx = thread::read_lock(st);
        let list = site.list.load(SeqCst);
        if !list.is_null() {
            // SAFETY: the list cannot be freed while we are in the read section.
            let list = unsafe { &*list };
            for e in &list.items {
                if e.kind == ProbeKind::Entry {
                    // SAFETY: calling the user's handler with its data and our regs.
                    if unsafe { (e.handler)(e.data as *mut c_void, regs) } == HOOK_SKIP {
                        skip = true;
                    }
                }
            }
        }
        thread::read_unlock(st, idx);
    }
    let mut res = normal;
    let redirected = (skip && site.is_entry) || regs.ip != site.addr as u64;
    if redirected {
        // The function is skipped (an override: resumed at a bare `ret`) or replaced by
        // other code: its return probes still fire when its frame returns, as the kernel's
        // kretprobes do after an override (the return address is the trampoline's).
        if has_ret && site.is_entry && regs.sp == sp && push_shadow(stm, site, sp) {
            // SAFETY: at a function entry [sp] is the return address pushed by the caller's
            // call, on this thread's stack; the return trampoline restores the original.
            unsafe { (sp as *mut u64).write(RET_TRAMP.load(Relaxed) as u64) };
        }
        res = if skip && site.is_entry { Resume { target: 0, mode: 1 } } else { Resume { target: regs.ip, mode: 2 } };
    } else if has_ret && site.is_entry && push_shadow(stm, site, sp) {
        if CALL_PLANTING.load(Relaxed) {
            // The site stub calls the relocated code (mode 3), which puts its return
            // landing in that slot.
            res = Resume { target: site.relocated as u64, mode: 3 };
        } else {
            // SAFETY: as above.
            unsafe { (sp as *mut u64).write(RET_TRAMP.load(Relaxed) as u64) };
        }
    }
    stm.in_handler = 0;
    res
}

/// Pushes the shadow-stack entry of a function entered with `sp` (its return address at
/// `[sp]`); false when the shadow stack is full (the return probes of this call are lost and
/// counted).
fn push_shadow(stm: &mut thread::ThreadState, site: &Site, sp: u64) -> bool {
    // Dead frames (longjmp'd over) sit at or below the new frame: drop them.
    while stm.top > 0 && stm.entries[stm.top - 1].sp <= sp {
        stm.top -= 1;
        SHADOW_STALE.fetch_add(1, Relaxed);
    }
    if stm.top >= SHADOW_CAPACITY {
        SHADOW_FULL.fetch_add(1, Relaxed);
        return false;
    }
    // SAFETY: at a function entry [sp] is the return address pushed by the caller's call, on
    // this thread's stack.
    let ra = unsafe { (sp as *const u64).read() };
    stm.entries[stm.top] =
        thread::ShadowEntry { ret: ra, site: site as *const Site as usize, func_ip: site.addr as u64, sp };
    stm.top += 1;
    true
}

#[cold]
fn fatal(msg: &str) -> ! {
    // SAFETY: write(2) of a static message, then abort: nothing else is possible
    // when the real return address is lost.
    unsafe {
        libc::write(2, msg.as_ptr() as *const c_void, msg.len());
        libc::abort()
    }
}

/// Called by the return trampoline; returns the original return address.
unsafe extern "C" fn ret_dispatch(regs: *mut PtRegs) -> u64 {
    // SAFETY: regs points at the pt_regs the trampoline built on this stack.
    let regs = unsafe { &mut *regs };
    let cur = regs as *mut PtRegs as usize + stubs::PT_REGS_SIZE as usize + 8;
    regs.sp = cur as u64;
    regs.cs = 0x33;
    regs.ss = 0x2b;
    regs.orig_ax = u64::MAX;
    let st = thread::current();
    if st.is_null() {
        fatal("userbpf-hook: return trampoline reached without a shadow stack\n");
    }
    // SAFETY: st is this thread's state.
    let stm = unsafe { &mut *st };
    let want = (cur - 8) as u64;
    let e = loop {
        if stm.top == 0 {
            fatal("userbpf-hook: return trampoline reached with an empty shadow stack\n");
        }
        let e = stm.entries[stm.top - 1];
        stm.top -= 1;
        if e.sp < want {
            SHADOW_STALE.fetch_add(1, Relaxed);
            continue;
        }
        if e.sp == want {
            break e;
        }
        fatal("userbpf-hook: shadow stack does not match the returning frame\n");
    };
    regs.ip = e.ret;
    if stm.in_handler == 0 {
        stm.in_handler = 1;
        let idx = thread::read_lock(st);
        // SAFETY: sites are never freed.
        let site = unsafe { &*(e.site as *const Site) };
        let list = site.list.load(SeqCst);
        if !list.is_null() {
            // SAFETY: protected by the read section.
            for h in unsafe { &(*list).items } {
                if h.kind == ProbeKind::Return {
                    // SAFETY: calling the user's handler.
                    unsafe { (h.handler)(h.data as *mut c_void, regs) };
                }
            }
        }
        thread::read_unlock(st, idx);
        stm.in_handler = 0;
    } else {
        MISSED_RECURSION.fetch_add(1, Relaxed);
    }
    e.ret
}
