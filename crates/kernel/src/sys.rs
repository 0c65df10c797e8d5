//! Raw `bpf()` calls on kernel maps: their info, lookups, updates and iteration (what user
//! space does to a kernel map it cannot map).

use std::io;
use std::os::fd::RawFd;

const BPF_MAP_LOOKUP_ELEM: libc::c_long = 1;
const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
const BPF_MAP_GET_NEXT_KEY: libc::c_long = 4;
const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;

fn sys_bpf(cmd: libc::c_long, attr: &mut [u64; 4]) -> io::Result<libc::c_long> {
    // SAFETY: `attr` is a writable 32-byte buffer laid out as the command's part of `union
    // bpf_attr` (the callers fill it; pointers in it point to live buffers of the sizes the
    // map's key and value need).
    let r = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr.as_mut_ptr(), 32usize) };
    if r < 0 { Err(io::Error::last_os_error()) } else { Ok(r) }
}

/// The part of `struct bpf_map_info` read here.
#[repr(C)]
#[derive(Default, Clone, Copy, Debug)]
pub struct MapInfo {
    pub map_type: u32,
    pub id: u32,
    pub key_size: u32,
    pub value_size: u32,
    pub max_entries: u32,
    pub map_flags: u32,
    pub name: [u8; 16],
}

/// `BPF_OBJ_GET_INFO_BY_FD` of map `fd`.
pub fn map_info(fd: RawFd) -> io::Result<MapInfo> {
    let mut info = MapInfo::default();
    let mut attr = [0u64; 4];
    attr[0] = fd as u32 as u64 | ((std::mem::size_of::<MapInfo>() as u64) << 32);
    attr[1] = (&raw mut info) as u64;
    sys_bpf(BPF_OBJ_GET_INFO_BY_FD, &mut attr)?;
    Ok(info)
}

/// `struct bpf_prog_info`'s size on 6.x kernels (older ones fill a prefix; the rest stays 0).
const PROG_INFO_LEN: usize = 232;
/// Where `recursion_misses` (5.12+) lies in it.
const RECURSION_MISSES_AT: usize = 208;

/// How many times the kernel skipped program `fd` because another tracing program was
/// already running on that CPU (`bpf_prog_info.recursion_misses`; 0 before 5.12).
pub fn prog_recursion_misses(fd: RawFd) -> io::Result<u64> {
    let mut info = [0u64; PROG_INFO_LEN / 8];
    let mut attr = [0u64; 4];
    attr[0] = fd as u32 as u64 | ((PROG_INFO_LEN as u64) << 32);
    attr[1] = info.as_mut_ptr() as u64;
    sys_bpf(BPF_OBJ_GET_INFO_BY_FD, &mut attr)?;
    Ok(info[RECURSION_MISSES_AT / 8])
}

fn elem_attr(fd: RawFd, key: *const u8, value: u64, flags: u64) -> [u64; 4] {
    // map_fd (u32, padded), key (u64), value / next_key (u64), flags (u64).
    [fd as u32 as u64, key as u64, value, flags]
}

/// `BPF_MAP_LOOKUP_ELEM`: `value` must hold the map's value (per-CPU: one per possible CPU,
/// rounded up to 8 bytes).
pub fn lookup(fd: RawFd, key: &[u8], value: &mut [u8]) -> io::Result<()> {
    let mut attr = elem_attr(fd, key.as_ptr(), value.as_mut_ptr() as u64, 0);
    sys_bpf(BPF_MAP_LOOKUP_ELEM, &mut attr).map(|_| ())
}

/// `BPF_MAP_UPDATE_ELEM`.
pub fn update(fd: RawFd, key: &[u8], value: &[u8], flags: u64) -> io::Result<()> {
    let mut attr = elem_attr(fd, key.as_ptr(), value.as_ptr() as u64, flags);
    sys_bpf(BPF_MAP_UPDATE_ELEM, &mut attr).map(|_| ())
}

/// `BPF_MAP_GET_NEXT_KEY`: the key after `key` (the first for `None`); `Ok(false)` after the
/// last.
pub fn next_key(fd: RawFd, key: Option<&[u8]>, next: &mut [u8]) -> io::Result<bool> {
    let kp = key.map_or(std::ptr::null(), |k| k.as_ptr());
    let mut attr = elem_attr(fd, kp, next.as_mut_ptr() as u64, 0);
    match sys_bpf(BPF_MAP_GET_NEXT_KEY, &mut attr) {
        Ok(_) => Ok(true),
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Every (key, value) of map `fd`, as `bpf()` iterates it; `value_len` is the value buffer's
/// size (per-CPU maps: one rounded value per possible CPU).
pub fn entries(fd: RawFd, key_size: usize, value_len: usize) -> io::Result<Vec<(Vec<u8>, Vec<u8>)>> {
    let mut out = Vec::new();
    let mut key: Option<Vec<u8>> = None;
    loop {
        let mut next = vec![0u8; key_size];
        if !next_key(fd, key.as_deref(), &mut next)? {
            return Ok(out);
        }
        let mut value = vec![0u8; value_len];
        match lookup(fd, &next, &mut value) {
            Ok(()) => out.push((next.clone(), value)),
            // Deleted meanwhile.
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
            Err(e) => return Err(e),
        }
        key = Some(next);
    }
}
