//! [`Map`]: one map file of any type, created or opened, with the syscall-style API (what
//! `BPF_MAP_*_ELEM` do for userspace) and the program-side hot-path API (what helpers call).
//!
//! Every map file starts with a [`MapHeader`] (offset 0, 64 bytes); bytes 128..4096 of the
//! first page hold the type's own header (counters, free lists, locks); the type's data
//! starts at offset 4096 ([`DATA_OFF`]). Each type's module documents the rest. The file is
//! written completely before the header's magic is stored (release), so a process opening a
//! file that is still being initialised sees "bad magic", never a half-built map.

use std::mem::offset_of;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::atomic::Ordering;

use crate::array::ArrayMap;
use crate::bloom_filter::BloomFilter;
use crate::hash::HashMap;
use crate::lpm_trie::LpmTrie;
use crate::mem::{a32, a64};
use crate::queue_stack::QueueStackMap;
use crate::shm::io_error;
use crate::shm::{MAP_LAYOUT_VERSION, MAP_MAGIC, MapHeader, PAGE_SIZE, Shm, possible_cpus};
use crate::stack_trace::StackTraceMap;
use crate::types::*;

/// Offset of the type's own header in the first page.
pub(crate) const EXT_OFF: usize = 128;
/// Offset of the type's data.
pub(crate) const DATA_OFF: usize = PAGE_SIZE;
/// Largest map file: sizes beyond this are refused with `E2BIG`.
pub const MAX_MAP_FILE_SIZE: u64 = 4 << 30;
/// The kernel's KMALLOC_MAX_SIZE on x86-64 (4 MiB), which bounds several sizes.
pub(crate) const KMALLOC_MAX_SIZE: u64 = 4 << 20;
/// The kernel's PCPU_MIN_UNIT_SIZE, the bound of a per-CPU value.
pub(crate) const PCPU_MIN_UNIT_SIZE: u64 = 32 << 10;
/// Most per-CPU slots a map file may declare.
pub const MAX_CPUS: u32 = 8192;

pub(crate) const fn einval(what: &'static str) -> MapError {
    MapError::new(libc::EINVAL, what)
}
pub(crate) const fn e2big(what: &'static str) -> MapError {
    MapError::new(libc::E2BIG, what)
}
pub(crate) const ENOENT: MapError = MapError::new(libc::ENOENT, "no such element");
pub(crate) const EEXIST: MapError = MapError::new(libc::EEXIST, "element exists (BPF_NOEXIST)");
pub(crate) const EBAD_FLAGS: MapError = MapError::new(libc::EINVAL, "invalid flags");
pub(crate) const EBUF: MapError = MapError::new(libc::EINVAL, "key or value buffer too small");
pub(crate) const EOPNOTSUPP: MapError = MapError::new(libc::EOPNOTSUPP, "operation not supported by this map type");
pub(crate) const ENOTSUPP_OP: MapError = MapError::new(ENOTSUPP, "operation not supported by this map type");

/// `BPF_F_RDONLY | BPF_F_WRONLY | BPF_F_RDONLY_PROG | BPF_F_WRONLY_PROG`.
pub(crate) const ACCESS_MASK: u32 = BPF_F_RDONLY | BPF_F_WRONLY | BPF_F_RDONLY_PROG | BPF_F_WRONLY_PROG;

/// The kernel's bpf_map_flags_access_ok: not both read-only and write-only for programs.
pub(crate) fn access_ok(flags: u32) -> bool {
    flags & (BPF_F_RDONLY_PROG | BPF_F_WRONLY_PROG) != (BPF_F_RDONLY_PROG | BPF_F_WRONLY_PROG)
}

/// What every map type keeps: the mapping, the spec, the per-CPU slot count.
pub(crate) struct Base {
    pub shm: Shm,
    pub spec: MapSpec,
    pub nr_cpus: u32,
}

impl Base {
    /// Pointer `off` bytes into the mapping.
    ///
    /// # Safety
    /// `off` is within the file size the type's layout computed (checked at create/open).
    #[inline(always)]
    pub(crate) unsafe fn at(&self, off: usize) -> *mut u8 {
        // SAFETY: the caller guarantees `off` is inside the mapping.
        unsafe { self.shm.as_ptr().add(off) }
    }
}

