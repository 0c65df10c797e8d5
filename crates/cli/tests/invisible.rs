//! Issue 18's matrix: real programs run without userbpf, under `userbpf start` in an empty
//! session, and under `userbpf start` in a session with a uprobe link on the program print the
//! same thing: a privilege drop with `setpriv`, user switches with `su` and `runuser`, a daemon dropping privileges with capabilities
//! kept on its own thread (and the check that no thread keeps more), a daemon (double fork,
//! setsid, every descriptor closed; also through vfork and exec) whose probe keeps firing, a
//! multi-threaded server, the descriptors a program gets and sees, `RLIMIT_NOFILE` of 16, and
//! signals sent to the process.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use userbpf_runtime::{LinkRecord, Session};

mod common;
use common::{agent, here, load_counter, userbpf};

fn tmp() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("invisible")
}

/// Where the sessions of these tests live (`USERBPF_SHM_DIR`): writable by all, sticky, as
/// /dev/shm (a program that dropped its privileges and exec'd makes its session there).
fn shm() -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let d = tmp().join("shm");
    std::fs::create_dir_all(&d).unwrap();
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o1777)).unwrap();
    d
}

fn target(name: &str, extra: &[&str]) -> PathBuf {
    userbpf_testutil::compile_c(&here(&format!("targets/{name}.c")), &tmp().join(name), extra)
}

fn count_object() -> PathBuf {
    static ONCE: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    ONCE.get_or_init(|| userbpf_testutil::compile_bpf(&here("bpf/count.bpf.c"), &tmp().join("bpf"))).clone()
}

/// How a case is run.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Mode {
    /// Without userbpf.
    Plain,
    /// `userbpf start` in a session with nothing in it.
    Empty,
    /// `userbpf start` in a session with a uprobe link (the count object) on `FILE:FUNC`.
    Uprobe,
}

const MODES: [Mode; 3] = [Mode::Plain, Mode::Empty, Mode::Uprobe];

/// A session for `mode` (none without userbpf): its name, and for `Uprobe` the reader of the
/// probe's hit count. The session is held by the returned handle.
struct Setup {
    name: String,
    hits: Option<Box<dyn Fn() -> u64>>,
    _session: Option<Session>,
}

fn setup(case: &str, mode: Mode, probe: (&str, &str)) -> Setup {
    let name = format!("inv-{case}-{mode:?}-{}", std::process::id()).to_lowercase();
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    let _ = std::fs::remove_dir_all(shm().join(format!("userbpf-{uid}-{name}")));
    if mode != Mode::Uprobe {
        return Setup { name, hits: None, _session: None };
    }
    let session = Session::open_in(&shm(), &name).unwrap();
    let (prog_id, hits) = load_counter(&session, &count_object());
    session.add_link(LinkRecord::uprobe(prog_id, probe.0, probe.1)).unwrap();
    Setup { name, hits: Some(Box::new(hits)), _session: Some(session) }
}

/// The command running `argv` in `mode`.
fn command(mode: Mode, session: &str, argv: &[&str]) -> Command {
    let mut c = if mode == Mode::Plain {
        Command::new(argv[0])
    } else {
        let mut c = Command::new(userbpf());
        c.args(["start", "--session", session, "--"]).arg(argv[0]);
        c
    };
    c.args(&argv[1..])
        .env("USERBPF_AGENT", agent())
        .env("USERBPF_SHM_DIR", shm())
        .env_remove("USERBPF_SESSION")
        .env_remove("LD_PRELOAD");
    c
}

/// Runs `argv` in `mode`: its stdout, stderr and exit code.
fn run(mode: Mode, session: &str, argv: &[&str]) -> (String, String, Option<i32>) {
    let out = command(mode, session, argv).output().unwrap();
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        out.status.code(),
    )
}

