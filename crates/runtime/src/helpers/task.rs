//! The current task: `get_current_pid_tgid`, `get_current_uid_gid`, `get_current_comm`,
//! `get_prandom_u32`, `get_smp_processor_id`, `get_current_task`, `send_signal`,
//! `send_signal_thread`.
//!
//! # Caches
//!
//! What the kernel reads from `current` costs a system call here, so it is cached per
//! thread:
//! - pid and tgid never change for a thread, except in the child of a `fork`: a
//!   `pthread_atfork` child handler bumps a process-wide generation that every cache
//!   compares with;
//! - the thread's name (`comm`, from `prctl(PR_GET_NAME)`) and the credentials (real uid and
//!   gid) can change at any time; they are re-read when the process's clock, read without
//!   ordering (an `rdtsc`; no vDSO call, whose code and data pages a cold hit would also touch),
//!   shows the cached copy is older than [`REFRESH_NS`], so a change is seen within about that
//!   long;
//! - the random generator is seeded once per thread (and again after a fork, so parent and
//!   child do not produce the same numbers).
//!
//! The pid, comm and credential caches live in the runtime's thread block
//! ([`crate::context`], initial-exec TLS: a load and an add), not in `thread_local!`s, which
//! in the agent's shared object call `__tls_get_addr` on every access.

use std::cell::Cell;
use std::sync::Once;
use std::sync::atomic::{AtomicU64, Ordering};

use userbpf_vm::HelperRegistry;

use super::time::{clock_ns, coarse_monotonic_ns};
use super::{EINVAL, helper, neg, write_to, zero_at};
use crate::context;

/// How old a cached comm or credential may get before it is read again.
pub const REFRESH_NS: u64 = 10_000_000;

/// Bumped in the child after each fork: caches of another generation are stale.
// The hit path reads it: with its other statics on one page (see `userbpf_arena`).
#[unsafe(link_section = "userbpf_hot")]
static FORK_GEN: AtomicU64 = AtomicU64::new(1);
// The hit path reads it: with its other statics on one page (see `userbpf_arena`).
#[unsafe(link_section = "userbpf_hot")]
static INIT: Once = Once::new();

extern "C" fn after_fork_in_child() {
    FORK_GEN.fetch_add(1, Ordering::Relaxed);
}

/// Installs the fork hook (once per process). Called by the helpers themselves; calling it
/// early keeps the one-time cost off the first probe hit.
pub fn init() {
    INIT.call_once(|| {
        // SAFETY: registers a handler that only bumps an atomic; no other effect.
        unsafe { libc::pthread_atfork(None, None, Some(after_fork_in_child)) };
    });
}

#[inline(always)]
fn generation() -> u64 {
    init();
    FORK_GEN.load(Ordering::Relaxed)
}

/// The process's fork generation: different in a child of `fork` from its parent's.
#[inline]
pub(crate) fn fork_generation() -> u64 {
    generation()
}

#[derive(Clone, Copy)]
struct Cached<T: Copy> {
    generation: u64,
    value: T,
}

thread_local! {
    static RNG: Cell<Cached<u64>> = const { Cell::new(Cached { generation: 0, value: 0 }) };
}

/// `tgid << 32 | tid` of the calling thread, cached in the runtime's thread block (reached
/// without a call, unlike a `thread_local!` in the agent's shared object: the bpftrace
/// programs keyed by `tid` call this on every hit).
#[inline]
pub fn pid_tgid() -> u64 {
    let generation = generation();
    let (cached_gen, value) = context::cached_pid_tgid();
    if cached_gen == generation {
        return value;
    }
    // SAFETY: getpid and gettid have no preconditions.
    let (tgid, tid) = unsafe { (libc::getpid() as u32, libc::gettid() as u32) };
    let value = (tgid as u64) << 32 | tid as u64;
    context::set_cached_pid_tgid(generation, value);
    value
}

