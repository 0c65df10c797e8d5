//! The C ABI: the libc functions this library defines in the loader. Each is thin: in the
//! served loader ([`serving`]) it hands the call to the library (`bpf`, `perf_event`,
//! `mmap`, `attach`, `trace_pipe`) with probes off and panics caught; everywhere else, and
//! for what is not ours, it makes the system call itself, unchanged. (`dlsym` is defined in
//! [`crate::dlsym`], which must work before anything else is set up.)

use std::ffi::{c_char, c_int, c_long, c_uint, c_ulong, c_void};

use crate::{SYS_BPF, SYS_PERF_EVENT_OPEN, attach, bpf, mmap, perf_event, serving, sys, trace_pipe};

/// Runs `f` (the server's work) catching its panics, with probes off on the calling thread
/// (`userbpf_hook::ours`): no probe of the process fires for userbpf's own work.
fn ours_catch<R>(f: impl FnOnce() -> R + std::panic::UnwindSafe) -> std::thread::Result<R> {
    let _ours = userbpf_hook::ours();
    std::panic::catch_unwind(f)
}

/// Runs `f` as [`ours_catch`] does: its value, or `-1` with its errno set (`EFAULT` for a
/// panic: no unwinding across the C boundary).
fn guarded(f: impl FnOnce() -> Result<i64, i32>) -> i64 {
    match ours_catch(std::panic::AssertUnwindSafe(f)) {
        Ok(Ok(v)) => v,
        Ok(Err(e)) => {
            sys::set_errno(e);
            -1
        }
        Err(_) => {
            sys::set_errno(libc::EFAULT);
            -1
        }
    }
}

/// libc's `syscall(2)`. Declared with six fixed arguments after the number: on x86-64 the
/// variadic arguments arrive in the same registers (and the sixth on the stack, read but
/// only passed on), so this is ABI-compatible with the variadic prototype.
///
/// # Safety
/// As for libc's `syscall`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn syscall(
    nr: c_long,
    a1: c_long,
    a2: c_long,
    a3: c_long,
    a4: c_long,
    a5: c_long,
    a6: c_long,
) -> c_long {
    if serving() || (nr == SYS_BPF && crate::adopt()) {
        match nr {
            // SAFETY: the loader's arguments, under the system call's contract.
            SYS_BPF => return guarded(|| unsafe { bpf::bpf(a1 as c_int, a2 as *mut u8, a3 as u32) }),
            SYS_PERF_EVENT_OPEN => {
                // SAFETY: the loader's arguments, under the system call's contract.
                return guarded(|| unsafe {
                    perf_event::perf_event_open(a1 as *const u8, a2 as i32, a3 as i32, a4 as i32, a5 as c_ulong)
                });
            }
            _ => {}
        }
    }
    // SAFETY: the caller's arguments, passed on unchanged.
    sys::libc_ret(unsafe { sys::raw6(nr, a1, a2, a3, a4, a5, a6) })
}

/// libc's `ioctl(2)` (the third argument, when there is one, is a word in the same register).
///
/// # Safety
/// As for libc's `ioctl`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ioctl(fd: c_int, req: c_ulong, arg: c_ulong) -> c_int {
    if serving() {
        // SAFETY: the loader's arguments, under ioctl's contract (this function's).
        if let Some(r) = ours_catch(|| unsafe { perf_event::ioctl(fd, req, arg) }).unwrap_or(Some(Err(libc::EFAULT))) {
            return guarded(|| r) as c_int;
        }
    }
    // SAFETY: the caller's arguments, passed on unchanged.
    sys::libc_ret(unsafe { sys::raw6(libc::SYS_ioctl, fd as i64, req as i64, arg as i64, 0, 0, 0) }) as c_int
}

/// libc's `mmap(2)`.
///
/// # Safety
/// As for libc's `mmap`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mmap(
    addr: *mut c_void,
    len: usize,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: i64,
) -> *mut c_void {
    if serving() && fd >= 0 {
        // SAFETY: the loader's arguments, under mmap's contract (this function's).
        let served = ours_catch(|| unsafe { mmap::mmap(addr, len, prot, flags, fd, off) });
        if let Some(r) = served.unwrap_or(Some(Err(libc::EFAULT))) {
            return match r {
                Ok(p) => p,
                Err(e) => {
                    sys::set_errno(e);
                    libc::MAP_FAILED
                }
            };
        }
    }
    // SAFETY: the caller's arguments, passed on unchanged.
    sys::libc_ret(unsafe {
        sys::raw6(libc::SYS_mmap, addr as i64, len as i64, prot as i64, flags as i64, fd as i64, off)
    }) as *mut c_void
}

