//! Members that dropped privileges: the session's files through a broker.
//!
//! A session's directory (`/dev/shm/userbpf-UID-NAME`, mode 0700, files 0600) is its owner's.
//! A target started as root that later drops root (nginx's workers switching to `user nobody`,
//! su's or runuser's child, any daemon calling `setresuid`/`setgroups`) keeps the files it
//! opened (its maps stay mapped, its inotify watch of `links/` keeps reporting), but can no
//! longer open anything in the session: links, programs and maps added later, its
//! acknowledgement file, its membership. The agent's thread follows the program's credentials
//! (`userbpf_agent::creds`): no userbpf thread keeps root in a process that dropped it. So a
//! process that still has the owner's credentials opens the files for it: the **broker**.
//!
//! **Servers.** Every long-lived userbpf process of the session with the owner's credentials
//! serves (`userbpf start`, `userbpf run`, the loader under `userbpf load`): [`Server::bind`]
//! listens on the abstract unix socket `userbpf-broker-UID-DEV-INO-PID` (UID: the session
//! directory's owner; DEV and INO: the directory's, so a session removed and made anew under
//! its name has other servers; PID: the server's). A client finds them in `/proc/net/unix`.
//! Links are only ever added by such a process (a loader, `userbpf run`), which serves while
//! it lives, so a dropped member always has a server when a link comes; the agent of a target
//! that keeps root (nginx's master) does not serve. A server's thread polls its connections and
//! answers each request with one file operation; it makes its own system calls (no libc
//! `close` or `poll`, which the syscall server wraps in a loader), closes a connection that has
//! not said its hello within 2 s (at most 256 connections), and a client gives up on a server
//! that does not answer within 5 s (the agent then syncs again shortly, a few times).
//!
//! **Clients.** An agent remembers its session while it can still read it ([`remember`], at
//! its start): the session directory, its owner and the session's secret (`secret`, 32 random
//! bytes made with the session directory, mode 0600). The file functions of this module
//! ([`open`], [`read`], [`read_dir_names`], [`rename`], [`remove_file`], [`make_dir`],
//! [`metadata`], [`touch`], [`add_watch`]) are what the session code uses: each does the plain system
//! call, and only when that fails with `EACCES`/`EPERM` on a path inside the remembered session
//! asks a server, which does it with its own credentials inside the session directory and
//! sends the result back (a descriptor through `SCM_RIGHTS`; a watch is added to the client's
//! own inotify descriptor, which it sends along). Map files opened through it
//! (`userbpf_maps::shm::set_open_fallback`) are mapped as any other. Nothing of this is on a
//! probe's path: only syncs (links added or removed), joins and leaves use it.
//!
//! **Who is answered** (the security argument). The broker must not make the session readable
//! by other users: it holds map data (sslsniff's captured plaintext). A connection is answered
//! only when all of these hold:
//! 1. *The server is the owner's.* The client checks the server's `SO_PEERCRED` (fixed when it
//!    called `listen`) is the session owner's uid or root before it sends anything, so a process
//!    of another user squatting a name of the form above learns nothing.
//! 2. *The client knows the secret.* Its first message carries the session's secret, which only
//!    a process with the owner's access to the session directory could read: one that was a
//!    member while it was privileged (or a fork of one, which copies its memory). An `exec`
//!    loses it: a program a dropped member execs (su's shell, a CGI script) is not answered.
//! 3. *The client is a member.* The peer's pid (`SO_PEERCRED`, the kernel's, not the client's
//!    word) with its start time (`/proc/PID/stat`, read by the server after the connection was
//!    made) has a membership record in `members/` — written while the process still had the
//!    owner's credentials, in a directory only they can write — or its parent's has, for a
//!    child forked after the drop (which joins with its own record through the broker). A pid
//!    reused by another process has another start time. So a secret read out of a member's
//!    memory (possible only if that process made itself dumpable again) is of no use to any
//!    other process.
//!
//! **Invited processes.** A process that was another user's before it ever was a member (a
//! daemon running as its own user, which root attaches to) could not read the secret nor write
//! its record. Root's `userbpf attach` [`invite`]s it: writes a membership record for it (its
//! pid and start time, as (3) wants), reads the secret, and hands both the secret and the
//! session's directory to the agent it puts there (the injection's argument, in the process's
//! memory, as a member's own copy is), which [`remember_given`]s them and opens everything
//! through a broker from its first file; `attach` serves until the agent has joined with a
//! record of its own, then removes the invitation's. Nothing else changes: a process only ever
//! becomes a member through one that could read the session.
//!
//! A process of another user that was never a member meets (2) and (3) and gets nothing: the
//! server closes the connection after its first message. Once answered, a member can do in the
//! session directory what it could when it was privileged, no more: paths are relative,
//! resolved with `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)` below
//! the server's descriptor of the session directory; files are created 0600 (the server's, the
//! owner's); no `..`, no symbolic links, nothing outside. The member could read all of it before
//! the drop; it gains access to what is added later, as the kernel's uprobes keep applying to a
//! process that changed its credentials.
//!
//! When no server lives (every privileged userbpf process of the session exited), a dropped
//! member keeps the probes it has; its watch of `links/` still reports removals by name, which
//! the agent applies (links added meanwhile wait for a server).
//!
//! Not served: kernel maps shared with kernel programs (`crate::kernel_map` gives their
//! descriptors to the owner's uid or root only); crash reports (`crate::crash` writes with
//! async-signal-safe calls at the fault); a forked child's own run statistics file
//! (`crate::prog_stats`: its runs add to its parent's). Members are matched by pid as the
//! server's `/proc` sees them: a member in another pid namespace is not answered.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};

use super::Layout;

/// Bytes of the session's secret.
pub const SECRET_LEN: usize = 32;

/// How long a new connection has to say its hello.
const HELLO_WITHIN: std::time::Duration = std::time::Duration::from_secs(2);

/// The largest request or answer (a path, a directory listing is a descriptor).
const MSG_MAX: usize = 8192;

const OP_HELLO: u8 = b'H';
const OP_OPEN: u8 = b'O';
const OP_UNLINK: u8 = b'U';
const OP_RENAME: u8 = b'R';
const OP_MKDIR: u8 = b'M';
const OP_WATCH: u8 = b'W';
const OP_TOUCH: u8 = b'T';

