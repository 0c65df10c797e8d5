//! Many threads on one map: no crash, no hang, no lost update, consistent at rest.

mod common;

use std::collections::BTreeSet;
use std::sync::Barrier;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::*;
use userbpf_maps::MapType::*;
use userbpf_maps::*;

const THREADS: usize = 6;

/// Full iteration with a bound; returns the keys (None if the bound was hit, which can
/// happen under churn since a deleted current key restarts the walk, as in the kernel).
fn iterate(m: &Map, bound: usize) -> Option<Vec<Vec<u8>>> {
    let ks = m.spec().key_size as usize;
    let mut keys = Vec::new();
    let mut cur: Option<Vec<u8>> = None;
    for _ in 0..bound {
        let mut nk = vec![0u8; ks];
        if m.get_next_key(cur.as_deref(), &mut nk).is_err() {
            return Some(keys);
        }
        keys.push(nk.clone());
        cur = Some(nk);
    }
    None
}

fn hammer(s: MapSpec, keyspace: u64, dur: Duration) -> Map {
    let d = TmpDir::new("hammer");
    let m = create(&d, &s);
    let ks = s.key_size as usize;
    let vb = m.value_buf_size();
    let stop = AtomicBool::new(false);
    let barrier = Barrier::new(THREADS + 1);
    let busy = AtomicU64::new(0);
    let key_of = |k: u64| {
        let mut v = vec![0u8; ks];
        let b = k.to_ne_bytes();
        let n = ks.min(8);
        v[..n].copy_from_slice(&b[..n]);
        if s.map_type == BPF_MAP_TYPE_LPM_TRIE {
            v[..4].copy_from_slice(&((k % 33) as u32).to_ne_bytes());
        }
        v
    };
    std::thread::scope(|sc| {
        for t in 0..THREADS {
            let (m, stop, barrier, busy) = (&m, &stop, &barrier, &busy);
            sc.spawn(move || {
                let mut rng = Rng::new(t as u64 * 7919 + 1);
                barrier.wait();
                let mut out = vec![0u8; vb];
                let mut nk = vec![0u8; ks];
                while !stop.load(Ordering::Relaxed) {
                    let key = key_of(rng.below(keyspace));
                    let val = rng.bytes(vb);
                    let r = match rng.below(10) {
                        0 | 1 => m.update_elem(&key, &val, BPF_ANY),
                        // SAFETY: key and value buffers of the map's sizes.
                        2 | 3 => unsafe { m.update(key.as_ptr(), val.as_ptr(), rng.below(3), t as u32) },
                        4 => m.delete_elem(&key),
                        // SAFETY: as above.
                        5 => unsafe { m.delete(key.as_ptr()) },
                        6 => m.lookup_elem(&key, &mut out),
                        7 => {
                            // SAFETY: as above; the value is read with an atomic add, as a
                            // program would.
                            unsafe {
                                let p = m.lookup(key.as_ptr(), t as u32);
                                if !p.is_null() && m.contains(p as u64, 8) {
                                    AtomicU64::from_ptr(p.cast()).fetch_add(1, Ordering::Relaxed);
                                }
                            }
                            Ok(())
                        }
                        8 => m.get_next_key(Some(&key), &mut nk),
                        _ => {
                            let _ = iterate(m, 1000);
                            Ok(())
                        }
                    };
                    if let Err(e) = r {
                        match e.errno() {
                            libc::EBUSY => {
                                busy.fetch_add(1, Ordering::Relaxed);
                            }
                            libc::ENOENT | libc::EEXIST | libc::E2BIG | libc::ENOSPC | libc::EINVAL => {}
                            e => panic!("unexpected errno {e}"),
                        }
                    }
                }
            });
        }
        barrier.wait();
        std::thread::sleep(dur);
        stop.store(true, Ordering::Relaxed);
    });
    eprintln!("{:?}: {} EBUSY", s.map_type, busy.load(Ordering::Relaxed));
    // At rest: the iteration ends, lists each key once, and every listed key is found.
    let keys = iterate(&m, 1_000_000).expect("iteration at rest must end");
    let set: BTreeSet<_> = keys.iter().cloned().collect();
    assert_eq!(set.len(), keys.len(), "a key was listed twice");
    assert!(keys.len() <= s.max_entries as usize);
    let mut out = vec![0u8; vb];
    for k in &keys {
        assert_eq!(errno(m.lookup_elem(k, &mut out)), 0);
    }
    // And the map still works.
    for k in &keys {
        assert_eq!(errno(m.delete_elem(k)), 0);
    }
    assert_eq!(iterate(&m, 10).unwrap().len(), 0);
    let k = key_of(1);
    assert_eq!(errno(m.update_elem(&k, &vec![1; vb], BPF_NOEXIST)), 0);
    drop(d);
    m
}

