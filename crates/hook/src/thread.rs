//! Per-thread state (recursion guard + uretprobe shadow stack) and the
//! RCU-like read side used by the hit path.
//!
//! The hit path may run inside `malloc`, inside the dynamic loader, or in a
//! thread whose Rust TLS is not set up yet, so it uses neither the allocator
//! nor `thread_local!` (which, in a `cdylib`, goes through `__tls_get_addr`
//! and may call `malloc` on first use). Instead a thread is identified by
//! `fs:[0]` (the glibc TCB self pointer) and its state is found in a fixed,
//! lock-free open-addressing table living in `.bss`. The state itself is
//! mmapped with a raw `syscall` instruction (once per thread, on that
//! thread's first probe hit) and unmapped by a pthread key destructor when
//! the thread exits.

use std::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, AtomicU64, AtomicUsize, Ordering::*};

use crate::PtRegs;

/// Entries in each thread's uretprobe shadow stack.
pub const SHADOW_CAPACITY: usize = 1024;

const TABLE_SIZE: usize = 4096;
const EMPTY: usize = 0;
const TOMBSTONE: usize = 1;

#[derive(Clone, Copy)]
#[repr(C)]
pub(crate) struct ShadowEntry {
    pub ret: u64,
    pub site: usize,
    pub func_ip: u64,
    /// rsp at the probed function's entry (points at the return address).
    pub sp: u64,
}

#[repr(C)]
pub(crate) struct ThreadState {
    pub key: usize,
    pub in_handler: u32,
    pub registered: u32,
    /// Index of this thread's slot in the table (holds its RCU counter).
    pub slot: usize,
    pub top: usize,
    pub entries: [ShadowEntry; SHADOW_CAPACITY],
}

struct Slot {
    key: AtomicUsize,
    state: AtomicPtr<ThreadState>,
    /// RCU reader generation of the thread owning the slot: odd while it is
    /// inside a read-side section. Lives in the static table (not in the
    /// unmappable state) so `synchronize` can scan it without racing exits.
    rcu: AtomicUsize,
}

#[allow(clippy::declare_interior_mutable_const)]
const SLOT_INIT: Slot =
    Slot { key: AtomicUsize::new(EMPTY), state: AtomicPtr::new(std::ptr::null_mut()), rcu: AtomicUsize::new(0) };
static TABLE: [Slot; TABLE_SIZE] = [SLOT_INIT; TABLE_SIZE];

pub(crate) static STATES_CREATED: AtomicU64 = AtomicU64::new(0);
pub(crate) static STATES_FREED: AtomicU64 = AtomicU64::new(0);
/// pthread key whose destructor frees a thread's state (set once by `init`).
pub(crate) static PTHREAD_KEY: AtomicUsize = AtomicUsize::new(usize::MAX);

/// The calling thread's TCB address, used as its identity.
#[inline(always)]
fn thread_key() -> usize {
    let k: usize;
    // SAFETY: on x86-64 Linux (glibc and musl) fs:[0] holds the thread
    // control block's self pointer; reading it has no side effect.
    unsafe { core::arch::asm!("mov {}, qword ptr fs:[0]", out(reg) k, options(nostack, readonly, preserves_flags)) };
    k
}

// This thread's slot in `TABLE` (a `*const Slot`, 0 until its state is created): a hint the
// stubs read with one load from the thread pointer (`thread_slot_tls_offset`) before hashing
// `fs:[0]`; they still compare the slot's key with `fs:[0]`, so a stale word (the slot
// given up, reused by another thread, or reset in a fork's child) only sends them to the
// hash. Zero-filled static TLS (`.tbss`, hidden), reached with the initial-exec model as the
// maps crate's thread words are (a preloaded object gets static TLS; one loaded later gets
// it from glibc's reserved surplus): no initialiser, no destructor, async-signal-safe.
std::arch::global_asm!(
    ".pushsection .tbss,\"awT\",@nobits",
    ".p2align 3",
    ".globl userbpf_hook_thread_slot",
    ".hidden userbpf_hook_thread_slot",
    ".type userbpf_hook_thread_slot,@object",
    ".size userbpf_hook_thread_slot, 8",
    "userbpf_hook_thread_slot:",
    ".zero 8",
    ".popsection",
);

