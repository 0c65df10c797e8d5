//! BCC's Python tools (Debian's bpfcc-tools 0.26) that probe user space, run unchanged once
//! through the kernel and once through `userbpf load` (the target under `userbpf start`), on
//! targets with known calls: funclatency-bpfcc, trace-bpfcc (uprobes, uretprobes, strings,
//! USDT), argdist-bpfcc, stackcount-bpfcc, bashreadline-bpfcc, gethostlatency-bpfcc (libc's
//! resolver), and the language tools ucalls,
//! uflow and ustat on a Python target. The outputs must be equal up to what legitimately
//! differs (pids, times, the order of entries the tool does not order), and the counts must be
//! the known ones.
//!
//! BCC compiles its programs at run time against kernel headers: `BCC_KERNEL_SOURCE` (set by
//! `make unit`), else the tree scripts/bcc-kernel-source.sh sets up. Every kernel run probes a
//! private copy of its binary (bash and python included), never a file other processes run.
//! The tools print through Python's stdio, unbuffered here (`PYTHONUNBUFFERED=1`).

mod common;

use common::*;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// BCC's compiler is heavy (clang in process, hundreds of MB): one tool run at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// The header tree for BCC_KERNEL_SOURCE: the environment's, else the set-up script's.
fn kernel_source() -> String {
    static ONCE: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    ONCE.get_or_init(|| {
        if let Some(v) = std::env::var("BCC_KERNEL_SOURCE").ok().filter(|v| !v.is_empty()) {
            return v;
        }
        let out =
            Command::new(repo("scripts/bcc-kernel-source.sh")).output().expect("running scripts/bcc-kernel-source.sh");
        assert!(
            out.status.success(),
            "scripts/bcc-kernel-source.sh failed (run `make test`, which installs the headers): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    })
    .clone()
}

/// Whether BCC's tools are here (`make test` installs them); fails the test otherwise.
fn have_bcc(tool: &str) -> bool {
    userbpf_testutil::require(
        Path::new("/usr/sbin").join(tool).exists(),
        &format!("/usr/sbin/{tool} (Debian's bpfcc-tools)"),
    ) && userbpf_testutil::require(
        Path::new("/usr/lib/python3/dist-packages/bcc/__init__.py").exists(),
        "BCC's Python module (Debian's python3-bpfcc)",
    )
}

/// The C target, built once per test binary.
fn bcc_target() -> PathBuf {
    static ONCE: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    ONCE.get_or_init(|| {
        userbpf_testutil::compile_c(&here("targets/loaders/bcc_target.c"), &tmp().join("bcc/bcc_target"), &[])
    })
    .clone()
}

/// Where file `path`'s virtual address 0 is in process `pid` (its mapping of file offset 0,
/// less the address that offset has in the file): 0 for an executable built without PIE.
fn load_bias(pid: i32, path: &Path) -> Option<u64> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).ok()?;
    let want = std::fs::canonicalize(path).ok()?;
    let start = maps.lines().find_map(|l| {
        let w: Vec<&str> = l.split_whitespace().collect();
        (w.len() >= 6 && Path::new(w[5]) == want && u64::from_str_radix(w[2], 16).ok() == Some(0))
            .then(|| u64::from_str_radix(w[0].split('-').next()?, 16).ok())
            .flatten()
    })?;
    Some(start - userbpf_elf::symbols::offset_to_vaddr(path, 0)?)
}

/// The run-time address of USDT probe `name` of `path` in process `pid`.
fn usdt_site(pid: i32, path: &Path, name: &str) -> (String, u64) {
    let notes = userbpf_elf::usdt::read_notes(path).unwrap();
    let note =
        notes.iter().find(|n| n.name == name).unwrap_or_else(|| panic!("{} has no USDT probe {name}", path.display()));
    let bias = load_bias(pid, path).unwrap_or_else(|| panic!("{} is not mapped in {pid}", path.display()));
    (format!("usdt:{name}"), bias + note.pc)
}

/// What a run probes in the target (so the workload starts once all of it is live).
enum Probed<'a> {
    /// Functions the target announces.
    Functions(&'a [&'a str]),
    /// USDT probes of the target's file.
    Usdt(&'a [&'a str]),
}

