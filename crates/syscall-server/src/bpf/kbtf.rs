//! The kernel's BTF objects (vmlinux and each module's, as `/sys/kernel/btf` lists them),
//! served through `bpf()` as the kernel serves them: they are listed by BTF_GET_NEXT_ID,
//! opened by BTF_GET_FD_BY_ID, and BPF_OBJ_GET_INFO_BY_FD on them gives their raw BTF,
//! their name (`vmlinux`, a module's name) and `kernel_btf = 1`.
//!
//! Loaders find the kernel's types this way rather than by reading the file: bpftrace 0.17
//! walks the BTF ids for the object named `vmlinux` and loads it with
//! `btf__load_from_kernel_by_id`, and without it has no types for `args->` of tracepoints;
//! libbpf walks them for module BTF when relocating against kernel modules.
//!
//! Ids: each kernel BTF object gets an id from the session's id space the first time any
//! process of the session asks (vmlinux first, so a fresh session gives it id 1 as the
//! kernel does). The id is recorded in `kernel_btf/NAME` in the session directory, created
//! with `link(2)` so that two processes racing agree on one id; a module loaded later gets
//! its id when it first appears. Descriptors are descriptors of that record file; the BTF
//! itself is read from `/sys/kernel/btf/NAME` when asked for, never copied.

use std::path::{Path, PathBuf};

use super::io_errno;
use crate::objects;

/// Where the kernel publishes its BTF objects.
const SYSFS_BTF: &str = "/sys/kernel/btf";

/// The session directory holding one record per kernel BTF object.
fn dir() -> Result<PathBuf, i32> {
    Ok(objects::session()?.layout().kernel_btf_dir())
}

/// The kernel's BTF object names, vmlinux first, then the modules in name order.
fn kernel_names() -> Vec<String> {
    let mut names: Vec<String> = match std::fs::read_dir(SYSFS_BTF) {
        Ok(rd) => {
            rd.flatten().filter_map(|e| e.file_name().into_string().ok()).filter(|n| !n.starts_with('.')).collect()
        }
        Err(_) => Vec::new(),
    };
    names.sort_by(|a, b| (a != "vmlinux", a).cmp(&(b != "vmlinux", b)));
    names
}

/// Reads the records: `(id, name)` of every kernel BTF object with an id in the session.
fn records(dir: &Path) -> Vec<(u32, String)> {
    let Ok(rd) = std::fs::read_dir(dir) else { return Vec::new() };
    rd.flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            if name.starts_with('.') {
                return None;
            }
            let id = std::fs::read_to_string(e.path()).ok()?.trim().parse::<u32>().ok()?;
            Some((id, name))
        })
        .collect()
}

/// Every kernel BTF object, with its session id (ids are handed out to the ones that have
/// none yet). Objects whose module is gone from `/sys/kernel/btf` are not listed.
pub fn all() -> Result<Vec<(u32, String)>, i32> {
    let names = kernel_names();
    if names.is_empty() {
        return Ok(Vec::new());
    }
    let dir = dir()?;
    let mut have = records(&dir);
    if names.iter().any(|n| !have.iter().any(|(_, h)| h == n)) {
        std::fs::create_dir_all(&dir).map_err(|e| io_errno(&e))?;
        let session = objects::session()?;
        for n in &names {
            if have.iter().any(|(_, h)| h == n) {
                continue;
            }
            let id = session.alloc_id().map_err(|e| io_errno(&e))?;
            let tmp = session.layout().kernel_btf(&format!(".{n}.{}.{id}", std::process::id()));
            std::fs::write(&tmp, id.to_string()).map_err(|e| io_errno(&e))?;
            // link(2) fails if another process recorded this object first: its id stands
            // (the id allocated here is simply unused, as the kernel's ids are never reused).
            let r = std::fs::hard_link(&tmp, session.layout().kernel_btf(n));
            let _ = std::fs::remove_file(&tmp);
            match r {
                Ok(()) => have.push((id, n.clone())),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(io_errno(&e)),
            }
        }
        have = records(&dir);
    }
    have.retain(|(_, h)| names.contains(h));
    have.sort_unstable();
    Ok(have)
}

/// The name of kernel BTF object `id`, if `id` is one.
pub fn name_of(id: u32) -> Result<Option<String>, i32> {
    Ok(all()?.into_iter().find(|&(i, _)| i == id).map(|(_, n)| n))
}

/// The name of kernel BTF object `id` if it has been recorded (no ids are handed out: a
/// descriptor of one exists only once it has been).
pub fn recorded_name(id: u32) -> Option<String> {
    let d = dir().ok()?;
    records(&d).into_iter().find(|&(i, _)| i == id).map(|(_, n)| n)
}

/// Whether `id` is a kernel BTF object already recorded (no ids are handed out).
pub fn is_kernel(id: u32) -> bool {
    recorded_name(id).is_some()
}

/// A new descriptor of kernel BTF object `id` named `name`.
pub fn install(id: u32, name: &str) -> Result<i32, i32> {
    objects::install(objects::Kind::Btf, id, &objects::session()?.layout().kernel_btf(name))
}

/// The raw BTF of kernel object `name`, as the kernel gives it.
pub fn data(name: &str) -> Result<Vec<u8>, i32> {
    std::fs::read(Path::new(SYSFS_BTF).join(name)).map_err(|e| io_errno(&e))
}
