//! The kernel's `trace_pipe`, as a loader sees it: opening `/sys/kernel/tracing/trace_pipe`
//! (or `/sys/kernel/debug/tracing/trace_pipe`) in the loader gives the read end of a pipe fed
//! with the session's `bpf_trace_printk` lines, in the kernel's line format, so
//! `userbpf load cat /sys/kernel/tracing/trace_pipe` and loaders that read the trace pipe
//! themselves show what the session's programs print. Reading consumes the lines, as reading
//! the kernel's trace_pipe does. A thread of ours copies lines from the session's ring into
//! the pipe until the reader closes its end.
//!
//! [`open_at`] and [`fopen_with`] serve the C entry points `open`, `open64`, `openat`,
//! `openat64`, `fopen` and `fopen64` ([`crate::shim`]); every other path goes to the kernel
//! (or libc's `fopen`) unchanged.

use std::ffi::{CStr, c_char, c_int, c_uint};
use std::time::Duration;

use userbpf_maps::Map;
use userbpf_maps::ringbuf::RingBufConsumer;

use crate::{objects, serving, sys};

/// The paths of the kernel's trace pipe (tracefs at its own mount point, and under debugfs).
const TRACE_PIPES: [&[u8]; 2] = [b"/sys/kernel/tracing/trace_pipe", b"/sys/kernel/debug/tracing/trace_pipe"];

/// Whether `path` names the kernel's trace pipe and this process is the served loader.
fn is_trace_pipe(path: *const c_char) -> bool {
    // Called by every open of the loader (a C entry point): no panic may escape.
    if path.is_null() || !std::panic::catch_unwind(serving).unwrap_or(false) {
        return false;
    }
    // SAFETY: a non-null path argument of open/fopen is a NUL-terminated string (libc's
    // contract, which the caller must keep for the real call as well).
    let p = unsafe { CStr::from_ptr(path) }.to_bytes();
    TRACE_PIPES.contains(&p)
}

/// Opens the session's trace pipe as a pipe: the read end (with `O_CLOEXEC`/`O_NONBLOCK` as
/// asked in `flags`), or a negative errno.
fn open_pipe(flags: c_int) -> Result<c_int, i32> {
    let session = objects::session()?;
    let map = session.trace_pipe().map_err(|_| libc::EIO)?;
    let mut fds = [-1; 2];
    // SAFETY: pipe2 writes two descriptors into the array we own.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EMFILE));
    }
    let [rd, wr] = fds;
    let fl = flags & (libc::O_NONBLOCK);
    if fl != 0 {
        // SAFETY: fcntl on our own descriptor.
        unsafe { libc::fcntl(rd, libc::F_SETFL, fl) };
    }
    if flags & libc::O_CLOEXEC == 0 {
        // SAFETY: fcntl on our own descriptor.
        unsafe { libc::fcntl(rd, libc::F_SETFD, 0) };
    }
    let spawned = userbpf_hook::quiet::spawn("userbpf-trace", move || feed(map, wr));
    if spawned.is_err() {
        objects::close(rd);
        objects::close(wr);
        return Err(libc::EAGAIN);
    }
    Ok(rd)
}

/// Copies the ring's lines into the pipe's write end `wr` until the reader is gone.
fn feed(map: Map, wr: c_int) {
    // The reader closing its end makes our write fail with EPIPE; its SIGPIPE is for this
    // thread alone and stays blocked here.
    // SAFETY: changing the calling thread's own signal mask with a set we own.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGPIPE);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
    let Map::RingBuf(rb) = &map else { return objects::close(wr) };
    let Ok(mut consumer) = RingBufConsumer::new(rb) else { return objects::close(wr) };
    let mut gone = false;
    while !gone {
        let r = consumer.poll(Duration::from_millis(200), |line| {
            if !gone {
                gone = !write_all(wr, line);
            }
        });
        if r.is_err() || (!gone && reader_gone(wr)) {
            break;
        }
    }
    objects::close(wr);
}

/// Writes all of `buf` to `fd`; false once the reader is gone (or on any other error).
fn write_all(fd: c_int, mut buf: &[u8]) -> bool {
    while !buf.is_empty() {
        // SAFETY: writing from a slice we hold, of its length.
        let n = unsafe { sys::raw6(libc::SYS_write, fd as i64, buf.as_ptr() as i64, buf.len() as i64, 0, 0, 0) };
        if n == -(libc::EINTR as i64) {
            continue;
        }
        if n <= 0 {
            return false;
        }
        buf = &buf[n as usize..];
    }
    true
}

/// Whether the pipe's read end is closed (checked while no line comes, so that an idle
/// reader that went away does not keep the thread).
fn reader_gone(wr: c_int) -> bool {
    let mut p = libc::pollfd { fd: wr, events: 0, revents: 0 };
    // SAFETY: polling one descriptor of ours through a local pollfd, without waiting.
    let n = unsafe { sys::raw6(libc::SYS_poll, &mut p as *mut libc::pollfd as i64, 1, 0, 0, 0, 0) };
    n > 0 && p.revents & (libc::POLLERR | libc::POLLHUP) != 0
}

/// `openat(2)` for every path: the trace pipe from the session, the rest from the kernel.
pub(crate) fn open_at(dirfd: c_int, path: *const c_char, flags: c_int, mode: c_uint) -> c_int {
    if is_trace_pipe(path) {
        return match std::panic::catch_unwind(|| open_pipe(flags)) {
            Ok(Ok(fd)) => fd,
            Ok(Err(e)) => {
                sys::set_errno(e);
                -1
            }
            Err(_) => {
                sys::set_errno(libc::EIO);
                -1
            }
        };
    }
    // SAFETY: the caller's arguments, passed on unchanged (mode is read by the kernel only
    // with O_CREAT or O_TMPFILE, as libc's variadic wrapper does).
    sys::libc_ret(unsafe { sys::raw6(libc::SYS_openat, dirfd as i64, path as i64, flags as i64, mode as i64, 0, 0) })
        as c_int
}

type FopenFn = unsafe extern "C" fn(*const c_char, *const c_char) -> *mut libc::FILE;

/// libc's own `fopen` (or `fopen64`), found past this library.
fn next_fopen(name: &CStr) -> Option<FopenFn> {
    // SAFETY: dlsym with RTLD_NEXT and a NUL-terminated name; the result, when not null, is
    // libc's function of that name, whose type is FopenFn.
    let f = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr()) };
    // SAFETY: see above: a non-null symbol of that name is a function of that type.
    (!f.is_null()).then(|| unsafe { std::mem::transmute::<*mut libc::c_void, FopenFn>(f) })
}

/// `fopen` for the trace pipe (glibc's `fopen` opens through its internal `open`, which the
/// definitions above do not reach): a stream on our pipe; other paths go to libc's.
pub(crate) fn fopen_with(next: &CStr, path: *const c_char, mode: *const c_char) -> *mut libc::FILE {
    if is_trace_pipe(path) {
        let fd = open_at(libc::AT_FDCWD, path, libc::O_RDONLY | libc::O_CLOEXEC, 0);
        if fd < 0 {
            return std::ptr::null_mut();
        }
        // SAFETY: a descriptor we just opened, and the caller's mode string.
        let f = unsafe { libc::fdopen(fd, mode) };
        if f.is_null() {
            objects::close(fd);
        }
        return f;
    }
    match next_fopen(next) {
        // SAFETY: libc's fopen with the caller's arguments, unchanged.
        Some(f) => unsafe { f(path, mode) },
        None => {
            sys::set_errno(libc::ENOSYS);
            std::ptr::null_mut()
        }
    }
}
