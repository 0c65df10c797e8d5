//! Objects userbpf cannot run are refused with an error naming the object, the map or
//! program, and why.

mod common;

use std::sync::Arc;

use userbpf_runtime::context::CpuSlots;
use userbpf_runtime::loader::LoadOptions;
use userbpf_runtime::{Engine, load_object};

fn load_err(name: &str, only: Option<&[String]>) -> String {
    let path = common::compile(name);
    let s = common::session(&format!("refused-{name}"));
    let obj = userbpf_object::Object::open(&path).unwrap();
    let slots = Arc::new(CpuSlots::open(&s.layout().cpus()).unwrap());
    let opts = LoadOptions { engine: Engine::Jit, helpers: userbpf_runtime::helpers::registry(), only };
    match load_object(&s, obj, &opts, slots) {
        Ok(_) => panic!("{name} loaded"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn unsupported_map_type() {
    let e = load_err("refused", None);
    assert!(e.ends_with("refused.bpf.o: map `socks`: map type 15 (sockmap) is not supported by userbpf"), "{e}");
}

#[test]
fn missing_helper_is_named() {
    let e = load_err("missing_helper", None);
    assert!(
        e.contains("program `uses_task_btf` (section uprobe): instruction 0: helper bpf_get_current_task_btf (id 158) is not supported"),
        "{e}"
    );
}

#[test]
fn kernel_only_programs() {
    let e = load_err("kernel_only", None);
    assert!(
        e.contains("program `kernel_side` (section kprobe/do_sys_open): kprobe programs run only in the kernel"),
        "{e}"
    );
    // The user-space program alone loads.
    let path = common::compile("kernel_only");
    let s = common::session("kernel-only-ok");
    let only = ["user_side".to_string()];
    let obj = common::load(&s, &path, Engine::Interpreter, Some(&only));
    assert_eq!(common::run(&obj, "user_side"), 0);
}

#[test]
fn snprintf_formats_are_checked_when_loading() {
    // As the kernel's verifier: a constant format bpf_snprintf would refuse fails the load.
    for (prog, insn) in [("with_precision", "Invalid format string"), ("with_too_few", "Invalid format string")] {
        let only = [prog.to_string()];
        let e = load_err("bad_format", Some(&only));
        assert!(e.contains(&format!("program `{prog}` (section uprobe): instruction ")) && e.contains(insn), "{e}");
    }
}
