//! Loading objects into a session as libbpf loads them: statically initialised prog arrays
//! filled whichever programs are asked for, and refused when a slot names a program that is
//! not loaded.

mod common;

use std::sync::Arc;
use userbpf_runtime::context::CpuSlots;
use userbpf_runtime::loader::LoadOptions;
use userbpf_runtime::{Engine, load_object};

/// The trace sink is one per process (loading an object installs its session's): tests take
/// turns.
static TRACE: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn a_static_prog_array_is_filled_when_only_its_caller_is_asked_for() {
    let _turn = TRACE.lock().unwrap_or_else(|e| e.into_inner());
    let path = common::compile("control");
    for engine in [Engine::Jit, Engine::Interpreter] {
        let s = common::session(&format!("only-tail-{engine:?}"));
        // As `userbpf prog run OBJ tail_caller`: only the caller is named.
        let only = ["tail_caller".to_string()];
        let obj = common::load(&s, &path, engine, Some(&only));
        // The target came along for its slot, and nothing else did.
        let mut names: Vec<&str> = obj.programs.iter().map(|(r, _)| r.name.as_str()).collect();
        names.sort();
        assert_eq!(names, ["tail_caller", "tail_target"], "{engine:?}");
        let jumps = &obj.map("init_jumps").unwrap().map;
        let mut v = [0u8; 4];
        jumps.lookup_elem(&1u32.to_ne_bytes(), &mut v).unwrap();
        let target_id = obj.programs.iter().find(|(r, _)| r.name == "tail_target").unwrap().0.id;
        assert_eq!(u32::from_ne_bytes(v), target_id, "slot 1 holds tail_target ({engine:?})");
        assert!(jumps.lookup_elem(&0u32.to_ne_bytes(), &mut v).is_err(), "slot 0 stays empty");
        // The tail call lands: r0 is the target's, and the target counted.
        assert_eq!(common::run_args(&obj, "tail_caller", &[5]), 1005, "{engine:?}");
        let hits = &obj.map("hits").unwrap().map;
        let mut h = [0u8; 8];
        hits.lookup_elem(&0u32.to_ne_bytes(), &mut h).unwrap();
        assert_eq!(u64::from_ne_bytes(h), 1, "{engine:?}");
    }
}

#[test]
fn a_slot_naming_a_program_that_is_not_loaded_is_refused() {
    let _turn = TRACE.lock().unwrap_or_else(|e| e.into_inner());
    let path = common::compile("tail_noautoload");
    let s = common::session("noautoload-slot");
    let obj = userbpf_object::Object::open(&path).unwrap();
    let slots = Arc::new(CpuSlots::open(&s.layout().cpus()).unwrap());
    let opts = LoadOptions { engine: Engine::Jit, helpers: userbpf_runtime::helpers::registry(), only: None };
    let err = load_object(&s, obj, &opts, slots.clone()).err().expect("the load fails, as libbpf's").to_string();
    assert!(err.contains("map `lazy_jmp`"), "{err}");
    assert!(err.contains("slot 0 names program `lazy_target` (section ?uprobe), which is not loaded"), "{err}");
    // Asking for the caller by name loads the target with it (`userbpf prog run` does).
    let obj = userbpf_object::Object::open(&path).unwrap();
    let only = ["caller".to_string()];
    let opts = LoadOptions { only: Some(&only), ..opts };
    let loaded = load_object(&s, obj, &opts, slots).unwrap_or_else(|e| panic!("{e}"));
    assert!(loaded.program("lazy_target").is_some());
    assert_eq!(common::run(&loaded, "caller"), 1, "the tail call lands");
}

fn try_load(s: &userbpf_runtime::Session, name: &str) -> Result<userbpf_runtime::LoadedObject, String> {
    let obj = userbpf_object::Object::open(common::compile(name)).unwrap();
    let slots = Arc::new(CpuSlots::open(&s.layout().cpus()).unwrap());
    let opts = LoadOptions { engine: Engine::Jit, helpers: userbpf_runtime::helpers::registry(), only: None };
    load_object(s, obj, &opts, slots).map_err(|e| e.to_string())
}

