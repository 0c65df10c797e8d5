//! Per-type semantics of the syscall-style and program-side APIs, errno by errno.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};

use common::*;
use libc::{E2BIG, EBADF, EEXIST, EFAULT, EINVAL, ENOENT, ENOMEM, ENOSPC, EOPNOTSUPP};
use userbpf_maps::MapType::*;
use userbpf_maps::*;

fn k32(i: u32) -> [u8; 4] {
    i.to_ne_bytes()
}
fn k64(i: u64) -> [u8; 8] {
    i.to_ne_bytes()
}

#[test]
fn array_syscall_api() {
    let d = TmpDir::new("array");
    let m = create(&d, &spec(BPF_MAP_TYPE_ARRAY, 4, 12, 4, 0));
    let mut v = [0u8; 12];
    assert_eq!(errno(m.lookup_elem(&k32(3), &mut v)), 0);
    assert_eq!(v, [0; 12], "arrays start zeroed");
    assert_eq!(errno(m.lookup_elem(&k32(4), &mut v)), ENOENT);
    assert_eq!(errno(m.update_elem(&k32(1), &[7; 12], BPF_ANY)), 0);
    assert_eq!(errno(m.update_elem(&k32(1), &[8; 12], BPF_EXIST)), 0);
    assert_eq!(errno(m.update_elem(&k32(1), &[9; 12], BPF_NOEXIST)), EEXIST);
    assert_eq!(errno(m.update_elem(&k32(4), &[9; 12], BPF_ANY)), E2BIG);
    assert_eq!(errno(m.update_elem(&k32(1), &[9; 12], 3)), EINVAL);
    assert_eq!(errno(m.update_elem(&k32(1), &[9; 12], BPF_F_LOCK)), EINVAL);
    m.lookup_elem(&k32(1), &mut v).unwrap();
    assert_eq!(v, [8; 12]);
    assert_eq!(errno(m.delete_elem(&k32(1))), EINVAL);
    assert_eq!(errno(m.lookup_and_delete_elem(&k32(1), &mut v)), ENOTSUPP);
    let mut n = [0u8; 4];
    m.get_next_key(None, &mut n).unwrap();
    assert_eq!(n, k32(0));
    m.get_next_key(Some(&k32(2)), &mut n).unwrap();
    assert_eq!(n, k32(3));
    assert_eq!(errno(m.get_next_key(Some(&k32(3)), &mut n)), ENOENT);
    m.get_next_key(Some(&k32(99)), &mut n).unwrap();
    assert_eq!(n, k32(0));
    // Short buffers are refused, not read past.
    assert_eq!(errno(m.lookup_elem(&k32(1), &mut [0u8; 11])), EINVAL);
    assert_eq!(errno(m.lookup_elem(&[1, 0], &mut v)), EINVAL);
}

#[test]
fn array_program_api_and_contains() {
    let d = TmpDir::new("array-prog");
    let m = create(&d, &spec(BPF_MAP_TYPE_ARRAY, 4, 12, 4, 0));
    // SAFETY: keys and values are live buffers of the map's sizes.
    unsafe {
        let p = m.lookup(k32(2).as_ptr(), 0);
        assert!(!p.is_null());
        assert_eq!(p as usize % 8, 0, "values are 8-byte aligned");
        assert!(m.lookup(k32(4).as_ptr(), 0).is_null());
        // Atomic adds through the pointer, as programs do.
        let a = AtomicU64::from_ptr(p.cast());
        a.fetch_add(5, Ordering::Relaxed);
        let mut v = [0u8; 12];
        m.lookup_elem(&k32(2), &mut v).unwrap();
        assert_eq!(u64::from_ne_bytes(v[..8].try_into().unwrap()), 5);
        assert_eq!(errno(m.update(k32(2).as_ptr(), [1u8; 12].as_ptr(), BPF_ANY, 0)), 0);
        assert_eq!(errno(m.update(k32(9).as_ptr(), [1u8; 12].as_ptr(), BPF_ANY, 0)), E2BIG);
        assert_eq!(errno(m.update(k32(2).as_ptr(), [1u8; 12].as_ptr(), BPF_NOEXIST, 0)), EEXIST);
        assert_eq!(errno(m.delete(k32(2).as_ptr())), EINVAL);
        m.lookup_elem(&k32(2), &mut v).unwrap();
        assert_eq!(v, [1; 12]);
        let addr = p as u64;
        assert!(m.contains(addr, 12));
        assert!(m.contains(addr + 4, 8));
        assert!(!m.contains(addr + 4, 9), "padding is not value");
        assert!(!m.contains(addr + 12, 1), "padding is not value");
        assert!(m.contains(addr + 16, 12), "the next value");
        let first = m.lookup(k32(0).as_ptr(), 0) as u64;
        assert!(!m.contains(first - 1, 1));
        let last = m.lookup(k32(3).as_ptr(), 0) as u64;
        assert!(m.contains(last, 12));
        assert!(!m.contains(last + 16, 1));
        assert!(!m.contains(u64::MAX, 2));
    }
    assert_eq!(m.mmapable_offset(), None);
}

#[test]
fn mmapable_array_layout() {
    let d = TmpDir::new("mmap");
    let path = d.path("m");
    let m = Map::create(&path, &spec(BPF_MAP_TYPE_ARRAY, 4, 8, 1000, BPF_F_MMAPABLE)).unwrap();
    let off = m.mmapable_offset().unwrap();
    let len = m.mmapable_len().unwrap();
    assert_eq!(off % 4096, 0);
    assert_eq!(len, 8192);
    m.update_elem(&k32(999), &0x1122_3344_5566_7788u64.to_ne_bytes(), 0).unwrap();
    let file = std::fs::read(&path).unwrap();
    assert!(file.len() >= off + len);
    assert_eq!(&file[off + 999 * 8..off + 1000 * 8], &0x1122_3344_5566_7788u64.to_ne_bytes());
    // SAFETY: key buffer of 4 bytes.
    let p = unsafe { m.lookup(k32(0).as_ptr(), 0) };
    assert_eq!(p as usize, m.shm().as_ptr() as usize + off);
}