/// A map of any type, mapped from its file. (`repr(u8)`: a plain tag byte, so dispatch is
/// one compare.)
#[repr(u8)]
pub enum Map {
    /// ARRAY, PERCPU_ARRAY, PROG_ARRAY, ARRAY_OF_MAPS.
    Array(ArrayMap),
    /// HASH, PERCPU_HASH, LRU_HASH, LRU_PERCPU_HASH, HASH_OF_MAPS.
    Hash(HashMap),
    StackTrace(StackTraceMap),
    /// QUEUE and STACK.
    QueueStack(QueueStackMap),
    BloomFilter(BloomFilter),
    LpmTrie(LpmTrie),
    RingBuf(crate::ringbuf::RingBuf),
    PerfEventArray(crate::perf::PerfEventArray),
    CgroupArray(crate::cgroup_array::CgroupArray),
    /// A map shared with kernel programs that cannot be mapped (not an array): its session
    /// file gives the spec and id, its contents are the kernel map's, reached with `bpf()`
    /// (see [`crate::kernel`]).
    Kernel(crate::kernel::KernelMap),
}

/// Per-type layout: the total file size (for `open`: the least a valid file has), or why the
/// spec cannot be laid out.
fn file_size(spec: &MapSpec, nr_cpus: u32, for_open: bool) -> Result<u64, MapError> {
    use MapType::*;
    let size = match spec.map_type {
        BPF_MAP_TYPE_ARRAY | BPF_MAP_TYPE_PERCPU_ARRAY | BPF_MAP_TYPE_PROG_ARRAY | BPF_MAP_TYPE_ARRAY_OF_MAPS => {
            ArrayMap::file_size(spec, nr_cpus)
        }
        BPF_MAP_TYPE_HASH
        | BPF_MAP_TYPE_PERCPU_HASH
        | BPF_MAP_TYPE_LRU_HASH
        | BPF_MAP_TYPE_LRU_PERCPU_HASH
        | BPF_MAP_TYPE_HASH_OF_MAPS => HashMap::file_size(spec, nr_cpus),
        BPF_MAP_TYPE_STACK_TRACE => StackTraceMap::file_size(spec),
        BPF_MAP_TYPE_QUEUE | BPF_MAP_TYPE_STACK => QueueStackMap::file_size(spec),
        BPF_MAP_TYPE_BLOOM_FILTER => BloomFilter::file_size(spec),
        BPF_MAP_TYPE_LPM_TRIE => LpmTrie::file_size(spec),
        BPF_MAP_TYPE_RINGBUF => crate::ringbuf::RingBuf::file_size(spec),
        BPF_MAP_TYPE_PERF_EVENT_ARRAY if for_open => crate::perf::PerfEventArray::min_file_size(spec, nr_cpus),
        BPF_MAP_TYPE_PERF_EVENT_ARRAY => crate::perf::PerfEventArray::file_size(spec, nr_cpus),
        BPF_MAP_TYPE_CGROUP_ARRAY => crate::cgroup_array::CgroupArray::file_size(spec),
    };
    match size {
        Some(s) if s <= MAX_MAP_FILE_SIZE => Ok(s),
        _ => Err(e2big("map file would exceed the size limit")),
    }
}

/// Checks a spec as the kernel's map_create and the type's map_alloc_check/map_alloc do.
pub fn check_spec(spec: &MapSpec) -> Result<(), MapError> {
    use MapType::*;
    if spec.map_type != BPF_MAP_TYPE_BLOOM_FILTER && spec.map_extra != 0 {
        return Err(einval("map_extra is only for bloom filters"));
    }
    if spec.map_flags & BPF_F_RDONLY != 0 && spec.map_flags & BPF_F_WRONLY != 0 {
        return Err(einval("BPF_F_RDONLY and BPF_F_WRONLY together"));
    }
    match spec.map_type {
        BPF_MAP_TYPE_ARRAY | BPF_MAP_TYPE_PERCPU_ARRAY | BPF_MAP_TYPE_PROG_ARRAY | BPF_MAP_TYPE_ARRAY_OF_MAPS => {
            ArrayMap::check(spec)
        }
        BPF_MAP_TYPE_HASH
        | BPF_MAP_TYPE_PERCPU_HASH
        | BPF_MAP_TYPE_LRU_HASH
        | BPF_MAP_TYPE_LRU_PERCPU_HASH
        | BPF_MAP_TYPE_HASH_OF_MAPS => HashMap::check(spec),
        BPF_MAP_TYPE_STACK_TRACE => StackTraceMap::check(spec),
        BPF_MAP_TYPE_QUEUE | BPF_MAP_TYPE_STACK => QueueStackMap::check(spec),
        BPF_MAP_TYPE_BLOOM_FILTER => BloomFilter::check(spec),
        BPF_MAP_TYPE_LPM_TRIE => LpmTrie::check(spec),
        BPF_MAP_TYPE_RINGBUF => crate::ringbuf::RingBuf::check(spec),
        BPF_MAP_TYPE_PERF_EVENT_ARRAY => crate::perf::PerfEventArray::check(spec),
        BPF_MAP_TYPE_CGROUP_ARRAY => crate::cgroup_array::CgroupArray::check(spec),
    }
}

