//! Shared-memory files: created 0600 and exclusively, mapped shared by every process that
//! opens them, and the header every map file starts with.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::ptr::NonNull;

use crate::types::{MapSpec, MapType};

/// Bytes of a page; map files keep their parts page-aligned so they can be mapped as the
/// kernel maps them (mmapable arrays, ring buffers).
pub const PAGE_SIZE: usize = 4096;

/// A file mapped `MAP_SHARED` read-write. The mapping lives as long as the value.
pub struct Shm {
    ptr: NonNull<u8>,
    len: usize,
    fd: OwnedFd,
}

// SAFETY: the mapping is plain shared memory; all access to it goes through raw pointers and
// atomics whose synchronisation the map types define. Moving or sharing the handle between
// threads is as sound as sharing it between processes.
unsafe impl Send for Shm {}
// SAFETY: as above.
unsafe impl Sync for Shm {}

/// How a process that may not open a map file itself gets it opened (a session member that
/// dropped privileges asks the session's broker: `userbpf_runtime::session::broker`); called
/// only when `open(2)` of the path failed with `EACCES` or `EPERM`.
pub type OpenFallback = fn(&Path, i32, u32) -> io::Result<OwnedFd>;

static OPEN_FALLBACK: std::sync::OnceLock<OpenFallback> = std::sync::OnceLock::new();

/// Sets the process's [`OpenFallback`] (once; later calls change nothing).
pub fn set_open_fallback(f: OpenFallback) {
    let _ = OPEN_FALLBACK.set(f);
}

/// `open(2)` with `O_CLOEXEC`, through the [`OpenFallback`] when permission is denied.
fn open_fd(path: &Path, flags: i32, mode: u32) -> io::Result<OwnedFd> {
    let c = cpath(path)?;
    // SAFETY: `c` is a valid NUL-terminated path; open has no other memory effects.
    let fd = unsafe { libc::open(c.as_ptr(), flags | libc::O_CLOEXEC, mode as libc::c_uint) };
    if fd >= 0 {
        // SAFETY: `fd` was just returned by open and is owned by nothing else.
        return Ok(unsafe { OwnedFd::from_raw_fd(fd) });
    }
    let e = io::Error::last_os_error();
    match (e.raw_os_error(), OPEN_FALLBACK.get()) {
        (Some(libc::EACCES | libc::EPERM), Some(f)) => f(path, flags, mode).map_err(|_| e),
        _ => Err(e),
    }
}

fn cpath(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path has a NUL byte"))
}

impl Shm {
    /// Creates `path` (which must not exist) with mode 0600, sized `len` bytes (zero-filled),
    /// and maps it.
    pub fn create(path: &Path, len: usize) -> io::Result<Shm> {
        let fd = open_fd(path, libc::O_RDWR | libc::O_CREAT | libc::O_EXCL, 0o600)?;
        // SAFETY: ftruncate on a file descriptor we own.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) } != 0 {
            let e = io::Error::last_os_error();
            let _ = std::fs::remove_file(path);
            return Err(e);
        }
        Self::map(fd, len).inspect_err(|_| {
            let _ = std::fs::remove_file(path);
        })
    }

    /// Opens and maps an existing file, all of it.
    pub fn open(path: &Path) -> io::Result<Shm> {
        let fd = open_fd(path, libc::O_RDWR, 0)?;
        let len = std::fs::File::from(fd.try_clone()?).metadata()?.len() as usize;
        Self::map(fd, len)
    }

    fn map(fd: OwnedFd, len: usize) -> io::Result<Shm> {
        if len == 0 {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "empty shared-memory file"));
        }
        // SAFETY: a fresh shared mapping of a file we hold open; no existing memory is affected.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr = NonNull::new(p.cast::<u8>()).ok_or_else(|| io::Error::other("mmap returned null"))?;
        Ok(Shm { ptr, len, fd })
    }

    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// The open file, for mapping parts of it again (ring buffers map their data twice).
    pub fn fd(&self) -> &OwnedFd {
        &self.fd
    }
    /// Whether `[addr, addr+len)` lies inside the mapping.
    pub fn contains(&self, addr: u64, len: u64) -> bool {
        let start = self.ptr.as_ptr() as u64;
        addr >= start && len <= self.len as u64 && addr - start <= self.len as u64 - len
    }
}

impl Drop for Shm {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly the mapping this value created; nothing borrows it past
        // the value's life (the map types hand out raw pointers only within their own life).
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// A map error from a failed file operation: its errno, or EIO.
pub(crate) fn io_error(e: io::Error, what: &'static str) -> crate::MapError {
    crate::MapError::new(e.raw_os_error().unwrap_or(libc::EIO), what)
}

/// Identifies a map file and its layout version.
pub const MAP_MAGIC: u64 = u64::from_le_bytes(*b"UBPFMAP\0");
pub const MAP_LAYOUT_VERSION: u32 = 2;

/// The first bytes of every map file (the rest of the first page is free for the type).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct MapHeader {
    pub magic: u64,
    pub version: u32,
    pub map_type: u32,
    pub key_size: u32,
    pub value_size: u32,
    pub max_entries: u32,
    pub map_flags: u32,
    pub map_extra: u64,
    /// Per-CPU slots of per-CPU maps (possible CPUs at creation).
    pub nr_cpus: u32,
    /// The map's id in its session (set by the runtime; 0 until then).
    pub id: u32,
    pub name: [u8; 16],
}

