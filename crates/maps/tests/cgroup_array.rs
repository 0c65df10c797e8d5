//! CGROUP_ARRAY: creation checks, updates with cgroup2 directory descriptors (stored as the
//! cgroup's id, the directory's inode number) and the kernel's errors for the rest.

use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;

use userbpf_maps::cgroup_array::{CGROUP2_SUPER_MAGIC, cgroup_id_of_fd};
use userbpf_maps::*;

fn spec(key: u32, value: u32, max: u32, flags: u32) -> MapSpec {
    MapSpec {
        map_type: MapType::BPF_MAP_TYPE_CGROUP_ARRAY,
        key_size: key,
        value_size: value,
        max_entries: max,
        map_flags: flags,
        map_extra: 0,
        name: "cg".into(),
    }
}

fn tmp(name: &str) -> PathBuf {
    let p = std::env::temp_dir().join(format!("userbpf-cgarray-{}-{name}", std::process::id()));
    let _ = std::fs::remove_file(&p);
    p
}

/// The cgroup2 mount (unified or hybrid layout).
fn cgroup2_root() -> PathBuf {
    for p in ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"] {
        let c = std::ffi::CString::new(p).unwrap();
        // SAFETY: statfs into a zeroed struct we own.
        let ok = unsafe {
            let mut s: libc::statfs = std::mem::zeroed();
            libc::statfs(c.as_ptr(), &mut s) == 0 && s.f_type as i64 == CGROUP2_SUPER_MAGIC
        };
        if ok {
            return PathBuf::from(p);
        }
    }
    panic!("no cgroup2 file system mounted at /sys/fs/cgroup or /sys/fs/cgroup/unified");
}

fn errno<T>(r: Result<T, MapError>) -> i32 {
    r.err().map_or(0, |e| e.errno())
}

#[test]
fn creation_checks_as_the_kernels_fd_arrays() {
    assert_eq!(errno(Map::create(&tmp("v8"), &spec(4, 8, 1, 0))), libc::EINVAL, "value is a 4-byte fd");
    assert_eq!(errno(Map::create(&tmp("k8"), &spec(8, 4, 1, 0))), libc::EINVAL);
    assert_eq!(errno(Map::create(&tmp("max0"), &spec(4, 4, 0, 0))), libc::EINVAL);
    assert_eq!(errno(Map::create(&tmp("rdonly"), &spec(4, 4, 1, BPF_F_RDONLY_PROG))), libc::EINVAL);
    assert_eq!(errno(Map::create(&tmp("mmap"), &spec(4, 4, 1, BPF_F_MMAPABLE))), libc::EINVAL);
    let p = tmp("ok");
    let m = Map::create(&p, &spec(4, 4, 2, BPF_F_RDONLY)).unwrap();
    assert_eq!(m.map_type(), MapType::BPF_MAP_TYPE_CGROUP_ARRAY);
    assert_eq!(MapType::from_u32(8), Some(MapType::BPF_MAP_TYPE_CGROUP_ARRAY));
    assert_eq!(m.map_type().name(), "cgroup_array");
    drop(m);
    let _ = std::fs::remove_file(p);
}

#[test]
fn slots_hold_cgroup_ids_given_by_descriptors() {
    let root = cgroup2_root();
    let p = tmp("slots");
    let m = Map::create(&p, &spec(4, 4, 2, 0)).unwrap();
    let Map::CgroupArray(a) = &m else { panic!("not a cgroup array") };
    let dir = std::fs::File::open(&root).unwrap();
    let fd = dir.as_raw_fd().to_ne_bytes();
    let ino = std::fs::metadata(&root).unwrap().ino();
    assert_eq!(cgroup_id_of_fd(dir.as_raw_fd()).unwrap(), ino);

    assert_eq!(a.get(0).unwrap(), 0, "empty");
    m.update_elem(&0u32.to_ne_bytes(), &fd, BPF_ANY).unwrap();
    assert_eq!(a.get(0).unwrap(), ino);
    // Opened again in another mapping: the same id.
    let again = Map::open(&p).unwrap();
    let Map::CgroupArray(b) = &again else { panic!("not a cgroup array") };
    assert_eq!(b.get(0).unwrap(), ino);

    assert_eq!(errno(m.update_elem(&0u32.to_ne_bytes(), &fd, BPF_NOEXIST)), libc::EINVAL, "only BPF_ANY");
    assert_eq!(errno(m.update_elem(&2u32.to_ne_bytes(), &fd, BPF_ANY)), libc::E2BIG);
    assert_eq!(errno(a.get(2)), libc::E2BIG);
    // Not a cgroup2 directory: a regular file, a directory elsewhere, a closed descriptor.
    let file = std::fs::File::open("/proc/self/status").unwrap();
    assert_eq!(errno(m.update_elem(&1u32.to_ne_bytes(), &file.as_raw_fd().to_ne_bytes(), BPF_ANY)), libc::EBADF);
    let tmpdir = std::fs::File::open(std::env::temp_dir()).unwrap();
    assert_eq!(errno(m.update_elem(&1u32.to_ne_bytes(), &tmpdir.as_raw_fd().to_ne_bytes(), BPF_ANY)), libc::EBADF);
    assert_eq!(errno(m.update_elem(&1u32.to_ne_bytes(), &(-1i32).to_ne_bytes(), BPF_ANY)), libc::EBADF);
    assert_eq!(a.get(1).unwrap(), 0, "failed updates store nothing");

    // No userspace lookup; delete; keys as an array.
    let mut v = [0u8; 4];
    assert_eq!(errno(m.lookup_elem(&0u32.to_ne_bytes(), &mut v)), ENOTSUPP);
    let mut k = [0u8; 4];
    m.get_next_key(None, &mut k).unwrap();
    assert_eq!(u32::from_ne_bytes(k), 0);
    m.get_next_key(Some(&0u32.to_ne_bytes()), &mut k).unwrap();
    assert_eq!(u32::from_ne_bytes(k), 1);
    assert_eq!(errno(m.get_next_key(Some(&1u32.to_ne_bytes()), &mut k)), libc::ENOENT);
    assert_eq!(errno(m.delete_elem(&1u32.to_ne_bytes())), libc::ENOENT);
    assert_eq!(errno(m.delete_elem(&5u32.to_ne_bytes())), libc::EINVAL);
    m.delete_elem(&0u32.to_ne_bytes()).unwrap();
    assert_eq!(b.get(0).unwrap(), 0);
    drop((m, again));
    let _ = std::fs::remove_file(&p);
}