/// This thread's slot hint (see above): valid while the thread runs, only used on it.
#[inline(always)]
fn slot_hint() -> *mut usize {
    let p: usize;
    // SAFETY: reads the word's offset from the thread pointer (a GOT entry the dynamic linker
    // filled at load) and adds the thread pointer (`fs:[0]`, the TCB's self pointer on x86-64
    // glibc and musl): the address of this thread's copy.
    unsafe {
        std::arch::asm!(
            "mov {p}, qword ptr [rip + userbpf_hook_thread_slot@GOTTPOFF]",
            "add {p}, qword ptr fs:[0]",
            p = out(reg) p,
            options(nostack, readonly, pure),
        )
    };
    p as *mut usize
}

/// The offset of this thread's slot hint from the thread pointer (the same in every thread).
pub(crate) fn slot_hint_tls_offset() -> i32 {
    let off = slot_hint() as usize as i64 - thread_key() as i64;
    // Static TLS sits just below the thread pointer (variant II): a few KiB at most.
    i32::try_from(off).expect("static TLS offset within 2 GiB of the thread pointer")
}

const HASH_MUL: usize = 0x9E37_79B9_7F4A_7C15;
const HASH_SHIFT: u32 = 20;

#[inline(always)]
fn hash(k: usize) -> usize {
    ((k >> 6).wrapping_mul(HASH_MUL) >> HASH_SHIFT) & (TABLE_SIZE - 1)
}

/// Where generated code finds a thread's state (the return-only fast path of the entry stub,
/// `stubs::ret_only_fast_path`): the table, its slots' size and fields, and `hash`. That code
/// looks at the first slot of the hash only and leaves everything else to `current`.
pub(crate) struct TableLayout {
    pub table: u64,
    pub slot_size: i32,
    pub key: i32,
    pub state: i32,
    /// The slot's RCU generation (see `read_lock`).
    pub rcu: i32,
    /// Address of the flag saying readers may announce a section with a plain store.
    pub asym: u64,
    pub mask: i32,
    pub mul: u64,
    pub shift: u32,
}

pub(crate) fn table_layout() -> TableLayout {
    TableLayout {
        table: TABLE.as_ptr() as u64,
        slot_size: std::mem::size_of::<Slot>() as i32,
        key: std::mem::offset_of!(Slot, key) as i32,
        state: std::mem::offset_of!(Slot, state) as i32,
        rcu: std::mem::offset_of!(Slot, rcu) as i32,
        asym: &ASYM as *const AtomicBool as u64,
        mask: (TABLE_SIZE - 1) as i32,
        mul: HASH_MUL as u64,
        shift: HASH_SHIFT,
    }
}

pub(crate) fn raw_mmap(len: usize) -> *mut u8 {
    let prot = (libc::PROT_READ | libc::PROT_WRITE) as u64;
    let flags = (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS) as u64;
    // With system call dispatch on (`sud`), a `syscall` outside its page would trap.
    if let Some(r) = crate::sud::raw_call(libc::SYS_mmap as u64, [0, len as u64, prot, flags, u64::MAX, 0]) {
        return if r < 0 && r > -4096 { std::ptr::null_mut() } else { r as *mut u8 };
    }
    let ret: isize;
    // SAFETY: a raw mmap(NULL, len, RW, PRIVATE|ANON, -1, 0) syscall; it
    // touches no user memory and clobbers only rcx/r11 (declared).
    unsafe {
        core::arch::asm!("syscall",
            inlateout("rax") libc::SYS_mmap as isize => ret,
            in("rdi") 0usize, in("rsi") len,
            in("rdx") (libc::PROT_READ | libc::PROT_WRITE) as usize,
            in("r10") (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS) as usize,
            in("r8") usize::MAX, in("r9") 0usize,
            lateout("rcx") _, lateout("r11") _, options(nostack));
    }
    if ret < 0 && ret > -4096 { std::ptr::null_mut() } else { ret as *mut u8 }
}

pub(crate) fn raw_munmap(p: *mut u8, len: usize) {
    if crate::sud::raw_call(libc::SYS_munmap as u64, [p as u64, len as u64, 0, 0, 0, 0]).is_some() {
        return;
    }
    let _ret: isize;
    // SAFETY: raw munmap of a region this module mapped and no longer uses.
    unsafe {
        core::arch::asm!("syscall",
            inlateout("rax") libc::SYS_munmap as isize => _ret,
            in("rdi") p as usize, in("rsi") len,
            lateout("rcx") _, lateout("r11") _, options(nostack));
    }
}

