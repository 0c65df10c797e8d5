//! Loading objects into a session as libbpf loads them: statically initialised prog arrays
//! filled whichever programs are asked for, and refused when a slot names a program that is
//! not loaded.

mod common;

use std::sync::Arc;
use userbpf_runtime::context::CpuSlots;
use userbpf_runtime::loader::LoadOptions;
use userbpf_runtime::{load_object, Engine};

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
    let slots = Arc::new(CpuSlots::open(&s.dir().join("cpus")).unwrap());
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