/// The session's secret, made when missing (by a process that can write the directory: the
/// caller holds the session's lock). The file is 0600 in the 0700 directory.
pub(crate) fn ensure_secret(l: &Layout) -> io::Result<()> {
    let path = l.secret();
    if exists(&path) {
        return Ok(());
    }
    let mut s = [0u8; SECRET_LEN];
    fill_random(&mut s)?;
    super::layout::write_atomic(&path, &s)
}

fn fill_random(buf: &mut [u8]) -> io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        // SAFETY: getrandom writes at most the rest of `buf`, which we own.
        let r = unsafe { libc::getrandom(buf[done..].as_mut_ptr().cast(), buf.len() - done, 0) };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        done += r as usize;
    }
    Ok(())
}

fn read_secret(l: &Layout) -> io::Result<[u8; SECRET_LEN]> {
    let data = std::fs::read(l.secret())?;
    data.as_slice()
        .try_into()
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "the session's secret is damaged"))
}

/// The identity of a session directory: its owner, device and inode.
fn identity(dir: &Path) -> io::Result<(u32, u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(dir)?;
    Ok((m.uid(), m.dev(), m.ino()))
}

fn name_prefix(owner: u32, dev: u64, ino: u64) -> String {
    format!("userbpf-broker-{owner}-{dev}-{ino}-")
}

fn abstract_addr(name: &str) -> (libc::sockaddr_un, libc::socklen_t) {
    // SAFETY: a zeroed sockaddr_un is valid.
    let mut a: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    a.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = name.as_bytes();
    let n = bytes.len().min(a.sun_path.len() - 1);
    for (i, b) in bytes[..n].iter().enumerate() {
        a.sun_path[i + 1] = *b as libc::c_char;
    }
    let len = std::mem::size_of::<libc::sa_family_t>() + 1 + n;
    (a, len as libc::socklen_t)
}

