//! ARRAY, PERCPU_ARRAY, PROG_ARRAY and ARRAY_OF_MAPS.
//!
//! File layout (`stride = round_up(value_size, 8)`):
//!
//! ```text
//! 0       MapHeader
//! 4096    ARRAY:        values[max_entries], `stride` bytes each, zero padded
//! 4096 + PCPU_COLOUR
//!         PERCPU_ARRAY: nr_cpus regions, one per CPU, each values[max_entries] and rounded up
//!                       to 64 bytes (CPU-major, so CPUs never share a cache line of a value)
//!         PROG_ARRAY / ARRAY_OF_MAPS: slots[max_entries] of 8 bytes, the u32 id in the low
//!                       4 bytes (0 = empty)
//! end     rounded up to a page
//! ```
//!
//! Values start page-aligned, so a BPF_F_MMAPABLE array's values are the file's
//! `[4096, 4096 + round_up(max_entries * stride, 4096))`, which the runtime can map for
//! userspace as the kernel's array mmap does.
//!
//! Concurrency: nothing to lock. Lookups are an index check and an address computation;
//! updates copy the value word by word with relaxed atomic stores (a concurrent reader may see
//! a mix of old and new words, as with the kernel's in-place array updates); id slots are
//! single atomic words.

use std::sync::atomic::Ordering;

use crate::map::*;
use crate::mem::{a32, copy_in, copy_out, round_up, round8};
use crate::shm::PAGE_SIZE;
use crate::types::*;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Plain,
    PerCpu,
    /// PROG_ARRAY and ARRAY_OF_MAPS: u32 ids.
    Ids,
}

/// Where a per-CPU array's values start after [`DATA_OFF`]: not at a page's start, where every
/// page-aligned object of a probed process competes for one level-1 data cache set (the set is
/// chosen by the address bits within the page). A counter probe touches its CPU's value on
/// every hit; measured in fio under callgrind's cache model (2026-11-26), each of a probe's
/// per-hit lines at page offset 0 cost fio a miss per I/O in lines of its own. (Plain arrays
/// stay page-aligned: they can be mapped into user space as the kernel's.)
const PCPU_COLOUR: usize = 0x340;

const ARRAY_CREATE_FLAG_MASK: u32 =
    BPF_F_NUMA_NODE | BPF_F_MMAPABLE | ACCESS_MASK | BPF_F_PRESERVE_ELEMS | BPF_F_INNER_MAP;

pub struct ArrayMap {
    base: Base,
    kind: Kind,
    max: u32,
    vs: usize,
    stride: usize,
    values: *mut u8,
    /// Bytes of one CPU's region (per-CPU arrays), else 0.
    cpu_stride: usize,
    nr_cpus: u32,
}

// SAFETY: the raw pointer points into `base.shm`, which is Send + Sync and lives as long as
// the struct; all access through it is atomic or documented as racing like the kernel's.
unsafe impl Send for ArrayMap {}
// SAFETY: as above.
unsafe impl Sync for ArrayMap {}

impl ArrayMap {
    pub(crate) fn check(spec: &MapSpec) -> Result<(), MapError> {
        let t = spec.map_type;
        let percpu = t == MapType::BPF_MAP_TYPE_PERCPU_ARRAY;
        let ids = matches!(t, MapType::BPF_MAP_TYPE_PROG_ARRAY | MapType::BPF_MAP_TYPE_ARRAY_OF_MAPS);
        let f = spec.map_flags;
        if ids && (spec.value_size != 4 || f & (BPF_F_RDONLY_PROG | BPF_F_WRONLY_PROG) != 0) {
            return Err(einval("prog and map-in-map arrays hold 4-byte ids"));
        }
        if spec.max_entries == 0
            || spec.key_size != 4
            || spec.value_size == 0
            || f & !ARRAY_CREATE_FLAG_MASK != 0
            || !access_ok(f)
            || (percpu && f & BPF_F_NUMA_NODE != 0)
        {
            return Err(einval("invalid array map attributes"));
        }
        if t != MapType::BPF_MAP_TYPE_ARRAY && f & (BPF_F_MMAPABLE | BPF_F_INNER_MAP) != 0 {
            return Err(einval("BPF_F_MMAPABLE and BPF_F_INNER_MAP are for plain arrays"));
        }
        if f & BPF_F_PRESERVE_ELEMS != 0 {
            return Err(einval("BPF_F_PRESERVE_ELEMS is for perf event arrays"));
        }
        if spec.value_size > i32::MAX as u32 {
            return Err(e2big("value too large"));
        }
        if percpu && round_up(spec.value_size as u64, 8) > PCPU_MIN_UNIT_SIZE {
            return Err(e2big("per-CPU value too large"));
        }
        Ok(())
    }

