//! libc's system call sites rewritten into jumps while dispatch is on (`rewrite`): the calls
//! are seen as through dispatch (numbers, arguments, results, errno), the registers the
//! program keeps across a `syscall` (vector ones included) survive, calls left to dispatch
//! (`fork` through `syscall()`) still work, a thread blocked in a call while its site is
//! rewritten and then interrupted by an `SA_RESTART` signal resumes correctly, a vfork child
//! is not taken for its parent, only the calls programs are attached to run callbacks, a
//! probe placed over a rewritten site takes it back, rewriting and restoring while threads
//! run through the sites (and return from signal handlers) keeps their results, and
//! disabling dispatch gives every site its original bytes back.

use std::ffi::c_void;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::*};

use userbpf_hook::{HOOK_CONTINUE, ProbeKind, PtRegs, rewrite, sud};

static PPID_ENTER: AtomicU64 = AtomicU64::new(0);
static PPID_EXIT: AtomicU64 = AtomicU64::new(0);
static PPID_RET: AtomicI64 = AtomicI64::new(0);
static CLOSE_BAD: AtomicU64 = AtomicU64::new(0);
static CLOSE_RET: AtomicI64 = AtomicI64::new(0);
static READS: AtomicU64 = AtomicU64::new(0);
static READ_RET: AtomicI64 = AtomicI64::new(0);
static FORKS: AtomicU64 = AtomicU64::new(0);
static EXECS: AtomicU64 = AtomicU64::new(0);

fn on_enter(r: &PtRegs) {
    match r.orig_ax as i64 {
        libc::SYS_getppid => drop(PPID_ENTER.fetch_add(1, SeqCst)),
        libc::SYS_close if r.di == 987_654 => drop(CLOSE_BAD.fetch_add(1, SeqCst)),
        libc::SYS_read if r.dx == 4321 => drop(READS.fetch_add(1, SeqCst)),
        libc::SYS_fork => drop(FORKS.fetch_add(1, SeqCst)),
        libc::SYS_execve => drop(EXECS.fetch_add(1, SeqCst)),
        _ => {}
    }
}

fn on_exit(r: &PtRegs) {
    match r.orig_ax as i64 {
        libc::SYS_getppid => {
            PPID_EXIT.fetch_add(1, SeqCst);
            PPID_RET.store(r.ax as i64, SeqCst);
        }
        libc::SYS_close if r.di == 987_654 => CLOSE_RET.store(r.ax as i64, SeqCst),
        libc::SYS_read if r.dx == 4321 => READ_RET.store(r.ax as i64, SeqCst),
        _ => {}
    }
}

fn getppid_addr() -> usize {
    libc::getppid as *const () as usize
}

fn first_byte(addr: usize) -> u8 {
    // SAFETY: a libc function's first byte, mapped and readable.
    unsafe { std::ptr::read_volatile(addr as *const u8) }
}

/// Calls libc's `getppid` with xmm0-15 holding known values and returns them as found after
/// the call (`getppid` itself touches none of them: only the site's trampoline could).
fn vectors_across_getppid() -> [u64; 32] {
    let input: [u64; 32] = std::array::from_fn(|i| 0x1111_0000_0000_0000 | (i as u64 * 0x0101_0101));
    let mut out = [0u64; 32];
    let f = getppid_addr();
    // SAFETY: loads and stores of the two local arrays; the call is to libc's getppid, which
    // clobbers at most rax, rcx and r11 (declared, with every other caller-saved register).
    unsafe {
        core::arch::asm!(
            "movdqu xmm0, [{i}]", "movdqu xmm1, [{i}+16]", "movdqu xmm2, [{i}+32]", "movdqu xmm3, [{i}+48]",
            "movdqu xmm4, [{i}+64]", "movdqu xmm5, [{i}+80]", "movdqu xmm6, [{i}+96]", "movdqu xmm7, [{i}+112]",
            "movdqu xmm8, [{i}+128]", "movdqu xmm9, [{i}+144]", "movdqu xmm10, [{i}+160]", "movdqu xmm11, [{i}+176]",
            "movdqu xmm12, [{i}+192]", "movdqu xmm13, [{i}+208]", "movdqu xmm14, [{i}+224]", "movdqu xmm15, [{i}+240]",
            "push {o}", "push {o}",
            "call {f}",
            "pop {o}", "pop {o}",
            "movdqu [{o}], xmm0", "movdqu [{o}+16], xmm1", "movdqu [{o}+32], xmm2", "movdqu [{o}+48], xmm3",
            "movdqu [{o}+64], xmm4", "movdqu [{o}+80], xmm5", "movdqu [{o}+96], xmm6", "movdqu [{o}+112], xmm7",
            "movdqu [{o}+128], xmm8", "movdqu [{o}+144], xmm9", "movdqu [{o}+160], xmm10", "movdqu [{o}+176], xmm11",
            "movdqu [{o}+192], xmm12", "movdqu [{o}+208], xmm13", "movdqu [{o}+224], xmm14", "movdqu [{o}+240], xmm15",
            i = in(reg) input.as_ptr(),
            o = in(reg) out.as_mut_ptr(),
            f = in(reg) f,
            clobber_abi("C"),
        );
    }
    assert_eq!(out, input, "vector registers changed across a rewritten system call");
    out
}

