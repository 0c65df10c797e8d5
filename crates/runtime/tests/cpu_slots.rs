//! CPU slots under contention: more threads than CPUs, all on one CPU, so that a thread is
//! often preempted in the middle of a run (holding its slot) while others want to run.
//!
//! In the kernel a uprobe's program runs with preemption disabled: it is never skipped
//! because other threads are running programs, and its per-CPU values see no lost update.
//! userbpf must give the same counts: a run that finds every slot held waits for one (the
//! holders are preempted threads that finish in a moment) instead of being skipped.

use std::sync::Arc;

use userbpf_isa::*;
use userbpf_maps::{Map, MapSpec, MapType};
use userbpf_runtime::context::{self, CpuSlots, RunContext};
use userbpf_runtime::program::MapResolver;
use userbpf_runtime::{Engine, LoadedProgram};

/// `v = lookup(map 1, 0); x = *v; <window of `window` instructions>; *v = x + 1`: a
/// non-atomic increment of this CPU's value, as bpftrace's `count()` does it.
fn increment(window: usize) -> Vec<Insn> {
    let mut p = vec![
        Insn::new(BPF_ST | BPF_MEM | BPF_W, 10, 0, -4, 0),
        Insn::new(OP_LDDW, 1, BPF_PSEUDO_MAP_IDX, 0, 1),
        Insn::new(0, 0, 0, 0, 0),
        Insn::new(BPF_ALU64 | BPF_MOV | BPF_X, 2, 10, 0, 0),
        Insn::new(BPF_ALU64 | BPF_ADD | BPF_K, 2, 0, 0, -4),
        Insn::new(OP_CALL, 0, 0, 0, 1),
        Insn::new(BPF_JMP | BPF_JEQ | BPF_K, 0, 0, (window + 3) as i16, 0),
        Insn::new(BPF_LDX | BPF_MEM | BPF_DW, 1, 0, 0, 0),
    ];
    p.extend(std::iter::repeat_n(Insn::new(BPF_ALU64 | BPF_ADD | BPF_K, 1, 0, 0, 0), window));
    p.extend([
        Insn::new(BPF_ALU64 | BPF_ADD | BPF_K, 1, 0, 0, 1),
        Insn::new(BPF_STX | BPF_MEM | BPF_DW, 0, 1, 0, 0),
        Insn::new(BPF_ALU64 | BPF_MOV | BPF_K, 0, 0, 0, 0),
        Insn::new(OP_EXIT, 0, 0, 0, 0),
    ]);
    p
}

/// Pins the calling thread to the first CPU it may run on.
fn pin_to_one_cpu() {
    // SAFETY: cpu_set_t values we own; sched_get/setaffinity on this thread only.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        assert_eq!(libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set), 0);
        let cpu = (0..libc::CPU_SETSIZE as usize).find(|&c| libc::CPU_ISSET(c, &set)).unwrap();
        let mut one: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut one);
        assert_eq!(libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &one), 0);
    }
}

