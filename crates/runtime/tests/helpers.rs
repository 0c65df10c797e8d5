//! The helpers, called through the registry's function pointers as programs call them, on
//! prepared memory and maps, inside a run context; and a small program calling helpers in
//! both executors.

mod common;

use std::sync::{Arc, Mutex};
use userbpf_testutil::TmpDir;

use common::{Registered, lddw};

use userbpf_isa::Insn;
use userbpf_maps::perf::{BPF_F_CURRENT_CPU, PerfConsumer, PerfEvent};
use userbpf_maps::ringbuf::RingBufConsumer;
use userbpf_maps::*;
use userbpf_runtime::context::{self, CpuSlots, RunContext};
use userbpf_runtime::helpers::{self, maps::register_map, stack::pt_regs};
use userbpf_vm::{HelperFn, Interpreter, JitProgram, LoadOptions, Program, Region};

// ---- support ----

fn func(id: u32) -> HelperFn {
    helpers::registry().get(id).unwrap_or_else(|| panic!("helper {id} not registered")).func
}

/// Calls helper `id` with up to five arguments, as a program's `call` does.
fn call(id: u32, args: &[u64]) -> u64 {
    let mut a = [0u64; 5];
    a[..args.len()].copy_from_slice(args);
    // SAFETY: the helpers tolerate any arguments the tests pass (bad pointers included: that
    // is what several tests check); the memory they are told to use is prepared by the test.
    unsafe { func(id)(a[0], a[1], a[2], a[3], a[4]) }
}

fn calli(id: u32, args: &[u64]) -> i64 {
    call(id, args) as i64
}

fn neg(e: i32) -> i64 {
    -(e as i64)
}

fn addr<T>(p: &T) -> u64 {
    p as *const T as u64
}

fn addr_mut<T>(p: &mut T) -> u64 {
    p as *mut T as u64
}

fn tmpdir(test: &str) -> TmpDir {
    TmpDir::new(&format!("helpers-{test}"))
}

fn spec(t: MapType, key: u32, value: u32, max: u32) -> MapSpec {
    MapSpec {
        map_type: t,
        key_size: key,
        value_size: value,
        max_entries: max,
        map_flags: 0,
        map_extra: 0,
        name: "m".into(),
    }
}

/// Creates a map in `dir` and registers it under `id` (its session is `dir`).
fn map(dir: &std::path::Path, id: u32, s: MapSpec) -> Arc<Map> {
    let m = Arc::new(Map::create(&dir.join(id.to_string()), &s).unwrap());
    m.set_id(id);
    assert!(register_map(id, m.clone()));
    m
}

fn map_addr(m: &Arc<Map>) -> u64 {
    Arc::as_ptr(m) as u64
}

fn slots() -> CpuSlots {
    CpuSlots::private().unwrap()
}

fn cstr(b: &[u8]) -> &[u8] {
    &b[..b.iter().position(|&c| c == 0).unwrap_or(b.len())]
}

fn set_thread_name(name: &str) {
    let mut n = name.as_bytes().to_vec();
    n.push(0);
    // SAFETY: PR_SET_NAME reads a NUL-terminated string of ours.
    unsafe { libc::prctl(libc::PR_SET_NAME, n.as_ptr() as libc::c_ulong, 0, 0, 0) };
}

/// An unmapped page: addresses that fault.
const BAD: u64 = 16;

// ---- maps ----

