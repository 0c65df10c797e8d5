//! Clocks: `ktime_get_ns`, `ktime_get_boot_ns`, `ktime_get_coarse_ns`, `jiffies64`.
//!
//! `clock_gettime` of these clocks is answered by the vDSO: no system call. It still costs
//! ~24 ns a call on this project's EPYC VM (its sequence counter, an ordered `rdtsc`, the
//! clock's arithmetic and the `timespec`), and `bpf_ktime_get_ns` is called on most probe
//! hits (sslsniff: once per entry and return probe). So `ktime_get_ns` reads CLOCK_MONOTONIC
//! from the TSC itself when the kernel does (see [`TscClock`]), and from `clock_gettime`
//! otherwise. `ktime_get_boot_ns` stays on `clock_gettime`: CLOCK_BOOTTIME is CLOCK_MONOTONIC
//! plus the time spent suspended, an offset that changes at each resume; the coarse clock
//! costs ~5 ns through the vDSO already.
//!
//! # The TSC clock
//!
//! Used only when the kernel's clocksource is `tsc`
//! (`/sys/devices/system/clocksource/clocksource0/current_clocksource`) and the CPU's TSC is
//! invariant (CPUID `0x8000_0007` EDX bit 8: constant rate, running in every C-state), i.e.
//! when the kernel's own CLOCK_MONOTONIC is the TSC scaled; `USERBPF_TSC=0` turns it off.
//!
//! The clock is a piecewise-linear function `F` of the TSC, `F(t) = base + (t - start) *
//! mult / 2^32`, published as records of two segments (`[a_start, start)` with the previous
//! parameters, `[start, expire)` with the current ones) that readers pick by a generation
//! counter (two record slots, written alternately, a torn read detected by re-reading the
//! counter: no reader ever waits for a writer). The fast path is one compare: the TSC lies in
//! `[start, start + span)`; then a multiply and a shift. An ordered read of the TSC (`rdtscp`,
//! or `lfence; rdtsc` without it: what the kernel's `rdtsc_ordered` and the vDSO do) keeps the
//! clock causal across threads: a thread that saw another's timestamp reads a later one.
//!
//! - **Calibration.** Until a first window of [`TscClock`]'s `window_ns` (50 ms) has passed
//!   since the first reading, `clock_gettime` answers and the rate is measured; the first
//!   record is then anchored on a `clock_gettime` reading bracketed by two TSC reads (the
//!   narrowest of three), at the earlier TSC read: the TSC clock starts at or above every
//!   value `clock_gettime` gave before.
//! - **Recalibration.** Once the TSC passes `start + span` (`span` = 1 s), the first reader
//!   there takes the writer flag (a compare-and-swap; the others go on with the current
//!   record), reads `clock_gettime` again, measures the rate since the last calibration and
//!   publishes a record whose new segment starts where the current one ends (`expire`, 1 ms
//!   past `start + span`) at the current segment's value there: the clock is continuous. Its
//!   rate is the measured one corrected so that the error seen now is gone one period later
//!   (slewing, at most 1% off the measured rate); only an error above 10 ms with the clock
//!   behind is closed by a jump forward, and one above 10 ms with the clock ahead (the TSC
//!   ran on through a suspend to idle while CLOCK_MONOTONIC stood still) by slowing down to
//!   as little as half speed.
//! - **Expiry.** A record is valid only below its `expire`: a reader beyond it (the first hit
//!   after an idle second, or a writer that was preempted) becomes the writer, or, if one is
//!   at work, waits for its record up to 20 µs and then answers the record's value at
//!   `expire`, where the next record starts (time stands still for that reader rather than
//!   running back). The writer anchors a late record on `clock_gettime` (never below the
//!   old record's end), so the clock never goes backwards, whatever the timing of writers
//!   and readers.
//! - **Forks.** A child of `fork` clears the writer flag (its holder may be a thread that
//!   does not exist in the child).
//!
//! Why the ordered read: without it, a thread that loaded another thread's timestamp could read
//! an earlier one (the `rdtsc` executed before the load completed): the test of this module
//! with three threads passing timestamps saw 66,215 such inversions in 44.7 million readings,
//! up to 1.3 µs, without it (2026-11-26), none with it. A program computing `now - start`
//! across threads (a request started on one, completed on another) must not see a negative
//! time, and the kernel's `bpf_ktime_get_ns` reads the TSC ordered too.
//!
//! Cost (`helper-bench`, this project's 2-core EPYC VM, 2026-11-26): ~22.7 ns a call against
//! 25.4 ns for `clock_gettime` and 19.9 ns for a bare `lfence; rdtsc`: the ordered read is
//! most of it.

use std::sync::Once;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU8, AtomicU64, Ordering, fence};

use userbpf_vm::HelperRegistry;

use super::helper;

