//! How a consumer of perf and ring buffers waits without making producers call the kernel.
//!
//! A consumer that finds its rings empty can sleep in two ways:
//!
//! - **lingering**: a short timed sleep with its `waiting` word clear: producers see nobody
//!   waiting and make no system call; the consumer looks again when the sleep ends;
//! - **deep**: it sets its `waiting` word, checks once more, and sleeps on the futex word
//!   until a producer wakes it (`FUTEX_WAKE`, the only system call a producer makes).
//!
//! [`Linger`] chooses: while records came within the last [`LINGER_IDLE`] the consumer
//! lingers, so a steady stream costs producers nothing (the cross-CPU wake-up a `FUTEX_WAKE`
//! is took about 15 µs of a traced nginx's CPU a time); after that much idleness it sleeps
//! deep, so an idle consumer costs no CPU, and the first record after a quiet period wakes it
//! at once.
//!
//! The lingering sleep follows the rate records come at: after a look that found the fullest
//! ring a share `f` full, `t` after the look before, the next sleep is the time the ring takes
//! to fill to [`LINGER_FILL`] at that rate, between [`LINGER_MIN`] and [`LINGER_MAX`]; after a
//! look that found nothing it doubles, up to [`LINGER_MAX`]. The first sleep after a deep one
//! is [`LINGER_MIN`]. So a fast stream is read before its ring fills, a slow one in batches
//! at most [`LINGER_MAX`] apart, and a lone record waits at most [`LINGER_MAX`] (plus the
//! timer slack, 50 µs by default) while the consumer lingers, and no time when it sleeps deep.
//!
//! The kernel wakes a perf buffer's reader for every `wakeup_events` samples (1 for libbpf and
//! BCC) and a ring buffer's for every record it waits for: userbpf's producers wake only a
//! consumer that has been idle for [`LINGER_IDLE`]. A consumer that lingers may so see a
//! record a producer committed with `BPF_RB_NO_WAKEUP` sooner than the kernel would show it.

use std::sync::atomic::{AtomicU8, AtomicU32, Ordering, compiler_fence, fence};
use std::time::{Duration, Instant};

use crate::ringbuf::futex_wait;
use crate::types::MapError;

/// The shortest lingering sleep (and the first after a deep one).
pub const LINGER_MIN: Duration = Duration::from_micros(50);
/// The longest lingering sleep: the most a lone record waits while the consumer lingers
/// (plus the timer slack, 50 µs by default).
pub const LINGER_MAX: Duration = Duration::from_millis(1);
/// Idleness after which the consumer sleeps deep (producers wake it).
pub const LINGER_IDLE: Duration = Duration::from_millis(20);
/// The share of the fullest ring a lingering sleep lets fill, at the rate last seen.
pub const LINGER_FILL: f64 = 0.125;

// ---- The wakeup handshake's barriers ----
//
// Producer and deep-sleeping consumer each store, then load what the other stored (Dekker):
// the producer publishes its record (perf ring: `data_head`) then loads `waiting`; the
// consumer stores `waiting` then looks for records. Each side needs a store-load barrier, or
// both can miss the other's store (the consumer then sleeps on a record nobody wakes it for).
// A full fence on x86 waits for every store the producer has in flight, and a perf record is a
// few hundred bytes of stores to lines the consumer just read: on nginx under sslsniff that
// wait was most of a perf output's time. So the barrier is asymmetric, as `membarrier(2)`
// allows: producers only keep the compiler from reordering their store and load
// ([`publish_fence`]), and a consumer about to sleep deep makes every running thread of the
// system pass a full barrier (`MEMBARRIER_CMD_GLOBAL`, [`waiter_fence`]): a producer's load of
// `waiting` either follows that barrier (and sees the consumer's store) or preceded it, with
// its record stored before it, which the consumer's check sees. The command waits for an RCU
// grace period (about 12 ms here), taking no CPU; consumers sleep deep only after
// [`LINGER_IDLE`] without records, and a record that comes meanwhile is seen when the barrier
// returns. (`MEMBARRIER_CMD_GLOBAL_EXPEDITED`, with IPIs to registered processes, takes
// microseconds, but a CPU that ran a producer's process idly before it registered can keep an
// unregistered state: the handshake test missed a record once in about 30 runs with it.)
// Where the kernel lacks the command (`nohz_full` CPUs), producers fence.

const MEMBARRIER_CMD_QUERY: i64 = 0;
const MEMBARRIER_CMD_GLOBAL: i64 = 1;

/// Whether consumers can use `MEMBARRIER_CMD_GLOBAL`: 0 not asked, 1 yes, 2 no (fences).
// The hit path reads it: with its other statics on one page (see `userbpf_arena`).
#[unsafe(link_section = "userbpf_hot")]
static GLOBAL_BARRIER: AtomicU8 = AtomicU8::new(0);

