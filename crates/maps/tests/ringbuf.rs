//! BPF_MAP_TYPE_RINGBUF: layout, producer/consumer protocol, wakeups, several producers in
//! several processes.

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use userbpf_testutil::TmpDir;

use userbpf_maps::ringbuf::{RINGBUF_MAX_RECORD_SZ, RingBuf, RingBufConsumer};
use userbpf_maps::{
    BPF_RB_AVAIL_DATA, BPF_RB_CONS_POS, BPF_RB_FORCE_WAKEUP, BPF_RB_NO_WAKEUP, BPF_RB_PROD_POS, BPF_RB_RING_SIZE,
    BPF_RINGBUF_BUSY_BIT, BPF_RINGBUF_DISCARD_BIT, MapSpec, MapType,
};

const PAGE: u64 = 4096;

/// A directory removed at the end of the test.
/// A directory of its own for one test, in shared memory when the machine has /dev/shm.
fn test_dir(name: &str) -> TmpDir {
    let root = if Path::new("/dev/shm").is_dir() { PathBuf::from("/dev/shm") } else { std::env::temp_dir() };
    TmpDir::new_in(&root, &format!("ringbuftest-{name}"))
}

fn spec(max_entries: u32) -> MapSpec {
    MapSpec {
        map_type: MapType::BPF_MAP_TYPE_RINGBUF,
        key_size: 0,
        value_size: 0,
        max_entries,
        map_flags: 0,
        map_extra: 0,
        name: "events".into(),
    }
}

fn out(rb: &RingBuf, data: &[u8]) -> Result<(), userbpf_maps::MapError> {
    // SAFETY: `data` is a live slice of `data.len()` bytes.
    unsafe { rb.output(data.as_ptr(), data.len() as u64, 0) }
}

fn read_u64(path: &Path, off: u64) -> u64 {
    let f = std::fs::File::open(path).unwrap();
    let mut b = [0u8; 8];
    f.read_exact_at(&mut b, off).unwrap();
    u64::from_ne_bytes(b)
}

fn read_u32(path: &Path, off: u64) -> u32 {
    let f = std::fs::File::open(path).unwrap();
    let mut b = [0u8; 4];
    f.read_exact_at(&mut b, off).unwrap();
    u32::from_ne_bytes(b)
}

fn poke(path: &Path, off: u64, bytes: &[u8]) {
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.write_all_at(bytes, off).unwrap();
}

fn pattern(seed: u32, len: usize) -> Vec<u8> {
    (0..len).map(|i| (seed as usize * 31 + i * 7) as u8).collect()
}

#[test]
fn create_checks_spec_like_the_kernel() {
    let d = test_dir("create");
    let einval = |s: MapSpec, f: &str| {
        let e = RingBuf::create(&d.path(f), &s).unwrap_err();
        assert_eq!(e.errno(), libc::EINVAL, "{s:?}");
        assert!(!d.path(f).exists(), "no file left behind");
    };
    einval(MapSpec { key_size: 4, ..spec(4096) }, "a");
    einval(MapSpec { value_size: 4, ..spec(4096) }, "b");
    einval(spec(0), "c");
    einval(spec(4095), "d");
    einval(spec(3 * 4096), "e");
    einval(spec(2048), "f");
    einval(MapSpec { map_flags: userbpf_maps::BPF_F_MMAPABLE, ..spec(4096) }, "g");
    einval(MapSpec { map_type: MapType::BPF_MAP_TYPE_ARRAY, ..spec(4096) }, "h");
    let rb =
        RingBuf::create(&d.path("ok"), &MapSpec { map_flags: userbpf_maps::BPF_F_NUMA_NODE, ..spec(8192) }).unwrap();
    assert_eq!(rb.size(), 8192);
    assert_eq!(rb.spec().name, "events");
    assert_eq!(RingBuf::create(&d.path("ok"), &spec(4096)).unwrap_err().errno(), libc::EEXIST);
    let l = rb.file_layout();
    assert_eq!((l.header_off, l.consumer_off, l.producer_off, l.data_off), (0, PAGE, 2 * PAGE, 3 * PAGE));
    assert_eq!(l.data_size, 8192);
    assert_eq!(l.file_size, 3 * PAGE + 8192);
    assert_eq!(std::fs::metadata(d.path("ok")).unwrap().len(), l.file_size);
    // libbpf's two mmaps: consumer page RW at 0; producer page + data twice RO at 1 page.
    assert_eq!(l.kernel_mmap_segments(0, PAGE, true).unwrap(), vec![(PAGE, PAGE)]);
    assert_eq!(
        l.kernel_mmap_segments(PAGE, PAGE + 2 * 8192, false).unwrap(),
        vec![(2 * PAGE, PAGE + 8192), (3 * PAGE, 8192)]
    );
}

