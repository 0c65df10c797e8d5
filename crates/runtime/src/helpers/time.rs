//! Clocks: `ktime_get_ns`, `ktime_get_boot_ns`, `ktime_get_coarse_ns`, `jiffies64`.
//!
//! `clock_gettime` of these clocks is answered by the vDSO: no system call.

use std::sync::atomic::{AtomicU64, Ordering};

use userbpf_vm::HelperRegistry;

use super::helper;

/// Nanoseconds of `clock` (0 if the clock cannot be read, which does not happen for the
/// clocks used here).
#[inline]
pub fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes the timespec we own; no other effect.
    let r = unsafe { libc::clock_gettime(clock, &mut ts) };
    if r != 0 {
        return 0;
    }
    (ts.tv_sec as u64).wrapping_mul(1_000_000_000).wrapping_add(ts.tv_nsec as u64)
}

/// `u64 bpf_ktime_get_ns(void)`: CLOCK_MONOTONIC.
unsafe extern "C" fn ktime_get_ns(_: u64, _: u64, _: u64, _: u64, _: u64) -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}

/// `u64 bpf_ktime_get_boot_ns(void)`: CLOCK_BOOTTIME (counts suspend).
unsafe extern "C" fn ktime_get_boot_ns(_: u64, _: u64, _: u64, _: u64, _: u64) -> u64 {
    clock_ns(libc::CLOCK_BOOTTIME)
}

/// `u64 bpf_ktime_get_coarse_ns(void)`: CLOCK_MONOTONIC_COARSE (tick resolution).
unsafe extern "C" fn ktime_get_coarse_ns(_: u64, _: u64, _: u64, _: u64, _: u64) -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC_COARSE)
}

/// Nanoseconds per kernel tick (1/HZ), from the resolution of the coarse clock, which is
/// one tick. 0 until first read.
static TICK_NS: AtomicU64 = AtomicU64::new(0);

fn tick_ns() -> u64 {
    let t = TICK_NS.load(Ordering::Relaxed);
    if t != 0 {
        return t;
    }
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_getres writes the timespec we own.
    let r = unsafe { libc::clock_getres(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
    let ns = (ts.tv_sec as u64).wrapping_mul(1_000_000_000).wrapping_add(ts.tv_nsec as u64);
    // Resolutions of 1 to 10 ms are HZ 1000..100; anything else: assume HZ 250.
    let t = if r == 0 && (1_000_000..=10_000_000).contains(&ns) { ns } else { 4_000_000 };
    TICK_NS.store(t, Ordering::Relaxed);
    t
}

/// `u64 bpf_jiffies64(void)`: the kernel's jiffies, reconstructed as `INITIAL_JIFFIES` plus
/// the ticks of CLOCK_MONOTONIC_COARSE since boot (HZ taken from that clock's resolution).
unsafe extern "C" fn jiffies64(_: u64, _: u64, _: u64, _: u64, _: u64) -> u64 {
    let tick = tick_ns();
    let hz = 1_000_000_000 / tick;
    // INITIAL_JIFFIES = (unsigned long)(unsigned int)(-300 * HZ).
    let initial = (-(300 * hz as i64)) as u32 as u64;
    initial.wrapping_add(clock_ns(libc::CLOCK_MONOTONIC_COARSE) / tick)
}

pub(crate) fn register(reg: &mut HelperRegistry) {
    reg.register(helper(5, "ktime_get_ns", ktime_get_ns));
    reg.register(helper(118, "jiffies64", jiffies64));
    reg.register(helper(125, "ktime_get_boot_ns", ktime_get_boot_ns));
    reg.register(helper(160, "ktime_get_coarse_ns", ktime_get_coarse_ns));
}
