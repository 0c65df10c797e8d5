//! `BPF_MAP_TYPE_RINGBUF`: the kernel's multi-producer, single-consumer ring buffer, with the
//! kernel's memory layout, in a shared-memory file.
//!
//! # File layout
//!
//! ```text
//! page 0        header page: MapHeader (offset 0), RbMeta (offset 128): spinlock, futex words
//! page 1        consumer page: consumer_pos (u64 at offset 0), written by the consumer
//! page 2        producer page: producer_pos (u64 at 0), pending_pos (u64 at 8), by producers
//! page 3..      data area, max_entries bytes (a power of 2, a multiple of the page size)
//! ```
//!
//! This is exactly the kernel's `struct bpf_ringbuf` as vmapped (non-mmapable page, consumer
//! page, producer page, data), so record headers carry the same `pg_off` as the kernel's and
//! the pages from 1 on can be handed to libbpf's consumer as they are (see [`RingBufLayout`]).
//!
//! # Mapping
//!
//! Each process reserves `3 pages + 2 × data` of address space (an anonymous `PROT_NONE`
//! mapping) and maps the file over it with `MAP_FIXED | MAP_SHARED`: the whole file, then the
//! data area a second time right after it, so a record that wraps at the end of the data area
//! is contiguous in memory, as in the kernel.
//!
//! # Records
//!
//! Each record is an 8-byte header `{ u32 len; u32 pg_off; }` followed by the sample, the
//! whole rounded up to 8 bytes. `len` has [`BPF_RINGBUF_BUSY_BIT`] set while the record is
//! reserved and [`BPF_RINGBUF_DISCARD_BIT`] set if it was discarded. `pg_off` is the record
//! header's offset in pages from the start of the header page.
//!
//! # Concurrency
//!
//! Reservation is serialised by a spinlock in the header page (the crate's `SpinLock`:
//! bounded spinning, giving up returns null like the kernel's reserve in NMI context; the
//! lock of a process that died holding it is taken over). Inside it: walk `pending_pos` over
//! committed records, check space against both `consumer_pos` and `pending_pos` (the kernel's
//! fix for overrunning reservations), write the header with the BUSY bit, then publish the
//! new `producer_pos`. Commit clears the BUSY bit (sets DISCARD for a discard) with one
//! sequentially consistent compare-exchange, the kernel's `xchg`; nothing else is locked. The
//! consumer follows libbpf's protocol: acquire-load `producer_pos`, walk records, stop at a
//! BUSY one, skip DISCARDed ones, release-store `consumer_pos` after each. It trusts no
//! length: positions and record lengths that do not fit what was produced are `EINVAL`.
//!
//! A producer process killed between reserve and submit leaves a BUSY record that stops the
//! consumer for good (the kernel's verifier rules this out for real programs);
//! [`RingBufConsumer::skip_busy_record`] lets a consumer that knows the producer is gone
//! move past it.
//!
//! # Wakeups
//!
//! A consumer that found the ring empty first lingers: while samples came within the last
//! [`crate::linger::LINGER_IDLE`] it takes short timed sleeps (50 µs doubling to 1 ms) with
//! `waiting` clear, so producers of a steady stream never make a system call (see
//! [`crate::linger`]). Only an idle consumer sleeps deep, as follows.
//!
//! A consumer about to sleep deep sets the `waiting` word, reads the futex word `wake_seq`,
//! checks once more that the record at `consumer_pos` is not committed, then `FUTEX_WAIT`s on
//! `wake_seq` (shared futex: the file is mapped by several processes) and clears `waiting`
//! when it wakes. A producer's commit reads `waiting` after publishing its record (both sides
//! sequentially consistent, so one of them sees the other: the producer's full barrier is
//! the commit's exchange of the record's `len`, the consumer's its store of `waiting`; the
//! consumer checks the record's `len` before `producer_pos`, so `producer_pos` is only
//! release-stored, as in the kernel) and only when a consumer waits,
//! and the kernel would wake it (the record is the one the consumer waits for, or
//! `BPF_RB_FORCE_WAKEUP`; never with `BPF_RB_NO_WAKEUP` alone), bumps `wake_seq` and calls
//! `FUTEX_WAKE`. With nobody waiting the hot path makes no system call.
//!
//! There is one consumer at a time, as the protocol requires: a consumer holds an `flock`
//! on its own open file description of the map file for its whole life (released by the
//! kernel if its process dies), and clears a `waiting` word a killed consumer may have left.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::ptr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use crate::linger::Linger;
use crate::map::Base;
use crate::shm::{MAP_MAGIC, MapHeader, PAGE_SIZE, Shm, possible_cpus};
use crate::sync::{SpinLock, Wait};
use crate::types::{
    BPF_F_NUMA_NODE, BPF_RB_AVAIL_DATA, BPF_RB_CONS_POS, BPF_RB_FORCE_WAKEUP, BPF_RB_NO_WAKEUP, BPF_RB_PROD_POS,
    BPF_RB_RING_SIZE, BPF_RINGBUF_BUSY_BIT, BPF_RINGBUF_DISCARD_BIT, BPF_RINGBUF_HDR_SZ, MapError, MapSpec, MapType,
};

const PAGE: u64 = PAGE_SIZE as u64;

/// Largest sample a reservation accepts (the kernel's `RINGBUF_MAX_RECORD_SZ`).
pub const RINGBUF_MAX_RECORD_SZ: u64 = (u32::MAX / 4) as u64;
/// Largest data area (the kernel's `RINGBUF_MAX_DATA_SZ`: `pg_off` must fit 24 bits).
pub const RINGBUF_MAX_DATA_SZ: u64 = ((1 << 24) - 3) * PAGE;

/// Offset of [`RbMeta`] in the header page (after the 64-byte `MapHeader`).
const META_OFF: usize = 128;
/// Identifies the ring buffer's own metadata ("UBPFRB", layout 1).
const RB_MAGIC: u64 = u64::from_le_bytes(*b"UBPFRB\x01\0");
/// Pages before the data area: header, consumer, producer.
const META_PAGES: u64 = 3;

