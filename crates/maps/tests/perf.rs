//! BPF_MAP_TYPE_PERF_EVENT_ARRAY: perf ring layout, exact record bytes, lost records,
//! several writers in several processes, wakeups.

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use userbpf_testutil::TmpDir;

use userbpf_maps::perf::{
    BPF_F_CURRENT_CPU, PERF_MMAP_DATA_HEAD, PERF_MMAP_DATA_OFFSET, PERF_MMAP_DATA_SIZE, PERF_MMAP_DATA_TAIL,
    PerfConsumer, PerfEvent, PerfEventArray,
};
use userbpf_maps::shm::possible_cpus;
use userbpf_maps::{MapError, MapSpec, MapType};

const PAGE: u64 = 4096;

/// A directory of its own for one test, in shared memory when the machine has /dev/shm.
fn test_dir(name: &str) -> TmpDir {
    let root = if Path::new("/dev/shm").is_dir() { PathBuf::from("/dev/shm") } else { std::env::temp_dir() };
    TmpDir::new_in(&root, &format!("perftest-{name}"))
}

fn spec(max_entries: u32) -> MapSpec {
    MapSpec {
        map_type: MapType::BPF_MAP_TYPE_PERF_EVENT_ARRAY,
        key_size: 4,
        value_size: 4,
        max_entries,
        map_flags: 0,
        map_extra: 0,
        name: "perf_events".into(),
    }
}

fn out(pa: &PerfEventArray, flags: u64, cpu: u32, data: &[u8]) -> Result<(), MapError> {
    // SAFETY: `data` is a live slice.
    unsafe { pa.output(flags, cpu, data.as_ptr(), data.len() as u64) }
}

fn read_at(path: &Path, off: u64, len: usize) -> Vec<u8> {
    let mut b = vec![0u8; len];
    std::fs::File::open(path).unwrap().read_exact_at(&mut b, off).unwrap();
    b
}

fn read_u64(path: &Path, off: u64) -> u64 {
    u64::from_ne_bytes(read_at(path, off, 8).try_into().unwrap())
}

fn poke(path: &Path, off: u64, bytes: &[u8]) {
    std::fs::OpenOptions::new().write(true).open(path).unwrap().write_all_at(bytes, off).unwrap();
}

#[derive(Debug, PartialEq, Eq)]
enum Ev {
    Sample(u32, Vec<u8>),
    Lost(u32, u64),
}

fn collect(c: &mut PerfConsumer) -> Vec<Ev> {
    let mut v = Vec::new();
    c.consume(|e| {
        v.push(match e {
            PerfEvent::Sample { cpu, data } => Ev::Sample(cpu, data.to_vec()),
            PerfEvent::Lost { cpu, lost } => Ev::Lost(cpu, lost),
        })
    })
    .unwrap();
    v
}

/// The raw data as the consumer sees it: padded with zeros so that 4 + len is a multiple of 8.
fn padded(data: &[u8]) -> Vec<u8> {
    let mut v = data.to_vec();
    while !(v.len() + 4).is_multiple_of(8) {
        v.push(0);
    }
    v
}

#[test]
fn create_checks_spec() {
    let d = test_dir("create");
    let einval = |s: MapSpec, pages: u32, f: &str| {
        let e = PerfEventArray::create_with_pages(&d.path(f), &s, pages).unwrap_err();
        assert_eq!(e.errno(), libc::EINVAL, "{s:?} {pages}");
    };
    einval(MapSpec { key_size: 8, ..spec(4) }, 8, "a");
    einval(MapSpec { value_size: 8, ..spec(4) }, 8, "b");
    einval(MapSpec { map_flags: userbpf_maps::BPF_F_MMAPABLE, ..spec(4) }, 8, "c");
    einval(MapSpec { map_flags: userbpf_maps::BPF_F_RDONLY_PROG, ..spec(4) }, 8, "d");
    einval(MapSpec { map_type: MapType::BPF_MAP_TYPE_RINGBUF, ..spec(4) }, 8, "e");
    einval(spec(4), 3, "f");
    einval(spec(4), 0, "g");
    assert_eq!(PerfEventArray::create_with_pages(&d.path("h"), &spec(u32::MAX), 8).unwrap_err().errno(), libc::E2BIG);

    let pa = PerfEventArray::create(&d.path("cpus"), &spec(0)).unwrap();
    assert_eq!(pa.max_entries(), possible_cpus());
    assert_eq!(pa.spec().max_entries, possible_cpus());
    assert_eq!(pa.data_pages(), 8);
    let pa = PerfEventArray::create_with_pages(
        &d.path("two"),
        &MapSpec { map_flags: userbpf_maps::BPF_F_PRESERVE_ELEMS, ..spec(2) },
        1,
    )
    .unwrap();
    assert_eq!(pa.ring_file_range(0), Some((2 * PAGE, 2 * PAGE)));
    assert_eq!(pa.ring_file_range(1), Some((4 * PAGE, 2 * PAGE)));
    assert_eq!(pa.ring_file_range(2), None);
    assert_eq!(std::fs::metadata(d.path("two")).unwrap().len(), 6 * PAGE);
    assert_eq!(PerfEventArray::open(&d.path("cpus")).unwrap().max_entries(), possible_cpus());
    assert_eq!(PerfEventArray::create(&d.path("two"), &spec(2)).unwrap_err().errno(), libc::EEXIST);
}