#[test]
fn percpu_array() {
    let d = TmpDir::new("pcpu-array");
    let m = create(&d, &spec(BPF_MAP_TYPE_PERCPU_ARRAY, 4, 4, 3, 0));
    let n = m.nr_cpus() as usize;
    assert_eq!(n as u32, shm::possible_cpus());
    assert_eq!(m.value_buf_size(), 8 * n);
    // SAFETY: key and value buffers of the map's sizes.
    unsafe {
        for cpu in 0..n as u32 {
            m.update(k32(1).as_ptr(), (cpu + 10).to_ne_bytes().as_ptr(), BPF_ANY, cpu).unwrap();
        }
        let p0 = m.lookup(k32(1).as_ptr(), 0);
        let plast = m.lookup(k32(1).as_ptr(), n as u32 - 1);
        assert_eq!(p0 == plast, n == 1);
        // A CPU beyond nr_cpus wraps around instead of failing.
        assert_eq!(m.lookup(k32(1).as_ptr(), n as u32), p0);
        assert!(m.contains(plast as u64, 4));
        assert!(!m.contains(plast as u64 + 4, 1));
    }
    let mut buf = vec![0u8; m.value_buf_size()];
    m.lookup_elem(&k32(1), &mut buf).unwrap();
    for cpu in 0..n {
        assert_eq!(&buf[8 * cpu..8 * cpu + 4], &(cpu as u32 + 10).to_ne_bytes());
    }
    // Syscall update writes every CPU.
    let all: Vec<u8> = (0..n).flat_map(|c| (c as u64 * 3).to_ne_bytes()).collect();
    m.update_elem(&k32(2), &all, BPF_EXIST).unwrap();
    m.lookup_elem(&k32(2), &mut buf).unwrap();
    assert_eq!(buf, all);
    assert_eq!(errno(m.update_elem(&k32(2), &all, BPF_NOEXIST)), EEXIST);
    assert_eq!(errno(m.update_elem(&k32(3), &all, BPF_ANY)), E2BIG);
    assert_eq!(errno(m.update_elem(&k32(0), &all[..all.len() - 1], BPF_ANY)), EINVAL);
}

#[test]
fn hash_syscall_api() {
    let d = TmpDir::new("hash");
    let m = create(&d, &spec(BPF_MAP_TYPE_HASH, 8, 4, 3, 0));
    let mut v = [0u8; 4];
    let mut nk = [0u8; 8];
    assert_eq!(errno(m.get_next_key(None, &mut nk)), ENOENT, "empty map");
    assert_eq!(errno(m.lookup_elem(&k64(1), &mut v)), ENOENT);
    assert_eq!(errno(m.update_elem(&k64(1), &k32(10), BPF_EXIST)), ENOENT);
    assert_eq!(errno(m.update_elem(&k64(1), &k32(10), BPF_NOEXIST)), 0);
    assert_eq!(errno(m.update_elem(&k64(1), &k32(11), BPF_NOEXIST)), EEXIST);
    assert_eq!(errno(m.update_elem(&k64(1), &k32(12), BPF_EXIST)), 0);
    assert_eq!(errno(m.update_elem(&k64(1), &k32(12), 3)), EINVAL);
    assert_eq!(errno(m.update_elem(&k64(1), &k32(12), BPF_F_LOCK)), EINVAL);
    m.lookup_elem(&k64(1), &mut v).unwrap();
    assert_eq!(v, k32(12));
    m.update_elem(&k64(2), &k32(20), BPF_ANY).unwrap();
    m.update_elem(&k64(3), &k32(30), BPF_ANY).unwrap();
    assert_eq!(errno(m.update_elem(&k64(4), &k32(40), BPF_ANY)), E2BIG, "full");
    assert_eq!(errno(m.update_elem(&k64(3), &k32(31), BPF_ANY)), 0, "replacing works when full");
    // Iteration: every key once, then ENOENT; a missing key restarts from the first.
    let mut seen = Vec::new();
    let mut cur: Option<[u8; 8]> = None;
    while m.get_next_key(cur.as_ref().map(|k| &k[..]), &mut nk).is_ok() {
        seen.push(u64::from_ne_bytes(nk));
        cur = Some(nk);
    }
    seen.sort();
    assert_eq!(seen, [1, 2, 3]);
    let mut first = [0u8; 8];
    m.get_next_key(None, &mut first).unwrap();
    m.get_next_key(Some(&k64(77)), &mut nk).unwrap();
    assert_eq!(nk, first);
    assert_eq!(errno(m.delete_elem(&k64(77))), ENOENT);
    assert_eq!(errno(m.lookup_and_delete_elem(&k64(2), &mut v)), 0);
    assert_eq!(v, k32(20));
    assert_eq!(errno(m.lookup_and_delete_elem(&k64(2), &mut v)), ENOENT);
    assert_eq!(errno(m.delete_elem(&k64(1))), 0);
    assert_eq!(errno(m.delete_elem(&k64(1))), ENOENT);
    m.update_elem(&k64(5), &k32(50), BPF_ANY).unwrap();
    m.update_elem(&k64(6), &k32(60), BPF_ANY).unwrap();
    assert_eq!(errno(m.update_elem(&k64(7), &k32(70), BPF_ANY)), E2BIG);
    if let Map::Hash(h) = &m {
        assert_eq!(h.len(), 3);
    }
}

