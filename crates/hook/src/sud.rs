//! System calls made by `syscall` instructions outside libc, seen through Linux's Syscall
//! User Dispatch (`prctl(PR_SET_SYSCALL_USER_DISPATCH)`, Linux 5.11+).
//!
//! With dispatch on, a thread's system call made from outside one allowed address range
//! does not run: the kernel sends the thread `SIGSYS` (`si_code` `SYS_USER_DISPATCH`) with
//! the registers as at the `syscall` instruction (`rax` = the number, `rip` after it). The
//! range allowed here is libc's text: calls made through libc's functions run as before (and
//! are seen at their wrappers by the agent's probes), at no cost; everything else (inline
//! `syscall` in the program or other libraries, the dynamic loader's own calls, the vDSO's
//! fallbacks) traps. The `SIGSYS` handler gives the registers to the enter callback (as a
//! `struct pt_regs`: the number in `orig_ax`, the arguments in di, si, dx, r10, r8, r9),
//! makes the call itself through the `syscall` instruction of libc's `syscall()` (inside
//! the allowed range; entered after that function's first bytes, so a probe on `syscall()`
//! does not see it), gives the result to the exit callback and returns it in `rax`.
//!
//! Calls that cannot be made from inside a signal handler:
//! * `rt_sigreturn` restores the frame of the signal it returns from: the thread is resumed
//!   at libc's `syscall` instruction with its registers as they were, so the call runs there;
//! * `clone` sharing the address space or with a new stack, `clone3` and `vfork` (the child
//!   would run on the handler's frames): dispatch is turned off for the calling thread and
//!   the instruction runs again as it is (its exit is not seen, nor later calls of that
//!   thread); other `clone`s and `fork` run in the handler and the child turns dispatch on;
//! * `rt_sigprocmask` is applied to the signal mask the handler returns to, with `SIGSYS`
//!   never blocked (a blocked `SIGSYS` from dispatch kills the process); `sigaltstack`'s new
//!   stack is also put in the frame (the handler's return restores the frame's); an
//!   `rt_sigaction` of `SIGSYS` keeps this handler and chains the program's.
//!
//! Dispatch is per thread: [`enable`] turns it on in every thread (the calling one directly,
//! the others with a signal), threads created later by `pthread_create` turn it on before
//! their start routine (an entry probe on `pthread_create` wraps the routine), a forked child
//! turns it on for its thread (`fork` module), and exec turns it off (the new image's agent
//! decides again). A dispatched call finding `SIGSYS` blocked kills the thread's process, so
//! while dispatch is on `SIGSYS` is taken out of the sets given to libc's `sigprocmask`,
//! `pthread_sigmask` and `sigaction` (entry probes pass a copy) and to raw `rt_sigprocmask`.
//! A `SIGSYS` handler the program installs through `sigaction` while dispatch is on is kept
//! as the one other `SIGSYS`s (seccomp's, `raise`) are handed to.
//! Limits: threads made by raw `clone` outside libc do not get dispatch; masks set by other paths
//! (`sigsuspend`, `pselect`, libc-internal blocking such as at thread exit) still block it,
//! and a raw system call then kills the process.

use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering::*};
use std::sync::Mutex;

use crate::PtRegs;

const PR_SET_SYSCALL_USER_DISPATCH: i32 = 59;
const PR_SYS_DISPATCH_OFF: u64 = 0;
const PR_SYS_DISPATCH_ON: u64 = 1;
const SYS_USER_DISPATCH: i32 = 2;

/// Called before a dispatched system call runs (`orig_ax` = its number).
pub type EnterFn = fn(&PtRegs);
/// Called after it ran (`ax` = the result, `-errno` on failure).
pub type ExitFn = fn(&PtRegs);

struct Callbacks {
    enter: EnterFn,
    exit: ExitFn,
}

static CALLBACKS: AtomicPtr<Callbacks> = AtomicPtr::new(std::ptr::null_mut());
static ENABLED: AtomicBool = AtomicBool::new(false);
/// libc's text: `[LO, LO + LEN)`.
static LO: AtomicUsize = AtomicUsize::new(0);
static LEN: AtomicUsize = AtomicUsize::new(0);
/// The `syscall` instruction inside libc's `syscall()`, followed by `cmp rax,-4095; jae
/// error; ret` (the error path sets errno and returns -1).
static GADGET: AtomicUsize = AtomicUsize::new(0);
static SETUP: Mutex<Option<Result<(), String>>> = Mutex::new(None);
static OLD_SIGSYS: AtomicPtr<libc::sigaction> = AtomicPtr::new(std::ptr::null_mut());
static ACKS: AtomicUsize = AtomicUsize::new(0);

