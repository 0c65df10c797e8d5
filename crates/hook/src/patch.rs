//! Memory: trampoline pages from regions reserved near the code (no search
//! by system calls, see [`alloc_near`]), and cross-thread-safe patching of
//! live code.
//!
//! ## Patching protocol (attach)
//! 1. write `int3` on the first byte (text page RWX only for that store,
//!    then back to its original protection);
//! 2. *broadcast*: send `FIXUP_SIGNAL` to every other thread of the process
//!    (`/proc/self/task` + `tgkill`) and wait for all of them to run the
//!    handler. Entering the kernel serializes each thread's instruction
//!    stream, and the handler moves a thread whose `rip` lies *inside* the
//!    displaced instructions (it was between two of them) to the same
//!    instruction in the relocated copy. A thread reaching the first byte
//!    from now on traps: the SIGTRAP handler sends it to the site's stub, where
//!    the jump will send it (the probe fires from the first byte's change on, as a
//!    kernel uprobe from its `int3`; while the last probe is being detached the
//!    stub's handler list is empty and it goes on with the relocated copy);
//! 3. write bytes 1..5 (the rel32), broadcast again;
//! 4. write the first byte (`0xE9`).
//!
//! Detach runs the same steps with the original bytes. No thread can be
//! inside a 5-byte `jmp`, so no fixup is needed there. The aligned-qword
//! atomic store variant is not used: the int3 protocol works for every
//! alignment and also solves threads paused between the displaced
//! instructions, which the single store does not.
//!
//! A thread blocked in the kernel (a system call, as `/proc/self/task/TID/syscall`
//! shows it: `NR args... SP PC`) whose `PC` is outside the displaced range is not
//! signalled: the signal would only make its `nanosleep`, `poll`, `epoll_wait`,
//! `select`... return early (`EINTR`: those never restart, `SA_RESTART` or not), which
//! the kernel's uprobes never do. Skipping it is sound: it is not between two displaced
//! instructions (its `PC` says where it resumes), its instruction stream holds nothing
//! fetched before the store (it entered the kernel and was scheduled out, and the file
//! is read after the store is done), and once it returns it can reach the patched bytes
//! only through their first byte, as any running thread: the `int3` (written before
//! the file is read) handles that. A thread reported `running` is signalled as before.
//!
//! ## Breakpoint sites
//! A probe planted as a breakpoint (`placement`) is one `int3` byte, written alone (a
//! thread fetches the old byte or the new one, as with the kernel's and debuggers'
//! breakpoints); detach writes the original byte back. No broadcast is needed: no thread can
//! be inside one byte.
//!
//! ## SIGTRAP
//! The engine's handler stays installed: an `int3` of ours (`si_code` `SI_KERNEL`, a
//! registered address before the saved `rip`) sends the thread on; any other `SIGTRAP` goes
//! to the program's disposition as the kernel would deliver it (its mask, `SA_NODEFER`,
//! `SA_RESETHAND`, `SA_SIGINFO`; the default action kills the process). The program's later
//! `sigaction`/`signal` calls for `SIGTRAP` are recorded (an entry probe on libc's
//! `sigaction`, which `signal`, `sigset` and `sysv_signal` call) instead of replacing ours, and
//! queries return what it set. That guard probe runs on every call, also where the engine
//! runs no probe (a call made inside a probe handler, or by a signal handler interrupting
//! one). The engine's handler can still be replaced where the guard does not look: by a
//! `sigaction` made after the handler was installed but before the guard probe existed (the
//! loader notification, `dlnotify`, starts the engine at preload time; under bpftrace,
//! libclang then sets up LLVM's crash-recovery handlers for `SIGTRAP`, `SIGSEGV`... through
//! libc), or by a raw `rt_sigaction`. So the kernel's disposition is checked (a raw
//! `rt_sigaction` query) before every `int3` of ours is written (a breakpoint, the first byte
//! of a jump being written or removed) and once the guard is in place; when it is not ours,
//! ours is put back and the one found is recorded as the program's ([`own_sigtrap`]): an
//! `int3` of ours always reaches our handler. A program that gives back the engine's own
//! handler (it was handed it as the "old" disposition, and LLVM's handlers restore that when
//! they disable themselves) gets the disposition from before the engine, never our handler
//! chained to itself. `SIGTRAP` is taken out of the sets given to libc's
//! `pthread_sigmask`/`sigprocmask` and of other handlers' `sa_mask` (a blocked `SIGTRAP`
//! makes the kernel kill the process at an `int3`; see `sigmask_guard`). Not seen: raw
//! `rt_sigprocmask` system calls, a raw `rt_sigaction` made *after* our `int3`s are in
//! place (until the next attach takes the handler back), masks set by other paths (`sigsuspend`,
//! `pselect`, `signalfd` users blocking it, glibc's internal blocking), and threads that
//! blocked `SIGTRAP` before the engine's first probe: a breakpoint hit there ends the process
//! as the program's own `int3` would.
//!
//! Limits: a thread that blocks `FIXUP_SIGNAL` makes the broadcast wait for
//! its timeout (1 s) and is not fixed up; a thread exiting between `tgkill`
//! and delivery also costs the timeout.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::*};
use std::time::{Duration, Instant};