#[test]
fn open_rejects_bad_files() {
    let d = test_dir("open");
    assert_eq!(PerfEventArray::open(&d.path("missing")).unwrap_err().errno(), libc::ENOENT);
    std::fs::write(d.path("junk"), vec![0x5au8; 8 * 4096]).unwrap();
    assert_eq!(PerfEventArray::open(&d.path("junk")).unwrap_err().errno(), libc::EINVAL);
    std::fs::write(d.path("tiny"), b"x").unwrap();
    assert!(PerfEventArray::open(&d.path("tiny")).is_err());
    let p = d.path("pa");
    drop(PerfEventArray::create_with_pages(&p, &spec(3), 2).unwrap());
    assert!(PerfEventArray::open(&p).is_ok());
    let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
    let len = f.metadata().unwrap().len();
    f.set_len(len - PAGE).unwrap();
    assert_eq!(PerfEventArray::open(&p).unwrap_err().errno(), libc::EINVAL, "truncated");
    f.set_len(len).unwrap();
    assert!(PerfEventArray::open(&p).is_ok());
    poke(&p, 24, &4u32.to_ne_bytes()); // max_entries in the header
    assert_eq!(PerfEventArray::open(&p).unwrap_err().errno(), libc::EINVAL);
    poke(&p, 24, &3u32.to_ne_bytes());
    poke(&p, 140, &3u32.to_ne_bytes()); // data pages: not a power of 2
    assert_eq!(PerfEventArray::open(&p).unwrap_err().errno(), libc::EINVAL);
    poke(&p, 140, &4u32.to_ne_bytes()); // a power of 2, but not the file's
    assert_eq!(PerfEventArray::open(&p).unwrap_err().errno(), libc::EINVAL);
    // A ring buffer file is not a perf event array.
    let rb = d.path("rb");
    drop(
        userbpf_maps::ringbuf::RingBuf::create(
            &rb,
            &MapSpec {
                map_type: MapType::BPF_MAP_TYPE_RINGBUF,
                key_size: 0,
                value_size: 0,
                max_entries: 4096,
                ..spec(0)
            },
        )
        .unwrap(),
    );
    assert_eq!(PerfEventArray::open(&rb).unwrap_err().errno(), libc::EINVAL);
}