/// Our metadata in the header page. Every field is atomic: other processes map it too.
#[repr(C)]
struct RbMeta {
    magic: AtomicU64,
    data_size: AtomicU64,
    _pad0: [u64; 14],
    /// Reservation spinlock (0 free, else the holder's thread id: `crate::sync::SpinLock`); its
    /// own cache line.
    lock: AtomicU32,
    _pad_lock: u32,
    /// The last `consumer_pos` a producer read, written and read under `lock` (so ordered by
    /// it). Positions only grow, so a stale value is a lower bound: it can only make space
    /// look shorter than it is, and then the producer reloads the real `consumer_pos`. Zero
    /// (a fresh file, or one written before this field existed) is such a lower bound too.
    /// It saves producers a load of the consumer's cache line, which the consumer writes
    /// after every record.
    cached_cons: AtomicU64,
    _pad1: [u32; 12],
    /// 1 while the consumer is about to sleep or sleeping in `poll`.
    waiting: AtomicU32,
    /// Futex word: bumped by each wakeup.
    wake_seq: AtomicU32,
    /// FUTEX_WAKE calls made by producers (statistics, tests).
    wakeups: AtomicU64,
    _pad2: [u32; 2],
    /// Reservations that gave up on the spinlock (statistics).
    lock_failures: AtomicU64,
}

const _: () = assert!(META_OFF + std::mem::size_of::<RbMeta>() <= PAGE_SIZE);
const _: () = assert!(std::mem::size_of::<MapHeader>() <= META_OFF);

/// Where the parts of a ring buffer file are, and how to map it as the kernel maps a ringbuf
/// fd.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingBufLayout {
    /// The header page (MapHeader and our metadata); the kernel's non-mmapable part.
    pub header_off: u64,
    /// The consumer page: `consumer_pos` at offset 0. The kernel's mmap offset 0 (RW).
    pub consumer_off: u64,
    /// The producer page: `producer_pos` at 0, `pending_pos` at 8. Kernel mmap offset 1 page.
    pub producer_off: u64,
    /// The data area. Kernel mmap offset 2 pages, mapped twice back to back.
    pub data_off: u64,
    /// Bytes of the data area (max_entries).
    pub data_size: u64,
    /// Bytes of the file.
    pub file_size: u64,
}

impl RingBufLayout {
    /// The layout of a ring buffer with `data_size` bytes of data.
    pub fn for_size(data_size: u64) -> RingBufLayout {
        RingBufLayout {
            header_off: 0,
            consumer_off: PAGE,
            producer_off: 2 * PAGE,
            data_off: META_PAGES * PAGE,
            data_size,
            file_size: META_PAGES * PAGE + data_size,
        }
    }

    /// How to emulate `mmap(NULL, len, prot, MAP_SHARED, ringbuf_fd, offset)` of the kernel:
    /// the file ranges `(file_offset, length)` to map back to back (at most two: the data
    /// area's second copy continues in the data area's start). Mirrors the kernel's checks:
    /// a writable mapping must be exactly the consumer page (else `EPERM`); the offset must be
    /// page-aligned and the range must lie within consumer page + producer page + 2 × data
    /// (else `EINVAL`). `len` is rounded up to pages as mmap does.
    pub fn kernel_mmap_segments(&self, offset: u64, len: u64, writable: bool) -> Result<Vec<(u64, u64)>, MapError> {
        if len == 0 || !offset.is_multiple_of(PAGE) {
            return Err(MapError::new(libc::EINVAL, "ringbuf mmap: unaligned offset or empty length"));
        }
        let len = len.checked_add(PAGE - 1).ok_or(MapError::new(libc::EINVAL, "ringbuf mmap: length"))? / PAGE * PAGE;
        if writable && (offset != 0 || len != PAGE) {
            return Err(MapError::new(libc::EPERM, "ringbuf mmap: only the consumer page may be writable"));
        }
        // The kernel's view: pages [1, 3 + 2n) of its vmap, mmap offset 0 = vmap page 1.
        let n = self.data_size / PAGE;
        let view_pages = 2 + 2 * n;
        let first = offset / PAGE;
        let count = len / PAGE;
        if first.checked_add(count).is_none_or(|end| end > view_pages) {
            return Err(MapError::new(libc::EINVAL, "ringbuf mmap: range beyond the ring"));
        }
        // View page v (0-based from the consumer page) is file page v + 1 for v < 2 + n
        // (consumer, producer, data), and file page v + 1 - n for the second data copy.
        let mut segs = Vec::with_capacity(2);
        let split = 2 + n;
        let end = first + count;
        if first < split {
            let e = end.min(split);
            segs.push(((first + 1) * PAGE, (e - first) * PAGE));
        }
        if end > split {
            let s = first.max(split);
            segs.push(((s + 1 - n) * PAGE, (end - s) * PAGE));
        }
        Ok(segs)
    }
}

struct Inner {
    /// The file's mapping (header access, the fd), its spec and CPU count, as every map type
    /// keeps them.
    base: Base,
    /// The path the map was created or opened with, if known (to reopen the file for a
    /// consumer's lock when /proc is not mounted).
    path: Option<PathBuf>,
    /// Start of our reserved region: header page, consumer, producer, data, data again.
    region: *mut u8,
    region_len: usize,
    size: u64,
    mask: u64,
}

// SAFETY: `region` points to a shared mapping owned by this value; all shared state in it is
// accessed through atomics or through raw pointers under the ring's protocol, which is
// designed for concurrent use by many threads and processes.
unsafe impl Send for Inner {}
// SAFETY: as above.
unsafe impl Sync for Inner {}

impl Drop for Inner {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly the region this value reserved and mapped; pointers
        // handed out (samples) are only valid during the value's life by contract.
        unsafe { libc::munmap(self.region.cast(), self.region_len) };
    }
}

/// A `BPF_MAP_TYPE_RINGBUF` map. Cloning is cheap and shares the mapping.
#[derive(Clone)]
pub struct RingBuf {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for RingBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RingBuf").field("name", &self.inner.base.spec.name).field("size", &self.inner.size).finish()
    }
}

pub(crate) use crate::shm::io_error;

fn host_page_ok() -> bool {
    // SAFETY: sysconf has no memory effects.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    p == PAGE_SIZE as libc::c_long
}

/// Per-CPU slot count recorded in the header of maps created here (as `Map::create` does).
pub(crate) fn header_nr_cpus() -> u32 {
    possible_cpus().clamp(1, crate::MAX_CPUS)
}

/// Writes the common header of a fresh map file with magic 0 (the file is no map until
/// [`publish_header`]); returns the spec as the header gives it back (name truncated).
pub(crate) fn write_header(shm: &Shm, spec: &MapSpec, nr_cpus: u32) -> MapSpec {
    let full = MapHeader::new(spec, nr_cpus);
    let back = full.spec().unwrap_or_else(|_| spec.clone());
    // SAFETY: the mapping is at least a page long and page-aligned; nobody uses the fresh
    // file before the magic is stored.
    unsafe { shm.as_ptr().cast::<MapHeader>().write(MapHeader { magic: 0, ..full }) };
    back
}