/// Signal used to stop-and-fix threads during patching (SIGRTMAX - 3).
pub fn fixup_signal() -> i32 {
    libc::SIGRTMAX() - 3
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct Mapping {
    pub start: usize,
    pub end: usize,
    pub prot: i32,
}

/// `/proc/self/maps`, read with a large buffer: the kernel fills it in one or two `read`s
/// (`read_to_string` would start with a few bytes and grow, a dozen reads or more).
pub(crate) fn read_maps() -> Option<String> {
    use std::io::Read;
    let mut f = std::fs::File::open("/proc/self/maps").ok()?;
    let mut buf = Vec::with_capacity(256 << 10);
    f.read_to_end(&mut buf).ok()?;
    String::from_utf8(buf).ok()
}

/// The mapping of this process that contains `addr`.
pub(crate) fn mapping_of(addr: usize) -> Option<Mapping> {
    let maps = read_maps()?;
    for line in maps.lines() {
        let mut it = line.split_whitespace();
        let range = it.next()?;
        let perms = it.next()?;
        let (s, e) = range.split_once('-')?;
        let start = usize::from_str_radix(s, 16).ok()?;
        let end = usize::from_str_radix(e, 16).ok()?;
        if addr >= start && addr < end {
            let b = perms.as_bytes();
            let mut prot = 0;
            if b.first() == Some(&b'r') {
                prot |= libc::PROT_READ;
            }
            if b.get(1) == Some(&b'w') {
                prot |= libc::PROT_WRITE;
            }
            if b.get(2) == Some(&b'x') {
                prot |= libc::PROT_EXEC;
            }
            return Some(Mapping { start, end, prot });
        }
    }
    None
}

const PAGE: usize = 4096;
const MAX_DIST: usize = 1536 << 20;
/// The size of a region reserved for trampoline pages (`MAP_NORESERVE`: only the pages used
/// cost memory).
const CHUNK: usize = 1 << 20;
/// The lowest address a region may take (`vm.mmap_min_addr` is at most this on Linux).
const LOW: usize = 0x10000;
/// Room left for the heap above the program break (beyond it, malloc maps memory anyway).
const HEAP_ROOM: usize = 1 << 30;
/// Above this, user space ends on x86-64 (4-level paging; the last page is never mapped).
const HIGH: usize = 0x7fff_ffff_f000;

/// Trampoline pages: regions reserved near the code they serve, handed out a page at a time.
struct Pools {
    /// Reserved regions: `[start, end)`, the next page not handed out yet.
    regions: Vec<(usize, usize, usize)>,
    /// Pages given back (a probe that could not be planted after all).
    free: Vec<usize>,
}

/// A spin lock rather than a mutex: a forked child resets it ([`after_fork_in_child`]) if
/// another thread of the parent held it at the fork.
static POOLS_LOCK: AtomicBool = AtomicBool::new(false);
struct PoolsCell(std::cell::UnsafeCell<Pools>);
// SAFETY: only touched with POOLS_LOCK held (see `with_pools`).
unsafe impl Sync for PoolsCell {}
static POOLS: PoolsCell = PoolsCell(std::cell::UnsafeCell::new(Pools { regions: Vec::new(), free: Vec::new() }));

fn with_pools<R>(f: impl FnOnce(&mut Pools) -> R) -> R {
    while POOLS_LOCK.compare_exchange_weak(false, true, SeqCst, SeqCst).is_err() {
        std::thread::yield_now();
    }
    // SAFETY: the lock is held: this is the only reference.
    let r = f(unsafe { &mut *POOLS.0.get() });
    POOLS_LOCK.store(false, SeqCst);
    r
}

/// In a forked child: the thread that held the pools' lock (if any) is not there.
pub(crate) fn after_fork_in_child() {
    POOLS_LOCK.store(false, SeqCst);
}

/// Whether the whole page at `page` is within reach of `target` (rel32 jumps both ways, and
/// RIP-relative operands of the relocated code still reach what they address near `target`).
fn near(page: usize, target: usize) -> bool {
    page.abs_diff(target) < MAX_DIST && (page + PAGE).abs_diff(target) < MAX_DIST
}

/// One RW page within ±1.5 GB of `target`, for a trampoline. Pages come from regions reserved
/// near the code ([`CHUNK`] bytes each): most calls make no system call; a new region is placed
/// in a free gap of the address space found in `/proc/self/maps` (read once), with
/// `MAP_FIXED_NOREPLACE` (another thread may have mapped there meanwhile: then the maps are
/// read again, a few times at most). No page-by-page search.
pub(crate) fn alloc_near(target: usize) -> Option<usize> {
    with_pools(|pools| {
        if let Some(i) = pools.free.iter().position(|&p| near(p, target)) {
            return Some(pools.free.swap_remove(i));
        }
        for r in pools.regions.iter_mut() {
            if r.2 + PAGE <= r.1 && near(r.2, target) {
                r.2 += PAGE;
                return Some(r.2 - PAGE);
            }
        }
        for _ in 0..4 {
            let maps = read_maps()?;
            let (at, len) = free_gap(&maps, target)?;
            // SAFETY: MAP_FIXED_NOREPLACE never replaces an existing mapping; the result is
            // checked and unmapped when it is not where asked.
            let p = unsafe {
                libc::mmap(
                    at as *mut libc::c_void,
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE | libc::MAP_NORESERVE,
                    -1,
                    0,
                )
            };
            if p == libc::MAP_FAILED {
                continue;
            }
            if p as usize != at {
                // Old kernels ignore the flag and treat the address as a hint.
                // SAFETY: p was just mapped by us and is not used.
                unsafe { libc::munmap(p, len) };
                continue;
            }
            pools.regions.push((at, at + len, at + PAGE));
            return Some(at);
        }
        None
    })
}

/// Gives back a page of [`alloc_near`] that was not used (still RW, never executable).
pub(crate) fn free_near(page: usize) {
    with_pools(|pools| pools.free.push(page));
}

/// Where to reserve a region for trampolines near `target`, in the address space `maps`
/// describes (`/proc/self/maps`): the free gap placement closest to `target` whose every page
/// is within reach, [`CHUNK`] bytes or what the gap holds. Where the process grows is left
/// alone: the gap below `[stack]`, and above the program break (`[heap]`, or the executable's
/// last mapping before the heap exists) all but the top of the gap, [`HEAP_ROOM`] away.
fn free_gap(maps: &str, target: usize) -> Option<(usize, usize)> {
    let exe = std::fs::read_link("/proc/self/exe").ok();
    let mut spans: Vec<(usize, usize)> = Vec::new();
    let (mut heap_end, mut exe_end, mut stack_start) = (None, 0usize, None);
    for line in maps.lines() {
        let mut it = line.split_whitespace();
        let Some((s, e)) = it.next().and_then(|r| r.split_once('-')) else { continue };
        let (Ok(s), Ok(e)) = (usize::from_str_radix(s, 16), usize::from_str_radix(e, 16)) else { continue };
        let name = it.nth(4).unwrap_or("");
        match name {
            "[heap]" => heap_end = Some(e),
            "[stack]" => stack_start = Some(s),
            n if exe.as_ref().is_some_and(|x| x.as_os_str() == n) => exe_end = exe_end.max(e),
            _ => {}
        }
        spans.push((s, e));
    }
    spans.sort_unstable();
    let brk = heap_end.unwrap_or(exe_end);
    let mut best: Option<(usize, usize, usize)> = None;
    let mut prev_end = LOW;
    for (s, e) in spans.iter().copied().chain(std::iter::once((HIGH, HIGH))) {
        let (gs, ge) = (prev_end.max(LOW), s.min(HIGH));
        prev_end = prev_end.max(e);
        if ge <= gs || Some(ge) == stack_start {
            continue;
        }
        let len = CHUNK.min(ge - gs) & !(PAGE - 1);
        if len == 0 {
            continue;
        }
        // The end of the gap nearest the target; in the gap above the program break, only its
        // top, and only with room for the heap to grow below it.
        let at = if ge <= target {
            ge - len
        } else if gs >= target && gs != brk {
            gs
        } else {
            continue;
        };
        if gs == brk && at < brk.saturating_add(HEAP_ROOM) {
            continue;
        }
        if !near(at, target) || !near(at + len - PAGE, target) {
            continue;
        }
        let dist = if at < target { target - at } else { at + len - target };
        if best.is_none_or(|b| dist < b.2) {
            best = Some((at, len, dist));
        }
    }
    best.map(|(at, len, _)| (at, len))
}

/// Copies `code` into the fresh RW page at `page` (from [`alloc_near`]) and makes it RX.
pub(crate) fn seal_page(page: usize, code_at: &[(usize, &[u8])]) -> Result<(), String> {
    seal_pages(page, PAGE, code_at)
}

/// [`seal_page`] for `len` bytes (whole pages) at `page`.
pub(crate) fn seal_pages(page: usize, len: usize, code_at: &[(usize, &[u8])]) -> Result<(), String> {
    for (off, bytes) in code_at {
        if off + bytes.len() > len {
            return Err("trampoline does not fit in its pages".into());
        }
        // SAFETY: page is a private RW mapping of len bytes (alloc_near, or the shared
        // stubs' raw_mmap) not yet executable or shared; the range was checked above.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), (page + off) as *mut u8, bytes.len()) };
    }
    // SAFETY: the pages are ours; W^X: they become RX and are never written again.
    if unsafe { libc::mprotect(page as *mut libc::c_void, len, libc::PROT_READ | libc::PROT_EXEC) } != 0 {
        return Err(format!("mprotect(RX) failed: {}", std::io::Error::last_os_error()));
    }
    Ok(())
}

/// Writes `bytes` at `addr` in live code, making the page(s) RWX only for
/// the store and then restoring `prot`.
pub(crate) fn write_text(addr: usize, bytes: &[u8], prot: i32) -> Result<(), String> {
    let start = addr & !(PAGE - 1);
    let end = (addr + bytes.len() + PAGE - 1) & !(PAGE - 1);
    let rwx = libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC;
    // SAFETY: the range covers mapped code pages of this process (checked by
    // the caller via mapping_of); RWX keeps them executable for other threads.
    if unsafe { libc::mprotect(start as *mut libc::c_void, end - start, rwx) } != 0 {
        return Err(format!("mprotect(RWX) of {start:#x} failed: {}", std::io::Error::last_os_error()));
    }
    for (i, b) in bytes.iter().enumerate() {
        // SAFETY: the page is writable now; volatile so each byte store happens
        // in order (the protocol relies on the first byte being written alone).
        unsafe { std::ptr::write_volatile((addr + i) as *mut u8, *b) };
    }
    std::sync::atomic::fence(SeqCst);
    // SAFETY: restores the original protection of the same range.
    if unsafe { libc::mprotect(start as *mut libc::c_void, end - start, prot) } != 0 {
        return Err(format!("mprotect restore of {start:#x} failed: {}", std::io::Error::last_os_error()));
    }
    Ok(())
}

// ------------------------------------------------------------ signals ----

pub(crate) const MAX_SITES: usize = 4096;
/// The sites the SIGTRAP handler knows: an open-addressing table (linear probing, twice
/// `MAX_SITES` slots) keyed by the patched address, written under the registry lock and read
/// lock-free by the handler (the target before the address, both Release/Acquire).
const TRAP_SLOTS: usize = 2 * MAX_SITES;
/// A slot whose site was removed: lookups go on past it, inserts take it again.
const TRAP_GONE: usize = 1;
static TRAP_ADDR: [AtomicUsize; TRAP_SLOTS] = [const { AtomicUsize::new(0) }; TRAP_SLOTS];
static TRAP_RELOC: [AtomicUsize; TRAP_SLOTS] = [const { AtomicUsize::new(0) }; TRAP_SLOTS];
static TRAP_COUNT: AtomicUsize = AtomicUsize::new(0);

fn trap_slot(addr: usize) -> usize {
    (addr.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) % TRAP_SLOTS
}

/// The target registered for `addr` (lock-free, no allocation: the SIGTRAP handler's lookup).
fn trap_lookup(addr: usize) -> Option<usize> {
    let mut i = trap_slot(addr);
    for _ in 0..TRAP_SLOTS {
        match TRAP_ADDR[i].load(Acquire) {
            0 => return None,
            a if a == addr => return Some(TRAP_RELOC[i].load(Acquire)),
            _ => i = (i + 1) % TRAP_SLOTS,
        }
    }
    None
}

/// Makes a site known to the SIGTRAP handler: a thread trapping at `addr` goes to `target`
/// while the `int3` is there (registry lock held).
pub(crate) fn register_trap_site(addr: usize, target: usize) -> bool {
    if TRAP_COUNT.load(Acquire) >= MAX_SITES {
        return false;
    }
    // The address's own slot when it has one (a later site at the same address), else the
    // first free or removed slot of its chain.
    let mut i = trap_slot(addr);
    let mut free = None;
    for _ in 0..TRAP_SLOTS {
        match TRAP_ADDR[i].load(Acquire) {
            a if a == addr => {
                TRAP_RELOC[i].store(target, Release);
                return true;
            }
            0 => {
                free = free.or(Some(i));
                break;
            }
            TRAP_GONE => free = free.or(Some(i)),
            _ => {}
        }
        i = (i + 1) % TRAP_SLOTS;
    }
    let Some(i) = free else { return false };
    // The handler reads the address (Acquire) before the target.
    TRAP_RELOC[i].store(target, Release);
    TRAP_ADDR[i].store(addr, Release);
    TRAP_COUNT.fetch_add(1, AcqRel);
    true
}

/// Forgets the site at `addr` (its code was unmapped: `dlnotify`), so that an `int3` met
/// there later is not taken for its patch (registry lock held).
pub(crate) fn unregister_trap_site(addr: usize) {
    let mut i = trap_slot(addr);
    for _ in 0..TRAP_SLOTS {
        match TRAP_ADDR[i].load(Acquire) {
            0 => return,
            a if a == addr => {
                TRAP_ADDR[i].store(TRAP_GONE, Release);
                TRAP_COUNT.fetch_sub(1, AcqRel);
                return;
            }
            _ => i = (i + 1) % TRAP_SLOTS,
        }
    }
}

const FIX_MAX: usize = 16;
static FIX_ACTIVE: AtomicBool = AtomicBool::new(false);
static FIX_ADDR: AtomicUsize = AtomicUsize::new(0);
static FIX_LEN: AtomicUsize = AtomicUsize::new(0);
static FIX_N: AtomicUsize = AtomicUsize::new(0);
static FIX_OFF: [AtomicUsize; FIX_MAX] = [const { AtomicUsize::new(0) }; FIX_MAX];
static FIX_TARGET: [AtomicUsize; FIX_MAX] = [const { AtomicUsize::new(0) }; FIX_MAX];
static ACKS: AtomicUsize = AtomicUsize::new(0);
pub(crate) static FIXUPS: AtomicU64 = AtomicU64::new(0);
pub(crate) static TRAPS: AtomicU64 = AtomicU64::new(0);
pub(crate) static BREAKPOINT_HITS: AtomicU64 = AtomicU64::new(0);

/// The program's `SIGTRAP` disposition, handed the traps that are not ours: the one found at
/// installation, then whatever the program sets through libc's `sigaction`/`signal` (see
/// [`guard_sigtrap`]). A slot of [`ACT_WORD`], or [`NO_ACT`] for `SIG_DFL`.
static OLD_TRAP: AtomicUsize = AtomicUsize::new(NO_ACT);
/// The disposition found when the engine's handler was installed (what the program had
/// before): what the program means when it gives back the engine's own handler, which it
/// may have been handed as the "old" one (see [`record_trap`]). A slot never rewritten.
static ORIG_TRAP: AtomicUsize = AtomicUsize::new(NO_ACT);

/// Copies of `struct sigaction`s (glibc's, in 8-byte words), written by [`act_store`] and read
/// by [`act_load`] under a sequence count per slot: no allocation and no lock, as the guard
/// may run inside a signal handler (LLVM's crash handlers call `sigaction`) that interrupted
/// `malloc`. A writer claims a slot that is neither published nor being written.
const ACT_WORDS: usize = std::mem::size_of::<libc::sigaction>() / 8;
const _: () = assert!(std::mem::size_of::<libc::sigaction>().is_multiple_of(8));
const ACT_SLOTS: usize = 64;
const NO_ACT: usize = usize::MAX;
static ACT_WORD: [[AtomicU64; ACT_WORDS]; ACT_SLOTS] = [const { [const { AtomicU64::new(0) }; ACT_WORDS] }; ACT_SLOTS];
/// Odd while the slot is being written.
static ACT_SEQ: [AtomicU64; ACT_SLOTS] = [const { AtomicU64::new(0) }; ACT_SLOTS];
static ACT_NEXT: AtomicUsize = AtomicUsize::new(0);

/// Stores a copy of `a` in a free slot and returns it (to be published in [`OLD_TRAP`]).
fn act_store(a: &libc::sigaction) -> usize {
    loop {
        let i = ACT_NEXT.fetch_add(1, Relaxed) % ACT_SLOTS;
        if i == OLD_TRAP.load(Acquire) || i == ORIG_TRAP.load(Acquire) {
            continue;
        }
        let seq = ACT_SEQ[i].load(Acquire);
        if seq & 1 != 0 || ACT_SEQ[i].compare_exchange(seq, seq + 1, AcqRel, Relaxed).is_err() {
            continue; // another writer has it
        }
        let src = a as *const libc::sigaction as *const u64;
        for (k, w) in ACT_WORD[i].iter().enumerate() {
            // SAFETY: `a` is a struct sigaction of ACT_WORDS words.
            w.store(unsafe { src.add(k).read_unaligned() }, Relaxed);
        }
        ACT_SEQ[i].store(seq + 2, Release);
        return i;
    }
}

/// The disposition published in `which` (`SIG_DFL` when none). A slot being rewritten is
/// read again from the then published one (a writer never takes a published slot).
fn act_load(which: &AtomicUsize) -> libc::sigaction {
    loop {
        let i = which.load(Acquire);
        // SAFETY: all-zero is a valid struct sigaction (SIG_DFL).
        let mut out: libc::sigaction = unsafe { std::mem::zeroed() };
        if i == NO_ACT {
            return out;
        }
        let s1 = ACT_SEQ[i].load(Acquire);
        if s1 & 1 == 0 {
            let dst = &mut out as *mut libc::sigaction as *mut u64;
            for (k, w) in ACT_WORD[i].iter().enumerate() {
                // SAFETY: `out` is a struct sigaction of ACT_WORDS words.
                unsafe { dst.add(k).write_unaligned(w.load(Relaxed)) };
            }
            std::sync::atomic::fence(Acquire);
            if ACT_SEQ[i].load(Relaxed) == s1 {
                return out;
            }
        }
        std::hint::spin_loop();
    }
}

/// Times the engine's `SIGTRAP` disposition was found replaced (through a path the guard
/// does not see, or before it existed) and taken back ([`own_sigtrap`]).
pub(crate) static TRAP_RETAKEN: AtomicU64 = AtomicU64::new(0);

/// The kernel's `struct sigaction` on x86-64 (`rt_sigaction`'s argument): handler, flags,
/// restorer, mask.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct KSigaction {
    handler: usize,
    flags: u64,
    restorer: usize,
    mask: u64,
}