/// Signal used to turn dispatch on or off in other threads (SIGRTMAX - 4).
pub fn switch_signal() -> i32 {
    libc::SIGRTMAX() - 4
}

/// Whether dispatch is on (for the threads that get it).
pub fn enabled() -> bool {
    ENABLED.load(SeqCst)
}

/// Sets the callbacks run for each dispatched system call (replaces earlier ones).
pub fn set_callbacks(enter: EnterFn, exit: ExitFn) {
    let new = Box::into_raw(Box::new(Callbacks { enter, exit }));
    // The old pair is leaked: a handler may be using it.
    CALLBACKS.swap(new, SeqCst);
}

fn set_dispatch(on: bool) -> i64 {
    let (lo, len) = (LO.load(SeqCst), LEN.load(SeqCst));
    let r = if on {
        // SAFETY: prctl with integer arguments; the selector pointer is NULL (dispatch
        // always applies outside the range).
        unsafe { libc::prctl(PR_SET_SYSCALL_USER_DISPATCH, PR_SYS_DISPATCH_ON, lo as u64, len as u64, 0u64) }
    } else {
        // SAFETY: as above; turning dispatch off takes no range.
        unsafe { libc::prctl(PR_SET_SYSCALL_USER_DISPATCH, PR_SYS_DISPATCH_OFF, 0u64, 0u64, 0u64) }
    };
    r as i64
}

/// libc's executable segment and the `syscall` instruction of its `syscall()`.
fn find_libc() -> Result<(usize, usize, usize), String> {
    struct Found {
        text: Option<(usize, usize)>,
    }
    unsafe extern "C" fn cb(info: *mut libc::dl_phdr_info, _: usize, data: *mut c_void) -> i32 {
        // SAFETY: dl_iterate_phdr passes a valid info and our &mut Found.
        let (info, f) = unsafe { (&*info, &mut *(data as *mut Found)) };
        if info.dlpi_name.is_null() {
            return 0;
        }
        // SAFETY: a NUL-terminated name owned by the loader.
        let name = unsafe { std::ffi::CStr::from_ptr(info.dlpi_name) }.to_bytes();
        let base = name.rsplit(|b| *b == b'/').next().unwrap_or(name);
        if !base.starts_with(b"libc.so") {
            return 0;
        }
        for i in 0..info.dlpi_phnum as usize {
            // SAFETY: dlpi_phdr has dlpi_phnum entries.
            let ph = unsafe { &*info.dlpi_phdr.add(i) };
            if ph.p_type == libc::PT_LOAD && ph.p_flags & libc::PF_X != 0 {
                let lo = (info.dlpi_addr as usize).wrapping_add(ph.p_vaddr as usize);
                f.text = Some((lo, ph.p_memsz as usize));
            }
        }
        1
    }
    let mut f = Found { text: None };
    // SAFETY: the callback only writes into `f`, which outlives the call.
    unsafe { libc::dl_iterate_phdr(Some(cb), &mut f as *mut Found as *mut c_void) };
    let (lo, len) = f.text.ok_or("libc's text segment was not found (a static or non-glibc program?)")?;
    // libc's own `syscall` (a preloaded library may interpose one): through libc's handle.
    // SAFETY: RTLD_NOLOAD only returns a handle of the loaded libc (its reference dropped by
    // dlclose below); dlsym with a NUL-terminated name.
    let sys = unsafe {
        let h = libc::dlopen(c"libc.so.6".as_ptr(), libc::RTLD_NOLOAD | libc::RTLD_LAZY);
        if h.is_null() {
            return Err("libc.so.6 is not loaded".into());
        }
        let p = libc::dlsym(h, c"syscall".as_ptr()) as usize;
        libc::dlclose(h);
        p
    };
    if sys < lo || sys >= lo + len {
        return Err("libc's syscall() is not in libc's text".into());
    }
    let avail = (lo + len - sys).min(64);
    // SAFETY: [sys, sys+avail) lies in libc's mapped, readable text.
    let code = unsafe { std::slice::from_raw_parts(sys as *const u8, avail) };
    let at = code
        .windows(2)
        .position(|w| w == [0x0F, 0x05])
        .ok_or("no `syscall` instruction in libc's syscall()")?;
    // Expect what glibc has after it: cmp rax, -4095 (48 3d 01 f0 ff ff).
    if code.get(at + 2..at + 8) != Some(&[0x48, 0x3D, 0x01, 0xF0, 0xFF, 0xFF][..]) {
        return Err("libc's syscall() is not laid out as glibc's (syscall; cmp rax,-4095)".into());
    }
    Ok((lo, len, sys + at))
}

