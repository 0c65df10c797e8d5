//! `userbpf tool funclatency`, `calls` and `trace` on a target with known calls
//! (tests/targets/tool_target.c: per round of N, tt_alpha N times, tt_beta 2N, tt_gamma 3N,
//! tt_greet N), started by the tool (`-- CMD`) and running before it (`-p PID`): counts
//! exact, histogram totals equal to the calls, trace lines as the filter selects them; and
//! aiocost's tables for the three async-I/O interfaces through userbpf and the kernel.

mod common;
mod procmem;

use std::path::PathBuf;
use std::process::{Command, Output};

use common::{Proc, here, interrupt, repo, tmp, userbpf};
use procmem::{agent_threads, code_as_in_files};

/// The tools' objects, built from tools/*.bpf.c once per test binary.
fn tools_dir() -> PathBuf {
    static ONCE: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    ONCE.get_or_init(|| {
        let dir = tmp().join("tools-objects");
        for t in ["funclatency", "calls", "trace", "aiocost"] {
            userbpf_testutil::compile_bpf(&repo(&format!("tools/{t}.bpf.c")), &dir);
        }
        userbpf_testutil::compile_c(&repo("tools/aiocost/aiobench.c"), &dir.join("aiobench"), &["-luring", "-laio"]);
        dir
    })
    .clone()
}

fn target() -> PathBuf {
    static ONCE: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    ONCE.get_or_init(|| {
        userbpf_testutil::compile_c(&here("targets/tool_target.c"), &tmp().join("tools/tool_target"), &[])
    })
    .clone()
}

fn tool(args: &[&str]) -> Command {
    let mut c = Command::new(userbpf());
    c.arg("tool").args(args).env("USERBPF_TOOLS_DIR", tools_dir()).env("USERBPF_SHM_DIR", tmp());
    c
}

fn run_ok(args: &[&str]) -> String {
    let out: Output = tool(args).output().unwrap();
    let (so, se) =
        (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned());
    assert!(
        out.status.success(),
        "userbpf tool {args:?} failed ({:?})\n--- stdout ---\n{so}\n--- stderr ---\n{se}",
        out.status
    );
    so
}

/// The histograms of funclatency's output: (header, sum of the bucket counts, the `count:` of
/// the avg line).
fn histograms(out: &str) -> Vec<(String, u64, u64)> {
    let mut v = Vec::new();
    let mut cur: Option<(String, u64)> = None;
    for line in out.lines() {
        if line.starts_with('@') && line.ends_with(':') {
            cur = Some((line.to_string(), 0));
        } else if line.starts_with('[') {
            let c: u64 =
                line.split_whitespace().find_map(|w| w.parse().ok()).unwrap_or_else(|| panic!("bucket line {line}"));
            if let Some((_, s)) = &mut cur {
                *s += c;
            }
        } else if let Some(c) = line.strip_prefix("avg = ").and_then(|l| l.rsplit("count: ").next()) {
            let (h, s) = cur.take().unwrap_or_else(|| panic!("avg line without histogram:\n{out}"));
            v.push((h, s, c.trim().parse().unwrap()));
        }
    }
    v
}

/// calls' rows of the target's functions: function → count.
fn call_rows(out: &str) -> Vec<(String, u64)> {
    out.lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            let (name, count) = (w.next()?, w.next()?.parse().ok()?);
            (w.next().is_none() && name.starts_with("tt_")).then(|| (name.to_string(), count))
        })
        .collect()
}

fn spec(func: &str) -> String {
    format!("{}:{func}", target().display())
}

