//! The allocator as the agent installs it: this test binary's global allocator.

use std::sync::Arc;

use userbpf_arena::{HitAlloc, MAX_SMALL, REGION, contains, scope, used};

#[global_allocator]
static ALLOC: HitAlloc = HitAlloc;

struct Probe {
    a: u64,
    b: [u8; 40],
}

#[test]
fn objects_made_in_a_scope_sit_together_in_the_region() {
    let outside = Box::new(1u64);
    assert!(!contains(&*outside as *const u64 as *const u8), "outside a scope: the system allocator");
    let (a, b, c) = scope(|| (Box::new(Probe { a: 1, b: [2; 40] }), Arc::new(7u32), Box::new([0u8; 200])));
    for p in [&*a as *const Probe as usize, Arc::as_ptr(&b) as usize, c.as_ptr() as usize] {
        assert!(contains(p as *const u8), "{p:#x} is not in the region");
    }
    // Made one after the other: within a few lines of each other, not pages apart.
    let lo = (&*a as *const Probe as usize).min(c.as_ptr() as usize);
    let hi = (&*a as *const Probe as usize).max(c.as_ptr() as usize);
    assert!(hi - lo < 1024, "{lo:#x}..{hi:#x}");
    assert_eq!((a.a, a.b[39], *b, c[199]), (1, 2, 7, 0));
    // An object of up to a line never straddles two.
    let a_at = &*a as *const Probe as usize;
    assert_eq!(a_at / 64, (a_at + std::mem::size_of::<Probe>() - 1) / 64);
    assert!(used() > 0 && used() < REGION);
}

#[test]
fn freed_blocks_are_reused_and_large_ones_go_to_the_system() {
    let first = scope(|| Box::new([5u64; 13]));
    let at = first.as_ptr() as usize;
    drop(first);
    // The same size class, freed on this thread or another: handed out again.
    let again = scope(|| Box::new([6u64; 13]));
    assert_eq!(again.as_ptr() as usize, at);
    let t = std::thread::spawn(move || drop(again));
    t.join().unwrap();
    let third = scope(|| Box::new([7u64; 13]));
    assert_eq!(third.as_ptr() as usize, at);
    assert!(third.iter().all(|&w| w == 7));

    let large = scope(|| vec![0u8; MAX_SMALL + 1]);
    assert!(!contains(large.as_ptr()));
    let zeroed = scope(|| vec![0u64; 64]);
    assert!(contains(zeroed.as_ptr() as *const u8) && zeroed.iter().all(|&w| w == 0));
}

#[test]
fn a_vector_grows_in_and_out_of_the_region() {
    let mut v = scope(|| {
        let mut v = Vec::new();
        for i in 0..100u32 {
            v.push(i);
        }
        v
    });
    assert!(contains(v.as_ptr() as *const u8));
    // Grown outside a scope: moves to the system allocator, contents kept.
    v.extend(100..5000u32);
    assert!(!contains(v.as_ptr() as *const u8));
    assert!(v.iter().copied().eq(0..5000u32));
    // And shrunk back inside one (small again): into the region.
    v.truncate(10);
    scope(|| v.shrink_to_fit());
    assert!(contains(v.as_ptr() as *const u8));
    assert!(v.iter().copied().eq(0..10u32));
}

#[test]
fn scopes_nest_and_are_per_thread() {
    scope(|| {
        scope(|| {});
        // Still inside the outer scope.
        assert!(contains(Box::new(1u8).as_ref() as *const u8));
        // Another thread is not.
        let other = std::thread::spawn(|| contains(Box::new(1u8).as_ref() as *const u8)).join().unwrap();
        assert!(!other);
    });
    assert!(!contains(Box::new(1u8).as_ref() as *const u8));
}

#[test]
fn alignment_is_kept() {
    #[repr(align(64))]
    struct Line([u8; 64]);
    #[repr(align(256))]
    struct Wide(u8);
    let l = scope(|| Box::new(Line([1; 64])));
    let w = scope(|| Box::new(Wide(3)));
    assert_eq!(&*l as *const Line as usize % 64, 0);
    assert_eq!(&*w as *const Wide as usize % 256, 0);
    assert!(contains(&*w as *const Wide as *const u8));
    assert_eq!((l.0[63], w.0), (1, 3));
}

#[test]
fn a_forked_child_can_allocate_in_the_region() {
    let _warm = scope(|| Box::new(0u64));
    // SAFETY: the child only allocates, checks and exits with `_exit`.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        let b = scope(|| Box::new(42u64));
        let ok = contains(&*b as *const u64 as *const u8) && *b == 42;
        // SAFETY: ends the child without running the parent's test harness's code.
        unsafe { libc::_exit(if ok { 0 } else { 1 }) };
    }
    let mut status = 0;
    // SAFETY: waits for the child just forked.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "status {status:#x}");
}