/// Stores the header's magic (release): the file is a map from now on.
pub(crate) fn publish_header(shm: &Shm) {
    // SAFETY: offset 0 of a page-aligned mapping at least a page long; other processes read
    // it atomically.
    unsafe { AtomicU64::from_ptr(shm.as_ptr().cast()).store(MAP_MAGIC, Ordering::Release) };
}

/// Reads the common header of a mapped map file with atomic loads (another process may be
/// writing `id`) and checks magic, version, type and CPU count: the spec and `nr_cpus`.
pub(crate) fn read_header(shm: &Shm) -> Result<(MapSpec, u32), MapError> {
    let bad = |what| MapError::new(libc::EINVAL, what);
    if shm.len() < PAGE_SIZE {
        return Err(bad("map file is truncated"));
    }
    // SAFETY: the mapping is page-aligned and at least a page long (checked above).
    let hdr = unsafe { MapHeader::load(shm.as_ptr()) };
    let spec = hdr.spec().map_err(|_| bad("not a userbpf map file, or of another layout version"))?;
    if hdr.nr_cpus == 0 || hdr.nr_cpus > crate::MAX_CPUS {
        return Err(bad("map file header holds an invalid CPU count"));
    }
    Ok((spec, hdr.nr_cpus))
}

/// Reserves `3 pages + 2 × size` of address space and maps the file over it, data twice.
fn map_region(shm: &Shm, size: u64) -> Result<(*mut u8, usize), MapError> {
    let layout = RingBufLayout::for_size(size);
    let file_len = usize::try_from(layout.file_size).map_err(|_| MapError::new(libc::E2BIG, "ringbuf too large"))?;
    let size_us = usize::try_from(size).map_err(|_| MapError::new(libc::E2BIG, "ringbuf too large"))?;
    let region_len = file_len.checked_add(size_us).ok_or(MapError::new(libc::E2BIG, "ringbuf too large"))?;
    if shm.len() < file_len {
        return Err(MapError::new(libc::EINVAL, "ringbuf: map file is truncated"));
    }
    let fd = shm.fd().as_raw_fd();
    // SAFETY: a fresh anonymous reservation; no existing memory is affected.
    let base = unsafe {
        libc::mmap(
            ptr::null_mut(),
            region_len,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if base == libc::MAP_FAILED {
        return Err(io_error(io::Error::last_os_error(), "ringbuf: reserving address space"));
    }
    // SAFETY: MAP_FIXED over our own reservation (base, region_len), which nothing else uses;
    // the file is at least `file_len` bytes long (checked above).
    let a = unsafe {
        libc::mmap(base, file_len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED | libc::MAP_FIXED, fd, 0)
    };
    // SAFETY: as above, for the second copy of the data area right after the file's end;
    // `base + file_len` is inside the reservation and `size` bytes fit after it.
    let b = unsafe {
        libc::mmap(
            base.cast::<u8>().add(file_len).cast(),
            size_us,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_FIXED,
            fd,
            layout.data_off as libc::off_t,
        )
    };
    if a == libc::MAP_FAILED || b == libc::MAP_FAILED {
        let e = io::Error::last_os_error();
        // SAFETY: releasing our own reservation, nothing points into it yet.
        unsafe { libc::munmap(base, region_len) };
        return Err(io_error(e, "ringbuf: mapping the file"));
    }
    Ok((base.cast(), region_len))
}

impl RingBuf {
    /// The kernel's checks at BPF_MAP_CREATE (ringbuf_map_alloc): key_size and value_size 0,
    /// max_entries a power of 2 and a multiple of the page size, map_flags at most
    /// `BPF_F_NUMA_NODE` (`EINVAL`); a data area beyond the kernel's limit (`E2BIG`).
    pub fn check(spec: &MapSpec) -> Result<(), MapError> {
        if spec.map_type != MapType::BPF_MAP_TYPE_RINGBUF {
            return Err(MapError::new(libc::EINVAL, "not a ringbuf map spec"));
        }
        if spec.map_flags & !BPF_F_NUMA_NODE != 0 {
            return Err(MapError::new(libc::EINVAL, "ringbuf: unsupported map_flags"));
        }
        if spec.key_size != 0 || spec.value_size != 0 {
            return Err(MapError::new(libc::EINVAL, "ringbuf: key_size and value_size must be 0"));
        }
        let n = spec.max_entries as u64;
        if !n.is_power_of_two() || !n.is_multiple_of(PAGE) {
            return Err(MapError::new(
                libc::EINVAL,
                "ringbuf: max_entries must be a power of 2 and a multiple of the page size",
            ));
        }
        if n > RINGBUF_MAX_DATA_SZ {
            return Err(MapError::new(libc::E2BIG, "ringbuf: max_entries too large"));
        }
        Ok(())
    }

    /// Bytes of the file for `spec` (checked).
    pub fn file_size(spec: &MapSpec) -> Option<u64> {
        Self::check(spec).ok()?;
        Some(RingBufLayout::for_size(spec.max_entries as u64).file_size)
    }

    /// Initialises a fresh (zero-filled, `file_size` long) map file whose common header has
    /// been written, and maps it. For `Map::create`; the caller publishes the header's magic
    /// afterwards.
    #[allow(dead_code)] // called by `Map` once wired
    pub(crate) fn init(base: Base) -> Result<RingBuf, MapError> {
        Self::init_with(base, None)
    }

    fn init_with(base: Base, path: Option<PathBuf>) -> Result<RingBuf, MapError> {
        Self::check(&base.spec)?;
        let size = base.spec.max_entries as u64;
        // SAFETY: RbMeta lies in the first page (asserted at compile time); all atomics.
        let meta = unsafe { &*(base.shm.as_ptr().add(META_OFF) as *const RbMeta) };
        meta.data_size.store(size, Ordering::Relaxed);
        meta.magic.store(RB_MAGIC, Ordering::Release);
        Self::map(base, path)
    }

    /// Maps an existing map file whose common header was read (`spec`, `nr_cpus`): checks the
    /// ring's own metadata and the file size (`EINVAL`). For `Map::open`.
    #[allow(dead_code)] // called by `Map` once wired
    pub(crate) fn open_base(base: Base) -> Result<RingBuf, MapError> {
        Self::open_checked(base, None)
    }

    fn open_checked(base: Base, path: Option<PathBuf>) -> Result<RingBuf, MapError> {
        Self::check(&base.spec).map_err(|_| MapError::new(libc::EINVAL, "ringbuf: invalid spec in the map file"))?;
        if base.shm.len() < PAGE_SIZE {
            return Err(MapError::new(libc::EINVAL, "ringbuf: map file is truncated"));
        }
        // SAFETY: RbMeta lies in the first page, which is mapped (checked above).
        let meta = unsafe { &*(base.shm.as_ptr().add(META_OFF) as *const RbMeta) };
        let size = base.spec.max_entries as u64;
        if meta.magic.load(Ordering::Acquire) != RB_MAGIC || meta.data_size.load(Ordering::Relaxed) != size {
            return Err(MapError::new(libc::EINVAL, "ringbuf: bad ring metadata"));
        }
        if base.shm.len() as u64 != RingBufLayout::for_size(size).file_size {
            return Err(MapError::new(libc::EINVAL, "ringbuf: file size does not match max_entries"));
        }
        Self::map(base, path)
    }

    fn map(base: Base, path: Option<PathBuf>) -> Result<RingBuf, MapError> {
        if !host_page_ok() {
            return Err(MapError::new(libc::ENOTSUP, "ringbuf: host page size is not 4096"));
        }
        let size = base.spec.max_entries as u64;
        let (region, region_len) = map_region(&base.shm, size)?;
        Ok(RingBuf { inner: Arc::new(Inner { base, path, region, region_len, size, mask: size - 1 }) })
    }

    /// What every map type keeps (the mapping of the whole file, spec, CPU count).
    #[allow(dead_code)] // called by `Map` once wired
    pub(crate) fn base(&self) -> &Base {
        &self.inner.base
    }

    /// Creates the map file at `path` (which must not exist), checking `spec` as the kernel
    /// does (see [`RingBuf::check`]).
    pub fn create(path: &Path, spec: &MapSpec) -> Result<RingBuf, MapError> {
        Self::check(spec)?;
        if !host_page_ok() {
            return Err(MapError::new(libc::ENOTSUP, "ringbuf: host page size is not 4096"));
        }
        let size = RingBufLayout::for_size(spec.max_entries as u64).file_size;
        let len = usize::try_from(size).map_err(|_| MapError::new(libc::E2BIG, "ringbuf too large"))?;
        let shm = Shm::create(path, len).map_err(|e| io_error(e, "ringbuf: cannot create the map file"))?;
        let nr_cpus = header_nr_cpus();
        let spec = write_header(&shm, spec, nr_cpus);
        match Self::init_with(Base { shm, spec, nr_cpus }, Some(path.to_path_buf())) {
            Ok(rb) => {
                publish_header(&rb.inner.base.shm);
                Ok(rb)
            }
            Err(e) => {
                let _ = std::fs::remove_file(path);
                Err(e)
            }
        }
    }

    /// Opens an existing ring buffer file, checking that it is one (`EINVAL` if not, or if it
    /// is truncated or inconsistent).
    pub fn open(path: &Path) -> Result<RingBuf, MapError> {
        let shm = Shm::open(path).map_err(|e| io_error(e, "ringbuf: cannot open the map file"))?;
        let (spec, nr_cpus) = read_header(&shm)?;
        if spec.map_type != MapType::BPF_MAP_TYPE_RINGBUF {
            return Err(MapError::new(libc::EINVAL, "not a ringbuf map file"));
        }
        Self::open_checked(Base { shm, spec, nr_cpus }, Some(path.to_path_buf()))
    }

    /// The spec the map was created with.
    pub fn spec(&self) -> &MapSpec {
        &self.inner.base.spec
    }

    /// Bytes of the data area (max_entries).
    pub fn size(&self) -> u64 {
        self.inner.size
    }

    /// Where the file's parts are (for mapping it as the kernel's mmap of a ringbuf fd).
    pub fn file_layout(&self) -> RingBufLayout {
        RingBufLayout::for_size(self.inner.size)
    }

    /// Start of this process's mapping of the ring (the header page). Samples' `pg_off` count
    /// pages from here, as the kernel's count from `struct bpf_ringbuf`; see
    /// [`RingBuf::region_base_of_sample`].
    pub fn region_base(&self) -> *const u8 {
        self.inner.region
    }

    /// Whether `[addr, addr+len)` lies in the data area (either copy): where samples a program
    /// reserved live. The interpreter's memory policy uses it.
    pub fn contains(&self, addr: u64, len: u64) -> bool {
        let data = self.data() as u64;
        let total = 2 * self.inner.size;
        addr >= data && len <= total && addr - data <= total - len
    }

    /// Whether `sample` is a sample pointer this ring's `reserve` could have returned (inside
    /// the first copy of the data area, right after an 8-byte-aligned header). Lets the
    /// runtime find the ring of a `bpf_ringbuf_submit(sample)`.
    pub fn owns_sample(&self, sample: *const u8) -> bool {
        let data = self.data() as usize;
        let s = sample as usize;
        match s.checked_sub(data + BPF_RINGBUF_HDR_SZ as usize) {
            Some(off) => (off as u64) < self.inner.size && off % 8 == 0,
            None => false,
        }
    }

    /// The kernel's `bpf_ringbuf_restore_from_rec`: from a sample pointer, the start of the
    /// mapping of its ring (compare with [`RingBuf::region_base`]), using the header's
    /// `pg_off`.
    ///
    /// # Safety
    /// `sample` must have been returned by `reserve` of a live ring and not yet committed
    /// (the 8 bytes before it must be readable).
    pub unsafe fn region_base_of_sample(sample: *const u8) -> *const u8 {
        let hdr = sample.wrapping_sub(BPF_RINGBUF_HDR_SZ as usize);
        // SAFETY: by the caller's contract the record header is readable and 4-aligned; it is
        // shared memory, read atomically.
        let pg_off = unsafe { (*(hdr.add(4) as *const AtomicU32)).load(Ordering::Relaxed) } as usize;
        ((hdr as usize & !(PAGE_SIZE - 1)).wrapping_sub(pg_off.wrapping_mul(PAGE_SIZE))) as *const u8
    }

    // ---- views of the shared memory ----

    #[inline]
    fn meta(&self) -> &RbMeta {
        // SAFETY: the header page is mapped for the life of `self`; RbMeta fits in it and is
        // aligned (page + 128); all its fields are atomics.
        unsafe { &*(self.inner.region.add(META_OFF) as *const RbMeta) }
    }

    #[inline]
    fn consumer_pos(&self) -> &AtomicU64 {
        // SAFETY: page 1 of the region is the consumer page, mapped for self's life.
        unsafe { &*(self.inner.region.add(PAGE_SIZE) as *const AtomicU64) }
    }

    #[inline]
    fn producer_pos(&self) -> &AtomicU64 {
        // SAFETY: page 2 of the region is the producer page, mapped for self's life.
        unsafe { &*(self.inner.region.add(2 * PAGE_SIZE) as *const AtomicU64) }
    }

    #[inline]
    fn pending_pos(&self) -> &AtomicU64 {
        // SAFETY: offset 8 of the producer page, as in the kernel; mapped for self's life.
        unsafe { &*(self.inner.region.add(2 * PAGE_SIZE + 8) as *const AtomicU64) }
    }

    #[inline]
    fn data(&self) -> *mut u8 {
        // SAFETY: the data area starts 3 pages into the region.
        unsafe { self.inner.region.add(3 * PAGE_SIZE) }
    }

    /// The `len` word of the record header at logical position `pos`.
    #[inline]
    fn hdr_len(&self, pos: u64) -> &AtomicU32 {
        let off = (pos & self.inner.mask & !7) as usize;
        // SAFETY: `off` < size and 8-aligned, so the 8-byte header is inside the data area.
        unsafe { &*(self.data().add(off) as *const AtomicU32) }
    }

    #[inline]
    fn hdr_pg_off(&self, pos: u64) -> &AtomicU32 {
        let off = (pos & self.inner.mask & !7) as usize;
        // SAFETY: as in `hdr_len`, 4 bytes further.
        unsafe { &*(self.data().add(off + 4) as *const AtomicU32) }
    }

    // ---- producer side (helpers) ----

    /// `bpf_ringbuf_reserve(map, size, 0)`: room for a `size`-byte sample, or null if the
    /// sample is too large, the ring is full, or the reservation lock stayed busy (the
    /// crate's bounded spinlock, which also takes over the lock of a dead process). The
    /// caller checks the helper's `flags` (non-zero → null).
    ///
    /// # Safety
    /// The returned pointer is valid for `size` bytes until `submit`/`discard`, and only while
    /// `self` (or a clone) lives. It must be committed exactly once: an uncommitted record
    /// stops the consumer forever, as in the kernel.
    #[unsafe(link_section = ".text.hot.userbpf")]
    pub unsafe fn reserve(&self, size: u64) -> *mut u8 {
        if size > RINGBUF_MAX_RECORD_SZ {
            return ptr::null_mut();
        }
        let len = (size + BPF_RINGBUF_HDR_SZ as u64 + 7) & !7;
        if len > self.inner.size {
            return ptr::null_mut();
        }
        let mask = self.inner.mask;
        let meta = self.meta();
        let Ok(guard) = SpinLock::new(&meta.lock).lock(Wait::Hot) else {
            meta.lock_failures.fetch_add(1, Ordering::Relaxed);
            return ptr::null_mut();
        };
        let mut pend_pos = self.pending_pos().load(Ordering::Relaxed);
        let prod_pos = self.producer_pos().load(Ordering::Relaxed);
        let new_prod_pos = prod_pos.wrapping_add(len);
        // Advance pending_pos over committed records: the oldest still-busy record bounds how
        // far producers may go, whatever the consumer wrote in consumer_pos.
        while pend_pos < prod_pos {
            let l = self.hdr_len(pend_pos).load(Ordering::Acquire);
            if l & BPF_RINGBUF_BUSY_BIT != 0 {
                break;
            }
            let t =
                ((l & !(BPF_RINGBUF_BUSY_BIT | BPF_RINGBUF_DISCARD_BIT)) as u64 + BPF_RINGBUF_HDR_SZ as u64 + 7) & !7;
            if t > prod_pos - pend_pos {
                // Impossible for a header written by `reserve`: the file was corrupted. Give
                // up tracking (rather than blocking producers forever).
                pend_pos = prod_pos;
                break;
            }
            pend_pos += t;
        }
        self.pending_pos().store(pend_pos, Ordering::Relaxed);
        // consumer_pos as last seen by a producer (a lower bound, see `RbMeta::cached_cons`);
        // only when space looks short is the consumer's word itself read. That load is
        // acquire: the consumer release-stores consumer_pos after it has finished reading a
        // record, so the bytes we are about to overwrite are no longer being read. A cached
        // value carries the same guarantee, through the lock (taken with acquire, released
        // with release by the producer that loaded it).
        let mut cons_pos = meta.cached_cons.load(Ordering::Relaxed);
        if new_prod_pos.wrapping_sub(cons_pos) > mask {
            cons_pos = self.consumer_pos().load(Ordering::Acquire);
            meta.cached_cons.store(cons_pos, Ordering::Relaxed);
        }
        if new_prod_pos.wrapping_sub(cons_pos) > mask || new_prod_pos.wrapping_sub(pend_pos) > mask {
            drop(guard);
            return ptr::null_mut();
        }
        let off = prod_pos & mask & !7;
        self.hdr_len(off).store(size as u32 | BPF_RINGBUF_BUSY_BIT, Ordering::Relaxed);
        self.hdr_pg_off(off).store(((META_PAGES * PAGE + off) / PAGE) as u32, Ordering::Relaxed);
        // Publishes the BUSY header: a release store, as the kernel's smp_store_release. The
        // wakeup protocol does not need more here (see `RingBufConsumer::ready`): the full
        // barrier it needs on the producer side is the commit's exchange of `len`.
        self.producer_pos().store(new_prod_pos, Ordering::Release);
        drop(guard);
        // SAFETY: off + 8 + size <= off + len <= 2 × size: inside the doubly mapped data.
        unsafe { self.data().add(off as usize + BPF_RINGBUF_HDR_SZ as usize) }
    }

    /// `bpf_ringbuf_submit(sample, flags)`.
    ///
    /// # Safety
    /// `sample` was returned by this ring's `reserve` and not committed yet. A pointer that
    /// is not one of this ring's sample positions, or whose record is not busy, is ignored.
    #[unsafe(link_section = ".text.hot.userbpf")]
    pub unsafe fn submit(&self, sample: *mut u8, flags: u64) {
        self.commit(sample, flags, false)
    }

    /// `bpf_ringbuf_discard(sample, flags)`.
    ///
    /// # Safety
    /// As for [`RingBuf::submit`].
    #[unsafe(link_section = ".text.hot.userbpf")]
    pub unsafe fn discard(&self, sample: *mut u8, flags: u64) {
        self.commit(sample, flags, true)
    }

    fn commit(&self, sample: *mut u8, flags: u64, discard: bool) {
        if !self.owns_sample(sample) {
            return;
        }
        let off = (sample as usize - self.data() as usize - BPF_RINGBUF_HDR_SZ as usize) as u64;
        let len = self.hdr_len(off);
        let cur = len.load(Ordering::Relaxed);
        if cur & BPF_RINGBUF_BUSY_BIT == 0 {
            return; // not a reserved record (committed twice?)
        }
        let mut new_len = cur ^ BPF_RINGBUF_BUSY_BIT;
        if discard {
            new_len |= BPF_RINGBUF_DISCARD_BIT;
        }
        // The kernel's xchg: a full barrier publishing the sample. A compare-exchange, so that
        // a record the consumer gave up on (`skip_busy_record`) is left alone. It is also the
        // producer's half of the wakeup handshake (a store-then-load, Dekker style, which needs
        // a full barrier on each side; the consumer's half is in `poll`): this sequentially
        // consistent read-modify-write comes before the sequentially consistent load of
        // `waiting` below, so either that load sees the consumer's `waiting = 1`, or the
        // consumer's later check (`RingBufConsumer::ready`) sees this committed `len`.
        if len.compare_exchange(cur, new_len, Ordering::SeqCst, Ordering::Relaxed).is_err() {
            return;
        }

        let force = flags & BPF_RB_FORCE_WAKEUP != 0;
        if !force && flags & BPF_RB_NO_WAKEUP != 0 {
            return;
        }
        if self.meta().waiting.load(Ordering::SeqCst) == 0 {
            return;
        }
        if !force && self.consumer_pos().load(Ordering::Acquire) & self.inner.mask != off {
            return; // the consumer waits for an earlier record, whose commit will wake it
        }
        self.wake();
    }

    fn wake(&self) {
        let m = self.meta();
        m.wakeups.fetch_add(1, Ordering::Relaxed);
        futex_wake(&m.wake_seq);
    }

    /// `bpf_ringbuf_output(map, data, size, flags)`: `EINVAL` for unknown flags, `EAGAIN` if
    /// the sample cannot be reserved.
    ///
    /// # Safety
    /// `data` must be readable for `size` bytes.
    #[unsafe(link_section = ".text.hot.userbpf")]
    pub unsafe fn output(&self, data: *const u8, size: u64, flags: u64) -> Result<(), MapError> {
        if flags & !(BPF_RB_NO_WAKEUP | BPF_RB_FORCE_WAKEUP) != 0 {
            return Err(MapError::new(libc::EINVAL, "ringbuf output: unknown flags"));
        }
        // SAFETY: reserve's contract is met: we commit the record below.
        let rec = unsafe { self.reserve(size) };
        if rec.is_null() {
            return Err(MapError::new(libc::EAGAIN, "ringbuf output: no space"));
        }
        // SAFETY: `rec` has room for `size` bytes (reserve succeeded); `data` is readable for
        // `size` bytes by the caller's contract; `copy` tolerates overlap.
        unsafe {
            if size > 0 {
                ptr::copy(data, rec, size as usize);
            }
            self.submit(rec, flags);
        }
        Ok(())
    }

    /// `bpf_ringbuf_query(map, flag)`; unknown flags give 0 as in the kernel.
    pub fn query(&self, flag: u64) -> u64 {
        match flag {
            BPF_RB_AVAIL_DATA => {
                let cons = self.consumer_pos().load(Ordering::Acquire);
                let prod = self.producer_pos().load(Ordering::Acquire);
                prod.wrapping_sub(cons)
            }
            BPF_RB_RING_SIZE => self.inner.size,
            BPF_RB_CONS_POS => self.consumer_pos().load(Ordering::Acquire),
            BPF_RB_PROD_POS => self.producer_pos().load(Ordering::Acquire),
            _ => 0,
        }
    }

    /// The share of the data area records not consumed yet take.
    pub fn fill(&self) -> f64 {
        (self.query(BPF_RB_AVAIL_DATA).min(self.inner.size) as f64) / self.inner.size as f64
    }

    /// FUTEX_WAKE calls producers made so far (statistics).
    pub fn wakeups(&self) -> u64 {
        self.meta().wakeups.load(Ordering::Relaxed)
    }

    /// For a watcher of a consumer that reads the ring itself (a loader's libbpf through its
    /// own mmap): sets or clears the `waiting` word, as a consumer about to sleep does, so
    /// producers wake the futex word ([`RingBuf::wake_word`]) when the record at
    /// `consumer_pos` is committed.
    pub fn set_waiting(&self, on: bool) {
        self.meta().waiting.store(on as u32, Ordering::SeqCst);
    }

    /// The futex word producers bump when they wake a waiter.
    pub fn wake_word(&self) -> &AtomicU32 {
        &self.meta().wake_seq
    }

    /// Bumps the futex word and wakes whoever waits on it (not counted in
    /// [`RingBuf::wakeups`], which counts producers' calls).
    pub fn wake_watchers(&self) {
        futex_wake(&self.meta().wake_seq);
    }

    /// Whether the record at `consumer_pos` is committed (see `RingBufConsumer`'s readiness
    /// check: call it after `set_waiting(true)`).
    pub fn has_committed_record(&self) -> bool {
        let cons = self.consumer_pos().load(Ordering::Relaxed);
        let len = self.hdr_len(cons).load(Ordering::SeqCst);
        let prod = self.producer_pos().load(Ordering::Acquire);
        if cons >= prod || prod - cons > self.inner.size {
            return false;
        }
        len & BPF_RINGBUF_BUSY_BIT == 0
    }

    /// Reservations that gave up waiting for the reservation lock (statistics).
    pub fn lock_failures(&self) -> u64 {
        self.meta().lock_failures.load(Ordering::Relaxed)
    }
}

/// The consumer of a ring buffer, following libbpf's `ring_buffer` protocol. There is one
/// consumer at a time: creating a second one while the first lives (in any process) gives
/// `EBUSY`.
pub struct RingBufConsumer {
    rb: RingBuf,
    /// How `poll` waits (see [`crate::linger`]).
    linger: Linger,
    /// Our open file description of the map file, `flock`ed while we live.
    _claim: OwnedFd,
}

impl RingBufConsumer {
    /// The consumer of `rb` (sharing its mapping); `EBUSY` if `rb` already has one.
    pub fn new(rb: &RingBuf) -> Result<RingBufConsumer, MapError> {
        let claim = claim_consumer(rb.inner.base.shm.fd(), rb.inner.path.as_deref())?;
        // Only the consumer sets `waiting`, and we are the consumer now: clear what a killed
        // one may have left, which would make producers call FUTEX_WAKE for nothing.
        rb.meta().waiting.store(0, Ordering::SeqCst);
        Ok(RingBufConsumer { rb: rb.clone(), linger: Linger::new(), _claim: claim })
    }

    /// Whether `poll` lingers (the default; see [`crate::linger`]) or sleeps on the futex
    /// as soon as it finds nothing, which makes the next producer call `FUTEX_WAKE` (for a
    /// consumer that wants every record at once whatever it costs producers, and for
    /// comparisons).
    pub fn set_linger(&mut self, on: bool) {
        self.linger = if on { Linger::new() } else { Linger::eager() };
    }

    /// Opens the ring buffer file at `path` for consuming.
    pub fn open(path: &Path) -> Result<RingBufConsumer, MapError> {
        RingBufConsumer::new(&RingBuf::open(path)?)
    }

    /// The ring this consumer reads.
    pub fn ring(&self) -> &RingBuf {
        &self.rb
    }

    /// Calls `f` with each committed sample, in order, without blocking; returns how many
    /// samples were handed to `f` (discarded records are skipped). Stops at the first record
    /// still being written. `EINVAL` if positions or a record length are inconsistent
    /// (corrupt file).
    pub fn consume(&mut self, f: impl FnMut(&[u8])) -> Result<usize, MapError> {
        let fill = self.rb.fill();
        let r = self.consume_records(f);
        if matches!(r, Ok(n) if n > 0) {
            self.linger.saw_data(fill);
        }
        r
    }

    fn consume_records(&mut self, mut f: impl FnMut(&[u8])) -> Result<usize, MapError> {
        let rb = &self.rb;
        let size = rb.inner.size;
        let mask = rb.inner.mask;
        let mut cons = rb.consumer_pos().load(Ordering::Acquire);
        let mut cnt = 0usize;
        loop {
            let prod = rb.producer_pos().load(Ordering::Acquire);
            if prod.wrapping_sub(cons) > size || !cons.is_multiple_of(8) {
                return Err(MapError::new(libc::EINVAL, "ringbuf: inconsistent consumer/producer positions"));
            }
            let mut got_new = false;
            while cons < prod {
                let l = rb.hdr_len(cons).load(Ordering::Acquire);
                if l & BPF_RINGBUF_BUSY_BIT != 0 {
                    return Ok(cnt);
                }
                let sample_len = (l & !(BPF_RINGBUF_BUSY_BIT | BPF_RINGBUF_DISCARD_BIT)) as u64;
                let total = (sample_len + BPF_RINGBUF_HDR_SZ as u64 + 7) & !7;
                if total > prod - cons {
                    return Err(MapError::new(libc::EINVAL, "ringbuf: record longer than the produced data"));
                }
                got_new = true;
                if l & BPF_RINGBUF_DISCARD_BIT == 0 {
                    let off = (cons & mask) as usize + BPF_RINGBUF_HDR_SZ as usize;
                    // SAFETY: off + sample_len <= (cons & mask) + total <= size - 1 + size:
                    // inside the doubly mapped data area. The record is committed and
                    // producers cannot reserve over it until consumer_pos passes it, which
                    // happens below, after `f` returns.
                    let s = unsafe { std::slice::from_raw_parts(rb.data().add(off), sample_len as usize) };
                    f(s);
                    cnt += 1;
                }
                cons += total;
                rb.consumer_pos().store(cons, Ordering::Release);
            }
            if !got_new {
                return Ok(cnt);
            }
        }
    }

    /// Gives up on the record at `consumer_pos` if it is still reserved (BUSY): marks it
    /// discarded so that consuming goes on past it. For a record whose producer died between
    /// reserve and submit (which the kernel's verifier makes impossible, but a killed process
    /// can do here); the ring stops at such a record forever otherwise. A producer that is in
    /// fact alive later finds its submit ignored, but may still write into the sample's bytes
    /// after they have been reused: only call this when the producer is known to be gone.
    /// Returns whether a record was skipped.
    pub fn skip_busy_record(&mut self) -> bool {
        let rb = &self.rb;
        let cons = rb.consumer_pos().load(Ordering::Acquire);
        let prod = rb.producer_pos().load(Ordering::Acquire);
        if cons >= prod || prod - cons > rb.inner.size {
            return false;
        }
        let len = rb.hdr_len(cons);
        let l = len.load(Ordering::Acquire);
        if l & BPF_RINGBUF_BUSY_BIT == 0 {
            return false;
        }
        let skipped = (l & !BPF_RINGBUF_BUSY_BIT) | BPF_RINGBUF_DISCARD_BIT;
        len.compare_exchange(l, skipped, Ordering::SeqCst, Ordering::Relaxed).is_ok()
    }

    /// Like [`RingBufConsumer::consume`], but if no sample is ready sleeps until one is or
    /// `timeout` has passed. Returns the number of samples handed to `f` (0 on timeout).
    /// `Duration::MAX` waits forever. While samples came recently the sleep is a short timed
    /// one that producers do not know of; after [`crate::linger::LINGER_IDLE`] without
    /// samples it is a futex wait producers end (see [`crate::linger`]).
    pub fn poll(&mut self, timeout: Duration, mut f: impl FnMut(&[u8])) -> Result<usize, MapError> {
        crate::linger::poll(self, timeout, |c| c.consume(&mut f))
    }

    /// Whether the record at consumer_pos is committed. Called after `waiting = 1`
    /// (sequentially consistent: the consumer's full barrier of the wakeup handshake).
    ///
    /// The record's `len` is read first, sequentially consistent: it pairs with the
    /// producer's sequentially consistent exchange of `len` in `commit`, which is followed by
    /// its load of `waiting`. Either that load saw `waiting = 1` (the producer wakes us), or
    /// the exchange precedes this load and we see the committed `len`. Reading it
    /// synchronises with the exchange (a release), so `producer_pos`, release-stored by
    /// `reserve` before it, is visible to the load that follows: `producer_pos` itself needs
    /// no stronger ordering than release. (Checked the other way round, a `producer_pos`
    /// read first could be stale and miss a record whose wakeup was skipped.) If no record
    /// was produced at consumer_pos, `len` is stale bytes, and `producer_pos` says so.
    fn ready(&self) -> bool {
        let rb = &self.rb;
        let cons = rb.consumer_pos().load(Ordering::Relaxed);
        let len = rb.hdr_len(cons).load(Ordering::SeqCst);
        let prod = rb.producer_pos().load(Ordering::Acquire);
        if cons >= prod || prod - cons > rb.inner.size {
            return false;
        }
        len & BPF_RINGBUF_BUSY_BIT == 0
    }
}

impl crate::linger::Waiting for RingBufConsumer {
    fn linger(&mut self) -> &mut Linger {
        &mut self.linger
    }

    fn sleep_deep(&self, timeout: Option<Duration>) {
        let m = self.rb.meta();
        crate::linger::sleep_deep(&m.waiting, &m.wake_seq, || self.ready(), timeout, true);
    }
}

/// Sleeps while `*word == expected`, at most `timeout` (forever if None). Shared futex (no
/// FUTEX_PRIVATE_FLAG): the word lives in a file mapped by several processes.
pub(crate) fn futex_wait(word: &AtomicU32, expected: u32, timeout: Option<Duration>) {
    let ts;
    let tsp: *const libc::timespec = match timeout {
        Some(d) => {
            ts = libc::timespec {
                tv_sec: d.as_secs().min(i64::MAX as u64) as libc::time_t,
                tv_nsec: d.subsec_nanos() as libc::c_long,
            };
            &ts
        }
        None => ptr::null(),
    };
    // SAFETY: FUTEX_WAIT reads the aligned u32 at `word` (valid for the call) and the
    // timespec (valid or null); it writes nothing.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAIT, expected, tsp, ptr::null::<u32>(), 0u32);
    }
}

/// Bumps futex word `word` (so a waiter about to sleep on its old value does not) and wakes
/// every waiter sleeping on it (in any process).
pub(crate) fn futex_wake(word: &AtomicU32) {
    word.fetch_add(1, Ordering::SeqCst);
    // SAFETY: FUTEX_WAKE only uses the address as a key; it does not access memory
    // through the null pointers.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE,
            i32::MAX,
            ptr::null::<libc::timespec>(),
            ptr::null::<u32>(),
            0u32,
        );
    }
}