#[test]
fn funclatency_counts_every_call_of_a_command() {
    let t = target().display().to_string();
    let out = run_ok(&["funclatency", &spec("tt_beta"), "--", &t, "100", "20"]);
    let h = histograms(&out);
    assert_eq!(h.len(), 1, "{out}");
    assert_eq!(h[0].0, "@nsecs:");
    assert_eq!((h[0].1, h[0].2), (240, 240), "{out}");
    // Microseconds: the same calls in other buckets.
    let out = run_ok(&["funclatency", "-u", &spec("tt_beta"), "--", &t, "100"]);
    let h = histograms(&out);
    assert_eq!((h[0].0.as_str(), h[0].1, h[0].2), ("@usecs:", 200, 200), "{out}");
    assert!(out.contains("usecs, total:"), "{out}");
}

#[test]
fn funclatency_globs_per_function_and_per_process() {
    let t = target().display().to_string();
    let out = run_ok(&["funclatency", "-F", "-P", &spec("tt_[abg]*"), "--", &t, "30"]);
    assert!(out.contains("Tracing 4 functions"), "{out}");
    let mut got: Vec<(String, u64, u64)> = histograms(&out);
    got.sort();
    let names: Vec<String> = got.iter().map(|(h, _, _)| h.split(['[', ',']).nth(1).unwrap().to_string()).collect();
    assert_eq!(names, ["tt_alpha", "tt_beta", "tt_gamma", "tt_greet"], "{out}");
    let counts: Vec<(u64, u64)> = got.iter().map(|&(_, s, c)| (s, c)).collect();
    assert_eq!(counts, [(30, 30), (60, 60), (90, 90), (30, 30)], "{out}");
    assert!(got.iter().all(|(h, _, _)| h.contains(", pid ")), "{out}");
    // Combined: one histogram of every call.
    let out = run_ok(&["funclatency", &spec("tt_*"), "--", &t, "30"]);
    let h = histograms(&out);
    assert_eq!(h.len(), 1, "{out}");
    assert_eq!((h[0].1, h[0].2), (210, 210), "{out}");
}

#[test]
fn funclatency_intervals_add_up_to_every_call() {
    let t = target().display().to_string();
    let out = run_ok(&["funclatency", "-i", "0.05", &spec("tt_gamma"), "--", &t, "2000", "2000", "2000", "2000"]);
    let total: u64 = histograms(&out)
        .iter()
        .map(|&(_, s, c)| {
            assert_eq!(s, c, "{out}");
            c
        })
        .sum();
    assert_eq!(total, 4 * 3 * 2000, "{out}");
}

/// The target waiting for rounds on stdin, started without userbpf.
fn waiting_target() -> Proc {
    let mut p = Proc::spawn("tool_target", Command::new(target()));
    p.wait_for("ready", "its start");
    p
}

#[test]
fn funclatency_and_calls_on_a_running_process() {
    let mut t = waiting_target();
    let pid = t.pid().to_string();
    let mut fl = Proc::spawn("funclatency", tool(&["funclatency", "--tids", "-p", &pid, &spec("tt_alpha")]));
    fl.wait_for("Tracing 1 function", "the probes in place");
    t.send("25\n");
    t.wait_for("done 25", "the first round");
    // A second tool on the same process: it already runs the agent, in the first one's session.
    let mut calls = Proc::spawn("calls", tool(&["calls", "-n", "2", "-p", &pid, &spec("tt_*")]));
    calls.wait_for("Tracing 4 functions", "the probes in place");
    t.send("10\n");
    t.wait_for("done 10", "the second round");
    t.close_stdin();
    t.wait_exit("end of input");
    assert!(fl.wait_exit("the process gone").success(), "{}", fl.stderr());
    assert!(calls.wait_exit("the process gone").success(), "{}", calls.stderr());
    let out = fl.stdout();
    let h = histograms(&out);
    assert_eq!(h.len(), 1, "{out}");
    assert_eq!(h[0].0, format!("@nsecs[tid {pid}]:"), "{out}");
    assert_eq!((h[0].1, h[0].2), (35, 35), "{out}");
    assert!(fl.stderr().contains(&format!("attached to process {pid}")), "{}", fl.stderr());
    assert!(!calls.stderr().contains("attached to process"), "the agent was injected twice: {}", calls.stderr());
    let out = calls.stdout();
    assert_eq!(call_rows(&out), [("tt_gamma".to_string(), 30), ("tt_beta".to_string(), 20)], "{out}");
    assert!(out.contains("(2 more functions called; -n shows more)"), "{out}");
}

