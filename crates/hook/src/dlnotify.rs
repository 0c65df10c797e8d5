//! Libraries mapped and unmapped later (dlopen, dlclose), seen before the call returns.
//!
//! The dynamic loader tells debuggers about changes of its object list by calling
//! `_dl_debug_state` (its address is `_r_debug.r_brk`) with `r_state` set to `RT_ADD` or
//! `RT_DELETE` before it maps or unmaps objects, and `RT_CONSISTENT` after; debuggers put a
//! breakpoint there. [`install`] does the same in process: `_dl_debug_state` is an empty
//! function (a `ret`, then alignment padding), so its `ret` and the padding after it are
//! replaced by a `jmp` to a near stub jumping to [`notified`], which returns to the loader
//! in its place. Nothing else changes and nothing runs on any other path: the cost is paid
//! only by dlopen and dlclose.
//!
//! On each notification the loaded objects are compared with the last look
//! ([`LibraryWatcher::changes`]). Probes in an object that is gone are forgotten at once
//! (its code is unmapped: its bytes are not restored, its handlers are unpublished, the site
//! and its trap entry are dropped so a library mapped at the same address later gets fresh
//! ones; trampoline pages stay mapped as for every detach). Then the callback given to [`install`] runs,
//! on the thread calling dlopen/dlclose with the loader's lock held: a library it sees in
//! `added` is mapped but not relocated yet and its constructors have not run, so probes
//! attached then see every call; it may attach and detach probes (this is not a hook
//! handler) but must not wait for another thread that may be waiting for the loader.
//!
//! [`uninstall`] (`userbpf detach`, through `crate::release`) puts `_dl_debug_state` back as
//! it was; a later [`install`] patches it again with the same stub page.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering::SeqCst};
use std::sync::{Mutex, OnceLock};

use iced_x86::{Decoder, DecoderOptions, Mnemonic};

use crate::symbols::{self, LibraryWatcher, ObjectChanges};

/// What [`install`] calls on every change of the loaded objects.
pub type Callback = fn(&ObjectChanges);

static CALLBACK: OnceLock<Callback> = OnceLock::new();
static INSTALLED: Mutex<Option<Result<(), String>>> = Mutex::new(None);
/// Where the jump was written, the bytes it replaced and the text's protection (see
/// [`uninstall`]); the stub page (kept across an uninstall, reused by the next install).
static PATCHED: Mutex<Option<(usize, [u8; 5], i32)>> = Mutex::new(None);
static STUB_PAGE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
static WATCHER: Mutex<Option<LibraryWatcher>> = Mutex::new(None);
/// Nesting of [`notified`] (a callback loading a library); set `AGAIN` instead of recursing.
static DEPTH: AtomicU32 = AtomicU32::new(0);
static AGAIN: AtomicBool = AtomicBool::new(false);

/// glibc's `struct r_debug` (`<link.h>`), the part read here.
#[repr(C)]
struct RDebug {
    r_version: i32,
    r_map: usize,
    r_brk: usize,
    r_state: i32,
    r_ldbase: usize,
}

/// Whether notifications are installed (`Ok` once [`install`] succeeded).
pub fn installed() -> bool {
    matches!(INSTALLED.lock().unwrap_or_else(|e| e.into_inner()).as_ref(), Some(Ok(())))
}

/// Starts watching dlopen/dlclose; `cb` runs after each change (see the module docs). The
/// first call decides the callback; later calls return its result.
pub fn install(cb: Callback) -> Result<(), String> {
    let mut g = INSTALLED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(r) = g.as_ref() {
        return r.clone();
    }
    let r = install_inner(cb);
    *g = Some(r.clone());
    r
}

