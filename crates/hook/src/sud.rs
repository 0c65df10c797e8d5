//! Every system call of a process, seen through Linux's Syscall User Dispatch
//! (`prctl(PR_SET_SYSCALL_USER_DISPATCH)`, Linux 5.11+).
//!
//! With dispatch on, a thread's system call made from outside one allowed address range
//! does not run: the kernel sends the thread `SIGSYS` (`si_code` `SYS_USER_DISPATCH`) with
//! the registers as at the `syscall` instruction (`rax` = the number, `rip` after it). The
//! range allowed here is one page of our own ([`PAGE`]: a `syscall; ret` gadget, the signal
//! restorer of our handlers, and stubs re-running `clone`s), so every other `syscall` instruction traps: libc's wrappers and its
//! internal calls (`__close_nocancel`, the `openat` inside `fopen`, locale loading...), inline
//! `syscall` in the program or other libraries, the dynamic loader's calls (dlopen), the
//! vDSO's fallbacks. The `SIGSYS` handler gives the registers to the enter callback (as a
//! `struct pt_regs`: the number in `orig_ax`, the arguments in di, si, dx, r10, r8, r9),
//! makes the call itself through the gadget, gives the result to the exit callback and
//! returns it in `rax`. Each dispatched call costs a signal delivery and return (a few
//! microseconds, see the README), paid only while dispatch is on (while a system call
//! tracepoint is attached). Meanwhile libc's own `syscall` sites are rewritten into jumps to
//! trampolines that do the same work without the signal (`crate::rewrite`, through
//! `site_call`); dispatch stays for every site not rewritten, and for the calls those sites
//! leave to it (`needs_dispatch`).
//!
//! userbpf's own work is not dispatched to the callbacks: threads userbpf made
//! (`thread::mark_thread_ours`) have dispatch off, and a call made while probes are off on the
//! thread (inside a probe's handler, a `thread::ours` scope of the agent's work, or the
//! callbacks themselves) is made without them.
//!
//! Calls that cannot be made from inside a signal handler:
//! * `rt_sigreturn` restores the frame of the signal it returns from: the thread is resumed
//!   at the gadget's `syscall` with its registers as they were, so the call runs there;
//! * `clone` sharing the address space or with a new stack, `clone3` and `vfork` (the child
//!   would run on the handler's frames): the thread is resumed with its registers as they
//!   were at a stub of the page, `syscall; jmp` back to the instruction after the program's
//!   `syscall` (one stub per call site, call and kind, made on first use), so parent and
//!   child return from the call where the program made it; the stub gives the call's return
//!   to the exit callbacks in the parent (`clone_exit`). A new thread of the program's
//!   (`CLONE_VM` without `CLONE_VFORK`) turns dispatch on in the stub before its first
//!   instruction and reports its return (0) too; one userbpf creates (probes off on the
//!   creating thread) does neither.
//!   Other `clone`s and `fork` run in the handler and the child turns dispatch on;
//! * `rt_sigprocmask` is applied to the signal mask the handler returns to, with `SIGSYS`
//!   never blocked (a blocked `SIGSYS` from dispatch kills the process), nor `SIGTRAP` (the
//!   engine's `int3`s, met with it blocked, kill the process: glibc blocks every signal
//!   around `clone` and runs libc's sites, being rewritten, meanwhile); `sigaltstack`'s new
//!   stack is also put in the frame (the handler's return restores the frame's); an
//!   `rt_sigaction` of `SIGSYS` keeps this handler and chains the program's. Masks the
//!   program hands the kernel (a handler's `sa_mask` without `SIGSYS` nor `SIGTRAP`;
//!   `rt_sigsuspend`, `ppoll`, `pselect6`, `epoll_pwait`) are passed without `SIGSYS`.
//!
//! Dispatch is per thread: [`enable`] turns it on in every thread (the calling one directly,
//! the others with a signal), threads created later get it in the clone stub (before their
//! first instruction: nothing of userbpf's runs on them before their own code), a forked child
//! turns it on for its thread (`fork` module), and exec turns it off (the new image's agent
//! decides again). Entry probes on libc's `sigprocmask`, `pthread_sigmask` and `sigaction`
//! keep `SIGSYS` out of the sets they are given as well, and a `SIGSYS` handler the program
//! installs while dispatch is on is kept as the one other `SIGSYS`s (seccomp's, `raise`) are
//! handed to.
//!
//! `crate::release` (`userbpf detach`) turns dispatch off in every thread, forgets the set-up
//! (its probes on libc go with every other probe) and gives `SIGSYS` and the switch signal
//! back; the page stays mapped (a thread may be returning through it) and is reused by the
//! next [`enable`].
//!
//! Not seen: the dynamic loader's calls before the agent is loaded (the preloaded agent's
//! constructor runs after the loader has mapped and relocated every library), calls made
//! before a system call tracepoint is attached, the calls of a `CLONE_VFORK` child (`vfork`,
//! `posix_spawn`) until its exec, and the return of `rt_sigreturn`. Calls the vDSO answers
//! without entering the kernel are not system calls (the kernel does not see them either).

use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering::*};
use std::sync::{Mutex, OnceLock};

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
/// The page of our own code, the one range dispatch allows: `syscall; ret` at 0, the signal
/// restorer of our handlers at [`RESTORER`], then
/// [`STUB`]-byte stubs re-running a `clone` (see [`stub_for`]) from [`STUB`] on. 0 until set up.
static PAGE: AtomicUsize = AtomicUsize::new(0);
const PAGE_LEN: usize = 4096;
const STUB: usize = 256;
/// Where the page's signal restorer (`rt_sigreturn`) is.
const RESTORER: usize = 4;
/// Held while a stub is written (by the SIGSYS handler: a spin lock).
static STUB_LOCK: AtomicBool = AtomicBool::new(false);
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

