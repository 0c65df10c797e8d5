//! The last close of an event's or link's descriptor detaches it, as in the kernel: seen by
//! the loader's `close` itself ([`closing`], [`closed`]) or by a thread watching the
//! session's `perf/` directory with inotify (`IN_CLOSE_*`, then a look at `/proc/self/fd`).

use std::os::unix::fs::MetadataExt;
use std::sync::Once;

use userbpf_runtime::session::layout::{Layout, PerfFile};

use super::{in_loader, remove_bpf_link, update_event};
use crate::objects::{self, Kind};
use crate::perf_event::with_events;

/// Whether a descriptor of this process other than our own refers to the file `(dev, ino)`.
fn open_elsewhere(dev: u64, ino: u64) -> bool {
    let own = crate::mmap::internal_fds();
    let Ok(rd) = std::fs::read_dir("/proc/self/fd") else { return true };
    for e in rd.flatten() {
        let Some(fd) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else { continue };
        if own.contains(&fd) {
            continue;
        }
        // SAFETY: an all-zero stat is valid plain data; fstat writes one struct stat.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: as above; `st` lives across the call.
        let r = unsafe { crate::sys::raw6(libc::SYS_fstat, fd as i64, &mut st as *mut libc::stat as i64, 0, 0, 0, 0) };
        if r == 0 && st.st_dev == dev && st.st_ino == ino {
            return true;
        }
    }
    false
}

/// The event or link file `file` in `perf/` was closed somewhere: detach if no descriptor of
/// it is left.
fn on_close(layout: &Layout, file: PerfFile) {
    // One close at a time: a close() returning must not overtake the watcher thread's detach
    // of the same object (it would find the link already gone and return before the probe
    // is out).
    let _one = crate::server::server().attach.closing.lock().unwrap_or_else(|e| e.into_inner());
    let path = layout.perf_file(file);
    let Ok(md) = std::fs::metadata(&path) else { return };
    if open_elsewhere(md.dev(), md.ino()) {
        return;
    }
    let id = match file {
        PerfFile::Link(link) => {
            if remove_bpf_link(link).is_ok() {
                objects::forget(Kind::Link, link);
                let _ = std::fs::remove_file(&path);
            }
            return;
        }
        PerfFile::Event(id) => id,
    };
    if !with_events(|ev| ev.iter().any(|e| e.id == id)) {
        return;
    }
    close_event(id);
    let _ = std::fs::remove_file(&path);
}

/// The last descriptor of event `id` is gone: its SET_BPF program stops (links made on it
/// keep it, as in the kernel, until they go).
pub fn close_event(id: u32) {
    with_events(|ev| {
        if let Some(e) = ev.iter_mut().find(|e| e.id == id) {
            e.prog = None;
            e.enabled = false;
        }
    });
    let _ = update_event(id);
    crate::mmap::event_closed(id);
    objects::forget(Kind::PerfEvent, id);
    with_events(|ev| ev.retain(|e| e.id != id || !e.bpf_links.is_empty()));
}

/// Before the loader's `close(fd)`: whether `fd` is a perf event or link of ours (then
/// [`closed`] is called after the close, so the last close detaches before `close` returns,
/// as in the kernel; the inotify watcher covers closes made otherwise).
pub fn closing(fd: i32) -> Option<(Kind, u32)> {
    match objects::kind_of(fd)? {
        (k @ (Kind::PerfEvent | Kind::Link), id) if in_loader() => Some((k, id)),
        _ => None,
    }
}

/// After the close of a descriptor [`closing`] recognised.
pub fn closed(kind: Kind, id: u32) {
    let Ok(s) = objects::session() else { return };
    on_close(s.layout(), if kind == Kind::Link { PerfFile::Link(id) } else { PerfFile::Event(id) });
}

/// Starts (once) the thread that sees descriptors of events and links closed.
pub fn watch_closes() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let Ok(s) = objects::session() else { return };
        let layout = s.layout().clone();
        let dir = layout.perf_dir();
        let _ = std::fs::create_dir_all(&dir);
        let Ok(c) = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()) else { return };
        // SAFETY: inotify_init1 has no preconditions; the descriptor stays with the thread.
        let fd = unsafe { libc::inotify_init1(libc::IN_CLOEXEC) };
        if fd < 0 {
            return;
        }
        crate::mmap::add_internal_fd(fd);
        // SAFETY: `c` is a NUL-terminated path; `fd` is our inotify descriptor.
        if unsafe { libc::inotify_add_watch(fd, c.as_ptr(), libc::IN_CLOSE_WRITE | libc::IN_CLOSE_NOWRITE) } < 0 {
            return;
        }
        let _ = userbpf_hook::quiet::spawn("userbpf-closes", move || {
            let mut buf = [0u8; 4096];
            loop {
                // SAFETY: reading into our buffer, of its length.
                let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
                if n <= 0 {
                    if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                        continue;
                    }
                    return;
                }
                let mut off = 0usize;
                let mut names = Vec::new();
                while off + std::mem::size_of::<libc::inotify_event>() <= n as usize {
                    // SAFETY: the kernel wrote whole inotify_event records into buf[..n].
                    let ev = unsafe { buf.as_ptr().add(off).cast::<libc::inotify_event>().read_unaligned() };
                    let name_off = off + std::mem::size_of::<libc::inotify_event>();
                    let name_end = (name_off + ev.len as usize).min(n as usize);
                    let raw = &buf[name_off..name_end];
                    let name = String::from_utf8_lossy(raw.split(|b| *b == 0).next().unwrap_or(&[])).into_owned();
                    if let Some(file) = Layout::parse_perf(&name).filter(|f| !names.contains(f)) {
                        names.push(file);
                    }
                    off = name_end;
                }
                for file in names {
                    let _ = std::panic::catch_unwind(|| on_close(&layout, file));
                }
            }
        });
    });
}
