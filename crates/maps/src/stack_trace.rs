//! STACK_TRACE: stack ids are bucket numbers chosen by the kernel's own hash of the trace.
//!
//! File layout (`depth = value_size / 8`, `n_buckets = roundup_pow_of_two(max_entries)`):
//!
//! ```text
//! 0       MapHeader
//! 128     free_head: u64 (free list: tag << 32 | element index)
//! 4096    buckets[n_buckets]: u32, element index + 1 (0 = empty); the bucket number is the id
//! E       (64-aligned) elements[max_entries], each
//!           +0 flink: u32, +4 hash: u32 (jhash2 of the trace), +8 nr: u32 (ips stored),
//!           +12 pad, +16 ips: [u64; depth]
//! end     rounded up to a page
//! ```
//!
//! Semantics follow the kernel's `__bpf_get_stackid`: the trace after `skip` frames (at most
//! `depth` of them, and at most sysctl perf_event_max_stack = 127 frames before skipping) is
//! hashed with `jhash2(ips, nr * 2, 0)`; the id is `hash & (n_buckets - 1)`. A bucket holding
//! the same trace (or the same hash with BPF_F_FAST_STACK_CMP) returns the id; a bucket
//! holding another trace gives `EEXIST` unless BPF_F_REUSE_STACKID, which replaces it. A new
//! trace takes an element from the free list (max_entries of them; `ENOMEM` when none is
//! left, as in the kernel).
//!
//! Concurrency: lock-free like the kernel's. Buckets change by atomic exchange; a replaced
//! element goes back to the lock-free free list. A syscall lookup takes the element out of
//! its bucket while copying it (so it cannot be reused meanwhile) and puts it back, exactly as
//! the kernel's bpf_stackmap_copy.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::*};

use crate::map::*;
use crate::mem::{a32, a64, copy_out, jhash2, round_up};
use crate::shm::PAGE_SIZE;
use crate::sync::{FreeList, NIL};
use crate::types::*;

const H_FREE: usize = EXT_OFF;
const E_FLINK: usize = 0;
const E_HASH: usize = 4;
const E_NR: usize = 8;
const E_IPS: usize = 16;

/// The kernel's default sysctl kernel.perf_event_max_stack.
pub const PERF_EVENT_MAX_STACK: u32 = 127;

const STACK_CREATE_FLAG_MASK: u32 = BPF_F_NUMA_NODE | BPF_F_RDONLY | BPF_F_WRONLY | BPF_F_STACK_BUILD_ID;

pub struct StackTraceMap {
    base: Base,
    depth: usize,
    n_buckets: u32,
    n_elems: u32,
    elem_size: usize,
    buckets: *mut u8,
    elems: *mut u8,
}

// SAFETY: the raw pointers point into `base.shm` (Send + Sync), alive as long as the struct;
// all shared state is accessed atomically.
unsafe impl Send for StackTraceMap {}
// SAFETY: as above.
unsafe impl Sync for StackTraceMap {}

fn geometry(spec: &MapSpec) -> Option<(u32, usize, usize, u64)> {
    let n_buckets = spec.max_entries.checked_next_power_of_two()?;
    let elem_size = 16 + spec.value_size as u64;
    let elems_off = round_up(DATA_OFF as u64 + 4 * n_buckets as u64, 64);
    let size = round_up(elems_off + elem_size * spec.max_entries as u64, PAGE_SIZE as u64);
    Some((n_buckets, elem_size as usize, elems_off as usize, size))
}

impl StackTraceMap {
    pub(crate) fn check(spec: &MapSpec) -> Result<(), MapError> {
        let f = spec.map_flags;
        if f & !STACK_CREATE_FLAG_MASK != 0 {
            return Err(einval("invalid stack trace map flags"));
        }
        let vs = spec.value_size;
        if spec.max_entries == 0 || spec.key_size != 4 || vs < 8 || !vs.is_multiple_of(8) {
            return Err(einval("invalid stack trace map sizes"));
        }
        if f & BPF_F_STACK_BUILD_ID != 0 {
            // Build-id stacks need ELF parsing of the target's mappings: not supported.
            return Err(einval("BPF_F_STACK_BUILD_ID is not supported"));
        }
        if vs / 8 > PERF_EVENT_MAX_STACK {
            return Err(einval("stack deeper than perf_event_max_stack"));
        }
        if spec.max_entries > 1 << 31 {
            return Err(e2big("too many entries"));
        }
        Ok(())
    }

