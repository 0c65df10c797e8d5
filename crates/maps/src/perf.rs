//! `BPF_MAP_TYPE_PERF_EVENT_ARRAY` as userspace perf rings: one ring per index, each laid
//! out exactly as `perf_event_open` + `mmap` of a `PERF_COUNT_SW_BPF_OUTPUT` event gives it,
//! written as the kernel writes `PERF_RECORD_SAMPLE` (with `PERF_SAMPLE_RAW`) and
//! `PERF_RECORD_LOST` records.
//!
//! # File layout
//!
//! ```text
//! page 0               MapHeader (offset 0), PerfMeta (offset 128): futex words, geometry
//! pages 1..            ring controls, 64 bytes per index: spinlock, attached flag, lost count
//! rings_off + i*stride ring i: one struct perf_event_mmap_page, then 2^n data pages
//! ```
//!
//! Each ring is page-aligned; ring slots are `(1 + max_data_pages) * 4096` bytes apart and a
//! ring uses `(1 + data_pages) * 4096` of its slot ([`PerfEventArray::ring_file_range`]):
//! mapping that range gives what mmap of a perf event fd gives (`data_head` at 1024,
//! `data_tail` at 1032, `data_offset` = 4096 at 1040, `data_size` at 1048, data from the
//! second page on). A ring's size can be changed ([`PerfEventArray::configure_ring`]) to the
//! size a loader mmapped its perf event with, up to the slot's size (the file is laid out with
//! [`MAX_PERF_DATA_PAGES`] per slot when created as a map; the part of a slot a ring does not
//! use is never touched).
//!
//! # Records
//!
//! A sample is `{ perf_event_header { u32 type = 9; u16 misc; u16 size }; u32 raw_size;
//! raw bytes }` with `raw_size = round_up(size + 4, 8) - 4`, so records stay 8-byte aligned
//! (the kernel's padding; we write the pad bytes as zeros). A sample that does not fit counts
//! as lost; the next one that fits is preceded by `{ header { type = 2, misc 0, size 24 };
//! u64 id; u64 lost }`, as the kernel does.
//!
//! # Concurrency and wakeups
//!
//! Writers to one ring are serialised by a spinlock in its control slot (the crate's
//! `SpinLock`: bounded spinning, giving up counts the sample as lost and returns `EBUSY`; the
//! lock of a dead process is taken over). The writer keeps its own copy of `data_head` and
//! the last `data_tail` it read in the ring's control slot (the ring page's line is the one
//! the consumer writes `data_tail` into after each record: reading it is a cache miss while
//! the consumer keeps up); it reads `data_tail` (acquire) only when the tail it saw leaves too
//! little space, writes the records past its head, then stores `data_head` (release). The
//! consumer reads
//! `data_head` with acquire and stores `data_tail` with release after each record; it trusts
//! no size (a ring whose positions or records do not add up is reset to empty and reported as
//! `EINVAL`). Wakeups as in the ring buffer module: a map-wide `waiting` word and futex word;
//! writers make the `FUTEX_WAKE` call only when the consumer waits, and a consumer sets
//! `waiting` only after [`crate::linger::LINGER_IDLE`] without records (until then it
//! lingers in short timed sleeps, see [`crate::linger`]), so a steady stream of outputs makes
//! no system call. The writer's barrier between its store of `data_head` and its load of
//! `waiting` is the asymmetric one of [`crate::linger`] (no fence on the writer's side where
//! the kernel offers `MEMBARRIER_CMD_GLOBAL`). One consumer at a time
//! (an `flock`, as for the ring buffer). A watcher that wants to hear of new data in some
//! rings only (a loader's poll on perf event descriptors) sets those rings' own `waiting`
//! words ([`PerfEventArray::set_ring_waiting`]) instead of the map-wide one, under the same
//! lingering rule.

use std::mem::offset_of;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::ptr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use crate::linger::Linger;
use crate::map::Base;
use crate::ringbuf::{claim_consumer, futex_wake, header_nr_cpus, io_error, publish_header, read_header, write_header};
use crate::shm::{MapHeader, PAGE_SIZE, Shm};
use crate::sync::{SpinLock, Wait};
use crate::types::{BPF_F_NUMA_NODE, BPF_F_PRESERVE_ELEMS, BPF_F_RDONLY, BPF_F_WRONLY, MapError, MapSpec, MapType};

const PAGE: u64 = PAGE_SIZE as u64;

/// `perf_event_header.type` of a sample.
pub const PERF_RECORD_SAMPLE: u32 = 9;
/// `perf_event_header.type` of a lost-samples record.
pub const PERF_RECORD_LOST: u32 = 2;
/// `perf_event_header.misc` of our samples: the program observed a user-mode context (what
/// the kernel writes for samples taken from uprobes).
pub const PERF_RECORD_MISC_USER: u16 = 2;
/// The index bits of `bpf_perf_event_output`'s flags.
pub const BPF_F_INDEX_MASK: u64 = 0xffff_ffff;
/// Index meaning "the current CPU".
pub const BPF_F_CURRENT_CPU: u64 = BPF_F_INDEX_MASK;
/// Data pages per ring unless told otherwise.
pub const DEFAULT_PERF_DATA_PAGES: u32 = 8;
/// Data pages a ring of a map created by [`PerfEventArray::create`] (or `Map::create`) can
/// grow to (1 MiB): the largest perf buffer a loader can mmap for such a map.
pub const MAX_PERF_DATA_PAGES: u32 = 256;

/// Offsets in `struct perf_event_mmap_page` (uapi).
pub const PERF_MMAP_DATA_HEAD: usize = 1024;
pub const PERF_MMAP_DATA_TAIL: usize = 1032;
pub const PERF_MMAP_DATA_OFFSET: usize = 1040;
pub const PERF_MMAP_DATA_SIZE: usize = 1048;

/// `struct perf_event_mmap_page` from the kernel's uapi (the first page of each ring).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct PerfEventMmapPage {
    pub version: u32,
    pub compat_version: u32,
    pub lock: u32,
    pub index: u32,
    pub offset: i64,
    pub time_enabled: u64,
    pub time_running: u64,
    /// Bit 0 cap_bit0, bit 1 cap_bit0_is_deprecated, bit 2 cap_user_rdpmc, ...
    pub capabilities: u64,
    pub pmc_width: u16,
    pub time_shift: u16,
    pub time_mult: u32,
    pub time_offset: u64,
    pub time_zero: u64,
    pub size: u32,
    pub reserved_1: u32,
    pub time_cycles: u64,
    pub time_mask: u64,
    pub reserved: [u8; 116 * 8],
    pub data_head: u64,
    pub data_tail: u64,
    pub data_offset: u64,
    pub data_size: u64,
    pub aux_offset: u64,
    pub aux_head: u64,
    pub aux_tail: u64,
    pub aux_size: u64,
}