/// Where a thread's state starts in its mapping: not at the page's start, where every
/// page-aligned object of the target competes for one level-1 data cache set (the set is
/// chosen by the address bits within the page); the stubs read `in_handler` on every hit
/// (see `userbpf_runtime::context::SLOTS_OFFSET` for the measurement).
const STATE_COLOUR: usize = 0xa40;
const STATE_BYTES: usize = (STATE_COLOUR + std::mem::size_of::<ThreadState>() + 4095) & !4095;

/// Maps a zeroed thread state (at [`STATE_COLOUR`] in a fresh mapping), or null.
fn map_state() -> *mut ThreadState {
    let base = raw_mmap(STATE_BYTES);
    if base.is_null() {
        return std::ptr::null_mut();
    }
    // SAFETY: the mapping holds STATE_COLOUR bytes then a ThreadState (STATE_BYTES).
    unsafe { base.add(STATE_COLOUR) as *mut ThreadState }
}

/// Unmaps a state [`map_state`] made.
fn unmap_state(st: *mut ThreadState) {
    raw_munmap((st as usize - STATE_COLOUR) as *mut u8, STATE_BYTES);
}

/// The calling thread's state, created on first use. Null when the table is
/// full or mmap fails (the hit is then skipped and counted as missed).
#[inline]
pub(crate) fn current() -> *mut ThreadState {
    let key = thread_key();
    let mut i = hash(key);
    for _ in 0..TABLE_SIZE {
        let k = TABLE[i].key.load(Acquire);
        if k == key {
            return TABLE[i].state.load(Acquire);
        }
        if k == EMPTY {
            break;
        }
        i = (i + 1) & (TABLE_SIZE - 1);
    }
    create(key)
}

#[cold]
fn create(key: usize) -> *mut ThreadState {
    let p = map_state();
    if p.is_null() {
        return p;
    }
    // SAFETY: p is a fresh zeroed private mapping large enough for a ThreadState
    // (all-zero is a valid bit pattern for it).
    unsafe {
        (*p).key = key;
    }
    let mut i = hash(key);
    for _ in 0..TABLE_SIZE {
        let k = TABLE[i].key.load(Acquire);
        // Only this thread ever inserts `key`, so claiming the first free or
        // dead slot is race-free with respect to its own lookups.
        if (k == EMPTY || k == TOMBSTONE) && TABLE[i].key.compare_exchange(k, key, AcqRel, Acquire).is_ok() {
            // SAFETY: p is our fresh state, not yet published.
            unsafe { (*p).slot = i };
            TABLE[i].state.store(p, Release);
            // SAFETY: this thread's own hint word (see `slot_hint`).
            unsafe { slot_hint().write(&TABLE[i] as *const Slot as usize) };
            STATES_CREATED.fetch_add(1, Relaxed);
            return p;
        }
        i = (i + 1) & (TABLE_SIZE - 1);
    }
    unmap_state(p);
    std::ptr::null_mut()
}

/// Registers the thread-exit destructor for `st` (first hit of a thread,
/// called with the recursion guard held).
pub(crate) fn register_destructor(st: *mut ThreadState) {
    let key = PTHREAD_KEY.load(Acquire);
    if key == usize::MAX {
        return;
    }
    // SAFETY: st is this thread's live state; pthread_setspecific with a key
    // created by init() only stores the pointer (no allocation for keys < 32).
    unsafe {
        (*st).registered = 1;
        libc::pthread_setspecific(key as libc::pthread_key_t, st as *const libc::c_void);
    }
}