/// Runs `argv` in every mode and asserts the same stdout and exit code as without userbpf
/// (and an empty stderr where it was empty); returns the uprobe mode's hit count.
fn same_in_every_mode(case: &str, argv: &[&str], probe: (&str, &str)) -> u64 {
    let mut plain = None;
    let mut hits = 0;
    for mode in MODES {
        let s = setup(case, mode, probe);
        let (out, err, code) = run(mode, &s.name, argv);
        match &plain {
            None => {
                assert_eq!(code, Some(0), "{case} without userbpf: {out}\n{err}");
                plain = Some((out, err));
            }
            Some((pout, perr)) => {
                assert_eq!(&out, pout, "{case}: stdout under userbpf ({mode:?}) differs; stderr:\n{err}");
                assert_eq!(code, Some(0), "{case} ({mode:?}): {err}");
                if perr.is_empty() {
                    assert_eq!(err, "", "{case} ({mode:?}): something was said on stderr");
                }
            }
        }
        if let Some(h) = &s.hits {
            hits = h();
        }
    }
    hits
}

#[test]
fn setpriv_drops_privileges_as_without_userbpf() {
    // SAFETY: geteuid has no preconditions.
    let ok = userbpf_testutil::require(
        unsafe { libc::geteuid() } == 0 && Path::new("/usr/bin/setpriv").exists(),
        "root and setpriv",
    );
    if !ok {
        return;
    }
    let argv = ["/usr/bin/setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/id", "-u"];
    // The probe: setpriv's own process calls libc's setresuid before the exec.
    let libc = libc_path();
    let hits = same_in_every_mode("setpriv", &argv, (&libc, "setresuid"));
    assert!(hits >= 1, "setresuid in setpriv was not seen");
}

#[test]
fn su_and_runuser_switch_users_as_without_userbpf() {
    // SAFETY: geteuid has no preconditions.
    let ok = userbpf_testutil::require(
        unsafe { libc::geteuid() } == 0 && Path::new("/usr/sbin/runuser").exists() && Path::new("/usr/bin/su").exists(),
        "root, su and runuser",
    );
    if !ok {
        return;
    }
    let libc = libc_path();
    // The probe: the process switching (su's child after its fork, runuser itself) calls
    // libc's setgid before its exec.
    let hits = same_in_every_mode(
        "runuser",
        &["/usr/sbin/runuser", "-u", "nobody", "--", "/usr/bin/id", "-u"],
        (&libc, "setgid"),
    );
    assert!(hits >= 1, "setgid in runuser was not seen");
    let hits = same_in_every_mode(
        "su",
        &["/usr/bin/su", "-s", "/bin/sh", "nobody", "-c", "/usr/bin/id -u"],
        (&libc, "setgid"),
    );
    assert!(hits >= 1, "setgid in su's child was not seen");
}

fn libc_path() -> String {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    maps.lines().filter_map(|l| l.split_whitespace().nth(5)).find(|p| p.contains("/libc.so")).unwrap().to_string()
}

#[test]
fn a_daemon_dropping_privileges_keeps_no_thread_privileged() {
    // SAFETY: geteuid has no preconditions.
    let ok = userbpf_testutil::require(unsafe { libc::geteuid() } == 0, "root");
    if !ok {
        return;
    }
    let exe = target("invisible_privdrop", &["-pthread"]);
    let exe = exe.to_str().unwrap();
    for how in ["keepcaps", "plain"] {
        let hits = same_in_every_mode(&format!("privdrop-{how}"), &[exe, how], (exe, "probed"));
        assert_eq!(hits, 2, "probed() before and after the drop ({how})");
        // The output itself: the drop happened and no thread differs.
        let (out, _, _) = run(Mode::Plain, "", &[exe, how]);
        assert!(
            out.contains("uid 65534 euid 65534 gid 65534 egid 65534")
                && out.contains("threads with other credentials: 0"),
            "{how}: {out}"
        );
        assert!(
            out.contains("setuid(0): Operation not permitted") && out.contains("CapPrm:\t0000000000000000"),
            "{how}: {out}"
        );
    }
}

#[test]
fn descriptors_are_the_programs_own() {
    let exe = target("invisible_fds", &[]);
    let exe = exe.to_str().unwrap();
    let libc = libc_path();
    assert_eq!(same_in_every_mode("fds", &[exe], (&libc, "opendir")), 1);
    let (out, _, _) = run(Mode::Plain, "", &[exe]);
    assert!(out.contains("first open: 3\n"), "{out}");
}