const _: () = assert!(std::mem::offset_of!(PerfEventMmapPage, data_head) == PERF_MMAP_DATA_HEAD);
const _: () = assert!(std::mem::offset_of!(PerfEventMmapPage, data_tail) == PERF_MMAP_DATA_TAIL);
const _: () = assert!(std::mem::offset_of!(PerfEventMmapPage, data_offset) == PERF_MMAP_DATA_OFFSET);
const _: () = assert!(std::mem::offset_of!(PerfEventMmapPage, data_size) == PERF_MMAP_DATA_SIZE);
const _: () = assert!(std::mem::offset_of!(PerfEventMmapPage, reserved) == 96);

const META_OFF: usize = 128;
const PERF_MAGIC: u64 = u64::from_le_bytes(*b"UBPFPE\x01\0");
const CTL_SIZE: usize = 64;
/// `sizeof(struct perf_event_header) + u32 raw_size`.
const SAMPLE_HDR: u64 = 12;
/// `PERF_RECORD_LOST`: header, id, lost.
const LOST_REC: u64 = 24;

/// Our metadata in the header page.
#[repr(C)]
struct PerfMeta {
    magic: AtomicU64,
    nr_rings: AtomicU32,
    data_pages: AtomicU32,
    ctl_off: AtomicU64,
    rings_off: AtomicU64,
    ring_stride: AtomicU64,
    _pad0: [u64; 11],
    /// 1 while the consumer is about to sleep or sleeping in `poll`, until a writer takes it
    /// to wake the consumer.
    waiting: AtomicU32,
    /// Futex word, bumped by each wakeup.
    wake_seq: AtomicU32,
    /// FUTEX_WAKE calls made by writers (statistics).
    wakeups: AtomicU64,
    _pad1: [u32; 2],
}

const _: () = assert!(META_OFF + std::mem::size_of::<PerfMeta>() <= PAGE_SIZE);

/// Per-ring control, in its own cache line.
#[repr(C)]
struct RingCtl {
    lock: AtomicU32,
    /// 1 if the index has a ring ("a perf event fd is stored at this index"), else ENOENT.
    attached: AtomicU32,
    /// Samples lost since the last PERF_RECORD_LOST.
    lost: AtomicU64,
    /// Samples lost ever (statistics).
    total_lost: AtomicU64,
    /// The `id` written in PERF_RECORD_LOST (the perf event's id).
    id: AtomicU64,
    /// Bytes of the ring's data area (a power of 2 of pages, at most the slot's), or 0: no
    /// ring yet (outputs get `ENOSPC`, as for a perf event nobody mmapped).
    data_size: AtomicU64,
    /// 1 while a watcher waits for data in this ring (see `set_ring_waiting`), until a writer
    /// takes it to wake the watcher.
    waiting: AtomicU32,
    _pad1: u32,
    /// The writers' own `data_head` (as the kernel keeps `rb->head`): written under the lock
    /// with the ring page's copy, read instead of it, so a writer does not load the ring
    /// page's line the consumer keeps writing `data_tail` into.
    head: AtomicU64,
    /// A `data_tail` a writer read: the consumer's is at least this far, so the space it
    /// leaves is at least what this one leaves (the real one is read only when that is not
    /// enough).
    tail_seen: AtomicU64,
}

const _: () = assert!(std::mem::size_of::<RingCtl>() == CTL_SIZE);

struct Geometry {
    nr: u32,
    data_pages: u32,
    ctl_off: u64,
    rings_off: u64,
    stride: u64,
    file_size: u64,
}

fn geometry(nr: u32, data_pages: u32) -> Result<Geometry, MapError> {
    let too_big = MapError::new(libc::E2BIG, "perf event array too large");
    let ctl_len = (nr as u64 * CTL_SIZE as u64).div_ceil(PAGE) * PAGE;
    let stride = (1 + data_pages as u64) * PAGE;
    let rings_off = PAGE + ctl_len;
    let file_size = (nr as u64).checked_mul(stride).and_then(|r| r.checked_add(rings_off)).ok_or(too_big)?;
    if file_size > crate::MAX_MAP_FILE_SIZE {
        return Err(too_big);
    }
    Ok(Geometry { nr, data_pages, ctl_off: PAGE, rings_off, stride, file_size })
}

/// Number of rings for `spec`: max_entries, or the CPU count if it is 0.
fn nr_rings(spec: &MapSpec, nr_cpus: u32) -> u32 {
    if spec.max_entries == 0 { nr_cpus.max(1) } else { spec.max_entries }
}

struct Inner {
    /// The file's mapping, spec (max_entries resolved) and CPU count.
    base: Base,
    /// For reopening the file for the consumer's lock when /proc is not mounted.
    path: Option<PathBuf>,
    geo: Geometry,
}

/// A `BPF_MAP_TYPE_PERF_EVENT_ARRAY` map. Cloning is cheap and shares the mapping.
#[derive(Clone)]
pub struct PerfEventArray {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for PerfEventArray {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PerfEventArray")
            .field("name", &self.inner.base.spec.name)
            .field("rings", &self.inner.geo.nr)
            .field("data_pages", &self.inner.geo.data_pages)
            .finish()
    }
}

impl PerfEventArray {
    /// The kernel's checks at BPF_MAP_CREATE for a perf event array
    /// (fd_array_map_alloc_check + array_map_alloc_check): key_size and value_size 4, flags
    /// among `BPF_F_NUMA_NODE`, `BPF_F_RDONLY`, `BPF_F_WRONLY` (not both) and
    /// `BPF_F_PRESERVE_ELEMS` (`EINVAL`). Unlike the kernel, max_entries 0 is accepted and
    /// means the number of possible CPUs (libbpf's default).
    pub fn check(spec: &MapSpec) -> Result<(), MapError> {
        if spec.map_type != MapType::BPF_MAP_TYPE_PERF_EVENT_ARRAY {
            return Err(MapError::new(libc::EINVAL, "not a perf_event_array map spec"));
        }
        if spec.key_size != 4 || spec.value_size != 4 {
            return Err(MapError::new(libc::EINVAL, "perf_event_array: key_size and value_size must be 4"));
        }
        if spec.map_flags & !(BPF_F_NUMA_NODE | BPF_F_RDONLY | BPF_F_WRONLY | BPF_F_PRESERVE_ELEMS) != 0
            || spec.map_flags & (BPF_F_RDONLY | BPF_F_WRONLY) == (BPF_F_RDONLY | BPF_F_WRONLY)
        {
            return Err(MapError::new(libc::EINVAL, "perf_event_array: unsupported map_flags"));
        }
        Ok(())
    }

