//! Memory for what a probe hit reads.
//!
//! A hit on a cold cache pays for every page its code reaches (a TLB miss, on a VM a walk of
//! two levels of page tables) more than for every line (bench/sslsniff/steps: the same data
//! lines spread one to a page cost a hit up to 1.7 µs more than in a row). The objects a hit
//! reads (the probe's handler and run arguments, the program, its maps' and the CPU slots'
//! descriptors, the hook's site) are made one by one while a link is attached, between the
//! many short-lived allocations of loading and compiling: from the malloc heap they land
//! each on a page of its own, 13 pages for sslsniff's four probes.
//!
//! [`HitAlloc`] is a global allocator (the agent's) that is the system allocator except
//! inside a [`scope`]: there, allocations of up to [`MAX_SMALL`] bytes come from one region
//! of their own, handed out in order (so objects made together sit together) and reused by
//! size once freed. An object of up to 64 bytes never straddles two cache lines. Memory
//! freed anywhere goes back to where it came from (the region's bounds tell). It is the
//! global allocator of the agent's library, and so of the syscall server's, which links the
//! agent's crate; where it is not (the CLI, tests of other crates) a scope changes nothing.
//!
//! Allocation takes a spin lock (attach time only: a hit never allocates); nothing here
//! calls the Rust allocator, so the hooked function may be `malloc` itself.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::{Cell, UnsafeCell};
use std::sync::Once;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// The region's size (address space reserved, `MAP_NORESERVE`: only pages used are backed).
pub const REGION: usize = 16 << 20;
/// Larger allocations (or alignments) go to the system allocator even inside a scope.
pub const MAX_SMALL: usize = 4096;
/// Sizes are rounded up to this; the region's free lists are kept per multiple of it.
const GRAIN: usize = 16;
const CLASSES: usize = MAX_SMALL / GRAIN;
const LINE: usize = 64;

