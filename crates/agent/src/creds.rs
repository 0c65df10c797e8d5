//! The agent's threads keep the credentials of the process they live in.
//!
//! Linux keeps credentials per thread; glibc makes `setuid`, `setgid`, `setres[ug]id`,
//! `setre[ug]id`, `sete[ug]id` and `setgroups` process-wide by replaying the call on every other
//! thread it created (its "setxid broadcast": the internal signal `SIGSETXID`, `SIGRTMIN+1`,
//! whose handler makes the same system call) and aborts the process when a thread's result
//! differs from the caller's. Capabilities and the securebits (`PR_SET_KEEPCAPS` among them)
//! stay per thread. So a program that keeps its capabilities across a change of uid on its own
//! thread only (`setpriv --reuid`, `su`, `runuser`, daemons dropping privileges and raising
//! `CAP_SETGID` again to finish) saw the replay fail with `EPERM` on the agent's thread, which
//! had lost them, and died in glibc's `abort`.
//!
//! The agent's threads therefore take part in the broadcast as a thread of the program would,
//! with the program's capabilities: [`install`] puts [`on_setxid`] in front of glibc's
//! handler (a raw `rt_sigaction`: glibc's own `sigaction` refuses the signal), and on an
//! agent thread ([`register_this_thread`]) the handler
//! 1. reads the capability sets (effective, permitted, inheritable, ambient, bounding) of a
//!    thread of the program from `/proc/self/task/TID/status` (the main thread while it lives,
//!    else the first other thread that is not the agent's) and takes the same ones, with
//!    `PR_SET_KEEPCAPS` on (it keeps its permitted set across the change of uid, as the
//!    program's thread may), so that the replayed call succeeds or fails as the program's does;
//! 2. runs glibc's handler (the replay);
//! 3. when its ids changed, waits (yielding, bounded) until the program's thread has its new
//!    ids too and takes that thread's capability sets again: a program that did not keep its
//!    capabilities leaves none to the agent's thread either.
//!
//! The agent's threads end each change with the program's uids, gids, groups and capability
//! sets. Between the program's own system call and step 3 (the time of a few `sched_yield`s)
//! an agent thread may still hold a permitted set the program's thread just lost (never an
//! effective capability the program does not have once step 3 ran); the thread runs only this
//! handler meanwhile. A program whose threads have different capabilities from each other (a
//! per-thread privilege model) is mirrored from its main thread.
//!
//! Everything here is async-signal-safe: raw system calls, stack buffers, no allocation.

use std::ffi::c_void;
use std::sync::atomic::{AtomicI32, AtomicUsize, Ordering};

/// glibc's `SIGSETXID` (`__SIGRTMIN + 1`; `SIGRTMIN` as programs see it is above glibc's two
/// internal signals).
const SIGSETXID: i32 = 33;

/// The kernel's `struct sigaction` (x86-64).
#[repr(C)]
#[derive(Clone, Copy)]
struct KSigaction {
    handler: usize,
    flags: u64,
    restorer: usize,
    mask: u64,
}

/// glibc's handler, replaced by ours (0: not installed).
static GLIBC_HANDLER: AtomicUsize = AtomicUsize::new(0);

/// The agent's threads (kernel thread ids; 0: a free slot).
static AGENT_TIDS: [AtomicI32; 8] = [const { AtomicI32::new(0) }; 8];

fn gettid() -> i32 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::syscall(libc::SYS_gettid) as i32 }
}

/// Records the calling thread as one of the agent's (call it first in every agent thread).
pub fn register_this_thread() {
    let me = gettid();
    if AGENT_TIDS.iter().any(|t| t.load(Ordering::SeqCst) == me) {
        return;
    }
    for t in &AGENT_TIDS {
        if t.compare_exchange(0, me, Ordering::SeqCst, Ordering::SeqCst).is_ok() {
            return;
        }
    }
}

/// Forgets the calling thread (an agent thread that is about to end: its id may be reused).
pub fn unregister_this_thread() {
    let me = gettid();
    for t in &AGENT_TIDS {
        let _ = t.compare_exchange(me, 0, Ordering::SeqCst, Ordering::SeqCst);
    }
}

