//! Two sides (two threads, then two processes) run random inserts, updates, deletes and
//! lookups on overlapping keys of one hash map at once; afterwards the map must hold exactly
//! what the sides' successful operations imply: no lost and no duplicated entries.
//!
//! The model. Each side counts, per key, its successful `BPF_NOEXIST` inserts minus its
//! successful deletes, and remembers the last value it wrote successfully. Whatever the
//! interleaving, a key's operations alternate insert/delete in the map's linearization, so
//! the sum over both sides is 1 for a key that is present at the end and 0 for one that is
//! not (2 would be a duplicated insert, -1 a delete that succeeded twice); a present key's
//! value is the last successful write of one of the sides. Then: the map's iteration lists
//! the model's keys each once, its count equals the model's, every free element is still
//! there (exactly max_entries - count more keys fit, then `E2BIG`), and (not per-CPU) every
//! value read while the sides ran was whole: values carry their key and a check word, so a
//! torn copy or another key's value is caught. `BPF_ANY` is left out: whether it inserted
//! cannot be told from its result (concurrency.rs hammers it). Not timed.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use common::*;
use userbpf_maps::MapType::*;
use userbpf_maps::*;

/// Keys shared by both sides; fewer than max_entries, so no insert may fail with E2BIG and
/// no LRU map may evict (the model covers every change).
const KEYS: u64 = 48;
const MAX: u32 = 64;
const OPS: u64 = 400_000;
const VS: usize = 16;

/// What one side did.
#[derive(Default)]
struct Tally {
    /// Per key: successful inserts minus successful deletes.
    net: Vec<i64>,
    /// Per key: the first word of the last value this side wrote successfully.
    last: Vec<Option<u64>>,
    busy: u64,
}

fn value_words(k: u64, side: u64, seq: u64) -> [u64; 2] {
    let w0 = k << 40 | side << 32 | (seq & 0xffff_ffff);
    [w0, !w0]
}

fn value_bytes(w: [u64; 2], copies: usize) -> Vec<u8> {
    let one: Vec<u8> = w[0].to_ne_bytes().into_iter().chain(w[1].to_ne_bytes()).collect();
    one.repeat(copies)
}

/// A value read back for key `k` must be whole and be `k`'s.
fn check_value(k: u64, v: &[u8], what: &str) {
    let w0 = u64::from_ne_bytes(v[..8].try_into().unwrap());
    let w1 = u64::from_ne_bytes(v[8..16].try_into().unwrap());
    assert_eq!(w1, !w0, "{what}: torn value for key {k}: {w0:#x} {w1:#x}");
    assert_eq!(w0 >> 40, k, "{what}: key {k} holds key {}'s value", w0 >> 40);
}

/// One side's random operations.
fn side(m: &Map, side: u64, seed: u64) -> Tally {
    side_with(m, side, seed, false)
}

