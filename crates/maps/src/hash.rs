//! HASH, PERCPU_HASH, LRU_HASH, LRU_PERCPU_HASH and HASH_OF_MAPS: preallocated hash tables.
//!
//! File layout (`ks8 = round_up(key_size, 8)`, `vs8 = round_up(value_size, 8)`,
//! `n_buckets = roundup_pow_of_two(max_entries)`, `n_elems = max_entries`; map layout
//! version 2):
//!
//! ```text
//! 0       MapHeader
//! 128     +4 clock_hand: u32 (LRU), +8 seed: u64 (hash seed)
//! 4096    buckets[n_buckets]: { lock: u32 (0 or holder thread id), head: u32 }
//! L       (64-aligned) nr_cpus list records of 64 bytes (one cache line each):
//!           +0 free: u64   this CPU's free list (tag << 32 | element index)
//!           +8 ring position: u32, +12 ring[12]: u32  the elements this CPU slot's
//!              programs deleted last (element index + 1, 0: none), +60 score: u32 (how
//!              often deleted keys did not come back; see "Deletes" below; zero in files
//!              made before 2026-11-27: an empty ring)
//! E       elements[n_elems], each a whole number of cache lines (64 bytes), holding
//!           +0  next: u32   chain link: element index, or NULLS | bucket at the chain's end
//!           +4  hash: u32
//!           +8  flink: u32  free-list link
//!           +12 state: u8 (0 free, 1 linked, 2 deleted: in its chain, not a key),
//!           +13 ref: u8 (LRU "recently used"),
//!           +14 sel: u8 (which value slot readers use)
//!           +16 lock: u32 (element lock: 0 or holder thread id), +20 seq: u32 (value writes)
//!           +24 key (ks8 bytes)
//!           +24+ks8 two value slots of vs8 bytes (absent for per-CPU types; a u32 id for
//!           hash of maps)
//! P       (per-CPU types, 64-aligned) nr_cpus regions, each values[n_elems] of vs8 bytes
//!         rounded up to 64 bytes
//! end     rounded up to a page
//! ```
//!
//! Concurrency. Lookups (program and syscall side) take no lock: they hash the key, load the
//! bucket head (acquire) and walk `next` links comparing hash and key, bounded by `n_elems`
//! steps. Chains end in a "nulls" marker naming their bucket (as the kernel's
//! hlist_nulls): a reader that was carried into another chain because the element it stood
//! on was deleted and reused ends on a foreign marker and restarts (at most 4 times).
//! Elements are never unmapped, so a racing reader is always memory-safe; like the kernel's
//! preallocated maps, a value pointer may end up pointing at an element reused for another
//! key.
//!
//! Locks are [`SpinLock`]s (bounded spinning, then a bounded yielding wait for a preempted
//! holder, then `EBUSY`; `EBUSY` at once on same-thread re-entry; a dead holder's lock is
//! taken over). Inserts and deletes change a chain under its bucket's lock; the element's own
//! lock is taken inside it (never the other way round) to unlink an element.
//!
//! An update of an existing key changes no chain and writes no bucket: it finds the element
//! without a lock, takes the element's lock, checks it still holds the key (else it was
//! deleted or reused meanwhile: retry, then the bucket-locked path), and writes the value in
//! place. Per-CPU types write the slot in place, as the kernel does. The others write the
//! value slot readers are not using and switch `sel` to it with one release store, so a
//! reader sees the old or the new value, never a mix (what the kernel gets by replacing the
//! element); `seq` counts these writes so that a syscall-side copy that raced two of them is
//! retried. A program's value pointer, as with the kernel's reuse of preallocated elements,
//! may see a later update. Why: with 8 buckets to a cache line every bucket line is written
//! by every thread, and taking a bucket lock was a cache-line transfer between CPUs on each
//! update (profiled: most of an update's time from two threads). Deletes and inserts still
//! write their bucket.
//!
//! Programs' operations. [`HashMap::prog_ops`] gives the program-side lookup, update and
//! delete as plain functions with the CPU slot as an argument, which the JIT calls directly
//! instead of the helpers (no registry probe, no dispatch on the map type, no thread-local
//! read of the run's CPU). Each is an instance for the map's key size (4, 8, 16 bytes, or
//! any): the hash, the searches and the key's copy are fixed-size loads and stores, with no
//! branch on the key size. A program's lookup leaves the element it found in
//! a per-thread memo (initial-exec TLS, `sync::lookup_memo`, with the key's first 8 bytes, so
//! that other keys pass it by without touching the element), and the memo it replaces, if it
//! was another map's, becomes the thread's second memo (`sync::lookup_memo2`: a thread
//! looking up two maps in turn, as sslsniff's return probe does `bufs` and `start_ns`, finds
//! both). Memos name a map by its hash seed (`HashMap::memo_id`), the same for every opening
//! of the map file: the runtime opens a map for each program that uses it, and the lookup
//! that follows an insert is often another program's (an entry probe's `start[tid] = ts`, its
//! return probe's lookup). The thread's next lookup of the same map first checks the first
//! memo's element, then the second's (which then becomes the first): linked (acquire) and
//! holding the key,
//! it is the key's element, found without hashing and walking the chain (a thread looking up
//! the same key on every hit, as bpftrace's `@x[tid]`, `sum()` and most `hist()` hits do).
//! Inserts mark an element linked only after publishing it in its chain, and deletes unlink
//! it before marking it free, so an element seen linked is one a search could find (or one
//! being deleted, which a lookup overlapping the delete may still return, as a search may);
//! like a search's result, it may be deleted and reused right after. An update of an existing
//! key that follows a lookup of it (bpftrace's keyed `count()`, `sum()`, `hist()` look the key
//! up, compute, then update it) writes the memo's element in place without hashing and
//! searching again, after the same checks under the element's lock as an update found by
//! `find` (holding the key); so does an insert of a key the thread looked up and deleted
//! (sslsniff's pattern: the element is taken back, see "Deletes"), and a delete of a key it
//! looked up. A stale memo (another key's element, a freed one) just sends the lookup,
//! update or delete the general way, without locking the element. For per-CPU
//! maps with keys of 1, 2, 4 or 8 bytes, [`HashMap::memo_layout`] tells the JIT where the
//! memo and the elements are, and it does these hits inline (the same checks, the same
//! element lock), calling [`ProgOps`] only on a miss.
//!
//! Deletes. A program's delete from a hash or per-CPU hash map marks the key's element
//! deleted under the element's lock and leaves it in its chain: no bucket lock, no free list.
//! Searches pass it by (lookups, iteration and the count see linked elements only), and an
//! insert of the same key takes it back in place under its lock: tracing tools insert
//! `start[tid]` on entry and delete it on return, and a thread's pair then costs one atomic
//! read-modify-write each (the element's lock), where freeing and allocating cost five
//! (bucket lock and free-list pop; bucket lock, element lock and free-list push), which were
//! most of the locked instructions of sslsniff's hits (20 of 26 a read+write pair,
//! 2026-11-26) and a fifth of their time with hot caches (measured without them). So that
//! keys that do not come back (by request, by pointer) do not hold the elements, each CPU
//! slot's list record keeps a ring of the last `RING` (12) elements its programs deleted
//! (plain loads and stores: a hint, see [`HashMap::note_deleted`]); the oldest, if still
//! deleted, is then unlinked and freed to the slot's list as a delete that frees would, and
//! a slot whose ring keeps doing so (its keys do not come back) frees most deletes at once.
//! Deleted elements stay free space: an insert of a new key takes a deleted element of its
//! own chain first (under the bucket lock it holds), and when every free list is empty, the
//! rings' elements or a search of every element give one (`E2BIG` only when every element
//! holds a key; see [`HashMap::take_deleted`]). The syscall
//! side's deletes, LRU maps' (whose eviction must not meet a live element before a deleted
//! one) and hashes of maps' free at once. The invariant that makes the lock-free paths safe:
//! a chain holds at most one element per key, linked or deleted (elements are added under
//! the bucket lock after a search finding none, and only under it re-keyed or unlinked), and
//! an element's state and key change only under its lock.
//!
//! Free elements sit on per-CPU lock-free [`FreeList`]s (as the kernel's pcpu_freelist): a
//! program's insert or delete through [`ProgOps`] pushes to and pops from the list of its
//! run's CPU slot (the `cpu` its operation receives: runs at the same time hold different
//! slots), the syscall side and the helpers (given no slot for maps that are not per-CPU)
//! the list of the CPU they run on (`sched_getcpu`: rseq or the vDSO, no system call);
//! each takes from the other lists only when its own is empty, so two CPUs inserting and
//! deleting share no free-list line. The free lists hold `max_entries` elements less the
//! linked and the deleted ones, which bounds the map. No element count is
//! kept (an insert or delete would write it: an atomic read-modify-write a call);
//! [`HashMap::len`] counts the linked elements. LRU types evict
//! instead: a CLOCK sweep over the elements (program lookups set `ref`, the sweep clears it
//! and takes the first element without it, locking the victim's bucket and element with a
//! single try so two updaters never wait for each other). The sweep's hand is shared, but each
//! thread takes a stretch of 64 of its positions at a time and steps through them in its
//! thread-local words, so threads evicting at once neither pass the hand's line back and forth
//! at every step nor sweep the same elements.

use std::sync::atomic::{AtomicU8, AtomicU32, AtomicU64, Ordering::*, fence};

use crate::map::*;
use crate::mem::{a8, a32, a64, copy_in, copy_out, eq, hash_key, read_tail, read_word, round_up, round8, zero};
use crate::shm::PAGE_SIZE;
use crate::sync::{
    FreeList, NIL, SpinLock, Wait, current_cpu, lookup_memo, lookup_memo2, set_lookup_memo, set_sweep_stretch,
    swap_lookup_memos, sweep_stretch,
};
use crate::types::*;

const NULLS: u32 = 1 << 31;
/// Bytes per bucket (8 to a cache line; see the module docs for why updates do not write them).
const BUCKET_SIZE: usize = 8;

const H_HAND: usize = EXT_OFF + 4;
const H_SEED: usize = EXT_OFF + 8;
/// CLOCK_MONOTONIC (ns) before which an insert into a full map does not search every element
/// for a deleted one again (see [`HashMap::take_deleted`]).
const H_SWEPT: usize = EXT_OFF + 16;
/// How long a search of every element that found no deleted one stands.
const SWEEP_EVERY_NS: u64 = 10_000_000;

/// Bytes of one CPU's list record (a cache line of its own).
const LIST_SIZE: usize = 64;
/// Offset in a list record: the free list's head (tag << 32 | element index).
const L_FREE: usize = 0;
/// Offset in a list record: the next position of its ring of deleted elements.
const L_RING_POS: usize = 8;
/// Offset in a list record: its ring of deleted elements (see [`HashMap::note_deleted`]).
const L_RING: usize = 12;
/// Deleted elements a CPU slot keeps in its chains for their keys to come back.
const RING: u32 = 12;
/// Offset in a list record: its score, which rises when deleted keys do not come back (see
/// [`HashMap::note_deleted`]).
const L_SCORE: usize = L_RING + 4 * RING as usize;
/// What a deleted element given back to a free list by the ring (its key did not come back
/// in `RING` deletes) adds to its slot's score.
const SCORE_WASTED: u32 = 8;
/// From this score on, a slot's program deletes free at once (each lowering it by one).
const SCORE_FREE_AT_ONCE: u32 = 16;
/// The score's ceiling.
const SCORE_MAX: u32 = 64;
/// Positions of the shared CLOCK hand a thread takes at a time (LRU types; see
/// [`HashMap::sweep_step`]).
const SWEEP_STRETCH: u32 = 64;

const E_NEXT: usize = 0;
const E_HASH: usize = 4;
const E_FLINK: usize = 8;
const E_STATE: usize = 12;
const E_REF: usize = 13;
const E_SEL: usize = 14;
const E_LOCK: usize = 16;
const E_SEQ: usize = 20;
const E_KEY: usize = 24;

const FREE: u8 = 0;
const LINKED: u8 = 1;
/// In its chain, holding a deleted key: a lookup does not see it; an insert of the same key
/// takes it back in place (see the module docs).
const DELETED: u8 = 2;

/// What a lock-free search returns when it gave up (carried between chains too often by
/// concurrent deletes and inserts): the caller searches again under the bucket's lock.
const UNSURE: u32 = NIL - 1;

const HTAB_CREATE_FLAG_MASK: u32 =
    BPF_F_NO_PREALLOC | BPF_F_NO_COMMON_LRU | BPF_F_NUMA_NODE | ACCESS_MASK | BPF_F_ZERO_SEED;
/// sizeof(struct htab_elem) in the kernel (x86-64), which enters its size check.
const KERNEL_HTAB_ELEM: u64 = 48;

/// What a search of a chain under its bucket's lock found (`HashMap::scan_locked`): the
/// key's element (NIL: none) and its predecessor (NIL: the head), and the first deleted
/// element of another key met before it (NIL: none).
struct Scan {
    prev: u32,
    found: u32,
    spare: u32,
}

/// Where an update's value comes from.
#[derive(Clone, Copy)]
enum Src {
    /// A program's value: the whole value of a non-per-CPU map, or `cpu`'s slot.
    Cpu(*const u8, usize),
    /// A syscall buffer of nr_cpus values, vs8 apart.
    All(*const u8),
}

struct Geometry {
    n_buckets: u32,
    n_elems: u32,
    elem_size: usize,
    lists_off: usize,
    elems_off: usize,
    pcpu_off: usize,
    pcpu_stride: usize,
    size: u64,
}

fn geometry(spec: &MapSpec, nr_cpus: u32) -> Option<Geometry> {
    let percpu = spec.map_type.is_percpu();
    if spec.max_entries > 1 << 30 {
        return None;
    }
    let n_buckets = spec.max_entries.checked_next_power_of_two()?;
    let n_elems = spec.max_entries;
    let ks8 = round_up(spec.key_size as u64, 8);
    let vs8 = round_up(spec.value_size as u64, 8);
    // Whole cache lines: two keys' elements never share a line (threads writing their own
    // keys, as each thread's `start[tid]`, would pass it back and forth), and an element of
    // up to 64 bytes is one line.
    let elem_size = round_up(E_KEY as u64 + ks8 + if percpu { 0 } else { 2 * vs8 }, 64);
    let lists_off = round_up(DATA_OFF as u64 + BUCKET_SIZE as u64 * n_buckets as u64, 64);
    let elems_off = lists_off + LIST_SIZE as u64 * nr_cpus as u64;
    let pcpu_off = round_up(elems_off.checked_add(elem_size.checked_mul(n_elems as u64)?)?, 64);
    let pcpu_stride = if percpu { round_up(vs8.checked_mul(n_elems as u64)?, 64) } else { 0 };
    let size = round_up(pcpu_off.checked_add(pcpu_stride.checked_mul(nr_cpus as u64)?)?, PAGE_SIZE as u64);
    if size > MAX_MAP_FILE_SIZE {
        return None;
    }
    Some(Geometry {
        n_buckets,
        n_elems,
        elem_size: elem_size as usize,
        lists_off: lists_off as usize,
        elems_off: elems_off as usize,
        pcpu_off: pcpu_off as usize,
        pcpu_stride: pcpu_stride as usize,
        size,
    })
}