/// Forgets the agent's threads of the parent (in a forked child, where none of them exists).
pub fn forget_threads() {
    for t in &AGENT_TIDS {
        t.store(0, Ordering::SeqCst);
    }
}

pub(crate) fn is_agent_tid(tid: i32) -> bool {
    AGENT_TIDS.iter().any(|t| t.load(Ordering::SeqCst) == tid)
}

/// Puts [`on_setxid`] in front of glibc's `SIGSETXID` handler (once per process image; the
/// handler is inherited by forked children). glibc installs its own when the process's first
/// thread is created: call it from an agent thread. False when glibc has no such handler (a libc
/// without the broadcast: nothing to do).
pub fn install() -> bool {
    if INSTALLED.load(Ordering::SeqCst) {
        return true;
    }
    let mut old = KSigaction { handler: 0, flags: 0, restorer: 0, mask: 0 };
    // SAFETY: reads the current action into a local of the kernel's layout (8-byte mask).
    let r = unsafe {
        libc::syscall(
            libc::SYS_rt_sigaction,
            SIGSETXID as libc::c_long,
            std::ptr::null::<KSigaction>(),
            &mut old as *mut KSigaction,
            8 as libc::c_long,
        )
    };
    if r != 0 || old.handler <= 1 || old.flags & libc::SA_SIGINFO as u64 == 0 {
        return false;
    }
    if old.handler == on_setxid as *const () as usize {
        INSTALLED.store(true, Ordering::SeqCst);
        return true;
    }
    // Kept after `uninstall`: a handler still running may read it.
    GLIBC_HANDLER.store(old.handler, Ordering::SeqCst);
    let new = KSigaction { handler: on_setxid as *const () as usize, ..old };
    // SAFETY: installs our handler with glibc's flags, restorer and mask; it chains glibc's.
    let r = unsafe {
        libc::syscall(
            libc::SYS_rt_sigaction,
            SIGSETXID as libc::c_long,
            &new as *const KSigaction,
            std::ptr::null_mut::<KSigaction>(),
            8 as libc::c_long,
        )
    };
    INSTALLED.store(r == 0, Ordering::SeqCst);
    r == 0
}

/// Whether [`on_setxid`] is installed.
static INSTALLED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Puts glibc's handler back in front (`userbpf detach`; the agent has no thread any more).
/// The next [`install`] puts ours in front again.
pub fn uninstall() {
    if !INSTALLED.swap(false, Ordering::SeqCst) {
        return;
    }
    let mut cur = KSigaction { handler: 0, flags: 0, restorer: 0, mask: 0 };
    // SAFETY: reads the current action into a local of the kernel's layout (8-byte mask).
    let r = unsafe {
        libc::syscall(
            libc::SYS_rt_sigaction,
            SIGSETXID as libc::c_long,
            std::ptr::null::<KSigaction>(),
            &mut cur as *mut KSigaction,
            8 as libc::c_long,
        )
    };
    if r != 0 || cur.handler != on_setxid as *const () as usize {
        return;
    }
    let back = KSigaction { handler: GLIBC_HANDLER.load(Ordering::SeqCst), ..cur };
    // SAFETY: glibc's own handler with the flags, restorer and mask it had.
    unsafe {
        libc::syscall(
            libc::SYS_rt_sigaction,
            SIGSETXID as libc::c_long,
            &back as *const KSigaction,
            std::ptr::null_mut::<KSigaction>(),
            8 as libc::c_long,
        )
    };
}

/// The `SIGSETXID` handler of every thread (see the module's documentation).
extern "C" fn on_setxid(sig: i32, info: *mut libc::siginfo_t, ctx: *mut c_void) {
    let glibc = GLIBC_HANDLER.load(Ordering::SeqCst);
    // SAFETY: glibc's SA_SIGINFO handler, saved by `install`, called as the kernel would.
    let chain = || unsafe {
        std::mem::transmute::<usize, extern "C" fn(i32, *mut libc::siginfo_t, *mut c_void)>(glibc)(sig, info, ctx)
    };
    // SAFETY: errno is this thread's; a handler gives it back as it found it.
    let saved_errno = unsafe { *libc::__errno_location() };
    if !is_agent_tid(gettid()) {
        chain();
        return;
    }
    let model = model_thread();
    if let Some(m) = model.and_then(Status::read) {
        take_caps(&m);
    }
    let before = Status::read(gettid());
    chain();
    let after = Status::read(gettid());
    if let (Some(model), Some(b), Some(a)) = (model, before, after)
        && !a.same_ids(&b)
    {
        // Until the program's own call is made (glibc makes it once every thread replied).
        let mut m = Status::read(model);
        for _ in 0..200_000 {
            match &m {
                Some(s) if s.same_ids(&a) => break,
                None => break,
                _ => {}
            }
            // SAFETY: sched_yield has no preconditions.
            unsafe { libc::sched_yield() };
            m = Status::read(model);
        }
        if let Some(m) = m.filter(|m| m.same_ids(&a)) {
            take_caps(&m);
        }
    }
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = saved_errno };
}

