//! The programs' run statistics in the session, readable by any process without stopping the
//! programs (`userbpf export`), as the kernel keeps `run_cnt`, `run_time_ns` and
//! `recursion_misses` in each program for `bpftool prog show`.
//!
//! Each process that runs programs keeps them in a file of its own, `counters/PID.START` (see
//! [`Layout`]), mapped shared: a 64-byte header and 4095 slots of 64 bytes, one per program id
//! the process prepared (id, name, then the [`RunStats`] words a run adds to with relaxed atomic
//! adds: no system call, no lock, no allocation on the hit path, no cache line shared by two
//! programs). A slot is claimed once per program id (compare-and-swap of its id word) and taken
//! up again when the process prepares the same program again (an agent re-synced, a new image
//! after exec: exec keeps the pid and the start time), so a process's counters only grow. The
//! file is sparse: only the pages of claimed slots take memory. A process that prepares more
//! than 4095 programs, or that is not bound to a session ([`bind`]), keeps the rest in its own
//! memory, where no other process sees them.
//!
//! A forked child gets a file of its own at once (a `pthread_atfork` child handler maps a new
//! file over the inherited mapping, same slots, counters at zero): the parent's file keeps the
//! parent's counts. When that fails (no descriptor left), the child's runs add to its parent's.
//!
//! A process gone does not take its counts with it: [`read`] folds the files of dead processes
//! into `counters/retired.json` (their totals per program id) under `counters/lock`, so the
//! totals per program only grow while the session lives: what Prometheus counters need. The
//! fold is crash-safe: the names folded are recorded with the totals in one atomic rewrite,
//! and removed afterwards (a name still present at the next fold is removed, not counted again).
//!
//! `run_cnt` and `run_time_ns` are counted only while run statistics are on (see
//! `program::set_stats_enabled`). A process bound to a session also follows the session's
//! switch, `counters/switch`: a byte (at `SWITCH_AT`) every bound process maps and the probes' lean handlers
//! read ([`crate::program::stats_gate`]); it is on while a live process holds it
//! ([`hold_run_stats`], `userbpf export --run-stats`, as `BPF_ENABLE_STATS` holds the
//! kernel's while its descriptor is open). A holder that died is let go at the next fold.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::fs::{self, OpenOptions};
use std::io;
use std::ops::Deref;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering};

use serde::{Deserialize, Serialize};

use crate::program::RunStats;
use crate::session::{Layout, layout};

/// Identifies a counters file and its layout version.
pub const MAGIC: u64 = u64::from_le_bytes(*b"UBPFRUN1");
/// Program slots in one process's file.
pub const SLOTS: usize = 4095;
const SLOT_BYTES: usize = 64;
const HEADER_BYTES: usize = 64;
/// Bytes of one process's file.
pub const FILE_BYTES: usize = HEADER_BYTES + SLOTS * SLOT_BYTES;
const SWITCH_BYTES: usize = 4096;
/// Where the switch byte is in its file: not at the page's start, where every page-aligned
/// object of a probed process competes for one level-1 data cache set (lean handlers read the
/// byte on every hit; see `crate::context::SLOTS_OFFSET`).
const SWITCH_AT: usize = 0xcc0;

#[repr(C)]
struct Header {
    magic: AtomicU64,
    pid: AtomicU32,
    capacity: AtomicU32,
    start: AtomicU64,
}

#[repr(C, align(64))]
struct Slot {
    /// The program's id (0: free), claimed by compare-and-swap.
    id: AtomicU32,
    /// Non-zero once `name` is written.
    ready: AtomicU32,
    stats: RunStats,
    /// The program's name, NUL-padded (16 bytes, the kernel's BPF_OBJ_NAME_LEN).
    name: [AtomicU64; 2],
}

const _: () = assert!(std::mem::size_of::<Slot>() == SLOT_BYTES);
const _: () = assert!(std::mem::size_of::<Header>() <= HEADER_BYTES);