/// The system calls whose enter / exit callbacks have something to run (see
/// [`want_callbacks`]): one bit per number below [`WANT_NRS`]; the last word's top bit
/// stands for every number above. All set until told otherwise.
const WANT_NRS: usize = 512;
static WANT_ENTER: [AtomicU64; WANT_NRS / 64] = [const { AtomicU64::new(u64::MAX) }; WANT_NRS / 64];
static WANT_EXIT: [AtomicU64; WANT_NRS / 64] = [const { AtomicU64::new(u64::MAX) }; WANT_NRS / 64];

/// Says for which system calls the enter and the exit callbacks have something to run:
/// `None` for every call, else the numbers (all set by default). A call through a rewritten
/// site (`crate::rewrite`) skips the side that has nothing, as the kernel runs no program for
/// a call whose tracepoints have none. To add numbers, call it before the callbacks can see
/// them; to remove some, after.
pub fn want_callbacks(enter: Option<&[u32]>, exit: Option<&[u32]>) {
    for (set, want) in [(&WANT_ENTER, enter), (&WANT_EXIT, exit)] {
        let mut bits = [0u64; WANT_NRS / 64];
        match want {
            None => bits = [u64::MAX; WANT_NRS / 64],
            Some(nrs) => {
                for &nr in nrs {
                    let i = (nr as usize).min(WANT_NRS - 1);
                    bits[i / 64] |= 1 << (i % 64);
                }
            }
        }
        for (w, b) in set.iter().zip(bits) {
            w.store(b, SeqCst);
        }
    }
    update_fast();
}

/// The calls a rewritten site makes straight from its stub (`stubs::syscall_common`), with
/// no callback and nothing else to do: neither side wants them and [`call_as_program`] /
/// [`site_call`] change nothing for them. Rebuilt by [`want_callbacks`]; none until then.
static FAST: [AtomicU64; WANT_NRS / 64] = [const { AtomicU64::new(0) }; WANT_NRS / 64];

/// Whether a call needs more than the plain call when made for the program (see
/// [`call_as_program`], [`site_call`], [`needs_dispatch`]).
fn special(nr: usize) -> bool {
    needs_dispatch(nr as u64)
        || matches!(
            nr as i64,
            libc::SYS_rt_sigreturn
                | libc::SYS_rt_sigaction
                | libc::SYS_rt_sigprocmask
                | libc::SYS_rt_sigsuspend
                | libc::SYS_ppoll
                | libc::SYS_epoll_pwait
                | libc::SYS_epoll_pwait2
                | libc::SYS_pselect6
        )
}

fn update_fast() {
    for w in 0..WANT_NRS / 64 {
        let mut fast = !(WANT_ENTER[w].load(SeqCst) | WANT_EXIT[w].load(SeqCst));
        for b in 0..64 {
            let nr = w * 64 + b;
            if special(nr) || nr == WANT_NRS - 1 {
                fast &= !(1 << b);
            }
        }
        FAST[w].store(fast, SeqCst);
    }
}

/// The address of the table of calls a rewritten site's stub makes itself (one bit per
/// number below 512; see [`FAST`]).
pub(crate) fn fast_table() -> u64 {
    FAST.as_ptr() as u64
}

/// The page's signal restorer (`rt_sigreturn`; 0 before dispatch was set up).
pub(crate) fn restorer() -> usize {
    match PAGE.load(SeqCst) {
        0 => 0,
        p => p + RESTORER,
    }
}

/// The page's `syscall; ret` (0 before dispatch was set up).
pub(crate) fn gadget() -> u64 {
    PAGE.load(SeqCst) as u64
}

fn wanted(set: &[AtomicU64; WANT_NRS / 64], nr: u64) -> bool {
    let i = (nr as usize).min(WANT_NRS - 1);
    set[i / 64].load(Relaxed) & (1 << (i % 64)) != 0
}

/// Sets the callbacks run for each dispatched system call (replaces earlier ones).
pub fn set_callbacks(enter: EnterFn, exit: ExitFn) {
    let new = Box::into_raw(Box::new(Callbacks { enter, exit }));
    // The old pair is leaked: a handler may be using it.
    CALLBACKS.swap(new, SeqCst);
}

/// Runs the programs of an `execve`/`execveat` made in a `vfork` child (before the call, and
/// after it when it fails): set by the agent, which runs them with the child's own ids (the
/// child shares the parent's memory, its per-thread caches included).
static VFORK_EXEC: OnceLock<fn(&PtRegs, bool)> = OnceLock::new();

/// Sets what runs for an exec in a vfork child (see [`VFORK_EXEC`]): `f(regs, exit)`. Once a
/// process; later calls do nothing.
pub fn set_vfork_exec_callback(f: fn(&PtRegs, bool)) {
    let _ = VFORK_EXEC.set(f);
}

/// The vfork-exec callback, when this call is an exec made in a vfork child whose programs
/// should run (a vfork made by the program, not by userbpf's own work).
fn vfork_exec(nr: u64) -> Option<fn(&PtRegs, bool)> {
    if !matches!(nr as i64, libc::SYS_execve | libc::SYS_execveat) || !crate::thread::in_vfork_child() {
        return None;
    }
    VFORK_EXEC.get().copied().filter(|_| !crate::thread::probes_off())
}

fn set_dispatch(on: bool) -> i64 {
    let page = PAGE.load(SeqCst);
    let a = if on {
        // The selector pointer is NULL: dispatch always applies outside the range.
        [PR_SET_SYSCALL_USER_DISPATCH as u64, PR_SYS_DISPATCH_ON, page as u64, PAGE_LEN as u64, 0]
    } else {
        [PR_SET_SYSCALL_USER_DISPATCH as u64, PR_SYS_DISPATCH_OFF, 0, 0, 0]
    };
    if page != 0 {
        // Through the page: with dispatch on, libc's prctl would trap.
        return raw(libc::SYS_prctl as u64, [a[0], a[1], a[2], a[3], a[4], 0]);
    }
    // SAFETY: prctl with integer arguments only.
    let r = unsafe { libc::prctl(a[0] as i32, a[1], a[2], a[3], a[4]) } as i64;
    if r < 0 { -(std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EINVAL) as i64) } else { r }
}

