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
//! waits on the map's futex word (producers only wake it when a ring it watches goes from
//! empty to not empty, so a target's hot path makes no system call otherwise) and writes a
//! byte into the FIFO of each ring that got data: the descriptor polls readable. Before each
//! `poll`/`epoll_wait` of the loader ([`before_wait`]), the FIFOs of rings the loader has
//! emptied are drained and their watchers re-armed: readable exactly while data waits.

use std::collections::HashMap;
use std::ffi::c_void;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use userbpf_maps::perf::PerfEventArray;
use userbpf_maps::Map;

use crate::objects::{self, Kind};
use crate::perf_event::Spec;
use crate::sys;

const PAGE: u64 = 4096;

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

fn state() -> &'static State {
    &crate::server::server().mmap
}

pub fn internal_fds() -> Vec<i32> {
    state().internal_fds.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

pub fn add_internal_fd(fd: i32) {
    state().internal_fds.lock().unwrap_or_else(|e| e.into_inner()).push(fd);
}

fn remove_internal_fd(fd: i32) {
    state().internal_fds.lock().unwrap_or_else(|e| e.into_inner()).retain(|f| *f != fd);
}

/// Opens our own descriptor of a FIFO (read-write, non-blocking).
fn open_fifo(path: &Path) -> Result<i32, i32> {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).map_err(|_| libc::EINVAL)?;
    // SAFETY: a NUL-terminated path.
    let fd = unsafe {
        sys::raw6(libc::SYS_openat, libc::AT_FDCWD as i64, c.as_ptr() as i64, (libc::O_RDWR | libc::O_NONBLOCK | libc::O_CLOEXEC) as i64, 0, 0, 0)
    };
    if fd < 0 {
        return Err(-fd as i32);
    }
    add_internal_fd(fd as i32);
    Ok(fd as i32)
}

// ---- the loader's view of events ----

/// A mapping the loader made of an event descriptor.
#[derive(Clone, Copy, Debug)]
struct Mapping {
    addr: usize,
    len: usize,
    prot: i32,
}

pub(crate) struct EventState {
    /// Our descriptor of the event's FIFO.
    fifo: i32,
    /// Where the event is stored: (map id, index).
    bound: Option<(u32, u32)>,
    mappings: Vec<Mapping>,
    /// Data pages of its ring (from the first mmap), 0 until then.
    pages: u32,
}

fn events<T>(f: impl FnOnce(&mut HashMap<u32, EventState>) -> T) -> T {
    let mut g = state().events.lock().unwrap_or_else(|e| e.into_inner());
    f(g.get_or_insert_with(HashMap::new))
}

/// A perf event was opened (its FIFO is `fifo`).
pub fn event_created(id: u32, fifo: &Path) {
    if let Ok(fd) = open_fifo(fifo) {
        events(|m| m.insert(id, EventState { fifo: fd, bound: None, mappings: Vec::new(), pages: 0 }));
    }
}

/// The last descriptor of event `id` was closed (its ring stays where it is stored, as the
/// map holds the event in the kernel).
pub fn event_closed(id: u32) {
    let st = events(|m| m.remove(&id));
    if let Some(st) = st {
        if let Some((map_id, index)) = st.bound {
            unwatch_ring(map_id, index);
        }
        remove_internal_fd(st.fifo);
        objects::close(st.fifo);
    }
}

// ---- maps opened by this module ----

fn map(id: u32) -> Result<Arc<Map>, i32> {
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

fn perf_array(m: &Map) -> Result<&PerfEventArray, i32> {
    match m {
        Map::PerfEventArray(pa) => Ok(pa),
        _ => Err(libc::EINVAL),
    }
}

/// After `MAP_CREATE` of any map: a perf event array starts with no event at any index (its
/// outputs get `ENOENT` until `MAP_UPDATE_ELEM`), as in the kernel.
pub fn map_created(id: u32, m: &Map) {
    if let Map::PerfEventArray(pa) = m {
        for i in 0..pa.max_entries() {
            let _ = pa.detach(i);
        }
    }
    let _ = id;
}

/// The FIFO a ring buffer map's descriptors open (so `epoll_ctl` accepts them), created on
/// first use, with the watcher that makes it readable while records wait.
pub fn ringbuf_fd_path(map_id: u32) -> Result<PathBuf, i32> {
    let s = objects::session()?;
    let path = s.layout().map_poll(map_id);
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).map_err(|_| libc::EINVAL)?;
    // SAFETY: a NUL-terminated path.
    if unsafe { libc::mkfifo(c.as_ptr(), 0o600) } != 0 {
        let e = std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO);
        if e != libc::EEXIST {
            return Err(e);
        }
    }
    let m = map(map_id)?;
    if !matches!(&*m, Map::RingBuf(_)) {
        return Err(libc::EINVAL);
    }
    let w = watcher(map_id, &m);
    let mut rings = w.rings.lock().unwrap_or_else(|e| e.into_inner());
    if !rings.iter().any(|r| r.index == 0) {
        let fd = open_fifo(&path)?;
        rings.push(Arc::new(WRing { index: 0, fifo: fd, signalled: AtomicBool::new(false) }));
        drop(rings);
        state().watched.fetch_add(1, Ordering::SeqCst);
        w.kick();
    }
    Ok(path)
}