    fn geometry(spec: &MapSpec) -> (usize, usize) {
        let stride = round8(spec.value_size as usize);
        let cpu_stride = if spec.map_type == MapType::BPF_MAP_TYPE_PERCPU_ARRAY {
            round_up(spec.max_entries as u64 * stride as u64, 64) as usize
        } else {
            0
        };
        (stride, cpu_stride)
    }

    pub(crate) fn file_size(spec: &MapSpec, nr_cpus: u32) -> Option<u64> {
        let stride = round_up(spec.value_size as u64, 8);
        let data = if spec.map_type == MapType::BPF_MAP_TYPE_PERCPU_ARRAY {
            round_up(spec.max_entries as u64 * stride, 64).checked_mul(nr_cpus as u64)? + PCPU_COLOUR as u64
        } else {
            spec.max_entries as u64 * stride
        };
        Some(round_up(DATA_OFF as u64 + data, PAGE_SIZE as u64))
    }

    /// Fresh files are zero-filled, which is an array of zero values: nothing to initialise.
    pub(crate) fn new(base: Base) -> ArrayMap {
        let (stride, cpu_stride) = Self::geometry(&base.spec);
        let kind = match base.spec.map_type {
            MapType::BPF_MAP_TYPE_PERCPU_ARRAY => Kind::PerCpu,
            MapType::BPF_MAP_TYPE_PROG_ARRAY | MapType::BPF_MAP_TYPE_ARRAY_OF_MAPS => Kind::Ids,
            _ => Kind::Plain,
        };
        let off = if kind == Kind::PerCpu { DATA_OFF + PCPU_COLOUR } else { DATA_OFF };
        // SAFETY: `off` is inside every array file of this kind (file_size >= DATA_OFF + data,
        // which counts PCPU_COLOUR for per-CPU arrays).
        let values = unsafe { base.at(off) };
        ArrayMap {
            kind,
            max: base.spec.max_entries,
            vs: base.spec.value_size as usize,
            stride,
            values,
            cpu_stride,
            nr_cpus: base.nr_cpus,
            base,
        }
    }

    pub(crate) fn base(&self) -> &Base {
        &self.base
    }

    /// A plain array's values: file offset and length in whole pages (whatever its flags).
    pub(crate) fn values_region(&self) -> Option<(usize, usize)> {
        (self.kind == Kind::Plain)
            .then(|| (DATA_OFF, round_up(self.max as u64 * self.stride as u64, PAGE_SIZE as u64) as usize))
    }

    pub(crate) fn mmapable(&self) -> Option<(usize, usize)> {
        (self.base.spec.map_flags & BPF_F_MMAPABLE != 0)
            .then(|| (DATA_OFF, round_up(self.max as u64 * self.stride as u64, PAGE_SIZE as u64) as usize))
    }

    #[inline(always)]
    fn cpu(&self, cpu: u32) -> usize {
        (if cpu < self.nr_cpus { cpu } else { cpu % self.nr_cpus }) as usize
    }

    /// The slot of `idx` (< max) for `cpu`.
    ///
    /// # Safety
    /// `idx < max`.
    #[inline(always)]
    unsafe fn slot(&self, idx: u32, cpu: usize) -> *mut u8 {
        // SAFETY: idx < max and cpu < nr_cpus, so the offset is inside the values the layout
        // reserved.
        unsafe { self.values.add(cpu * self.cpu_stride + idx as usize * self.stride) }
    }