fn seqpacket() -> io::Result<OwnedFd> {
    // SAFETY: socket has no memory effects; the descriptor is owned below.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The peer's credentials as the kernel fixed them at connect (`SO_PEERCRED`).
pub(crate) fn peer_cred(fd: RawFd) -> io::Result<libc::ucred> {
    let mut cred = libc::ucred { pid: 0, uid: 0, gid: 0 };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `cred`, which we own.
    let r = unsafe { libc::getsockopt(fd, libc::SOL_SOCKET, libc::SO_PEERCRED, (&raw mut cred).cast(), &mut len) };
    if r != 0 { Err(io::Error::last_os_error()) } else { Ok(cred) }
}

/// Sends one message, with descriptor `pass` riding along if given (`SCM_RIGHTS`).
pub(crate) fn send(fd: RawFd, data: &[u8], pass: Option<RawFd>) -> io::Result<()> {
    let mut iov = libc::iovec { iov_base: data.as_ptr() as *mut libc::c_void, iov_len: data.len() };
    let mut cbuf = [0u64; 4];
    // SAFETY: a zeroed msghdr is valid; its pointers are set to live buffers below.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if let Some(p) = pass {
        msg.msg_control = cbuf.as_mut_ptr().cast();
        // SAFETY: CMSG_SPACE is a pure computation.
        msg.msg_controllen = unsafe { libc::CMSG_SPACE(4) } as usize;
        // SAFETY: the control buffer (32 bytes) holds one header with a 4-byte payload;
        // CMSG_FIRSTHDR and CMSG_DATA point inside it.
        unsafe {
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(4) as usize;
            std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<i32>(), p);
        }
    }
    loop {
        // SAFETY: `msg` points to live buffers for the call's duration.
        let r = unsafe { libc::sendmsg(fd, &msg, libc::MSG_NOSIGNAL) };
        if r >= 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Receives one message into `buf`: its length (0: the peer closed) and the descriptor that
/// came with it, if any.
pub(crate) fn recv(fd: RawFd, buf: &mut [u8]) -> io::Result<(usize, Option<OwnedFd>)> {
    let mut iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
    let mut cbuf = [0u64; 8];
    loop {
        // SAFETY: a zeroed msghdr is valid; its pointers are set to live buffers below.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cbuf.as_mut_ptr().cast();
        msg.msg_controllen = std::mem::size_of_val(&cbuf);
        // SAFETY: `msg` points to live buffers of the sizes given.
        let r = unsafe { libc::recvmsg(fd, &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        let mut got = None;
        // SAFETY: walking the control messages the kernel wrote into `cbuf`, as `msg` says.
        unsafe {
            let mut c = libc::CMSG_FIRSTHDR(&msg);
            while !c.is_null() {
                if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                    let n = ((*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize) / 4;
                    for i in 0..n {
                        let fd = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<i32>().add(i));
                        // Descriptors beyond the first are not part of the protocol: closed.
                        let owned = OwnedFd::from_raw_fd(fd);
                        if got.is_none() {
                            got = Some(owned);
                        }
                    }
                }
                c = libc::CMSG_NXTHDR(&msg, c);
            }
        }
        return Ok((r as usize, got));
    }
}

// ---- the server ----

/// A descriptor of the server's, closed by the system call itself: in a loader under
/// `userbpf load`, libc's `close` and `poll` are the syscall server's, which look at the
/// loader's objects (and their locks) first; the broker stays out of them.
struct Fd(RawFd);

impl Fd {
    fn from_owned(f: OwnedFd) -> Fd {
        Fd(std::os::fd::IntoRawFd::into_raw_fd(f))
    }
}

impl AsRawFd for Fd {
    fn as_raw_fd(&self) -> RawFd {
        self.0
    }
}

impl Drop for Fd {
    fn drop(&mut self) {
        // SAFETY: closing the descriptor this value owns.
        unsafe { libc::syscall(libc::SYS_close, self.0) };
    }
}

/// `/proc/PID/stat`, read with system calls only (see [`Fd`]).
fn proc_stat(pid: u32) -> Option<String> {
    let path = CString::new(format!("/proc/{pid}/stat")).ok()?;
    // SAFETY: a NUL-terminated path; the descriptor is owned below.
    let fd =
        unsafe { libc::syscall(libc::SYS_openat, libc::AT_FDCWD, path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
    if fd < 0 {
        return None;
    }
    let fd = Fd(fd as RawFd);
    let mut buf = vec![0u8; 4096];
    let mut len = 0;
    while len < buf.len() {
        // SAFETY: reading into the rest of a buffer we own.
        let n = unsafe { libc::syscall(libc::SYS_read, fd.0, buf[len..].as_mut_ptr(), buf.len() - len) };
        if n <= 0 {
            break;
        }
        len += n as usize;
    }
    buf.truncate(len);
    String::from_utf8(buf).ok()
}

/// Fields 4 (parent) and 22 (start time) of `/proc/PID/stat`.
fn parent_and_start(pid: u32) -> Option<(u32, u64)> {
    let stat = proc_stat(pid)?;
    let rest: Vec<&str> = stat[stat.rfind(')')? + 2..].split(' ').collect();
    Some((rest.get(1)?.parse().ok()?, rest.get(19)?.parse().ok()?))
}

/// A broker listening for a session's members (see the module's documentation).
pub struct Server {
    listener: Fd,
    /// The session directory (`O_PATH`), what every path is resolved beneath.
    dir: Fd,
    secret: [u8; SECRET_LEN],
}

impl Server {
    /// Listens for the members of the session in `dir` (a process with the owner's credentials;
    /// the session's secret made if missing). [`Server::run`] answers them.
    pub fn bind(dir: &Path) -> io::Result<Server> {
        let layout = Layout::new(dir);
        let secret = match read_secret(&layout) {
            Ok(s) => s,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                ensure_secret(&layout)?;
                read_secret(&layout)?
            }
            Err(e) => return Err(e),
        };
        let (owner, dev, ino) = identity(dir)?;
        let c = CString::new(dir.as_os_str().as_bytes()).map_err(|_| io::Error::other("NUL in the session path"))?;
        // SAFETY: a NUL-terminated path; the descriptor is owned below.
        let dfd = unsafe { libc::open(c.as_ptr(), libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC) };
        if dfd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a fresh descriptor owned by nothing else.
        let dir_fd = Fd(dfd);
        let listener = Fd::from_owned(seqpacket()?);
        let name = format!("{}{}", name_prefix(owner, dev, ino), std::process::id());
        let (addr, len) = abstract_addr(&name);
        // SAFETY: binding our socket to an address of `len` bytes in a local.
        if unsafe { libc::bind(listener.as_raw_fd(), (&raw const addr).cast(), len) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: listen on our socket.
        if unsafe { libc::listen(listener.as_raw_fd(), 16) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Server { listener, dir: dir_fd, secret })
    }

    /// Answers members until the process exits: one thread, polling the listener and every
    /// connection (requests are a single file operation each). A connection that has not said
    /// its hello within `HELLO_WITHIN` (2 s) is closed, so connections left open by others cannot
    /// fill the server's table (at most 256).
    pub fn run(self) {
        // Each connection: its descriptor, whether it was admitted, when it was accepted.
        let mut conns: Vec<(Fd, bool, std::time::Instant)> = Vec::new();
        let mut buf = vec![0u8; MSG_MAX];
        loop {
            let mut pfds: Vec<libc::pollfd> = std::iter::once(self.listener.as_raw_fd())
                .chain(conns.iter().map(|(c, _, _)| c.as_raw_fd()))
                .map(|fd| libc::pollfd { fd, events: libc::POLLIN, revents: 0 })
                .collect();
            // Woken for the first hello that would be late.
            let timeout = conns
                .iter()
                .filter(|(_, authed, _)| !authed)
                .map(|(_, _, at)| HELLO_WITHIN.saturating_sub(at.elapsed()).as_millis() as i32 + 1)
                .min()
                .unwrap_or(-1);
            // SAFETY: polling descriptors we own, `pfds.len()` entries.
            let n = unsafe { libc::syscall(libc::SYS_poll, pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, timeout) };
            if n < 0 {
                if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return;
            }
            let mut closed = Vec::new();
            for (i, p) in pfds.iter().enumerate().skip(1) {
                if p.revents == 0 {
                    continue;
                }
                let (conn, authed, _) = &mut conns[i - 1];
                let keep = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    self.answer(conn.as_raw_fd(), authed, &mut buf)
                }))
                .unwrap_or(false);
                if !keep {
                    closed.push(i - 1);
                }
            }
            for (i, (_, authed, at)) in conns.iter().enumerate() {
                if !authed && at.elapsed() >= HELLO_WITHIN && !closed.contains(&i) {
                    closed.push(i);
                }
            }
            closed.sort_unstable();
            for i in closed.into_iter().rev() {
                conns.remove(i);
            }
            if pfds[0].revents & libc::POLLIN != 0 {
                // SAFETY: accept on our listener; the descriptor is owned below.
                let c = unsafe {
                    libc::accept4(
                        self.listener.as_raw_fd(),
                        std::ptr::null_mut(),
                        std::ptr::null_mut(),
                        libc::SOCK_CLOEXEC,
                    )
                };
                if c >= 0 && conns.len() < 256 {
                    // SAFETY: a fresh descriptor owned by nothing else.
                    conns.push((Fd(c), false, std::time::Instant::now()));
                } else if c >= 0 {
                    // Too many clients: refused.
                    drop(Fd(c));
                }
            }
        }
    }

    /// Reads and answers one request on `conn`; false: close the connection.
    fn answer(&self, conn: RawFd, authed: &mut bool, buf: &mut [u8]) -> bool {
        let Ok((n, passed)) = recv(conn, buf) else { return false };
        let passed = passed.map(Fd::from_owned);
        if n == 0 {
            return false;
        }
        let req = &buf[..n];
        if !*authed {
            // The first message is the hello; anything else, or a refusal, ends the connection.
            if req[0] != OP_HELLO || !self.admits(conn, &req[1..]) {
                return false;
            }
            *authed = true;
            return send(conn, &0i32.to_ne_bytes(), None).is_ok();
        }
        let (errno, value, fd) = match self.op(req, passed) {
            Ok((v, fd)) => (0, v, fd),
            Err(e) => (e.raw_os_error().unwrap_or(libc::EIO), 0, None),
        };
        let mut out = [0u8; 8];
        out[..4].copy_from_slice(&errno.to_ne_bytes());
        out[4..].copy_from_slice(&value.to_ne_bytes());
        send(conn, &out, fd.as_ref().map(|f| f.as_raw_fd())).is_ok()
    }

    /// Whether the peer of `conn`, which sent `secret`, is answered (see the module's
    /// documentation: the secret, and a membership of the process or of its parent).
    fn admits(&self, conn: RawFd, secret: &[u8]) -> bool {
        if secret.len() != SECRET_LEN {
            return false;
        }
        // Constant time: no early exit on the first differing byte.
        let diff = secret.iter().zip(self.secret.iter()).fold(0u8, |d, (a, b)| d | (a ^ b));
        if diff != 0 {
            return false;
        }
        let Ok(cred) = peer_cred(conn) else { return false };
        let pid = cred.pid as u32;
        if pid == 0 {
            return false;
        }
        if self.is_member(pid) {
            return true;
        }
        // A child forked after its parent dropped privileges: its parent's membership.
        parent_and_start(pid).is_some_and(|(pp, _)| pp != 0 && self.is_member(pp))
    }

    /// Whether process `pid` (as it is now: its start time) holds a membership record.
    fn is_member(&self, pid: u32) -> bool {
        let Some((_, start)) = parent_and_start(pid) else { return false };
        let prefix = Layout::member_prefix(pid, start);
        let Ok(dir) = self.open_beneath(c"members", libc::O_RDONLY | libc::O_DIRECTORY, 0) else { return false };
        dir_names(dir.as_raw_fd()).is_ok_and(|names| names.iter().any(|n| n.starts_with(&prefix)))
    }

    /// One request of an admitted member: `(value, descriptor)` or the errno.
    fn op(&self, req: &[u8], passed: Option<Fd>) -> io::Result<(u32, Option<Fd>)> {
        let word = |at: usize| -> io::Result<u32> {
            req.get(at..at + 4)
                .and_then(|b| b.try_into().ok())
                .map(u32::from_ne_bytes)
                .ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))
        };
        match req[0] {
            OP_OPEN => {
                let (flags, mode) = (word(1)? as i32, word(5)?);
                let path = rel_path(&req[9..])?;
                let fd = self.open_beneath(&path, flags, mode)?;
                Ok((0, Some(fd)))
            }
            OP_UNLINK => {
                let (parent, name) = self.parent_of(&req[1..])?;
                // SAFETY: a directory descriptor we own and a NUL-terminated name.
                cvt(unsafe { libc::unlinkat(parent.as_raw_fd(), name.as_ptr(), 0) })?;
                Ok((0, None))
            }
            OP_MKDIR => {
                let (parent, name) = self.parent_of(&req[1..])?;
                // SAFETY: as for unlink.
                cvt(unsafe { libc::mkdirat(parent.as_raw_fd(), name.as_ptr(), 0o700) })?;
                Ok((0, None))
            }
            OP_TOUCH => {
                let (parent, name) = self.parent_of(&req[1..])?;
                // SAFETY: a directory descriptor we own, a NUL-terminated name, NULL times (now).
                cvt(unsafe {
                    libc::utimensat(parent.as_raw_fd(), name.as_ptr(), std::ptr::null(), libc::AT_SYMLINK_NOFOLLOW)
                })?;
                Ok((0, None))
            }
            OP_RENAME => {
                let body = &req[1..];
                let split =
                    body.iter().position(|&b| b == 0).ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))?;
                let (from_dir, from) = self.parent_of(&body[..split])?;
                let (to_dir, to) = self.parent_of(&body[split + 1..])?;
                // SAFETY: directory descriptors we own and NUL-terminated names.
                cvt(unsafe { libc::renameat(from_dir.as_raw_fd(), from.as_ptr(), to_dir.as_raw_fd(), to.as_ptr()) })?;
                Ok((0, None))
            }
            OP_WATCH => {
                let mask = word(1)? & (libc::IN_ALL_EVENTS | libc::IN_ONLYDIR | libc::IN_EXCL_UNLINK);
                let path = rel_path(&req[5..])?;
                let inotify = passed.ok_or_else(|| io::Error::from_raw_os_error(libc::EBADF))?;
                // The watch is added on the member's own inotify descriptor, to a directory
                // opened beneath the session's (`/proc/self/fd/N` names exactly that one).
                let target = self.open_beneath(&path, libc::O_PATH | libc::O_DIRECTORY, 0)?;
                let proc_path = CString::new(format!("/proc/self/fd/{}", target.as_raw_fd())).unwrap_or_default();
                // SAFETY: an inotify descriptor we were given and a NUL-terminated path.
                let wd = unsafe { libc::inotify_add_watch(inotify.as_raw_fd(), proc_path.as_ptr(), mask) };
                cvt(wd)?;
                Ok((wd as u32, None))
            }
            _ => Err(io::Error::from_raw_os_error(libc::EINVAL)),
        }
    }

    /// Opens `path` (checked relative) beneath the session directory, never through a link.
    fn open_beneath(&self, path: &std::ffi::CStr, flags: i32, mode: u32) -> io::Result<Fd> {
        let allowed = libc::O_ACCMODE
            | libc::O_CREAT
            | libc::O_EXCL
            | libc::O_TRUNC
            | libc::O_APPEND
            | libc::O_DIRECTORY
            | libc::O_NOFOLLOW
            | libc::O_PATH
            | libc::O_NONBLOCK;
        #[repr(C)]
        struct OpenHow {
            flags: u64,
            mode: u64,
            resolve: u64,
        }
        const RESOLVE_NO_MAGICLINKS: u64 = 0x02;
        const RESOLVE_NO_SYMLINKS: u64 = 0x04;
        const RESOLVE_BENEATH: u64 = 0x08;
        let mut flags = (flags & allowed) | libc::O_CLOEXEC;
        if flags & libc::O_PATH != 0 {
            // What openat2 takes with O_PATH (it refuses any other flag).
            flags &= libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC;
        } else {
            flags |= libc::O_NOCTTY;
        }
        let how = OpenHow {
            flags: flags as u32 as u64,
            mode: if flags & libc::O_CREAT != 0 { (mode & 0o600) as u64 } else { 0 },
            resolve: RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS,
        };
        // SAFETY: openat2 with our directory descriptor, a NUL-terminated path and a local
        // `open_how` of the size given.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_openat2,
                self.dir.as_raw_fd(),
                path.as_ptr(),
                &how as *const OpenHow,
                std::mem::size_of::<OpenHow>(),
            )
        } as i32;
        cvt(fd)?;
        Ok(Fd(fd))
    }

    /// The directory holding relative path `p` (opened beneath the session's) and its last
    /// component.
    fn parent_of(&self, p: &[u8]) -> io::Result<(Fd, CString)> {
        let path = rel_path(p)?;
        let bytes = path.as_bytes();
        let (dir, name) = match bytes.iter().rposition(|&b| b == b'/') {
            Some(i) => (&bytes[..i], &bytes[i + 1..]),
            None => (&b"."[..], bytes),
        };
        let dir = CString::new(dir).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        let fd = self.open_beneath(&dir, libc::O_PATH | libc::O_DIRECTORY, 0)?;
        Ok((fd, CString::new(name).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?))
    }
}

