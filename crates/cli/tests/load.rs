//! `userbpf load`: the loader runs in place of `userbpf` (same pid, which the server serves),
//! with the server preloaded and the session named; a libbpf program's bpf() calls through it
//! give what the kernel gives; errors are clear.

use std::path::{Path, PathBuf};
use std::process::Command;

fn tmp() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).to_path_buf()
}

/// The server library built beside the test's `userbpf` binary.
fn server() -> PathBuf {
    let exe = PathBuf::from(env!("CARGO_BIN_EXE_userbpf"));
    let so = exe.parent().unwrap().join("libuserbpf_syscall_server.so");
    assert!(so.exists(), "{} missing: build the workspace (cargo build --release) first", so.display());
    so
}

fn load(session: &str, cmd: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_userbpf"))
        .env("USERBPF_SYSCALL_SERVER", server())
        .env("USERBPF_SHM_DIR", tmp())
        .args(["load", "--session", session])
        .args(cmd)
        .output()
        .unwrap()
}

#[test]
fn the_loader_replaces_userbpf_with_the_server_preloaded() {
    let out = load("load-env", &["sh", "-c", "echo \"$$ $USERBPF_LOADER_PID $USERBPF_SESSION $LD_PRELOAD\""]);
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    let f: Vec<&str> = text.split_whitespace().collect();
    assert_eq!(f.len(), 4, "{text}");
    assert_eq!(f[0], f[1], "the loader's pid is the one served: {text}");
    assert_eq!(f[2], "load-env");
    assert!(f[3].ends_with("libuserbpf_syscall_server.so"), "{text}");
}

#[test]
fn the_loaders_exit_status_is_returned() {
    let out = load("load-status", &["sh", "-c", "exit 7"]);
    assert_eq!(out.status.code(), Some(7));
}

#[test]
fn a_missing_loader_is_reported() {
    let out = load("load-missing", &["/nonexistent/loader"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot run /nonexistent/loader"), "{err}");
}

/// libbpf's low-level API through `userbpf load` gives the kernel's answers (the fuller
/// comparison is crates/syscall-server/tests/bpf_calls.rs).
#[test]
fn libbpf_calls_through_load_match_the_kernel() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../syscall-server/tests/c/bpf_calls.c");
    let prog = userbpf_testutil::compile_c(&src, &tmp().join("load/bpf_calls"), &["-lbpf"]);
    let p = prog.to_str().unwrap();
    for section in ["maps", "progs"] {
        let kernel = Command::new(p).arg(section).output().unwrap();
        let user = load(&format!("load-{section}"), &[p, section]);
        assert!(kernel.status.success() && user.status.success(), "{kernel:?}\n{user:?}");
        assert_eq!(String::from_utf8_lossy(&user.stdout), String::from_utf8_lossy(&kernel.stdout), "{section}");
    }
}

/// A libbpf loader loading a program the verifier refuses: through `userbpf load` it fails
/// as on the kernel (the same error, -EACCES) and libbpf prints userbpf's verifier log, with
/// the kernel's reason, from `bpf_attr.log_buf`.
#[test]
fn a_refused_program_gives_libbpf_the_verifiers_log() {
    let here = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    let dir = tmp().join("load/refused");
    let obj = userbpf_testutil::compile_bpf(&here.join("bpf/refused_value_oob.bpf.c"), &dir);
    let ldr =
        userbpf_testutil::compile_c(&here.join("targets/loaders/load_object.c"), &dir.join("load_object"), &["-lbpf"]);
    let (ldr, obj) = (ldr.to_str().unwrap(), obj.to_str().unwrap());
    let reason = "invalid access to map value, value_size=8 off=8 size=8";
    let log_of = |out: &std::process::Output| {
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        let start = err.find("-- BEGIN PROG LOAD LOG --").unwrap_or_else(|| panic!("no log printed: {err}"));
        let end = err.find("-- END PROG LOAD LOG --").unwrap_or_else(|| panic!("log not ended: {err}"));
        err[start..end].to_string()
    };
    let user = load("load-refused", &[ldr, obj]);
    assert_eq!(user.status.code(), Some(1), "{user:?}");
    assert_eq!(String::from_utf8_lossy(&user.stdout), "load failed: -13\n");
    let log = log_of(&user);
    assert!(log.contains(&format!("\n{reason}\n")), "userbpf's log: {log}");
    assert!(log.contains("(7b) *(u64 *)(r0 +8) = r1\n"), "the instruction, as the kernel prints it: {log}");
    assert!(log.contains("call bpf_map_lookup_elem#1"), "the helper, as the kernel names it: {log}");
    assert!(log.contains("processed "), "the statistics line: {log}");
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if userbpf_testutil::require(root, "root, to load the same program into the kernel") {
        let kernel = Command::new(ldr).arg(obj).output().unwrap();
        assert_eq!(String::from_utf8_lossy(&kernel.stdout), "load failed: -13\n", "{kernel:?}");
        assert!(log_of(&kernel).contains(&format!("\n{reason}\n")), "the kernel's reason is the same");
    }
}

/// A tracepoint program using one map at more than 64 places loads, on the kernel and
/// through `userbpf load` (whose trial load in the kernel once copied the map for each use:
/// "The total number of maps per program has reached the limit of 64", libbpf-tools'
/// execsnoop refused).
#[test]
fn a_program_using_one_map_at_many_places_loads_as_on_the_kernel() {
    let here = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    let dir = tmp().join("load/many-uses");
    let obj = userbpf_testutil::compile_bpf(&here.join("bpf/many_map_uses.bpf.c"), &dir);
    let ldr =
        userbpf_testutil::compile_c(&here.join("targets/loaders/load_object.c"), &dir.join("load_object"), &["-lbpf"]);
    let (ldr, obj) = (ldr.to_str().unwrap(), obj.to_str().unwrap());
    let user = load("load-many-uses", &[ldr, obj]);
    assert_eq!(String::from_utf8_lossy(&user.stdout), "loaded\n", "{user:?}");
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if userbpf_testutil::require(root, "root, to load the same program into the kernel") {
        let kernel = Command::new(ldr).arg(obj).output().unwrap();
        assert_eq!(String::from_utf8_lossy(&kernel.stdout), "loaded\n", "{kernel:?}");
    }
}

/// `userbpf load --no-verify`: the refused program loads, with a warning (for experiments).
#[test]
fn no_verify_lets_a_refused_program_load_with_a_warning() {
    let here = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    let dir = tmp().join("load/no-verify");
    let obj = userbpf_testutil::compile_bpf(&here.join("bpf/refused_value_oob.bpf.c"), &dir);
    let ldr =
        userbpf_testutil::compile_c(&here.join("targets/loaders/load_object.c"), &dir.join("load_object"), &["-lbpf"]);
    let out = Command::new(env!("CARGO_BIN_EXE_userbpf"))
        .env("USERBPF_SYSCALL_SERVER", server())
        .env("USERBPF_SHM_DIR", tmp())
        .args(["load", "--session", "load-no-verify", "--no-verify"])
        .args([ldr.to_str().unwrap(), obj.to_str().unwrap()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "loaded\n");
    assert!(err.contains("userbpf: warning: --no-verify"), "{err}");
    assert!(err.contains("USERBPF_VERIFY=0: program `past_the_end` runs unverified"), "{err}");
}
