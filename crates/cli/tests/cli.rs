//! The `userbpf` command as a user runs it: `prog run` on a clang-compiled object, `map list`
//! and `map dump` on a session another process holds, `prog list`, and clear errors.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Arc;

use serde_json::Value;

fn userbpf() -> Command {
    Command::new(env!("CARGO_BIN_EXE_userbpf"))
}

fn shm_dir() -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("cli-shm-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn example(name: &str) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/bpf").join(format!("{name}.bpf.c"));
    userbpf_testutil::compile_bpf(&src, &Path::new(env!("CARGO_TARGET_TMPDIR")).join("bpf"))
}

fn ok(out: Output) -> String {
    assert!(out.status.success(), "userbpf failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn prog_run_prints_r0_and_typed_maps() {
    let obj = example("latency");
    for engine in [&[][..], &["--interpreter"][..]] {
        let out = ok(userbpf()
            .env("USERBPF_SHM_DIR", shm_dir())
            .args(["--session", "cli-run", "prog", "run"])
            .arg(&obj)
            .args(["--repeat", "2", "--json"])
            .args(engine)
            .output()
            .unwrap());
        let v: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["retval"], 1000, "bpf_loop ran 1000 callbacks");
        let maps = v["maps"].as_array().unwrap();
        let bss = maps.iter().find(|m| m["name"] == "latency.bss").unwrap();
        assert_eq!(bss["entries"][0]["value"]["calls"], 2000);
        let hist = maps.iter().find(|m| m["name"] == "hist").unwrap();
        let total: u64 = hist["entries"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|e| e["values"].as_array().unwrap().iter().map(|c| c["value"].as_u64().unwrap()))
            .sum();
        assert_eq!(total, 2000, "every call counted once across the per-CPU slots");
        let slowest = maps.iter().find(|m| m["name"] == "slowest").unwrap();
        let kinds: Vec<&str> =
            slowest["entries"].as_array().unwrap().iter().map(|e| e["key"]["kind"].as_str().unwrap()).collect();
        assert!(kinds.contains(&"READ") && kinds.contains(&"WRITE"), "enums by name: {kinds:?}");
        assert_eq!(slowest["entries"][0]["key"]["comm"], "userbpf", "char arrays as strings");
    }
    // Text output names the program, r0 and the maps.
    let text = ok(userbpf()
        .env("USERBPF_SHM_DIR", shm_dir())
        .args(["--session", "cli-run-text", "prog", "run"])
        .arg(&obj)
        .output()
        .unwrap());
    assert!(text.starts_with("latency: r0 = 1000 (0x3e8); 1 runs,"), "{text}");
    assert!(text.contains("map latency.bss (array, id 4):\n  key = 0, value = { .calls = 1000 }"), "{text}");
}

#[test]
fn map_dump_reads_a_session_held_by_another_process() {
    let dir = shm_dir();
    // SAFETY: (of the environment change) this test binary's tests all set the same value.
    unsafe { std::env::set_var("USERBPF_SHM_DIR", &dir) };
    let session = userbpf_runtime::Session::open("cli-held").unwrap();
    let slots = Arc::new(userbpf_runtime::context::CpuSlots::open(&session.layout().cpus()).unwrap());
    let object = userbpf_object::Object::open(example("latency")).unwrap();
    let opts = userbpf_runtime::loader::LoadOptions {
        engine: userbpf_runtime::Engine::Jit,
        helpers: userbpf_runtime::helpers::registry(),
        only: None,
    };
    let loaded = userbpf_runtime::load_object(&session, object, &opts, slots).unwrap();
    let mut regs = [0u8; 168];
    let p = loaded.program("latency").unwrap();
    assert_eq!(p.run(regs.as_mut_ptr(), regs.len(), Default::default()).unwrap(), Some(1000));

    let list = ok(userbpf()
        .env("USERBPF_SHM_DIR", &dir)
        .args(["--session", "cli-held", "map", "list", "--json"])
        .output()
        .unwrap());
    let list: Value = serde_json::from_str(&list).unwrap();
    let names: Vec<&str> = list.as_array().unwrap().iter().map(|m| m["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["hist", "slowest", "latency.bss"]);
    assert_eq!(list[0]["type"], "percpu_array");

    let dump = ok(userbpf()
        .env("USERBPF_SHM_DIR", &dir)
        .args(["--session", "cli-held", "map", "dump", "latency.bss"])
        .output()
        .unwrap());
    assert_eq!(dump, "key = 0, value = { .calls = 1000 }\n");
    let by_id = ok(userbpf()
        .env("USERBPF_SHM_DIR", &dir)
        .args(["--session", "cli-held", "map", "dump", "3", "--json"])
        .output()
        .unwrap());
    let by_id: Value = serde_json::from_str(&by_id).unwrap();
    assert_eq!(by_id.as_array().unwrap().len(), 2, "slowest has a READ and a WRITE caller");

    let progs =
        ok(userbpf().env("USERBPF_SHM_DIR", &dir).args(["--session", "cli-held", "prog", "list"]).output().unwrap());
    assert!(progs.contains("kprobe  name latency  section uprobe"), "{progs}");

    let missing =
        userbpf().env("USERBPF_SHM_DIR", &dir).args(["--session", "cli-held", "map", "dump", "nope"]).output().unwrap();
    assert!(!missing.status.success());
    assert_eq!(String::from_utf8_lossy(&missing.stderr).trim(), "userbpf: no map `nope` in session cli-held");
    drop(session);
}

#[test]
fn bad_input_gets_clear_errors() {
    let dir = shm_dir();
    let run = |args: &[&str], stdin: &str| {
        use std::io::Write;
        let mut child = userbpf()
            .env("USERBPF_SHM_DIR", &dir)
            .args(args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(!out.status.success(), "{args:?} succeeded");
        String::from_utf8_lossy(&out.stderr).trim().to_string()
    };
    // A jump out of the program, named by instruction index.
    assert_eq!(
        run(&["exec"], "05 00 05 00 00 00 00 00 95 00 00 00 00 00 00 00"),
        "userbpf: program refused: instruction 0: jump to instruction 6, outside the program of 2 instructions"
    );
    // A null dereference in the JIT is contained and reported.
    let e = run(&["exec"], "b7 01 00 00 00 00 00 00 79 10 00 00 00 00 00 00 95 00 00 00 00 00 00 00");
    assert!(e.contains("instruction 1"), "{e}");
    // An object that is not one.
    let not_elf = Path::new(env!("CARGO_TARGET_TMPDIR")).join("not-elf.o");
    std::fs::write(&not_elf, b"hello").unwrap();
    let e = run(&["prog", "run", not_elf.to_str().unwrap()], "");
    assert!(e.contains("not-elf.o") && e.contains("not an ELF file"), "{e}");
    // A program that does not exist.
    let obj = example("latency");
    let e = run(&["prog", "run", obj.to_str().unwrap(), "nope"], "");
    assert!(e.ends_with("no program named `nope` (it has: latency)"), "{e}");
}