/// A relative path of plain components (no `/` at either end, no `.`, `..` or empty part).
fn rel_path(p: &[u8]) -> io::Result<CString> {
    let bad = || io::Error::from_raw_os_error(libc::EINVAL);
    if p.is_empty() || p.len() > 1024 || p.contains(&0) {
        return Err(bad());
    }
    if p.split(|&b| b == b'/').any(|c| c.is_empty() || c == b"." || c == b"..") {
        return Err(bad());
    }
    CString::new(p).map_err(|_| bad())
}

fn cvt(r: i32) -> io::Result<i32> {
    if r < 0 { Err(io::Error::last_os_error()) } else { Ok(r) }
}

/// Starts a broker for the session in `dir` on a thread of its own (`userbpf start`, `run`,
/// the loader): see [`Server`]. Once per session directory per process; an error (the
/// directory unreadable, no socket) is returned, and the caller goes on without one.
pub fn serve(dir: &Path, spawn: impl FnOnce(Box<dyn FnOnce() + Send>) -> io::Result<()>) -> io::Result<()> {
    static SERVING: Mutex<Vec<(u64, u64)>> = Mutex::new(Vec::new());
    let (_, dev, ino) = identity(dir)?;
    let mut serving = SERVING.lock().unwrap_or_else(|e| e.into_inner());
    if serving.contains(&(dev, ino)) {
        return Ok(());
    }
    let server = Server::bind(dir)?;
    spawn(Box::new(move || server.run()))?;
    serving.push((dev, ino));
    Ok(())
}