    #[inline(always)]
    fn index(key: &[u8]) -> u32 {
        u32::from_ne_bytes([key[0], key[1], key[2], key[3]])
    }

    /// # Safety
    /// `key` readable for 4 bytes.
    #[inline(always)]
    pub(crate) unsafe fn lookup(&self, key: *const u8, cpu: u32) -> *mut u8 {
        // SAFETY: 4 readable bytes (caller).
        let idx = unsafe { key.cast::<u32>().read_unaligned() };
        if idx >= self.max {
            return std::ptr::null_mut();
        }
        match self.kind {
            // SAFETY: idx < max.
            Kind::Plain => unsafe { self.slot(idx, 0) },
            // SAFETY: idx < max, cpu reduced below nr_cpus.
            Kind::PerCpu => unsafe { self.slot(idx, self.cpu(cpu)) },
            Kind::Ids => {
                // SAFETY: idx < max; slots are 8-aligned.
                let p = unsafe { self.slot(idx, 0) };
                // SAFETY: p is an aligned id slot inside the mapping.
                if unsafe { a32(p) }.load(Ordering::Acquire) == 0 { std::ptr::null_mut() } else { p }
            }
        }
    }

    /// A program's update: in place, per-CPU maps only `cpu`'s slot.
    ///
    /// # Safety
    /// `key` readable for 4 bytes, `value` for value_size bytes.
    #[inline]
    pub(crate) unsafe fn update(&self, key: *const u8, value: *const u8, flags: u64, cpu: u32) -> Result<(), MapError> {
        if self.kind == Kind::Ids {
            return Err(einval("prog and map-in-map arrays are not updated by programs"));
        }
        // SAFETY: 4 readable bytes (caller).
        let idx = unsafe { key.cast::<u32>().read_unaligned() };
        self.check_update(idx, flags)?;
        // SAFETY: idx < max (checked); `value` readable for vs bytes (caller); the slot holds
        // round8(vs) bytes.
        unsafe { copy_in(self.slot(idx, self.cpu(cpu)), value, self.vs) };
        Ok(())
    }

    fn check_update(&self, idx: u32, flags: u64) -> Result<(), MapError> {
        if (flags & !BPF_F_LOCK) > BPF_EXIST {
            return Err(EBAD_FLAGS);
        }
        if idx >= self.max {
            return Err(e2big("index beyond max_entries"));
        }
        if flags & BPF_NOEXIST != 0 {
            return Err(EEXIST);
        }
        if flags & BPF_F_LOCK != 0 {
            return Err(einval("BPF_F_LOCK without a bpf_spin_lock in the value"));
        }
        Ok(())
    }

    /// # Safety
    /// `key` readable for 4 bytes.
    pub(crate) unsafe fn delete(&self, key: *const u8) -> Result<(), MapError> {
        // SAFETY: 4 readable bytes (caller).
        let idx = unsafe { key.cast::<u32>().read_unaligned() };
        self.delete_idx(idx)
    }

    fn delete_idx(&self, idx: u32) -> Result<(), MapError> {
        if self.kind != Kind::Ids {
            return Err(einval("array elements cannot be deleted"));
        }
        if idx >= self.max {
            return Err(e2big("index beyond max_entries"));
        }
        // SAFETY: idx < max; aligned id slot.
        let old = unsafe { a32(self.slot(idx, 0)) }.swap(0, Ordering::AcqRel);
        if old == 0 { Err(ENOENT) } else { Ok(()) }
    }

