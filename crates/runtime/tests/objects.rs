//! Objects compiled from C: every map type used from programs, in both executors.

mod common;

use userbpf_runtime::Engine;

/// The trace sink is one per process (loading an object installs its session's): tests take
/// turns.
static TRACE: std::sync::Mutex<()> = std::sync::Mutex::new(());

const PROGS: [&str; 6] =
    ["hash_and_array", "percpu_and_lru", "queue_stack_bloom", "lpm_and_map_in_map", "globals", "ring_and_perf"];

fn maps_programs(engine: Engine) {
    let _turn = TRACE.lock().unwrap_or_else(|e| e.into_inner());
    let path = common::compile("maps");
    let s = common::session(&format!("maps-{engine:?}"));
    let obj = common::load(&s, &path, engine, None);
    for p in PROGS {
        assert_eq!(common::run(&obj, p), 0, "{p} ({engine:?}) failed at the line it returned");
    }
    // What the programs left in the maps, read through the syscall-style API.
    let array = &obj.map("array").unwrap().map;
    let mut v = [0u8; 8];
    array.lookup_elem(&2u32.to_ne_bytes(), &mut v).unwrap();
    assert_eq!(u64::from_ne_bytes(v), 42);
    let data = obj.maps.iter().find(|m| m.def.name.ends_with(".data")).unwrap();
    data.map.lookup_elem(&0u32.to_ne_bytes(), &mut v).unwrap();
    assert_eq!(u64::from_ne_bytes(v), 8, "counter in .data");
    // Two ring buffer records and one perf sample.
    let events = &obj.map("events").unwrap().map;
    let userbpf_maps::Map::RingBuf(rb) = &**events else { panic!("events is not a ringbuf") };
    let mut c = userbpf_maps::ringbuf::RingBufConsumer::new(rb).unwrap();
    let mut seqs = Vec::new();
    c.consume(|rec| seqs.push(u64::from_ne_bytes(rec[24..32].try_into().unwrap()))).unwrap();
    assert_eq!(seqs, [1, 2]);
}

#[test]
fn maps_from_c_in_the_jit() {
    maps_programs(Engine::Jit);
}

#[test]
fn maps_from_c_in_the_interpreter() {
    maps_programs(Engine::Interpreter);
}

fn control_programs(engine: Engine) {
    let _turn = TRACE.lock().unwrap_or_else(|e| e.into_inner());
    let path = common::compile("control");
    let s = common::session(&format!("control-{engine:?}"));
    let obj = common::load(&s, &path, engine, None);
    // The tail call replaces the caller: its r0 is the target's.
    assert_eq!(common::run_args(&obj, "tail_caller", &[5]), 1005, "{engine:?}");
    let hits = &obj.map("hits").unwrap().map;
    let mut v = [0u8; 8];
    hits.lookup_elem(&0u32.to_ne_bytes(), &mut v).unwrap();
    assert_eq!(u64::from_ne_bytes(v), 1);
    assert_eq!(common::run(&obj, "loops_and_calls"), 0, "{engine:?}: failed at the line returned");
    assert_eq!(common::run_args(&obj, "context_and_strings", &[7, 8]), 0, "{engine:?}: failed at the line returned");
    let lines = s.read_trace_pipe().unwrap();
    assert!(lines.iter().any(|l| l.contains("bpf_trace_printk: hello from userbpf, arg 7")), "{lines:?}");
}

#[test]
fn control_from_c_in_the_jit() {
    control_programs(Engine::Jit);
}

#[test]
fn control_from_c_in_the_interpreter() {
    control_programs(Engine::Interpreter);
}