// ---- the client ----

/// What a member remembers of its session while it can read it (see [`remember`]).
struct Client {
    dir: PathBuf,
    owner: u32,
    dev: u64,
    ino: u64,
    secret: [u8; SECRET_LEN],
    /// The connection: its descriptor, the thread whose descriptor table holds it, and its
    /// inode (a table that is gone takes the descriptor with it; its number may then name
    /// another file of a thread that got the same id).
    conn: Mutex<Option<Conn>>,
}

#[derive(Clone, Copy)]
struct Conn {
    fd: RawFd,
    tid: i32,
    ino: u64,
    /// The process that made it (a forked child makes its own: the server admits it as its
    /// own pid).
    pid: u32,
}

static CLIENT: RwLock<Option<Arc<Client>>> = RwLock::new(None);

/// Remembers the session in `dir` (call while the process can read it: an agent at its
/// start): from now on the file functions of this module ask a broker for what this process
/// may no longer open there. Also makes map files open through it.
pub fn remember(dir: &Path) -> io::Result<()> {
    let layout = Layout::new(dir);
    let secret = match read_secret(&layout) {
        Ok(s) => s,
        // A process that never could read the session (the agent put into another user's
        // process, which was given the secret: see `remember_given`) keeps what it was given.
        Err(e) if matches!(e.raw_os_error(), Some(libc::EACCES | libc::EPERM)) && remembers(dir) => return Ok(()),
        Err(e) => return Err(e),
    };
    remember_given(dir, secret)
}

/// Remembers the session in `dir` with its secret given by who put the agent into this
/// process (`userbpf attach` of a process of another user, which never could read the
/// session: see [`invite`]); otherwise as [`remember`].
pub fn remember_given(dir: &Path, secret: [u8; SECRET_LEN]) -> io::Result<()> {
    let (owner, dev, ino) = identity(dir)?;
    let c = Client { dir: dir.to_path_buf(), owner, dev, ino, secret, conn: Mutex::new(None) };
    *CLIENT.write().unwrap_or_else(|e| e.into_inner()) = Some(Arc::new(c));
    userbpf_maps::shm::set_open_fallback(map_fallback);
    Ok(())
}

/// Whether the session directory `dir` (as it is now) is the one remembered.
fn remembers(dir: &Path) -> bool {
    let Ok((_, dev, ino)) = identity(dir) else { return false };
    CLIENT.read().unwrap_or_else(|e| e.into_inner()).as_ref().is_some_and(|c| c.dev == dev && c.ino == ino)
}

/// The handle of an invitation's membership record (see [`invite`]); a process's own records
/// count their handles up from 0.
pub const INVITE_HANDLE: u32 = u32::MAX;

/// Invites process `pid`, which cannot read the session in `l` (another user's, never a
/// member), before the agent is put into it (`userbpf attach`, with the owner's credentials):
/// writes a membership record for it (as it is now: its start time), so that a broker answers
/// it, and returns the session's secret, which the caller hands to the agent it puts there
/// ([`remember_given`]) and the record's path, which the caller removes once the agent has
/// joined with a record of its own (or failed to). The security argument of the module holds:
/// the process is made a member by a process that could read the session, as a member that
/// dropped privileges was while it had them.
pub fn invite(l: &Layout, pid: u32) -> io::Result<([u8; SECRET_LEN], PathBuf)> {
    let start = super::start_time(pid).ok_or_else(|| io::Error::from_raw_os_error(libc::ESRCH))?;
    let secret = read_secret(l)?;
    let record = l.member(pid, start, INVITE_HANDLE);
    super::layout::write_atomic(&record, b"")?;
    Ok((secret, record))
}

