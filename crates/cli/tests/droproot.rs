//! Targets that drop root after they joined their session (nginx's workers under `user
//! nobody;`, su's child, daemons calling setgroups/setresgid/setresuid) still see what is added
//! to the session later, through the session's broker (`userbpf_runtime::session::broker`):
//! a bpftrace link made after the drop counts the calls exactly, its removal is seen, maps
//! created after the drop work, a child that dropped root before its agent thread ran joins,
//! and a process of another user that was never a member gets nothing from the broker.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

mod common;
use common::{
    Proc, Ready, STEP, Via, here, interrupt, loader_command, parse_ready, target_command, tmp, wait_attached,
};

const NOBODY: u32 = 65534;

fn root_and_bpftrace() -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    userbpf_testutil::require(root, "root (the target starts as root and drops it)")
        && userbpf_testutil::require(Path::new("/usr/bin/bpftrace").exists(), "bpftrace (Debian's package)")
}

/// This test process's own directory for what it builds (a binary another run of the tests
/// rebuilt under a running target would be another file than the one it maps).
fn work() -> PathBuf {
    tmp().join(format!("droproot-{}", std::process::id()))
}

fn target() -> PathBuf {
    static ONCE: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    ONCE.get_or_init(|| {
        userbpf_testutil::compile_c(&here("targets/droproot_target.c"), &work().join("droproot_target"), &[])
    })
    .clone()
}

/// The counting object (crates/cli/tests/bpf/count.bpf.c), built once.
fn count_object() -> PathBuf {
    static ONCE: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    ONCE.get_or_init(|| userbpf_testutil::compile_bpf(&here("bpf/count.bpf.c"), &work().join("bpf"))).clone()
}

/// Kills process `pid` when dropped (a test that fails leaves no process behind: nginx's
/// master outlives `userbpf start`, a forked child waits for a signal).
struct KillOnDrop(i32);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        // SAFETY: kill(2) of a process this test started (directly or through its target).
        unsafe { libc::kill(self.0, libc::SIGKILL) };
    }
}

fn session(test: &str) -> String {
    format!("t{}-droproot-{test}", std::process::id())
}

/// The session directory of `session` (the tests' USERBPF_SHM_DIR).
fn session_dir(session: &str) -> PathBuf {
    // SAFETY: getuid has no preconditions.
    tmp().join(format!("userbpf-{}-{session}", unsafe { libc::getuid() }))
}

