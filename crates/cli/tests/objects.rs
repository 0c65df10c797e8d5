//! Objects as libbpf loads them, through the command line: a statically initialised prog
//! array tail-calls under `userbpf prog run` and in a target under `userbpf run`; `?`
//! (autoload-off) programs are neither loaded nor attached; and a program `run` cannot
//! attach is an error (the command does not start, or is stopped, and `run` exits non-zero)
//! unless `--allow-partial` is given.

use std::path::PathBuf;
use std::process::Command;

mod common;
use common::{here, repo, tmp, userbpf_run};

fn workload() -> PathBuf {
    static ONCE: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    ONCE.get_or_init(|| {
        userbpf_testutil::compile_c(&repo("examples/targets/workload.c"), &tmp().join("objects/workload"), &[])
    })
    .clone()
}

fn object(name: &str) -> PathBuf {
    userbpf_testutil::compile_bpf(&here(&format!("bpf/{name}.bpf.c")), &tmp().join("bpf/objects"))
}

#[test]
fn a_static_prog_array_tail_calls_under_prog_run() {
    let obj = object("tail_static");
    for engine in [&[][..], &["--interpreter"][..]] {
        let out = Command::new(env!("CARGO_BIN_EXE_userbpf"))
            .env("USERBPF_SHM_DIR", tmp())
            .args(["--session", &format!("objects-prog-run-{}-{}", std::process::id(), engine.len())])
            .args(["prog", "run"])
            .arg(&obj)
            .arg("entry")
            .args(engine)
            .arg("--json")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["retval"], 42, "r0 is the tail target's ({engine:?}): {text}");
        let bss = v["maps"].as_array().unwrap().iter().find(|m| m["name"].as_str().unwrap().ends_with(".bss")).unwrap();
        let text = bss["entries"].to_string();
        assert!(text.contains("[1,1,0]"), "entry and tail_target ran once, lazy never ({engine:?}): {text}");
    }
}

#[test]
fn a_static_prog_array_tail_calls_in_a_target() {
    let obj = object("tail_static");
    let target = workload();
    for engine in [&[][..], &["--interpreter"][..]] {
        let mut args = engine.to_vec();
        args.extend(["--attach", "entry=work"]);
        let (out, err, ok) = userbpf_run(&obj, &args, &[target.to_str().unwrap(), "100"]);
        assert!(ok, "{out}\n{err}");
        assert!(out.contains("workload: 100 calls of work()"), "{out}");
        // Every hit tail-called tail_target (prepared in the target though no link names
        // it); `lazy` (autoload-off, though its section names a target) was not attached.
        assert!(out.contains("value = { .hits = [100, 100, 0] }"), "{engine:?}: {out}\n{err}");
        assert!(!err.contains("tail_target"), "a tail-call target needs no link: {err}");
    }
    // An autoload-off program is not loaded: --attach cannot name it.
    let (_, err, ok) = userbpf_run(&obj, &["--attach", "lazy=work"], &[target.to_str().unwrap(), "1"]);
    assert!(!ok);
    assert!(err.contains("has no loaded program `lazy`"), "{err}");
}

#[test]
fn a_kind_run_cannot_attach_stops_it_before_the_command_starts() {
    let obj = object("tp_refused");
    let target = workload();
    // sched_switch runs in the kernel by default (tests/kernel.rs); forced into the process,
    // where there is no such event, it cannot be attached.
    let side = ["--side", "on_switch=process"];
    let (out, err, ok) = userbpf_run(&obj, &side, &[target.to_str().unwrap(), "10"]);
    assert!(!ok, "{out}\n{err}");
    assert!(
        err.contains(
            "program `on_switch` (tracepoint sched/sched_switch) cannot be attached: only system call tracepoints"
        ),
        "the program and its target are named: {err}"
    );
    assert!(err.contains("--allow-partial"), "{err}");
    assert!(!out.contains("workload:"), "the command did not start: {out}");
    // --allow-partial: the command runs with what could be attached.
    let (out, err, ok) = userbpf_run(&obj, &["--allow-partial", side[0], side[1]], &[target.to_str().unwrap(), "10"]);
    assert!(ok, "{out}\n{err}");
    assert!(out.contains("workload: 10 calls"), "{out}");
    assert!(
        err.contains("program `on_switch` (tracepoint sched/sched_switch) cannot be attached")
            && err.contains("carrying on (--allow-partial)"),
        "{err}"
    );
}

