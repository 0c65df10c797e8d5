//! USDT links (`kind: "usdt"`, `func: "PROVIDER:NAME"`, `path`: the binary or library, empty
//! for the executable), attached the way libbpf attaches them:
//!
//! * every site of the probe (from the file's `.note.stapsdt`, see `userbpf_hook::usdt`) gets
//!   an entry probe at the note's address, inside its function's extent when a symbol has one;
//! * each site's argument spec is written into the program's `__bpf_usdt_specs` map (libbpf's
//!   `struct __bpf_usdt_spec`) and the probe's cookie is the spec's index: `usdt.bpf.h` reads
//!   the spec id with `bpf_get_attach_cookie` (`LINUX_HAS_BPF_COOKIE` is 1 here), so
//!   `__bpf_usdt_ip_to_spec_id` is not filled;
//! * the probe's semaphore, if any, is incremented while attached.
//!
//! Spec slots are shared by every process of the session: a slot is taken under a lock file
//! of the session (`usdt-specs-MAPID.lock`), identical specs share a slot, and slots are never
//! given back (a process may still use one). A taken slot has the last (padding) byte of the
//! value set, which the BPF side never reads.

use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::{Arc, Mutex};

use userbpf_hook::ProbeKind;
use userbpf_hook::usdt::{self as notes, ArgSpec};
use userbpf_runtime::{LinkRecord, LoadedProgram, Session};

use super::{Attached, AttachedLink, on_hit};

/// `sizeof(struct __bpf_usdt_spec)`: 12 args of 16 bytes, the cookie, arg_cnt, padding.
pub const SPEC_SIZE: usize = 208;
const TAKEN_BYTE: usize = SPEC_SIZE - 1;

/// Adds `delta` to the `u16` semaphore at `addr` (in this process).
pub fn semaphore_add(addr: usize, delta: i16) {
    // SAFETY: `addr` is a USDT semaphore of an object loaded in this process (the note's
    // address plus the object's load bias): a 2-byte aligned, writable u16 in `.probes`.
    let sema = unsafe { &*(addr as *const AtomicU16) };
    if delta >= 0 {
        sema.fetch_add(delta as u16, Ordering::SeqCst);
    } else {
        sema.fetch_sub(delta.unsigned_abs(), Ordering::SeqCst);
    }
}

/// libbpf's `struct __bpf_usdt_spec` for these arguments (and `usdt_cookie`), slot mark set.
pub fn encode_spec(args: &[ArgSpec], usdt_cookie: u64) -> [u8; SPEC_SIZE] {
    let mut v = [0u8; SPEC_SIZE];
    for (i, a) in args.iter().enumerate().take(notes::MAX_ARGS) {
        let o = i * 16;
        v[o..o + 8].copy_from_slice(&a.val_off.to_le_bytes());
        v[o + 8..o + 12].copy_from_slice(&(a.kind as u32).to_le_bytes());
        v[o + 12..o + 14].copy_from_slice(&a.reg_off.to_le_bytes());
        v[o + 14] = a.signed as u8;
        v[o + 15] = a.bitshift;
    }
    v[192..200].copy_from_slice(&usdt_cookie.to_le_bytes());
    v[200..202].copy_from_slice(&(args.len() as i16).to_le_bytes());
    v[TAKEN_BYTE] = 1;
    v
}

/// The program's spec map (`__bpf_usdt_specs`), if it uses one.
fn spec_map(session: &Session, prog_id: u32) -> Result<Option<u32>, String> {
    let prog = session
        .progs()
        .map_err(|e| e.to_string())?
        .into_iter()
        .find(|p| p.id == prog_id)
        .ok_or(format!("program {prog_id} is not in the session"))?;
    let maps = session.maps().map_err(|e| e.to_string())?;
    Ok(maps.into_iter().find(|m| prog.map_ids.contains(&m.id) && m.name.ends_with("usdt_specs")).map(|m| m.id))
}

/// Stores `spec` in the map (an identical one is shared); returns its index.
fn store_spec(session: &Session, map_id: u32, spec: &[u8; SPEC_SIZE]) -> Result<u32, String> {
    let map = session.open_map(map_id).map_err(|e| e.to_string())?;
    let (vs, max) = (map.spec().value_size as usize, map.spec().max_entries);
    if vs != SPEC_SIZE {
        return Err(format!(
            "map __bpf_usdt_specs has {vs}-byte values, not libbpf's {SPEC_SIZE}-byte struct __bpf_usdt_spec"
        ));
    }
    let lock_path = session.layout().usdt_specs_lock(map_id);
    // Through the broker in a process that dropped privileges.
    let lock = std::fs::File::from(
        userbpf_runtime::session::broker::open(&lock_path, libc::O_CREAT | libc::O_WRONLY, 0o600)
            .map_err(|e| format!("{}: {e}", lock_path.display()))?,
    );
    // SAFETY: flock on a descriptor we own; released when `lock` is closed.
    if unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&lock), libc::LOCK_EX) } != 0 {
        return Err(format!("locking {}: {}", lock_path.display(), std::io::Error::last_os_error()));
    }
    let mut cur = [0u8; SPEC_SIZE];
    let mut free = None;
    for idx in 0..max {
        map.lookup_elem(&idx.to_le_bytes(), &mut cur).map_err(|e| e.to_string())?;
        if cur == *spec {
            return Ok(idx);
        }
        if free.is_none() && cur[TAKEN_BYTE] == 0 {
            free = Some(idx);
        }
    }
    let idx = free.ok_or(format!("__bpf_usdt_specs is full ({max} specs): define BPF_USDT_MAX_SPEC_CNT larger"))?;
    map.update_elem(&idx.to_le_bytes(), spec, 0).map_err(|e| e.to_string())?;
    Ok(idx)
}