#[test]
fn open_rejects_bad_files() {
    let d = test_dir("open");
    assert_eq!(RingBuf::open(&d.path("missing")).unwrap_err().errno(), libc::ENOENT);
    std::fs::write(d.path("empty"), b"").unwrap();
    assert!(RingBuf::open(&d.path("empty")).is_err());
    std::fs::write(d.path("junk"), vec![0xa5u8; 5 * 4096]).unwrap();
    assert_eq!(RingBuf::open(&d.path("junk")).unwrap_err().errno(), libc::EINVAL);
    std::fs::write(d.path("short"), b"UBPFMAP\0").unwrap();
    assert!(RingBuf::open(&d.path("short")).is_err());

    let p = d.path("rb");
    drop(RingBuf::create(&p, &spec(8192)).unwrap());
    assert!(RingBuf::open(&p).is_ok());
    // Truncated: data area shorter than max_entries.
    let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
    f.set_len(3 * PAGE + 4096).unwrap();
    assert_eq!(RingBuf::open(&p).unwrap_err().errno(), libc::EINVAL);
    f.set_len(3 * PAGE + 8192).unwrap();
    assert!(RingBuf::open(&p).is_ok());
    // max_entries in the header changed to something a ring cannot be.
    poke(&p, 24, &5000u32.to_ne_bytes());
    assert_eq!(RingBuf::open(&p).unwrap_err().errno(), libc::EINVAL);
    poke(&p, 24, &16384u32.to_ne_bytes());
    assert_eq!(RingBuf::open(&p).unwrap_err().errno(), libc::EINVAL, "file size disagrees");
    poke(&p, 24, &8192u32.to_ne_bytes());
    // Our metadata's magic broken.
    poke(&p, 128, &[0u8; 8]);
    assert_eq!(RingBuf::open(&p).unwrap_err().errno(), libc::EINVAL);
}

#[test]
fn records_have_the_kernel_layout() {
    let d = test_dir("layout");
    let p = d.path("rb");
    let rb = RingBuf::create(&p, &spec(8192)).unwrap();
    let data = 3 * PAGE;
    // SAFETY: every reserved sample is written within its size and committed once.
    unsafe {
        let s = rb.reserve(5);
        assert!(!s.is_null());
        assert!(rb.owns_sample(s));
        assert_eq!(RingBuf::region_base_of_sample(s), rb.region_base());
        assert_eq!(read_u32(&p, data), 5 | BPF_RINGBUF_BUSY_BIT);
        assert_eq!(read_u32(&p, data + 4), 3, "pg_off counts pages from the header page");
        assert_eq!(read_u64(&p, 2 * PAGE), 16, "producer_pos: 8-byte header + 5 rounded up");
        std::ptr::copy_nonoverlapping(b"hello".as_ptr(), s, 5);
        rb.submit(s, 0);
        assert_eq!(read_u32(&p, data), 5);
        let mut b = [0u8; 5];
        std::fs::File::open(&p).unwrap().read_exact_at(&mut b, data + 8).unwrap();
        assert_eq!(&b, b"hello");

        // A record starting in the second data page has pg_off 4.
        let s = rb.reserve(4072).cast::<u8>();
        assert!(!s.is_null());
        rb.submit(s, 0);
        let s = rb.reserve(1);
        assert_eq!(read_u64(&p, 2 * PAGE), 16 + 4080 + 16);
        assert_eq!(read_u32(&p, data + 4096 + 4), 4);
        assert_eq!(RingBuf::region_base_of_sample(s), rb.region_base());
        rb.discard(s, 0);
        assert_eq!(read_u32(&p, data + 4096), 1 | BPF_RINGBUF_DISCARD_BIT);
    }
    let mut c = RingBufConsumer::new(&rb).unwrap();
    let mut got = Vec::new();
    assert_eq!(c.consume(|s| got.push(s.to_vec())).unwrap(), 2);
    assert_eq!(got[0], b"hello");
    assert_eq!(got[1].len(), 4072);
    assert_eq!(read_u64(&p, PAGE), 16 + 4080 + 16, "consumer_pos written to the consumer page");
    // pending_pos (producer page + 8) follows committed records at the next reservation.
    // SAFETY: committed right away.
    unsafe {
        let s = rb.reserve(0);
        rb.discard(s, 0);
    }
    assert_eq!(read_u64(&p, 2 * PAGE + 8), 16 + 4080 + 16);
}

