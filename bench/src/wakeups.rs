//! `wakeup-bench`: what a perf buffer or ring buffer output costs its producer while a
//! consumer is attached, and what the consumer gets: side by side, the consumer lingering
//! (userbpf's default, `userbpf_maps::linger`: short timed sleeps while records came within
//! the last 20 ms, a futex sleep producers end only after that) and the consumer sleeping on
//! the futex as soon as it finds nothing (`set_linger(false)`: what every consumer did before,
//! each sleep making the next producer call `FUTEX_WAKE`).
//!
//! One producer thread calls `PerfEventArray::output` (1 ring of 8 data pages, BCC's default)
//! or `RingBuf::output` (64 KiB) with 64-byte events at a steady pace (busy-waiting between
//! events, so the pace is exact), a consumer thread `poll`s. Printed per pace: the producer's
//! nanoseconds per output call (timed around the call; the futex wake-ups are inside),
//! `FUTEX_WAKE` calls per event (the only system call on the producer's path), the consumer's
//! CPU time (its thread's, per second of wall time), and the delivery latency (from the
//! output call to the consumer's callback: median and maximum, the maximum mostly the machine's
//! scheduling). The last row: the consumer
//! alone for a second with no event (its CPU while idle). It reports; it never fails on
//! timing. Load average printed before and after.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use userbpf_maps::perf::{PerfConsumer, PerfEvent, PerfEventArray};
use userbpf_maps::ringbuf::{RingBuf, RingBufConsumer};
use userbpf_maps::{MapSpec, MapType};

const EVENT: usize = 64;

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().map(str::to_owned))
        .unwrap_or_default()
}

fn thread_cpu() -> Duration {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes the timespec we pass.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// A map under test: the producer's call, the wake-up counter, a consumer.
enum Target {
    Perf(PerfEventArray),
    Ring(RingBuf),
}

impl Target {
    fn output(&self, data: &[u8]) -> bool {
        // SAFETY: `data` is readable for its length.
        unsafe {
            match self {
                Target::Perf(pa) => pa.output(0, 0, data.as_ptr(), data.len() as u64).is_ok(),
                Target::Ring(rb) => rb.output(data.as_ptr(), data.len() as u64, 0).is_ok(),
            }
        }
    }

    fn wakeups(&self) -> u64 {
        match self {
            Target::Perf(pa) => pa.wakeups(),
            Target::Ring(rb) => rb.wakeups(),
        }
    }

    /// Polls until `stop` and the map is empty, handing each event's payload to `f`; returns
    /// the consumer thread's CPU time.
    fn consume(&self, linger: bool, stop: &AtomicBool, mut f: impl FnMut(&[u8])) -> Duration {
        let cpu0 = thread_cpu();
        match self {
            Target::Perf(pa) => {
                let mut c = PerfConsumer::new(pa).expect("perf consumer");
                c.set_linger(linger);
                let mut g = |e: PerfEvent<'_>| {
                    if let PerfEvent::Sample { data, .. } = e {
                        f(data)
                    }
                };
                while !stop.load(Ordering::Acquire) {
                    c.poll(Duration::from_millis(100), &mut g).expect("poll");
                }
                while c.consume(&mut g).expect("consume") > 0 {}
            }
            Target::Ring(rb) => {
                let mut c = RingBufConsumer::new(rb).expect("ring buffer consumer");
                c.set_linger(linger);
                while !stop.load(Ordering::Acquire) {
                    c.poll(Duration::from_millis(100), &mut f).expect("poll");
                }
                while c.consume(&mut f).expect("consume") > 0 {}
            }
        }
        thread_cpu() - cpu0
    }
}

struct Row {
    pace: String,
    events: u64,
    sent: u64,
    received: u64,
    producer_ns: f64,
    wakes: u64,
    consumer_cpu: f64,
    lat_median_us: f64,
    lat_max_us: f64,
}