/// One side's random operations; `direct`: a program's updates of existing keys go as the
/// JIT makes them, a lookup of the key then the map's own update (`Map::prog_ops`, whose
/// fast path writes the element the lookup found).
fn side_with(m: &Map, side: u64, seed: u64, direct: bool) -> Tally {
    let ops = m.prog_ops().filter(|_| direct);
    let percpu = m.map_type().is_percpu();
    let vb = m.value_buf_size();
    let copies = vb / VS;
    let mut t = Tally { net: vec![0; KEYS as usize], last: vec![None; KEYS as usize], busy: 0 };
    let mut rng = Rng::new(seed);
    let mut out = vec![0u8; vb];
    let mut nk = [0u8; 8];
    for seq in 0..OPS {
        let k = rng.below(KEYS);
        let key = k.to_ne_bytes();
        let w = value_words(k, side, seq);
        let prog = rng.below(2) == 0;
        let r = match rng.below(9) {
            op @ 0..=3 => {
                let flags = if op < 2 { BPF_NOEXIST } else { BPF_EXIST };
                let r = if let (true, Some(ops)) = (prog && flags == BPF_EXIST, ops) {
                    // SAFETY: `ops.arg` is m's hash map (alive); 8-byte key; a 16-byte value
                    // (a program writes one CPU's slot).
                    unsafe {
                        (ops.lookup)(ops.arg, key.as_ptr() as u64, 0, 0, side);
                        match (ops.update)(ops.arg, key.as_ptr() as u64, value_bytes(w, 1).as_ptr() as u64, flags, side)
                            as i64
                        {
                            0 => Ok(()),
                            e => Err(MapError::new(-e as i32, "direct update")),
                        }
                    }
                } else if prog {
                    // SAFETY: 8-byte key; a 16-byte value (a program writes one CPU's slot).
                    unsafe { m.update(key.as_ptr(), value_bytes(w, 1).as_ptr(), flags, side as u32) }
                } else {
                    m.update_elem(&key, &value_bytes(w, copies), flags)
                };
                if r.is_ok() {
                    if flags == BPF_NOEXIST {
                        t.net[k as usize] += 1;
                    }
                    t.last[k as usize] = Some(w[0]);
                }
                r
            }
            4 => {
                let r = if prog {
                    // SAFETY: 8-byte key.
                    unsafe { m.delete(key.as_ptr()) }
                } else {
                    m.delete_elem(&key)
                };
                if r.is_ok() {
                    t.net[k as usize] -= 1;
                }
                r
            }
            5 => {
                let r = m.lookup_and_delete_elem(&key, &mut out);
                if r.is_ok() {
                    t.net[k as usize] -= 1;
                    if !percpu {
                        check_value(k, &out, "lookup_and_delete");
                    }
                }
                r
            }
            6 => {
                let r = m.lookup_elem(&key, &mut out);
                if r.is_ok() && !percpu {
                    check_value(k, &out, "lookup");
                }
                r
            }
            7 => {
                // SAFETY: 8-byte key; the pointer is only checked for being inside a value.
                let p = unsafe { m.lookup(key.as_ptr(), side as u32) };
                assert!(p.is_null() || m.contains(p as u64, VS as u64), "program lookup outside the values");
                Ok(())
            }
            _ => m.get_next_key(Some(&key), &mut nk),
        };
        match r {
            Ok(()) => {}
            Err(e) if e.errno() == libc::ENOENT || e.errno() == libc::EEXIST => {}
            // A lock holder preempted for longer than the wait allows (a loaded machine):
            // the operation had no effect, which the model already assumes.
            Err(e) if e.errno() == libc::EBUSY => t.busy += 1,
            Err(e) => panic!("side {side}: key {k}: unexpected {e}"),
        }
    }
    t
}

/// Compares the map at rest with the sides' tallies, then checks that no element leaked.
fn check(m: &Map, tallies: &[Tally]) {
    let percpu = m.map_type().is_percpu();
    let mut out = vec![0u8; m.value_buf_size()];
    let mut model = Vec::new();
    for k in 0..KEYS {
        let net: i64 = tallies.iter().map(|t| t.net[k as usize]).sum();
        assert!(net == 0 || net == 1, "key {k}: inserts minus deletes = {net} (lost or duplicated entry)");
        let r = m.lookup_elem(&k.to_ne_bytes(), &mut out);
        assert_eq!(r.is_ok(), net == 1, "key {k}: present {} but the model says {}", r.is_ok(), net == 1);
        if net == 1 {
            model.push(k);
            if !percpu {
                check_value(k, &out, "at rest");
                let w0 = u64::from_ne_bytes(out[..8].try_into().unwrap());
                let lasts: Vec<_> = tallies.iter().filter_map(|t| t.last[k as usize]).collect();
                assert!(lasts.contains(&w0), "key {k}: value {w0:#x} is no side's last write {lasts:x?}");
            }
        }
    }
    // Iteration: each key once, the model's set.
    let mut seen = Vec::new();
    let mut cur: Option<[u8; 8]> = None;
    let mut nk = [0u8; 8];
    while m.get_next_key(cur.as_ref().map(|k| &k[..]), &mut nk).is_ok() {
        seen.push(u64::from_ne_bytes(nk));
        cur = Some(nk);
        assert!(seen.len() <= MAX as usize, "iteration does not end");
    }
    let mut sorted = seen.clone();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(sorted.len(), seen.len(), "iteration listed a key twice: {seen:?}");
    assert_eq!(sorted, model, "iteration vs model");
    if let Map::Hash(h) = m {
        assert_eq!(h.len() as usize, model.len(), "element count vs model");
    }
    // No element leaked: MAX - count new keys fit without evicting (LRU) any key, then the
    // map is full: E2BIG, or (LRU) an eviction.
    let v = vec![1u8; m.value_buf_size()];
    let room = MAX as u64 - model.len() as u64;
    for k in 1000..1000 + room {
        assert_eq!(
            errno(m.update_elem(&k.to_ne_bytes(), &v, BPF_NOEXIST)),
            0,
            "insert {k} of {room}: free elements lost"
        );
    }
    for k in &model {
        assert_eq!(errno(m.lookup_elem(&k.to_ne_bytes(), &mut out)), 0, "key {k} evicted before the map was full");
    }
    if let Map::Hash(h) = m {
        assert_eq!(h.len(), MAX);
    }
    let lru = matches!(m.map_type(), BPF_MAP_TYPE_LRU_HASH | BPF_MAP_TYPE_LRU_PERCPU_HASH);
    let r = errno(m.update_elem(&5000u64.to_ne_bytes(), &v, BPF_NOEXIST));
    assert_eq!(r, if lru { 0 } else { libc::E2BIG }, "insert into the full map");
}

