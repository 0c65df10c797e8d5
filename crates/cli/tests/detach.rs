//! `userbpf detach PID`: the agent taken out of a running process, which is then as it was
//! before `userbpf attach`: its code byte-for-byte as its files' (every executable mapping of
//! a file: the program, libc with the engine's guard probes, ld.so with the loader
//! notification), its signal dispositions and masks as before, no thread, descriptor or
//! mapping of ours left, no probe firing; and attach works again. Cycles on a busy
//! multi-threaded target (threads calling the probed function while it is patched and
//! unpatched, a thread always running, two threads blocked in read() that must see no EINTR).

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use userbpf_runtime::{LinkRecord, Session};

mod common;
mod procmem;
use common::{here, load_counter, tmp, userbpf};
use procmem::{agent_threads, code_as_in_files};

fn shm() -> PathBuf {
    let d = tmp().join(format!("detach-shm-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The target, compiled for each test (`name`: the tests run in parallel; one compiling over
/// the binary another runs fails with ETXTBSY).
fn target(name: &str) -> PathBuf {
    userbpf_testutil::compile_c(&here("targets/detach_target.c"), &tmp().join(format!("detach/{name}")), &["-pthread"])
}

fn cmd(args: &[&str]) -> std::process::Output {
    Command::new(userbpf()).args(args).env("USERBPF_SHM_DIR", shm()).output().unwrap()
}

fn ok(o: &std::process::Output) -> String {
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(o.status.success(), "{out}{}", String::from_utf8_lossy(&o.stderr));
    out
}

struct Target {
    child: Child,
    stdin: ChildStdin,
    out: BufReader<ChildStdout>,
    pid: u32,
}

impl Target {
    fn start(exe: &PathBuf) -> Target {
        let mut child = Command::new(exe).stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
        let stdin = child.stdin.take().unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        assert!(line.starts_with("ready"), "{line}");
        let pid = child.id();
        Target { child, stdin, out, pid }
    }

    fn send(&mut self, s: &str) {
        self.stdin.write_all(format!("{s}\n").as_bytes()).unwrap();
        self.stdin.flush().unwrap();
    }

    /// Each of the 3 workers calls work() `n` times; returns when all are done.
    fn go(&mut self, n: u64) {
        self.send(&format!("go {n}"));
        self.wait();
    }

    fn wait(&mut self) {
        self.send("wait");
        let mut line = String::new();
        self.out.read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "done");
    }

    /// Ends the target: (calls of work(), EINTR seen by the two threads blocked in read()).
    fn quit(mut self) -> (u64, u64, u64) {
        self.send("quit");
        let mut line = String::new();
        self.out.read_line(&mut line).unwrap();
        assert!(self.child.wait().unwrap().success());
        let w: Vec<u64> = line.split_whitespace().filter_map(|w| w.parse().ok()).collect();
        assert_eq!(w.len(), 3, "{line}");
        (w[0], w[1], w[2])
    }
}

/// Threads, descriptors (of every thread's table), mapping lines, and the signal state
/// (caught, ignored, and each thread's blocked set) of process `pid`.
#[derive(Debug, PartialEq, Eq, Clone)]
struct Shape {
    threads: usize,
    fds: usize,
    maps: usize,
    caught: String,
    ignored: String,
    blocked: Vec<String>,
}

fn status_field(path: &str, name: &str) -> String {
    let s = std::fs::read_to_string(path).unwrap();
    s.lines().find_map(|l| l.strip_prefix(name)).unwrap_or_default().trim().to_string()
}

fn shape(pid: u32) -> Shape {
    let tasks: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    let mut fds = 0;
    let mut blocked = Vec::new();
    for t in &tasks {
        fds += std::fs::read_dir(format!("/proc/{pid}/task/{t}/fd")).map(|d| d.count()).unwrap_or(0);
        blocked.push(status_field(&format!("/proc/{pid}/task/{t}/status"), "SigBlk:"));
    }
    blocked.sort();
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap().lines().count();
    let st = format!("/proc/{pid}/status");
    Shape {
        threads: tasks.len(),
        fds,
        maps,
        caught: status_field(&st, "SigCgt:"),
        ignored: status_field(&st, "SigIgn:"),
        blocked,
    }
}

fn members(session: &Session, pid: u32) -> usize {
    let p = format!("{pid}.");
    let n = |d: PathBuf| {
        std::fs::read_dir(d)
            .map(|d| d.flatten().filter(|e| e.file_name().to_string_lossy().starts_with(&p)).count())
            .unwrap_or(0)
    };
    n(session.layout().members_dir()) + n(session.layout().agents_dir())
}

#[test]
fn attach_detach_cycles_leave_the_process_as_it_was() {
    // SAFETY: (of the environment change) the tests of this file set the same value.
    unsafe { std::env::set_var("USERBPF_SHM_DIR", shm()) };
    let exe = target("cycles_target");
    let mut t = Target::start(&exe);
    let pid = t.pid;
    let session = Session::open("detach-a").unwrap();
    let obj = userbpf_testutil::compile_bpf(&here("bpf/count.bpf.c"), &tmp().join("detach"));
    let (prog_id, hits) = load_counter(&session, &obj);
    session.add_link(LinkRecord::uprobe(prog_id, exe.display().to_string(), "work")).unwrap();
    let before = shape(pid);
    code_as_in_files(pid);

    // Not attached: a detach says so.
    let r = cmd(&["detach", &pid.to_string()]);
    assert!(!r.status.success());
    assert!(
        String::from_utf8_lossy(&r.stderr).contains(&format!("process {pid} has no userbpf agent")),
        "{}",
        String::from_utf8_lossy(&r.stderr)
    );

    let pid_s = pid.to_string();
    let mut after_first: Option<Shape> = None;
    let mut expected = 0;
    for cycle in 0..30 {
        let said = ok(&cmd(&["attach", &pid_s, "--session", "detach-a"]));
        assert!(said.starts_with(&format!("attached to process {pid}")), "{said}");
        // Attached: every call counted, exactly.
        let h0 = hits();
        assert_eq!(h0, expected, "cycle {cycle}: hits while detached");
        t.go(500);
        if hits() - h0 != 1500 {
            let m = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
            let f = std::fs::read_dir(session.layout().agents_dir())
                .unwrap()
                .flatten()
                .map(|e| format!("{:?}={:?}", e.file_name(), std::fs::read_to_string(e.path())))
                .collect::<Vec<_>>();
            panic!(
                "cycle {cycle}: {} hits of 3 workers x 500 calls while attached; {said}; agents {f:?} gen {}\n{m}",
                hits() - h0,
                userbpf_runtime::session::handshake::current(session.layout())
            );
        }
        assert_eq!(agent_threads(pid), 1);
        assert_eq!(members(&session, pid), 2, "cycle {cycle}: a member with an acknowledgement file");
        // Detach while the workers are calling the probed function.
        t.send("go 200000");
        let said = ok(&cmd(&["detach", &pid_s]));
        assert!(said.starts_with(&format!("detached from process {pid}")), "{said}");
        t.wait();
        assert_eq!(agent_threads(pid), 0, "cycle {cycle}: the agent's thread ended");
        assert_eq!(members(&session, pid), 0, "cycle {cycle}: membership and acknowledgement file gone");
        // Detached: nothing counted.
        let h1 = hits();
        t.go(500);
        assert_eq!(hits(), h1, "cycle {cycle}: a probe fired after detach");
        expected = h1;
        code_as_in_files(pid);
        let now = shape(pid);
        assert_eq!(
            (now.threads, now.fds, &now.caught, &now.ignored, &now.blocked),
            (before.threads, before.fds, &before.caught, &before.ignored, &before.blocked),
            "cycle {cycle}: {now:?} vs {before:?}"
        );
        match &after_first {
            None => after_first = Some(now),
            Some(first) => {
                if now.maps != first.maps {
                    let m = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
                    panic!("cycle {cycle}: mappings grew from {} to {}:\n{m}", first.maps, now.maps);
                }
            }
        }
    }
    let again = cmd(&["detach", &pid_s]);
    assert!(
        !again.status.success() && String::from_utf8_lossy(&again.stderr).contains("no userbpf agent running"),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );
    let (calls, eintr_main, eintr_pipe) = t.quit();
    assert_eq!(calls, 30 * 3 * (500 + 200000 + 500));
    assert_eq!((eintr_main, eintr_pipe), (0, 0), "a thread blocked in read() saw EINTR");
}

/// The signal dispositions (caught, ignored) of process `pid`.
fn dispositions(pid: u32) -> (String, String) {
    let st = format!("/proc/{pid}/status");
    (status_field(&st, "SigCgt:"), status_field(&st, "SigIgn:"))
}

#[test]
fn a_process_started_under_userbpf_is_detached_too_system_call_dispatch_and_all() {
    // SAFETY: (of the environment change) the tests of this file set the same value.
    unsafe { std::env::set_var("USERBPF_SHM_DIR", shm()) };
    let exe = target("start_target");
    let session = Session::open("detach-b").unwrap();
    let obj = userbpf_testutil::compile_bpf(&here("bpf/count.bpf.c"), &tmp().join("detach-b"));
    let (prog_id, hits) = load_counter(&session, &obj);
    session.add_link(LinkRecord::uprobe(prog_id, exe.display().to_string(), "work")).unwrap();
    // A system call tracepoint: system call dispatch on in every thread of the target.
    let sys =
        userbpf_testutil::compile_bpf(&here("../../../bench/agent/start_syscalls.bpf.c"), &tmp().join("detach-b"));
    let (sys_id, sys_hits) = load_counter(&session, &sys);
    session
        .add_link(LinkRecord {
            id: 0,
            prog_id: sys_id,
            kind: "tracepoint".into(),
            path: String::new(),
            func: Some("raw_syscalls/sys_enter".into()),
            offset: 0,
            cookie: 0,
            pid: None,
        })
        .unwrap();
    // The same program never under userbpf: the dispositions a detached process must have.
    let plain = Target::start(&exe);
    let want = dispositions(plain.pid);
    plain.quit();

    let mut child = Command::new(userbpf())
        .args(["--session", "detach-b", "start", &exe.display().to_string()])
        .env("USERBPF_SHM_DIR", shm())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let stdin = child.stdin.take().unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    let pid: u32 = line.trim().strip_prefix("ready ").unwrap().parse().unwrap();
    let mut t = Target { child, stdin, out, pid };
    let pid_s = pid.to_string();

    let h0 = hits();
    t.go(100);
    assert_eq!(hits() - h0, 300, "under userbpf start");
    assert_ne!(dispositions(pid), want, "system call dispatch and the hook engine catch signals");
    let s0 = sys_hits();
    t.go(10);
    assert!(sys_hits() > s0, "system calls seen");

    ok(&cmd(&["detach", &pid_s]));
    assert_eq!(agent_threads(pid), 0);
    assert_eq!(dispositions(pid), want, "signal dispositions after detach as in a process never under userbpf");
    code_as_in_files(pid);
    let (h1, s1) = (hits(), sys_hits());
    t.go(100);
    assert_eq!((hits(), sys_hits()), (h1, s1), "nothing seen after detach");

    // Attached again in place, then detached again.
    ok(&cmd(&["attach", &pid_s, "--session", "detach-b"]));
    t.go(100);
    assert_eq!(hits() - h1, 300, "attached again");
    assert!(sys_hits() > s1, "system calls seen again");
    ok(&cmd(&["detach", &pid_s]));
    assert_eq!(dispositions(pid), want);
    code_as_in_files(pid);
    let (_, eintr_main, eintr_pipe) = t.quit();
    assert_eq!((eintr_main, eintr_pipe), (0, 0), "a thread blocked in read() saw EINTR");
}
