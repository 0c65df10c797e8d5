//! Maps shared with programs running in the kernel.
//!
//! A map that programs on both sides use is a kernel map. When it is an array, the kernel
//! creates it `BPF_F_MMAPABLE` and every process of the session maps the kernel's values over
//! the values of the session's map file (`MAP_FIXED` at the file's page-aligned values, the
//! `userbpf_maps::array` layout): the JIT's inlined lookups, the helpers, atomics and the CLI's
//! dumps then read and write the kernel's memory with no system call, and see the kernel
//! programs' writes as they happen. The kinds the kernel does not let user space map (hash,
//! LRU hash, per-CPU hash and array) are opened as [`Map::Kernel`]: every operation
//! is a `bpf()` call on the kernel map's descriptor (`userbpf_maps::kernel` gives the
//! semantics). [`shareable`] says which kinds can be shared at all.
//!
//! The session file `maps/ID.kernel` holds the kernel map's id and the process that holds it
//! (the `userbpf run` or loader that created it); [`Session::open_map`](crate::Session::open_map)
//! opens the kernel map wherever the map is opened (agents, loaders, the CLI).
//!
//! **Descriptors without privilege.** Opening a kernel map by id (`BPF_MAP_GET_FD_BY_ID`) needs
//! CAP_SYS_ADMIN, which a traced process rarely has. So the process holding the kernel maps
//! ([`provide`]) serves their descriptors on a unix socket (abstract name
//! `userbpf-kmaps-SESSIONHASH-PID`): a process asks for a kernel map id and gets a descriptor
//! (`SCM_RIGHTS`). Only processes of the server's user (or root) are answered (the peer's
//! credentials, `SO_PEERCRED`), as only they can open the session. A member that dropped
//! privileges after it joined (`crate::session::broker` opens the session's files for it) is
//! not answered here: a kernel map it had opened before the drop stays usable, one opened
//! later fails with this module's error. A process first uses the
//! descriptors it holds, then asks the holder, then tries `BPF_MAP_GET_FD_BY_ID`. With the
//! descriptor, a mapped array needs no further `bpf()` call (`mmap` only; its geometry is
//! checked with `BPF_OBJ_GET_INFO_BY_FD` when the kernel allows it), so it works even where
//! the kernel refuses `bpf()` to unprivileged processes (`kernel.unprivileged_bpf_disabled`
//! on kernels before 6.5); the `bpf()` kinds need `bpf()` on the descriptor, which kernels
//! from 6.5 on allow to any holder, and fail with the kernel's `EPERM` named otherwise.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::path::Path;
use std::sync::Mutex;

use userbpf_maps::{Map, MapSpec, MapType};

use crate::session::broker;

const BPF_MAP_GET_FD_BY_ID: libc::c_long = 14;
const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
const BPF_F_MMAPABLE: u32 = 1 << 10;
const BPF_F_RDONLY_PROG: u32 = 1 << 7;

/// What `maps/ID.kernel` records: the kernel map behind a session map.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelBacking {
    /// The kernel's map id.
    pub kernel_id: u32,
    /// The process serving its descriptor ([`provide`]; 0: none).
    pub holder: u32,
}

impl KernelBacking {
    /// The file's text: `kernel ID holder PID`.
    pub fn to_text(self) -> String {
        format!("kernel {} holder {}\n", self.kernel_id, self.holder)
    }
    /// Parses [`KernelBacking::to_text`] (`kernel ID` alone: no holder).
    pub fn parse(text: &str) -> Option<KernelBacking> {
        let rest = text.trim().strip_prefix("kernel ")?;
        let (id, holder) = match rest.split_once(" holder ") {
            Some((id, h)) => (id, h.parse().ok()?),
            None => (rest, 0),
        };
        Some(KernelBacking { kernel_id: id.parse().ok()?, holder })
    }
}