/// The engine's disposition as the kernel holds it (with libc's restorer), read back once
/// installed: what [`own_sigtrap`] puts back.
static OURS_K: std::sync::OnceLock<KSigaction> = std::sync::OnceLock::new();

/// Raw `rt_sigaction(SIGTRAP, new, &old)` (not libc's `sigaction`, which carries the guard
/// probe); `None` when the call fails.
fn k_sigtrap(new: Option<&KSigaction>) -> Option<KSigaction> {
    let mut old = KSigaction::default();
    let newp = new.map_or(std::ptr::null(), |n| n as *const KSigaction);
    // SAFETY: rt_sigaction with pointers to local/borrowed kernel-layout structs and the
    // kernel's sigset size (8).
    let rc = unsafe { libc::syscall(libc::SYS_rt_sigaction, libc::SIGTRAP, newp, &mut old as *mut KSigaction, 8) };
    (rc == 0).then_some(old)
}

/// Makes the engine's `SIGTRAP` and fixup handlers return through `restorer` (system call
/// dispatch's page: its `rt_sigreturn` is let through) instead of libc's `__restore_rt`,
/// whose `rt_sigreturn` traps while dispatch is on (a `SIGSYS` frame pushed on the stack the
/// handler ran on, an alternate signal stack too) and is itself rewritten while dispatch is
/// on (`crate::rewrite`): a trap at its `int3` while it is being rewritten would otherwise
/// return through that same `int3`. Only while the handlers installed are the engine's.
pub(crate) fn return_through(restorer: usize) {
    const SA_RESTORER: u64 = 0x0400_0000;
    let handlers =
        [(libc::SIGTRAP, trap_handler as *const () as usize), (fixup_signal(), fixup_handler as *const () as usize)];
    for (sig, ours) in handlers {
        let mut cur = KSigaction::default();
        // SAFETY: rt_sigaction queries into a local kernel-layout struct, then sets a copy
        // of it with another restorer (the kernel's sigset size, 8).
        unsafe {
            if libc::syscall(
                libc::SYS_rt_sigaction,
                sig,
                std::ptr::null::<KSigaction>(),
                &mut cur as *mut KSigaction,
                8,
            ) != 0
                || cur.handler != ours
            {
                continue;
            }
            let new = KSigaction { flags: cur.flags | SA_RESTORER, restorer, ..cur };
            libc::syscall(
                libc::SYS_rt_sigaction,
                sig,
                &new as *const KSigaction,
                std::ptr::null_mut::<KSigaction>(),
                8,
            );
        }
    }
}