/// pthread key destructor: runs on the exiting thread.
pub(crate) unsafe extern "C" fn destroy(p: *mut libc::c_void) {
    let st = p as *mut ThreadState;
    if st.is_null() {
        return;
    }
    // SAFETY: p is the state registered by this thread in register_destructor.
    let (key, ours) = unsafe { ((*st).key, (*st).in_handler == OURS_FOREVER) };
    if ours {
        // SAFETY: gettid has no arguments and cannot fail.
        forget_tid(unsafe { libc::syscall(libc::SYS_gettid) } as i32);
    }
    let mut i = hash(key);
    for _ in 0..TABLE_SIZE {
        let k = TABLE[i].key.load(Acquire);
        if k == key && TABLE[i].state.load(Acquire) == st {
            TABLE[i].state.store(std::ptr::null_mut(), Release);
            TABLE[i].key.store(TOMBSTONE, Release);
            // SAFETY: the exiting thread's own hint word (the destructor runs on it).
            unsafe { slot_hint().write(0) };
            break;
        }
        if k == EMPTY {
            break;
        }
        i = (i + 1) & (TABLE_SIZE - 1);
    }
    unmap_state(st);
    STATES_FREED.fetch_add(1, Relaxed);
}

// ---------------------------------------------------------------- RCU ----
//
// Per-thread reader generations instead of a shared counter: a reader only
// writes its own table slot (no cache line shared between threads). Reader:
// `rcu.swap(odd, SeqCst)` then loads the published pointer (SeqCst);
// writer: swaps the pointer (SeqCst), then loads every slot's generation
// (SeqCst). All four are SeqCst operations, so in their single total order
// either the writer sees the reader's odd generation (and waits until it
// changes, i.e. that section ended; the Release store that ends it makes the
// section's reads happen-before the free), or the reader's load comes after
// the writer's swap and sees the new pointer. A section that starts later
// sees the new pointer too, so waiting for a *change* (not for even) is
// enough and a busy reader cannot starve the writer.

/// Set once at initialisation when `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)`
/// is registered: readers then need only a compiler fence after announcing
/// their section, and `synchronize` supplies the missing StoreLoad barrier
/// on every running thread of the process with one membarrier call
/// (asymmetric fences, as in liburcu's membarrier flavour). Never cleared.
// The hit path reads it: with its other statics on one page (see `userbpf_arena`).
#[unsafe(link_section = "userbpf_hot")]
static ASYM: AtomicBool = AtomicBool::new(false);

const MEMBARRIER_CMD_QUERY: i32 = 0;
const MEMBARRIER_CMD_PRIVATE_EXPEDITED: i32 = 1 << 3;
const MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED: i32 = 1 << 4;

fn membarrier(cmd: i32) -> i64 {
    // SAFETY: membarrier(2) takes no memory arguments.
    unsafe { libc::syscall(libc::SYS_membarrier, cmd, 0, 0) as i64 }
}

/// Registers for private expedited membarrier (called once by `init`,
/// before any probe is attached).
pub(crate) fn init_rcu() {
    let q = membarrier(MEMBARRIER_CMD_QUERY);
    if q > 0
        && q & i64::from(MEMBARRIER_CMD_PRIVATE_EXPEDITED) != 0
        && membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) == 0
    {
        ASYM.store(true, SeqCst);
    }
}

/// Enters a read-side section of the calling thread (`st` = its state);
/// returns the generation to pass to `read_unlock`.
#[inline(always)]
pub(crate) fn read_lock(st: *mut ThreadState) -> usize {
    // SAFETY: st is this thread's live state.
    let slot = &TABLE[unsafe { (*st).slot }];
    let g = slot.rcu.load(Relaxed).wrapping_add(1) | 1;
    if ASYM.load(Relaxed) {
        slot.rcu.store(g, Relaxed);
        // The writer's membarrier orders this store before our later loads.
        std::sync::atomic::compiler_fence(SeqCst);
    } else {
        slot.rcu.swap(g, SeqCst);
    }
    g
}

#[inline(always)]
pub(crate) fn read_unlock(st: *mut ThreadState, g: usize) {
    // SAFETY: st is this thread's live state.
    let slot = &TABLE[unsafe { (*st).slot }];
    slot.rcu.store(g.wrapping_add(1), Release);
}

/// The calling thread's state if it has one (never creates it).
pub(crate) fn lookup() -> *mut ThreadState {
    let key = thread_key();
    let mut i = hash(key);
    for _ in 0..TABLE_SIZE {
        let k = TABLE[i].key.load(Acquire);
        if k == key {
            return TABLE[i].state.load(Acquire);
        }
        if k == EMPTY {
            break;
        }
        i = (i + 1) & (TABLE_SIZE - 1);
    }
    std::ptr::null_mut()
}

