//! QUEUE and STACK: a ring of `max_entries + 1` slots (one always empty), as the kernel's
//! queue_stack_maps.c.
//!
//! File layout (`vs8 = round_up(value_size, 8)`, `size = max_entries + 1`):
//!
//! ```text
//! 0       MapHeader
//! 128     lock: u32 (0 or holder thread id), head: u32 (next slot to write), tail: u32 (oldest)
//! 4096    slots[size], vs8 bytes each
//! end     rounded up to a page
//! ```
//!
//! Every operation takes the map's [`SpinLock`] (bounded spinning, then `EBUSY`, as the
//! kernel's trylock in NMI context). Indices read from the file are reduced modulo `size`, so
//! a corrupt file cannot send a copy out of bounds. Each operation moves at most one index
//! with one store after copying, so a holder that dies mid-operation leaves the ring
//! consistent.

use std::sync::atomic::{AtomicU32, Ordering::Relaxed};

use crate::map::*;
use crate::mem::{a32, copy_in, copy_out, round_up, round8};
use crate::shm::PAGE_SIZE;
use crate::sync::{SpinLock, Wait};
use crate::types::*;

const H_LOCK: usize = EXT_OFF;
const H_HEAD: usize = EXT_OFF + 4;
const H_TAIL: usize = EXT_OFF + 8;

const QUEUE_STACK_CREATE_FLAG_MASK: u32 = BPF_F_NUMA_NODE | ACCESS_MASK;

pub struct QueueStackMap {
    base: Base,
    stack: bool,
    size: u32,
    vs: usize,
    vs8: usize,
    slots: *mut u8,
}

// SAFETY: the raw pointer points into `base.shm` (Send + Sync), alive as long as the struct;
// the ring is only touched under the map's lock, with atomic word copies.
unsafe impl Send for QueueStackMap {}
// SAFETY: as above.
unsafe impl Sync for QueueStackMap {}

impl QueueStackMap {
    pub(crate) fn check(spec: &MapSpec) -> Result<(), MapError> {
        if spec.max_entries == 0
            || spec.key_size != 0
            || spec.value_size == 0
            || spec.map_flags & !QUEUE_STACK_CREATE_FLAG_MASK != 0
            || !access_ok(spec.map_flags)
        {
            return Err(einval("invalid queue/stack attributes"));
        }
        if spec.value_size as u64 > KMALLOC_MAX_SIZE {
            return Err(e2big("value too large"));
        }
        Ok(())
    }

    pub(crate) fn file_size(spec: &MapSpec) -> Option<u64> {
        let slots = (spec.max_entries as u64 + 1).checked_mul(round_up(spec.value_size as u64, 8))?;
        Some(round_up(DATA_OFF as u64 + slots, PAGE_SIZE as u64))
    }

    /// A zero-filled file is an empty ring: nothing to initialise.
    pub(crate) fn new(base: Base) -> QueueStackMap {
        // SAFETY: DATA_OFF is inside the file (file_size).
        let slots = unsafe { base.at(DATA_OFF) };
        QueueStackMap {
            stack: base.spec.map_type == MapType::BPF_MAP_TYPE_STACK,
            size: base.spec.max_entries.saturating_add(1),
            vs: base.spec.value_size as usize,
            vs8: round8(base.spec.value_size as usize),
            slots,
            base,
        }
    }

    pub(crate) fn base(&self) -> &Base {
        &self.base
    }

    fn word(&self, off: usize) -> &AtomicU32 {
        // SAFETY: aligned fields of the type header, in the first page.
        unsafe { a32(self.base.at(off)) }
    }
    /// # Safety
    /// `i < size`.
    unsafe fn slot(&self, i: u32) -> *mut u8 {
        // SAFETY: inside the slots (caller's bound).
        unsafe { self.slots.add(i as usize * self.vs8) }
    }

    /// `map_push_elem`.
    ///
    /// # Safety
    /// `value` readable for value_size bytes.
    pub(crate) unsafe fn push(&self, value: *const u8, flags: u64, wait: Wait) -> Result<(), MapError> {
        if flags & BPF_NOEXIST != 0 || flags > BPF_EXIST {
            return Err(EBAD_FLAGS);
        }
        let _g = SpinLock::new(self.word(H_LOCK)).lock(wait)?;
        let head = self.word(H_HEAD).load(Relaxed) % self.size;
        let mut tail = self.word(H_TAIL).load(Relaxed) % self.size;
        let next_head = if head + 1 >= self.size { 0 } else { head + 1 };
        if next_head == tail {
            if flags & BPF_EXIST == 0 {
                return Err(e2big("queue/stack is full"));
            }
            // Overwrite the oldest element.
            tail = if tail + 1 >= self.size { 0 } else { tail + 1 };
            self.word(H_TAIL).store(tail, Relaxed);
        }
        // SAFETY: head < size; value readable (caller).
        unsafe { copy_in(self.slot(head), value, self.vs) };
        self.word(H_HEAD).store(next_head, Relaxed);
        Ok(())
    }

    /// `map_pop_elem` (`delete`) or `map_peek_elem`.
    ///
    /// # Safety
    /// `out` writable for value_size bytes.
    pub(crate) unsafe fn pop(&self, out: *mut u8, delete: bool, wait: Wait) -> Result<(), MapError> {
        let _g = SpinLock::new(self.word(H_LOCK)).lock(wait)?;
        let head = self.word(H_HEAD).load(Relaxed) % self.size;
        let tail = self.word(H_TAIL).load(Relaxed) % self.size;
        if head == tail {
            return Err(ENOENT);
        }
        if self.stack {
            let idx = if head == 0 { self.size - 1 } else { head - 1 };
            // SAFETY: idx < size; out writable (caller).
            unsafe { copy_out(self.slot(idx), out, self.vs) };
            if delete {
                self.word(H_HEAD).store(idx, Relaxed);
            }
        } else {
            // SAFETY: tail < size; out writable (caller).
            unsafe { copy_out(self.slot(tail), out, self.vs) };
            if delete {
                self.word(H_TAIL).store(if tail + 1 >= self.size { 0 } else { tail + 1 }, Relaxed);
            }
        }
        Ok(())
    }

    pub(crate) fn peek_sys(&self, out: &mut [u8]) -> Result<(), MapError> {
        // SAFETY: out holds value_size bytes (checked by Map).
        unsafe { self.pop(out.as_mut_ptr(), false, Wait::Sys) }
    }
}
