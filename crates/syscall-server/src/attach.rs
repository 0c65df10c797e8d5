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

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Once, OnceLock};
use std::time::{Duration, Instant};

use userbpf_runtime::context::{CpuSlots, RunContext};
use userbpf_runtime::session::layout::{self, Layout, PerfFile};
use userbpf_runtime::session::handshake;
use userbpf_runtime::{Engine, LinkRecord, LoadedProgram};

use crate::objects::{self, Kind};
use crate::perf_event::{with_events, Spec};

/// What runs for an attachment.
enum Running {
    /// A session link (its id).
    Link(u32),
    /// A timer thread (stop flag, thread handle for unparking).
    Timer(Arc<AtomicBool>, std::thread::Thread),
}

/// An attachment: the event's SET_BPF program while enabled, or a `LINK_CREATE` link.
struct Attachment {
    event: u32,
    prog: u32,
    running: Running,
}

/// Attachments by key: `Set(event id)` or `Link(link id)`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
enum Key {
    Set(u32),
    Link(u32),
}

static ATTACHED: Mutex<Option<HashMap<Key, Attachment>>> = Mutex::new(None);

fn attached<T>(f: impl FnOnce(&mut HashMap<Key, Attachment>) -> T) -> T {
    let mut g = ATTACHED.lock().unwrap_or_else(|e| e.into_inner());
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

/// Syncs the loader's own agent (attaches links for this process, detaches removed ones).
/// After a change of the session's links: the loader's own agent syncs now, and the agents
/// of the session's running targets are waited for (bounded), so that, as with the kernel,
/// a probe is live in every process when the ioctl, LINK_CREATE or close returns.
fn sync_agent() {
    match userbpf_agent::Agent::start() {
        Ok(a) => a.lock().unwrap_or_else(|e| e.into_inner()).sync(),
        Err(e) => eprintln!("userbpf: the loader's agent did not start ({e}): probes on the loader itself will not run"),
    }
    if let Ok(s) = objects::session() {
        if let Some(gen) = handshake::publish(s) {
            handshake::wait(s.layout(), gen, std::process::id(), Duration::from_secs(1));
        }
    }
    nudge_later();
}

/// A target whose agent was starting while links changed may have listed `links/` before
/// the change and set up its inotify watch after it: such an agent would never see the
/// change. So the loader rewrites `links/nudge` (an event in `links/`, ignored as a link)
/// 0.2 s and 1 s after the last change, and every agent looks at the links again.
fn nudge_later() {
    static LAST: Mutex<Option<Instant>> = Mutex::new(None);
    static THREAD: Once = Once::new();
    static WAKE: std::sync::Condvar = std::sync::Condvar::new();
    *LAST.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
    WAKE.notify_one();
    THREAD.call_once(|| {
        let _ = userbpf_hook::quiet::spawn("userbpf-nudge", || {
            let mut done_for: Option<Instant> = None;
            let mut step = 0;
            loop {
                let g = LAST.lock().unwrap_or_else(|e| e.into_inner());
                let last = *g;
                if last != done_for {
                    step = 0;
                    done_for = last;
                }
                let Some(t) = last else {
                    drop(WAKE.wait(g));
                    continue;
                };
                let at = t + if step == 0 { Duration::from_millis(200) } else { Duration::from_secs(1) };
                let now = Instant::now();
                if step >= 2 {
                    drop(WAKE.wait(g));
                    continue;
                }
                if now < at {
                    drop(WAKE.wait_timeout(g, at - now));
                    continue;
                }
                drop(g);
                if let Ok(s) = objects::session() {
                    handshake::nudge(s.layout());
                }
                step += 1;
            }
        });
    });
}

/// The loader's pid, recorded with its first link: a child it forks (before exec) shares
/// our memory but must neither detach the loader's links when it closes inherited
/// descriptors nor remove them when it exits.
static LOADER: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

fn in_loader() -> bool {
    let l = LOADER.load(Ordering::Relaxed);
    l == 0 || l == std::process::id()
}

fn at_exit_once() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        LOADER.store(std::process::id(), Ordering::Relaxed);
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
    let rec = match spec {
        Spec::Uprobe { path, func, offset, retprobe, pid, ref_ctr_offset, .. } => {
            if ref_ctr_offset != 0 {
                sema = Some((path.clone(), ref_ctr_offset, pid));
            }
            record(if retprobe { "uretprobe" } else { "uprobe" }, path, func, offset, pid)
        }
        Spec::Tracepoint { func, pid } => record("tracepoint", String::new(), Some(func), 0, pid),
        Spec::Clock { .. } => return start_timer(event, prog, cookie),
        Spec::Output { .. } => return Err(libc::EINVAL),
    };
    let s = objects::session()?;
    let rec = s.add_link(rec).map_err(io_errno)?;
    if let Some((path, off, pid)) = sema {
        semaphores::raise(s.layout(), rec.id, &path, off, pid);
    }
    at_exit_once();
    owned(|v| v.push(rec.id));
    watchdog_once();
    Ok(Running::Link(rec.id))
}