impl Map {
    /// Creates the map file `path` (which must not exist) for `spec`, checked as the kernel
    /// checks BPF_MAP_CREATE (`EINVAL` for bad sizes or flags, `E2BIG` for a file over
    /// [`MAX_MAP_FILE_SIZE`]). Per-CPU maps get [`possible_cpus`] slots.
    pub fn create(path: &Path, spec: &MapSpec) -> Result<Map, MapError> {
        check_spec(spec)?;
        let nr_cpus = possible_cpus().clamp(1, MAX_CPUS);
        let size = file_size(spec, nr_cpus, false)?;
        let shm = Shm::create(path, size as usize).map_err(|e| io_error(e, "cannot create the map file"))?;
        // Reserve the file's memory now: a sparse file on a full tmpfs would otherwise fail
        // later, with SIGBUS in whichever process first touches a page.
        // SAFETY: fallocate on a descriptor we own; no memory is touched.
        let r = unsafe { libc::posix_fallocate(shm.fd().as_raw_fd(), 0, size as libc::off_t) };
        if r != 0 && r != libc::EOPNOTSUPP && r != libc::EINVAL {
            drop(shm);
            let _ = std::fs::remove_file(path);
            return Err(MapError::new(if r == libc::ENOSPC { libc::ENOMEM } else { r }, "no memory for the map file"));
        }
        let full = MapHeader::new(spec, nr_cpus);
        let hdr = MapHeader { magic: 0, ..full };
        // SAFETY: the mapping is `size >= PAGE_SIZE` bytes, page-aligned, and nobody else can
        // use it before the magic is stored below.
        unsafe { shm.as_ptr().cast::<MapHeader>().write(hdr) };
        let mut spec = spec.clone();
        spec.name = full.spec().map(|s| s.name).unwrap_or_default();
        let base = Base { shm, spec, nr_cpus };
        let map = Self::init_type(base)?;
        // SAFETY: offset 0 of the mapping, 8-aligned.
        unsafe { a64(map.base_ptr()).store(MAP_MAGIC, Ordering::Release) };
        Ok(map)
    }

    fn init_type(base: Base) -> Result<Map, MapError> {
        use MapType::*;
        Ok(match base.spec.map_type {
            BPF_MAP_TYPE_ARRAY | BPF_MAP_TYPE_PERCPU_ARRAY | BPF_MAP_TYPE_PROG_ARRAY | BPF_MAP_TYPE_ARRAY_OF_MAPS => {
                Map::Array(ArrayMap::new(base))
            }
            BPF_MAP_TYPE_HASH
            | BPF_MAP_TYPE_PERCPU_HASH
            | BPF_MAP_TYPE_LRU_HASH
            | BPF_MAP_TYPE_LRU_PERCPU_HASH
            | BPF_MAP_TYPE_HASH_OF_MAPS => Map::Hash(HashMap::create(base)?),
            BPF_MAP_TYPE_STACK_TRACE => Map::StackTrace(StackTraceMap::create(base)),
            BPF_MAP_TYPE_QUEUE | BPF_MAP_TYPE_STACK => Map::QueueStack(QueueStackMap::new(base)),
            BPF_MAP_TYPE_BLOOM_FILTER => Map::BloomFilter(BloomFilter::create(base)?),
            BPF_MAP_TYPE_LPM_TRIE => Map::LpmTrie(LpmTrie::create(base)),
            BPF_MAP_TYPE_RINGBUF => Map::RingBuf(crate::ringbuf::RingBuf::init(base)?),
            BPF_MAP_TYPE_PERF_EVENT_ARRAY => Map::PerfEventArray(crate::perf::PerfEventArray::init(base)?),
            BPF_MAP_TYPE_CGROUP_ARRAY => Map::CgroupArray(crate::cgroup_array::CgroupArray::new(base)),
        })
    }