/// Makes system call `nr` through libc's `syscall` instruction; `-errno` on failure.
fn raw(nr: u64, a: [u64; 6]) -> i64 {
    let gadget = GADGET.load(Relaxed);
    let mut ret: i64;
    // SAFETY: calls into libc's syscall() after its prologue: `syscall; cmp; jae err; ret`,
    // the error path storing errno and returning -1. It uses only the registers declared
    // (rax and the arguments; rcx and r11 clobbered by `syscall` and the error path) and
    // pushes one return address (the asm may use the stack: no `nostack`).
    unsafe {
        core::arch::asm!(
            "call {g}",
            g = in(reg) gadget,
            inlateout("rax") nr as i64 => ret,
            in("rdi") a[0], in("rsi") a[1], in("rdx") a[2],
            in("r10") a[3], in("r8") a[4], in("r9") a[5],
            lateout("rcx") _, lateout("r11") _,
        );
    }
    if ret == -1 {
        // SAFETY: this thread's errno, just set by libc's error path.
        -(unsafe { *libc::__errno_location() } as i64)
    } else {
        ret
    }
}

/// Makes a system call through libc's `syscall` instruction once dispatch was set up (so
/// that it never traps), keeping errno; `None` before (the caller makes it itself).
pub(crate) fn through_libc(nr: u64, a: [u64; 6]) -> Option<i64> {
    if GADGET.load(Relaxed) == 0 {
        return None;
    }
    // SAFETY: this thread's errno, restored below.
    let errno = unsafe { *libc::__errno_location() };
    let r = raw(nr, a);
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = errno };
    Some(r)
}

fn greg(uc: *mut libc::ucontext_t, r: i32) -> *mut i64 {
    // SAFETY: uc is the ucontext the kernel passed to our SA_SIGINFO handler.
    unsafe { &mut (*uc).uc_mcontext.gregs[r as usize] as *mut i64 }
}

fn regs_of(uc: *mut libc::ucontext_t) -> PtRegs {
    // SAFETY: reading the saved registers of the signal frame.
    let g = |r: i32| unsafe { *greg(uc, r) } as u64;
    PtRegs {
        r15: g(libc::REG_R15),
        r14: g(libc::REG_R14),
        r13: g(libc::REG_R13),
        r12: g(libc::REG_R12),
        bp: g(libc::REG_RBP),
        bx: g(libc::REG_RBX),
        r11: g(libc::REG_R11),
        r10: g(libc::REG_R10),
        r9: g(libc::REG_R9),
        r8: g(libc::REG_R8),
        ax: (-(libc::ENOSYS as i64)) as u64,
        cx: g(libc::REG_RCX),
        dx: g(libc::REG_RDX),
        si: g(libc::REG_RSI),
        di: g(libc::REG_RDI),
        orig_ax: g(libc::REG_RAX),
        ip: g(libc::REG_RIP),
        cs: 0x33,
        flags: g(libc::REG_EFL),
        sp: g(libc::REG_RSP),
        ss: 0x2b,
    }
}

fn callbacks() -> Option<&'static Callbacks> {
    let p = CALLBACKS.load(Acquire);
    // SAFETY: callbacks are leaked boxes, never freed.
    (!p.is_null()).then(|| unsafe { &*p })
}