fn membarrier(cmd: i64) -> i64 {
    // SAFETY: membarrier takes no pointers; an unknown or refused command returns -1.
    unsafe { libc::syscall(libc::SYS_membarrier, cmd, 0u32, 0i32) as i64 }
}

/// Asks the kernel once whether consumers can make the system-wide barrier (see above): called
/// when a process opens a perf event array, before it writes any record, so the hot path reads
/// one relaxed byte.
pub fn prepare_producer() {
    if GLOBAL_BARRIER.load(Ordering::Acquire) != 0 {
        return;
    }
    let q = membarrier(MEMBARRIER_CMD_QUERY);
    let ok = q >= 0 && q & MEMBARRIER_CMD_GLOBAL != 0;
    GLOBAL_BARRIER.store(if ok { 1 } else { 2 }, Ordering::Release);
}

/// The producer's barrier between publishing a record and loading the consumers' `waiting`
/// words: a compiler barrier where consumers make the system-wide one, a full fence otherwise.
#[inline(always)]
pub fn publish_fence() {
    if GLOBAL_BARRIER.load(Ordering::Relaxed) == 1 {
        compiler_fence(Ordering::SeqCst);
    } else {
        fence(Ordering::SeqCst);
    }
}

/// The consumer's barrier between storing its `waiting` word(s) and looking for records once
/// more before a deep sleep. False if the system refused it: the sleep must then be bounded
/// ([`deep_timeout`]), as a producer may not have seen `waiting`.
pub fn waiter_fence() -> bool {
    fence(Ordering::SeqCst);
    membarrier(MEMBARRIER_CMD_GLOBAL) == 0
}

/// The timeout of a deep sleep that wanted `timeout`, after a [`waiter_fence`] that returned
/// `fenced`.
pub fn deep_timeout(timeout: Option<Duration>, fenced: bool) -> Option<Duration> {
    if fenced { timeout } else { Some(timeout.map_or(LINGER_MAX, |t| t.min(LINGER_MAX))) }
}

/// The state of one consumer's waiting (see the module).
#[derive(Debug, Clone)]
pub struct Linger {
    /// When records were last seen; None: idle (sleep deep).
    last: Option<Instant>,
    /// When the rings were last looked at while lingering (None after a deep sleep).
    looked: Option<Instant>,
    /// The next lingering sleep.
    next: Duration,
    /// Never linger: every wait is deep (each wait after records makes the next producer
    /// call `FUTEX_WAKE`, as before lingering existed; for comparisons).
    eager: bool,
}

impl Default for Linger {
    fn default() -> Linger {
        Linger::new()
    }
}

impl Linger {
    /// An idle consumer: its first wait is deep.
    pub fn new() -> Linger {
        Linger { last: None, looked: None, next: LINGER_MIN, eager: false }
    }

    /// A consumer that never lingers (see the field `eager`).
    pub fn eager() -> Linger {
        Linger { eager: true, ..Linger::new() }
    }

    /// A look found records; `fill`: the largest share of a ring they took (0..=1).
    pub fn saw_data(&mut self, fill: f64) {
        self.saw_data_at(fill, Instant::now())
    }

    fn saw_data_at(&mut self, fill: f64, now: Instant) {
        if self.eager {
            return;
        }
        self.next = match self.looked {
            Some(before) if fill > 0.0 => {
                let rate = fill / now.duration_since(before).as_secs_f64().max(1e-9);
                Duration::from_secs_f64((LINGER_FILL / rate).min(1.0)).clamp(LINGER_MIN, LINGER_MAX)
            }
            Some(_) => LINGER_MAX,
            None => LINGER_MIN,
        };
        self.last = Some(now);
        self.looked = Some(now);
    }

    /// How to wait after a look that found the rings empty: `Some(d)`, a lingering sleep of
    /// `d` (the `waiting` word clear), or `None`, sleep deep (set `waiting`, check, futex
    /// wait).
    pub fn next_sleep(&mut self) -> Option<Duration> {
        self.next_sleep_at(Instant::now())
    }

    fn next_sleep_at(&mut self, now: Instant) -> Option<Duration> {
        let last = self.last?;
        if now.duration_since(last) >= LINGER_IDLE {
            self.last = None;
            self.looked = None;
            return None;
        }
        if self.looked.is_some() {
            let d = self.next;
            self.next = (d * 2).min(LINGER_MAX);
            self.looked = Some(now);
            Some(d)
        } else {
            self.looked = Some(now);
            Some(LINGER_MIN)
        }
    }

    /// Whether the next wait is deep.
    pub fn idle(&self) -> bool {
        self.last.is_none_or(|l| l.elapsed() >= LINGER_IDLE)
    }
}