#[test]
fn ring_pages_and_record_bytes_are_the_kernels() {
    let d = test_dir("bytes");
    let p = d.path("pa");
    let pa = PerfEventArray::create_with_pages(&p, &spec(2), 2).unwrap();
    let (ring1, len) = pa.ring_file_range(1).unwrap();
    assert_eq!(len, 3 * PAGE);
    // The perf_event_mmap_page as perf_event_init_userpage leaves it.
    assert_eq!(read_u64(&p, ring1 + 40), 2, "cap_bit0_is_deprecated");
    assert_eq!(read_at(&p, ring1 + 72, 4), 96u32.to_ne_bytes(), "size = offsetof(__reserved)");
    assert_eq!(read_u64(&p, ring1 + PERF_MMAP_DATA_OFFSET as u64), PAGE);
    assert_eq!(read_u64(&p, ring1 + PERF_MMAP_DATA_SIZE as u64), 2 * PAGE);
    assert_eq!(read_u64(&p, ring1 + PERF_MMAP_DATA_HEAD as u64), 0);

    out(&pa, 1, 0, b"hello").unwrap();
    let want: Vec<u8> = [
        &9u32.to_ne_bytes()[..],  // PERF_RECORD_SAMPLE
        &2u16.to_ne_bytes()[..],  // misc: PERF_RECORD_MISC_USER
        &24u16.to_ne_bytes()[..], // size
        &12u32.to_ne_bytes()[..], // raw size: 4 + 12 = 16
        b"hello",
        &[0u8; 7],
    ]
    .concat();
    assert_eq!(read_at(&p, ring1 + PAGE, 24), want);
    assert_eq!(read_u64(&p, ring1 + PERF_MMAP_DATA_HEAD as u64), 24);
    // Exact multiple: 4 + 4 = 8, no padding; empty: raw size 4 of zeros.
    out(&pa, 1, 0, b"abcd").unwrap();
    out(&pa, 1, 0, b"").unwrap();
    let want2: Vec<u8> = [
        &9u32.to_ne_bytes()[..],
        &2u16.to_ne_bytes()[..],
        &16u16.to_ne_bytes()[..],
        &4u32.to_ne_bytes()[..],
        b"abcd",
        &9u32.to_ne_bytes()[..],
        &2u16.to_ne_bytes()[..],
        &16u16.to_ne_bytes()[..],
        &4u32.to_ne_bytes()[..],
        &[0u8; 4],
    ]
    .concat();
    assert_eq!(read_at(&p, ring1 + PAGE + 24, 32), want2);
    assert_eq!(read_u64(&p, ring1 + PERF_MMAP_DATA_HEAD as u64), 56);
    // Ring 0 untouched.
    assert_eq!(read_u64(&p, pa.ring_file_range(0).unwrap().0 + PERF_MMAP_DATA_HEAD as u64), 0);

    let mut c = PerfConsumer::new(&pa).unwrap();
    assert_eq!(
        collect(&mut c),
        vec![Ev::Sample(1, padded(b"hello")), Ev::Sample(1, b"abcd".to_vec()), Ev::Sample(1, vec![0; 4])]
    );
    assert_eq!(read_u64(&p, ring1 + PERF_MMAP_DATA_TAIL as u64), 56, "data_tail written back");
}

#[test]
fn output_errors_like_the_kernel() {
    let d = test_dir("errors");
    let pa = PerfEventArray::create_with_pages(&d.path("pa"), &spec(4), 1).unwrap();
    assert_eq!(out(&pa, 1 << 32, 0, b"x").unwrap_err().errno(), libc::EINVAL);
    assert_eq!(out(&pa, 4, 0, b"x").unwrap_err().errno(), libc::E2BIG);
    assert_eq!(out(&pa, BPF_F_CURRENT_CPU, 4, b"x").unwrap_err().errno(), libc::E2BIG);
    out(&pa, BPF_F_CURRENT_CPU, 3, b"on cpu 3").unwrap();
    pa.detach(2).unwrap();
    assert!(!pa.is_attached(2));
    assert_eq!(out(&pa, 2, 0, b"x").unwrap_err().errno(), libc::ENOENT);
    assert_eq!(out(&pa, BPF_F_CURRENT_CPU, 2, b"x").unwrap_err().errno(), libc::ENOENT);
    pa.attach(2).unwrap();
    out(&pa, 2, 0, b"back").unwrap();
    assert_eq!(pa.detach(4).unwrap_err().errno(), libc::E2BIG);
    // Larger than a perf record can describe (16-bit size).
    let big = vec![0u8; 70000];
    assert_eq!(out(&pa, 0, 0, &big).unwrap_err().errno(), libc::E2BIG);
    // Larger than the ring: lost.
    assert_eq!(out(&pa, 0, 0, &big[..5000]).unwrap_err().errno(), libc::ENOSPC);
    assert_eq!(pa.lost_total(0), 1);
    let mut c = PerfConsumer::new(&pa).unwrap();
    assert_eq!(collect(&mut c), vec![Ev::Sample(2, padded(b"back")), Ev::Sample(3, padded(b"on cpu 3"))]);
}