    pub(crate) fn file_size(spec: &MapSpec) -> Option<u64> {
        geometry(spec).map(|g| g.3)
    }

    fn from_base(base: Base) -> StackTraceMap {
        let (n_buckets, elem_size, elems_off, _) = geometry(&base.spec).unwrap_or((1, 16, DATA_OFF, 0));
        // SAFETY: offsets computed by the layout that sized the file.
        let (buckets, elems) = unsafe { (base.at(DATA_OFF), base.at(elems_off)) };
        StackTraceMap {
            depth: base.spec.value_size as usize / 8,
            n_buckets,
            n_elems: base.spec.max_entries,
            elem_size,
            buckets,
            elems,
            base,
        }
    }

    pub(crate) fn create(base: Base) -> StackTraceMap {
        let m = StackTraceMap::from_base(base);
        for i in 0..m.n_elems {
            // SAFETY: i < n_elems; flink is the element's first aligned word.
            unsafe { a32(m.elem(i).add(E_FLINK)) }.store(if i + 1 < m.n_elems { i + 1 } else { NIL }, Relaxed);
        }
        m.free_head().store(0, Release);
        m
    }

    pub(crate) fn open(base: Base) -> StackTraceMap {
        StackTraceMap::from_base(base)
    }

    pub(crate) fn base(&self) -> &Base {
        &self.base
    }

