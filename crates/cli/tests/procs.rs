//! Processes around the target: libraries loaded and unloaded later (dlopen, dlclose), fork
//! and exec while probes fire, and wrappers (`sh -c`, strace) that load the agent too but do
//! not map what is probed and must stay quiet.

use std::path::{Path, PathBuf};
use std::process::Command;

mod common;
use common::{agent, here, load_counter};

fn tmp() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("procs")
}

fn count_object() -> PathBuf {
    static ONCE: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    ONCE.get_or_init(|| userbpf_testutil::compile_bpf(&here("bpf/count.bpf.c"), &tmp().join("bpf"))).clone()
}

fn forkexec() -> PathBuf {
    static ONCE: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    ONCE.get_or_init(|| {
        userbpf_testutil::compile_c(&here("targets/forkexec_target.c"), &tmp().join("forkexec_target"), &["-pthread"])
    })
    .clone()
}

fn userbpf_run(extra: &[&str], cmd: &[&str]) -> (String, String, bool) {
    let out = Command::new(env!("CARGO_BIN_EXE_userbpf"))
        .env("USERBPF_AGENT", agent())
        .env("USERBPF_SHM_DIR", Path::new(env!("CARGO_TARGET_TMPDIR")))
        .arg("run")
        .arg(count_object())
        .args(extra)
        .arg("--")
        .args(cmd)
        .output()
        .unwrap();
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        out.status.success(),
    )
}

fn hits(out: &str) -> u64 {
    let at = out.find(".hits = ").unwrap_or_else(|| panic!("no hit count in {out}"));
    out[at + 8..].split(|c: char| !c.is_ascii_digit()).next().unwrap().parse().unwrap()
}

#[test]
fn a_library_loaded_later_is_probed_from_its_constructor_on_and_survives_unloading() {
    let lib =
        userbpf_testutil::compile_c(&here("targets/dl_lib.c"), &tmp().join("dl/libdl_lib.so"), &["-shared", "-fPIC"]);
    let exe = userbpf_testutil::compile_c(&here("targets/dlopen_target.c"), &tmp().join("dl/dlopen_target"), &["-ldl"]);
    let lib = lib.to_str().unwrap();
    let (out, err, ok) =
        userbpf_run(&["--attach", &format!("hit={lib}:lib_work")], &[exe.to_str().unwrap(), lib, "4", "500"]);
    assert!(ok, "{out}\n{err}");
    assert!(out.contains("dlopen_target: 4 rounds of 500 calls"), "{out}\n{err}");
    assert!(!err.contains("userbpf-agent:"), "the library is not mapped at start: nothing to say: {err}");
    // Each round: the constructor's call (the probe is in place before constructors run),
    // then 500 calls; after each dlclose the library's probe is forgotten, and placed again
    // when it is loaded anew (maybe at the same address).
    assert_eq!(hits(&out), 4 * 501, "{out}");
}

#[test]
fn a_library_the_program_links_is_probed_from_its_constructor_on() {
    // The dynamic loader runs the constructors of the program's libraries before main; the
    // agent's runs first of them (it is linked `-z initfirst`), so the library's constructor
    // call is counted, as a kernel uprobe counts it.
    let dir = tmp().join("linked");
    let lib = userbpf_testutil::compile_c(&here("targets/dl_lib.c"), &dir.join("libdl_lib.so"), &["-shared", "-fPIC"]);
    let exe = userbpf_testutil::compile_c(
        &here("targets/linked_target.c"),
        &dir.join("linked_target"),
        &[lib.to_str().unwrap(), &format!("-Wl,-rpath,{}", dir.display())],
    );
    let lib = lib.to_str().unwrap();
    let (out, err, ok) = userbpf_run(&["--attach", &format!("hit={lib}:lib_work")], &[exe.to_str().unwrap(), "300"]);
    assert!(ok, "{out}\n{err}");
    assert!(out.contains("linked_target: 300 calls"), "{out}\n{err}");
    assert!(!err.contains("userbpf-agent:"), "{err}");
    assert_eq!(hits(&out), 300 + 1, "main's calls and the constructor's: {out}");
}

