//! The cgroup helpers (`current_task_under_cgroup` with a CGROUP_ARRAY,
//! `get_current_cgroup_id`, `get_current_ancestor_cgroup_id`) in a child process moved into
//! fresh cgroups, and the ids compared with the kernel's (bpftrace's `cgroup` builtin is the
//! kernel's `bpf_get_current_cgroup_id`).

use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use userbpf_maps::cgroup_array::CGROUP2_SUPER_MAGIC;
use userbpf_maps::*;
use userbpf_runtime::helpers::{self, maps::register_map};
use userbpf_vm::HelperFn;

fn func(id: u32) -> HelperFn {
    helpers::registry().get(id).unwrap_or_else(|| panic!("helper {id} not registered")).func
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

/// This process's cgroup v2 directory.
fn own_cgroup(root: &Path) -> PathBuf {
    let text = std::fs::read_to_string("/proc/self/cgroup").unwrap();
    let rel = text.lines().find_map(|l| l.strip_prefix("0::")).expect("a cgroup v2 line");
    root.join(rel.trim_start_matches('/'))
}

fn ino(p: &Path) -> u64 {
    std::fs::metadata(p).unwrap_or_else(|e| panic!("{}: {e}", p.display())).ino()
}

/// Cgroups made for one test, removed (children first) when dropped.
struct Cgroups(Vec<PathBuf>);

impl Drop for Cgroups {
    fn drop(&mut self) {
        for d in self.0.iter().rev() {
            let _ = std::fs::remove_dir(d);
        }
    }
}

/// The cgroup ids the kernel gives a process in `cg`: bpftrace's `cgroup` in BEGIN (run in
/// bpftrace's own process, moved there before it starts).
fn kernel_cgroup_id(cg: &Path) -> u64 {
    let script = format!(
        "echo $$ > {}/cgroup.procs && exec bpftrace -e 'BEGIN {{ printf(\"cg=%llu\\n\", cgroup); exit(); }}'",
        cg.display()
    );
    let out = Command::new("sh").args(["-c", &script]).output().expect("running sh");
    let text = String::from_utf8_lossy(&out.stdout);
    let id = text.lines().find_map(|l| l.strip_prefix("cg=")).and_then(|v| v.trim().parse().ok());
    id.unwrap_or_else(|| {
        panic!("bpftrace on the kernel gave no cgroup id:\n{text}\n{}", String::from_utf8_lossy(&out.stderr))
    })
}

#[test]
fn helpers_see_the_calling_threads_cgroup_v2() {
    let root = cgroup2_root();
    let own = own_cgroup(&root);
    let a = own.join(format!("userbpf-test-{}", std::process::id()));
    let (b, c) = (a.join("b"), a.join("c"));
    let _ = std::fs::remove_dir(&b);
    let _ = std::fs::remove_dir(&c);
    let _ = std::fs::remove_dir(&a);
    let mut made = Cgroups(Vec::new());
    for d in [&a, &b, &c] {
        std::fs::create_dir(d).unwrap_or_else(|e| panic!("creating the cgroup {}: {e}", d.display()));
        made.0.push(d.clone());
    }

    // Slots: 0 = a, 1 = b, 2 = c, 3 = the hierarchy's root, 4 empty.
    let dir = userbpf_testutil::TmpDir::new("cgroup-helpers");
    let spec = MapSpec {
        map_type: MapType::BPF_MAP_TYPE_CGROUP_ARRAY,
        key_size: 4,
        value_size: 4,
        max_entries: 5,
        map_flags: 0,
        map_extra: 0,
        name: "cg".into(),
    };
    let map = Arc::new(Map::create(&dir.join("1"), &spec).unwrap());
    map.set_id(1);
    assert!(register_map(1, map.clone()));
    for (i, d) in [&a, &b, &c, &root].into_iter().enumerate() {
        let f = std::fs::File::open(d).unwrap();
        map.update_elem(&(i as u32).to_ne_bytes(), &f.as_raw_fd().to_ne_bytes(), BPF_ANY).unwrap();
    }
    let m = Arc::as_ptr(&map) as u64;
    let (under, id, ancestor) = (func(37), func(80), func(123));
    let depth_b = b.strip_prefix(&root).unwrap().components().count() as u64;

    // In a child moved into b: only system calls between fork and _exit.
    let procs = std::ffi::CString::new(b.join("cgroup.procs").into_os_string().into_encoded_bytes()).unwrap();
    let mut pipe = [0i32; 2];
    // SAFETY: pipe into a local array.
    assert_eq!(unsafe { libc::pipe(pipe.as_mut_ptr()) }, 0);
    // SAFETY: the child makes only system calls (open, write, the helpers' open/read/stat)
    // and leaves with _exit; the registry and the map were set up before the fork.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        // SAFETY: as above; every buffer is a local.
        unsafe {
            let fd = libc::open(procs.as_ptr(), libc::O_WRONLY);
            let moved = fd >= 0 && libc::write(fd, b"0".as_ptr().cast(), 1) == 1;
            let r: [u64; 12] = [
                moved as u64,
                under(m, 0, 0, 0, 0),
                under(m, 1, 0, 0, 0),
                under(m, 2, 0, 0, 0),
                under(m, 3, 0, 0, 0),
                under(m, 4, 0, 0, 0),
                under(m, 5, 0, 0, 0),
                id(0, 0, 0, 0, 0),
                ancestor(0, 0, 0, 0, 0),
                ancestor(depth_b - 1, 0, 0, 0, 0),
                ancestor(depth_b, 0, 0, 0, 0),
                ancestor(depth_b + 1, 0, 0, 0, 0),
            ];
            libc::write(pipe[1], r.as_ptr().cast(), std::mem::size_of_val(&r));
            libc::_exit(0);
        }
    }
    // SAFETY: closing our copy of the write end; reading into a local; reaping the child.
    let r = unsafe {
        libc::close(pipe[1]);
        let mut r = [0u64; 12];
        let n = libc::read(pipe[0], r.as_mut_ptr().cast(), std::mem::size_of_val(&r));
        libc::close(pipe[0]);
        let mut st = 0;
        libc::waitpid(pid, &mut st, 0);
        assert_eq!(n as usize, std::mem::size_of_val(&r), "the child reported");
        r
    };
    let neg = |e: i32| (-(e as i64)) as u64;
    assert_eq!(r[0], 1, "the child moved itself into {}", b.display());
    assert_eq!(r[1], 1, "under its cgroup's parent");
    assert_eq!(r[2], 1, "under its own cgroup");
    assert_eq!(r[3], 0, "not under a sibling");
    assert_eq!(r[4], 1, "under the root");
    assert_eq!(r[5], neg(libc::EAGAIN), "empty slot");
    assert_eq!(r[6], neg(libc::E2BIG), "index past the end");
    assert_eq!(r[7], ino(&b), "get_current_cgroup_id");
    assert_eq!(r[8], ino(&root), "ancestor 0: the root");
    assert_eq!(r[9], ino(&a), "ancestor one level up");
    assert_eq!(r[10], ino(&b), "ancestor at its own level: itself");
    assert_eq!(r[11], 0, "deeper than the cgroup");

    // The test's own thread (in `own`, not under a).
    // SAFETY: helpers called with the arguments they expect (a registered map).
    unsafe {
        assert_eq!(under(m, 0, 0, 0, 0), 0);
        assert_eq!(under(m, 3, 0, 0, 0), 1);
        assert_eq!(id(0, 0, 0, 0, 0), ino(&own));
    }
    // Not a cgroup array: EINVAL, as a map of the wrong type is refused.
    let plain = Arc::new(
        Map::create(&dir.join("2"), &MapSpec { map_type: MapType::BPF_MAP_TYPE_ARRAY, value_size: 4, ..spec.clone() })
            .unwrap(),
    );
    plain.set_id(2);
    assert!(register_map(2, plain.clone()));
    // SAFETY: as above.
    assert_eq!(unsafe { under(Arc::as_ptr(&plain) as u64, 0, 0, 0, 0) }, neg(libc::EINVAL));

    // The kernel's ids are these inode numbers.
    assert_eq!(
        kernel_cgroup_id(&c),
        ino(&c),
        "bpftrace's cgroup (the kernel's bpf_get_current_cgroup_id) in {}",
        c.display()
    );
    drop(made);
    let _ = std::fs::remove_dir_all(&dir);
}
