//! The loader's descriptors that are ours: each object is a file in the session directory,
//! and a descriptor is ours when `fstat` finds its (device, inode) in this table, so `dup`,
//! `fcntl(F_DUPFD)`, `close` and `fork` need no interposing.
//!
//! The table is read on every interposed `ioctl`/`mmap` of a descriptor: a read lock and a
//! linear scan of a small vector, no allocation. Entries are added when an object is first
//! handed out and stay while the file exists (a removed file's entry is dropped with
//! [`forget`]).

use std::path::{Path, PathBuf};

use userbpf_runtime::session::{Layout, Session};

use crate::server::server;
use crate::sys;

/// What a descriptor of ours refers to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    Map,
    Prog,
    Btf,
    Link,
    PerfEvent,
}

impl Kind {
    /// The name the kernel's fdinfo/anon inode would use (for messages).
    pub fn name(self) -> &'static str {
        match self {
            Kind::Map => "map",
            Kind::Prog => "prog",
            Kind::Btf => "btf",
            Kind::Link => "link",
            Kind::PerfEvent => "perf_event",
        }
    }
}

/// One object of the session known to this process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Obj {
    pub kind: Kind,
    /// The session id (maps, programs, BTF and links share the session's id space; perf
    /// events get ids of their own choosing by their owner module).
    pub id: u32,
    /// The file backing the object.
    pub path: PathBuf,
}

pub(crate) struct Entry {
    dev: u64,
    ino: u64,
    obj: Obj,
}

/// `fstat` through the raw system call: `(st_dev, st_ino)`, or the errno.
fn dev_ino(fd: i32) -> Result<(u64, u64), i32> {
    // SAFETY: an all-zero `stat` is a valid value of the plain-data struct.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat writes at most one `struct stat` into `st`, which lives across the call.
    let r = unsafe { sys::raw6(libc::SYS_fstat, fd as i64, &mut st as *mut libc::stat as i64, 0, 0, 0, 0) };
    if r < 0 {
        return Err(-r as i32);
    }
    Ok((st.st_dev, st.st_ino))
}

/// Opens the object's file and registers it; returns the new descriptor (O_CLOEXEC, as the
/// kernel's bpf descriptors are).
pub fn install(kind: Kind, id: u32, path: &Path) -> Result<i32, i32> {
    use std::os::unix::ffi::OsStrExt;
    let mut cpath = path.as_os_str().as_bytes().to_vec();
    cpath.push(0);
    // SAFETY: `cpath` is NUL-terminated and outlives the call.
    let fd = unsafe {
        sys::raw6(
            libc::SYS_openat,
            libc::AT_FDCWD as i64,
            cpath.as_ptr() as i64,
            (libc::O_RDWR | libc::O_CLOEXEC | libc::O_NOATIME) as i64,
            0,
            0,
            0,
        )
    };
    if fd < 0 {
        return Err(-fd as i32);
    }
    let fd = fd as i32;
    if let Err(e) = register(fd, kind, id, path) {
        close(fd);
        return Err(e);
    }
    Ok(fd)
}

/// Registers an already open descriptor of an object's file (for objects whose descriptor
/// is opened otherwise).
pub fn register(fd: i32, kind: Kind, id: u32, path: &Path) -> Result<(), i32> {
    let (dev, ino) = dev_ino(fd)?;
    let obj = Obj { kind, id, path: path.to_path_buf() };
    let mut t = server().objects.write().unwrap_or_else(|e| e.into_inner());
    if let Some(e) = t.iter_mut().find(|e| e.dev == dev && e.ino == ino) {
        e.obj = obj;
    } else {
        t.push(Entry { dev, ino, obj });
    }
    Ok(())
}

/// The object `fd` refers to, if it is one of ours.
pub fn get(fd: i32) -> Option<Obj> {
    if fd < 0 {
        return None;
    }
    let (dev, ino) = dev_ino(fd).ok()?;
    let t = server().objects.read().unwrap_or_else(|e| e.into_inner());
    if t.is_empty() {
        return None;
    }
    t.iter().find(|e| e.dev == dev && e.ino == ino).map(|e| e.obj.clone())
}

/// Whether `fd` is one of ours, without copying the object (cheap check for hot paths).
pub fn kind_of(fd: i32) -> Option<(Kind, u32)> {
    if fd < 0 {
        return None;
    }
    {
        let t = server().objects.read().unwrap_or_else(|e| e.into_inner());
        if t.is_empty() {
            return None;
        }
    }
    let (dev, ino) = dev_ino(fd).ok()?;
    let t = server().objects.read().unwrap_or_else(|e| e.into_inner());
    t.iter().find(|e| e.dev == dev && e.ino == ino).map(|e| (e.obj.kind, e.obj.id))
}

/// The object `fd` refers to, which must be of `kind`: `EBADF` when `fd` is not an open
/// descriptor, `EINVAL` when it is something else (as the kernel's `bpf_map_get` and
/// `bpf_prog_get` answer).
pub fn get_kind(fd: i32, kind: Kind) -> Result<Obj, i32> {
    if fd < 0 {
        return Err(libc::EBADF);
    }
    let (dev, ino) = dev_ino(fd)?;
    let t = server().objects.read().unwrap_or_else(|e| e.into_inner());
    match t.iter().find(|e| e.dev == dev && e.ino == ino) {
        Some(e) if e.obj.kind == kind => Ok(e.obj.clone()),
        _ => Err(libc::EINVAL),
    }
}