/// `rt_sigprocmask(how, set, oldset, size)` applied to the mask the handler returns to.
fn sigprocmask_in(uc: *mut libc::ucontext_t, a: [u64; 6]) -> i64 {
    let (how, set, old, size) = (a[0] as i32, a[1] as *const u64, a[2] as *mut u64, a[3]);
    if size != 8 {
        return -(libc::EINVAL as i64);
    }
    // SAFETY: the kernel's sigset is the first 8 bytes of the ucontext's uc_sigmask.
    let cur = unsafe { &mut *(&mut (*uc).uc_sigmask as *mut libc::sigset_t as *mut u64) };
    let prev = *cur;
    if !set.is_null() {
        // SAFETY: the program passed `set` to the kernel, which would read 8 bytes there; an
        // unreadable pointer faults in the program's own call, as with the kernel's EFAULT.
        let s = unsafe { set.read_unaligned() };
        let new = match how {
            libc::SIG_BLOCK => prev | s,
            libc::SIG_UNBLOCK => prev & !s,
            libc::SIG_SETMASK => s,
            _ => return -(libc::EINVAL as i64),
        };
        // SIGKILL and SIGSTOP cannot be blocked; SIGSYS must not be.
        let never = (1u64 << (libc::SIGKILL - 1)) | (1 << (libc::SIGSTOP - 1)) | (1 << (libc::SIGSYS - 1));
        *cur = new & !never;
    }
    if !old.is_null() {
        // SAFETY: as for `set`, the program's buffer for the old mask.
        unsafe { old.write_unaligned(prev) };
    }
    0
}

extern "C" fn on_sigsys(sig: i32, info: *mut libc::siginfo_t, ctx: *mut c_void) {
    // SAFETY: the kernel passes a valid siginfo to an SA_SIGINFO handler.
    if unsafe { (*info).si_code } != SYS_USER_DISPATCH {
        return chain(sig, info, ctx);
    }
    // SAFETY: this thread's errno, restored before returning (a signal handler must not
    // change it).
    let errno = unsafe { *libc::__errno_location() };
    let uc = ctx as *mut libc::ucontext_t;
    let mut regs = regs_of(uc);
    let nr = regs.orig_ax;
    let args = [regs.di, regs.si, regs.dx, regs.r10, regs.r8, regs.r9];
    let cbs = callbacks();
    if let Some(c) = cbs {
        (c.enter)(&regs);
    }
    let ret = match nr as i64 {
        libc::SYS_rt_sigreturn => {
            // Run it at libc's `syscall` with the registers it was made with.
            // SAFETY: rewriting the saved rip/rax of this thread's signal frame.
            unsafe {
                *greg(uc, libc::REG_RIP) = GADGET.load(Relaxed) as i64;
                *greg(uc, libc::REG_RAX) = nr as i64;
                *libc::__errno_location() = errno;
            }
            return;
        }
        libc::SYS_clone if args[0] & libc::CLONE_VM as u64 != 0 || args[1] != 0 => return rerun_without_dispatch(uc, nr, errno),
        libc::SYS_clone3 | libc::SYS_vfork => return rerun_without_dispatch(uc, nr, errno),
        libc::SYS_rt_sigprocmask => sigprocmask_in(uc, args),
        libc::SYS_sigaltstack => {
            let r = raw(nr, args);
            if r == 0 && args[0] != 0 {
                // The return from this handler restores the alternate stack saved in the
                // frame: put the new one there.
                // SAFETY: a stack_t of ours for the kernel to fill; uc_stack is in the frame.
                unsafe {
                    let mut cur: libc::stack_t = std::mem::zeroed();
                    if raw(nr, [0, &mut cur as *mut libc::stack_t as u64, 0, 0, 0, 0]) == 0 {
                        (*uc).uc_stack = cur;
                    }
                }
            }
            r
        }
        libc::SYS_rt_sigaction if args[0] as i32 == libc::SIGSYS && args[1] != 0 => raw_sigsys_action(args),
        libc::SYS_fork | libc::SYS_clone => {
            let r = raw(nr, args);
            if r == 0 && ENABLED.load(SeqCst) {
                // The child: dispatch is not inherited.
                set_dispatch(true);
            }
            r
        }
        _ => raw(nr, args),
    };
    // SAFETY: the result goes into the saved rax of this thread's signal frame.
    unsafe { *greg(uc, libc::REG_RAX) = ret };
    regs.ax = ret as u64;
    if let Some(c) = cbs {
        (c.exit)(&regs);
    }
    // SAFETY: restoring this thread's errno.
    unsafe { *libc::__errno_location() = errno };
}

