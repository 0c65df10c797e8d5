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

use std::sync::atomic::{AtomicPtr, AtomicU64, AtomicUsize, Ordering::*};

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
    /// RCU counter index held by this thread while inside handlers, or usize::MAX.
    pub rcu_idx: usize,
    pub top: usize,
    pub entries: [ShadowEntry; SHADOW_CAPACITY],
}

struct Slot {
    key: AtomicUsize,
    state: AtomicPtr<ThreadState>,
}

#[allow(clippy::declare_interior_mutable_const)]
const SLOT_INIT: Slot = Slot {
    key: AtomicUsize::new(EMPTY),
    state: AtomicPtr::new(std::ptr::null_mut()),
};
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
    unsafe {
        core::arch::asm!("mov {}, qword ptr fs:[0]", out(reg) k, options(nostack, readonly, preserves_flags))
    };
    k
}

#[inline(always)]
fn hash(k: usize) -> usize {
    ((k >> 6).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 20) & (TABLE_SIZE - 1)
}

pub(crate) fn raw_mmap(len: usize) -> *mut u8 {
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
    if ret < 0 && ret > -4096 {
        std::ptr::null_mut()
    } else {
        ret as *mut u8
    }
}

pub(crate) fn raw_munmap(p: *mut u8, len: usize) {
    let _ret: isize;
    // SAFETY: raw munmap of a region this module mapped and no longer uses.
    unsafe {
        core::arch::asm!("syscall",
            inlateout("rax") libc::SYS_munmap as isize => _ret,
            in("rdi") p as usize, in("rsi") len,
            lateout("rcx") _, lateout("r11") _, options(nostack));
    }
}

const STATE_BYTES: usize = (std::mem::size_of::<ThreadState>() + 4095) & !4095;

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
    let p = raw_mmap(STATE_BYTES) as *mut ThreadState;
    if p.is_null() {
        return p;
    }
    // SAFETY: p is a fresh zeroed private mapping large enough for a ThreadState
    // (all-zero is a valid bit pattern for it).
    unsafe {
        (*p).key = key;
        (*p).rcu_idx = usize::MAX;
    }
    let mut i = hash(key);
    for _ in 0..TABLE_SIZE {
        let k = TABLE[i].key.load(Acquire);
        // Only this thread ever inserts `key`, so claiming the first free or
        // dead slot is race-free with respect to its own lookups.
        if (k == EMPTY || k == TOMBSTONE)
            && TABLE[i]
                .key
                .compare_exchange(k, key, AcqRel, Acquire)
                .is_ok()
        {
            TABLE[i].state.store(p, Release);
            STATES_CREATED.fetch_add(1, Relaxed);
            return p;
        }
        i = (i + 1) & (TABLE_SIZE - 1);
    }
    raw_munmap(p as *mut u8, STATE_BYTES);
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
    let key = unsafe { (*st).key };
    let mut i = hash(key);
    for _ in 0..TABLE_SIZE {
        let k = TABLE[i].key.load(Acquire);
        if k == key && TABLE[i].state.load(Acquire) == st {
            TABLE[i].state.store(std::ptr::null_mut(), Release);
            TABLE[i].key.store(TOMBSTONE, Release);
            break;
        }
        if k == EMPTY {
            break;
        }
        i = (i + 1) & (TABLE_SIZE - 1);
    }
    raw_munmap(st as *mut u8, STATE_BYTES);
    STATES_FREED.fetch_add(1, Relaxed);
}

// ---------------------------------------------------------------- RCU ----

static RCU_EPOCH: AtomicUsize = AtomicUsize::new(0);
static RCU_READERS: [AtomicUsize; 2] = [AtomicUsize::new(0), AtomicUsize::new(0)];

/// Enters a read-side section; returns the counter index to pass to `read_unlock`.
#[inline(always)]
pub(crate) fn read_lock() -> usize {
    let i = RCU_EPOCH.load(SeqCst) & 1;
    RCU_READERS[i].fetch_add(1, SeqCst);
    i
}

#[inline(always)]
pub(crate) fn read_unlock(i: usize) {
    RCU_READERS[i].fetch_sub(1, Release);
}

/// Waits until every read-side section that may have seen a pointer
/// unpublished before this call has ended (two epoch flips, SRCU-style).
/// Returns false when the caller is itself inside a read-side section (a
/// handler attaching/detaching): then it did not wait for its own section
/// and the caller must not free what it unpublished.
pub(crate) fn synchronize() -> bool {
    let me = current();
    // SAFETY: me, when non-null, is this thread's state.
    let held = if me.is_null() {
        usize::MAX
    } else {
        unsafe { (*me).rcu_idx }
    };
    for _ in 0..2 {
        let old = RCU_EPOCH.fetch_add(1, SeqCst) & 1;
        let own = usize::from(held == old);
        let mut spins = 0u32;
        while RCU_READERS[old].load(SeqCst) > own {
            spins += 1;
            if spins < 100 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }
    held == usize::MAX
}

/// Records in the thread state which RCU index the thread holds.
#[inline(always)]
pub(crate) fn set_held(st: *mut ThreadState, idx: usize) {
    // SAFETY: st is this thread's live state.
    unsafe { (*st).rcu_idx = idx };
}

#[allow(dead_code)]
pub(crate) fn _regs_size_check() {
    const _: () = assert!(std::mem::size_of::<PtRegs>() == 168);
}