/// Runs `f` with [`pid_tgid`] (and the programs' own reads of the cache) giving `value`, the
/// thread's cache restored after: for a `vfork` child, which runs on its parent's thread block
/// (shared memory) while the parent is suspended until the child's exec or exit.
pub fn with_pid_tgid<T>(value: u64, f: impl FnOnce() -> T) -> T {
    let saved = context::cached_pid_tgid();
    context::set_cached_pid_tgid(generation(), value);
    let r = f();
    context::set_cached_pid_tgid(saved.0, saved.1);
    r
}

/// The calling thread's name, NUL-padded (`/proc/self/task/TID/comm` without the newline),
/// cached in the runtime's thread block (reached without a call).
#[inline]
pub fn comm() -> [u8; 16] {
    let generation = generation();
    let now = coarse_monotonic_ns();
    let (cached_gen, at, name) = context::cached_comm();
    if cached_gen == generation && now.wrapping_sub(at) < REFRESH_NS {
        return name;
    }
    read_comm(generation, now)
}

#[cold]
#[inline(never)]
fn read_comm(generation: u64, now: u64) -> [u8; 16] {
    let mut name = [0u8; 16];
    // SAFETY: PR_GET_NAME writes at most 16 bytes (NUL included) to the buffer we own.
    let r = unsafe { libc::prctl(libc::PR_GET_NAME, name.as_mut_ptr() as libc::c_ulong, 0, 0, 0) };
    if r != 0 {
        name = [0; 16];
    }
    // NUL-padded after the name, whatever the kernel left there: `get_current_comm` copies
    // the padding as it is.
    name[15] = 0;
    let len = name.iter().position(|&b| b == 0).unwrap_or(15);
    name[len..].fill(0);
    context::set_cached_comm(generation, now, name);
    name
}

/// `gid << 32 | uid` (real ids) of the calling thread, cached in the runtime's thread block.
#[inline]
pub fn uid_gid() -> u64 {
    let generation = generation();
    let now = coarse_monotonic_ns();
    let (cached_gen, at, value) = context::cached_uid_gid();
    if cached_gen == generation && now.wrapping_sub(at) < REFRESH_NS {
        return value;
    }
    read_uid_gid(generation, now)
}

#[cold]
#[inline(never)]
fn read_uid_gid(generation: u64, now: u64) -> u64 {
    // SAFETY: getuid and getgid have no preconditions.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    let value = (gid as u64) << 32 | uid as u64;
    context::set_cached_uid_gid(generation, now, value);
    value
}

/// The next number of the thread's generator (splitmix64, seeded from getrandom once per
/// thread and fork generation).
#[inline]
pub fn prandom_u64() -> u64 {
    let generation = generation();
    RNG.with(|c| {
        let mut v = c.get();
        if v.generation != generation {
            let mut seed = [0u8; 8];
            // SAFETY: getrandom writes at most 8 bytes to the buffer we own.
            let n = unsafe { libc::getrandom(seed.as_mut_ptr().cast(), 8, libc::GRND_NONBLOCK) };
            let mut s = u64::from_ne_bytes(seed);
            if n != 8 {
                s ^= clock_ns(libc::CLOCK_MONOTONIC) ^ pid_tgid().rotate_left(17) ^ (c as *const _ as u64);
            }
            v = Cached { generation, value: s };
        }
        v.value = v.value.wrapping_add(0x9e37_79b9_7f4a_7c15);
        c.set(v);
        let mut z = v.value;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    })
}

/// `u64 bpf_get_current_pid_tgid(void)`.
unsafe extern "C" fn get_current_pid_tgid(_: u64, _: u64, _: u64, _: u64, _: u64) -> u64 {
    pid_tgid()
}

/// Where the JIT reads `get_current_pid_tgid`'s per-thread cache inline (see
/// `userbpf_vm::CachedHelper`), when `f` is this module's helper (a registry may replace it):
/// the fork generation and the thread block's cached generation and value. Installs the fork
/// hook first, so that a forked child's inherited cache is stale from its first read.
pub(crate) fn pid_tgid_cache(f: userbpf_vm::HelperFn) -> Option<userbpf_vm::CachedHelper> {
    if f as usize != get_current_pid_tgid as userbpf_vm::HelperFn as usize {
        return None;
    }
    init();
    let (tls_generation, tls_value) = context::pid_tgid_tls_offsets();
    Some(userbpf_vm::CachedHelper { generation: FORK_GEN.as_ptr() as u64, tls_generation, tls_value })
}

