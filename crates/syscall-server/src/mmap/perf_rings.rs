//! The loader's view of its perf events (the FIFOs their descriptors open, their mappings,
//! where they are stored) and perf event arrays storing them: `MAP_UPDATE_ELEM` lays the map
//! file's ring over the loader's mapping of the event (see the module above).

use std::collections::HashMap;
use std::path::Path;

use userbpf_maps::Map;

use super::wakeups::{unwatch_ring, watch_ring};
use super::{map, open_fifo, perf_array, remove_internal_fd, state};
use crate::objects::{self, Kind};
use crate::perf_event::Spec;
use crate::sys;

/// A mapping the loader made of an event descriptor.
#[derive(Clone, Copy, Debug)]
pub(super) struct Mapping {
    pub(super) addr: usize,
    pub(super) len: usize,
    pub(super) prot: i32,
}

pub(crate) struct EventState {
    /// Our descriptor of the event's FIFO.
    pub(super) fifo: i32,
    /// Where the event is stored: (map id, index).
    pub(super) bound: Option<(u32, u32)>,
    pub(super) mappings: Vec<Mapping>,
    /// Data pages of its ring (from the first mmap), 0 until then.
    pub(super) pages: u32,
}

pub(super) fn events<T>(f: impl FnOnce(&mut HashMap<u32, EventState>) -> T) -> T {
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
    if let Some((om, oi)) = old
        && (om, oi) != (map_id, key)
    {
        unwatch_ring(om, oi);
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
            range == format!("{:x}-{:x}", mp.addr, mp.addr + mp.len)
                && (path.starts_with("/dev/zero") || (!maps_dir.is_empty() && path.starts_with(&maps_dir)))
        });
        if !ours {
            continue;
        }
        // SAFETY: replaces the loader's own mapping of the event (same address and length)
        // with the map's ring of the same size.
        let r = unsafe {
            sys::raw6(
                libc::SYS_mmap,
                mp.addr as i64,
                mp.len as i64,
                mp.prot as i64,
                (libc::MAP_SHARED | libc::MAP_FIXED) as i64,
                fd as i64,
                off as i64,
            )
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