    /// Bytes of the file for `spec` with [`MAX_PERF_DATA_PAGES`] per ring slot (`nr_cpus`
    /// rings if max_entries is 0); None if the spec is invalid or the file too large.
    pub fn file_size(spec: &MapSpec, nr_cpus: u32) -> Option<u64> {
        Self::check(spec).ok()?;
        geometry(nr_rings(spec, nr_cpus), MAX_PERF_DATA_PAGES).ok().map(|g| g.file_size)
    }

    /// The smallest file a valid perf event array with this spec can have (one data page per
    /// ring): the bound for a generic truncation check at open, since the page count is
    /// chosen at creation.
    pub fn min_file_size(spec: &MapSpec, nr_cpus: u32) -> Option<u64> {
        Self::check(spec).ok()?;
        geometry(nr_rings(spec, nr_cpus), 1).ok().map(|g| g.file_size)
    }

    /// Creates the map file at `path` with [`DEFAULT_PERF_DATA_PAGES`] data pages per ring,
    /// which can grow to [`MAX_PERF_DATA_PAGES`] (see [`PerfEventArray::check`]). Every index
    /// starts attached (has a ring).
    pub fn create(path: &Path, spec: &MapSpec) -> Result<PerfEventArray, MapError> {
        Self::create_sized(path, spec, DEFAULT_PERF_DATA_PAGES, MAX_PERF_DATA_PAGES)
    }

    /// As [`PerfEventArray::create`] with `data_pages` data pages per ring (a power of 2, as
    /// perf's mmap requires, else `EINVAL`), which is also the most a ring can have.
    pub fn create_with_pages(path: &Path, spec: &MapSpec, data_pages: u32) -> Result<PerfEventArray, MapError> {
        Self::create_sized(path, spec, data_pages, data_pages)
    }

    fn create_sized(path: &Path, spec: &MapSpec, data_pages: u32, max_pages: u32) -> Result<PerfEventArray, MapError> {
        Self::check(spec)?;
        if !data_pages.is_power_of_two() || !max_pages.is_power_of_two() {
            return Err(MapError::new(libc::EINVAL, "perf_event_array: data pages must be a power of 2"));
        }
        let nr_cpus = header_nr_cpus();
        let geo = geometry(nr_rings(spec, nr_cpus), max_pages)?;
        let len =
            usize::try_from(geo.file_size).map_err(|_| MapError::new(libc::E2BIG, "perf event array too large"))?;
        let shm = Shm::create(path, len).map_err(|e| io_error(e, "perf_event_array: cannot create the map file"))?;
        let spec = write_header(&shm, spec, nr_cpus);
        match Self::init_with(
            Base { shm, spec, nr_cpus },
            max_pages,
            data_pages.min(max_pages),
            Some(path.to_path_buf()),
        ) {
            Ok(pa) => {
                publish_header(&pa.inner.base.shm);
                Ok(pa)
            }
            Err(e) => {
                let _ = std::fs::remove_file(path);
                Err(e)
            }
        }
    }

    /// Initialises a fresh (zero-filled, [`PerfEventArray::file_size`] long) map file whose
    /// common header has been written, with the default page count. For `Map::create`; the
    /// caller publishes the header's magic afterwards. A max_entries of 0 is replaced by
    /// `base.nr_cpus`, in the header too.
    #[allow(dead_code)] // called by `Map` once wired
    pub(crate) fn init(base: Base) -> Result<PerfEventArray, MapError> {
        Self::init_with(base, MAX_PERF_DATA_PAGES, DEFAULT_PERF_DATA_PAGES, None)
    }

    fn init_with(
        mut base: Base,
        data_pages: u32,
        active_pages: u32,
        path: Option<PathBuf>,
    ) -> Result<PerfEventArray, MapError> {
        Self::check(&base.spec)?;
        if !data_pages.is_power_of_two() {
            return Err(MapError::new(libc::EINVAL, "perf_event_array: data pages must be a power of 2"));
        }
        let nr = nr_rings(&base.spec, base.nr_cpus);
        let geo = geometry(nr, data_pages)?;
        if (base.shm.len() as u64) < geo.file_size {
            return Err(MapError::new(libc::EINVAL, "perf_event_array: map file is too short"));
        }
        if base.spec.max_entries != nr {
            base.spec.max_entries = nr;
            // SAFETY: the header's max_entries field, 4-aligned, in the first page; nobody
            // uses the file before its magic is published.
            unsafe {
                AtomicU32::from_ptr(base.shm.as_ptr().add(offset_of!(MapHeader, max_entries)).cast())
                    .store(nr, Ordering::Relaxed)
            };
        }
        let data_size = active_pages.min(data_pages) as u64 * PAGE;
        crate::linger::prepare_producer();
        let pa = PerfEventArray { inner: Arc::new(Inner { base, path, geo }) };
        for i in 0..nr {
            let ctl = pa.ctl(i);
            ctl.id.store(i as u64, Ordering::Relaxed);
            ctl.attached.store(1, Ordering::Relaxed);
            ctl.data_size.store(data_size, Ordering::Relaxed);
            ctl.head.store(0, Ordering::Relaxed);
            ctl.tail_seen.store(0, Ordering::Relaxed);
            // SAFETY: the ring's first page is inside the fresh file and nobody else uses
            // the file yet.
            unsafe { init_page(pa.ring_page(i), data_size) };
        }
        let m = pa.meta();
        m.nr_rings.store(nr, Ordering::Relaxed);
        m.data_pages.store(data_pages, Ordering::Relaxed);
        m.ctl_off.store(pa.inner.geo.ctl_off, Ordering::Relaxed);
        m.rings_off.store(pa.inner.geo.rings_off, Ordering::Relaxed);
        m.ring_stride.store(pa.inner.geo.stride, Ordering::Relaxed);
        m.magic.store(PERF_MAGIC, Ordering::Release);
        Ok(pa)
    }

