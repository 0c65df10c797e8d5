//! Rough timings of the program-side hot path (`cargo test --release -p userbpf-maps --test
//! hot_path_timing -- --ignored --nocapture`). Not a benchmark suite: a quick check that
//! array lookups stay around 2 ns and hash lookups of 8-byte keys well under 20 ns.

mod common;

use std::hint::black_box;
use std::time::Instant;

use common::*;
use userbpf_maps::MapType::*;
use userbpf_maps::*;

fn time(name: &str, n: u64, mut f: impl FnMut(u64)) -> f64 {
    for i in 0..n / 10 {
        f(i);
    }
    // The best of a few rounds: other work on the machine only ever adds time.
    let mut ns = f64::MAX;
    for _ in 0..5 {
        let t = Instant::now();
        for i in 0..n / 5 {
            f(i);
        }
        ns = ns.min(t.elapsed().as_nanos() as f64 / (n / 5) as f64);
    }
    eprintln!("{name:<40} {ns:6.2} ns/op");
    ns
}

#[test]
#[ignore]
fn hot_path_timing() {
    let d = TmpDir::new("timing");
    let arr = create(&d, &spec(BPF_MAP_TYPE_ARRAY, 4, 8, 1024, 0));
    let pcpu = create(&d, &spec(BPF_MAP_TYPE_PERCPU_ARRAY, 4, 8, 1024, 0));
    const MAX: u64 = 1 << 16;
    let hash = create(&d, &spec(BPF_MAP_TYPE_HASH, 8, 8, MAX as u32, 0));
    let lru = create(&d, &spec(BPF_MAP_TYPE_LRU_HASH, 8, 8, MAX as u32, 0));
    let lpm = create(&d, &spec(BPF_MAP_TYPE_LPM_TRIE, 8, 8, 1024, BPF_F_NO_PREALLOC));
    let mix = |i: u64| i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 16;
    for i in 0..MAX / 2 {
        hash.update_elem(&mix(i).to_ne_bytes(), &i.to_ne_bytes(), BPF_ANY).unwrap();
        lru.update_elem(&mix(i).to_ne_bytes(), &i.to_ne_bytes(), BPF_ANY).unwrap();
    }
    for i in 0..1000u32 {
        let mut k = [0u8; 8];
        k[..4].copy_from_slice(&(8 + i % 25).to_ne_bytes());
        k[4..].copy_from_slice(&(mix(i as u64) as u32).to_ne_bytes());
        lpm.update_elem(&k, &[1; 8], BPF_ANY).unwrap();
    }
    const N: u64 = 20_000_000;
    let base = arr.shm().as_ptr();
    time("baseline (loop, key, black_box)", N, |i| {
        let k = ((i & 1023) as u32).to_ne_bytes();
        black_box(base.wrapping_add(u32::from_ne_bytes(black_box(k)) as usize));
    });
    let small = create(&d, &spec(BPF_MAP_TYPE_HASH, 8, 8, 1024, 0));
    for i in 0..512u64 {
        small.update_elem(&mix(i).to_ne_bytes(), &i.to_ne_bytes(), BPF_ANY).unwrap();
    }
    // SAFETY: keys and values are live buffers of the map's sizes.
    time("hash lookup (hit, 512 of 1024, cached)", N, |i| unsafe {
        black_box(small.lookup(mix(i & 511).to_ne_bytes().as_ptr(), 0));
    });
    // SAFETY: keys and values are live buffers of the map's sizes.
    time("array lookup", N, |i| unsafe {
        black_box(arr.lookup(((i & 1023) as u32).to_ne_bytes().as_ptr(), 0));
    });
    // SAFETY: keys and values are live buffers of the map's sizes.
    time("percpu_array lookup", N, |i| unsafe {
        black_box(pcpu.lookup(((i & 1023) as u32).to_ne_bytes().as_ptr(), 1));
    });
    // SAFETY: keys and values are live buffers of the map's sizes.
    time("array update", N, |i| unsafe {
        black_box(arr.update(((i & 1023) as u32).to_ne_bytes().as_ptr(), i.to_ne_bytes().as_ptr(), 0, 0)).ok();
    });
    // SAFETY: keys and values are live buffers of the map's sizes.
    time("hash lookup (hit, half full)", N, |i| unsafe {
        black_box(hash.lookup(mix(i & (MAX / 2 - 1)).to_ne_bytes().as_ptr(), 0));
    });
    // SAFETY: keys and values are live buffers of the map's sizes.
    time("hash lookup (miss)", N, |i| unsafe {
        black_box(hash.lookup(mix(MAX + (i & 0xffff)).to_ne_bytes().as_ptr(), 0));
    });
    // SAFETY: keys and values are live buffers of the map's sizes.
    time("lru_hash lookup (hit)", N, |i| unsafe {
        black_box(lru.lookup(mix(i & (MAX / 2 - 1)).to_ne_bytes().as_ptr(), 0));
    });
    // SAFETY: keys and values are live buffers of the map's sizes.
    time("hash update existing", N / 4, |i| unsafe {
        black_box(hash.update(mix(i & (MAX / 2 - 1)).to_ne_bytes().as_ptr(), i.to_ne_bytes().as_ptr(), 0, 0)).ok();
    });
    // SAFETY: keys and values are live buffers of the map's sizes.
    time("hash delete + insert", N / 8, |i| unsafe {
        let k = mix(i & (MAX / 2 - 1)).to_ne_bytes();
        black_box(hash.delete(k.as_ptr())).ok();
        black_box(hash.update(k.as_ptr(), i.to_ne_bytes().as_ptr(), 0, 0)).ok();
    });
    // SAFETY: keys and values are live buffers of the map's sizes.
    time("lpm lookup", N / 4, |i| unsafe {
        let mut k = [0u8; 8];
        k[..4].copy_from_slice(&32u32.to_ne_bytes());
        k[4..].copy_from_slice(&(mix(i & 1023) as u32).to_ne_bytes());
        black_box(lpm.lookup(k.as_ptr(), 0));
    });
}
