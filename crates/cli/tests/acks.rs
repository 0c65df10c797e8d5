//! The agents' acknowledgement of link changes (the loader's side waits for it:
//! syscall-server `attach::publish_links_gen` / `wait_for_agents`): every running agent keeps
//! `agents/PID.STARTTIME` in the session, holding the `links/gen` generation its last sync
//! read before listing the links; once it holds a generation, the links of that generation
//! are attached (or detached) in that process. A forked child keeps a file of its own; a
//! process removes its file when it exits.

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use userbpf_runtime::{LinkRecord, Session};

mod common;
use common::{agent, here, load_counter};

fn tmp() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("acks")
}

fn wait_for(what: &str, cond: &mut dyn FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The acknowledgement file of process `pid`.
fn ack_file(session: &Session, pid: u32) -> PathBuf {
    let start = userbpf_runtime::session::start_time(pid).expect("process alive");
    session.layout().agent(pid, start)
}

fn acked(path: &Path) -> Option<u32> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// What a loader does after changing links: a new generation renamed into `links/gen`.
fn publish(session: &Session) -> u32 {
    userbpf_runtime::session::handshake::publish(session).expect("an agent acknowledges")
}

/// The first byte of process `pid`'s code at `addr`.
fn code_byte(pid: u32, addr: u64) -> u8 {
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::open(format!("/proc/{pid}/mem")).unwrap();
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, addr).unwrap();
    b[0]
}

#[test]
fn agents_acknowledge_link_changes_once_they_are_in_place() {
    let dir = tmp();
    let exe = userbpf_testutil::compile_c(&here("targets/acks_target.c"), &dir.join("acks_target"), &[]);
    let count = userbpf_testutil::compile_bpf(&here("bpf/count.bpf.c"), &dir.join("bpf"));
    let _ = std::fs::remove_file(dir.join("stop"));
    let name = format!("acks-{}", std::process::id());
    let session = Session::open(&name).unwrap();
    let (prog_id, hits) = load_counter(&session, &count);

    let mut target = Command::new(&exe)
        .arg(&dir)
        .env("LD_PRELOAD", agent())
        .env("USERBPF_SESSION", &name)
        .env_remove("USERBPF_SHM_DIR")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let parent = target.id();
    let mut out = std::io::BufReader::new(target.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    let work = line
        .trim()
        .strip_prefix("work 0x")
        .and_then(|a| u64::from_str_radix(a, 16).ok())
        .unwrap_or_else(|| panic!("{line}"));
    line.clear();
    out.read_line(&mut line).unwrap();
    let child: u32 =
        line.trim().strip_prefix("child ").and_then(|p| p.parse().ok()).unwrap_or_else(|| panic!("{line}"));

    // Both agents (the child's watcher makes its own) acknowledge from their start.
    let files = [ack_file(&session, parent), ack_file(&session, child)];
    for f in &files {
        wait_for(&format!("{}", f.display()), &mut || acked(f).is_some());
    }
    let original = code_byte(child, work);
    assert_ne!(original, 0xE9);
    let before = hits();
    assert_eq!(before, 0);

    // A link: once both files hold the new generation, work() is patched in both processes.
    let link = session.add_link(LinkRecord::uprobe(prog_id, exe.display().to_string(), "work")).unwrap();
    let generation = publish(&session);
    for f in &files {
        wait_for("the acknowledgement of the new link", &mut || acked(f).is_some_and(|g| g >= generation));
    }
    for pid in [parent, child] {
        assert_eq!(
            code_byte(pid, work),
            0xE9,
            "work() not patched in pid {pid} when its agent acknowledged generation {generation}"
        );
    }
    wait_for("hits in the child", &mut || hits() > 0);

    // Removed: once acknowledged, the code is the original again and nothing counts.
    session.remove_link(link.id).unwrap();
    let generation = publish(&session);
    for f in &files {
        wait_for("the acknowledgement of the removal", &mut || acked(f).is_some_and(|g| g >= generation));
    }
    for pid in [parent, child] {
        assert_eq!(
            code_byte(pid, work),
            original,
            "work() still patched in pid {pid} after its agent acknowledged the removal"
        );
    }
    let after = hits();
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(hits(), after, "hits after the removal was acknowledged");

    std::fs::write(dir.join("stop"), b"").unwrap();
    let status = target.wait().unwrap();
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut out, &mut rest).unwrap();
    assert!(status.success() && rest.contains("acks_target: child ok"), "{rest}");
    // Both exited through exit(): their files are gone.
    for f in &files {
        assert!(!f.exists(), "{} left behind", f.display());
    }
}

/// An image that cannot acknowledge (the syscall-server library's agent has no watcher)
/// drops the file its process's previous image (before exec: same pid and start time) kept,
/// so the loader does not wait for it.
#[test]
fn an_exec_into_an_image_without_a_watcher_drops_the_previous_images_file() {
    let server = PathBuf::from(env!("CARGO_BIN_EXE_userbpf")).parent().unwrap().join("libuserbpf_syscall_server.so");
    assert!(server.exists(), "{} missing: build userbpf-syscall-server first", server.display());
    let name = format!("acks-exec-{}", std::process::id());
    let session = Session::open(&name).unwrap();
    // sh under the agent (it keeps a file), then cat under the server library only.
    let mut target = Command::new("sh")
        .arg("-c")
        .arg("LD_PRELOAD=\"$0\" exec cat")
        .arg(&server)
        .env("LD_PRELOAD", agent())
        .env("USERBPF_SESSION", &name)
        .env_remove("USERBPF_SHM_DIR")
        .env_remove("USERBPF_LOADER_PID")
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = target.id();
    // cat waits in read(2) once its constructors (the server library's) ran.
    wait_for("cat reading its input", &mut || {
        let exe = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap_or_default();
        let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
        let sc = std::fs::read_to_string(format!("/proc/{pid}/syscall")).unwrap_or_default();
        exe.ends_with("cat") && maps.contains("libuserbpf_syscall_server.so") && sc.starts_with("0 ")
    });
    let f = ack_file(&session, pid);
    assert!(!f.exists(), "{} of sh's image still there under cat", f.display());
    drop(target.stdin.take());
    assert!(target.wait().unwrap().success());
}