/// The target of a run: the C target (a private copy, run as is), or the Python script run
/// by a private copy of Debian's python3 named `python` (ustat finds Python processes by
/// that command name; the copy is not a PIE, so the test also covers uprobes at offsets no
/// symbol covers, whose address differs from the offset).
#[derive(Clone, Copy, PartialEq)]
enum Target {
    C,
    Python,
    /// The Python target started as is, not with `userbpf start`: a running process the
    /// tool names by pid (the agent is injected into it).
    RunningPython,
}

/// One run through `via`: the target (a private copy) starts, then the tool (`argv`, where
/// `{T}` stands for the copy's path and `{PID}` for the target's pid); once the tool printed
/// `marker` and everything in `probed` is live in the target, the workload runs; once
/// `settled` holds for the tool's output (or a step's time passed), the tool is interrupted.
/// `wrapper`: `argv` is a script running the tool as its child (the tool's process group is
/// interrupted). Returns the tool's stdout, stderr (with the target's stderr) and exit code
/// (trace-bpfcc, for one, exits with 1 when interrupted, on the kernel too).
#[allow(clippy::too_many_arguments)]
fn run_tool(
    test: &str,
    via: Via,
    target: Target,
    argv: &[&str],
    marker: &str,
    probed: Probed,
    settled: &dyn Fn(&str) -> bool,
    wrapper: bool,
) -> (String, String, Option<i32>) {
    let dir = tmp().join("bcc").join(test).join(format!("{via:?}").to_lowercase());
    let session = session_name(&format!("bcc-{test}"), via, Order::TargetFirst);
    let (bin, tcmd): (PathBuf, Vec<String>) = match target {
        Target::C => {
            let t = private_copy(&bcc_target(), &dir);
            (t.clone(), vec![t.display().to_string()])
        }
        Target::Python | Target::RunningPython => {
            std::fs::create_dir_all(&dir).unwrap();
            let py = dir.join("python");
            let _ = std::fs::remove_file(&py);
            // Debian's interpreter (/usr/bin/python3 links to it), whose USDT probes the tools use.
            let debian = std::fs::canonicalize("/usr/bin/python3").expect("Debian's /usr/bin/python3");
            std::fs::copy(&debian, &py).unwrap_or_else(|e| panic!("copying {}: {e}", debian.display()));
            (py.clone(), vec![py.display().to_string(), here("targets/bcc/py_target.py").display().to_string()])
        }
    };
    let targv: Vec<&str> = tcmd.iter().map(|s| s.as_str()).collect();
    let tvia = if target == Target::RunningPython { Via::Kernel } else { via };
    let mut t = Proc::spawn(&format!("target ({via:?})"), target_command(tvia, &session, &targv));
    t.wait_for(if target == Target::C { "\nend\n" } else { "ready " }, "its ready lines");
    let mut ready = parse_ready(&t.stdout());
    let tpath = bin.display().to_string();
    let argv: Vec<String> =
        argv.iter().map(|a| a.replace("{T}", &tpath).replace("{PID}", &ready.pid.to_string())).collect();
    let argv: Vec<&str> = argv.iter().map(|s| s.as_str()).collect();
    let mut cmd = loader_command(via, &session, &argv);
    cmd.env("BCC_KERNEL_SOURCE", kernel_source()).env("PYTHONUNBUFFERED", "1");
    // A process group of its own: a wrapper script and the tool it runs are interrupted
    // together, as Ctrl-C in a terminal does.
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    if wrapper && via != Via::Kernel {
        // Every served bpf() call on stderr: the tool's are there, not the kernel's.
        cmd.env("USERBPF_TRACE_BPF", "1");
    }
    let mut l = Proc::spawn(&format!("{} ({via:?})", argv[0]), cmd);
    l.wait_for(marker, "its header");
    let names: Vec<String> = match probed {
        Probed::Functions(f) => f.iter().map(|s| s.to_string()).collect(),
        Probed::Usdt(u) => u
            .iter()
            .map(|n| {
                let site = usdt_site(ready.pid, &bin, n);
                ready.fns.push(site.clone());
                site.0
            })
            .collect(),
    };
    wait_attached(&mut t, &ready, &names, &mut l);
    t.send("go\n");
    t.wait_for("done ", "the end of its workload");
    let start = Instant::now();
    while !settled(&l.stdout()) && start.elapsed() < STEP && !l.exited() {
        std::thread::sleep(Duration::from_millis(20));
    }
    if !l.exited() {
        if wrapper {
            // The tool is the wrapper's child: the group gets the signal (once the tool has
            // had the time to settle in its loop).
            std::thread::sleep(Duration::from_millis(500));
            // SAFETY: kill(2) on the process group of a child this test started.
            unsafe { libc::kill(-l.pid(), libc::SIGINT) };
        } else {
            interrupt(&mut l);
        }
    }
    let st = l.wait_exit("interrupted");
    t.close_stdin();
    let tst = t.wait_exit("once its stdin closed");
    assert!(tst.success(), "target failed: {tst:?}\n{}", t.describe());
    remove_session(&session);
    let mut err = l.stderr();
    let terr = t.stderr();
    if !terr.is_empty() {
        err.push_str(&format!("\n--- target's stderr ---\n{terr}"));
    }
    (l.stdout(), err, st.code())
}

