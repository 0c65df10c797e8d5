//! `mmap` of our descriptors with the kernel's layouts, perf event arrays' rings, and the
//! wakeups that make the loader's `poll`/`epoll_wait` on rings work.
//!
//! **Perf rings.** A `PERF_COUNT_SW_BPF_OUTPUT` event's ring is a ring of the perf event array
//! map it is stored in: `MAP_UPDATE_ELEM(map, cpu, event_fd)` ([`perf_array_update`]) sizes the
//! map's ring at that index to what the loader mmapped the event with (`1 + 2^n` pages, as
//! bcc, bpftrace and libbpf's perf_buffer do before the update) and maps that range of the
//! map file `MAP_FIXED` over the loader's mapping of the event. From then on programs in
//! every process (they all map the map file) write exactly the memory the loader's reader
//! reads, and until then they get `ENOENT` (no event at the index), as in the kernel. An event
//! mmapped before it is stored anywhere gets anonymous shared memory laid out as an empty
//! ring; one stored before it is mmapped has no ring (`ENOSPC`) until it is.
//!
//! **Ring buffers** (`BPF_MAP_TYPE_RINGBUF`): libbpf maps the consumer page read-write at
//! offset 0 and the producer page with the data area twice read-only at one page; the map
//! file's pages are mapped in that order ([`RingBufLayout::kernel_mmap_segments`]).
//! **Mmapable arrays** (`BPF_F_MMAPABLE`): the values, from offset 0.
//!
//! **Wakeups.** Event and ring buffer descriptors are FIFOs. A thread per map in the loader
//! watches the rings and writes a byte into the FIFO of each ring that got data: the
//! descriptor polls readable. While data came within the last 20 ms it looks again after
//! short timed sleeps (50 µs doubling to 1 ms) that producers know nothing of; only once
//! idle does it set the rings' `waiting` words and sleep on the map's futex word, which a
//! producer then bumps and wakes (`userbpf_maps::linger`). So a steady stream costs the
//! target's hot path no system call, a lone event after a quiet period is signalled at once,
//! one during a stream within about a millisecond, and an idle watcher takes no CPU. Before each
//! `poll`/`epoll_wait` of the loader ([`before_wait`]), the FIFOs of rings the loader has
//! emptied are drained and their watchers re-armed: readable exactly while data waits.
//!
//! The jobs, one module each: this module serves `mmap` and `munmap` of our descriptors;
//! [`perf_rings`] keeps the loader's view of its perf events and stores them in perf event
//! arrays; [`wakeups`] makes ring descriptors poll readable.

mod perf_rings;
mod wakeups;

use std::collections::HashMap;
use std::ffi::c_void;
use std::path::Path;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex};

use userbpf_maps::Map;
use userbpf_maps::perf::PerfEventArray;

use crate::objects::{self, Kind};

use crate::perf_event::Spec;
use crate::sys;
pub(crate) use perf_rings::EventState;
use perf_rings::{Mapping, events};
pub use perf_rings::{event_closed, event_created, map_created, perf_array_delete, perf_array_update};
pub(crate) use wakeups::Watcher;
pub use wakeups::{before_wait, ringbuf_fd_path};

pub(super) const PAGE: u64 = 4096;

/// What this module keeps (in [`crate::server::Server`]).
pub(crate) struct State {
    /// Descriptors this library keeps open for itself (not the loader's).
    pub(crate) internal_fds: Mutex<Vec<i32>>,
    /// Perf events' rings and mappings.
    pub(crate) events: Mutex<Option<HashMap<u32, EventState>>>,
    /// Maps opened by this module.
    pub(crate) maps: Mutex<Option<HashMap<u32, Arc<Map>>>>,
    /// The watcher of each map with watched rings.
    pub(crate) watchers: Mutex<Option<HashMap<u32, Arc<Watcher>>>>,
    /// Number of watched rings (the fast path of [`before_wait`] when there is none).
    pub(crate) watched: AtomicUsize,
}

pub(super) fn state() -> &'static State {
    &crate::server::server().mmap
}

pub fn internal_fds() -> Vec<i32> {
    state().internal_fds.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

pub fn add_internal_fd(fd: i32) {
    state().internal_fds.lock().unwrap_or_else(|e| e.into_inner()).push(fd);
}

pub(super) fn remove_internal_fd(fd: i32) {
    state().internal_fds.lock().unwrap_or_else(|e| e.into_inner()).retain(|f| *f != fd);
}

/// Opens our own descriptor of a FIFO (read-write, non-blocking).
pub(super) fn open_fifo(path: &Path) -> Result<i32, i32> {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).map_err(|_| libc::EINVAL)?;
    // SAFETY: a NUL-terminated path.
    let fd = unsafe {
        sys::raw6(
            libc::SYS_openat,
            libc::AT_FDCWD as i64,
            c.as_ptr() as i64,
            (libc::O_RDWR | libc::O_NONBLOCK | libc::O_CLOEXEC) as i64,
            0,
            0,
            0,
        )
    };
    if fd < 0 {
        return Err(-fd as i32);
    }
    add_internal_fd(fd as i32);
    Ok(fd as i32)
}

