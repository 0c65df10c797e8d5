//! Cgroup helpers: `current_task_under_cgroup` (with a `CGROUP_ARRAY` map),
//! `get_current_cgroup_id` and `get_current_ancestor_cgroup_id`, for the cgroup v2
//! hierarchy as the kernel's do (`task_dfl_cgroup`).
//!
//! A cgroup's id is the inode number of its directory in the cgroup2 file system (the
//! kernel's `cgroup_id()`). The calling thread's cgroup is read from
//! `/proc/thread-self/cgroup` (the `0::PATH` line) and found under the cgroup2 mount
//! (`/sys/fs/cgroup`, or `/sys/fs/cgroup/unified` on hybrid systems, checked by statfs); ids
//! are then `stat`s of that directory and of its parents. A thread can be moved to another
//! cgroup at any time, so nothing is cached: **these helpers make system calls** (an open, a
//! read and a close of the proc file, a stat per level), unlike the other helpers. Programs
//! call them only when they filter by cgroup (libbpf-tools' `-c`), where the kernel's cost is
//! also paid per event. No allocation: paths are built in stack buffers.
//!
//! Paths in `/proc/thread-self/cgroup` are relative to the thread's cgroup namespace, as the
//! cgroup2 mount of that namespace shows them; ancestors above the namespace's root cannot be
//! seen from it (`under_cgroup` is then 0 and ancestor levels count from the namespace root).

use std::sync::atomic::{AtomicU8, Ordering};

use userbpf_maps::Map;
use userbpf_maps::cgroup_array::CGROUP2_SUPER_MAGIC;
use userbpf_vm::HelperRegistry;

use super::maps::map_ref;
use super::{EINVAL, helper, neg};

const PATH_MAX: usize = 4096;

/// The cgroup2 mount candidates, NUL-terminated.
const ROOTS: [&[u8]; 2] = [b"/sys/fs/cgroup\0", b"/sys/fs/cgroup/unified\0"];
/// Which of [`ROOTS`] is the cgroup2 mount: 0 not checked yet, 1 + index, or 255 none.
static ROOT: AtomicU8 = AtomicU8::new(0);

fn root() -> Option<&'static [u8]> {
    let r = ROOT.load(Ordering::Relaxed);
    if r == 0 {
        let found = ROOTS
            .iter()
            .position(|p| {
                // SAFETY: statfs on a NUL-terminated path into a zeroed struct we own.
                unsafe {
                    let mut s: libc::statfs = std::mem::zeroed();
                    libc::statfs(p.as_ptr().cast(), &mut s) == 0 && s.f_type == CGROUP2_SUPER_MAGIC
                }
            })
            .map_or(255, |i| i as u8 + 1);
        ROOT.store(found, Ordering::Relaxed);
        return root();
    }
    ROOTS.get(r as usize - 1).map(|p| &p[..p.len() - 1])
}

/// The directory of the calling thread's cgroup v2: its path in `buf` (NUL-terminated), the
/// path's length and the length of the mount's own path (the hierarchy's root).
fn current_dir(buf: &mut [u8; PATH_MAX]) -> Option<(usize, usize)> {
    let root = root()?;
    let mut file = [0u8; 4096];
    // SAFETY: open/read/close of a NUL-terminated path into a buffer we own.
    let n = unsafe {
        let fd = libc::open(c"/proc/thread-self/cgroup".as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC);
        if fd < 0 {
            return None;
        }
        let n = libc::read(fd, file.as_mut_ptr().cast(), file.len());
        libc::close(fd);
        n
    };
    if n <= 0 {
        return None;
    }
    let text = &file[..n as usize];
    let path = text.split(|&b| b == b'\n').find_map(|l| l.strip_prefix(b"0::"))?;
    let path = if path == b"/" { &[][..] } else { path };
    let len = root.len() + path.len();
    if (!path.is_empty() && path[0] != b'/') || len + 1 > buf.len() {
        return None;
    }
    buf[..root.len()].copy_from_slice(root);
    buf[root.len()..len].copy_from_slice(path);
    buf[len] = 0;
    Some((len, root.len()))
}

