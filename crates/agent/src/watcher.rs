//! The agent's thread: it starts the agent in its session, then watches the session's `links/`
//! directory (inotify: notified, never polled) and syncs on every change.
//!
//! The program must not see it (issue 18):
//! - **Descriptors.** The thread works in a descriptor table of its own
//!   (`close_range(CLOSE_RANGE_UNSHARE)`: a private copy of the program's table, emptied at
//!   once, so no file of the program is held open by it; 0, 1 and 2 are `/dev/null`). Every
//!   descriptor the agent keeps (the session's files and maps, the CPU slots, its inotify
//!   watch) lives there: the program's first `open()` gets the descriptor it gets without
//!   userbpf, `/proc/self/fd` lists only its own, `close_range`/`closefrom` or a loop closing
//!   every descriptor (daemons) leave the agent's alone, and an `RLIMIT_NOFILE` of 16 leaves the
//!   program its 16. So the agent's start-up (the first sync, which opens them) runs on this
//!   thread while the program's thread that loaded the agent waits for it, and syncs asked for
//!   by the program's threads (a library loaded with dlopen, see `on_objects_changed`) are
//!   made here too while the asking thread waits (bounded, as for the agent's lock). The
//!   agent's messages go to the program's standard error as it is when they are written
//!   (`pidfd_getfd` of the process's descriptor 2 for the write: nothing once the program
//!   closed it).
//! - **Signals.** It blocks every signal but faults and the hook engine's own
//!   (`userbpf_hook::quiet`): a signal sent to the process goes to one of the program's threads.
//! - **Credentials.** It takes part in glibc's set*id broadcast with the program's capabilities
//!   and ends each change with the program's credentials (see `creds`). So once the program
//!   drops root (nginx's worker, su's child, a daemon) the thread cannot open the session's
//!   files any more: its watch of `links/` (made before) still reports changes, and what it
//!   reads or writes in the session afterwards goes through the session's broker
//!   (`userbpf_runtime::session::broker`, remembered at the agent's start): links, programs
//!   and maps added later, its acknowledgements, its membership. A child forked after the drop
//!   joins through it too (its parent's membership admits it) and asks it for its own watch.
//!   With no broker serving (no privileged userbpf process of the session alive), links
//!   removed are still detached (the watch names them, see `GONE_LINKS`); links added wait.
//!   A touch of the acknowledgement file (the wake-up below) also goes through the broker, and
//!   `userbpf detach` makes it itself.
//! - **Wake-ups.** A thread of the program asks for a sync by touching (`utimensat`) this
//!   process's acknowledgement file `agents/PID.STARTTIME`, which the thread's inotify
//!   descriptor watches (`IN_ATTRIB` on `agents/`, filtered by name): no descriptor of the
//!   program's is needed. A sync that must wait for the dynamic loader (see
//!   `symbols::DEFERRED`) is retried after a short poll timeout.
//!
//! What stays visible: the thread itself, in `/proc/PID/task` (named `userbpf-agent`).

use std::ffi::CString;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, AtomicU64, Ordering};

use userbpf_runtime::Session;
use userbpf_runtime::session::Layout;
use userbpf_runtime::session::broker;

use crate::{AGENT, Ack, Agent, creds, lock};

/// The path of this process's acknowledgement file, touched to wake the agent's thread (null:
/// none). Leaked when replaced: a thread may be reading it.
static KICK_PATH: AtomicPtr<libc::c_char> = AtomicPtr::new(std::ptr::null_mut());
/// Syncs the program's threads asked for, and the last one made (see [`request_sync`]).
static REQUESTED: AtomicU64 = AtomicU64::new(0);
static DONE: AtomicU64 = AtomicU64::new(0);
/// A sync waits for the dynamic loader: the agent's thread tries again shortly.
static RETRY: AtomicBool = AtomicBool::new(false);
/// The agent's watching thread in this process (0: none).
static THREAD: AtomicI32 = AtomicI32::new(0);
/// Links whose records the watch saw removed since the last listing of `links/` (what a
/// process that dropped privileges, with no broker to list the directory for it, detaches:
/// see `Agent::sync_inner`).
pub(crate) static GONE_LINKS: Mutex<Vec<u32>> = Mutex::new(Vec::new());
/// An agent thread is being started (at load, in a forked child): a sync asked for meanwhile
/// waits for it rather than running on the program's thread.
static STARTING: AtomicBool = AtomicBool::new(false);

