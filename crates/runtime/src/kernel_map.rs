//! Maps shared with programs running in the kernel.
//!
//! A map that programs on both sides use is a kernel map. When it is an array, the kernel
//! creates it `BPF_F_MMAPABLE` and every process of the session maps the kernel's values over
//! the values of the session's map file (`MAP_FIXED` at the file's page-aligned values, the
//! `userbpf_maps::array` layout): the JIT's inlined lookups, the helpers, atomics and the CLI's
//! dumps then read and write the kernel's memory with no system call, and see the kernel
//! programs' writes as they happen. The session file `maps/ID.kernel` holds the kernel map's
//! id; [`Session::open_map`](crate::Session::open_map) maps the kernel's values wherever the
//! map is opened (agents, loaders, the CLI), through `BPF_MAP_GET_FD_BY_ID`, so the processes
//! need the privilege the kernel asks for that (CAP_SYS_ADMIN), as the kernel programs do.
//!
//! Maps of other kinds are not shared this way (their memory is not mappable): the caller
//! keeps them on one side or reaches them through `bpf()` (see `userbpf-kernel`).

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use userbpf_maps::{Map, MapType};

const BPF_MAP_GET_FD_BY_ID: libc::c_long = 14;
const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
const BPF_F_MMAPABLE: u32 = 1 << 10;
const BPF_F_RDONLY_PROG: u32 = 1 << 7;

/// What `maps/ID.kernel` records: the kernel map behind a session map.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelBacking {
    /// The kernel's map id.
    pub kernel_id: u32,
}

impl KernelBacking {
    /// The file's text: `kernel ID`.
    pub fn to_text(self) -> String {
        format!("kernel {}\n", self.kernel_id)
    }
    /// Parses [`KernelBacking::to_text`].
    pub fn parse(text: &str) -> Option<KernelBacking> {
        let id = text.trim().strip_prefix("kernel ")?.parse().ok()?;
        Some(KernelBacking { kernel_id: id })
    }
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

/// `bpf()` through the `syscall` instruction itself: in a loader under `userbpf load`,
/// libc's `syscall` is the syscall server's, which would answer instead of the kernel.
fn sys_bpf(cmd: libc::c_long, attr: &mut [u64]) -> std::io::Result<libc::c_long> {
    let r: i64;
    // SAFETY: the x86-64 Linux system call convention (number in rax, arguments in rdi, rsi,
    // rdx; rcx and r11 clobbered). `attr` is a writable buffer of the given size, laid out as
    // the command's part of `union bpf_attr` (callers fill it); the kernel reads and writes
    // at most that many bytes, and the pointers inside point to live buffers.
    unsafe {
        std::arch::asm!("syscall", inlateout("rax") libc::SYS_bpf => r, in("rdi") cmd, in("rsi") attr.as_mut_ptr(),
             in("rdx") std::mem::size_of_val(attr), lateout("rcx") _, lateout("r11") _, options(nostack));
    }
    if r < 0 { Err(std::io::Error::from_raw_os_error(-r as i32)) } else { Ok(r) }
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
pub fn map_kernel_values(map: &Map, backing: KernelBacking) -> Result<(), String> {
    let kid = backing.kernel_id;
    let Some((off, len)) = map.values_region() else {
        return Err(format!("map {} is not an array: its values cannot be the kernel's", map.spec().name));
    };
    let fd = map_fd_by_id(kid).map_err(|e| format!("opening kernel map id {kid} (BPF_MAP_GET_FD_BY_ID): {e}"))?;
    let info = map_info(&fd).map_err(|e| format!("reading kernel map id {kid}'s info: {e}"))?;
    let spec = map.spec();
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
        let b = KernelBacking { kernel_id: 4242 };
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
        map_kernel_values(&map, KernelBacking { kernel_id: kid }).unwrap();
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
        let e = map_kernel_values(&other, KernelBacking { kernel_id: kid }).unwrap_err();
        assert!(e.contains("does not match map other"), "{e}");
        let (_f, plain) = kernel_array(8, 600, 0);
        let third = Map::create(&dir.path("third"), &MapSpec { name: "third".into(), ..spec.clone() }).unwrap();
        let e = map_kernel_values(&third, KernelBacking { kernel_id: plain }).unwrap_err();
        assert!(e.contains("flags 0x0) does not match map third"), "{e}");
    }
}
