//! The programs' run statistics in the session (`userbpf_runtime::prog_stats`): a bound
//! process's runs are in its counters file, read from outside without stopping anything; the
//! same program prepared again takes up its slot; a forked child counts in a file of its own
//! (the parent's counts are not the child's); a dead process's counts are folded into the
//! session's retired totals, never lost nor counted twice; runs are counted only while the
//! session's switch is held.

use std::sync::Arc;

use userbpf_isa::*;
use userbpf_runtime::context::{CpuSlots, RunContext};
use userbpf_runtime::program::MapResolver;
use userbpf_runtime::{Engine, LoadedProgram, Session, prog_stats};

fn prepare(slots: &Arc<CpuSlots>) -> LoadedProgram {
    let insns = [Insn::new(BPF_ALU64 | BPF_MOV | BPF_K, 0, 0, 0, 7), Insn::new(OP_EXIT, 0, 0, 0, 0)];
    let none: &[(u32, Arc<userbpf_maps::Map>)] = &[];
    LoadedProgram::prepare(
        42,
        "counted_prog",
        &insns,
        userbpf_runtime::helpers::registry(),
        &none as &dyn MapResolver,
        Engine::Jit,
        slots.clone(),
    )
    .unwrap()
}

fn run(p: &LoadedProgram, n: u32) {
    let mut regs = [0u8; 168];
    for _ in 0..n {
        assert_eq!(p.run(regs.as_mut_ptr(), regs.len(), RunContext::default()).unwrap(), Some(7));
    }
}

fn runs_of(snap: &prog_stats::Snapshot, pid: u32) -> Vec<(u32, String, u64)> {
    snap.processes
        .iter()
        .filter(|p| p.pid == pid)
        .flat_map(|p| p.progs.iter().map(|x| (x.id, x.name.clone(), x.run_cnt)))
        .collect()
}

#[test]
fn counters_live_in_the_session_survive_their_process_and_follow_the_switch() {
    let root = userbpf_testutil::TmpDir::new("prog-stats");
    let s = Session::open_in(&root, "stats").unwrap();
    let l = s.layout().clone();
    prog_stats::bind(&l).unwrap();
    let slots = Arc::new(CpuSlots::open(&l.cpus()).unwrap());
    let me = std::process::id();

    // Off: runs are not counted (misses and errors always are).
    let p = prepare(&slots);
    run(&p, 3);
    assert_eq!(runs_of(&prog_stats::read(&l).unwrap(), me), [(42, "counted_prog".to_string(), 0)]);

    let hold = prog_stats::hold_run_stats(&l).unwrap();
    assert!(prog_stats::read(&l).unwrap().switch_on);
    run(&p, 10);
    // Prepared again (an agent's re-sync): the same slot, the counts go on.
    let again = prepare(&slots);
    run(&again, 5);
    let snap = prog_stats::read(&l).unwrap();
    assert_eq!(runs_of(&snap, me), [(42, "counted_prog".to_string(), 15)]);
    assert!(snap.processes.iter().find(|x| x.pid == me).unwrap().progs[0].run_time_ns > 0);

    // A forked child counts in its own file; once it is gone its counts are folded.
    // SAFETY: the child only runs the program (no allocation, no lock) and _exits.
    let child = unsafe { libc::fork() };
    assert!(child >= 0);
    if child == 0 {
        run(&p, 7);
        // SAFETY: ends the child without running the parent's destructors.
        unsafe { libc::_exit(0) };
    }
    let mut status = 0;
    // SAFETY: waiting for the child forked above.
    assert_eq!(unsafe { libc::waitpid(child, &mut status, 0) }, child);
    assert_eq!(status, 0);
    let snap = prog_stats::read(&l).unwrap();
    assert_eq!(runs_of(&snap, me), [(42, "counted_prog".to_string(), 15)], "the child's runs went to its parent");
    assert!(runs_of(&snap, child as u32).is_empty(), "a dead child's file is still read: {snap:?}");
    assert_eq!(snap.retired.iter().map(|x| (x.id, x.run_cnt)).collect::<Vec<_>>(), [(42, 7)]);
    assert_eq!(snap.totals()[&42].run_cnt, 22);
    // Read again: folded once, not twice.
    assert_eq!(prog_stats::read(&l).unwrap().totals()[&42].run_cnt, 22);

    // The switch let go: runs are not counted any more.
    drop(hold);
    assert!(!prog_stats::read(&l).unwrap().switch_on);
    run(&p, 4);
    assert_eq!(prog_stats::read(&l).unwrap().totals()[&42].run_cnt, 22);
    assert_eq!(prog_stats::read(&l).unwrap().totals()[&42].missed, 0);
}