#[test]
fn map_helpers_on_hash_array_percpu() {
    let d = tmpdir("maps");
    let slots = slots();
    let g = context::enter(&slots, RunContext::default()).unwrap();
    let hash = map(&d, 1, spec(MapType::BPF_MAP_TYPE_HASH, 4, 8, 4));
    let array = map(&d, 2, spec(MapType::BPF_MAP_TYPE_ARRAY, 4, 8, 2));
    let pcpu = map(&d, 3, spec(MapType::BPF_MAP_TYPE_PERCPU_ARRAY, 4, 8, 1));
    let (h, a, p) = (map_addr(&hash), map_addr(&array), map_addr(&pcpu));
    let (k7, k8, k2, k0) = (7u32, 8u32, 2u32, 0u32);
    let (v100, v5) = (100u64, 5u64);

    assert_eq!(calli(2, &[h, addr(&k7), addr(&v100), BPF_NOEXIST]), 0);
    assert_eq!(calli(2, &[h, addr(&k7), addr(&v100), BPF_NOEXIST]), neg(libc::EEXIST));
    assert_eq!(calli(2, &[h, addr(&k8), addr(&v100), BPF_EXIST]), neg(libc::ENOENT));
    assert_eq!(calli(2, &[h, addr(&k7), addr(&v100), 99]), neg(libc::EINVAL));
    let vp = call(1, &[h, addr(&k7)]) as *mut u64;
    assert!(!vp.is_null());
    // SAFETY: the helper returned the address of the 8-byte value in the map's mapping.
    assert_eq!(unsafe { *vp }, 100);
    assert_eq!(call(1, &[h, addr(&k8)]), 0);
    assert_eq!(calli(3, &[h, addr(&k8)]), neg(libc::ENOENT));
    assert_eq!(calli(3, &[h, addr(&k7)]), 0);
    assert_eq!(call(1, &[h, addr(&k7)]), 0);
    // Full hash map: E2BIG.
    for k in 0..4u32 {
        assert_eq!(calli(2, &[h, addr(&k), addr(&v5), BPF_ANY]), 0);
    }
    assert_eq!(calli(2, &[h, addr(&k7), addr(&v5), BPF_ANY]), neg(libc::E2BIG));

    assert_eq!(calli(2, &[a, addr(&k2), addr(&v5), 0]), neg(libc::E2BIG));
    assert_eq!(calli(2, &[a, addr(&k0), addr(&v5), BPF_NOEXIST]), neg(libc::EEXIST));
    assert_eq!(calli(3, &[a, addr(&k0)]), neg(libc::EINVAL));
    assert_eq!(call(1, &[a, addr(&k2)]), 0);
    assert_eq!(calli(2, &[a, addr(&k0), addr(&v5), 0]), 0);
    let mut out = [0u8; 8];
    array.lookup_elem(&0u32.to_ne_bytes(), &mut out).unwrap();
    assert_eq!(u64::from_ne_bytes(out), 5);

    // Per-CPU: the run's slot, and lookup_percpu_elem for any possible CPU.
    let mine = call(1, &[p, addr(&k0)]);
    assert_eq!(mine, call(195, &[p, addr(&k0), g.cpu() as u64]));
    assert_ne!(mine, 0);
    assert_eq!(call(195, &[p, addr(&k0), pcpu.nr_cpus() as u64]), 0);
    assert_eq!(call(195, &[h, addr(&k0), 0]), 0, "not a per-CPU map");
    assert_eq!(calli(2, &[p, addr(&k0), addr(&v100), 0]), 0);
    // SAFETY: the per-CPU value of this run's slot, 8 bytes.
    assert_eq!(unsafe { *(mine as *const u64) }, 100);
    let mut all = vec![0u8; pcpu.value_buf_size()];
    pcpu.lookup_elem(&0u32.to_ne_bytes(), &mut all).unwrap();
    let cpu = g.cpu() as usize;
    assert_eq!(u64::from_ne_bytes(all[8 * cpu..8 * cpu + 8].try_into().unwrap()), 100);

    // Not a registered map: refused, nothing dereferenced.
    let stray = 0u64;
    assert_eq!(call(1, &[addr(&stray), addr(&k0)]), 0);
    assert_eq!(calli(2, &[addr(&stray), addr(&k0), addr(&v5), 0]), neg(libc::EINVAL));
    assert_eq!(calli(3, &[0, addr(&k0)]), neg(libc::EINVAL));
    drop(g);
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn queue_stack_and_bloom_helpers() {
    let d = tmpdir("queue");
    let q = map(&d, 1, spec(MapType::BPF_MAP_TYPE_QUEUE, 0, 4, 2));
    let s = map(&d, 2, spec(MapType::BPF_MAP_TYPE_STACK, 0, 4, 2));
    let b = map(&d, 3, spec(MapType::BPF_MAP_TYPE_BLOOM_FILTER, 0, 4, 16));
    let (q, s, b) = (map_addr(&q), map_addr(&s), map_addr(&b));
    for v in [1u32, 2] {
        assert_eq!(calli(87, &[q, addr(&v), 0]), 0);
        assert_eq!(calli(87, &[s, addr(&v), 0]), 0);
    }
    let three = 3u32;
    assert_eq!(calli(87, &[q, addr(&three), 0]), neg(libc::E2BIG));
    assert_eq!(calli(87, &[q, addr(&three), BPF_EXIST]), 0, "overwrites the oldest");
    let mut v = 0u32;
    assert_eq!(calli(89, &[q, addr_mut(&mut v)]), 0);
    assert_eq!(v, 2);
    assert_eq!(calli(88, &[q, addr_mut(&mut v)]), 0);
    assert_eq!(v, 2);
    assert_eq!(calli(88, &[q, addr_mut(&mut v)]), 0);
    assert_eq!(v, 3);
    v = 0xdead;
    assert_eq!(calli(88, &[q, addr_mut(&mut v)]), neg(libc::ENOENT));
    assert_eq!(v, 0, "the kernel zeroes the value of a failed pop");
    v = 0xdead;
    assert_eq!(calli(89, &[q, addr_mut(&mut v)]), neg(libc::ENOENT));
    assert_eq!(v, 0);
    assert_eq!(calli(88, &[s, addr_mut(&mut v)]), 0);
    assert_eq!(v, 2, "a stack pops the newest");
    // Lookup on a queue: NULL, as the kernel refuses it.
    assert_eq!(call(1, &[s, addr(&v)]), 0);
    let (x, y) = (99u32, 98u32);
    assert_eq!(calli(87, &[b, addr(&x), 0]), 0);
    assert_eq!(calli(89, &[b, addr(&x)]), 0);
    // A bloom filter of 16 entries: a value never added is (almost surely) absent.
    assert_eq!(calli(89, &[b, addr(&y)]), neg(libc::ENOENT));
    assert_eq!(calli(88, &[b, addr_mut(&mut v)]), neg(libc::EOPNOTSUPP));
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn map_in_map_lookup_returns_the_inner_map() {
    let d = tmpdir("mim");
    let inner_a = map(&d, 10, spec(MapType::BPF_MAP_TYPE_ARRAY, 4, 8, 1));
    let inner_b = map(&d, 11, spec(MapType::BPF_MAP_TYPE_ARRAY, 4, 8, 1));
    let outer = map(&d, 12, spec(MapType::BPF_MAP_TYPE_ARRAY_OF_MAPS, 4, 4, 3));
    let outer_h = map(&d, 13, spec(MapType::BPF_MAP_TYPE_HASH_OF_MAPS, 4, 4, 3));
    outer.update_elem(&0u32.to_ne_bytes(), &10u32.to_ne_bytes(), BPF_ANY).unwrap();
    outer.update_elem(&1u32.to_ne_bytes(), &11u32.to_ne_bytes(), BPF_ANY).unwrap();
    outer.update_elem(&2u32.to_ne_bytes(), &99u32.to_ne_bytes(), BPF_ANY).unwrap();
    outer_h.update_elem(&5u32.to_ne_bytes(), &11u32.to_ne_bytes(), BPF_ANY).unwrap();
    // Another session with the same ids must not be confused with this one.
    let d2 = tmpdir("mim-other");
    let other = map(&d2, 11, spec(MapType::BPF_MAP_TYPE_ARRAY, 4, 8, 1));

    let (k0, k1, k2, k5) = (0u32, 1u32, 2u32, 5u32);
    assert_eq!(call(1, &[map_addr(&outer), addr(&k0)]), map_addr(&inner_a));
    assert_eq!(call(1, &[map_addr(&outer), addr(&k1)]), map_addr(&inner_b));
    assert_ne!(call(1, &[map_addr(&outer), addr(&k1)]), map_addr(&other));
    assert_eq!(call(1, &[map_addr(&outer), addr(&k2)]), 0, "names no registered map");
    assert_eq!(call(1, &[map_addr(&outer_h), addr(&k5)]), map_addr(&inner_b));
    assert_eq!(call(1, &[map_addr(&outer_h), addr(&k1)]), 0);
    // The inner map is used like any other.
    let m = call(1, &[map_addr(&outer_h), addr(&k5)]);
    let v = 77u64;
    assert_eq!(calli(2, &[m, addr(&k0), addr(&v), 0]), 0);
    let vp = call(1, &[m, addr(&k0)]);
    // SAFETY: value address returned by the helper.
    assert_eq!(unsafe { *(vp as *const u64) }, 77);
    assert!(helpers::registry_contains(vp, 8));
    assert!(!helpers::registry_contains(addr(&v), 8));
    let _ = std::fs::remove_dir_all(&d);
    let _ = std::fs::remove_dir_all(&d2);
}

// ---- time, task ----

#[test]
fn clocks() {
    let t1 = call(5, &[]);
    let b1 = call(125, &[]);
    let c1 = call(160, &[]);
    std::thread::sleep(std::time::Duration::from_millis(20));
    let t2 = call(5, &[]);
    assert!(t2 >= t1 + 20_000_000, "{t1} {t2}");
    assert!(b1 + 1_000_000 >= t1, "boot time counts at least the monotonic time");
    assert!(c1.abs_diff(t1) < 50_000_000, "coarse {c1} vs {t1}");
    let j1 = call(118, &[]);
    std::thread::sleep(std::time::Duration::from_millis(30));
    let j2 = call(118, &[]);
    assert!(j2 > j1, "{j1} {j2}");
    // jiffies = INITIAL_JIFFIES (2^32 - 300 HZ) + uptime * HZ: between HZ 100 and 1000.
    let secs = t2 / 1_000_000_000;
    let plausible = (100..=1000u64).any(|hz| {
        let expect = (1u64 << 32) - 300 * hz + secs * hz;
        j2.abs_diff(expect) <= 2 * hz
    });
    assert!(plausible, "jiffies {j2} for {secs} s of uptime");
}

#[test]
fn pid_uid_comm_random_cpu() {
    // SAFETY: plain system calls without preconditions.
    let (pid, tid, uid, gid) =
        unsafe { (libc::getpid() as u64, libc::gettid() as u64, libc::getuid() as u64, libc::getgid() as u64) };
    assert_eq!(call(14, &[]), pid << 32 | tid);
    assert_eq!(call(15, &[]), gid << 32 | uid);
    let other = std::thread::spawn(|| call(14, &[])).join().unwrap();
    assert_eq!(other >> 32, pid);
    assert_ne!(other & 0xffff_ffff, tid);

    set_thread_name("helper-comm");
    let mut buf = [0xffu8; 32];
    assert_eq!(calli(16, &[addr_mut(&mut buf), 32]), 0);
    assert_eq!(&buf[..12], b"helper-comm\0");
    assert!(buf[12..].iter().all(|&b| b == 0), "padded with NULs");
    let mut small = [0xffu8; 6];
    assert_eq!(calli(16, &[addr_mut(&mut small), 5]), 0);
    assert_eq!(&small, b"help\0\xff");
    // strscpy_pad at every size around the 16 bytes of a name: size - 1 bytes at most, NULs
    // up to size, nothing written past it.
    for size in 1..=20usize {
        let mut b = [0xffu8; 24];
        assert_eq!(calli(16, &[addr_mut(&mut b), size as u64]), 0, "size {size}");
        let n = 11.min(size - 1);
        assert_eq!(&b[..n], &b"helper-comm"[..n], "size {size}");
        assert!(b[n..size].iter().all(|&x| x == 0), "size {size}: {b:?}");
        assert!(b[size..].iter().all(|&x| x == 0xff), "size {size}: {b:?}");
    }
    // Each thread has its own name (and cache).
    let theirs = std::thread::spawn(|| {
        set_thread_name("other-thr");
        let mut b = [0xffu8; 16];
        assert_eq!(calli(16, &[addr_mut(&mut b), 16]), 0);
        b
    })
    .join()
    .unwrap();
    assert_eq!(&theirs, b"other-thr\0\0\0\0\0\0\0");
    assert_eq!(calli(16, &[addr_mut(&mut buf), 16]), 0);
    assert_eq!(&buf[..12], b"helper-comm\0");
    assert_eq!(calli(16, &[BAD, 16]), neg(libc::EFAULT));
    // A rename is seen once the cache is older than its refresh period.
    set_thread_name("renamed");
    std::thread::sleep(std::time::Duration::from_nanos(2 * helpers::task::REFRESH_NS));
    assert_eq!(calli(16, &[addr_mut(&mut buf), 16]), 0);
    assert_eq!(cstr(&buf), b"renamed");
    assert!(buf[7..16].iter().all(|&b| b == 0), "the old name's tail is not kept: {buf:?}");

    let r: Vec<u64> = (0..8).map(|_| call(7, &[])).collect();
    assert!(r.iter().all(|&x| x <= u32::MAX as u64));
    assert!(r.windows(2).any(|w| w[0] != w[1]));

    let slots = slots();
    assert_eq!(call(8, &[]), 0, "CPU 0 outside runs");
    let g = context::enter(&slots, RunContext::default()).unwrap();
    assert_eq!(call(8, &[]), g.cpu() as u64);
    drop(g);
    assert_eq!(call(35, &[]), 0);
}

#[test]
fn pid_cache_is_renewed_in_a_forked_child() {
    let before = call(14, &[]);
    // SAFETY: the child only calls the helper (system calls and thread-local reads) and
    // _exit, which are fine after fork in a multi-threaded process.
    let child = unsafe { libc::fork() };
    if child == 0 {
        let me = call(14, &[]);
        // SAFETY: plain system calls.
        let expect = unsafe { (libc::getpid() as u64) << 32 | libc::gettid() as u64 };
        // SAFETY: ending the child.
        unsafe { libc::_exit(if me == expect && me != before { 0 } else { 1 }) };
    }
    let mut status = 0;
    // SAFETY: waiting for our own child.
    unsafe { libc::waitpid(child, &mut status, 0) };
    assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "status {status:#x}");
}

#[test]
fn signals() {
    assert_eq!(calli(109, &[0]), 0, "signal 0 only checks");
    assert_eq!(calli(109, &[65]), neg(libc::EINVAL));
    assert_eq!(calli(117, &[0]), 0);
    // SIGURG is ignored by default: delivering it to this thread is harmless.
    assert_eq!(calli(117, &[libc::SIGURG as u64]), 0);
    assert_eq!(calli(117, &[1000]), neg(libc::EINVAL));
}

// ---- probe_read ----

#[test]
fn probe_reads_and_writes() {
    let src = *b"user data\0tail";
    let mut dst = [0xffu8; 16];
    let d = addr_mut(&mut dst);
    for id in [4, 112] {
        dst = [0xff; 16];
        assert_eq!(calli(id, &[d, 9, addr(&src)]), 0);
        assert_eq!(&dst[..9], b"user data");
        assert_eq!(dst[9], 0xff);
        dst = [0xff; 16];
        assert_eq!(calli(id, &[d, 8, BAD]), neg(libc::EFAULT));
        assert_eq!(&dst[..8], &[0; 8], "zeroed on failure");
        assert_eq!(dst[8], 0xff);
        assert_eq!(calli(id, &[d, 8, u64::MAX - 3]), neg(libc::EFAULT));
        assert_eq!(calli(id, &[d, 0, BAD]), 0);
    }
    // A read running into an unmapped page fails as a whole.
    // SAFETY: mapping and protecting two fresh pages of our own.
    let pages = unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            8192,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        assert_ne!(p, libc::MAP_FAILED);
        libc::mprotect(p.cast::<u8>().add(4096).cast(), 4096, libc::PROT_NONE);
        p as u64
    };
    dst = [0xff; 16];
    assert_eq!(calli(112, &[d, 16, pages + 4096 - 8]), neg(libc::EFAULT));
    assert_eq!(dst, [0; 16]);
    // Kernel memory: none in user space.
    dst = [0xff; 16];
    assert_eq!(calli(113, &[d, 8, addr(&src)]), neg(libc::ERANGE), "user addresses are refused");
    assert_eq!(&dst[..8], &[0; 8]);
    assert_eq!(calli(113, &[d, 8, 0xffff_8880_0000_0000]), neg(libc::EFAULT));
    assert_eq!(calli(4, &[d, 8, 0xffff_8880_0000_0000]), neg(libc::EFAULT));
    assert_eq!(calli(115, &[d, 8, addr(&src)]), neg(libc::ERANGE));

    // Strings: bytes including the NUL, cut to size - 1 and a NUL.
    for id in [45, 114] {
        dst = [0xff; 16];
        assert_eq!(calli(id, &[d, 16, addr(&src)]), 10);
        assert_eq!(&dst[..10], b"user data\0");
        assert_eq!(dst[10], 0xff, "nothing written past the NUL");
        assert_eq!(calli(id, &[d, 5, addr(&src)]), 5);
        assert_eq!(&dst[..5], b"user\0");
        dst = [0xff; 16];
        assert_eq!(calli(id, &[d, 16, BAD]), neg(libc::EFAULT));
        assert_eq!(dst, [0; 16]);
        assert_eq!(calli(id, &[d, 0, addr(&src)]), 0);
    }
    // A string running into the unmapped page.
    // SAFETY: the first page is ours and writable.
    unsafe { std::ptr::write_bytes((pages + 4096 - 4) as *mut u8, b'x', 4) };
    assert_eq!(calli(114, &[d, 16, pages + 4096 - 4]), neg(libc::EFAULT));
    assert_eq!(calli(114, &[d, 4, pages + 4096 - 4]), 4, "stops before the fault");

    // probe_write_user.
    let mut target = [0u8; 8];
    assert_eq!(calli(36, &[addr_mut(&mut target), addr(&src), 4]), 0);
    assert_eq!(&target[..4], b"user");
    assert_eq!(calli(36, &[BAD, addr(&src), 4]), neg(libc::EFAULT));
    assert_eq!(calli(36, &[pages + 4096, addr(&src), 4]), neg(libc::EFAULT));
    let rodata: &'static [u8; 4] = b"ro!!";
    assert_eq!(calli(36, &[addr(rodata), addr(&src), 4]), neg(libc::EFAULT), "read-only memory");
    assert_eq!(calli(36, &[0xffff_8880_0000_0000, addr(&src), 4]), neg(libc::EFAULT));
    // SAFETY: unmapping the pages mapped above.
    unsafe { libc::munmap(pages as *mut libc::c_void, 8192) };
}

