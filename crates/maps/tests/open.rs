//! `Map::open` refuses files that are not sound maps, and a map whose body was corrupted
//! (by a bug or another process) never crashes or hangs the processes using it.

mod common;

use std::io::{Seek, SeekFrom, Write};
use std::path::Path;
use std::time::{Duration, Instant};

use common::*;
use userbpf_maps::MapType::*;
use userbpf_maps::*;

fn write_at(path: &Path, off: u64, bytes: &[u8]) {
    let mut f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.seek(SeekFrom::Start(off)).unwrap();
    f.write_all(bytes).unwrap();
}

#[test]
fn refuses_bad_files() {
    let d = TmpDir::new("open-bad");
    let good = d.path("good");
    drop(Map::create(&good, &spec(BPF_MAP_TYPE_HASH, 8, 8, 1000, 0)).unwrap());
    let len = std::fs::metadata(&good).unwrap().len();
    assert!(Map::open(&good).is_ok());

    let copy = |name: &str| {
        let p = d.path(name);
        std::fs::copy(&good, &p).unwrap();
        p
    };
    let einval = |p: &Path| assert_eq!(errno(Map::open(p)), libc::EINVAL, "{p:?} should be refused");

    // Truncated anywhere.
    for (i, cut) in [0, 10, 64, 4095, 4096, len / 2, len - 1].into_iter().enumerate() {
        let p = copy(&format!("trunc{i}"));
        std::fs::OpenOptions::new().write(true).open(&p).unwrap().set_len(cut).unwrap();
        einval(&p);
    }
    // Not a map at all.
    let p = d.path("garbage");
    std::fs::write(&p, Rng::new(5).bytes(3 * 4096)).unwrap();
    einval(&p);
    let p = d.path("zeros");
    std::fs::write(&p, vec![0u8; 4 * 4096]).unwrap();
    einval(&p);
    // Header fields: version, type, sizes, flags, cpus.
    let fields: [(u64, &[u8]); 9] = [
        (8, &99u32.to_ne_bytes()),           // layout version
        (12, &200u32.to_ne_bytes()),         // unknown map type
        (12, &27u32.to_ne_bytes()),          // ring buffer: not built here
        (16, &0u32.to_ne_bytes()),           // key_size 0
        (20, &0u32.to_ne_bytes()),           // value_size 0
        (24, &u32::MAX.to_ne_bytes()),       // max_entries: file far too short
        (28, &BPF_F_MMAPABLE.to_ne_bytes()), // flag the type refuses
        (40, &0u32.to_ne_bytes()),           // nr_cpus 0
        (40, &1_000_000u32.to_ne_bytes()),   // nr_cpus absurd
    ];
    for (i, (off, bytes)) in fields.iter().enumerate() {
        let p = copy(&format!("field{i}"));
        write_at(&p, *off, bytes);
        einval(&p);
    }
    // A per-CPU map whose header claims more CPUs than its file holds.
    let pc = d.path("pcpu");
    drop(Map::create(&pc, &spec(BPF_MAP_TYPE_PERCPU_ARRAY, 4, 64, 1000, 0)).unwrap());
    write_at(&pc, 40, &512u32.to_ne_bytes());
    einval(&pc);
}