pub struct HashMap {
    base: Base,
    percpu: bool,
    lru: bool,
    ids: bool,
    ks: usize,
    vs: usize,
    vs8: usize,
    val_off: usize,
    elem_size: usize,
    n_elems: u32,
    n_buckets: u32,
    mask: u32,
    max: u32,
    nr_cpus: u32,
    seed: u64,
    buckets: *mut u8,
    lists: *mut u8,
    elems: *mut u8,
    pcpu: *mut u8,
    pcpu_stride: usize,
}

// SAFETY: the raw pointers point into `base.shm`, which is Send + Sync and lives as long as
// the struct; shared state is accessed through atomics and the bucket locks.
unsafe impl Send for HashMap {}
// SAFETY: as above.
unsafe impl Sync for HashMap {}

impl HashMap {
    pub(crate) fn check(spec: &MapSpec) -> Result<(), MapError> {
        let t = spec.map_type;
        let percpu = t.is_percpu();
        let lru = matches!(t, MapType::BPF_MAP_TYPE_LRU_HASH | MapType::BPF_MAP_TYPE_LRU_PERCPU_HASH);
        let f = spec.map_flags;
        if t == MapType::BPF_MAP_TYPE_HASH_OF_MAPS && spec.value_size != 4 {
            return Err(einval("hash of maps holds 4-byte ids"));
        }
        if f & !HTAB_CREATE_FLAG_MASK != 0 || !access_ok(f) {
            return Err(einval("invalid hash map flags"));
        }
        if !lru && f & BPF_F_NO_COMMON_LRU != 0 {
            return Err(einval("BPF_F_NO_COMMON_LRU is for LRU maps"));
        }
        if lru && f & BPF_F_NO_PREALLOC != 0 {
            return Err(MapError::new(ENOTSUPP, "LRU maps are always preallocated"));
        }
        if f & BPF_F_NUMA_NODE != 0 && (percpu || f & BPF_F_NO_COMMON_LRU != 0) {
            return Err(einval("BPF_F_NUMA_NODE with per-CPU storage"));
        }
        if spec.max_entries == 0 || spec.key_size == 0 || spec.value_size == 0 {
            return Err(einval("invalid hash map sizes"));
        }
        if spec.key_size as u64 + spec.value_size as u64 >= KMALLOC_MAX_SIZE - KERNEL_HTAB_ELEM {
            return Err(e2big("key and value too large"));
        }
        if percpu && round_up(spec.value_size as u64, 8) > PCPU_MIN_UNIT_SIZE {
            return Err(e2big("per-CPU value too large"));
        }
        Ok(())
    }

    pub(crate) fn file_size(spec: &MapSpec, nr_cpus: u32) -> Option<u64> {
        geometry(spec, nr_cpus).map(|g| g.size)
    }

    fn from_base(base: Base) -> HashMap {
        let spec = &base.spec;
        // The layout was checked by Map::create/open before this is called.
        let g = geometry(spec, base.nr_cpus).unwrap_or(Geometry {
            n_buckets: 1,
            n_elems: 0,
            elem_size: 16,
            lists_off: DATA_OFF,
            elems_off: DATA_OFF,
            pcpu_off: DATA_OFF,
            pcpu_stride: 0,
            size: 0,
        });
        let t = spec.map_type;
        // SAFETY: offsets computed by the layout that sized the file.
        let (buckets, lists, elems, pcpu) =
            unsafe { (base.at(DATA_OFF), base.at(g.lists_off), base.at(g.elems_off), base.at(g.pcpu_off)) };
        // SAFETY: H_SEED is an aligned field of the type header in the first page.
        let seed = unsafe { a64(base.at(H_SEED)) }.load(Relaxed);
        HashMap {
            percpu: t.is_percpu(),
            lru: matches!(t, MapType::BPF_MAP_TYPE_LRU_HASH | MapType::BPF_MAP_TYPE_LRU_PERCPU_HASH),
            ids: t == MapType::BPF_MAP_TYPE_HASH_OF_MAPS,
            ks: spec.key_size as usize,
            vs: spec.value_size as usize,
            vs8: round8(spec.value_size as usize),
            val_off: E_KEY + round8(spec.key_size as usize),
            elem_size: g.elem_size,
            n_elems: g.n_elems,
            n_buckets: g.n_buckets,
            mask: g.n_buckets - 1,
            max: spec.max_entries,
            nr_cpus: base.nr_cpus,
            seed,
            buckets,
            lists,
            elems,
            pcpu,
            pcpu_stride: g.pcpu_stride,
            base,
        }
    }

    pub(crate) fn create(base: Base) -> Result<HashMap, MapError> {
        let mut seed = 0u64;
        if base.spec.map_flags & BPF_F_ZERO_SEED == 0 {
            let mut b = [0u8; 8];
            // SAFETY: getrandom writes at most 8 bytes into the local buffer.
            let r = unsafe { libc::getrandom(b.as_mut_ptr().cast(), 8, 0) };
            seed = if r == 8 {
                u64::from_ne_bytes(b)
            } else {
                // No entropy source: fall back on the clock and the pid.
                let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
                (t as u64) ^ ((std::process::id() as u64) << 32)
            };
        }
        // SAFETY: H_SEED is an aligned field of the type header in the first page.
        unsafe { a64(base.at(H_SEED)) }.store(seed, Relaxed);
        let m = HashMap::from_base(base);
        // SAFETY: every index below is < n_buckets or < n_elems, inside the layout.
        unsafe {
            for b in 0..m.n_buckets {
                m.head(b).store(NULLS | b, Relaxed);
            }
            for i in 0..m.n_elems {
                a32(m.elem(i).add(E_NEXT)).store(NIL, Relaxed);
            }
            // Each CPU's lists get a contiguous share of each pool (as the kernel's
            // pcpu_freelist_populate), so the elements a CPU cycles through share no cache
            // line with another CPU's but at the shares' edges.
            let nr = m.nr_cpus as u64;
            for c in 0..nr {
                let a = (m.n_elems as u64 * c / nr) as u32;
                let z = (m.n_elems as u64 * (c + 1) / nr) as u32;
                for i in a..z {
                    a32(m.elem(i).add(E_FLINK)).store(if i + 1 < z { i + 1 } else { NIL }, Relaxed);
                }
                m.free_head(c as usize).store(if a < z { a as u64 } else { NIL as u64 }, Relaxed);
            }
            std::sync::atomic::fence(Release);
        }
        Ok(m)
    }

    pub(crate) fn open(base: Base) -> HashMap {
        HashMap::from_base(base)
    }

    pub(crate) fn base(&self) -> &Base {
        &self.base
    }

    // ---- layout accessors ----

    #[inline(always)]
    fn head(&self, b: u32) -> &AtomicU32 {
        // SAFETY: callers pass b <= mask < n_buckets; bucket b's head is at 8b + 4, aligned.
        unsafe { a32(self.buckets.add(BUCKET_SIZE * (b & self.mask) as usize + 4)) }
    }
    #[inline(always)]
    fn lock_word(&self, b: u32) -> &AtomicU32 {
        // SAFETY: as in `head`; the lock word is at 8b.
        unsafe { a32(self.buckets.add(BUCKET_SIZE * (b & self.mask) as usize)) }
    }
    /// CPU `c`'s list record.
    #[inline(always)]
    fn list(&self, c: usize) -> *mut u8 {
        // SAFETY: c < nr_cpus (callers: `home` or a loop bound): inside the list records.
        unsafe { self.lists.add(LIST_SIZE * c) }
    }
    #[inline(always)]
    fn free_head(&self, c: usize) -> &AtomicU64 {
        // SAFETY: an aligned field of CPU c's list record.
        unsafe { a64(self.list(c).add(L_FREE)) }
    }
    #[inline(always)]
    fn hand(&self) -> &AtomicU32 {
        // SAFETY: aligned field of the type header.
        unsafe { a32(self.base.at(H_HAND)) }
    }

    /// The next position of the CLOCK sweep for an eviction by this thread: the sweep is one
    /// hand over every element, as CLOCK's, but each thread takes [`SWEEP_STRETCH`] positions
    /// of it at a time and steps through them in its own thread-local words
    /// (`sync::sweep_stretch`), so threads evicting at once pass the hand's cache line back
    /// and forth once every stretch instead of at every step, and sweep different elements. A
    /// thread that evicts from another map meanwhile takes a new stretch (skipping the rest of
    /// the old one, which the next round of the hand covers).
    fn sweep_step(&self) -> u32 {
        let me = self.buckets as u64;
        let (map, pos, end) = sweep_stretch();
        if map == me && pos != end {
            set_sweep_stretch(me, pos.wrapping_add(1), end);
            return pos;
        }
        let start = self.hand().fetch_add(SWEEP_STRETCH, Relaxed);
        set_sweep_stretch(me, start.wrapping_add(1), start.wrapping_add(SWEEP_STRETCH));
        start
    }

    /// Element `i`.
    ///
    /// # Safety
    /// `i < n_elems`.
    #[inline(always)]
    unsafe fn elem(&self, i: u32) -> *mut u8 {
        // SAFETY: i < n_elems (caller): inside the element array.
        unsafe { self.elems.add(i as usize * self.elem_size) }
    }
    /// # Safety
    /// `i < n_elems`.
    #[inline(always)]
    unsafe fn next(&self, i: u32) -> &AtomicU32 {
        // SAFETY: field of element i (caller: i < n_elems), aligned.
        unsafe { a32(self.elem(i).add(E_NEXT)) }
    }
    /// Value of element `i` for `cpu` (ignored unless per-CPU).
    ///
    /// # Safety
    /// `i < n_elems`, `cpu < nr_cpus`.
    #[inline(always)]
    unsafe fn val(&self, i: u32, cpu: usize) -> *mut u8 {
        // SAFETY: inside the element array or the per-CPU regions (caller's bounds).
        unsafe {
            if self.percpu {
                self.pcpu.add(cpu * self.pcpu_stride + i as usize * self.vs8)
            } else {
                self.vslot(i, self.sel(i).load(Acquire) & 1)
            }
        }
    }
    #[inline(always)]
    fn cpu(&self, cpu: u32) -> usize {
        (if cpu < self.nr_cpus { cpu } else { cpu % self.nr_cpus }) as usize
    }