#[test]
fn lost_records_when_full() {
    let d = test_dir("lost");
    let pa = PerfEventArray::create_with_pages(&d.path("pa"), &spec(1), 1).unwrap();
    let mut c = PerfConsumer::new(&pa).unwrap();
    let sample = [0x11u8; 100]; // record: 8 + 4 + 100 -> 112 bytes
    let mut written = 0;
    while out(&pa, 0, 0, &sample).is_ok() {
        written += 1;
    }
    assert_eq!(written, 4095 / 112);
    for _ in 0..4 {
        assert_eq!(out(&pa, 0, 0, &sample).unwrap_err().errno(), libc::ENOSPC);
    }
    assert_eq!(pa.lost_total(0), 5);
    let evs = collect(&mut c);
    assert_eq!(evs.len(), written);
    assert!(evs.iter().all(|e| *e == Ev::Sample(0, sample.to_vec())));
    // The next sample is preceded by the count of lost ones.
    out(&pa, 0, 0, b"after").unwrap();
    out(&pa, 0, 0, b"again").unwrap();
    assert_eq!(collect(&mut c), vec![Ev::Lost(0, 5), Ev::Sample(0, padded(b"after")), Ev::Sample(0, padded(b"again"))]);
    // The LOST record's exact bytes: header {2, 0, 24}, id (the index), lost.
    let p = d.path("pa");
    let (ring, _) = pa.ring_file_range(0).unwrap();
    let pos = (written as u64 * 112) % PAGE;
    let mut want = Vec::new();
    want.extend_from_slice(&2u32.to_ne_bytes());
    want.extend_from_slice(&0u16.to_ne_bytes());
    want.extend_from_slice(&24u16.to_ne_bytes());
    want.extend_from_slice(&0u64.to_ne_bytes());
    want.extend_from_slice(&5u64.to_ne_bytes());
    assert_eq!(read_at(&p, ring + PAGE + pos, 24), want);
    // Room for a sample but not for LOST + sample: both are lost. Ring: head = tail = 4032 + 3 × 24.
    assert_eq!(read_u64(&p, ring + PERF_MMAP_DATA_HEAD as u64), 4104);
    for _ in 0..36 {
        out(&pa, 0, 0, &sample).unwrap(); // 36 × 112 = 4032: 63 bytes left
    }
    out(&pa, 0, 0, &[0x22u8; 40]).unwrap(); // 56 bytes: 7 left
    assert_eq!(out(&pa, 0, 0, &sample).unwrap_err().errno(), libc::ENOSPC);
    // "Consume" one record by hand: 7 + 112 = 119 bytes free, < 24 + 112.
    poke(&p, ring + PERF_MMAP_DATA_TAIL as u64, &(4104u64 + 112).to_ne_bytes());
    assert_eq!(out(&pa, 0, 0, &sample).unwrap_err().errno(), libc::ENOSPC);
    assert_eq!(pa.lost_total(0), 7);
    let evs = collect(&mut c);
    assert_eq!(evs.len(), 36);
    assert_eq!(evs[35], Ev::Sample(0, padded(&[0x22u8; 40])));
    out(&pa, 0, 0, b"x").unwrap();
    assert_eq!(collect(&mut c), vec![Ev::Lost(0, 2), Ev::Sample(0, padded(b"x"))]);
}

#[test]
fn wraparound_records_arrive_whole() {
    let d = test_dir("wrap");
    let pa = PerfEventArray::create_with_pages(&d.path("pa"), &spec(2), 1).unwrap();
    let mut c = PerfConsumer::new(&pa).unwrap();
    let mut expected = Vec::new();
    for i in 0..3000u32 {
        let len = (i as usize * 53) % 900;
        let data: Vec<u8> = (0..len).map(|k| (k as u32 * 3 + i) as u8).collect();
        out(&pa, (i % 2) as u64, 0, &data).unwrap();
        expected.push(Ev::Sample(i % 2, padded(&data)));
        if i % 3 == 2 || i % 7 == 0 {
            // The consumer reads ring 0, then ring 1.
            expected.sort_by_key(|e| match e {
                Ev::Sample(cpu, _) | Ev::Lost(cpu, _) => *cpu,
            });
            assert_eq!(collect(&mut c), std::mem::take(&mut expected), "after record {i}");
        }
    }
    assert_eq!(pa.lost_total(0) + pa.lost_total(1), 0);
}

fn record(producer: u32, seq: u32) -> Vec<u8> {
    let mut v = Vec::new();
    v.extend_from_slice(&producer.to_ne_bytes());
    v.extend_from_slice(&seq.to_ne_bytes());
    v.extend(std::iter::repeat_n(seq as u8, (seq % 37) as usize));
    v
}

fn produce(pa: &PerfEventArray, index: u64, producer: u32, n: u32) {
    let start = Instant::now();
    for seq in 0..n {
        let r = record(producer, seq);
        while let Err(e) = out(pa, index, 0, &r) {
            assert!(e.errno() == libc::ENOSPC || e.errno() == libc::EBUSY, "{e}");
            if start.elapsed() > Duration::from_secs(120) {
                return;
            }
            std::thread::yield_now();
        }
    }
}