/// Forgets the session (the agent left it).
pub fn forget() {
    *CLIENT.write().unwrap_or_else(|e| e.into_inner()) = None;
}

fn map_fallback(path: &Path, flags: i32, mode: u32) -> io::Result<OwnedFd> {
    broker_open(path, flags, mode)
}

/// The remembered session, when `path` lies inside it: the client and the relative path.
fn client_for(path: &Path) -> Option<(Arc<Client>, Vec<u8>)> {
    let c = CLIENT.read().unwrap_or_else(|e| e.into_inner()).clone()?;
    let rel = path.strip_prefix(&c.dir).ok()?.as_os_str().as_bytes().to_vec();
    (!rel.is_empty()).then_some((c, rel))
}

fn gettid() -> i32 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() }
}

fn inode_of(fd: RawFd) -> Option<u64> {
    // SAFETY: a zeroed stat is valid; fstat writes it.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat into a local.
    (unsafe { libc::fstat(fd, &mut st) } == 0).then_some(st.st_ino)
}

impl Client {
    /// The servers listening for this session now (`/proc/net/unix`).
    fn servers(&self) -> Vec<String> {
        let prefix = format!("@{}", name_prefix(self.owner, self.dev, self.ino));
        let Ok(text) = std::fs::read_to_string("/proc/net/unix") else { return Vec::new() };
        text.lines()
            .filter_map(|l| l.split_whitespace().nth(7))
            .filter(|n| n.starts_with(&prefix))
            .map(|n| n[1..].to_string())
            .collect()
    }

    /// A new, admitted connection to a server of the session.
    fn connect(&self) -> io::Result<OwnedFd> {
        let mut last = io::Error::from_raw_os_error(libc::EACCES);
        for name in self.servers() {
            let s = seqpacket()?;
            let (addr, len) = abstract_addr(&name);
            // SAFETY: connecting our socket to an address of `len` bytes in a local.
            if unsafe { libc::connect(s.as_raw_fd(), (&raw const addr).cast(), len) } != 0 {
                last = io::Error::last_os_error();
                continue;
            }
            // The server must be the owner's (or root's) before it sees the secret.
            match peer_cred(s.as_raw_fd()) {
                Ok(c) if c.uid == self.owner || c.uid == 0 => {}
                _ => continue,
            }
            // A server that stopped answering (its process stopped, say) fails the request
            // instead of holding the agent's thread.
            let limit = libc::timeval { tv_sec: 5, tv_usec: 0 };
            for opt in [libc::SO_RCVTIMEO, libc::SO_SNDTIMEO] {
                // SAFETY: setsockopt on our socket with a local timeval of the size given.
                unsafe {
                    libc::setsockopt(
                        s.as_raw_fd(),
                        libc::SOL_SOCKET,
                        opt,
                        (&raw const limit).cast(),
                        std::mem::size_of::<libc::timeval>() as libc::socklen_t,
                    )
                };
            }
            let mut hello = Vec::with_capacity(1 + SECRET_LEN);
            hello.push(OP_HELLO);
            hello.extend_from_slice(&self.secret);
            if send(s.as_raw_fd(), &hello, None).is_err() {
                continue;
            }
            let mut buf = [0u8; 8];
            match recv(s.as_raw_fd(), &mut buf) {
                Ok((4, _)) if i32::from_ne_bytes([buf[0], buf[1], buf[2], buf[3]]) == 0 => return Ok(s),
                _ => last = io::Error::from_raw_os_error(libc::EACCES),
            }
        }
        Err(last)
    }

    /// One request; its answer: `(value, descriptor)`.
    fn call(&self, req: &[u8], pass: Option<RawFd>) -> io::Result<(u32, Option<OwnedFd>)> {
        let tid = gettid();
        let mut guard = self.conn.lock().unwrap_or_else(|e| e.into_inner());
        if guard.is_some_and(|c| c.pid != std::process::id()) {
            // The parent's, copied by fork: its descriptor is in a table the child's agent
            // thread does not have; forgotten, not closed.
            *guard = None;
        }
        for attempt in 0..2 {
            // A connection of this thread's table, still the socket it was; else a new one,
            // kept when none is (the agent's thread makes nearly every call), else closed
            // after this call (a connection in another thread's table is left alone: its
            // number means nothing here).
            let cached = guard.filter(|c| c.tid == tid && inode_of(c.fd) == Some(c.ino));
            let (fd, temporary) = match cached {
                Some(c) => (c.fd, None),
                None => {
                    let s = self.connect()?;
                    if guard.is_none() {
                        let fd = std::os::fd::IntoRawFd::into_raw_fd(s);
                        *guard = Some(Conn { fd, tid, ino: inode_of(fd).unwrap_or(0), pid: std::process::id() });
                        (fd, None)
                    } else {
                        (s.as_raw_fd(), Some(s))
                    }
                }
            };
            let r = exchange(fd, req, pass);
            drop(temporary);
            match r {
                Ok(Ok(v)) => return Ok(v),
                Ok(Err(errno)) => return Err(io::Error::from_raw_os_error(errno)),
                Err(e) => {
                    // The server went away: this connection goes, another server is asked once.
                    if let Some(c) = *guard
                        && c.fd == fd
                        && c.tid == tid
                    {
                        // SAFETY: this thread's descriptor, the broken connection.
                        unsafe { libc::close(fd) };
                        *guard = None;
                    }
                    if attempt > 0 {
                        return Err(e);
                    }
                }
            }
        }
        Err(io::Error::from_raw_os_error(libc::ECONNRESET))
    }
}

/// Sends a request on connection `fd` and reads its answer: the server's `Ok(value,
/// descriptor)` or `Err(errno)`; the outer error is the connection's.
fn exchange(fd: RawFd, req: &[u8], pass: Option<RawFd>) -> io::Result<Result<(u32, Option<OwnedFd>), i32>> {
    send(fd, req, pass)?;
    let mut buf = [0u8; 8];
    match recv(fd, &mut buf)? {
        (8, got) => {
            let errno = i32::from_ne_bytes([buf[0], buf[1], buf[2], buf[3]]);
            if errno != 0 {
                return Ok(Err(errno));
            }
            Ok(Ok((u32::from_ne_bytes([buf[4], buf[5], buf[6], buf[7]]), got)))
        }
        _ => Err(io::Error::from_raw_os_error(libc::ECONNRESET)),
    }
}