/// Maps the page of our own code (see [`PAGE`]).
fn make_page() -> Result<usize, String> {
    // SAFETY: a fresh anonymous private mapping; nothing else refers to it yet. It is
    // writable and executable: stubs are added while other threads may run older ones (new
    // bytes are only ever written past the stubs in use).
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            PAGE_LEN,
            libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(format!("mapping the system call page: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: the page is ours and writable; syscall (0f 05), ret (c3), then at RESTORER
    // mov eax, 15 (rt_sigreturn); syscall, then int3 filler.
    unsafe {
        std::ptr::write_bytes(p as *mut u8, 0xCC, PAGE_LEN);
        std::ptr::copy_nonoverlapping([0x0Fu8, 0x05, 0xC3].as_ptr(), p as *mut u8, 3);
        let restorer = [0xB8u8, 15, 0, 0, 0, 0x0F, 0x05];
        std::ptr::copy_nonoverlapping(restorer.as_ptr(), (p as *mut u8).add(RESTORER), restorer.len());
    }
    crate::perfmap::note(p as usize, PAGE_LEN, "userbpf_syscall_page");
    Ok(p as usize)
}

/// What a stub does after its `syscall`.
#[derive(Clone, Copy, PartialEq, Eq)]
enum StubKind {
    /// Jumps back (userbpf's own clone: nothing is reported).
    Plain = 1,
    /// The parent (or a failed call) reports the call's return to the exit callbacks
    /// ([`clone_exit`]) and jumps back; the child (a vfork child, or a process on a stack of
    /// its own, without dispatch) jumps back.
    Report = 2,
    /// As `Report`, and the child (a new thread of the program's, on a stack of its own)
    /// turns dispatch on and reports its return (0) too, so that its calls are seen from its
    /// first instruction.
    Thread = 3,
}

/// Offsets in a stub slot of its data: the call and kind (`nr << 8 | kind`), [`clone_exit`],
/// the page's address and the address the stub jumps back to.
const STUB_KIND: usize = 224;
const STUB_EXIT_FN: usize = 232;
const STUB_PAGE: usize = 240;
const STUB_BACK: usize = 248;

/// The code of a stub: position-independent (it reads the quads of its slot), assembled from
/// this source (GNU as, Intel syntax; `THREAD` defined for [`StubKind::Thread`]):
///
/// ```text
/// slot:   syscall
///         test rax, rax
///         jnz report                      ; the parent, or an error
/// .ifdef THREAD                           ; the child: dispatch on
///         push rdi; push rsi; push rdx; push r10; push r8
///         mov edi, 59; mov esi, 1         ; PR_SET_SYSCALL_USER_DISPATCH, ON
///         mov rdx, [rip+page]; mov r10d, 4096; xor r8d, r8d
///         mov eax, 157; syscall           ; prctl
///         pop r8; pop r10; pop rdx; pop rsi; pop rdi
///         xor eax, eax                    ; the child's result, reported
/// .else
///         jmp [rip+back]
/// .endif
/// report: lea rsp, [rsp-128]              ; the red zone
///         push rax; push rcx; push rdx; push rsi; push rdi
///         push r8; push r9; push r10; push r11; push rbp
///         mov rbp, rsp; and rsp, -16
///         mov rdi, rax; lea rsi, [rip+slot]
///         call [rip+exitfn]               ; clone_exit(result, slot)
///         mov rsp, rbp
///         pop rbp; pop r11; pop r10; pop r9; pop r8
///         pop rdi; pop rsi; pop rdx; pop rcx; pop rax
///         lea rsp, [rsp+128]
///         jmp [rip+back]
/// .org 224
/// kind: .quad 0; exitfn: .quad 0; page: .quad 0; back: .quad 0
/// ```
///
/// ([`StubKind::Plain`] is `syscall; jmp [rip+back]`.) The vector registers are not saved:
/// the stub returns into libc's `clone`/`clone3`/`vfork` wrapper, a function, whose caller
/// keeps none of them live across the call.
fn stub_code(kind: StubKind) -> &'static [u8] {
    const PLAIN: [u8; 8] = [0x0F, 0x05, 0xFF, 0x25, 0xF0, 0x00, 0x00, 0x00];
    const REPORT: [u8; 86] = [
        0x0F, 0x05, 0x48, 0x85, 0xC0, 0x75, 0x06, 0xFF, 0x25, 0xEB, 0x00, 0x00, 0x00, 0x48, 0x8D, 0x64, 0x24, 0x80,
        0x50, 0x51, 0x52, 0x56, 0x57, 0x41, 0x50, 0x41, 0x51, 0x41, 0x52, 0x41, 0x53, 0x55, 0x48, 0x89, 0xE5, 0x48,
        0x83, 0xE4, 0xF0, 0x48, 0x89, 0xC7, 0x48, 0x8D, 0x35, 0xCF, 0xFF, 0xFF, 0xFF, 0xFF, 0x15, 0xB1, 0x00, 0x00,
        0x00, 0x48, 0x89, 0xEC, 0x5D, 0x41, 0x5B, 0x41, 0x5A, 0x41, 0x59, 0x41, 0x58, 0x5F, 0x5E, 0x5A, 0x59, 0x58,
        0x48, 0x8D, 0xA4, 0x24, 0x80, 0x00, 0x00, 0x00, 0xFF, 0x25, 0xA2, 0x00, 0x00, 0x00,
    ];
    const THREAD: [u8; 129] = [
        0x0F, 0x05, 0x48, 0x85, 0xC0, 0x75, 0x31, 0x57, 0x56, 0x52, 0x41, 0x52, 0x41, 0x50, 0xBF, 0x3B, 0x00, 0x00,
        0x00, 0xBE, 0x01, 0x00, 0x00, 0x00, 0x48, 0x8B, 0x15, 0xD1, 0x00, 0x00, 0x00, 0x41, 0xBA, 0x00, 0x10, 0x00,
        0x00, 0x45, 0x31, 0xC0, 0xB8, 0x9D, 0x00, 0x00, 0x00, 0x0F, 0x05, 0x41, 0x58, 0x41, 0x5A, 0x5A, 0x5E, 0x5F,
        0x31, 0xC0, 0x48, 0x8D, 0x64, 0x24, 0x80, 0x50, 0x51, 0x52, 0x56, 0x57, 0x41, 0x50, 0x41, 0x51, 0x41, 0x52,
        0x41, 0x53, 0x55, 0x48, 0x89, 0xE5, 0x48, 0x83, 0xE4, 0xF0, 0x48, 0x89, 0xC7, 0x48, 0x8D, 0x35, 0xA4, 0xFF,
        0xFF, 0xFF, 0xFF, 0x15, 0x86, 0x00, 0x00, 0x00, 0x48, 0x89, 0xEC, 0x5D, 0x41, 0x5B, 0x41, 0x5A, 0x41, 0x59,
        0x41, 0x58, 0x5F, 0x5E, 0x5A, 0x59, 0x58, 0x48, 0x8D, 0xA4, 0x24, 0x80, 0x00, 0x00, 0x00, 0xFF, 0x25, 0x77,
        0x00, 0x00, 0x00,
    ];
    const _: () = assert!(PAGE_LEN == 0x1000 && STUB == 256);
    match kind {
        StubKind::Plain => &PLAIN,
        StubKind::Report => &REPORT,
        StubKind::Thread => &THREAD,
    }
}

/// Called by a stub after the `clone`, `clone3` or `vfork` it made (see [`stub_code`]): the
/// call's return (`ret`) to the exit callbacks, in the parent and in a new thread, as the
/// kernel reports it in both.
extern "C" fn clone_exit(ret: i64, slot: usize) {
    // SAFETY: this thread's errno, restored below; the slot is one of our page's, in use.
    let (errno, kind, back) = unsafe {
        (
            *libc::__errno_location(),
            ((slot + STUB_KIND) as *const u64).read_volatile(),
            ((slot + STUB_BACK) as *const u64).read_volatile(),
        )
    };
    // A vfork's parent (the child never comes here): the child is done with our TCB.
    crate::thread::vfork_end();
    let regs = PtRegs { ax: ret as u64, orig_ax: kind >> 8, ip: back, cs: 0x33, ss: 0x2b, ..Default::default() };
    let _ = std::panic::catch_unwind(|| run_callbacks(|c| (c.exit)(&regs)));
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = errno };
}