/// A raw `rt_sigaction(SIGSYS, act, old, 8)`: ours stays, the program's is chained (as
/// [`keep_sigsys_handler`] does for libc's `sigaction`).
fn raw_sigsys_action(a: [u64; 6]) -> i64 {
    #[repr(C)]
    struct KernelSigaction {
        handler: usize,
        flags: u64,
        restorer: usize,
        mask: u64,
    }
    if a[3] != 8 {
        return -(libc::EINVAL as i64);
    }
    let (act, old) = (a[1] as *const KernelSigaction, a[2] as *mut KernelSigaction);
    let prev = OLD_SIGSYS.load(Acquire);
    if !old.is_null() {
        // SAFETY: `prev` is a leaked copy (never freed); `old` the program's buffer for the
        // kernel's struct sigaction, which the kernel would have written.
        unsafe {
            let p: libc::sigaction = if prev.is_null() { std::mem::zeroed() } else { *prev };
            let mask = *(&p.sa_mask as *const libc::sigset_t as *const u64);
            old.write_unaligned(KernelSigaction { handler: p.sa_sigaction, flags: p.sa_flags as u32 as u64, restorer: p.sa_restorer.map_or(0, |f| f as usize), mask });
        }
    }
    // SAFETY: the program's struct for the kernel (non-null, checked by the caller); the
    // libc sigaction made from it is leaked (a handler may be reading the previous one).
    unsafe {
        let k = act.read_unaligned();
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = k.handler;
        sa.sa_flags = k.flags as i32;
        *(&mut sa.sa_mask as *mut libc::sigset_t as *mut u64) = k.mask;
        OLD_SIGSYS.store(Box::into_raw(Box::new(sa)), Release);
    }
    0
}

/// Turns dispatch off for this thread and makes its `syscall` instruction run again.
fn rerun_without_dispatch(uc: *mut libc::ucontext_t, nr: u64, errno: i32) {
    set_dispatch(false);
    // SAFETY: back to the 2-byte `syscall` instruction with its number, in the frame.
    unsafe {
        *greg(uc, libc::REG_RIP) -= 2;
        *greg(uc, libc::REG_RAX) = nr as i64;
        *libc::__errno_location() = errno;
    }
}

/// A SIGSYS that is not ours (seccomp, a program's own): the previous disposition.
fn chain(sig: i32, info: *mut libc::siginfo_t, ctx: *mut c_void) {
    let old = OLD_SIGSYS.load(Acquire);
    // SAFETY: `old` was saved by sigaction before our handler was installed, never freed.
    let old = if old.is_null() { None } else { Some(unsafe { *old }) };
    match old {
        Some(o) if o.sa_sigaction > 1 && o.sa_flags & libc::SA_SIGINFO != 0 => {
            // SAFETY: the previous handler was an SA_SIGINFO handler.
            let f: extern "C" fn(i32, *mut libc::siginfo_t, *mut c_void) = unsafe { std::mem::transmute(o.sa_sigaction) };
            f(sig, info, ctx)
        }
        Some(o) if o.sa_sigaction > 1 => {
            // SAFETY: the previous handler was a plain handler.
            let f: extern "C" fn(i32) = unsafe { std::mem::transmute(o.sa_sigaction) };
            f(sig)
        }
        _ => {
            // SAFETY: default disposition and re-raise: what would have happened without us.
            unsafe {
                libc::signal(sig, libc::SIG_DFL);
                libc::raise(sig);
            }
        }
    }
}

extern "C" fn on_switch(_: i32, _: *mut libc::siginfo_t, _: *mut c_void) {
    // SAFETY: errno saved and restored around the prctl (async-signal-safe).
    let errno = unsafe { *libc::__errno_location() };
    set_dispatch(ENABLED.load(SeqCst));
    ACKS.fetch_add(1, SeqCst);
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = errno };
}

/// Makes every other thread apply `ENABLED` (waits up to 1 s for them).
fn broadcast() {
    // SAFETY: plain system calls without memory arguments.
    let (pid, me) = unsafe { (libc::getpid(), libc::gettid()) };
    ACKS.store(0, SeqCst);
    let mut sent = 0;
    if let Ok(dir) = std::fs::read_dir("/proc/self/task") {
        for e in dir.flatten() {
            let Some(tid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else { continue };
            // SAFETY: tgkill to a thread of this process, whose handler is installed.
            if tid != me && unsafe { libc::syscall(libc::SYS_tgkill, pid, tid, switch_signal()) } == 0 {
                sent += 1;
            }
        }
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(1);
    while ACKS.load(SeqCst) < sent && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_micros(50));
    }
}