    fn free_head(&self) -> &AtomicU64 {
        // SAFETY: aligned field of the type header.
        unsafe { a64(self.base.at(H_FREE)) }
    }
    /// # Safety
    /// `i < n_elems`.
    unsafe fn elem(&self, i: u32) -> *mut u8 {
        // SAFETY: inside the element array (caller's bound).
        unsafe { self.elems.add(i as usize * self.elem_size) }
    }
    fn bucket(&self, id: u32) -> Option<&AtomicU32> {
        // SAFETY: id < n_buckets is checked; bucket words are 4-aligned.
        (id < self.n_buckets).then(|| unsafe { a32(self.buckets.add(4 * id as usize)) })
    }
    fn freelist<'a>(&'a self) -> FreeList<'a, impl Fn(u32) -> Option<&'a AtomicU32> + 'a> {
        FreeList {
            head: self.free_head(),
            // SAFETY: i < n_elems is checked.
            link: move |i: u32| (i < self.n_elems).then(|| unsafe { a32(self.elem(i).add(E_FLINK)) }),
        }
    }
    /// The element a bucket word names, if valid.
    fn decode(&self, word: u32) -> Option<u32> {
        let i = word.wrapping_sub(1);
        (word != 0 && i < self.n_elems).then_some(i)
    }

    /// `bpf_get_stackid` over `ips` (innermost frame first).
    pub fn get_stackid(&self, ips: &[u64], flags: u64) -> Result<u32, MapError> {
        if flags & !(BPF_F_SKIP_FIELD_MASK | BPF_F_USER_STACK | BPF_F_FAST_STACK_CMP | BPF_F_REUSE_STACKID) != 0 {
            return Err(EBAD_FLAGS);
        }
        let skip = (flags & BPF_F_SKIP_FIELD_MASK) as usize;
        // The callchain the kernel captures holds at most depth + skip frames (capped by the
        // sysctl); `skip` of them are then dropped.
        let total = ips.len().min(self.depth + skip).min(PERF_EVENT_MAX_STACK as usize);
        if total <= skip {
            return Err(MapError::new(libc::EFAULT, "stack shorter than the frames to skip"));
        }
        let trace = &ips[skip..total];
        let nr = trace.len();
        // SAFETY: `trace` is nr u64s = 2 * nr readable u32 words.
        let hash = unsafe { jhash2(trace.as_ptr().cast(), nr * 2, 0) };
        let id = hash & (self.n_buckets - 1);
        let Some(bucket) = self.bucket(id) else { return Err(EBAD_FLAGS) };
        let cur = self.decode(bucket.load(Acquire));
        if let Some(c) = cur {
            // SAFETY: c < n_elems.
            let e = unsafe { self.elem(c) };
            // SAFETY: aligned fields of element c.
            let same_hash = unsafe { a32(e.add(E_HASH)) }.load(Relaxed) == hash;
            if same_hash && flags & BPF_F_FAST_STACK_CMP != 0 {
                return Ok(id);
            }
            // SAFETY: aligned field of element c.
            let same_nr = unsafe { a32(e.add(E_NR)) }.load(Relaxed) as usize == nr;
            let same_ips = || {
                trace.iter().enumerate().all(|(k, &ip)| {
                    // SAFETY: ips word k < nr <= depth of element c, 8-aligned.
                    unsafe { a64(e.add(E_IPS + 8 * k)) }.load(Relaxed) == ip
                })
            };
            if same_hash && same_nr && same_ips() {
                return Ok(id);
            }
            if flags & BPF_F_REUSE_STACKID == 0 {
                return Err(EEXIST);
            }
        }
        let Some(n) = self.freelist().pop() else {
            return Err(MapError::new(libc::ENOMEM, "no free stack trace element"));
        };
        // SAFETY: n < n_elems and ours until published; nr <= depth.
        unsafe {
            let e = self.elem(n);
            for (k, &ip) in trace.iter().enumerate() {
                a64(e.add(E_IPS + 8 * k)).store(ip, Relaxed);
            }
            a32(e.add(E_HASH)).store(hash, Relaxed);
            a32(e.add(E_NR)).store(nr as u32, Relaxed);
        }
        let old = bucket.swap(n + 1, AcqRel);
        if let Some(o) = self.decode(old) {
            self.freelist().push(o);
        }
        Ok(id)
    }

    fn id_of(key: &[u8]) -> u32 {
        u32::from_ne_bytes([key[0], key[1], key[2], key[3]])
    }

    pub(crate) fn lookup_elem(&self, key: &[u8], out: &mut [u8]) -> Result<(), MapError> {
        let Some(bucket) = self.bucket(Self::id_of(key)) else { return Err(ENOENT) };
        let taken = bucket.swap(0, AcqRel);
        let Some(i) = self.decode(taken) else { return Err(ENOENT) };
        // SAFETY: i < n_elems, taken out of its bucket so nobody reuses it meanwhile.
        unsafe {
            let e = self.elem(i);
            let nr = (a32(e.add(E_NR)).load(Relaxed) as usize).min(self.depth);
            copy_out(e.add(E_IPS), out.as_mut_ptr(), 8 * nr);
        }
        // SAFETY: as above.
        let nr = (unsafe { a32(self.elem(i).add(E_NR)) }.load(Relaxed) as usize).min(self.depth);
        out[8 * nr..8 * self.depth].fill(0);
        let old = bucket.swap(taken, AcqRel);
        if let Some(o) = self.decode(old) {
            self.freelist().push(o);
        }
        Ok(())
    }

    fn delete_id(&self, id: u32) -> Result<(), MapError> {
        let Some(bucket) = self.bucket(id) else { return Err(e2big("stack id beyond the buckets")) };
        match self.decode(bucket.swap(0, AcqRel)) {
            Some(o) => {
                self.freelist().push(o);
                Ok(())
            }
            None => Err(ENOENT),
        }
    }

    pub(crate) fn delete_elem(&self, key: &[u8]) -> Result<(), MapError> {
        self.delete_id(Self::id_of(key))
    }

    /// # Safety
    /// `key` readable for 4 bytes.
    pub(crate) unsafe fn delete(&self, key: *const u8) -> Result<(), MapError> {
        // SAFETY: 4 readable bytes (caller).
        self.delete_id(unsafe { key.cast::<u32>().read_unaligned() })
    }

    pub(crate) fn get_next_key(&self, key: Option<&[u8]>, out: &mut [u8]) -> Result<(), MapError> {
        let occupied = |id: u32| self.bucket(id).is_some_and(|b| b.load(Relaxed) != 0);
        let mut id = match key {
            None => 0,
            Some(k) => {
                let id = Self::id_of(k);
                if id >= self.n_buckets || !occupied(id) { 0 } else { id + 1 }
            }
        };
        while id < self.n_buckets && !occupied(id) {
            id += 1;
        }
        if id >= self.n_buckets {
            return Err(ENOENT);
        }
        out[..4].copy_from_slice(&id.to_ne_bytes());
        Ok(())
    }
}