/// Which kinds of map can be shared with kernel programs: arrays by mapping their values,
/// these through `bpf()` (`Err`: why not).
pub fn shareable(map_type: u32) -> Result<(), &'static str> {
    use MapType::*;
    let Some(t) = MapType::from_u32(map_type) else { return Err("its type is unknown") };
    match t {
        BPF_MAP_TYPE_ARRAY
        | BPF_MAP_TYPE_HASH
        | BPF_MAP_TYPE_PERCPU_HASH
        | BPF_MAP_TYPE_LRU_HASH
        | BPF_MAP_TYPE_LRU_PERCPU_HASH
        | BPF_MAP_TYPE_PERCPU_ARRAY => Ok(()),
        BPF_MAP_TYPE_LPM_TRIE => Err(
            "a lookup's value belongs to the longest matching prefix, which bpf() does not name, so a program's writes through it could not be written back",
        ),
        BPF_MAP_TYPE_RINGBUF | BPF_MAP_TYPE_PERF_EVENT_ARRAY => Err(
            "user-space programs cannot write into the kernel's buffer (keep its writers on one side; the loader reads a kernel buffer as usual)",
        ),
        BPF_MAP_TYPE_ARRAY_OF_MAPS | BPF_MAP_TYPE_HASH_OF_MAPS | BPF_MAP_TYPE_PROG_ARRAY => {
            Err("maps of maps and program arrays name objects of one side")
        }
        _ => Err("its operations (push, pop, stack ids, ...) are not passed to the kernel from user-space programs"),
    }
}

// ---- descriptors ----

/// Kernel map descriptors this process holds, by kernel id: the ones it provides, and the ones
/// it was given.
static HELD: Mutex<Option<HashMap<u32, OwnedFd>>> = Mutex::new(None);

/// The server's socket of the holder `pid` of `session_dir`'s kernel maps.
fn socket_addr(session_dir: &Path, pid: u32) -> std::io::Result<SocketAddr> {
    let dir = std::fs::canonicalize(session_dir).unwrap_or_else(|_| session_dir.to_path_buf());
    // FNV-1a of the session directory.
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for &b in dir.as_os_str().as_encoded_bytes() {
        h = (h ^ b as u64).wrapping_mul(0x0100_0000_01b3);
    }
    <SocketAddr as std::os::linux::net::SocketAddrExt>::from_abstract_name(format!("userbpf-kmaps-{h:016x}-{pid}"))
}

/// Servers started by this process, by session directory.
static SERVING: Mutex<Vec<std::path::PathBuf>> = Mutex::new(Vec::new());

/// Makes kernel map `fd` (id `kernel_id`) available to the processes of `session_dir`: kept
/// here, and served to them (see the module docs). Returns this process's id, the holder to
/// record.
pub fn provide(session_dir: &Path, kernel_id: u32, fd: BorrowedFd<'_>) -> std::io::Result<u32> {
    let own = fd.try_clone_to_owned()?;
    HELD.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert_default().insert(kernel_id, own);
    let pid = std::process::id();
    let mut serving = SERVING.lock().unwrap_or_else(|e| e.into_inner());
    if serving.iter().any(|d| d == session_dir) {
        return Ok(pid);
    }
    let listener = UnixListener::bind_addr(&socket_addr(session_dir, pid)?)?;
    std::thread::Builder::new().name("userbpf-kmaps".into()).spawn(move || serve(listener))?;
    serving.push(session_dir.to_path_buf());
    Ok(pid)
}

/// Answers requests for kernel map descriptors: 4 bytes (the kernel id) in, one status byte
/// out (0: the descriptor rides along; else an errno).
fn serve(listener: UnixListener) {
    // SAFETY: geteuid has no arguments and cannot fail.
    let me = unsafe { libc::geteuid() };
    for conn in listener.incoming() {
        let Ok(mut conn) = conn else { continue };
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _ = conn.set_read_timeout(Some(std::time::Duration::from_secs(2)));
            let allowed = peer_uid(&conn).is_some_and(|u| u == me || u == 0);
            let mut id = [0u8; 4];
            if conn.read_exact(&mut id).is_err() {
                return;
            }
            if !allowed {
                let _ = conn.write_all(&[libc::EACCES as u8]);
                return;
            }
            let held = HELD.lock().unwrap_or_else(|e| e.into_inner());
            match held.as_ref().and_then(|h| h.get(&u32::from_ne_bytes(id))) {
                Some(fd) => {
                    let _ = send_fd(&conn, fd.as_raw_fd());
                }
                None => {
                    let _ = conn.write_all(&[libc::ENOENT as u8]);
                }
            }
        }));
    }
}

