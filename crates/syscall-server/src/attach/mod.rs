//! Where the loader's programs run.
//!
//! - uprobes and tracepoints become session links ([`LinkRecord`]): the agent of every process
//!   the link is for attaches it, the loader's own agent included (links on the loader's
//!   binary or pid, e.g. bpftrace's `BEGIN_trigger`). The loader's agent is synced before the
//!   ioctl or `LINK_CREATE` returns, so a probe on the loader is in place when the loader
//!   goes on to call the probed function. Targets started with `userbpf start` pick links up
//!   through their agent's watcher, whichever of loader and target starts first.
//! - CPU/task clock events run their program from a timer thread in the loader.
//!
//! Detaching follows the kernel: `PERF_EVENT_IOC_DISABLE`, `LINK_DETACH`, the last
//! descriptor of the event (or of the link) closed — seen by a thread watching the session's
//! `perf/` directory with inotify (`IN_CLOSE_*`, then a look at `/proc/self/fd`) — or the
//! loader exiting (an `atexit` handler removes every link it made).
//!
//! The jobs, one module each: this module keeps the attachments (start, stop, the events'
//! SET_BPF programs and `LINK_CREATE` links); [`sync`] makes a change of links take effect in
//! every agent before the call returns; [`watchdog`] removes the links of a loader that died
//! without exiting; [`timer`] runs clock events' programs; [`closes`] sees the last close
//! of an event's or link's descriptor; [`semaphores`] raises USDT semaphores; [`targets`]
//! makes a running process a link names (`pid = PID`, `userbpf load --pid`/bpftrace's `-p`,
//! `--running`) a member of the session, injecting the agent, and detaches it when the last
//! link for it goes.

mod closes;
pub mod semaphores;
mod sync;
pub mod targets;
mod timer;
mod watchdog;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Condvar, Mutex, Once};
use std::time::Instant;

use userbpf_runtime::{LinkRecord, LoadedProgram};

use crate::objects;
use crate::perf_event::{Spec, with_events};

pub use closes::{close_event, closed, closing, watch_closes};
use sync::sync_agent;
pub use timer::refresh_timer;
use timer::start_timer;
use watchdog::{owned, watchdog_once};

/// What this module keeps (in [`crate::server::Server`]).
pub(crate) struct State {
    /// Attachments by key.
    pub(crate) attached: Mutex<Option<HashMap<Key, Attachment>>>,
    /// The loader's pid, recorded with its first link: a child it forks (before exec)
    /// shares our memory but must neither detach the loader's links when it closes
    /// inherited descriptors nor remove them when it exits.
    pub(crate) loader: AtomicU32,
    /// Session links this loader made and has not removed ([`watchdog`]).
    pub(crate) owned: Mutex<Vec<u32>>,
    /// USDT semaphores raised by the loader, by link id ([`semaphores`]).
    pub(crate) raised: Mutex<Option<HashMap<u32, Vec<semaphores::Raised>>>>,
    /// Programs prepared for timers, by id ([`timer`]).
    pub(crate) programs: Mutex<Option<HashMap<u32, Arc<LoadedProgram>>>>,
    /// When links last changed ([`sync`]'s nudges), and its signal.
    pub(crate) last_change: Mutex<Option<Instant>>,
    pub(crate) changed: Condvar,
    /// Held while a close is looked at: one at a time ([`closes`]).
    pub(crate) closing: Mutex<()>,
    /// Running processes the loader's links hold a place in, by link id ([`targets`]).
    pub(crate) targets: Mutex<Option<HashMap<u32, Vec<targets::Proc>>>>,
}

fn state() -> &'static State {
    &crate::server::server().attach
}

/// What runs for an attachment.
pub(crate) enum Running {
    /// A session link (its id).
    Link(u32),
    /// A timer thread (stop flag, thread handle for unparking).
    Timer(Arc<AtomicBool>, std::thread::Thread),
}

/// An attachment: the event's SET_BPF program while enabled, or a `LINK_CREATE` link.
pub(crate) struct Attachment {
    event: u32,
    prog: u32,
    running: Running,
}