/// The `struct sigaction` (glibc's layout) of a kernel one.
fn from_kernel(k: &KSigaction) -> libc::sigaction {
    // SAFETY: all-zero is a valid struct sigaction (SIG_DFL, empty mask, no restorer).
    let mut sa: libc::sigaction = unsafe { std::mem::zeroed() };
    sa.sa_sigaction = k.handler;
    sa.sa_flags = k.flags as i32;
    // SAFETY: glibc's sigset_t starts with the kernel's 64-bit mask word.
    unsafe { (&mut sa.sa_mask as *mut libc::sigset_t as *mut u64).write(k.mask) };
    // SAFETY: a restorer the kernel held is libc's `__restore_rt` (or null: None).
    sa.sa_restorer = unsafe { std::mem::transmute::<usize, Option<extern "C" fn()>>(k.restorer) };
    sa
}

/// Records `act` as the program's `SIGTRAP` disposition (the one foreign traps go to). The
/// engine's own handler stands for the disposition found before it: a program that read the
/// current disposition while ours was installed (before the guard probe existed, or through
/// a path it does not see) and restores it later (LLVM's crash handlers do) means that one.
fn record_trap(act: &libc::sigaction) {
    let new = if act.sa_sigaction == trap_handler as *const () as usize { act_load(&ORIG_TRAP) } else { *act };
    OLD_TRAP.store(act_store(&new), Release);
}