fn denied(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EACCES) | Some(libc::EPERM))
}

/// Opens `path` through a broker (see the module's documentation).
fn broker_open(path: &Path, flags: i32, mode: u32) -> io::Result<OwnedFd> {
    let Some((c, rel)) = client_for(path) else { return Err(io::Error::from_raw_os_error(libc::EACCES)) };
    let mut req = Vec::with_capacity(9 + rel.len());
    req.push(OP_OPEN);
    req.extend_from_slice(&flags.to_ne_bytes());
    req.extend_from_slice(&mode.to_ne_bytes());
    req.extend_from_slice(&rel);
    match c.call(&req, None)? {
        (_, Some(fd)) => Ok(fd),
        (_, None) => Err(io::Error::from_raw_os_error(libc::EPROTO)),
    }
}

fn broker_path_op(op: u8, paths: &[&Path], pass: Option<RawFd>, word: Option<u32>) -> io::Result<u32> {
    let mut req = vec![op];
    if let Some(w) = word {
        req.extend_from_slice(&w.to_ne_bytes());
    }
    let mut client = None;
    for (i, p) in paths.iter().enumerate() {
        let Some((c, rel)) = client_for(p) else { return Err(io::Error::from_raw_os_error(libc::EACCES)) };
        if i > 0 {
            req.push(0);
        }
        req.extend_from_slice(&rel);
        client = Some(c);
    }
    let c = client.ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))?;
    c.call(&req, pass).map(|(v, _)| v)
}

// ---- the session's file functions ----

/// `open(2)` of `path` (`O_CLOEXEC` added), through a broker when this process may not.
pub fn open(path: &Path, flags: i32, mode: u32) -> io::Result<OwnedFd> {
    let c = CString::new(path.as_os_str().as_bytes()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: a NUL-terminated path; the descriptor is owned below.
    let fd = unsafe { libc::open(c.as_ptr(), flags | libc::O_CLOEXEC, mode as libc::c_uint) };
    if fd >= 0 {
        // SAFETY: a fresh descriptor owned by nothing else.
        return Ok(unsafe { OwnedFd::from_raw_fd(fd) });
    }
    let e = io::Error::last_os_error();
    if denied(&e) && client_for(path).is_some() {
        return broker_open(path, flags, mode);
    }
    Err(e)
}

/// The whole file.
pub fn read(path: &Path) -> io::Result<Vec<u8>> {
    match std::fs::read(path) {
        Err(e) if denied(&e) && client_for(path).is_some() => {
            use std::io::Read;
            let mut v = Vec::new();
            std::fs::File::from(broker_open(path, libc::O_RDONLY, 0)?).read_to_end(&mut v)?;
            Ok(v)
        }
        r => r,
    }
}

/// The whole file, as UTF-8.
pub fn read_to_string(path: &Path) -> io::Result<String> {
    String::from_utf8(read(path)?).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// The names in directory `path` (`.` and `..` left out; names that are not UTF-8 too).
pub fn read_dir_names(path: &Path) -> io::Result<Vec<String>> {
    match std::fs::read_dir(path) {
        Ok(rd) => Ok(rd.flatten().filter_map(|e| e.file_name().into_string().ok()).collect()),
        Err(e) if denied(&e) && client_for(path).is_some() => {
            let fd = broker_open(path, libc::O_RDONLY | libc::O_DIRECTORY, 0)?;
            dir_names(fd.as_raw_fd())
        }
        Err(e) => Err(e),
    }
}

/// The names a directory descriptor lists (`getdents64`).
fn dir_names(fd: RawFd) -> io::Result<Vec<String>> {
    let mut names = Vec::new();
    let mut buf = vec![0u8; 16384];
    loop {
        // SAFETY: getdents64 into a buffer we own, of its length.
        let n = unsafe { libc::syscall(libc::SYS_getdents64, fd, buf.as_mut_ptr(), buf.len()) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        if n == 0 {
            return Ok(names);
        }
        let mut off = 0usize;
        while off + 19 <= n as usize {
            let reclen = u16::from_ne_bytes([buf[off + 16], buf[off + 17]]) as usize;
            if reclen == 0 {
                break;
            }
            let raw = &buf[off + 19..(off + reclen).min(n as usize)];
            let name = &raw[..raw.iter().position(|&b| b == 0).unwrap_or(raw.len())];
            if name != b"."
                && name != b".."
                && let Ok(s) = std::str::from_utf8(name)
            {
                names.push(s.to_string());
            }
            off += reclen;
        }
    }
}

/// Removes a file.
pub fn remove_file(path: &Path) -> io::Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if denied(&e) && client_for(path).is_some() => broker_path_op(OP_UNLINK, &[path], None, None).map(drop),
        r => r,
    }
}

/// Sets a file's times to now (`utimensat` with no times: an inotify `IN_ATTRIB`).
pub fn touch(path: &Path) -> io::Result<()> {
    let c = CString::new(path.as_os_str().as_bytes()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: a NUL-terminated path; NULL times: now.
    if unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), std::ptr::null(), 0) } == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    if denied(&e) && client_for(path).is_some() {
        return broker_path_op(OP_TOUCH, &[path], None, None).map(drop);
    }
    Err(e)
}

/// Renames a file (both paths in the session).
pub fn rename(from: &Path, to: &Path) -> io::Result<()> {
    match std::fs::rename(from, to) {
        Err(e) if denied(&e) && client_for(from).is_some() && client_for(to).is_some() => {
            broker_path_op(OP_RENAME, &[from, to], None, None).map(drop)
        }
        r => r,
    }
}

/// Makes directory `dir` (and its parents) with mode 0700 if missing.
pub fn make_dir(dir: &Path) -> io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    match std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir) {
        Err(e) if denied(&e) && client_for(dir).is_some() => match broker_path_op(OP_MKDIR, &[dir], None, None) {
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => Ok(()),
            r => r.map(drop),
        },
        r => r,
    }
}