    /// CPU `c`'s free list.
    #[inline(always)]
    fn freelist<'a>(&'a self, c: usize) -> FreeList<'a, impl Fn(u32) -> Option<&'a AtomicU32> + 'a> {
        FreeList {
            head: self.free_head(c),
            // SAFETY: i < n_elems is checked; flink is an aligned field of the element.
            link: move |i: u32| (i < self.n_elems).then(|| unsafe { a32(self.elem(i).add(E_FLINK)) }),
        }
    }

    /// A free element: from `home`'s list, else taken from the other CPUs' lists in turn
    /// (as the kernel's pcpu_freelist_pop); None when every list is empty.
    #[inline]
    fn pop(&self, home: usize) -> Option<u32> {
        if let Some(i) = self.freelist(home).pop() {
            return Some(i);
        }
        self.steal(home)
    }

    #[cold]
    fn steal(&self, home: usize) -> Option<u32> {
        let nr = self.nr_cpus as usize;
        (1..nr).find_map(|k| self.freelist((home + k) % nr).pop())
    }

    /// Gives element `i` back to `home`'s free list.
    #[inline]
    fn push(&self, home: usize, i: u32) {
        self.freelist(home).push(i);
    }

    /// Element `i`'s lock (held by whoever writes its value in place or unlinks it).
    ///
    /// # Safety
    /// `i < n_elems`.
    #[inline(always)]
    unsafe fn elock(&self, i: u32) -> SpinLock<'_> {
        // SAFETY: an aligned field of element i (caller: i < n_elems).
        SpinLock::new(unsafe { a32(self.elem(i).add(E_LOCK)) })
    }
    /// # Safety
    /// `i < n_elems`.
    #[inline(always)]
    unsafe fn sel(&self, i: u32) -> &AtomicU8 {
        // SAFETY: a field of element i (caller: i < n_elems).
        unsafe { a8(self.elem(i).add(E_SEL)) }
    }
    /// # Safety
    /// `i < n_elems`.
    #[inline(always)]
    unsafe fn seq(&self, i: u32) -> &AtomicU32 {
        // SAFETY: an aligned field of element i (caller: i < n_elems).
        unsafe { a32(self.elem(i).add(E_SEQ)) }
    }
    /// Value slot `s` (0 or 1) of element `i` of a map that is not per-CPU.
    ///
    /// # Safety
    /// `i < n_elems`, `s < 2`.
    #[inline(always)]
    unsafe fn vslot(&self, i: u32, s: u8) -> *mut u8 {
        // SAFETY: inside element i (caller's bounds).
        unsafe { self.elem(i).add(self.val_off + s as usize * self.vs8) }
    }

    /// The list record an operation that holds no CPU slot uses (the syscall side, the
    /// helpers' update and delete): that of the CPU the thread runs on (as the kernel's this_cpu).
    /// Threads running at the same time are on different CPUs, so they work on different
    /// lists; a thread migrated in the middle of an operation only uses another CPU's list,
    /// which is correct too (every list is lock-free). A program's insert or delete uses its
    /// run's CPU slot instead (no `sched_getcpu`; runs at the same time hold different slots).
    #[inline]
    fn home(&self) -> usize {
        let c = current_cpu();
        (if c < self.nr_cpus { c } else { c % self.nr_cpus }) as usize
    }

    /// The key's hash. Specialised for the common key sizes 4, 8 and 16: the same function
    /// (`hash_key`, so files stay readable by every build), with the length a constant so
    /// that it compiles to fixed-size loads and no loop.
    ///
    /// # Safety
    /// `key` readable for key_size bytes.
    #[inline(always)]
    unsafe fn hash(&self, key: *const u8) -> u32 {
        // SAFETY: forwarded; each arm's constant is key_size.
        unsafe {
            match self.ks {
                4 => hash_key(key, 4, self.seed),
                8 => hash_key(key, 8, self.seed),
                16 => hash_key(key, 16, self.seed),
                n => hash_key(key, n, self.seed),
            }
        }
    }

    /// Whether element `e`'s key is `key`; fixed-size compares for key sizes 4, 8 and 16.
    ///
    /// # Safety
    /// `e` an element; `key` readable for key_size bytes.
    #[inline(always)]
    unsafe fn key_eq(&self, e: *mut u8, key: *const u8) -> bool {
        // SAFETY: forwarded; each arm's constant is key_size.
        unsafe {
            match self.ks {
                4 => eq(e.add(E_KEY), key, 4),
                8 => eq(e.add(E_KEY), key, 8),
                16 => eq(e.add(E_KEY), key, 16),
                n => eq(e.add(E_KEY), key, n),
            }
        }
    }

    /// `hash` for a key size known at compile time (`N`, or 0: key_size).
    ///
    /// # Safety
    /// `key` readable for key_size bytes; `N` is 0 or key_size.
    #[inline(always)]
    unsafe fn hash_n<const N: usize>(&self, key: *const u8) -> u32 {
        // SAFETY: forwarded.
        unsafe { if N == 0 { self.hash(key) } else { hash_key(key, N, self.seed) } }
    }

    /// `key_eq` for a key size known at compile time (`N`, or 0: key_size).
    ///
    /// # Safety
    /// As for `key_eq`; `N` is 0 or key_size.
    #[inline(always)]
    unsafe fn key_eq_n<const N: usize>(&self, e: *mut u8, key: *const u8) -> bool {
        // SAFETY: forwarded.
        unsafe { if N == 0 { self.key_eq(e, key) } else { eq(e.add(E_KEY), key, N) } }
    }

    /// Lock-free search: the element holding `key` (linked, or deleted and not yet freed: the
    /// caller reads its state), NIL when the key's chain holds none, or UNSURE when the search
    /// gave up (see `UNSURE`).
    ///
    /// # Safety
    /// `key` readable for key_size bytes.
    #[inline(always)]
    unsafe fn find(&self, key: *const u8, h: u32) -> u32 {
        // SAFETY: forwarded; each arm's constant is key_size.
        unsafe {
            match self.ks {
                4 => self.find_n::<4>(key, h),
                8 => self.find_n::<8>(key, h),
                16 => self.find_n::<16>(key, h),
                _ => self.find_n::<0>(key, h),
            }
        }
    }

    /// `find` for a key size known at compile time (`N`, or 0: key_size).
    ///
    /// # Safety
    /// `key` readable for key_size bytes; `N` is 0 or key_size.
    #[inline(always)]
    unsafe fn find_n<const N: usize>(&self, key: *const u8, h: u32) -> u32 {
        let ks = if N == 0 { self.ks } else { N };
        let b = h & self.mask;
        for _ in 0..4 {
            let mut cur = self.head(b).load(Acquire);
            let mut steps = self.n_elems;
            while cur & NULLS == 0 {
                if cur >= self.n_elems || steps == 0 {
                    return UNSURE;
                }
                steps -= 1;
                // SAFETY: cur < n_elems; fields are aligned; key readable (caller).
                unsafe {
                    let e = self.elem(cur);
                    // Keys of one word: comparing the key is as cheap as comparing the
                    // stored hash, and equal keys have equal hashes.
                    let hash_ok = N == 4 || N == 8 || a32(e.add(E_HASH)).load(Relaxed) == h;
                    if hash_ok && eq(e.add(E_KEY), key, ks) {
                        return cur;
                    }
                    cur = self.next(cur).load(Acquire);
                }
            }
            if cur == NULLS | b {
                return NIL;
            }
        }
        UNSURE
    }

    /// Search under bucket `b`'s lock, for a key size known at compile time (`N`, or 0:
    /// key_size): (predecessor or NIL for the head, element).
    ///
    /// # Safety
    /// `key` readable for key_size bytes; the caller holds `b`'s lock; `N` is 0 or key_size.
    #[inline(always)]
    unsafe fn find_locked<const N: usize>(&self, b: u32, key: *const u8, h: u32) -> Option<(u32, u32)> {
        // SAFETY: forwarded.
        let w = unsafe { self.scan_locked::<N>(b, key, h) };
        (w.found != NIL).then_some((w.prev, w.found))
    }

    /// The link that points at the element after `prev` (the head if `prev` is NIL).
    ///
    /// # Safety
    /// `prev` is NIL or < n_elems.
    unsafe fn slot(&self, b: u32, prev: u32) -> &AtomicU32 {
        if prev == NIL {
            self.head(b)
        } else {
            // SAFETY: prev < n_elems (caller).
            unsafe { self.next(prev) }
        }
    }

    /// Unlinks element `i` whose predecessor is `prev`, under `b`'s lock.
    ///
    /// # Safety
    /// `i < n_elems`, `prev` NIL or < n_elems; the caller holds `b`'s lock.
    #[inline(always)]
    unsafe fn unlink(&self, b: u32, prev: u32, i: u32) {
        // SAFETY: bounds from the caller.
        unsafe {
            let e = self.elem(i);
            let nxt = a32(e.add(E_NEXT)).load(Relaxed);
            self.slot(b, prev).store(nxt, Release);
            a8(e.add(E_STATE)).store(FREE, Relaxed);
        }
    }

    /// Writes `src` into element `i`'s value(s), under its lock or before it is published.
    /// `fresh`: a new element (a per-CPU update of one CPU zeroes the others).
    ///
    /// Maps that are not per-CPU: the value goes into the slot readers are not directed to,
    /// then one release store of `sel` directs them there (a reader sees the old or the new
    /// value, never a mix, as the kernel's replacement of the element gives), after `seq`
    /// counts the update so that a copying reader can tell the slot it read was rewritten.
    ///
    /// # Safety
    /// `i < n_elems`; `src` readable as its variant says; the caller holds `i`'s lock or
    /// owns the unpublished element.
    #[inline(always)]
    unsafe fn write_value(&self, i: u32, src: Src, fresh: bool) {
        // SAFETY: i < n_elems, cpu < nr_cpus; sources readable (caller).
        unsafe {
            if !self.percpu {
                let p = match src {
                    Src::Cpu(p, _) | Src::All(p) => p,
                };
                let e = self.elem(i);
                let seq = a32(e.add(E_SEQ));
                seq.store(seq.load(Relaxed).wrapping_add(1), Relaxed);
                fence(Release);
                let sel = a8(e.add(E_SEL));
                let s = if fresh { 1 } else { sel.load(Relaxed) & 1 };
                self.copy_value(e.add(self.val_off + (s ^ 1) as usize * self.vs8), p);
                sel.store(s ^ 1, Release);
                return;
            }
            self.write_percpu(i, src, fresh);
        }
    }

    /// A value of value_size bytes into shared memory at `dst`: one word store for 8-byte
    /// values (sslsniff's, bpftrace's), else `copy_in`.
    ///
    /// # Safety
    /// As for `copy_in` with value_size bytes.
    #[inline(always)]
    unsafe fn copy_value(&self, dst: *mut u8, src: *const u8) {
        // SAFETY: forwarded (value_size is 8 in the first arm).
        unsafe {
            if self.vs == 8 {
                a64(dst).store(read_word(src), Relaxed);
            } else {
                copy_in(dst, src, self.vs);
            }
        }
    }

    /// `write_value` for per-CPU maps.
    ///
    /// # Safety
    /// As for `write_value`.
    unsafe fn write_percpu(&self, i: u32, src: Src, fresh: bool) {
        // SAFETY: i < n_elems, cpu < nr_cpus; sources readable (caller).
        unsafe {
            match src {
                Src::Cpu(p, c) => {
                    if fresh {
                        // CPU 0's value, then one region further for each CPU.
                        let mut v = self.pcpu.add(i as usize * self.vs8);
                        for cpu in 0..self.nr_cpus as usize {
                            if cpu == c {
                                self.copy_value(v, p);
                            } else {
                                zero(v, self.vs);
                            }
                            v = v.add(self.pcpu_stride);
                        }
                    } else {
                        self.copy_value(self.val(i, c), p);
                    }
                }
                Src::All(p) => {
                    // Whole rounded slots, padding included, as the kernel's
                    // copy_map_value_long.
                    for cpu in 0..self.nr_cpus as usize {
                        copy_in(self.val(i, cpu), p.add(cpu * self.vs8), self.vs8);
                    }
                }
            }
        }
    }

    /// Copies element `i`'s value(s) out: per-CPU maps nr_cpus × vs8 bytes.
    ///
    /// # Safety
    /// `i < n_elems`; `out` writable for value_buf_size bytes.
    unsafe fn read_value(&self, i: u32, out: *mut u8) {
        // SAFETY: bounds from the caller.
        unsafe {
            if self.percpu {
                for cpu in 0..self.nr_cpus as usize {
                    copy_out(self.val(i, cpu), out.add(cpu * self.vs8), self.vs8);
                }
            } else {
                copy_out(self.val(i, 0), out, self.vs);
            }
        }
    }

    /// Fills a free element with key, hash and value (not yet published, not yet marked
    /// linked: the insert does both, in that order).
    ///
    /// # Safety
    /// `n < n_elems` owned by the caller; `key`, `src` readable; `N` is 0 or key_size.
    #[inline(always)]
    unsafe fn fill<const N: usize>(&self, n: u32, key: *const u8, h: u32, src: Src) {
        // SAFETY: bounds from the caller.
        unsafe {
            let e = self.elem(n);
            copy_in(e.add(E_KEY), key, if N == 0 { self.ks } else { N });
            a32(e.add(E_HASH)).store(h, Relaxed);
            self.write_value(n, src, true);
            // Not yet used: a program's lookup marks it (as the kernel's LRU nodes start
            // without their ref bit).
            a8(e.add(E_REF)).store(0, Relaxed);
        }
    }

    /// A free element for a new key, under `held`'s lock: from the free pool (which holds
    /// max_entries elements less the linked and the deleted ones still in their chains), or
    /// one of those deleted ones, or (LRU) evicted from the least recently used.
    #[inline(always)]
    fn take_for_insert(&self, held: u32, home: usize) -> Result<u32, MapError> {
        match self.pop(home) {
            Some(n) => Ok(n),
            None => self.take_when_empty(held),
        }
    }

    /// `take_for_insert` when every free list is empty: (LRU) an eviction, else a deleted
    /// element still in its chain, else `E2BIG`.
    #[cold]
    #[inline(never)]
    fn take_when_empty(&self, held: u32) -> Result<u32, MapError> {
        if self.lru {
            return self.evict(held).ok_or(MapError::new(libc::ENOMEM, "no LRU element could be evicted"));
        }
        self.take_deleted(held).ok_or_else(|| e2big("hash map is full"))
    }

    /// A deleted element unlinked for a new key when every free list is empty: one the CPU
    /// slots' rings name (every element programs deleted is in one, unless two threads
    /// wrote a ring at once), else one found by a search of every element. So that inserts
    /// into a map that is really full (tools whose maps fill up try on every hit) do not each
    /// read every element, a search that found none stands for `SWEEP_EVERY_NS` (an element
    /// lost from the rings in that time waits for the next search). An element whose locks
    /// another thread holds at that moment is passed over.
    fn take_deleted(&self, held: u32) -> Option<u32> {
        let ringed = (0..self.nr_cpus as usize).flat_map(|c| {
            let rec = self.list(c);
            // SAFETY: aligned u32 fields of CPU c's list record.
            (0..RING).map(move |k| unsafe { a32(rec.add(L_RING + 4 * k as usize)) }.load(Relaxed))
        });
        for tag in ringed {
            let i = tag.wrapping_sub(1);
            if i < self.n_elems
                // SAFETY: i < n_elems, checked first.
                && unsafe { a8(self.elem(i).add(E_STATE)) }.load(Relaxed) == DELETED
                && self.try_unlink(i, held, Wait::Try, true)
            {
                return Some(i);
            }
        }
        let now = monotonic_ns();
        // SAFETY: an aligned field of the type header.
        let swept = unsafe { a64(self.base.at(H_SWEPT)) };
        if now < swept.load(Relaxed) {
            return None;
        }
        let found = (0..self.n_elems).find(|&i| {
            // SAFETY: i < n_elems.
            unsafe { a8(self.elem(i).add(E_STATE)) }.load(Relaxed) == DELETED
                && self.try_unlink(i, held, Wait::Try, true)
        });
        if found.is_none() {
            swept.store(now + SWEEP_EVERY_NS, Relaxed);
        }
        found
    }

    /// CLOCK eviction (LRU types): unlinks an element not recently used and returns it (it
    /// stays counted: it becomes the new key's).
    fn evict(&self, held: u32) -> Option<u32> {
        let n = self.n_elems;
        let mut fallback = NIL;
        for _ in 0..n.min(128) * 2 + 8 {
            let i = self.sweep_step() % n;
            // SAFETY: i < n_elems.
            let e = unsafe { self.elem(i) };
            // SAFETY: fields of element i.
            let (state, r) = unsafe { (a8(e.add(E_STATE)), a8(e.add(E_REF))) };
            if state.load(Relaxed) != LINKED {
                continue;
            }
            if r.load(Relaxed) != 0 {
                r.store(0, Relaxed);
                if fallback == NIL {
                    fallback = i;
                }
                continue;
            }
            if self.try_unlink(i, held, Wait::Try, false) {
                return Some(i);
            }
        }
        if fallback != NIL && self.try_unlink(fallback, held, Wait::Try, false) {
            return Some(fallback);
        }
        (0..n).find(|&i| {
            // SAFETY: i < n_elems.
            unsafe { a8(self.elem(i).add(E_STATE)) }.load(Relaxed) == LINKED
                && self.try_unlink(i, held, Wait::Try, false)
        })
    }

    /// Unlinks element `i` if it is in its bucket's chain (and, with `deleted`, still
    /// deleted), taking that bucket's lock unless it is `held` (already ours; NIL: none),
    /// then the element's, each waiting as `wait` says (evictions: a single try, so that two
    /// inserters holding their buckets never wait for each other).
    fn try_unlink(&self, i: u32, held: u32, wait: Wait, deleted: bool) -> bool {
        // SAFETY: i < n_elems (callers).
        let h = unsafe { a32(self.elem(i).add(E_HASH)) }.load(Relaxed);
        let b = h & self.mask;
        let _guard = if b == held {
            None
        } else {
            match SpinLock::new(self.lock_word(b)).lock(wait) {
                Ok(g) => Some(g),
                Err(_) => return false,
            }
        };
        let Some(prev) = self.predecessor(b, i) else { return false };
        // A victim whose value is being written in place is passed over.
        // SAFETY: i < n_elems.
        let Ok(_e) = (unsafe { self.elock(i) }).lock(wait) else { return false };
        // SAFETY: a field of element i.
        let state = unsafe { a8(self.elem(i).add(E_STATE)) }.load(Relaxed);
        if state == FREE || deleted && state != DELETED {
            return false;
        }
        // SAFETY: i and prev are elements of b's chain; we hold b's and i's locks.
        unsafe { self.unlink(b, prev, i) };
        true
    }

    /// Element `i`'s predecessor in bucket `b`'s chain (NIL: the head), None if `i` is not
    /// in it. The caller holds `b`'s lock.
    fn predecessor(&self, b: u32, i: u32) -> Option<u32> {
        let mut prev = NIL;
        let mut cur = self.head(b).load(Relaxed);
        let mut steps = self.n_elems;
        while cur < self.n_elems && steps > 0 {
            if cur == i {
                return Some(prev);
            }
            steps -= 1;
            prev = cur;
            // SAFETY: cur < n_elems.
            cur = unsafe { self.next(cur) }.load(Relaxed);
        }
        None
    }

    /// An update aimed at element `i`, found holding `key` (by a search, the thread's memo,
    /// or under the bucket's lock), under the element's lock: a linked element's value is
    /// written in place (`BPF_NOEXIST`: `EEXIST`); a deleted one takes the key back, with the
    /// new value, in place (`BPF_EXIST`: `ENOENT`). Ok(false) when the element no longer
    /// holds the key (freed or reused meanwhile: the caller searches again). `h`: the key's
    /// hash, compared first when known (equal keys have equal hashes, so the key's comparison
    /// alone decides).
    ///
    /// # Safety
    /// `i < n_elems`; `key` readable for key_size bytes, `src` as its variant says; `N` is 0 or
    /// key_size.
    #[inline(always)]
    unsafe fn update_found<const N: usize>(
        &self,
        i: u32,
        key: *const u8,
        h: Option<u32>,
        src: Src,
        flags: u64,
        wait: Wait,
    ) -> Result<bool, MapError> {
        // SAFETY: bounds from the caller.
        unsafe {
            let _e = self.elock(i).lock(wait)?;
            let e = self.elem(i);
            // Unlinking (which marks the element free), deleting and taking a deleted element
            // back happen under this lock, and so does giving a deleted element another key
            // (under its bucket's lock too): an element holding our key, linked or deleted,
            // stays in its chain, in that state and with that key until we unlock.
            let state = a8(e.add(E_STATE)).load(Acquire);
            if state == FREE || h.is_some_and(|h| a32(e.add(E_HASH)).load(Relaxed) != h) || !self.key_eq_n::<N>(e, key)
            {
                return Ok(false);
            }
            if state == LINKED {
                if flags == BPF_NOEXIST {
                    return Err(EEXIST);
                }
                self.write_value(i, src, false);
            } else {
                if flags == BPF_EXIST {
                    return Err(ENOENT);
                }
                // A new element for the key, as an insert's (per-CPU: the other CPUs'
                // values zeroed; LRU: not yet used), then visible to searches again.
                self.write_value(i, src, true);
                a8(e.add(E_REF)).store(0, Relaxed);
                a8(e.add(E_STATE)).store(LINKED, Release);
            }
        }
        Ok(true)
    }

    /// Bucket `b`'s chain under its lock: the element holding `key` (linked or deleted) and
    /// its predecessor, and the first deleted element holding another key before it.
    ///
    /// # Safety
    /// `key` readable for key_size bytes; the caller holds `b`'s lock; `N` is 0 or key_size.
    #[inline(always)]
    unsafe fn scan_locked<const N: usize>(&self, b: u32, key: *const u8, h: u32) -> Scan {
        let mut w = Scan { prev: NIL, found: NIL, spare: NIL };
        let mut cur = self.head(b).load(Relaxed);
        let mut steps = self.n_elems;
        // n_elems <= 2^30: an index below it is no nulls marker.
        while cur < self.n_elems && steps > 0 {
            steps -= 1;
            // SAFETY: cur < n_elems; key readable (caller).
            unsafe {
                let e = self.elem(cur);
                // Keys of one word: the key's comparison is as cheap as the hash's.
                let hash_ok = N == 4 || N == 8 || a32(e.add(E_HASH)).load(Relaxed) == h;
                if hash_ok && self.key_eq_n::<N>(e, key) {
                    w.found = cur;
                    return w;
                }
                if w.spare == NIL && a8(e.add(E_STATE)).load(Relaxed) == DELETED {
                    w.spare = cur;
                }
                w.prev = cur;
                cur = a32(e.add(E_NEXT)).load(Relaxed);
            }
        }
        w
    }

    /// The update every entry point shares.
    ///
    /// A program's update of an existing key first tries the element the thread's last
    /// program-side lookup found (the thread's lookup memo, `sync::lookup_memo`): programs
    /// typically look a key up, compute, then update the same key (bpftrace's `count()`,
    /// `sum()`, `hist()` on keyed maps do), and the element is then written without hashing
    /// the key and walking its chain again; or look it up, delete it, then insert it again
    /// (sslsniff's `start_ns[tid]`), and the deleted element takes the key back. The memo is
    /// only a hint: the element is used if, under its lock, it holds the key (as
    /// `update_found` checks the element a search returned), else the update goes the
    /// general way.
    ///
    /// Specialised for a key size known at compile time (`N`, or 0: key_size): the hash,
    /// the searches, the key's copy. Flags other than `BPF_ANY`, `BPF_NOEXIST`, `BPF_EXIST`
    /// and an empty pool are cold calls.
    ///
    /// `home`: the list record a new element comes from (a program's CPU slot), None for the
    /// CPU the thread runs on.
    ///
    /// # Safety
    /// `key` readable for key_size bytes; `src` readable as its variant says; `N` is 0 or
    /// key_size; `home` < nr_cpus.
    #[inline(always)]
    unsafe fn update_impl<const N: usize>(
        &self,
        key: *const u8,
        src: Src,
        flags: u64,
        wait: Wait,
        memo: bool,
        home: Option<usize>,
    ) -> Result<(), MapError> {
        if flags > BPF_EXIST {
            return Err(bad_update_flags(flags));
        }
        if memo && matches!(src, Src::Cpu(..)) {
            // SAFETY: key readable for key_size bytes (caller).
            let i = unsafe { self.memo_elem::<N>(key) };
            // SAFETY: i < n_elems (memo_elem); key and src readable (caller).
            if i != NIL && unsafe { self.update_found::<N>(i, key, None, src, flags, wait) }? {
                return Ok(());
            }
        }
        // SAFETY: key readable (caller).
        let h = unsafe { self.hash_n::<N>(key) };
        // The key's element, linked or deleted: found without a lock, written (or taken back)
        // under its element's lock. The bucket's cache line is only read, so threads updating
        // different keys do not pass it back and forth. Not for `BPF_NOEXIST`, whose key is
        // usually absent: its search under the bucket's lock finds a deleted element as well.
        for _ in 0..if flags == BPF_NOEXIST { 0 } else { 4 } {
            // SAFETY: key readable (caller).
            let i = unsafe { if N == 0 { self.find(key, h) } else { self.find_n::<N>(key, h) } };
            if i >= self.n_elems {
                break;
            }
            // SAFETY: i < n_elems; key and src readable (caller).
            if unsafe { self.update_found::<N>(i, key, Some(h), src, flags, wait) }? {
                return Ok(());
            }
        }
        let b = h & self.mask;
        let _guard = SpinLock::new(self.lock_word(b)).lock(wait)?;
        // SAFETY: we hold b's lock; key readable.
        let Scan { found: old, spare, .. } = unsafe { self.scan_locked::<N>(b, key, h) };
        if old != NIL {
            // Inserted (or deleted) meanwhile by another thread. In b's chain, which we hold,
            // with our key: `update_found` cannot find it changed.
            // SAFETY: old < n_elems; src readable.
            return match unsafe { self.update_found::<N>(old, key, Some(h), src, flags, wait) }? {
                true => Ok(()),
                false => Err(MapError::new(libc::EAGAIN, "hash element changed under its bucket's lock")),
            };
        }
        if flags == BPF_EXIST {
            return Err(ENOENT);
        }
        if spare != NIL {
            // A deleted element of this chain takes the new key where it is: no free list.
            // SAFETY: spare < n_elems, in b's chain, which we hold.
            unsafe {
                let _e = self.elock(spare).lock(wait)?;
                // Still deleted: not taken back meanwhile by a lock-free insert of its key.
                if a8(self.elem(spare).add(E_STATE)).load(Acquire) == DELETED {
                    self.fill::<N>(spare, key, h, src);
                    // As an insert's: marked linked once it holds the new key and value.
                    a8(self.elem(spare).add(E_STATE)).store(LINKED, Release);
                    return Ok(());
                }
            }
        }
        // A program's run holds its CPU slot: that slot's list (see `home`).
        let n = self.take_for_insert(b, home.unwrap_or_else(|| self.home()))?;
        // SAFETY: n is ours; we hold b's lock, so the head is stable until the store.
        unsafe {
            self.fill::<N>(n, key, h, src);
            let head = self.head(b);
            a32(self.elem(n).add(E_NEXT)).store(head.load(Relaxed), Relaxed);
            head.store(n, Release);
            // Marked linked once reachable, never before: whoever sees LINKED (acquire) with
            // our key sees the key and value written above (not a previous key's bytes) and
            // an element searches can find, which a program's lookup through its memo
            // relies on (an element found LINKED but not yet in its chain would be a key seen
            // before its insert took effect). An updater that finds the element in the chain
            // before this store finds it not linked, retries, then waits for our bucket lock.
            a8(self.elem(n).add(E_STATE)).store(LINKED, Release);
        }
        Ok(())
    }

    /// The element of the thread's lookup memos (see `lookup_n`) holding `key`, linked or
    /// deleted, or NIL: checked without its lock, a hint for `update_found` and
    /// `delete_mark`, which check again under it.
    ///
    /// # Safety
    /// `key` readable for key_size bytes; `N` is 0 or key_size.
    #[inline(always)]
    unsafe fn memo_elem<const N: usize>(&self, key: *const u8) -> u32 {
        let ks = if N == 0 { self.ks } else { N };
        let me = self.memo_id();
        // SAFETY: key readable for ks bytes (caller).
        let word = unsafe { key_word(key, ks) };
        let (map, i, w) = lookup_memo();
        let (map2, i2, w2) = lookup_memo2();
        let i = if map == me && w == word {
            i
        } else if map2 == me && w2 == word {
            i2
        } else {
            return NIL;
        };
        // SAFETY: i < n_elems is checked first; key readable (caller).
        let holds = i < self.n_elems
            && unsafe {
                let e = self.elem(i);
                a8(e.add(E_STATE)).load(Relaxed) != FREE && self.key_eq_n::<N>(e, key)
            };
        if holds { i } else { NIL }
    }

    /// A program's delete (`home`: its CPU slot, or the CPU the thread runs on) from a hash
    /// or per-CPU hash map: the key's
    /// element is marked deleted under its own lock and stays in its chain, no bucket lock
    /// taken and no free list written; the key's next insert takes it back (tracing tools'
    /// `start[tid]`, inserted on entry and deleted on return). It joins `home`'s ring of
    /// deleted elements ([`HashMap::note_deleted`]), which gives the oldest back to the free
    /// list. A search that gave up, LRU maps and hashes of maps take the general way
    /// (`delete_impl`).
    ///
    /// # Safety
    /// `key` readable for key_size bytes; `N` is 0 or key_size; `home` < nr_cpus.
    #[inline(always)]
    unsafe fn delete_mark<const N: usize>(&self, key: *const u8, wait: Wait, home: usize) -> Result<(), MapError> {
        let score = self.score(home);
        let s = score.load(Relaxed);
        if self.ids || self.lru || s >= SCORE_FREE_AT_ONCE {
            // LRU maps free at once: the kernel's evict only when no element is free, and a
            // sweep that met live elements before a deleted one would evict one of them. So
            // do slots whose deleted keys have not been coming back (see `note_deleted`).
            if s >= SCORE_FREE_AT_ONCE {
                score.store(s - 1, Relaxed);
            }
            // SAFETY: forwarded.
            return unsafe { self.delete_impl::<N>(key, std::ptr::null_mut(), wait, Some(home)) };
        }
        // SAFETY: key readable (caller).
        let mut i = unsafe { self.memo_elem::<N>(key) };
        let mut h = None;
        for _ in 0..4 {
            if i == NIL {
                // SAFETY: key readable (caller).
                let hk = unsafe { self.hash_n::<N>(key) };
                h = Some(hk);
                // SAFETY: key readable (caller).
                i = unsafe { if N == 0 { self.find(key, hk) } else { self.find_n::<N>(key, hk) } };
                if i == NIL {
                    return Err(ENOENT);
                }
                if i >= self.n_elems {
                    break;
                }
            }
            // SAFETY: i < n_elems; key readable (caller).
            unsafe {
                let guard = self.elock(i).lock(wait)?;
                let e = self.elem(i);
                let state = a8(e.add(E_STATE)).load(Acquire);
                // As in `update_found`: under its lock an element holding our key stays so.
                if state != FREE
                    && h.is_none_or(|h| a32(e.add(E_HASH)).load(Relaxed) == h)
                    && self.key_eq_n::<N>(e, key)
                {
                    if state == DELETED {
                        return Err(ENOENT);
                    }
                    a8(e.add(E_STATE)).store(DELETED, Release);
                    drop(guard);
                    self.note_deleted(home, i);
                    return Ok(());
                }
            }
            i = NIL;
        }
        // SAFETY: forwarded.
        unsafe { self.delete_impl::<N>(key, std::ptr::null_mut(), wait, Some(home)) }
    }

    /// `home`'s score (see `note_deleted`).
    #[inline(always)]
    fn score(&self, home: usize) -> &AtomicU32 {
        // SAFETY: an aligned u32 field of home's list record (L_SCORE + 4 <= LIST_SIZE).
        unsafe { a32(self.list(home).add(L_SCORE)) }
    }

    /// Records deleted element `i` in `home`'s ring, whose oldest element, if still
    /// deleted, goes back to `home`'s free list (`reclaim`): each CPU slot keeps up to
    /// [`RING`] deleted elements in their chains, so that the free lists do not run dry
    /// when keys do not come back (keys by request, by pointer). Plain loads and stores: the
    /// ring is a hint (two threads using the same record at once may lose an entry, whose
    /// element then waits in its chain for an insert in its bucket or the sweep of a full
    /// map, or record one twice, which `reclaim`'s checks make harmless).
    ///
    /// A deleted element freed by the ring cost its delete more than freeing it at once
    /// (its element lock, then the bucket lock, the element lock and the free list again),
    /// so the slot's score counts them: each adds [`SCORE_WASTED`], a key deleted again
    /// that the ring still holds (its key came back) resets it, and from
    /// [`SCORE_FREE_AT_ONCE`] on the slot's deletes free at once (`delete_mark`), each
    /// taking one off, so that one delete in nine still tries the ring and finds out when
    /// keys come back again.
    #[unsafe(link_section = ".text.hot.userbpf")]
    fn note_deleted(&self, home: usize, i: u32) {
        let rec = self.list(home);
        let tag = i + 1;
        // SAFETY: aligned u32 fields of home's list record (L_RING + 4 * RING <= LIST_SIZE).
        let word = |k: u32| unsafe { a32(rec.add(L_RING + 4 * k as usize)) };
        // SAFETY: as above.
        let pos_word = unsafe { a32(rec.add(L_RING_POS)) };
        let pos = pos_word.load(Relaxed) % RING;
        // The last one recorded first: a thread deleting its own key again (`start[tid]`).
        let last = if pos == 0 { RING - 1 } else { pos - 1 };
        if word(last).load(Relaxed) == tag || (0..RING).any(|k| word(k).load(Relaxed) == tag) {
            let score = self.score(home);
            if score.load(Relaxed) != 0 {
                score.store(0, Relaxed);
            }
            return;
        }
        let old = word(pos).load(Relaxed);
        word(pos).store(tag, Relaxed);
        pos_word.store(if pos + 1 == RING { 0 } else { pos + 1 }, Relaxed);
        if old != 0 && self.reclaim(old - 1, home) {
            let score = self.score(home);
            score.store((score.load(Relaxed) + SCORE_WASTED).min(SCORE_MAX), Relaxed);
        }
    }

    /// Gives deleted element `x` back to `home`'s free list if it is still deleted: unlinked
    /// under its bucket's lock and its own (as a delete that frees at once would). True when
    /// it did.
    #[inline(never)]
    fn reclaim(&self, x: u32, home: usize) -> bool {
        let freed = x < self.n_elems
            // SAFETY: x < n_elems, checked first.
            && unsafe { a8(self.elem(x).add(E_STATE)) }.load(Relaxed) == DELETED
            && self.try_unlink(x, NIL, Wait::Hot, true);
        if freed {
            self.push(home, x);
        }
        freed
    }

    /// Delete that frees the element at once (the syscall side, hashes of maps), optionally
    /// copying the value out first, for a key size known at compile time (`N`, or 0:
    /// key_size). A deleted element of the key still in its chain is freed too (the key is
    /// absent: `ENOENT`). `home`: the list record the freed element goes to (a program's CPU
    /// slot), None for the CPU the thread runs on.
    ///
    /// # Safety
    /// `key` readable; `out` null or writable for value_buf_size bytes; `home` < nr_cpus;
    /// `N` is 0 or key_size.
    #[inline(always)]
    unsafe fn delete_impl<const N: usize>(
        &self,
        key: *const u8,
        out: *mut u8,
        wait: Wait,
        home: Option<usize>,
    ) -> Result<(), MapError> {
        // SAFETY: key readable (caller).
        let h = unsafe { self.hash_n::<N>(key) };
        let b = h & self.mask;
        let guard = SpinLock::new(self.lock_word(b)).lock(wait)?;
        // SAFETY: we hold b's lock.
        let Some((prev, i)) = (unsafe { self.find_locked::<N>(b, key, h) }) else {
            return Err(ENOENT);
        };
        // SAFETY: i/prev in b's chain under its lock; out writable (caller).
        let linked = unsafe {
            let e = self.elock(i).lock(wait)?;
            let linked = a8(self.elem(i).add(E_STATE)).load(Relaxed) == LINKED;
            if linked && !out.is_null() {
                self.read_value(i, out);
            }
            self.unlink(b, prev, i);
            drop(e);
            linked
        };
        drop(guard);
        self.push(home.unwrap_or_else(|| self.home()), i);
        if linked { Ok(()) } else { Err(ENOENT) }
    }

    // ---- program side ----

    /// # Safety
    /// `key` readable for key_size bytes.
    #[inline(always)]
    pub(crate) unsafe fn lookup(&self, key: *const u8, cpu: u32) -> *mut u8 {
        // SAFETY: key readable (caller); each arm's constant is key_size. One dispatch on the
        // key size for both the hash and the search.
        unsafe {
            match self.ks {
                4 => self.lookup_n::<4>(key, cpu),
                8 => self.lookup_n::<8>(key, cpu),
                16 => self.lookup_n::<16>(key, cpu),
                _ => self.lookup_n::<0>(key, cpu),
            }
        }
    }

    /// The map's name in the threads' lookup memos: its hash seed (random per map file), the
    /// same in every process and for every [`HashMap`] of the file. The runtime opens a map
    /// anew for each program that uses it (sslsniff's entry and return programs each have
    /// their own), so the address of this struct would not find a memo another program left.
    /// Two maps may share a seed (`BPF_F_ZERO_SEED`): the memo is a hint whose element is
    /// checked in this map (linked and holding the key, so the key's element of this map),
    /// and a shared name only costs that check.
    #[inline(always)]
    fn memo_id(&self) -> u64 {
        self.seed
    }

    /// Whether a memo's element `i` is the key's: below n_elems, linked (acquire: its key
    /// and value as published) and holding the key.
    ///
    /// # Safety
    /// `key` readable for key_size bytes; `N` is 0 or key_size.
    #[inline(always)]
    unsafe fn memo_holds<const N: usize>(&self, i: u32, key: *const u8) -> bool {
        let ks = if N == 0 { self.ks } else { N };
        // SAFETY: i < n_elems is checked first; key readable for ks bytes (caller).
        i < self.n_elems
            && unsafe {
                let e = self.elem(i);
                a8(e.add(E_STATE)).load(Acquire) == LINKED && eq(e.add(E_KEY), key, ks)
            }
    }

    /// `lookup` for a key size known at compile time (`N`, or 0: key_size).
    ///
    /// # Safety
    /// `key` readable for key_size bytes; `N` is 0 or key_size.
    #[inline(always)]
    unsafe fn lookup_n<const N: usize>(&self, key: *const u8, cpu: u32) -> *mut u8 {
        let ks = if N == 0 { self.ks } else { N };
        let me = self.memo_id();
        let (memo_map, memo, memo_word) = lookup_memo();
        // SAFETY: key readable for ks bytes (caller).
        let word = unsafe { key_word(key, ks) };
        // The thread's last lookup found the key's element, which is still linked and holds
        // it: that element, without hashing and searching again (see the module docs).
        // SAFETY: memo < n_elems is checked first; key readable for ks bytes (caller).
        let i = if memo_map == me && memo_word == word && unsafe { self.memo_holds::<N>(memo, key) } {
            memo
        } else {
            // The thread's memo before its last lookup of another map (two maps looked up in
            // turn, as sslsniff's `bufs` and `start_ns`): the same checks, then it becomes
            // the first memo (the one an update of the key checks).
            let (memo2_map, memo2, memo2_word) = lookup_memo2();
            // SAFETY: key readable for ks bytes (caller).
            if memo2_map == me && memo2_word == word && unsafe { self.memo_holds::<N>(memo2, key) } {
                swap_lookup_memos();
                memo2
            } else {
                // SAFETY: key readable for ks bytes (caller).
                let i = unsafe { self.find_n::<N>(key, hash_key(key, ks, self.seed)) };
                // The key's element may be a deleted one still in its chain (or one whose
                // insert is not done): the key is then absent.
                // SAFETY: i < n_elems is checked first.
                if i >= self.n_elems || unsafe { a8(self.elem(i).add(E_STATE)) }.load(Acquire) != LINKED {
                    return std::ptr::null_mut();
                }
                set_lookup_memo(me, i, word);
                i
            }
        };
        // SAFETY: i < n_elems (the memo's was checked, find returns such indices).
        unsafe {
            if self.lru {
                let r = a8(self.elem(i).add(E_REF));
                if r.load(Relaxed) == 0 {
                    r.store(1, Relaxed);
                }
            }
            self.val(i, self.cpu(cpu))
        }
    }

    /// The helpers' update (`Map::update`). `cpu` is the slot whose per-CPU value is written;
    /// the helpers pass 0 for maps that are not per-CPU, so a new element comes from the free
    /// list of the CPU the thread runs on (`home`), not from `cpu`'s.
    ///
    /// # Safety
    /// `key` readable for key_size bytes, `value` for value_size bytes.
    pub(crate) unsafe fn update(&self, key: *const u8, value: *const u8, flags: u64, cpu: u32) -> Result<(), MapError> {
        // SAFETY: forwarded contract; each arm's constant is key_size.
        unsafe {
            match self.ks {
                4 => self.update_n::<4>(key, value, flags, cpu, true, false),
                8 => self.update_n::<8>(key, value, flags, cpu, true, false),
                16 => self.update_n::<16>(key, value, flags, cpu, true, false),
                _ => self.update_n::<0>(key, value, flags, cpu, true, false),
            }
        }
    }

    /// `update` for a key size known at compile time (`N`, or 0: key_size); `memo`: whether
    /// to try the thread's lookup memo (false for a caller that already tried it,
    /// `update_memo_fast`); `slot`: whether `cpu` is the CPU slot the caller's run holds
    /// (the program ops), whose free list a new element then comes from.
    ///
    /// # Safety
    /// As for `update`; `N` is 0 or key_size.
    #[inline(always)]
    unsafe fn update_n<const N: usize>(
        &self,
        key: *const u8,
        value: *const u8,
        flags: u64,
        cpu: u32,
        memo: bool,
        slot: bool,
    ) -> Result<(), MapError> {
        if self.ids {
            return Err(einval("hash of maps is not updated by programs"));
        }
        let c = self.cpu(cpu);
        // SAFETY: forwarded contract; c < nr_cpus.
        unsafe { self.update_impl::<N>(key, Src::Cpu(value, c), flags, Wait::Hot, memo, slot.then_some(c)) }
    }

    /// The common case of a program's update of a per-CPU map, done inline with no error
    /// plumbing and no call: an existing key (`BPF_ANY` or `BPF_EXIST`) whose element is the
    /// thread's lookup memo (see `update_impl`), whose lock is free. True when the value was written; false when
    /// nothing was done and the update must go the general way (`update`).
    ///
    /// # Safety
    /// `key` readable for key_size bytes, `value` for value_size bytes.
    #[inline(always)]
    unsafe fn update_memo_fast(&self, key: *const u8, value: *const u8, flags: u64, cpu: u32) -> bool {
        if flags > BPF_EXIST || flags == BPF_NOEXIST || self.ids || !self.percpu {
            return false;
        }
        let (map, i, word) = lookup_memo();
        // SAFETY: key readable for key_size bytes (caller).
        if map != self.memo_id() || word != unsafe { key_word(key, self.ks) } || i >= self.n_elems {
            return false;
        }
        // SAFETY: i < n_elems; key and value readable (caller).
        unsafe {
            let e = self.elem(i);
            // Linked (as the JIT's inline hit checks): a lookup then a delete of the key leave
            // the memo naming a free element, which a new insert of the key would lock for
            // nothing.
            if a8(e.add(E_STATE)).load(Relaxed) != LINKED || !self.key_eq(e, key) {
                return false;
            }
            let Some(_e) = self.elock(i).try_lock_once() else { return false };
            // Under the element's lock, as `update_in_place` checks: still linked, still the key.
            if a8(e.add(E_STATE)).load(Acquire) != LINKED || !self.key_eq(e, key) {
                return false;
            }
            // This CPU's slot, in place (what `write_value` does for a per-CPU map).
            copy_in(self.val(i, self.cpu(cpu)), value, self.vs);
        }
        true
    }

    /// # Safety
    /// `key` readable for key_size bytes.
    pub(crate) unsafe fn delete(&self, key: *const u8) -> Result<(), MapError> {
        // SAFETY: forwarded contract; each arm's constant is key_size; `home` is below nr_cpus.
        unsafe {
            let home = self.home();
            match self.ks {
                4 => self.delete_mark::<4>(key, Wait::Hot, home),
                8 => self.delete_mark::<8>(key, Wait::Hot, home),
                16 => self.delete_mark::<16>(key, Wait::Hot, home),
                _ => self.delete_mark::<0>(key, Wait::Hot, home),
            }
        }
    }

    /// `delete` by a program's run holding CPU slot `cpu`, for a key size known at compile
    /// time (`N`, or 0: key_size): the freed element goes to that slot's free list.
    ///
    /// # Safety
    /// `key` readable for key_size bytes; `N` is 0 or key_size.
    #[inline(always)]
    unsafe fn delete_in_slot<const N: usize>(&self, key: *const u8, cpu: u32) -> Result<(), MapError> {
        // SAFETY: forwarded contract; `self.cpu` is below nr_cpus.
        unsafe { self.delete_mark::<N>(key, Wait::Hot, self.cpu(cpu)) }
    }

    /// The program-side operations of this map as functions a caller (the JIT) can call
    /// directly, with the map and the run's CPU slot as arguments, instead of going through
    /// the helpers (which find the map in the registry by address, dispatch on its type and
    /// read the run's CPU from thread-local state): each is an `extern "C" fn(arg, r2, r3, r4,
    /// cpu) -> u64` returning what the helper of the same name returns for this map (see
    /// [`ProgOps`]). Each is specialised for the key size (4, 8, 16 or any). None for hashes of maps,
    /// whose lookups return inner maps (the runtime's registry knows them).
    pub fn prog_ops(&self) -> Option<ProgOps> {
        if self.ids {
            return None;
        }
        let (lookup, mut update, delete, shared): (ProgOp, ProgOp, ProgOp, ProgOp) = match self.ks {
            4 => (key4::lookup, key4::update, key4::delete, key4::update_shared),
            8 => (key8::lookup, key8::update, key8::delete, key8::update_shared),
            16 => (key16::lookup, key16::update, key16::delete, key16::update_shared),
            _ => (key_any::lookup, key_any::update, key_any::delete, key_any::update_shared),
        };
        if !self.percpu {
            // No inline memo path to keep small: the general update is the function.
            update = shared;
        }
        Some(ProgOps { arg: self as *const HashMap as u64, lookup, update, delete })
    }

    /// Where generated code finds what a program's lookup and update of an existing key
    /// through the thread's lookup memo read and write (see the module docs), so that the JIT
    /// can do the memo's hit inline and call [`ProgOps`] only when it misses: per-CPU hash
    /// maps (not LRU: their lookups mark elements used) whose keys are 1, 2, 4 or 8 bytes
    /// (the memo's key word is then the whole key, zero-padded, and so is the element's
    /// stored key word) and whose values are whole 8-byte words, at most 64 bytes. None for
    /// other maps.
    pub fn memo_layout(&self) -> Option<MemoLayout> {
        if !self.percpu || self.lru || self.ids || !matches!(self.ks, 1 | 2 | 4 | 8) {
            return None;
        }
        if !self.vs.is_multiple_of(8) || self.vs > 64 {
            return None;
        }
        let elem_size = u32::try_from(self.elem_size).ok().filter(|&s| s <= i32::MAX as u32)?;
        let pcpu_stride = u32::try_from(self.pcpu_stride).ok().filter(|&s| s <= i32::MAX as u32)?;
        Some(MemoLayout {
            map: self.memo_id(),
            thread_words: crate::sync::thread_words_tls_offset(),
            n_elems: self.n_elems,
            elems: self.elems as u64,
            elem_size,
            state: E_STATE as u32,
            linked: LINKED,
            lock: E_LOCK as u32,
            key: E_KEY as u32,
            key_size: self.ks as u32,
            pcpu: self.pcpu as u64,
            pcpu_stride,
            value_size: self.vs as u32,
        })
    }

    // ---- syscall side ----

    pub(crate) fn lookup_elem(&self, key: &[u8], out: &mut [u8]) -> Result<(), MapError> {
        let k = key.as_ptr();
        // SAFETY: key holds key_size bytes, out value_buf_size bytes (checked by Map).
        unsafe {
            let h = self.hash(k);
            for _ in 0..4 {
                let i = self.find(k, h);
                if i == NIL {
                    return Err(ENOENT);
                }
                if i >= self.n_elems {
                    break;
                }
                let e = self.elem(i);
                // A deleted element holding the key, still in its chain: the key is absent.
                if a8(e.add(E_STATE)).load(Acquire) == DELETED && self.key_eq(e, k) {
                    return Err(ENOENT);
                }
                let seq = self.seq(i).load(Acquire);
                self.read_value(i, out.as_mut_ptr());
                fence(Acquire);
                // The slot we copied may have been rewritten (two updates while we copied),
                // or the element deleted and reused: keep the copy only if neither happened.
                if (self.percpu || self.seq(i).load(Relaxed) == seq)
                    && a8(e.add(E_STATE)).load(Acquire) == LINKED
                    && a32(e.add(E_HASH)).load(Relaxed) == h
                    && self.key_eq(e, k)
                {
                    return Ok(());
                }
            }
            let b = h & self.mask;
            let _g = SpinLock::new(self.lock_word(b)).lock(Wait::Sys)?;
            match self.find_locked::<0>(b, k, h) {
                Some((_, i)) => {
                    let _e = self.elock(i).lock(Wait::Sys)?;
                    // A deleted element still in its chain: the key is absent.
                    if a8(self.elem(i).add(E_STATE)).load(Relaxed) != LINKED {
                        return Err(ENOENT);
                    }
                    self.read_value(i, out.as_mut_ptr());
                    Ok(())
                }
                None => Err(ENOENT),
            }
        }
    }

    pub(crate) fn update_elem(&self, key: &[u8], value: &[u8], flags: u64) -> Result<(), MapError> {
        if self.ids && value[..4] == [0; 4] {
            return Err(MapError::new(libc::EBADF, "id 0 names no map"));
        }
        // SAFETY: key holds key_size bytes, value value_buf_size bytes (checked by Map).
        unsafe { self.update_impl::<0>(key.as_ptr(), Src::All(value.as_ptr()), flags, Wait::Sys, false, None) }
    }

    pub(crate) fn delete_elem(&self, key: &[u8]) -> Result<(), MapError> {
        // SAFETY: key holds key_size bytes.
        unsafe { self.delete_impl::<0>(key.as_ptr(), std::ptr::null_mut(), Wait::Sys, None) }
    }

    pub(crate) fn lookup_and_delete_elem(&self, key: &[u8], out: &mut [u8]) -> Result<(), MapError> {
        // SAFETY: key holds key_size bytes, out value_buf_size bytes (checked by Map).
        unsafe { self.delete_impl::<0>(key.as_ptr(), out.as_mut_ptr(), Wait::Sys, None) }
    }

    pub(crate) fn get_next_key(&self, key: Option<&[u8]>, out: &mut [u8]) -> Result<(), MapError> {
        let mut start = 0;
        if let Some(k) = key {
            // SAFETY: k holds key_size bytes.
            let h = unsafe { self.hash(k.as_ptr()) };
            // SAFETY: as above.
            let i = unsafe { self.find(k.as_ptr(), h) };
            // The key's element, if linked. A key not in the map, deleted ones included,
            // gives the first key, as the kernel's: loaders start iterations from a key they
            // found absent (bpftrace's `print` from the first key its lookup does not find,
            // often all zeros, which a program may have deleted).
            // SAFETY: i < n_elems is checked first.
            if i < self.n_elems && unsafe { a8(self.elem(i).add(E_STATE)) }.load(Acquire) == LINKED {
                // SAFETY: i < n_elems.
                if let Some(j) = self.first_linked(unsafe { self.next(i) }.load(Acquire)) {
                    // SAFETY: j < n_elems; out holds key_size bytes.
                    unsafe { copy_out(self.elem(j).add(E_KEY), out.as_mut_ptr(), self.ks) };
                    return Ok(());
                }
                start = (h & self.mask) + 1;
            }
        }
        for b in start..self.n_buckets {
            if let Some(j) = self.first_linked(self.head(b).load(Acquire)) {
                // SAFETY: j < n_elems; out holds key_size bytes.
                unsafe { copy_out(self.elem(j).add(E_KEY), out.as_mut_ptr(), self.ks) };
                return Ok(());
            }
        }
        Err(ENOENT)
    }

    /// The first linked element of the chain from `cur` on (deleted ones are passed over).
    fn first_linked(&self, mut cur: u32) -> Option<u32> {
        let mut steps = self.n_elems;
        while cur & NULLS == 0 && cur < self.n_elems && steps > 0 {
            steps -= 1;
            // SAFETY: cur < n_elems.
            unsafe {
                if a8(self.elem(cur).add(E_STATE)).load(Acquire) == LINKED {
                    return Some(cur);
                }
                cur = self.next(cur).load(Acquire);
            }
        }
        None
    }

    /// The elements in the map: those marked linked (exact when no update or delete runs;
    /// while they run, each element is counted as it is at the moment its state is read).
    /// One pass over the elements' state bytes: the map keeps no count, so that inserts and
    /// deletes write no shared counter (as the kernel's preallocated hash maps keep none).
    pub fn len(&self) -> u32 {
        // SAFETY: i < n_elems; the state byte of element i.
        let n = (0..self.n_elems).filter(|&i| unsafe { a8(self.elem(i).add(E_STATE)) }.load(Relaxed) == LINKED).count();
        (n as u32).min(self.max)
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    #[inline]
    pub(crate) fn contains(&self, addr: u64, len: u64) -> bool {
        if self.ids || len > self.vs as u64 {
            return false;
        }
        if self.percpu {
            let off = addr.wrapping_sub(self.pcpu as u64);
            if off >= self.pcpu_stride as u64 * self.nr_cpus as u64 {
                return false;
            }
            let off = off % self.pcpu_stride as u64;
            off < self.n_elems as u64 * self.vs8 as u64 && off % self.vs8 as u64 + len <= self.vs as u64
        } else {
            let off = addr.wrapping_sub(self.elems as u64);
            if off >= self.n_elems as u64 * self.elem_size as u64 {
                return false;
            }
            let within = off % self.elem_size as u64;
            // Either of the two value slots.
            let (val_off, vs8) = (self.val_off as u64, self.vs8 as u64);
            within >= val_off && within - val_off < 2 * vs8 && (within - val_off) % vs8 + len <= self.vs as u64
        }
    }
}