    fn open_type(base: Base) -> Result<Map, MapError> {
        use MapType::*;
        Ok(match base.spec.map_type {
            BPF_MAP_TYPE_ARRAY | BPF_MAP_TYPE_PERCPU_ARRAY | BPF_MAP_TYPE_PROG_ARRAY | BPF_MAP_TYPE_ARRAY_OF_MAPS => {
                Map::Array(ArrayMap::new(base))
            }
            BPF_MAP_TYPE_HASH
            | BPF_MAP_TYPE_PERCPU_HASH
            | BPF_MAP_TYPE_LRU_HASH
            | BPF_MAP_TYPE_LRU_PERCPU_HASH
            | BPF_MAP_TYPE_HASH_OF_MAPS => Map::Hash(HashMap::open(base)),
            BPF_MAP_TYPE_STACK_TRACE => Map::StackTrace(StackTraceMap::open(base)),
            BPF_MAP_TYPE_QUEUE | BPF_MAP_TYPE_STACK => Map::QueueStack(QueueStackMap::new(base)),
            BPF_MAP_TYPE_BLOOM_FILTER => Map::BloomFilter(BloomFilter::open(base)),
            BPF_MAP_TYPE_LPM_TRIE => Map::LpmTrie(LpmTrie::open(base)),
            BPF_MAP_TYPE_RINGBUF => Map::RingBuf(crate::ringbuf::RingBuf::open_base(base)?),
            BPF_MAP_TYPE_PERF_EVENT_ARRAY => Map::PerfEventArray(crate::perf::PerfEventArray::open_base(base)?),
            BPF_MAP_TYPE_CGROUP_ARRAY => Map::CgroupArray(crate::cgroup_array::CgroupArray::new(base)),
        })
    }

    /// Opens and maps an existing map file. A file that is not a map, of another layout
    /// version, with an impossible spec, or shorter than its spec needs is refused (`EINVAL`).
    pub fn open(path: &Path) -> Result<Map, MapError> {
        Self::open_type(Self::open_base(path)?)
    }

    /// Opens the session map file `path` as the kernel map `fd` whose contents it stands for
    /// (see [`crate::kernel`]): the file gives the spec, id and per-CPU slots; the kernel map
    /// must have the same type, key and value sizes, and entries (`EINVAL` otherwise; the
    /// caller reads them with `BPF_OBJ_GET_INFO_BY_FD` and passes them as `kernel`, or `None`
    /// when the kernel refuses that to this process).
    pub fn open_kernel(path: &Path, fd: std::os::fd::OwnedFd, kernel: Option<&MapSpec>) -> Result<Map, MapError> {
        let base = Self::open_base(path)?;
        if let Some(k) = kernel
            && (k.map_type != base.spec.map_type
                || k.key_size != base.spec.key_size
                || k.value_size != base.spec.value_size
                || k.max_entries != base.spec.max_entries)
        {
            return Err(einval("the kernel map's type or geometry is not the session map's"));
        }
        Ok(Map::Kernel(crate::kernel::KernelMap::new(base, fd)))
    }

    fn open_base(path: &Path) -> Result<Base, MapError> {
        // A process that may not look at the file (a member that dropped privileges) opens it
        // through `Shm::open`'s fallback; the mapping's length is checked below.
        match std::fs::metadata(path) {
            Ok(m) if m.len() < DATA_OFF as u64 => return Err(einval("map file is truncated")),
            Err(e) if !matches!(e.raw_os_error(), Some(libc::EACCES | libc::EPERM)) => {
                return Err(io_error(e, "cannot open the map file"));
            }
            _ => {}
        }
        let shm = Shm::open(path).map_err(|e| io_error(e, "cannot open the map file"))?;
        if shm.len() < DATA_OFF {
            return Err(einval("map file is truncated"));
        }
        // SAFETY: the mapping is page-aligned and at least a page long.
        let hdr = unsafe { MapHeader::load(shm.as_ptr()) };
        if hdr.magic != MAP_MAGIC {
            return Err(einval("not a userbpf map file (bad magic)"));
        }
        if hdr.version != MAP_LAYOUT_VERSION {
            return Err(einval("map file has another layout version"));
        }
        let spec = hdr.spec().map_err(|_| einval("map file has an unknown map type"))?;
        check_spec(&spec).map_err(|_| einval("map file header holds an invalid spec"))?;
        if hdr.nr_cpus == 0 || hdr.nr_cpus > MAX_CPUS {
            return Err(einval("map file header holds an invalid CPU count"));
        }
        let size = file_size(&spec, hdr.nr_cpus, true).map_err(|_| einval("map file header holds an invalid spec"))?;
        if (shm.len() as u64) < size {
            return Err(einval("map file is truncated"));
        }
        Ok(Base { shm, spec, nr_cpus: hdr.nr_cpus })
    }