static USR1: AtomicU64 = AtomicU64::new(0);
extern "C" fn on_usr1(_: i32) {
    USR1.fetch_add(1, SeqCst);
}

unsafe extern "C" fn nothing(_: *mut c_void, _: *mut PtRegs) -> u32 {
    HOOK_CONTINUE
}

#[test]
fn libc_sites_are_rewritten_and_behave_as_dispatched() {
    // A thread blocked in read() before anything is rewritten (its site is rewritten under
    // it), later interrupted by an SA_RESTART signal: the kernel restarts the call at the
    // original `syscall`, which dispatch handles; the data then arrives.
    let mut fds = [0i32; 2];
    // SAFETY: a pipe into a local array; SIGUSR1 gets a plain SA_RESTART handler.
    unsafe {
        assert_eq!(libc::pipe(fds.as_mut_ptr()), 0);
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_usr1 as *const () as usize;
        sa.sa_flags = libc::SA_RESTART;
        libc::sigaction(libc::SIGUSR1, &sa, std::ptr::null_mut());
    }
    let rfd = fds[0];
    let (tx, rx) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        // SAFETY: gettid has no preconditions.
        tx.send(unsafe { libc::gettid() }).unwrap();
        let mut buf = [0u8; 4321];
        // SAFETY: reading into a local buffer of the length given.
        unsafe { libc::read(rfd, buf.as_mut_ptr() as *mut c_void, 4321) }
    });
    let tid = rx.recv().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(100));

    sud::set_callbacks(on_enter, on_exit);
    let t0 = std::time::Instant::now();
    sud::enable().expect("system call dispatch (Linux 5.11+)");
    eprintln!("dispatch on and libc rewritten in {:?}", t0.elapsed());
    assert_eq!(sud::rewrite_error(), None);
    let (now, found) = rewrite::counts();
    assert!(found >= 400 && now >= 400, "rewritten {now} of {found} sites of libc");
    eprintln!("libc: {now} of {found} system call sites rewritten");
    assert!(rewrite::is_rewritten(getppid_addr()), "getppid's `mov eax, NR` is a jump");
    assert_eq!(first_byte(getppid_addr()), 0xE9);

    // Interrupt the blocked read (restarted by the kernel), then feed it.
    // SAFETY: a signal to our own thread, whose handler is installed.
    unsafe { libc::syscall(libc::SYS_tgkill, libc::getpid(), tid, libc::SIGUSR1) };
    std::thread::sleep(std::time::Duration::from_millis(50));
    // SAFETY: writing 3 bytes from a static buffer into our pipe.
    assert_eq!(unsafe { libc::write(fds[1], b"abc".as_ptr() as *const c_void, 3) }, 3);
    assert_eq!(reader.join().unwrap(), 3, "the interrupted read resumed and read the data");
    assert_eq!(USR1.load(SeqCst), 1);
    // Its call began before dispatch: only its return would be seen, and dispatch does not
    // see the return of a call whose entry it did not see.

    // Calls through rewritten sites: counts, results and errno as the kernel's.
    // SAFETY: no preconditions.
    let ppid = unsafe { libc::getppid() };
    for _ in 0..1000 {
        // SAFETY: as above.
        assert_eq!(unsafe { libc::getppid() }, ppid);
    }
    assert_eq!((PPID_ENTER.load(SeqCst), PPID_EXIT.load(SeqCst), PPID_RET.load(SeqCst)), (1001, 1001, ppid as i64));
    // SAFETY: closing a descriptor that does not exist; errno read right after.
    let (r, errno) = unsafe { (libc::close(987_654), *libc::__errno_location()) };
    assert_eq!((r, errno), (-1, libc::EBADF));
    assert_eq!((CLOSE_BAD.load(SeqCst), CLOSE_RET.load(SeqCst)), (1, -(libc::EBADF as i64)));
    // The generic syscall() (its number known only when it runs).
    // SAFETY: as above.
    assert_eq!(unsafe { libc::syscall(libc::SYS_getppid) }, ppid as i64);
    assert_eq!(PPID_ENTER.load(SeqCst), 1002);
    vectors_across_getppid();
    assert_eq!(PPID_ENTER.load(SeqCst), 1003);

    // fork through syscall(): left to dispatch by the site (the child returns where the
    // parent called); the child sees its calls too.
    // SAFETY: the child makes system calls and leaves with _exit.
    let pid = unsafe { libc::syscall(libc::SYS_fork) } as i32;
    if pid == 0 {
        let before = PPID_ENTER.load(SeqCst);
        // SAFETY: no preconditions.
        unsafe { libc::getppid() };
        // SAFETY: leaving the child at once.
        unsafe { libc::_exit(if PPID_ENTER.load(SeqCst) == before + 1 { 0 } else { 3 }) };
    }
    assert!(pid > 0, "fork: {pid}");
    let mut status = 0;
    // SAFETY: waiting for our child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "child status {status:#x}");
    assert_eq!(FORKS.load(SeqCst), 1);

    // posix_spawn (clone with CLONE_VFORK, left to dispatch): the child's calls until its
    // exec run with this thread's TCB and are not taken for ours (as with dispatch alone);
    // this thread's calls after it are seen again.
    let mut child = 0;
    let prog = c"/bin/true";
    let argv = [prog.as_ptr() as *mut libc::c_char, std::ptr::null_mut()];
    // SAFETY: spawning /bin/true with a NULL-terminated argv and no environment.
    let r = unsafe {
        libc::posix_spawn(
            &mut child,
            prog.as_ptr(),
            std::ptr::null(),
            std::ptr::null(),
            argv.as_ptr(),
            [std::ptr::null_mut()].as_ptr(),
        )
    };
    assert_eq!(r, 0);
    // SAFETY: waiting for our child.
    unsafe { libc::waitpid(child, &mut status, 0) };
    assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "spawned child status {status:#x}");
    assert_eq!(EXECS.load(SeqCst), 0, "the vfork child's execve taken for the parent's");
    // SAFETY: no preconditions.
    unsafe { libc::getppid() };
    assert_eq!(PPID_ENTER.load(SeqCst), 1004, "a call after posix_spawn");

    // Threads calling through rewritten sites at once.
    let threads: Vec<_> = (0..4)
        .map(|_| {
            std::thread::spawn(|| {
                for _ in 0..2000 {
                    // SAFETY: no preconditions.
                    unsafe { libc::getppid() };
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(PPID_ENTER.load(SeqCst), 1004 + 8000);

    // A probe placed over a rewritten site takes it back: the site goes to dispatch, the
    // probe and the tracing both see the call.
    let id = userbpf_hook::attach(getppid_addr(), ProbeKind::Entry, nothing, std::ptr::null_mut()).expect("probe");
    assert!(!rewrite::is_rewritten(getppid_addr()));
    // SAFETY: as above.
    assert_eq!(unsafe { libc::getppid() }, ppid);
    assert_eq!(PPID_ENTER.load(SeqCst), 1004 + 8000 + 1);
    userbpf_hook::detach(id).unwrap();

    // Only getppid wanted: a close through a rewritten site runs no callback (as the kernel
    // runs no program for a call without one), getppid still does.
    sud::want_callbacks(Some(&[libc::SYS_getppid as u32]), Some(&[libc::SYS_getppid as u32]));
    // The close is made straight from the sites' stub: its result and errno as ever.
    // SAFETY: closing a descriptor that does not exist; no preconditions for getppid.
    let (r, errno) = unsafe { (libc::close(987_654), *libc::__errno_location()) };
    assert_eq!((r, errno), (-1, libc::EBADF));
    // SAFETY: as above.
    assert_eq!(unsafe { libc::getppid() }, ppid);
    assert_eq!((CLOSE_BAD.load(SeqCst), PPID_ENTER.load(SeqCst)), (1, 1004 + 8000 + 2));
    // A call that needs more than the plain call (rt_sigprocmask keeps SIGSYS unblocked) is
    // not made from the stub.
    // SAFETY: blocking every signal on this thread, then reading the mask back and restoring it.
    unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        let mut now: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        // Raw calls through syscall(), past libc's sigprocmask (which has a guard probe).
        let mask = |set: *const libc::sigset_t, old: *mut libc::sigset_t| {
            libc::syscall(libc::SYS_rt_sigprocmask, libc::SIG_SETMASK, set, old, 8)
        };
        assert_eq!(mask(&all, &mut old), 0);
        assert_eq!(mask(std::ptr::null(), &mut now), 0);
        assert_eq!(libc::sigismember(&now, libc::SIGSYS), 0, "SIGSYS blocked");
        assert_eq!(libc::sigismember(&now, libc::SIGUSR1), 1);
        assert_eq!(mask(&old, std::ptr::null_mut()), 0);
    }
    sud::want_callbacks(None, None);

    // Rewriting and restoring while other threads run through the sites: reads of an empty
    // non-blocking pipe (glibc's `read` of a threaded process: `mov edi, [rsp+8]; xor eax,
    // eax; syscall`, a window of two instructions, where a thread may be caught between the
    // two and is moved to the trampoline's copy) and getppid, each checking its result.
    let mut p2 = [0i32; 2];
    // SAFETY: a pipe into a local array.
    assert_eq!(unsafe { libc::pipe2(p2.as_mut_ptr(), libc::O_NONBLOCK) }, 0);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let bad = std::sync::Arc::new(AtomicU64::new(0));
    let spinners: Vec<_> = (0..2)
        .map(|_| {
            let (stop, bad, rfd) = (stop.clone(), bad.clone(), p2[0]);
            std::thread::spawn(move || {
                let mut buf = [0u8; 8];
                while !stop.load(SeqCst) {
                    // SAFETY: reading into a local buffer; errno read right after.
                    let (r, e) =
                        unsafe { (libc::read(rfd, buf.as_mut_ptr() as *mut c_void, 8), *libc::__errno_location()) };
                    // SAFETY: no preconditions.
                    if (r, e) != (-1, libc::EAGAIN) || unsafe { libc::getppid() } != ppid {
                        bad.fetch_add(1, SeqCst);
                    }
                }
            })
        })
        .collect();
    for _ in 0..10 {
        sud::disable();
        assert_eq!(rewrite::counts().0, 0);
        sud::enable().unwrap();
        assert!(rewrite::counts().0 >= 400);
    }
    stop.store(true, SeqCst);
    for t in spinners {
        t.join().unwrap();
    }
    assert_eq!(bad.load(SeqCst), 0, "wrong results while sites were rewritten and restored");
    // SAFETY: closing our pipe.
    unsafe {
        libc::close(p2[0]);
        libc::close(p2[1]);
    }
    let seen = PPID_ENTER.load(SeqCst);

    // Dispatch off: every site has its original bytes back.
    sud::disable();
    assert_eq!(rewrite::counts().0, 0);
    assert_eq!(first_byte(getppid_addr()), 0xB8);
    // SAFETY: a raw read of libc's `close` wrapper bytes is fine; no preconditions for the call.
    unsafe { libc::getppid() };
    assert_eq!(PPID_ENTER.load(SeqCst), seen, "dispatch off");
    // SAFETY: closing our pipe.
    unsafe {
        libc::close(fds[0]);
        libc::close(fds[1]);
    }
}