#[test]
fn a_missing_function_of_a_library_loaded_later_is_reported_once() {
    let lib = userbpf_testutil::compile_c(
        &here("targets/dl_lib.c"),
        &tmp().join("dl_missing/libdl_lib.so"),
        &["-shared", "-fPIC"],
    );
    let exe = userbpf_testutil::compile_c(
        &here("targets/dlopen_target.c"),
        &tmp().join("dl_missing/dlopen_target"),
        &["-ldl"],
    );
    let lib = lib.to_str().unwrap();
    // By its file name (a path to a file lacking the function is refused before the command
    // starts); --allow-partial: the failure does not stop the target (tests/objects.rs).
    let (out, err, ok) = userbpf_run(
        &["--allow-partial", "--attach", "hit=libdl_lib.so:no_such_lib_function"],
        &[exe.to_str().unwrap(), lib, "3", "10"],
    );
    assert!(ok, "{out}\n{err}");
    assert!(out.contains("dlopen_target: 3 rounds of 10 calls"), "{out}\n{err}");
    assert_eq!(err.matches("userbpf-agent:").count(), 1, "reported when the library is mapped, once: {err}");
    assert!(err.contains("no function `no_such_lib_function`"), "{err}");
}

#[test]
fn forked_and_execed_children_keep_counting() {
    let exe = forkexec();
    let (out, err, ok) = userbpf_run(&["--attach", "hit=work"], &[exe.to_str().unwrap(), "2000"]);
    assert!(ok, "{out}\n{err}");
    assert!(out.contains("forked child: 2000 calls") && out.contains("exec child: 2000 calls"), "{out}\n{err}");
    assert!(out.contains("forkexec_target: parent 2000 calls, children ok"), "{out}\n{err}");
    assert!(!err.contains("userbpf-agent:"), "{err}");
    // The parent's two threads, the forked child (hooks inherited) and the exec'd image
    // (agent loaded again).
    assert_eq!(hits(&out), 4 * 2000, "{out}");
}

#[test]
fn wrappers_that_do_not_map_the_target_stay_quiet() {
    let exe = forkexec();
    let script = format!("{} 300 | cat", exe.display());
    let (out, err, ok) = userbpf_run(&["--attach", "hit=work"], &["sh", "-c", &script]);
    assert!(ok, "{out}\n{err}");
    assert!(out.contains("forkexec_target: parent 300 calls, children ok"), "{out}\n{err}");
    assert!(!err.contains("userbpf-agent:"), "sh and cat have no `work`: {err}");
    assert!(
        err.contains("function `work` is not in")
            && err.contains("attaches only in processes it starts whose executable has it"),
        "the command's executable has no `work`: {err}"
    );
    assert_eq!(hits(&out), 4 * 300, "{out}");
    // A path: attached where that file runs, whatever runs around it.
    let (out, err, ok) = userbpf_run(&["--attach", &format!("hit={}:work", exe.display())], &["sh", "-c", &script]);
    assert!(ok, "{out}\n{err}");
    assert!(!err.contains("userbpf"), "{err}");
    assert_eq!(hits(&out), 4 * 300, "{out}");
}

#[test]
fn links_added_after_a_fork_are_attached_in_the_child() {
    use std::io::BufRead;
    use userbpf_runtime::{LinkRecord, Session};

    let dir = tmp().join("forkwait");
    let exe = userbpf_testutil::compile_c(&here("targets/forkwait_target.c"), &dir.join("forkwait_target"), &[]);
    let _ = std::fs::remove_file(dir.join("stop"));
    // A session of this test's own (in /dev/shm, where the target looks too), programs loaded,
    // no link yet.
    let name = format!("procs-forkwait-{}", std::process::id());
    let session = Session::open(&name).unwrap();
    let (prog_id, hits) = load_counter(&session, &count_object());

    let mut target = Command::new(&exe)
        .arg(&dir)
        .env("LD_PRELOAD", agent())
        .env("USERBPF_SESSION", &name)
        .env_remove("USERBPF_SHM_DIR")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(target.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    let child: u32 =
        line.trim().strip_prefix("child ").and_then(|p| p.parse().ok()).unwrap_or_else(|| panic!("{line}"));
    let wait_for = |what: &str, cond: &dyn Fn() -> bool| {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while !cond() {
            assert!(std::time::Instant::now() < deadline, "timed out waiting for {what}");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    };
    // The forked child joins the session as a member of its own (its watcher thread).
    let members = session.layout().members_dir();
    wait_for("the child's membership", &|| {
        std::fs::read_dir(&members)
            .unwrap()
            .flatten()
            .any(|e| e.file_name().to_string_lossy().starts_with(&format!("{child}.")))
    });
    assert_eq!(hits(), 0);
    // A link added now: only the child calls work(), and only its own watcher can attach it.
    session.add_link(LinkRecord::uprobe(prog_id, exe.display().to_string(), "work")).unwrap();
    wait_for("hits in the child", &|| hits() > 0);
    std::fs::write(dir.join("stop"), b"").unwrap();
    let status = target.wait().unwrap();
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut out, &mut rest).unwrap();
    assert!(status.success() && rest.contains("forkwait_target: child ok"), "{rest}");
}
