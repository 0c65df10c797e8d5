//! Sessions live as long as their users: a session's directory goes when its last process
//! (loader, target) exits, and a session whose processes were all killed is removed by the
//! next `userbpf` command; `userbpf session list` shows who uses what.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::{Proc, repo, tmp, userbpf};

/// A sessions directory of the test's own (USERBPF_SHM_DIR), so "nothing left" is exact.
fn shm(test: &str) -> PathBuf {
    let d = tmp().join(format!("sessions-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn cmd(shm: &Path, session: &str, args: &[&str]) -> Command {
    let mut c = Command::new(userbpf());
    c.args(args).env("USERBPF_SESSION", session).env("USERBPF_SHM_DIR", shm);
    c
}

fn left(shm: &Path) -> Vec<String> {
    std::fs::read_dir(shm).unwrap().flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect()
}

fn workload() -> PathBuf {
    let w = repo("target/examples/workload");
    assert!(w.exists(), "{} missing: `make build` builds it", w.display());
    w
}

#[test]
fn a_target_alone_leaves_nothing_behind() {
    let d = shm("alone");
    let out = cmd(&d, "alone", &["start", workload().to_str().unwrap(), "100"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(left(&d), Vec::<String>::new(), "the agent's empty session stays after its only process exited");
}

#[test]
fn userbpf_run_leaves_nothing_behind() {
    let d = shm("run");
    let obj = repo("target/bpf/funclatency.bpf.o");
    let w = workload();
    let out = cmd(
        &d,
        "unused",
        &[
            "run",
            obj.to_str().unwrap(),
            "--attach",
            "enter=work",
            "--attach",
            "leave=work",
            "--",
            w.to_str().unwrap(),
            "100",
        ],
    )
    .output()
    .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(left(&d), Vec::<String>::new());
}

#[test]
fn loader_and_target_leave_nothing_behind_and_are_listed_while_running() {
    let d = shm("loader");
    let w = workload();
    let script = format!("uprobe:{}:work {{ @calls = count(); }}", w.display());
    let mut loader = Proc::spawn("bpftrace", cmd(&d, "both", &["load", "bpftrace", "-e", &script]));
    loader.wait_for("Attaching 1 probe", "bpftrace attaching");
    // bpftrace says so before it attaches: wait for the link, so that the target started
    // next has its probe from its first call (else it would be attached while running).
    let links = userbpf_runtime::session::Layout::new(userbpf_runtime::Session::dir_in(&d, "both")).links_dir();
    let start = Instant::now();
    while !std::fs::read_dir(&links)
        .is_ok_and(|rd| rd.flatten().any(|e| e.path().extension().is_some_and(|x| x == "json")))
    {
        assert!(start.elapsed() < common::STEP, "bpftrace never made its link");
        std::thread::sleep(Duration::from_millis(5));
    }
    let list = cmd(&d, "both", &["session", "list"]).output().unwrap();
    let list = String::from_utf8_lossy(&list.stdout).into_owned();
    assert!(list.contains("both") && list.contains(&format!("{} (bpftrace)", loader.pid())), "session list:\n{list}");
    let out = cmd(&d, "both", &["start", w.to_str().unwrap(), "1000"]).stdout(Stdio::null()).output().unwrap();
    assert!(out.status.success());
    common::interrupt(&mut loader);
    loader.wait_exit("after SIGINT");
    assert!(loader.stdout().contains("@calls: 1000"), "{}", loader.stdout());
    assert_eq!(left(&d), Vec::<String>::new(), "files left after the loader and the target exited");
}

#[test]
fn a_session_whose_processes_were_killed_is_reaped_by_the_next_command() {
    let d = shm("killed");
    let mut target = Proc::spawn("sleep", cmd(&d, "killed", &["start", "sleep", "100"]));
    // The agent joins at start: wait for its membership.
    // SAFETY: getuid has no preconditions.
    let members = d.join(format!("userbpf-{}-killed/members", unsafe { libc::getuid() }));
    let start = Instant::now();
    while std::fs::read_dir(&members).map_or(true, |rd| rd.count() == 0) {
        assert!(start.elapsed() < common::STEP, "the agent never joined");
        std::thread::sleep(Duration::from_millis(20));
    }
    // `userbpf start` execs nothing: its child is the target; kill both without a chance to leave.
    let child = std::fs::read_to_string(format!("/proc/{}/task/{}/children", target.pid(), target.pid())).unwrap();
    for pid in child.split_whitespace() {
        // SAFETY: kill(2) on a pid read from our child's children list.
        unsafe { libc::kill(pid.parse().unwrap(), libc::SIGKILL) };
    }
    target.signal(libc::SIGKILL);
    target.wait_exit("SIGKILL");
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(left(&d).len(), 1, "the killed session stays until something reaps it");
    let list = cmd(&d, "other", &["session", "list"]).output().unwrap();
    assert!(list.status.success());
    assert!(!String::from_utf8_lossy(&list.stdout).contains("killed"), "a dead session is not listed");
    assert_eq!(left(&d), Vec::<String>::new(), "reaped by `userbpf session list`");
}