/// A program's statistics: a slot of the process's counters file, or its own memory.
pub enum StatsRef {
    Shared(&'static RunStats),
    Own(Box<RunStats>),
}

impl Deref for StatsRef {
    type Target = RunStats;
    fn deref(&self) -> &RunStats {
        match self {
            StatsRef::Shared(s) => s,
            StatsRef::Own(b) => b,
        }
    }
}

/// The base of this process's counters mapping (0: not bound).
static REGION: AtomicUsize = AtomicUsize::new(0);
/// The session's switch byte (null: not bound).
static SWITCH: AtomicPtr<AtomicBool> = AtomicPtr::new(std::ptr::null_mut());
/// The `counters/` directory, NUL-terminated, for the fork handler (leaked when replaced).
static DIR: AtomicPtr<libc::c_char> = AtomicPtr::new(std::ptr::null_mut());
/// Device and inode of the session directory bound to and of this process's counters file
/// there (a session made anew, or wiped meanwhile, is bound again).
static BOUND: std::sync::Mutex<Option<(u64, u64, u64)>> = std::sync::Mutex::new(None);

/// The session's run-statistics switch when bound.
#[inline]
pub(crate) fn session_switch() -> Option<&'static AtomicBool> {
    let p = SWITCH.load(Ordering::Relaxed);
    // SAFETY: a non-null SWITCH points into a mapping that is never unmapped.
    unsafe { p.as_ref() }
}

fn slots(base: usize) -> &'static [Slot] {
    // SAFETY: `base` is a live mapping of FILE_BYTES (never unmapped): a header then SLOTS
    // 64-byte slots of atomics, for which any bit pattern is valid.
    unsafe { std::slice::from_raw_parts((base + HEADER_BYTES) as *const Slot, SLOTS) }
}

fn name_words(name: &str) -> [u64; 2] {
    let mut b = [0u8; 16];
    let n = name.len().min(15);
    b[..n].copy_from_slice(&name.as_bytes()[..n]);
    [
        u64::from_ne_bytes(b[..8].try_into().unwrap_or_default()),
        u64::from_ne_bytes(b[8..].try_into().unwrap_or_default()),
    ]
}

fn name_of(words: [u64; 2]) -> String {
    let mut b = [0u8; 16];
    b[..8].copy_from_slice(&words[0].to_ne_bytes());
    b[8..].copy_from_slice(&words[1].to_ne_bytes());
    let n = b.iter().position(|&c| c == 0).unwrap_or(16);
    String::from_utf8_lossy(&b[..n]).into_owned()
}

/// The statistics of program `id` named `name` in this process: its slot of the session's
/// counters file when this process is bound to a session (the same slot each time the same
/// program is prepared), else memory of its own.
pub fn slot(id: u32, name: &str) -> StatsRef {
    let base = REGION.load(Ordering::Acquire);
    if base == 0 || id == 0 {
        return StatsRef::Own(Box::default());
    }
    for s in slots(base) {
        let claimed = match s.id.compare_exchange(0, id, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => {
                let w = name_words(name);
                s.name[0].store(w[0], Ordering::Relaxed);
                s.name[1].store(w[1], Ordering::Relaxed);
                s.ready.store(1, Ordering::Release);
                true
            }
            Err(existing) => existing == id,
        };
        if claimed {
            return StatsRef::Shared(&s.stats);
        }
    }
    StatsRef::Own(Box::default())
}

fn io_err(what: &str, path: &Path, e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("{what} {}: {e}", path.display()))
}

/// Maps `len` bytes of `path` (created 0600 and sized if needed) shared; the descriptor is
/// closed (the mapping holds the file). `fresh`: emptied first (a file of another layout).
fn map_file(path: &Path, len: usize) -> io::Result<*mut u8> {
    // Through the broker when this process may not open the session's files (one that dropped
    // privileges, or another user's invited into the session: see `session::broker`).
    let f = fs::File::from(
        crate::session::broker::open(path, libc::O_RDWR | libc::O_CREAT | libc::O_CLOEXEC, 0o600)
            .map_err(|e| io_err("opening", path, e))?,
    );
    if (f.metadata()?.len() as usize) < len {
        f.set_len(len as u64).map_err(|e| io_err("sizing", path, e))?;
    }
    // SAFETY: a fresh shared mapping of a file we hold open and sized; no memory is affected.
    let p = unsafe {
        libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, f.as_raw_fd(), 0)
    };
    if p == libc::MAP_FAILED {
        return Err(io_err("mapping", path, io::Error::last_os_error()));
    }
    Ok(p.cast())
}

