//! Wakeups: event and ring buffer descriptors are FIFOs; a thread per map watches its rings
//! and writes a byte into the FIFO of each ring that got data (lingering in short timed
//! sleeps while data came recently, on the map's futex word with the rings armed once idle:
//! `userbpf_maps::linger`), and before each
//! `poll`/`epoll_wait` of the loader ([`before_wait`]) the FIFOs of emptied rings are drained
//! (see the module above).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use userbpf_maps::Map;
use userbpf_maps::linger::Linger;

use super::perf_rings::events;
use super::{map, open_fifo, state};
use crate::objects;
use crate::sys;

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

/// A watched ring: its FIFO (our descriptor) and whether a byte sits in it.
pub(super) struct WRing {
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

    /// The share of ring `index` unread records take.
    fn fill(&self, index: u32) -> f64 {
        match &*self.map {
            Map::PerfEventArray(pa) => pa.ring_fill(index),
            Map::RingBuf(rb) => rb.fill(),
            _ => 0.0,
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

    /// The watcher thread: signals the FIFO of each ring that got data. While data came
    /// recently it looks again after short timed sleeps with the rings' `waiting` words
    /// clear, so producers make no system call; after [`userbpf_maps::linger::LINGER_IDLE`]
    /// without data it arms the rings it watches and sleeps on the map's futex word until a
    /// producer (or a re-arm, [`Watcher::kick`]) wakes it (see `userbpf_maps::linger`).
    fn run(self: Arc<Self>) {
        let Some(word) = self.word() else { return };
        let mut linger = Linger::new();
        // Rings whose `waiting` word we set (producers wake us for them).
        let mut armed: Vec<u32> = Vec::new();
        loop {
            // Read before looking at the rings: a wakeup after this makes the wait return.
            let seq = word.load(Ordering::SeqCst);
            let rings: Vec<Arc<WRing>> = self.rings.lock().unwrap_or_else(|e| e.into_inner()).clone();
            for i in armed.drain(..) {
                self.arm(i, false);
            }
            let mut watching = false;
            let mut fill = -1.0f64;
            for r in &rings {
                if r.signalled.load(Ordering::SeqCst) {
                    continue;
                }
                if self.ready(r.index) {
                    self.signal(r);
                    fill = fill.max(self.fill(r.index));
                } else {
                    watching = true;
                }
            }
            if fill >= 0.0 {
                linger.saw_data(fill);
            }
            if !watching {
                futex_wait(word, seq, None); // every ring signalled: a re-arm kicks us
                continue;
            }
            if let Some(nap) = linger.next_sleep() {
                futex_wait(word, seq, Some(nap));
                continue;
            }
            // Idle: arm, then check once more (the wakeup handshake: a producer that stored
            // its data before our store of `waiting` is seen here, one after it sees
            // `waiting` and bumps the word).
            for r in &rings {
                if !r.signalled.load(Ordering::SeqCst) {
                    self.arm(r.index, true);
                    armed.push(r.index);
                }
            }
            // Perf rings' writers publish without a fence of their own (the ring buffer's
            // commit is a full barrier): see `userbpf_maps::linger`.
            let fenced = !matches!(&*self.map, Map::PerfEventArray(_)) || userbpf_maps::linger::waiter_fence();
            let mut found = false;
            for r in &rings {
                if armed.contains(&r.index) && self.ready(r.index) {
                    self.signal(r);
                    found = true;
                }
            }
            if found {
                linger.saw_data(0.0);
            } else {
                futex_wait(word, seq, userbpf_maps::linger::deep_timeout(None, fenced));
            }
        }
    }

    /// Makes ring `r`'s descriptor readable: one byte into its FIFO.
    fn signal(&self, r: &WRing) {
        r.signalled.store(true, Ordering::SeqCst);
        let b = 1u8;
        // SAFETY: writing one byte from a local to our FIFO descriptor.
        unsafe { sys::raw6(libc::SYS_write, r.fifo as i64, &b as *const u8 as i64, 1, 0, 0, 0) };
    }
}

/// Sleeps while `*word == expected`, at most `timeout` (None: until woken).
pub(super) fn futex_wait(word: &std::sync::atomic::AtomicU32, expected: u32, timeout: Option<Duration>) {
    let ts = timeout.map(|d| libc::timespec {
        tv_sec: d.as_secs().min(i64::MAX as u64) as libc::time_t,
        tv_nsec: d.subsec_nanos() as libc::c_long,
    });
    let tsp = ts.as_ref().map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: FUTEX_WAIT on an aligned u32 of a shared mapping that outlives the call (the
    // watcher holds the map), with a timespec that lives across the call or none.
    unsafe {
        sys::raw6(libc::SYS_futex, word.as_ptr() as i64, libc::FUTEX_WAIT as i64, expected as i64, tsp as i64, 0, 0);
    }
}

pub(super) fn watcher(map_id: u32, m: &Arc<Map>) -> Arc<Watcher> {
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

pub(super) fn watch_ring(map_id: u32, m: &Arc<Map>, index: u32, event: u32) {
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

pub(super) fn unwatch_ring(map_id: u32, index: u32) {
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
    let ws: Vec<Arc<Watcher>> = state()
        .watchers
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .as_ref()
        .map(|m| m.values().cloned().collect())
        .unwrap_or_default();
    for w in ws {
        let rings: Vec<Arc<WRing>> = w.rings.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let mut rearm = false;
        for r in rings {
            if r.signalled.load(Ordering::SeqCst) && !w.has_data(r.index) {
                let mut buf = [0u8; 64];
                // SAFETY: reading into a local buffer from our non-blocking FIFO descriptor.
                while unsafe {
                    sys::raw6(libc::SYS_read, r.fifo as i64, buf.as_mut_ptr() as i64, buf.len() as i64, 0, 0, 0)
                } > 0
                {}
                r.signalled.store(false, Ordering::SeqCst);
                rearm = true;
            }
        }
        if rearm {
            w.kick();
        }
    }
}