#[test]
fn hash_program_api() {
    let d = TmpDir::new("hash-prog");
    let m = create(&d, &spec(BPF_MAP_TYPE_HASH, 5, 16, 8, 0));
    let key = [1u8, 2, 3, 4, 5];
    // SAFETY: key and value buffers of the map's sizes.
    unsafe {
        assert!(m.lookup(key.as_ptr(), 0).is_null());
        m.update(key.as_ptr(), [3u8; 16].as_ptr(), BPF_NOEXIST, 0).unwrap();
        let p = m.lookup(key.as_ptr(), 0);
        assert!(!p.is_null());
        assert_eq!(p as usize % 8, 0);
        assert!(m.contains(p as u64, 16));
        assert!(!m.contains(p as u64 - 1, 1), "the key is not value");
        // The element's second value slot (updates alternate between the two) is value
        // memory too; past both is the next element's header.
        assert!(m.contains(p as u64 + 16, 16));
        assert!(!m.contains(p as u64 + 32, 1));
        assert!(!m.contains(p as u64 + 8, 16), "straddles two slots");
        AtomicU64::from_ptr(p.cast()).fetch_add(1, Ordering::Relaxed);
        let mut v = [0u8; 16];
        m.lookup_elem(&key, &mut v).unwrap();
        assert_eq!(u64::from_ne_bytes(v[..8].try_into().unwrap()), 0x0303_0303_0303_0304);
        assert_eq!(errno(m.update(key.as_ptr(), [4u8; 16].as_ptr(), BPF_NOEXIST, 0)), EEXIST);
        assert_eq!(errno(m.update([9u8; 5].as_ptr(), [4u8; 16].as_ptr(), BPF_EXIST, 0)), ENOENT);
        m.update(key.as_ptr(), [4u8; 16].as_ptr(), BPF_EXIST, 0).unwrap();
        let p2 = m.lookup(key.as_ptr(), 0);
        assert_eq!(std::slice::from_raw_parts(p2, 16), &[4u8; 16]);
        m.delete(key.as_ptr()).unwrap();
        assert!(m.lookup(key.as_ptr(), 0).is_null());
        assert_eq!(errno(m.delete(key.as_ptr())), ENOENT);
    }
}

/// A program's update after its lookup of the same key uses the element the lookup found
/// (the thread's lookup memo) only while that element still holds the key: after the key was
/// deleted and its element reused for another key, the update neither writes the other key's
/// value nor fails, it inserts (BPF_ANY) or reports ENOENT (BPF_EXIST). Through the
/// program-side API and through the direct operations (`prog_ops`, whose update has a fast
/// path of its own for the memo's element).
#[test]
fn update_after_lookup_of_a_deleted_and_reused_element() {
    for direct in [false, true] {
        for t in [BPF_MAP_TYPE_HASH, BPF_MAP_TYPE_PERCPU_HASH, BPF_MAP_TYPE_LRU_HASH, BPF_MAP_TYPE_LRU_PERCPU_HASH] {
            let d = TmpDir::new("memo");
            // One element: a deleted key's element is the next insert's.
            let m = create(&d, &spec(t, 8, 8, 1, 0));
            let ops = m.prog_ops().unwrap();
            let read = |k: u64| {
                let mut buf = vec![0u8; m.value_buf_size()];
                m.lookup_elem(&k64(k), &mut buf).ok().map(|()| u64::from_ne_bytes(buf[..8].try_into().unwrap()))
            };
            // SAFETY: key and value buffers of the map's sizes; `ops.arg` is m's (alive).
            let update = |k: u64, v: u64, flags: u64| unsafe {
                let (k, v) = (k64(k), v.to_ne_bytes());
                if direct {
                    match (ops.update)(ops.arg, k.as_ptr() as u64, v.as_ptr() as u64, flags, 0) as i64 {
                        0 => 0,
                        e => -e as i32,
                    }
                } else {
                    errno(m.update(k.as_ptr(), v.as_ptr(), flags, 0))
                }
            };
            // SAFETY: as above.
            let found = |k: u64| unsafe {
                let k = k64(k);
                if direct {
                    (ops.lookup)(ops.arg, k.as_ptr() as u64, 0, 0, 0) != 0
                } else {
                    !m.lookup(k.as_ptr(), 0).is_null()
                }
            };
            let what = format!("{t:?}, {}", if direct { "direct" } else { "program API" });
            assert_eq!(update(1, 10, BPF_ANY), 0);
            assert!(found(1));
            // The memo's element, key 1: updated in place.
            assert_eq!(update(1, 11, BPF_EXIST), 0);
            assert_eq!(read(1), Some(11), "{what}");
            // Key 1 deleted, its element reused for key 2 (the memo still names it).
            // SAFETY: an 8-byte key.
            unsafe { m.delete(k64(1).as_ptr()).unwrap() };
            assert!(!found(1), "{what}: a deleted key is not found through the memo");
            assert_eq!(update(2, 20, BPF_NOEXIST), 0);
            assert!(!found(1), "{what}: nor once its element holds another key");
            assert!(found(2), "{what}");
            assert!(!found(1) && found(2) && !found(1), "{what}: alternating keys");
            assert_eq!(update(1, 12, BPF_EXIST), ENOENT, "{what}");
            assert_eq!(read(2), Some(20), "{what}: key 2's value untouched");
            assert_eq!(read(1), None, "{what}");
            if matches!(t, BPF_MAP_TYPE_LRU_HASH | BPF_MAP_TYPE_LRU_PERCPU_HASH) {
                // BPF_ANY evicts key 2 for key 1.
                assert_eq!(update(1, 13, BPF_ANY), 0);
                assert_eq!((read(1), read(2)), (Some(13), None), "{what}");
            } else {
                assert_eq!(update(1, 13, BPF_ANY), E2BIG, "{what}: full");
                assert_eq!(read(2), Some(20), "{what}");
            }
            // Looked up again: the memo names the element of the key in the map, written in place.
            let live = if read(1).is_some() { 1 } else { 2 };
            assert!(found(live));
            assert_eq!(update(live, 30, BPF_EXIST), 0);
            assert_eq!(read(live), Some(30), "{what}");
        }
    }
}