#[test]
fn round_trip_many_sizes_with_wraparound() {
    let d = test_dir("roundtrip");
    let rb = RingBuf::create(&d.path("rb"), &spec(4096)).unwrap();
    let mut c = RingBufConsumer::new(&rb).unwrap();
    let mut wrapped = 0;
    // One at a time: every size from 0 to 700, positions wrap around many times.
    for i in 0..2000u32 {
        let len = (i as usize * 37) % 701;
        let want = pattern(i, len);
        let pos = rb.query(BPF_RB_PROD_POS);
        if (pos % 4096) + 8 + len as u64 > 4096 {
            wrapped += 1;
        }
        out(&rb, &want).unwrap();
        let mut got = Vec::new();
        assert_eq!(c.consume(|s| got.push(s.to_vec())).unwrap(), 1);
        assert_eq!(got, vec![want], "record {i}");
    }
    assert!(wrapped > 50, "records straddling the end: {wrapped}");
    // Batches: fill until full, then drain, and check order.
    let mut next = 0u32;
    let mut expect = 0u32;
    for _ in 0..50 {
        loop {
            let len = 1 + (next as usize * 13) % 300;
            match out(&rb, &pattern(next, len)) {
                Ok(()) => next += 1,
                Err(e) => {
                    assert_eq!(e.errno(), libc::EAGAIN);
                    break;
                }
            }
        }
        c.consume(|s| {
            let len = 1 + (expect as usize * 13) % 300;
            assert_eq!(s, &pattern(expect, len)[..]);
            expect += 1;
        })
        .unwrap();
        assert_eq!(expect, next);
    }
    assert_eq!(rb.query(BPF_RB_AVAIL_DATA), 0);
}

#[test]
fn discard_and_out_of_order_commits() {
    let d = test_dir("discard");
    let rb = RingBuf::create(&d.path("rb"), &spec(4096)).unwrap();
    let mut c = RingBufConsumer::new(&rb).unwrap();
    let mut got: Vec<Vec<u8>> = Vec::new();
    // SAFETY: each sample is written within its size and committed exactly once.
    unsafe {
        let a = rb.reserve(3);
        let b = rb.reserve(4);
        let x = rb.reserve(100);
        std::ptr::copy_nonoverlapping(b"bbbb".as_ptr(), b, 4);
        rb.submit(b, 0);
        rb.discard(x, 0);
        // `a` is still busy: the consumer stops there.
        assert_eq!(c.consume(|s| got.push(s.to_vec())).unwrap(), 0);
        assert_eq!(rb.query(BPF_RB_CONS_POS), 0);
        std::ptr::copy_nonoverlapping(b"aaa".as_ptr(), a, 3);
        rb.submit(a, 0);
        // Committing twice is ignored.
        rb.submit(a, 0);
        rb.discard(a, 0);
    }
    assert_eq!(c.consume(|s| got.push(s.to_vec())).unwrap(), 2);
    assert_eq!(got, vec![b"aaa".to_vec(), b"bbbb".to_vec()]);
    assert_eq!(rb.query(BPF_RB_CONS_POS), 16 + 16 + 112);
    assert_eq!(rb.query(BPF_RB_AVAIL_DATA), 0);
}