/// Binds this process's run statistics to the session laid out at `layout`: programs prepared
/// from now on count in `counters/PID.START`, and runs are counted while the session's switch
/// is on. Binding again to the same session does nothing; to another one (an agent started
/// again elsewhere), programs prepared before keep their slots in the first one's files.
pub fn bind(layout: &Layout) -> io::Result<()> {
    let meta = fs::metadata(layout.dir()).map_err(|e| io_err("reading", layout.dir(), e))?;
    let pid = std::process::id();
    let start = crate::session::start_time(pid).unwrap_or(0);
    let path = layout.counters(pid, start);
    let mut bound = BOUND.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((dev, ino, file)) = *bound
        && (dev, ino) == (meta.dev(), meta.ino())
        && crate::session::broker::metadata(&path).is_ok_and(|m| m.ino() == file)
    {
        return Ok(());
    }
    let dir = layout.counters_dir();
    layout::make_dir(&dir).map_err(|e| io_err("making", &dir, e))?;
    let switch = map_file(&layout.counters_switch(), SWITCH_BYTES)?;
    let base = map_file(&path, FILE_BYTES)?;
    let file = crate::session::broker::metadata(&path).map_err(|e| io_err("reading", &path, e))?.ino();
    // SAFETY: `base` is a mapping of FILE_BYTES that starts with the header's atomics.
    let h = unsafe { &*(base as *const Header) };
    if h.magic.load(Ordering::Relaxed) != MAGIC {
        h.pid.store(pid, Ordering::Relaxed);
        h.start.store(start, Ordering::Relaxed);
        h.capacity.store(SLOTS as u32, Ordering::Relaxed);
        h.magic.store(MAGIC, Ordering::Release);
    }
    let c = CString::new(dir.as_os_str().as_bytes()).map_err(|_| io::Error::other("NUL in the session path"))?;
    let old = DIR.swap(c.into_raw(), Ordering::AcqRel);
    let _ = old; // leaked: the fork handler may be reading it.
    // SAFETY: the mapping holds SWITCH_BYTES > SWITCH_AT bytes.
    SWITCH.store(unsafe { switch.add(SWITCH_AT) }.cast(), Ordering::Release);
    REGION.store(base as usize, Ordering::Release);
    *bound = Some((meta.dev(), meta.ino(), file));
    static AT_FORK: std::sync::Once = std::sync::Once::new();
    // SAFETY: registers a child handler that only makes system calls on memory it owns (see
    // `remap_in_child`).
    AT_FORK.call_once(|| unsafe {
        libc::pthread_atfork(None, None, Some(remap_in_child));
    });
    drop(bound);
    // Dead processes' files are folded now and then: at every bind, and at every read.
    let _ = with_lock(layout, |_| fold(layout));
    Ok(())
}

