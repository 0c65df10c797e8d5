//! The target's signals stay the target's: a program that blocks SIGCHLD and reads it from a
//! signalfd or with sigtimedwait (as `script` does) sees every child's exit while userbpf's
//! threads (the agent's watcher) live in it. A process-directed signal goes to any thread
//! not blocking it: if one of ours did not block it, the program would wait forever (the
//! target gives up after 5 s and fails).

use std::path::{Path, PathBuf};
use std::process::Command;

use userbpf_runtime::{LinkRecord, Session};

mod common;
use common::{agent, here, load_counter};

fn tmp() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("signals")
}

fn count_object() -> PathBuf {
    static ONCE: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    ONCE.get_or_init(|| userbpf_testutil::compile_bpf(&here("bpf/count.bpf.c"), &tmp().join("bpf"))).clone()
}

fn target() -> PathBuf {
    static ONCE: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    ONCE.get_or_init(|| {
        userbpf_testutil::compile_c(&here("targets/sigchld_target.c"), &tmp().join("sigchld_target"), &[])
    })
    .clone()
}

/// 10 children waited for through a signalfd, 10 with sigtimedwait; tick() called before each.
const CHILDREN: u64 = 10;

fn check_target_output(out: &str, err: &str, ok: bool) {
    assert!(ok, "the target failed (a SIGCHLD taken by one of userbpf's threads?)\n{out}\n{err}");
    assert!(out.contains(&format!("sigchld_target: {} children seen exiting", 2 * CHILDREN)), "{out}\n{err}");
}

#[test]
fn sigchld_read_from_a_signalfd_under_userbpf_run() {
    let out = Command::new(env!("CARGO_BIN_EXE_userbpf"))
        .env("USERBPF_AGENT", agent())
        .env("USERBPF_SHM_DIR", tmp())
        .arg("run")
        .arg(count_object())
        .args(["--attach", "hit=tick", "--"])
        .arg(target())
        .arg(CHILDREN.to_string())
        .output()
        .unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    check_target_output(&stdout, &stderr, out.status.success());
    assert!(stdout.contains(&format!(".hits = {}", 2 * CHILDREN)), "the probe ran at every tick(): {stdout}");
}

#[test]
fn sigchld_read_from_a_signalfd_under_userbpf_start() {
    // A session with the program loaded and linked to tick() before the target starts.
    let name = format!("signals-start-{}", std::process::id());
    let session = Session::open(&name).unwrap();
    let (prog_id, hits) = load_counter(&session, &count_object());
    let exe = target();
    session.add_link(LinkRecord::uprobe(prog_id, exe.display().to_string(), "tick")).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_userbpf"))
        .env("USERBPF_AGENT", agent())
        .env("USERBPF_SESSION", &name)
        .env_remove("USERBPF_SHM_DIR")
        .arg("start")
        .arg(&exe)
        .arg(CHILDREN.to_string())
        .output()
        .unwrap();
    check_target_output(
        &String::from_utf8_lossy(&out.stdout),
        &String::from_utf8_lossy(&out.stderr),
        out.status.success(),
    );
    assert_eq!(hits(), 2 * CHILDREN, "the probe ran at every tick()");
}