#[test]
fn hash_hammer() {
    hammer(spec(BPF_MAP_TYPE_HASH, 8, 16, 64, 0), 100, Duration::from_millis(1500));
    hammer(spec(BPF_MAP_TYPE_HASH, 4, 8, 1, 0), 3, Duration::from_millis(500));
}

#[test]
fn percpu_hash_hammer() {
    hammer(spec(BPF_MAP_TYPE_PERCPU_HASH, 4, 8, 32, 0), 50, Duration::from_millis(800));
}

#[test]
fn lru_hash_hammer() {
    hammer(spec(BPF_MAP_TYPE_LRU_HASH, 8, 8, 32, 0), 100, Duration::from_millis(1500));
    hammer(spec(BPF_MAP_TYPE_LRU_PERCPU_HASH, 4, 8, 16, 0), 64, Duration::from_millis(800));
}

#[test]
fn lpm_trie_hammer() {
    hammer(spec(BPF_MAP_TYPE_LPM_TRIE, 8, 8, 24, BPF_F_NO_PREALLOC), 200, Duration::from_millis(1500));
}

#[test]
fn atomic_adds_are_not_lost() {
    let d = TmpDir::new("adds");
    let arr = create(&d, &spec(BPF_MAP_TYPE_ARRAY, 4, 8, 4, 0));
    let hash = create(&d, &spec(BPF_MAP_TYPE_HASH, 4, 8, 4, 0));
    hash.update_elem(&7u32.to_ne_bytes(), &0u64.to_ne_bytes(), BPF_ANY).unwrap();
    const N: u64 = 200_000;
    std::thread::scope(|sc| {
        for _ in 0..THREADS {
            sc.spawn(|| {
                for _ in 0..N {
                    // SAFETY: 4-byte keys; the pointers are 8-aligned u64 values.
                    unsafe {
                        let p = arr.lookup(2u32.to_ne_bytes().as_ptr(), 0);
                        AtomicU64::from_ptr(p.cast()).fetch_add(1, Ordering::Relaxed);
                        let p = hash.lookup(7u32.to_ne_bytes().as_ptr(), 0);
                        AtomicU64::from_ptr(p.cast()).fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
    });
    let mut v = [0u8; 8];
    arr.lookup_elem(&2u32.to_ne_bytes(), &mut v).unwrap();
    assert_eq!(u64::from_ne_bytes(v), N * THREADS as u64);
    hash.lookup_elem(&7u32.to_ne_bytes(), &mut v).unwrap();
    assert_eq!(u64::from_ne_bytes(v), N * THREADS as u64);
}

#[test]
fn queue_loses_nothing() {
    let d = TmpDir::new("queue-mt");
    let q = create(&d, &spec(BPF_MAP_TYPE_QUEUE, 0, 8, 64, 0));
    const PER: u64 = 20_000;
    let popped = std::sync::Mutex::new(Vec::new());
    let done = AtomicU64::new(0);
    std::thread::scope(|sc| {
        for t in 0..3u64 {
            let (q, done) = (&q, &done);
            sc.spawn(move || {
                for i in 0..PER {
                    let v = (t << 32 | i).to_ne_bytes();
                    // SAFETY: 8-byte value.
                    while unsafe { q.push(v.as_ptr(), BPF_ANY) }.is_err() {
                        std::thread::yield_now();
                    }
                }
                done.fetch_add(1, Ordering::Relaxed);
            });
        }
        for _ in 0..3 {
            let (q, done, popped) = (&q, &done, &popped);
            sc.spawn(move || {
                let mut mine = Vec::new();
                let mut v = [0u8; 8];
                loop {
                    let finished = done.load(Ordering::Relaxed) == 3;
                    // SAFETY: 8-byte buffer.
                    match unsafe { q.pop(v.as_mut_ptr()) } {
                        Ok(()) => mine.push(u64::from_ne_bytes(v)),
                        Err(e) if e.errno() == libc::ENOENT && finished => break,
                        Err(_) => std::thread::yield_now(),
                    }
                }
                popped.lock().unwrap().extend(mine);
            });
        }
    });
    let mut all = popped.into_inner().unwrap();
    assert_eq!(all.len() as u64, 3 * PER);
    all.sort();
    all.dedup();
    assert_eq!(all.len() as u64, 3 * PER, "duplicates popped");
}

#[test]
fn iteration_survives_concurrent_deletes() {
    let d = TmpDir::new("iter-del");
    for s in [spec(BPF_MAP_TYPE_HASH, 4, 4, 256, 0), spec(BPF_MAP_TYPE_LPM_TRIE, 8, 4, 256, BPF_F_NO_PREALLOC)] {
        let m = create(&d, &s);
        let ks = s.key_size as usize;
        let key = |i: u32| {
            let mut k = vec![0u8; ks];
            if ks == 8 {
                k[..4].copy_from_slice(&32u32.to_ne_bytes());
            }
            k[ks - 4..].copy_from_slice(&i.to_be_bytes());
            k
        };
        for i in 0..256 {
            m.update_elem(&key(i), &[1; 4], BPF_ANY).unwrap();
        }
        let stop = AtomicBool::new(false);
        std::thread::scope(|sc| {
            sc.spawn(|| {
                let mut rng = Rng::new(3);
                while !stop.load(Ordering::Relaxed) {
                    let k = key(rng.below(256) as u32);
                    let _ = m.delete_elem(&k);
                    let _ = m.update_elem(&k, &[2; 4], BPF_ANY);
                }
            });
            let start = Instant::now();
            let mut calls = 0u64;
            while start.elapsed() < Duration::from_millis(800) {
                // Every call returns; walks may restart but never spin forever.
                let _ = iterate(&m, 2000);
                calls += 1;
            }
            stop.store(true, Ordering::Relaxed);
            assert!(calls > 0);
        });
    }
}

#[test]
fn busy_lock_gives_up() {
    // A live holder that never releases: waiters get EBUSY within a bounded time.
    let d = TmpDir::new("busy");
    let path = d.path("q");
    let q = Map::create(&path, &spec(BPF_MAP_TYPE_QUEUE, 0, 8, 4, 0)).unwrap();
    // The queue's lock word is at offset 128 (see queue_stack.rs): pid 1 always exists.
    // SAFETY: offset 128 of the mapping is the 4-aligned lock word.
    let lock = unsafe { std::sync::atomic::AtomicU32::from_ptr(q.shm().as_ptr().add(128).cast()) };
    lock.store(1, Ordering::Relaxed);
    let t = Instant::now();
    // SAFETY: 8-byte value.
    assert_eq!(errno(unsafe { q.push([0u8; 8].as_ptr(), BPF_ANY) }), libc::EBUSY);
    let hot = t.elapsed();
    let t = Instant::now();
    assert_eq!(errno(q.update_elem(&[], &[0u8; 8], BPF_ANY)), libc::EBUSY);
    let sys = t.elapsed();
    eprintln!("EBUSY after {hot:?} (program side), {sys:?} (syscall side)");
    assert!(hot < Duration::from_secs(1) && sys < Duration::from_secs(2));
    // A holder that died: its lock is taken over.
    let child = std::process::Command::new("true").spawn().unwrap();
    let pid = child.id();
    let mut child = child;
    child.wait().unwrap();
    lock.store(pid, Ordering::Relaxed);
    // SAFETY: 8-byte value.
    assert_eq!(errno(unsafe { q.push([0u8; 8].as_ptr(), BPF_ANY) }), 0);
    assert_eq!(lock.load(Ordering::Relaxed), 0);
}

#[test]
fn program_side_waits_for_a_preempted_lock_holder() {
    // Another thread holds every bucket lock for 5 ms, as a lock holder preempted by the
    // scheduler does: program-side update and delete must wait for it, not fail with EBUSY
    // (which the kernel returns only for re-entry on the same CPU). The spin budget alone is
    // far shorter than 5 ms, so this failed deterministically when waiters only spun.
    for t in [BPF_MAP_TYPE_HASH, BPF_MAP_TYPE_LRU_HASH] {
        let d = TmpDir::new("preempted");
        let m = Map::create(&d.path("m"), &spec(t, 8, 8, 4, 0)).unwrap();
        // Bucket locks: { lock: u32, head: u32 } from offset 4096 (see hash.rs); 4 buckets.
        let locks: Vec<&std::sync::atomic::AtomicU32> = (0..4)
            // SAFETY: bucket b's lock word is at 4096 + 8b, 4-aligned, inside the mapping.
            .map(|b| unsafe { std::sync::atomic::AtomicU32::from_ptr(m.shm().as_ptr().add(4096 + 8 * b).cast()) })
            .collect();
        for op in 0..2 {
            let held = Barrier::new(2);
            std::thread::scope(|s| {
                s.spawn(|| {
                    // SAFETY: gettid has no arguments.
                    let tid = unsafe { libc::syscall(libc::SYS_gettid) } as u32;
                    for l in &locks {
                        while l.compare_exchange(0, tid, Ordering::Acquire, Ordering::Relaxed).is_err() {}
                    }
                    held.wait();
                    std::thread::sleep(Duration::from_millis(5));
                    for l in &locks {
                        l.store(0, Ordering::Release);
                    }
                });
                held.wait();
                let k = 7u64.to_ne_bytes();
                let v = 9u64.to_ne_bytes();
                let start = Instant::now();
                // SAFETY: 8-byte key and value.
                let r = unsafe {
                    if op == 0 { m.update(k.as_ptr(), v.as_ptr(), BPF_ANY, 0) } else { m.delete(k.as_ptr()) }
                };
                // (No lower bound on the time taken: on a loaded machine this thread may
                // itself be descheduled until the holder is done.)
                assert!(r.is_ok(), "{t:?} op {op}: {r:?} after {:?}", start.elapsed());
            });
        }
        assert_eq!(locks.iter().map(|l| l.load(Ordering::Relaxed)).sum::<u32>(), 0);
    }
}