/// The stub of the page that makes system call `nr` and jumps to `back` (made on first use);
/// `None` when the page is full.
fn stub_for(back: usize, nr: u64, kind: StubKind) -> Option<usize> {
    let page = PAGE.load(Acquire);
    let tag = nr << 8 | kind as u64;
    let slots = || (1..PAGE_LEN / STUB).map(|i| page + i * STUB);
    // Slots lie inside our page; a slot's data is written before its first two bytes (read
    // here as the sign that it is in use).
    // SAFETY: `s` is a slot of our page, mapped for as long as the process lives.
    let used = |s: usize| unsafe { (s as *const u16).read_volatile() } == 0x050F;
    let find = || {
        // SAFETY: as for `used`: every address read lies inside slot `s` of our page.
        slots().find(|&s| unsafe {
            used(s)
                && ((s + STUB_KIND) as *const u64).read_volatile() == tag
                && ((s + STUB_BACK) as *const usize).read_volatile() == back
        })
    };
    if let Some(s) = find() {
        return Some(s);
    }
    while STUB_LOCK.compare_exchange(false, true, Acquire, Relaxed).is_err() {
        std::hint::spin_loop();
    }
    let r = find().or_else(|| {
        let free = slots().find(|&s| !used(s))?;
        let code = stub_code(kind);
        // SAFETY: a free slot of our writable page, written under the lock; the `syscall` is
        // written last, so a finder never takes a half-made stub. A thread runs a stub only
        // after returning from its SIGSYS handler (sigreturn goes back to user mode through
        // iret, which serialises: the new bytes are seen).
        unsafe {
            ((free + STUB_BACK) as *mut usize).write_volatile(back);
            ((free + STUB_PAGE) as *mut usize).write_volatile(page);
            ((free + STUB_EXIT_FN) as *mut usize).write_volatile(clone_exit as *const () as usize);
            ((free + STUB_KIND) as *mut u64).write_volatile(tag);
            std::ptr::copy_nonoverlapping(code[2..].as_ptr(), (free + 2) as *mut u8, code.len() - 2);
            std::sync::atomic::compiler_fence(SeqCst);
            (free as *mut u16).write_volatile(0x050F);
        }
        Some(free)
    });
    STUB_LOCK.store(false, Release);
    r
}

/// Installs `handler` (an `SA_SIGINFO` handler) for `sig` with an empty mask and the page's
/// restorer (`rt_sigreturn` made inside the page).
fn install_own(sig: i32, handler: usize, flags: i32) -> Result<(), std::io::Error> {
    const SA_RESTORER: u64 = 0x0400_0000;
    let act: [u64; 4] = [handler as u64, flags as u32 as u64 | SA_RESTORER, (PAGE.load(SeqCst) + RESTORER) as u64, 0];
    let r = raw(libc::SYS_rt_sigaction as u64, [sig as u64, act.as_ptr() as u64, 0, 8, 0, 0]);
    if r < 0 { Err(std::io::Error::from_raw_os_error(-r as i32)) } else { Ok(()) }
}