/// Waits until every read-side section that may have seen a pointer
/// unpublished (SeqCst) before this call has ended. Returns false when the
/// caller is itself inside a read-side section (a handler attaching/
/// detaching): then it did not wait for its own section and the caller
/// must not free what it unpublished.
pub(crate) fn synchronize() -> bool {
    let me = lookup();
    let my_slot = if me.is_null() {
        usize::MAX
    } else {
        // SAFETY: me, when non-null, is this thread's state.
        unsafe { (*me).slot }
    };
    if ASYM.load(SeqCst) && membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) != 0 {
        // Cannot happen once registered. Fall back to a signal to every
        // other thread (delivery and the handler's ack act as a full
        // barrier on each of them).
        std::sync::atomic::fence(SeqCst);
        crate::patch::broadcast();
    }
    let mut held = false;
    for (i, slot) in TABLE.iter().enumerate() {
        let g = slot.rcu.load(SeqCst);
        if g & 1 == 0 {
            continue;
        }
        if i == my_slot {
            held = true;
            continue;
        }
        let mut spins = 0u32;
        while slot.rcu.load(Acquire) == g {
            spins += 1;
            if spins < 100 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }
    !held
}

// ------------------------------------------------------------ ours ----
//
// Work of userbpf itself (the agent's watcher thread, its start-up and syncs on the target's
// threads, the programs run from the system call dispatch handler) must not be seen by any
// probe: its system calls and its calls of probed functions (malloc...) are not the target's.
// The recursion guard already makes a probe hit run no handler while `in_handler` is set, in
// every path (the Rust dispatchers and the generated fast paths, which only compare it with
// 0), so "ours" is that same field: held for a scope ([`ours`]), or for the rest of a thread
// made by userbpf ([`mark_thread_ours`]: a value no dispatcher ever clears, since they only
// set and clear it when it was 0). System call dispatch (`sud`) skips the programs for a
// thread in that state as well.

/// `in_handler` of a thread userbpf made: never cleared.
const OURS_FOREVER: u32 = 2;

/// The calling thread's state, created (and its exit destructor registered) if needed.
fn current_registered() -> *mut ThreadState {
    let st = current();
    // SAFETY: st, when non-null, is this thread's live state.
    if !st.is_null() && unsafe { (*st).registered } == 0 {
        register_destructor(st);
    }
    st
}

/// Marks the calling thread as userbpf's own for the rest of its life: no probe runs a
/// handler on it and system call dispatch is turned off for it (its system calls are not the
/// target's). Call it first thing in every thread userbpf starts. False when the thread's
/// state could not be made (mmap failed or the table is full).
pub fn mark_thread_ours() -> bool {
    let st = current_registered();
    if !st.is_null() {
        // SAFETY: this thread's state, only written by this thread.
        unsafe { (*st).in_handler = OURS_FOREVER };
    }
    crate::sud::leave_this_thread();
    let k = thread_key();
    for s in &OURS_PENDING {
        let _ = s.compare_exchange(k, 0, AcqRel, Relaxed);
    }
    if st.is_null() {
        return false;
    }
    // Its exit destructor (registered with its state) forgets it.
    // SAFETY: gettid has no arguments and cannot fail.
    let tid = unsafe { libc::syscall(libc::SYS_gettid) } as i32;
    for t in &OURS_TIDS {
        if t.compare_exchange(0, tid, AcqRel, Relaxed).is_ok() {
            break;
        }
    }
    // SAFETY: this thread's state, only written by this thread.
    unsafe { (*st).in_handler = OURS_FOREVER };
    true
}

/// The thread ids of userbpf's own threads ([`mark_thread_ours`]) while they live (a thread's
/// exit destructor clears its entry; a forked child clears them all): system calls the
/// program makes only because they exist (glibc's setxid broadcast signals every thread) are
/// not shown to its programs (see `sud::for_ours`). With every slot taken a thread is not
/// recorded (its signals are then seen).
static OURS_TIDS: [AtomicI32; 32] = [const { AtomicI32::new(0) }; 32];

/// Whether `tid` is one of userbpf's own threads in this process.
pub(crate) fn is_tid_ours(tid: i32) -> bool {
    tid > 0 && OURS_TIDS.iter().any(|t| t.load(Acquire) == tid)
}