#[test]
fn reserve_fails_when_full_and_recovers() {
    let d = test_dir("full");
    let rb = RingBuf::create(&d.path("rb"), &spec(4096)).unwrap();
    let mut c = RingBufConsumer::new(&rb).unwrap();
    // SAFETY: all successful reservations are committed.
    unsafe {
        assert!(rb.reserve(RINGBUF_MAX_RECORD_SZ + 1).is_null());
        assert!(rb.reserve(4096).is_null(), "larger than the ring");
        assert!(rb.reserve(4088).is_null(), "8 + 4088 = 4096 > size - 1");
        let s = rb.reserve(4080);
        assert!(!s.is_null(), "the largest record: 4088 bytes");
        assert!(rb.reserve(0).is_null(), "full");
        rb.submit(s, 0);
        assert!(rb.reserve(0).is_null(), "still full until consumed");
    }
    assert_eq!(rb.query(BPF_RB_AVAIL_DATA), 4088);
    assert_eq!(c.consume(|s| assert_eq!(s.len(), 4080)).unwrap(), 1);
    let mut n = 0;
    while out(&rb, &[7u8; 100]).is_ok() {
        n += 1;
    }
    assert_eq!(n, 4095 / 112);
    assert_eq!(out(&rb, &[0u8; 100]).unwrap_err().errno(), libc::EAGAIN);
    assert_eq!(c.consume(|_| {}).unwrap(), n);
    out(&rb, &[1u8; 100]).unwrap();
    // SAFETY: `b"x"` is readable for 1 byte.
    let e = unsafe { rb.output(b"x".as_ptr(), 1, 4) }.unwrap_err();
    assert_eq!(e.errno(), libc::EINVAL, "unknown output flags");
}

#[test]
fn pending_record_is_never_overrun_even_if_consumer_pos_lies() {
    let d = test_dir("pending");
    let p = d.path("rb");
    let rb = RingBuf::create(&p, &spec(4096)).unwrap();
    // SAFETY: `a` is committed at the end; nothing else is reserved successfully.
    unsafe {
        let a = rb.reserve(100); // record [0, 112), busy
        assert!(!a.is_null());
        // A misbehaving consumer skips the busy record.
        poke(&p, PAGE, &112u64.to_ne_bytes());
        // By consumer_pos alone this would fit and overwrite `a`'s header.
        assert!(rb.reserve(4000).is_null());
        let b = rb.reserve(100);
        assert!(!b.is_null());
        rb.submit(b, 0);
        rb.submit(a, 0);
    }
    assert_eq!(read_u32(&p, 3 * PAGE), 100, "a's header intact");
}

#[test]
fn query_values() {
    let d = test_dir("query");
    let rb = RingBuf::create(&d.path("rb"), &spec(16384)).unwrap();
    assert_eq!(rb.query(BPF_RB_RING_SIZE), 16384);
    assert_eq!(rb.query(BPF_RB_AVAIL_DATA), 0);
    assert_eq!(rb.query(99), 0);
    out(&rb, &[0u8; 10]).unwrap();
    out(&rb, &[0u8; 24]).unwrap();
    assert_eq!(rb.query(BPF_RB_PROD_POS), 24 + 32);
    assert_eq!(rb.query(BPF_RB_CONS_POS), 0);
    assert_eq!(rb.query(BPF_RB_AVAIL_DATA), 56);
    // SAFETY: committed right away.
    unsafe {
        let s = rb.reserve(1);
        assert_eq!(rb.query(BPF_RB_AVAIL_DATA), 72, "busy records count as available, as in the kernel");
        rb.submit(s, 0);
    }
    let mut c = RingBufConsumer::open(&d.path("rb")).unwrap();
    assert_eq!(c.consume(|_| {}).unwrap(), 3);
    assert_eq!(rb.query(BPF_RB_CONS_POS), 72);
    assert_eq!(rb.query(BPF_RB_AVAIL_DATA), 0);
}

/// Payload: producer id, sequence number, then a filler whose length depends on seq.
fn record(producer: u32, seq: u32) -> Vec<u8> {
    let mut v = Vec::with_capacity(8 + 64);
    v.extend_from_slice(&producer.to_ne_bytes());
    v.extend_from_slice(&seq.to_ne_bytes());
    v.extend(std::iter::repeat_n((seq % 251) as u8, (seq % 61) as usize));
    v
}