pub(super) fn map(id: u32) -> Result<Arc<Map>, i32> {
    let mut g = state().maps.lock().unwrap_or_else(|e| e.into_inner());
    let m = g.get_or_insert_with(HashMap::new);
    if let Some(x) = m.get(&id) {
        return Ok(x.clone());
    }
    let s = objects::session()?;
    let x = Arc::new(s.open_map(id).map_err(|e| match e {
        userbpf_runtime::SessionError::Map(m) => m.errno(),
        userbpf_runtime::SessionError::Io(e) => e.raw_os_error().unwrap_or(libc::EIO),
        userbpf_runtime::SessionError::NotFound(_) => libc::ENOENT,
    })?);
    m.insert(id, x.clone());
    Ok(x)
}

pub(super) fn perf_array(m: &Map) -> Result<&PerfEventArray, i32> {
    match m {
        Map::PerfEventArray(pa) => Ok(pa),
        _ => Err(libc::EINVAL),
    }
}

/// Serves `mmap` when `fd` is ours; `None`: not ours, the kernel's.
///
/// # Safety
/// As for libc's `mmap`: with `MAP_FIXED` in `flags`, `[addr, addr + len)` is replaced, so
/// it must be a range the caller may unmap (nothing else of the process lives there).
pub unsafe fn mmap(
    addr: *mut c_void,
    len: usize,
    prot: i32,
    flags: i32,
    fd: i32,
    off: i64,
) -> Option<Result<*mut c_void, i32>> {
    let (kind, id) = objects::kind_of(fd)?;
    // The descriptors handed to the loader are opened with O_NOATIME; this library's own
    // opens of the same files (the agent mapping a map, Map::open) are not, and are the
    // kernel's business.
    // SAFETY: F_GETFL reads the descriptor's status flags only.
    let fl = unsafe { sys::raw6(libc::SYS_fcntl, fd as i64, libc::F_GETFL as i64, 0, 0, 0, 0) };
    if fl < 0 || fl & libc::O_NOATIME as i64 == 0 {
        return None;
    }
    // SAFETY: the caller's request, under this function's contract.
    Some(unsafe {
        match kind {
            Kind::PerfEvent => mmap_event(id, addr, len, prot, flags, off),
            Kind::Map => mmap_map(id, addr, len, prot, flags, off),
            _ => Err(libc::ENODEV),
        }
    })
}

/// The `mmap` system call.
///
/// # Safety
/// With `MAP_FIXED` in `flags`, `[addr, addr + len)` must be a range the caller may replace:
/// one the loader asked for (under [`mmap`]'s contract) or one reserved here.
unsafe fn raw_mmap(addr: usize, len: usize, prot: i32, flags: i32, fd: i32, off: u64) -> Result<usize, i32> {
    // SAFETY: a mapping request the kernel checks; MAP_FIXED only under this function's
    // contract.
    let r =
        unsafe { sys::raw6(libc::SYS_mmap, addr as i64, len as i64, prot as i64, flags as i64, fd as i64, off as i64) };
    if r < 0 { Err(-r as i32) } else { Ok(r as usize) }
}

/// `mmap` of a perf event's descriptor.
///
/// # Safety
/// As for [`mmap`].
unsafe fn mmap_event(
    id: u32,
    addr: *mut c_void,
    len: usize,
    prot: i32,
    flags: i32,
    off: i64,
) -> Result<*mut c_void, i32> {
    if !matches!(crate::perf_event::event_spec(id), Some(Spec::Output { .. })) {
        return Err(libc::EINVAL);
    }
    let pages = (len as u64 / PAGE).saturating_sub(1);
    if off != 0
        || !(len as u64).is_multiple_of(PAGE)
        || pages == 0
        || !pages.is_power_of_two()
        || flags & libc::MAP_SHARED == 0
    {
        return Err(libc::EINVAL);
    }
    let pages = pages as u32;
    let (bound, have) = events(|e| e.get(&id).map(|st| (st.bound, st.pages)).ok_or(libc::EBADF))?;
    if have != 0 && have != pages {
        return Err(libc::EINVAL); // the kernel: one ring buffer per event, of one size
    }
    let keep = flags
        & !(libc::MAP_PRIVATE | libc::MAP_SHARED_VALIDATE)
        & (libc::MAP_FIXED | libc::MAP_POPULATE | libc::MAP_NORESERVE);
    let at = match bound {
        Some((map_id, index)) => {
            let m = map(map_id)?;
            let pa = perf_array(&m)?;
            let (roff, rlen) = if have == 0 {
                pa.configure_ring(index, pages, id as u64).map_err(|e| e.errno())?
            } else {
                pa.ring_file_range(index).ok_or(libc::EINVAL)?
            };
            if rlen as usize != len {
                return Err(libc::EINVAL);
            }
            let fd = std::os::fd::AsRawFd::as_raw_fd(m.shm().fd());
            // SAFETY: the caller's range, under this function's contract.
            unsafe { raw_mmap(addr as usize, len, prot, libc::MAP_SHARED | keep, fd, roff)? }
        }
        None => {
            // Not stored anywhere yet: an empty ring of its own.
            // SAFETY: the caller's range, under this function's contract.
            let a = unsafe {
                raw_mmap(
                    addr as usize,
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED | libc::MAP_ANONYMOUS | keep,
                    -1,
                    0,
                )?
            };
            // SAFETY: the fresh page we just mapped read-write.
            unsafe {
                let p = a as *mut u8;
                p.add(userbpf_maps::perf::PERF_MMAP_DATA_OFFSET).cast::<u64>().write(PAGE);
                p.add(userbpf_maps::perf::PERF_MMAP_DATA_SIZE).cast::<u64>().write(pages as u64 * PAGE);
                // size of the page's header part, as perf_event_init_userpage writes it.
                p.add(48).cast::<u32>().write(96);
                libc::mprotect(a as *mut c_void, len, prot);
            }
            a
        }
    };
    events(|e| {
        if let Some(st) = e.get_mut(&id) {
            st.pages = pages;
            st.mappings.push(Mapping { addr: at, len, prot });
        }
    });
    Ok(at as *mut c_void)
}