/// Runs `argv` through the kernel, then through userbpf, and hands both outputs to `check`.
fn both(
    test: &str,
    target: Target,
    argv: &[&str],
    marker: &str,
    probed: &dyn Fn() -> Probed<'static>,
    settled: &dyn Fn(&str) -> bool,
    check: &dyn Fn(&str, &str, &str, &str),
) {
    let _g = serial();
    let wrapper = argv[0].ends_with("calls-bpfcc");
    let (kout, kerr, kcode) = run_tool(test, Via::Kernel, target, argv, marker, probed(), settled, wrapper);
    let (uout, uerr, ucode) = run_tool(test, Via::Userbpf, target, argv, marker, probed(), settled, wrapper);
    check(&kout, &kerr, &uout, &uerr);
    same("the exit code", &kcode, &ucode, (&kout, &kerr, &uout, &uerr));
}

/// Fails showing both outputs unless `k == u`.
fn same<T: PartialEq + std::fmt::Debug>(what: &str, k: &T, u: &T, outs: (&str, &str, &str, &str)) {
    assert_eq!(
        k, u,
        "{what}: userbpf's differs from the kernel's\n=== kernel ===\n{}\n{}\n=== userbpf ===\n{}\n{}",
        outs.0, outs.1, outs.2, outs.3
    );
}

/// A log2 histogram's rows as BCC prints them (`low -> high : count |...|`): (low, count).
fn histogram(out: &str) -> Vec<(u64, u64)> {
    out.lines()
        .filter_map(|l| {
            let (range, rest) = l.split_once(':')?;
            let (lo, _) = range.trim().split_once("->")?;
            Some((lo.trim().parse().ok()?, rest.split('|').next()?.trim().parse().ok()?))
        })
        .collect()
}

#[test]
fn funclatency_counts_every_call() {
    if !have_bcc("funclatency-bpfcc") {
        return;
    }
    // "avg = A nsecs, total: T nsecs, count: N": the count does not depend on timing.
    let count = |out: &str| -> Option<u64> { out.lines().find_map(|l| l.split("count: ").nth(1)?.trim().parse().ok()) };
    both(
        "funclatency",
        Target::C,
        &["funclatency-bpfcc", "{T}:work"],
        "Hit Ctrl-C",
        &|| Probed::Functions(&["work"]),
        &|_| true,
        &|k, ke, u, ue| {
            assert_eq!(count(k), Some(40), "kernel:\n{k}\n{ke}");
            same("funclatency's count", &count(k), &count(u), (k, ke, u, ue));
            let total = |o: &str| histogram(o).iter().map(|r| r.1).sum::<u64>();
            same("funclatency's histogram total", &total(k), &total(u), (k, ke, u, ue));
            assert_eq!(total(u), 40, "{u}");
        },
    );
}