/// The exiting thread `tid` is no longer ours to hide (its tid can be reused).
fn forget_tid(tid: i32) {
    for t in &OURS_TIDS {
        let _ = t.compare_exchange(tid, 0, AcqRel, Relaxed);
    }
}

/// Threads userbpf is creating (a `clone`/`clone3` made with probes off), by their TCB
/// address (the `tls` they are given, `fs:[0]` once they run), until they mark themselves
/// ours: their first calls in glibc's `start_thread` (`rseq`, `set_robust_list`,
/// `rt_sigprocmask`) come before their start routine and must not be seen either (libc's
/// rewritten system call sites run on them; dispatch itself is off there).
static OURS_PENDING: [AtomicUsize; 16] = [const { AtomicUsize::new(0) }; 16];

/// Records that the thread about to be made with TCB `tcb` is userbpf's (see
/// [`OURS_PENDING`]); with every slot taken the oldest record is replaced.
pub(crate) fn expect_ours(tcb: usize) {
    if tcb == 0 {
        return;
    }
    OURS_PENDING_USED.store(true, SeqCst);
    for s in &OURS_PENDING {
        if s.compare_exchange(0, tcb, AcqRel, Relaxed).is_ok() {
            return;
        }
    }
    OURS_PENDING[0].store(tcb, Release);
}

/// Set once a thread was recorded in [`OURS_PENDING`] (most processes never look there).
static OURS_PENDING_USED: AtomicBool = AtomicBool::new(false);

/// Threads of the program's in a `vfork` (or a `clone` with `CLONE_VFORK`), by TCB address,
/// until the call returns in the parent: until its `exec` or exit, the child runs with the
/// parent's TCB (and memory) while the parent waits in the kernel, so a call made with that
/// TCB meanwhile is the child's. Its calls are not seen (dispatch is off in it; libc's
/// rewritten sites run there too): the agent's per-thread caches (its pid and tid) are the
/// parent's.
static VFORKING: [AtomicUsize; 16] = [const { AtomicUsize::new(0) }; 16];
static VFORKS: AtomicUsize = AtomicUsize::new(0);

/// The calling thread is about to `vfork` (see [`VFORKING`]); false when too many are.
pub(crate) fn vfork_begin() -> bool {
    let k = thread_key();
    for s in &VFORKING {
        if s.compare_exchange(0, k, AcqRel, Relaxed).is_ok() {
            VFORKS.fetch_add(1, SeqCst);
            return true;
        }
    }
    false
}

/// The calling thread's `vfork` returned in it (the parent).
pub(crate) fn vfork_end() {
    if VFORKS.load(SeqCst) == 0 {
        return;
    }
    let k = thread_key();
    for s in &VFORKING {
        if s.compare_exchange(k, 0, AcqRel, Relaxed).is_ok() {
            VFORKS.fetch_sub(1, SeqCst);
        }
    }
}

pub(crate) fn in_vfork_child() -> bool {
    if VFORKS.load(Relaxed) == 0 {
        return false;
    }
    let k = thread_key();
    VFORKING.iter().any(|s| s.load(Acquire) == k)
}

fn pending_ours() -> bool {
    if !OURS_PENDING_USED.load(Relaxed) {
        return false;
    }
    let k = thread_key();
    OURS_PENDING.iter().any(|s| s.load(Acquire) == k)
}

/// Whether the calling thread is one of userbpf's own ([`mark_thread_ours`]).
pub fn is_thread_ours() -> bool {
    let st = lookup();
    // SAFETY: st, when non-null, is this thread's live state.
    !st.is_null() && unsafe { (*st).in_handler } == OURS_FOREVER
}

/// Whether probes are off on the calling thread: it is inside a handler, inside an [`ours`]
/// scope, or one of userbpf's threads. Never creates the thread's state.
pub fn probes_off() -> bool {
    let st = lookup();
    // SAFETY: st, when non-null, is this thread's live state.
    !st.is_null() && unsafe { (*st).in_handler } != 0
}

/// While alive, the calling thread does userbpf's work: no probe runs a handler on it and
/// system call dispatch runs no program for its calls. Nests; restores the previous state when
/// dropped (on the thread that made it: it is not `Send`).
#[must_use = "probes are off only while the guard lives"]
pub struct Ours {
    st: *mut ThreadState,
    prev: u32,
}