/// The inode number of the directory at `buf[..len]` (NUL at `len`).
fn ino(buf: &[u8; PATH_MAX], len: usize) -> Option<u64> {
    debug_assert_eq!(buf[len], 0);
    // SAFETY: stat of a NUL-terminated path into a zeroed struct we own.
    unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        (libc::stat(buf.as_ptr().cast(), &mut st) == 0).then_some(st.st_ino)
    }
}

/// Cuts the path in `buf` to its parent (not above `root_len`); false at the root.
fn parent(buf: &mut [u8; PATH_MAX], len: &mut usize, root_len: usize) -> bool {
    if *len <= root_len {
        return false;
    }
    let cut = buf[root_len..*len].iter().rposition(|&b| b == b'/').map_or(root_len, |i| root_len + i);
    *len = cut;
    buf[cut] = 0;
    true
}

/// `long bpf_current_task_under_cgroup(map, index)`: 1 if the calling thread's cgroup is the
/// one in the `CGROUP_ARRAY` slot or a descendant of it, else 0; `-E2BIG` for an index past
/// the end, `-EAGAIN` for an empty slot (the kernel's errors).
unsafe extern "C" fn current_task_under_cgroup(map: u64, index: u64, _: u64, _: u64, _: u64) -> u64 {
    let Some(Map::CgroupArray(a)) = map_ref(map) else { return EINVAL };
    let want = match a.get(index as u32) {
        Ok(0) => return neg(libc::EAGAIN),
        Ok(id) => id,
        Err(e) => return e.to_helper_ret(),
    };
    let mut buf = [0u8; PATH_MAX];
    let Some((mut len, root_len)) = current_dir(&mut buf) else { return 0 };
    loop {
        if ino(&buf, len) == Some(want) {
            return 1;
        }
        if !parent(&mut buf, &mut len, root_len) {
            return 0;
        }
    }
}

/// `u64 bpf_get_current_cgroup_id(void)`: the id of the calling thread's cgroup v2 (0 if it
/// cannot be found, e.g. no cgroup2 mount).
unsafe extern "C" fn get_current_cgroup_id(_: u64, _: u64, _: u64, _: u64, _: u64) -> u64 {
    let mut buf = [0u8; PATH_MAX];
    current_dir(&mut buf).and_then(|(len, _)| ino(&buf, len)).unwrap_or(0)
}

/// `u64 bpf_get_current_ancestor_cgroup_id(int ancestor_level)`: the id of the calling
/// thread's cgroup's ancestor at `ancestor_level` (0: the root), or 0 if the cgroup is not
/// that deep.
unsafe extern "C" fn get_current_ancestor_cgroup_id(level: u64, _: u64, _: u64, _: u64, _: u64) -> u64 {
    let level = level as i32;
    if level < 0 {
        return 0;
    }
    let mut buf = [0u8; PATH_MAX];
    let Some((mut len, root_len)) = current_dir(&mut buf) else { return 0 };
    let depth = buf[root_len..len].iter().filter(|&&b| b == b'/').count();
    if level as usize > depth {
        return 0;
    }
    for _ in level as usize..depth {
        parent(&mut buf, &mut len, root_len);
    }
    ino(&buf, len).unwrap_or(0)
}

pub(crate) fn register(reg: &mut HelperRegistry) {
    reg.register(helper(37, "current_task_under_cgroup", current_task_under_cgroup));
    reg.register(helper(80, "get_current_cgroup_id", get_current_cgroup_id));
    reg.register(helper(123, "get_current_ancestor_cgroup_id", get_current_ancestor_cgroup_id));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parents_stop_at_the_root() {
        let mut buf = [0u8; PATH_MAX];
        let p = b"/sys/fs/cgroup/a.slice/b";
        buf[..p.len()].copy_from_slice(p);
        let (mut len, root) = (p.len(), 14);
        assert!(parent(&mut buf, &mut len, root));
        assert_eq!(&buf[..len], b"/sys/fs/cgroup/a.slice");
        assert_eq!(buf[len], 0);
        assert!(parent(&mut buf, &mut len, root));
        assert_eq!(&buf[..len], b"/sys/fs/cgroup");
        assert!(!parent(&mut buf, &mut len, root));
    }
}