/// `MAP_UPDATE_ELEM` on a perf event array: stores the event of `event_fd` at `key`.
pub fn perf_array_update(map_id: u32, key: u32, event_fd: i32) -> Result<(), i32> {
    let ev = objects::get_kind(event_fd, Kind::PerfEvent)?;
    match crate::perf_event::event_spec(ev.id) {
        Some(Spec::Output { .. }) => {}
        Some(_) => return Err(libc::EOPNOTSUPP),
        None => return Err(libc::EBADF),
    }
    let m = map(map_id)?;
    let pa = perf_array(&m)?;
    if key >= pa.max_entries() {
        return Err(libc::E2BIG);
    }
    // The event moves here from wherever it was stored.
    let (old, pages, maps) = events(|e| {
        let st = e.get_mut(&ev.id).ok_or(libc::EBADF)?;
        let old = st.bound.replace((map_id, key));
        Ok::<_, i32>((old, st.pages, st.mappings.clone()))
    })?;
    if let Some((om, oi)) = old {
        if (om, oi) != (map_id, key) {
            unwatch_ring(om, oi);
        }
    }
    // Another event stored at this index is replaced.
    events(|e| {
        for (id, st) in e.iter_mut() {
            if *id != ev.id && st.bound == Some((map_id, key)) {
                st.bound = None;
            }
        }
    });
    let (off, _) = pa.configure_ring(key, pages, ev.id as u64).map_err(|e| e.errno())?;
    let fd = std::os::fd::AsRawFd::as_raw_fd(m.shm().fd());
    let current = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
    let maps_dir = objects::session().map(|s| s.layout().maps_dir().to_string_lossy().into_owned()).unwrap_or_default();
    for mp in maps {
        // Only a mapping still there as we made it (an empty ring of its own, or a ring of a
        // map file): one the loader unmapped without us seeing it is left alone.
        let ours = current.lines().any(|l| {
            let mut f = l.split_whitespace();
            let range = f.next().unwrap_or("");
            let path = f.nth(4).unwrap_or("");
            range == format!("{:x}-{:x}", mp.addr, mp.addr + mp.len) && (path.starts_with("/dev/zero") || (!maps_dir.is_empty() && path.starts_with(&maps_dir)))
        });
        if !ours {
            continue;
        }
        // SAFETY: replaces the loader's own mapping of the event (same address and length)
        // with the map's ring of the same size.
        let r = unsafe {
            sys::raw6(libc::SYS_mmap, mp.addr as i64, mp.len as i64, mp.prot as i64, (libc::MAP_SHARED | libc::MAP_FIXED) as i64, fd as i64, off as i64)
        };
        if r < 0 {
            return Err(-r as i32);
        }
    }
    pa.attach(key).map_err(|e| e.errno())?;
    watch_ring(map_id, &m, key, ev.id);
    Ok(())
}

/// `MAP_DELETE_ELEM` on a perf event array: `ENOENT` if no event is stored at `key`.
pub fn perf_array_delete(map_id: u32, key: u32) -> Result<(), i32> {
    let m = map(map_id)?;
    let pa = perf_array(&m)?;
    if key >= pa.max_entries() {
        return Err(libc::E2BIG);
    }
    if !pa.is_attached(key) {
        return Err(libc::ENOENT);
    }
    pa.detach(key).map_err(|e| e.errno())?;
    events(|e| {
        for st in e.values_mut() {
            if st.bound == Some((map_id, key)) {
                st.bound = None;
            }
        }
    });
    unwatch_ring(map_id, key);
    Ok(())
}

// ---- mmap ----

/// Serves `mmap` when `fd` is ours; `None`: not ours, the kernel's.
///
/// # Safety
/// As for libc's `mmap`: with `MAP_FIXED` in `flags`, `[addr, addr + len)` is replaced, so
/// it must be a range the caller may unmap (nothing else of the process lives there).
pub unsafe fn mmap(addr: *mut c_void, len: usize, prot: i32, flags: i32, fd: i32, off: i64) -> Option<Result<*mut c_void, i32>> {
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
    let r = unsafe { sys::raw6(libc::SYS_mmap, addr as i64, len as i64, prot as i64, flags as i64, fd as i64, off as i64) };
    if r < 0 {
        Err(-r as i32)
    } else {
        Ok(r as usize)
    }
}