#[test]
fn map_attributes_and_subprograms_work_as_in_libbpf() {
    let _turn = TRACE.lock().unwrap_or_else(|e| e.into_inner());
    let s = common::session("features");
    let first = try_load(&s, "features").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(common::run(&first, "features"), 0, "failed at the line returned");
    let m = |n: &str| first.map(n).unwrap_or_else(|| panic!("no map {n}"));
    // map_extra reaches the bloom filter (its number of hash functions); flags as declared.
    assert_eq!(m("bloom").map.spec().map_extra, 5);
    assert_eq!(m("sparse").map.spec().map_flags, userbpf_maps::BPF_F_NO_PREALLOC | (1 << 2));
    assert_eq!(m("shared").map.spec().map_flags, userbpf_object::maps::BPF_F_MMAPABLE);
    assert_eq!(m("settings").map.spec().map_flags, userbpf_object::maps::BPF_F_RDONLY_PROG);
    // LIBBPF_PIN_BY_NAME: pinned at /sys/fs/bpf/NAME in the session ...
    let pinned = m("pinned_runs");
    assert!(!pinned.reused);
    assert_eq!(pinned.record.pinned.as_deref(), Some("/sys/fs/bpf/pinned_runs"));
    let recorded = s.maps().unwrap().into_iter().find(|r| r.id == pinned.record.id).unwrap();
    assert_eq!(recorded.pinned.as_deref(), Some("/sys/fs/bpf/pinned_runs"));
    let pin = std::fs::read_to_string(s.layout().pin(b"/sys/fs/bpf/pinned_runs")).unwrap();
    assert_eq!(pin, format!("map {}\n", pinned.record.id));
    // ... and reused by the next load, which counts on (unpinned maps are created anew).
    let second = try_load(&s, "features").unwrap_or_else(|e| panic!("{e}"));
    let again = second.map("pinned_runs").unwrap();
    assert!(again.reused);
    assert_eq!(again.record.id, pinned.record.id);
    assert_ne!(second.map("sparse").unwrap().record.id, m("sparse").record.id);
    assert_eq!(common::run(&second, "features"), 0);
    let mut v = [0u8; 8];
    again.map.lookup_elem(&0u32.to_ne_bytes(), &mut v).unwrap();
    assert_eq!(u64::from_ne_bytes(v), 2, "both runs counted in the one pinned map");
    // A definition that does not match the pinned map is refused, as libbpf refuses it.
    let e = try_load(&s, "pin_mismatch").err().expect("refused");
    assert!(
        e.contains("map `pinned_runs`")
            && e.contains("the map pinned at /sys/fs/bpf/pinned_runs")
            && e.contains("max_entries 0x1 != 0x4"),
        "{e}"
    );
    // Unpinning (what `userbpf run` does for its own session) removes pin and record mark.
    userbpf_runtime::loader::unpin_maps(&s, &second).unwrap();
    assert!(!s.layout().pin(b"/sys/fs/bpf/pinned_runs").exists());
    assert!(s.maps().unwrap().iter().all(|r| r.pinned.is_none()));
}

#[test]
fn map_attributes_the_kernel_refuses_are_refused_by_name() {
    let _turn = TRACE.lock().unwrap_or_else(|e| e.into_inner());
    let s = common::session("bad-attrs");
    let e = try_load(&s, "bad_numa").err().expect("refused");
    assert!(e.contains("map `far_node`: numa_node 4000 (with BPF_F_NUMA_NODE) is not an online NUMA node"), "{e}");
    let e = try_load(&s, "bad_flags").err().expect("refused");
    assert!(e.contains("map `mmap_hash`") && e.contains("flags"), "{e}");
}

#[test]
fn gpl_only_helpers_need_a_gpl_compatible_license() {
    let _turn = TRACE.lock().unwrap_or_else(|e| e.into_inner());
    let s = common::session("license");
    let e = try_load(&s, "proprietary").err().expect("refused");
    assert!(
        e.contains("program `reads` (section uprobe): instruction ")
            && e.contains("cannot call GPL-restricted function bpf_probe_read_user#112 from a program that is not GPL-compatible (license \"Proprietary\""),
        "{e}"
    );
    // Map helpers are for every license.
    let path = common::compile("proprietary");
    let only = ["counts".to_string()];
    let obj = common::load(&s, &path, Engine::Jit, Some(&only));
    assert_eq!(common::run(&obj, "counts"), 0);
}

#[test]
fn a_failed_load_unpins_what_it_pinned() {
    let _turn = TRACE.lock().unwrap_or_else(|e| e.into_inner());
    let s = common::session("pin-then-fail");
    let e = try_load(&s, "pin_then_fail").err().expect("refused");
    assert!(e.contains("GPL-restricted"), "{e}");
    assert!(!s.layout().pin(b"/sys/fs/bpf/doomed_pin").exists(), "the pin was removed");
    assert!(s.maps().unwrap().iter().all(|r| r.pinned.is_none()), "no map record is left pinned");
}

/// The programs a process prepares from the session's records (as an agent does for each link
/// it runs) share one opening of each map: preparing a program again finds the map already
/// opened and registered, instead of mapping and registering another copy (the registry keeps
/// what it holds for the process's life).
#[test]
fn programs_prepared_from_the_session_share_one_opening_of_each_map() {
    let _turn = TRACE.lock().unwrap_or_else(|e| e.into_inner());
    let path = common::compile("control");
    let s = common::session("shared-opening");
    let obj = common::load(&s, &path, Engine::Jit, None);
    let rec = obj.programs.iter().find(|(r, _)| r.name == "tail_target").unwrap().0.clone();
    let hits = obj.map("hits").unwrap();
    let (key, id) = (userbpf_runtime::helpers::maps::session_key_of(&hits.map), hits.record.id);
    let slots = Arc::new(CpuSlots::open(&s.layout().cpus()).unwrap());
    let prepare = || {
        userbpf_runtime::loader::prepare_record(
            &s,
            &rec,
            userbpf_runtime::helpers::registry(),
            Engine::Jit,
            slots.clone(),
        )
        .unwrap()
    };
    let registered = || userbpf_runtime::helpers::maps::map_by_session_id(key, id).unwrap() as *const userbpf_maps::Map;
    let first = prepare();
    let opening = registered();
    let second = prepare();
    assert_eq!(registered(), opening, "the second program found the first's opening of `hits`");
    // Both count into the session's map.
    for p in [&first, &second] {
        let mut regs = [0u8; 168];
        p.run(regs.as_mut_ptr(), regs.len(), userbpf_runtime::context::RunContext::default()).unwrap();
    }
    let mut v = [0u8; 8];
    hits.map.lookup_elem(&0u32.to_ne_bytes(), &mut v).unwrap();
    assert_eq!(u64::from_ne_bytes(v), 2);
}
