//! Sessions: the programs, maps and links of one session live in one directory of shared
//! memory (`/dev/shm/userbpf-UID-NAME/`, mode 0700) that every process of the session maps.
//!
//! The directory's files and directories are named in one place, [`layout`] ([`Layout`]);
//! the handshake by which a loader waits for the agents after changing links is
//! [`handshake`]. A member that drops privileges after it joined (nginx's workers) reaches
//! the files through the session's [`broker`]; the file calls here go through its functions,
//! which are the plain system calls unless permission is denied.
//!
//! A process joins a session while it uses it. A session whose members are all gone is
//! removed, as the kernel frees a program's objects at the last close: by the last member to
//! leave (a dropped [`Session`], or [`Session::leave_process`] at the exit of a process that
//! keeps its session for life), by the next process to open it, or by any `userbpf` command
//! ([`Session::reap`]) when the last one died without leaving (SIGKILL). A session with a
//! live member, or with a pinned map (a pin outlives its loader, as on a BPF filesystem), is
//! never removed.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize, de::DeserializeOwned};

pub mod broker;
pub mod handshake;
pub mod layout;

pub use layout::Layout;
use layout::write_atomic;
use userbpf_maps::{Map, MapError, MapSpec};

/// Bytes of the session's trace pipe ring.
pub const TRACE_PIPE_BYTES: u32 = 1 << 20;

/// Environment variable naming the session (default: `default`).
pub const SESSION_ENV: &str = "USERBPF_SESSION";
/// Environment variable overriding where session directories live (default: /dev/shm).
pub const SHM_DIR_ENV: &str = "USERBPF_SHM_DIR";

/// What is recorded about a map beside its file.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct MapRecord {
    pub id: u32,
    pub name: String,
    /// BTF object (id of `btf/ID`) describing the key and value, if any.
    pub btf_id: Option<u32>,
    pub key_type_id: Option<u32>,
    pub value_type_id: Option<u32>,
    /// The object file the map came from, if any.
    pub object: Option<String>,
    /// Pinned path (kept across the session's members leaving).
    pub pinned: Option<String>,
}

/// A program loaded into a session.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct ProgRecord {
    pub id: u32,
    pub name: String,
    /// libbpf section name, e.g. `uprobe/./target:func`.
    pub section: String,
    /// Program type as the kernel names it (`kprobe` for uprobes, `tracepoint`, ...).
    pub prog_type: String,
    /// The instructions with map references as `lddw` of `BPF_PSEUDO_MAP_IDX` (imm = map id)
    /// or `BPF_PSEUDO_MAP_IDX_VALUE` (imm = map id, next imm = offset).
    pub insns_hex: String,
    pub map_ids: Vec<u32>,
    pub btf_id: Option<u32>,
    pub object: Option<String>,
    pub license: String,
}

/// An attachment of a program: where a target process should run it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct LinkRecord {
    pub id: u32,
    pub prog_id: u32,
    /// `uprobe`, `uretprobe`, `usdt` (func = `PROVIDER:NAME`), `tracepoint` (func =
    /// `CATEGORY/NAME`) or `raw_tracepoint`.
    pub kind: String,
    /// The binary or library (as given; empty: the target's executable).
    pub path: String,
    /// The function, when attaching by symbol.
    pub func: Option<String>,
    /// Offset from the function (or, without one, the address in the file).
    pub offset: u64,
    /// `bpf_get_attach_cookie`'s value.
    pub cookie: u64,
    /// Only this process, when set.
    pub pid: Option<u32>,
}

impl LinkRecord {
    /// A uprobe link of program `prog_id` on function `func` of the binary or library `path`
    /// (empty: the target's executable), in every process of the session.
    pub fn uprobe(prog_id: u32, path: impl Into<String>, func: &str) -> LinkRecord {
        LinkRecord {
            id: 0,
            prog_id,
            kind: "uprobe".into(),
            path: path.into(),
            func: Some(func.into()),
            offset: 0,
            cookie: 0,
            pid: None,
        }
    }
}

/// An open session directory.
pub struct Session {
    name: String,
    layout: Layout,
    member: Option<PathBuf>,
}