/// Makes sure the kernel's `SIGTRAP` disposition is the engine's handler, taking it back
/// (and recording the one found as the program's) when something replaced it: the program
/// called `sigaction` before the guard probe existed (LLVM's crash-recovery handlers, set
/// up by libclang, come after the engine's handler when the engine started early for the
/// loader notification, `dlnotify`), or made a raw `rt_sigaction` system call. Called before
/// every `int3` of the engine is written and once the guard probe is in place: an `int3` of
/// ours then always reaches our handler. One system call (two when taking it back), never on
/// a hit.
pub(crate) fn own_sigtrap() {
    let Some(ours) = OURS_K.get() else { return };
    let Some(cur) = k_sigtrap(None) else { return };
    if cur.handler == ours.handler {
        return;
    }
    if let Some(prev) = k_sigtrap(Some(ours))
        && prev.handler != ours.handler
    {
        record_trap(&from_kernel(&prev));
        TRAP_RETAKEN.fetch_add(1, Relaxed);
    }
}

/// The guard handler of a guard probe's address (`sigaction`, `pthread_sigmask`), for the
/// calls the engine's dispatch would not run probes for (see [`guard_at`]).
static GUARD_SITES: [AtomicUsize; 2] = [const { AtomicUsize::new(0) }; 2];

/// The guard handler to run at `addr` when the dispatch skips the site's probes (a call
/// made inside a probe handler or a signal handler interrupting one, a thread without state):
/// the guard runs on every call, so that no `sigaction(SIGTRAP)` replaces the engine's
/// handler and no mask blocks `SIGTRAP`.
pub(crate) fn guard_at(addr: usize) -> Option<crate::Handler> {
    if GUARD_SITES[0].load(Relaxed) == addr {
        Some(sigaction_guard)
    } else if GUARD_SITES[1].load(Relaxed) == addr {
        Some(sigmask_guard)
    } else {
        None
    }
}

fn rip_of(ctx: *mut libc::c_void) -> *mut i64 {
    let uc = ctx as *mut libc::ucontext_t;
    // SAFETY: ctx is the ucontext the kernel passed to an SA_SIGINFO handler.
    unsafe { &mut (*uc).uc_mcontext.gregs[libc::REG_RIP as usize] as *mut i64 }
}

/// The `SIGTRAP` handler: an `int3` of ours (a breakpoint site, or the first byte of a jump
/// being written) sends the thread on; anything else goes to the program's disposition.
///
/// Ours: the trap comes from an `int3` (`si_code` `SI_KERNEL`, not a `kill`) and the byte
/// before the saved `rip` is a registered site (a lock-free hash lookup: no lock, no
/// allocation). The saved `rip` becomes the site's target (its stub, which runs the
/// handlers after the signal returned: a breakpoint site's, or that of a jump being written,
/// where the jump will lead), or the site's own address when its `int3` is gone by now (the
/// jump complete, or the original bytes back).
extern "C" fn trap_handler(sig: i32, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: info is the siginfo the kernel passed to an SA_SIGINFO handler.
    let code = unsafe { (*info).si_code };
    if code == libc::SI_KERNEL {
        let rip = rip_of(ctx);
        // SAFETY: rip points into the live ucontext.
        let after = unsafe { *rip } as usize;
        let at = after.wrapping_sub(1);
        if let Some(to) = trap_lookup(at) {
            // A breakpoint site's target (its stub) is registered with the low bit set.
            let counter = if to & 1 != 0 { &BREAKPOINT_HITS } else { &TRAPS };
            counter.fetch_add(1, Relaxed);
            // SAFETY: `at` is a patched site address, mapped and readable.
            let byte = unsafe { std::ptr::read_volatile(at as *const u8) };
            let target = if byte == 0xCC { to & !1 } else { at };
            // SAFETY: writing the saved rip of this thread's signal frame.
            unsafe { *rip = target as i64 };
            return;
        }
    }
    chain_trap(sig, info, ctx, code);
}