/// Consumes until every producer's n records arrived; checks order and exactly-once.
fn consume_all(c: &mut PerfConsumer, producers: usize, n: u32) {
    let mut next = vec![0u32; producers];
    let mut done = 0;
    let start = Instant::now();
    while done < producers * n as usize {
        assert!(start.elapsed() < Duration::from_secs(120), "stuck: {next:?}");
        c.poll(Duration::from_millis(500), |e| match e {
            PerfEvent::Sample { data, .. } => {
                let p = u32::from_ne_bytes(data[0..4].try_into().unwrap()) as usize;
                let seq = u32::from_ne_bytes(data[4..8].try_into().unwrap());
                assert_eq!(seq, next[p], "producer {p}");
                assert_eq!(data, &padded(&record(p as u32, seq))[..]);
                next[p] += 1;
                done += 1;
            }
            PerfEvent::Lost { .. } => {} // writers retry: a lost sample is resent
        })
        .unwrap();
    }
    assert!(next.iter().all(|&x| x == n));
}

#[test]
fn several_writers_on_one_ring_and_across_rings() {
    const N: u32 = 20_000;
    let d = test_dir("threads");
    let pa = PerfEventArray::create_with_pages(&d.path("pa"), &spec(2), 2).unwrap();
    let mut c = PerfConsumer::new(&pa).unwrap();
    // Producers 0, 1, 2 share ring 0 ("the same CPU"); producer 3 writes ring 1.
    let ws: Vec<_> = (0..4u32)
        .map(|t| {
            let pa = pa.clone();
            std::thread::spawn(move || produce(&pa, if t == 3 { 1 } else { 0 }, t, N))
        })
        .collect();
    consume_all(&mut c, 4, N);
    for w in ws {
        w.join().unwrap();
    }
}

#[test]
fn writer_in_another_process() {
    const N: u32 = 20_000;
    let d = test_dir("fork");
    let path = d.path("pa");
    let pa = PerfEventArray::create_with_pages(&path, &spec(2), 2).unwrap();
    let cpath = path.clone();
    // SAFETY: the child opens the map, writes and leaves with _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        let code = match PerfEventArray::open(&cpath) {
            Ok(child) => {
                std::thread::sleep(Duration::from_millis(50));
                produce(&child, 0, 1, N);
                0
            }
            Err(_) => 1,
        };
        // SAFETY: ends the child immediately.
        unsafe { libc::_exit(code) };
    }
    let w = {
        let pa = pa.clone();
        std::thread::spawn(move || produce(&pa, 0, 0, N))
    };
    let mut c = PerfConsumer::open(&path).unwrap();
    assert_eq!(PerfConsumer::new(&pa).err().unwrap().errno(), libc::EBUSY, "one consumer at a time");
    consume_all(&mut c, 2, N);
    w.join().unwrap();
    let mut status = 0;
    // SAFETY: waiting for our own child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "child status {status:#x}");
}

#[test]
fn blocked_consumer_wakes_on_output() {
    let d = test_dir("wake");
    let pa = PerfEventArray::create_with_pages(&d.path("pa"), &spec(4), 1).unwrap();
    let mut c = PerfConsumer::new(&pa).unwrap();
    for i in 0..100u32 {
        out(&pa, (i % 4) as u64, 0, &i.to_ne_bytes()).unwrap();
        collect(&mut c);
    }
    assert_eq!(pa.wakeups(), 0, "no consumer waiting: no system call");
    assert_eq!(c.poll(Duration::from_millis(50), |_| {}).unwrap(), 0, "timeout");

    let waiting = Arc::new(AtomicBool::new(false));
    let t = {
        let w = waiting.clone();
        std::thread::spawn(move || {
            w.store(true, Ordering::SeqCst);
            let start = Instant::now();
            let mut got = Vec::new();
            let n = c
                .poll(Duration::from_secs(20), |e| {
                    if let PerfEvent::Sample { cpu, data } = e {
                        got.push((cpu, data.to_vec()))
                    }
                })
                .unwrap();
            (n, got, start.elapsed())
        })
    };
    while !waiting.load(Ordering::SeqCst) {
        std::thread::yield_now();
    }
    std::thread::sleep(Duration::from_millis(200));
    let before = Instant::now();
    out(&pa, 3, 0, b"ring 3!").unwrap();
    let (n, got, elapsed) = t.join().unwrap();
    assert_eq!(n, 1);
    assert_eq!(got, vec![(3, padded(b"ring 3!"))]);
    assert!(elapsed >= Duration::from_millis(150));
    assert!(before.elapsed() < Duration::from_secs(5));
    assert_eq!(pa.wakeups(), 1);
}