/// Nanoseconds of `clock` (0 if the clock cannot be read, which does not happen for the
/// clocks used here). Through the vDSO's own `clock_gettime` once [`init`] found it: not
/// libc's, which a probe may be on (the kernel's helpers fire no uprobe either).
#[inline]
pub fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    let r = match VDSO_CLOCK_GETTIME.get() {
        // SAFETY: the vDSO's `__vdso_clock_gettime` (see `init`) writes the timespec we own.
        Some(Some(f)) => unsafe { f(clock, &mut ts) },
        // SAFETY: clock_gettime writes the timespec we own; no other effect.
        _ => unsafe { libc::clock_gettime(clock, &mut ts) },
    };
    if r != 0 {
        return 0;
    }
    (ts.tv_sec as u64).wrapping_mul(1_000_000_000).wrapping_add(ts.tv_nsec as u64)
}

/// CLOCK_MONOTONIC_COARSE: the time of the last tick, read by the vDSO from its data page
/// (about 5 ns, no TSC read, which costs 17 ns on a virtual machine's CPU). The helpers'
/// caches check their age with it.
#[inline]
pub fn coarse_monotonic_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC_COARSE)
}

type ClockGettime = unsafe extern "C" fn(libc::clockid_t, *mut libc::timespec) -> libc::c_int;

/// The vDSO's `__vdso_clock_gettime` once [`init`] looked for it (None: libc's is used).
// The hit path reads it: with its other statics on one page (see `userbpf_arena`).
#[unsafe(link_section = "userbpf_hot")]
static VDSO_CLOCK_GETTIME: std::sync::OnceLock<Option<ClockGettime>> = std::sync::OnceLock::new();

/// The address of the vDSO's dynamic symbol `name`, from the image the kernel maps (its ELF
/// header at `AT_SYSINFO_EHDR`, its section headers at the end of the image).
fn vdso_symbol(name: &str) -> Option<usize> {
    use object::{Object, ObjectSegment, ObjectSymbol};
    // SAFETY: getauxval reads the auxiliary vector; no other effect.
    let base = unsafe { libc::getauxval(libc::AT_SYSINFO_EHDR) } as usize;
    if base == 0 {
        return None;
    }
    // SAFETY: the kernel maps the whole vDSO image at `base` (at least its 64-byte ELF header,
    // read here) for the life of the process, read-only.
    let hdr = unsafe { std::slice::from_raw_parts(base as *const u8, 64) };
    if hdr[..4] != *b"\x7fELF" || hdr[4] != 2 {
        return None;
    }
    let u16_at = |o: usize| u16::from_ne_bytes([hdr[o], hdr[o + 1]]) as usize;
    let shoff = u64::from_ne_bytes(hdr[0x28..0x30].try_into().ok()?) as usize;
    let len = shoff.checked_add(u16_at(0x3a).checked_mul(u16_at(0x3c))?)?;
    if len > 1 << 20 {
        return None;
    }
    // SAFETY: the image runs to the end of its section headers (the vDSO is a whole ELF file,
    // mapped as one); 1 MiB bounds a damaged header.
    let data = unsafe { std::slice::from_raw_parts(base as *const u8, len) };
    let file = object::read::elf::ElfFile64::<object::Endianness>::parse(data).ok()?;
    let low = file.segments().map(|s| s.address()).min()? as usize;
    let sym = file.dynamic_symbols().find(|s| s.name() == Ok(name) && s.is_definition())?;
    (sym.address() as usize).checked_sub(low)?.checked_add(base)
}

/// CLOCK_MONOTONIC in nanoseconds, what `bpf_ktime_get_ns` returns: from the TSC when the
/// kernel's clock is the TSC (see the module's documentation), else `clock_gettime`.
#[inline]
pub fn monotonic_ns() -> u64 {
    CLOCK.now()
}

/// Checks once whether the TSC clock can be used and takes its first calibration reading.
/// Called when the helper registry is built (the check reads a sysfs file); the clock calls
/// it itself otherwise.
pub fn init() {
    VDSO_CLOCK_GETTIME.get_or_init(|| {
        // SAFETY: the address is the vDSO's definition of `__vdso_clock_gettime`, a C function
        // of this signature (the kernel's vDSO ABI), mapped for the process's life.
        vdso_symbol("__vdso_clock_gettime").map(|a| unsafe { std::mem::transmute::<usize, ClockGettime>(a) })
    });
    CLOCK.init_global();
}

/// Whether the TSC clock is in use (false before its first calibration window has passed,
/// and where it cannot be used).
pub fn tsc_in_use() -> bool {
    CLOCK.mode.load(Ordering::Relaxed) == MODE_TSC
}

/// The process's clock: 1 s periods, a 50 ms first calibration window.
// The hit path reads it: with its other statics on one page (see `userbpf_arena`).
#[unsafe(link_section = "userbpf_hot")]
static CLOCK: TscClock = TscClock::new(1_000_000_000, 50_000_000);
static CLOCK_INIT: Once = Once::new();

/// Whether the CPU has `rdtscp` (CPUID `0x8000_0001` EDX bit 27), set once by the clock's
/// initialisation: [`rdtsc_ordered`] then uses it.
// The hit path reads it: with its other statics on one page (see `userbpf_arena`).
#[unsafe(link_section = "userbpf_hot")]
static RDTSCP: AtomicBool = AtomicBool::new(false);