/// A frame below the run's start, as a program's stack is: reads its own buffer with
/// `bpf_probe_read_kernel` (113) and `bpf_probe_read_kernel_str` (115).
#[inline(never)]
fn read_own_frame() -> (i64, [u8; 16], i64, [u8; 16]) {
    let frame = std::hint::black_box(*b"on the stack\0xyz");
    let (mut a, mut b) = ([0xffu8; 16], [0xffu8; 16]);
    let r1 = calli(113, &[addr_mut(&mut a), 16, addr(&frame)]);
    let r2 = calli(115, &[addr_mut(&mut b), 16, addr(&frame)]);
    (r1, a, r2, b)
}

#[test]
fn kernel_reads_of_the_programs_own_memory() {
    // In the kernel a program's stack and its maps' values are kernel memory: BCC's
    // gethostlatency copies strings out of a map value with bpf_probe_read_kernel.
    let d = tmpdir("readkernel");
    let hash = map(&d, 1, spec(MapType::BPF_MAP_TYPE_HASH, 4, 16, 4));
    let (h, k) = (map_addr(&hash), 3u32);
    let value = *b"localhost\0abcdef";
    assert_eq!(calli(2, &[h, addr(&k), addr(&value), 0]), 0);
    let vp = call(1, &[h, addr(&k)]);
    assert_ne!(vp, 0);
    let mut dst = [0xffu8; 16];
    let d8 = addr_mut(&mut dst);
    assert_eq!(calli(113, &[d8, 16, vp]), 0);
    assert_eq!(&dst, &value);
    dst = [0xff; 16];
    assert_eq!(calli(115, &[d8, 16, vp]), 10);
    assert_eq!(&dst[..10], b"localhost\0");
    assert_eq!(calli(113, &[d8, 0, vp]), 0);
    // Past the map's memory: refused as a user address.
    assert_eq!(calli(113, &[d8, 16, vp + (1 << 30)]), neg(libc::ERANGE));

    // The run's stack, only while the run lasts.
    let slots = slots();
    let g = context::enter(&slots, RunContext::default()).unwrap();
    let (r1, a, r2, b) = read_own_frame();
    assert_eq!((r1, &a), (0, b"on the stack\0xyz"));
    assert_eq!((r2, &b[..13]), (13, &b"on the stack\0"[..]));
    // Memory above where the run began is the process's own (here: the test's frame).
    let local = *b"test frame data!";
    assert_eq!(calli(113, &[d8, 16, addr(&local)]), neg(libc::ERANGE));
    drop(g);
    let (r1, a, r2, _) = read_own_frame();
    assert_eq!((r1, a), (neg(libc::ERANGE), [0; 16]), "no run: a user address");
    assert_eq!(r2, neg(libc::ERANGE));
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn the_current_task_has_the_kernels_layout_and_this_threads_ids() {
    use userbpf_runtime::helpers::current_task;
    let layout = current_task::prepare().expect("the kernel's task_struct layout (/sys/kernel/btf/vmlinux)");
    assert!(layout.size > layout.comm && layout.size > 1000, "{layout:?}");
    // The offsets of the kernel's BTF, as libbpf's CO-RE relocations find them.
    let btf = userbpf_object::btf::Btf::parse_file("/sys/kernel/btf/vmlinux").unwrap().unwrap();
    assert_eq!(current_task::TaskLayout::from_btf(&btf).unwrap(), layout);

    let read = |src: u64, len: usize| {
        let mut b = vec![0xffu8; len];
        let r = calli(113, &[addr_mut(&mut b[0]), len as u64, src]);
        (r, b)
    };
    let int_at = |base: u64, off: usize| {
        let (r, b) = read(base + off as u64, 4);
        assert_eq!(r, 0, "read at {off}");
        i32::from_ne_bytes(b[..4].try_into().unwrap())
    };
    let ptr_at = |base: u64, off: usize| {
        let (r, b) = read(base + off as u64, 8);
        assert_eq!(r, 0, "read at {off}");
        u64::from_ne_bytes(b[..8].try_into().unwrap())
    };
    let comm_at = |base: u64| {
        let mut b = [0xffu8; 16];
        let n = calli(115, &[addr_mut(&mut b), 16, base + layout.comm as u64]);
        assert!(n > 0, "comm read: {n}");
        String::from_utf8_lossy(&b[..n as usize - 1]).into_owned()
    };
    let proc_comm = |path: String| std::fs::read_to_string(path).unwrap().trim_end().to_string();
    // SAFETY: getpid, gettid and getppid cannot fail.
    let (pid, ppid) = unsafe { (libc::getpid(), libc::getppid()) };
    let main_comm = proc_comm(format!("/proc/{pid}/comm"));
    let parent_comm = proc_comm(format!("/proc/{ppid}/comm"));

    // On another thread of the process, named: its own task, the main thread as its leader.
    let other = std::thread::scope(|sc| {
        std::thread::Builder::new()
            .name("task-probe".into())
            .spawn_scoped(sc, || {
                // SAFETY: gettid cannot fail.
                let tid = unsafe { libc::gettid() };
                let task = call(35, &[]);
                assert_ne!(task, 0);
                assert_eq!(call(35, &[]), task, "one task a thread");
                assert_eq!((int_at(task, layout.pid), int_at(task, layout.tgid)), (tid, pid));
                assert_eq!(comm_at(task), "task-probe");
                let leader = ptr_at(task, layout.group_leader);
                assert_eq!((int_at(leader, layout.pid), int_at(leader, layout.tgid)), (pid, pid));
                assert_eq!(comm_at(leader), main_comm);
                assert_eq!(ptr_at(leader, layout.group_leader), leader);
                let parent = ptr_at(task, layout.real_parent);
                assert_eq!(ptr_at(task, layout.parent), parent);
                assert_eq!(ptr_at(leader, layout.real_parent), parent);
                assert_eq!((int_at(parent, layout.pid), int_at(parent, layout.tgid)), (ppid, ppid));
                assert_eq!(comm_at(parent), parent_comm);
                // Past the parent's block: not this thread's memory.
                let after = parent + layout.size.div_ceil(64) as u64 * 64;
                assert_eq!(read(after, 8).0, neg(libc::ERANGE));
                task
            })
            .unwrap()
            .join()
            .unwrap()
    });
    // Another thread's task is not this thread's to read.
    assert_eq!(read(other + layout.pid as u64, 4).0, neg(libc::ERANGE));
    let mine = call(35, &[]);
    assert_ne!(mine, 0);
    // SAFETY: gettid cannot fail.
    assert_eq!(int_at(mine, layout.pid), unsafe { libc::gettid() });
}

// ---- printf ----

static SINK_LOCK: Mutex<()> = Mutex::new(());

#[test]
fn trace_printk_lines_reach_the_sink() {
    let _l = SINK_LOCK.lock().unwrap();
    let d = tmpdir("trace");
    let sink = Arc::new(Map::create(&d.join("trace"), &spec(MapType::BPF_MAP_TYPE_RINGBUF, 0, 0, 16384)).unwrap());
    helpers::set_trace_sink(Some(sink.clone())).unwrap();
    let Map::RingBuf(rb) = &*sink else { unreachable!() };
    let mut consumer = RingBufConsumer::new(rb).unwrap();
    set_thread_name("tracer");
    let slots = slots();
    let g = context::enter(&slots, RunContext::default()).unwrap();

    let fmt = b"hello %d %s 0x%lx%c\n\0";
    let word = b"world\0";
    let ret = calli(6, &[addr(fmt), fmt.len() as u64, 42, addr(word), 0xbeef]);
    // Only three arguments: %c has none, so the format is refused.
    assert_eq!(ret, neg(libc::EINVAL));
    let fmt = b"hello %d %s 0x%lx\n\0";
    let ret = calli(6, &[addr(fmt), fmt.len() as u64, -42i64 as u64, addr(word), 0xbeef]);
    assert_eq!(ret, "hello -42 world 0xbeef\n".len() as i64);
    // trace_vprintk: up to 12 arguments from an array.
    let vfmt = b"%d+%d=%u %5s|%-3c|\0";
    let args = [2u64, 3, 5, addr(word), b'z' as u64];
    let ret = calli(177, &[addr(vfmt), vfmt.len() as u64, args.as_ptr() as u64, 40]);
    assert_eq!(ret, "2+3=5 world|z  |".len() as i64);
    // Bad formats and sizes.
    let nonul = b"abc";
    assert_eq!(calli(6, &[addr(nonul), 3, 0, 0, 0]), neg(libc::EINVAL), "no NUL within fmt_size");
    assert_eq!(calli(6, &[BAD, 8, 0, 0, 0]), neg(libc::EFAULT));
    assert_eq!(calli(177, &[addr(vfmt), vfmt.len() as u64, args.as_ptr() as u64, 12]), neg(libc::EINVAL));
    assert_eq!(calli(177, &[addr(vfmt), vfmt.len() as u64, 0, 8]), neg(libc::EINVAL));
    assert_eq!(calli(177, &[addr(vfmt), vfmt.len() as u64, args.as_ptr() as u64, 13 * 8]), neg(libc::EINVAL));
    // A message longer than the kernel's 1024-byte buffer is cut; the length is all of it.
    let long = format!("{}%s\0", "x".repeat(1020));
    let ret = calli(6, &[long.as_ptr() as u64, long.len() as u64, addr(word), 0, 0]);
    assert_eq!(ret, 1025);

    let mut lines = Vec::new();
    consumer.consume(|r| lines.push(String::from_utf8(r.to_vec()).unwrap())).unwrap();
    assert_eq!(lines.len(), 3, "{lines:?}");
    let tid = call(14, &[]) as u32;
    let prefix = format!("{:>16}-{:<7} [{:03}] ..... ", "tracer", tid, g.cpu());
    let now = call(5, &[]) as f64 / 1e9;
    let bodies = ["hello -42 world 0xbeef\n", "2+3=5 world|z  |\n"];
    for (line, body) in lines.iter().zip(bodies) {
        assert!(line.starts_with(&prefix), "{line:?} vs {prefix:?}");
        let rest = &line[prefix.len()..];
        let (ts, msg) = rest.split_once(": ").unwrap();
        assert_eq!(ts.trim_start().split_once('.').unwrap().1.len(), 6, "usecs: {ts}");
        let t: f64 = ts.trim().parse().unwrap();
        assert!((now - t).abs() < 5.0, "{t} vs {now}");
        assert_eq!(msg, format!("bpf_trace_printk: {body}"));
    }
    let last = lines[2].split_once("bpf_trace_printk: ").unwrap().1;
    assert_eq!(last, format!("{}wor\n", "x".repeat(1020)), "cut to 1023 bytes, then the newline");
    drop(g);

    // Without a sink the helper still answers; the line is counted as dropped.
    helpers::set_trace_sink(None).unwrap();
    let dropped = helpers::trace_lines_dropped();
    let fmt = b"nowhere\0";
    assert_eq!(calli(6, &[addr(fmt), 8, 0, 0, 0]), 7);
    assert_eq!(helpers::trace_lines_dropped(), dropped + 1);
    let arr = map(&d, 1, spec(MapType::BPF_MAP_TYPE_ARRAY, 4, 4, 1));
    assert!(helpers::set_trace_sink(Some(arr)).is_err(), "only ring buffers");
    let _ = std::fs::remove_dir_all(&d);
}

fn snprintf(out: &mut [u8], fmt: &[u8], args: &[u64]) -> i64 {
    calli(
        165,
        &[out.as_mut_ptr() as u64, out.len() as u64, fmt.as_ptr() as u64, args.as_ptr() as u64, 8 * args.len() as u64],
    )
}

#[test]
fn snprintf_outputs_and_return_values() {
    let mut out = [0xffu8; 64];
    let name = b"comm\0";
    assert_eq!(snprintf(&mut out, b"%s:%d\0", &[addr(name), 7]), 7);
    assert_eq!(&out[..7], b"comm:7\0");
    // Cut to the buffer, NUL-terminated; the return value is the size needed.
    let mut small = [0xffu8; 4];
    assert_eq!(snprintf(&mut small, b"%s:%d\0", &[addr(name), 7]), 7);
    assert_eq!(&small, b"com\0");
    assert_eq!(calli(165, &[0, 0, c"%d".as_ptr() as u64, [12345u64].as_ptr() as u64, 8]), 6);
    assert_eq!(snprintf(&mut out, b"%08x|%-6d|%+ld|%X|%llu\0", &[0xbeef, -3i64 as u64, 5, 0xabc, u64::MAX]), 44);
    assert_eq!(cstr(&out), b"0000beef|-3    |+5|ABC|18446744073709551615");
    let ip4 = [192u8, 168, 1, 20];
    let ip6 = [0xfeu8, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
    snprintf(&mut out, b"%pI4 %pi4\0", &[addr(&ip4), addr(&ip4)]);
    assert_eq!(cstr(&out), b"192.168.1.20 192.168.001.020");
    snprintf(&mut out, b"%pI6\0", &[addr(&ip6)]);
    assert_eq!(cstr(&out), b"fe80:0000:0000:0000:0000:0000:0000:0001");
    snprintf(&mut out, b"%px %p %pK %ps\0", &[0x7f00_0000_1000, 0x10, 0, 0x401000]);
    assert_eq!(cstr(&out), b"00007f0000001000 0000000000000010 0000000000000000 0x401000");
    assert_eq!(snprintf(&mut out, b"[%s] [%pus]\0", &[BAD, BAD]), 6, "unreadable strings print as empty");
    assert_eq!(cstr(&out), b"[] []");
    assert_eq!(snprintf(&mut out, b"100%% %c\0", &[b'!' as u64]), 7);
    assert_eq!(cstr(&out), b"100% !");
    let mut big = vec![0u8; 3000];
    let wide = b"%2000d|\0";
    assert_eq!(snprintf(&mut big, wide, &[1]), 2002);
    assert_eq!(&big[1998..2002], b" 1|\0");

    // Errors.
    let einval = neg(libc::EINVAL);
    assert_eq!(snprintf(&mut out, b"%d %d\0", &[1]), einval, "more conversions than arguments");
    assert_eq!(snprintf(&mut out, b"%q\0", &[1]), einval);
    assert_eq!(snprintf(&mut out, b"%.2s\0", &[addr(name)]), einval);
    assert_eq!(snprintf(&mut out, b"%sabc\0", &[addr(name)]), einval);
    assert_eq!(calli(165, &[addr_mut(&mut out), 64, c"%d".as_ptr() as u64, 0, 8]), einval, "NULL data");
    assert_eq!(calli(165, &[addr_mut(&mut out), 64, c"%d".as_ptr() as u64, [1u64].as_ptr() as u64, 4]), einval);
    assert_eq!(calli(165, &[addr_mut(&mut out), 64, c"x".as_ptr() as u64, [0u64; 13].as_ptr() as u64, 104]), einval);
    assert_eq!(calli(165, &[addr_mut(&mut out), 64, BAD, 0, 0]), neg(libc::EFAULT));
    assert_eq!(calli(165, &[BAD, 64, c"x".as_ptr() as u64, 0, 0]), neg(libc::EFAULT));
    let long = vec![b'a'; 600];
    let mut with_nul = long.clone();
    with_nul.push(0);
    assert_eq!(snprintf(&mut out, b"%s%s\0", &[with_nul.as_ptr() as u64, with_nul.as_ptr() as u64]), neg(libc::ENOSPC));
    // Twelve arguments at most, all usable.
    let twelve: Vec<u64> = (1..=12).collect();
    assert_eq!(snprintf(&mut out, b"%d%d%d%d%d%d%d%d%d%d%d%d\0", &twelve), 16);
    assert_eq!(cstr(&out), b"123456789101112");
}

// ---- perf and ring buffer output ----

#[test]
fn perf_event_output_reaches_the_consumer() {
    let d = tmpdir("perf");
    let pa_map = map(&d, 1, spec(MapType::BPF_MAP_TYPE_PERF_EVENT_ARRAY, 4, 4, 0));
    let Map::PerfEventArray(pa) = &*pa_map else { unreachable!() };
    let mut consumer = PerfConsumer::new(pa).unwrap();
    let slots = slots();
    let g = context::enter(&slots, RunContext::default()).unwrap();
    let m = map_addr(&pa_map);
    let data = *b"sample!";
    assert_eq!(calli(25, &[0, m, BPF_F_CURRENT_CPU, addr(&data), 7]), 0);
    assert_eq!(calli(25, &[0, m, 0, addr(&data), 3]), 0);
    assert_eq!(calli(25, &[0, m, 1 << 40, addr(&data), 3]), neg(libc::EINVAL));
    assert_eq!(calli(25, &[0, m, pa.max_entries() as u64, addr(&data), 3]), neg(libc::E2BIG));
    assert_eq!(calli(25, &[0, m, 0, BAD, 3]), neg(libc::EFAULT));
    let ring = map(&d, 2, spec(MapType::BPF_MAP_TYPE_RINGBUF, 0, 0, 4096));
    assert_eq!(calli(25, &[0, map_addr(&ring), 0, addr(&data), 3]), neg(libc::EINVAL), "not a perf event array");
    let mut got = Vec::new();
    consumer
        .consume(|e| {
            if let PerfEvent::Sample { cpu, data } = e {
                got.push((cpu, data.to_vec()))
            }
        })
        .unwrap();
    got.sort();
    let mut want = vec![(g.cpu(), b"sample!".to_vec()), (0, b"sam\0".to_vec())];
    want.sort();
    assert_eq!(got.len(), 2);
    for ((c, d), (wc, wd)) in got.iter().zip(&want) {
        assert_eq!(c, wc);
        assert_eq!(&d[..wd.len()], &wd[..], "raw data, padded to keep records aligned");
    }
    drop(g);
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn ringbuf_helpers() {
    let d = tmpdir("ringbuf");
    let ring = map(&d, 1, spec(MapType::BPF_MAP_TYPE_RINGBUF, 0, 0, 4096));
    let Map::RingBuf(rb) = &*ring else { unreachable!() };
    let mut consumer = RingBufConsumer::new(rb).unwrap();
    let m = map_addr(&ring);
    assert_eq!(call(131, &[m, 16, 1]), 0, "flags must be 0");
    assert_eq!(call(131, &[m, 8192, 0]), 0, "larger than the ring");
    let a = call(131, &[m, 16, 0]);
    let b = call(131, &[m, 8, 0]);
    assert!(a != 0 && b != 0);
    // SAFETY: reserved samples of 16 and 8 bytes.
    unsafe {
        std::ptr::copy_nonoverlapping(b"first sample....".as_ptr(), a as *mut u8, 16);
        std::ptr::copy_nonoverlapping(b"dropped!".as_ptr(), b as *mut u8, 8);
    }
    assert_eq!(call(134, &[m, BPF_RB_AVAIL_DATA]), 24 + 16);
    assert_eq!(call(134, &[m, BPF_RB_RING_SIZE]), 4096);
    assert_eq!(call(134, &[m, 99]), 0);
    // Committed out of order: the consumer waits for the first.
    assert_eq!(call(133, &[b, 0]), 0);
    assert_eq!(consumer.consume(|_| {}).unwrap(), 0);
    assert_eq!(call(132, &[a, 0]), 0);
    assert_eq!(call(132, &[a, 0]), 0, "a second submit is ignored");
    assert_eq!(call(132, &[BAD, 0]), 0, "an address of no ring is ignored");
    let data = *b"output";
    assert_eq!(calli(130, &[m, addr(&data), 6, 0]), 0);
    assert_eq!(calli(130, &[m, addr(&data), 6, 4]), neg(libc::EINVAL));
    assert_eq!(calli(130, &[m, BAD, 6, 0]), neg(libc::EFAULT));
    let big = vec![0u8; 5000];
    assert_eq!(calli(130, &[m, big.as_ptr() as u64, 5000, 0]), neg(libc::EAGAIN));
    let mut got = Vec::new();
    consumer.consume(|r| got.push(r.to_vec())).unwrap();
    assert_eq!(got, [b"first sample....".to_vec(), b"output".to_vec()]);
    assert_eq!(call(134, &[m, BPF_RB_AVAIL_DATA]), 0);
    // Reservations submitted from another thread are found through the registry.
    let s = call(131, &[m, 4, 0]);
    std::thread::spawn(move || call(132, &[s, 0])).join().unwrap();
    assert_eq!(consumer.consume(|_| {}).unwrap(), 1);
    let _ = std::fs::remove_dir_all(&d);
}

// ---- stacks ----

/// A `struct pt_regs` with ip, bp and sp set.
fn regs(ip: u64, bp: u64, sp: u64) -> [u64; pt_regs::SIZE / 8] {
    let mut r = [0u64; pt_regs::SIZE / 8];
    r[pt_regs::IP / 8] = ip;
    r[pt_regs::BP / 8] = bp;
    r[pt_regs::SP / 8] = sp;
    r
}

#[test]
fn stacks_from_a_synthetic_frame_chain() {
    // Three frames: [saved rbp, return address], the last one ending the chain.
    let mut frames = [0u64; 6];
    let base = frames.as_ptr() as u64;
    frames[0] = base + 16;
    frames[1] = 0x1111;
    frames[2] = base + 32;
    frames[3] = 0x2222;
    frames[4] = 0;
    frames[5] = 0x3333;
    std::hint::black_box(&frames);
    let r = regs(0x1000, base, 0);
    let ctx = r.as_ptr() as u64;
    let mut buf = [0xffu64; 8];
    let b = buf.as_mut_ptr() as u64;
    assert_eq!(calli(67, &[ctx, b, 64, BPF_F_USER_STACK]), 32);
    assert_eq!(buf, [0x1000, 0x1111, 0x2222, 0x3333, 0, 0, 0, 0]);
    assert_eq!(calli(67, &[ctx, b, 64, BPF_F_USER_STACK | 2]), 16, "two frames skipped");
    assert_eq!(&buf[..3], &[0x2222, 0x3333, 0]);
    assert_eq!(calli(67, &[ctx, b, 16, BPF_F_USER_STACK]), 16, "cut to the buffer");
    assert_eq!(&buf[..2], &[0x1000, 0x1111]);
    // Build-id entries: status "ip only" and the address.
    let mut ent = [0xffu8; 64];
    assert_eq!(calli(67, &[ctx, ent.as_mut_ptr() as u64, 64, BPF_F_USER_STACK | (1 << 11)]), 64);
    assert_eq!(i32::from_ne_bytes(ent[..4].try_into().unwrap()), 2);
    assert_eq!(&ent[4..24], &[0; 20]);
    assert_eq!(u64::from_ne_bytes(ent[24..32].try_into().unwrap()), 0x1000);
    assert_eq!(u64::from_ne_bytes(ent[56..64].try_into().unwrap()), 0x1111);
    // Errors zero the buffer.
    buf = [0xff; 8];
    assert_eq!(calli(67, &[ctx, b, 64, BPF_F_USER_STACK | (1 << 12)]), neg(libc::EINVAL));
    assert_eq!(buf, [0; 8]);
    assert_eq!(calli(67, &[ctx, b, 12, BPF_F_USER_STACK]), neg(libc::EINVAL));
    assert_eq!(calli(67, &[ctx, b, 64, 1 << 11]), neg(libc::EINVAL), "build ids of the kernel stack");
    assert_eq!(calli(67, &[ctx, b, 64, BPF_F_USER_STACK | 5]), neg(libc::EFAULT), "skipping more than the stack");
    assert_eq!(calli(67, &[BAD, b, 64, BPF_F_USER_STACK]), neg(libc::EFAULT));
    // No kernel stack under a user probe.
    buf = [0xff; 8];
    assert_eq!(calli(67, &[ctx, b, 64, 0]), 0);
    assert_eq!(buf, [0; 8]);
    assert_eq!(calli(67, &[ctx, b, 64, 1]), neg(libc::EFAULT));

    // At an entry probe on `push %rbp` / `endbr64`, the return address at [rsp] is the first
    // caller (the kernel's is_uprobe_at_func_entry).
    let ret0 = 0x0999u64;
    let r = regs(0x1000, base, addr(&ret0));
    let slots = slots();
    let g = context::enter(
        &slots,
        RunContext { regs: r.as_ptr() as u64, func_ip: 0x1000, at_func_entry: true, ..Default::default() },
    )
    .unwrap();
    assert_eq!(calli(67, &[0, b, 64, BPF_F_USER_STACK]), 40, "ctx 0: the run's registers");
    assert_eq!(&buf[..5], &[0x1000, 0x999, 0x1111, 0x2222, 0x3333]);
    drop(g);
    // Any other probed instruction, even at the function's start: no [rsp] word, the frame
    // chain follows the instruction pointer (the direct caller of a frameless leaf is lost, as
    // in the kernel).
    let g =
        context::enter(&slots, RunContext { regs: r.as_ptr() as u64, func_ip: 0x1000, ..Default::default() }).unwrap();
    buf = [0xff; 8];
    assert_eq!(calli(67, &[0, b, 64, BPF_F_USER_STACK]), 32);
    assert_eq!(&buf[..5], &[0x1000, 0x1111, 0x2222, 0x3333, 0]);
    drop(g);

    // get_stackid.
    let d = tmpdir("stackid");
    let st = map(&d, 1, spec(MapType::BPF_MAP_TYPE_STACK_TRACE, 4, 8 * 3, 8));
    let m = map_addr(&st);
    let id = calli(27, &[ctx, m, BPF_F_USER_STACK]);
    assert!(id >= 0, "{id}");
    assert_eq!(calli(27, &[ctx, m, BPF_F_USER_STACK]), id, "same trace, same id");
    let mut v = [0u8; 24];
    st.lookup_elem(&(id as u32).to_ne_bytes(), &mut v).unwrap();
    let ips: Vec<u64> = v.chunks(8).map(|c| u64::from_ne_bytes(c.try_into().unwrap())).collect();
    assert_eq!(ips, [0x1000, 0x1111, 0x2222], "depth 3");
    let id2 = calli(27, &[ctx, m, BPF_F_USER_STACK | BPF_F_REUSE_STACKID | 1]);
    st.lookup_elem(&(id2 as u32).to_ne_bytes(), &mut v).unwrap();
    assert_eq!(&v[..8], &0x1111u64.to_ne_bytes(), "skip 1: depth + skip frames captured");
    assert_eq!(calli(27, &[ctx, m, 0]), neg(libc::EFAULT), "no kernel stack");
    assert_eq!(calli(27, &[ctx, m, 1 << 20]), neg(libc::EINVAL));
    assert_eq!(calli(27, &[ctx, m, BPF_F_USER_STACK | 9]), neg(libc::EFAULT));
    let arr = map(&d, 2, spec(MapType::BPF_MAP_TYPE_ARRAY, 4, 8, 1));
    assert_eq!(calli(27, &[ctx, map_addr(&arr), BPF_F_USER_STACK]), neg(libc::EINVAL));
    let _ = std::fs::remove_dir_all(&d);
}

// Three functions with frame pointers, written out so the frames are certain: f1 calls f2,
// f2 calls f3, f3 calls back (rdi) with its rbp and the address of the call.
std::arch::global_asm!(
    ".text",
    ".globl userbpf_helpers_test_f1",
    "userbpf_helpers_test_f1:",
    "    push rbp",
    "    mov rbp, rsp",
    "    call userbpf_helpers_test_f2",
    ".globl userbpf_helpers_test_ret1",
    "userbpf_helpers_test_ret1:",
    "    pop rbp",
    "    ret",
    ".globl userbpf_helpers_test_f2",
    "userbpf_helpers_test_f2:",
    "    push rbp",
    "    mov rbp, rsp",
    "    call userbpf_helpers_test_f3",
    ".globl userbpf_helpers_test_ret2",
    "userbpf_helpers_test_ret2:",
    "    pop rbp",
    "    ret",
    ".globl userbpf_helpers_test_f3",
    "userbpf_helpers_test_f3:",
    "    push rbp",
    "    mov rbp, rsp",
    "    mov rax, rdi",
    "    mov rdi, rbp",
    "    lea rsi, [rip + userbpf_helpers_test_here]",
    ".globl userbpf_helpers_test_here",
    "userbpf_helpers_test_here:",
    "    call rax",
    "    pop rbp",
    "    ret",
);

unsafe extern "C" {
    fn userbpf_helpers_test_f1(cb: extern "C" fn(u64, u64));
    fn userbpf_helpers_test_ret1();
    fn userbpf_helpers_test_ret2();
    fn userbpf_helpers_test_here();
}

thread_local! {
    static REAL: std::cell::Cell<([u64; 4], i64)> = const { std::cell::Cell::new(([0; 4], 0)) };
}

extern "C" fn capture(rbp: u64, ip: u64) {
    let r = regs(ip, rbp, 0);
    let mut buf = [0u64; 4];
    let n = calli(67, &[r.as_ptr() as u64, buf.as_mut_ptr() as u64, 32, BPF_F_USER_STACK]);
    REAL.with(|c| c.set((buf, n)));
}

#[test]
fn stack_of_real_frames() {
    // SAFETY: the assembly functions follow the C ABI and call `capture` with two integers.
    unsafe { userbpf_helpers_test_f1(capture) };
    let (ips, n) = REAL.with(|c| c.get());
    assert_eq!(n, 32);
    assert_eq!(ips[0], userbpf_helpers_test_here as *const () as u64);
    assert_eq!(ips[1], userbpf_helpers_test_ret2 as *const () as u64);
    assert_eq!(ips[2], userbpf_helpers_test_ret1 as *const () as u64);
    // The caller of f1: an address in this test function's code.
    let here = stack_of_real_frames as *const () as u64;
    assert!(ips[3] > here && ips[3] < here + 4096, "{:#x} after {here:#x}", ips[3]);
}

// ---- the probed function ----

#[test]
fn function_ip_cookie_arguments_and_return_value() {
    assert_eq!(call(173, &[]), 0, "outside runs");
    let mut r = regs(0x4000, 0, 0);
    for (k, off) in
        [pt_regs::DI, pt_regs::SI, pt_regs::DX, pt_regs::CX, pt_regs::R8, pt_regs::R9].into_iter().enumerate()
    {
        r[off / 8] = 100 + k as u64;
    }
    let ctx = r.as_ptr() as u64;
    let slots = slots();
    let info =
        RunContext { regs: ctx, func_ip: 0x4000, cookie: 0xc00c1e, nr_args: 3, retval: None, ..Default::default() };
    let g = context::enter(&slots, info).unwrap();
    assert_eq!(call(173, &[ctx]), 0x4000);
    assert_eq!(call(174, &[ctx]), 0xc00c1e);
    assert_eq!(call(185, &[ctx]), 3);
    let mut v = 0u64;
    for n in 0..3 {
        assert_eq!(calli(183, &[ctx, n, addr_mut(&mut v)]), 0);
        assert_eq!(v, 100 + n);
    }
    v = 7;
    assert_eq!(calli(183, &[ctx, 3, addr_mut(&mut v)]), neg(libc::EINVAL));
    assert_eq!(v, 7);
    assert_eq!(calli(183, &[0, 1, addr_mut(&mut v)]), 0, "ctx 0: the run's registers");
    assert_eq!(v, 101);
    assert_eq!(calli(183, &[ctx, 0, BAD]), neg(libc::EFAULT));
    assert_eq!(calli(184, &[ctx, addr_mut(&mut v)]), neg(libc::EOPNOTSUPP));
    drop(g);
    let g =
        context::enter(&slots, RunContext { retval: Some(-5i64 as u64), nr_args: 8, regs: ctx, ..Default::default() })
            .unwrap();
    assert_eq!(calli(184, &[ctx, addr_mut(&mut v)]), 0);
    assert_eq!(v as i64, -5);
    assert_eq!(calli(183, &[ctx, 5, addr_mut(&mut v)]), 0);
    assert_eq!(v, 105);
    assert_eq!(calli(183, &[ctx, 6, addr_mut(&mut v)]), neg(libc::EINVAL), "only register arguments");
    drop(g);
}

// ---- strings ----

#[test]
fn strncmp_and_strtol() {
    let s = |x: &'static [u8]| x.as_ptr() as u64;
    assert_eq!(calli(182, &[s(b"abc\0"), 3, s(b"abd\0")]), -1);
    assert_eq!(calli(182, &[s(b"abc\0"), 2, s(b"abd\0")]), 0);
    assert_eq!(calli(182, &[s(b"abd\0"), 3, s(b"abc\0")]), 1);
    assert_eq!(calli(182, &[s(b"ab\0"), 3, s(b"abc\0")]), -1);
    assert_eq!(calli(182, &[s(b"abc\0"), 4, s(b"abc\0")]), 0);
    assert_eq!(calli(182, &[s(b"\xff\0"), 1, s(b"a\0")]), 1, "bytes compare unsigned");
    let long_a = [b'q'; 200];
    let mut long_b = [b'q'; 201];
    long_b[200] = 0;
    assert_eq!(calli(182, &[addr(&long_a), 200, addr(&long_b)]), 0);
    long_b[150] = b'r';
    assert_eq!(calli(182, &[addr(&long_a), 200, addr(&long_b)]), -1);
    assert_eq!(calli(182, &[BAD, 3, s(b"abc\0")]), neg(libc::EFAULT));

    let mut res = 0xdeadu64;
    let r = addr_mut(&mut res);
    let strtol = |b: &'static [u8], flags: u64, res: u64| calli(105, &[b.as_ptr() as u64, b.len() as u64, flags, res]);
    let strtoul = |b: &'static [u8], flags: u64, res: u64| calli(106, &[b.as_ptr() as u64, b.len() as u64, flags, res]);
    assert_eq!(strtol(b"  -123abc", 0, r), 6);
    assert_eq!(res as i64, -123);
    assert_eq!(strtol(b"0x1fz", 0, r), 4);
    assert_eq!(res, 31);
    assert_eq!(strtol(b"0x1f", 16, r), 4);
    assert_eq!(strtol(b"077", 0, r), 3);
    assert_eq!(res, 63);
    assert_eq!(strtol(b"0xg", 0, r), 1, "0 in base 8, then x");
    assert_eq!(res, 0);
    assert_eq!(strtol(b"0x", 16, r), neg(libc::EINVAL));
    assert_eq!(strtol(b"12", 10, r), 2);
    assert_eq!(strtol(b"129", 8, r), 2);
    assert_eq!(res, 10);
    res = 9;
    assert_eq!(strtol(b"abc", 10, r), neg(libc::EINVAL));
    assert_eq!(res, 0, "zeroed on error");
    assert_eq!(strtol(b"   ", 0, r), neg(libc::EINVAL));
    assert_eq!(strtol(b"-", 0, r), neg(libc::EINVAL));
    assert_eq!(strtol(b"12", 7, r), neg(libc::EINVAL));
    assert_eq!(strtol(b"12", 1 << 5, r), neg(libc::EINVAL));
    assert_eq!(strtol(b"9223372036854775807", 0, r), 19);
    assert_eq!(res as i64, i64::MAX);
    assert_eq!(strtol(b"9223372036854775808", 0, r), neg(libc::ERANGE));
    assert_eq!(strtol(b"-9223372036854775808", 0, r), 20);
    assert_eq!(res as i64, i64::MIN);
    assert_eq!(strtol(b"99999999999999999999", 0, r), neg(libc::ERANGE));
    assert_eq!(strtoul(b"18446744073709551615", 0, r), 20);
    assert_eq!(res, u64::MAX);
    assert_eq!(strtoul(b"18446744073709551616", 0, r), neg(libc::ERANGE));
    assert_eq!(strtoul(b"-1", 0, r), neg(libc::EINVAL));
    assert_eq!(strtoul(b"\t42\n", 0, r), 3);
    assert_eq!(res, 42);
    assert_eq!(strtoul(b"42", 0, BAD), neg(libc::EFAULT));
    assert_eq!(calli(105, &[BAD, 4, 0, r]), neg(libc::EFAULT));
    assert_eq!(calli(105, &[0, 4, 0, r]), neg(libc::EINVAL));
}

// ---- a program calling helpers, in both executors ----

#[test]
fn program_calls_helpers_in_the_interpreter_and_the_jit() {
    let d = tmpdir("prog");
    let hash = map(&d, 1, spec(MapType::BPF_MAP_TYPE_HASH, 4, 8, 8));
    let fmt: &'static [u8] = b"v=%llu\0";
    let mut p = Vec::new();
    let mov64_reg = |dst, src| Insn::new(0xbf, dst, src, 0, 0);
    let call_insn = |id| Insn::new(0x85, 0, 0, 0, id);
    p.push(mov64_reg(6, 1)); // r6 = ctx
    p.push(Insn::new(0x62, 10, 0, -8, 1)); // *(u32 *)(fp - 8) = 1
    p.push(Insn::new(0x7a, 10, 0, -16, 42)); // *(u64 *)(fp - 16) = 42
    p.extend(lddw(1, map_addr(&hash)));
    p.push(mov64_reg(2, 10));
    p.push(Insn::new(0x07, 2, 0, 0, -8));
    p.push(mov64_reg(3, 10));
    p.push(Insn::new(0x07, 3, 0, 0, -16));
    p.push(Insn::new(0xb7, 4, 0, 0, 0));
    p.push(call_insn(2)); // map_update_elem
    p.push(Insn::new(0x55, 0, 0, 25, 0)); // if r0 != 0 goto fail
    p.extend(lddw(1, map_addr(&hash)));
    p.push(mov64_reg(2, 10));
    p.push(Insn::new(0x07, 2, 0, 0, -8));
    p.push(call_insn(1)); // map_lookup_elem
    p.push(Insn::new(0x15, 0, 0, 19, 0)); // if r0 == 0 goto fail
    p.push(Insn::new(0x79, 7, 0, 0, 0)); // r7 = *(u64 *)(r0 + 0)
    p.push(Insn::new(0x7b, 6, 7, 0, 0)); // *(u64 *)(r6 + 0) = r7
    p.push(call_insn(14)); // get_current_pid_tgid
    p.push(Insn::new(0x7b, 6, 0, 8, 0)); // *(u64 *)(r6 + 8) = r0
    p.push(Insn::new(0x7b, 10, 7, -24, 0)); // *(u64 *)(fp - 24) = r7
    p.push(mov64_reg(1, 6));
    p.push(Insn::new(0x07, 1, 0, 0, 16)); // r1 = ctx + 16
    p.push(Insn::new(0xb7, 2, 0, 0, 32));
    p.extend(lddw(3, fmt.as_ptr() as u64));
    p.push(mov64_reg(4, 10));
    p.push(Insn::new(0x07, 4, 0, 0, -24));
    p.push(Insn::new(0xb7, 5, 0, 0, 8));
    p.push(call_insn(165)); // snprintf(ctx + 16, 32, fmt, fp - 24, 8)
    p.push(Insn::new(0x7b, 6, 0, 48, 0)); // *(u64 *)(r6 + 48) = r0
    p.push(call_insn(8)); // get_smp_processor_id
    p.push(Insn::new(0x7b, 6, 0, 56, 0)); // *(u64 *)(r6 + 56) = r0
    p.push(Insn::new(0xb7, 0, 0, 0, 0));
    p.push(Insn::new(0x95, 0, 0, 0, 0));
    // fail:
    p.push(Insn::new(0xb7, 0, 0, 0, 1));
    p.push(Insn::new(0x95, 0, 0, 0, 0));
    let opts = LoadOptions { helpers: helpers::registry(), memory: Some(Arc::new(Registered)), allow_callx: false };
    let prog = Arc::new(Program::load(&p, &opts, None).unwrap());
    let interp = Interpreter::new(prog.clone());
    let jit = JitProgram::compile(prog).unwrap();
    let slots = slots();
    for engine in ["interpreter", "jit"] {
        hash.delete_elem(&1u32.to_ne_bytes()).ok();
        let mut ctx = [0u8; 64];
        let g = context::enter(&slots, RunContext::default()).unwrap();
        let r = if engine == "jit" {
            // SAFETY: the program touches its stack, `ctx` (64 bytes) and the map value the
            // lookup returned.
            unsafe { jit.run(ctx.as_mut_ptr() as u64, 0) }
        } else {
            interp.run(ctx.as_mut_ptr() as u64, 0, &[Region::of_mut(&mut ctx)])
        };
        let cpu = g.cpu();
        drop(g);
        assert_eq!(r.unwrap(), 0, "{engine}");
        let word = |o: usize| u64::from_ne_bytes(ctx[o..o + 8].try_into().unwrap());
        assert_eq!(word(0), 42, "{engine}: value read back from the map");
        assert_eq!(word(8), call(14, &[]), "{engine}: pid_tgid");
        assert_eq!(cstr(&ctx[16..48]), b"v=42", "{engine}: snprintf output");
        assert_eq!(word(48), 5, "{engine}: snprintf return value");
        assert_eq!(word(56), cpu as u64, "{engine}: CPU slot");
    }
    let _ = std::fs::remove_dir_all(&d);
}