/// Checks one record against the per-producer sequence; returns the producer id.
fn check(s: &[u8], next: &mut [u32]) -> usize {
    assert!(s.len() >= 8);
    let p = u32::from_ne_bytes(s[0..4].try_into().unwrap()) as usize;
    let seq = u32::from_ne_bytes(s[4..8].try_into().unwrap());
    assert_eq!(seq, next[p], "producer {p}: records in order, each once");
    assert_eq!(s, &record(p as u32, seq)[..]);
    next[p] += 1;
    p
}

fn produce(rb: &RingBuf, producer: u32, n: u32) {
    let start = Instant::now();
    for seq in 0..n {
        let r = record(producer, seq);
        let len = r.len() as u64;
        loop {
            // Alternate the two producer APIs.
            let ok = if seq % 2 == 0 {
                out(rb, &r).is_ok()
            } else {
                // SAFETY: the sample is written within its size and submitted once.
                unsafe {
                    let s = rb.reserve(len);
                    if !s.is_null() {
                        std::ptr::copy_nonoverlapping(r.as_ptr(), s, r.len());
                        rb.submit(s, 0);
                    }
                    !s.is_null()
                }
            };
            if ok {
                break;
            }
            if start.elapsed() > Duration::from_secs(120) {
                return; // the consumer is gone (failed test): do not spin forever
            }
            std::thread::yield_now();
        }
    }
}

#[test]
fn several_producer_threads_one_consumer_thread() {
    const THREADS: u32 = 4;
    const N: u32 = 20_000;
    let d = test_dir("threads");
    let rb = RingBuf::create(&d.path("rb"), &spec(16384)).unwrap();
    let consumer = {
        let mut c = RingBufConsumer::new(&rb).unwrap();
        std::thread::spawn(move || {
            let mut next = vec![0u32; THREADS as usize];
            let mut total = 0;
            let start = Instant::now();
            while total < (THREADS * N) as usize {
                assert!(start.elapsed() < Duration::from_secs(120), "consumer stuck at {total}");
                total += c
                    .poll(Duration::from_millis(500), |s| {
                        check(s, &mut next);
                    })
                    .unwrap();
            }
            assert!(next.iter().all(|&n| n == N));
            // Nothing more.
            assert_eq!(c.consume(|_| panic!("extra record")).unwrap(), 0);
        })
    };
    let producers: Vec<_> = (0..THREADS)
        .map(|t| {
            let rb = rb.clone();
            std::thread::spawn(move || produce(&rb, t, N))
        })
        .collect();
    for p in producers {
        p.join().unwrap();
    }
    consumer.join().unwrap();
}

#[test]
fn producer_in_another_process() {
    const N: u32 = 20_000;
    let d = test_dir("fork");
    let path = d.path("rb");
    let rb = RingBuf::create(&path, &spec(8192)).unwrap();
    let cpath = path.clone();
    // SAFETY: the child only opens the map (malloc is fork-safe in glibc), produces, and
    // leaves with _exit without running the parent's destructors or test harness.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        let code = match RingBuf::open(&cpath) {
            Ok(child_rb) => {
                // Wait until the parent's consumer sleeps, so that cross-process wakeups are used.
                std::thread::sleep(Duration::from_millis(50));
                produce(&child_rb, 2, N);
                0
            }
            Err(_) => 1,
        };
        // SAFETY: ends the child process immediately.
        unsafe { libc::_exit(code) };
    }
    let local: Vec<_> = (0..2)
        .map(|t| {
            let rb = rb.clone();
            std::thread::spawn(move || produce(&rb, t, N))
        })
        .collect();
    let mut c = RingBufConsumer::open(&path).unwrap();
    let mut next = vec![0u32; 3];
    let mut total = 0;
    let start = Instant::now();
    while total < 3 * N as usize {
        assert!(start.elapsed() < Duration::from_secs(120), "consumer stuck at {total}: {next:?}");
        total += c
            .poll(Duration::from_millis(500), |s| {
                check(s, &mut next);
            })
            .unwrap();
    }
    assert_eq!(next, vec![N; 3]);
    for t in local {
        t.join().unwrap();
    }
    let mut status = 0;
    // SAFETY: waiting for our own child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "child status {status:#x}");
}

