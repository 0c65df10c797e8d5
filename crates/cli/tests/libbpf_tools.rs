//! The uprobe-based tools of Debian's libbpf-tools, run unmodified through the kernel and
//! through `userbpf load` against test processes (under `userbpf start`), compared on what does
//! not depend on timing or on process ids: funclatency's sample count and lowest bucket,
//! bashreadline's command lines, gethostlatency's callers and host names. The tools run under
//! `stdbuf -oL` (they print through stdio, which holds a pipe's output until exit otherwise);
//! `userbpf load stdbuf ...` keeps serving the tool, which stdbuf execs in the same process.

mod common;

use common::*;
use std::time::{Duration, Instant};

/// The tools probe shared files (bash, libc): one test at a time in this file, so that no test
/// sees another's processes through the kernel.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// funclatency's histogram rows: (low, high, count).
fn histogram(out: &str) -> Vec<(u64, u64, u64)> {
    out.lines()
        .filter_map(|l| {
            let (range, rest) = l.split_once(':')?;
            let (lo, hi) = range.trim().split_once("->")?;
            let count = rest.split('|').next()?.trim().parse().ok()?;
            Some((lo.trim().parse().ok()?, hi.trim().parse().ok()?, count))
        })
        .collect()
}

/// What funclatency prints that does not depend on timing: the unit, the number of samples,
/// and the lowest non-empty bucket (nap(ms) never returns before ms milliseconds).
fn funclatency_summary(out: &str) -> (String, u64, u64) {
    let unit = out
        .lines()
        .find(|l| l.contains(": count"))
        .map(|l| l.split(':').next().unwrap().trim().to_string())
        .unwrap_or_default();
    let h = histogram(out);
    let total = h.iter().map(|b| b.2).sum();
    let lowest = h.iter().find(|b| b.2 > 0).map(|b| b.0).unwrap_or(u64::MAX);
    (unit, total, lowest)
}

#[test]
fn funclatency_program_function() {
    let _g = serial();
    let probed = vec!["nap".to_string()];
    let argv = ["stdbuf", "-oL", "/usr/sbin/funclatency", "-m", "{T}:nap"];
    let (kout, kerr) =
        run_with_target("funclatency", Via::Kernel, Order::LoaderFirst, &argv, "Tracing ", &probed, Ending::Interrupt);
    // nap(12), nap(24), nap(48) in 4 threads: 12 samples, none under 8 ms.
    let k = funclatency_summary(&kout);
    assert_eq!(k, ("msec".to_string(), 12, 8), "kernel:\n{kout}\n{kerr}");
    for order in [Order::LoaderFirst, Order::TargetFirst] {
        let (uout, uerr) =
            run_with_target("funclatency", Via::Userbpf, order, &argv, "Tracing ", &probed, Ending::Interrupt);
        assert_eq!(
            funclatency_summary(&uout),
            k,
            "funclatency through userbpf ({order:?}):\n{uout}\n{uerr}\n--- kernel ---\n{kout}"
        );
    }
}

/// bashreadline's COMMAND column for the lines of this test (their text holds "h5t").
fn readline_commands(out: &str) -> Vec<String> {
    // "%-9s %-7d %s": time, pid, command.
    let mut v: Vec<String> = out
        .lines()
        .filter(|l| l.contains("h5t") && !l.contains("h5tsync"))
        .map(|l| l.split_whitespace().skip(2).collect::<Vec<_>>().join(" "))
        .collect();
    v.sort();
    v
}

fn bashreadline_run(via: Via, order: Order) -> (String, String) {
    let session = session_name("bashreadline", via, order);
    let start_loader = || {
        let mut l = Proc::spawn(
            &format!("bashreadline ({via:?})"),
            loader_command(via, &session, &["stdbuf", "-oL", "/usr/sbin/bashreadline"]),
        );
        l.wait_for("COMMAND", "its header");
        l
    };
    let start_shell = || {
        let mut c = target_command(via, &session, &["script", "-qfec", "bash --norc --noprofile -i", "/dev/null"]);
        c.env("TERM", "dumb").env("HISTFILE", "/dev/null").env("PS1", "$ ");
        Proc::spawn(&format!("bash ({via:?})"), c)
    };
    let (mut loader, mut shell) = match order {
        Order::LoaderFirst => {
            let l = start_loader();
            (l, start_shell())
        }
        Order::TargetFirst => {
            let s = start_shell();
            (start_loader(), s)
        }
    };
    // Lines until one is seen: the uretprobe is live in this bash from then on.
    let start = Instant::now();
    let mut k = 0;
    while !loader.stdout().contains("h5tsync") {
        assert!(
            start.elapsed() < STEP,
            "bashreadline ({via:?}, {order:?}) saw no line\n{}\n{}",
            loader.stdout(),
            loader.stderr()
        );
        assert!(!shell.exited(), "bash exited: {}\n{}", shell.stdout(), shell.stderr());
        shell.send(&format!("echo h5tsync {k}\n"));
        k += 1;
        std::thread::sleep(Duration::from_millis(200));
    }
    for cmd in ["echo h5t one", "true h5t two  spaces 'quoted'", "# h5t a comment", "x=1; echo h5t $x"] {
        shell.send(&format!("{cmd}\n"));
    }
    shell.send("exit\n");
    shell.wait_exit("after exit");
    let start = Instant::now();
    while readline_commands(&loader.stdout()).len() < 4 && start.elapsed() < STEP {
        std::thread::sleep(Duration::from_millis(20));
    }
    loader.signal(libc::SIGINT);
    loader.wait_exit("interrupted");
    (loader.stdout(), loader.stderr())
}