/// The program's thread whose capabilities the agent's threads take: the main thread while it
/// lives, else the first thread that is not the agent's.
fn model_thread() -> Option<i32> {
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() };
    if !is_agent_tid(pid) && Status::read(pid).is_some() {
        return Some(pid);
    }
    let mut found = None;
    for_each_task(|tid| {
        if found.is_none() && !is_agent_tid(tid) {
            found = Some(tid);
        }
    });
    found
}

/// Calls `f` with every thread id in /proc/self/task (getdents64 into a stack buffer).
fn for_each_task(mut f: impl FnMut(i32)) {
    // SAFETY: a NUL-terminated path; the descriptor is closed below.
    let fd = unsafe { libc::open(c"/proc/self/task".as_ptr(), libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC) };
    if fd < 0 {
        return;
    }
    let mut buf = [0u8; 2048];
    loop {
        // SAFETY: getdents64 into a buffer we own, of its length.
        let n = unsafe { libc::syscall(libc::SYS_getdents64, fd, buf.as_mut_ptr(), buf.len()) };
        if n <= 0 {
            break;
        }
        let mut off = 0usize;
        while off + 19 < n as usize {
            let reclen = u16::from_ne_bytes([buf[off + 16], buf[off + 17]]) as usize;
            if reclen == 0 {
                break;
            }
            let name = &buf[off + 19..(off + reclen).min(n as usize)];
            let len = name.iter().position(|&b| b == 0).unwrap_or(name.len());
            if let Some(t) = parse_dec(&name[..len]) {
                f(t as i32);
            }
            off += reclen;
        }
    }
    // SAFETY: our descriptor.
    unsafe { libc::close(fd) };
}

fn parse_dec(s: &[u8]) -> Option<u64> {
    if s.is_empty() {
        return None;
    }
    let mut v = 0u64;
    for &b in s {
        if !b.is_ascii_digit() {
            return None;
        }
        v = v.checked_mul(10)?.checked_add((b - b'0') as u64)?;
    }
    Some(v)
}

fn parse_hex(s: &[u8]) -> Option<u64> {
    if s.is_empty() {
        return None;
    }
    let mut v = 0u64;
    for &b in s {
        let d = (b as char).to_digit(16)? as u64;
        v = v.checked_mul(16)?.checked_add(d)?;
    }
    Some(v)
}

/// What a thread's `/proc/self/task/TID/status` says of its credentials.
struct Status {
    /// The `Uid:`, `Gid:` and `Groups:` lines (hashed: compared, never shown).
    ids: u64,
    inh: u64,
    prm: u64,
    eff: u64,
    bnd: u64,
    amb: u64,
}