/// Attachments by key: `Set(event id)` or `Link(link id)`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub(crate) enum Key {
    Set(u32),
    Link(u32),
}

fn attached<T>(f: impl FnOnce(&mut HashMap<Key, Attachment>) -> T) -> T {
    let mut g = state().attached.lock().unwrap_or_else(|e| e.into_inner());
    f(g.get_or_insert_with(HashMap::new))
}

fn io_errno(e: std::io::Error) -> i32 {
    e.raw_os_error().unwrap_or(libc::EIO)
}

/// The file a `LINK_CREATE(BPF_PERF_EVENT)` link's descriptor opens (created by
/// [`create_bpf_link`]); closing its last descriptor detaches the link.
pub fn link_file(link_id: u32) -> PathBuf {
    match objects::session() {
        Ok(s) => s.layout().perf_link(link_id),
        Err(_) => PathBuf::from(format!("/nonexistent/link-{link_id}")),
    }
}

/// Whether this process is the loader that made the links (see [`State::loader`]).
fn in_loader() -> bool {
    let l = state().loader.load(Ordering::Relaxed);
    l == 0 || l == std::process::id()
}

fn at_exit_once() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        state().loader.store(std::process::id(), Ordering::Relaxed);
        extern "C" fn on_exit() {
            let _ = std::panic::catch_unwind(detach_all);
        }
        // SAFETY: registering a function with no preconditions to run at exit.
        unsafe { libc::atexit(on_exit) };
    });
}

/// Removes every attachment of this loader (at exit).
pub fn detach_all() {
    if !in_loader() {
        return;
    }
    let all: Vec<Attachment> = attached(|m| m.drain().map(|(_, a)| a).collect());
    let mut any_link = false;
    for a in all {
        any_link |= matches!(a.running, Running::Link(_));
        stop(a);
    }
    if any_link {
        sync_agent();
    }
}

fn stop(a: Attachment) {
    match a.running {
        Running::Link(id) => {
            if let Ok(s) = objects::session() {
                let _ = s.remove_link(id);
                semaphores::lower(s.layout(), id);
            }
            owned(|v| v.retain(|l| *l != id));
            // Processes injected for the link and used by no other go back as they were.
            targets::release(id);
        }
        Running::Timer(flag, thread) => {
            flag.store(true, Ordering::SeqCst);
            thread.unpark();
        }
    }
}

/// Starts what event `event` with program `prog` and `cookie` runs.
fn start(event: u32, prog: u32, cookie: u64) -> Result<Running, i32> {
    let spec = crate::perf_event::event_spec(event).ok_or(libc::EBADF)?;
    let record = |kind: &str, path: String, func: Option<String>, offset: u64, pid: Option<u32>| LinkRecord {
        id: 0,
        prog_id: prog,
        kind: kind.to_string(),
        path,
        func,
        offset,
        cookie,
        pid,
    };
    let mut sema = None;
    let (rec, procs) = match spec {
        Spec::Uprobe { path, func, offset, retprobe, pid, ref_ctr_offset, .. } => {
            if ref_ctr_offset != 0 {
                sema = Some((path.clone(), ref_ctr_offset, pid));
            }
            let procs = targets::wanted(pid, Some(&path));
            (record(if retprobe { "uretprobe" } else { "uprobe" }, path, func, offset, pid), procs)
        }
        Spec::Tracepoint { func, pid } => {
            (record("tracepoint", String::new(), Some(func), 0, pid), targets::wanted(pid, None))
        }
        Spec::Clock { .. } => return start_timer(event, prog, cookie),
        Spec::Output { .. } => return Err(libc::EINVAL),
    };
    let s = objects::session()?;
    // A process the link names (`pid`, `userbpf load --pid`; with `--running`, the running
    // processes mapping the file) becomes a member first, the agent injected if needed.
    let prepared = targets::prepare(s, &procs.0, &procs.1).map_err(|e| e.errno)?;
    let rec = match s.add_link(rec) {
        Ok(r) => r,
        Err(e) => {
            targets::abort(prepared);
            return Err(io_errno(e));
        }
    };
    targets::commit(prepared, rec.id);
    if let Some((path, off, pid)) = sema {
        semaphores::raise(s.layout(), rec.id, &path, off, pid);
    }
    at_exit_once();
    owned(|v| v.push(rec.id));
    watchdog_once();
    Ok(Running::Link(rec.id))
}