/// Hooks made for USDT probes in this process: (address, end of its patch, users).
static ANCHORS: Mutex<Vec<(usize, usize, u32)>> = Mutex::new(Vec::new());

/// Takes a use of the hook at `anchor` (patching `span` bytes), refused when it would overlap
/// another USDT hook's patch.
fn claim(anchor: usize, span: Option<usize>) -> Result<(), String> {
    let mut a = ANCHORS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(e) = a.iter_mut().find(|e| e.0 == anchor) {
        e.2 += 1;
        return Ok(());
    }
    let end = anchor + span.unwrap_or(5).max(5);
    if let Some(o) = a.iter().find(|e| anchor < e.1 && e.0 < end) {
        return Err(format!(
            "its hook at {anchor:#x} would overlap the hook of another USDT probe at {:#x} ({} bytes patched): attach only one of them",
            o.0,
            o.1 - o.0
        ));
    }
    a.push((anchor, end, 1));
    Ok(())
}

/// Gives back a use taken by [`claim`].
pub fn release(anchor: usize) {
    let mut a = ANCHORS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(i) = a.iter().position(|e| e.0 == anchor) {
        a[i].2 -= 1;
        if a[i].2 == 0 {
            a.remove(i);
        }
    }
}

/// Whether `obj` has the link's probe (`PROVIDER:NAME`) in its notes.
pub fn has_probe(obj: &userbpf_hook::symbols::MappedObject, link: &LinkRecord) -> bool {
    let probe = link.func.as_deref().unwrap_or("");
    let Some((provider, name)) = probe.split_once(':') else { return true };
    notes::read_notes(&obj.path).is_ok_and(|n| n.iter().any(|n| n.provider == provider && n.name == name))
}

/// Attaches a USDT link: every site of the probe, or none.
pub fn attach(session: &Session, link: &LinkRecord, prog: Arc<LoadedProgram>) -> Result<AttachedLink, String> {
    let probe = link.func.as_deref().unwrap_or("");
    let (provider, name) = probe.split_once(':').ok_or(format!("USDT link without PROVIDER:NAME (`{probe}`)"))?;
    if prog.calls_helper(userbpf_runtime::helpers::overrides::OVERRIDE_RETURN) {
        // As the kernel: the override needs a probe at a function's entry.
        return Err(format!(
            "program `{}` calls bpf_override_return, which needs a probe at a function's entry, not USDT probe {provider}:{name}",
            prog.name
        ));
    }
    let sites = notes::locate(&link.path, provider, name)?;
    let specs = spec_map(session, link.prog_id)?;
    // Check every site before attaching any.
    let mut planned = Vec::new();
    for s in &sites {
        let args =
            notes::parse_args(&s.note.args).map_err(|e| format!("USDT {provider}:{name} at {:#x}: {e}", s.note.pc))?;
        let cookie = match specs {
            Some(map) => store_spec(session, map, &encode_spec(&args, link.cookie))?,
            None => 0,
        };
        planned.push((s, cookie));
    }
    let mut done = AttachedLink::default();
    for (s, cookie) in planned {
        let fail = |e: String| format!("USDT {provider}:{name} at {:#x} in {}: {e}", s.note.pc, s.object.display());
        if let Err(e) = claim(s.anchor, s.span) {
            done.detach();
            return Err(fail(e));
        }
        done.anchors.push(s.anchor);
        let ext = userbpf_hook::symbols::lookup_addr(s.anchor)
            .and_then(|r| r.size.filter(|n| *n > 0).map(|len| userbpf_hook::FuncExtent { start: r.func_start, len }));
        let ip = if s.anchor == s.addr { 0 } else { s.addr as u64 };
        let data: *mut Attached = crate::detach::leak(Attached {
            prog: prog.clone(),
            cookie: cookie as u64,
            func_ip: s.addr as u64,
            retprobe: false,
            ip,
            at_func_entry: false,
        });
        match userbpf_hook::attach_with(s.anchor, ProbeKind::Entry, on_hit, data.cast(), ext) {
            Ok(id) => done.probes.push(id),
            Err(e) => {
                done.detach();
                return Err(fail(e.to_string()));
            }
        }
        if s.sema_addr != 0 {
            semaphore_add(s.sema_addr, 1);
            done.semaphores.push(s.sema_addr);
        }
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_are_laid_out_as_usdt_bpf_h_reads_them() {
        let args = notes::parse_args("-4@%edi 8@-16(%rbp) 2@$7").unwrap();
        let v = encode_spec(&args, 0x1122);
        assert_eq!(&v[8..12], &1u32.to_le_bytes(), "arg 0: BPF_USDT_ARG_REG");
        assert_eq!(i16::from_le_bytes([v[12], v[13]]), 112, "offsetof(struct pt_regs, di)");
        assert_eq!((v[14], v[15]), (1, 32));
        assert_eq!(u64::from_le_bytes(v[16..24].try_into().unwrap()), (-16i64) as u64);
        assert_eq!(&v[24..28], &2u32.to_le_bytes(), "arg 1: BPF_USDT_ARG_REG_DEREF");
        assert_eq!(i16::from_le_bytes([v[28], v[29]]), 32, "offsetof(struct pt_regs, bp)");
        assert_eq!(u64::from_le_bytes(v[32..40].try_into().unwrap()), 7);
        assert_eq!((v[46], v[47]), (0, 48));
        assert_eq!(u64::from_le_bytes(v[192..200].try_into().unwrap()), 0x1122);
        assert_eq!(i16::from_le_bytes([v[200], v[201]]), 3);
    }
}