/// CLOCK_MONOTONIC in nanoseconds (the same clock in every process sharing a map file).
fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes the timespec we own (the vDSO: no system call).
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The error of an update whose flags are not `BPF_ANY`, `BPF_NOEXIST` or `BPF_EXIST`.
#[cold]
#[inline(never)]
fn bad_update_flags(flags: u64) -> MapError {
    if (flags & !BPF_F_LOCK) > BPF_EXIST {
        EBAD_FLAGS
    } else {
        einval("BPF_F_LOCK without a bpf_spin_lock in the value")
    }
}

/// The first 8 bytes of a key of `ks` bytes (zero-padded), the lookup memo's filter: a memo
/// of another key is told apart without touching its element.
///
/// # Safety
/// `key` readable for `ks` bytes.
#[inline(always)]
unsafe fn key_word(key: *const u8, ks: usize) -> u64 {
    // SAFETY: readable for ks bytes (caller).
    unsafe { if ks >= 8 { read_word(key) } else { read_tail(key, ks) } }
}

/// A program-side map operation called directly (see [`HashMap::prog_ops`]): `(arg, r2, r3,
/// r4, cpu) -> r0`, the C calling convention, as helpers are called.
pub type ProgOp = unsafe extern "C" fn(u64, u64, u64, u64, u64) -> u64;