/// Makes system call `nr` through the page's `syscall`; `-errno` on failure.
fn raw(nr: u64, a: [u64; 6]) -> i64 {
    let gadget = PAGE.load(Relaxed);
    let mut ret: i64;
    // SAFETY: calls the page's `syscall; ret`, which uses only the registers declared (rax and
    // the arguments; rcx and r11 clobbered by `syscall`) and pushes one return address (the
    // asm may use the stack: no `nostack`).
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
    ret
}

/// Makes a system call through the page once dispatch was set up (so that it never traps);
/// `None` before (the caller makes it itself).
pub(crate) fn raw_call(nr: u64, a: [u64; 6]) -> Option<i64> {
    if PAGE.load(Relaxed) == 0 {
        return None;
    }
    Some(raw(nr, a))
}

/// Turns dispatch off for the calling thread (one of userbpf's own).
pub(crate) fn leave_this_thread() {
    if PAGE.load(SeqCst) != 0 {
        set_dispatch(false);
    }
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
        // SIGKILL and SIGSTOP cannot be blocked; SIGSYS and SIGTRAP must not be (an `int3`
        // of the engine's met with SIGTRAP blocked ends the process: a site being rewritten,
        // a breakpoint probe; glibc blocks every signal around `clone` in pthread_create and
        // posix_spawn, and runs libc code meanwhile).
        let never = (1u64 << (libc::SIGKILL - 1)) | (1 << (libc::SIGSTOP - 1)) | NEVER_BLOCKED;
        *cur = new & !never;
    }
    if !old.is_null() {
        // SAFETY: as for `set`, the program's buffer for the old mask.
        unsafe { old.write_unaligned(prev) };
    }
    0
}

thread_local! {
    /// Depth of dispatched calls being handled on a thread without a hook state (see
    /// `thread::enter_guard`): a call made by the callbacks themselves runs none.
    static DEPTH: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// The signals a thread's mask (or a handler's) never gets while dispatch is on: `SIGSYS`
/// (a dispatched call with it blocked kills the thread) and `SIGTRAP` (the engine's `int3`s:
/// libc's system call sites being rewritten, breakpoint probes).
const NEVER_BLOCKED: u64 = (1 << (libc::SIGSYS - 1)) | (1 << (libc::SIGTRAP - 1));

/// A copy of signal mask `p` (8 bytes, the kernel's) without `SIGSYS`, in `buf`; the
/// address to give the kernel (null stays null).
fn mask_without_sigsys(p: u64, buf: &mut u64) -> u64 {
    if p == 0 {
        return 0;
    }
    // SAFETY: the program gives this pointer to the kernel, which would read 8 bytes there;
    // an unreadable one faults in the program's own call (the kernel's EFAULT).
    *buf = unsafe { (p as *const u64).read_unaligned() } & !(1u64 << (libc::SIGSYS - 1));
    buf as *mut u64 as u64
}

/// Runs `f` on the callbacks unless probes are off on this thread (userbpf's own work, or a
/// call made by the callbacks themselves), holding them off meanwhile. Not held while the
/// call itself runs: a signal delivered at its end runs the program's handler, whose calls
/// are the program's. Returns whether `f` ran.
fn run_callbacks(f: impl FnOnce(&Callbacks)) -> bool {
    let Some(c) = callbacks() else { return false };
    let Some(guard) = crate::thread::enter_guard() else { return false };
    if guard.is_null() {
        if DEPTH.with(|d| d.replace(d.get() + 1)) != 0 {
            DEPTH.with(|d| d.set(d.get() - 1));
            return false;
        }
        f(c);
        DEPTH.with(|d| d.set(d.get() - 1));
    } else {
        f(c);
    }
    drop(guard);
    true
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
    let mut args = [regs.di, regs.si, regs.dx, regs.r10, regs.r8, regs.r9];
    // The program's call, or userbpf's own (probes off on this thread: no callbacks).
    let traced = !for_ours(nr, &args) && run_callbacks(|c| (c.enter)(&regs));
    let ret = match nr as i64 {
        libc::SYS_rt_sigreturn => {
            // Run it at the page's `syscall` with the registers it was made with.
            // SAFETY: rewriting the saved rip/rax of this thread's signal frame.
            unsafe {
                *greg(uc, libc::REG_RIP) = PAGE.load(Relaxed) as i64;
                *greg(uc, libc::REG_RAX) = nr as i64;
            }
            None
        }
        libc::SYS_clone if args[0] & libc::CLONE_VM as u64 != 0 || args[1] != 0 => {
            if new_thread(args[0]) && args[0] & libc::CLONE_SETTLS as u64 != 0 && crate::thread::probes_off() {
                crate::thread::expect_ours(args[4] as usize);
            }
            rerun_at_stub(uc, nr, new_thread(args[0]), traced, args[0] & libc::CLONE_VFORK as u64 != 0)
        }
        libc::SYS_clone3 => {
            let flags = if args[0] == 0 || args[1] < 8 {
                0
            } else {
                // SAFETY: clone3's first argument is the program's struct clone_args, whose
                // first field is the flags (read by the kernel too; a bad pointer faults in
                // the program's own call, as with the kernel's EFAULT).
                unsafe { (args[0] as *const u64).read_unaligned() }
            };
            // struct clone_args: tls at byte 56 (size at least 64 when given).
            if new_thread(flags)
                && flags & libc::CLONE_SETTLS as u64 != 0
                && args[1] >= 64
                && crate::thread::probes_off()
            {
                // SAFETY: as above, the program's struct of args[1] >= 64 bytes.
                crate::thread::expect_ours(unsafe { ((args[0] + 56) as *const u64).read_unaligned() } as usize);
            }
            rerun_at_stub(uc, nr, new_thread(flags), traced, flags & libc::CLONE_VFORK as u64 != 0)
        }
        libc::SYS_vfork => rerun_at_stub(uc, nr, false, traced, true),
        libc::SYS_rt_sigprocmask => Some(sigprocmask_in(uc, args)),
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
            Some(r)
        }
        _ => Some(call_as_program(nr, &mut args)),
    };
    if let Some(ret) = ret {
        // SAFETY: the result goes into the saved rax of this thread's signal frame.
        unsafe { *greg(uc, libc::REG_RAX) = ret };
        regs.ax = ret as u64;
        if traced {
            run_callbacks(|c| (c.exit)(&regs));
        }
    }
    // SAFETY: restoring this thread's errno.
    unsafe { *libc::__errno_location() = errno };
}