/// Hands a `SIGTRAP` that is not ours to the program's disposition, as the kernel would
/// have: its handler runs with its `sa_mask` blocked (but never `SIGTRAP`),
/// `SA_RESETHAND` resets it first; `SIG_IGN` ignores a sent signal; the default action (or
/// `SIG_IGN` for a real trap, which the kernel does not let be ignored) kills the process.
fn chain_trap(sig: i32, info: *mut libc::siginfo_t, ctx: *mut libc::c_void, code: i32) {
    let old = act_load(&OLD_TRAP);
    let mut handler = old.sa_sigaction;
    if handler == trap_handler as *const () as usize {
        handler = libc::SIG_DFL; // never ourselves (see `record_trap`)
    }
    if handler == libc::SIG_IGN && code <= 0 {
        return; // sent with kill/tgkill/sigqueue and ignored
    }
    if handler == libc::SIG_DFL || handler == libc::SIG_IGN {
        // SAFETY: raw rt_sigaction (not libc's, which the guard probe intercepts) to the
        // default action, then the signal again: async-signal-safe; SA_NODEFER delivers it
        // at once.
        unsafe {
            let k = [0u64; 4];
            libc::syscall(libc::SYS_rt_sigaction, libc::SIGTRAP, k.as_ptr(), std::ptr::null_mut::<u64>(), 8);
            libc::raise(libc::SIGTRAP);
        }
        return;
    }
    if old.sa_flags & libc::SA_RESETHAND != 0 {
        OLD_TRAP.store(NO_ACT, Release);
    }
    // SAFETY: an all-zero sigset_t is a valid (empty) set.
    let mut prev: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: sigset operations on local sets; a raw rt_sigprocmask (async-signal-safe, and
    // not through libc's pthread_sigmask, which carries the engine's own guard probe).
    unsafe {
        // Never SIGTRAP itself (see `sigmask_guard`): the kernel would block it without
        // SA_NODEFER, and a breakpoint probe hit inside the handler would then end the process.
        let mut block = old.sa_mask;
        libc::sigdelset(&mut block, libc::SIGTRAP);
        libc::syscall(
            libc::SYS_rt_sigprocmask,
            libc::SIG_BLOCK,
            &block as *const libc::sigset_t,
            &mut prev as *mut libc::sigset_t,
            8,
        );
    }
    if old.sa_flags & libc::SA_SIGINFO != 0 {
        // SAFETY: the program installed it as an SA_SIGINFO handler.
        let f: extern "C" fn(i32, *mut libc::siginfo_t, *mut libc::c_void) = unsafe { std::mem::transmute(handler) };
        f(sig, info, ctx);
    } else {
        // SAFETY: the program installed it as a plain handler.
        let f: extern "C" fn(i32) = unsafe { std::mem::transmute(handler) };
        f(sig);
    }
    // SAFETY: restores this thread's mask as it was in our handler.
    unsafe {
        libc::syscall(
            libc::SYS_rt_sigprocmask,
            libc::SIG_SETMASK,
            &prev as *const libc::sigset_t,
            std::ptr::null_mut::<libc::sigset_t>(),
            8,
        )
    };
}

/// Entry handler of the guard probe on libc's `sigaction` (which `signal`, `sigset` and
/// `sysv_signal` call too): a `SIGTRAP` disposition the program sets is recorded as the one
/// [`chain_trap`] hands foreign traps to, instead of replacing the engine's handler; a query
/// returns the recorded one. Other signals go on to libc.
unsafe extern "C" fn sigaction_guard(_d: *mut libc::c_void, regs: *mut crate::PtRegs) -> u32 {
    // SAFETY: the engine passes the live pt_regs of the call.
    let regs = unsafe { &mut *regs };
    if regs.di as i32 != libc::SIGTRAP {
        // Another signal's handler blocks its sa_mask while it runs: never SIGTRAP (see
        // `sigmask_guard`).
        strip_sigtrap(regs, 19, 1);
        return crate::HOOK_CONTINUE;
    }
    let (act, old) = (regs.si as *const libc::sigaction, regs.dx as *mut libc::sigaction);
    if !old.is_null() {
        // SAFETY: the program's buffer for a struct sigaction (glibc's layout is the libc
        // crate's).
        unsafe { old.write(act_load(&OLD_TRAP)) };
    }
    if !act.is_null() {
        // SAFETY: the program's struct sigaction, which libc would have read.
        record_trap(&unsafe { act.read() });
    }
    regs.ax = 0;
    crate::HOOK_SKIP
}

thread_local! {
    /// A copy of the signal set (or `struct sigaction`) a program passed, without `SIGTRAP`
    /// (glibc's sigset_t is 128 bytes; its struct sigaction 152).
    static MASK_COPY: std::cell::UnsafeCell<[u64; 20]> = const { std::cell::UnsafeCell::new([0; 20]) };
}

/// Passes libc a copy of the set at `regs.si` (`words` words, the set at word `at`) without
/// `SIGTRAP`, when it has it.
fn strip_sigtrap(regs: &mut crate::PtRegs, words: usize, at: usize) {
    let bit = 1u64 << (libc::SIGTRAP - 1);
    let src = regs.si as *const u64;
    // SAFETY: the program passes this pointer to libc, which reads these bytes too.
    if src.is_null() || unsafe { src.add(at).read_unaligned() } & bit == 0 {
        return;
    }
    MASK_COPY.with(|c| {
        let dst = c.get() as *mut u64;
        // SAFETY: copying the program's set/struct (readable, see above) into this thread's
        // buffer of 20 words, which libc reads before this thread can come here again.
        unsafe {
            std::ptr::copy_nonoverlapping(src as *const u8, dst as *mut u8, words * 8);
            *dst.add(at) &= !bit;
        }
        regs.si = dst as u64;
    });
}

/// Entry handler on libc's `pthread_sigmask` (which `sigprocmask` calls): `SIGTRAP` is never
/// blocked. A blocked `SIGTRAP` does not hold back an `int3`'s trap: the kernel kills the
/// process instead (it would for the program's own `int3` too), so a thread that blocks every
/// signal would die at its next breakpoint probe. Only a `SIGTRAP` sent with `kill` is delayed
/// by blocking it, which is all the program loses.
unsafe extern "C" fn sigmask_guard(_d: *mut libc::c_void, regs: *mut crate::PtRegs) -> u32 {
    // SAFETY: the engine passes the live pt_regs of the call.
    let regs = unsafe { &mut *regs };
    if regs.di as i32 != libc::SIG_UNBLOCK {
        strip_sigtrap(regs, 16, 0);
    }
    crate::HOOK_CONTINUE
}

static GUARD: AtomicUsize = AtomicUsize::new(0);

/// Puts the guard probes on libc's `sigaction` and `pthread_sigmask` (once; best effort: a
/// process without a dynamic libc has no such function to call, and raw `rt_sigaction` /
/// `rt_sigprocmask` system calls are not seen). Called outside the registry lock.
pub(crate) fn guard_sigtrap() {
    if GUARD.compare_exchange(0, 1, SeqCst, SeqCst).is_err() {
        return;
    }
    let mut ok = true;
    for (i, (func, h)) in
        [("sigaction", sigaction_guard as crate::Handler), ("pthread_sigmask", sigmask_guard)].into_iter().enumerate()
    {
        let Ok(r) = crate::symbols::resolve(&format!("libc.so.6:{func}")) else {
            ok = false;
            continue;
        };
        let ext = r.size.filter(|s| *s > 0).map(|len| crate::FuncExtent { start: r.func_start, len });
        let attached = crate::attach_with(r.addr, crate::ProbeKind::Entry, h, std::ptr::null_mut(), ext).is_ok();
        if attached {
            GUARD_SITES[i].store(r.addr, SeqCst);
        }
        ok &= attached;
    }
    if ok {
        GUARD.store(2, SeqCst);
    }
    // A `sigaction` made before the guard was in place (since the handler's installation)
    // replaced ours in the kernel: take it back now that later ones are recorded.
    own_sigtrap();
}

extern "C" fn fixup_handler(_sig: i32, _info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // The windows of libc's system call sites being rewritten (`crate::rewrite`), all at once.
    {
        let rip = rip_of(ctx);
        // SAFETY: rip points into the live ucontext.
        if let Some(to) = crate::rewrite::fixup(unsafe { *rip } as usize) {
            // SAFETY: moving this thread to the equivalent relocated instruction.
            unsafe { *rip = to as i64 };
            FIXUPS.fetch_add(1, Relaxed);
        }
    }
    if FIX_ACTIVE.load(Acquire) {
        let rip = rip_of(ctx);
        // SAFETY: rip points into the live ucontext.
        let pc = unsafe { *rip } as usize;
        let addr = FIX_ADDR.load(Acquire);
        let len = FIX_LEN.load(Acquire);
        if pc > addr && pc < addr + len {
            let n = FIX_N.load(Acquire).min(FIX_MAX);
            for i in 0..n {
                if FIX_OFF[i].load(Acquire) == pc - addr {
                    // SAFETY: moving this thread to the equivalent relocated instruction.
                    unsafe { *rip = FIX_TARGET[i].load(Acquire) as i64 };
                    FIXUPS.fetch_add(1, Relaxed);
                    break;
                }
            }
        }
    }
    ACKS.fetch_add(1, SeqCst);
}

pub(crate) fn install_handlers() -> Result<(), String> {
    // SAFETY: installing process-wide signal handlers with fully initialised
    // sigaction structs; OLD_TRAP is written before our handler is active.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = trap_handler as *const () as usize;
        // SA_ONSTACK: a program handler chained from here may rely on its alternate stack.
        sa.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART | libc::SA_NODEFER | libc::SA_ONSTACK;
        libc::sigemptyset(&mut sa.sa_mask);
        let mut old: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(libc::SIGTRAP, &sa, &mut old) != 0 {
            return Err(format!("sigaction(SIGTRAP): {}", std::io::Error::last_os_error()));
        }
        ORIG_TRAP.store(act_store(&old), SeqCst);
        OLD_TRAP.store(act_store(&old), SeqCst);
        if let Some(k) = k_sigtrap(None) {
            let _ = OURS_K.set(k);
        }
        let mut sb: libc::sigaction = std::mem::zeroed();
        sb.sa_sigaction = fixup_handler as *const () as usize;
        sb.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
        libc::sigemptyset(&mut sb.sa_mask);
        let mut prev: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(fixup_signal(), &sb, &mut prev) != 0 {
            return Err(format!("sigaction(fixup signal): {}", std::io::Error::last_os_error()));
        }
        *OLD_FIXUP.lock().unwrap_or_else(|e| e.into_inner()) = Some(prev);
    }
    Ok(())
}