/// The start time of this process (`/proc/self/stat` field 22), read without allocating.
fn own_start_time() -> Option<u64> {
    let mut buf = [0u8; 1024];
    // SAFETY: a NUL-terminated literal path; the descriptor is closed below.
    let fd = unsafe { libc::open(c"/proc/self/stat".as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
    if fd < 0 {
        return None;
    }
    // SAFETY: reading into a buffer we own, of its length.
    let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
    // SAFETY: closing the descriptor opened above.
    unsafe { libc::close(fd) };
    let b = buf.get(..usize::try_from(n).ok()?)?;
    let close = b.iter().rposition(|&c| c == b')')?;
    let field = b.get(close + 2..)?.split(|&c| c == b' ').nth(19)?;
    let mut v: u64 = 0;
    for &d in field {
        if !d.is_ascii_digit() {
            return None;
        }
        v = v.checked_mul(10)?.checked_add((d - b'0') as u64)?;
    }
    Some(v)
}

/// Appends the decimal digits of `v` to `buf` at `*at`.
fn push_decimal(buf: &mut [u8], at: &mut usize, mut v: u64) -> Option<()> {
    let mut digits = [0u8; 20];
    let mut n = 0;
    loop {
        digits[n] = b'0' + (v % 10) as u8;
        n += 1;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    for i in (0..n).rev() {
        *buf.get_mut(*at)? = digits[i];
        *at += 1;
    }
    Some(())
}

/// `pthread_atfork` child handler: the child's runs get a file of their own (see the module
/// documentation). Only system calls and stores to memory this module owns: no allocation, no
/// lock (the child has one thread, and the parent's locks may be held).
extern "C" fn remap_in_child() {
    // Its system calls are userbpf's, not the program's.
    crate::own_work::run(remap_in_child_quietly)
}

fn remap_in_child_quietly() {
    let base = REGION.load(Ordering::Acquire);
    let dir = DIR.load(Ordering::Acquire);
    if base == 0 || dir.is_null() {
        return;
    }
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() } as u32;
    let Some(start) = own_start_time() else { return };
    let mut path = [0u8; 4096];
    // SAFETY: DIR holds a leaked NUL-terminated string.
    let d = unsafe { std::ffi::CStr::from_ptr(dir) }.to_bytes();
    if d.len() + 48 > path.len() {
        return;
    }
    path[..d.len()].copy_from_slice(d);
    let mut at = d.len();
    path[at] = b'/';
    at += 1;
    if push_decimal(&mut path, &mut at, pid as u64).is_none() {
        return;
    }
    path[at] = b'.';
    at += 1;
    if push_decimal(&mut path, &mut at, start).is_none() {
        return;
    }
    path[at] = 0;
    // SAFETY: `path` is NUL-terminated; the descriptor is closed below.
    let fd = unsafe {
        libc::open(path.as_ptr().cast(), libc::O_RDWR | libc::O_CREAT | libc::O_TRUNC | libc::O_CLOEXEC, 0o600)
    };
    if fd < 0 {
        return;
    }
    // SAFETY: sizing and mapping the file just opened; the new mapping is ours alone.
    let fresh = unsafe {
        if libc::ftruncate(fd, FILE_BYTES as libc::off_t) != 0 {
            libc::close(fd);
            return;
        }
        libc::mmap(std::ptr::null_mut(), FILE_BYTES, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd, 0)
    };
    if fresh == libc::MAP_FAILED {
        // SAFETY: closing the descriptor opened above.
        unsafe { libc::close(fd) };
        return;
    }
    // SAFETY: both are mappings of FILE_BYTES laid out as a header then SLOTS slots.
    let (old_h, new_h) = unsafe { (&*(base as *const Header), &*(fresh as *const Header)) };
    new_h.pid.store(pid, Ordering::Relaxed);
    new_h.start.store(start, Ordering::Relaxed);
    new_h.capacity.store(old_h.capacity.load(Ordering::Relaxed), Ordering::Relaxed);
    new_h.magic.store(MAGIC, Ordering::Relaxed);
    for (o, n) in slots(base).iter().zip(slots(fresh as usize)) {
        let id = o.id.load(Ordering::Acquire);
        if id == 0 {
            break;
        }
        n.name[0].store(o.name[0].load(Ordering::Relaxed), Ordering::Relaxed);
        n.name[1].store(o.name[1].load(Ordering::Relaxed), Ordering::Relaxed);
        n.ready.store(o.ready.load(Ordering::Relaxed), Ordering::Relaxed);
        n.id.store(id, Ordering::Release);
    }
    // SAFETY: replaces this process's (the child's) mapping of the parent's file by the same
    // bytes of its own file, at the same address and size: every pointer into it (the
    // programs' `RunStats`) stays valid; the temporary mapping and the descriptor go.
    unsafe {
        let p = libc::mmap(
            base as *mut libc::c_void,
            FILE_BYTES,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_FIXED,
            fd,
            0,
        );
        libc::munmap(fresh, FILE_BYTES);
        libc::close(fd);
        if p == libc::MAP_FAILED {
            // The parent's mapping is still in place: the child's runs add to the parent's.
            let _ = libc::unlink(path.as_ptr().cast());
        }
    }
}

/// One program's counters (in one process, or summed).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProgCounters {
    pub id: u32,
    pub name: String,
    pub run_cnt: u64,
    pub run_time_ns: u64,
    /// Runs skipped (recursion on a thread, no CPU slot free): the kernel's `recursion_misses`.
    pub missed: u64,
    /// Runs ended by an error (a fault, an out-of-bounds access).
    pub errors: u64,
}

impl ProgCounters {
    fn add(&mut self, o: &ProgCounters) {
        self.run_cnt = self.run_cnt.wrapping_add(o.run_cnt);
        self.run_time_ns = self.run_time_ns.wrapping_add(o.run_time_ns);
        self.missed = self.missed.wrapping_add(o.missed);
        self.errors = self.errors.wrapping_add(o.errors);
        if self.name.is_empty() {
            self.name = o.name.clone();
        }
    }
}

/// One process's counters file.
#[derive(Clone, Debug, Default)]
pub struct ProcCounters {
    pub pid: u32,
    pub start: u64,
    pub progs: Vec<ProgCounters>,
}

/// What [`read`] finds: the live processes' counters and the totals of those gone.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    pub processes: Vec<ProcCounters>,
    pub retired: Vec<ProgCounters>,
    /// Whether the session's switch is on (runs counted and timed).
    pub switch_on: bool,
}