/// Starts a scope of userbpf's own work on the calling thread (see [`Ours`]). If the thread's
/// state cannot be made (mmap failed, table full), no probe can run a handler there anyway
/// (the hit is counted as missed for lack of state).
pub fn ours() -> Ours {
    let st = current_registered();
    if st.is_null() {
        return Ours { st, prev: 0 };
    }
    // SAFETY: this thread's state, only written by this thread (a signal handler running on it
    // restores what it changed before returning).
    let prev = unsafe { (*st).in_handler };
    if prev == 0 {
        // SAFETY: as above.
        unsafe { (*st).in_handler = 1 };
    }
    Ours { st, prev }
}

/// Enters the recursion guard for work done outside a probe (the system call dispatch
/// handler running programs): `None` when probes are off on this thread (see [`probes_off`]),
/// else a guard holding them off until dropped. Never creates the thread's state: a thread
/// without one (it never met a probe, or its state was freed at its exit) gets a guard that
/// holds nothing (`Some`).
pub(crate) fn enter_guard() -> Option<Ours> {
    if in_vfork_child() {
        return None;
    }
    let st = lookup();
    if st.is_null() {
        // A thread userbpf is starting, before it marks itself ours, has no state yet.
        return if pending_ours() { None } else { Some(Ours { st, prev: 0 }) };
    }
    // SAFETY: this thread's live state. A thread userbpf is starting may already have one
    // (a cached stack's TCB whose previous thread left its state, or made while it marks
    // itself): still not the program's.
    if unsafe { (*st).in_handler } != 0 || pending_ours() {
        return None;
    }
    // SAFETY: as above.
    unsafe { (*st).in_handler = 1 };
    Some(Ours { st, prev: 0 })
}

impl Ours {
    /// Whether the guard holds nothing (the thread has no state).
    pub(crate) fn is_null(&self) -> bool {
        self.st.is_null()
    }
}

/// [`ours`] for callers that cannot hold the guard (another crate's C-style hooks, see
/// `userbpf_runtime::own_work`): starts the scope and returns what [`ours_end`] restores.
pub fn ours_begin() -> u32 {
    let g = ours();
    let prev = if g.st.is_null() { u32::MAX } else { g.prev };
    std::mem::forget(g);
    prev
}

/// Ends a scope [`ours_begin`] started on the calling thread.
pub fn ours_end(prev: u32) {
    let st = lookup();
    if prev != u32::MAX && !st.is_null() {
        // SAFETY: this thread's live state, only written by this thread.
        unsafe { (*st).in_handler = prev };
    }
}

impl Drop for Ours {
    fn drop(&mut self) {
        if !self.st.is_null() {
            // SAFETY: the state of the thread that made the guard (not Send), alive while
            // that thread runs (it is only freed by its exit destructor).
            unsafe { (*self.st).in_handler = self.prev };
        }
    }
}

#[allow(dead_code)]
pub(crate) fn _regs_size_check() {
    const _: () = assert!(std::mem::size_of::<PtRegs>() == 168);
}

/// In the child of a fork (called by `fork`'s child handler, only async-signal-safe work):
/// drops the states of the threads that were not copied (their slots become tombstones, their
/// RCU generations even, their states unmapped) and registers for membarrier again.
pub(crate) fn after_fork_in_child() {
    // userbpf's threads were not copied (the calling thread, if one of them, has a new tid).
    for t in &OURS_TIDS {
        t.store(0, Release);
    }
    let me = thread_key();
    for slot in TABLE.iter() {
        let k = slot.key.load(Acquire);
        if k == EMPTY || k == TOMBSTONE || k == me {
            continue;
        }
        let st = slot.state.swap(std::ptr::null_mut(), AcqRel);
        slot.rcu.store(0, Release);
        slot.key.store(TOMBSTONE, Release);
        if !st.is_null() {
            unmap_state(st);
            STATES_FREED.fetch_add(1, Relaxed);
        }
    }
    if ASYM.load(Relaxed) && membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) != 0 {
        // Readers of this process still announce their sections with a full barrier.
        ASYM.store(false, SeqCst);
    }
}