/// The fixup signal's disposition before the engine installed its handler.
static OLD_FIXUP: std::sync::Mutex<Option<libc::sigaction>> = std::sync::Mutex::new(None);
/// Set by [`release_signals`]: the engine's handlers are not installed (the next
/// [`reclaim_signals`] installs them again).
static RELEASED: AtomicBool = AtomicBool::new(false);

/// Sets `sig`'s disposition to `act`, through `SIG_IGN` first: a signal of ours still pending
/// somewhere (a thread that had it blocked) is discarded rather than delivered to a
/// disposition that is not ours any more (the default action of a real-time signal ends the
/// process).
pub(crate) fn set_through_ignore(sig: i32, act: &libc::sigaction) {
    // SAFETY: sigaction with fully initialised structs (all-zero plus SIG_IGN, then the
    // caller's copy of a disposition the kernel gave us).
    unsafe {
        let mut ign: libc::sigaction = std::mem::zeroed();
        ign.sa_sigaction = libc::SIG_IGN;
        libc::sigaction(sig, &ign, std::ptr::null_mut());
        libc::sigaction(sig, act, std::ptr::null_mut());
    }
}

/// Gives back the signals the engine took (called once every probe is gone, see
/// `crate::release`): `SIGTRAP` goes to the disposition the program set last (or the one
/// found before the engine), the fixup signal to the one found before the engine; the guard
/// probes are forgotten (put back by the next attach).
pub(crate) fn release_signals() {
    if !OURS_INSTALLED.load(SeqCst) {
        return;
    }
    let trap = act_load(&OLD_TRAP);
    set_through_ignore(libc::SIGTRAP, &trap);
    if let Some(old) = *OLD_FIXUP.lock().unwrap_or_else(|e| e.into_inner()) {
        set_through_ignore(fixup_signal(), &old);
    }
    for g in &GUARD_SITES {
        g.store(0, SeqCst);
    }
    GUARD.store(0, SeqCst);
    OURS_INSTALLED.store(false, SeqCst);
    RELEASED.store(true, SeqCst);
}