impl Snapshot {
    /// Counters per program id, summed over the processes live and gone.
    pub fn totals(&self) -> BTreeMap<u32, ProgCounters> {
        let mut t: BTreeMap<u32, ProgCounters> = BTreeMap::new();
        for p in self.processes.iter().flat_map(|p| &p.progs).chain(&self.retired) {
            t.entry(p.id).or_insert_with(|| ProgCounters { id: p.id, ..Default::default() }).add(p);
        }
        t
    }
}

#[derive(Default, Serialize, Deserialize)]
struct Retired {
    /// Files whose counts are in `progs` and that may still exist (removed at the next fold).
    folded: Vec<String>,
    progs: Vec<ProgCounters>,
}

/// Reads one process's counters file (a snapshot of its atomics, read in place).
fn read_file(path: &Path) -> io::Result<Vec<ProgCounters>> {
    let f = fs::File::open(path)?;
    if (f.metadata()?.len() as usize) < FILE_BYTES {
        return Err(io::Error::new(io::ErrorKind::InvalidData, format!("{}: too short", path.display())));
    }
    // SAFETY: a fresh read-only shared mapping of a file we hold open; unmapped below.
    let p =
        unsafe { libc::mmap(std::ptr::null_mut(), FILE_BYTES, libc::PROT_READ, libc::MAP_SHARED, f.as_raw_fd(), 0) };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    let mut out = Vec::new();
    // SAFETY: the mapping is FILE_BYTES long: a header then SLOTS slots of atomics, only
    // loaded from here.
    let h = unsafe { &*(p as *const Header) };
    if h.magic.load(Ordering::Acquire) == MAGIC {
        for s in slots(p as usize) {
            let id = s.id.load(Ordering::Acquire);
            if id == 0 {
                break;
            }
            let name = if s.ready.load(Ordering::Acquire) != 0 {
                name_of([s.name[0].load(Ordering::Relaxed), s.name[1].load(Ordering::Relaxed)])
            } else {
                String::new()
            };
            out.push(ProgCounters {
                id,
                name,
                run_cnt: s.stats.run_cnt.load(Ordering::Relaxed),
                run_time_ns: s.stats.run_time_ns.load(Ordering::Relaxed),
                missed: s.stats.missed.load(Ordering::Relaxed),
                errors: s.stats.errors.load(Ordering::Relaxed),
            });
        }
    }
    // SAFETY: unmapping the mapping made above; nothing borrows it any more.
    unsafe { libc::munmap(p, FILE_BYTES) };
    Ok(out)
}

fn alive(pid: u32, start: u64) -> bool {
    crate::session::start_time(pid) == Some(start) && !crate::session::exited(pid)
}

fn with_lock<T>(layout: &Layout, f: impl FnOnce(&Layout) -> io::Result<T>) -> io::Result<T> {
    layout::make_dir(&layout.counters_dir())?;
    let lock = OpenOptions::new().create(true).truncate(false).write(true).mode(0o600).open(layout.counters_lock())?;
    // SAFETY: flock on a descriptor we own; released when `lock` is closed.
    if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) } != 0 {
        return Err(io::Error::last_os_error());
    }
    f(layout)
}

