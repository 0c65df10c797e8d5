//! `helper-bench`: nanoseconds per call of the helpers a probe hit of sslsniff calls on every
//! hit, called through the helper registry as JIT'd programs call them, each beside the
//! reference it is measured against:
//!
//! - `ktime_get_ns` beside `clock_gettime(CLOCK_MONOTONIC)` (what the helper was before the
//!   TSC clock, and what the vDSO costs), and beside a bare `lfence; rdtsc`;
//! - `get_current_comm` (16 bytes) and `get_current_uid_gid` beside `get_current_pid_tgid`
//!   (the cheapest cached helper);
//! - `probe_read_user` of 100 and 612 bytes (sslsniff's two buffers) beside `memcpy`;
//! - `perf_event_output` of 700 bytes (sslsniff's event) beside `PerfEventArray::output`
//!   called directly (the ring write alone), timed in batches that fit the ring, drained
//!   between batches.
//!
//! Rounds alternate between the rows; medians of 7 rounds. Load average printed before and
//! after: the machine is shared. It reports; it never fails on timing. Markdown tables (one
//! per helper, `make bench` draws them). For a before/after comparison, run the binary of
//! each build alternately (`make bench` runs this build's).

use std::sync::Arc;
use std::time::Instant;

use userbpf_maps::perf::{BPF_F_CURRENT_CPU, PerfConsumer};
use userbpf_maps::{Map, MapSpec, MapType};
use userbpf_runtime::helpers;

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

type Row<'a> = (&'a str, Box<dyn FnMut() -> u64 + 'a>);

