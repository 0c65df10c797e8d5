//! Loaders naming a running process that was started without userbpf: `bpftrace -p PID` (uprobe,
//! uretprobe and USDT) and a
//! libbpf program attaching its uprobe with a pid, through the kernel and through `userbpf
//! load`, one after the other on the same running target; the same counts, and after each
//! loader exits the process's code is byte-for-byte its files' (no probe, no agent thread
//! left when userbpf injected the agent for the loader). The target is busy (three workers
//! calling the probed function, a thread always spinning, two threads blocked in `read()`
//! that must see no `EINTR`); it is a private copy, so the kernel's uprobes touch no other
//! process.
//!
//! An agent detached from a process keeps its programs for a later attach in the same
//! session: after the session was wiped (its ids given out again) a new loader's program with
//! an old one's id is the new program, not the kept one.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

mod common;
mod procmem;
use common::{Proc, Via, here, interrupt, libbpf_example, loader_command, target_command, tmp, userbpf};
use procmem::{agent_threads, code_as_in_files, patched};

/// The busy target (detach_target.c), compiled for each test into a directory of its own.
fn target(name: &str) -> PathBuf {
    let dir = tmp().join("pid").join(name);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    userbpf_testutil::compile_c(&here("targets/detach_target.c"), &dir.join("busy"), &["-pthread", "-DWITH_USDT"])
}

struct Target {
    child: Child,
    stdin: ChildStdin,
    out: BufReader<ChildStdout>,
    pid: u32,
}

impl Target {
    fn start(mut cmd: Command) -> Target {
        let mut child = cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
        let stdin = child.stdin.take().unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        assert!(line.starts_with("ready"), "{line}");
        // Under `userbpf start` the pid is the target's (userbpf execs it in place).
        let pid = line.split_whitespace().nth(1).unwrap().parse().unwrap();
        Target { child, stdin, out, pid }
    }

    /// Each of the 3 workers calls work() `n` times; returns when all are done.
    fn go(&mut self, n: u64) {
        self.stdin.write_all(format!("go {n}\nwait\n").as_bytes()).unwrap();
        self.stdin.flush().unwrap();
        let mut line = String::new();
        self.out.read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "done");
    }

    /// Forks a child that calls work() until killed; returns its pid.
    fn fork(&mut self) -> u32 {
        self.stdin.write_all(b"fork\n").unwrap();
        self.stdin.flush().unwrap();
        let mut line = String::new();
        self.out.read_line(&mut line).unwrap();
        line.strip_prefix("child ").unwrap_or_else(|| panic!("{line}")).trim().parse().unwrap()
    }

    /// Ends the target; asserts the threads blocked in read() never saw EINTR.
    fn quit(mut self) {
        self.stdin.write_all(b"quit\n").unwrap();
        self.stdin.flush().unwrap();
        let mut line = String::new();
        self.out.read_line(&mut line).unwrap();
        assert!(self.child.wait().unwrap().success());
        assert!(line.ends_with(" eintr 0 0\n"), "{line}");
    }
}