#[test]
fn bashreadline_sees_the_lines_bash_reads() {
    let _g = serial();
    let (kout, kerr) = bashreadline_run(Via::Kernel, Order::LoaderFirst);
    let k = readline_commands(&kout);
    assert_eq!(
        k,
        ["# h5t a comment", "echo h5t one", "true h5t two spaces 'quoted'", "x=1; echo h5t $x"],
        "kernel:\n{kout}\n{kerr}"
    );
    for order in [Order::LoaderFirst, Order::TargetFirst] {
        let (uout, uerr) = bashreadline_run(Via::Userbpf, order);
        assert_eq!(
            readline_commands(&uout),
            k,
            "bashreadline through userbpf ({order:?}):\n{uout}\n{uerr}\n--- kernel ---\n{kout}"
        );
    }
}

/// gethostlatency's (COMM, HOST) for the test target's lines.
fn resolutions(out: &str) -> Vec<String> {
    // "%-8s %-7d %-16s %-10.3f %-s": time, pid, comm, latency, host.
    let mut v: Vec<String> = out
        .lines()
        .filter_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            (w.len() >= 4 && w[2] == "gh_target").then(|| format!("{} {}", w[2], w.get(4).unwrap_or(&"")))
        })
        .collect();
    v.sort();
    v
}

#[test]
fn gethostlatency_sees_each_resolution() {
    let _g = serial();
    let probed: Vec<String> =
        ["getaddrinfo", "gethostbyname", "gethostbyname2"].iter().map(|s| s.to_string()).collect();
    let argv = ["stdbuf", "-oL", "/usr/sbin/gethostlatency"];
    let expected = 9;
    let settled = |out: &str| resolutions(out).len() >= expected;
    let (kout, kerr) = run_with(
        "gethostlatency",
        Via::Kernel,
        Order::LoaderFirst,
        &argv,
        "HOST",
        &gh_target(),
        &probed,
        Ending::Interrupt,
        &settled,
    );
    let k = resolutions(&kout);
    assert_eq!(k, vec!["gh_target localhost".to_string(); expected], "kernel:\n{kout}\n{kerr}");
    for order in [Order::LoaderFirst, Order::TargetFirst] {
        let (uout, uerr) = run_with(
            "gethostlatency",
            Via::Userbpf,
            order,
            &argv,
            "HOST",
            &gh_target(),
            &probed,
            Ending::Interrupt,
            &settled,
        );
        assert_eq!(
            resolutions(&uout),
            k,
            "gethostlatency through userbpf ({order:?}):\n{uout}\n{uerr}\n--- kernel ---\n{kout}"
        );
    }
}

/// execsnoop's lines for the commands of `marker`'s script: (PCOMM, RET, ARGS), and how their
/// PIDs and PPIDs relate (each pid named by its first appearance: `a<b` is PID a, PPID b), so
/// that runs with other pids compare.
fn execs(out: &str, marker: &str) -> (Vec<String>, String) {
    let mut v = Vec::new();
    let mut names: Vec<String> = Vec::new();
    let mut rel = Vec::new();
    let mut name = |p: &str| match names.iter().position(|n| n == p) {
        Some(i) => i,
        None => {
            names.push(p.to_string());
            names.len() - 1
        }
    };
    for l in out.lines().filter(|l| l.contains(marker)) {
        let w: Vec<&str> = l.split_whitespace().collect();
        // PCOMM PID PPID RET ARGS...
        if w.len() >= 5 && (w[4] == "/bin/true" || w[4] == "/bin/echo") {
            rel.push(format!("{}<{}", name(w[1]), name(w[2])));
            v.push(format!("{} {} {}", w[0], w[3], w[4..].join(" ")));
        }
    }
    (v, rel.join(" "))
}

/// One run of execsnoop (kernel, or through `userbpf load` with the script under `userbpf
/// start`), the script run by `shell`: its output once the script's commands ran.
fn execsnoop_run(via: Via, shell: &str, marker: &str) -> (String, String) {
    let session = session_name(&format!("execsnoop-{shell}"), via, Order::LoaderFirst);
    let mut tool = Proc::spawn("execsnoop", loader_command(via, &session, &["stdbuf", "-oL", "/usr/sbin/execsnoop"]));
    tool.wait_for("PCOMM", "execsnoop's header");
    let script = format!("/bin/true {marker}; /bin/echo {marker} > /dev/null; /bin/true {marker} again");
    let st = target_command(via, &session, &[shell, "-c", &script]).status().unwrap();
    assert!(st.success());
    let start = Instant::now();
    while execs(&tool.stdout(), marker).0.len() < 3 && start.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(50));
    }
    interrupt(&mut tool);
    let _ = tool.wait_exit("execsnoop");
    if via != Via::Kernel {
        remove_session(&session);
    }
    (tool.stdout(), tool.stderr())
}

#[test]
fn execsnoop_sees_what_a_shell_runs() {
    let _g = serial();
    // bash forks its first two commands and execs the last itself; dash (sh) vforks all
    // three: the execve entry made in a vfork child, the return in the new image.
    for shell in ["bash", "sh"] {
        let marker = format!("marker-{}-{shell}", std::process::id());
        let (kout, kerr) = execsnoop_run(Via::Kernel, shell, &marker);
        let k = execs(&kout, &marker);
        let want: Vec<String> = [
            format!("true 0 /bin/true {marker}"),
            format!("echo 0 /bin/echo {marker}"),
            format!("true 0 /bin/true {marker} again"),
        ]
        .into();
        assert_eq!(k.0, want, "{shell}, kernel:\n{kout}\n{kerr}");
        let (uout, uerr) = execsnoop_run(Via::Userbpf, shell, &marker);
        assert_eq!(
            execs(&uout, &marker),
            k,
            "{shell}, execsnoop through userbpf:\n{uout}\n{uerr}\n--- kernel ---\n{kout}"
        );
    }
}