    pub(crate) fn lookup_elem(&self, key: &[u8], out: &mut [u8]) -> Result<(), MapError> {
        let idx = Self::index(key);
        if idx >= self.max {
            return Err(ENOENT);
        }
        match self.kind {
            // SAFETY: idx < max; `out` holds at least vs bytes (checked by Map).
            Kind::Plain => unsafe { copy_out(self.slot(idx, 0), out.as_mut_ptr(), self.vs) },
            Kind::PerCpu => {
                // The kernel copies round_up(value_size, 8) bytes per CPU.
                for cpu in 0..self.nr_cpus as usize {
                    // SAFETY: idx < max, cpu < nr_cpus; `out` holds nr_cpus * stride bytes.
                    unsafe { copy_out(self.slot(idx, cpu), out.as_mut_ptr().add(cpu * self.stride), self.stride) };
                }
            }
            Kind::Ids => {
                // SAFETY: idx < max; aligned id slot.
                let id = unsafe { a32(self.slot(idx, 0)) }.load(Ordering::Acquire);
                if id == 0 {
                    return Err(ENOENT);
                }
                out[..4].copy_from_slice(&id.to_ne_bytes());
            }
        }
        Ok(())
    }

    pub(crate) fn update_elem(&self, key: &[u8], value: &[u8], flags: u64) -> Result<(), MapError> {
        let idx = Self::index(key);
        match self.kind {
            Kind::Plain => {
                self.check_update(idx, flags)?;
                // SAFETY: idx < max; `value` holds at least vs bytes (checked by Map).
                unsafe { copy_in(self.slot(idx, 0), value.as_ptr(), self.vs) };
            }
            Kind::PerCpu => {
                if flags > BPF_EXIST {
                    return Err(EBAD_FLAGS);
                }
                self.check_update(idx, flags)?;
                for cpu in 0..self.nr_cpus as usize {
                    // Whole rounded slots, padding included, as the kernel's copy_map_value_long.
                    // SAFETY: idx < max, cpu < nr_cpus; `value` holds nr_cpus * stride bytes.
                    unsafe { copy_in(self.slot(idx, cpu), value.as_ptr().add(cpu * self.stride), self.stride) };
                }
            }
            Kind::Ids => {
                if flags != BPF_ANY {
                    return Err(EBAD_FLAGS);
                }
                if idx >= self.max {
                    return Err(e2big("index beyond max_entries"));
                }
                let id = u32::from_ne_bytes([value[0], value[1], value[2], value[3]]);
                if id == 0 {
                    return Err(MapError::new(libc::EBADF, "id 0 names no program or map"));
                }
                // SAFETY: idx < max; aligned id slot.
                unsafe { a32(self.slot(idx, 0)) }.store(id, Ordering::Release);
            }
        }
        Ok(())
    }

    pub(crate) fn delete_elem(&self, key: &[u8]) -> Result<(), MapError> {
        self.delete_idx(Self::index(key))
    }

    pub(crate) fn get_next_key(&self, key: Option<&[u8]>, out: &mut [u8]) -> Result<(), MapError> {
        next_index(key.map(Self::index), self.max, out)
    }

    #[inline]
    pub(crate) fn contains(&self, addr: u64, len: u64) -> bool {
        if self.kind == Kind::Ids || len > self.vs as u64 {
            return false;
        }
        let off = addr.wrapping_sub(self.values as u64);
        let per_cpu = self.max as u64 * self.stride as u64;
        let off = if self.kind == Kind::PerCpu {
            if off >= self.cpu_stride as u64 * self.nr_cpus as u64 {
                return false;
            }
            off % self.cpu_stride as u64
        } else {
            off
        };
        off < per_cpu && off % self.stride as u64 + len <= self.vs as u64
    }
}

/// BPF_MAP_GET_NEXT_KEY over the indexes `0..max` of the array kinds: the index after `idx`,
/// the first one when there is no key or it is out of range, `ENOENT` after the last.
pub(crate) fn next_index(idx: Option<u32>, max: u32, out: &mut [u8]) -> Result<(), MapError> {
    let next = match idx {
        Some(i) if i < max && i == max - 1 => return Err(ENOENT),
        Some(i) if i < max => i + 1,
        _ => 0,
    };
    out[..4].copy_from_slice(&next.to_ne_bytes());
    Ok(())
}
