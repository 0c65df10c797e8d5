//! Shared by the loader tests (bpftrace, libbpf, libbpf-tools): running a loader and a target
//! once through the kernel and once through `userbpf load` + `userbpf start`, in either order,
//! and comparing what the loader printed after normalising only what may legitimately differ.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long any one step (a loader starting, a target attaching, a loader exiting) may take.
pub const STEP: Duration = Duration::from_secs(60);

pub fn tmp() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).to_path_buf()
}

pub fn here(p: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests").join(p)
}

pub fn repo(p: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").join(p)
}

pub fn userbpf() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_userbpf"))
}

/// The counting object `object` (a program and a `.bss` counter) loaded into `session` with
/// the JIT, as a loader would: its program's session id, and a reader of the counter.
pub fn load_counter(session: &userbpf_runtime::Session, object: &Path) -> (u32, impl Fn() -> u64 + use<>) {
    use userbpf_runtime::context::CpuSlots;
    use userbpf_runtime::loader::LoadOptions;
    let slots = Arc::new(CpuSlots::open(&session.layout().cpus()).unwrap());
    let opts =
        LoadOptions { engine: userbpf_runtime::Engine::Jit, helpers: userbpf_runtime::helpers::registry(), only: None };
    let loaded =
        userbpf_runtime::load_object(session, userbpf_object::Object::open(object).unwrap(), &opts, slots).unwrap();
    let bss = loaded.maps.iter().find(|m| m.record.name.ends_with(".bss")).unwrap().map.clone();
    let hits = move || {
        let mut v = [0u8; 8];
        bss.lookup_elem(&0u32.to_le_bytes(), &mut v).unwrap();
        u64::from_le_bytes(v)
    };
    (loaded.programs[0].0.id, hits)
}

/// The agent library built beside the `userbpf` binary.
pub fn agent() -> PathBuf {
    let so = userbpf().parent().unwrap().join("libuserbpf_agent.so");
    assert!(so.exists(), "{} missing: build the workspace (cargo build) first", so.display());
    so
}

/// The test target, compiled once per test binary.
pub fn bt_target() -> PathBuf {
    static ONCE: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    ONCE.get_or_init(|| {
        userbpf_testutil::compile_c(
            &here("targets/loaders/bt_target.c"),
            &tmp().join("loaders/bt_target"),
            &["-pthread"],
        )
    })
    .clone()
}

/// gh_target.c (calls libc's resolver functions), compiled once per test binary.
pub fn gh_target() -> PathBuf {
    static ONCE: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    ONCE.get_or_init(|| {
        userbpf_testutil::compile_c(&here("targets/loaders/gh_target.c"), &tmp().join("loaders/gh_target"), &[])
    })
    .clone()
}

/// A fresh copy of `bin` in `dir` (same file name): kernel uprobes with pid -1 fire in every
/// process that maps the probed file, so each run gets a file (an inode) of its own and the
/// tests running in parallel do not see each other's calls.
pub fn private_copy(bin: &Path, dir: &Path) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let dst = dir.join(bin.file_name().unwrap());
    let _ = std::fs::remove_file(&dst);
    std::fs::copy(bin, &dst).unwrap_or_else(|e| panic!("copying {} to {}: {e}", bin.display(), dst.display()));
    dst
}

/// Which side serves the loader's eBPF.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Via {
    Kernel,
    Userbpf,
    /// Through userbpf, the loader and the target running as this (unprivileged) user.
    UserbpfAs(u32),
}

impl Via {
    /// A name for directories and sessions.
    fn tag(self) -> String {
        match self {
            Via::Kernel => "kernel".into(),
            Via::Userbpf => "userbpf".into(),
            Via::UserbpfAs(uid) => format!("userbpf-uid{uid}"),
        }
    }

    fn userbpf(self) -> bool {
        self != Via::Kernel
    }