fn invalid(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg.into())
}

impl Session {
    /// The session named by `USERBPF_SESSION`, or `default`.
    pub fn default_name() -> String {
        std::env::var(SESSION_ENV).ok().filter(|s| !s.is_empty()).unwrap_or_else(|| "default".into())
    }

    /// Directory holding session directories.
    pub fn root() -> PathBuf {
        std::env::var_os(SHM_DIR_ENV)
            .map(PathBuf::from)
            .unwrap_or_else(|| if Path::new("/dev/shm").is_dir() { "/dev/shm".into() } else { std::env::temp_dir() })
    }

    /// The directory of session `name` for this user.
    pub fn dir_of(name: &str) -> PathBuf {
        Self::dir_in(&Self::root(), name)
    }

    /// The directory of session `name` for this user under `root`.
    pub fn dir_in(root: &Path, name: &str) -> PathBuf {
        root.join(format!("{}{name}", Layout::dir_name_prefix()))
    }

    /// Opens (creating if needed) session `name` and joins it. A leftover session whose
    /// members all died is wiped first.
    pub fn open(name: &str) -> io::Result<Session> {
        Self::open_in(&Self::root(), name)
    }

    /// As [`Session::open`], with the sessions under `root` (a process whose environment does
    /// not say where, such as one the agent was injected into).
    pub fn open_in(root: &Path, name: &str) -> io::Result<Session> {
        Self::check_name(name)?;
        Self::open_layout(name, Layout::new(Self::dir_in(root, name)))
    }

    /// As [`Session::open_in`], for the session in directory `dir` (named for its owner, who
    /// may be another user than the caller's: a process invited into another user's session,
    /// see [`broker::invite`]).
    pub fn open_at(dir: &Path, name: &str) -> io::Result<Session> {
        Self::check_name(name)?;
        Self::open_layout(name, Layout::new(dir))
    }

    /// Opens this session's directory again, as a membership of the calling process (a forked
    /// child joins its parent's session: the same directory, whatever its uid is now; one that
    /// dropped privileges joins through the broker, see [`broker`]).
    pub fn reopen(&self) -> io::Result<Session> {
        Self::open_layout(&self.name, self.layout.clone())
    }

    fn check_name(name: &str) -> io::Result<()> {
        if name.is_empty()
            || name.len() > 64
            || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
            || name.starts_with('.')
        {
            return Err(invalid(format!("invalid session name {name:?}: use 1-64 letters, digits, '-', '_' or '.'")));
        }
        Ok(())
    }

    fn open_layout(name: &str, layout: Layout) -> io::Result<Session> {
        let mut s = Session { name: name.to_string(), layout, member: None };
        let _lock = s.lock()?;
        for sub in s.layout.made_at_open() {
            layout::make_dir(&sub)?;
        }
        // What a member that drops privileges later shows the broker (see `broker`).
        broker::ensure_secret(&s.layout)?;
        if s.live_members()?.is_empty() && !s.has_pins()? {
            s.wipe()?;
        }
        s.member = Some(s.join_locked()?);
        Ok(s)
    }