/// What `pthread_create`'s probe hands the new thread.
struct Start {
    routine: extern "C-unwind" fn(*mut c_void) -> *mut c_void,
    arg: *mut c_void,
}

/// The start routine of threads created while dispatch is on.
extern "C-unwind" fn thread_start(p: *mut c_void) -> *mut c_void {
    // SAFETY: `p` is the Box<Start> made by `on_pthread_create` for this thread alone.
    let s = unsafe { Box::from_raw(p as *mut Start) };
    let (routine, arg) = (s.routine, s.arg);
    drop(s);
    if ENABLED.load(SeqCst) {
        set_dispatch(true);
    }
    routine(arg)
}

/// Entry probe of `pthread_create(thread, attr, routine, arg)`: wrap the routine.
unsafe extern "C" fn on_pthread_create(_: *mut c_void, regs: *mut PtRegs) -> u32 {
    // SAFETY: the hook's registers at pthread_create's entry.
    let regs = unsafe { &mut *regs };
    if ENABLED.load(Relaxed) && regs.dx != 0 {
        // SAFETY: rdx holds the start routine the caller passed (a function pointer).
        let routine = unsafe { std::mem::transmute::<usize, extern "C-unwind" fn(*mut c_void) -> *mut c_void>(regs.dx as usize) };
        let b = Box::into_raw(Box::new(Start { routine, arg: regs.cx as *mut c_void }));
        regs.dx = thread_start as *const () as usize as u64;
        regs.cx = b as u64;
    }
    crate::HOOK_CONTINUE
}

thread_local! {
    /// A copy of the signal set (or `struct sigaction`) a program passed, without `SIGSYS`.
    static MASK_COPY: std::cell::UnsafeCell<[u64; 20]> = const { std::cell::UnsafeCell::new([0; 20]) };
}

/// Entry probe of `sigprocmask`/`pthread_sigmask(how, set, old)` (`data` null) and
/// `sigaction(sig, act, old)` (`data` non-null): while dispatch is on, a set blocking
/// `SIGSYS` is replaced by a copy that does not (the kernel kills a thread whose dispatched
/// system call finds `SIGSYS` blocked).
unsafe extern "C" fn on_mask(data: *mut c_void, regs: *mut PtRegs) -> u32 {
    // SAFETY: the hook's registers at the function's entry.
    let regs = unsafe { &mut *regs };
    if !ENABLED.load(Relaxed) || regs.si == 0 {
        return crate::HOOK_CONTINUE;
    }
    let action = !data.is_null();
    if !action && regs.di as i32 == libc::SIG_UNBLOCK {
        return crate::HOOK_CONTINUE;
    }
    if action && regs.di as i32 == libc::SIGSYS {
        return keep_sigsys_handler(regs);
    }
    // glibc's sigset_t is 128 bytes; its struct sigaction is the handler, the 128-byte mask,
    // the flags and the restorer (152 bytes).
    let (words, mask_at) = if action { (19, 1) } else { (16, 0) };
    let bit = 1u64 << (libc::SIGSYS - 1);
    let src = regs.si as *const u64;
    // SAFETY: the program passes this pointer to libc, which reads these bytes too.
    if unsafe { src.add(mask_at).read_unaligned() } & bit == 0 {
        return crate::HOOK_CONTINUE;
    }
    MASK_COPY.with(|c| {
        let dst = c.get() as *mut u64;
        // SAFETY: copying the program's set/struct (readable, see above) into this thread's
        // buffer of 20 words, which the call reads before this thread can reach here again.
        unsafe {
            std::ptr::copy_nonoverlapping(src as *const u8, dst as *mut u8, words * 8);
            *dst.add(mask_at) &= !bit;
        }
        regs.si = dst as u64;
    });
    crate::HOOK_CONTINUE
}