fn types() -> [MapType; 4] {
    [BPF_MAP_TYPE_HASH, BPF_MAP_TYPE_PERCPU_HASH, BPF_MAP_TYPE_LRU_HASH, BPF_MAP_TYPE_LRU_PERCPU_HASH]
}

#[test]
fn two_threads_match_the_model() {
    for t in types() {
        let d = TmpDir::new("stress-threads");
        let m = create(&d, &spec(t, 8, VS as u32, MAX, 0));
        let tallies: Vec<Tally> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..2u64)
                .map(|i| {
                    s.spawn({
                        let m = &m;
                        move || side(m, i, 0x5eed + 977 * i)
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        eprintln!("{t:?}: {} EBUSY", tallies.iter().map(|t| t.busy).sum::<u64>());
        check(&m, &tallies);
    }
}

/// The same, with the programs' updates of existing keys made as JIT code makes them (a
/// lookup, then the map's own update through its lookup memo).
#[test]
fn two_threads_with_direct_updates_match_the_model() {
    for t in types() {
        let d = TmpDir::new("stress-direct");
        let m = create(&d, &spec(t, 8, VS as u32, MAX, 0));
        let tallies: Vec<Tally> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..2u64)
                .map(|i| {
                    s.spawn({
                        let m = &m;
                        move || side_with(m, i, 0xd1ec7 + 977 * i, true)
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        eprintln!("{t:?}: {} EBUSY", tallies.iter().map(|t| t.busy).sum::<u64>());
        check(&m, &tallies);
    }
}

fn read_tally(path: &Path) -> Tally {
    let text = std::fs::read_to_string(path).unwrap();
    let mut t = Tally { net: vec![0; KEYS as usize], last: vec![None; KEYS as usize], busy: 0 };
    for (k, line) in text.lines().enumerate() {
        let mut f = line.split(' ');
        t.net[k] = f.next().unwrap().parse().unwrap();
        t.last[k] = f.next().unwrap().parse().ok();
    }
    t
}

fn write_tally(path: &Path, t: &Tally) {
    let text: String = (0..KEYS as usize)
        .map(|k| format!("{} {}\n", t.net[k], t.last[k].map_or("-".to_string(), |v| v.to_string())))
        .collect();
    std::fs::write(path, text).unwrap();
}

#[test]
fn two_processes_match_the_model() {
    for t in types() {
        let d = TmpDir::new("stress-procs");
        let path = d.path("m");
        let m = Map::create(&path, &spec(t, 8, VS as u32, MAX, 0)).unwrap();
        let tally_path = d.path("tally");
        let child = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "stress_child", "--nocapture", "--test-threads=1"])
            .env("USERBPF_STRESS_MAP", &path)
            .env("USERBPF_STRESS_TALLY", &tally_path)
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        let mine = side(&m, 0, 0xfeed);
        let st = child.wait_with_output().unwrap().status;
        assert!(st.success(), "{t:?}: the other process failed: {st}");
        let theirs = read_tally(&tally_path);
        check(&m, &[mine, theirs]);
    }
}

/// The other process of `two_processes_match_the_model`; does nothing as an ordinary test.
#[test]
fn stress_child() {
    let Ok(map) = std::env::var("USERBPF_STRESS_MAP") else { return };
    let tally = PathBuf::from(std::env::var("USERBPF_STRESS_TALLY").unwrap());
    let m = Map::open(Path::new(&map)).unwrap();
    let t = side(&m, 1, 0xbeef);
    write_tally(&tally, &t);
}