/// `events` outputs `gap` apart (0 events: the consumer alone for `gap`).
fn run(t: &Target, linger: bool, gap: Duration, events: u64) -> Row {
    let stop = AtomicBool::new(false);
    let t0 = Instant::now();
    let w0 = t.wakeups();
    let (prod, (cpu, lats)) = std::thread::scope(|s| {
        let cons = s.spawn(|| {
            let mut lats = Vec::with_capacity(events as usize);
            let cpu = t.consume(linger, &stop, |d: &[u8]| {
                let sent = u64::from_ne_bytes(d[..8].try_into().expect("8 bytes"));
                lats.push(t0.elapsed().as_nanos() as u64 - sent);
            });
            (cpu, lats)
        });
        // Let the consumer start and go idle (deep sleep).
        std::thread::sleep(Duration::from_millis(50));
        let start = Instant::now();
        let (mut in_calls, mut sent) = (Duration::ZERO, 0u64);
        let mut buf = [0x55u8; EVENT];
        if events == 0 {
            std::thread::sleep(gap);
        }
        for i in 0..events {
            let due = start + gap * i as u32;
            while Instant::now() < due {
                std::hint::spin_loop();
            }
            let c0 = Instant::now();
            buf[..8].copy_from_slice(&(t0.elapsed().as_nanos() as u64).to_ne_bytes());
            sent += t.output(&buf) as u64;
            in_calls += c0.elapsed();
        }
        let wall = start.elapsed();
        std::thread::sleep(Duration::from_millis(50));
        stop.store(true, Ordering::Release);
        ((in_calls, sent, wall), cons.join().expect("consumer"))
    });
    let (in_calls, sent, wall) = prod;
    let mut lats = lats;
    lats.sort_unstable();
    let received = lats.len() as u64;
    let pace = if events == 0 {
        format!("idle {:.0} s, no event", gap.as_secs_f64())
    } else if gap >= Duration::from_millis(1) {
        format!("1 every {} ms", gap.as_millis())
    } else {
        format!("1 every {} µs", gap.as_micros())
    };
    Row {
        pace,
        events,
        sent,
        received,
        producer_ns: if sent > 0 { in_calls.as_nanos() as f64 / events as f64 } else { 0.0 },
        wakes: t.wakeups() - w0,
        consumer_cpu: 100.0 * cpu.as_secs_f64() / (wall + Duration::from_millis(100)).as_secs_f64(),
        lat_median_us: lats.get(lats.len() / 2).map_or(0.0, |&n| n as f64 / 1e3),
        lat_max_us: lats.last().map_or(0.0, |&n| n as f64 / 1e3),
    }
}

fn main() {
    let load0 = loadavg();
    let dir = PathBuf::from(if std::path::Path::new("/dev/shm").is_dir() { "/dev/shm" } else { "/tmp" })
        .join(format!("userbpf-wakeup-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("bench directory");
    let perf_spec = MapSpec {
        map_type: MapType::BPF_MAP_TYPE_PERF_EVENT_ARRAY,
        key_size: 4,
        value_size: 4,
        max_entries: 1,
        map_flags: 0,
        map_extra: 0,
        name: "events".into(),
    };
    let ring_spec = MapSpec {
        map_type: MapType::BPF_MAP_TYPE_RINGBUF,
        key_size: 0,
        value_size: 0,
        max_entries: 64 * 1024,
        map_flags: 0,
        map_extra: 0,
        name: "rb".into(),
    };
    let paces: [(Duration, u64); 5] = [
        (Duration::from_micros(10), 100_000),
        (Duration::from_micros(100), 10_000),
        (Duration::from_millis(5), 200),
        (Duration::from_millis(100), 20),
        (Duration::from_secs(1), 0),
    ];
    println!("## Wake-ups: a producer's output with a consumer attached");
    println!();
    println!(
        "{EVENT}-byte events from one producer thread at a steady pace, one consumer thread in `poll`; \
         \"lingering\": the consumer's default, \"futex at once\": `set_linger(false)`, how every consumer slept before. \
         Producer ns: per output call, futex wake-ups included."
    );
    println!();
    println!(
        "| map | consumer | pace | events received / sent | producer ns per event | FUTEX_WAKE per event | consumer CPU | delivery latency median µs | delivery latency max µs |"
    );
    println!("|---|---|---|---:|---:|---:|---:|---:|---:|");
    for kind in ["perf buffer", "ring buffer"] {
        for linger in [false, true] {
            for &(gap, events) in &paces {
                let path = dir.join(format!("{}-{linger}-{}", kind.replace(' ', "-"), gap.as_micros()));
                let t = if kind == "perf buffer" {
                    Target::Perf(PerfEventArray::create_with_pages(&path, &perf_spec, 8).expect("perf event array"))
                } else {
                    Target::Ring(RingBuf::create(&path, &ring_spec).expect("ring buffer"))
                };
                let r = run(&t, linger, gap, events);
                let per = |x: u64| {
                    if r.events > 0 { format!("{:.3}", x as f64 / r.events as f64) } else { "–".into() }
                };
                println!(
                    "| {kind} | {} | {} | {} / {} | {} | {} | {:.2}% | {} |",
                    if linger { "lingering" } else { "futex at once" },
                    r.pace,
                    r.received,
                    r.sent,
                    if r.events > 0 { format!("{:.0}", r.producer_ns) } else { "–".into() },
                    per(r.wakes),
                    r.consumer_cpu,
                    if r.received > 0 {
                        format!("{:.0} | {:.0}", r.lat_median_us, r.lat_max_us)
                    } else {
                        "– | –".into()
                    },
                );
                let _ = std::fs::remove_file(&path);
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    println!();
    println!("Load average {load0} at the start, {} at the end.", loadavg());
}