// ---- links of a loader that dies without exiting (SIGKILL, a crash) ----

/// Session links this loader made and has not removed.
static OWNED: Mutex<Vec<u32>> = Mutex::new(Vec::new());

/// Changes the owned list and rewrites the owner file (`perf/owner-PID`: the paths of the
/// owned links' records, one a line) that the watchdog reads when the loader is gone.
fn owned(f: impl FnOnce(&mut Vec<u32>)) {
    let mut v = OWNED.lock().unwrap_or_else(|e| e.into_inner());
    f(&mut v);
    let Ok(s) = objects::session() else { return };
    let mut text = String::new();
    for id in v.iter() {
        text.push_str(&s.layout().link(*id).to_string_lossy());
        text.push('\n');
    }
    let _ = layout::write_atomic(&s.layout().perf_owner(std::process::id()), text.as_bytes());
}

/// Starts (once) a watchdog process that removes this loader's links when the loader is
/// gone however it ended, so targets detach: a forked child in its own session (terminal
/// signals do not reach it), with no descriptor of the loader's (closes are seen as the
/// kernel sees them), waiting on a pidfd of the loader. After the fork it makes raw system
/// calls only, on memory prepared before.
fn watchdog_once() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let Ok(s) = objects::session() else { return };
        let Ok(owner) = std::ffi::CString::new(s.layout().perf_owner(std::process::id()).into_os_string().into_encoded_bytes()) else { return };
        let loader = std::process::id() as i64;
        // SAFETY: fork; the child runs `watchdog` only, which makes raw system calls on its
        // stack and on `owner` (copied into the child), and never returns.
        let pid = unsafe { crate::sys::raw6(libc::SYS_fork, 0, 0, 0, 0, 0, 0) };
        if pid == 0 {
            // SAFETY: in the child, as above.
            unsafe { watchdog(loader, owner.as_ptr()) }
        }
    });
}

/// The watchdog's body (see [`watchdog_once`]).
///
/// # Safety
/// Only in the forked child; `owner` is a NUL-terminated path.
unsafe fn watchdog(loader: i64, owner: *const libc::c_char) -> ! {
    use crate::sys::raw6;
    // SAFETY (whole body): raw system calls with pointers to this frame's buffers and to the
    // NUL-terminated `owner`.
    unsafe {
        raw6(436 /* close_range */, 0, u32::MAX as i64, 0, 0, 0, 0);
        raw6(libc::SYS_setsid, 0, 0, 0, 0, 0, 0);
        let name = *b"userbpf-watch\0";
        raw6(libc::SYS_prctl, libc::PR_SET_NAME as i64, name.as_ptr() as i64, 0, 0, 0, 0);
        let pidfd = raw6(434 /* pidfd_open */, loader, 0, 0, 0, 0, 0);
        if pidfd >= 0 {
            let mut p = libc::pollfd { fd: pidfd as i32, events: libc::POLLIN, revents: 0 };
            loop {
                let r = raw6(libc::SYS_poll, &mut p as *mut libc::pollfd as i64, 1, -1, 0, 0, 0);
                if r != -(libc::EINTR as i64) {
                    break;
                }
            }
        }
        let fd = raw6(libc::SYS_openat, libc::AT_FDCWD as i64, owner as i64, libc::O_RDONLY as i64, 0, 0, 0);
        if fd >= 0 {
            let mut buf = [0u8; 65536];
            let mut n = 0usize;
            while n < buf.len() - 1 {
                let r = raw6(libc::SYS_read, fd, buf.as_mut_ptr().add(n) as i64, (buf.len() - 1 - n) as i64, 0, 0, 0);
                if r <= 0 {
                    break;
                }
                n += r as usize;
            }
            let mut start = 0usize;
            for i in 0..n {
                if buf[i] == b'\n' {
                    buf[i] = 0;
                    if i > start {
                        raw6(libc::SYS_unlink, buf.as_ptr().add(start) as i64, 0, 0, 0, 0, 0);
                    }
                    start = i + 1;
                }
            }
        }
        raw6(libc::SYS_unlink, owner as i64, 0, 0, 0, 0, 0);
        raw6(libc::SYS_exit_group, 0, 0, 0, 0, 0, 0);
    }
    #[allow(clippy::empty_loop)]
    loop {}
}