/// Clears [`STARTING`] when dropped (the thread's start-up is over, whichever way it ended).
struct StartingGuard;

impl Drop for StartingGuard {
    fn drop(&mut self) {
        STARTING.store(false, Ordering::SeqCst);
    }
}

fn gettid() -> i32 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() }
}

/// The agent's watching thread (0: none).
pub(crate) fn agent_tid() -> i32 {
    THREAD.load(Ordering::SeqCst)
}

/// Whether the calling thread is one of the agent's (it has a descriptor table of its own).
pub(crate) fn is_agent_thread() -> bool {
    creds::is_agent_tid(gettid())
}

/// Prints `userbpf-agent: MSG` on the program's standard error.
pub(crate) fn log(msg: &str) {
    let line = format!("userbpf-agent: {msg}\n");
    let (fd, opened) = if is_agent_thread() { (programs_stderr(), true) } else { (2, false) };
    if fd < 0 {
        return;
    }
    // SAFETY: writing a buffer we own, of its length.
    unsafe { libc::write(fd, line.as_ptr().cast(), line.len()) };
    if opened {
        // SAFETY: our descriptor.
        unsafe { libc::close(fd) };
    }
}

/// A descriptor (in the agent thread's table) of the program's standard error as it is now:
/// `pidfd_getfd` of the process's descriptor 2 (the file itself, whatever its owner), else
/// `/proc/self/fd/2` opened again; -1 when the program has none.
fn programs_stderr() -> i32 {
    // SAFETY: pidfd_open of this process; the descriptor is closed below.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, libc::getpid(), 0) } as i32;
    if pidfd >= 0 {
        // SAFETY: duplicates descriptor 2 of this process (the thread group's table) into ours.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd, 2, 0) } as i32;
        // SAFETY: our descriptor.
        unsafe { libc::close(pidfd) };
        if fd >= 0 {
            return fd;
        }
    }
    // SAFETY: a NUL-terminated path; the caller closes the descriptor.
    unsafe {
        libc::open(c"/proc/self/fd/2".as_ptr(), libc::O_WRONLY | libc::O_APPEND | libc::O_CLOEXEC | libc::O_NOCTTY)
    }
}

/// Sets (or clears) the acknowledgement file that [`kick`] touches.
pub(crate) fn set_kick_path(path: Option<&std::path::Path>) {
    let new = path
        .and_then(|p| CString::new(p.as_os_str().as_encoded_bytes()).ok())
        .map_or(std::ptr::null_mut(), CString::into_raw);
    // The old path is leaked: another thread may be using it.
    KICK_PATH.swap(new, Ordering::SeqCst);
}

/// Asks the agent's thread for a sync (a sync waits for the dynamic loader, or a program's
/// thread could not sync itself). Returns whether the thread was told.
pub(crate) fn kick() -> bool {
    if is_agent_thread() {
        RETRY.store(true, Ordering::SeqCst);
        return true;
    }
    // A thread being started acknowledges nothing yet: wait for it (bounded).
    let deadline = std::time::Instant::now() + std::time::Duration::from_millis(500);
    while STARTING.load(Ordering::SeqCst) && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_micros(100));
    }
    let p = KICK_PATH.load(Ordering::SeqCst);
    if p.is_null() || THREAD.load(Ordering::SeqCst) == 0 {
        return false;
    }
    // SAFETY: a leaked NUL-terminated path (never freed); NULL times: now.
    if unsafe { libc::utimensat(libc::AT_FDCWD, p, std::ptr::null(), 0) } == 0 {
        return true;
    }
    // The process dropped privileges since it made the file: the touch through the broker.
    // SAFETY: as above.
    let path = unsafe { std::ffi::CStr::from_ptr(p) };
    let path = std::path::Path::new(<std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(path.to_bytes()));
    userbpf_runtime::session::broker::touch(path).is_ok()
}

