//! Several processes sharing map files: the test binary runs itself as the other processes
//! (the `child` test does the work when USERBPF_MAPS_CHILD names a role).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use common::*;
use userbpf_maps::MapType::*;
use userbpf_maps::*;

const ADDS: u64 = 300_000;

fn spawn(role: &str, dir: &Path) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child", "--nocapture", "--test-threads=1"])
        .env("USERBPF_MAPS_CHILD", role)
        .env("USERBPF_MAPS_DIR", dir)
        // The child's own test-harness summary would read as this run's; panics go to stderr.
        .stdout(Stdio::null())
        .spawn()
        .unwrap()
}

fn wait_ok(mut c: Child) {
    let st = c.wait().unwrap();
    assert!(st.success(), "child failed: {st}");
}

fn k32(i: u32) -> [u8; 4] {
    i.to_ne_bytes()
}

/// Work done by both the parent and the children on the shared maps.
fn add_and_write(dir: &Path, who: u32) {
    let arr = Map::open(&dir.join("array")).unwrap();
    let hash = Map::open(&dir.join("hash")).unwrap();
    for i in 0..ADDS {
        // SAFETY: 4-byte keys; the values are 8-aligned u64s in the shared mapping.
        unsafe {
            let p = arr.lookup(k32(0).as_ptr(), 0);
            AtomicU64::from_ptr(p.cast()).fetch_add(1, Ordering::Relaxed);
            let p = hash.lookup(k32(1).as_ptr(), 0);
            AtomicU64::from_ptr(p.cast()).fetch_add(1, Ordering::Relaxed);
        }
        // Contended inserts and deletes on a few shared buckets too.
        if i % 64 == 0 {
            let k = k32(10 + (i / 64 % 8) as u32);
            loop {
                // SAFETY: 4-byte key, 8-byte value.
                match unsafe { hash.update(k.as_ptr(), (i + 1).to_ne_bytes().as_ptr(), BPF_ANY, 0) } {
                    Err(e) if e.errno() == libc::EBUSY => continue,
                    r => {
                        r.unwrap();
                        break;
                    }
                }
            }
            let _ = hash.delete_elem(&k);
        }
    }
    // Entries only this process writes.
    for i in 0..50u32 {
        hash.update_elem(&k32(1000 * who + i), &(who as u64).to_ne_bytes(), BPF_NOEXIST).unwrap();
    }
}

fn parent_fixture(d: &TmpDir) {
    Map::create(&d.path("array"), &spec(BPF_MAP_TYPE_ARRAY, 4, 8, 4, 0)).unwrap();
    let h = Map::create(&d.path("hash"), &spec(BPF_MAP_TYPE_HASH, 4, 8, 1024, 0)).unwrap();
    h.update_elem(&k32(1), &0u64.to_ne_bytes(), BPF_ANY).unwrap();
}

#[test]
fn counters_and_entries_are_shared() {
    let d = TmpDir::new("mp");
    parent_fixture(&d);
    let c1 = spawn("adder:1", d.dir());
    let c2 = spawn("adder:2", d.dir());
    add_and_write(d.dir(), 3);
    wait_ok(c1);
    wait_ok(c2);
    let arr = Map::open(&d.path("array")).unwrap();
    let hash = Map::open(&d.path("hash")).unwrap();
    let mut v = [0u8; 8];
    arr.lookup_elem(&k32(0), &mut v).unwrap();
    assert_eq!(u64::from_ne_bytes(v), 3 * ADDS, "lost array updates");
    hash.lookup_elem(&k32(1), &mut v).unwrap();
    assert_eq!(u64::from_ne_bytes(v), 3 * ADDS, "lost hash updates");
    for who in 1..=3u32 {
        for i in 0..50 {
            hash.lookup_elem(&k32(1000 * who + i), &mut v).unwrap();
            assert_eq!(u64::from_ne_bytes(v), who as u64);
        }
    }
}

fn typed_fixture(dir: &Path) -> Vec<(PathBuf, MapSpec)> {
    let mut bloom = spec(BPF_MAP_TYPE_BLOOM_FILTER, 0, 4, 100, 0);
    bloom.map_extra = 4;
    [
        ("lpm", spec(BPF_MAP_TYPE_LPM_TRIE, 8, 4, 16, BPF_F_NO_PREALLOC)),
        ("queue", spec(BPF_MAP_TYPE_QUEUE, 0, 4, 16, 0)),
        ("stack", spec(BPF_MAP_TYPE_STACK, 0, 4, 16, 0)),
        ("bloom", bloom),
        ("stacktrace", spec(BPF_MAP_TYPE_STACK_TRACE, 4, 16, 16, 0)),
        ("pcpu", spec(BPF_MAP_TYPE_PERCPU_HASH, 4, 4, 16, 0)),
        ("lru", spec(BPF_MAP_TYPE_LRU_HASH, 4, 4, 16, 0)),
        ("progs", spec(BPF_MAP_TYPE_PROG_ARRAY, 4, 4, 4, 0)),
    ]
    .into_iter()
    .map(|(n, s)| (dir.join(n), s))
    .collect()
}

fn lpm_key(plen: u32, a: [u8; 4]) -> [u8; 8] {
    let mut k = [0u8; 8];
    k[..4].copy_from_slice(&plen.to_ne_bytes());
    k[4..].copy_from_slice(&a);
    k
}