/// A stream of outputs to a consumer in `poll`, each written once the consumer has the one
/// before: the consumer lingers between them (records keep coming), so writers make no
/// FUTEX_WAKE call but the first (the consumer starts idle, asleep on the futex). A consumer
/// that sleeps on the futex whenever it finds nothing (`set_linger(false)`, how every
/// consumer slept before) made one for most outputs here (1,260 of 2,000). The bound leaves
/// room for a machine so busy that a thread waits 20 ms for a CPU now and then.
#[test]
fn a_steady_stream_makes_no_wakeups() {
    const N: u64 = 2000;
    let d = test_dir("stream");
    let pa = PerfEventArray::create_with_pages(&d.path("pa"), &spec(2), 1).unwrap();
    let mut c = PerfConsumer::new(&pa).unwrap();
    let got = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let t = {
        let got = got.clone();
        std::thread::spawn(move || {
            let mut seen = Vec::new();
            while got.load(Ordering::SeqCst) < N {
                c.poll(Duration::from_secs(20), |e| {
                    if let PerfEvent::Sample { data, .. } = e {
                        seen.push(u64::from_ne_bytes(data[..8].try_into().unwrap()));
                        got.fetch_add(1, Ordering::SeqCst);
                    }
                })
                .unwrap();
            }
            seen
        })
    };
    for i in 0..N {
        out(&pa, i % 2, 0, &i.to_ne_bytes()).unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        while got.load(Ordering::SeqCst) <= i {
            assert!(Instant::now() < deadline, "event {i} never arrived");
            std::thread::yield_now();
        }
    }
    assert_eq!(t.join().unwrap(), (0..N).collect::<Vec<_>>());
    assert!(pa.wakeups() <= N / 20, "{} FUTEX_WAKE calls for {N} outputs", pa.wakeups());
}

/// The wakeup handshake under a race on every record: a consumer that sleeps deep whenever it
/// finds nothing (`set_linger(false)`) and writers in two threads that each output a record as
/// soon as the consumer has taken the one before, so each output meets the consumer on its way
/// to sleep. Writers publish with no fence of their own (the sleeping consumer's system-wide
/// barrier covers them, see `userbpf_maps::linger`): a record published unseen would wait for
/// the next one, and the last one forever. Without the consumer's barrier, 2 of 5 runs of 400
/// records missed one.
#[test]
fn a_consumer_going_to_sleep_never_misses_a_record() {
    const N: u64 = 1000;
    let d = test_dir("race");
    let pa = PerfEventArray::create_with_pages(&d.path("pa"), &spec(2), 1).unwrap();
    let mut c = PerfConsumer::new(&pa).unwrap();
    c.set_linger(false);
    let got = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let t = {
        let got = got.clone();
        std::thread::spawn(move || {
            let mut seen = Vec::new();
            while got.load(Ordering::SeqCst) < N {
                let n = c
                    .poll(Duration::from_secs(30), |e| {
                        if let PerfEvent::Sample { data, .. } = e {
                            seen.push(u64::from_ne_bytes(data[..8].try_into().unwrap()));
                            got.fetch_add(1, Ordering::SeqCst);
                        }
                    })
                    .unwrap();
                // The writer of the next record waits for this poll: nothing in 30 s is a
                // record the consumer slept on.
                assert!(n > 0, "record {} was written and never woke the consumer", got.load(Ordering::SeqCst));
            }
            seen
        })
    };
    let writers: Vec<_> = (0..2u64)
        .map(|w| {
            let (pa, got) = (pa.clone(), got.clone());
            std::thread::spawn(move || {
                for i in (w..N).step_by(2) {
                    while got.load(Ordering::SeqCst) < i {
                        std::hint::spin_loop();
                    }
                    out(&pa, w, 0, &i.to_ne_bytes()).unwrap();
                }
            })
        })
        .collect();
    // The consumer first: if it failed, the writers wait for it forever.
    let mut seen = t.join().unwrap();
    for w in writers {
        w.join().unwrap();
    }
    seen.sort();
    assert_eq!(seen, (0..N).collect::<Vec<_>>());
}