/// Every operation of both APIs on random keys and values, bounded in time.
fn exercise(m: &Map, rng: &mut Rng, ops: usize) {
    let s = m.spec().clone();
    let ks = s.key_size as usize;
    let vb = m.value_buf_size().max(s.value_size as usize);
    let deadline = Instant::now() + Duration::from_secs(60);
    for _ in 0..ops {
        assert!(Instant::now() < deadline, "operations on a corrupt map take too long");
        let mut key = rng.bytes(ks);
        if ks >= 4 && rng.below(2) == 0 {
            // Small indices and prefix lengths reach real elements.
            key[..4].copy_from_slice(&(rng.below(40) as u32).to_ne_bytes());
        }
        let val = rng.bytes(vb);
        let mut out = vec![0u8; vb];
        let mut nk = vec![0u8; ks];
        let _ = m.lookup_elem(&key, &mut out);
        let _ = m.update_elem(&key, &val, rng.below(3));
        let _ = m.get_next_key(Some(&key), &mut nk);
        let _ = m.get_next_key(None, &mut nk);
        let _ = m.delete_elem(&key);
        let _ = m.lookup_and_delete_elem(&key, &mut out);
        let _ = m.get_stackid(&[rng.next_u64(), rng.next_u64()], rng.below(1 << 11));
        let cpu = rng.below(300) as u32;
        // SAFETY: key and value buffers hold at least key_size / value_size bytes.
        unsafe {
            let p = m.lookup(key.as_ptr(), cpu);
            if !p.is_null() {
                assert!(m.contains(p as u64, 1) || !matches!(s.map_type, BPF_MAP_TYPE_ARRAY | BPF_MAP_TYPE_HASH));
            }
            let _ = m.update(key.as_ptr(), val.as_ptr(), rng.below(3), cpu);
            let _ = m.delete(key.as_ptr());
            let _ = m.push(val.as_ptr(), rng.below(3));
            let _ = m.pop(out.as_mut_ptr());
            let _ = m.peek(out.as_mut_ptr());
        }
    }
    // Iterations end.
    let mut cur: Option<Vec<u8>> = None;
    for _ in 0..100_000 {
        let mut nk = vec![0u8; ks];
        if m.get_next_key(cur.as_deref(), &mut nk).is_err() {
            return;
        }
        cur = Some(nk);
    }
}

fn all_specs() -> Vec<MapSpec> {
    let mut bloom = spec(BPF_MAP_TYPE_BLOOM_FILTER, 0, 8, 64, 0);
    bloom.map_extra = 3;
    vec![
        spec(BPF_MAP_TYPE_HASH, 4, 8, 16, 0),
        spec(BPF_MAP_TYPE_HASH, 13, 3, 16, 0),
        spec(BPF_MAP_TYPE_PERCPU_HASH, 4, 8, 16, 0),
        spec(BPF_MAP_TYPE_LRU_HASH, 4, 8, 16, 0),
        spec(BPF_MAP_TYPE_LRU_PERCPU_HASH, 8, 8, 16, 0),
        spec(BPF_MAP_TYPE_HASH_OF_MAPS, 4, 4, 16, 0),
        spec(BPF_MAP_TYPE_ARRAY, 4, 8, 16, 0),
        spec(BPF_MAP_TYPE_PERCPU_ARRAY, 4, 8, 16, 0),
        spec(BPF_MAP_TYPE_PROG_ARRAY, 4, 4, 16, 0),
        spec(BPF_MAP_TYPE_ARRAY_OF_MAPS, 4, 4, 16, 0),
        spec(BPF_MAP_TYPE_STACK_TRACE, 4, 16, 16, 0),
        spec(BPF_MAP_TYPE_QUEUE, 0, 8, 16, 0),
        spec(BPF_MAP_TYPE_STACK, 0, 5, 16, 0),
        bloom,
        spec(BPF_MAP_TYPE_LPM_TRIE, 8, 8, 16, BPF_F_NO_PREALLOC),
        spec(BPF_MAP_TYPE_LPM_TRIE, 5, 3, 16, BPF_F_NO_PREALLOC),
    ]
}

#[test]
fn corrupt_bodies_never_crash_or_hang() {
    let d = TmpDir::new("corrupt");
    let mut rng = Rng::new(99);
    for (i, s) in all_specs().iter().enumerate() {
        for pattern in 0..3 {
            let path = d.path(&format!("m{i}-{pattern}"));
            let m = Map::create(&path, s).unwrap();
            exercise(&m, &mut rng, 30);
            drop(m);
            // Overwrite everything after the header: random bytes, small integers (links that
            // point at real elements and form cycles), or all ones.
            let len = std::fs::metadata(&path).unwrap().len() as usize;
            let body: Vec<u8> = match pattern {
                0 => rng.bytes(len - 64),
                1 => (0..(len - 64) / 4).flat_map(|_| (rng.below(6) as u32).to_ne_bytes()).collect(),
                _ => vec![0xff; len - 64],
            };
            write_at(&path, 64, &body);
            let m = Map::open(&path).unwrap();
            exercise(&m, &mut rng, 6);
        }
    }
}