/// Re-evaluates event `id` after SET_BPF, ENABLE or DISABLE: its SET_BPF program runs while
/// the event is enabled.
pub fn update_event(id: u32) -> Result<(), i32> {
    let (want, prog) = with_events(|ev| {
        ev.iter()
            .find(|e| e.id == id)
            .map(|e| (e.enabled && e.prog.is_some(), e.prog.unwrap_or(0)))
            .unwrap_or((false, 0))
    });
    let have = attached(|m| m.contains_key(&Key::Set(id)));
    if want && !have {
        let running = start(id, prog, 0)?;
        let is_link = matches!(running, Running::Link(_));
        attached(|m| m.insert(Key::Set(id), Attachment { event: id, prog, running }));
        if is_link {
            sync_agent();
        }
    } else if !want
        && have
        && let Some(a) = attached(|m| m.remove(&Key::Set(id)))
    {
        let is_link = matches!(a.running, Running::Link(_));
        stop(a);
        if is_link {
            sync_agent();
        }
    }
    Ok(())
}

/// `LINK_CREATE(BPF_PERF_EVENT)`: the program runs from now on (whatever the event's enable
/// state, as a libbpf loader expects); returns the link id, whose descriptor opens
/// [`link_file`].
pub fn create_bpf_link(event: u32, prog: u32, cookie: u64) -> Result<u32, i32> {
    let running = start(event, prog, cookie)?;
    let id = match &running {
        Running::Link(id) => *id,
        Running::Timer(..) => objects::session()?.alloc_id().map_err(io_errno)?,
    };
    let path = link_file(id);
    // Ids are never reused in a live session: a file of this name is a dead session's.
    let _ = std::fs::remove_file(&path);
    // mknod, not open: an open and close here would look like the link's last close to the
    // close watcher.
    let made = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).map_err(|_| libc::EINVAL).and_then(|c| {
        // SAFETY: a NUL-terminated path; mknod creates an empty regular file.
        let r = unsafe { libc::mknod(c.as_ptr(), libc::S_IFREG | 0o600, 0) };
        if r == 0 { Ok(()) } else { Err(io_errno(std::io::Error::last_os_error())) }
    });
    if let Err(e) = made {
        stop(Attachment { event, prog, running });
        return Err(e);
    }
    let is_link = matches!(running, Running::Link(_));
    attached(|m| m.insert(Key::Link(id), Attachment { event, prog, running }));
    with_events(|ev| {
        if let Some(e) = ev.iter_mut().find(|e| e.id == event) {
            e.bpf_links.push(id);
        }
    });
    if is_link {
        sync_agent();
    }
    watch_closes();
    Ok(id)
}

/// Stops link `link_id` (`LINK_DETACH`, or its last descriptor closed): `ENOENT` if unknown.
pub fn remove_bpf_link(link_id: u32) -> Result<(), i32> {
    let a = attached(|m| m.remove(&Key::Link(link_id))).ok_or(libc::ENOENT)?;
    with_events(|ev| {
        if let Some(e) = ev.iter_mut().find(|e| e.id == a.event) {
            e.bpf_links.retain(|l| *l != link_id);
        }
    });
    let is_link = matches!(a.running, Running::Link(_));
    stop(a);
    if is_link {
        sync_agent();
    }
    Ok(())
}

/// The prog id a `LINK_CREATE` link runs, if it is one of ours.
pub fn bpf_link_prog(link_id: u32) -> Option<u32> {
    attached(|m| m.get(&Key::Link(link_id)).map(|a| a.prog))
}