/// gethostlatency's rows as (COMM, HOST), sorted (TIME, PID and LATms differ between runs).
fn lookups(out: &str) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = out
        .lines()
        .filter_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            (w.len() == 5 && w[1].parse::<u32>().is_ok()).then(|| (w[2].to_string(), w[4].to_string()))
        })
        .collect();
    v.sort();
    v
}

/// gethostlatency-bpfcc: uprobes and uretprobes on libc's resolver functions of one process
/// (`-p PID`); the return program copies the comm and host name its entry program stored in a
/// hash map's value with `bpf_probe_read_kernel` (kernel memory in the kernel: a map value).
#[test]
fn gethostlatency_times_the_resolver_calls() {
    if !have_bcc("gethostlatency-bpfcc") {
        return;
    }
    // 3 rounds of getaddrinfo, gethostbyname and gethostbyname2 on "localhost".
    let expected = 9;
    both(
        "gethostlatency",
        Target::C,
        &["gethostlatency-bpfcc", "-p", "{PID}"],
        "HOST",
        &|| Probed::Functions(&["getaddrinfo", "gethostbyname", "gethostbyname2"]),
        &|o| lookups(o).len() >= expected,
        &|k, ke, u, ue| {
            let rows = lookups(k);
            assert_eq!(rows, vec![("bcc_target".to_string(), "localhost".to_string()); expected], "kernel:\n{k}\n{ke}");
            same("gethostlatency's rows", &rows, &lookups(u), (k, ke, u, ue));
        },
    );
}

/// trace's event lines without the PID and TID columns, sorted (each probe has a perf buffer
/// of its own, read one after the other).
fn trace_events(out: &str) -> Vec<String> {
    let mut v: Vec<String> = out
        .lines()
        .filter(|l| l.split_whitespace().next().is_some_and(|w| w.parse::<u32>().is_ok()))
        .map(|l| l.split_whitespace().skip(2).collect::<Vec<_>>().join(" "))
        .collect();
    v.sort();
    v
}

#[test]
fn trace_prints_arguments_return_values_and_strings() {
    if !have_bcc("trace-bpfcc") {
        return;
    }
    let expected = 40 + 40 + 4;
    both(
        "trace",
        Target::C,
        &["trace-bpfcc", "{T}:work \"n=%d\", arg1", "r:{T}:work \"ret %d\", retval", "{T}:greet \"%s %d\", arg1, arg2"],
        "PID",
        &|| Probed::Functions(&["work", "greet"]),
        &|o| trace_events(o).len() >= expected,
        &|k, ke, u, ue| {
            let ke_ = trace_events(k);
            assert_eq!(ke_.len(), expected, "kernel:\n{k}\n{ke}");
            assert!(ke_.contains(&"bcc_target work n=3900".to_string()), "{k}");
            assert!(ke_.contains(&"bcc_target work ret 11701".to_string()), "{k}");
            assert!(ke_.contains(&"bcc_target greet gamma 3".to_string()), "{k}");
            same("trace's events", &ke_, &trace_events(u), (k, ke, u, ue));
        },
    );
}