/// Puts `_dl_debug_state` back as it was (`userbpf detach`): its `ret` first (one byte: a
/// thread runs the whole `jmp` or the `ret`), then, once every thread saw it, the padding.
/// A thread already in the stub goes on to [`notified`] (the stub page and this code stay
/// mapped) and returns to the loader. The next [`install`] patches it again.
pub fn uninstall() -> Result<(), String> {
    let mut g = INSTALLED.lock().unwrap_or_else(|e| e.into_inner());
    let Some((at, orig, prot)) = PATCHED.lock().unwrap_or_else(|e| e.into_inner()).take() else {
        *g = None;
        return Ok(());
    };
    crate::patch::write_text(at, &orig[..1], prot)?;
    crate::patch::broadcast();
    crate::patch::write_text(at + 1, &orig[1..], prot)?;
    *g = None;
    Ok(())
}

/// The address of the loader's `_dl_debug_state`.
fn debug_state_addr() -> Result<usize, String> {
    // SAFETY: dlsym with a NUL-terminated name; RTLD_DEFAULT searches the global scope, which
    // holds the loader (it exports `_r_debug`).
    let p = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"_r_debug".as_ptr()) } as *const RDebug;
    if p.is_null() {
        return Err("the dynamic loader exports no `_r_debug` (not glibc's ld.so?)".into());
    }
    // SAFETY: `_r_debug` is the loader's live `struct r_debug`; r_brk is written once, before
    // any user code runs.
    let brk = unsafe { std::ptr::addr_of!((*p).r_brk).read_volatile() };
    if brk == 0 {
        return Err("`_r_debug.r_brk` is not set".into());
    }
    Ok(brk)
}

/// Where to put the jump: the `ret` of `_dl_debug_state` (after an `endbr64`), when at least
/// 4 bytes of padding (`nop`s, `int3`s) follow it.
fn patch_site(addr: usize, code: &[u8]) -> Result<usize, String> {
    let mut dec = Decoder::with_ip(64, code, addr as u64, DecoderOptions::NONE);
    let mut ret_at = None;
    let mut pad = 0usize;
    while dec.can_decode() {
        let ins = dec.decode();
        match (ret_at, ins.mnemonic()) {
            (None, Mnemonic::Endbr64) => {}
            (None, Mnemonic::Ret) => ret_at = Some(ins.ip() as usize),
            (None, m) => return Err(format!("`_dl_debug_state` at {addr:#x} is not an empty function (`{m:?}`)")),
            (Some(_), Mnemonic::Nop | Mnemonic::Int3) => {
                pad += ins.len();
                if pad >= 4 {
                    return Ok(ret_at.unwrap_or(addr));
                }
            }
            (Some(_), _) => break,
        }
    }
    Err(format!("`_dl_debug_state` at {addr:#x} has no room for a jump after its `ret`"))
}

fn install_inner(cb: Callback) -> Result<(), String> {
    // The hook engine's signal handlers must be in place before `patch::broadcast`.
    crate::init().map_err(|e| e.to_string())?;
    let addr = debug_state_addr()?;
    let map = crate::patch::mapping_of(addr).ok_or(format!("`_dl_debug_state` at {addr:#x} is not mapped"))?;
    let avail = map.end.saturating_sub(addr).min(32);
    // SAFETY: [addr, addr+avail) lies inside a mapping of this process, which is readable
    // code (the loader's text).
    let code = unsafe { std::slice::from_raw_parts(addr as *const u8, avail) };
    if map.prot & libc::PROT_READ == 0 {
        return Err("the loader's text is not readable".into());
    }
    let at = patch_site(addr, code)?;
    *WATCHER.lock().unwrap_or_else(|e| e.into_inner()) = Some(LibraryWatcher::new());
    let _ = CALLBACK.set(cb);
    let page = match STUB_PAGE.load(SeqCst) {
        0 => {
            let page =
                crate::patch::alloc_near(at).ok_or("no free memory near the loader for the notification stub")?;
            // jmp qword ptr [rip+0]; .quad notified
            let mut stub = vec![0xFF, 0x25, 0, 0, 0, 0];
            stub.extend_from_slice(&(notified as *const () as usize as u64).to_le_bytes());
            crate::patch::seal_page(page, &[(0, &stub)])?;
            STUB_PAGE.store(page, SeqCst);
            page
        }
        // Installed before and uninstalled: the same stub.
        page => page,
    };
    let mut orig = [0u8; 5];
    // SAFETY: `at`..`at + 5` lies in the readable text checked above (`patch_site` found the
    // `ret` and at least 4 bytes of padding there).
    orig.copy_from_slice(unsafe { std::slice::from_raw_parts(at as *const u8, 5) });
    let rel =
        i32::try_from(page as i64 - (at as i64 + 5)).map_err(|_| "notification stub out of rel32 range".to_string())?;
    let mut jmp = [0xE9, 0, 0, 0, 0];
    jmp[1..].copy_from_slice(&rel.to_le_bytes());
    // The 4 bytes after the `ret` are padding no thread executes: write them first, make every
    // thread see them (broadcast serialises each one), then swap the `ret` for the `jmp`'s
    // opcode with one byte store: a thread runs either the old `ret` or the whole `jmp`.
    crate::patch::write_text(at + 1, &jmp[1..], map.prot)?;
    crate::patch::broadcast();
    crate::patch::write_text(at, &jmp[..1], map.prot)?;
    *PATCHED.lock().unwrap_or_else(|e| e.into_inner()) = Some((at, orig, map.prot));
    Ok(())
}