/// From a program's thread: has the agent's thread sync and waits for it, at most `limit`.
/// False when there is no such thread or it did not sync in time (it will).
pub(crate) fn request_sync(limit: std::time::Duration) -> bool {
    let req = REQUESTED.fetch_add(1, Ordering::SeqCst) + 1;
    if !kick() {
        return false;
    }
    let deadline = std::time::Instant::now() + limit;
    while DONE.load(Ordering::SeqCst) < req {
        if std::time::Instant::now() >= deadline || THREAD.load(Ordering::SeqCst) == 0 {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_micros(50));
    }
    true
}

/// First thing on an agent thread: it is userbpf's, it follows the program's credentials, and
/// its descriptors are its own (see the module's documentation).
pub(crate) fn enter_agent_thread() {
    userbpf_hook::mark_thread_ours();
    creds::register_this_thread();
    // glibc installs its handler when the process's first thread is created: it is there now.
    creds::install();
    private_descriptors();
    grow_arena();
    THREAD.store(gettid(), Ordering::SeqCst);
}

/// glibc gives a new thread a malloc arena of its own, which grows by `mprotect` a few pages at
/// a time (no padding, unlike the main heap): the agent's start-up would make hundreds of
/// them. Allocating a megabyte in blocks below the mmap threshold, then freeing them, grows it
/// in a dozen calls; later growth up to that size makes none.
fn grow_arena() {
    let blocks: Vec<Vec<u8>> = (0..9).map(|_| Vec::with_capacity(120 << 10)).collect();
    drop(std::hint::black_box(blocks));
}

/// Last thing on an agent thread that ends (its id may be reused by a thread of the program).
fn leave_agent_thread() {
    let _ = THREAD.compare_exchange(gettid(), 0, Ordering::SeqCst, Ordering::SeqCst);
    creds::unregister_this_thread();
}

/// Gives the calling thread an empty descriptor table of its own, 0 to 2 on `/dev/null`.
fn private_descriptors() {
    const CLOSE_RANGE_UNSHARE: libc::c_uint = 2;
    // SAFETY: unshares this thread's table, then closes every descriptor of the copy; the
    // program's table is not touched.
    let r = unsafe { libc::syscall(libc::SYS_close_range, 0 as libc::c_uint, libc::c_uint::MAX, CLOSE_RANGE_UNSHARE) };
    if r != 0 {
        // Before Linux 5.9: unshare, then close what the copy holds.
        // SAFETY: unshare of this thread's descriptor table.
        if unsafe { libc::unshare(libc::CLONE_FILES) } != 0 {
            return;
        }
        let fds: Vec<i32> = std::fs::read_dir("/proc/thread-self/fd")
            .map(|d| d.flatten().filter_map(|e| e.file_name().to_str()?.parse().ok()).collect())
            .unwrap_or_default();
        for fd in fds {
            // SAFETY: a descriptor of this thread's private copy (the directory's own one is
            // closed already and fails harmlessly).
            unsafe { libc::close(fd) };
        }
    }
    for _ in 0..3 {
        // SAFETY: a NUL-terminated path; the descriptor is this thread's (0, 1, 2 in turn).
        unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    }
}

/// The directory `links_watch` watches: an inotify descriptor and the directory's inode.
pub(crate) struct LinksWatch {
    pub(crate) fd: i32,
    ino: u64,
}

impl LinksWatch {
    fn close(self) {
        // SAFETY: our descriptor, not shared.
        unsafe { libc::close(self.fd) };
    }
}

/// The inode of a directory, if it exists.
fn inode(dir: &std::path::Path) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(dir).ok().map(|m| m.ino())
}