/// The program-side operations of a hash map, called with `arg` in place of the map's
/// address and the run's CPU slot as the fifth argument:
/// - `lookup(arg, key, _, _, cpu)`: `bpf_map_lookup_elem`: the value's address (`cpu`'s for a
///   per-CPU map; an LRU map's element is marked used), or 0;
/// - `update(arg, key, value, flags, cpu)`: `bpf_map_update_elem`: 0 or `-errno`;
/// - `delete(arg, key, _, _, cpu)`: `bpf_map_delete_elem`: 0 or `-errno`.
///
/// Safety of the calls: `arg` names a live [`HashMap`] (its map is never unmapped while
/// programs may call), `cpu` is a CPU slot the caller's run holds, and keys and values are
/// readable for the map's sizes, as for the helpers (valid programs pass stack or map memory).
#[derive(Clone, Copy, Debug)]
pub struct ProgOps {
    pub arg: u64,
    pub lookup: ProgOp,
    pub update: ProgOp,
    pub delete: ProgOp,
}

/// What a program's lookup or update of an existing key reads and writes when the thread's
/// lookup memo names the key's element (see [`HashMap::memo_layout`]):
///
/// - the thread's words at `thread_words` from the thread pointer: +0 its id (u32, 0: not
///   read yet), +4 the memo's element index (u32), +8 the memo's map (u64, compared with
///   `map`, the map's name in memos: its hash seed, the same for every process's and every
///   program's opening of the map file), +16 the memo's key word (u64: the key's `key_size`
///   bytes, zero-padded);
/// - element `i < n_elems` at `elems + i * elem_size`: its state byte at `+state` (`linked`:
///   in its chain), its lock word at `+lock` (u32: 0 or the holder's thread id; an update
///   takes it with one compare-and-swap, and gives up when it is held), its key word at
///   `+key` (u64, zero-padded);
/// - its value for CPU slot `c` at `pcpu + c * pcpu_stride + i * value_size`.
///
/// A lookup hit: the memo's map and key word are the map's and the key's, `i < n_elems`,
/// the element linked and holding the key word: the value's address. An update hit (flags
/// `BPF_ANY` or `BPF_EXIST`): the same checks, the element's lock taken (the thread's id
/// known), the checks again under it, the value's words stored, the lock given back (a
/// release store of 0), result 0. Anything else: [`ProgOps`]' function, which does the
/// same and more.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoLayout {
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

