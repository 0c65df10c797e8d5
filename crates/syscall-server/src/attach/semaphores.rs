//! USDT semaphores of uprobe events opened with a `ref_ctr_offset` (the kernel raises the
//! counter at that file offset in every process the probe is for while it is attached).
//!
//! The loader raises it in the processes mapping the file when the link is made (through
//! `/proc/PID/mem`) and lowers it there when the link goes; the link's semaphore is also
//! recorded in the session (`perf/sema-LINK`: path, offset, pid), so a process of the session
//! starting later with this library (a child of the loader, e.g. bpftrace's `-c`) raises it in
//! itself at start ([`raise_own`]).

use std::collections::HashMap;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::MetadataExt;

use userbpf_runtime::session::{Layout, SemaphoreRecord};

/// A counter raised in a process: (pid, its start time, address).
pub(crate) type Raised = (u32, u64, u64);

/// The address of file offset `off` of the file `(dev, ino)` in process `pid`'s writable
/// private mappings (see `userbpf_hook::usdt::semaphore_address`).
fn address_in(pid: &str, dev: u64, ino: u64, off: u64) -> Option<u64> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).ok()?;
    userbpf_hook::usdt::semaphore_address(&maps, dev, ino, off)
}

/// Adds `delta` to the u16 counter at `addr` in process `pid`.
fn add_in(pid: u32, addr: u64, delta: i16) -> bool {
    let Ok(mut f) = std::fs::OpenOptions::new().read(true).write(true).open(format!("/proc/{pid}/mem")) else {
        return false;
    };
    let mut b = [0u8; 2];
    if f.seek(SeekFrom::Start(addr)).is_err() || f.read_exact(&mut b).is_err() {
        return false;
    }
    let v = u16::from_ne_bytes(b).wrapping_add_signed(delta);
    f.seek(SeekFrom::Start(addr)).is_ok() && f.write_all(&v.to_ne_bytes()).is_ok()
}

/// Link `link` has a semaphore at file offset `off` of `path`: raise it in the processes
/// it is for and record it in the session.
pub fn raise(dir: &Layout, link: u32, path: &str, off: u64, pid: Option<u32>) {
    let _ = SemaphoreRecord { link, path: path.to_string(), offset: off, pid }.write(dir);
    let Ok(md) = std::fs::metadata(path) else { return };
    let me = std::process::id();
    let mut done = Vec::new();
    let pids: Vec<String> = match pid {
        Some(p) => vec![p.to_string()],
        None => std::fs::read_dir("/proc")
            .map(|rd| {
                rd.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| n.parse::<u32>().is_ok())
                    .collect()
            })
            .unwrap_or_default(),
    };
    for p in pids {
        let Ok(n) = p.parse::<u32>() else { continue };
        if let Some(addr) = address_in(&p, md.dev(), md.ino(), off) {
            if !claim(dir, link, n) {
                continue; // the process raised it itself
            }
            let ok = if n == me { add_own(addr, 1) } else { add_in(n, addr, 1) };
            if ok {
                done.push((n, userbpf_runtime::session::start_time(n).unwrap_or(0), addr));
            }
        }
    }
    let mut g = crate::server::server().attach.raised.lock().unwrap_or_else(|e| e.into_inner());
    g.get_or_insert_with(HashMap::new).insert(link, done);
}

/// Whether the caller is the one to raise link `link`'s semaphore in process `pid` (the
/// loader's scan and the process's own start can both see it: exactly one of them wins).
fn claim(dir: &Layout, link: u32, pid: u32) -> bool {
    let start = userbpf_runtime::session::start_time(pid).unwrap_or(0);
    std::fs::OpenOptions::new().write(true).create_new(true).open(dir.semaphore_claim(link, pid, start)).is_ok()
}

/// Link `link` is gone: lower what [`raise`] raised (in processes still the same).
pub fn lower(dir: &Layout, link: u32) {
    let _ = std::fs::remove_file(dir.semaphore(link));
    if let Ok(rd) = std::fs::read_dir(dir.perf_dir()) {
        for e in rd.flatten() {
            if Layout::is_claim_of_link(&e.file_name().to_string_lossy(), link) {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
    let done = crate::server::server()
        .attach
        .raised
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .as_mut()
        .and_then(|m| m.remove(&link))
        .unwrap_or_default();
    let me = std::process::id();
    for (pid, start, addr) in done {
        if pid == me {
            add_own(addr, -1);
        } else if userbpf_runtime::session::start_time(pid).unwrap_or(0) == start {
            add_in(pid, addr, -1);
        }
    }
}

fn add_own(addr: u64, delta: i16) -> bool {
    // SAFETY: `addr` is a USDT semaphore of a file mapped in this process (found in our
    // own maps): a 2-byte aligned u16 in a writable mapping.
    let a = unsafe { &*(addr as *const std::sync::atomic::AtomicU16) };
    if delta >= 0 {
        a.fetch_add(delta as u16, std::sync::atomic::Ordering::SeqCst);
    } else {
        a.fetch_sub(delta.unsigned_abs(), std::sync::atomic::Ordering::SeqCst);
    }
    true
}

/// At the start of a process of the session (not the loader): raise the semaphores of
/// the session's links that are for this process.
pub fn raise_own(dir: &Layout) {
    let me = std::process::id();
    for r in SemaphoreRecord::all(dir) {
        if !r.is_for(me) {
            continue;
        }
        let Ok(md) = std::fs::metadata(&r.path) else { continue };
        if let Some(addr) = address_in("self", md.dev(), md.ino(), r.offset)
            && claim(dir, r.link, me)
        {
            add_own(addr, 1);
        }
    }
}