#[test]
fn a_function_the_file_lacks_is_refused_before_the_command_starts() {
    let obj = object("tail_static");
    let target = workload();
    let t = target.to_str().unwrap();
    let (out, err, ok) = userbpf_run(&obj, &["--attach", &format!("entry={t}:no_such_function")], &[t, "10"]);
    assert!(!ok, "{out}\n{err}");
    assert!(
        err.contains(&format!(
            "program `entry` (uprobe {t}:no_such_function): function `no_such_function` is not in {t}"
        )),
        "{err}"
    );
    assert!(!out.contains("workload:"), "the command did not start: {out}");
    let (out, err, ok) = userbpf_run(&obj, &["--attach", "entry=/no/such/file:work"], &[t, "10"]);
    assert!(!ok, "{out}\n{err}");
    assert!(err.contains("program `entry` (uprobe /no/such/file:work): /no/such/file does not exist"), "{err}");
}

#[test]
fn a_function_no_process_of_the_command_has_fails_the_run() {
    // No path: the function may be in a process the command starts (`sh -c`), so the command
    // runs; at its end no process had attached it.
    let obj = object("tail_static");
    let target = workload();
    let (out, err, ok) = userbpf_run(&obj, &["--attach", "entry=no_such_function"], &[target.to_str().unwrap(), "10"]);
    assert!(!ok, "{out}\n{err}");
    assert!(out.contains("workload: 10 calls"), "{out}");
    assert!(
        err.contains(
            "program `entry` was not attached at uprobe no_such_function: function `no_such_function` is not in"
        ),
        "{err}"
    );
    let (out, err, ok) = userbpf_run(
        &obj,
        &["--allow-partial", "--attach", "entry=no_such_function"],
        &[target.to_str().unwrap(), "10"],
    );
    assert!(ok, "{out}\n{err}");
    assert!(err.contains("carried on (--allow-partial)"), "{err}");
    // Through a shell, the function is in the process the shell starts: attached, no error.
    let cmd = format!("{} 10", target.display());
    let (out, err, ok) = userbpf_run(&obj, &["--attach", "entry=work"], &["sh", "-c", &cmd]);
    assert!(ok, "{out}\n{err}");
    assert!(out.contains("value = { .hits = [10, 10, 0] }"), "{out}\n{err}");
}

#[test]
fn an_attach_failure_in_the_target_stops_it() {
    // A library named as the dynamic loader finds it: only the agent in the target can tell
    // that the function is missing. It reports the failure; `run` stops the command (a sleep
    // that would otherwise last a minute) and exits non-zero, naming program and target.
    let obj = object("tail_static");
    let (out, err, ok) = userbpf_run(&obj, &["--attach", "entry=libc.so.6:no_such_func"], &["sleep", "60"]);
    assert!(!ok, "{out}\n{err}");
    assert!(err.contains("program `entry` could not be attached at uprobe libc.so.6:no_such_func: "), "{err}");
    assert!(err.contains("no_such_func") && err.contains("(process "), "the agent's reason and the process: {err}");
    assert!(err.contains("stopped sleep"), "{err}");
    // --allow-partial: the command runs to its end; the failure is a warning.
    let (out, err, ok) =
        userbpf_run(&obj, &["--allow-partial", "--attach", "entry=libc.so.6:no_such_func"], &["sleep", "0.1"]);
    assert!(ok, "{out}\n{err}");
    assert!(
        err.contains("program `entry` could not be attached at uprobe libc.so.6:no_such_func")
            && err.contains("carried on (--allow-partial)"),
        "{err}"
    );
    assert!(!err.contains("stopped"), "{err}");
}
