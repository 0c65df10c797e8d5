//! CGROUP_ARRAY: slots holding cgroups (v2), for `bpf_current_task_under_cgroup`.
//!
//! File layout:
//!
//! ```text
//! 0       MapHeader
//! 4096    slots[max_entries]: u64, the cgroup's id (0 = empty)
//! end     rounded up to a page
//! ```
//!
//! A cgroup's id is the kernel's `cgroup_id()`: the inode number of its directory in the
//! cgroup2 file system (kernfs node ids are inode numbers on 64-bit kernels), which is what
//! `bpf_get_current_cgroup_id` and bpftrace's `cgroupid()` give. Ids are never reused while
//! the system runs, so a slot names one cgroup even across processes.
//!
//! As in the kernel, userspace stores a cgroup by giving a descriptor of its directory
//! ([`Map::update_elem`](crate::Map::update_elem) with a 4-byte fd value, only `BPF_ANY`;
//! a descriptor of anything but a cgroup2 directory is `EBADF`), cannot look slots up
//! (`ENOTSUPP`), deletes with `ENOENT` for an empty slot and walks keys as an array.
//! Programs read a slot with [`CgroupArray::get`].

use std::os::fd::RawFd;
use std::sync::atomic::Ordering;

use crate::map::*;
use crate::mem::{a64, round_up};
use crate::shm::PAGE_SIZE;
use crate::types::*;

/// `CGROUP2_SUPER_MAGIC` (statfs f_type of the cgroup2 file system).
pub const CGROUP2_SUPER_MAGIC: i64 = 0x6367_7270;

/// The kernel's ARRAY_CREATE_FLAG_MASK; fd arrays refuse BPF_F_MMAPABLE, BPF_F_INNER_MAP,
/// BPF_F_PRESERVE_ELEMS and the program access flags on top.
const CREATE_FLAG_MASK: u32 = BPF_F_NUMA_NODE | BPF_F_RDONLY | BPF_F_WRONLY;

pub struct CgroupArray {
    base: Base,
    max: u32,
    slots: *mut u8,
}

// SAFETY: the raw pointer points into `base.shm` (Send + Sync), alive as long as the struct;
// slots are only accessed atomically.
unsafe impl Send for CgroupArray {}
// SAFETY: as above.
unsafe impl Sync for CgroupArray {}

/// The id of the cgroup (v2) whose directory `fd` is open on, as the kernel's
/// `cgroup_get_from_fd` accepts it: `EBADF` for a bad descriptor or anything else than a
/// cgroup2 directory.
pub fn cgroup_id_of_fd(fd: RawFd) -> Result<u64, MapError> {
    const EBADF: MapError = MapError::new(libc::EBADF, "not a descriptor of a cgroup2 directory");
    // SAFETY: fstat/fstatfs write into zeroed structs we own; any fd value is fine.
    let (st, sfs) = unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        let mut sfs: libc::statfs = std::mem::zeroed();
        if libc::fstat(fd, &mut st) != 0 || libc::fstatfs(fd, &mut sfs) != 0 {
            return Err(EBADF);
        }
        (st, sfs)
    };
    if sfs.f_type != CGROUP2_SUPER_MAGIC || st.st_mode & libc::S_IFMT != libc::S_IFDIR || st.st_ino == 0 {
        return Err(EBADF);
    }
    Ok(st.st_ino)
}

impl CgroupArray {
    /// As the kernel's fd_array_map_alloc_check + array_map_alloc_check.
    pub(crate) fn check(spec: &MapSpec) -> Result<(), MapError> {
        let f = spec.map_flags;
        if spec.value_size != 4 || spec.key_size != 4 || spec.max_entries == 0 || f & !CREATE_FLAG_MASK != 0 {
            return Err(einval("invalid cgroup array attributes (key and value 4 bytes, no program access flags)"));
        }
        Ok(())
    }

    pub(crate) fn file_size(spec: &MapSpec) -> Option<u64> {
        Some(round_up(DATA_OFF as u64 + 8 * spec.max_entries as u64, PAGE_SIZE as u64))
    }

    pub(crate) fn new(base: Base) -> CgroupArray {
        let max = base.spec.max_entries;
        // SAFETY: DATA_OFF is inside the file (file_size).
        let slots = unsafe { base.at(DATA_OFF) };
        CgroupArray { base, max, slots }
    }

    pub(crate) fn base(&self) -> &Base {
        &self.base
    }

    #[inline(always)]
    fn slot(&self, idx: u32) -> &std::sync::atomic::AtomicU64 {
        debug_assert!(idx < self.max);
        // SAFETY: idx < max: the slot is inside the file, 8-aligned (page-aligned base).
        unsafe { a64(self.slots.add(idx as usize * 8)) }
    }

    /// The cgroup id at `idx` (0: empty), or `E2BIG` past the end, as
    /// `bpf_current_task_under_cgroup` checks. Program-side: one atomic load.
    #[inline]
    pub fn get(&self, idx: u32) -> Result<u64, MapError> {
        if idx >= self.max {
            return Err(e2big("index beyond max_entries"));
        }
        Ok(self.slot(idx).load(Ordering::Acquire))
    }

    /// Stores the cgroup `id` at `idx` (the kernel's fd array update: `EINVAL` for flags
    /// other than `BPF_ANY`, `E2BIG` past the end).
    pub fn set(&self, idx: u32, id: u64, flags: u64) -> Result<(), MapError> {
        if flags != BPF_ANY {
            return Err(EBAD_FLAGS);
        }
        if idx >= self.max {
            return Err(e2big("index beyond max_entries"));
        }
        if id == 0 {
            return Err(MapError::new(libc::EBADF, "not a cgroup"));
        }
        self.slot(idx).store(id, Ordering::Release);
        Ok(())
    }

    fn index(key: &[u8]) -> u32 {
        u32::from_ne_bytes(key[..4].try_into().expect("4-byte key"))
    }

    /// BPF_MAP_UPDATE_ELEM: the value is a descriptor of the cgroup's directory.
    pub(crate) fn update_elem(&self, key: &[u8], value: &[u8], flags: u64) -> Result<(), MapError> {
        if flags != BPF_ANY {
            return Err(EBAD_FLAGS);
        }
        let idx = Self::index(key);
        if idx >= self.max {
            return Err(e2big("index beyond max_entries"));
        }
        let fd = i32::from_ne_bytes(value[..4].try_into().expect("4-byte value"));
        self.set(idx, cgroup_id_of_fd(fd)?, flags)
    }

    /// BPF_MAP_DELETE_ELEM (`EINVAL` past the end, `ENOENT` for an empty slot).
    pub(crate) fn delete_elem(&self, key: &[u8]) -> Result<(), MapError> {
        let idx = Self::index(key);
        if idx >= self.max {
            return Err(einval("index beyond max_entries"));
        }
        if self.slot(idx).swap(0, Ordering::AcqRel) == 0 {
            return Err(ENOENT);
        }
        Ok(())
    }

    /// BPF_MAP_GET_NEXT_KEY: the next index, whatever the slots hold.
    pub(crate) fn get_next_key(&self, key: Option<&[u8]>, out: &mut [u8]) -> Result<(), MapError> {
        crate::array::next_index(key.map(Self::index), self.max, out)
    }
}
