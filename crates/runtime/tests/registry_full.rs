//! A process's registries of maps and programs keep what they hold for its life (a run on
//! another thread may still use it): once full, loading an object or preparing a program that
//! needs another entry fails with an error saying so, instead of a program whose map calls or
//! tail calls quietly find nothing. A test binary of its own: it fills the process's registries.

mod common;

use std::sync::Arc;

use userbpf_isa::*;
use userbpf_runtime::context::CpuSlots;
use userbpf_runtime::helpers::maps::{MAX_MAPS, register_map};
use userbpf_runtime::helpers::registry;
use userbpf_runtime::loader::{LoadOptions, prepare_record};
use userbpf_runtime::program::MapResolver;
use userbpf_runtime::program_table::MAX_PROGRAMS;
use userbpf_runtime::{Engine, LoadedProgram, load_object};

#[test]
fn a_full_program_table_or_map_registry_is_an_error_naming_the_program_or_map() {
    let path = common::compile("control");
    let s = common::session("registry-full");
    let obj = common::load(&s, &path, Engine::Jit, None);
    let rec = obj.programs.iter().find(|(r, _)| r.name == "tail_target").unwrap().0.clone();
    let slots = Arc::new(CpuSlots::open(&s.layout().cpus()).unwrap());
    let prepare = || prepare_record(&s, &rec, registry(), Engine::Jit, slots.clone());
    // Prepared while there is room; prepared again, it reuses its opening (no new entry).
    prepare().unwrap();

    // The program table: filled with programs of other ids, loading an object fails naming
    // its first program.
    let none: &[(u32, Arc<userbpf_maps::Map>)] = &[];
    let tiny = [Insn::new(BPF_ALU64 | BPF_MOV | BPF_K, 0, 0, 0, 0), Insn::new(OP_EXIT, 0, 0, 0, 0)];
    let mut id = 1_000_000;
    loop {
        let p = LoadedProgram::prepare(
            id,
            "filler",
            &tiny,
            registry(),
            &none as &dyn MapResolver,
            Engine::Interpreter,
            slots.clone(),
        )
        .unwrap();
        if !userbpf_runtime::program_table::register(Arc::new(p)) {
            break;
        }
        id += 1;
        assert!(id - 1_000_000 <= MAX_PROGRAMS as u32, "the program table never filled");
    }
    let opts = LoadOptions { engine: Engine::Jit, helpers: registry(), only: Some(&["tail_target".to_string()]) };
    let err = load_object(&s, userbpf_object::Object::open(&path).unwrap(), &opts, slots.clone())
        .err()
        .expect("no room for its program");
    assert!(err.to_string().contains(&format!("already holds {MAX_PROGRAMS} programs")), "{err}");

    // Fill the registry with other openings of a map (each opening is an entry of its own).
    let hits = obj.map("hits").unwrap();
    let mut n = 0;
    while register_map(100_000 + n, Arc::new(s.open_map(hits.record.id).unwrap())) {
        n += 1;
        assert!((n as usize) <= MAX_MAPS, "the registry never filled");
    }
    prepare().unwrap();
    // A session made anew under the same name: its `hits` is another file, so another entry.
    std::fs::remove_dir_all(s.dir()).unwrap();
    let s2 = common::session("registry-full");
    let full = format!("already holds {MAX_MAPS} maps");
    // Loading the object there (as a loader does) fails on its first map.
    let object = userbpf_object::Object::open(&path).unwrap();
    let err = load_object(&s2, object, &opts, slots.clone()).err().expect("no room for its maps");
    assert!(err.to_string().contains(&full), "{err}");
    // A program recorded there by another process (as the agent prepares it) names itself.
    let map = s2.create_map(hits.map.spec(), hits.record.clone()).unwrap().0;
    let mut rec2 = rec.clone();
    rec2.map_ids = vec![map.id];
    let err = prepare_record(&s2, &rec2, registry(), Engine::Jit, slots.clone())
        .err()
        .expect("no room for the new session's map");
    assert!(err.contains("program `tail_target`") && err.contains(&full), "{err}");
}