/// Whether system call `nr` with `args` is one the program makes only because userbpf's threads
/// exist, which its programs must not see (the kernel's would not: there these threads do not
/// exist): a signal to one of them with `tgkill` or `tkill`, as glibc's setxid broadcast sends
/// `SIGSETXID` to every thread when the program changes its credentials. The call is made all
/// the same.
fn for_ours(nr: u64, args: &[u64; 6]) -> bool {
    match nr as i64 {
        // getpid from the page (never trapping), only for a signal to a thread of ours.
        libc::SYS_tgkill => {
            crate::thread::is_tid_ours(args[1] as i32) && args[0] as i32 == raw(libc::SYS_getpid as u64, [0; 6]) as i32
        }
        libc::SYS_tkill => crate::thread::is_tid_ours(args[0] as i32),
        _ => false,
    }
}

/// Makes system call `nr` for the program (from the page, so that it never traps), with what
/// dispatch changes for every call: `SIGSYS` kept out of the masks and handlers given to the
/// kernel, a `SIGSYS` handler recorded instead of installed, dispatch turned on in a forked
/// child. Not for the calls that need the program's own stack or signal frame (see
/// `on_sigsys` and [`needs_dispatch`]). Returns the result (`-errno` on failure).
fn call_as_program(nr: u64, args: &mut [u64; 6]) -> i64 {
    let mut buf = 0u64;
    match nr as i64 {
        libc::SYS_rt_sigaction if args[0] as i32 == libc::SIGSYS && args[1] != 0 => raw_sigsys_action(*args),
        libc::SYS_rt_sigaction if args[1] != 0 && args[3] == 8 => {
            // A handler's mask blocking SIGSYS would make any dispatched call of that handler
            // kill the process: the kernel gets a copy without it.
            let mut k = [0u64; 4];
            // SAFETY: the program's struct for the kernel (handler, flags, restorer, mask),
            // which the kernel would read; a bad pointer faults in the program's own call.
            unsafe { std::ptr::copy_nonoverlapping(args[1] as *const u8, k.as_mut_ptr() as *mut u8, 32) };
            k[3] &= !NEVER_BLOCKED;
            args[1] = k.as_ptr() as u64;
            raw(nr, *args)
        }
        libc::SYS_rt_sigsuspend => {
            args[0] = mask_without_sigsys(args[0], &mut buf);
            raw(nr, *args)
        }
        libc::SYS_ppoll | libc::SYS_epoll_pwait | libc::SYS_epoll_pwait2 => {
            let i = if nr as i64 == libc::SYS_ppoll { 3 } else { 4 };
            args[i] = mask_without_sigsys(args[i], &mut buf);
            raw(nr, *args)
        }
        libc::SYS_pselect6 if args[5] != 0 => {
            // SAFETY: the program's `{ const sigset_t *ss; size_t len }` for the kernel.
            let mut d = unsafe { (args[5] as *const [u64; 2]).read_unaligned() };
            d[0] = mask_without_sigsys(d[0], &mut buf);
            args[5] = &d as *const [u64; 2] as u64;
            raw(nr, *args)
        }
        libc::SYS_fork | libc::SYS_clone => {
            let r = raw(nr, *args);
            if r == 0 && ENABLED.load(SeqCst) {
                // The child: dispatch is not inherited.
                set_dispatch(true);
            }
            r
        }
        _ => raw(nr, *args),
    }
}

/// The calls a rewritten site (`crate::rewrite`) leaves to dispatch, made from the site's
/// own `syscall` instruction (which traps): those that need the program's stack and
/// registers as at the instruction (`clone`, `clone3`, `vfork` and `fork`, whose child
/// returns where the parent called). (`rt_sigreturn` goes to [`sigreturn_at_site`].)
pub(crate) fn needs_dispatch(nr: u64) -> bool {
    matches!(nr as i64, libc::SYS_clone | libc::SYS_clone3 | libc::SYS_vfork | libc::SYS_fork)
}

/// `rt_sigreturn` reached through a rewritten site (libc's `__restore_rt`, the return of
/// every handler installed through libc): the enter callbacks run (its return is never seen,
/// as with dispatch), and the site's stub resumes, with every register as it was, at the
/// page's restorer, whose `rt_sigreturn` dispatch lets through: no `SIGSYS` (whose frame
/// would be pushed on the same stack, an alternate signal stack too) for each handler's
/// return. Returns where to resume.
pub(crate) fn sigreturn_at_site(regs: &mut PtRegs) -> u64 {
    let nr = regs.orig_ax;
    if ENABLED.load(Relaxed) && wanted(&WANT_ENTER, nr) {
        // SAFETY: this thread's errno, restored after (the frame restores every register,
        // not errno).
        let errno = unsafe { *libc::__errno_location() };
        regs.ax = (-(libc::ENOSYS as i64)) as u64;
        run_callbacks(|c| (c.enter)(regs));
        regs.ax = nr;
        // SAFETY: as above.
        unsafe { *libc::__errno_location() = errno };
    }
    (PAGE.load(Relaxed) + RESTORER) as u64
}