/// The time-stamp counter, read after every earlier load completed (the kernel's
/// `rdtsc_ordered`): `rdtscp` where the CPU has it, else `lfence; rdtsc`, as the kernel
/// chooses. `rdtscp` waits for the earlier instructions and loads as `lfence` does, but lets
/// the later ones start: on this project's Intel VM (2026-11-27) a bare `rdtsc` takes 22 ns,
/// `rdtscp` 32–35 and `lfence; rdtsc` 36–46, and the fence also holds back every later
/// instruction while the hit's earlier cache misses complete.
#[inline(always)]
fn rdtsc_ordered() -> u64 {
    let lo: u32;
    let hi: u32;
    if RDTSCP.load(Ordering::Relaxed) {
        // SAFETY: reads the time-stamp counter and TSC_AUX (the CPU has rdtscp: checked at
        // init; allowed in user mode: checked at init that the process did not ask for it to
        // fault, PR_SET_TSC). No memory is touched; the asm is not marked `nomem` so the
        // compiler keeps it after the loads that precede it.
        unsafe {
            std::arch::asm!("rdtscp", out("eax") lo, out("edx") hi, out("ecx") _, options(nostack, preserves_flags))
        };
    } else {
        // SAFETY: as above, without TSC_AUX.
        unsafe { std::arch::asm!("lfence", "rdtsc", out("eax") lo, out("edx") hi, options(nostack, preserves_flags)) };
    }
    (hi as u64) << 32 | lo as u64
}

/// CPUID `0x8000_0001` EDX bit 27: the CPU has `rdtscp`.
fn have_rdtscp() -> bool {
    extended_edx(0x8000_0001) & (1 << 27) != 0
}

/// `d * mult / 2^32`.
#[inline(always)]
fn scale(d: u64, mult: u64) -> u64 {
    ((d as u128 * mult as u128) >> 32) as u64
}

/// Ticks in `ns` nanoseconds at `mult` (nanoseconds per tick, times 2^32).
fn ticks(ns: u64, mult: u64) -> u64 {
    (((ns as u128) << 32) / mult.max(1) as u128).min(u64::MAX as u128 / 4) as u64
}

const MODE_UNKNOWN: u8 = 0;
/// The first calibration window: `clock_gettime` answers.
const MODE_CALIBRATING: u8 = 1;
const MODE_TSC: u8 = 2;
/// No TSC clock here: `clock_gettime` answers.
const MODE_OFF: u8 = 3;

/// How far past a segment's recalibration point its record stays valid.
const MARGIN_NS: u64 = 1_000_000;
/// How long a reader past a record's expiry waits for the writer's new record.
const WAIT_NS: u64 = 20_000;
/// The most a new segment's rate differs from the measured one (1/100).
const SLEW_DIV: u64 = 100;
/// An error above this, with the clock behind, is closed by a jump forward.
const JUMP_NS: i64 = 10_000_000;
/// Nanoseconds per tick accepted as a TSC rate, times 2^32: 20 GHz .. 50 MHz.
const MULT_MIN: u64 = (1u64 << 32) / 20;
const MULT_MAX: u64 = 20 << 32;

/// One published record: the segment `[start, expire)` (fast below `start + span`) and the
/// one before it, `[a_start, start)`.
#[repr(C, align(64))]
struct Record {
    start: AtomicU64,
    span: AtomicU64,
    base: AtomicU64,
    mult: AtomicU64,
    a_start: AtomicU64,
    a_base: AtomicU64,
    a_mult: AtomicU64,
    expire: AtomicU64,
}

#[derive(Clone, Copy, Debug, Default)]
struct Params {
    start: u64,
    span: u64,
    base: u64,
    mult: u64,
    a_start: u64,
    a_base: u64,
    a_mult: u64,
    expire: u64,
}

impl Params {
    /// The clock at `t` by this record (clamped to the record's range).
    fn at(&self, t: u64) -> u64 {
        if t >= self.start {
            self.base.wrapping_add(scale(t.min(self.expire) - self.start, self.mult))
        } else if t >= self.a_start {
            self.a_base.wrapping_add(scale(t - self.a_start, self.a_mult))
        } else {
            self.a_base
        }
    }
}

impl Record {
    const fn new() -> Record {
        Record {
            start: AtomicU64::new(0),
            span: AtomicU64::new(0),
            base: AtomicU64::new(0),
            mult: AtomicU64::new(0),
            a_start: AtomicU64::new(0),
            a_base: AtomicU64::new(0),
            a_mult: AtomicU64::new(0),
            expire: AtomicU64::new(0),
        }
    }

    fn load(&self) -> Params {
        Params {
            start: self.start.load(Ordering::Relaxed),
            span: self.span.load(Ordering::Relaxed),
            base: self.base.load(Ordering::Relaxed),
            mult: self.mult.load(Ordering::Relaxed),
            a_start: self.a_start.load(Ordering::Relaxed),
            a_base: self.a_base.load(Ordering::Relaxed),
            a_mult: self.a_mult.load(Ordering::Relaxed),
            expire: self.expire.load(Ordering::Relaxed),
        }
    }

    fn store(&self, p: &Params) {
        self.start.store(p.start, Ordering::Relaxed);
        self.span.store(p.span, Ordering::Relaxed);
        self.base.store(p.base, Ordering::Relaxed);
        self.mult.store(p.mult, Ordering::Relaxed);
        self.a_start.store(p.a_start, Ordering::Relaxed);
        self.a_base.store(p.a_base, Ordering::Relaxed);
        self.a_mult.store(p.a_mult, Ordering::Relaxed);
        self.expire.store(p.expire, Ordering::Relaxed);
    }
}