/// As [`watch_links`], also telling which directory is watched: the session directory may be
/// removed and made anew (a session with no live member is reaped by any `userbpf` command)
/// between this watch, made before the agent joins, and the join.
pub(crate) fn watch_links_early(dir: &std::path::Path) -> Option<LinksWatch> {
    let before = inode(dir)?;
    let fd = watch_links(dir, true)?;
    if inode(dir) == Some(before) {
        return Some(LinksWatch { fd, ino: before });
    }
    LinksWatch { fd, ino: 0 }.close();
    None
}

/// An inotify descriptor watching the session's `links/` directory `dir` (`None` when it
/// cannot be watched: said unless `quiet`).
pub(crate) fn watch_links(dir: &std::path::Path, quiet: bool) -> Option<i32> {
    // SAFETY: inotify_init1 has no preconditions; the descriptor is owned by the caller.
    let fd = unsafe { libc::inotify_init1(libc::IN_CLOEXEC) };
    if fd < 0 {
        log("inotify_init1 failed: links added later will not be attached");
        return None;
    }
    // Through the broker in a process that dropped privileges (a child forked after the drop).
    if userbpf_runtime::session::broker::add_watch(fd, dir, libc::IN_MOVED_TO | libc::IN_CREATE | libc::IN_DELETE)
        .is_err()
    {
        LinksWatch { fd, ino: 0 }.close();
        if !quiet {
            log("watching the session's links failed: links added later will not be attached");
        }
        return None;
    }
    Some(fd)
}

/// Adds the watch of `agents/` (touches of this process's acknowledgement file wake the
/// thread, see [`kick`]); returns its watch descriptor and the file's name.
fn watch_kicks(fd: i32, a: &Mutex<Agent>) -> Option<(i32, Vec<u8>)> {
    let g = lock(a);
    let path = g.ack.as_ref()?.file.path();
    let name = path.file_name()?.as_encoded_bytes().to_vec();
    let wd = userbpf_runtime::session::broker::add_watch(fd, path.parent()?, libc::IN_ATTRIB).ok()?;
    Some((wd, name))
}

/// Syncs on every change of the session's links (inotify `fd`, see [`watch_links`]), on
/// kicks, and again shortly after a sync that waits for the dynamic loader.
fn watch(fd: i32, a: &'static Mutex<Agent>) {
    let kicks = watch_kicks(fd, a);
    // inotify events are 4-byte aligned.
    let mut buf = [0u32; 1024];
    loop {
        // A detach asked for before the watch of kicks existed (right after the start-up
        // sync, which `userbpf attach` waits for) touched the file unseen: the flag says it.
        if crate::detach::requested() {
            return;
        }
        let mut pfd = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
        let timeout = if RETRY.load(Ordering::SeqCst) { 10 } else { -1 };
        // SAFETY: polling one descriptor we own (closed by the thread's end at a detach).
        let n = unsafe { libc::poll(&mut pfd, 1, timeout) };
        if crate::detach::requested() {
            return;
        }
        if n < 0 {
            if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return;
        }
        let mut wanted = n == 0 || REQUESTED.load(Ordering::SeqCst) > DONE.load(Ordering::SeqCst);
        if pfd.revents & libc::POLLIN != 0 {
            // SAFETY: reading into a buffer we own, of its length in bytes.
            let r = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), std::mem::size_of_val(&buf)) };
            if r <= 0 {
                if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                return;
            }
            wanted |= relevant(&buf, r as usize, kicks.as_ref());
        } else if pfd.revents != 0 {
            return;
        }
        if !wanted {
            continue;
        }
        RETRY.store(false, Ordering::SeqCst);
        let req = REQUESTED.load(Ordering::SeqCst);
        lock(a).sync();
        DONE.fetch_max(req, Ordering::SeqCst);
    }
}