impl MapHeader {
    pub fn new(spec: &MapSpec, nr_cpus: u32) -> MapHeader {
        let mut name = [0u8; 16];
        let n = spec.name.as_bytes();
        let k = n.len().min(15);
        name[..k].copy_from_slice(&n[..k]);
        MapHeader {
            magic: MAP_MAGIC,
            version: MAP_LAYOUT_VERSION,
            map_type: spec.map_type as u32,
            key_size: spec.key_size,
            value_size: spec.value_size,
            max_entries: spec.max_entries,
            map_flags: spec.map_flags,
            map_extra: spec.map_extra,
            nr_cpus,
            id: 0,
            name,
        }
    }

    /// Reads the header at the start of a mapping field by field with atomic loads (another
    /// process may be writing `id`); the magic with acquire, so a published header is whole.
    ///
    /// # Safety
    /// `p` is the page-aligned start of a mapping at least `size_of::<MapHeader>()` long.
    pub(crate) unsafe fn load(p: *const u8) -> MapHeader {
        use std::mem::offset_of;
        use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
        // SAFETY: every offset is a naturally aligned field of MapHeader (repr(C)) inside the
        // mapping, which is page-aligned; the words are only ever accessed atomically.
        unsafe {
            let f32 = |off: usize| AtomicU32::from_ptr(p.add(off).cast_mut().cast()).load(Ordering::Relaxed);
            let f64 = |off: usize| AtomicU64::from_ptr(p.add(off).cast_mut().cast()).load(Ordering::Relaxed);
            let name_off = offset_of!(MapHeader, name);
            let mut name = [0u8; 16];
            name[..8].copy_from_slice(&f64(name_off).to_ne_bytes());
            name[8..].copy_from_slice(&f64(name_off + 8).to_ne_bytes());
            MapHeader {
                magic: AtomicU64::from_ptr(p.cast_mut().cast()).load(Ordering::Acquire),
                version: f32(offset_of!(MapHeader, version)),
                map_type: f32(offset_of!(MapHeader, map_type)),
                key_size: f32(offset_of!(MapHeader, key_size)),
                value_size: f32(offset_of!(MapHeader, value_size)),
                max_entries: f32(offset_of!(MapHeader, max_entries)),
                map_flags: f32(offset_of!(MapHeader, map_flags)),
                map_extra: f64(offset_of!(MapHeader, map_extra)),
                nr_cpus: f32(offset_of!(MapHeader, nr_cpus)),
                id: f32(offset_of!(MapHeader, id)),
                name,
            }
        }
    }

    /// The spec the header was created from, or why the header is not a map's.
    pub fn spec(&self) -> Result<MapSpec, String> {
        if self.magic != MAP_MAGIC {
            return Err("not a userbpf map file (bad magic)".into());
        }
        if self.version != MAP_LAYOUT_VERSION {
            return Err(format!("map file layout version {} (this build reads {MAP_LAYOUT_VERSION})", self.version));
        }
        let map_type = MapType::from_u32(self.map_type).ok_or_else(|| format!("unknown map type {}", self.map_type))?;
        let end = self.name.iter().position(|&b| b == 0).unwrap_or(16);
        Ok(MapSpec {
            map_type,
            key_size: self.key_size,
            value_size: self.value_size,
            max_entries: self.max_entries,
            map_flags: self.map_flags,
            map_extra: self.map_extra,
            name: String::from_utf8_lossy(&self.name[..end]).into_owned(),
        })
    }
}

/// Number of possible CPUs (/sys/devices/system/cpu/possible), at least 1. Per-CPU maps keep
/// this many slots, as the kernel does.
pub fn possible_cpus() -> u32 {
    std::fs::read_to_string("/sys/devices/system/cpu/possible")
        .ok()
        .and_then(|s| parse_cpu_list(s.trim()))
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get() as u32))
        .max(1)
}

/// "0-3,5" -> 6 (highest CPU + 1).
fn parse_cpu_list(s: &str) -> Option<u32> {
    let mut max = None;
    for part in s.split(',') {
        let hi = part.rsplit('-').next()?.trim().parse::<u32>().ok()?;
        max = Some(max.map_or(hi, |m: u32| m.max(hi)));
    }
    max.map(|m| m + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_list() {
        assert_eq!(parse_cpu_list("0-1"), Some(2));
        assert_eq!(parse_cpu_list("0"), Some(1));
        assert_eq!(parse_cpu_list("0-3,8-9"), Some(10));
        assert_eq!(parse_cpu_list("x"), None);
        assert!(possible_cpus() >= 1);
    }

    #[test]
    fn create_open_share() {
        let dir = std::env::temp_dir().join(format!("userbpf-shm-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("m");
        let _ = std::fs::remove_file(&path);
        let a = Shm::create(&path, PAGE_SIZE).unwrap();
        assert!(Shm::create(&path, PAGE_SIZE).is_err(), "create is exclusive");
        let b = Shm::open(&path).unwrap();
        // SAFETY: both mappings are PAGE_SIZE long; offset 100 is inside.
        unsafe {
            a.as_ptr().add(100).write(7);
            assert_eq!(b.as_ptr().add(100).read(), 7);
        }
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        assert!(a.contains(a.as_ptr() as u64 + 4095, 1));
        assert!(!a.contains(a.as_ptr() as u64 + 4095, 2));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
