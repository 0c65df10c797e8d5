//! BLOOM_FILTER: the kernel's bit array and hashing (bloom_filter.c), so the same values set
//! the same bits as in the kernel (identical false positives when BPF_F_ZERO_SEED is given).
//!
//! `nr_hashes = map_extra & 0xf` (0 means 5). The bit array has
//! `roundup_pow_of_two(max_entries * nr_hashes / 5 * 7)` bits (at least 64; 2^32 if that
//! overflows or exceeds 2^31). Hash `i` of a value is `jhash2(value, value_size / 4, seed + i)`
//! when value_size is a multiple of 4, else `jhash(value, value_size, seed + i)`, masked.
//!
//! File layout:
//!
//! ```text
//! 0       MapHeader
//! 128     seed: u32 (random unless BPF_F_ZERO_SEED)
//! 4096    bits: u64 words, bit h in word h / 64 at position h % 64
//! end     rounded up to a page
//! ```
//!
//! Lock-free: adding sets bits with atomic `fetch_or`; testing loads words.

use std::sync::atomic::Ordering::Relaxed;

use crate::map::*;
use crate::mem::{a32, a64, jhash, jhash2, round_up};
use crate::shm::PAGE_SIZE;
use crate::types::*;

const H_SEED: usize = EXT_OFF;
const BLOOM_CREATE_FLAG_MASK: u32 = BPF_F_NUMA_NODE | BPF_F_ZERO_SEED | ACCESS_MASK;

pub struct BloomFilter {
    base: Base,
    vs: usize,
    nr_hashes: u32,
    mask: u32,
    seed: u32,
    bits: *mut u8,
}

// SAFETY: the raw pointer points into `base.shm` (Send + Sync), alive as long as the struct;
// bits are only accessed atomically.
unsafe impl Send for BloomFilter {}
// SAFETY: as above.
unsafe impl Sync for BloomFilter {}

/// (nr_hashes, bitset_mask, bitset bytes) as the kernel's bloom_map_alloc computes them.
fn geometry(spec: &MapSpec) -> (u32, u32, u64) {
    let nr_hashes = match (spec.map_extra & 0xf) as u32 {
        0 => 5,
        n => n,
    };
    let nr_bits =
        spec.max_entries.checked_mul(nr_hashes).and_then(|n| (n / 5).checked_mul(7)).filter(|&n| n <= 1 << 31);
    let (bytes, mask) = match nr_bits {
        None => ((u32::MAX as u64).div_ceil(8), u32::MAX),
        Some(n) => {
            let n = if n <= 64 { 64 } else { n.next_power_of_two() };
            ((n as u64).div_ceil(8), n - 1)
        }
    };
    (nr_hashes, mask, round_up(bytes, 8))
}

impl BloomFilter {
    pub(crate) fn check(spec: &MapSpec) -> Result<(), MapError> {
        if spec.value_size as u64 > KMALLOC_MAX_SIZE {
            return Err(e2big("value too large"));
        }
        if spec.key_size != 0
            || spec.value_size == 0
            || spec.max_entries == 0
            || spec.map_flags & !BLOOM_CREATE_FLAG_MASK != 0
            || !access_ok(spec.map_flags)
            || spec.map_extra & !0xf != 0
        {
            return Err(einval("invalid bloom filter attributes"));
        }
        Ok(())
    }

    pub(crate) fn file_size(spec: &MapSpec) -> Option<u64> {
        Some(round_up(DATA_OFF as u64 + geometry(spec).2, PAGE_SIZE as u64))
    }

    fn from_base(base: Base) -> BloomFilter {
        let (nr_hashes, mask, _) = geometry(&base.spec);
        // SAFETY: aligned field of the type header; DATA_OFF is inside the file.
        let (seed, bits) = unsafe { (a32(base.at(H_SEED)).load(Relaxed), base.at(DATA_OFF)) };
        BloomFilter { vs: base.spec.value_size as usize, nr_hashes, mask, seed, bits, base }
    }

    pub(crate) fn create(base: Base) -> Result<BloomFilter, MapError> {
        let mut seed = 0u32;
        if base.spec.map_flags & BPF_F_ZERO_SEED == 0 {
            let mut b = [0u8; 4];
            // SAFETY: getrandom writes at most 4 bytes into the local buffer.
            let r = unsafe { libc::getrandom(b.as_mut_ptr().cast(), 4, 0) };
            seed = if r == 4 { u32::from_ne_bytes(b) } else { std::process::id().wrapping_mul(0x9e37_79b9) };
        }
        // SAFETY: aligned field of the type header.
        unsafe { a32(base.at(H_SEED)) }.store(seed, Relaxed);
        Ok(BloomFilter::from_base(base))
    }

    pub(crate) fn open(base: Base) -> BloomFilter {
        BloomFilter::from_base(base)
    }

    pub(crate) fn base(&self) -> &Base {
        &self.base
    }

    /// Bit index of hash `i` of the value at `value`.
    ///
    /// # Safety
    /// `value` readable for value_size bytes.
    #[inline]
    unsafe fn bit(&self, value: *const u8, i: u32) -> u32 {
        let init = self.seed.wrapping_add(i);
        // SAFETY: value_size readable bytes (caller).
        let h = unsafe {
            if self.vs.is_multiple_of(4) { jhash2(value, self.vs / 4, init) } else { jhash(value, self.vs, init) }
        };
        h & self.mask
    }

    /// # Safety
    /// `h <= mask`.
    #[inline]
    unsafe fn word(&self, h: u32) -> &std::sync::atomic::AtomicU64 {
        // SAFETY: bit h <= mask lies in the bitset (sized for mask + 1 bits, whole words).
        unsafe { a64(self.bits.add(8 * (h / 64) as usize)) }
    }

    /// `map_push_elem`: adds the value.
    ///
    /// # Safety
    /// `value` readable for value_size bytes.
    pub(crate) unsafe fn push(&self, value: *const u8, flags: u64) -> Result<(), MapError> {
        if flags != BPF_ANY {
            return Err(EBAD_FLAGS);
        }
        for i in 0..self.nr_hashes {
            // SAFETY: value readable (caller); bit() <= mask.
            unsafe {
                let h = self.bit(value, i);
                self.word(h).fetch_or(1 << (h % 64), Relaxed);
            }
        }
        Ok(())
    }

    /// `map_peek_elem`: Ok if the value may have been added, `ENOENT` if certainly not.
    ///
    /// # Safety
    /// `value` readable for value_size bytes.
    pub(crate) unsafe fn peek(&self, value: *const u8) -> Result<(), MapError> {
        for i in 0..self.nr_hashes {
            // SAFETY: value readable (caller); bit() <= mask.
            unsafe {
                let h = self.bit(value, i);
                if self.word(h).load(Relaxed) & (1 << (h % 64)) == 0 {
                    return Err(ENOENT);
                }
            }
        }
        Ok(())
    }

    pub(crate) fn peek_sys(&self, value: &[u8]) -> Result<(), MapError> {
        // SAFETY: value holds value_size bytes (checked by Map).
        unsafe { self.peek(value.as_ptr()) }
    }
}