#[test]
fn more_threads_than_cpus_on_one_cpu_lose_no_run_and_no_update() {
    let dir = userbpf_testutil::TmpDir::new("cpu-slots");
    let spec = MapSpec {
        map_type: MapType::BPF_MAP_TYPE_PERCPU_ARRAY,
        key_size: 4,
        value_size: 8,
        max_entries: 1,
        map_flags: 0,
        map_extra: 0,
        name: "count".into(),
    };
    let map = Arc::new(Map::create(&dir.join("map"), &spec).unwrap());
    map.set_id(1);
    assert!(userbpf_runtime::helpers::maps::register_map(1, map.clone()));
    let slots = Arc::new(CpuSlots::private().unwrap());
    let nr = slots.nr_cpus() as usize;
    let maps = [(1u32, map.clone())];
    let resolver: &[(u32, Arc<Map>)] = &maps;
    let helpers = userbpf_runtime::helpers::registry();
    let prog = Arc::new(
        LoadedProgram::prepare(
            1,
            "count",
            &increment(400),
            helpers,
            &resolver as &dyn MapResolver,
            Engine::Jit,
            slots.clone(),
        )
        .unwrap(),
    );

    // Threads enough that every slot is often held by a preempted thread.
    let threads = 2 * nr + 2;
    let runs = 200_000u64;
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let prog = prog.clone();
            std::thread::spawn(move || {
                pin_to_one_cpu();
                let mut regs = [0u8; 168];
                let mut skipped = 0u64;
                for _ in 0..runs {
                    match prog.run(regs.as_mut_ptr(), regs.len(), RunContext::default()) {
                        Ok(Some(_)) => {}
                        Ok(None) => skipped += 1,
                        Err(e) => panic!("run failed: {e}"),
                    }
                }
                skipped
            })
        })
        .collect();
    let skipped: u64 = handles.into_iter().map(|h| h.join().unwrap()).sum();

    let mut values = vec![0u8; map.value_buf_size()];
    map.lookup_elem(&0u32.to_ne_bytes(), &mut values).unwrap();
    let per_cpu: Vec<u64> = values.chunks(8).take(nr).map(|c| u64::from_ne_bytes(c.try_into().unwrap())).collect();
    let total: u64 = per_cpu.iter().sum();
    let expected = threads as u64 * runs;
    assert_eq!(
        skipped,
        0,
        "runs skipped ({} missed), per-CPU values {per_cpu:?}",
        prog.stats.missed.load(std::sync::atomic::Ordering::Relaxed)
    );
    assert_eq!(total, expected, "lost updates: per-CPU values {per_cpu:?}");
    assert_eq!(prog.stats.missed.load(std::sync::atomic::Ordering::Relaxed), 0);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Every slot held by a thread that is not running (blocked here, as a preempted thread is
/// off its CPU): a new run is not skipped (it waits until a slot is given back).
#[test]
fn a_run_is_not_skipped_while_every_slot_is_held() {
    let slots = Arc::new(CpuSlots::private().unwrap());
    let nr = slots.nr_cpus() as usize;
    let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
    let release_rx = Arc::new(std::sync::Mutex::new(release_rx));
    let (held_tx, held_rx) = std::sync::mpsc::channel::<u32>();
    let holders: Vec<_> = (0..nr)
        .map(|_| {
            let (slots, held_tx, release_rx) = (slots.clone(), held_tx.clone(), release_rx.clone());
            std::thread::spawn(move || {
                let g = context::enter(&slots, RunContext::default()).expect("a free slot");
                held_tx.send(g.cpu()).unwrap();
                // Wait (blocked, not running) until told to give the slot back.
                let _ = release_rx.lock().unwrap().recv();
                drop(g);
            })
        })
        .collect();
    let mut held: Vec<u32> = (0..nr).map(|_| held_rx.recv().unwrap()).collect();
    held.sort();
    assert_eq!(held, (0..nr as u32).collect::<Vec<_>>());
    let waiter = {
        let slots = slots.clone();
        std::thread::spawn(move || {
            let g = context::enter(&slots, RunContext::default()).map_err(|e| format!("{e:?}"))?;
            Ok::<u32, String>(g.cpu())
        })
    };
    release_tx.send(()).unwrap();
    let got = waiter.join().unwrap();
    for _ in 1..nr {
        release_tx.send(()).unwrap();
    }
    for h in holders {
        h.join().unwrap();
    }
    let cpu = got.expect("the run was skipped while every slot was held");
    assert!((cpu as usize) < nr);
}

/// Slots held by runs of processes that died in the middle of them (killed targets) are
/// taken over: they would otherwise never be given back.
#[test]
fn slots_of_dead_holders_are_taken_over() {
    let slots = CpuSlots::private().unwrap();
    for _ in 0..slots.nr_cpus() {
        // SAFETY: the child only claims a slot (atomics on the shared mapping, gettid) and
        // leaves with _exit, running nothing of the parent's other threads' state.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            let code = match context::enter(&slots, RunContext::default()) {
                Ok(g) => {
                    std::mem::forget(g);
                    0
                }
                Err(_) => 1,
            };
            // SAFETY: leaves the child at once, as a process killed in the middle of a run.
            unsafe { libc::_exit(code) };
        }
        let mut status = 0;
        // SAFETY: waiting for our own child.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "a child could not claim a slot");
    }
    let g = context::enter(&slots, RunContext::default()).expect("every slot is held by a dead process");
    assert!(g.cpu() < slots.nr_cpus());
}