/// Whether the inotify events read (`len` bytes of `buf`) call for a sync: any change in
/// `links/`, and touches of this process's own acknowledgement file among those of `agents/`.
fn relevant(buf: &[u32], len: usize, kicks: Option<&(i32, Vec<u8>)>) -> bool {
    // SAFETY: the bytes of the buffer, of its size.
    let bytes = unsafe { std::slice::from_raw_parts(buf.as_ptr().cast::<u8>(), std::mem::size_of_val(buf)) };
    let mut off = 0;
    let mut any = false;
    while off + 16 <= len {
        let wd = i32::from_ne_bytes(bytes[off..off + 4].try_into().unwrap_or_default());
        let mask = u32::from_ne_bytes(bytes[off + 4..off + 8].try_into().unwrap_or_default());
        let nlen = u32::from_ne_bytes(bytes[off + 12..off + 16].try_into().unwrap_or_default()) as usize;
        let name = &bytes[(off + 16).min(len)..(off + 16 + nlen).min(len)];
        let name = &name[..name.iter().position(|&b| b == 0).unwrap_or(name.len())];
        match kicks {
            Some((kwd, own)) if *kwd == wd => any |= name == own.as_slice() || mask & libc::IN_Q_OVERFLOW != 0,
            _ => {
                any = true;
                let id = std::str::from_utf8(name).ok().and_then(|n| n.strip_suffix(".json")?.parse::<u32>().ok());
                if let (Some(id), true) = (id, mask & libc::IN_DELETE != 0) {
                    let mut g = GONE_LINKS.lock().unwrap_or_else(|e| e.into_inner());
                    if g.len() < 4096 {
                        g.push(id);
                    }
                }
            }
        }
        off += 16 + nlen;
    }
    any
}

/// Runs `watch`; once it ends (nothing syncs on link changes any more), the process stops
/// acknowledging them, and the thread only serves the syncs the program's threads ask for: it
/// stays, as its descriptor table holds the agent's descriptors (a sync on a program's thread
/// could close one of the program's by their numbers), until a detach (`detach`), which it
/// makes before it returns.
pub(crate) fn watch_then_stop_acking(fd: i32, a: &'static Mutex<Agent>) {
    watch(fd, a);
    if !crate::detach::requested() {
        stop_acking(a);
    }
    serve_requests(a)
}