#[test]
fn trace_reads_usdt_arguments() {
    if !have_bcc("trace-bpfcc") {
        return;
    }
    both(
        "trace_usdt",
        Target::C,
        &["trace-bpfcc", "-p", "{PID}", "u:{T}:tick \"path %d\", arg1"],
        "PID",
        &|| Probed::Usdt(&["tick"]),
        &|o| trace_events(o).len() >= 50,
        &|k, ke, u, ue| {
            let ev = trace_events(k);
            let n = |p: &str| ev.iter().filter(|l| l.ends_with(p)).count();
            assert_eq!((n("path 1"), n("path 2"), ev.len()), (30, 20, 50), "kernel:\n{k}\n{ke}");
            same("trace's USDT events", &ev, &trace_events(u), (k, ke, u, ue));
        },
    );
}

/// argdist's last report (`-c`: cumulative), from its last `[HH:MM:SS]` line on, the
/// target's path left out and the counted values sorted (rows of equal counts come in hash
/// order).
fn last_report(out: &str) -> String {
    let lines: Vec<&str> = out.lines().collect();
    let at = lines.iter().rposition(|l| l.starts_with('[') && l.ends_with(']')).unwrap_or(0);
    let mut rep: Vec<String> = lines[at.min(lines.len())..]
        .iter()
        .skip(1)
        .map(|l| match l.split_once(":work(") {
            Some((_, rest)) => format!("{{T}}:work({rest}"),
            None => l.to_string(),
        })
        .collect();
    let counted: Vec<usize> = (0..rep.len()).filter(|&i| rep[i].contains(" = ")).collect();
    let mut rows: Vec<String> = counted.iter().map(|&i| rep[i].clone()).collect();
    rows.sort();
    for (i, r) in counted.into_iter().zip(rows) {
        rep[i] = r;
    }
    rep.join("\n")
}

#[test]
fn argdist_counts_and_histograms_values() {
    if !have_bcc("argdist-bpfcc") {
        return;
    }
    // Settled once a report counts all 40 calls (the reports come every second).
    let counted = |o: &str| {
        let r = last_report(o);
        r.lines()
            .filter(|l| l.contains("n>=2000 ="))
            .filter_map(|l| l.split_whitespace().next()?.parse::<u64>().ok())
            .sum::<u64>()
            == 40
            && histogram(&r).iter().map(|x| x.1).sum::<u64>() == 40
    };
    both(
        "argdist",
        Target::C,
        &["argdist-bpfcc", "-c", "-i", "1", "-C", "p:{T}:work(long n):long:n>=2000", "-H", "r:{T}:work():long:$retval"],
        "COUNT",
        &|| Probed::Functions(&["work"]),
        &counted,
        &|k, ke, u, ue| {
            let (kr, ur) = (last_report(k), last_report(u));
            assert!(counted(k), "kernel:\n{k}\n{ke}");
            // 20 calls with n >= 2000, 20 below.
            let rows: Vec<(u64, String)> = kr
                .lines()
                .filter(|l| l.contains("n>=2000 ="))
                .filter_map(|l| {
                    Some((l.split_whitespace().next()?.parse().ok()?, l.split('=').next_back()?.trim().to_string()))
                })
                .collect();
            assert!(rows.contains(&(20, "1".into())) && rows.contains(&(20, "0".into())), "{kr}");
            // Return values 1, 301, ..., 11701: 14 in [4096, 8192), 12 in [8192, 16384).
            assert!(histogram(&kr).contains(&(4096, 14)) && histogram(&kr).contains(&(8192, 12)), "{kr}");
            same("argdist's report", &kr, &ur, (k, ke, u, ue));
        },
    );
}

/// stackcount's stacks and their counts: blocks of frames, a count at the end of each.
fn stacks(out: &str) -> Vec<(Vec<String>, u64)> {
    let mut v = Vec::new();
    let mut frames = Vec::new();
    for l in out.lines() {
        let t = l.trim();
        if t.is_empty() || t.starts_with("Tracing") || t.starts_with("Detaching") {
            frames.clear();
        } else if let Ok(n) = t.parse::<u64>() {
            v.push((std::mem::take(&mut frames), n));
        } else {
            frames.push(t.to_string());
        }
    }
    v.sort();
    v
}