/// The program-side operations for key size `N` (0: any), as [`ProgOps`] holds them: one
/// module per key size, each in code sections of its own (`.text.hot.userbpf.hashN`, and
/// `.hashN.percpu` for the per-CPU maps' updates; see `userbpf_agent`'s build script): a
/// program's lookups, updates and deletes of one map then run code on two or three
/// neighbouring pages, not spread over the 64 KiB that the four sizes' functions take
/// together (a probe hit on a target's cold caches pays a translation and a fill for every
/// page and line of code it runs).
macro_rules! key_size_ops {
    ($module:ident, $n:literal, $section:literal, $percpu_section:literal) => {
        mod $module {
            use super::HashMap;

            /// [`ProgOps::lookup`](super::ProgOps::lookup).
            #[unsafe(link_section = $section)]
            pub(super) unsafe extern "C" fn lookup(m: u64, key: u64, _: u64, _: u64, cpu: u64) -> u64 {
                // SAFETY: `m` is a live HashMap and `key` readable for key_size bytes
                // (ProgOps' contract); `prog_ops` chose this module for the map's key size.
                unsafe { (*(m as *const HashMap)).lookup_n::<$n>(key as *const u8, cpu as u32) as u64 }
            }

            /// [`ProgOps::update`](super::ProgOps::update) of a map that is not per-CPU: the
            /// general update, which tries the thread's lookup memo (their value write
            /// switches slots).
            #[unsafe(link_section = $section)]
            pub(super) unsafe extern "C" fn update_shared(m: u64, key: u64, value: u64, flags: u64, cpu: u64) -> u64 {
                // SAFETY: as for `lookup`; `value` readable for value_size bytes.
                match unsafe {
                    (*(m as *const HashMap)).update_n::<$n>(
                        key as *const u8,
                        value as *const u8,
                        flags,
                        cpu as u32,
                        true,
                        true,
                    )
                } {
                    Ok(()) => 0,
                    Err(e) => e.to_helper_ret(),
                }
            }

            /// [`ProgOps::update`](super::ProgOps::update) of a per-CPU map.
            #[unsafe(link_section = $percpu_section)]
            pub(super) unsafe extern "C" fn update(m: u64, key: u64, value: u64, flags: u64, cpu: u64) -> u64 {
                // SAFETY: as for `lookup`; `value` readable for value_size bytes.
                let map = unsafe { &*(m as *const HashMap) };
                // Per-CPU maps (bpftrace's count(), sum(), hist()): the memo's element
                // written inline.
                let fast = map.percpu
                    // SAFETY: as above.
                    && unsafe { map.update_memo_fast(key as *const u8, value as *const u8, flags, cpu as u32) };
                if fast {
                    return 0;
                }
                // SAFETY: as above.
                unsafe { update_general(map, key, value, flags, cpu) }
            }

            /// [`update`] when the memo's fast path does not apply (out of line, so that
            /// the fast path does not pay for its frame).
            ///
            /// # Safety
            /// As for [`update`].
            #[inline(never)]
            #[unsafe(link_section = $percpu_section)]
            unsafe fn update_general(map: &HashMap, key: u64, value: u64, flags: u64, cpu: u64) -> u64 {
                // Per-CPU maps: `update` tried the memo.
                // SAFETY: forwarded.
                match unsafe {
                    map.update_n::<$n>(key as *const u8, value as *const u8, flags, cpu as u32, !map.percpu, true)
                } {
                    Ok(()) => 0,
                    Err(e) => e.to_helper_ret(),
                }
            }

            /// [`ProgOps::delete`](super::ProgOps::delete).
            #[unsafe(link_section = $section)]
            pub(super) unsafe extern "C" fn delete(m: u64, key: u64, _: u64, _: u64, cpu: u64) -> u64 {
                // SAFETY: as for `lookup`.
                match unsafe { (*(m as *const HashMap)).delete_in_slot::<$n>(key as *const u8, cpu as u32) } {
                    Ok(()) => 0,
                    Err(e) => e.to_helper_ret(),
                }
            }
        }
    };
}