/// Syncs when a thread of the program asks (see [`request_sync`]), until a detach is asked
/// for: then detaches and returns (the thread ends, its descriptor table with it).
fn serve_requests(a: &'static Mutex<Agent>) {
    loop {
        if crate::detach::requested() {
            crate::detach::run(a);
            return;
        }
        let req = REQUESTED.load(Ordering::SeqCst);
        if req > DONE.load(Ordering::SeqCst) || RETRY.swap(false, Ordering::SeqCst) {
            lock(a).sync();
            DONE.fetch_max(req, Ordering::SeqCst);
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Once the agent started in its session: leaves the session at exit, and returns the
/// inotify descriptor to watch the session's links with: the `early` watch (made before the
/// start-up sync, so that no link added meanwhile is missed) when it is on the directory of
/// the session joined, else a new one followed by a sync. `None`: links cannot be watched.
pub(crate) fn watch_after_start(a: &'static Mutex<Agent>, early: Option<LinksWatch>) -> Option<i32> {
    // Once per process (an agent started again after a detach has it already).
    static AT_EXIT: std::sync::Once = std::sync::Once::new();
    // SAFETY: registering a function with no preconditions to run at exit.
    AT_EXIT.call_once(|| unsafe {
        libc::atexit(crate::leave_at_exit);
    });
    let links = lock(a).session.layout().links_dir();
    let early = early.and_then(|w| {
        if inode(&links) == Some(w.ino) {
            return Some(w.fd);
        }
        w.close();
        None
    });
    early.or_else(|| {
        let fd = watch_links(&links, false)?;
        lock(a).sync();
        Some(fd)
    })
}

/// Without a watcher, this process acknowledges no link change: its file goes.
pub(crate) fn stop_acking(a: &Mutex<Agent>) {
    if let Some(ack) = lock(a).ack.take() {
        ack.remove();
    }
}

/// The agent thread's life: `start` joins the session and makes the first sync (its result is
/// sent on `started`, which a waiting thread of the program reads), then the watch.
fn agent_thread(
    links: std::path::PathBuf,
    start: impl FnOnce() -> Result<&'static Mutex<Agent>, String>,
    started: Option<std::sync::mpsc::SyncSender<()>>,
    what: &str,
) {
    let starting = StartingGuard;
    enter_agent_thread();
    // Watch first, then sync at the start: a link added in between is not missed.
    let early = watch_links_early(&links);
    match start() {
        Ok(a) => {
            let fd = watch_after_start(a, early);
            drop(starting);
            drop(started);
            match fd {
                Some(fd) => watch_then_stop_acking(fd, a),
                None => {
                    stop_acking(a);
                    serve_requests(a)
                }
            }
        }
        Err(e) => {
            drop(starting);
            if let Some(w) = early {
                w.close();
            }
            log(&format!("{what}{e}"));
        }
    }
    leave_agent_thread();
}

/// The library's constructor (`LD_PRELOAD`): starts the agent on its thread and waits until
/// the session's links are attached. The dynamic loader calls it with the program's `argc`,
/// `argv` and `envp`, first of all the constructors of the libraries loaded with the program
/// (the library is linked `-z initfirst`, see build.rs), so before libc's own: see
/// [`environ_before_libc`].
pub(crate) extern "C" fn agent_init(
    _argc: libc::c_int,
    _argv: *const *const libc::c_char,
    envp: *mut *mut libc::c_char,
) {
    environ_before_libc(envp);
    if std::env::var_os("USERBPF_SESSION").is_none() {
        return;
    }
    // Preloaded only: a process that merely inherited USERBPF_SESSION (started from a shell
    // of a session) and gets the agent by `userbpf attach` loads it with dlopen, whose lock
    // the agent's thread would wait for while this constructor waits for that thread; the
    // injector starts it (`userbpf_agent_attach`).
    if !preloaded() {
        return;
    }
    let _ = std::panic::catch_unwind(|| {
        // The agent's work on the program's main thread: no probe fires for it.
        let _ours = userbpf_hook::ours();
        // While the process has one thread (see `userbpf_hook::prepare`).
        let _ = userbpf_hook::prepare();
        let links = Layout::new(Session::dir_of(&Session::default_name())).links_dir();
        let (tx, rx) = std::sync::mpsc::sync_channel::<()>(1);
        STARTING.store(true, Ordering::SeqCst);
        let spawned = userbpf_hook::quiet::spawn("userbpf-agent", move || {
            agent_thread(links, || Agent::start_with(true), Some(tx), "")
        });
        match spawned {
            // The sender goes when the start-up sync is done (or failed); then the return of
            // the execve that made this image, as the kernel reports it here.
            Ok(_) => {
                let _ = rx.recv();
                crate::tracepoint::exec_returned();
            }
            Err(e) => {
                STARTING.store(false, Ordering::SeqCst);
                log(&format!("starting the agent's thread: {e}"))
            }
        }
    });
}

/// For a constructor that may run before libc's (a library linked `-z initfirst`, as the agent
/// and the syscall server are): libc's initialiser sets `environ`, which `getenv` (Rust's
/// `std::env`) reads, from the `envp` the dynamic loader passes to every initialiser. Before
/// that `environ` is null and every variable looks unset: this sets it to that same `envp`.
/// Once libc has set it (later constructors, a `dlopen`), it does nothing.
pub fn environ_before_libc(envp: *mut *mut libc::c_char) {
    unsafe extern "C" {
        static mut environ: *mut *mut libc::c_char;
    }
    // SAFETY: `environ` is null only before libc's initialiser ran, i.e. while the dynamic
    // loader runs the first constructors of the program on its one thread: nothing else reads
    // or writes it then. Later (a dlopen by `userbpf attach`) it is not null and is only read,
    // as getenv reads it. `envp` is the environment block the loader passes to every
    // initialiser, the one libc's initialiser stores in `environ` after this.
    unsafe {
        if (&raw const environ).read_volatile().is_null() && !envp.is_null() {
            environ = envp;
        }
    }
}

/// Whether this library is one `LD_PRELOAD` names (by file name).
fn preloaded() -> bool {
    let Some(pre) = std::env::var_os("LD_PRELOAD") else { return false };
    // SAFETY: Dl_info is pointers only, for which null is a valid value.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: dladdr reads the address of a function of this library and writes `info`.
    if unsafe { libc::dladdr(agent_init as *const libc::c_void, &mut info) } == 0 || info.dli_fname.is_null() {
        return false;
    }
    // SAFETY: dladdr's dli_fname is a NUL-terminated path owned by the dynamic linker.
    let me = unsafe { std::ffi::CStr::from_ptr(info.dli_fname) }.to_bytes();
    let name = |p: &[u8]| p.rsplit(|b| *b == b'/').next().map(<[u8]>::to_vec).unwrap_or_default();
    let mine = name(me);
    pre.as_encoded_bytes().split(|b| *b == b':' || *b == b' ').any(|p| !p.is_empty() && name(p) == mine)
}

/// The entry point of `userbpf attach` (called by the injector, see the userbpf-inject crate,
/// on a borrowed thread of a running process, once the library is loaded by the process's own
/// dlopen): `arg` is `ROOT\nSESSION`, where the session directories are and which session to
/// join. Returns at once (the borrowed thread is paused while it runs): a thread of ours joins
/// the session, attaches its links and then watches them, as in a process started under the
/// agent. 0: started; 1: the agent already runs here; -1: a bad argument or no thread.
///
/// # Safety
/// `arg` is a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn userbpf_agent_attach(arg: *const std::ffi::c_char) -> i32 {
    if arg.is_null() {
        return -1;
    }
    // userbpf's own work on the borrowed thread: no probe fires for it.
    let _ours = userbpf_hook::ours();
    // SAFETY: a NUL-terminated string (the caller's contract).
    let arg = unsafe { std::ffi::CStr::from_ptr(arg) }.to_string_lossy().into_owned();
    std::panic::catch_unwind(move || {
        let Some((root, rest)) = arg.split_once('\n') else { return -1 };
        // `ROOT\nNAME`, or `ROOT\nNAME\nSECRET\nDIR` (the secret in hex, the session's
        // directory, named for its owner) for a process that cannot read the session: another
        // user's, which the attacher invited (`broker::invite`).
        let (name, invited) = match rest.split_once('\n') {
            Some((name, more)) => match more.split_once('\n').and_then(|(hex, dir)| Some((decode_secret(hex)?, dir))) {
                Some((secret, dir)) => (name, Some((secret, std::path::PathBuf::from(dir)))),
                None => return -1,
            },
            None => (rest, None),
        };
        if AGENT.get().is_some() && !crate::detach::is_detached() {
            return 1;
        }
        // A detach still under way (the previous agent thread has not ended): not yet.
        if THREAD.load(Ordering::SeqCst) != 0 {
            return 2;
        }
        let (root, name) = (std::path::PathBuf::from(root), name.to_string());
        let dir = invited.as_ref().map_or_else(|| Session::dir_in(&root, &name), |(_, d)| d.clone());
        let links = Layout::new(&dir).links_dir();
        note_borrowed();
        let start = move || {
            // No patching (and its signals to every thread) while the injector still holds
            // this thread stopped.
            wait_borrowed_released();
            let opened = match invited {
                Some((secret, dir)) => broker::remember_given(&dir, secret)
                    .map_err(|e| format!("reaching session {name} through its broker: {e}"))
                    .and_then(|()| Session::open_at(&dir, &name).map_err(|e| format!("opening session {name}: {e}"))),
                None => Session::open_in(&root, &name).map_err(|e| format!("opening session {name}: {e}")),
            };
            opened.and_then(|s| Agent::start_in(s, true))
        };
        STARTING.store(true, Ordering::SeqCst);
        let started = userbpf_hook::quiet::spawn("userbpf-agent", move || agent_thread(links, start, None, "attach: "));
        if started.is_err() {
            STARTING.store(false, Ordering::SeqCst);
        }
        if started.is_ok() { 0 } else { -1 }
    })
    .unwrap_or(-1)
}

/// The session's secret as `userbpf attach` passes it: 64 hex digits.
fn decode_secret(hex: &str) -> Option<[u8; broker::SECRET_LEN]> {
    let hex = hex.as_bytes();
    if hex.len() != 2 * broker::SECRET_LEN {
        return None;
    }
    let mut out = [0u8; broker::SECRET_LEN];
    for (o, pair) in out.iter_mut().zip(hex.chunks_exact(2)) {
        *o = u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok()?;
    }
    Some(out)
}

/// The thread the injector borrowed for `userbpf_agent_attach` or `userbpf_agent_detach`
/// (0: none).
static BORROWED: AtomicI32 = AtomicI32::new(0);

/// Called on the injector's borrowed thread: remembers it (see [`wait_borrowed_released`]).
pub(crate) fn note_borrowed() {
    // SAFETY: gettid has no preconditions.
    BORROWED.store(unsafe { libc::gettid() }, Ordering::SeqCst);
}

/// On the agent's thread, before it patches code (its first sync at an attach, the probes'
/// removal at a detach): waits until the injector has let the borrowed thread go (its
/// `TracerPid` is 0 again; at most 2 s). Patching signals every thread running user code and
/// waits for each (bounded); a thread held in a ptrace stop answers only once released, and
/// under load the injector's last steps (its `dlclose` call, the registers put back) can take
/// long enough to make each such wait run to its timeout.
pub(crate) fn wait_borrowed_released() {
    let tid = BORROWED.swap(0, Ordering::SeqCst);
    if tid == 0 {
        return;
    }
    let path = format!("/proc/self/task/{tid}/status");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    while std::time::Instant::now() < deadline {
        let Ok(status) = std::fs::read_to_string(&path) else { return };
        let traced = status
            .lines()
            .find_map(|l| l.strip_prefix("TracerPid:"))
            .is_some_and(|v| v.trim().parse::<i32>().is_ok_and(|p| p != 0));
        if !traced {
            return;
        }
        std::thread::sleep(std::time::Duration::from_micros(200));
    }
}

/// The forked child's agent thread (see `fork`): descriptors of its own, a membership of its
/// own, links for another pid detached, then the parent's job.
pub(crate) fn child_thread() {
    let starting = StartingGuard;
    enter_agent_thread();
    crate::fork::restore_agent_fds();
    let Some(cell) = AGENT.get().filter(|_| !crate::detach::is_detached()) else { return leave_agent_thread() };
    // Watch first, then sync: a link added in between is not missed.
    let dir = lock(cell).session.layout().links_dir();
    let mut fd = watch_links(&dir, true);
    let mut a = lock(cell);
    // The parent's session, in the directory it is in (an injected agent's may not be the
    // default one: `userbpf attach` names it; a child whose uid changed still joins its
    // parent's session, not one of its new uid).
    match a.session.reopen() {
        Ok(s) => {
            // The copy of the parent's handle would leave with the parent's membership.
            std::mem::forget(std::mem::replace(&mut a.session, s));
        }
        // A child that changed its credentials before its agent thread ran (su's, runuser's
        // child after setuid) joins through the broker (its parent's membership admits it:
        // see `userbpf_runtime::session::broker`); with no broker serving, its probes (copied
        // from the parent) keep firing and nothing is said, as for a sync (see
        // `Agent::sync_inner`).
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {}
        Err(e) => log(&format!("joining the session in a forked child: {e}")),
    }
    if fd.is_none() {
        fd = watch_links(&a.session.layout().links_dir(), false);
    }
    // The parent's acknowledgement file is the parent's: the child acknowledges in its own.
    a.ack = if fd.is_some() { Ack::create(a.session.dir()) } else { None };
    a.sync();
    drop(a);
    drop(starting);
    match fd {
        Some(fd) => watch_then_stop_acking(fd, cell),
        None => serve_requests(cell),
    }
    leave_agent_thread();
}

/// In a forked child: the parent's agent threads are not there. `starting`: the child's own
/// is about to be started.
pub(crate) fn forget_after_fork(starting: bool) {
    THREAD.store(0, Ordering::SeqCst);
    STARTING.store(starting, Ordering::SeqCst);
    creds::forget_threads();
}