/// CLOCK_MONOTONIC from the TSC (see the module's documentation). One per process
/// ([`monotonic_ns`]); tests make their own with short periods.
pub struct TscClock {
    /// The published record's generation: record `gen & 1`; 0 = none yet.
    generation: AtomicU64,
    records: [Record; 2],
    mode: AtomicU8,
    /// Taken by the one thread calibrating.
    writer: AtomicBool,
    /// The last calibration reading (TSC, CLOCK_MONOTONIC), written by the writer only.
    cal_tsc: AtomicU64,
    cal_real: AtomicU64,
    /// Nanoseconds between recalibrations, and of the first calibration window.
    period_ns: u64,
    window_ns: u64,
    /// Parts per million added to the next segment's rate (tests: a clock that drifts).
    perturb_ppm: AtomicI64,
}

impl TscClock {
    pub const fn new(period_ns: u64, window_ns: u64) -> TscClock {
        TscClock {
            generation: AtomicU64::new(0),
            records: [Record::new(), Record::new()],
            mode: AtomicU8::new(MODE_UNKNOWN),
            writer: AtomicBool::new(false),
            cal_tsc: AtomicU64::new(0),
            cal_real: AtomicU64::new(0),
            period_ns,
            window_ns,
            perturb_ppm: AtomicI64::new(0),
        }
    }

    /// CLOCK_MONOTONIC in nanoseconds. No system call, no allocation, no lock: the fast path
    /// is a generation load, four loads of its record, an ordered TSC read, one compare, a
    /// multiply and a second generation load.
    #[inline]
    pub fn now(&self) -> u64 {
        // No record (calibrating, or no TSC clock here: no TSC read), or one that does not
        // cover the reading: the slow path.
        self.record_time(rdtsc_ordered).unwrap_or_else(|| self.slow())
    }

    /// The published record's time for the TSC `read` gives, if there is a record and it
    /// covers that reading (the seqlock's check: the generation unchanged after the read).
    #[inline(always)]
    fn record_time(&self, read: fn() -> u64) -> Option<u64> {
        let generation = self.generation.load(Ordering::Acquire);
        if generation == 0 {
            return None;
        }
        let r = &self.records[(generation & 1) as usize];
        let start = r.start.load(Ordering::Relaxed);
        let span = r.span.load(Ordering::Relaxed);
        let base = r.base.load(Ordering::Relaxed);
        let mult = r.mult.load(Ordering::Relaxed);
        let d = read().wrapping_sub(start);
        fence(Ordering::Acquire);
        (d < span && self.generation.load(Ordering::Relaxed) == generation).then(|| base.wrapping_add(scale(d, mult)))
    }

    /// Starts calibrating (`tsc` true) or settles on `clock_gettime`.
    fn start(&self, tsc: bool) {
        if tsc {
            let (t, real) = self.sample();
            self.cal_tsc.store(t, Ordering::Relaxed);
            self.cal_real.store(real, Ordering::Relaxed);
            self.mode.store(MODE_CALIBRATING, Ordering::Release);
        } else {
            self.mode.store(MODE_OFF, Ordering::Release);
        }
    }

    fn init_global(&'static self) {
        CLOCK_INIT.call_once(|| {
            let clocksource =
                std::fs::read_to_string("/sys/devices/system/clocksource/clocksource0/current_clocksource")
                    .unwrap_or_default();
            let env = std::env::var("USERBPF_TSC").ok();
            RDTSCP.store(have_rdtscp(), Ordering::Relaxed);
            self.start(tsc_usable(&clocksource, invariant_tsc(), rdtsc_allowed(), env.as_deref()));
            // SAFETY: registers a child handler that only stores to an atomic.
            unsafe { libc::pthread_atfork(None, None, Some(clock_after_fork)) };
        });
    }

    fn mode(&self) -> u8 {
        let m = self.mode.load(Ordering::Acquire);
        if m == MODE_UNKNOWN && std::ptr::eq(self, &CLOCK) {
            CLOCK.init_global();
            return CLOCK.mode.load(Ordering::Acquire);
        }
        m
    }

    /// A `clock_gettime` reading and the TSC just before it: the narrowest of three brackets,
    /// as `(tsc before, real)`; the real time lies at or after that TSC.
    fn sample(&self) -> (u64, u64) {
        let mut best = (u64::MAX, 0, 0);
        for _ in 0..3 {
            let t1 = rdtsc_ordered();
            let real = clock_ns(libc::CLOCK_MONOTONIC);
            let t2 = rdtsc_ordered();
            if t2.wrapping_sub(t1) < best.0 {
                best = (t2.wrapping_sub(t1), t1, real);
            }
        }
        (best.1, best.2)
    }

    fn publish(&self, generation: u64, p: &Params) {
        // Orders the generation this writer (or the previous one) published before the
        // record's stores: a reader of the slot that sees a field written here, and then
        // the generation it began with, sees at least that generation (the seqlock's
        // re-check; on x86 a compiler barrier only).
        fence(Ordering::Release);
        self.records[((generation + 1) & 1) as usize].store(p);
        self.generation.store(generation + 1, Ordering::Release);
    }

