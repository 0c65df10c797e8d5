//! The bpf commands' calls into the perf event and mmap modules, in one place: perf event
//! arrays hold perf event descriptors, ring buffer maps get a pollable descriptor,
//! LINK_CREATE(BPF_PERF_EVENT) makes a perf link.

use std::path::PathBuf;

use userbpf_maps::Map;

/// A map was created (perf event arrays start with no event in any slot).
pub fn map_created(id: u32, map: &Map) {
    crate::mmap::map_created(id, map)
}

/// The file a ring buffer map's descriptor opens (pollable).
pub fn ringbuf_fd_path(id: u32) -> Result<PathBuf, i32> {
    crate::mmap::ringbuf_fd_path(id)
}

/// MAP_UPDATE_ELEM on a perf event array: slot `key` gets the event of `fd`.
pub fn perf_array_update(map_id: u32, key: u32, fd: i32) -> Result<(), i32> {
    crate::mmap::perf_array_update(map_id, key, fd)
}

/// MAP_DELETE_ELEM on a perf event array.
pub fn perf_array_delete(map_id: u32, key: u32) -> Result<(), i32> {
    crate::mmap::perf_array_delete(map_id, key)
}

/// LINK_CREATE(BPF_PERF_EVENT): the link id and the file its descriptor opens.
pub fn perf_attach(event_fd: i32, prog_id: u32, cookie: u64) -> Result<(u32, PathBuf), i32> {
    let id = crate::perf_event::attach(event_fd, prog_id, cookie)?;
    Ok((id, crate::attach::link_file(id)))
}