    /// Opens an existing perf event array file, checking that it is one and consistent
    /// (`EINVAL` otherwise).
    pub fn open(path: &Path) -> Result<PerfEventArray, MapError> {
        let shm = Shm::open(path).map_err(|e| io_error(e, "perf_event_array: cannot open the map file"))?;
        let (spec, nr_cpus) = read_header(&shm)?;
        if spec.map_type != MapType::BPF_MAP_TYPE_PERF_EVENT_ARRAY {
            return Err(MapError::new(libc::EINVAL, "not a perf_event_array map file"));
        }
        Self::open_checked(Base { shm, spec, nr_cpus }, Some(path.to_path_buf()))
    }

    /// Maps an existing map file whose common header was read: checks our metadata against
    /// the spec and the file size (`EINVAL`). For `Map::open`.
    #[allow(dead_code)] // called by `Map` once wired
    pub(crate) fn open_base(base: Base) -> Result<PerfEventArray, MapError> {
        Self::open_checked(base, None)
    }

    fn open_checked(base: Base, path: Option<PathBuf>) -> Result<PerfEventArray, MapError> {
        let bad = |what| MapError::new(libc::EINVAL, what);
        Self::check(&base.spec).map_err(|_| bad("perf_event_array: invalid spec in the map file"))?;
        if base.shm.len() < PAGE_SIZE {
            return Err(bad("perf_event_array: map file is truncated"));
        }
        // SAFETY: PerfMeta lies within the first page (asserted at compile time).
        let m = unsafe { &*(base.shm.as_ptr().add(META_OFF) as *const PerfMeta) };
        if m.magic.load(Ordering::Acquire) != PERF_MAGIC {
            return Err(bad("perf_event_array: bad metadata"));
        }
        let nr = m.nr_rings.load(Ordering::Relaxed);
        let data_pages = m.data_pages.load(Ordering::Relaxed);
        if nr == 0 || nr != base.spec.max_entries || !data_pages.is_power_of_two() {
            return Err(bad("perf_event_array: bad geometry"));
        }
        let geo = geometry(nr, data_pages).map_err(|_| bad("perf_event_array: bad geometry"))?;
        if m.ctl_off.load(Ordering::Relaxed) != geo.ctl_off
            || m.rings_off.load(Ordering::Relaxed) != geo.rings_off
            || m.ring_stride.load(Ordering::Relaxed) != geo.stride
            || base.shm.len() as u64 != geo.file_size
        {
            return Err(bad("perf_event_array: file does not match its geometry"));
        }
        crate::linger::prepare_producer();
        Ok(PerfEventArray { inner: Arc::new(Inner { base, path, geo }) })
    }

    /// What every map type keeps (the mapping, spec, CPU count).
    #[allow(dead_code)] // called by `Map` once wired
    pub(crate) fn base(&self) -> &Base {
        &self.inner.base
    }

    /// The spec (max_entries resolved: never 0).
    pub fn spec(&self) -> &MapSpec {
        &self.inner.base.spec
    }

    /// Number of indices (rings).
    pub fn max_entries(&self) -> u32 {
        self.inner.geo.nr
    }

    /// Data pages of ring 0 (every ring has this many until [`PerfEventArray::configure_ring`]).
    pub fn data_pages(&self) -> u32 {
        (self.ring_size(0) / PAGE) as u32
    }

    /// The most data pages a ring of this map can have.
    pub fn max_data_pages(&self) -> u32 {
        self.inner.geo.data_pages
    }

    /// `(file offset, length)` of ring `index`: its perf_event_mmap_page then its data pages,
    /// exactly what `mmap(NULL, length, ..., perf_fd, 0)` maps for a perf event.
    pub fn ring_file_range(&self, index: u32) -> Option<(u64, u64)> {
        (index < self.inner.geo.nr)
            .then(|| (self.inner.geo.rings_off + index as u64 * self.inner.geo.stride, PAGE + self.ring_size(index)))
    }

    /// Bytes of ring `index`'s data area (0: no ring). Precondition: index < nr. A value
    /// the layout does not allow (a damaged file) reads as 0.
    #[inline]
    fn ring_size(&self, index: u32) -> u64 {
        let s = self.ctl(index).data_size.load(Ordering::Acquire);
        if s.is_power_of_two() && s >= PAGE && s <= self.inner.geo.data_pages as u64 * PAGE { s } else { 0 }
    }

    /// Gives ring `index` `data_pages` data pages (a power of 2, at most
    /// [`PerfEventArray::max_data_pages`], else `EINVAL`; 0: no ring, outputs get `ENOSPC`),
    /// empties it and sets the id its PERF_RECORD_LOST records carry: what creating a perf
    /// event's ring buffer by mmap does. Returns the ring's new file range. Not for a hot
    /// path (takes the ring's lock; a consumer reading the ring meanwhile sees it emptied).
    pub fn configure_ring(&self, index: u32, data_pages: u32, id: u64) -> Result<(u64, u64), MapError> {
        self.check_index(index)?;
        if data_pages != 0 && (!data_pages.is_power_of_two() || data_pages > self.inner.geo.data_pages) {
            return Err(MapError::new(
                libc::EINVAL,
                "perf_event_array: ring size must be a power of 2 of pages within the map's slot",
            ));
        }
        let ctl = self.ctl(index);
        let guard = SpinLock::new(&ctl.lock)
            .lock(Wait::Sys)
            .map_err(|_| MapError::new(libc::EBUSY, "perf_event_array: ring lock busy"))?;
        let size = data_pages as u64 * PAGE;
        ctl.data_size.store(0, Ordering::Release);
        // SAFETY: the ring's first page lies inside the file (index checked); writers are
        // excluded by the lock and see data_size 0 until the store below.
        unsafe { init_page(self.ring_page(index), size) };
        ctl.head.store(0, Ordering::Relaxed);
        ctl.tail_seen.store(0, Ordering::Relaxed);
        ctl.lost.store(0, Ordering::Relaxed);
        ctl.id.store(id, Ordering::Relaxed);
        ctl.data_size.store(size, Ordering::Release);
        drop(guard);
        Ok(self.ring_file_range(index).unwrap_or((0, 0)))
    }

    /// Sets or clears ring `index`'s `waiting` word: while set, the next writer to that ring
    /// clears it, bumps the map's futex word ([`PerfEventArray::wake_word`]) and wakes its
    /// waiters.
    pub fn set_ring_waiting(&self, index: u32, on: bool) {
        if index < self.inner.geo.nr {
            self.ctl(index).waiting.store(on as u32, Ordering::SeqCst);
        }
    }

