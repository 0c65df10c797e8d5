//! `bpf()` through any path into libc's `syscall`: a loader that looks `syscall` up itself
//! (`dlsym(dlopen("libc.so.6", ...), "syscall")`) gets libc's own function, which the
//! definition in this library does not interpose, and its `bpf()` calls would reach the
//! kernel. `dlsym` is defined here: it answers as libc's does, except that a lookup of
//! `syscall` that finds libc's gets this library's `syscall` instead (in the served loader
//! only). Not reached: `dlvsym(..., "syscall", VERSION)` (libc's `dlvsym` is what finds the
//! real `dlsym`, so it cannot be defined here too), and loaders that make the system call
//! with their own `syscall` instruction (Go programs, static binaries): no preloaded library
//! sees those.
//!
//! Nothing here allocates or takes a lock: `dlsym` is called from anywhere (Rust's and
//! glibc's own weak-symbol lookups included).

use std::ffi::{CStr, c_char, c_void};
use std::sync::atomic::{AtomicPtr, Ordering};

use crate::serving;

type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;

static REAL_DLSYM: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());

/// libc's `dlsym`: found with libc's `dlvsym` (not defined here) past this library.
fn real_dlsym() -> Option<DlsymFn> {
    let mut f = REAL_DLSYM.load(Ordering::Acquire);
    if f.is_null() {
        // dlsym moved into libc.so.6 in glibc 2.34; the older version stays for old binaries.
        for version in [c"GLIBC_2.34", c"GLIBC_2.2.5"] {
            // SAFETY: libc's dlvsym with RTLD_NEXT (the objects after this library) and
            // NUL-terminated strings.
            f = unsafe { libc::dlvsym(libc::RTLD_NEXT, c"dlsym".as_ptr(), version.as_ptr()) };
            if !f.is_null() {
                break;
            }
        }
        if f.is_null() {
            return None;
        }
        REAL_DLSYM.store(f, Ordering::Release);
    }
    // SAFETY: a non-null result of looking up libc's `dlsym`, whose type is DlsymFn.
    Some(unsafe { std::mem::transmute::<*mut c_void, DlsymFn>(f) })
}

/// Stands for libc's `dlsym` when it cannot be found: finds nothing.
extern "C" fn dlsym_missing(_: *mut c_void, _: *const c_char) -> *mut c_void {
    std::ptr::null_mut()
}

/// Decides a `dlsym` call: the replacement to return (this library's `syscall`), or null to
/// let libc's `dlsym` answer. Makes sure [`REAL_DLSYM`] holds a function to jump to.
extern "C" fn dlsym_redirect(handle: *mut c_void, name: *const c_char) -> *mut c_void {
    // No panic may unwind into the naked `dlsym`: one (there is none to expect) finds nothing
    // to replace, so libc's dlsym answers.
    let r = std::panic::catch_unwind(|| redirect(handle, name)).unwrap_or(std::ptr::null_mut());
    // The stub jumps to REAL_DLSYM when nothing is replaced: never to null.
    let _ = REAL_DLSYM.compare_exchange(
        std::ptr::null_mut(),
        dlsym_missing as *const () as *mut c_void,
        Ordering::AcqRel,
        Ordering::Acquire,
    );
    r
}

/// [`dlsym_redirect`]'s decision.
fn redirect(handle: *mut c_void, name: *const c_char) -> *mut c_void {
    let real = match real_dlsym() {
        Some(f) => f,
        None => return std::ptr::null_mut(),
    };
    // SAFETY: a non-null name of a dlsym call is a NUL-terminated string (its contract).
    if name.is_null() || unsafe { CStr::from_ptr(name) }.to_bytes() != b"syscall" || !serving() {
        return std::ptr::null_mut();
    }
    // Only a lookup that finds a `syscall` answers ours (a handle without one finds nothing).
    // SAFETY: the caller's arguments, passed on unchanged.
    if unsafe { real(handle, name) }.is_null() {
        return std::ptr::null_mut();
    }
    crate::shim::syscall as *const () as *mut c_void
}

/// libc's `dlsym(3)`, except that `syscall` is this library's in the served loader. Every
/// other lookup is a tail jump into libc's `dlsym`, so that libc sees the caller's return
/// address, which decides what `RTLD_NEXT` means and the scope `RTLD_DEFAULT` searches.
///
/// # Safety
/// As for libc's `dlsym`.
#[unsafe(naked)]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, name: *const c_char) -> *mut c_void {
    core::arch::naked_asm!(
        "push rdi",
        "push rsi",
        "sub rsp, 8", // 16-byte alignment at the call
        "call {redirect}",
        "add rsp, 8",
        "pop rsi",
        "pop rdi",
        "test rax, rax",
        "jnz 2f",
        "jmp qword ptr [rip + {real}]",
        "2:",
        "ret",
        redirect = sym dlsym_redirect,
        real = sym REAL_DLSYM,
    )
}
