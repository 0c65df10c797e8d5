//! Links of a loader that dies without exiting (SIGKILL, a crash): the loader keeps the list
//! of the links it owns in the session (`perf/owner-PID`), and a watchdog process removes
//! them when the loader is gone, then (when loaders injected the agent into running
//! processes) runs `userbpf detach --unused`, so a process injected for the dead loader's
//! links is left as it was.

use std::sync::Once;

use userbpf_runtime::session::layout;

use crate::objects;

/// Changes the owned list and rewrites the owner file (`perf/owner-PID`: the paths of the
/// owned links' records, one a line) that the watchdog reads when the loader is gone.
pub(super) fn owned(f: impl FnOnce(&mut Vec<u32>)) {
    let mut v = crate::server::server().attach.owned.lock().unwrap_or_else(|e| e.into_inner());
    f(&mut v);
    let Ok(s) = objects::session() else { return };
    let mut text = String::new();
    for id in v.iter() {
        text.push_str(&s.layout().link(*id).to_string_lossy());
        text.push('\n');
    }
    let _ = layout::write_atomic(&s.layout().perf_owner(std::process::id()), text.as_bytes());
}

/// Starts (once) a watchdog process that removes this loader's links when the loader is
/// gone however it ended, so targets detach: a forked child in its own session (terminal
/// signals do not reach it), with no descriptor of the loader's (closes are seen as the
/// kernel sees them), waiting on a pidfd of the loader. After the fork it makes raw system
/// calls only, on memory prepared before.
pub(super) fn watchdog_once() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let Ok(s) = objects::session() else { return };
        let Ok(owner) =
            std::ffi::CString::new(s.layout().perf_owner(std::process::id()).into_os_string().into_encoded_bytes())
        else {
            return;
        };
        let loader = std::process::id() as i64;
        let then = Detacher::new(s);
        // SAFETY: fork; the child runs `watchdog` only, which makes raw system calls on its
        // stack and on `owner` and `then` (copied into the child), and never returns.
        let pid = unsafe { crate::sys::raw6(libc::SYS_fork, 0, 0, 0, 0, 0, 0) };
        if pid == 0 {
            // SAFETY: in the child, as above.
            unsafe { watchdog(loader, owner.as_ptr(), then.as_ref()) }
        }
        // The parent keeps its copy for as long as it runs (nothing to free in a loop).
        std::mem::forget(then);
    });
}

/// What the watchdog runs once the loader's links are gone, if loaders injected the agent
/// into running processes in the session (`perf/injected.lock` exists): `userbpf --session S
/// detach --unused`, which detaches those whose links are all gone (see
/// [`super::targets`]). Everything the `execve` needs is made before the fork.
pub(super) struct Detacher {
    lock: std::ffi::CString,
    bin: std::ffi::CString,
    _strings: Vec<std::ffi::CString>,
    argv: Vec<*const libc::c_char>,
    envp: Vec<*const libc::c_char>,
}

impl Detacher {
    fn new(s: &userbpf_runtime::Session) -> Option<Detacher> {
        use std::ffi::CString;
        let bin = super::targets::userbpf_bin().ok()?;
        let bin = CString::new(bin.into_os_string().into_encoded_bytes()).ok()?;
        let lock = CString::new(s.layout().injected_lock().into_os_string().into_encoded_bytes()).ok()?;
        let args = ["userbpf", "--session", s.name(), "detach", "--unused"];
        let args: Vec<CString> = args.iter().filter_map(|a| CString::new(*a).ok()).collect();
        // The loader's environment (USERBPF_SHM_DIR, ...) without this library preloaded.
        let env: Vec<CString> = std::env::vars_os()
            .filter(|(k, _)| k != "LD_PRELOAD" && k != "USERBPF_LOADER_PID")
            .filter_map(|(k, v)| {
                let mut e = k.into_encoded_bytes();
                e.push(b'=');
                e.extend(v.into_encoded_bytes());
                CString::new(e).ok()
            })
            .collect();
        let mut argv: Vec<*const libc::c_char> = args.iter().map(|a| a.as_ptr()).collect();
        argv.push(std::ptr::null());
        let mut envp: Vec<*const libc::c_char> = env.iter().map(|e| e.as_ptr()).collect();
        envp.push(std::ptr::null());
        let mut strings = args;
        strings.extend(env);
        Some(Detacher { lock, bin, _strings: strings, argv, envp })
    }
}

/// The watchdog's body (see [`watchdog_once`]).
///
/// # Safety
/// Only in the forked child; `owner` is a NUL-terminated path; `then`'s pointers point into
/// its own strings.
unsafe fn watchdog(loader: i64, owner: *const libc::c_char, then: Option<&Detacher>) -> ! {
    use crate::sys::raw6;
    // SAFETY: (whole body) raw system calls with pointers to this frame's buffers and to the
    // NUL-terminated `owner`.
    unsafe {
        raw6(436 /* close_range */, 0, u32::MAX as i64, 0, 0, 0, 0);
        raw6(libc::SYS_setsid, 0, 0, 0, 0, 0, 0);
        let name = *b"userbpf-watch\0";
        raw6(libc::SYS_prctl, libc::PR_SET_NAME as i64, name.as_ptr() as i64, 0, 0, 0, 0);
        let pidfd = raw6(434 /* pidfd_open */, loader, 0, 0, 0, 0, 0);
        if pidfd >= 0 {
            let mut p = libc::pollfd { fd: pidfd as i32, events: libc::POLLIN, revents: 0 };
            loop {
                let r = raw6(libc::SYS_poll, &mut p as *mut libc::pollfd as i64, 1, -1, 0, 0, 0);
                if r != -(libc::EINTR as i64) {
                    break;
                }
            }
        }
        let fd = raw6(libc::SYS_openat, libc::AT_FDCWD as i64, owner as i64, libc::O_RDONLY as i64, 0, 0, 0);
        if fd >= 0 {
            let mut buf = [0u8; 65536];
            let mut n = 0usize;
            while n < buf.len() - 1 {
                let r = raw6(libc::SYS_read, fd, buf.as_mut_ptr().add(n) as i64, (buf.len() - 1 - n) as i64, 0, 0, 0);
                if r <= 0 {
                    break;
                }
                n += r as usize;
            }
            let mut start = 0usize;
            for i in 0..n {
                if buf[i] == b'\n' {
                    buf[i] = 0;
                    if i > start {
                        raw6(libc::SYS_unlink, buf.as_ptr().add(start) as i64, 0, 0, 0, 0, 0);
                    }
                    start = i + 1;
                }
            }
        }
        raw6(libc::SYS_unlink, owner as i64, 0, 0, 0, 0, 0);
        if let Some(d) = then
            && raw6(libc::SYS_access, d.lock.as_ptr() as i64, libc::F_OK as i64, 0, 0, 0, 0) == 0
        {
            // The agents saw their links go; what loaders injected and nothing uses goes too.
            raw6(libc::SYS_execve, d.bin.as_ptr() as i64, d.argv.as_ptr() as i64, d.envp.as_ptr() as i64, 0, 0, 0);
        }
        raw6(libc::SYS_exit_group, 0, 0, 0, 0, 0, 0);
    }
    #[allow(clippy::empty_loop)]
    loop {}
}