/// Re-evaluates event `id` after SET_BPF, ENABLE or DISABLE: its SET_BPF program runs while
/// the event is enabled.
pub fn update_event(id: u32) -> Result<(), i32> {
    let (want, prog) = with_events(|ev| {
        ev.iter().find(|e| e.id == id).map(|e| (e.enabled && e.prog.is_some(), e.prog.unwrap_or(0))).unwrap_or((false, 0))
    });
    let have = attached(|m| m.contains_key(&Key::Set(id)));
    if want && !have {
        let running = start(id, prog, 0)?;
        let is_link = matches!(running, Running::Link(_));
        attached(|m| m.insert(Key::Set(id), Attachment { event: id, prog, running }));
        if is_link {
            sync_agent();
        }
    } else if !want && have {
        if let Some(a) = attached(|m| m.remove(&Key::Set(id))) {
            let is_link = matches!(a.running, Running::Link(_));
            stop(a);
            if is_link {
                sync_agent();
            }
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
    let made = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|_| libc::EINVAL)
        // SAFETY: a NUL-terminated path; mknod creates an empty regular file.
        .and_then(|c| if unsafe { libc::mknod(c.as_ptr(), libc::S_IFREG | 0o600, 0) } == 0 { Ok(()) } else { Err(io_errno(std::io::Error::last_os_error())) });
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

// ---- timers: CPU/task clock events ----

fn prepared(prog_id: u32) -> Result<Arc<LoadedProgram>, i32> {
    static CACHE: Mutex<Option<HashMap<u32, Arc<LoadedProgram>>>> = Mutex::new(None);
    static SLOTS: OnceLock<Result<Arc<CpuSlots>, i32>> = OnceLock::new();
    let mut g = CACHE.lock().unwrap_or_else(|e| e.into_inner());
    let cache = g.get_or_insert_with(HashMap::new);
    if let Some(p) = cache.get(&prog_id) {
        return Ok(p.clone());
    }
    let s = objects::session()?;
    let slots = SLOTS
        .get_or_init(|| CpuSlots::open(&s.layout().cpus()).map(Arc::new).map_err(io_errno))
        .clone()?;
    let rec = s.progs().map_err(io_errno)?.into_iter().find(|p| p.id == prog_id).ok_or(libc::EBADF)?;
    let engine = if std::env::var("USERBPF_INTERPRETER").is_ok_and(|v| v == "1") { Engine::Interpreter } else { Engine::Jit };
    let prog = userbpf_runtime::loader::prepare_record(s, &rec, userbpf_runtime::helpers::registry(), engine, slots)
        .map_err(|e| {
            eprintln!("userbpf: program {prog_id}: {e}");
            libc::EINVAL
        })?;
    let prog = Arc::new(prog);
    userbpf_runtime::programs::register(prog.clone());
    cache.insert(prog_id, prog.clone());
    Ok(prog)
}

/// `struct bpf_perf_event_data`: `pt_regs` (21 words), `sample_period`, `addr`.
#[repr(C)]
struct PerfEventData {
    regs: [u64; 21],
    sample_period: u64,
    addr: u64,
}

fn period_of(event: u32) -> Option<Duration> {
    match crate::perf_event::event_spec(event)? {
        Spec::Clock { period, freq: false, .. } => Some(Duration::from_nanos(period.max(1000))),
        Spec::Clock { period, freq: true, .. } => Some(Duration::from_nanos((1_000_000_000 / period.max(1)).max(1000))),
        _ => None,
    }
}

fn start_timer(event: u32, prog_id: u32, cookie: u64) -> Result<Running, i32> {
    let prog = prepared(prog_id)?;
    let period = period_of(event).ok_or(libc::EINVAL)?;
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    let cpu = match crate::perf_event::event_spec(event) {
        Some(Spec::Clock { cpu, .. }) => cpu,
        _ => -1,
    };
    let t = userbpf_hook::quiet::spawn(format!("userbpf-timer-{event}"), move || {
        if cpu >= 0 && (cpu as usize) < libc::CPU_SETSIZE as usize {
            // A per-CPU clock samples its CPU: the program runs there (its CPU slot, what
            // bpf_get_smp_processor_id returns, is that CPU's when free).
            // SAFETY: a zeroed cpu_set_t is empty; CPU_SET and sched_setaffinity work on it.
            unsafe {
                let mut set: libc::cpu_set_t = std::mem::zeroed();
                libc::CPU_SET(cpu as usize, &mut set);
                libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
            }
        }
        let mut period = period;
        let mut next = Instant::now() + period;
        loop {
            let now = Instant::now();
            if now < next {
                std::thread::park_timeout(next - now);
            }
            if flag.load(Ordering::SeqCst) {
                return;
            }
            if Instant::now() < next {
                // Unparked early: the period may have changed.
                if let Some(p) = period_of(event) {
                    if p != period {
                        next = next - period + p;
                        period = p;
                    }
                }
                continue;
            }
            let mut data = PerfEventData { regs: [0; 21], sample_period: period.as_nanos() as u64, addr: 0 };
            let info = RunContext { regs: data.regs.as_ptr() as u64, cookie, ..Default::default() };
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                prog.run((&mut data as *mut PerfEventData).cast(), std::mem::size_of::<PerfEventData>(), info)
            }));
            next += period;
            let now = Instant::now();
            if next < now {
                // Fell behind (a slow program, a stopped process): no burst of catch-up runs.
                next = now + period;
            }
        }
    })
    .map_err(|_| libc::EAGAIN)?;
    Ok(Running::Timer(stop, t.thread().clone()))
}