impl Status {
    fn read(tid: i32) -> Option<Status> {
        let mut path = [0u8; 40];
        let prefix = b"/proc/self/task/";
        path[..prefix.len()].copy_from_slice(prefix);
        let mut n = prefix.len();
        let mut digits = [0u8; 12];
        let mut d = 0;
        let mut t = tid as u32;
        loop {
            digits[d] = b'0' + (t % 10) as u8;
            d += 1;
            t /= 10;
            if t == 0 {
                break;
            }
        }
        while d > 0 {
            d -= 1;
            path[n] = digits[d];
            n += 1;
        }
        path[n..n + 7].copy_from_slice(b"/status");
        // path[n + 7] is the terminating NUL (the buffer is zeroed).
        // SAFETY: a NUL-terminated path in a local buffer; the descriptor is closed below.
        let fd = unsafe { libc::open(path.as_ptr().cast(), libc::O_RDONLY | libc::O_CLOEXEC) };
        if fd < 0 {
            return None;
        }
        let mut buf = [0u8; 4096];
        let mut len = 0usize;
        while len < buf.len() {
            // SAFETY: reading into the rest of a buffer we own.
            let r = unsafe { libc::read(fd, buf[len..].as_mut_ptr().cast(), buf.len() - len) };
            if r <= 0 {
                break;
            }
            len += r as usize;
        }
        // SAFETY: our descriptor.
        unsafe { libc::close(fd) };
        let text = &buf[..len];
        let mut s = Status { ids: 0xcbf2_9ce4_8422_2325, inh: 0, prm: 0, eff: 0, bnd: 0, amb: 0 };
        let mut seen = 0;
        for line in text.split(|&b| b == b'\n') {
            let Some(colon) = line.iter().position(|&b| b == b':') else { continue };
            let (key, val) = (&line[..colon], trim(&line[colon + 1..]));
            match key {
                b"Uid" | b"Gid" | b"Groups" => {
                    for &b in line {
                        s.ids = (s.ids ^ b as u64).wrapping_mul(0x100_0000_01b3);
                    }
                    seen |= 1;
                }
                b"CapInh" => s.inh = parse_hex(val)?,
                b"CapPrm" => s.prm = parse_hex(val)?,
                b"CapEff" => {
                    s.eff = parse_hex(val)?;
                    seen |= 2;
                }
                b"CapBnd" => s.bnd = parse_hex(val)?,
                b"CapAmb" => s.amb = parse_hex(val)?,
                _ => {}
            }
        }
        (seen == 3).then_some(s)
    }

    fn same_ids(&self, o: &Status) -> bool {
        self.ids == o.ids
    }
}

fn trim(s: &[u8]) -> &[u8] {
    let a = s.iter().position(|b| !b.is_ascii_whitespace()).unwrap_or(s.len());
    let b = s.iter().rposition(|b| !b.is_ascii_whitespace()).map_or(a, |i| i + 1);
    &s[a..b]
}

/// Gives the calling thread the capability sets of `m` (as far as it may: it only ever drops
/// what it has, or raises an effective capability it holds in its permitted set), with
/// `PR_SET_KEEPCAPS` on.
fn take_caps(m: &Status) {
    let Some(me) = Status::read(gettid()) else { return };
    // SAFETY: prctl calls with integer arguments on the calling thread.
    unsafe {
        libc::prctl(libc::PR_SET_KEEPCAPS, 1, 0, 0, 0);
        // The bounding set first, while CAP_SETPCAP may still be effective.
        let drop = me.bnd & !m.bnd;
        for cap in 0..64 {
            if drop & (1 << cap) != 0 {
                libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0);
            }
        }
    }
    if (me.eff, me.prm, me.inh) != (m.eff, m.prm, m.inh) {
        #[repr(C)]
        struct Header {
            version: u32,
            pid: i32,
        }
        #[repr(C)]
        #[derive(Clone, Copy)]
        struct Data {
            eff: u32,
            prm: u32,
            inh: u32,
        }
        let h = Header { version: 0x2008_0522, pid: 0 };
        let lo = |v: u64| v as u32;
        let hi = |v: u64| (v >> 32) as u32;
        let d = [
            Data { eff: lo(m.eff), prm: lo(m.prm), inh: lo(m.inh) },
            Data { eff: hi(m.eff), prm: hi(m.prm), inh: hi(m.inh) },
        ];
        // SAFETY: capset (version 3: two data records) on the calling thread, from locals.
        unsafe { libc::syscall(libc::SYS_capset, &h as *const Header, d.as_ptr()) };
    }
    let amb = Status::read(gettid()).map_or(0, |s| s.amb);
    for cap in 0..64u64 {
        let (want, have) = (m.amb & (1 << cap) != 0, amb & (1 << cap) != 0);
        if want != have {
            let op = if want { libc::PR_CAP_AMBIENT_RAISE } else { libc::PR_CAP_AMBIENT_LOWER };
            // SAFETY: prctl with integer arguments on the calling thread.
            unsafe { libc::prctl(libc::PR_CAP_AMBIENT, op, cap, 0, 0) };
        }
    }
}