#[test]
fn stackcount_counts_user_stacks() {
    if !have_bcc("stackcount-bpfcc") {
        return;
    }
    both(
        "stackcount",
        Target::C,
        &["stackcount-bpfcc", "-p", "{PID}", "{T}:leaf"],
        "Hit Ctrl-C",
        &|| Probed::Functions(&["leaf"]),
        &|_| true,
        &|k, ke, u, ue| {
            let s = stacks(k);
            // leaf() is reached from via_a() (through middle()) 30 times, from via_b() 20 times.
            let counts: Vec<u64> = s.iter().map(|x| x.1).collect();
            assert!(
                counts.contains(&30) && counts.contains(&20) && counts.iter().sum::<u64>() == 50,
                "kernel:\n{k}\n{ke}"
            );
            assert!(s.iter().all(|x| x.0.first().map(|f| f.as_str()) == Some("leaf")), "{k}");
            same("stackcount's stacks", &s, &stacks(u), (k, ke, u, ue));
        },
    );
}

/// Debian's stackcount-bpfcc 0.26 cannot take a `u:` (USDT) spec at all: it passes the
/// library's path to bcc's USDT class as bytes where a string is expected (a bare name fails
/// the same way in its `find_exe`). Through userbpf it fails with the same message.
#[test]
fn stackcount_usdt_spec_fails_as_on_the_kernel() {
    if !have_bcc("stackcount-bpfcc") {
        return;
    }
    let _g = serial();
    let dir = tmp().join("bcc/stackcount_usdt");
    let t = private_copy(&bcc_target(), &dir);
    let spec = format!("u:{}:tick", t.display());
    let run = |via: Via| {
        let mut c =
            loader_command(via, &session_name("bcc-scu", via, Order::LoaderFirst), &["stackcount-bpfcc", &spec]);
        c.env("BCC_KERNEL_SOURCE", kernel_source());
        let o = c.output().unwrap();
        (String::from_utf8_lossy(&o.stdout).into_owned(), o.status.code())
    };
    let (k, kc) = run(Via::Kernel);
    assert!(k.contains("'bytes' object has no attribute 'encode'"), "kernel: {k:?} ({kc:?})");
    let (u, uc) = run(Via::Userbpf);
    assert_eq!((k, kc), (u, uc));
    remove_session(&session_name("bcc-scu", Via::Userbpf, Order::LoaderFirst));
}

/// bashreadline's COMMAND column for this test's lines (their text holds "h5t").
fn readline_commands(out: &str) -> Vec<String> {
    let mut v: Vec<String> = out
        .lines()
        .filter(|l| l.contains("h5t") && !l.contains("h5tsync"))
        .map(|l| l.split_whitespace().skip(2).collect::<Vec<_>>().join(" "))
        .collect();
    v.sort();
    v
}