/// Tells event `id`'s timer its period changed.
pub fn refresh_timer(id: u32) {
    attached(|m| {
        for a in m.values() {
            if a.event == id {
                if let Running::Timer(_, t) = &a.running {
                    t.unpark();
                }
            }
        }
    });
}

// ---- last close of an event or link descriptor ----

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
    static CLOSING: Mutex<()> = Mutex::new(());
    let _one = CLOSING.lock().unwrap_or_else(|e| e.into_inner());
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

/// USDT semaphores of uprobe events opened with a `ref_ctr_offset` (the kernel raises the
/// counter at that file offset in every process the probe is for while it is attached).
///
/// The loader raises it in the processes mapping the file when the link is made (through
/// `/proc/PID/mem`) and lowers it there when the link goes; the link's semaphore is also
/// recorded in the session (`perf/sema-LINK`: path, offset, pid), so a process of the session
/// starting later with this library (a child of the loader, e.g. bpftrace's `-c`) raises it in
/// itself at start ([`semaphores::raise_own`]).
pub mod semaphores {
    use std::collections::HashMap;
    use std::io::{Read, Seek, SeekFrom, Write};
    use std::os::unix::fs::MetadataExt;
    use std::sync::Mutex;

    use userbpf_runtime::session::{Layout, SemaphoreRecord};

    /// A counter raised in a process: (pid, its start time, address).
    type Raised = (u32, u64, u64);

    /// Counters raised by the loader, by link id.
    static RAISED: Mutex<Option<HashMap<u32, Vec<Raised>>>> = Mutex::new(None);