/// ns per call of `f`, `n` calls.
fn time(n: u64, f: &mut dyn FnMut() -> u64) -> f64 {
    let mut acc = 0u64;
    let t0 = Instant::now();
    for _ in 0..n {
        acc = acc.wrapping_add(f());
    }
    let ns = t0.elapsed().as_nanos() as f64 / n as f64;
    std::hint::black_box(acc);
    ns
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Runs the rows of a group in alternating rounds; prints each median and its ratio to the
/// group's first row.
fn group(title: &str, n: u64, rows: &mut [Row<'_>]) {
    let mut samples = vec![Vec::new(); rows.len()];
    for (_, f) in rows.iter_mut() {
        time(n / 10, f.as_mut());
    }
    for _ in 0..7 {
        for (i, (_, f)) in rows.iter_mut().enumerate() {
            samples[i].push(time(n, f.as_mut()));
        }
    }
    let names: Vec<&str> = rows.iter().map(|(n, _)| *n).collect();
    table(title, &names, samples.into_iter().map(median).collect());
}

/// One Markdown table: a row per call, its median and its ratio to the first row.
fn table(title: &str, names: &[&str], meds: Vec<f64>) {
    println!("### {title}");
    println!();
    println!("| call | ns/call | / {} |", names[0]);
    println!("|---|---:|---:|");
    for (name, m) in names.iter().zip(&meds) {
        println!("| {name} | {m:.1} | {:.2}× |", m / meds[0]);
    }
    println!();
}

fn main() -> anyhow::Result<()> {
    println!("## Helpers of a probe hit: ns a call");
    println!();
    println!(
        "Called through the helper registry as JIT'd programs call them; medians of 7 rounds. Load average {}.",
        loadavg()
    );
    println!();
    let reg = helpers::registry();
    let h = |id: u32| reg.get(id).expect("helper").func;
    let (ktime, pid_tgid, uid_gid, comm, read_user, perf_output) = (h(5), h(14), h(15), h(16), h(112), h(25));
    // The TSC clock calibrates for its first 50 ms.
    let t0 = Instant::now();
    // Every helper call below gets the arguments the kernel's verifier would require:
    // buffers of ours with their sizes, a registered map.
    while t0.elapsed().as_millis() < 60 {
        // SAFETY: helper arguments as the verifier requires them (see main).
        unsafe { ktime(0, 0, 0, 0, 0) };
    }
    println!("TSC clock in use: {}.", helpers::time::tsc_in_use());
    println!();

    group(
        "bpf_ktime_get_ns",
        2_000_000,
        &mut [
            (
                "clock_gettime(CLOCK_MONOTONIC), the helper before",
                Box::new(|| helpers::time::clock_ns(libc::CLOCK_MONOTONIC)),
            ),
            // SAFETY: helper arguments as the verifier requires them (see main).
            ("ktime_get_ns helper", Box::new(|| unsafe { ktime(0, 0, 0, 0, 0) })),
            (
                "lfence; rdtsc",
                Box::new(|| {
                    // SAFETY: lfence and rdtsc have no memory effects.
                    unsafe {
                        core::arch::x86_64::_mm_lfence();
                        core::arch::x86_64::_rdtsc()
                    }
                }),
            ),
        ],
    );

    let mut buf = [0u8; 16];
    let b = buf.as_mut_ptr() as u64;
    group(
        "current task",
        2_000_000,
        &mut [
            // SAFETY: helper arguments as the verifier requires them (see main).
            ("get_current_pid_tgid helper", Box::new(|| unsafe { pid_tgid(0, 0, 0, 0, 0) })),
            // SAFETY: helper arguments as the verifier requires them (see main).
            ("get_current_uid_gid helper", Box::new(|| unsafe { uid_gid(0, 0, 0, 0, 0) })),
            // SAFETY: helper arguments as the verifier requires them (see main).
            ("get_current_comm helper (16 bytes)", Box::new(|| unsafe { comm(b, 16, 0, 0, 0) })),
        ],
    );

    let src = vec![7u8; 4096];
    let mut dst = vec![0u8; 4096];
    let (s, d) = (src.as_ptr() as u64, dst.as_mut_ptr() as u64);
    for size in [100u64, 612] {
        group(
            &format!("bpf_probe_read_user, {size} bytes"),
            2_000_000,
            &mut [
                (
                    "memcpy",
                    Box::new(|| {
                        // SAFETY: both buffers hold 4096 bytes.
                        unsafe { std::ptr::copy_nonoverlapping(s as *const u8, d as *mut u8, size as usize) };
                        std::hint::black_box(d)
                    }),
                ),
                // SAFETY: helper arguments as the verifier requires them (see main).
                ("probe_read_user helper", Box::new(|| unsafe { read_user(d, size, s, 0, 0) })),
            ],
        );
    }
    drop(dst);

    let dir = std::env::temp_dir().join(format!("userbpf-helper-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let spec = MapSpec {
        map_type: MapType::BPF_MAP_TYPE_PERF_EVENT_ARRAY,
        key_size: 4,
        value_size: 4,
        max_entries: 0,
        map_flags: 0,
        map_extra: 0,
        name: "events".into(),
    };
    let map = Arc::new(Map::create(&dir.join("events"), &spec)?);
    let Map::PerfEventArray(pa) = map.as_ref() else { anyhow::bail!("not a perf event array") };
    let pa = pa.clone();
    helpers::register_map(1, map.clone());
    // The ring (8 data pages) holds 46 of these records: outputs are timed in batches of 32
    // on an empty ring, which is drained, untimed, between batches (a consumer thread could
    // not keep up: the outputs would measure the full ring's lost-sample path).
    let event = vec![1u8; 700];
    let m = Arc::as_ptr(&map) as u64;
    let mut consumer = PerfConsumer::new(&pa)?;
    let e = event.as_ptr() as u64;
    let direct = || {
        // SAFETY: `event` holds 700 readable bytes.
        unsafe { pa.output(BPF_F_CURRENT_CPU, 0, e as *const u8, 700).is_ok() }
    };
    let helper = || {
        // SAFETY: a registered perf event array and 700 readable bytes, as the verifier requires.
        unsafe { perf_output(0, m, BPF_F_CURRENT_CPU, e, 700) == 0 }
    };
    let rows: [(&str, &dyn Fn() -> bool); 2] =
        [("PerfEventArray::output", &direct), ("perf_event_output helper", &helper)];
    let mut samples = vec![Vec::new(); rows.len()];
    let mut failed = 0u64;
    for _ in 0..7 {
        for (i, (_, f)) in rows.iter().enumerate() {
            let mut ns = 0u128;
            for _ in 0..4000 {
                consumer.consume(|_| {})?;
                let t0 = Instant::now();
                for _ in 0..32 {
                    failed += u64::from(!f());
                }
                ns += t0.elapsed().as_nanos();
            }
            samples[i].push(ns as f64 / (4000.0 * 32.0));
        }
    }
    let names: Vec<&str> = rows.iter().map(|(n, _)| *n).collect();
    table(
        "bpf_perf_event_output, 700 bytes (batches of 32 on an empty ring)",
        &names,
        samples.into_iter().map(median).collect(),
    );
    if failed > 0 {
        println!("{failed} outputs failed.");
        println!();
    }
    let _ = std::fs::remove_dir_all(&dir);
    println!("Load average {} at the end.", loadavg());
    Ok(())
}