    fn try_lock(&self) -> bool {
        !self.writer.load(Ordering::Relaxed)
            && self.writer.compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed).is_ok()
    }

    fn unlock(&self) {
        self.writer.store(false, Ordering::Release);
    }

    #[cold]
    #[inline(never)]
    fn slow(&self) -> u64 {
        loop {
            let generation = self.generation.load(Ordering::Acquire);
            if generation == 0 {
                match self.mode() {
                    MODE_CALIBRATING => {
                        let real = clock_ns(libc::CLOCK_MONOTONIC);
                        if real.wrapping_sub(self.cal_real.load(Ordering::Relaxed)) < self.window_ns || !self.try_lock()
                        {
                            return real;
                        }
                        let done = self.generation.load(Ordering::Acquire) == 0 && self.first_record();
                        self.unlock();
                        if !done {
                            return real;
                        }
                        continue;
                    }
                    _ => return clock_ns(libc::CLOCK_MONOTONIC),
                }
            }
            let p = self.records[(generation & 1) as usize].load();
            let t = rdtsc_ordered();
            fence(Ordering::Acquire);
            if self.generation.load(Ordering::Relaxed) != generation {
                continue; // a torn record: read again
            }
            if t >= p.start {
                if t < p.expire {
                    let v = p.at(t);
                    if t - p.start >= p.span && self.try_lock() {
                        self.recalibrate(generation, &p);
                        self.unlock();
                    }
                    return v;
                }
                // Expired: make the next record, or wait for the one being made.
                if self.try_lock() {
                    self.recalibrate(generation, &p);
                    self.unlock();
                    continue;
                }
                let deadline = t.saturating_add(ticks(WAIT_NS, p.mult));
                while self.generation.load(Ordering::Acquire) == generation && rdtsc_ordered() < deadline {
                    std::hint::spin_loop();
                }
                if self.generation.load(Ordering::Acquire) != generation {
                    continue;
                }
                return p.at(p.expire);
            }
            if t >= p.a_start {
                return p.at(t);
            }
            // Before the record: a TSC that went back (a resume from suspend) by more than a
            // period makes a new record; a few ticks (counters of two CPUs) read the start.
            if p.a_start - t > p.span && self.try_lock() {
                self.recalibrate(generation, &p);
                self.unlock();
                continue;
            }
            return p.a_base;
        }
    }

    /// The first record, at the end of the calibration window. Holding the writer flag.
    fn first_record(&self) -> bool {
        let (t, real) = self.sample();
        let (t0, real0) = (self.cal_tsc.load(Ordering::Relaxed), self.cal_real.load(Ordering::Relaxed));
        let mult = if t > t0 && real > real0 { (((real - real0) as u128) << 32) / (t - t0) as u128 } else { 0 };
        if !(MULT_MIN as u128..=MULT_MAX as u128).contains(&mult) {
            // No plausible rate: no TSC value was given out yet, so clock_gettime can stay.
            self.mode.store(MODE_OFF, Ordering::Release);
            return false;
        }
        let mult = mult as u64;
        self.cal_tsc.store(t, Ordering::Relaxed);
        self.cal_real.store(real, Ordering::Relaxed);
        let span = ticks(self.period_ns, mult);
        let p = Params {
            start: t,
            span,
            base: real,
            mult,
            a_start: t,
            a_base: real,
            a_mult: mult,
            expire: t.saturating_add(span).saturating_add(ticks(MARGIN_NS, mult)),
        };
        self.publish(0, &p);
        self.mode.store(MODE_TSC, Ordering::Release);
        true
    }

    /// Publishes the record after `p` (generation `generation`), holding the writer flag.
    fn recalibrate(&self, generation: u64, p: &Params) {
        if self.generation.load(Ordering::Acquire) != generation {
            return; // another writer did it
        }
        let (t, real) = self.sample();
        let (t0, real0) = (self.cal_tsc.load(Ordering::Relaxed), self.cal_real.load(Ordering::Relaxed));
        // The rate since the last calibration, if it is a plausible one.
        let measured = if t > t0 && real > real0 { (((real - real0) as u128) << 32) / (t - t0) as u128 } else { 0 };
        let mut rate = if (MULT_MIN as u128..=MULT_MAX as u128).contains(&measured) { measured as u64 } else { p.mult };
        let ppm = self.perturb_ppm.swap(0, Ordering::Relaxed);
        self.cal_tsc.store(t, Ordering::Relaxed);
        self.cal_real.store(real, Ordering::Relaxed);
        let span = ticks(self.period_ns, rate);
        let margin = ticks(MARGIN_NS, rate);
        let next = if t >= p.start && t < p.expire {
            // In time: the next segment starts where this one ends, at its value there; its
            // rate closes the error predicted there within one period.
            let s = p.expire;
            let v = p.at(s);
            let predicted = real as i128 + scale(s - t, rate) as i128;
            let err = (predicted - v as i128).clamp(i64::MIN as i128, i64::MAX as i128) as i64;
            let (base, mult) = slew(v, err, rate, self.period_ns);
            rate = mult;
            Params {
                start: s,
                span,
                base,
                mult,
                a_start: p.start,
                a_base: p.base,
                a_mult: p.mult,
                expire: s.saturating_add(span).saturating_add(margin),
            }
        } else {
            // Late (the record expired) or the TSC went back: anchor on the reading, never
            // below what the expired record gave out (its value at `expire`).
            let floor = p.at(p.expire);
            let err = real as i128 - floor as i128;
            let (base, mult) = if err >= 0 {
                (real, rate)
            } else {
                slew(floor, err.max(i64::MIN as i128) as i64, rate, self.period_ns)
            };
            rate = mult;
            Params {
                start: t,
                span,
                base,
                mult,
                a_start: if t >= p.expire { p.expire } else { t },
                a_base: floor,
                a_mult: 0,
                expire: t.saturating_add(span).saturating_add(margin),
            }
        };
        let mut next = next;
        if ppm != 0 {
            next.mult = (rate as i128 + rate as i128 * ppm as i128 / 1_000_000) as u64;
        }
        self.publish(generation, &next);
    }

    /// Skews the next segment's rate by `ppm` parts per million (tests: a drifting clock
    /// the following recalibration must bring back).
    #[cfg(test)]
    fn perturb_next(&self, ppm: i64) {
        self.perturb_ppm.store(ppm, Ordering::Relaxed);
    }
}