    /// The address of file offset `off` of the file `(dev, ino)` in process `pid`'s writable
    /// private mappings (see `userbpf_hook::usdt::semaphore_address`).
    fn address_in(pid: &str, dev: u64, ino: u64, off: u64) -> Option<u64> {
        let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).ok()?;
        userbpf_hook::usdt::semaphore_address(&maps, dev, ino, off)
    }

    /// Adds `delta` to the u16 counter at `addr` in process `pid`.
    fn add_in(pid: u32, addr: u64, delta: i16) -> bool {
        let Ok(mut f) = std::fs::OpenOptions::new().read(true).write(true).open(format!("/proc/{pid}/mem")) else { return false };
        let mut b = [0u8; 2];
        if f.seek(SeekFrom::Start(addr)).is_err() || f.read_exact(&mut b).is_err() {
            return false;
        }
        let v = u16::from_ne_bytes(b).wrapping_add_signed(delta);
        f.seek(SeekFrom::Start(addr)).is_ok() && f.write_all(&v.to_ne_bytes()).is_ok()
    }

    /// Link `link` has a semaphore at file offset `off` of `path`: raise it in the processes
    /// it is for and record it in the session.
    pub fn raise(dir: &Layout, link: u32, path: &str, off: u64, pid: Option<u32>) {
        let _ = SemaphoreRecord { link, path: path.to_string(), offset: off, pid }.write(dir);
        let Ok(md) = std::fs::metadata(path) else { return };
        let me = std::process::id();
        let mut done = Vec::new();
        let pids: Vec<String> = match pid {
            Some(p) => vec![p.to_string()],
            None => std::fs::read_dir("/proc")
                .map(|rd| rd.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).filter(|n| n.parse::<u32>().is_ok()).collect())
                .unwrap_or_default(),
        };
        for p in pids {
            let Ok(n) = p.parse::<u32>() else { continue };
            if let Some(addr) = address_in(&p, md.dev(), md.ino(), off) {
                if !claim(dir, link, n) {
                    continue; // the process raised it itself
                }
                let ok = if n == me { add_own(addr, 1) } else { add_in(n, addr, 1) };
                if ok {
                    done.push((n, userbpf_runtime::session::start_time(n).unwrap_or(0), addr));
                }
            }
        }
        let mut g = RAISED.lock().unwrap_or_else(|e| e.into_inner());
        g.get_or_insert_with(HashMap::new).insert(link, done);
    }

    /// Whether the caller is the one to raise link `link`'s semaphore in process `pid` (the
    /// loader's scan and the process's own start can both see it: exactly one of them wins).
    fn claim(dir: &Layout, link: u32, pid: u32) -> bool {
        let start = userbpf_runtime::session::start_time(pid).unwrap_or(0);
        std::fs::OpenOptions::new().write(true).create_new(true).open(dir.semaphore_claim(link, pid, start)).is_ok()
    }

    /// Link `link` is gone: lower what [`raise`] raised (in processes still the same).
    pub fn lower(dir: &Layout, link: u32) {
        let _ = std::fs::remove_file(dir.semaphore(link));
        if let Ok(rd) = std::fs::read_dir(dir.perf_dir()) {
            for e in rd.flatten() {
                if Layout::is_claim_of_link(&e.file_name().to_string_lossy(), link) {
                    let _ = std::fs::remove_file(e.path());
                }
            }
        }
        let done = RAISED.lock().unwrap_or_else(|e| e.into_inner()).as_mut().and_then(|m| m.remove(&link)).unwrap_or_default();
        let me = std::process::id();
        for (pid, start, addr) in done {
            if pid == me {
                add_own(addr, -1);
            } else if userbpf_runtime::session::start_time(pid).unwrap_or(0) == start {
                add_in(pid, addr, -1);
            }
        }
    }

    fn add_own(addr: u64, delta: i16) -> bool {
        // SAFETY: `addr` is a USDT semaphore of a file mapped in this process (found in our
        // own maps): a 2-byte aligned u16 in a writable mapping.
        let a = unsafe { &*(addr as *const std::sync::atomic::AtomicU16) };
        if delta >= 0 {
            a.fetch_add(delta as u16, std::sync::atomic::Ordering::SeqCst);
        } else {
            a.fetch_sub(delta.unsigned_abs(), std::sync::atomic::Ordering::SeqCst);
        }
        true
    }

    /// At the start of a process of the session (not the loader): raise the semaphores of
    /// the session's links that are for this process.
    pub fn raise_own(dir: &Layout) {
        let me = std::process::id();
        for r in SemaphoreRecord::all(dir) {
            if !r.is_for(me) {
                continue;
            }
            let Ok(md) = std::fs::metadata(&r.path) else { continue };
            if let Some(addr) = address_in("self", md.dev(), md.ino(), r.offset) {
                if claim(dir, r.link, me) {
                    add_own(addr, 1);
                }
            }
        }
    }
}