#[test]
fn corrupt_rings_are_errors_not_crashes() {
    let d = test_dir("corrupt");
    let p = d.path("pa");
    let pa = PerfEventArray::create_with_pages(&p, &spec(2), 1).unwrap();
    let mut c = PerfConsumer::new(&pa).unwrap();
    let (r0, _) = pa.ring_file_range(0).unwrap();
    let (r1, _) = pa.ring_file_range(1).unwrap();
    out(&pa, 0, 0, b"fine").unwrap();
    out(&pa, 1, 0, b"0123456789").unwrap();
    // Record size on ring 1 larger than what was written.
    poke(&p, r1 + PAGE + 6, &4000u16.to_ne_bytes());
    let mut seen = Vec::new();
    let e = c.consume(|e| seen.push(format!("{e:?}"))).unwrap_err();
    assert_eq!(e.errno(), libc::EINVAL);
    assert_eq!(seen.len(), 1, "ring 0 still read: {seen:?}");
    // The bad ring was reset to empty; it works again.
    assert_eq!(collect(&mut c), vec![]);
    out(&pa, 1, 0, b"ok").unwrap();
    assert_eq!(collect(&mut c), vec![Ev::Sample(1, padded(b"ok"))]);
    // Zero size (would loop forever if trusted), raw size beyond the record, odd sizes.
    for (off, bytes) in
        [(6u64, &0u16.to_ne_bytes()[..]), (8, &1000u32.to_ne_bytes()[..]), (6, &13u16.to_ne_bytes()[..])]
    {
        out(&pa, 0, 0, b"abcdefgh").unwrap();
        let head = read_u64(&p, r0 + PERF_MMAP_DATA_HEAD as u64);
        let at = r0 + PAGE + (head - 24) % PAGE;
        poke(&p, at + off, bytes);
        assert_eq!(c.consume(|_| {}).unwrap_err().errno(), libc::EINVAL);
    }
    // A data_head far ahead of data_tail; a data_tail past data_head.
    poke(&p, r0 + PERF_MMAP_DATA_HEAD as u64, &(1u64 << 40).to_ne_bytes());
    assert_eq!(c.consume(|_| {}).unwrap_err().errno(), libc::EINVAL);
    poke(&p, r0 + PERF_MMAP_DATA_TAIL as u64, &(3u64 << 40).to_ne_bytes());
    assert_eq!(c.poll(Duration::from_millis(10), |_| {}).unwrap_err().errno(), libc::EINVAL);
    // Writers survive a garbage data_tail too.
    poke(&p, r0 + PERF_MMAP_DATA_TAIL as u64, &12345u64.to_ne_bytes());
    for _ in 0..50 {
        let _ = out(&pa, 0, 0, &[1u8; 200]);
    }
    let _ = c.consume(|_| {});
}

#[test]
fn writers_recover_from_a_dead_lock_holder() {
    let d = test_dir("dead");
    let p = d.path("pa");
    let pa = PerfEventArray::create_with_pages(&p, &spec(2), 1).unwrap();
    // SAFETY: the child exits at once; we reap it.
    let dead = unsafe {
        let pid = libc::fork();
        assert!(pid >= 0);
        if pid == 0 {
            libc::_exit(0);
        }
        let mut status = 0;
        assert_eq!(libc::waitpid(pid, &mut status, 0), pid);
        pid as u32
    };
    // Ring 1's control slot: page 1, 64 bytes per ring, lock word first.
    poke(&p, PAGE + 64, &dead.to_ne_bytes());
    out(&pa, 1, 0, b"still works").unwrap();
    let mut c = PerfConsumer::new(&pa).unwrap();
    assert_eq!(collect(&mut c), vec![Ev::Sample(1, padded(b"still works"))]);
}

#[test]
fn rings_are_resized_to_the_loaders_mmap_and_emptied() {
    let d = test_dir("resize");
    let p = d.path("pa");
    let pa = PerfEventArray::create(&p, &spec(2)).unwrap();
    assert_eq!(pa.data_pages(), 8);
    assert_eq!(pa.max_data_pages(), userbpf_maps::perf::MAX_PERF_DATA_PAGES);
    let (off0, len0) = pa.ring_file_range(0).unwrap();
    assert_eq!(len0, 9 * PAGE);
    out(&pa, 0, 0, b"old").unwrap();
    // A loader mmapped its event with 1 + 64 pages: ring 0 becomes that, empty, with the id.
    assert_eq!(pa.configure_ring(0, 64, 77).unwrap(), (off0, 65 * PAGE));
    assert_eq!(read_u64(&p, off0 + PERF_MMAP_DATA_SIZE as u64), 64 * PAGE);
    assert_eq!(read_u64(&p, off0 + PERF_MMAP_DATA_HEAD as u64), 0);
    assert_eq!(pa.ring_file_range(1).unwrap().1, 9 * PAGE, "other rings keep their size");
    // Another process's view of the same file sees the new size.
    let other = PerfEventArray::open(&p).unwrap();
    let big = vec![7u8; 40_000];
    out(&other, 0, 0, &big).unwrap(); // does not fit 8 pages, fits 64
    let mut c = PerfConsumer::new(&pa).unwrap();
    assert_eq!(collect(&mut c), vec![Ev::Sample(0, padded(&big))]);
    // Sizes that are not a power of 2 or beyond the slot are refused; 0 means no ring.
    assert_eq!(pa.configure_ring(0, 3, 0).unwrap_err().errno(), libc::EINVAL);
    assert_eq!(pa.configure_ring(0, 512, 0).unwrap_err().errno(), libc::EINVAL);
    assert_eq!(pa.configure_ring(5, 1, 0).unwrap_err().errno(), libc::E2BIG);
    pa.configure_ring(1, 0, 0).unwrap();
    assert_eq!(out(&pa, 1, 0, b"x").unwrap_err().errno(), libc::ENOSPC);
}