fn peer_uid(conn: &UnixStream) -> Option<u32> {
    broker::peer_cred(conn.as_raw_fd()).ok().map(|c| c.uid)
}

/// Sends status 0 with descriptor `fd` (`SCM_RIGHTS`).
fn send_fd(conn: &UnixStream, fd: i32) -> std::io::Result<()> {
    broker::send(conn.as_raw_fd(), &[0], Some(fd))
}

/// Asks holder `pid` of `session_dir`'s kernel maps for kernel map `kernel_id`.
fn ask(session_dir: &Path, pid: u32, kernel_id: u32) -> std::io::Result<OwnedFd> {
    let mut conn = UnixStream::connect_addr(&socket_addr(session_dir, pid)?)?;
    conn.set_read_timeout(Some(std::time::Duration::from_secs(2)))?;
    conn.write_all(&kernel_id.to_ne_bytes())?;
    let mut byte = [0u8];
    let (n, fd) = broker::recv(conn.as_raw_fd(), &mut byte)?;
    if n == 0 {
        return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "the holder closed the connection"));
    }
    match (byte[0], fd) {
        (0, Some(fd)) => Ok(fd),
        (e, _) => Err(std::io::Error::from_raw_os_error(if e == 0 { libc::EIO } else { e as i32 })),
    }
}

/// A descriptor of the kernel map behind a map of `session_dir` (see the module docs).
pub fn kernel_fd(session_dir: &Path, backing: KernelBacking) -> Result<OwnedFd, String> {
    let kid = backing.kernel_id;
    {
        let mut held = HELD.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(fd) = held.get_or_insert_default().get(&kid) {
            return fd.try_clone().map_err(|e| format!("duplicating kernel map id {kid}'s descriptor: {e}"));
        }
    }
    let asked = if backing.holder != 0 {
        match ask(session_dir, backing.holder, kid) {
            Ok(fd) => {
                let mut held = HELD.lock().unwrap_or_else(|e| e.into_inner());
                if let Ok(copy) = fd.try_clone() {
                    held.get_or_insert_default().insert(kid, copy);
                }
                return Ok(fd);
            }
            Err(e) => format!("asking its holder (pid {}): {e}; ", backing.holder),
        }
    } else {
        String::new()
    };
    map_fd_by_id(kid).map_err(|e| {
        format!(
            "opening kernel map id {kid}: {asked}BPF_MAP_GET_FD_BY_ID: {e}{}",
            if e.raw_os_error() == Some(libc::EPERM) { " (it needs CAP_SYS_ADMIN)" } else { "" }
        )
    })
}

/// Opens session map file `path` (map `id`) as the kernel map `backing` reached through
/// `bpf()` (a kind that cannot be mapped).
pub fn open_kernel_map(session_dir: &Path, path: &Path, backing: KernelBacking) -> Result<Map, String> {
    let fd = kernel_fd(session_dir, backing)?;
    let kernel = map_info(&fd).ok().and_then(|i| {
        Some(MapSpec {
            map_type: MapType::from_u32(i.map_type)?,
            key_size: i.key_size,
            value_size: i.value_size,
            max_entries: i.max_entries,
            map_flags: i.map_flags,
            map_extra: 0,
            name: String::new(),
        })
    });
    Map::open_kernel(path, fd, kernel.as_ref()).map_err(|e| format!("kernel map id {}: {e}", backing.kernel_id))
}

/// The part of the kernel's `struct bpf_map_info` this module reads.
#[repr(C)]
#[derive(Default, Clone, Copy, Debug)]
pub struct KernelMapInfo {
    pub map_type: u32,
    pub id: u32,
    pub key_size: u32,
    pub value_size: u32,
    pub max_entries: u32,
    pub map_flags: u32,
    pub name: [u8; 16],
}

/// `bpf()` through the `syscall` instruction itself (libc's `syscall` is the syscall server's
/// in a loader under `userbpf load`).
fn sys_bpf(cmd: libc::c_long, attr: &mut [u64]) -> std::io::Result<libc::c_long> {
    userbpf_maps::kernel::raw_bpf(cmd, attr)
}