/// The metadata of `path` (following no link at its end when asked through a broker).
pub fn metadata(path: &Path) -> io::Result<std::fs::Metadata> {
    match std::fs::metadata(path) {
        Err(e) if denied(&e) && client_for(path).is_some() => {
            std::fs::File::from(broker_open(path, libc::O_PATH, 0)?).metadata()
        }
        r => r,
    }
}

/// Whether `path` exists (as `Path::exists`, through a broker when this process may not look).
pub fn exists(path: &Path) -> bool {
    metadata(path).is_ok()
}

/// `inotify_add_watch(fd, path, mask)`, through a broker when this process may not read the
/// directory (the watch goes on `fd` all the same).
pub fn add_watch(fd: RawFd, path: &Path, mask: u32) -> io::Result<i32> {
    let c = CString::new(path.as_os_str().as_bytes()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: our inotify descriptor and a NUL-terminated path.
    let wd = unsafe { libc::inotify_add_watch(fd, c.as_ptr(), mask) };
    if wd >= 0 {
        return Ok(wd);
    }
    let e = io::Error::last_os_error();
    if denied(&e) && client_for(path).is_some() {
        return broker_path_op(OP_WATCH, &[path], Some(fd), Some(mask)).map(|w| w as i32);
    }
    Err(e)
}

/// Asks the servers of the session in `dir` for nothing but admission, with `secret` (tests:
/// what a process that is not a member gets). True: some server answered it.
pub fn admitted_with(dir: &Path, secret: [u8; SECRET_LEN]) -> io::Result<bool> {
    let (owner, dev, ino) = identity(dir)?;
    let c = Client { dir: dir.to_path_buf(), owner, dev, ino, secret, conn: Mutex::new(None) };
    if c.servers().is_empty() {
        return Err(io::Error::from_raw_os_error(libc::ENOENT));
    }
    match c.connect() {
        Ok(_) => Ok(true),
        Err(e) if e.raw_os_error() == Some(libc::EACCES) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Whether a broker serves the session in `dir` now.
pub fn served(dir: &Path) -> bool {
    identity(dir).is_ok_and(|(owner, dev, ino)| {
        Client { dir: dir.to_path_buf(), owner, dev, ino, secret: [0; SECRET_LEN], conn: Mutex::new(None) }
            .servers()
            .into_iter()
            .next()
            .is_some()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A session of this process in a directory of its own, served by a broker thread.
    fn served_session(name: &str) -> crate::Session {
        let root = std::env::temp_dir().join(format!("userbpf-broker-unit-{}", std::process::id()));
        std::fs::create_dir_all(&root).unwrap();
        let s = crate::Session::open_in(&root, name).unwrap();
        serve(s.dir(), |f| std::thread::Builder::new().spawn(f).map(drop)).unwrap();
        s
    }

    #[test]
    fn relative_paths_only() {
        for bad in ["", "/etc/passwd", "../x", "a/../b", "a//b", "./a", "a/", "a/.", "a\0b"] {
            assert!(rel_path(bad.as_bytes()).is_err(), "{bad:?}");
        }
        for good in ["links", "links/3.json", "maps/12", "agents/5.77"] {
            assert!(rel_path(good.as_bytes()).is_ok(), "{good:?}");
        }
    }

    #[test]
    fn a_member_with_the_secret_is_answered_inside_the_session_only() {
        let s = served_session("answered");
        let dir = s.dir().to_path_buf();
        assert!(served(&dir));
        std::fs::write(s.layout().links_dir().join("9.json"), b"{}").unwrap();
        // Outside the session, through a link: refused by the server.
        std::os::unix::fs::symlink("/etc/passwd", dir.join("escape")).unwrap();
        let secret = read_secret(s.layout()).unwrap();
        let (owner, dev, ino) = identity(&dir).unwrap();
        let c = Client { dir: dir.clone(), owner, dev, ino, secret, conn: Mutex::new(None) };
        let open = |rel: &str, flags: i32| {
            let mut req = vec![OP_OPEN];
            req.extend_from_slice(&flags.to_ne_bytes());
            req.extend_from_slice(&0o600u32.to_ne_bytes());
            req.extend_from_slice(rel.as_bytes());
            c.call(&req, None)
        };
        let (_, fd) = open("links/9.json", libc::O_RDONLY).unwrap();
        let mut text = String::new();
        std::io::Read::read_to_string(&mut std::fs::File::from(fd.unwrap()), &mut text).unwrap();
        assert_eq!(text, "{}");
        let names =
            dir_names(open("links", libc::O_RDONLY | libc::O_DIRECTORY).unwrap().1.unwrap().as_raw_fd()).unwrap();
        assert!(names.contains(&"9.json".to_string()), "{names:?}");
        assert_eq!(open("escape", libc::O_RDONLY).unwrap_err().raw_os_error(), Some(libc::ELOOP));
        assert_eq!(open("../x", libc::O_RDONLY).unwrap_err().raw_os_error(), Some(libc::EINVAL));
        // Files it creates are 0600 whatever is asked.
        let (_, fd) = open("agents-x", libc::O_CREAT | libc::O_WRONLY).unwrap();
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::File::from(fd.unwrap()).metadata().unwrap().permissions().mode() & 0o777, 0o600);
        // This process is a member (the session above): admitted with the secret, not without.
        assert!(admitted_with(&dir, secret).unwrap());
        let mut wrong = secret;
        wrong[31] ^= 0x80;
        assert!(!admitted_with(&dir, wrong).unwrap());
    }

    #[test]
    fn a_process_that_is_no_member_is_refused_even_with_the_secret() {
        let s = served_session("refused");
        let dir = s.dir().to_path_buf();
        let secret = read_secret(s.layout()).unwrap();
        // This process's memberships go: its pid no longer has a record, nor has its parent
        // (the test harness, never a member).
        for name in std::fs::read_dir(s.layout().members_dir()).unwrap().flatten() {
            std::fs::remove_file(name.path()).unwrap();
        }
        assert!(!admitted_with(&dir, secret).unwrap());
    }
}