#[test]
fn a_ring_watcher_is_woken_by_that_ring_only() {
    let d = test_dir("ringwait");
    let pa = PerfEventArray::create(&d.path("pa"), &spec(2)).unwrap();
    let seq = pa.wake_word().load(Ordering::SeqCst);
    out(&pa, 0, 0, b"a").unwrap();
    assert_eq!(pa.wake_word().load(Ordering::SeqCst), seq, "nobody waits: no wakeup");
    assert!(pa.ring_has_data(0) && !pa.ring_has_data(1));
    pa.set_ring_waiting(1, true);
    out(&pa, 0, 0, b"b").unwrap();
    assert_eq!(pa.wake_word().load(Ordering::SeqCst), seq, "ring 0 is not watched");
    out(&pa, 1, 0, b"c").unwrap();
    assert_eq!(pa.wake_word().load(Ordering::SeqCst), seq + 1);
    out(&pa, 1, 0, b"d").unwrap();
    assert_eq!(pa.wake_word().load(Ordering::SeqCst), seq + 1, "the first writer took the word: one wake-up a wait");
    pa.set_ring_waiting(1, false);
    pa.wake_watchers();
    assert_eq!(pa.wake_word().load(Ordering::SeqCst), seq + 2);
}

/// `output_with` whose copy fails (a fault in the program's data): nothing is published, a
/// pending lost count stays pending, and the ring goes on as if the call had not been made,
/// in the in-place case and when the record wraps around the ring's end.
#[test]
fn a_failed_copy_publishes_nothing() {
    let d = test_dir("failcopy");
    let pa = PerfEventArray::create_with_pages(&d.path("pa"), &spec(1), 1).unwrap();
    let mut c = PerfConsumer::new(&pa).unwrap();
    let fail = |_: *mut u8, _: *const u8, _: usize| false;
    let sample = [0x33u8; 100]; // 112-byte records
    let head =
        |pa: &PerfEventArray| read_u64(&d.path("pa"), pa.ring_file_range(0).unwrap().0 + PERF_MMAP_DATA_HEAD as u64);
    // In place, nothing pending.
    let e = pa.output_with(0, 0, sample.as_ptr(), 100, fail).unwrap_err();
    assert_eq!(e.errno(), libc::EFAULT);
    assert_eq!(head(&pa), 0);
    out(&pa, 0, 0, b"first").unwrap();
    assert_eq!(collect(&mut c), vec![Ev::Sample(0, padded(b"first"))]);
    // Lose 2, drain: the failed output keeps the 2 pending for the next good one.
    while out(&pa, 0, 0, &sample).is_ok() {}
    assert_eq!(out(&pa, 0, 0, &sample).unwrap_err().errno(), libc::ENOSPC);
    let n = collect(&mut c).len();
    let h = head(&pa);
    assert_eq!(pa.output_with(0, 0, sample.as_ptr(), 100, fail).unwrap_err().errno(), libc::EFAULT);
    assert_eq!(head(&pa), h, "nothing published");
    out(&pa, 0, 0, b"second").unwrap();
    assert_eq!(collect(&mut c), vec![Ev::Lost(0, 2), Ev::Sample(0, padded(b"second"))]);
    assert!(n > 30);
    // A record that wraps: the copy fails on its second part.
    while (head(&pa) % PAGE) + 112 <= PAGE {
        out(&pa, 0, 0, &sample).unwrap();
        collect(&mut c);
    }
    let h = head(&pa);
    let mut calls = 0;
    let second_fails = |dst: *mut u8, src: *const u8, len: usize| {
        calls += 1;
        if calls == 1 {
            // SAFETY: the first part: `dst` is the ring's, `len` bytes of `sample`.
            unsafe { std::ptr::copy_nonoverlapping(src, dst, len) };
        }
        calls == 1
    };
    assert_eq!(pa.output_with(0, 0, sample.as_ptr(), 100, second_fails).unwrap_err().errno(), libc::EFAULT);
    assert_eq!(calls, 2, "the wrapped record is copied in two parts");
    assert_eq!(head(&pa), h, "nothing published");
    out(&pa, 0, 0, &sample).unwrap();
    assert_eq!(collect(&mut c), vec![Ev::Sample(0, sample.to_vec())]);
    assert_eq!(pa.lost_total(0), 2);
}