    pub fn name(&self) -> &str {
        &self.name
    }
    pub fn dir(&self) -> &Path {
        self.layout.dir()
    }
    /// The paths of the session's files.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// Takes the session's lock. The last member to leave removes the directory, lock file
    /// included, while holding it: a lock taken on a file that is gone by then is retried on
    /// the directory made anew.
    fn lock(&self) -> io::Result<File> {
        use std::os::unix::fs::MetadataExt;
        loop {
            layout::make_dir(self.dir())?;
            let path = self.layout.lock();
            let f = match broker::open(&path, libc::O_CREAT | libc::O_WRONLY, 0o600) {
                Ok(f) => File::from(f),
                // The directory was removed (by its last member) between the two calls.
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            };
            // SAFETY: flock on a descriptor we own; released when `f` is closed.
            if unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&f), libc::LOCK_EX) } != 0 {
                return Err(io::Error::last_os_error());
            }
            let held = f.metadata()?;
            match broker::metadata(&path) {
                Ok(now) if now.ino() == held.ino() && now.dev() == held.dev() => return Ok(f),
                _ => continue,
            }
        }
    }

    fn join_locked(&self) -> io::Result<PathBuf> {
        static HANDLES: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let me = std::process::id();
        let n = HANDLES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = self.layout.member(me, start_time(me).unwrap_or(0), n);
        broker::open(&path, libc::O_CREAT | libc::O_WRONLY | libc::O_TRUNC, 0o600)?;
        Ok(path)
    }

    /// Pids of members still alive (their files whose process is gone are removed).
    pub fn live_members(&self) -> io::Result<Vec<u32>> {
        let mut live = Vec::new();
        let dir = self.layout.members_dir();
        for name in broker::read_dir_names(&dir)? {
            // PID.STARTTIME.HANDLE: alive while that process (not a reuse of its pid) is.
            let member = Layout::parse_member(&name).filter(|&(pid, t)| start_time(pid) == Some(t) && !exited(pid));
            if let Some((pid, _)) = member {
                live.push(pid);
            } else {
                let _ = broker::remove_file(&dir.join(name));
            }
        }
        Ok(live)
    }

    fn has_pins(&self) -> io::Result<bool> {
        Ok(self.maps()?.iter().any(|m| m.pinned.is_some()))
    }

    fn wipe(&self) -> io::Result<()> {
        for d in self.layout.wiped() {
            let entries = match fs::read_dir(&d) {
                Ok(rd) => rd,
                // `counters/` is made by the first process that runs programs.
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            };
            for e in entries {
                let p = e?.path();
                if p.is_dir() {
                    fs::remove_dir_all(&p)?;
                } else {
                    fs::remove_file(&p)?;
                }
            }
        }
        let _ = fs::remove_file(self.layout.next_id());
        let _ = fs::remove_file(self.layout.trace_pipe());
        Ok(())
    }

    /// Hands out the next id (ids are never reused within a session's life).
    pub fn alloc_id(&self) -> io::Result<u32> {
        let _lock = self.lock()?;
        let path = self.layout.next_id();
        let last: u32 = fs::read_to_string(&path).ok().and_then(|s| s.trim().parse().ok()).unwrap_or(0);
        let id = last.checked_add(1).ok_or_else(|| io::Error::other("session ran out of ids"))?;
        write_atomic(&path, id.to_string().as_bytes())?;
        Ok(id)
    }

    /// Creates a map in the session; returns it with its id set.
    pub fn create_map(&self, spec: &MapSpec, mut record: MapRecord) -> Result<(MapRecord, Map), SessionError> {
        let id = self.alloc_id()?;
        let map = Map::create(&self.map_path(id), spec)?;
        map.set_id(id);
        record.id = id;
        record.name = spec.name.clone();
        self.write_json(&self.layout.map_record(id), &record)?;
        Ok((record, map))
    }

    pub fn map_path(&self, id: u32) -> PathBuf {
        self.layout.map(id)
    }

    /// Opens map `id`. A map whose contents are a kernel map's (`maps/ID.kernel`, see
    /// [`crate::kernel_map`]) is the kernel's: an array gets the kernel's values mapped over
    /// its own; another kind is opened as [`Map::Kernel`], reached through `bpf()`.
    pub fn open_map(&self, id: u32) -> Result<Map, SessionError> {
        let path = self.map_path(id);
        if !broker::exists(&path) {
            return Err(SessionError::NotFound(format!("map {id}")));
        }
        let map = Map::open(&path)?;
        if let Some(backing) = self.kernel_backing(id) {
            let e = |e: String| SessionError::Io(io::Error::other(format!("map {id}: {e}")));
            if map.map_type() != userbpf_maps::MapType::BPF_MAP_TYPE_ARRAY {
                drop(map);
                return crate::kernel_map::open_kernel_map(self.dir(), &path, backing).map_err(e);
            }
            crate::kernel_map::map_kernel_values(self.dir(), &map, backing).map_err(e)?;
        }
        Ok(map)
    }

    /// The kernel map behind map `id`, if its contents are a kernel map's.
    pub fn kernel_backing(&self, id: u32) -> Option<crate::kernel_map::KernelBacking> {
        crate::kernel_map::KernelBacking::parse(&broker::read_to_string(&self.layout.map_kernel(id)).ok()?)
    }

    /// Makes kernel map `fd` (kernel id `kernel_id`) the contents of map `id` (`map`, open in
    /// this process): an array's values are mapped here; this process then holds the kernel
    /// map for the session (serves its descriptor, [`crate::kernel_map::provide`]) and
    /// records it, so every process opening the map opens the kernel's. `map` itself (if not
    /// an array) keeps the session's own contents: reopen it to reach the kernel's.
    pub fn set_kernel_backing(
        &self,
        id: u32,
        map: &Map,
        kernel_id: u32,
        fd: std::os::fd::BorrowedFd<'_>,
    ) -> Result<crate::kernel_map::KernelBacking, SessionError> {
        crate::kernel_map::shareable(map.map_type() as u32).map_err(|why| {
            SessionError::Io(io::Error::other(format!(
                "map {id} ({}): a {} cannot be shared with kernel programs: {why}",
                map.spec().name,
                map.map_type().name()
            )))
        })?;
        let holder = crate::kernel_map::provide(self.dir(), kernel_id, fd)
            .map_err(|e| SessionError::Io(io::Error::other(format!("map {id}: serving the kernel map: {e}"))))?;
        let backing = crate::kernel_map::KernelBacking { kernel_id, holder };
        if map.map_type() == userbpf_maps::MapType::BPF_MAP_TYPE_ARRAY {
            crate::kernel_map::map_kernel_values(self.dir(), map, backing)
                .map_err(|e| SessionError::Io(io::Error::other(format!("map {id}: {e}"))))?;
        }
        write_atomic(&self.layout.map_kernel(id), backing.to_text().as_bytes())?;
        Ok(backing)
    }

    /// Records of every map, by id.
    pub fn maps(&self) -> io::Result<Vec<MapRecord>> {
        self.read_all(&self.layout.maps_dir())
    }

    /// Stores raw BTF; returns its id.
    pub fn add_btf(&self, data: &[u8]) -> io::Result<u32> {
        let id = self.alloc_id()?;
        write_atomic(&self.layout.btf(id), data)?;
        Ok(id)
    }

    pub fn btf(&self, id: u32) -> io::Result<Vec<u8>> {
        broker::read(&self.layout.btf(id))
    }

    pub fn add_prog(&self, mut record: ProgRecord) -> io::Result<ProgRecord> {
        record.id = self.alloc_id()?;
        self.write_json(&self.layout.prog(record.id), &record)?;
        Ok(record)
    }

    pub fn progs(&self) -> io::Result<Vec<ProgRecord>> {
        self.read_all(&self.layout.progs_dir())
    }

    /// The session's trace pipe: a ring buffer of `bpf_trace_printk` lines (created on first
    /// use), read like the kernel's trace_pipe.
    pub fn trace_pipe(&self) -> Result<Map, SessionError> {
        let path = self.layout.trace_pipe();
        let spec = MapSpec {
            map_type: userbpf_maps::MapType::BPF_MAP_TYPE_RINGBUF,
            key_size: 0,
            value_size: 0,
            max_entries: TRACE_PIPE_BYTES,
            map_flags: 0,
            map_extra: 0,
            name: "trace_pipe".into(),
        };
        match Map::create(&path, &spec) {
            Ok(m) => Ok(m),
            Err(e) if e.errno() == libc::EEXIST => Ok(Map::open(&path)?),
            Err(e) => Err(e.into()),
        }
    }

    /// The trace lines waiting in the pipe (consumed), without waiting for more.
    pub fn read_trace_pipe(&self) -> Result<Vec<String>, SessionError> {
        let map = self.trace_pipe()?;
        let Map::RingBuf(rb) = &map else { return Ok(Vec::new()) };
        let mut consumer = userbpf_maps::ringbuf::RingBufConsumer::new(rb)?;
        let mut lines = Vec::new();
        consumer.consume(|rec| lines.push(String::from_utf8_lossy(rec).trim_end_matches('\n').to_string()))?;
        Ok(lines)
    }

    /// Records a link; targets watching the session's `links/` directory attach it.
    pub fn add_link(&self, mut record: LinkRecord) -> io::Result<LinkRecord> {
        record.id = self.alloc_id()?;
        self.write_json(&self.layout.link(record.id), &record)?;
        Ok(record)
    }

    pub fn links(&self) -> io::Result<Vec<LinkRecord>> {
        self.read_all(&self.layout.links_dir())
    }

    /// Removes a link (detach).
    pub fn remove_link(&self, id: u32) -> io::Result<()> {
        broker::remove_file(&self.layout.link(id))
    }

    /// Opens the session a process was started in (`USERBPF_SESSION`), if any.
    pub fn from_env() -> Option<io::Result<Session>> {
        std::env::var(SESSION_ENV).ok().filter(|s| !s.is_empty()).map(|n| Session::open(&n))
    }

    fn write_json<T: Serialize>(&self, path: &Path, v: &T) -> io::Result<()> {
        let data = serde_json::to_vec_pretty(v).map_err(io::Error::other)?;
        write_atomic(path, &data)
    }

    fn read_all<T: DeserializeOwned + HasId>(&self, dir: &Path) -> io::Result<Vec<T>> {
        let mut v: Vec<T> = Vec::new();
        for name in broker::read_dir_names(dir)? {
            let p = dir.join(name);
            if p.extension().is_some_and(|x| x == "json") {
                // A record being replaced may vanish between read_dir and read.
                if let Ok(data) = broker::read(&p) {
                    v.push(
                        serde_json::from_slice(&data)
                            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("{}: {e}", p.display())))?,
                    );
                }
            }
        }
        v.sort_by_key(|r| r.id());
        Ok(v)
    }

    /// At the exit of a process that keeps its session for its whole life (the agent's and the
    /// loader's are statics, never dropped): every membership of this process goes, and the
    /// session with it when no other member is alive and nothing is pinned, as [`Session::leave`]
    /// does for a session that is dropped.
    pub fn leave_process(&self) -> io::Result<()> {
        let _lock = self.lock()?;
        let me = std::process::id();
        let prefix = Layout::member_prefix(me, start_time(me).unwrap_or(0));
        let dir = self.layout.members_dir();
        if let Ok(names) = broker::read_dir_names(&dir) {
            for name in names.into_iter().filter(|n| n.starts_with(&prefix)) {
                let _ = broker::remove_file(&dir.join(name));
            }
        }
        self.remove_if_unused()
    }

    /// Removes the directory, lock file included, when no member is alive and no map is
    /// pinned. The caller holds the lock: a process opening the session meanwhile blocks on
    /// it, then recreates the directory it finds gone (see [`Session::lock`]).
    fn remove_if_unused(&self) -> io::Result<()> {
        let alone = self.live_members().map_or(true, |m| m.is_empty());
        if alone && !self.has_pins().unwrap_or(false) {
            match fs::remove_dir_all(self.dir()) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
        }
        Ok(())
    }

    /// The names of this user's session directories under [`Session::root`].
    fn names() -> Vec<String> {
        let prefix = Layout::dir_name_prefix();
        let Ok(rd) = fs::read_dir(Self::root()) else { return Vec::new() };
        let mut names: Vec<String> = rd
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .filter_map(|e| e.file_name().to_str()?.strip_prefix(&prefix).map(str::to_string))
            .collect();
        names.sort();
        names
    }

    /// Removes every session of this user whose processes are all gone (killed ones included)
    /// and which holds no pin; returns their names. A session whose lock is held right now is
    /// in use and left alone. Every `userbpf` command calls this first.
    pub fn reap() -> Vec<String> {
        let mut gone = Vec::new();
        for name in Self::names() {
            let s = Session { layout: Layout::new(Self::dir_of(&name)), name, member: None };
            let Ok(Some(_lock)) = s.try_lock() else { continue };
            let before = s.dir().exists();
            if s.remove_if_unused().is_ok() && before && !s.dir().exists() {
                gone.push(s.name.clone());
            }
        }
        gone
    }

    /// The sessions of this user that exist, after [`Session::reap`]: what `userbpf session
    /// list` shows.
    pub fn list() -> Vec<SessionInfo> {
        Self::reap();
        let mut out = Vec::new();
        for name in Self::names() {
            let s = Session { layout: Layout::new(Self::dir_of(&name)), name, member: None };
            // The lock is held only while the registry changes: wait for it a little.
            let mut lock = s.try_lock();
            for _ in 0..100 {
                if !matches!(lock, Ok(None)) {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(10));
                lock = s.try_lock();
            }
            let Ok(Some(_lock)) = lock else {
                out.push(SessionInfo {
                    name: s.name.clone(),
                    dir: s.dir().to_path_buf(),
                    members: Vec::new(),
                    progs: 0,
                    maps: 0,
                    links: 0,
                    pinned: Vec::new(),
                    busy: true,
                });
                continue;
            };
            let mut members = s.live_members().unwrap_or_default();
            members.sort_unstable();
            members.dedup();
            let maps = s.maps().unwrap_or_default();
            let count = |dir: PathBuf| {
                fs::read_dir(dir)
                    .map_or(0, |rd| rd.flatten().filter(|e| e.path().extension().is_some_and(|x| x == "json")).count())
            };
            out.push(SessionInfo {
                members: members.into_iter().map(|pid| (pid, comm(pid))).collect(),
                progs: count(s.layout.progs_dir()),
                maps: maps.len(),
                links: count(s.layout.links_dir()),
                pinned: maps.iter().filter_map(|m| m.pinned.clone()).collect(),
                busy: false,
                name: s.name.clone(),
                dir: s.dir().to_path_buf(),
            });
        }
        out
    }

    /// The session's lock without waiting: `None` while another process holds it. Unlike
    /// [`Session::lock`] it never creates the directory.
    fn try_lock(&self) -> io::Result<Option<File>> {
        use std::os::unix::fs::MetadataExt;
        let path = self.layout.lock();
        let f = match OpenOptions::new().write(true).open(&path) {
            Ok(f) => f,
            // No lock file: the directory is being made or removed right now. Never touched
            // here: recreating it would race its last member's removal, and removing it would
            // race its first member's creation.
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        // SAFETY: flock on a descriptor we own; released when `f` is closed.
        if unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&f), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let e = io::Error::last_os_error();
            return if e.raw_os_error() == Some(libc::EWOULDBLOCK) { Ok(None) } else { Err(e) };
        }
        let (held, now) = (f.metadata()?, fs::metadata(&path));
        match now {
            Ok(now) if now.ino() == held.ino() && now.dev() == held.dev() => Ok(Some(f)),
            _ => Ok(None),
        }
    }

    /// Leaves the session; the last member to leave removes it (unless something is pinned).
    pub fn leave(&mut self) -> io::Result<()> {
        let Some(member) = self.member.take() else { return Ok(()) };
        let _lock = self.lock()?;
        let _ = broker::remove_file(&member);
        self.remove_if_unused()
    }
}