/// Whether the engine's handlers are installed.
static OURS_INSTALLED: AtomicBool = AtomicBool::new(false);

/// Marks the handlers installed (by the first `install_handlers`).
pub(crate) fn handlers_installed() {
    OURS_INSTALLED.store(true, SeqCst);
}

/// Installs the engine's handlers again after [`release_signals`] (a later attach).
pub(crate) fn reclaim_signals() -> Result<(), String> {
    if RELEASED.swap(false, SeqCst) {
        install_handlers()?;
        OURS_INSTALLED.store(true, SeqCst);
    }
    Ok(())
}

/// Publishes the fixup map for the displaced range (offset -> relocated address).
pub(crate) fn set_fixup(addr: usize, len: usize, map: &[(usize, usize)]) {
    let n = map.len().min(FIX_MAX);
    for (i, (off, t)) in map.iter().take(n).enumerate() {
        FIX_OFF[i].store(*off, Release);
        FIX_TARGET[i].store(*t, Release);
    }
    FIX_N.store(n, Release);
    FIX_LEN.store(len, Release);
    FIX_ADDR.store(addr, Release);
    FIX_ACTIVE.store(true, SeqCst);
}

pub(crate) fn clear_fixup() {
    FIX_ACTIVE.store(false, SeqCst);
}

/// Whether thread `tid` of this process is blocked in the kernel with its user `PC`
/// outside the displaced range being fixed up (none: any `PC`): it then needs no signal
/// (see the module docs). `/proc/self/task/TID/syscall` reads `NR a1..a6 SP PC` for a
/// thread in a system call, `-1 SP PC` for one blocked otherwise (a fault, a stop),
/// `running` for one on a CPU.
fn blocked_elsewhere(tid: i32) -> bool {
    let Ok(text) = std::fs::read_to_string(format!("/proc/self/task/{tid}/syscall")) else {
        return false;
    };
    let Some(pc) = text
        .split_whitespace()
        .last()
        .and_then(|w| w.strip_prefix("0x"))
        .and_then(|h| usize::from_str_radix(h, 16).ok())
    else {
        return false; // "running", or a format we do not know
    };
    if FIX_ACTIVE.load(SeqCst) {
        let addr = FIX_ADDR.load(SeqCst);
        let len = FIX_LEN.load(SeqCst);
        if pc > addr && pc < addr + len {
            return false;
        }
    }
    crate::rewrite::fixup(pc).is_none()
}

/// Runs the fixup handler on every other thread that may need it (not threads blocked in
/// the kernel elsewhere, see the module docs) and waits (≤ 1 s) for them.
pub(crate) fn broadcast() {
    // SAFETY: plain syscalls without memory arguments.
    let (pid, me) = unsafe { (libc::getpid(), libc::syscall(libc::SYS_gettid) as i32) };
    ACKS.store(0, SeqCst);
    let mut sent = 0usize;
    if let Ok(dir) = std::fs::read_dir("/proc/self/task") {
        for e in dir.flatten() {
            let Some(tid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
                continue;
            };
            if tid == me || blocked_elsewhere(tid) {
                continue;
            }
            // SAFETY: tgkill to a thread of our own process with our handler installed.
            if unsafe { libc::syscall(libc::SYS_tgkill, pid, tid, fixup_signal()) } == 0 {
                sent += 1;
            }
        }
    }
    let deadline = Instant::now() + Duration::from_secs(1);
    while ACKS.load(SeqCst) < sent && Instant::now() < deadline {
        std::thread::sleep(Duration::from_micros(20));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAPS: &str = "\
555555554000-555555556000 r--p 00000000 08:01 1 /nonexistent/exe
555555556000-555555558000 r-xp 00002000 08:01 1 /nonexistent/exe
555555558000-55555555a000 rw-p 00004000 08:01 1 /nonexistent/exe
55555555a000-55555557b000 rw-p 00000000 00:00 0 [heap]
7ffff7d00000-7ffff7e00000 r-xp 00000000 08:01 2 /lib/libc.so.6
7ffff7e00000-7ffff7e10000 rw-p 00000000 00:00 0
7ffff7f00000-7ffff7f10000 r-xp 00000000 08:01 3 /lib/ld.so
7ffffffde000-7ffffffff000 rw-p 00000000 00:00 0 [stack]
";

    #[test]
    fn a_region_goes_into_the_free_gap_nearest_the_code_never_where_the_heap_or_stack_grow() {
        // Near libc: below it, at the top of the gap under it.
        let libc = 0x7fff_f7d0_1000;
        let (at, len) = free_gap(MAPS, libc).unwrap();
        assert_eq!((at, len), (0x7fff_f7d0_0000 - CHUNK, CHUNK));
        // Between libc's data and ld.so: that gap, smaller than a region, is all taken.
        let ld = 0x7fff_f7f0_0100;
        let (at, len) = free_gap(MAPS, ld).unwrap();
        assert_eq!((at, len), (0x7fff_f7e1_0000, 0xf_0000));
        // The executable: below it (the gap above [heap] is where the heap grows).
        let exe = 0x5555_5555_6100;
        let (at, _) = free_gap(MAPS, exe).unwrap();
        assert!(at + CHUNK <= 0x5555_5555_4000, "{at:#x}");
        // Every page in reach.
        assert!(near(at, exe) && near(at + CHUNK - PAGE, exe));
        // Nothing is placed in the gap under [stack].
        let top = 0x7fff_ffff_0000;
        if let Some((at, len)) = free_gap(MAPS, top) {
            assert!(at + len <= 0x7fff_f7f0_0000 || at >= 0x7fff_ffff_f000, "{at:#x}");
        }
    }

    #[test]
    fn pages_come_from_one_region_without_a_system_call_each() {
        let code = alloc_near as *const () as usize;
        let a = alloc_near(code).unwrap();
        let b = alloc_near(code).unwrap();
        assert!(near(a, code) && near(b, code));
        assert_eq!(b.abs_diff(a), PAGE, "consecutive pages of one region");
        free_near(b);
        assert_eq!(alloc_near(code), Some(b), "a page given back is handed out again");
    }
}