    /// The sessions' directory: the test's, or one any user may write to.
    fn shm_dir(self) -> PathBuf {
        match self {
            Via::UserbpfAs(_) => {
                let d = tmp().join("shm-any-user");
                std::fs::create_dir_all(&d).unwrap();
                std::fs::set_permissions(&d, std::os::unix::fs::PermissionsExt::from_mode(0o1777)).unwrap();
                d
            }
            _ => tmp(),
        }
    }

    fn apply(self, c: &mut Command, session: &str) {
        c.env("USERBPF_SESSION", session).env("USERBPF_SHM_DIR", self.shm_dir());
        if let Via::UserbpfAs(uid) = self {
            std::os::unix::process::CommandExt::uid(c, uid);
            std::os::unix::process::CommandExt::gid(c, uid);
        }
    }
}

/// Which of loader and target starts first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Order {
    LoaderFirst,
    TargetFirst,
}

/// A child process whose stdout and stderr are collected by reader threads.
pub struct Proc {
    pub name: String,
    child: Child,
    stdin: Option<ChildStdin>,
    out: Arc<Mutex<String>>,
    err: Arc<Mutex<String>>,
    status: Option<ExitStatus>,
}

fn collect(mut r: impl Read + Send + 'static, buf: Arc<Mutex<String>>) {
    std::thread::spawn(move || {
        let mut chunk = [0u8; 4096];
        loop {
            match r.read(&mut chunk) {
                Ok(0) | Err(_) => break,
                Ok(n) => buf.lock().unwrap().push_str(&String::from_utf8_lossy(&chunk[..n])),
            }
        }
    });
}