/// Waits until a probe is in place in the target's copy of `exe` and the loader is done
/// attaching: through userbpf, `links` (the session's directory, how many links) are all in
/// the session and the target's agent acknowledged a links generation published after the
/// newest of them (a loader waiting for that sleeps, which would look like its event loop;
/// the link's file alone is written before its generation, while the target may be syncing
/// for an older one); through the kernel, the loader waits in its event loop (bpftrace prints
/// "Attaching N probes..." before it attaches them).
fn wait_probed(loader: &mut Proc, pid: u32, exe: &Path, marker: &str, links: Option<(PathBuf, usize)>) {
    loader.wait_for(marker, "attaching");
    let start = Instant::now();
    let done = || {
        if !patched(pid, exe) {
            return false;
        }
        let Some((dir, n)) = &links else { return true };
        let l = userbpf_runtime::session::Layout::new(dir.clone());
        let ids: Vec<u32> = std::fs::read_dir(l.links_dir())
            .map(|d| d.flatten().filter_map(|e| e.file_name().to_str()?.strip_suffix(".json")?.parse().ok()).collect())
            .unwrap_or_default();
        // A link's file is written before the loader publishes the generation that covers it
        // (generations and link ids are drawn from the session's one id counter): an
        // acknowledgement of a generation older than the newest link says nothing about it.
        use userbpf_runtime::session::handshake;
        let generation = handshake::current(&l);
        ids.len() == *n
            && ids.iter().all(|&id| id < generation)
            && handshake::acked_by(&l, pid).is_some_and(|a| a >= generation)
    };
    while !done() {
        assert!(!loader.exited(), "{} exited before its probes were in place\n{}", loader.name, loader.describe());
        assert!(start.elapsed() < common::STEP, "no probes in process {pid} within a step\n{}", loader.describe());
        std::thread::sleep(Duration::from_millis(10));
    }
    if links.is_some() {
        return;
    }
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(5) {
        let sc = std::fs::read_to_string(format!("/proc/{}/syscall", loader.pid())).unwrap_or_default();
        if matches!(sc.split_whitespace().next(), Some("232" | "281" | "7" | "271" | "35" | "230" | "34")) {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The directory of session `name` in the tests' USERBPF_SHM_DIR, with `n` links expected.
fn links_of(name: &str, n: usize) -> Option<(PathBuf, usize)> {
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    Some((tmp().join(format!("userbpf-{uid}-{name}")), n))
}

/// The value of map line `@name: N` in bpftrace's output.
fn bt_value(out: &str, name: &str) -> u64 {
    let key = format!("@{name}: ");
    out.lines()
        .find_map(|l| l.strip_prefix(&key))
        .unwrap_or_else(|| panic!("no {key} in {out:?}"))
        .trim()
        .parse()
        .unwrap()
}

fn have(tool: &str) -> bool {
    Command::new(tool).arg("--version").output().is_ok_and(|o| o.status.success())
}

fn session(test: &str) -> String {
    format!("t{}-{test}", std::process::id())
}

/// The process after a loader that named it exited: its code is its files', no agent thread
/// runs, and it is in no session.
fn as_before(pid: u32) {
    code_as_in_files(pid);
    assert!(!patched(pid, Path::new("/nonexistent")));
    assert_eq!(agent_threads(pid), 0, "an agent thread is left in process {pid}");
}

#[test]
fn bpftrace_dash_p_counts_on_a_process_started_without_userbpf_as_the_kernel_does() {
    if !userbpf_testutil::require(have("bpftrace"), "bpftrace") {
        return;
    }
    let exe = target("bpftrace");
    let mut t = Target::start(Command::new(&exe));
    let pid = t.pid.to_string();
    let script = format!(
        "uprobe:{e}:work {{ @calls = count(); }} uretprobe:{e}:work {{ @rets = count(); }} \
         usdt:{e}:busy:tick {{ @ticks = count(); @sum = sum(arg0); }}",
        e = exe.display()
    );
    let threads = std::fs::read_dir(format!("/proc/{pid}/task")).unwrap().count();
    // The kernel, then userbpf twice (the second finds the agent's library loaded and starts it
    // in place), then the kernel again: all on the same running process.
    for (round, via) in [Via::Kernel, Via::Userbpf, Via::Userbpf, Via::Kernel].into_iter().enumerate() {
        let s = session("bt");
        let mut l = Proc::spawn(
            &format!("bpftrace -p ({via:?}, round {round})"),
            loader_command(via, &s, &["bpftrace", "-p", &pid, "-e", &script]),
        );
        wait_probed(&mut l, t.pid, &exe, "Attaching 3 probes", if via == Via::Kernel { None } else { links_of(&s, 3) });
        if via == Via::Userbpf {
            assert_eq!(agent_threads(t.pid), 1, "the agent runs in the target while bpftrace traces it");
        }
        t.go(1000);
        interrupt(&mut l);
        let st = l.wait_exit("after SIGINT");
        assert!(st.success(), "{}", l.describe());
        let out = l.stdout();
        // bpftrace passes the pid for its USDT probe and -1 for the uprobes: all count here.
        let values = ["calls", "rets", "ticks", "sum"].map(|m| bt_value(&out, m));
        assert_eq!(values, [3000, 3000, 3000, 3 * 999 * 1000 / 2], "{via:?} round {round}\n{out}");
        // Gone with the loader: every probe, and the agent userbpf injected for it.
        as_before(t.pid);
        assert_eq!(std::fs::read_dir(format!("/proc/{pid}/task")).unwrap().count(), threads);
        // Nothing counts any more.
        t.go(100);
    }
    t.quit();
}

#[test]
fn a_libbpf_program_attached_with_a_pid_counts_that_process_only() {
    if !userbpf_testutil::require(have("bpftool"), "bpftool") {
        return;
    }
    let counter = libbpf_example("percpu-counter");
    let exe = target("libbpf");
    let mut t = Target::start(Command::new(&exe));
    let pid = t.pid.to_string();
    for via in [Via::Kernel, Via::Userbpf] {
        let s = session(&format!("lb-{via:?}").to_lowercase());
        // Another process running the same file: under `userbpf start` in the loader's session
        // (where a pid -1 link would count it), or plain for the kernel (where it would too).
        let mut other = Target::start(target_command(via, &s, &[exe.to_str().unwrap()]));
        let mut l = Proc::spawn(
            &format!("percpu-counter with pid ({via:?})"),
            loader_command(via, &s, &[counter.to_str().unwrap(), exe.to_str().unwrap(), "work", &pid]),
        );
        wait_probed(&mut l, t.pid, &exe, "attached to", None);
        t.go(700);
        other.go(500);
        l.signal(libc::SIGINT);
        let st = l.wait_exit("after SIGINT");
        assert!(st.success(), "{}", l.describe());
        let out = l.stdout();
        assert!(out.contains("\ncount 2100\n"), "{via:?}: {out}");
        as_before(t.pid);
        other.quit();
    }
    t.quit();
}

#[test]
fn a_process_of_another_user_is_attached_by_that_user_without_root_and_by_roots_loader() {
    // SAFETY: geteuid has no preconditions.
    if !userbpf_testutil::require(unsafe { libc::geteuid() } == 0, "root (to run the test's processes as nobody)") {
        return;
    }
    if !userbpf_testutil::require(have("bpftool"), "bpftool") {
        return;
    }
    let nobody = 65534;
    let counter = libbpf_example("percpu-counter");
    let exe = target("nobody");
    let shm = tmp().join("pid-shm-any-user");
    std::fs::create_dir_all(&shm).unwrap();
    std::fs::set_permissions(&shm, std::os::unix::fs::PermissionsExt::from_mode(0o1777)).unwrap();
    let as_nobody = |c: &mut Command| {
        std::os::unix::process::CommandExt::uid(c, nobody);
        std::os::unix::process::CommandExt::gid(c, nobody);
        c.env("USERBPF_SHM_DIR", &shm).env("USERBPF_SESSION", session("nobody"));
    };
    // The target inherits USERBPF_SESSION (as from a shell of the session) without the agent
    // preloaded: the injected agent must not start in its constructor, under dlopen's lock.
    let mut tc = Command::new(&exe);
    as_nobody(&mut tc);
    let mut t = Target::start(tc);
    let pid = t.pid.to_string();

    // `userbpf attach` and `userbpf detach` as nobody.
    let mut a = Command::new(userbpf());
    a.args(["attach", &pid]);
    as_nobody(&mut a);
    let o = a.output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(agent_threads(t.pid), 1);
    let mut d = Command::new(userbpf());
    d.args(["detach", &pid]);
    as_nobody(&mut d);
    let o = d.output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    as_before(t.pid);

    // A libbpf loader naming the process: exact counts, then detached at the loader's exit.
    let mut count_through_loader = |what: &str, as_root: bool| {
        let mut lc = Command::new(userbpf());
        lc.args(["load", counter.to_str().unwrap(), exe.to_str().unwrap(), "work", &pid]);
        if as_root {
            lc.env("USERBPF_SHM_DIR", &shm).env("USERBPF_SESSION", session("root"));
        } else {
            as_nobody(&mut lc);
        }
        let mut l = Proc::spawn(what, lc);
        wait_probed(&mut l, t.pid, &exe, "attached to", None);
        t.go(400);
        l.signal(libc::SIGINT);
        let st = l.wait_exit("after SIGINT");
        assert!(st.success(), "{}", l.describe());
        assert!(l.stdout().contains("\ncount 1200\n"), "{}", l.stdout());
        as_before(t.pid);
    };
    // As nobody: the agent injected, a member of nobody's session.
    count_through_loader("percpu-counter as nobody", false);
    // Root's loader brings nobody's process into root's session: the agent, which runs as
    // nobody and cannot read the session, is invited (a membership record and the session's
    // secret from `userbpf attach`) and opens its files through the broker. Nothing of the
    // invitation is left.
    count_through_loader("percpu-counter as root on nobody's process", true);
    let members = shm.join(format!("userbpf-0-{}", session("root"))).join("members");
    let no_record_left = || {
        let names: Vec<_> = std::fs::read_dir(&members)
            .map(|rd| rd.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
            .unwrap_or_default();
        assert!(!names.iter().any(|n| n.starts_with(&format!("{pid}."))), "{names:?}");
    };
    no_record_left();

    // Root's `userbpf attach` and `userbpf detach` alone: no broker serves when the agent
    // leaves (attach has exited), so detach removes the records it could not.
    for cmd in ["attach", "detach"] {
        let mut a = Command::new(userbpf());
        a.args([cmd, &pid]).env("USERBPF_SHM_DIR", &shm).env("USERBPF_SESSION", session("root"));
        let o = a.output().unwrap();
        assert!(o.status.success(), "{cmd}: {}", String::from_utf8_lossy(&o.stderr));
    }
    assert_eq!(agent_threads(t.pid), 0);
    as_before(t.pid);
    no_record_left();
    t.quit();
}

fn wait_until(what: &str, ok: impl Fn() -> bool) {
    let start = Instant::now();
    while !ok() {
        assert!(start.elapsed() < common::STEP, "not within a step: {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_killed_loader_leaves_the_process_running_and_its_watchdog_detaches_it() {
    if !userbpf_testutil::require(have("bpftrace"), "bpftrace") {
        return;
    }
    let exe = target("killed");
    let mut t = Target::start(Command::new(&exe));
    let pid = t.pid.to_string();
    let s = session("killed");
    let script = format!("uprobe:{}:work {{ @calls = count(); }}", exe.display());
    let mut l =
        Proc::spawn("bpftrace -p (killed)", loader_command(Via::Userbpf, &s, &["bpftrace", "-p", &pid, "-e", &script]));
    wait_probed(&mut l, t.pid, &exe, "Attaching 1 probe", links_of(&s, 1));
    t.go(100);
    l.signal(libc::SIGKILL);
    l.wait_exit("SIGKILL");
    // The target runs on, and the loader's watchdog takes the agent out.
    t.go(100);
    wait_until("the agent detached after the loader was killed", || agent_threads(t.pid) == 0);
    as_before(t.pid);
    let o = Command::new(userbpf()).args(["detach", &pid]).output().unwrap();
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("nothing to detach"), "{}", String::from_utf8_lossy(&o.stderr));
    // A later loader injects it again.
    let mut l =
        Proc::spawn("bpftrace -p (after)", loader_command(Via::Userbpf, &s, &["bpftrace", "-p", &pid, "-e", &script]));
    wait_probed(&mut l, t.pid, &exe, "Attaching 1 probe", links_of(&s, 1));
    t.go(200);
    interrupt(&mut l);
    assert!(l.wait_exit("SIGINT").success(), "{}", l.describe());
    assert_eq!(bt_value(&l.stdout(), "calls"), 600);
    as_before(t.pid);
    t.quit();
}

#[test]
fn a_child_forked_while_attached_is_detached_with_its_parent() {
    if !userbpf_testutil::require(have("bpftrace"), "bpftrace") {
        return;
    }
    let exe = target("fork");
    let mut t = Target::start(Command::new(&exe));
    let pid = t.pid.to_string();
    let s = session("fork");
    let script = format!("uprobe:{}:work {{ @calls = count(); }}", exe.display());
    let mut l =
        Proc::spawn("bpftrace -p (fork)", loader_command(Via::Userbpf, &s, &["bpftrace", "-p", &pid, "-e", &script]));
    wait_probed(&mut l, t.pid, &exe, "Attaching 1 probe", links_of(&s, 1));
    let child = t.fork();
    struct Kill(u32);
    impl Drop for Kill {
        fn drop(&mut self) {
            // SAFETY: kill(2) of the test's own forked target child.
            unsafe { libc::kill(self.0 as i32, libc::SIGKILL) };
        }
    }
    let _kill = Kill(child);
    // The child has the agent (forked with it) and keeps the probe (bpftrace's -1 uprobe, as
    // the kernel's fires in the child too).
    wait_until("the child's agent thread", || agent_threads(child) == 1);
    assert!(patched(child, &exe));
    interrupt(&mut l);
    assert!(l.wait_exit("SIGINT").success(), "{}", l.describe());
    assert!(bt_value(&l.stdout(), "calls") > 0);
    // Both detached with the loader's exit.
    as_before(t.pid);
    wait_until("the child detached", || agent_threads(child) == 0);
    code_as_in_files(child);
    t.quit();
}

#[test]
fn load_running_applies_a_pid_minus_one_link_to_the_users_running_processes_mapping_the_file() {
    if !userbpf_testutil::require(have("bpftool"), "bpftool") {
        return;
    }
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let counter = libbpf_example("percpu-counter");
    let exe = target("running");
    let mut a = Target::start(Command::new(&exe));
    let mut b = Target::start(Command::new(&exe));
    // Another user's process mapping the file is left alone.
    let mut other = root.then(|| {
        let mut c = Command::new(&exe);
        std::os::unix::process::CommandExt::uid(&mut c, 65534);
        std::os::unix::process::CommandExt::gid(&mut c, 65534);
        Target::start(c)
    });
    let s = session("running");
    let mut cmd = Command::new(userbpf());
    cmd.args(["load", "--running", counter.to_str().unwrap(), exe.to_str().unwrap(), "work"]);
    cmd.env("USERBPF_SESSION", &s).env("USERBPF_SHM_DIR", tmp());
    let mut l = Proc::spawn("percpu-counter --running", cmd);
    wait_probed(&mut l, a.pid, &exe, "attached to", None);
    assert!(patched(b.pid, &exe), "the second process has the probe too");
    a.go(100);
    b.go(200);
    if let Some(o) = other.as_mut() {
        o.go(300);
        assert_eq!(agent_threads(o.pid), 0);
        assert!(!patched(o.pid, &exe));
    }
    l.signal(libc::SIGINT);
    assert!(l.wait_exit("SIGINT").success(), "{}", l.describe());
    assert!(l.stdout().contains("\ncount 900\n"), "{}", l.stdout());
    as_before(a.pid);
    as_before(b.pid);
    a.quit();
    b.quit();
    if let Some(o) = other {
        o.quit();
    }
}

#[test]
fn a_pid_that_names_no_process_is_refused_as_the_kernel_refuses_it() {
    if !userbpf_testutil::require(have("bpftool"), "bpftool") {
        return;
    }
    let counter = libbpf_example("percpu-counter");
    let exe = target("esrch");
    // A pid above the kernel's pid_max names no process.
    let pid = "4194304";
    let mut said = Vec::new();
    for via in [Via::Kernel, Via::Userbpf] {
        let mut l = Proc::spawn(
            &format!("percpu-counter with no such pid ({via:?})"),
            loader_command(via, &session("esrch"), &[counter.to_str().unwrap(), exe.to_str().unwrap(), "work", pid]),
        );
        let st = l.wait_exit("its refusal");
        assert!(!st.success(), "{}", l.describe());
        let err = l.stderr();
        let line =
            err.lines().find(|l| l.contains("attaching the uprobe")).unwrap_or_else(|| panic!("{err}")).to_string();
        said.push(line);
    }
    assert!(said[0].ends_with("No such process"), "{said:?}");
    assert_eq!(said[0], said[1]);
}

#[test]
fn two_loaders_share_an_injected_process_and_the_last_one_detaches_it() {
    if !userbpf_testutil::require(have("bpftrace") && have("bpftool"), "bpftrace and bpftool") {
        return;
    }
    let counter = libbpf_example("percpu-counter");
    let exe = target("shared");
    let mut t = Target::start(Command::new(&exe));
    let pid = t.pid.to_string();
    let s = session("shared");
    let script = format!("uprobe:{}:work {{ @calls = count(); }}", exe.display());
    let mut a =
        Proc::spawn("bpftrace -p (first)", loader_command(Via::Userbpf, &s, &["bpftrace", "-p", &pid, "-e", &script]));
    wait_probed(&mut a, t.pid, &exe, "Attaching 1 probe", links_of(&s, 1));
    let mut b = Proc::spawn(
        "percpu-counter with pid (second)",
        loader_command(Via::Userbpf, &s, &[counter.to_str().unwrap(), exe.to_str().unwrap(), "work", &pid]),
    );
    wait_probed(&mut b, t.pid, &exe, "attached to", None);
    t.go(100);
    interrupt(&mut a);
    assert!(a.wait_exit("SIGINT").success(), "{}", a.describe());
    assert_eq!(bt_value(&a.stdout(), "calls"), 300);
    // The second loader still uses the process: it stays attached.
    assert_eq!(agent_threads(t.pid), 1);
    t.go(100);
    b.signal(libc::SIGINT);
    assert!(b.wait_exit("SIGINT").success(), "{}", b.describe());
    assert!(b.stdout().contains("\ncount 600\n"), "{}", b.stdout());
    as_before(t.pid);
    t.quit();
}

#[test]
fn a_process_of_another_session_is_refused_with_that_sessions_name() {
    if !userbpf_testutil::require(have("bpftool"), "bpftool") {
        return;
    }
    let counter = libbpf_example("percpu-counter");
    let exe = target("othersession");
    let (mine, theirs) = (session("os-mine"), session("os-theirs"));
    let t = Target::start(target_command(Via::Userbpf, &theirs, &[exe.to_str().unwrap()]));
    let pid = t.pid.to_string();
    let mut l = Proc::spawn(
        "percpu-counter with the pid of another session's process",
        loader_command(Via::Userbpf, &mine, &[counter.to_str().unwrap(), exe.to_str().unwrap(), "work", &pid]),
    );
    assert!(!l.wait_exit("its refusal").success(), "{}", l.describe());
    let err = l.stderr();
    assert!(err.contains(&format!("process {pid} runs the userbpf agent in session {theirs}")), "{err}");
    assert!(err.contains("Device or resource busy"), "{err}");
    t.quit();
}

#[test]
fn a_process_attached_again_in_a_wiped_session_runs_the_new_loaders_programs() {
    if !userbpf_testutil::require(have("bpftrace"), "bpftrace") {
        return;
    }
    let exe = target("wiped");
    let mut t = Target::start(Command::new(&exe));
    let pid = t.pid.to_string();
    let s = session("wiped");
    let script = format!("uprobe:{}:work {{ @calls = count(); }}", exe.display());
    // Sessions of a directory of their own: another test's `userbpf` command would reap this
    // one (no live member) between its members' deaths and the open below.
    let root = tmp().join("pid-shm-wiped");
    std::fs::create_dir_all(&root).unwrap();
    let own_root = |mut c: Command| {
        c.env("USERBPF_SHM_DIR", &root);
        c
    };
    let links = links_of(&s, 1).map(|(d, n)| (root.join(d.file_name().unwrap()), n));
    let dir = links.clone().unwrap().0;
    let ino = || std::fs::metadata(&dir).map(|m| std::os::unix::fs::MetadataExt::ino(&m)).unwrap();
    // Members killed without leaving (`userbpf start` and its command) keep the session's
    // directory once the loader and the target left it.
    let mut member = Target::start(own_root(target_command(Via::Userbpf, &s, &[exe.to_str().unwrap()])));
    let mut held = None;
    let mut first = None;
    let mut round0 = None;
    for (round, n) in [(0, 100), (1, 200)] {
        let mut l = Proc::spawn(
            &format!("bpftrace -p (round {round})"),
            own_root(loader_command(Via::Userbpf, &s, &["bpftrace", "-p", &pid, "-e", &script])),
        );
        wait_probed(&mut l, t.pid, &exe, "Attaching 1 probe", links.clone());
        assert_eq!(*first.get_or_insert(ino()), ino(), "the session's directory was made anew: nothing tested");
        let mut progs: Vec<String> = std::fs::read_dir(dir.join("progs"))
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        progs.sort();
        // The premise: the same ids as round 0 (else nothing is tested).
        assert_eq!(*round0.get_or_insert(progs.clone()), progs, "round {round}: the program ids do not line up");
        t.go(n);
        interrupt(&mut l);
        assert!(l.wait_exit("SIGINT").success(), "{}", l.describe());
        assert_eq!(bt_value(&l.stdout(), "calls"), 3 * n, "round {round}");
        as_before(t.pid);
        if round == 0 {
            // `userbpf start` (a member while its command runs) first, then the command.
            member.child.kill().unwrap();
            member.child.wait().unwrap();
            // SAFETY: kill(2) of the test's own target process (the child `userbpf start` ran).
            unsafe { libc::kill(member.pid as i32, libc::SIGKILL) };
            wait_until("the member killed", || !Path::new(&format!("/proc/{}", member.pid)).exists());
            // Opened again with no live member, the session is wiped in place: the same
            // directory, its ids given out from 1 again, so the next loader's program gets the
            // id the previous one had (which the agent, detached with its programs kept, knows).
            let h = userbpf_runtime::Session::open_in(&root, &s).unwrap();
            // In round 0 one id was given out before the loader's first (with the member
            // started): one here too, so that the ids line up (checked above).
            h.alloc_id().unwrap();
            held = Some(h);
        }
    }
    drop(held);
    t.quit();
}