/// `mmap` of a map's descriptor.
///
/// # Safety
/// As for [`mmap`].
unsafe fn mmap_map(
    id: u32,
    addr: *mut c_void,
    len: usize,
    prot: i32,
    flags: i32,
    off: i64,
) -> Result<*mut c_void, i32> {
    if off < 0 || !(off as u64).is_multiple_of(PAGE) || len == 0 {
        return Err(libc::EINVAL);
    }
    if flags & libc::MAP_SHARED == 0 && prot & libc::PROT_WRITE != 0 {
        return Err(libc::EINVAL);
    }
    let m = map(id)?;
    let fd = std::os::fd::AsRawFd::as_raw_fd(m.shm().fd());
    let keep = flags & (libc::MAP_FIXED | libc::MAP_POPULATE | libc::MAP_NORESERVE);
    let share = if flags & libc::MAP_SHARED != 0 { libc::MAP_SHARED } else { libc::MAP_PRIVATE };
    match &*m {
        Map::RingBuf(rb) => {
            let segs = rb
                .file_layout()
                .kernel_mmap_segments(off as u64, len as u64, prot & libc::PROT_WRITE != 0)
                .map_err(|e| e.errno())?;
            let total: u64 = segs.iter().map(|s| s.1).sum();
            // Reserve the range (or take the loader's), then lay the file's pages over it.
            let base = if keep & libc::MAP_FIXED != 0 {
                addr as usize
            } else {
                // SAFETY: without MAP_FIXED: a new range of the kernel's choosing.
                unsafe {
                    raw_mmap(
                        addr as usize,
                        total as usize,
                        libc::PROT_NONE,
                        libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                        -1,
                        0,
                    )?
                }
            };
            let mut at = base;
            for (foff, flen) in segs {
                // SAFETY: within [base, base + total): the caller's range (MAP_FIXED, under
                // this function's contract) or the one reserved above.
                if let Err(e) = unsafe {
                    raw_mmap(at, flen as usize, prot, share | libc::MAP_FIXED | (keep & libc::MAP_POPULATE), fd, foff)
                } {
                    if keep & libc::MAP_FIXED == 0 {
                        // SAFETY: the range we reserved above.
                        unsafe { sys::raw6(libc::SYS_munmap, base as i64, total as i64, 0, 0, 0, 0) };
                    }
                    return Err(e);
                }
                at += flen as usize;
            }
            Ok(base as *mut c_void)
        }
        _ => {
            let (Some(moff), Some(mlen)) = (m.mmapable_offset(), m.mmapable_len()) else {
                return Err(libc::ENODEV);
            };
            if off as u64 + len as u64 > (mlen as u64).div_ceil(PAGE) * PAGE {
                return Err(libc::EINVAL);
            }
            let frozen_or_ro = m.spec().map_flags & userbpf_maps::BPF_F_RDONLY != 0;
            if frozen_or_ro && prot & libc::PROT_WRITE != 0 && share == libc::MAP_SHARED {
                return Err(libc::EPERM);
            }
            // SAFETY: the caller's range, under this function's contract.
            Ok(unsafe { raw_mmap(addr as usize, len, prot, share | keep, fd, moff as u64 + off as u64)? }
                as *mut c_void)
        }
    }
}

/// Forgets what was mapped in `[addr, addr + len)` (the kernel does the unmapping).
pub fn munmap(addr: *mut c_void, len: usize) {
    // try_lock: munmap can be called while this thread holds the lock (free() of a large
    // block inside one of our own closures); a mapping not forgotten then is only re-pointed
    // needlessly by a later MAP_UPDATE_ELEM of its event.
    let Ok(mut g) = state().events.try_lock() else { return };
    let Some(m) = g.as_mut() else { return };
    let (a, e) = (addr as usize, (addr as usize).saturating_add(len));
    for st in m.values_mut() {
        st.mappings.retain(|mp| mp.addr + mp.len <= a || mp.addr >= e);
    }
}