    /// Whether ring `index` holds records not consumed yet (sequentially consistent: pairs with
    /// writers' store of data_head and load of `waiting`).
    pub fn ring_has_data(&self, index: u32) -> bool {
        if index >= self.inner.geo.nr {
            return false;
        }
        let page = self.ring_page(index);
        self.head(page).load(Ordering::SeqCst) != self.tail(page).load(Ordering::SeqCst)
    }

    /// The share of ring `index`'s data area its unread records take (0 without a ring).
    pub fn ring_fill(&self, index: u32) -> f64 {
        if index >= self.inner.geo.nr {
            return 0.0;
        }
        let size = self.ring_size(index);
        if size == 0 {
            return 0.0;
        }
        let page = self.ring_page(index);
        let used = self.head(page).load(Ordering::Acquire).wrapping_sub(self.tail(page).load(Ordering::Acquire));
        (used.min(size) as f64) / size as f64
    }

    /// The map's futex word: bumped by every wakeup.
    pub fn wake_word(&self) -> &AtomicU32 {
        &self.meta().wake_seq
    }

    /// Bumps the futex word and wakes whoever waits on it (e.g. a watcher that must look at
    /// its rings again).
    pub fn wake_watchers(&self) {
        futex_wake(&self.meta().wake_seq);
    }

    /// Puts a ring at `index` (like storing a perf event fd there): outputs go to it.
    pub fn attach(&self, index: u32) -> Result<(), MapError> {
        self.check_index(index)?;
        self.ctl(index).attached.store(1, Ordering::Release);
        Ok(())
    }

    /// Removes the ring at `index` (like deleting the element): outputs get `ENOENT`.
    pub fn detach(&self, index: u32) -> Result<(), MapError> {
        self.check_index(index)?;
        self.ctl(index).attached.store(0, Ordering::Release);
        Ok(())
    }

    /// Whether `index` has a ring.
    pub fn is_attached(&self, index: u32) -> bool {
        index < self.inner.geo.nr && self.ctl(index).attached.load(Ordering::Acquire) != 0
    }

    /// Samples lost on ring `index` since creation.
    pub fn lost_total(&self, index: u32) -> u64 {
        if index < self.inner.geo.nr { self.ctl(index).total_lost.load(Ordering::Relaxed) } else { 0 }
    }

    /// FUTEX_WAKE calls writers made so far (statistics).
    pub fn wakeups(&self) -> u64 {
        self.meta().wakeups.load(Ordering::Relaxed)
    }

    fn check_index(&self, index: u32) -> Result<(), MapError> {
        if index >= self.inner.geo.nr {
            return Err(MapError::new(libc::E2BIG, "perf_event_array: index out of range"));
        }
        Ok(())
    }

    // ---- views of the shared memory ----

    #[inline]
    fn meta(&self) -> &PerfMeta {
        // SAFETY: PerfMeta lies in the header page, mapped for self's life; all atomics.
        unsafe { &*(self.inner.base.shm.as_ptr().add(META_OFF) as *const PerfMeta) }
    }

    /// Precondition: index < nr (callers check).
    #[inline]
    fn ctl(&self, index: u32) -> &RingCtl {
        let off = self.inner.geo.ctl_off as usize + (index.min(self.inner.geo.nr - 1) as usize) * CTL_SIZE;
        // SAFETY: the control area holds nr 64-byte slots from ctl_off, inside the file
        // (geometry checked at create/open); the index is clamped; all fields atomic.
        unsafe { &*(self.inner.base.shm.as_ptr().add(off) as *const RingCtl) }
    }

    /// The ring's perf_event_mmap_page. Precondition: index < nr.
    #[inline]
    fn ring_page(&self, index: u32) -> *mut u8 {
        let off = self.inner.geo.rings_off as usize
            + (index.min(self.inner.geo.nr - 1) as usize) * self.inner.geo.stride as usize;
        // SAFETY: ring `index` (clamped) lies inside the file, as the geometry says.
        unsafe { self.inner.base.shm.as_ptr().add(off) }
    }

    #[inline]
    fn head(&self, page: *mut u8) -> &AtomicU64 {
        // SAFETY: `page` is a ring's first page (from ring_page); data_head is at 1024, aligned.
        unsafe { &*(page.add(PERF_MMAP_DATA_HEAD) as *const AtomicU64) }
    }

    #[inline]
    fn tail(&self, page: *mut u8) -> &AtomicU64 {
        // SAFETY: as for `head`, at 1032.
        unsafe { &*(page.add(PERF_MMAP_DATA_TAIL) as *const AtomicU64) }
    }

    /// Copies `len` bytes from `src` (or zeros if null) into the ring's data at logical
    /// position `pos`, wrapping at the end.
    ///
    /// # Safety
    /// `page` is a ring page of this map, `len` <= data size, and `src` (if not null) is
    /// readable for `len` bytes.
    unsafe fn write_wrapped(&self, page: *mut u8, data_size: u64, pos: u64, src: *const u8, len: usize) {
        if len == 0 {
            return;
        }
        let size = data_size as usize;
        let off = (pos & (data_size - 1)) as usize;
        let first = len.min(size - off);
        // SAFETY: data = page + 4096 spans `size` bytes; [off, off + first) and
        // [0, len - first) are inside it; `src` is readable for len bytes by contract.
        unsafe {
            let data = page.add(PAGE_SIZE);
            if src.is_null() {
                ptr::write_bytes(data.add(off), 0, first);
                ptr::write_bytes(data, 0, len - first);
            } else {
                ptr::copy(src, data.add(off), first);
                ptr::copy(src.add(first), data, len - first);
            }
        }
    }

    // ---- producer side ----

    /// `bpf_perf_event_output(ctx, map, flags, data, size)`: writes a PERF_RECORD_SAMPLE with
    /// the raw `data` to the ring of the index in the low 32 bits of `index_flags`
    /// (`BPF_F_CURRENT_CPU` means `cpu`). Errors as the kernel's: other flag bits → `EINVAL`,
    /// index ≥ max_entries → `E2BIG`, no ring at the index → `ENOENT`, no room → `ENOSPC`
    /// (the sample is counted as lost). Also `E2BIG` if the record would not fit the 16-bit
    /// `perf_event_header.size`, and `EBUSY` if the ring's lock stayed taken (counted lost).
    ///
    /// # Safety
    /// `data` must be readable for `size` bytes.
    pub unsafe fn output(&self, index_flags: u64, cpu: u32, data: *const u8, size: u64) -> Result<(), MapError> {
        self.output_with(index_flags, cpu, data, size, |dst, src, len| {
            // SAFETY: `src` is within the `size` readable bytes of `data` (the caller's
            // contract); `dst` is the record's place in the ring, `len` bytes, which
            // `output_with` hands over and no other memory overlaps.
            unsafe { ptr::copy_nonoverlapping(src, dst, len) };
            true
        })
    }