/// `sigaction(SIGSYS, act, old)` while dispatch is on: ours stays installed, the program's
/// becomes the one ours hands other `SIGSYS`s to (seccomp's, `raise`), and `old` gets the
/// program's previous one, as if the call had been made.
fn keep_sigsys_handler(regs: &mut PtRegs) -> u32 {
    let (act, old) = (regs.si as *const libc::sigaction, regs.dx as *mut libc::sigaction);
    let prev = OLD_SIGSYS.load(Acquire);
    if !old.is_null() {
        // SAFETY: `old` is the program's buffer for a struct sigaction (glibc's layout is the
        // libc crate's); `prev` a leaked copy, never freed.
        unsafe { old.write(if prev.is_null() { std::mem::zeroed() } else { *prev }) };
    }
    // SAFETY: `act` is the program's struct sigaction (non-null: checked by the caller).
    let new = Box::into_raw(Box::new(unsafe { act.read() }));
    OLD_SIGSYS.store(new, Release);
    regs.ax = 0;
    crate::HOOK_SKIP
}

fn setup() -> Result<(), String> {
    let mut s = SETUP.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(r) = s.as_ref() {
        return r.clone();
    }
    let r = (|| {
        let (lo, len, gadget) = find_libc()?;
        LO.store(lo, SeqCst);
        LEN.store(len, SeqCst);
        GADGET.store(gadget, SeqCst);
        // SAFETY: installing process-wide handlers with initialised sigaction structs; the
        // old SIGSYS disposition is saved (leaked) before ours can run.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_switch as *const () as usize;
            sa.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
            libc::sigemptyset(&mut sa.sa_mask);
            if libc::sigaction(switch_signal(), &sa, std::ptr::null_mut()) != 0 {
                return Err(format!("sigaction(SIGRTMAX-4): {}", std::io::Error::last_os_error()));
            }
            let old = Box::into_raw(Box::new(std::mem::zeroed::<libc::sigaction>()));
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_sigsys as *const () as usize;
            // NODEFER: a raw system call in a signal handler running inside ours must trap
            // again, not find SIGSYS blocked (the kernel would kill the process).
            sa.sa_flags = libc::SA_SIGINFO | libc::SA_NODEFER;
            libc::sigemptyset(&mut sa.sa_mask);
            if libc::sigaction(libc::SIGSYS, &sa, old) != 0 {
                return Err(format!("sigaction(SIGSYS): {}", std::io::Error::last_os_error()));
            }
            OLD_SIGSYS.store(old, SeqCst);
        }
        // Does the kernel have it? (Turned on for real by `enable`.)
        if set_dispatch(true) != 0 {
            let e = std::io::Error::last_os_error();
            return Err(format!("prctl(PR_SET_SYSCALL_USER_DISPATCH) failed: {e} (Linux 5.11 or later with CONFIG_GENERIC_ENTRY is needed)"));
        }
        set_dispatch(false);
        let r = crate::symbols::resolve("libc.so.6:pthread_create").map_err(|e| e.to_string())?;
        let ext = r.size.filter(|s| *s > 0).map(|len| crate::FuncExtent { start: r.func_start, len });
        crate::attach_with(r.addr, crate::ProbeKind::Entry, on_pthread_create, std::ptr::null_mut(), ext)
            .map_err(|e| format!("probing pthread_create (new threads): {e}"))?;
        // Best effort: glibc's sigprocmask only calls pthread_sigmask (and starts with that
        // call, which cannot be displaced), so its own probe may be refused.
        for (func, data) in [("pthread_sigmask", 0usize), ("sigaction", 1), ("sigprocmask", 0)] {
            if let Ok(r) = crate::symbols::resolve(&format!("libc.so.6:{func}")) {
                let ext = r.size.filter(|s| *s > 0).map(|len| crate::FuncExtent { start: r.func_start, len });
                let _ = crate::attach_with(r.addr, crate::ProbeKind::Entry, on_mask, data as *mut c_void, ext);
            }
        }
        Ok(())
    })();
    *s = Some(r.clone());
    r
}

/// Turns dispatch on in every thread of the process (see the module docs).
pub fn enable() -> Result<(), String> {
    setup()?;
    if ENABLED.swap(true, SeqCst) {
        return Ok(());
    }
    set_dispatch(true);
    broadcast();
    Ok(())
}

/// Turns dispatch off in every thread.
pub fn disable() {
    if !ENABLED.swap(false, SeqCst) {
        return;
    }
    set_dispatch(false);
    broadcast();
}

/// In the child of a fork (only async-signal-safe work): dispatch is not inherited.
pub(crate) fn after_fork_in_child() {
    if ENABLED.load(SeqCst) {
        set_dispatch(true);
    }
}