/// A descriptor of kernel map `id` (`BPF_MAP_GET_FD_BY_ID`).
pub fn map_fd_by_id(id: u32) -> std::io::Result<OwnedFd> {
    let mut attr = [0u64; 2];
    attr[0] = id as u64; // map_id, then next_id and open_flags (0: read-write).
    let fd = sys_bpf(BPF_MAP_GET_FD_BY_ID, &mut attr)?;
    // SAFETY: the kernel returned a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// `BPF_OBJ_GET_INFO_BY_FD` of a kernel map.
pub fn map_info(fd: &OwnedFd) -> std::io::Result<KernelMapInfo> {
    let mut info = KernelMapInfo::default();
    let mut attr = [0u64; 2];
    // bpf_fd (u32), info_len (u32), info (u64 pointer).
    attr[0] = fd.as_raw_fd() as u32 as u64 | ((std::mem::size_of::<KernelMapInfo>() as u64) << 32);
    attr[1] = (&raw mut info) as u64;
    sys_bpf(BPF_OBJ_GET_INFO_BY_FD, &mut attr)?;
    Ok(info)
}

/// The kernel map types whose values a process can map (`BPF_F_MMAPABLE` arrays).
pub fn shareable_by_mmap(map_type: u32) -> bool {
    map_type == MapType::BPF_MAP_TYPE_ARRAY as u32
}

/// Maps the values of kernel map `backing` over `map`'s values in this process. `map` is a
/// session array with the kernel map's geometry (checked; the kernel's is `BPF_F_MMAPABLE`,
/// the session's has the same layout with or without the flag); read-only
/// for programs (`BPF_F_RDONLY_PROG`, a frozen `.rodata`) maps it read-only, as the kernel
/// allows only that for a frozen map.
pub fn map_kernel_values(session_dir: &Path, map: &Map, backing: KernelBacking) -> Result<(), String> {
    let kid = backing.kernel_id;
    let Some((off, len)) = map.values_region() else {
        return Err(format!("map {} is not an array: its values cannot be the kernel's", map.spec().name));
    };
    let fd = kernel_fd(session_dir, backing)?;
    let spec = map.spec();
    let info = match map_info(&fd) {
        Ok(i) => i,
        // Refused to this process (unprivileged bpf() disabled): the holder made the kernel map
        // for this session map; the kernel checks the mapping's length itself.
        Err(e) if e.raw_os_error() == Some(libc::EPERM) => KernelMapInfo {
            map_type: MapType::BPF_MAP_TYPE_ARRAY as u32,
            value_size: spec.value_size,
            max_entries: spec.max_entries,
            map_flags: BPF_F_MMAPABLE | spec.map_flags & BPF_F_RDONLY_PROG,
            ..Default::default()
        },
        Err(e) => return Err(format!("reading kernel map id {kid}'s info: {e}")),
    };
    if info.map_type != MapType::BPF_MAP_TYPE_ARRAY as u32
        || info.value_size != spec.value_size
        || info.max_entries != spec.max_entries
        || info.map_flags & BPF_F_MMAPABLE == 0
    {
        return Err(format!(
            "kernel map id {kid} (type {}, value_size {}, max_entries {}, flags {:#x}) does not match map {} (value_size {}, max_entries {}): not an mmapable array of the same geometry",
            info.map_type,
            info.value_size,
            info.max_entries,
            info.map_flags,
            spec.name,
            spec.value_size,
            spec.max_entries
        ));
    }
    let prot = if info.map_flags & BPF_F_RDONLY_PROG != 0 || spec.map_flags & BPF_F_RDONLY_PROG != 0 {
        libc::PROT_READ
    } else {
        libc::PROT_READ | libc::PROT_WRITE
    };
    let shm = map.shm();
    if off.checked_add(len).is_none_or(|end| end > shm.len()) {
        return Err(format!("map {}: values [{off}, +{len}) are outside its file", spec.name));
    }
    // SAFETY: `[base + off, base + off + len)` lies inside this map's own mapping (checked
    // above), so MAP_FIXED replaces only pages the map owns; they are replaced by the kernel
    // map's values, which have the same layout (elements of round_up(value_size, 8) bytes from
    // a page boundary) and length, so every pointer the map hands out stays valid. The map is
    // freshly opened or created by this process and not yet used by any program run.
    let p = unsafe {
        libc::mmap(shm.as_ptr().add(off).cast(), len, prot, libc::MAP_SHARED | libc::MAP_FIXED, fd.as_raw_fd(), 0)
    };
    if p == libc::MAP_FAILED {
        return Err(format!(
            "mapping kernel map id {kid}'s values ({len} bytes) over map {}: {}",
            spec.name,
            std::io::Error::last_os_error()
        ));
    }
    // The mapping keeps the kernel map alive; the descriptor is closed here.
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use userbpf_maps::MapSpec;

    #[test]
    fn backing_records_round_trip() {
        let b = KernelBacking { kernel_id: 4242, holder: 77 };
        assert_eq!(KernelBacking::parse("kernel 12"), Some(KernelBacking { kernel_id: 12, holder: 0 }));
        assert_eq!(KernelBacking::parse(&b.to_text()), Some(b));
        assert_eq!(KernelBacking::parse("map 3"), None);
        assert_eq!(KernelBacking::parse("kernel x"), None);
    }

    /// A kernel array (BPF_MAP_CREATE, BPF_F_MMAPABLE) of `max` 8-byte values: its id.
    fn kernel_array(value_size: u32, max: u32, flags: u32) -> (OwnedFd, u32) {
        let mut attr = [0u64; 9];
        attr[0] = MapType::BPF_MAP_TYPE_ARRAY as u64 | (4u64 << 32);
        attr[1] = value_size as u64 | ((max as u64) << 32);
        attr[2] = flags as u64;
        let fd = sys_bpf(0, &mut attr).expect("BPF_MAP_CREATE");
        // SAFETY: a new descriptor the kernel returned.
        let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
        let id = map_info(&fd).expect("info").id;
        (fd, id)
    }

    #[test]
    fn the_kernels_values_are_the_maps_and_a_mismatch_is_refused() {
        // SAFETY: geteuid has no arguments.
        if !userbpf_testutil::require(unsafe { libc::geteuid() } == 0, "root for kernel maps") {
            return;
        }
        let dir = userbpf_testutil::TmpDir::new("kernel-map");
        let spec = MapSpec {
            map_type: MapType::BPF_MAP_TYPE_ARRAY,
            key_size: 4,
            value_size: 8,
            max_entries: 600,
            map_flags: 0,
            map_extra: 0,
            name: "shared".into(),
        };
        let map = Map::create(&dir.path("shared"), &spec).unwrap();
        let (kfd, kid) = kernel_array(8, 600, BPF_F_MMAPABLE);
        map_kernel_values(dir.path("").as_path(), &map, KernelBacking { kernel_id: kid, holder: 0 }).unwrap();
        // Written here, read by the kernel; written by the kernel, read here.
        map.update_elem(&599u32.to_ne_bytes(), &77u64.to_ne_bytes(), 0).unwrap();
        let (key, mut value) = (599u32, 0u64);
        let mut attr = [kfd.as_raw_fd() as u64, (&raw const key) as u64, (&raw mut value) as u64, 0];
        sys_bpf(1, &mut attr).unwrap();
        assert_eq!(value, 77);
        let (key, value) = (3u32, 5u64);
        let mut attr = [kfd.as_raw_fd() as u64, (&raw const key) as u64, (&raw const value) as u64, 0];
        sys_bpf(2, &mut attr).unwrap();
        let mut out = [0u8; 8];
        map.lookup_elem(&3u32.to_ne_bytes(), &mut out).unwrap();
        assert_eq!(u64::from_ne_bytes(out), 5);
        // Another geometry, or an array the kernel cannot map: refused, saying why.
        let other = Map::create(&dir.path("other"), &MapSpec { max_entries: 10, name: "other".into(), ..spec.clone() })
            .unwrap();
        let e =
            map_kernel_values(dir.path("").as_path(), &other, KernelBacking { kernel_id: kid, holder: 0 }).unwrap_err();
        assert!(e.contains("does not match map other"), "{e}");
        let (_f, plain) = kernel_array(8, 600, 0);
        let third = Map::create(&dir.path("third"), &MapSpec { name: "third".into(), ..spec.clone() }).unwrap();
        let e = map_kernel_values(dir.path("").as_path(), &third, KernelBacking { kernel_id: plain, holder: 0 })
            .unwrap_err();
        assert!(e.contains("flags 0x0) does not match map third"), "{e}");
    }
}