/// `u64 bpf_get_current_uid_gid(void)`.
#[unsafe(link_section = ".text.hot.userbpf")]
unsafe extern "C" fn get_current_uid_gid(_: u64, _: u64, _: u64, _: u64, _: u64) -> u64 {
    uid_gid()
}

/// `long bpf_get_current_comm(buf, size)`: the kernel's `strscpy_pad`: at most `size - 1`
/// bytes of the name, then NULs up to `size`. 0, or `-EFAULT` if `buf` cannot be written.
/// The cached name is NUL-padded: a copy of its first `size` bytes with a NUL at `size - 1`
/// is that (one guarded copy of at most 16 bytes, then zeros past 16 for larger buffers).
#[unsafe(link_section = ".text.hot.userbpf")]
unsafe extern "C" fn get_current_comm(buf: u64, size: u64, _: u64, _: u64, _: u64) -> u64 {
    let size = size as u32 as u64;
    if size == 0 {
        return 0;
    }
    let mut name = comm();
    let first = size.min(16) as usize;
    name[first - 1] = 0;
    if !write_to(buf, &name[..first]) || (size > 16 && !zero_at(buf.wrapping_add(16), size - 16)) {
        return super::EFAULT;
    }
    0
}

/// `u32 bpf_get_prandom_u32(void)`.
unsafe extern "C" fn get_prandom_u32(_: u64, _: u64, _: u64, _: u64, _: u64) -> u64 {
    prandom_u64() >> 32
}

/// `u32 bpf_get_smp_processor_id(void)`: the CPU slot of the run (see [`crate::context`]).
unsafe extern "C" fn get_smp_processor_id(_: u64, _: u64, _: u64, _: u64, _: u64) -> u64 {
    context::current_cpu() as u64
}

/// `u64 bpf_get_current_task(void)`: the thread's stand-in `task_struct` (see
/// [`super::current_task`]).
unsafe extern "C" fn get_current_task(_: u64, _: u64, _: u64, _: u64, _: u64) -> u64 {
    super::current_task::current_task()
}

const NSIG: u32 = 64;

fn send(sig: u64, thread: bool) -> u64 {
    let sig = sig as u32;
    let pt = pid_tgid();
    let (tgid, tid) = ((pt >> 32) as i32, pt as u32 as i32);
    if tgid == 1 {
        // The kernel refuses to signal init.
        return neg(libc::EPERM);
    }
    if sig > NSIG {
        return EINVAL;
    }
    // SAFETY: kill/tgkill of our own process/thread; the signal's effect is what the program
    // asked for.
    let r = unsafe {
        if thread {
            libc::syscall(libc::SYS_tgkill, tgid as libc::c_long, tid as libc::c_long, sig as libc::c_long) as i32
        } else {
            libc::kill(tgid, sig as i32)
        }
    };
    if r == 0 { 0 } else { neg(std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EINVAL)) }
}

/// `long bpf_send_signal(u32 sig)`: the signal to the current process.
unsafe extern "C" fn send_signal(sig: u64, _: u64, _: u64, _: u64, _: u64) -> u64 {
    send(sig, false)
}

/// `long bpf_send_signal_thread(u32 sig)`: the signal to the current thread.
unsafe extern "C" fn send_signal_thread(sig: u64, _: u64, _: u64, _: u64, _: u64) -> u64 {
    send(sig, true)
}

pub(crate) fn register(reg: &mut HelperRegistry) {
    reg.register(helper(7, "get_prandom_u32", get_prandom_u32));
    reg.register(helper(8, "get_smp_processor_id", get_smp_processor_id));
    reg.register(helper(14, "get_current_pid_tgid", get_current_pid_tgid));
    reg.register(helper(15, "get_current_uid_gid", get_current_uid_gid));
    reg.register(helper(16, "get_current_comm", get_current_comm));
    reg.register(helper(35, "get_current_task", get_current_task));
    reg.register(helper(109, "send_signal", send_signal));
    reg.register(helper(117, "send_signal_thread", send_signal_thread));
}