/// One consumer at a time: opens a new open file description of the map file (through
/// /proc/self/fd, else by path) and takes an exclusive `flock` on it, without waiting
/// (`EBUSY` if another consumer holds it). The lock lives as long as the returned fd, and
/// the kernel drops it if the process dies.
pub(crate) fn claim_consumer(file: &OwnedFd, path: Option<&Path>) -> Result<OwnedFd, MapError> {
    let open = |p: &[u8]| -> Option<OwnedFd> {
        let c = CString::new(p).ok()?;
        // SAFETY: `c` is a valid NUL-terminated path; open has no other memory effects.
        let fd = unsafe { libc::open(c.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
        // SAFETY: a descriptor open just returned, owned by nobody else.
        (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd) })
    };
    let fd = open(format!("/proc/self/fd/{}", file.as_raw_fd()).as_bytes())
        .or_else(|| path.and_then(|p| open(p.as_os_str().as_bytes())))
        .ok_or_else(|| {
            MapError::new(
                io::Error::last_os_error().raw_os_error().unwrap_or(libc::EINVAL),
                "reopening the map file for its consumer",
            )
        })?;
    // SAFETY: flock on a descriptor we own.
    if unsafe { libc::flock(fd.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let e = io::Error::last_os_error();
        return Err(if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
            MapError::new(libc::EBUSY, "the map already has a consumer")
        } else {
            io_error(e, "locking the map file for its consumer")
        });
    }
    Ok(fd)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn map_style_create_and_open() {
        let dir = std::env::temp_dir().join(format!("userbpf-rb-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("rb");
        let _ = std::fs::remove_file(&path);
        let spec = MapSpec {
            map_type: MapType::BPF_MAP_TYPE_RINGBUF,
            key_size: 0,
            value_size: 0,
            max_entries: 8192,
            map_flags: 0,
            map_extra: 0,
            name: "a_rather_long_map_name".into(),
        };
        // As Map::create does it.
        let size = RingBuf::file_size(&spec).unwrap() as usize;
        let shm = Shm::create(&path, size).unwrap();
        let back = write_header(&shm, &spec, 4);
        assert_eq!(back.name, "a_rather_long_m");
        let rb = RingBuf::init(Base { shm, spec: back.clone(), nr_cpus: 4 }).unwrap();
        assert!(RingBuf::open(&path).is_err(), "not a map before the magic is published");
        publish_header(&rb.base().shm);
        // SAFETY: the sample is committed right away.
        unsafe { rb.output(b"x".as_ptr(), 1, 0).unwrap() };
        // As Map::open does it.
        let shm = Shm::open(&path).unwrap();
        let (spec2, nr_cpus) = read_header(&shm).unwrap();
        assert_eq!((spec2.clone(), nr_cpus), (back, 4));
        let rb2 = RingBuf::open_base(Base { shm, spec: spec2, nr_cpus }).unwrap();
        assert_eq!(rb2.query(crate::types::BPF_RB_AVAIL_DATA), 16);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn meta_layout() {
        assert_eq!(std::mem::offset_of!(RbMeta, lock), 128);
        assert_eq!(std::mem::offset_of!(RbMeta, waiting), 192);
        assert_eq!(std::mem::offset_of!(RbMeta, wake_seq), 196);
    }

    #[test]
    fn kernel_mmap_segments() {
        let l = RingBufLayout::for_size(4 * PAGE);
        // libbpf: consumer page RW at 0, then producer + 2 × data RO at one page.
        assert_eq!(l.kernel_mmap_segments(0, PAGE, true).unwrap(), vec![(PAGE, PAGE)]);
        assert_eq!(
            l.kernel_mmap_segments(PAGE, PAGE + 8 * PAGE, false).unwrap(),
            vec![(2 * PAGE, 5 * PAGE), (3 * PAGE, 4 * PAGE)]
        );
        assert_eq!(l.kernel_mmap_segments(PAGE, PAGE, true).unwrap_err().errno(), libc::EPERM);
        assert_eq!(l.kernel_mmap_segments(PAGE, 10 * PAGE, false).unwrap_err().errno(), libc::EINVAL);
        // View page 7 is the second copy of data page 1: file page 4.
        assert_eq!(l.kernel_mmap_segments(7 * PAGE, PAGE, false).unwrap(), vec![(4 * PAGE, PAGE)]);
        assert_eq!(l.kernel_mmap_segments(3, PAGE, false).unwrap_err().errno(), libc::EINVAL);
    }
}