/// `Map::prog_ops` (what the JIT calls directly) does what the program-side API does, with
/// the CPU given: lookups (of that CPU's value), updates, deletes, and their errors.
#[test]
fn prog_ops_agree_with_the_program_api() {
    for (t, ks) in [
        (BPF_MAP_TYPE_HASH, 4),
        (BPF_MAP_TYPE_PERCPU_HASH, 8),
        (BPF_MAP_TYPE_LRU_PERCPU_HASH, 16),
        (BPF_MAP_TYPE_HASH, 5),
    ] {
        let d = TmpDir::new("ops");
        let m = create(&d, &spec(t, ks, 8, 4, 0));
        let ops = m.prog_ops().expect("hash maps have direct ops");
        let n = m.nr_cpus() as u64;
        let key = |i: u8| vec![i; ks as usize];
        // SAFETY: `ops.arg` is m's hash map (alive here); keys and values of the map's sizes.
        unsafe {
            let (k1, k9) = (key(1), key(9));
            let v = 5u64.to_ne_bytes();
            assert_eq!((ops.update)(ops.arg, k1.as_ptr() as u64, v.as_ptr() as u64, BPF_NOEXIST, n - 1), 0);
            assert_eq!(
                (ops.update)(ops.arg, k1.as_ptr() as u64, v.as_ptr() as u64, BPF_NOEXIST, 0),
                (-EEXIST) as i64 as u64
            );
            assert_eq!((ops.update)(ops.arg, k9.as_ptr() as u64, v.as_ptr() as u64, 77, 0), (-EINVAL) as i64 as u64);
            assert_eq!(
                (ops.update)(ops.arg, k9.as_ptr() as u64, v.as_ptr() as u64, BPF_EXIST, 0),
                (-ENOENT) as i64 as u64
            );
            for cpu in [0, n - 1] {
                let p = (ops.lookup)(ops.arg, k1.as_ptr() as u64, 0, 0, cpu);
                assert_eq!(p, m.lookup(k1.as_ptr(), cpu as u32) as u64, "{t:?} cpu {cpu}");
                let want = if cpu == n - 1 || !t.is_percpu() { 5 } else { 0 };
                assert_eq!((p as *const u64).read(), want, "{t:?} cpu {cpu}");
            }
            assert_eq!((ops.lookup)(ops.arg, k9.as_ptr() as u64, 0, 0, 0), 0);
            assert_eq!((ops.delete)(ops.arg, k1.as_ptr() as u64, 0, 0, 0), 0);
            assert_eq!((ops.delete)(ops.arg, k1.as_ptr() as u64, 0, 0, 0), (-ENOENT) as i64 as u64);
            assert!(m.lookup(k1.as_ptr(), 0).is_null());
        }
    }
    // Arrays and hashes of maps have none (their helpers stay in charge).
    let d = TmpDir::new("ops-none");
    assert!(create(&d, &spec(BPF_MAP_TYPE_PERCPU_ARRAY, 4, 8, 4, 0)).prog_ops().is_none());
    assert!(create(&d, &spec(BPF_MAP_TYPE_HASH_OF_MAPS, 4, 4, 4, 0)).prog_ops().is_none());
}

#[test]
fn percpu_hash_program_updates_one_cpu() {
    let d = TmpDir::new("pcpu-hash");
    let m = create(&d, &spec(BPF_MAP_TYPE_PERCPU_HASH, 4, 8, 4, 0));
    let n = m.nr_cpus();
    let all: Vec<u8> = (0..n as u64).flat_map(|c| (100 + c).to_ne_bytes()).collect();
    m.update_elem(&k32(1), &all, BPF_ANY).unwrap();
    // SAFETY: key and value buffers of the map's sizes.
    unsafe {
        // Existing element: only this CPU's slot changes.
        m.update(k32(1).as_ptr(), 7u64.to_ne_bytes().as_ptr(), BPF_EXIST, n - 1).unwrap();
        // New element: this CPU's slot set, the others zeroed.
        m.update(k32(2).as_ptr(), 9u64.to_ne_bytes().as_ptr(), BPF_NOEXIST, 0).unwrap();
        let p = m.lookup(k32(2).as_ptr(), 0);
        assert_eq!(p.cast::<u64>().read(), 9);
    }
    let mut buf = vec![0u8; m.value_buf_size()];
    m.lookup_elem(&k32(1), &mut buf).unwrap();
    let mut want = all.clone();
    want[8 * (n as usize - 1)..].copy_from_slice(&7u64.to_ne_bytes());
    assert_eq!(buf, want);
    m.lookup_elem(&k32(2), &mut buf).unwrap();
    let mut want = vec![0u8; 8 * n as usize];
    want[..8].copy_from_slice(&9u64.to_ne_bytes());
    assert_eq!(buf, want);
    assert_eq!(errno(m.lookup_and_delete_elem(&k32(2), &mut buf)), 0);
    assert_eq!(buf, want);
}

#[test]
fn lru_hash_evicts_least_recently_used() {
    let d = TmpDir::new("lru");
    let m = create(&d, &spec(BPF_MAP_TYPE_LRU_HASH, 4, 8, 64, 0));
    for i in 0..64 {
        m.update_elem(&k32(i), &k64(i as u64), BPF_NOEXIST).unwrap();
    }
    // Programs touch the first half.
    for i in 0..32 {
        // SAFETY: 4-byte key.
        assert!(!unsafe { m.lookup(k32(i).as_ptr(), 0) }.is_null());
    }
    // Full: new keys evict instead of failing with E2BIG.
    for i in 100..132 {
        assert_eq!(errno(m.update_elem(&k32(i), &k64(i as u64), BPF_NOEXIST)), 0);
    }
    let mut v = [0u8; 8];
    for i in 0..32 {
        assert_eq!(errno(m.lookup_elem(&k32(i), &mut v)), 0, "recently used key {i} was evicted");
    }
    let present = (32..64).filter(|&i| m.lookup_elem(&k32(i), &mut v).is_ok()).count();
    assert_eq!(present, 0, "the untouched keys go first");
    for i in 100..132 {
        assert_eq!(errno(m.lookup_elem(&k32(i), &mut v)), 0);
    }
    if let Map::Hash(h) = &m {
        assert_eq!(h.len(), 64);
    }
    // Flags still apply.
    assert_eq!(errno(m.update_elem(&k32(0), &k64(0), BPF_NOEXIST)), EEXIST);
    assert_eq!(errno(m.update_elem(&k32(999), &k64(0), BPF_EXIST)), ENOENT);
    // Many more inserts never fail.
    for i in 1000..3000 {
        assert_eq!(errno(m.update_elem(&k32(i), &k64(i as u64), BPF_ANY)), 0);
    }
    let mut n = 0;
    let mut cur: Option<[u8; 4]> = None;
    let mut nk = [0u8; 4];
    while m.get_next_key(cur.as_ref().map(|k| &k[..]), &mut nk).is_ok() {
        n += 1;
        cur = Some(nk);
    }
    assert_eq!(n, 64);
}