/// A session as `userbpf session list` shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionInfo {
    pub name: String,
    pub dir: PathBuf,
    /// Live member processes: pid and command name.
    pub members: Vec<(u32, String)>,
    pub progs: usize,
    pub maps: usize,
    pub links: usize,
    /// Pinned paths of its maps (they keep the session when no process uses it).
    pub pinned: Vec<String>,
    /// Its lock was held while looking: counts not read.
    pub busy: bool,
}

/// Whether process `pid` has exited and waits to be reaped (a zombie whose threads are all
/// gone: a main thread that called pthread_exit shows as a zombie while other threads run).
pub(crate) fn exited(pid: u32) -> bool {
    let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else { return true };
    let state = stat.rfind(')').and_then(|i| stat.get(i + 2..i + 3));
    matches!(state, Some("Z" | "X")) && fs::read_dir(format!("/proc/{pid}/task")).map_or(true, |rd| rd.count() <= 1)
}

/// A process's command name (/proc/PID/comm), empty when it is gone.
fn comm(pid: u32) -> String {
    fs::read_to_string(format!("/proc/{pid}/comm")).map(|s| s.trim_end().to_string()).unwrap_or_default()
}

impl Drop for Session {
    fn drop(&mut self) {
        let _ = self.leave();
    }
}