/// Runs in place of `_dl_debug_state` (the loader's lock held, see the module docs).
extern "C" fn notified() {
    // userbpf's work, not the target's: no probe fires for it.
    let _ours = crate::thread::ours();
    if DEPTH.fetch_add(1, SeqCst) > 0 {
        AGAIN.store(true, SeqCst);
        DEPTH.fetch_sub(1, SeqCst);
        return;
    }
    let _ = std::panic::catch_unwind(|| {
        loop {
            AGAIN.store(false, SeqCst);
            let changes = match WATCHER.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
                Some(w) => w.changes(),
                None => ObjectChanges::default(),
            };
            if !changes.is_empty() {
                for (_, ranges) in &changes.removed {
                    forget_sites_in(ranges);
                }
                if let Some(cb) = CALLBACK.get() {
                    symbols::set_in_loader(true);
                    cb(&changes);
                    symbols::set_in_loader(false);
                }
            }
            if !AGAIN.load(SeqCst) {
                break;
            }
        }
    });
    DEPTH.fetch_sub(1, SeqCst);
}

/// Forgets the probes of sites inside `ranges` (code that is unmapped): no byte is written
/// there; their handlers no longer run and the sites are dropped. Returns how many.
pub fn forget_sites_in(ranges: &[(usize, usize)]) -> usize {
    let mut guard = crate::registry();
    let Some(reg) = guard.as_mut() else { return 0 };
    let dead: Vec<usize> = reg.sites.keys().copied().filter(|a| ranges.iter().any(|(s, e)| a >= s && a < e)).collect();
    for addr in &dead {
        if let Some(site) = reg.sites.remove(addr) {
            site.patched.store(false, SeqCst);
            crate::publish(site, Vec::new());
            crate::patch::unregister_trap_site(site.patch_at);
        }
        reg.probes.retain(|_, a| a != addr);
    }
    dead.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_jump_goes_over_the_ret_and_its_padding() {
        let plain = [0xC3, 0x66, 0x66, 0x2E, 0x0F, 0x1F, 0x84, 0, 0, 0, 0, 0];
        assert_eq!(patch_site(0x1000, &plain), Ok(0x1000));
        let cet = [0xF3, 0x0F, 0x1E, 0xFA, 0xC3, 0xCC, 0xCC, 0xCC, 0xCC];
        assert_eq!(patch_site(0x1000, &cet), Ok(0x1004));
        assert!(patch_site(0x1000, &[0xC3, 0x90, 0x55, 0x48]).is_err(), "a function follows");
        assert!(patch_site(0x1000, &[0x55, 0xC3, 0x90, 0x90, 0x90, 0x90]).is_err(), "not empty");
    }
}