/// Folds the files of dead processes into `retired.json` and sets the switch from the live
/// holders. Under the counters lock.
fn fold(layout: &Layout) -> io::Result<Retired> {
    let path = layout.counters_retired();
    let mut r: Retired = match fs::read(&path) {
        Ok(b) => serde_json::from_slice(&b).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?,
        Err(e) if e.kind() == io::ErrorKind::NotFound => Retired::default(),
        Err(e) => return Err(e),
    };
    let dir = layout.counters_dir();
    for name in std::mem::take(&mut r.folded) {
        let _ = fs::remove_file(dir.join(name));
    }
    let mut totals: BTreeMap<u32, ProgCounters> = r.progs.drain(..).map(|p| (p.id, p)).collect();
    let mut holders = false;
    for e in fs::read_dir(&dir)? {
        let e = e?;
        let name = e.file_name().to_string_lossy().into_owned();
        if let Some(h) = name.strip_prefix("hold-") {
            match Layout::parse_counters(h) {
                Some((pid, start)) if alive(pid, start) => holders = true,
                _ => {
                    let _ = fs::remove_file(e.path());
                }
            }
            continue;
        }
        let Some((pid, start)) = Layout::parse_counters(&name) else { continue };
        if alive(pid, start) {
            continue;
        }
        if let Ok(progs) = read_file(&e.path()) {
            for p in progs {
                totals.entry(p.id).or_insert_with(|| ProgCounters { id: p.id, ..Default::default() }).add(&p);
            }
        }
        r.folded.push(name);
    }
    r.progs = totals.into_values().collect();
    if !r.folded.is_empty() {
        let json = serde_json::to_vec(&r).map_err(io::Error::other)?;
        layout::write_atomic(&path, &json)?;
        for name in &r.folded {
            let _ = fs::remove_file(dir.join(name));
        }
    }
    set_switch(layout, holders)?;
    Ok(r)
}

fn set_switch(layout: &Layout, on: bool) -> io::Result<()> {
    let path = layout.counters_switch();
    let mut f = OpenOptions::new().create(true).truncate(false).write(true).mode(0o600).open(&path)?;
    if f.metadata()?.len() < SWITCH_BYTES as u64 {
        f.set_len(SWITCH_BYTES as u64)?;
    }
    use std::io::{Seek, Write};
    f.seek(io::SeekFrom::Start(SWITCH_AT as u64))?;
    f.write_all(&[on as u8])
}

fn switch_on(layout: &Layout) -> bool {
    fs::read(layout.counters_switch()).ok().and_then(|b| b.get(SWITCH_AT).copied()).is_some_and(|b| b != 0)
}

/// The session's counters: dead processes' files folded first (see the module documentation),
/// then every live process's file read in place, without stopping anything.
pub fn read(layout: &Layout) -> io::Result<Snapshot> {
    with_lock(layout, |layout| {
        let retired = fold(layout)?;
        let mut processes = Vec::new();
        for e in fs::read_dir(layout.counters_dir())? {
            let e = e?;
            let name = e.file_name().to_string_lossy().into_owned();
            let Some((pid, start)) = Layout::parse_counters(&name) else { continue };
            if let Ok(progs) = read_file(&e.path()) {
                processes.push(ProcCounters { pid, start, progs });
            }
        }
        processes.sort_by_key(|p| (p.pid, p.start));
        Ok(Snapshot { processes, retired: retired.progs, switch_on: switch_on(layout) })
    })
}

/// Keeps the session's run statistics on (runs counted and timed in every process bound to
/// it) while it lives.
pub struct RunStatsHold {
    layout: Layout,
    path: std::path::PathBuf,
}

/// Turns the session's run statistics on until the returned hold is dropped (or this process
/// dies: its hold is let go at the next fold).
pub fn hold_run_stats(layout: &Layout) -> io::Result<RunStatsHold> {
    let pid = std::process::id();
    let path = layout.counters_hold(pid, crate::session::start_time(pid).unwrap_or(0));
    with_lock(layout, |layout| {
        fs::write(&path, b"")?;
        set_switch(layout, true)
    })?;
    Ok(RunStatsHold { layout: layout.clone(), path })
}

impl Drop for RunStatsHold {
    fn drop(&mut self) {
        let _ = with_lock(&self.layout, |layout| {
            let _ = fs::remove_file(&self.path);
            fold(layout).map(|_| ())
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_through_two_words() {
        assert_eq!(name_of(name_words("uprobe_malloc")), "uprobe_malloc");
        assert_eq!(name_of(name_words("a_name_longer_than_fifteen")), "a_name_longer_t");
        assert_eq!(name_of(name_words("")), "");
    }

    #[test]
    fn decimal_digits() {
        let mut b = [0u8; 24];
        let mut at = 0;
        push_decimal(&mut b, &mut at, 1234567890123).unwrap();
        assert_eq!(&b[..at], b"1234567890123");
        let mut at = 0;
        push_decimal(&mut b, &mut at, 0).unwrap();
        assert_eq!(&b[..at], b"0");
    }

    #[test]
    fn own_start_time_is_procs() {
        assert_eq!(own_start_time(), crate::session::start_time(std::process::id()));
    }
}