    fn base(&self) -> &Base {
        match self {
            Map::Array(m) => m.base(),
            Map::Hash(m) => m.base(),
            Map::StackTrace(m) => m.base(),
            Map::QueueStack(m) => m.base(),
            Map::BloomFilter(m) => m.base(),
            Map::LpmTrie(m) => m.base(),
            Map::RingBuf(m) => m.base(),
            Map::PerfEventArray(m) => m.base(),
            Map::CgroupArray(m) => m.base(),
            Map::Kernel(m) => m.base(),
        }
    }

    /// Start of the mapping (the header).
    fn base_ptr(&self) -> *mut u8 {
        self.base().shm.as_ptr()
    }

    /// What the map was created with.
    pub fn spec(&self) -> &MapSpec {
        &self.base().spec
    }
    pub fn map_type(&self) -> MapType {
        self.spec().map_type
    }
    /// Per-CPU slots (the possible CPUs when the map was created).
    pub fn nr_cpus(&self) -> u32 {
        self.base().nr_cpus
    }
    /// Bytes of the value buffer of the syscall-style API: `value_size`, or for per-CPU maps
    /// `round_up(value_size, 8) * nr_cpus` as the kernel's bpf() expects.
    pub fn value_buf_size(&self) -> usize {
        let s = self.spec();
        if s.map_type.is_percpu() {
            crate::mem::round8(s.value_size as usize) * self.nr_cpus() as usize
        } else {
            s.value_size as usize
        }
    }
    /// The map's id in its session (header field; 0 until the runtime sets it).
    pub fn id(&self) -> u32 {
        // SAFETY: the header's `id` field, 4-aligned, inside the first page.
        unsafe { a32(self.base_ptr().add(offset_of!(MapHeader, id))).load(Ordering::Relaxed) }
    }
    pub fn set_id(&self, id: u32) {
        // SAFETY: as in `id`.
        unsafe { a32(self.base_ptr().add(offset_of!(MapHeader, id))).store(id, Ordering::Relaxed) }
    }
    /// The mapping itself (for the runtime: size, fd to map parts again).
    pub fn shm(&self) -> &Shm {
        &self.base().shm
    }

    /// Whether `[addr, addr+len)` lies inside one value of this map in this process's mapping
    /// (the bytes a program may touch through a pointer `lookup` returned). Keys, links,
    /// locks, padding and id slots (prog/map-in-map arrays) are never inside.
    #[inline]
    pub fn contains(&self, addr: u64, len: u64) -> bool {
        match self {
            Map::Array(m) => m.contains(addr, len),
            Map::Hash(m) => m.contains(addr, len),
            Map::LpmTrie(m) => m.contains(addr, len),
            Map::RingBuf(m) => m.contains(addr, len),
            Map::Kernel(m) => m.contains(addr, len),
            _ => false,
        }
    }

    /// For a BPF_F_MMAPABLE array: the file offset of its values (page-aligned) and the
    /// length to map (whole pages), as the kernel lets userspace mmap such an array.
    pub fn mmapable_offset(&self) -> Option<usize> {
        match self {
            Map::Array(m) => m.mmapable().map(|(off, _)| off),
            _ => None,
        }
    }
    /// For a plain ARRAY (with or without BPF_F_MMAPABLE): the file offset of its values and
    /// their length in whole pages, laid out as the kernel's mmapable array (values of
    /// `round_up(value_size, 8)` bytes from a page boundary).
    pub fn values_region(&self) -> Option<(usize, usize)> {
        match self {
            Map::Array(m) => m.values_region(),
            _ => None,
        }
    }
    /// Length in bytes (whole pages) of the mmapable part, see [`Map::mmapable_offset`].
    pub fn mmapable_len(&self) -> Option<usize> {
        match self {
            Map::Array(m) => m.mmapable().map(|(_, len)| len),
            _ => None,
        }
    }