/// A tool that put the agent into a running process takes it out again when it ends, as the
/// kernel's tools leave a process: its code is its files' and no agent thread runs; a second
/// run does the same; the process runs on.
#[test]
fn a_tool_on_a_running_process_leaves_it_as_it_found_it() {
    let mut t = waiting_target();
    let pid = t.pid() as u32;
    let p = pid.to_string();
    // Rounds of 5 and 6 calls (tt_beta: 10 and 12 calls).
    for n in [5u64, 6] {
        let round = n - 4;
        let mut calls = Proc::spawn("calls", tool(&["calls", "-p", &p, &spec("tt_beta")]));
        calls.wait_for("Tracing 1 function", "the probes in place");
        assert_eq!(agent_threads(pid), 1, "round {round}: no agent in the process");
        t.send(&format!("{n}\n"));
        t.wait_for(&format!("done {n}\n"), "a round");
        interrupt(&mut calls);
        let st = calls.wait_exit("interrupted");
        assert!(st.success(), "round {round}: {st:?}\n{}", calls.stderr());
        let err = calls.stderr();
        assert!(err.contains(&format!("attached to process {pid}")), "round {round}: {err}");
        assert!(err.contains(&format!("detached from process {pid}")), "round {round}: {err}");
        let out = calls.stdout();
        assert_eq!(call_rows(&out), [("tt_beta".to_string(), 2 * n)], "round {round}: {out}");
        assert_eq!(agent_threads(pid), 0, "round {round}: the agent's thread is left");
        code_as_in_files(pid);
    }
    t.close_stdin();
    assert!(t.wait_exit("end of input").success(), "{}", t.stderr());
}

#[test]
fn calls_counts_exactly_and_intervals_add_up() {
    let t = target().display().to_string();
    let out = run_ok(&["calls", &spec("tt_*"), "--", &t, "40"]);
    assert_eq!(
        call_rows(&out),
        [
            ("tt_gamma".to_string(), 120),
            ("tt_beta".to_string(), 80),
            ("tt_alpha".to_string(), 40),
            ("tt_greet".to_string(), 40)
        ],
        "{out}"
    );
    // Two processes half a second apart (the agent follows the shell's children): intervals
    // between them, whose counts add up to every call.
    let script = format!("{t} 1500; sleep 0.5; {t} 1500");
    let out = run_ok(&["calls", "-i", "0.05", &spec("tt_beta"), "--", "sh", "-c", &script]);
    let total: u64 = call_rows(&out)
        .iter()
        .map(|(n, c)| {
            assert_eq!(n, "tt_beta");
            c
        })
        .sum();
    assert_eq!(total, 6000, "{out}");
    assert!(out.matches("FUNC").count() >= 2, "no interval printed: {out}");
}

/// trace's event lines: (pid, tid, comm, func, message).
fn events(out: &str) -> Vec<(String, String, String, String, String)> {
    out.lines()
        .skip_while(|l| !l.starts_with("TIME"))
        .skip(1)
        .filter_map(|l| {
            let parts: Vec<&str> = l.split_whitespace().collect();
            if parts.len() < 5 || parts[0].parse::<f64>().is_err() {
                return None;
            }
            Some((
                parts[1].to_string(),
                parts[2].to_string(),
                parts[3].to_string(),
                parts[4].to_string(),
                parts[5..].join(" "),
            ))
        })
        .collect()
}