#[test]
fn every_type_is_visible_to_another_process() {
    let d = TmpDir::new("mp-types");
    let maps: Vec<Map> = typed_fixture(d.dir()).iter().map(|(p, s)| Map::create(p, s).unwrap()).collect();
    maps[0].update_elem(&lpm_key(16, [10, 1, 0, 0]), &k32(16), BPF_ANY).unwrap();
    maps[1].update_elem(&[], &k32(5), BPF_ANY).unwrap();
    maps[1].update_elem(&[], &k32(6), BPF_ANY).unwrap();
    maps[2].update_elem(&[], &k32(5), BPF_ANY).unwrap();
    maps[2].update_elem(&[], &k32(6), BPF_ANY).unwrap();
    maps[3].update_elem(&[], &k32(77), BPF_ANY).unwrap();
    let id = maps[4].get_stackid(&[0xdead, 0xbeef], 0).unwrap();
    std::fs::write(d.path("stackid"), id.to_string()).unwrap();
    let all: Vec<u8> = (0..maps[5].nr_cpus()).flat_map(|c| (c as u64 + 1).to_ne_bytes()).collect();
    maps[5].update_elem(&k32(3), &all, BPF_ANY).unwrap();
    maps[6].update_elem(&k32(4), &k32(44), BPF_ANY).unwrap();
    maps[7].update_elem(&k32(2), &k32(9), BPF_ANY).unwrap();
    wait_ok(spawn("reader", d.dir()));
    // The child popped one element from each of the queue and the stack.
    let mut v = [0u8; 4];
    maps[1].lookup_and_delete_elem(&[], &mut v).unwrap();
    assert_eq!(v, k32(6));
    maps[2].lookup_and_delete_elem(&[], &mut v).unwrap();
    assert_eq!(v, k32(5));
    // And wrote to the trie.
    maps[0].lookup_elem(&lpm_key(32, [10, 2, 3, 4]), &mut v).unwrap();
    assert_eq!(v, k32(8));
}

fn reader(dir: &Path) {
    let maps: Vec<Map> = typed_fixture(dir).iter().map(|(p, _)| Map::open(p).unwrap()).collect();
    let mut v = [0u8; 4];
    maps[0].lookup_elem(&lpm_key(32, [10, 1, 9, 9]), &mut v).unwrap();
    assert_eq!(v, k32(16));
    maps[0].update_elem(&lpm_key(8, [10, 0, 0, 0]), &k32(8), BPF_ANY).unwrap();
    maps[1].lookup_and_delete_elem(&[], &mut v).unwrap();
    assert_eq!(v, k32(5), "queue: first in, first out");
    maps[2].lookup_and_delete_elem(&[], &mut v).unwrap();
    assert_eq!(v, k32(6), "stack: last in, first out");
    let mut probe = k32(77);
    maps[3].lookup_elem(&[], &mut probe).unwrap();
    let id: u32 = std::fs::read_to_string(dir.join("stackid")).unwrap().parse().unwrap();
    let mut ips = [0u8; 16];
    maps[4].lookup_elem(&id.to_ne_bytes(), &mut ips).unwrap();
    assert_eq!(u64::from_ne_bytes(ips[..8].try_into().unwrap()), 0xdead);
    assert_eq!(maps[4].get_stackid(&[0xdead, 0xbeef], 0), Ok(id));
    let mut all = vec![0u8; maps[5].value_buf_size()];
    maps[5].lookup_elem(&k32(3), &mut all).unwrap();
    for c in 0..maps[5].nr_cpus() as usize {
        assert_eq!(u64::from_ne_bytes(all[8 * c..8 * c + 8].try_into().unwrap()), c as u64 + 1);
    }
    maps[6].lookup_elem(&k32(4), &mut v).unwrap();
    assert_eq!(v, k32(44));
    maps[7].lookup_elem(&k32(2), &mut v).unwrap();
    assert_eq!(v, k32(9));
}

#[test]
fn a_dead_holder_does_not_block_others() {
    let d = TmpDir::new("mp-dead");
    let q = Map::create(&d.path("q"), &spec(BPF_MAP_TYPE_QUEUE, 0, 8, 4, 0)).unwrap();
    // The child takes the queue's lock (offset 128, see queue_stack.rs) and exits holding it.
    wait_ok(spawn("die-holding-lock", d.dir()));
    // SAFETY: offset 128 of the mapping is the 4-aligned lock word.
    let lock = unsafe { AtomicU32::from_ptr(q.shm().as_ptr().add(128).cast()) };
    assert_ne!(lock.load(Ordering::Relaxed), 0, "the child left the lock taken");
    assert_eq!(errno(q.update_elem(&[], &[1u8; 8], BPF_ANY)), 0);
    // SAFETY: 8-byte value.
    assert_eq!(errno(unsafe { q.push([2u8; 8].as_ptr(), BPF_ANY) }), 0);
}

/// The other processes' side; does nothing when run as an ordinary test.
#[test]
fn child() {
    let Ok(role) = std::env::var("USERBPF_MAPS_CHILD") else { return };
    let dir = PathBuf::from(std::env::var("USERBPF_MAPS_DIR").unwrap());
    match role.split_once(':') {
        Some(("adder", who)) => add_and_write(&dir, who.parse().unwrap()),
        _ if role == "reader" => reader(&dir),
        _ if role == "die-holding-lock" => {
            let q = Map::open(&dir.join("q")).unwrap();
            // SAFETY: offset 128 of the mapping is the 4-aligned lock word.
            let lock = unsafe { AtomicU32::from_ptr(q.shm().as_ptr().add(128).cast()) };
            lock.compare_exchange(0, std::process::id(), Ordering::Acquire, Ordering::Relaxed).unwrap();
            // Exit without unlocking, as a killed process would.
            std::process::exit(0);
        }
        _ => panic!("unknown role {role}"),
    }
}