    // ---- syscall-style API ----

    /// BPF_MAP_LOOKUP_ELEM. Queue/stack: peek (key empty). Bloom filter: `value` holds the
    /// value to test (it is not written); `Ok` means "maybe present", `ENOENT` absent.
    /// Prog/map-in-map arrays and hash of maps: the stored id.
    pub fn lookup_elem(&self, key: &[u8], value_out: &mut [u8]) -> Result<(), MapError> {
        self.check_key(key)?;
        if value_out.len() < self.value_buf_size() {
            return Err(EBUF);
        }
        match self {
            Map::Array(m) => m.lookup_elem(key, value_out),
            Map::Hash(m) => m.lookup_elem(key, value_out),
            Map::StackTrace(m) => m.lookup_elem(key, value_out),
            Map::QueueStack(m) => m.peek_sys(value_out),
            Map::BloomFilter(m) => m.peek_sys(value_out),
            Map::LpmTrie(m) => m.lookup_elem(key, value_out),
            Map::Kernel(m) => m.lookup_elem(key, value_out),
            // fd arrays without map_fd_sys_lookup_elem.
            Map::RingBuf(_) | Map::PerfEventArray(_) | Map::CgroupArray(_) => Err(ENOTSUPP_OP),
        }
    }

    /// BPF_MAP_UPDATE_ELEM (`BPF_ANY`, `BPF_NOEXIST`, `BPF_EXIST`). Queue/stack and bloom
    /// filter: push (key empty). Prog/map-in-map arrays and hash of maps: the value is the
    /// u32 id to store (the runtime checks that it names a live program or a compatible map;
    /// 0 is refused with `EBADF`, as an invalid fd is by the kernel). Cgroup arrays: the value
    /// is a descriptor (in this process) of the cgroup's directory.
    pub fn update_elem(&self, key: &[u8], value: &[u8], flags: u64) -> Result<(), MapError> {
        self.check_key(key)?;
        if value.len() < self.value_buf_size() {
            return Err(EBUF);
        }
        if flags & BPF_F_LOCK != 0 {
            // bpf() refuses BPF_F_LOCK for maps without a bpf_spin_lock before anything else.
            return Err(einval("BPF_F_LOCK without a bpf_spin_lock in the value"));
        }
        match self {
            Map::Array(m) => m.update_elem(key, value, flags),
            Map::Hash(m) => m.update_elem(key, value, flags),
            Map::StackTrace(_) => Err(einval("stack trace maps are not updated from userspace")),
            // SAFETY: `value` holds at least value_size bytes (checked above).
            Map::QueueStack(m) => unsafe { m.push(value.as_ptr(), flags, crate::sync::Wait::Sys) },
            // SAFETY: as above.
            Map::BloomFilter(m) => unsafe { m.push(value.as_ptr(), flags) },
            Map::LpmTrie(m) => m.update_elem(key, value, flags),
            Map::CgroupArray(m) => m.update_elem(key, value, flags),
            Map::Kernel(m) => m.update_elem(key, value, flags),
            Map::RingBuf(_) | Map::PerfEventArray(_) => Err(ENOTSUPP_OP),
        }
    }

    /// BPF_MAP_DELETE_ELEM.
    pub fn delete_elem(&self, key: &[u8]) -> Result<(), MapError> {
        self.check_key(key)?;
        match self {
            Map::Array(m) => m.delete_elem(key),
            Map::Hash(m) => m.delete_elem(key),
            Map::StackTrace(m) => m.delete_elem(key),
            Map::QueueStack(_) => Err(einval("queue and stack maps have no delete")),
            Map::BloomFilter(_) => Err(EOPNOTSUPP),
            Map::LpmTrie(m) => m.delete_elem(key),
            Map::CgroupArray(m) => m.delete_elem(key),
            Map::Kernel(m) => m.delete_elem(key),
            Map::RingBuf(_) | Map::PerfEventArray(_) => Err(ENOTSUPP_OP),
        }
    }