#[test]
fn blocked_consumer_wakes_on_submit() {
    let d = test_dir("wake");
    let rb = RingBuf::create(&d.path("rb"), &spec(4096)).unwrap();
    // Nobody waits: producers make no wakeup call.
    let mut c = RingBufConsumer::new(&rb).unwrap();
    for i in 0..100u32 {
        out(&rb, &i.to_ne_bytes()).unwrap();
        c.consume(|_| {}).unwrap();
    }
    assert_eq!(rb.wakeups(), 0);

    let waiting = Arc::new(AtomicBool::new(false));
    let t = {
        let w = waiting.clone();
        std::thread::spawn(move || {
            w.store(true, Ordering::SeqCst);
            let start = Instant::now();
            let mut got = Vec::new();
            let n = c.poll(Duration::from_secs(20), |s| got.push(s.to_vec())).unwrap();
            (n, got, start.elapsed())
        })
    };
    while !waiting.load(Ordering::SeqCst) {
        std::thread::yield_now();
    }
    std::thread::sleep(Duration::from_millis(200));
    let before = Instant::now();
    out(&rb, b"wake up").unwrap();
    let (n, got, elapsed) = t.join().unwrap();
    assert_eq!(n, 1);
    assert_eq!(got, vec![b"wake up".to_vec()]);
    assert!(elapsed >= Duration::from_millis(150), "it did sleep: {elapsed:?}");
    assert!(before.elapsed() < Duration::from_secs(5), "woken by the submit, not the timeout");
    assert_eq!(rb.wakeups(), 1);
}

/// A stream of records to a consumer in `poll`, each submitted once the consumer has the one
/// before: the consumer lingers between them, so producers make no FUTEX_WAKE call but the
/// first (see perf.rs's test of the same name for the bound).
#[test]
fn a_steady_stream_makes_no_wakeups() {
    const N: u64 = 2000;
    let d = test_dir("stream");
    let rb = RingBuf::create(&d.path("rb"), &spec(4096)).unwrap();
    let mut c = RingBufConsumer::new(&rb).unwrap();
    let got = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let t = {
        let got = got.clone();
        std::thread::spawn(move || {
            let mut seen = Vec::new();
            while got.load(Ordering::SeqCst) < N {
                c.poll(Duration::from_secs(20), |s| {
                    seen.push(u64::from_ne_bytes(s.try_into().unwrap()));
                    got.fetch_add(1, Ordering::SeqCst);
                })
                .unwrap();
            }
            seen
        })
    };
    for i in 0..N {
        out(&rb, &i.to_ne_bytes()).unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        while got.load(Ordering::SeqCst) <= i {
            assert!(Instant::now() < deadline, "record {i} never arrived");
            std::thread::yield_now();
        }
    }
    assert_eq!(t.join().unwrap(), (0..N).collect::<Vec<_>>());
    assert!(rb.wakeups() <= N / 20, "{} FUTEX_WAKE calls for {N} records", rb.wakeups());
}