/// A consumer that waits as this module says: its [`Linger`], and its deep sleep.
pub(crate) trait Waiting {
    fn linger(&mut self) -> &mut Linger;
    /// Sleeps deep, at most `timeout` (forever if None): see [`sleep_deep`].
    fn sleep_deep(&self, timeout: Option<Duration>);
}

/// A consumer's `poll`: `consume` until it hands over records (their number is returned), or
/// `timeout` passes (0; `Duration::MAX` waits forever), waiting in between as [`Linger`] says.
pub(crate) fn poll<C: Waiting>(
    c: &mut C,
    timeout: Duration,
    mut consume: impl FnMut(&mut C) -> Result<usize, MapError>,
) -> Result<usize, MapError> {
    let deadline = Instant::now().checked_add(timeout);
    loop {
        let n = consume(c)?;
        if n > 0 {
            return Ok(n);
        }
        let remaining = match deadline {
            Some(d) => {
                let now = Instant::now();
                if now >= d {
                    return Ok(0);
                }
                Some(d - now)
            }
            None => None,
        };
        if let Some(nap) = c.linger().next_sleep() {
            std::thread::sleep(remaining.map_or(nap, |r| r.min(nap)));
            continue;
        }
        c.sleep_deep(remaining);
    }
}

/// The deep sleep: sets `waiting` (producers that see it bump `wake_seq` and wake it), looks
/// once more (`ready`, sequentially consistent with the producers' publication, see the
/// consumers' `ready`), and sleeps on `wake_seq` unless something came; clears `waiting`.
/// `producers_fence`: the producers publish with a full barrier of their own (the ring
/// buffer's commit is a compare-and-swap), so the consumer needs no system-wide one.
pub(crate) fn sleep_deep(
    waiting: &AtomicU32,
    wake_seq: &AtomicU32,
    ready: impl FnOnce() -> bool,
    timeout: Option<Duration>,
    producers_fence: bool,
) {
    waiting.store(1, Ordering::SeqCst);
    let fenced = producers_fence || waiter_fence();
    let seq = wake_seq.load(Ordering::SeqCst);
    if !ready() {
        futex_wait(wake_seq, seq, deep_timeout(timeout, fenced));
    }
    waiting.store(0, Ordering::SeqCst);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lingers_while_data_came_recently_then_sleeps_deep() {
        let mut l = Linger::new();
        assert!(l.idle());
        assert_eq!(l.next_sleep(), None, "a fresh consumer sleeps deep");
        l.saw_data(0.01);
        assert!(!l.idle());
        assert_eq!(l.next_sleep(), Some(LINGER_MIN), "the first sleep after a deep one");
        let mut sleeps = Vec::new();
        for _ in 0..8 {
            sleeps.push(l.next_sleep().unwrap());
        }
        assert!(sleeps.windows(2).all(|w| w[1] >= w[0] && w[1] <= LINGER_MAX), "{sleeps:?}");
        assert_eq!(*sleeps.last().unwrap(), LINGER_MAX);
        std::thread::sleep(LINGER_IDLE);
        assert_eq!(l.next_sleep(), None, "idle: deep");
        assert!(l.idle());
        let mut e = Linger::eager();
        e.saw_data(0.5);
        assert_eq!(e.next_sleep(), None, "eager: always deep");
    }

    #[test]
    fn the_sleep_follows_the_rate() {
        let t0 = Instant::now();
        let at = |us: u64| t0 + Duration::from_micros(us);
        let mut l = Linger::new();
        l.saw_data_at(0.01, at(0));
        assert_eq!(l.next_sleep_at(at(1)), Some(LINGER_MIN), "first after a deep sleep");
        // 90% of a ring in 100 µs: as short as allowed.
        l.saw_data_at(0.9, at(100));
        assert_eq!(l.next_sleep_at(at(100)), Some(LINGER_MIN));
        // 1/16 of a ring in 200 µs: 1/8 takes 400 µs.
        l.saw_data_at(0.0625, at(300));
        assert_eq!(l.next_sleep_at(at(301)), Some(Duration::from_micros(400)));
        // Nothing found: double.
        assert_eq!(l.next_sleep_at(at(700)), Some(Duration::from_micros(800)));
        assert_eq!(l.next_sleep_at(at(1500)), Some(LINGER_MAX));
        // A trickle: the longest sleep.
        l.saw_data_at(0.0001, at(2500));
        assert_eq!(l.next_sleep_at(at(2501)), Some(LINGER_MAX));
        // Idle for LINGER_IDLE: deep; the first sleep after it is the shortest.
        assert_eq!(l.next_sleep_at(at(2500) + LINGER_IDLE), None);
        l.saw_data_at(0.5, at(30_000));
        assert_eq!(l.next_sleep_at(at(30_001)), Some(LINGER_MIN));
    }
}