trait HasId {
    fn id(&self) -> u32;
}
impl HasId for MapRecord {
    fn id(&self) -> u32 {
        self.id
    }
}
impl HasId for LinkRecord {
    fn id(&self) -> u32 {
        self.id
    }
}
impl HasId for ProgRecord {
    fn id(&self) -> u32 {
        self.id
    }
}

/// Errors of session operations.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error(transparent)]
    Io(#[from] io::Error),
    #[error(transparent)]
    Map(#[from] MapError),
    #[error("{0} not found in the session")]
    NotFound(String),
}

/// A USDT semaphore a loader's uprobe link raises while it exists (a uprobe event opened with
/// a `ref_ctr_offset`), recorded in the session as `perf/sema-LINK` ("PATH\nFILE_OFFSET\nPID
/// or -1\n") by the loader, so that processes started later raise it themselves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SemaphoreRecord {
    pub link: u32,
    /// The file holding the semaphore.
    pub path: String,
    /// The semaphore's offset in the file.
    pub offset: u64,
    /// The process the link is for (`None`: every process mapping the file).
    pub pid: Option<u32>,
}

impl SemaphoreRecord {
    /// Records it in the session of layout `l`.
    pub fn write(&self, l: &Layout) -> io::Result<()> {
        let pid = self.pid.map_or(-1, |p| p as i64);
        fs::write(l.semaphore(self.link), format!("{}\n{}\n{pid}\n", self.path, self.offset))
    }

