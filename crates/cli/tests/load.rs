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