/// Every thread of `pid` (the agent's included) has nobody's ids, no supplementary group but
/// nobody's, and no capability: no userbpf thread kept root.
fn assert_no_root(pid: i32) {
    // The agent's thread takes the program's capabilities again right after the program's
    // thread changed its ids (`userbpf_agent::creds`, step 3): a few scheduler yields.
    let start = Instant::now();
    loop {
        match root_left(pid) {
            None => return,
            Some(why) if start.elapsed() > Duration::from_secs(2) => panic!("{why}"),
            Some(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// What of root a thread of `pid` still has, if anything (see [`assert_no_root`]).
fn root_left(pid: i32) -> Option<String> {
    let tasks: Vec<PathBuf> =
        std::fs::read_dir(format!("/proc/{pid}/task")).unwrap().flatten().map(|e| e.path()).collect();
    let mut names = Vec::new();
    let nobody = NOBODY.to_string();
    for t in &tasks {
        let status = std::fs::read_to_string(t.join("status")).unwrap_or_default();
        names.push(std::fs::read_to_string(t.join("comm")).unwrap_or_default().trim().to_string());
        let field =
            |k: &str| status.lines().find_map(|l| l.strip_prefix(k)).map(|v| v.split_whitespace().collect::<Vec<_>>());
        let ok = field("Uid:") == Some(vec![nobody.as_str(); 4])
            && field("Gid:") == Some(vec![nobody.as_str(); 4])
            // nginx's initgroups leaves nogroup (65534) as its one supplementary group.
            && field("Groups:").is_some_and(|g| g.iter().all(|g| *g == nobody))
            && ["CapEff:", "CapPrm:", "CapAmb:"].iter().all(|c| field(c) == Some(vec!["0000000000000000"]));
        if !ok {
            return Some(format!("{} kept something of root: {status}", t.display()));
        }
    }
    (!names.iter().any(|n| n == "userbpf-agent")).then(|| format!("no agent thread in {pid}: {names:?}"))
}

/// The 8 bytes at `addr` in `pid`'s memory and in the file mapped there.
fn code_and_file(pid: i32, addr: u64) -> Option<([u8; 8], [u8; 8])> {
    use std::os::unix::fs::FileExt;
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).ok()?;
    for l in maps.lines() {
        let w: Vec<&str> = l.split_whitespace().collect();
        let Some((lo, hi)) = w.first()?.split_once('-') else { continue };
        let (lo, hi) = (u64::from_str_radix(lo, 16).ok()?, u64::from_str_radix(hi, 16).ok()?);
        if w.len() < 6 || addr < lo || addr >= hi {
            continue;
        }
        let off = u64::from_str_radix(w[2], 16).ok()? + (addr - lo);
        let (mut mem, mut file) = ([0u8; 8], [0u8; 8]);
        std::fs::File::open(w[5]).ok()?.read_exact_at(&mut file, off).ok()?;
        std::fs::File::open(format!("/proc/{pid}/mem")).ok()?.read_exact_at(&mut mem, addr).ok()?;
        return Some((mem, file));
    }
    None
}

/// Waits until the code at `addr` in `pid` is its file's again (the probe was removed).
fn wait_unpatched(pid: i32, addr: u64, what: &str) {
    let start = Instant::now();
    loop {
        match code_and_file(pid, addr) {
            Some((mem, file)) if mem == file => return,
            Some(_) => {}
            None => panic!("{what}: no code at {addr:#x} in {pid}"),
        }
        assert!(start.elapsed() < STEP, "{what}: the probe at {addr:#x} in {pid} is still there after {STEP:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits until the code at `addr` in `pid` differs from its file's (a probe is in place).
fn wait_patched(pid: i32, addr: u64, loader: &mut Proc, target: &mut Proc) {
    let start = Instant::now();
    loop {
        if code_and_file(pid, addr).is_some_and(|(mem, file)| mem != file) {
            return;
        }
        assert!(!loader.exited(), "the loader exited first\n{}\n{}", loader.describe(), target.describe());
        assert!(start.elapsed() < STEP, "no probe at {addr:#x} in {pid}\n{}\n{}", loader.describe(), target.describe());
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn bpftrace(session: &str, script: &str) -> Proc {
    Proc::spawn("bpftrace", loader_command(Via::Userbpf, session, &["bpftrace", "-e", script]))
}

/// The value bpftrace printed for `@name` (a map without keys).
fn printed(out: &str, name: &str) -> Option<u64> {
    out.lines().find_map(|l| l.strip_prefix(&format!("@{name}: "))?.trim().parse().ok())
}

fn started_target(session: &str) -> (Proc, Ready) {
    let bin = target();
    let mut t = Proc::spawn("droproot_target", target_command(Via::Userbpf, session, &[bin.to_str().unwrap()]));
    t.wait_for("fn tick", "its ready line");
    let ready = parse_ready(&t.stdout());
    (t, ready)
}

#[test]
fn links_and_maps_added_after_the_drop_count_exactly_and_their_removal_is_seen() {
    if !root_and_bpftrace() {
        return;
    }
    let s = session("after");
    let (mut t, ready) = started_target(&s);
    let tick = ready.fns[0].1;
    t.send("drop\n");
    t.wait_for(&format!("dropped {NOBODY} {NOBODY}"), "the drop");
    assert_no_root(ready.pid);

    // A link, a program and maps (a count and a hash keyed by argument) made after the drop.
    let bin = target();
    let script = format!("uprobe:{}:tick {{ @calls = count(); @by[arg0 % 4] = count(); }}", bin.display());
    let mut bt = bpftrace(&s, &script);
    wait_attached(&mut t, &ready, &["tick".to_string()], &mut bt);
    t.send("run 1000\n");
    t.wait_for("ran 1000", "the calls");
    interrupt(&mut bt);
    bt.wait_exit("bpftrace interrupted");
    let out = bt.stdout();
    assert_eq!(printed(&out, "calls"), Some(1000), "{}\n{}", bt.describe(), t.describe());
    for k in 0..4 {
        assert!(out.contains(&format!("@by[{k}]: 250")), "{}\n{}", bt.describe(), t.describe());
    }
    // bpftrace gone: its link was removed from the session, and the dropped target took the
    // probe out.
    wait_unpatched(ready.pid, tick, "after bpftrace exited");

    // Again: a second loader, new maps, the same exact count; its removal seen too.
    let mut bt = bpftrace(&s, &format!("uprobe:{}:tick {{ @again = count(); }}", bin.display()));
    wait_attached(&mut t, &ready, &["tick".to_string()], &mut bt);
    t.send("run 321\n");
    t.wait_for("ran 321", "the second calls");
    interrupt(&mut bt);
    bt.wait_exit("the second bpftrace interrupted");
    assert_eq!(printed(&bt.stdout(), "again"), Some(321), "{}\n{}", bt.describe(), t.describe());
    wait_unpatched(ready.pid, tick, "after the second bpftrace exited");
    assert!(!t.stderr().contains("userbpf-agent"), "the agent complained:\n{}", t.describe());
    assert_no_root(ready.pid);
    t.send("quit\n");
    assert!(t.wait_exit("quit").success(), "{}", t.describe());
}

#[test]
fn a_child_that_drops_root_before_its_agent_thread_runs_joins_and_counts() {
    if !root_and_bpftrace() {
        return;
    }
    let s = session("child");
    let (mut t, ready) = started_target(&s);
    // su's child: forked by a process that keeps root, drops it at once.
    t.send("forkdrop 500\n");
    t.wait_for(&format!("child dropped {NOBODY}"), "the child's drop");
    let child: i32 = t
        .stdout()
        .lines()
        .find_map(|l| l.strip_prefix("child ")?.trim().parse::<i32>().ok())
        .unwrap_or_else(|| panic!("no child pid\n{}", t.describe()));
    let _child = KillOnDrop(child);
    // Its agent thread runs, and it has nobody's credentials (the thread too).
    let start = Instant::now();
    while std::fs::read_dir(format!("/proc/{child}/task")).map_or(0, |d| d.count()) < 2 {
        assert!(start.elapsed() < STEP, "no agent thread in the child {child}\n{}", t.describe());
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_no_root(child);

    let bin = target();
    let mut bt = bpftrace(&s, &format!("uprobe:{}:tick {{ @calls = count(); }}", bin.display()));
    let in_child = Ready { pid: child, fns: ready.fns.clone() };
    wait_attached(&mut t, &in_child, &["tick".to_string()], &mut bt);
    // SAFETY: kill(2) of the target's child, which waits for this signal.
    unsafe { libc::kill(child, libc::SIGUSR1) };
    t.wait_for("child ran 500", "the child's calls");
    interrupt(&mut bt);
    bt.wait_exit("bpftrace interrupted");
    assert_eq!(printed(&bt.stdout(), "calls"), Some(500), "{}\n{}", bt.describe(), t.describe());
    t.send("reap\nquit\n");
    t.wait_for("reaped 0", "the child's exit");
    assert!(t.wait_exit("quit").success(), "{}", t.describe());
}

/// `broker_probe` (targets/broker_probe.c) asking the session's broker with `secret`, as
/// `uid` (its own process, or a child whose parent is no member with `orphan`): what it printed.
fn probe(dir: &Path, secret: &[u8], uid: u32, orphan: bool) -> String {
    use std::os::unix::fs::MetadataExt;
    static ONCE: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    let bin = ONCE.get_or_init(|| {
        userbpf_testutil::compile_c(&here("targets/broker_probe.c"), &work().join("broker_probe"), &[])
    });
    let m = std::fs::metadata(dir).unwrap();
    let prefix = format!("userbpf-broker-{}-{}-{}-", m.uid(), m.dev(), m.ino());
    let hex: String = secret.iter().map(|b| format!("{b:02x}")).collect();
    let mut c = std::process::Command::new(bin);
    if orphan {
        c.arg("--orphan");
    }
    c.arg(&prefix).arg(hex);
    // std drops the supplementary groups when root sets a uid.
    std::os::unix::process::CommandExt::uid(&mut c, uid);
    std::os::unix::process::CommandExt::gid(&mut c, uid);
    let out = c.output().unwrap();
    assert!(out.status.success(), "broker_probe: {out:?}");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[test]
fn a_process_of_another_user_that_was_never_a_member_gets_nothing() {
    if !root_and_bpftrace() {
        return;
    }
    let s = session("other");
    let (mut t, _ready) = started_target(&s);
    let dir = session_dir(&s);
    // This test process joins the session (a member record of its own, written as root): a
    // child of it with the secret is admitted, which shows the probe asks the right way.
    // SAFETY: (of the environment) only this test of the binary reads USERBPF_SHM_DIR here,
    // and every test sets the same value.
    let me = userbpf_runtime::Session::open_in(&tmp(), &s).unwrap();
    let secret = std::fs::read(me.layout().secret()).unwrap();
    assert_eq!(secret.len(), userbpf_runtime::session::broker::SECRET_LEN);
    let mut wrong = secret.clone();
    wrong[0] ^= 1;
    assert_eq!(probe(&dir, &secret, 0, false), "admitted", "a member's child with the secret");
    // Not a member (its parent is none either), the right secret: nothing.
    assert_eq!(probe(&dir, &secret, 0, true), "refused", "root, never a member");
    assert_eq!(probe(&dir, &secret, NOBODY, true), "refused", "nobody, never a member, with the secret");
    // A member's child without the secret: nothing.
    assert_eq!(probe(&dir, &wrong, NOBODY, false), "refused", "nobody, a member's child, a wrong secret");
    assert_eq!(probe(&dir, &wrong, 0, false), "refused", "root, a member's child, a wrong secret");
    drop(me);
    t.send("quit\n");
    assert!(t.wait_exit("quit").success(), "{}", t.describe());
}

/// The `daemon off; master_process on; user nobody;` nginx serving plain HTTP from `www`.
fn nginx_conf(work: &Path, port: u16) -> PathBuf {
    let www = work.join("www");
    std::fs::create_dir_all(&www).unwrap();
    std::fs::write(www.join("index.html"), "hello\n").unwrap();
    let temp = work.join("tmp");
    std::fs::create_dir_all(&temp).unwrap();
    let conf = work.join("nginx.conf");
    let w = work.display();
    std::fs::write(
        &conf,
        format!(
            "daemon off;\nmaster_process on;\nworker_processes 1;\nuser nobody nogroup;\npid {w}/nginx.pid;\n\
             error_log {w}/error.log warn;\nevents {{ worker_connections 64; }}\nhttp {{\n  access_log {w}/access.log;\n\
             client_body_temp_path {t}/body;\n  proxy_temp_path {t}/proxy;\n  fastcgi_temp_path {t}/fastcgi;\n\
             uwsgi_temp_path {t}/uwsgi;\n  scgi_temp_path {t}/scgi;\n\
             server {{ listen 127.0.0.1:{port}; root {www}; }}\n}}\n",
            t = temp.display(),
            www = www.display()
        ),
    )
    .unwrap();
    conf
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Process `pid`'s children.
fn children(pid: i32) -> Vec<i32> {
    let Ok(rd) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return Vec::new() };
    rd.flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
        .flat_map(|s| s.split_whitespace().filter_map(|c| c.parse().ok()).collect::<Vec<i32>>())
        .collect()
}

/// The address of `sym` (an exported function of /usr/sbin/nginx at file offset `off`) in `pid`.
fn nginx_function(pid: i32, off: u64) -> Option<u64> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).ok()?;
    maps.lines().find_map(|l| {
        let w: Vec<&str> = l.split_whitespace().collect();
        (w.len() >= 6 && w[5] == "/usr/sbin/nginx" && w[2].trim_start_matches('0').is_empty())
            .then(|| u64::from_str_radix(w[0].split_once('-').unwrap().0, 16).ok())
            .flatten()
            .map(|base| base + off)
    })
}

/// The file offset of exported function `sym` of /usr/sbin/nginx (its code segment maps file
/// offset = address, as the test checks with readelf's view through `nm`).
fn nginx_symbol(sym: &str) -> u64 {
    let out = std::process::Command::new("nm").args(["-D", "/usr/sbin/nginx"]).output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            (w.len() == 3 && w[2] == sym).then(|| u64::from_str_radix(w[0], 16).unwrap())
        })
        .unwrap_or_else(|| panic!("/usr/sbin/nginx exports no {sym}"))
}

#[test]
fn nginx_workers_as_nobody_see_a_bpftrace_link_added_after_they_started() {
    if !root_and_bpftrace() {
        return;
    }
    let have = ["/usr/sbin/nginx", "/usr/bin/curl"].iter().all(|p| Path::new(p).exists());
    if !userbpf_testutil::require(have, "nginx and curl (Debian's packages)") {
        return;
    }
    let s = session("nginx");
    let work = tmp().join(format!("droproot-nginx-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).unwrap();
    let port = free_port();
    let conf = nginx_conf(&work, port);
    let mut nginx = Proc::spawn(
        "nginx",
        target_command(Via::Userbpf, &s, &["/usr/sbin/nginx", "-c", conf.to_str().unwrap(), "-e", "stderr"]),
    );
    // The worker, once it runs as nobody and serves.
    let url = format!("http://127.0.0.1:{port}/index.html");
    let start = Instant::now();
    let mut master_guard = None;
    let (master, worker) = loop {
        let master = children(nginx.pid()).into_iter().next();
        if master_guard.is_none()
            && let Some(m) = master
        {
            master_guard = Some(KillOnDrop(m));
        }
        let worker = master.and_then(|m| children(m).into_iter().next());
        let nobody = worker.is_some_and(|w| {
            std::fs::read_to_string(format!("/proc/{w}/status")).is_ok_and(|st| {
                st.lines().any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("65534"))
            })
        });
        let serves = std::process::Command::new("curl")
            .args(["-sf", "-o", "/dev/null", &url])
            .status()
            .is_ok_and(|s| s.success());
        if let (Some(m), Some(w), true, true) = (master, worker, nobody, serves) {
            break (m, w);
        }
        assert!(!nginx.exited(), "nginx exited\n{}", nginx.describe());
        assert!(start.elapsed() < STEP, "no nginx worker serving as nobody\n{}", nginx.describe());
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_no_root(worker);

    // The link is made after the worker dropped root.
    let off = nginx_symbol("ngx_http_process_request");
    let addr = nginx_function(worker, off).expect("the worker maps /usr/sbin/nginx");
    let mut bt = bpftrace(&s, "uprobe:/usr/sbin/nginx:ngx_http_process_request { @requests = count(); }");
    wait_patched(worker, addr, &mut bt, &mut nginx);
    const REQUESTS: usize = 25;
    for _ in 0..REQUESTS {
        let ok = std::process::Command::new("curl").args(["-sf", "-o", "/dev/null", &url]).status().unwrap();
        assert!(ok.success(), "curl {url}");
    }
    interrupt(&mut bt);
    bt.wait_exit("bpftrace interrupted");
    assert_eq!(printed(&bt.stdout(), "requests"), Some(REQUESTS as u64), "{}\n{}", bt.describe(), nginx.describe());
    wait_unpatched(worker, addr, "the worker after bpftrace exited");
    // nginx's master quits (`userbpf start` exits with it).
    // SAFETY: kill(2) of the nginx master this test started.
    unsafe { libc::kill(master, libc::SIGQUIT) };
    assert!(nginx.wait_exit("nginx quitting").success(), "{}", nginx.describe());
    drop(master_guard);
    let _ = std::fs::remove_dir_all(&work);
}

#[test]
fn an_attached_process_that_drops_root_sees_a_later_link_and_detaches() {
    if !root_and_bpftrace() {
        return;
    }
    let s = session("attach");
    let bin = target();
    // Started without userbpf, attached while root: `userbpf attach` exits at once, so the
    // only broker is the loader's.
    let mut t = Proc::spawn("droproot_target", std::process::Command::new(&bin));
    t.wait_for("fn tick", "its ready line");
    let ready = parse_ready(&t.stdout());
    let attach = |sub: &str| {
        std::process::Command::new(common::userbpf())
            .args([sub, &ready.pid.to_string()])
            .env("USERBPF_SESSION", &s)
            .env("USERBPF_SHM_DIR", tmp())
            .output()
            .unwrap()
    };
    let out = attach("attach");
    assert!(out.status.success(), "userbpf attach: {out:?}\n{}", t.describe());
    t.send("drop\n");
    t.wait_for(&format!("dropped {NOBODY} {NOBODY}"), "the drop");
    assert_no_root(ready.pid);

    let mut bt = bpftrace(&s, &format!("uprobe:{}:tick {{ @calls = count(); }}", bin.display()));
    wait_attached(&mut t, &ready, &["tick".to_string()], &mut bt);
    t.send("run 777\n");
    t.wait_for("ran 777", "the calls");
    interrupt(&mut bt);
    bt.wait_exit("bpftrace interrupted");
    assert_eq!(printed(&bt.stdout(), "calls"), Some(777), "{}\n{}", bt.describe(), t.describe());
    wait_unpatched(ready.pid, ready.fns[0].1, "after bpftrace exited");

    // `userbpf detach` of the dropped process: its agent's thread ends, the program runs on.
    let out = attach("detach");
    assert!(out.status.success(), "userbpf detach: {out:?}\n{}", t.describe());
    let tasks = std::fs::read_dir(format!("/proc/{}/task", ready.pid)).unwrap().count();
    assert_eq!(tasks, 1, "the agent's thread is gone\n{}", t.describe());
    t.send("run 5\n");
    t.wait_for("ran 5", "the calls after the detach");
    assert!(!t.stderr().contains("userbpf-agent"), "the agent complained:\n{}", t.describe());
    t.send("quit\n");
    assert!(t.wait_exit("quit").success(), "{}", t.describe());
}

#[test]
fn a_link_removed_while_no_broker_serves_is_detached_all_the_same() {
    // SAFETY: geteuid has no preconditions.
    if !userbpf_testutil::require(unsafe { libc::geteuid() } == 0, "root (the target starts as root and drops it)") {
        return;
    }
    let s = session("nobroker");
    let bin = target();
    // No userbpf command serves this session: the target runs the agent by itself, and this
    // test makes and removes the link through the session's files.
    let session = userbpf_runtime::Session::open_in(&tmp(), &s).unwrap();
    let count = count_object();
    let (prog_id, hits) = common::load_counter(&session, &count);
    let mut cmd = std::process::Command::new(&bin);
    cmd.env("LD_PRELOAD", common::agent()).env("USERBPF_SESSION", &s).env("USERBPF_SHM_DIR", tmp());
    let mut t = Proc::spawn("droproot_target", cmd);
    t.wait_for("fn tick", "its ready line");
    let ready = parse_ready(&t.stdout());
    let tick = ready.fns[0].1;
    let link =
        session.add_link(userbpf_runtime::LinkRecord::uprobe(prog_id, bin.display().to_string(), "tick")).unwrap();
    let start = Instant::now();
    while code_and_file(ready.pid, tick).is_none_or(|(mem, file)| mem == file) {
        assert!(start.elapsed() < STEP, "the link was not attached\n{}", t.describe());
        std::thread::sleep(Duration::from_millis(20));
    }
    t.send("drop\n");
    t.wait_for(&format!("dropped {NOBODY} {NOBODY}"), "the drop");
    assert!(!userbpf_runtime::session::broker::served(&session_dir(&s)), "no broker serves the session");
    t.send("run 100\n");
    t.wait_for("ran 100", "the calls");
    assert_eq!(hits(), 100, "the probe placed before the drop counts");
    // The removal: seen by name through the watch made before the drop.
    session.remove_link(link.id).unwrap();
    wait_unpatched(ready.pid, tick, "after the link was removed");
    t.send("run 50\n");
    t.wait_for("ran 50", "the calls after the removal");
    assert_eq!(hits(), 100, "no probe after the removal");
    t.send("quit\n");
    assert!(t.wait_exit("quit").success(), "{}", t.describe());
}

/// Waits until bpftrace's main thread waits in its event loop (every probe attached: bpftrace
/// attaches them all before it polls its buffers).
fn wait_polling(bt: &mut Proc) {
    let start = Instant::now();
    loop {
        let sc = std::fs::read_to_string(format!("/proc/{}/syscall", bt.pid())).unwrap_or_default();
        if matches!(sc.split_whitespace().next(), Some("232" | "281" | "7" | "271" | "441")) {
            return;
        }
        assert!(!bt.exited() && start.elapsed() < STEP, "bpftrace never reached its event loop\n{}", bt.describe());
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn bpftrace_p_reaches_a_process_that_dropped_root_after_the_first_loader_injected_it() {
    if !root_and_bpftrace() {
        return;
    }
    let s = session("pid");
    let bin = target();
    let mut t = Proc::spawn("droproot_target", std::process::Command::new(&bin));
    t.wait_for("fn tick", "its ready line");
    let ready = parse_ready(&t.stdout());
    let pid = ready.pid.to_string();
    let script = |map: &str| format!("uprobe:{}:tick {{ @{map} = count(); }}", bin.display());
    let p_loader = |script: &str| {
        Proc::spawn("bpftrace -p", loader_command(Via::Userbpf, &s, &["bpftrace", "-p", &pid, "-e", script]))
    };
    // The first loader injects the agent while the process is root.
    let mut first = p_loader(&script("first"));
    wait_attached(&mut t, &ready, &["tick".to_string()], &mut first);
    t.send("drop\n");
    t.wait_for(&format!("dropped {NOBODY} {NOBODY}"), "the drop");
    assert_no_root(ready.pid);
    // The second one, after the drop: the process is a member already, its link goes in.
    let mut second = p_loader(&script("second"));
    wait_polling(&mut second);
    t.send("run 333\n");
    t.wait_for("ran 333", "the calls");
    for bt in [&mut first, &mut second] {
        interrupt(bt);
        bt.wait_exit("bpftrace interrupted");
    }
    assert_eq!(printed(&first.stdout(), "first"), Some(333), "{}\n{}", first.describe(), t.describe());
    assert_eq!(printed(&second.stdout(), "second"), Some(333), "{}\n{}", second.describe(), t.describe());
    // The last loader gone, the process is detached: its code is its file's, no agent thread.
    wait_unpatched(ready.pid, ready.fns[0].1, "after both loaders exited");
    let start = Instant::now();
    while std::fs::read_dir(format!("/proc/{}/task", ready.pid)).unwrap().count() > 1 {
        assert!(start.elapsed() < STEP, "the agent's thread stays\n{}", t.describe());
        std::thread::sleep(Duration::from_millis(20));
    }
    t.send("quit\n");
    assert!(t.wait_exit("quit").success(), "{}", t.describe());
}

/// The value of the `.bss` counter of the counting object (`hits`) in the session open as `s`.
fn bss_hits(s: &userbpf_runtime::Session) -> u64 {
    let rec = s.maps().unwrap().into_iter().find(|m| m.name.ends_with(".bss")).expect("a .bss map");
    let map = s.open_map(rec.id).unwrap();
    let mut v = [0u8; 8];
    map.lookup_elem(&0u32.to_le_bytes(), &mut v).unwrap();
    u64::from_le_bytes(v)
}

/// A link of program `prog` on `tick` added to `s` by this test (a writer that serves no
/// broker), acknowledged by every agent of the session: the dropped target's acknowledgement
/// comes through the broker of the userbpf command it runs under.
fn add_acknowledged(s: &userbpf_runtime::Session, prog: u32, bin: &Path) -> u32 {
    use userbpf_runtime::session::handshake;
    let link = s.add_link(userbpf_runtime::LinkRecord::uprobe(prog, bin.display().to_string(), "tick")).unwrap();
    let generation = handshake::publish(s).expect("the target's agent acknowledges");
    assert!(
        handshake::wait(s.layout(), generation, std::process::id(), STEP),
        "the dropped target did not acknowledge link {}",
        link.id
    );
    link.id
}

fn remove_acknowledged(s: &userbpf_runtime::Session, link: u32) {
    use userbpf_runtime::session::handshake;
    s.remove_link(link).unwrap();
    let generation = handshake::publish(s).expect("the target's agent acknowledges");
    assert!(handshake::wait(s.layout(), generation, std::process::id(), STEP), "the removal of link {link}");
}

#[test]
fn userbpf_start_alone_serves_a_dropped_target_and_its_acknowledgements() {
    // SAFETY: geteuid has no preconditions.
    if !userbpf_testutil::require(unsafe { libc::geteuid() } == 0, "root (the target starts as root and drops it)") {
        return;
    }
    let s = session("start");
    let (mut t, ready) = started_target(&s);
    t.send("drop\n");
    t.wait_for(&format!("dropped {NOBODY} {NOBODY}"), "the drop");
    // The program, its maps and the link all come after the drop, from a process that serves
    // no broker: only `userbpf start`'s answers the target.
    let session = userbpf_runtime::Session::open_in(&tmp(), &s).unwrap();
    let count = count_object();
    let (prog, hits) = common::load_counter(&session, &count);
    let link = add_acknowledged(&session, prog, &target());
    // Acknowledged: the probe is in place now, not later.
    assert!(code_and_file(ready.pid, ready.fns[0].1).is_some_and(|(m, f)| m != f), "acknowledged, not attached");
    t.send("run 200\n");
    t.wait_for("ran 200", "the calls");
    assert_eq!(hits(), 200);
    remove_acknowledged(&session, link);
    assert!(code_and_file(ready.pid, ready.fns[0].1).is_some_and(|(m, f)| m == f), "acknowledged, not detached");
    t.send("run 10\nquit\n");
    assert!(t.wait_exit("quit").success(), "{}", t.describe());
    assert_eq!(hits(), 200);
}

#[test]
fn userbpf_run_alone_serves_a_dropped_target() {
    // SAFETY: geteuid has no preconditions.
    if !userbpf_testutil::require(unsafe { libc::geteuid() } == 0, "root (the target starts as root and drops it)") {
        return;
    }
    let bin = target();
    let count = count_object();
    let attach = format!("hit={}:tick", bin.display());
    let mut cmd = std::process::Command::new(common::userbpf());
    cmd.env("USERBPF_AGENT", common::agent()).env("USERBPF_SHM_DIR", tmp()).arg("run").arg(&count);
    cmd.args(["--attach", &attach, "--", bin.to_str().unwrap()]);
    let mut run = Proc::spawn("userbpf run", cmd);
    run.wait_for("fn tick", "the target's ready line");
    // The run's session, and its program (the run's own link applies from the start).
    let name = format!("run-{}", run.pid());
    let session = userbpf_runtime::Session::open_in(&tmp(), &name).unwrap();
    let prog = session.progs().unwrap().into_iter().find(|p| p.name == "hit").expect("the program").id;
    let ready = parse_ready(&run.stdout());
    let start = Instant::now();
    while code_and_file(ready.pid, ready.fns[0].1).is_none_or(|(m, f)| m == f) {
        assert!(start.elapsed() < STEP && !run.exited(), "the run's link was not attached\n{}", run.describe());
        std::thread::sleep(Duration::from_millis(20));
    }
    run.send("run 100\n");
    run.wait_for("ran 100", "the calls as root");
    assert_eq!(bss_hits(&session), 100);
    run.send("drop\n");
    run.wait_for(&format!("dropped {NOBODY} {NOBODY}"), "the drop");
    // A second link of the same program after the drop: each call counts twice.
    let link = add_acknowledged(&session, prog, &bin);
    run.send("run 100\n");
    wait_count(&mut run, "ran 100", 2);
    assert_eq!(bss_hits(&session), 300);
    remove_acknowledged(&session, link);
    run.send("run 100\n");
    wait_count(&mut run, "ran 100", 3);
    assert_eq!(bss_hits(&session), 400);
    run.send("quit\n");
    assert!(run.wait_exit("quit").success(), "{}", run.describe());
}

/// Waits until `p`'s stdout holds `pat` `n` times.
fn wait_count(p: &mut Proc, pat: &str, n: usize) {
    let start = Instant::now();
    while p.stdout().matches(pat).count() < n {
        assert!(start.elapsed() < STEP && !p.exited(), "no {n}th {pat:?}\n{}", p.describe());
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn userbpf_tool_on_a_process_that_dropped_root_counts_its_calls() {
    // SAFETY: geteuid has no preconditions.
    if !userbpf_testutil::require(unsafe { libc::geteuid() } == 0, "root (the target starts as root and drops it)") {
        return;
    }
    let s = session("tool");
    let (mut t, ready) = started_target(&s);
    t.send("drop\n");
    t.wait_for(&format!("dropped {NOBODY} {NOBODY}"), "the drop");
    let spec = format!("{}:tick", target().display());
    let mut cmd = std::process::Command::new(common::userbpf());
    cmd.env("USERBPF_SHM_DIR", tmp()).args(["tool", "calls", "--session", &s, "-p", &ready.pid.to_string(), &spec]);
    let mut tool = Proc::spawn("userbpf tool calls", cmd);
    wait_patched(ready.pid, ready.fns[0].1, &mut tool, &mut t);
    t.send("run 400\n");
    t.wait_for("ran 400", "the calls");
    tool.signal(libc::SIGINT);
    tool.wait_exit("the tool interrupted");
    let counted = tool.stdout().lines().find_map(|l| {
        let w: Vec<&str> = l.split_whitespace().collect();
        (w.len() == 2 && w[0] == "tick").then(|| w[1].parse::<u64>().ok()).flatten()
    });
    assert_eq!(counted, Some(400), "{}\n{}", tool.describe(), t.describe());
    wait_unpatched(ready.pid, ready.fns[0].1, "after the tool ended");
    t.send("quit\n");
    assert!(t.wait_exit("quit").success(), "{}", t.describe());
}
