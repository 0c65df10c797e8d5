//! `userbpf attach PID`: the agent put into a process started without userbpf, which then runs
//! the session's programs like a process started under `userbpf start`, and runs on as before
//! (its thread blocked in read() through the injection sees no EINTR); what cannot be attached
//! is refused with the reason.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use userbpf_runtime::{LinkRecord, Session};

mod common;
use common::{here, load_counter, tmp, userbpf};

fn shm() -> PathBuf {
    let d = tmp().join(format!("attach-shm-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn target() -> PathBuf {
    userbpf_testutil::compile_c(&here("targets/attach_target.c"), &tmp().join("attach/attach_target"), &["-pthread"])
}

fn attach(session: &str, pid: u32) -> std::process::Output {
    Command::new(userbpf())
        .args(["attach", &pid.to_string(), "--session", session])
        .env("USERBPF_SHM_DIR", shm())
        .output()
        .unwrap()
}

#[test]
fn a_running_process_gets_the_sessions_probes() {
    // SAFETY: (of the environment change) the tests of this file set the same value.
    unsafe { std::env::set_var("USERBPF_SHM_DIR", shm()) };
    let exe = target();
    let mut t = Command::new(&exe).stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
    let mut out = BufReader::new(t.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    let pid = t.id();

    let session = Session::open("attach-a").unwrap();
    let obj = userbpf_testutil::compile_bpf(&here("bpf/count.bpf.c"), &tmp().join("attach"));
    let (prog_id, hits) = load_counter(&session, &obj);
    session.add_link(LinkRecord::uprobe(prog_id, exe.display().to_string(), "work")).unwrap();
    assert_eq!(hits(), 0, "not started under userbpf: nothing runs yet");

    let r = attach("attach-a", pid);
    let said = String::from_utf8_lossy(&r.stdout).into_owned();
    assert!(r.status.success(), "{said}{}", String::from_utf8_lossy(&r.stderr));
    assert!(said.starts_with(&format!("attached to process {pid} (attach_target) in session attach-a")), "{said}");
    assert!(
        said.contains(&format!("thread {pid} paused")),
        "the main thread, blocked in read(), is the one borrowed: {said}"
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    while hits() < 20 {
        assert!(Instant::now() < deadline, "no hits after attaching");
        std::thread::sleep(Duration::from_millis(5));
    }
    // Attached once: a second attach says so.
    let again = attach("attach-a", pid);
    assert!(!again.status.success());
    assert!(
        String::from_utf8_lossy(&again.stderr).contains("already runs the agent"),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );

    t.stdin.as_mut().unwrap().write_all(b"stop\n").unwrap();
    let mut rest = String::new();
    out.read_to_string(&mut rest).unwrap();
    assert!(t.wait().unwrap().success());
    let calls: u64 = rest.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or_else(|| panic!("{rest}"));
    assert!(rest.trim_end().ends_with("eintr 0"), "the read() of the borrowed thread was interrupted: {rest}");
    assert!(hits() >= 20 && hits() <= calls, "hits {} of {calls} calls", hits());
}

#[test]
fn what_cannot_be_attached_is_refused_with_the_reason() {
    let r = attach("attach-b", 999_999_999);
    assert!(!r.status.success());
    let e = String::from_utf8_lossy(&r.stderr);
    assert!(e.contains("process 999999999 does not exist"), "{e}");
    // A process someone already traces.
    let (mut traced, sleep_pid) = userbpf_testutil::traced_sleep();
    let r = attach("attach-b", sleep_pid);
    traced.kill().unwrap();
    traced.wait().unwrap();
    let e = String::from_utf8_lossy(&r.stderr);
    assert!(!r.status.success() && e.contains("already traced by process"), "{e}");
}