    /// BPF_MAP_GET_NEXT_KEY: the key after `key`, or the first key if `key` is None or not in
    /// the map (hash maps); `ENOENT` after the last.
    pub fn get_next_key(&self, key: Option<&[u8]>, next_out: &mut [u8]) -> Result<(), MapError> {
        if let Some(k) = key {
            self.check_key(k)?;
        }
        if next_out.len() < self.spec().key_size as usize {
            return Err(EBUF);
        }
        match self {
            Map::Array(m) => m.get_next_key(key, next_out),
            Map::Hash(m) => m.get_next_key(key, next_out),
            Map::StackTrace(m) => m.get_next_key(key, next_out),
            Map::QueueStack(_) => Err(einval("queue and stack maps have no keys")),
            Map::BloomFilter(_) => Err(EOPNOTSUPP),
            Map::LpmTrie(m) => m.get_next_key(key, next_out),
            Map::CgroupArray(m) => m.get_next_key(key, next_out),
            Map::Kernel(m) => m.get_next_key(key, next_out),
            Map::RingBuf(_) | Map::PerfEventArray(_) => Err(ENOTSUPP_OP),
        }
    }

    /// BPF_MAP_LOOKUP_AND_DELETE_ELEM: pop for queue/stack (key empty); lookup-then-delete
    /// for the hash types; `ENOTSUPP` (524) for the others, as the kernel.
    pub fn lookup_and_delete_elem(&self, key: &[u8], value_out: &mut [u8]) -> Result<(), MapError> {
        self.check_key(key)?;
        if value_out.len() < self.value_buf_size() {
            return Err(EBUF);
        }
        match self {
            Map::Hash(m) => m.lookup_and_delete_elem(key, value_out),
            Map::Kernel(m) => m.lookup_and_delete_elem(key, value_out),
            // SAFETY: `value_out` holds at least value_size bytes (checked above).
            Map::QueueStack(m) => unsafe { m.pop(value_out.as_mut_ptr(), true, crate::sync::Wait::Sys) },
            Map::BloomFilter(_) | Map::Array(_) | Map::StackTrace(_) | Map::LpmTrie(_) => Err(ENOTSUPP_OP),
            Map::RingBuf(_) | Map::PerfEventArray(_) | Map::CgroupArray(_) => Err(ENOTSUPP_OP),
        }
    }

    fn check_key(&self, key: &[u8]) -> Result<(), MapError> {
        if key.len() < self.spec().key_size as usize { Err(EBUF) } else { Ok(()) }
    }

    /// Stack trace maps: `bpf_get_stackid` over the captured instruction pointers `ips`
    /// (innermost first; `flags & BPF_F_SKIP_FIELD_MASK` of them are skipped).
    pub fn get_stackid(&self, ips: &[u64], flags: u64) -> Result<u32, MapError> {
        match self {
            Map::StackTrace(m) => m.get_stackid(ips, flags),
            _ => Err(einval("not a stack trace map")),
        }
    }

    // ---- program-side hot path ----

    /// `bpf_map_lookup_elem` from a program: a pointer to the value in this process's
    /// mapping, or null. Per-CPU maps: the slot of `cpu` (taken modulo `nr_cpus`). Prog and
    /// map-in-map arrays, hash of maps: a pointer to the stored u32 id. Queue, stack, bloom
    /// filter and stack trace maps: null (the kernel forbids the call). Kernel maps
    /// ([`Map::Kernel`]): `cpu` must be the caller's run's CPU slot (its buffers are used).
    ///
    /// # Safety
    /// `key` is readable for `key_size` bytes. The pointer stays valid while `self` lives.
    #[inline(always)]
    pub unsafe fn lookup(&self, key: *const u8, cpu: u32) -> *mut u8 {
        // SAFETY: forwarded contract.
        unsafe {
            match self {
                Map::Array(m) => m.lookup(key, cpu),
                Map::Hash(m) => m.lookup(key, cpu),
                Map::LpmTrie(m) => m.lookup(key),
                Map::Kernel(m) => m.lookup(key, cpu, cpu),
                _ => std::ptr::null_mut(),
            }
        }
    }