impl Proc {
    pub fn spawn(name: &str, mut cmd: Command) -> Proc {
        cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = cmd.spawn().unwrap_or_else(|e| panic!("starting {name} ({cmd:?}): {e}"));
        let out = Arc::new(Mutex::new(String::new()));
        let err = Arc::new(Mutex::new(String::new()));
        collect(child.stdout.take().unwrap(), out.clone());
        collect(child.stderr.take().unwrap(), err.clone());
        Proc { name: name.to_string(), stdin: child.stdin.take(), child, out, err, status: None }
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    pub fn stdout(&self) -> String {
        self.out.lock().unwrap().clone()
    }

    pub fn stderr(&self) -> String {
        self.err.lock().unwrap().clone()
    }

    pub fn exited(&mut self) -> bool {
        if self.status.is_none() {
            self.status = self.child.try_wait().unwrap();
        }
        self.status.is_some()
    }

    pub fn describe(&self) -> String {
        let pid = self.pid();
        // Where a process that is still there sits, for the failures where it hangs.
        let state = std::fs::read_to_string(format!("/proc/{pid}/status"))
            .map(|s| {
                s.lines()
                    .filter(|l| {
                        l.starts_with("State:")
                            || l.starts_with("SigCgt:")
                            || l.starts_with("SigIgn:")
                            || l.starts_with("SigBlk:")
                            || l.starts_with("Threads:")
                    })
                    .collect::<Vec<_>>()
                    .join(", ")
            })
            .unwrap_or_default();
        let wchan = std::fs::read_to_string(format!("/proc/{pid}/wchan")).unwrap_or_default();
        format!(
            "--- {} (pid {pid} {state} wchan {wchan}) stdout ---\n{}\n--- {} stderr ---\n{}",
            self.name,
            self.stdout(),
            self.name,
            self.stderr()
        )
    }

    /// Waits until stdout holds `pat`; panics (with the output so far) when the process exits
    /// first or the step takes too long.
    pub fn wait_for(&mut self, pat: &str, what: &str) {
        let start = Instant::now();
        loop {
            if self.stdout().contains(pat) {
                return;
            }
            if self.exited() {
                // Its last output may still be in the pipe.
                std::thread::sleep(Duration::from_millis(200));
                if self.stdout().contains(pat) {
                    return;
                }
                panic!("{} exited ({:?}) before {what}\n{}", self.name, self.status, self.describe());
            }
            if start.elapsed() > STEP {
                panic!("{}: no {what} within {STEP:?}\n{}", self.name, self.describe());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn send(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        stdin.write_all(line.as_bytes()).unwrap();
        stdin.flush().unwrap();
    }

    pub fn close_stdin(&mut self) {
        self.stdin = None;
    }

    pub fn signal(&self, sig: i32) {
        // SAFETY: kill(2) on the pid of a child this Proc owns and has not reaped yet.
        unsafe { libc::kill(self.pid(), sig) };
    }

    /// Waits for the process to exit; panics when it takes too long.
    pub fn wait_exit(&mut self, what: &str) -> ExitStatus {
        let start = Instant::now();
        while !self.exited() {
            if start.elapsed() > STEP {
                panic!("{}: did not exit ({what}) within {STEP:?}\n{}", self.name, self.describe());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        // Let the reader threads drain the pipes.
        std::thread::sleep(Duration::from_millis(100));
        self.status.unwrap()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if !self.exited() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// What a target announced: its pid and where its functions are.
pub struct Ready {
    pub pid: i32,
    pub fns: Vec<(String, u64)>,
}

pub fn parse_ready(out: &str) -> Ready {
    let mut pid = 0;
    let mut fns = Vec::new();
    for l in out.lines() {
        let w: Vec<&str> = l.split_whitespace().collect();
        match w.as_slice() {
            ["ready", p] => pid = p.parse().unwrap(),
            ["fn", name, addr] => {
                fns.push((name.to_string(), u64::from_str_radix(addr.trim_start_matches("0x"), 16).unwrap()))
            }
            _ => {}
        }
    }
    assert!(pid > 0, "no ready line in {out:?}");
    Ready { pid, fns }
}

/// The first bytes of code at `addr` in process `pid`, and the same bytes of the file it maps.
fn code_bytes(pid: i32, addr: u64) -> Option<([u8; 8], [u8; 8])> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).ok()?;
    for l in maps.lines() {
        let w: Vec<&str> = l.split_whitespace().collect();
        if w.len() < 6 {
            continue;
        }
        let (lo, hi) = w[0].split_once('-')?;
        let (lo, hi) = (u64::from_str_radix(lo, 16).ok()?, u64::from_str_radix(hi, 16).ok()?);
        if addr < lo || addr >= hi {
            continue;
        }
        let off = u64::from_str_radix(w[2], 16).ok()? + (addr - lo);
        let mut file = [0u8; 8];
        std::fs::File::open(w[5]).ok()?.read_exact_at(&mut file, off).ok()?;
        let mut mem = [0u8; 8];
        std::fs::File::open(format!("/proc/{pid}/mem")).ok()?.read_exact_at(&mut mem, addr).ok()?;
        return Some((mem, file));
    }
    None
}

/// Waits until every function in `names` is patched in the target (a kernel uprobe's int3 or
/// userbpf's hook changes the code at the probed address), so the workload starts only once
/// all its probes are live, whichever of loader and target started first.
pub fn wait_attached(target: &mut Proc, ready: &Ready, names: &[String], loader: &mut Proc) {
    let start = Instant::now();
    loop {
        let pending: Vec<&String> = names
            .iter()
            .filter(|n| {
                let addr =
                    ready.fns.iter().find(|(f, _)| f == *n).unwrap_or_else(|| panic!("target has no function {n}")).1;
                match code_bytes(ready.pid, addr) {
                    Some((mem, file)) => mem == file,
                    None => true,
                }
            })
            .collect();
        if pending.is_empty() {
            return;
        }
        if loader.exited() {
            panic!(
                "{} exited ({:?}) before attaching {pending:?}\n{}\n{}",
                loader.name,
                loader.status,
                loader.describe(),
                target.describe()
            );
        }
        if target.exited() {
            panic!(
                "{} exited before {pending:?} were attached\n{}\n{}",
                target.name,
                target.describe(),
                loader.describe()
            );
        }
        if start.elapsed() > STEP {
            panic!(
                "{pending:?} not attached in pid {} within {STEP:?}\n{}\n{}",
                ready.pid,
                loader.describe(),
                target.describe()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A command run through `userbpf load` in `session`, or as is through the kernel.
pub fn loader_command(via: Via, session: &str, argv: &[&str]) -> Command {
    command_via(via, session, "load", argv)
}

/// A target started directly (kernel) or with `userbpf start` in `session`.
pub fn target_command(via: Via, session: &str, argv: &[&str]) -> Command {
    command_via(via, session, "start", argv)
}

/// `argv` as is (kernel), or under `userbpf SUB` in `session`.
fn command_via(via: Via, session: &str, sub: &str, argv: &[&str]) -> Command {
    if via == Via::Kernel {
        let mut c = Command::new(argv[0]);
        c.args(&argv[1..]);
        return c;
    }
    let mut c = Command::new(userbpf());
    c.arg(sub).args(argv);
    via.apply(&mut c, session);
    c
}

/// Removes a finished run's session directory (in the test's USERBPF_SHM_DIR).
pub fn remove_session(session: &str) {
    remove_session_of(Via::Userbpf, session);
}

fn remove_session_of(via: Via, session: &str) {
    let uid = match via {
        Via::UserbpfAs(uid) => uid,
        // SAFETY: getuid has no preconditions.
        _ => unsafe { libc::getuid() },
    };
    let _ = std::fs::remove_dir_all(via.shm_dir().join(format!("userbpf-{uid}-{session}")));
}

/// A session name of this run's own.
pub fn session_name(test: &str, via: Via, order: Order) -> String {
    format!("t{}-{test}-{}-{order:?}", std::process::id(), via.tag()).to_lowercase()
}

/// How a loader run ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ending {
    /// SIGINT once the target's workload is done (bpftrace prints its maps, libbpf tools exit).
    Interrupt,
    /// The loader exits by itself (bpftrace's exit(), a tool's duration).
    ItSelf,
}

/// One run: the loader (argv, where "{T}" stands for the target's path) and the target, in
/// `order`, through `via`. The workload starts once the functions in `probed` are attached.
/// Returns the loader's stdout and stderr.
pub fn run_with_target(
    test: &str,
    via: Via,
    order: Order,
    loader_argv: &[&str],
    attached_marker: &str,
    probed: &[String],
    ending: Ending,
) -> (String, String) {
    run_with(test, via, order, loader_argv, attached_marker, &bt_target(), probed, ending, &|_| true)
}

/// As `run_with_target`, with `target_bin` (which follows bt_target.c's protocol) as the target.
/// `settled` tells from the loader's output that it has printed all it will print about the
/// workload (tools that do not drain their buffers when interrupted); the loader is
/// interrupted once it is true, or after a step's time.
#[allow(clippy::too_many_arguments)]
pub fn run_with(
    test: &str,
    via: Via,
    order: Order,
    loader_argv: &[&str],
    attached_marker: &str,
    target_bin: &Path,
    probed: &[String],
    ending: Ending,
    settled: &dyn Fn(&str) -> bool,
) -> (String, String) {
    let dir = tmp().join("loaders").join(test).join(format!("{}-{order:?}", via.tag()).to_lowercase());
    let target = private_copy(target_bin, &dir);
    let tpath = target.to_str().unwrap().to_string();
    let argv: Vec<String> = loader_argv.iter().map(|a| a.replace("{T}", &tpath)).collect();
    let argv: Vec<&str> = argv.iter().map(|s| s.as_str()).collect();
    let session = session_name(test, via, order);
    let start_loader = || {
        let mut l = Proc::spawn(&format!("{} ({via:?}, {order:?})", argv[0]), loader_command(via, &session, &argv));
        l.wait_for(attached_marker, "attaching");
        l
    };
    let start_target = || {
        let mut c = target_command(via, &session, &[&tpath]);
        if via != Via::Kernel {
            // The agent's counters at exit, in the target's stderr (shown on a failure).
            c.env("USERBPF_EXIT_REPORT", "1");
        }
        let mut t = Proc::spawn(&format!("target ({via:?}, {order:?})"), c);
        t.wait_for("\nend\n", "its ready lines");
        t
    };
    let (mut loader, mut target) = match order {
        Order::LoaderFirst => {
            let l = start_loader();
            // bpftrace prints "Attaching N probes..." before it attaches them: let it finish,
            // so that the target really starts after the loader.
            std::thread::sleep(Duration::from_millis(500));
            (l, start_target())
        }
        Order::TargetFirst => {
            let t = start_target();
            (start_loader(), t)
        }
    };
    let ready = parse_ready(&target.stdout());
    wait_attached(&mut target, &ready, probed, &mut loader);
    target.send("go\n");
    target.wait_for("done ", "the end of its workload");
    let start = Instant::now();
    while !settled(&loader.stdout()) && start.elapsed() < STEP && !loader.exited() {
        std::thread::sleep(Duration::from_millis(20));
    }
    if ending == Ending::Interrupt {
        interrupt(&mut loader);
    }
    if ending == Ending::ItSelf {
        // A loader that should have exited by itself: interrupt it after a step, so that
        // what it printed (its maps) shows why.
        let start = Instant::now();
        while !loader.exited() && start.elapsed() < STEP {
            std::thread::sleep(Duration::from_millis(20));
        }
        if !loader.exited() {
            loader.signal(libc::SIGINT);
            let start = Instant::now();
            while !loader.exited() && start.elapsed() < Duration::from_secs(10) {
                std::thread::sleep(Duration::from_millis(20));
            }
            panic!(
                "{} did not exit by itself within {STEP:?} (interrupted)\n{}\n{}",
                loader.name,
                loader.describe(),
                target.describe()
            );
        }
    }
    let lst = loader.wait_exit("after the workload");
    target.close_stdin();
    let st = target.wait_exit("once its stdin closed");
    assert!(st.success(), "target failed: {st:?}\n{}", target.describe());
    assert!(lst.success(), "{} failed: {lst:?}\n{}\n{}", loader.name, loader.describe(), target.describe());
    remove_session_of(via, &session);
    // The target's stderr holds the agent's messages: shown with the loader's on a failure.
    let mut err = loader.stderr();
    let terr = target.stderr();
    if !terr.is_empty() {
        err.push_str(&format!("\n--- target's stderr ---\n{terr}"));
    }
    (loader.stdout(), err)
}

/// Interrupts a loader once it waits idle in its event loop (its main thread blocked in an
/// event loop's wait or sleep, as /proc/PID/syscall shows, and no thread runnable, for 100 ms:
/// [`wait_in_event_loop`]), not while it may still be finishing its set-up or reading records
/// (at most a few seconds). A loader that missed the signal (seen with the kernel's
/// bpftrace under load) gets it again after 10 s; one that ignores both fails its caller's
/// wait for its exit.
pub fn interrupt(loader: &mut Proc) {
    wait_in_event_loop(loader.child.id());
    loader.signal(libc::SIGINT);
    let start = Instant::now();
    while !loader.exited() && start.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(20));
    }
    if !loader.exited() {
        eprintln!("{}: still running 10 s after SIGINT; sending it again\n{}", loader.name, loader.describe());
        loader.signal(libc::SIGINT);
    }
}

/// Waits (at most 3 s) until process `pid` is idle in its event loop: its main thread blocked
/// in one of the calls an event loop waits in (epoll_wait 232, epoll_pwait 281, poll 7, ppoll
/// 271, or a sleep between reports: nanosleep 35, clock_nanosleep 230, pause 34, rt_sigsuspend
/// 130) and none of its threads runnable, at every look over [`IDLE_FOR`]. A loader woken for
/// records it has not read yet is runnable while /proc still shows the wait it is leaving; one
/// interrupted then drops them (bpftrace ignores the events it reads after SIGINT), and through
/// userbpf a record reaches the loader a thread hop later than through the kernel (the
/// syscall server's ring watcher).
fn wait_in_event_loop(pid: u32) {
    const IDLE_FOR: Duration = Duration::from_millis(100);
    let start = Instant::now();
    let mut idle_since: Option<Instant> = None;
    while start.elapsed() < Duration::from_secs(3) {
        if !loader_idle(pid) {
            idle_since = None;
        } else if idle_since.get_or_insert_with(Instant::now).elapsed() >= IDLE_FOR {
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Whether `pid`'s main thread waits in an event loop's call and no thread of it is runnable
/// (true also once the process is gone: nothing to wait for).
fn loader_idle(pid: u32) -> bool {
    let sc = std::fs::read_to_string(format!("/proc/{pid}/syscall")).unwrap_or_default();
    let waiting =
        matches!(sc.split_whitespace().next(), Some("232" | "281" | "7" | "271" | "35" | "230" | "34" | "130") | None);
    if !waiting {
        return false;
    }
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return true };
    tasks.flatten().all(|t| {
        let stat = std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
        // The state follows the command's closing parenthesis.
        stat.rfind(')').and_then(|i| stat[i + 1..].split_whitespace().next()) != Some("R")
    })
}

/// Output cut into entries: a line, a multi-line map entry (`@[` ... `]: N`, a histogram with
/// its buckets), and entries of one map (or one run of printf lines) sorted: bpftrace prints
/// keyed maps sorted by value, so entries of equal value come in hash order, and printf lines
/// come from per-CPU rings read one after the other.
pub fn normalise_bpftrace(out: &str) -> Vec<String> {
    let lines: Vec<&str> = out.lines().collect();
    // (group, text): group is the map's name for map entries, "" for other text, "\n" for blank lines.
    let mut entries: Vec<(String, String)> = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let l = lines[i];
        if l.trim().is_empty() {
            entries.push(("\n".into(), String::new()));
            i += 1;
        } else if l.starts_with('@') {
            let name: String = l.chars().take_while(|&c| c != '[' && c != ':').collect();
            let mut text = l.to_string();
            i += 1;
            if l.ends_with('[') {
                // A stack in the key: frames up to "]: value" (or ", other keys]: value").
                while i < lines.len() {
                    text.push('\n');
                    text.push_str(lines[i]);
                    i += 1;
                    if lines[i - 1].contains("]:") {
                        break;
                    }
                }
            } else if l.trim_end().ends_with(':') {
                // A histogram: its buckets up to the blank line.
                while i < lines.len() && !lines[i].trim().is_empty() {
                    text.push('\n');
                    text.push_str(lines[i]);
                    i += 1;
                }
            }
            entries.push((name, text));
        } else if l.starts_with("Attaching ") {
            entries.push(("Attaching".into(), l.to_string()));
            i += 1;
        } else {
            entries.push((String::new(), l.to_string()));
            i += 1;
        }
    }
    let mut result = Vec::new();
    let mut k = 0;
    while k < entries.len() {
        let g = &entries[k].0;
        let mut run: Vec<String> = Vec::new();
        while k < entries.len() && &entries[k].0 == g {
            run.push(entries[k].1.clone());
            k += 1;
        }
        if g != "\n" {
            run.sort();
        }
        result.extend(run);
    }
    result
}

/// Asserts two normalised outputs are equal, showing both (and the first difference) if not.
pub fn assert_same_output(
    what: &str,
    kernel: &[String],
    ours: &[String],
    raw_kernel: &str,
    raw_ours: &str,
    ours_err: &str,
) {
    if kernel == ours {
        return;
    }
    let first = kernel.iter().zip(ours.iter()).position(|(a, b)| a != b).unwrap_or(kernel.len().min(ours.len()));
    panic!(
        "{what}: userbpf's output differs from the kernel's at entry {first}:\n  kernel: {:?}\n  userbpf: {:?}\n=== kernel ===\n{raw_kernel}\n=== userbpf ===\n{raw_ours}\n=== userbpf stderr ===\n{ours_err}",
        kernel.get(first),
        ours.get(first)
    );
}

/// The names of the functions probed in a bpftrace script, as `uprobe:{T}:NAME` or
/// `uretprobe:{T}:NAME` (deduplicated).
pub fn probed_functions(script: &str) -> Vec<String> {
    let mut v: Vec<String> = Vec::new();
    for (i, _) in script.match_indices("{T}:") {
        let name: String = script[i + 4..].chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
        if !v.contains(&name) {
            v.push(name);
        }
    }
    v
}

fn run_ok(cmd: &mut Command, what: &str) {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{what}: {e} (run `make test`, which installs clang, bpftool, libbpf-dev)"));
    assert!(
        out.status.success(),
        "{what} failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// examples/libbpf/userbpf-demo built as the Makefile builds it; once per test binary.
pub fn libbpf_demo() -> PathBuf {
    static ONCE: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    ONCE.get_or_init(|| libbpf_example("userbpf-demo")).clone()
}

/// examples/libbpf/NAME built as the Makefile builds it (clang, `bpftool gen skeleton` named
/// `NAME_bpf` with dashes as underscores, cc against libbpf), into the test's directory.
pub fn libbpf_example(name: &str) -> PathBuf {
    let dir = tmp().join("loaders").join(name);
    // Tests running in parallel build the same example: each builds in a directory of its
    // own and renames the results into place (a reader, or a test executing the loader,
    // never sees a file another build is writing: the linker's output is not executable
    // until it is complete, and exec(2) of it meanwhile fails with EACCES).
    static BUILDS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let work = dir.join(format!(
        ".build-{}-{}",
        std::process::id(),
        BUILDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&work).unwrap();
    let src = repo("examples/libbpf");
    let obj = work.join(format!("{name}.bpf.o"));
    run_ok(
        Command::new("clang")
            .args(userbpf_testutil::BPF_CFLAGS)
            .arg("-o")
            .arg(&obj)
            .arg(src.join(format!("{name}.bpf.c"))),
        &format!("clang {name}.bpf.c"),
    );
    let skel_name = format!("{}_bpf", name.replace('-', "_"));
    let skel = Command::new("bpftool")
        .arg("gen")
        .arg("skeleton")
        .arg(&obj)
        .args(["name", &skel_name])
        .output()
        .expect("bpftool");
    assert!(skel.status.success(), "bpftool gen skeleton: {}", String::from_utf8_lossy(&skel.stderr));
    std::fs::write(work.join(format!("{name}.skel.h")), &skel.stdout).unwrap();
    let built = work.join(name);
    run_ok(
        Command::new("cc")
            .args(["-O2", "-g", "-Wall", "-I"])
            .arg(&work)
            .arg("-I")
            .arg(&src)
            .arg("-o")
            .arg(&built)
            .arg(src.join(format!("{name}.c")))
            .args(["-lbpf", "-lelf", "-lz"]),
        &format!("cc {name}.c"),
    );
    for f in [format!("{name}.bpf.o"), format!("{name}.skel.h"), name.to_string()] {
        std::fs::rename(work.join(&f), dir.join(&f)).unwrap();
    }
    let _ = std::fs::remove_dir_all(&work);
    dir.join(name)
}

/// Lines sorted: for loaders whose events come from per-CPU buffers (libbpf's perf buffer)
/// or two buffers read in turn, the order of lines is not the order of events.
pub fn sorted_lines(out: &str) -> Vec<String> {
    let mut v: Vec<String> = out.lines().map(|l| l.to_string()).collect();
    v.sort();
    v
}

/// `userbpf run OBJ EXTRA... -- CMD...` with the agent built beside it and the sessions in the
/// test's directory: its stdout, stderr and whether it succeeded.
pub fn userbpf_run(obj: &Path, extra: &[&str], cmd: &[&str]) -> (String, String, bool) {
    userbpf_run_env(obj, extra, cmd, &[])
}

/// [`userbpf_run`] with extra environment variables (e.g. `USERBPF_VERIFY=0`).
pub fn userbpf_run_env(obj: &Path, extra: &[&str], cmd: &[&str], env: &[(&str, &str)]) -> (String, String, bool) {
    let out = Command::new(userbpf())
        .envs(env.iter().copied())
        .env("USERBPF_AGENT", agent())
        .env("USERBPF_SHM_DIR", tmp())
        .arg("run")
        .arg(obj)
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