#[test]
fn lru_percpu_hash() {
    let d = TmpDir::new("lru-pcpu");
    let m = create(&d, &spec(BPF_MAP_TYPE_LRU_PERCPU_HASH, 4, 4, 8, BPF_F_NO_COMMON_LRU));
    for i in 0..100u32 {
        // SAFETY: key and value buffers of the map's sizes.
        unsafe { m.update(k32(i).as_ptr(), k32(i).as_ptr(), BPF_ANY, i) }.unwrap();
    }
    let mut buf = vec![0u8; m.value_buf_size()];
    assert_eq!(errno(m.lookup_elem(&k32(99), &mut buf)), 0);
    let cpu = 99 % m.nr_cpus() as usize;
    assert_eq!(&buf[8 * cpu..8 * cpu + 4], &k32(99));
}

#[test]
fn hash_spec_checks() {
    let d = TmpDir::new("hash-spec");
    let c = |s: MapSpec| errno(Map::create(&d.path(&format!("{:?}-{}", s.map_type, rand_name())), &s));
    assert_eq!(c(spec(BPF_MAP_TYPE_HASH, 0, 4, 4, 0)), EINVAL);
    assert_eq!(c(spec(BPF_MAP_TYPE_HASH, 4, 0, 4, 0)), EINVAL);
    assert_eq!(c(spec(BPF_MAP_TYPE_HASH, 4, 4, 0, 0)), EINVAL);
    assert_eq!(c(spec(BPF_MAP_TYPE_HASH, 4, 4, 4, BPF_F_NO_COMMON_LRU)), EINVAL);
    assert_eq!(c(spec(BPF_MAP_TYPE_LRU_HASH, 4, 4, 4, BPF_F_NO_PREALLOC)), ENOTSUPP);
    assert_eq!(c(spec(BPF_MAP_TYPE_HASH, 4, 4, 4, BPF_F_MMAPABLE)), EINVAL);
    assert_eq!(c(spec(BPF_MAP_TYPE_HASH_OF_MAPS, 4, 8, 4, 0)), EINVAL);
    assert_eq!(c(spec(BPF_MAP_TYPE_HASH, 4, 4, 4, BPF_F_NO_PREALLOC | BPF_F_ZERO_SEED)), 0);
    // Files beyond the limit.
    assert_eq!(c(spec(BPF_MAP_TYPE_HASH, 64, 4096, 1 << 20, 0)), E2BIG);
    assert_eq!(c(spec(BPF_MAP_TYPE_ARRAY, 4, 1 << 20, 1 << 16, 0)), E2BIG);
    assert_eq!(c(spec(BPF_MAP_TYPE_PERCPU_ARRAY, 4, 32 * 1024 + 1, 1, 0)), E2BIG);
    let mut s = spec(BPF_MAP_TYPE_HASH, 4, 4, 4, 0);
    s.map_extra = 1;
    assert_eq!(c(s), EINVAL);
    // Invalid whether or not these types are built in.
    assert_eq!(c(spec(BPF_MAP_TYPE_RINGBUF, 4, 0, 4096, 0)), EINVAL);
    assert_eq!(c(spec(BPF_MAP_TYPE_PERF_EVENT_ARRAY, 4, 8, 2, 0)), EINVAL);
}