    /// `bpf_map_update_elem` from a program (per-CPU maps: only `cpu`'s slot; a new per-CPU
    /// element has the other slots zeroed). Queue/stack/bloom: use [`Map::push`].
    ///
    /// # Safety
    /// `key` readable for `key_size` bytes, `value` for `value_size` bytes.
    #[inline]
    pub unsafe fn update(&self, key: *const u8, value: *const u8, flags: u64, cpu: u32) -> Result<(), MapError> {
        // SAFETY: forwarded contract.
        unsafe {
            match self {
                Map::Array(m) => m.update(key, value, flags, cpu),
                Map::Hash(m) => m.update(key, value, flags, cpu),
                Map::LpmTrie(m) => m.update(key, value, flags, crate::sync::Wait::Hot),
                Map::Kernel(m) => m.update(key, value, flags, cpu, cpu),
                _ => Err(einval("map type has no update from programs")),
            }
        }
    }

    /// The program-side operations that callers may call directly instead of dispatching
    /// through this enum (hash maps but hashes of maps; see [`crate::hash::ProgOps`]).
    pub fn prog_ops(&self) -> Option<crate::hash::ProgOps> {
        match self {
            Map::Hash(m) => m.prog_ops(),
            _ => None,
        }
    }

    /// Where generated code finds a per-CPU hash map's memo hits (see
    /// [`crate::hash::HashMap::memo_layout`]).
    pub fn memo_layout(&self) -> Option<crate::hash::MemoLayout> {
        match self {
            Map::Hash(m) => m.memo_layout(),
            _ => None,
        }
    }

    /// `bpf_map_delete_elem` from a program.
    ///
    /// # Safety
    /// `key` readable for `key_size` bytes.
    #[inline]
    pub unsafe fn delete(&self, key: *const u8) -> Result<(), MapError> {
        // SAFETY: forwarded contract.
        unsafe {
            match self {
                Map::Array(m) => m.delete(key),
                Map::Hash(m) => m.delete(key),
                Map::StackTrace(m) => m.delete(key),
                Map::LpmTrie(m) => m.delete(key, crate::sync::Wait::Hot),
                Map::BloomFilter(_) => Err(EOPNOTSUPP),
                Map::Kernel(_) => Err(einval("a kernel map's delete needs the run's CPU slot (KernelMap::delete)")),
                _ => Err(einval("map type has no delete")),
            }
        }
    }

    /// `bpf_map_push_elem`: queue/stack push (`BPF_EXIST` overwrites the oldest when full,
    /// otherwise `E2BIG`); bloom filter add (`flags` must be `BPF_ANY`).
    ///
    /// # Safety
    /// `value` readable for `value_size` bytes.
    #[inline]
    pub unsafe fn push(&self, value: *const u8, flags: u64) -> Result<(), MapError> {
        // SAFETY: forwarded contract.
        unsafe {
            match self {
                Map::QueueStack(m) => m.push(value, flags, crate::sync::Wait::Hot),
                Map::BloomFilter(m) => m.push(value, flags),
                _ => Err(einval("not a queue, stack or bloom filter")),
            }
        }
    }

    /// `bpf_map_pop_elem` (queue/stack): `ENOENT` when empty.
    ///
    /// # Safety
    /// `value_out` writable for `value_size` bytes.
    #[inline]
    pub unsafe fn pop(&self, value_out: *mut u8) -> Result<(), MapError> {
        // SAFETY: forwarded contract.
        unsafe {
            match self {
                Map::QueueStack(m) => m.pop(value_out, true, crate::sync::Wait::Hot),
                Map::BloomFilter(_) => Err(EOPNOTSUPP),
                _ => Err(einval("not a queue or stack")),
            }
        }
    }

    /// `bpf_map_peek_elem`: queue/stack: copy the next element out (`ENOENT` when empty);
    /// bloom filter: `value` is read, 0 when maybe present, `ENOENT` when certainly absent.
    ///
    /// # Safety
    /// `value` writable (queue/stack) or readable (bloom) for `value_size` bytes.
    #[inline]
    pub unsafe fn peek(&self, value: *mut u8) -> Result<(), MapError> {
        // SAFETY: forwarded contract.
        unsafe {
            match self {
                Map::QueueStack(m) => m.pop(value, false, crate::sync::Wait::Hot),
                Map::BloomFilter(m) => m.peek(value),
                _ => Err(einval("not a queue, stack or bloom filter")),
            }
        }
    }
}