#[test]
fn no_wakeup_and_force_wakeup_flags() {
    let d = test_dir("flags");
    let rb = RingBuf::create(&d.path("rb"), &spec(4096)).unwrap();
    let spawn_poll = |timeout: Duration| {
        // The consumer before is gone, but a child another test of this binary is forking
        // may still hold its descriptor (and so its lock) until it execs: EBUSY for a moment.
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut c = loop {
            match RingBufConsumer::new(&rb) {
                Err(e) if e.errno() == libc::EBUSY && Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(5))
                }
                r => break r.unwrap(),
            }
        };
        std::thread::spawn(move || {
            let start = Instant::now();
            let n = c.poll(timeout, |_| {}).unwrap();
            (n, start.elapsed())
        })
    };
    // BPF_RB_NO_WAKEUP: the sleeping consumer only sees the record at its timeout.
    let t = spawn_poll(Duration::from_millis(800));
    std::thread::sleep(Duration::from_millis(150));
    // SAFETY: the literal is readable for 3 bytes.
    unsafe { rb.output(b"abc".as_ptr(), 3, BPF_RB_NO_WAKEUP) }.unwrap();
    let (n, elapsed) = t.join().unwrap();
    assert_eq!(n, 1);
    assert!(elapsed >= Duration::from_millis(750), "not woken: {elapsed:?}");
    assert_eq!(rb.wakeups(), 0);

    // BPF_RB_FORCE_WAKEUP wakes even though the consumer waits for an earlier record.
    // SAFETY: both samples are committed.
    let a = unsafe { rb.reserve(8) };
    let t = spawn_poll(Duration::from_secs(20));
    std::thread::sleep(Duration::from_millis(150));
    // SAFETY: as above.
    unsafe {
        let b = rb.reserve(8);
        rb.submit(b, BPF_RB_FORCE_WAKEUP);
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while rb.wakeups() == 0 {
        assert!(Instant::now() < deadline, "no forced wakeup");
        std::thread::sleep(Duration::from_millis(5));
    }
    // Without flags, the commit of the record the consumer waits for wakes it.
    // SAFETY: `a` was reserved above and not committed yet.
    unsafe { rb.submit(a, 0) };
    let (n, elapsed) = t.join().unwrap();
    assert_eq!(n, 2);
    assert!(elapsed < Duration::from_secs(5));
    // The last commit wakes the consumer unless it was between two sleeps (it then finds the
    // record without sleeping).
    assert!((1..=2).contains(&rb.wakeups()));
}

#[test]
fn one_consumer_at_a_time() {
    let d = test_dir("excl");
    let p = d.path("rb");
    let rb = RingBuf::create(&p, &spec(4096)).unwrap();
    out(&rb, b"x").unwrap();
    let a = RingBufConsumer::new(&rb).unwrap();
    assert_eq!(RingBufConsumer::new(&rb).err().unwrap().errno(), libc::EBUSY);
    assert_eq!(RingBufConsumer::open(&p).err().unwrap().errno(), libc::EBUSY);
    // Another process cannot consume either.
    // SAFETY: the child only tries to open a consumer and leaves with _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        let code = match RingBufConsumer::open(&p) {
            Err(e) if e.errno() == libc::EBUSY => 0,
            _ => 1,
        };
        // SAFETY: ends the child immediately.
        unsafe { libc::_exit(code) };
    }
    let mut status = 0;
    // SAFETY: waiting for our own child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0);
    drop(a);
    let mut b = RingBufConsumer::open(&p).unwrap();
    assert_eq!(b.consume(|s| assert_eq!(s, b"x")).unwrap(), 1);
}

#[test]
fn a_killed_consumer_leaves_no_trace() {
    let d = test_dir("killed");
    let p = d.path("rb");
    let rb = RingBuf::create(&p, &spec(4096)).unwrap();
    // A consumer process sleeping in poll, killed.
    // SAFETY: the child opens a consumer, polls, and is killed (or leaves with _exit).
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        if let Ok(mut c) = RingBufConsumer::open(&p) {
            let _ = c.poll(Duration::from_secs(60), |_| {});
        }
        // SAFETY: ends the child immediately.
        unsafe { libc::_exit(1) };
    }
    // Wait until it sleeps: the waiting word (header page, offset 128 + 192) is set.
    let start = Instant::now();
    while read_u32(&p, 128 + 192) == 0 {
        assert!(start.elapsed() < Duration::from_secs(10), "child never waited");
        std::thread::sleep(Duration::from_millis(5));
    }
    // SAFETY: killing and reaping our own child.
    unsafe {
        libc::kill(pid, libc::SIGKILL);
        let mut status = 0;
        assert_eq!(libc::waitpid(pid, &mut status, 0), pid);
    }
    // Its lock went with it; the next consumer clears its waiting word, so producers make no
    // wakeup calls for nobody.
    let mut c = RingBufConsumer::open(&p).unwrap();
    assert_eq!(read_u32(&p, 128 + 192), 0);
    let w = rb.wakeups();
    for i in 0..100u32 {
        out(&rb, &i.to_ne_bytes()).unwrap();
        assert_eq!(c.consume(|_| {}).unwrap(), 1);
    }
    assert_eq!(rb.wakeups(), w);
}