#[test]
fn trace_prints_filtered_calls_and_returns() {
    let t = target().display().to_string();
    let greet = format!(r#"{} (arg2 >= 5) "%s i=%d", arg1, arg2"#, spec("tt_greet"));
    let ret = format!(r#"r:{} (retval > 10) "ret %ld", retval"#, spec("tt_alpha"));
    // check_sign returns an int: its -1 is 0xffffffff in rax until cast.
    let sign = format!(r#"r:{} ((int)retval < 0) "neg %d", retval"#, spec("check_sign"));
    let mut p = Proc::spawn("trace", tool(&["trace", &greet, &ret, &sign, "--", &t, "8"]));
    assert!(p.wait_exit("the command's end").success(), "{}", p.stderr());
    let out = p.stdout();
    let ev = events(&out);
    let msgs: Vec<(&str, &str)> = ev.iter().map(|e| (e.3.as_str(), e.4.as_str())).collect();
    let neg = ("check_sign", "neg -1");
    assert_eq!(
        msgs,
        [
            ("tt_alpha", "ret 12"),
            ("tt_alpha", "ret 14"),
            ("tt_greet", "name-5 i=5"),
            ("tt_greet", "name-6 i=6"),
            ("tt_greet", "name-7 i=7"),
            neg,
            neg,
            neg,
            neg
        ],
        "{out}"
    );
    assert!(ev.iter().all(|e| e.0 == e.1 && e.2 == "tool_target"), "{out}");
}

#[test]
fn trace_on_a_running_process_stops_after_max_events() {
    let mut t = waiting_target();
    let pid = t.pid().to_string();
    let spec = format!(r#"{} "n=%d", arg1"#, spec("tt_beta"));
    let mut tr = Proc::spawn("trace", tool(&["trace", "-M", "3", "-p", &pid, &spec]));
    tr.wait_for("TIME", "the probes in place");
    t.send("4\n");
    t.wait_for("done 4", "a round");
    assert!(tr.wait_exit("three events").success(), "{}", tr.stderr());
    let out = tr.stdout();
    let ev = events(&out);
    let msgs: Vec<&str> = ev.iter().map(|e| e.4.as_str()).collect();
    assert_eq!(msgs, ["n=0", "n=1", "n=2"], "{out}");
    assert!(ev.iter().all(|e| e.0 == pid), "{out}");
    // The probes are gone: the process runs on (and another round is not traced by anyone).
    t.send("2\n");
    t.wait_for("done 2", "a round after the tool");
    t.close_stdin();
    assert!(t.wait_exit("end of input").success());
}

#[test]
fn duration_stops_a_command_and_bad_specs_are_named() {
    let mut p = Proc::spawn("calls", tool(&["calls", "-d", "0.5", "c:nanosleep", "--", "sleep", "30"]));
    assert!(p.wait_exit("the duration").success(), "{}", p.stderr());
    let out = tool(&["trace", &format!(r#"{} "%d %d", arg1"#, spec("tt_beta")), "--", "true"]).output().unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("2 conversions but 1 argument"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = tool(&["calls", &spec("no_such_*"), "--", "true"]).output().unwrap();
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no function of"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = tool(&["funclatency", &spec("tt_beta")]).output().unwrap();
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("nothing to trace"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_process_started_under_userbpf_is_traced_in_its_own_session() {
    let session = format!("tool-start-{}", std::process::id());
    let mut c = Command::new(userbpf());
    c.args(["--session", &session, "start"]).arg(target()).env("USERBPF_SHM_DIR", tmp());
    let mut t = Proc::spawn("tool_target under userbpf start", c);
    t.wait_for("ready", "its start");
    // `userbpf start` runs the target as its child: the pid to trace is the target's.
    let kids = std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", t.pid())).unwrap();
    let pid = kids.split_whitespace().next().unwrap_or_else(|| panic!("userbpf start has no child")).to_string();
    let mut calls = Proc::spawn("calls", tool(&["calls", "-p", &pid, &spec("tt_gamma")]));
    calls.wait_for("Tracing 1 function", "the probes in place");
    t.send("6\n");
    t.wait_for("done 6", "a round");
    t.close_stdin();
    t.wait_exit("end of input");
    assert!(calls.wait_exit("the process gone").success(), "{}", calls.stderr());
    assert!(
        !calls.stderr().contains("attached to process"),
        "the agent was injected into a process that had it: {}",
        calls.stderr()
    );
    assert_eq!(call_rows(&calls.stdout()), [("tt_gamma".to_string(), 18)], "{}", calls.stdout());
}

/// aiocost's tables: (section title, interface, iterations, total us, shares).
fn aiocost_tables(out: &str) -> Vec<(String, String, u64, f64, Vec<f64>)> {
    let mut v = Vec::new();
    let mut section = String::new();
    let lines: Vec<&str> = out.lines().collect();
    for (i, l) in lines.iter().enumerate() {
        if l.starts_with("through ") {
            section = l.to_string();
        }
        let Some((name, iters)) = l.split_once("   (") else { continue };
        let iters: u64 = iters.trim_end_matches(" iterations)").parse().unwrap();
        let nums: Vec<f64> = lines[i + 2].split_whitespace().map(|x| x.parse().unwrap()).collect();
        v.push((section.clone(), name.to_string(), iters, nums[0], nums[1..].to_vec()));
    }
    v
}

#[test]
fn aiocost_measures_three_interfaces_through_userbpf_and_the_kernel() {
    if !userbpf_testutil::require(
        Command::new("bpftrace").arg("--version").output().is_ok_and(|o| o.status.success()),
        "bpftrace (the kernel's side of aiocost)",
    ) {
        return;
    }
    // The file on the test's directory (a disk file system: O_DIRECT).
    let file = tmp().join("tools/aiocost.dat");
    let out = run_ok(&[
        "aiocost",
        "-n",
        "12",
        "-b",
        "4",
        "--size-mb",
        "4",
        "--rounds",
        "1",
        "--file",
        &file.display().to_string(),
    ]);
    let t = aiocost_tables(&out);
    let names: Vec<(&str, &str)> = t.iter().map(|r| (&r.0[..12], r.1.as_str())).collect();
    assert_eq!(
        names,
        [
            ("through user", "io_uring"),
            ("through user", "native aio"),
            ("through user", "posix aio"),
            ("through the ", "io_uring"),
            ("through the ", "native aio"),
            ("through the ", "posix aio")
        ],
        "{out}"
    );
    for (section, name, iters, total, shares) in &t {
        assert_eq!(*iters, 12, "{section} {name}: every iteration seen\n{out}");
        assert!(*total > 0.0, "{out}");
        assert_eq!(shares.len(), if name == "io_uring" { 3 } else { 2 }, "{out}");
        assert!(shares.iter().all(|&s| s >= 0.0), "{out}");
        // Each share is printed rounded to 4 decimals (±0.00005).
        assert!(
            shares.iter().sum::<f64>() <= 1.0 + 0.00005 * shares.len() as f64,
            "{section} {name}: shares add up to more than 1\n{out}"
        );
    }
    assert!(out.contains("the benchmark's own time per iteration"), "{out}");
}

#[test]
fn probes_left_by_a_killed_tool_are_removed_by_the_next() {
    let mut t = waiting_target();
    let pid = t.pid().to_string();
    let mut first = Proc::spawn("calls", tool(&["calls", "-p", &pid, &spec("tt_beta")]));
    first.wait_for("Tracing 1 function", "the probes in place");
    first.signal(libc::SIGKILL);
    first.wait_exit("SIGKILL");
    let mut second = Proc::spawn("calls", tool(&["calls", "-p", &pid, &spec("tt_alpha")]));
    second.wait_for("Tracing 1 function", "the probes in place");
    assert!(second.stderr().contains("removed 1 probe left in process"), "{}", second.stderr());
    t.send("4\n");
    t.wait_for("done 4", "a round");
    t.close_stdin();
    t.wait_exit("end of input");
    assert!(second.wait_exit("the process gone").success(), "{}", second.stderr());
    assert_eq!(call_rows(&second.stdout()), [("tt_alpha".to_string(), 4)], "{}", second.stdout());
}