    /// [`PerfEventArray::output`] with the sample's bytes copied by `copy(dst, data, len)`
    /// (possibly in two parts, when the record wraps around the ring's end), which may fail:
    /// a copy from memory the caller could not vouch for, made by a fault-tolerant routine
    /// (the helper's). Then nothing is published (the ring's head stays where it was; a
    /// pending lost count stays pending) and the result is `EFAULT`. Nothing is read from
    /// `data` other than through `copy`.
    ///
    /// The common case, a record that does not wrap and no lost count pending, is written
    /// in place: a zero word over the record's last 8 bytes (its padding), the 12-byte header,
    /// one copy of the data.
    #[unsafe(link_section = ".text.hot.userbpf")]
    pub fn output_with(
        &self,
        index_flags: u64,
        cpu: u32,
        data: *const u8,
        size: u64,
        mut copy: impl FnMut(*mut u8, *const u8, usize) -> bool,
    ) -> Result<(), MapError> {
        if index_flags & !BPF_F_INDEX_MASK != 0 {
            return Err(MapError::new(libc::EINVAL, "perf_event_output: unknown flags"));
        }
        let mut index = index_flags & BPF_F_INDEX_MASK;
        if index == BPF_F_CURRENT_CPU {
            index = cpu as u64;
        }
        if index >= self.inner.geo.nr as u64 {
            return Err(MapError::new(libc::E2BIG, "perf_event_output: index out of range"));
        }
        let index = index as u32;
        let ctl = self.ctl(index);
        if ctl.attached.load(Ordering::Acquire) == 0 {
            return Err(MapError::new(libc::ENOENT, "perf_event_output: no perf event at this index"));
        }
        // Sizes past u16 fail here too: rec then exceeds u16::MAX.
        let raw_size = ((size.min(1 << 20) + 4 + 7) & !7) - 4;
        let rec = SAMPLE_HDR + raw_size;
        if rec > u16::MAX as u64 {
            return Err(MapError::new(libc::E2BIG, "perf_event_output: sample too large"));
        }
        let Ok(guard) = SpinLock::new(&ctl.lock).lock(Wait::Hot) else {
            ctl.lost.fetch_add(1, Ordering::Relaxed);
            ctl.total_lost.fetch_add(1, Ordering::Relaxed);
            return Err(MapError::new(libc::EBUSY, "perf_event_output: ring lock busy"));
        };
        // Read under the lock: configure_ring changes it holding the lock.
        let dsize = self.ring_size(index);
        if dsize == 0 {
            drop(guard);
            return Err(MapError::new(libc::ENOSPC, "perf_event_output: the perf event has no ring buffer"));
        }
        let page = self.ring_page(index);
        let head = ctl.head.load(Ordering::Relaxed);
        let lost = ctl.lost.load(Ordering::Relaxed);
        let need = rec + if lost > 0 { LOST_REC } else { 0 };
        let space_after = |tail: u64| tail.wrapping_sub(head).wrapping_sub(1) & (dsize - 1);
        let mut space = space_after(ctl.tail_seen.load(Ordering::Relaxed));
        if space < need {
            // Pairs with the consumer's release store: its reads of the data are done.
            let tail = self.tail(page).load(Ordering::Acquire);
            ctl.tail_seen.store(tail, Ordering::Relaxed);
            space = space_after(tail);
        }
        if space < need {
            ctl.lost.fetch_add(1, Ordering::Relaxed);
            ctl.total_lost.fetch_add(1, Ordering::Relaxed);
            drop(guard);
            return Err(MapError::new(libc::ENOSPC, "perf_event_output: ring full"));
        }
        let off = head & (dsize - 1);
        let hdr = PERF_RECORD_SAMPLE as u64 | (PERF_RECORD_MISC_USER as u64) << 32 | rec << 48;
        let copied = if lost == 0 && off + rec <= dsize {
            // SAFETY: [off, off + rec) lies inside the ring's data area (page + 4096, dsize
            // bytes) and in its free space (checked above), which only this writer (holding
            // the lock) touches; off and rec are multiples of 8, rec >= 16.
            unsafe {
                let r = page.add(PAGE_SIZE + off as usize);
                r.add(rec as usize - 8).cast::<u64>().write(0);
                r.cast::<u64>().write(hdr);
                r.add(8).cast::<u32>().write(raw_size as u32);
                copy(r.add(SAMPLE_HDR as usize), data, size as usize)
            }
        } else {
            self.write_record_wrapped(page, dsize, head, lost, ctl, hdr, raw_size, data, size, &mut copy)
        };
        if !copied {
            drop(guard);
            return Err(MapError::new(libc::EFAULT, "perf_event_output: cannot read the sample's data"));
        }
        if lost > 0 {
            // Reported by the record just written; increments since then stay pending.
            ctl.lost.fetch_sub(lost, Ordering::Relaxed);
        }
        let pos = head.wrapping_add(rec + if lost > 0 { LOST_REC } else { 0 });
        ctl.head.store(pos, Ordering::Relaxed);
        // Release publishes the records to the consumer.
        self.head(page).store(pos, Ordering::Release);
        drop(guard);
        // The wakeup handshake's store-load barrier (see `crate::linger`).
        crate::linger::publish_fence();
        let m = self.meta();
        // A writer that sees a `waiting` word takes it (sets it to 0) and wakes; the writers
        // after it see nobody waiting. So a consumer's sleep costs one wake-up, although its
        // barrier keeps the word set for milliseconds before it sleeps.
        let take = |w: &AtomicU32| w.load(Ordering::Relaxed) != 0 && w.swap(0, Ordering::SeqCst) != 0;
        if take(&m.waiting) | take(&ctl.waiting) {
            m.wakeups.fetch_add(1, Ordering::Relaxed);
            futex_wake(&m.wake_seq);
        }
        Ok(())
    }