#[test]
fn corrupt_lengths_are_errors_not_crashes() {
    let d = test_dir("corrupt");
    let p = d.path("rb");
    let rb = RingBuf::create(&p, &spec(4096)).unwrap();
    let mut c = RingBufConsumer::new(&rb).unwrap();
    out(&rb, b"12345678").unwrap();
    // A committed length running past producer_pos.
    poke(&p, 3 * PAGE, &4000u32.to_ne_bytes());
    assert_eq!(c.consume(|_| panic!("no sample")).unwrap_err().errno(), libc::EINVAL);
    poke(&p, 3 * PAGE, &(!BPF_RINGBUF_BUSY_BIT).to_ne_bytes());
    assert_eq!(c.consume(|_| panic!("no sample")).unwrap_err().errno(), libc::EINVAL);
    // Positions that cannot be: producer_pos more than a ring ahead, consumer ahead of it.
    poke(&p, 2 * PAGE, &(5000u64).to_ne_bytes());
    assert_eq!(c.consume(|_| {}).unwrap_err().errno(), libc::EINVAL);
    poke(&p, 2 * PAGE, &16u64.to_ne_bytes());
    poke(&p, PAGE, &24u64.to_ne_bytes());
    assert_eq!(c.consume(|_| {}).unwrap_err().errno(), libc::EINVAL);
    assert_eq!(c.poll(Duration::from_millis(10), |_| {}).unwrap_err().errno(), libc::EINVAL);
    // Producers keep going without crashing (their reservations may fail).
    for _ in 0..100 {
        let _ = out(&rb, &[0u8; 64]);
    }
    // Repair the positions: the ring works again.
    poke(&p, PAGE, &rb.query(BPF_RB_PROD_POS).to_ne_bytes());
    out(&rb, b"ok").unwrap();
    assert_eq!(c.consume(|s| assert_eq!(s, b"ok")).unwrap(), 1);
}

/// The pid of a process that existed and is gone.
fn dead_pid() -> u32 {
    // SAFETY: the child exits at once; we reap it.
    unsafe {
        let pid = libc::fork();
        assert!(pid >= 0);
        if pid == 0 {
            libc::_exit(0);
        }
        let mut status = 0;
        assert_eq!(libc::waitpid(pid, &mut status, 0), pid);
        pid as u32
    }
}

#[test]
fn producers_recover_from_a_dead_process() {
    let d = test_dir("dead");
    let p = d.path("rb");
    let rb = RingBuf::create(&p, &spec(4096)).unwrap();
    // A producer process died holding the reservation lock (header page, offset 128 + 128).
    poke(&p, 256, &dead_pid().to_ne_bytes());
    out(&rb, b"after the lock's holder died").unwrap();
    assert_eq!(read_u32(&p, 256), 0, "lock released");
    // A producer died between reserve and submit: the consumer is stuck on its record until
    // told to skip it.
    // SAFETY: `dead` is never committed (its producer "died"); the others are.
    let dead = unsafe { rb.reserve(16) };
    out(&rb, b"behind the dead one").unwrap();
    let mut c = RingBufConsumer::new(&rb).unwrap();
    let mut got = Vec::new();
    assert_eq!(c.consume(|s| got.push(s.to_vec())).unwrap(), 1);
    assert_eq!(c.consume(|s| got.push(s.to_vec())).unwrap(), 0, "stuck at the busy record");
    assert!(c.skip_busy_record());
    assert!(!c.skip_busy_record(), "nothing busy any more");
    assert_eq!(c.consume(|s| got.push(s.to_vec())).unwrap(), 1);
    assert_eq!(got, vec![b"after the lock's holder died".to_vec(), b"behind the dead one".to_vec()]);
    // A late submit of the skipped record is ignored.
    // SAFETY: `dead` came from reserve; submit ignores it since it is no longer busy.
    unsafe { rb.submit(dead, 0) };
    assert_eq!(c.consume(|_| panic!("skipped record delivered")).unwrap(), 0);
    out(&rb, b"z").unwrap();
    assert_eq!(c.consume(|s| assert_eq!(s, b"z")).unwrap(), 1);
}