#[test]
fn rlimit_nofile_of_16_leaves_the_program_its_16() {
    let ok = userbpf_testutil::require(Path::new("/usr/bin/prlimit").exists(), "prlimit");
    if !ok {
        return;
    }
    let exe = target("invisible_fds", &[]);
    let exe = exe.to_str().unwrap();
    let libc = libc_path();
    same_in_every_mode("nofile", &["/usr/bin/prlimit", "--nofile=16", exe, "fill"], (&libc, "opendir"));
}

#[test]
fn a_multi_threaded_server_serves_the_same() {
    let exe = target("invisible_server", &["-pthread"]);
    let exe = exe.to_str().unwrap();
    let hits = same_in_every_mode("server", &[exe], (exe, "probed"));
    assert_eq!(hits, 200, "every answer's probed() call");
}

/// Runs the daemon in `mode` and waits for its report; returns it and the probe's hits.
fn daemon(mode: Mode, how: &str) -> (String, u64) {
    let exe = target("invisible_daemon", &[]);
    let case = format!("daemon-{how}");
    let s = setup(&case, mode, (exe.to_str().unwrap(), "probed"));
    let out = tmp().join(format!("{case}-{mode:?}.out"));
    let _ = std::fs::remove_file(&out);
    let (o, e, code) = run(mode, &s.name, &[exe.to_str().unwrap(), out.to_str().unwrap(), "1000", how]);
    assert_eq!(code, Some(0), "{o}\n{e}");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !out.exists() {
        assert!(Instant::now() < deadline, "the daemon ({mode:?}) never reported");
        std::thread::sleep(Duration::from_millis(10));
    }
    let report = std::fs::read_to_string(&out).unwrap();
    // The probe's program may still be running its last hit when the report appears.
    std::thread::sleep(Duration::from_millis(20));
    (report, s.hits.as_ref().map_or(0, |h| h()))
}

#[test]
fn a_daemon_closing_every_descriptor_keeps_its_probes() {
    for how in ["close_range", "loop", "vfork"] {
        let (plain, _) = daemon(Mode::Plain, how);
        assert!(plain.contains("first descriptor 0\n") && plain.contains("calls 1000\n"), "{plain}");
        for mode in [Mode::Empty, Mode::Uprobe] {
            let (report, hits) = daemon(mode, how);
            assert_eq!(report, plain, "the daemon ({how}) under userbpf ({mode:?})");
            if mode == Mode::Uprobe {
                assert_eq!(hits, 1000, "the daemon's probe ({how}) after it closed every descriptor");
            }
        }
    }
}

#[test]
fn signals_sent_to_the_process_reach_the_programs_threads() {
    let exe = target("invisible_signals", &["-pthread"]);
    let exe = exe.to_str().unwrap();
    let mut outs = Vec::new();
    for mode in MODES {
        let s = setup("signals", mode, (exe, "on_usr1"));
        let mut child = command(mode, &s.name, &[exe]).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        let pid: i32 = line
            .trim()
            .strip_prefix("ready ")
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("{mode:?}: {line}"));
        for sig in [libc::SIGUSR2, libc::SIGUSR1] {
            // SAFETY: kill of our own child process.
            assert_eq!(unsafe { libc::kill(pid, sig) }, 0);
        }
        let mut rest = String::new();
        std::io::Read::read_to_string(&mut stdout, &mut rest).unwrap();
        let st = child.wait().unwrap();
        assert!(st.success(), "{mode:?}: {st} {rest}");
        if let Some(h) = &s.hits {
            assert_eq!(h(), 1, "the handler's probe");
        }
        outs.push(rest);
    }
    assert!(
        outs[0].contains("signalfd: User defined signal 2") && outs[0].contains("handled on the main thread: yes"),
        "{}",
        outs[0]
    );
    assert!(outs.iter().all(|o| *o == outs[0]), "{outs:?}");
}