    /// The general case of [`PerfEventArray::output_with`]: a PERF_RECORD_LOST for `lost`
    /// samples first if `lost` > 0, then the sample, each wrapping around the ring's end as
    /// needed. The caller holds the ring's lock and checked the space. False if `copy` failed.
    #[cold]
    #[allow(clippy::too_many_arguments)]
    fn write_record_wrapped(
        &self,
        page: *mut u8,
        dsize: u64,
        head: u64,
        lost: u64,
        ctl: &RingCtl,
        hdr: u64,
        raw_size: u64,
        data: *const u8,
        size: u64,
        copy: &mut impl FnMut(*mut u8, *const u8, usize) -> bool,
    ) -> bool {
        let mut pos = head;
        if lost > 0 {
            let mut r = [0u8; LOST_REC as usize];
            r[0..4].copy_from_slice(&PERF_RECORD_LOST.to_ne_bytes());
            r[4..6].copy_from_slice(&0u16.to_ne_bytes());
            r[6..8].copy_from_slice(&(LOST_REC as u16).to_ne_bytes());
            r[8..16].copy_from_slice(&ctl.id.load(Ordering::Relaxed).to_ne_bytes());
            r[16..24].copy_from_slice(&lost.to_ne_bytes());
            // SAFETY: page is the ring's; 24 bytes <= data size (checked by the caller's space).
            unsafe { self.write_wrapped(page, dsize, pos, r.as_ptr(), r.len()) };
            pos = pos.wrapping_add(LOST_REC);
        }
        let mut h = [0u8; SAMPLE_HDR as usize];
        h[0..8].copy_from_slice(&hdr.to_ne_bytes());
        h[8..12].copy_from_slice(&(raw_size as u32).to_ne_bytes());
        // SAFETY: the whole record fits in the free space (the caller checked).
        unsafe {
            self.write_wrapped(page, dsize, pos, h.as_ptr(), h.len());
            self.write_wrapped(
                page,
                dsize,
                pos.wrapping_add(SAMPLE_HDR + size),
                ptr::null(),
                (raw_size - size) as usize,
            );
        }
        // The data, in at most two parts.
        let size_us = dsize as usize;
        let off = (pos.wrapping_add(SAMPLE_HDR) & (dsize - 1)) as usize;
        let len = size as usize;
        let first = len.min(size_us - off);
        // SAFETY: data = page + 4096 spans dsize bytes; [off, off + first) and
        // [0, len - first) are inside it and in the free space.
        unsafe {
            let d = page.add(PAGE_SIZE);
            (first == 0 || copy(d.add(off), data, first))
                && (len == first || copy(d, data.wrapping_add(first), len - first))
        }
    }
}

/// Writes a ring's perf_event_mmap_page as the kernel's perf_event_init_userpage does (and
/// empties the ring).
///
/// # Safety
/// `page` is a ring's first page in a live mapping, not written concurrently.
unsafe fn init_page(page: *mut u8, data_size: u64) {
    // SAFETY: by the contract, a whole page we may write.
    unsafe {
        ptr::write_bytes(page, 0, PAGE_SIZE);
        let p = page.cast::<PerfEventMmapPage>();
        (*p).capabilities = 1 << 1; // cap_bit0_is_deprecated
        (*p).size = offset_of!(PerfEventMmapPage, reserved) as u32;
        (*p).data_offset = PAGE;
        (*p).data_size = data_size;
    }
}

/// What a consumer gets from a ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PerfEvent<'a> {
    /// A PERF_RECORD_SAMPLE: the raw data as libbpf hands it over, `raw_size` bytes
    /// (the sample and its padding to keep records 8-byte aligned).
    Sample { cpu: u32, data: &'a [u8] },
    /// A PERF_RECORD_LOST: `lost` samples did not fit in ring `cpu`.
    Lost { cpu: u32, lost: u64 },
}

/// The consumer of every ring of a perf event array (as libbpf's perf_buffer). One consumer
/// at a time: creating a second one while the first lives (in any process) gives `EBUSY`.
pub struct PerfConsumer {
    pa: PerfEventArray,
    /// Copies of records that wrap around the end of a ring.
    buf: Vec<u8>,
    /// How `poll` waits (see [`crate::linger`]).
    linger: Linger,
    /// Our open file description of the map file, `flock`ed while we live.
    _claim: OwnedFd,
}

impl PerfConsumer {
    /// The consumer of `pa` (sharing its mapping); `EBUSY` if `pa` already has one.
    pub fn new(pa: &PerfEventArray) -> Result<PerfConsumer, MapError> {
        let claim = claim_consumer(pa.inner.base.shm.fd(), pa.inner.path.as_deref())?;
        // We are the only consumer: clear a `waiting` a killed one may have left.
        pa.meta().waiting.store(0, Ordering::SeqCst);
        Ok(PerfConsumer { pa: pa.clone(), buf: Vec::new(), linger: Linger::new(), _claim: claim })
    }

    /// Whether `poll` lingers (the default; see [`crate::linger`]) or sleeps on the futex
    /// as soon as it finds nothing, which makes the next producer call `FUTEX_WAKE` (for a
    /// consumer that wants every record at once whatever it costs producers, and for
    /// comparisons).
    pub fn set_linger(&mut self, on: bool) {
        self.linger = if on { Linger::new() } else { Linger::eager() };
    }

    /// Opens the perf event array file at `path` for consuming.
    pub fn open(path: &Path) -> Result<PerfConsumer, MapError> {
        PerfConsumer::new(&PerfEventArray::open(path)?)
    }

    /// The map this consumer reads.
    pub fn array(&self) -> &PerfEventArray {
        &self.pa
    }