/// libc's `mmap64` (the same call on x86-64).
///
/// # Safety
/// As for libc's `mmap64`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mmap64(
    addr: *mut c_void,
    len: usize,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: i64,
) -> *mut c_void {
    // SAFETY: the same contract.
    unsafe { mmap(addr, len, prot, flags, fd, off) }
}

/// libc's `munmap(2)`.
///
/// # Safety
/// As for libc's `munmap`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn munmap(addr: *mut c_void, len: usize) -> c_int {
    if serving() {
        let _ = ours_catch(|| mmap::munmap(addr, len));
    }
    // SAFETY: the caller's arguments, passed on unchanged.
    sys::libc_ret(unsafe { sys::raw6(libc::SYS_munmap, addr as i64, len as i64, 0, 0, 0, 0) }) as c_int
}

/// libc's `epoll_wait(2)`: in the loader, rings it has emptied stop polling readable first
/// ([`mmap::before_wait`]).
///
/// # Safety
/// As for libc's `epoll_wait`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn epoll_wait(epfd: c_int, events: *mut libc::epoll_event, max: c_int, timeout: c_int) -> c_int {
    if serving() {
        let _ = ours_catch(mmap::before_wait);
    }
    // SAFETY: the caller's arguments, passed on unchanged (epoll_pwait with no mask is epoll_wait).
    sys::libc_ret(unsafe {
        sys::raw6(libc::SYS_epoll_pwait, epfd as i64, events as i64, max as i64, timeout as i64, 0, 8)
    }) as c_int
}

/// libc's `epoll_pwait(2)`.
///
/// # Safety
/// As for libc's `epoll_pwait`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn epoll_pwait(
    epfd: c_int,
    events: *mut libc::epoll_event,
    max: c_int,
    timeout: c_int,
    mask: *const libc::sigset_t,
) -> c_int {
    if serving() {
        let _ = ours_catch(mmap::before_wait);
    }
    // SAFETY: the caller's arguments; the kernel's sigset is 8 bytes.
    sys::libc_ret(unsafe {
        sys::raw6(libc::SYS_epoll_pwait, epfd as i64, events as i64, max as i64, timeout as i64, mask as i64, 8)
    }) as c_int
}

/// libc's `poll(2)`.
///
/// # Safety
/// As for libc's `poll`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn poll(fds: *mut libc::pollfd, nfds: libc::nfds_t, timeout: c_int) -> c_int {
    if serving() {
        let _ = ours_catch(mmap::before_wait);
    }
    // SAFETY: the caller's arguments, passed on unchanged.
    sys::libc_ret(unsafe { sys::raw6(libc::SYS_poll, fds as i64, nfds as i64, timeout as i64, 0, 0, 0) }) as c_int
}

/// libc's `ppoll(2)`.
///
/// # Safety
/// As for libc's `ppoll`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ppoll(
    fds: *mut libc::pollfd,
    nfds: libc::nfds_t,
    ts: *const libc::timespec,
    mask: *const libc::sigset_t,
) -> c_int {
    if serving() {
        let _ = ours_catch(mmap::before_wait);
    }
    // SAFETY: the caller's arguments; the kernel may write the remaining time back into a
    // copy only (glibc passes a copy too), so we pass a copy.
    let mut copy = if ts.is_null() { None } else { Some(unsafe { *ts }) };
    let tp = copy.as_mut().map_or(std::ptr::null_mut(), |t| t as *mut libc::timespec);
    // SAFETY: as above.
    sys::libc_ret(unsafe { sys::raw6(libc::SYS_ppoll, fds as i64, nfds as i64, tp as i64, mask as i64, 8, 0) }) as c_int
}

/// The BPF filesystem's `f_type` (`BPF_FS_MAGIC`).
const BPF_FS_MAGIC: i64 = 0xcafe_4a11;

/// Whether `path` (a C string) is on the BPF filesystem as the loader sees it (pins live in
/// the session: see `bpf::obj::on_bpffs`).
fn on_bpffs(path: *const c_char) -> bool {
    if path.is_null() || !serving() {
        return false;
    }
    ours_catch(|| {
        // SAFETY: statfs succeeded on this path just before, so it is a readable C string.
        let raw = unsafe { std::ffi::CStr::from_ptr(path) }.to_bytes();
        bpf::obj::on_bpffs(raw)
    })
    .unwrap_or(false)
}