/// `mmap` of a perf event's descriptor.
///
/// # Safety
/// As for [`mmap`].
unsafe fn mmap_event(id: u32, addr: *mut c_void, len: usize, prot: i32, flags: i32, off: i64) -> Result<*mut c_void, i32> {
    if !matches!(crate::perf_event::event_spec(id), Some(Spec::Output { .. })) {
        return Err(libc::EINVAL);
    }
    let pages = (len as u64 / PAGE).saturating_sub(1);
    if off != 0 || !(len as u64).is_multiple_of(PAGE) || pages == 0 || !pages.is_power_of_two() || flags & libc::MAP_SHARED == 0 {
        return Err(libc::EINVAL);
    }
    let pages = pages as u32;
    let (bound, have) = events(|e| e.get(&id).map(|st| (st.bound, st.pages)).ok_or(libc::EBADF))?;
    if have != 0 && have != pages {
        return Err(libc::EINVAL); // the kernel: one ring buffer per event, of one size
    }
    let keep = flags & !(libc::MAP_PRIVATE | libc::MAP_SHARED_VALIDATE) & (libc::MAP_FIXED | libc::MAP_POPULATE | libc::MAP_NORESERVE);
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
            let a = unsafe { raw_mmap(addr as usize, len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED | libc::MAP_ANONYMOUS | keep, -1, 0)? };
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
unsafe fn mmap_map(id: u32, addr: *mut c_void, len: usize, prot: i32, flags: i32, off: i64) -> Result<*mut c_void, i32> {
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
            let segs = rb.file_layout().kernel_mmap_segments(off as u64, len as u64, prot & libc::PROT_WRITE != 0).map_err(|e| e.errno())?;
            let total: u64 = segs.iter().map(|s| s.1).sum();
            // Reserve the range (or take the loader's), then lay the file's pages over it.
            let base = if keep & libc::MAP_FIXED != 0 {
                addr as usize
            } else {
                // SAFETY: without MAP_FIXED: a new range of the kernel's choosing.
                unsafe { raw_mmap(addr as usize, total as usize, libc::PROT_NONE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0)? }
            };
            let mut at = base;
            for (foff, flen) in segs {
                // SAFETY: within [base, base + total): the caller's range (MAP_FIXED, under
                // this function's contract) or the one reserved above.
                if let Err(e) = unsafe { raw_mmap(at, flen as usize, prot, share | libc::MAP_FIXED | (keep & libc::MAP_POPULATE), fd, foff) } {
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
            Ok(unsafe { raw_mmap(addr as usize, len, prot, share | keep, fd, moff as u64 + off as u64)? } as *mut c_void)
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

// ---- wakeups ----

/// A watched ring: its FIFO (our descriptor) and whether a byte sits in it.
struct WRing {
    index: u32,
    fifo: i32,
    signalled: AtomicBool,
}

/// The watcher of one map's rings.
pub(crate) struct Watcher {
    map: Arc<Map>,
    rings: Mutex<Vec<Arc<WRing>>>,
}

impl Watcher {
    fn kick(&self) {
        match &*self.map {
            Map::PerfEventArray(pa) => pa.wake_watchers(),
            Map::RingBuf(rb) => rb.wake_watchers(),
            _ => {}
        }
    }

    fn has_data(&self, index: u32) -> bool {
        match &*self.map {
            Map::PerfEventArray(pa) => pa.ring_has_data(index),
            Map::RingBuf(rb) => rb.query(userbpf_maps::BPF_RB_AVAIL_DATA) != 0,
            _ => false,
        }
    }

    fn ready(&self, index: u32) -> bool {
        match &*self.map {
            Map::PerfEventArray(pa) => pa.ring_has_data(index),
            Map::RingBuf(rb) => rb.has_committed_record(),
            _ => false,
        }
    }

    fn arm(&self, index: u32, on: bool) {
        match &*self.map {
            Map::PerfEventArray(pa) => pa.set_ring_waiting(index, on),
            Map::RingBuf(rb) => rb.set_waiting(on),
            _ => {}
        }
    }

    fn word(&self) -> Option<&std::sync::atomic::AtomicU32> {
        match &*self.map {
            Map::PerfEventArray(pa) => Some(pa.wake_word()),
            Map::RingBuf(rb) => Some(rb.wake_word()),
            _ => None,
        }
    }

    /// The watcher thread: signals the FIFO of each ring that got data, sleeps on the map's
    /// futex word while the others are empty.
    fn run(self: Arc<Self>) {
        let Some(word) = self.word() else { return };
        loop {
            let seq = word.load(Ordering::SeqCst);
            let rings: Vec<Arc<WRing>> = self.rings.lock().unwrap_or_else(|e| e.into_inner()).clone();
            for r in &rings {
                let armed = !r.signalled.load(Ordering::SeqCst);
                self.arm(r.index, armed);
                if armed && self.ready(r.index) {
                    self.arm(r.index, false);
                    r.signalled.store(true, Ordering::SeqCst);
                    let b = 1u8;
                    // SAFETY: writing one byte from a local to our FIFO descriptor.
                    unsafe { sys::raw6(libc::SYS_write, r.fifo as i64, &b as *const u8 as i64, 1, 0, 0, 0) };
                }
            }
            futex_wait(word, seq);
        }
    }
}

fn futex_wait(word: &std::sync::atomic::AtomicU32, expected: u32) {
    // SAFETY: FUTEX_WAIT on an aligned u32 of a shared mapping that outlives the call (the
    // watcher holds the map); no timeout.
    unsafe {
        sys::raw6(libc::SYS_futex, word.as_ptr() as i64, libc::FUTEX_WAIT as i64, expected as i64, 0, 0, 0);
    }
}

fn watcher(map_id: u32, m: &Arc<Map>) -> Arc<Watcher> {
    let mut g = state().watchers.lock().unwrap_or_else(|e| e.into_inner());
    let ws = g.get_or_insert_with(HashMap::new);
    if let Some(w) = ws.get(&map_id) {
        return w.clone();
    }
    let w = Arc::new(Watcher { map: m.clone(), rings: Mutex::new(Vec::new()) });
    let t = w.clone();
    // Signals blocked: the loader's own (SIGINT, SIGCHLD from a signalfd...) go to its threads.
    let _ = userbpf_hook::quiet::spawn(format!("userbpf-wake-{map_id}"), move || t.run());
    ws.insert(map_id, w.clone());
    w
}

fn watch_ring(map_id: u32, m: &Arc<Map>, index: u32, event: u32) {
    let Some(fifo) = events(|e| e.get(&event).map(|s| s.fifo)) else { return };
    let w = watcher(map_id, m);
    let mut rings = w.rings.lock().unwrap_or_else(|e| e.into_inner());
    let before = rings.len();
    rings.retain(|r| r.index != index);
    let removed = before - rings.len();
    rings.push(Arc::new(WRing { index, fifo, signalled: AtomicBool::new(false) }));
    drop(rings);
    if removed == 0 {
        state().watched.fetch_add(1, Ordering::SeqCst);
    }
    w.kick();
}

fn unwatch_ring(map_id: u32, index: u32) {
    let w = state().watchers.lock().unwrap_or_else(|e| e.into_inner()).as_ref().and_then(|m| m.get(&map_id).cloned());
    if let Some(w) = w {
        let mut rings = w.rings.lock().unwrap_or_else(|e| e.into_inner());
        let before = rings.len();
        rings.retain(|r| r.index != index);
        if rings.len() < before {
            state().watched.fetch_sub(1, Ordering::SeqCst);
        }
        drop(rings);
        w.arm(index, false);
        w.kick();
    }
}

/// Called before the loader's `poll`/`epoll_wait`: the FIFOs of rings the loader has
/// emptied are drained and their watchers re-armed, so a descriptor polls readable exactly
/// while its ring holds data.
pub fn before_wait() {
    if state().watched.load(Ordering::Relaxed) == 0 {
        return;
    }
    let ws: Vec<Arc<Watcher>> = state().watchers.lock().unwrap_or_else(|e| e.into_inner()).as_ref().map(|m| m.values().cloned().collect()).unwrap_or_default();
    for w in ws {
        let rings: Vec<Arc<WRing>> = w.rings.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let mut rearm = false;
        for r in rings {
            if r.signalled.load(Ordering::SeqCst) && !w.has_data(r.index) {
                let mut buf = [0u8; 64];
                // SAFETY: reading into a local buffer from our non-blocking FIFO descriptor.
                while unsafe { sys::raw6(libc::SYS_read, r.fifo as i64, buf.as_mut_ptr() as i64, buf.len() as i64, 0, 0, 0) } > 0 {}
                r.signalled.store(false, Ordering::SeqCst);
                rearm = true;
            }
        }
        if rearm {
            w.kick();
        }
    }
}