    /// The records of the session of layout `l` (unreadable ones are skipped).
    pub fn all(l: &Layout) -> Vec<SemaphoreRecord> {
        let Ok(names) = broker::read_dir_names(&l.perf_dir()) else { return Vec::new() };
        let mut v = Vec::new();
        for name in names {
            let Some(link) = Layout::parse_semaphore(&name) else { continue };
            let Ok(text) = broker::read_to_string(&l.perf_dir().join(&name)) else { continue };
            let mut l = text.lines();
            let (Some(path), Some(offset), Some(pid)) =
                (l.next(), l.next().and_then(|o| o.parse::<u64>().ok()), l.next().and_then(|p| p.parse::<i64>().ok()))
            else {
                continue;
            };
            v.push(SemaphoreRecord { link, path: path.to_string(), offset, pid: u32::try_from(pid).ok() });
        }
        v
    }

    /// Whether the link is for process `pid`.
    pub fn is_for(&self, pid: u32) -> bool {
        self.pid.is_none_or(|p| p == pid)
    }
}

/// A process's start time in clock ticks since boot (/proc/PID/stat field 22): with the pid,
/// it identifies a process even after its pid is reused.
pub fn start_time(pid: u32) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses: split after its last ')'.
    let rest = &stat[stat.rfind(')')? + 2..];
    rest.split(' ').nth(19)?.parse().ok()
}