/// A system call reached through a rewritten site (`crate::rewrite`), as [`on_sigsys`] makes
/// a dispatched one but without the signal: `regs` are the registers at the site's `syscall`
/// (`orig_ax` = the number); the enter callbacks run (unless probes are off on this thread),
/// the call is made from the page, `regs.ax` gets its result and the exit callbacks run.
/// `rt_sigprocmask` is made for real, with `SIGSYS` kept out of the set (no frame to apply it
/// to). Never a call of [`needs_dispatch`].
pub(crate) fn site_call(regs: &mut PtRegs) {
    // SAFETY: this thread's errno, restored before returning (the program's call sets it
    // itself from the result).
    let errno = unsafe { *libc::__errno_location() };
    let nr = regs.orig_ax;
    let mut args = [regs.di, regs.si, regs.dx, regs.r10, regs.r8, regs.r9];
    regs.ax = (-(libc::ENOSYS as i64)) as u64;
    // Whether this call is the program's (probes are on), when either side has work.
    let (want_enter, want_exit) = (wanted(&WANT_ENTER, nr), wanted(&WANT_EXIT, nr));
    // An exec in a vfork child (whose calls are otherwise not seen: see `thread::VFORKING`):
    // its programs, run with the child's ids; the exit only when the exec failed (a
    // successful one returns in the new image, whose agent reports it).
    if ENABLED.load(Relaxed)
        && (want_enter || want_exit)
        && let Some(f) = vfork_exec(nr)
    {
        if want_enter {
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(regs, false)));
        }
        regs.ax = call_as_program(nr, &mut args) as u64;
        if want_exit {
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(regs, true)));
        }
        // SAFETY: as above.
        unsafe { *libc::__errno_location() = errno };
        return;
    }
    let traced = ENABLED.load(Relaxed)
        && (want_enter || want_exit)
        && !for_ours(nr, &args)
        && run_callbacks(|c| {
            if want_enter {
                (c.enter)(regs)
            }
        });
    let ret = match nr as i64 {
        libc::SYS_rt_sigprocmask if args[1] != 0 && args[0] as i32 != libc::SIG_UNBLOCK => {
            // SIGTRAP stays unblocked too (see `sigprocmask_in`).
            // SAFETY: the program gives this pointer to the kernel, which would read 8 bytes
            // there; an unreadable one faults in the program's own call (the kernel's EFAULT).
            let buf = unsafe { (args[1] as *const u64).read_unaligned() } & !NEVER_BLOCKED;
            args[1] = &buf as *const u64 as u64;
            raw(nr, args)
        }
        _ => call_as_program(nr, &mut args),
    };
    regs.ax = ret as u64;
    if traced && want_exit {
        run_callbacks(|c| (c.exit)(regs));
    }
    // SAFETY: as above.
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
            old.write_unaligned(KernelSigaction {
                handler: p.sa_sigaction,
                flags: p.sa_flags as u32 as u64,
                restorer: p.sa_restorer.map_or(0, |f| f as usize),
                mask,
            });
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

/// Whether a clone with `flags` makes a thread of this process on a stack of its own (not a
/// vfork child, which runs on the parent's stack until it execs or exits).
fn new_thread(flags: u64) -> bool {
    flags & libc::CLONE_VM as u64 != 0 && flags & libc::CLONE_VFORK as u64 == 0
}

/// Resumes the thread with its registers as at its `syscall` instruction, at a stub of the
/// page that makes the call and jumps back after the program's `syscall` (parent and child
/// return there, on their own stacks). `traced`: the call's entry went to the callbacks, its
/// return goes there too; `thread`: the child (a new thread of the program's) turns dispatch
/// on first. With no stub left, dispatch is turned off for this thread and its own
/// instruction runs again. Returns `None`: the frame holds no result.
/// `vfork`: the call is a `vfork` (or `CLONE_VFORK`): with its return reported (a `Report`
/// stub, whose `clone_exit` runs in the parent only), the thread is marked as vforking until
/// then (`thread::vfork_begin`), so that the child's calls are not taken for the parent's.
fn rerun_at_stub(uc: *mut libc::ucontext_t, nr: u64, thread: bool, traced: bool, vfork: bool) -> Option<i64> {
    // SAFETY: reading the saved rip of this thread's signal frame (after its `syscall`).
    let back = unsafe { *greg(uc, libc::REG_RIP) } as usize;
    let kind = match (traced, thread && ENABLED.load(SeqCst)) {
        (false, _) => StubKind::Plain,
        (true, false) => StubKind::Report,
        (true, true) => StubKind::Thread,
    };
    let at = match stub_for(back, nr, kind) {
        Some(s) => {
            if vfork && kind == StubKind::Report {
                crate::thread::vfork_begin();
            }
            s
        }
        None => {
            set_dispatch(false);
            back - 2
        }
    };
    // SAFETY: rewriting the saved rip/rax of this thread's signal frame.
    unsafe {
        *greg(uc, libc::REG_RIP) = at as i64;
        *greg(uc, libc::REG_RAX) = nr as i64;
    }
    None
}