/// bashreadline-bpfcc on a private copy of bash (`-s`), started under `script` (a terminal,
/// for readline) before the tool: lines are sent until one is seen (the uretprobe is live
/// from then on), then the test's lines.
fn bashreadline_run(via: Via) -> (String, String) {
    let dir = tmp().join("bcc/bashreadline").join(format!("{via:?}").to_lowercase());
    let bash = private_copy(Path::new("/usr/bin/bash"), &dir);
    let session = session_name("bcc-bashreadline", via, Order::TargetFirst);
    let shell_cmd = format!("{} --norc --noprofile -i", bash.display());
    let mut c = target_command(via, &session, &["script", "-qfec", &shell_cmd, "/dev/null"]);
    c.env("TERM", "dumb").env("HISTFILE", "/dev/null").env("PS1", "$ ");
    let mut shell = Proc::spawn(&format!("bash ({via:?})"), c);
    let mut lc = loader_command(via, &session, &["bashreadline-bpfcc", "-s", bash.to_str().unwrap()]);
    lc.env("BCC_KERNEL_SOURCE", kernel_source()).env("PYTHONUNBUFFERED", "1");
    let mut loader = Proc::spawn(&format!("bashreadline-bpfcc ({via:?})"), lc);
    loader.wait_for("COMMAND", "its header");
    let start = Instant::now();
    let mut k = 0;
    while !loader.stdout().contains("h5tsync") {
        assert!(
            start.elapsed() < STEP,
            "bashreadline ({via:?}) saw no line\n{}\n{}",
            loader.describe(),
            shell.describe()
        );
        assert!(!shell.exited(), "bash exited: {}", shell.describe());
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
    interrupt(&mut loader);
    loader.wait_exit("interrupted");
    remove_session(&session);
    (loader.stdout(), loader.stderr())
}

#[test]
fn bashreadline_sees_the_lines_bash_reads() {
    if !have_bcc("bashreadline-bpfcc") {
        return;
    }
    let _g = serial();
    let (k, ke) = bashreadline_run(Via::Kernel);
    assert_eq!(
        readline_commands(&k),
        ["# h5t a comment", "echo h5t one", "true h5t two spaces 'quoted'", "x=1; echo h5t $x"],
        "kernel:\n{k}\n{ke}"
    );
    let (u, ue) = bashreadline_run(Via::Userbpf);
    same("bashreadline's lines", &readline_commands(&k), &readline_commands(&u), (&k, &ke, &u, &ue));
}

/// ucalls' (METHOD, # CALLS) rows, the script's directory left out, sorted (rows of equal
/// counts come in hash order).
fn ucalls_rows(out: &str) -> Vec<(String, u64)> {
    let mut v: Vec<(String, u64)> = out
        .lines()
        .filter_map(|l| {
            let (m, n) = l.rsplit_once(char::is_whitespace)?;
            let m = m.trim();
            Some((m.rsplit('/').next()?.to_string(), n.trim().parse().ok()?))
        })
        .collect();
    v.sort();
    v
}

#[test]
fn ucalls_counts_python_calls() {
    if !have_bcc("ucalls") {
        return;
    }
    both(
        "ucalls",
        Target::Python,
        &["ucalls", "-l", "python", "{PID}"],
        "Ctrl-C to quit",
        &|| Probed::Usdt(&["function__entry"]),
        &|_| true,
        &|k, ke, u, ue| {
            let rows = ucalls_rows(k);
            for want in [("py_target.py.leaf", 12), ("py_target.py.middle", 12), ("py_target.py.outer", 1)] {
                assert!(rows.contains(&(want.0.to_string(), want.1)), "kernel: no {want:?}\n{k}\n{ke}");
            }
            same("ucalls' rows", &rows, &ucalls_rows(u), (k, ke, u, ue));
        },
    );
}

/// Debian's pythoncalls-bpfcc is a shell script running `ucalls -l python` as its child: the
/// child's eBPF is served too (it takes the loader's role at its first bpf() call), not
/// passed to the kernel.
#[test]
fn pythoncalls_wrapper_runs_its_tool_through_userbpf() {
    if !have_bcc("pythoncalls-bpfcc") {
        return;
    }
    both(
        "pythoncalls",
        Target::Python,
        &["pythoncalls-bpfcc", "{PID}"],
        "Ctrl-C to quit",
        &|| Probed::Usdt(&["function__entry"]),
        &|_| true,
        &|k, ke, u, ue| {
            assert!(ucalls_rows(k).contains(&("py_target.py.middle".to_string(), 12)), "kernel:\n{k}\n{ke}");
            assert!(ue.contains("userbpf: bpf(BPF_PROG_LOAD"), "the tool's programs were not loaded by userbpf:\n{ue}");
            same("pythoncalls' rows", &ucalls_rows(k), &ucalls_rows(u), (k, ke, u, ue));
        },
    );
}

/// ucalls through `userbpf load` on a Python process already running (not started with
/// userbpf): BCC opens its uprobes for that pid, so userbpf injects its agent into it, and
/// the counts are the kernel's.
#[test]
fn ucalls_counts_calls_of_a_running_python() {
    if !have_bcc("ucalls") {
        return;
    }
    let _g = serial();
    let argv = ["ucalls", "-l", "python", "{PID}"];
    let probed = || Probed::Usdt(&["function__entry"]);
    let (k, ke, kc) =
        run_tool("ucalls_running", Via::Kernel, Target::Python, &argv, "Ctrl-C to quit", probed(), &|_| true, false);
    let (u, ue, uc) = run_tool(
        "ucalls_running",
        Via::Userbpf,
        Target::RunningPython,
        &argv,
        "Ctrl-C to quit",
        probed(),
        &|_| true,
        false,
    );
    assert!(ucalls_rows(&k).contains(&("py_target.py.leaf".to_string(), 12)), "kernel:\n{k}\n{ke}");
    same("ucalls' rows", &ucalls_rows(&k), &ucalls_rows(&u), (&k, &ke, &u, &ue));
    same("the exit code", &kc, &uc, (&k, &ke, &u, &ue));
}

/// uflow's (depth, direction, method) columns, sorted: events come from per-CPU buffers, and
/// the one thread may move between CPUs during the run.
fn flow(out: &str) -> Vec<String> {
    // "CPU PID TID TIME(us) DIR METHOD" (DIR indented by depth).
    let mut v = out
        .lines()
        .filter_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            (w.len() == 6 && (w[4] == "->" || w[4] == "<-")).then(|| {
                let depth = l.find(w[4]).unwrap_or(0) - l.find(w[3]).unwrap_or(0);
                format!("{depth} {} {}", w[4], w[5].rsplit('/').next().unwrap_or(""))
            })
        })
        .collect::<Vec<_>>();
    v.sort();
    v
}