    /// Hands every available record of every ring to `f` without blocking; returns how many.
    /// A ring whose positions or records are inconsistent is reset to empty and reported as
    /// `EINVAL` once the other rings are read.
    pub fn consume(&mut self, mut f: impl FnMut(PerfEvent<'_>)) -> Result<usize, MapError> {
        let pa = self.pa.clone();
        let mut total = 0;
        let mut err = None;
        let mut fill = 0.0f64;
        for i in 0..pa.inner.geo.nr {
            fill = fill.max(pa.ring_fill(i));
            match self.consume_ring(&pa, i, &mut f) {
                Ok(n) => total += n,
                Err(e) => err = Some(e),
            }
        }
        if total > 0 {
            self.linger.saw_data(fill);
        }
        match err {
            Some(e) => Err(e),
            None => Ok(total),
        }
    }

    fn consume_ring(
        &mut self,
        pa: &PerfEventArray,
        index: u32,
        f: &mut impl FnMut(PerfEvent<'_>),
    ) -> Result<usize, MapError> {
        let corrupt = |what| MapError::new(libc::EINVAL, what);
        let page = pa.ring_page(index);
        let head_a = pa.head(page);
        let tail_a = pa.tail(page);
        let size = pa.ring_size(index);
        if size == 0 {
            return Ok(0);
        }
        let head = head_a.load(Ordering::Acquire);
        let mut tail = tail_a.load(Ordering::Relaxed);
        if head.wrapping_sub(tail) >= size || !tail.is_multiple_of(8) {
            tail_a.store(head, Ordering::Release);
            return Err(corrupt("perf ring: inconsistent data_head/data_tail"));
        }
        let mut n = 0;
        while tail != head {
            let off = (tail & (size - 1)) as usize;
            // SAFETY: page + 4096 is the ring's data, `size` bytes; off is 8-aligned and
            // < size, so the 8-byte header lies inside.
            let data = unsafe { page.add(PAGE_SIZE) };
            // SAFETY: as above; an unaligned-safe read of the header from shared memory.
            let hdr = unsafe { ptr::read_volatile(data.add(off).cast::<[u8; 8]>()) };
            let typ = u32::from_ne_bytes([hdr[0], hdr[1], hdr[2], hdr[3]]);
            let rsize = u16::from_ne_bytes([hdr[6], hdr[7]]) as u64;
            if rsize < 8 || !rsize.is_multiple_of(8) || rsize > head - tail {
                tail_a.store(head, Ordering::Release);
                return Err(corrupt("perf ring: bad record size"));
            }
            let rec: &[u8] = if off as u64 + rsize <= size {
                // SAFETY: [off, off + rsize) is inside the data area; the record lies in
                // [tail, head), which writers do not touch until data_tail passes it.
                unsafe { std::slice::from_raw_parts(data.add(off), rsize as usize) }
            } else {
                let first = size as usize - off;
                self.buf.clear();
                // SAFETY: both parts are inside the data area (first + rest = rsize <= size).
                unsafe {
                    self.buf.extend_from_slice(std::slice::from_raw_parts(data.add(off), first));
                    self.buf.extend_from_slice(std::slice::from_raw_parts(data, rsize as usize - first));
                }
                &self.buf
            };
            match typ {
                PERF_RECORD_SAMPLE => {
                    if rec.len() < SAMPLE_HDR as usize {
                        tail_a.store(head, Ordering::Release);
                        return Err(corrupt("perf ring: short sample record"));
                    }
                    let raw = u32::from_ne_bytes([rec[8], rec[9], rec[10], rec[11]]) as usize;
                    match rec.get(SAMPLE_HDR as usize..SAMPLE_HDR as usize + raw) {
                        Some(d) => f(PerfEvent::Sample { cpu: index, data: d }),
                        None => {
                            tail_a.store(head, Ordering::Release);
                            return Err(corrupt("perf ring: raw size beyond the record"));
                        }
                    }
                    n += 1;
                }
                PERF_RECORD_LOST => {
                    if rec.len() < LOST_REC as usize {
                        tail_a.store(head, Ordering::Release);
                        return Err(corrupt("perf ring: short lost record"));
                    }
                    let mut l = [0u8; 8];
                    l.copy_from_slice(&rec[16..24]);
                    f(PerfEvent::Lost { cpu: index, lost: u64::from_ne_bytes(l) });
                    n += 1;
                }
                _ => {} // other record types: skipped, as libbpf does without an event_cb
            }
            tail += rsize;
            tail_a.store(tail, Ordering::Release);
        }
        Ok(n)
    }

    /// Like [`PerfConsumer::consume`], but if no record is available sleeps until one is or
    /// `timeout` has passed. Returns the number of records handed to `f` (0 on timeout).
    /// `Duration::MAX` waits forever. While records came recently the sleep is a short
    /// timed one that writers do not know of; after [`crate::linger::LINGER_IDLE`] without
    /// records it is a futex wait writers end (see [`crate::linger`]).
    pub fn poll(&mut self, timeout: Duration, mut f: impl FnMut(PerfEvent<'_>)) -> Result<usize, MapError> {
        crate::linger::poll(self, timeout, |c| c.consume(&mut f))
    }

    /// Whether any ring has data (sequentially consistent: pairs with the writers' store of
    /// data_head and load of waiting).
    fn ready(&self) -> bool {
        (0..self.pa.inner.geo.nr).any(|i| {
            let page = self.pa.ring_page(i);
            self.pa.head(page).load(Ordering::SeqCst) != self.pa.tail(page).load(Ordering::SeqCst)
        })
    }
}

impl crate::linger::Waiting for PerfConsumer {
    fn linger(&mut self) -> &mut Linger {
        &mut self.linger
    }

    fn sleep_deep(&self, timeout: Option<Duration>) {
        let m = self.pa.meta();
        crate::linger::sleep_deep(&m.waiting, &m.wake_seq, || self.ready(), timeout, false);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ringbuf::{publish_header, write_header};

    #[test]
    fn map_style_create_and_open() {
        let dir = std::env::temp_dir().join(format!("userbpf-perf-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("pa");
        let _ = std::fs::remove_file(&path);
        let spec = MapSpec {
            map_type: MapType::BPF_MAP_TYPE_PERF_EVENT_ARRAY,
            key_size: 4,
            value_size: 4,
            max_entries: 0,
            map_flags: 0,
            map_extra: 0,
            name: "events".into(),
        };
        // As Map::create does it: max_entries 0 becomes the CPU count, in the header too.
        let size = PerfEventArray::file_size(&spec, 3).unwrap() as usize;
        assert!(PerfEventArray::min_file_size(&spec, 3).unwrap() < size as u64);
        let shm = Shm::create(&path, size).unwrap();
        let back = write_header(&shm, &spec, 3);
        let pa = PerfEventArray::init(Base { shm, spec: back, nr_cpus: 3 }).unwrap();
        publish_header(&pa.base().shm);
        assert_eq!(pa.max_entries(), 3);
        assert_eq!(pa.data_pages(), DEFAULT_PERF_DATA_PAGES);
        // As Map::open does it.
        let shm = Shm::open(&path).unwrap();
        let (spec2, nr_cpus) = read_header(&shm).unwrap();
        assert_eq!((spec2.max_entries, nr_cpus), (3, 3));
        let pa2 = PerfEventArray::open_base(Base { shm, spec: spec2, nr_cpus }).unwrap();
        // SAFETY: the literal is readable for 2 bytes.
        unsafe { pa2.output(2, 0, b"hi".as_ptr(), 2).unwrap() };
        assert_eq!(PerfEventArray::open(&path).unwrap().max_entries(), 3);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn page_layout() {
        assert_eq!(std::mem::size_of::<PerfEventMmapPage>(), 1088);
        assert_eq!(std::mem::offset_of!(PerfMeta, waiting), 128);
        assert_eq!(std::mem::offset_of!(PerfMeta, data_pages), 12);
    }
}