/// A SIGSYS that is not ours (seccomp, a program's own): the previous disposition.
fn chain(sig: i32, info: *mut libc::siginfo_t, ctx: *mut c_void) {
    let old = OLD_SIGSYS.load(Acquire);
    // SAFETY: `old` was saved by sigaction before our handler was installed, never freed.
    let old = if old.is_null() { None } else { Some(unsafe { *old }) };
    match old {
        Some(o) if o.sa_sigaction > 1 && o.sa_flags & libc::SA_SIGINFO != 0 => {
            // SAFETY: the previous handler was an SA_SIGINFO handler.
            let f: extern "C" fn(i32, *mut libc::siginfo_t, *mut c_void) =
                unsafe { std::mem::transmute(o.sa_sigaction) };
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
    set_dispatch(ENABLED.load(SeqCst) && !crate::thread::is_thread_ours());
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
        // The page stays mapped after `release` (a thread may be returning through it): a
        // later setup reuses it.
        if PAGE.load(SeqCst) == 0 {
            PAGE.store(make_page()?, SeqCst);
        }
        let mut prev_switch = Box::new(
            // SAFETY: all-zero is a valid struct sigaction.
            unsafe { std::mem::zeroed::<libc::sigaction>() },
        );
        // SAFETY: a query only (no new action) into a struct of ours.
        unsafe { libc::sigaction(switch_signal(), std::ptr::null(), &mut *prev_switch) };
        *OLD_SWITCH.lock().unwrap_or_else(|e| e.into_inner()) = Some(*prev_switch);
        // Our handlers return through the page's restorer: libc's (`__restore_rt`) makes its
        // `rt_sigreturn` outside the page, which would trap again from the handler's return.
        install_own(switch_signal(), on_switch as *const () as usize, libc::SA_SIGINFO | libc::SA_RESTART)
            .map_err(|e| format!("sigaction(SIGRTMAX-4): {e}"))?;
        // SAFETY: reading the current SIGSYS disposition into a zeroed struct (leaked: a
        // handler may read it at any time).
        let old = Box::into_raw(Box::new(unsafe { std::mem::zeroed::<libc::sigaction>() }));
        // SAFETY: as above; a query only (no new action).
        if unsafe { libc::sigaction(libc::SIGSYS, std::ptr::null(), old) } != 0 {
            return Err(format!("sigaction(SIGSYS): {}", std::io::Error::last_os_error()));
        }
        OLD_SIGSYS.store(old, SeqCst);
        // NODEFER: a raw system call in a signal handler running inside ours must trap
        // again, not find SIGSYS blocked (the kernel would kill the process).
        install_own(libc::SIGSYS, on_sigsys as *const () as usize, libc::SA_SIGINFO | libc::SA_NODEFER)
            .map_err(|e| format!("sigaction(SIGSYS): {e}"))?;
        // Does the kernel have it? (Turned on for real by `enable`.)
        let r = set_dispatch(true);
        if r != 0 {
            let e = std::io::Error::from_raw_os_error(-r as i32);
            return Err(format!(
                "prctl(PR_SET_SYSCALL_USER_DISPATCH) failed: {e} (Linux 5.11 or later with CONFIG_GENERIC_ENTRY is needed)"
            ));
        }
        set_dispatch(false);
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
    if !crate::thread::is_thread_ours() {
        set_dispatch(true);
    }
    broadcast();
    // libc's own sites at a function call's cost; what is not rewritten stays with dispatch.
    let r = crate::rewrite_libc().map(|_| ());
    *REWRITE_ERR.lock().unwrap_or_else(|e| e.into_inner()) = r.err();
    Ok(())
}

/// Why libc's system call sites could not be rewritten at the last [`enable`] (they are then
/// all left to dispatch).
static REWRITE_ERR: Mutex<Option<String>> = Mutex::new(None);

/// Why the last [`enable`] could not rewrite libc's system call sites (`crate::rewrite`), if
/// it could not (every call then goes through dispatch, as before).
pub fn rewrite_error() -> Option<String> {
    REWRITE_ERR.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

/// Turns dispatch off in every thread.
pub fn disable() {
    if !ENABLED.swap(false, SeqCst) {
        return;
    }
    // Calls through a site being given back meanwhile run no callbacks (`site_call`).
    if let Err(e) = crate::unrewrite_libc() {
        *REWRITE_ERR.lock().unwrap_or_else(|e| e.into_inner()) = Some(e);
    }
    set_dispatch(false);
    broadcast();
}

/// The switch signal's disposition before [`setup`] installed ours.
static OLD_SWITCH: Mutex<Option<libc::sigaction>> = Mutex::new(None);
/// Set by [`release`] when dispatch had been set up: [`release_signals`] gives its signals back.
static RELEASING: AtomicBool = AtomicBool::new(false);

/// First step of `crate::release`: dispatch off in every thread, and the set-up forgotten
/// (the next [`enable`] installs the handlers and its probes again; the page is kept). Its
/// probes on libc go with every other probe; then [`release_signals`].
pub(crate) fn release() {
    let mut s = SETUP.lock().unwrap_or_else(|e| e.into_inner());
    if !matches!(s.as_ref(), Some(Ok(()))) {
        *s = None;
        return;
    }
    disable();
    *s = None;
    RELEASING.store(true, SeqCst);
}

/// Last step of `crate::release` (every probe gone): `SIGSYS` goes back to the program's
/// disposition (the one it set while dispatch was on, or the one found before), the switch
/// signal to the one found before.
pub(crate) fn release_signals() {
    if !RELEASING.swap(false, SeqCst) {
        return;
    }
    let prev = OLD_SIGSYS.load(Acquire);
    // SAFETY: all-zero is SIG_DFL; `prev` is a leaked copy, never freed.
    let sys = if prev.is_null() { unsafe { std::mem::zeroed() } } else { unsafe { *prev } };
    crate::patch::set_through_ignore(libc::SIGSYS, &sys);
    if let Some(old) = *OLD_SWITCH.lock().unwrap_or_else(|e| e.into_inner()) {
        crate::patch::set_through_ignore(switch_signal(), &old);
    }
}

/// In the child of a fork (only async-signal-safe work): dispatch is not inherited.
pub(crate) fn after_fork_in_child() {
    if ENABLED.load(SeqCst) && !crate::thread::is_thread_ours() {
        set_dispatch(true);
    }
}