#[test]
fn uflow_follows_python_calls() {
    if !have_bcc("uflow") {
        return;
    }
    both(
        "uflow",
        Target::Python,
        &["uflow", "-l", "python", "{PID}"],
        "Ctrl-C to quit",
        &|| Probed::Usdt(&["function__entry", "function__return"]),
        &|o| {
            flow(o).iter().filter(|l| l.ends_with("-> py_target.py.leaf")).count() >= 12
                && flow(o).iter().any(|l| l.ends_with("<- py_target.py.outer"))
        },
        &|k, ke, u, ue| {
            let f = flow(k);
            let n = |s: &str| f.iter().filter(|l| l.ends_with(s)).count();
            assert_eq!(
                (n("-> py_target.py.leaf"), n("<- py_target.py.leaf"), n("-> py_target.py.outer")),
                (12, 12, 1),
                "kernel:\n{k}\n{ke}"
            );
            same("uflow's flow", &f, &flow(u), (k, ke, u, ue));
        },
    );
}

#[test]
fn ustat_counts_python_events() {
    if !have_bcc("ustat") {
        return;
    }
    // One report after 5 s (ustat attaches for each interval); it exits after it.
    both(
        "ustat",
        Target::Python,
        &["ustat", "-l", "python", "-C", "5", "1"],
        "Tracing",
        &|| Probed::Usdt(&["function__entry"]),
        &|o| o.contains("Detaching"),
        &|k, ke, u, ue| {
            // One row (ustat reports every process named `python`: none but the target may
            // run), its CMDLINE cut at 20 characters; the rates, reversed: 25 calls (outer,
            // 12 middle, 12 leaf) / 5 s.
            let rates = |o: &str| -> Vec<String> {
                o.lines()
                    .filter(|l| l.split_whitespace().next().is_some_and(|w| w.parse::<u32>().is_ok()))
                    .map(|l| l.split_whitespace().rev().take(6).collect::<Vec<_>>().join(" "))
                    .collect()
            };
            assert_eq!(rates(k), ["0 0 0 0 0 5"], "kernel:\n{k}\n{ke}");
            same("ustat's rates", &rates(k), &rates(u), (k, ke, u, ue));
        },
    );
}