thread_local! {
    /// Whether allocations of this thread go to the region (see [`scope`]).
    static IN_SCOPE: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f` with this thread's small allocations coming from the region (where
/// [`HitAlloc`] is the global allocator). Nests.
pub fn scope<R>(f: impl FnOnce() -> R) -> R {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            let _ = IN_SCOPE.try_with(|s| s.set(self.0));
        }
    }
    let _restore = Restore(IN_SCOPE.try_with(|s| s.replace(true)).unwrap_or(false));
    f()
}

/// Whether this thread is inside a [`scope`].
fn in_scope() -> bool {
    IN_SCOPE.try_with(Cell::get).unwrap_or(false)
}

/// Whether `p` lies in the region (allocated there, or not yet: the region is only mapped on
/// first use).
pub fn contains(p: *const u8) -> bool {
    let base = ARENA.base.load(Ordering::Acquire);
    base != 0 && (p as usize).wrapping_sub(base) < REGION
}

/// Bytes of the region handed out so far (freed ones included: its high-water mark).
pub fn used() -> usize {
    ARENA.lock();
    // SAFETY: the lock is held.
    let s = unsafe { &*ARENA.state.get() };
    let used = s.next.saturating_sub(ARENA.base.load(Ordering::Relaxed));
    ARENA.unlock();
    used
}

struct State {
    /// The next free byte, and the region's end (0 and 0 until mapped).
    next: usize,
    end: usize,
    /// Heads of the free lists, per size class (a freed block holds the next one's address).
    free: [usize; CLASSES],
    /// Mapping the region failed: never try again.
    failed: bool,
}

struct Arena {
    base: AtomicUsize,
    locked: AtomicBool,
    state: UnsafeCell<State>,
}

// SAFETY: `state` is only touched with `locked` held (`lock`/`unlock`); the other fields are
// atomics.
unsafe impl Sync for Arena {}

static ARENA: Arena = Arena {
    base: AtomicUsize::new(0),
    locked: AtomicBool::new(false),
    state: UnsafeCell::new(State { next: 0, end: 0, free: [0; CLASSES], failed: false }),
};

static AT_FORK: Once = Once::new();

/// In a fork's child, only the forking thread exists: a lock another thread held is free.
/// Every change to the state under the lock is a single store of a consistent value (a freed
/// block's link is written before the list's head names it, in that order: see `free`), so
/// the child's copy is consistent whatever the parent's other threads were doing.
extern "C" fn after_fork_child() {
    ARENA.locked.store(false, Ordering::Release);
}

impl Arena {
    fn lock(&self) {
        let mut spins = 0u32;
        while self.locked.compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed).is_err() {
            spins += 1;
            if spins < 64 {
                std::hint::spin_loop();
            } else {
                // SAFETY: sched_yield has no memory effects.
                unsafe { libc::sched_yield() };
            }
        }
    }

    fn unlock(&self) {
        self.locked.store(false, Ordering::Release);
    }

    /// A block for `layout` from the region, or `None` (too large, region full or unmapped).
    fn alloc(&self, layout: Layout) -> Option<*mut u8> {
        let size = layout.size().max(1).div_ceil(GRAIN) * GRAIN;
        let align = layout.align();
        if size > MAX_SMALL || align > MAX_SMALL {
            return None;
        }
        self.lock();
        // SAFETY: the lock is held until `unlock` below.
        let s = unsafe { &mut *self.state.get() };
        let r = self.alloc_locked(s, size, align);
        self.unlock();
        r
    }

    fn alloc_locked(&self, s: &mut State, size: usize, align: usize) -> Option<*mut u8> {
        if s.end == 0 && !self.map(s) {
            return None;
        }
        let class = size / GRAIN - 1;
        let head = s.free[class];
        if head != 0 && head.is_multiple_of(align) && (size > LINE || head % LINE + size <= LINE) {
            // SAFETY: `head` is a freed block of this class in the region: its first word
            // holds the next free block (written by `free`).
            s.free[class] = unsafe { (head as *const usize).read() };
            return Some(head as *mut u8);
        }
        let mut at = s.next.next_multiple_of(align.max(GRAIN));
        if size <= LINE && at % LINE + size > LINE {
            at = at.next_multiple_of(LINE);
        }
        if at + size > s.end {
            return None;
        }
        s.next = at + size;
        Some(at as *mut u8)
    }

    /// Maps the region (the lock held).
    fn map(&self, s: &mut State) -> bool {
        if s.failed {
            return false;
        }
        // SAFETY: a fresh private anonymous mapping; no existing memory is touched.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                REGION,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            s.failed = true;
            return false;
        }
        AT_FORK.call_once(|| {
            // SAFETY: registers a child handler that only stores to an atomic.
            unsafe { libc::pthread_atfork(None, None, Some(after_fork_child)) };
        });
        s.next = p as usize;
        s.end = p as usize + REGION;
        self.base.store(p as usize, Ordering::Release);
        true
    }

    /// Returns a block [`Arena::alloc`] gave for a layout of `size` bytes.
    fn free(&self, p: *mut u8, size: usize) {
        let class = size.max(1).div_ceil(GRAIN) - 1;
        self.lock();
        // SAFETY: the lock is held until `unlock` below.
        let s = unsafe { &mut *self.state.get() };
        // SAFETY: `p` is a block of at least GRAIN bytes in the region that its owner gave
        // back: it is ours to hold the list's link.
        unsafe { (p as *mut usize).write(s.free[class]) };
        // The link before the head that names the block (see `after_fork_child`).
        std::sync::atomic::compiler_fence(Ordering::Release);
        s.free[class] = p as usize;
        self.unlock();
    }
}

/// The agent's global allocator: the system allocator, but for small allocations made
/// inside a [`scope`], which come from the region (see the module's documentation).
pub struct HitAlloc;

// SAFETY: every block handed out is either the system allocator's (and goes back to it:
// not in the region) or a region block of at least the layout's size and alignment, not
// handed out again until freed (the lock orders the free lists' updates).
unsafe impl GlobalAlloc for HitAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if in_scope()
            && let Some(p) = ARENA.alloc(layout)
        {
            return p;
        }
        // SAFETY: the caller's layout, as `GlobalAlloc::alloc` requires.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if in_scope()
            && let Some(p) = ARENA.alloc(layout)
        {
            // SAFETY: a block of at least `layout.size()` bytes (a reused one is not zero).
            unsafe { p.write_bytes(0, layout.size()) };
            return p;
        }
        // SAFETY: as in `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if contains(ptr) {
            ARENA.free(ptr, layout.size());
        } else {
            // SAFETY: not in the region: the system allocator gave it, for this layout.
            unsafe { System.dealloc(ptr, layout) }
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if !contains(ptr) && !in_scope() {
            // SAFETY: the system allocator's block, the caller's layout and size.
            return unsafe { System.realloc(ptr, layout, new_size) };
        }
        // SAFETY: the caller guarantees a valid layout for `new_size` at this alignment.
        let new_layout = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
        // SAFETY: as for `alloc`.
        let new = unsafe { self.alloc(new_layout) };
        if !new.is_null() {
            // SAFETY: both blocks are live and distinct; the smaller size is within both.
            unsafe { std::ptr::copy_nonoverlapping(ptr, new, layout.size().min(new_size)) };
            // SAFETY: the old block, for its layout, no longer used.
            unsafe { self.dealloc(ptr, layout) };
        }
        new
    }
}