fn rand_name() -> u64 {
    use std::sync::atomic::AtomicU64;
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

#[test]
fn fd_arrays_hold_ids() {
    let d = TmpDir::new("fd-array");
    for t in [BPF_MAP_TYPE_PROG_ARRAY, BPF_MAP_TYPE_ARRAY_OF_MAPS] {
        let m = create(&d, &spec(t, 4, 4, 4, 0));
        let mut v = [0u8; 4];
        assert_eq!(errno(m.lookup_elem(&k32(0), &mut v)), ENOENT, "empty slot");
        assert_eq!(errno(m.update_elem(&k32(0), &k32(17), BPF_NOEXIST)), EINVAL);
        assert_eq!(errno(m.update_elem(&k32(0), &k32(17), BPF_EXIST)), EINVAL);
        assert_eq!(errno(m.update_elem(&k32(4), &k32(17), BPF_ANY)), E2BIG);
        assert_eq!(errno(m.update_elem(&k32(0), &k32(0), BPF_ANY)), EBADF);
        assert_eq!(errno(m.update_elem(&k32(0), &k32(17), BPF_ANY)), 0);
        m.lookup_elem(&k32(0), &mut v).unwrap();
        assert_eq!(v, k32(17));
        // SAFETY: 4-byte keys.
        unsafe {
            let p = m.lookup(k32(0).as_ptr(), 0);
            assert_eq!(p.cast::<u32>().read(), 17);
            assert!(!m.contains(p as u64, 4), "programs may not write ids");
            assert!(m.lookup(k32(1).as_ptr(), 0).is_null());
            assert_eq!(errno(m.update(k32(1).as_ptr(), k32(3).as_ptr(), BPF_ANY, 0)), EINVAL);
        }
        assert_eq!(errno(m.delete_elem(&k32(4))), E2BIG);
        assert_eq!(errno(m.delete_elem(&k32(1))), ENOENT);
        assert_eq!(errno(m.delete_elem(&k32(0))), 0);
        assert_eq!(errno(m.lookup_elem(&k32(0), &mut v)), ENOENT);
        let mut nk = [0u8; 4];
        m.get_next_key(Some(&k32(2)), &mut nk).unwrap();
        assert_eq!(nk, k32(3));
        let c = |s: MapSpec| errno(Map::create(&d.path(&format!("x{}", rand_name())), &s));
        assert_eq!(c(spec(t, 4, 8, 4, 0)), EINVAL);
        assert_eq!(c(spec(t, 4, 4, 4, BPF_F_RDONLY_PROG)), EINVAL);
        assert_eq!(c(spec(t, 4, 4, 4, BPF_F_MMAPABLE)), EINVAL);
    }
}

#[test]
fn hash_of_maps_holds_ids() {
    let d = TmpDir::new("hash-of-maps");
    let m = create(&d, &spec(BPF_MAP_TYPE_HASH_OF_MAPS, 8, 4, 2, 0));
    let mut v = [0u8; 4];
    assert_eq!(errno(m.update_elem(&k64(1), &k32(0), BPF_ANY)), EBADF);
    assert_eq!(errno(m.update_elem(&k64(1), &k32(5), BPF_EXIST)), ENOENT);
    assert_eq!(errno(m.update_elem(&k64(1), &k32(5), BPF_NOEXIST)), 0);
    assert_eq!(errno(m.update_elem(&k64(1), &k32(6), BPF_NOEXIST)), EEXIST);
    m.lookup_elem(&k64(1), &mut v).unwrap();
    assert_eq!(v, k32(5));
    // SAFETY: 8-byte keys.
    unsafe {
        let p = m.lookup(k64(1).as_ptr(), 0);
        assert_eq!(p.cast::<u32>().read(), 5);
        assert!(!m.contains(p as u64, 4));
        assert_eq!(errno(m.update(k64(2).as_ptr(), k32(3).as_ptr(), BPF_ANY, 0)), EINVAL);
    }
    m.update_elem(&k64(2), &k32(7), BPF_ANY).unwrap();
    assert_eq!(errno(m.update_elem(&k64(3), &k32(7), BPF_ANY)), E2BIG);
    m.delete_elem(&k64(1)).unwrap();
    assert_eq!(errno(m.lookup_elem(&k64(1), &mut v)), ENOENT);
}

#[test]
fn queue_and_stack() {
    let d = TmpDir::new("queue");
    let q = create(&d, &spec(BPF_MAP_TYPE_QUEUE, 0, 3, 3, 0));
    let s = create(&d, &spec(BPF_MAP_TYPE_STACK, 0, 3, 3, 0));
    for m in [&q, &s] {
        let mut v = [0u8; 3];
        assert_eq!(errno(m.lookup_elem(&[], &mut v)), ENOENT);
        assert_eq!(errno(m.lookup_and_delete_elem(&[], &mut v)), ENOENT);
        for i in 1..=3u8 {
            m.update_elem(&[], &[i; 3], BPF_ANY).unwrap();
        }
        assert_eq!(errno(m.update_elem(&[], &[4; 3], BPF_ANY)), E2BIG);
        assert_eq!(errno(m.update_elem(&[], &[4; 3], BPF_NOEXIST)), EINVAL);
        assert_eq!(errno(m.update_elem(&[], &[4; 3], 3)), EINVAL);
        // BPF_EXIST overwrites the oldest.
        m.update_elem(&[], &[4; 3], BPF_EXIST).unwrap();
        assert_eq!(errno(m.delete_elem(&[])), EINVAL);
        assert_eq!(errno(m.get_next_key(None, &mut [])), EINVAL);
    }
    let drain = |m: &Map| {
        let mut out = Vec::new();
        let mut v = [0u8; 3];
        // SAFETY: 3-byte value buffer.
        unsafe {
            if m.peek(v.as_mut_ptr()).is_ok() {
                out.push(v[0]);
            }
            while m.pop(v.as_mut_ptr()).is_ok() {
                out.push(v[0]);
            }
        }
        out
    };
    assert_eq!(drain(&q), [2, 2, 3, 4]);
    assert_eq!(drain(&s), [4, 4, 3, 2]);
    // SAFETY: 3-byte value buffers.
    unsafe {
        q.push([9u8; 3].as_ptr(), BPF_ANY).unwrap();
        let mut v = [0u8; 3];
        q.peek(v.as_mut_ptr()).unwrap();
        assert_eq!(v, [9; 3]);
        assert!(q.lookup([].as_ptr(), 0).is_null());
        assert_eq!(errno(q.update([].as_ptr(), v.as_ptr(), 0, 0)), EINVAL);
    }
}

#[test]
fn bloom_filter() {
    let d = TmpDir::new("bloom");
    let mut sp = spec(BPF_MAP_TYPE_BLOOM_FILTER, 0, 8, 100, 0);
    sp.map_extra = 3;
    let m = create(&d, &sp);
    for i in 0..100u64 {
        // SAFETY: 8-byte values.
        unsafe { m.push(k64(i).as_ptr(), BPF_ANY) }.unwrap();
    }
    // SAFETY: 8-byte values.
    unsafe {
        assert_eq!(errno(m.push(k64(1).as_ptr(), BPF_EXIST)), EINVAL);
        for i in 0..100u64 {
            assert_eq!(errno(m.peek(k64(i).as_ptr().cast_mut())), 0);
        }
        let fp = (1000..11000u64).filter(|&i| m.peek(k64(i).as_ptr().cast_mut()).is_ok()).count();
        assert!(fp < 2500, "false positive rate too high: {fp}/10000");
        assert_eq!(errno(m.pop([0u8; 8].as_mut_ptr())), EOPNOTSUPP);
        assert!(m.lookup([].as_ptr(), 0).is_null());
    }
    let mut v = k64(5);
    assert_eq!(errno(m.lookup_elem(&[], &mut v)), 0);
    assert_eq!(v, k64(5), "the value is input only");
    assert_eq!(errno(m.delete_elem(&[])), EOPNOTSUPP);
    assert_eq!(errno(m.get_next_key(None, &mut [])), EOPNOTSUPP);
    sp.map_extra = 16;
    assert_eq!(errno(Map::create(&d.path("bad"), &sp)), EINVAL);
}

fn lpm_key(plen: u32, a: [u8; 4]) -> [u8; 8] {
    let mut k = [0u8; 8];
    k[..4].copy_from_slice(&plen.to_ne_bytes());
    k[4..].copy_from_slice(&a);
    k
}

#[test]
fn lpm_trie() {
    let d = TmpDir::new("lpm");
    let m = create(&d, &spec(BPF_MAP_TYPE_LPM_TRIE, 8, 4, 5, BPF_F_NO_PREALLOC));
    // The example of the kernel's lpm_trie.c.
    m.update_elem(&lpm_key(16, [192, 168, 0, 0]), &k32(16), BPF_ANY).unwrap();
    m.update_elem(&lpm_key(24, [192, 168, 0, 0]), &k32(240), BPF_ANY).unwrap();
    m.update_elem(&lpm_key(24, [192, 168, 1, 0]), &k32(241), BPF_ANY).unwrap();
    m.update_elem(&lpm_key(24, [192, 168, 128, 0]), &k32(242), BPF_ANY).unwrap();
    let look = |a: [u8; 4]| {
        let mut v = [0u8; 4];
        m.lookup_elem(&lpm_key(32, a), &mut v).ok().map(|_| u32::from_ne_bytes(v))
    };
    assert_eq!(look([192, 168, 0, 1]), Some(240));
    assert_eq!(look([192, 168, 1, 1]), Some(241));
    assert_eq!(look([192, 168, 128, 9]), Some(242));
    assert_eq!(look([192, 168, 2, 1]), Some(16));
    assert_eq!(look([10, 0, 0, 1]), None);
    // SAFETY: 8-byte keys.
    unsafe {
        let p = m.lookup(lpm_key(32, [192, 168, 2, 1]).as_ptr(), 0);
        assert_eq!(p.cast::<u32>().read(), 16);
        assert!(m.contains(p as u64, 4));
        assert!(!m.contains(p as u64 + 4, 1));
        assert!(!m.contains(p as u64 - 1, 1));
    }
    // Post-order iteration: more specific prefixes first.
    let mut order = Vec::new();
    let mut cur: Option<[u8; 8]> = None;
    let mut nk = [0u8; 8];
    while m.get_next_key(cur.as_ref().map(|k| &k[..]), &mut nk).is_ok() {
        order.push((u32::from_ne_bytes(nk[..4].try_into().unwrap()), nk[6]));
        cur = Some(nk);
    }
    assert_eq!(order, [(24, 0), (24, 1), (24, 128), (16, 0)]);
    // Errors.
    assert_eq!(errno(m.update_elem(&lpm_key(33, [0; 4]), &k32(0), BPF_ANY)), EINVAL);
    assert_eq!(errno(m.update_elem(&lpm_key(8, [10, 0, 0, 0]), &k32(0), 3)), EINVAL);
    assert_eq!(errno(m.update_elem(&lpm_key(8, [10, 0, 0, 0]), &k32(0), BPF_EXIST)), ENOENT);
    assert_eq!(errno(m.update_elem(&lpm_key(16, [192, 168, 0, 0]), &k32(0), BPF_NOEXIST)), EEXIST);
    m.update_elem(&lpm_key(8, [10, 0, 0, 0]), &k32(8), BPF_NOEXIST).unwrap();
    assert_eq!(errno(m.update_elem(&lpm_key(8, [11, 0, 0, 0]), &k32(0), BPF_ANY)), ENOSPC);
    assert_eq!(errno(m.delete_elem(&lpm_key(8, [11, 0, 0, 0]))), ENOENT);
    assert_eq!(errno(m.delete_elem(&lpm_key(40, [11, 0, 0, 0]))), EINVAL);
    assert_eq!(errno(m.delete_elem(&lpm_key(16, [192, 168, 0, 0]))), 0);
    assert_eq!(look([192, 168, 2, 1]), None);
    assert_eq!(look([192, 168, 0, 1]), Some(240));
    assert_eq!(errno(m.lookup_and_delete_elem(&lpm_key(8, [10, 0, 0, 0]), &mut [0u8; 4])), ENOTSUPP);
    // Creation rules.
    assert_eq!(errno(Map::create(&d.path("a"), &spec(BPF_MAP_TYPE_LPM_TRIE, 8, 4, 5, 0))), EINVAL);
    assert_eq!(errno(Map::create(&d.path("b"), &spec(BPF_MAP_TYPE_LPM_TRIE, 4, 4, 5, BPF_F_NO_PREALLOC))), EINVAL);
    assert_eq!(errno(Map::create(&d.path("c"), &spec(BPF_MAP_TYPE_LPM_TRIE, 261, 4, 5, BPF_F_NO_PREALLOC))), EINVAL);
}

#[test]
fn lpm_trie_program_side() {
    let d = TmpDir::new("lpm-prog");
    let m = create(&d, &spec(BPF_MAP_TYPE_LPM_TRIE, 8, 8, 100, BPF_F_NO_PREALLOC));
    // SAFETY: 8-byte keys and values.
    unsafe {
        for i in 0..32u32 {
            let k = lpm_key(i, [0xff; 4]);
            m.update(k.as_ptr(), k64(i as u64).as_ptr(), BPF_ANY, 0).unwrap();
        }
        let p = m.lookup(lpm_key(32, [0xff, 0xff, 0xff, 0xfe]).as_ptr(), 0);
        assert_eq!(p.cast::<u64>().read(), 31);
        m.delete(lpm_key(31, [0xff; 4]).as_ptr()).unwrap();
        let p = m.lookup(lpm_key(32, [0xff, 0xff, 0xff, 0xfe]).as_ptr(), 0);
        assert_eq!(p.cast::<u64>().read(), 30);
        assert!(m.lookup(lpm_key(33, [0xff; 4]).as_ptr(), 0).is_null());
    }
}

#[test]
fn stack_trace() {
    let d = TmpDir::new("stack");
    // 3 entries, 4 buckets (ids 0..4), 4 frames deep.
    let m = create(&d, &spec(BPF_MAP_TYPE_STACK_TRACE, 4, 32, 3, 0));
    let a = [0x1000u64, 0x2000, 0x3000];
    let id = m.get_stackid(&a, 0).unwrap();
    assert!(id < 4);
    assert_eq!(m.get_stackid(&a, 0), Ok(id), "same stack, same id");
    let mut v = [0u8; 32];
    m.lookup_elem(&k32(id), &mut v).unwrap();
    let ips: Vec<u64> = v.chunks(8).map(|c| u64::from_ne_bytes(c.try_into().unwrap())).collect();
    assert_eq!(ips, [0x1000, 0x2000, 0x3000, 0], "zero padded");
    // Skipping frames and truncation to the value's depth.
    let long = [1u64, 2, 3, 4, 5, 6, 7];
    let id2 = m.get_stackid(&long, 2 | BPF_F_REUSE_STACKID).unwrap();
    m.lookup_elem(&k32(id2), &mut v).unwrap();
    let ips: Vec<u64> = v.chunks(8).map(|c| u64::from_ne_bytes(c.try_into().unwrap())).collect();
    assert_eq!(ips, [3, 4, 5, 6]);
    assert_eq!(errno(m.get_stackid(&long[..2], 2)), EFAULT);
    assert_eq!(errno(m.get_stackid(&long, 1 << 20)), EINVAL);
    // Find a stack colliding with `a`'s bucket.
    let empty = TmpDir::new("stack2");
    let m = create(&empty, &spec(BPF_MAP_TYPE_STACK_TRACE, 4, 32, 3, 0));
    let id = m.get_stackid(&a, 0).unwrap();
    let other = (1..1000u64)
        .map(|i| [i, i * 7])
        .find(|s| {
            let probe = TmpDir::new("stack-probe");
            let p = create(&probe, &spec(BPF_MAP_TYPE_STACK_TRACE, 4, 32, 3, 0));
            p.get_stackid(s, 0) == Ok(id)
        })
        .unwrap();
    assert_eq!(errno(m.get_stackid(&other, 0)), EEXIST, "collision without REUSE");
    assert_eq!(m.get_stackid(&other, BPF_F_REUSE_STACKID), Ok(id));
    m.lookup_elem(&k32(id), &mut v).unwrap();
    assert_eq!(u64::from_ne_bytes(v[..8].try_into().unwrap()), other[0]);
    assert_eq!(errno(m.get_stackid(&a, 0)), EEXIST);
    // FAST_STACK_CMP trusts the hash only: the same stack matches.
    assert_eq!(m.get_stackid(&other, BPF_F_FAST_STACK_CMP), Ok(id));
    // get_next_key, delete, errors.
    let mut nk = [0u8; 4];
    m.get_next_key(None, &mut nk).unwrap();
    assert_eq!(nk, k32(id));
    assert_eq!(errno(m.get_next_key(Some(&k32(id)), &mut nk)), ENOENT);
    assert_eq!(errno(m.lookup_elem(&k32(4), &mut v)), ENOENT);
    assert_eq!(errno(m.update_elem(&k32(id), &v, 0)), EINVAL);
    assert_eq!(errno(m.delete_elem(&k32(4))), E2BIG);
    assert_eq!(errno(m.delete_elem(&k32(id))), 0);
    assert_eq!(errno(m.delete_elem(&k32(id))), ENOENT);
    assert_eq!(errno(m.lookup_elem(&k32(id), &mut v)), ENOENT);
    // SAFETY: 4-byte key.
    assert!(unsafe { m.lookup(k32(id).as_ptr(), 0) }.is_null());
    // Exhaustion: with every element in use, a REUSE of an occupied bucket needs a free
    // element first and fails with ENOMEM, as in the kernel.
    let full = TmpDir::new("stack3");
    let m = create(&full, &spec(BPF_MAP_TYPE_STACK_TRACE, 4, 8, 2, 0));
    let mut ids = std::collections::BTreeSet::new();
    let mut i = 1u64;
    while ids.len() < 2 {
        if let Ok(id) = m.get_stackid(&[i], 0) {
            ids.insert(id);
        }
        i += 1;
    }
    let mut saw_enomem = false;
    for j in 1000..1100u64 {
        match errno(m.get_stackid(&[j], BPF_F_REUSE_STACKID)) {
            ENOMEM => saw_enomem = true,
            0 | EEXIST => {}
            e => panic!("unexpected errno {e}"),
        }
    }
    assert!(saw_enomem);
    assert_eq!(errno(Map::create(&full.path("x"), &spec(BPF_MAP_TYPE_STACK_TRACE, 4, 12, 3, 0))), EINVAL);
    assert_eq!(errno(Map::create(&full.path("y"), &spec(BPF_MAP_TYPE_STACK_TRACE, 4, 8 * 128, 3, 0))), EINVAL);
}

#[test]
fn header_fields() {
    let d = TmpDir::new("header");
    let path = d.path("m");
    let mut s = spec(BPF_MAP_TYPE_HASH, 4, 4, 4, 0);
    s.name = "a_rather_long_map_name".into();
    let m = Map::create(&path, &s).unwrap();
    assert_eq!(m.spec().name, "a_rather_long_m");
    assert_eq!(m.id(), 0);
    let o = Map::open(&path).unwrap();
    m.set_id(42);
    assert_eq!(o.id(), 42);
    assert_eq!(o.spec(), m.spec());
    assert_eq!(o.nr_cpus(), m.nr_cpus());
    assert_eq!(errno(Map::create(&path, &s)), EEXIST, "create is exclusive");
    assert_eq!(errno(Map::open(&d.path("missing"))), ENOENT);
}