/// The base and rate of a segment starting at `v` whose error against the real clock is
/// `err` ns there (positive: the clock is behind): the rate closes it within one period,
/// changed by at most 1/[`SLEW_DIV`] (at most half, for the clock more than [`JUMP_NS`]
/// ahead); an error above [`JUMP_NS`] with the clock behind is closed at once (forward:
/// still monotonic).
fn slew(v: u64, err: i64, rate: u64, period_ns: u64) -> (u64, u64) {
    if err > JUMP_NS {
        return (v + err as u64, rate);
    }
    // Far ahead (the TSC ran while CLOCK_MONOTONIC stood still: a suspend to idle): up to
    // half speed, so that a second ahead takes seconds, not minutes, to close.
    let max = if err < -JUMP_NS { rate / 2 } else { rate / SLEW_DIV };
    let adj = (((err.unsigned_abs() as u128) * rate as u128) / period_ns.max(1) as u128).min(max as u128) as u64;
    (v, if err >= 0 { rate + adj } else { rate - adj })
}

extern "C" fn clock_after_fork() {
    CLOCK.writer.store(false, Ordering::Relaxed);
}

/// CPUID `0x8000_0007` EDX bit 8: the TSC runs at a constant rate in every state.
fn invariant_tsc() -> bool {
    extended_edx(0x8000_0007) & (1 << 8) != 0
}

/// EDX of CPUID's extended leaf `leaf`, 0 where the CPU does not report it.
fn extended_edx(leaf: u32) -> u32 {
    use std::arch::x86_64::__cpuid;
    #[allow(unused_unsafe)]
    // SAFETY: cpuid exists on every x86-64 CPU; the extended leaf is read only if the CPU
    // reports it.
    unsafe {
        if __cpuid(0x8000_0000).eax >= leaf { __cpuid(leaf).edx } else { 0 }
    }
}

/// Whether this process may execute `rdtsc` (`prctl(PR_SET_TSC, PR_TSC_SIGSEGV)` forbids it).
fn rdtsc_allowed() -> bool {
    let mut v: libc::c_int = 0;
    // SAFETY: PR_GET_TSC writes an int to the address we own.
    let r = unsafe { libc::prctl(libc::PR_GET_TSC, &mut v as *mut libc::c_int as libc::c_ulong, 0, 0, 0) };
    r != 0 || v != libc::PR_TSC_SIGSEGV
}

/// Whether the TSC clock is used: the kernel's clocksource is the TSC (its CLOCK_MONOTONIC
/// is the TSC scaled), the TSC is invariant, the process may read it, and `USERBPF_TSC` is
/// not `0`.
fn tsc_usable(clocksource: &str, invariant: bool, allowed: bool, env: Option<&str>) -> bool {
    clocksource.trim() == "tsc" && invariant && allowed && env.is_none_or(|v| v.trim() != "0")
}