/// libc's `statfs(2)`: `/sys/fs/bpf` and what lies below it report the BPF filesystem's type
/// in the loader, as if a bpffs were mounted there (its pins are the session's), so libbpf's
/// check before pinning passes as on a machine with the BPF filesystem mounted.
///
/// # Safety
/// As for libc's `statfs`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn statfs(path: *const c_char, buf: *mut libc::statfs) -> c_int {
    // SAFETY: the caller's arguments, passed on unchanged.
    let r = sys::libc_ret(unsafe { sys::raw6(libc::SYS_statfs, path as i64, buf as i64, 0, 0, 0, 0) }) as c_int;
    if r == 0 && on_bpffs(path) {
        // SAFETY: the kernel just filled the caller's struct statfs.
        unsafe { (*buf).f_type = BPF_FS_MAGIC as _ };
    }
    r
}

/// libc's `statfs64`: the same struct as `statfs` on x86-64.
///
/// # Safety
/// As for libc's `statfs64`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn statfs64(path: *const c_char, buf: *mut libc::statfs64) -> c_int {
    // SAFETY: as for `statfs`: the same system call and layout on x86-64.
    unsafe { statfs(path, buf.cast()) }
}

/// libc's `close(2)`: the last close of a perf event or link of ours detaches it before
/// `close` returns, as in the kernel.
///
/// # Safety
/// As for libc's `close`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn close(fd: c_int) -> c_int {
    let ours = if serving() { ours_catch(|| attach::closing(fd)).ok().flatten() } else { None };
    // SAFETY: the caller's argument, passed on unchanged.
    let r = sys::libc_ret(unsafe { sys::raw6(libc::SYS_close, fd as i64, 0, 0, 0, 0, 0) }) as c_int;
    if let Some((kind, id)) = ours {
        let _ = ours_catch(|| attach::closed(kind, id));
    }
    r
}

/// At load: in a process the loader started (not the loader: it starts its agent when it
/// makes links), act as the agent of the session. Like the agent's library, this one is linked
/// `-z initfirst` (the agent crate's build.rs): its constructors run before libc's.
extern "C" fn server_init(_argc: c_int, _argv: *const *const c_char, envp: *mut *mut c_char) {
    userbpf_agent::environ_before_libc(envp);
    if serving() || std::env::var_os(userbpf_runtime::session::SESSION_ENV).is_none() {
        return;
    }
    let _ = ours_catch(|| {
        match userbpf_agent::Agent::start() {
            // The links are attached: the return of the execve that made this image, as the
            // kernel reports it here (as the agent's own constructor does).
            Ok(_) => userbpf_agent::exec_returned(),
            Err(e) => eprintln!("userbpf-agent: {e}"),
        }
        attach::semaphores::raise_own(&userbpf_runtime::session::Layout::new(userbpf_runtime::Session::dir_of(
            &userbpf_runtime::Session::default_name(),
        )));
    });
}

#[used]
#[unsafe(link_section = ".init_array")]
static SERVER_INIT: extern "C" fn(c_int, *const *const c_char, *mut *mut c_char) = server_init;

/// libc's `open(2)` (variadic in C: on x86-64 the optional mode arrives in the third
/// argument register, as a non-variadic third argument would).
///
/// # Safety
/// As for libc's `open`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn open(path: *const c_char, flags: c_int, mode: c_uint) -> c_int {
    trace_pipe::open_at(libc::AT_FDCWD, path, flags, mode)
}

/// libc's `open64`: the same call on x86-64.
///
/// # Safety
/// As for libc's `open64`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn open64(path: *const c_char, flags: c_int, mode: c_uint) -> c_int {
    trace_pipe::open_at(libc::AT_FDCWD, path, flags, mode)
}

/// libc's `openat(2)`.
///
/// # Safety
/// As for libc's `openat`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn openat(dirfd: c_int, path: *const c_char, flags: c_int, mode: c_uint) -> c_int {
    trace_pipe::open_at(dirfd, path, flags, mode)
}

/// libc's `openat64`: the same call on x86-64.
///
/// # Safety
/// As for libc's `openat64`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn openat64(dirfd: c_int, path: *const c_char, flags: c_int, mode: c_uint) -> c_int {
    trace_pipe::open_at(dirfd, path, flags, mode)
}

/// libc's `fopen(3)`.
///
/// # Safety
/// As for libc's `fopen`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fopen(path: *const c_char, mode: *const c_char) -> *mut libc::FILE {
    trace_pipe::fopen_with(c"fopen", path, mode)
}

/// libc's `fopen64(3)`.
///
/// # Safety
/// As for libc's `fopen64`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fopen64(path: *const c_char, mode: *const c_char) -> *mut libc::FILE {
    trace_pipe::fopen_with(c"fopen64", path, mode)
}