key_size_ops!(key4, 4, ".text.hot.userbpf.hash4", ".text.hot.userbpf.hash4.percpu");
key_size_ops!(key8, 8, ".text.hot.userbpf.hash8", ".text.hot.userbpf.hash8.percpu");
key_size_ops!(key16, 16, ".text.hot.userbpf.hash16", ".text.hot.userbpf.hash16.percpu");
key_size_ops!(key_any, 0, ".text.hot.userbpf.hash0", ".text.hot.userbpf.hash0.percpu");

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shm::Shm;
    use std::path::PathBuf;

    struct Tmp(PathBuf);

    impl Drop for Tmp {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn tmp(name: &str) -> Tmp {
        let root =
            if std::path::Path::new("/dev/shm").is_dir() { PathBuf::from("/dev/shm") } else { std::env::temp_dir() };
        let d = root.join(format!("userbpf-hash-unit-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        Tmp(d)
    }

    /// A hash map with `nr_cpus` CPU slots, whatever the machine has (as `Map::create` makes
    /// it, the published header aside).
    fn map(t: &Tmp, name: &str, map_type: MapType, ks: u32, max: u32, nr_cpus: u32) -> HashMap {
        let spec = MapSpec {
            map_type,
            key_size: ks,
            value_size: 8,
            max_entries: max,
            map_flags: 0,
            map_extra: 0,
            name: name.into(),
        };
        HashMap::check(&spec).unwrap();
        let size = HashMap::file_size(&spec, nr_cpus).unwrap() as usize;
        let shm = Shm::create(&t.0.join(name), size).unwrap();
        HashMap::create(Base { shm, spec, nr_cpus }).unwrap()
    }

    /// Key `k` as `ks` bytes.
    fn key(k: u32, ks: u32) -> Vec<u8> {
        let mut v = vec![0u8; ks as usize];
        v[..4].copy_from_slice(&k.to_ne_bytes());
        v
    }

    fn update(m: &HashMap, k: &[u8], v: u64, flags: u64, cpu: u32) -> i64 {
        let ops = m.prog_ops().unwrap();
        // SAFETY: a live map; key and value readable for its sizes; this thread is the only
        // one using slot `cpu`.
        unsafe { (ops.update)(ops.arg, k.as_ptr() as u64, &v as *const u64 as u64, flags, cpu as u64) as i64 }
    }

    fn delete(m: &HashMap, k: &[u8], cpu: u32) -> i64 {
        let ops = m.prog_ops().unwrap();
        // SAFETY: as in `update`.
        unsafe { (ops.delete)(ops.arg, k.as_ptr() as u64, 0, 0, cpu as u64) as i64 }
    }

    /// A program's lookup: the value's address, 0 if absent.
    fn lookup(m: &HashMap, k: &[u8], cpu: u32) -> u64 {
        let ops = m.prog_ops().unwrap();
        // SAFETY: as in `update`.
        unsafe { (ops.lookup)(ops.arg, k.as_ptr() as u64, 0, 0, cpu as u64) }
    }

    /// The element holding `k` (found by a program's lookup, through its value's address).
    fn elem_of(m: &HashMap, k: &[u8]) -> u32 {
        let v = lookup(m, k, 0);
        assert_ne!(v, 0, "key {k:?} absent");
        let i = if m.percpu { (v - m.pcpu as u64) / m.vs8 as u64 } else { (v - m.elems as u64) / m.elem_size as u64 };
        i as u32
    }

    /// CPU `c`'s share of the elements when the map was created.
    fn share(m: &HashMap, c: u32) -> std::ops::Range<u32> {
        let (n, nr) = (m.n_elems as u64, m.nr_cpus as u64);
        (n * c as u64 / nr) as u32..(n * (c as u64 + 1) / nr) as u32
    }

    /// The types whose program deletes keep the element (not LRU).
    fn kept_types() -> [MapType; 2] {
        [MapType::BPF_MAP_TYPE_HASH, MapType::BPF_MAP_TYPE_PERCPU_HASH]
    }

    fn types() -> [MapType; 4] {
        [
            MapType::BPF_MAP_TYPE_HASH,
            MapType::BPF_MAP_TYPE_PERCPU_HASH,
            MapType::BPF_MAP_TYPE_LRU_HASH,
            MapType::BPF_MAP_TYPE_LRU_PERCPU_HASH,
        ]
    }

    /// The element at the head of CPU slot `c`'s free list.
    fn free_top(m: &HashMap, c: usize) -> u32 {
        m.free_head(c).load(Relaxed) as u32
    }

    /// A program's insert takes its element from its run's CPU slot's free list. Its delete
    /// leaves the element in its chain, deleted: the key's next insert (from any slot) takes
    /// it back without a free list; once the slot has deleted `RING` more, it goes back to
    /// that slot's free list, whatever CPU the thread runs on.
    #[test]
    fn program_inserts_and_deletes_use_their_slots_free_list() {
        let t = tmp("home");
        for (n, mt) in types().into_iter().enumerate() {
            for ks in [4, 8, 12, 16] {
                let m = map(&t, &format!("m{n}-{ks}"), mt, ks, 64, 4);
                for c in 0..4 {
                    assert_eq!(update(&m, &key(c, ks), c as u64, BPF_ANY, c), 0);
                    let i = elem_of(&m, &key(c, ks));
                    assert!(share(&m, c).contains(&i), "{mt:?} key size {ks}: slot {c}'s insert took element {i}");
                }
                if m.lru {
                    // LRU maps free at once (see `delete_mark`): deleted in slot c + 1, the
                    // next insert in that slot takes the element.
                    for c in 0..4 {
                        let d = (c + 1) % 4;
                        let i = elem_of(&m, &key(c, ks));
                        assert_eq!(delete(&m, &key(c, ks), d), 0);
                        assert_eq!(free_top(&m, d as usize), i, "{mt:?} key size {ks}: slot {d}'s free list");
                        assert_eq!(update(&m, &key(100 + c, ks), 7, BPF_NOEXIST, d), 0);
                        assert_eq!(elem_of(&m, &key(100 + c, ks)), i, "{mt:?} key size {ks}: slot {d}'s free list");
                    }
                    assert_eq!(m.len(), 4);
                    continue;
                }
                for c in 0..4 {
                    let d = (c + 1) % 4;
                    let i = elem_of(&m, &key(c, ks));
                    let tops: Vec<u32> = (0..4).map(|c| free_top(&m, c)).collect();
                    assert_eq!(delete(&m, &key(c, ks), d), 0);
                    assert_eq!(lookup(&m, &key(c, ks), c), 0, "{mt:?} key size {ks}: deleted key {c} found");
                    assert_eq!(m.len(), 3);
                    assert_eq!(delete(&m, &key(c, ks), c), -(libc::ENOENT as i64));
                    assert_eq!(update(&m, &key(c, ks), 7, BPF_EXIST, c), -(libc::ENOENT as i64));
                    assert_eq!(update(&m, &key(c, ks), 8, BPF_NOEXIST, c), 0);
                    assert_eq!(elem_of(&m, &key(c, ks)), i, "{mt:?} key size {ks}: key {c} taken back in place");
                    let now: Vec<u32> = (0..4).map(|c| free_top(&m, c)).collect();
                    assert_eq!(now, tops, "{mt:?} key size {ks}: a free list changed");
                }
                // Key 0 deleted in slot 1, then RING more keys: key 0's element is the oldest
                // of slot 1's ring, and goes to slot 1's list.
                let keys: Vec<Vec<u8>> = (0..RING).map(|k| key(200 + k, ks)).collect();
                for k in &keys {
                    assert_eq!(update(&m, k, 1, BPF_NOEXIST, 2), 0);
                }
                let i = elem_of(&m, &key(0, ks));
                assert_eq!(delete(&m, &key(0, ks), 1), 0);
                for k in &keys[..RING as usize - 1] {
                    assert_eq!(delete(&m, k, 1), 0);
                }
                assert_ne!(free_top(&m, 1), i, "{mt:?} key size {ks}: freed before the ring was full");
                assert_eq!(delete(&m, &keys[RING as usize - 1], 1), 0);
                assert_eq!(free_top(&m, 1), i, "{mt:?} key size {ks}: slot 1's free list");
                assert_eq!(m.len(), 3);
            }
        }
    }

    /// The helpers' update and delete (`Map::update`, `Map::delete`) are given no CPU slot of
    /// their own for maps that are not per-CPU (the helpers pass 0): their elements come from
    /// and go back to the free list (and the ring of deleted elements) of the CPU the thread
    /// runs on.
    #[test]
    fn helper_updates_use_the_running_cpus_free_list() {
        let t = tmp("helper");
        std::thread::spawn(move || {
            // Pinned to one CPU it may run on.
            // SAFETY: a zeroed cpu_set_t filled by sched_getaffinity, then one CPU set in a
            // fresh one; both calls are for this thread (pid 0).
            let cpu = unsafe {
                let mut set: libc::cpu_set_t = std::mem::zeroed();
                assert_eq!(libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set), 0);
                let cpu = (0..libc::CPU_SETSIZE as usize).rev().find(|&c| libc::CPU_ISSET(c, &set)).unwrap();
                let mut one: libc::cpu_set_t = std::mem::zeroed();
                libc::CPU_SET(cpu, &mut one);
                assert_eq!(libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &one), 0);
                cpu as u32
            };
            assert_eq!(crate::sync::current_cpu(), cpu);
            let m = map(&t, "m", MapType::BPF_MAP_TYPE_HASH, 4, 64, 4);
            let home = cpu % 4;
            let other = (home + 1) % 4;
            let v = 5u64;
            for k in 0..=RING {
                // SAFETY: a 4-byte key and an 8-byte value.
                unsafe { m.update(key(k, 4).as_ptr(), &v as *const u64 as *const u8, BPF_ANY, other) }.unwrap();
                let i = elem_of(&m, &key(k, 4));
                assert!(share(&m, home).contains(&i), "CPU {cpu}: the helper's insert took element {i}");
            }
            // Deleted by the helper, then RING more: the first goes to the running CPU's list.
            let i = elem_of(&m, &key(0, 4));
            for k in 0..=RING {
                // SAFETY: a 4-byte key.
                unsafe { m.delete(key(k, 4).as_ptr()) }.unwrap();
            }
            assert_eq!(free_top(&m, home as usize), i);
            assert_eq!(m.len(), 0);
        })
        .join()
        .unwrap();
    }

    /// The element count, kept by no counter, is what inserts and deletes from several threads
    /// and slots left; the map holds exactly max_entries elements (E2BIG after), taking from
    /// other slots' lists when a slot's own is empty.
    #[test]
    fn len_and_e2big_across_threads_and_slots() {
        let t = tmp("len");
        for (n, mt) in kept_types().into_iter().enumerate() {
            const MAX: u32 = 240;
            let m = map(&t, &format!("m{n}"), mt, 4, MAX, 4);
            // Two threads, slots {0, 2} and {1, 3}: 100 keys each, every third deleted again
            // (by the other slot of the pair).
            std::thread::scope(|s| {
                for th in 0..2u32 {
                    let m = &m;
                    s.spawn(move || {
                        for k in 0..100 {
                            let key = key(th * 1000 + k, 4);
                            assert_eq!(update(m, &key, k as u64, BPF_ANY, th + 2 * (k % 2)), 0);
                            if k % 3 == 0 {
                                assert_eq!(delete(m, &key, th + 2 * (1 - k % 2)), 0);
                            }
                        }
                    });
                }
            });
            let kept = 2 * (100 - 34);
            assert_eq!(m.len(), kept, "{mt:?}");
            // Syscall-side deletes and inserts count too.
            m.delete_elem(&key(1, 4)).unwrap();
            m.update_elem(&key(5000, 4), &vec![1u8; 8 * if m.percpu { 4 } else { 1 }], BPF_NOEXIST).unwrap();
            assert_eq!(m.len(), kept);
            // Fill from slot 3 alone: its list empties, then it takes from the others'.
            let room = MAX - kept;
            for k in 0..room {
                assert_eq!(update(&m, &key(10_000 + k, 4), 1, BPF_ANY, 3), 0, "{mt:?}: insert {k} of {room}");
            }
            assert_eq!(m.len(), MAX);
            for c in 0..4 {
                assert_eq!(update(&m, &key(20_000 + c, 4), 1, BPF_ANY, c), -(libc::E2BIG as i64), "{mt:?}");
            }
            // An existing key is still updated in place.
            assert_eq!(update(&m, &key(10_000, 4), 2, BPF_ANY, 0), 0);
            assert_eq!(delete(&m, &key(10_000, 4), 1), 0);
            assert_eq!(m.len(), MAX - 1);
            assert_eq!(update(&m, &key(20_000, 4), 1, BPF_ANY, 2), 0);
            assert_eq!(update(&m, &key(20_001, 4), 1, BPF_ANY, 2), -(libc::E2BIG as i64));
            assert_eq!(m.len(), MAX);
        }
    }

    /// sslsniff's pattern: a key inserted, looked up (the thread's memo names its element),
    /// deleted, then inserted again. Deleted, the key is absent to every reader (programs'
    /// lookups, the syscall side's lookup and iteration); inserted again, it takes its element
    /// back with the new value (per-CPU: the other CPUs' values zero, as a new element's).
    #[test]
    fn insert_after_delete_takes_the_deleted_element_back() {
        let t = tmp("memo");
        for (n, mt) in types().into_iter().enumerate() {
            let m = map(&t, &format!("m{n}"), mt, 4, 16, 2);
            let k = key(42, 4);
            let nv = if m.percpu { 2 } else { 1 };
            // LRU maps free at once (see `delete_mark`): not taken back, the rest is the same.
            let back = !m.lru;
            assert_eq!(update(&m, &k, 1, BPF_ANY, 1), 0);
            assert_eq!(update(&m, &k, 3, BPF_ANY, 0), 0);
            assert_ne!(lookup(&m, &k, 0), 0);
            let i = elem_of(&m, &k);
            assert_eq!(delete(&m, &k, 0), 0);
            assert_eq!(lookup(&m, &k, 0), 0, "{mt:?}");
            let mut out = vec![0u8; 8 * nv];
            assert_eq!(m.lookup_elem(&k, &mut out).err(), Some(ENOENT), "{mt:?}");
            assert_eq!(m.get_next_key(None, &mut [0u8; 4]).err(), Some(ENOENT), "{mt:?}");
            assert_eq!(m.len(), 0);
            let top = free_top(&m, 0);
            assert_eq!(update(&m, &k, 2, BPF_ANY, 0), 0);
            if back {
                assert_eq!(elem_of(&m, &k), i, "{mt:?}");
                assert_eq!(free_top(&m, 0), top, "{mt:?}: a free element taken");
            }
            m.lookup_elem(&k, &mut out).unwrap();
            let words: Vec<u64> = out.chunks(8).map(|w| u64::from_ne_bytes(w.try_into().unwrap())).collect();
            assert_eq!(words, if m.percpu { vec![2, 0] } else { vec![2] }, "{mt:?}");
            let mut next = [0u8; 4];
            m.get_next_key(None, &mut next).unwrap();
            assert_eq!(next[..], k[..]);
        }
    }

    /// An iteration from a key a program deleted (its element still in its chain) starts
    /// from the first key, as from any key not in the map (the kernel's answer, which loaders
    /// rely on: bpftrace's `print` starts from the first key its lookup finds absent, often
    /// all zeros).
    #[test]
    fn iteration_from_a_deleted_key_starts_from_the_first() {
        let t = tmp("iter");
        for (n, mt) in kept_types().into_iter().enumerate() {
            let m = map(&t, &format!("m{n}"), mt, 4, 64, 2);
            for k in 0..40 {
                assert_eq!(update(&m, &key(k, 4), 1, BPF_NOEXIST, 0), 0);
            }
            let mut first = [0u8; 4];
            m.get_next_key(None, &mut first).unwrap();
            for k in 0..40 {
                assert_eq!(delete(&m, &key(k, 4), 1), 0);
                assert_eq!(update(&m, &key(k, 4), 1, BPF_NOEXIST, 0), 0);
            }
            for k in 0..40 {
                let gone = key(k, 4);
                assert_eq!(delete(&m, &gone, 1), 0);
                let mut from_gone = [0u8; 4];
                m.get_next_key(Some(&gone), &mut from_gone).unwrap();
                let mut from_none = [0u8; 4];
                m.get_next_key(None, &mut from_none).unwrap();
                assert_eq!(from_gone, from_none, "{mt:?}: from deleted key {k}");
                let mut count = 0;
                let mut cur = from_gone;
                loop {
                    count += 1;
                    let mut next = [0u8; 4];
                    if m.get_next_key(Some(&cur), &mut next).is_err() {
                        break;
                    }
                    cur = next;
                }
                assert_eq!(count, 39, "{mt:?}: keys seen from deleted key {k}");
                assert_eq!(update(&m, &gone, 1, BPF_NOEXIST, 0), 0);
            }
        }
    }

    /// Deleted elements still in their chains are free space: a map whose every element was
    /// deleted by programs (none given back to a free list yet) takes max_entries new keys,
    /// then `E2BIG`, and iteration and the count see only the new keys. A syscall-side
    /// delete of a key frees its element at once.
    #[test]
    fn deleted_elements_are_free_space() {
        let t = tmp("space");
        for (n, mt) in kept_types().into_iter().enumerate() {
            const MAX: u32 = 8;
            let m = map(&t, &format!("m{n}"), mt, 4, MAX, 2);
            for k in 0..MAX {
                assert_eq!(update(&m, &key(k, 4), 1, BPF_NOEXIST, 0), 0);
            }
            for k in 0..MAX {
                assert_eq!(delete(&m, &key(k, 4), 0), 0);
            }
            assert_eq!((free_top(&m, 0), free_top(&m, 1)), (NIL, NIL), "{mt:?}: elements freed");
            for k in 100..100 + MAX {
                assert_eq!(update(&m, &key(k, 4), k as u64, BPF_NOEXIST, 1), 0, "{mt:?}: key {k}");
            }
            assert_eq!(update(&m, &key(500, 4), 1, BPF_NOEXIST, 1), -(libc::E2BIG as i64), "{mt:?}");
            let mut seen = Vec::new();
            let mut cur: Option<[u8; 4]> = None;
            loop {
                let mut next = [0u8; 4];
                match m.get_next_key(cur.as_ref().map(|c| &c[..]), &mut next) {
                    Ok(()) => {
                        seen.push(u32::from_ne_bytes(next));
                        cur = Some(next);
                    }
                    Err(e) => {
                        assert_eq!(e, ENOENT);
                        break;
                    }
                }
            }
            seen.sort();
            let expect: Vec<u32> = (100..100 + MAX).collect();
            assert_eq!(seen, expect, "{mt:?}");
            assert_eq!(m.len() as usize, expect.len(), "{mt:?}");
            // The syscall side frees at once: the next insert has room.
            let gone = key(seen[0], 4);
            m.delete_elem(&gone).unwrap();
            assert_eq!(m.delete_elem(&gone).err(), Some(ENOENT));
            assert_eq!(update(&m, &key(600, 4), 1, BPF_NOEXIST, 0), 0, "{mt:?}");
        }
    }

    /// A deleted element no ring names (two threads wrote a ring at once) is still found
    /// when the map is otherwise full, by the search of every element; a search that found
    /// none is not repeated by every insert for a while (a map that is really full).
    #[test]
    fn a_deleted_element_lost_from_the_rings_is_found_by_the_search() {
        let t = tmp("orphan");
        for (n, mt) in kept_types().into_iter().enumerate() {
            const MAX: u32 = 16;
            let m = map(&t, &format!("m{n}"), mt, 4, MAX, 2);
            for k in 0..MAX {
                assert_eq!(update(&m, &key(k, 4), 1, BPF_NOEXIST, 0), 0);
            }
            assert_eq!(update(&m, &key(100, 4), 1, BPF_NOEXIST, 0), -(libc::E2BIG as i64));
            // SAFETY: an aligned field of the type header.
            let swept = unsafe { a64(m.base.at(H_SWEPT)) };
            assert!(swept.load(Relaxed) > monotonic_ns(), "{mt:?}: the failed search stands");
            assert_eq!(delete(&m, &key(3, 4), 1), 0);
            // Lost from slot 1's ring.
            for k in 0..RING {
                // SAFETY: aligned u32 fields of slot 1's list record.
                unsafe { a32(m.list(1).add(L_RING + 4 * k as usize)) }.store(0, Relaxed);
            }
            // A new key of another chain than key 3's (whose deleted element an insert into
            // its own chain would take without any search).
            // SAFETY: 4-byte keys.
            let bucket = |k: u32| unsafe { m.hash(key(k, 4).as_ptr()) } & m.mask;
            let new = key((100..).find(|&k| bucket(k) != bucket(3)).unwrap(), 4);
            // Within the standing search: full.
            assert_eq!(update(&m, &new, 1, BPF_NOEXIST, 0), -(libc::E2BIG as i64), "{mt:?}");
            swept.store(0, Relaxed);
            assert_eq!(update(&m, &new, 5, BPF_NOEXIST, 0), 0, "{mt:?}");
            assert_eq!(m.len(), MAX);
            assert_eq!(lookup(&m, &key(3, 4), 0), 0);
        }
    }

    /// A slot whose deleted keys do not come back (keys by request) soon frees at once, as
    /// a delete did before deleted elements were kept; one whose keys come back again goes
    /// back to keeping them.
    #[test]
    fn a_slots_deletes_free_at_once_while_its_keys_do_not_come_back() {
        let t = tmp("score");
        for (n, mt) in kept_types().into_iter().enumerate() {
            // Chains of one element mostly: a deleted element seldom taken by a new key of its
            // chain (which also counts as its coming back).
            let m = map(&t, &format!("m{n}"), mt, 4, 4096, 2);
            // Keys that never come back: every delete's element kept at first (not freed),
            // then eight in nine freed at once.
            let mut freed_at_once = 0;
            for k in 0..100 {
                assert_eq!(update(&m, &key(1000 + k, 4), 1, BPF_NOEXIST, 0), 0);
                let i = elem_of(&m, &key(1000 + k, 4));
                assert_eq!(delete(&m, &key(1000 + k, 4), 0), 0);
                if free_top(&m, 0) == i {
                    freed_at_once += 1;
                }
                if k < RING + SCORE_FREE_AT_ONCE.div_ceil(SCORE_WASTED) {
                    assert_ne!(free_top(&m, 0), i, "{mt:?}: key {k} freed at once");
                }
            }
            assert!(freed_at_once >= 60, "{mt:?}: {freed_at_once} of 100 deletes freed at once");
            // A key that comes back: after a while, kept again.
            let k = key(7, 4);
            let mut kept = false;
            for _ in 0..100 {
                assert_eq!(update(&m, &k, 1, BPF_ANY, 0), 0);
                let i = elem_of(&m, &k);
                assert_eq!(delete(&m, &k, 0), 0);
                kept = free_top(&m, 0) != i;
            }
            assert!(kept, "{mt:?}: a key that comes back is still freed at once");
            assert_eq!(m.score(0).load(Relaxed), 0);
            assert_eq!(m.len(), 0);
        }
    }

    /// Threads inserting and deleting keys of their own (as tracing tools' `start[tid]`) and
    /// keys that never come back, in the same slots, with a map too small to hold the
    /// deleted elements beside the live ones unless they are reused: no insert fails, every
    /// live key holds its last value, and the count is exact at the end.
    #[test]
    fn churn_reuses_deleted_elements() {
        let t = tmp("churn");
        for (n, mt) in types().into_iter().enumerate() {
            const MAX: u32 = 24;
            let m = map(&t, &format!("m{n}"), mt, 4, MAX, 2);
            std::thread::scope(|s| {
                for th in 0..4u32 {
                    let m = &m;
                    s.spawn(move || {
                        let mine = key(th, 4);
                        for r in 0..20_000u32 {
                            let slot = th % 2;
                            assert_eq!(update(m, &mine, r as u64, BPF_ANY, slot), 0, "{mt:?}");
                            let once = key(1000 + th * 100_000 + r, 4);
                            assert_eq!(update(m, &once, 1, BPF_NOEXIST, slot), 0, "{mt:?}");
                            let v = lookup(m, &mine, slot);
                            assert_ne!(v, 0);
                            // SAFETY: a value of this map (8 bytes, aligned).
                            assert_eq!(unsafe { (v as *const u64).read() }, r as u64, "{mt:?}");
                            assert_eq!(delete(m, &once, slot), 0);
                            assert_eq!(delete(m, &mine, slot), 0);
                        }
                        assert_eq!(update(m, &mine, 7, BPF_NOEXIST, th % 2), 0);
                    });
                }
            });
            assert_eq!(m.len(), 4, "{mt:?}");
        }
    }

    /// A map file opened twice (as the runtime opens a map for each program that uses it:
    /// sslsniff's entry and return programs) is one map to the threads' lookup memos, and a
    /// thread looking up two maps in turn has both remembered.
    #[test]
    fn lookup_memos_name_the_map_file_and_remember_two_maps() {
        let t = tmp("memo2");
        let a1 = map(&t, "a", MapType::BPF_MAP_TYPE_HASH, 4, 64, 2);
        let a2 =
            HashMap::open(Base { shm: Shm::open(&t.0.join("a")).unwrap(), spec: a1.base.spec.clone(), nr_cpus: 2 });
        let b = map(&t, "b", MapType::BPF_MAP_TYPE_HASH, 4, 64, 2);
        let k = key(7, 4);
        assert_eq!(update(&a1, &k, 11, BPF_ANY, 0), 0);
        assert_eq!(update(&b, &k, 22, BPF_ANY, 0), 0);
        let (ia, ib) = (elem_of(&a1, &k), elem_of(&b, &k));
        assert_ne!(lookup(&a1, &k, 0), 0);
        assert_ne!(lookup(&b, &k, 0), 0);
        assert_eq!(crate::sync::lookup_memo(), (b.memo_id(), ib, 7));
        assert_eq!(crate::sync::lookup_memo2(), (a1.memo_id(), ia, 7));
        // Through the other opening: the second memo is the key's element, now the first.
        let v = lookup(&a2, &k, 0);
        // SAFETY: a value of this map (8 bytes, aligned).
        assert_eq!(unsafe { (v as *const u64).read() }, 11);
        assert_eq!(crate::sync::lookup_memo(), (a2.memo_id(), ia, 7));
        assert_eq!(crate::sync::lookup_memo2(), (b.memo_id(), ib, 7));
        // And again through the first opening: the first memo, nothing moved.
        assert_ne!(lookup(&a1, &k, 0), 0);
        assert_eq!(crate::sync::lookup_memo(), (a1.memo_id(), ia, 7));
        assert_eq!(crate::sync::lookup_memo2(), (b.memo_id(), ib, 7));
        // An update through either opening after the lookup writes the element in place.
        assert_eq!(update(&a2, &k, 33, BPF_EXIST, 0), 0);
        // SAFETY: as above.
        assert_eq!(unsafe { (lookup(&a1, &k, 0) as *const u64).read() }, 33);
    }

    /// The program-side operations (each key size's instance) answer as the helpers do.
    #[test]
    fn program_ops_errors_and_values() {
        let t = tmp("ops");
        for (n, mt) in types().into_iter().enumerate() {
            for ks in [4, 8, 12, 16] {
                let m = map(&t, &format!("m{n}-{ks}"), mt, ks, 8, 2);
                let (a, b) = (key(1, ks), key(2, ks));
                assert_eq!(update(&m, &a, 10, BPF_EXIST, 1), -(libc::ENOENT as i64));
                assert_eq!(update(&m, &a, 11, BPF_NOEXIST, 1), 0);
                assert_eq!(update(&m, &a, 12, BPF_NOEXIST, 0), -(libc::EEXIST as i64));
                assert_eq!(update(&m, &a, 13, BPF_EXIST, 1), 0);
                assert_eq!(update(&m, &a, 14, 3, 1), -(libc::EINVAL as i64));
                assert_eq!(update(&m, &a, 15, BPF_F_LOCK, 1), -(libc::EINVAL as i64));
                assert_eq!(update(&m, &b, 20, BPF_ANY, 0), 0);
                // SAFETY: values of this map (8 bytes, aligned).
                unsafe {
                    assert_eq!((lookup(&m, &a, 1) as *const u64).read(), 13, "{mt:?} key size {ks}");
                    assert_eq!((lookup(&m, &b, 0) as *const u64).read(), 20, "{mt:?} key size {ks}");
                }
                assert_eq!(delete(&m, &a, 1), 0);
                assert_eq!(delete(&m, &a, 1), -(libc::ENOENT as i64));
                assert_eq!(lookup(&m, &a, 1), 0);
                assert_eq!(m.len(), 1);
                // The syscall side sees what the programs wrote.
                let mut out = vec![0u8; 8 * if m.percpu { 2 } else { 1 }];
                m.lookup_elem(&b, &mut out).unwrap();
                assert_eq!(u64::from_ne_bytes(out[..8].try_into().unwrap()), 20);
            }
        }
    }
}