/// `u64 bpf_ktime_get_ns(void)`: CLOCK_MONOTONIC.
#[unsafe(link_section = ".text.hot.userbpf")]
unsafe extern "C" fn ktime_get_ns(_: u64, _: u64, _: u64, _: u64, _: u64) -> u64 {
    monotonic_ns()
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    /// The TSC clock's tests need an invariant TSC behind the kernel's CLOCK_MONOTONIC.
    fn tsc_here() -> bool {
        let cs = std::fs::read_to_string("/sys/devices/system/clocksource/clocksource0/current_clocksource")
            .unwrap_or_default();
        userbpf_testutil::require(
            tsc_usable(&cs, invariant_tsc(), rdtsc_allowed(), None),
            "the kernel's clocksource is an invariant TSC",
        )
    }

    fn leak(period_ns: u64, window_ns: u64) -> &'static TscClock {
        let c: &'static TscClock = Box::leak(Box::new(TscClock::new(period_ns, window_ns)));
        c.start(true);
        c
    }

    /// `clock.now()` between two clock_gettime readings, as (before, value, after).
    fn bracket(clock: &TscClock) -> (u64, u64, u64) {
        let a = clock_ns(libc::CLOCK_MONOTONIC);
        let v = clock.now();
        let b = clock_ns(libc::CLOCK_MONOTONIC);
        (a, v, b)
    }

    /// How far `v` lies outside `[a, b]` (0 inside), in ns.
    fn off(a: u64, v: u64, b: u64) -> u64 {
        if v < a { a - v } else { v.saturating_sub(b) }
    }

    #[test]
    fn used_only_on_an_invariant_tsc_clocksource() {
        assert!(tsc_usable("tsc\n", true, true, None));
        assert!(tsc_usable("tsc\n", true, true, Some("1")));
        assert!(!tsc_usable("tsc\n", true, true, Some("0")));
        assert!(!tsc_usable("hpet\n", true, true, None));
        assert!(!tsc_usable("kvm-clock\n", true, true, None));
        assert!(!tsc_usable("tsc\n", false, true, None));
        assert!(!tsc_usable("tsc\n", true, false, None));
    }

    #[test]
    fn slewing_is_bounded() {
        let rate = 1u64 << 32; // 1 ns a tick
        let s = 1_000_000_000;
        assert_eq!(slew(100, 0, rate, s), (100, rate));
        assert_eq!(slew(100, 5_000_000, rate, s), (100, rate + rate / 200), "behind 5 ms: 0.5% faster");
        assert_eq!(slew(100, -5_000_000, rate, s), (100, rate - rate / 200), "ahead 5 ms: 0.5% slower");
        assert_eq!(slew(100, 9_000_000, rate, 100_000_000), (100, rate + rate / 100), "at most 1%");
        assert_eq!(slew(100, -9_000_000, rate, 100_000_000), (100, rate - rate / 100), "at most 1%");
        assert_eq!(slew(100, 20_000_000, rate, s), (20_000_100, rate), "far behind: a jump forward");
        assert_eq!(slew(100, -800_000_000, rate, s), (100, rate / 2), "far ahead: half speed");
        assert_eq!(slew(100, -20_000_000, rate, s), (100, rate - rate / 50), "ahead 20 ms: 2% slower");
    }

    #[test]
    fn the_fallback_is_clock_gettime() {
        let c: &'static TscClock = Box::leak(Box::new(TscClock::new(10_000_000, 1_000_000)));
        c.start(false);
        let mut last = 0;
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_millis(30) {
            let (a, v, b) = bracket(c);
            assert!(a <= v && v <= b && v >= last, "{a} {v} {b} after {last}");
            last = v;
        }
        assert_eq!(c.generation.load(Ordering::Relaxed), 0, "no TSC record without the TSC clock");
        assert_eq!(c.mode.load(Ordering::Relaxed), MODE_OFF);
    }

    #[test]
    fn clock_gettime_answers_during_the_first_window_then_the_tsc() {
        if !tsc_here() {
            return;
        }
        let c = leak(100_000_000, 40_000_000);
        let (a, v, b) = bracket(c);
        assert!(a <= v && v <= b, "{a} {v} {b}");
        assert_eq!(c.generation.load(Ordering::Relaxed), 0, "calibrating");
        std::thread::sleep(Duration::from_millis(45));
        let mut last = v;
        for _ in 0..1000 {
            let (a, v, b) = bracket(c);
            assert!(v >= last);
            assert!(off(a, v, b) < 5_000, "{a} {v} {b}");
            last = v;
        }
        assert_eq!(c.generation.load(Ordering::Relaxed), 1, "one record after the window");
        assert!(c.mode.load(Ordering::Relaxed) == MODE_TSC);
    }

    #[test]
    fn within_microseconds_of_clock_gettime_over_recalibrations() {
        if !tsc_here() {
            return;
        }
        let c = leak(20_000_000, 20_000_000);
        let t0 = Instant::now();
        let (mut worst, mut n, mut last) = (0, 0u64, 0);
        while t0.elapsed() < Duration::from_secs(3) {
            let (a, v, b) = bracket(c);
            assert!(v >= last, "backwards: {v} after {last}");
            last = v;
            if c.generation.load(Ordering::Relaxed) >= 2 {
                worst = worst.max(off(a, v, b));
                n += 1;
            }
            if n.is_multiple_of(4096) {
                std::thread::sleep(Duration::from_micros(200));
            }
        }
        let generation = c.generation.load(Ordering::Relaxed);
        assert!(generation >= 50, "only {generation} records in 3 s of 20 ms periods");
        assert!(worst < 5_000, "{worst} ns off clock_gettime over {n} readings, {generation} records");
    }

    #[test]
    fn a_drifting_segment_is_slewed_back_without_going_backwards() {
        if !tsc_here() {
            return;
        }
        let period = 20_000_000;
        let c = leak(period, 20_000_000);
        while c.generation.load(Ordering::Relaxed) < 3 {
            c.now();
        }
        for ppm in [5_000i64, -5_000] {
            // A segment 0.5% fast (or slow): 100 us off after one 20 ms period, which the
            // recalibration after it must take back by slewing, not by jumping.
            let g0 = c.generation.load(Ordering::Relaxed);
            c.perturb_next(ppm);
            let (mut last, mut seen) = (0u64, 0i64);
            let t0 = Instant::now();
            while c.generation.load(Ordering::Relaxed) < g0 + 2 {
                let (a, v, b) = bracket(c);
                assert!(v >= last, "backwards: {v} after {last}");
                last = v;
                let e = if v > b {
                    (v - b) as i64
                } else if v < a {
                    -((a - v) as i64)
                } else {
                    0
                };
                if e.abs() > seen.abs() {
                    seen = e;
                }
                assert!(t0.elapsed() < Duration::from_secs(5));
            }
            assert!(seen.signum() == ppm.signum() && seen.abs() > 30_000, "the {ppm} ppm segment was {seen} ns off");
            // One more period to converge: then back within microseconds.
            let g1 = c.generation.load(Ordering::Relaxed);
            while c.generation.load(Ordering::Relaxed) < g1 + 2 {
                let (_, v, _) = bracket(c);
                assert!(v >= last, "backwards: {v} after {last}");
                last = v;
            }
            let mut worst = 0;
            for _ in 0..10_000 {
                let (a, v, b) = bracket(c);
                assert!(v >= last, "backwards: {v} after {last}");
                last = v;
                worst = worst.max(off(a, v, b));
            }
            assert!(worst < 5_000, "{worst} ns off two periods after a {ppm} ppm segment");
        }
    }

    /// Both ordered reads (`lfence; rdtsc`, and `rdtscp` where the CPU has it) keep a
    /// timestamp read after another thread's at or above it. (The flag is the process's: other
    /// tests running meanwhile read the TSC either way, both ordered.)
    #[test]
    fn monotonic_across_threads_and_recalibrations() {
        if !tsc_here() {
            return;
        }
        for rdtscp in [false, true] {
            if rdtscp && !have_rdtscp() {
                continue;
            }
            RDTSCP.store(rdtscp, Ordering::Relaxed);
            let c = leak(5_000_000, 5_000_000);
            let latest = AtomicU64::new(0);
            let stop = AtomicBool::new(false);
            std::thread::scope(|s| {
                for k in 0..3 {
                    let (latest, stop) = (&latest, &stop);
                    s.spawn(move || {
                        let mut mine = 0;
                        let mut i = 0u64;
                        while !stop.load(Ordering::Relaxed) {
                            let seen = latest.load(Ordering::Acquire);
                            let v = c.now();
                            assert!(v >= mine, "thread {k}: {v} after its own {mine} (rdtscp: {rdtscp})");
                            assert!(v >= seen, "thread {k}: {v} after another thread's {seen} (rdtscp: {rdtscp})");
                            mine = v;
                            latest.fetch_max(v, Ordering::AcqRel);
                            i += 1;
                            if k == 0 && i.is_multiple_of(20_000) {
                                c.perturb_next(if i.is_multiple_of(40_000) { 8_000 } else { -8_000 });
                            }
                        }
                    });
                }
                std::thread::sleep(Duration::from_millis(1000));
                stop.store(true, Ordering::Relaxed);
            });
            let generation = c.generation.load(Ordering::Relaxed);
            assert!(generation >= 12, "only {generation} records (rdtscp: {rdtscp})");
        }
        RDTSCP.store(have_rdtscp(), Ordering::Relaxed);
    }

    #[test]
    fn an_expired_record_is_replaced_on_the_real_clock() {
        if !tsc_here() {
            return;
        }
        let c = leak(10_000_000, 10_000_000);
        std::thread::sleep(Duration::from_millis(12));
        let mut last = c.now();
        for _ in 0..5 {
            // Idle for several periods: the first reading after it finds the record expired.
            std::thread::sleep(Duration::from_millis(35));
            let g = c.generation.load(Ordering::Relaxed);
            let (a, v, b) = bracket(c);
            assert!(v >= last, "backwards: {v} after {last}");
            assert!(off(a, v, b) < 5_000, "{a} {v} {b}");
            assert_eq!(c.generation.load(Ordering::Relaxed), g + 1, "one new record");
            last = v;
        }
    }

    #[test]
    fn the_process_clock_is_clock_monotonic() {
        init();
        let mut last = 0;
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_millis(120) {
            let (a, v, b) = (clock_ns(libc::CLOCK_MONOTONIC), monotonic_ns(), clock_ns(libc::CLOCK_MONOTONIC));
            assert!(v >= last);
            assert!(off(a, v, b) < 5_000, "{a} {v} {b}");
            last = v;
        }
    }

    #[test]
    fn the_coarse_clock_is_the_vdsos_clock_monotonic_at_its_last_tick() {
        init();
        assert!(matches!(VDSO_CLOCK_GETTIME.get(), Some(Some(_))), "the vDSO's clock_gettime was not found");
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_millis(30) {
            let c = coarse_monotonic_ns();
            let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
            // SAFETY: libc's clock_gettime writes the timespec we own.
            assert_eq!(unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) }, 0);
            let b = ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64;
            assert!(c <= b && b - c < 2 * tick_ns() + 5_000_000, "coarse {c}, libc's CLOCK_MONOTONIC {b}");
        }
    }
}