/// A process's effective uid (`/proc/PID/status`, the second field of `Uid:`).
pub fn effective_uid(pid: u32) -> Option<u32> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find_map(|l| l.strip_prefix("Uid:"))?.split_whitespace().nth(1)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_root<T>(f: impl FnOnce() -> T) -> T {
        let dir = std::env::temp_dir().join(format!("userbpf-session-unit-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        // SAFETY: (of the environment change) the unit tests of this module all set the same value.
        unsafe { std::env::set_var(SHM_DIR_ENV, &dir) };
        f()
    }

    #[test]
    fn the_last_member_to_leave_removes_the_session() {
        with_root(|| {
            let a = Session::open("leave").unwrap();
            let dir = a.dir().to_path_buf();
            let b = Session::open("leave").unwrap();
            let id = a.alloc_id().unwrap();
            assert_eq!(b.alloc_id().unwrap(), id + 1, "members share one id space");
            drop(a);
            assert!(dir.exists(), "still in use by b");
            assert_eq!(b.live_members().unwrap().len(), 1);
            drop(b);
            assert!(!dir.exists(), "removed by the last member");
        });
    }

    #[test]
    fn a_session_whose_members_died_is_wiped_on_open() {
        with_root(|| {
            let a = Session::open("dead").unwrap();
            a.add_btf(b"x").unwrap();
            // Pretend a dead process was the only member.
            let member = a.member.clone().unwrap();
            fs::rename(&member, a.layout().members_dir().join("999999999.1")).unwrap();
            std::mem::forget(a);
            let b = Session::open("dead").unwrap();
            assert!(fs::read_dir(b.layout().btf_dir()).unwrap().next().is_none(), "stale contents wiped");
            assert_eq!(b.alloc_id().unwrap(), 1);
        });
    }

    /// A member file of a process that is gone (pid beyond pid_max).
    fn fake_dead_member(s: &Session) {
        fs::write(s.layout().member(999_999_999, 1, 0), b"").unwrap();
    }

    #[test]
    fn reap_removes_sessions_whose_processes_are_gone() {
        with_root(|| {
            // Left by a process killed while a member: its member file names a dead process.
            let dead = Session::open("reap-dead").unwrap();
            let dead_dir = dead.dir().to_path_buf();
            fake_dead_member(&dead);
            fs::remove_file(dead.member.clone().unwrap()).unwrap();
            std::mem::forget(dead);
            // In use by this process: kept.
            let live = Session::open("reap-live").unwrap();
            // Pinned, no process: kept, as a bpffs pin outlives its loader.
            let pinned = Session::open("reap-pinned").unwrap();
            let spec = MapSpec {
                map_type: userbpf_maps::MapType::BPF_MAP_TYPE_ARRAY,
                key_size: 4,
                value_size: 8,
                max_entries: 1,
                map_flags: 0,
                map_extra: 0,
                name: "p".into(),
            };
            let rec = MapRecord {
                id: 0,
                name: String::new(),
                btf_id: None,
                key_type_id: None,
                value_type_id: None,
                object: None,
                pinned: Some("/sys/fs/bpf/p".into()),
            };
            pinned.create_map(&spec, rec).unwrap();
            let pinned_dir = pinned.dir().to_path_buf();
            drop(pinned);
            assert!(pinned_dir.exists());

            let gone = Session::reap();
            assert!(gone.contains(&"reap-dead".to_string()), "{gone:?}");
            assert!(!dead_dir.exists());
            assert!(live.dir().exists() && pinned_dir.exists());
            let listed = Session::list();
            let live_info = listed.iter().find(|i| i.name == "reap-live").expect("listed");
            assert_eq!(live_info.members.iter().map(|m| m.0).collect::<Vec<_>>(), vec![std::process::id()]);
            let pinned_info = listed.iter().find(|i| i.name == "reap-pinned").expect("listed");
            assert_eq!(
                (pinned_info.maps, pinned_info.pinned.clone(), pinned_info.members.len()),
                (1, vec!["/sys/fs/bpf/p".to_string()], 0)
            );
            assert!(!listed.iter().any(|i| i.name == "reap-dead"));
            fs::remove_dir_all(&pinned_dir).unwrap();
        });
    }

    #[test]
    fn leave_process_removes_a_session_only_it_used() {
        with_root(|| {
            let a = Session::open("leave-process").unwrap();
            let dir = a.dir().to_path_buf();
            let b = Session::open("leave-process").unwrap();
            a.add_btf(b"x").unwrap();
            // Both handles are this process's memberships: both go.
            a.leave_process().unwrap();
            assert!(!dir.exists(), "removed with the process's last membership");
            std::mem::forget(a);
            std::mem::forget(b);
            // With another process's membership alive, it stays.
            let c = Session::open("leave-process2").unwrap();
            let parent = std::os::unix::process::parent_id();
            fs::write(c.layout().member(parent, start_time(parent).unwrap(), 0), b"").unwrap();
            c.leave_process().unwrap();
            assert!(c.dir().exists(), "the other member is alive");
            fs::remove_dir_all(c.dir()).unwrap();
            std::mem::forget(c);
        });
    }

    #[test]
    fn bad_names_are_refused() {
        for n in ["", ".x", "a/b", "a b"] {
            assert!(Session::open(n).is_err(), "{n:?}");
        }
    }
}