/// Every registered object of `kind` (e.g. links to detach at exit).
pub fn all(kind: Kind) -> Vec<Obj> {
    let t = server().objects.read().unwrap_or_else(|e| e.into_inner());
    t.iter().filter(|e| e.obj.kind == kind).map(|e| e.obj.clone()).collect()
}

/// Drops the entries of an object whose file is being removed (its inode may be reused).
pub fn forget(kind: Kind, id: u32) {
    let mut t = server().objects.write().unwrap_or_else(|e| e.into_inner());
    t.retain(|e| !(e.obj.kind == kind && e.obj.id == id));
}

/// Closes a descriptor through the raw system call.
pub fn close(fd: i32) {
    // SAFETY: closing a descriptor this module opened and did not hand out.
    unsafe { sys::raw6(libc::SYS_close, fd as i64, 0, 0, 0, 0, 0) };
}

/// The loader's session (`USERBPF_SESSION`, default `default`), opened and joined on first
/// use and kept for the life of the process; the process leaves it at exit (see
/// [`leave_at_exit`]). Errors map to an errno (`EPERM`-like failures of the shared-memory
/// directory come back as the OS error).
pub fn session() -> Result<&'static Session, i32> {
    server()
        .session
        .get_or_init(|| {
            let s = Session::open(&Session::default_name()).map_err(|e| e.raw_os_error().unwrap_or(libc::EINVAL))?;
            // SAFETY: registering a function with no preconditions to run at exit.
            unsafe { libc::atexit(leave_at_exit) };
            // Targets that dropped privileges reach the session through the loader while it
            // lives (the links it makes are theirs to attach): see
            // `userbpf_runtime::session::broker`. Without a broker they keep what they have.
            let spawn = |f: Box<dyn FnOnce() + Send>| userbpf_hook::quiet::spawn("userbpf-broker", f).map(drop);
            let _ = userbpf_runtime::session::broker::serve(s.dir(), spawn);
            Ok(s)
        })
        .as_ref()
        .map_err(|e| *e)
}

/// Serves the calls of this process in session `s` instead of the one `USERBPF_SESSION`
/// names (a process using the server as a library, the in-process tests). Only before the
/// first call that needs a session; `Err(s)` after.
pub fn set_session(s: Session) -> Result<(), Session> {
    let mut s = Some(s);
    server().session.get_or_init(|| {
        let s = s.take().expect("taken once");
        // SAFETY: registering a function with no preconditions to run at exit.
        unsafe { libc::atexit(leave_at_exit) };
        Ok(s)
    });
    match s {
        None => Ok(()),
        Some(s) => Err(s),
    }
}

/// At exit: this process leaves the session, and the last member to leave frees it (its
/// maps' memory included) unless a map is pinned, as `Session::leave` does for a session
/// value that is dropped (the loader's is static, so never dropped). Runs after the attach
/// module's exit handler (registered later), so the loader's links are gone by then.
extern "C" fn leave_at_exit() {
    let _ = std::panic::catch_unwind(|| {
        if let Some(Ok(s)) = server().session.get() {
            leave(s);
        }
    });
}

fn leave(s: &Session) {
    use std::os::unix::fs::MetadataExt;
    let layout = s.layout();
    let lock_path = layout.lock();
    // The session's lock, as Session takes it: a lock file that is gone means the session
    // was removed meanwhile.
    let Ok(lock) = std::fs::OpenOptions::new().write(true).open(&lock_path) else { return };
    // SAFETY: flock on a descriptor we own; released when `lock` is closed.
    if unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&lock), libc::LOCK_EX) } != 0 {
        return;
    }
    match (lock.metadata(), std::fs::metadata(&lock_path)) {
        (Ok(a), Ok(b)) if a.ino() == b.ino() && a.dev() == b.dev() => {}
        _ => return,
    }
    // Every membership of this process (the loader's, and the agent's in the loader).
    let me = std::process::id();
    let prefix = Layout::member_prefix(me, userbpf_runtime::session::start_time(me).unwrap_or(0));
    if let Ok(rd) = std::fs::read_dir(layout.members_dir()) {
        for e in rd.flatten() {
            if e.file_name().to_string_lossy().starts_with(&prefix) {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
    let alone = s.live_members().is_ok_and(|m| m.is_empty());
    let pinned = s.maps().map_or(true, |m| m.iter().any(|r| r.pinned.is_some()));
    if alone && !pinned {
        // Everything but the lock, the members and the links directory, which agents in
        // this very process may still be watching at exit (the next process to open the
        // session wipes the rest, as it does for any session whose members are gone).
        if let Ok(rd) = std::fs::read_dir(layout.dir()) {
            for e in rd.flatten() {
                if Layout::kept_at_last_exit(&e.file_name()) {
                    continue;
                }
                let p = e.path();
                let _ = if p.is_dir() { std::fs::remove_dir_all(&p) } else { std::fs::remove_file(&p) };
            }
        }
    }
}
