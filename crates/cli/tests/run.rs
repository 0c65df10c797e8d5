//! `userbpf run` on the bundled target: uprobes and uretprobes in a real process, counts that
//! match the calls, and a faulting program that does not take the target down.

use std::path::{Path, PathBuf};

mod common;
use common::{repo, userbpf_run, userbpf_run_env};

fn tmp() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).to_path_buf()
}

/// The bundled target, compiled once for all the tests of this file (they run in parallel).
fn workload() -> PathBuf {
    static ONCE: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    ONCE.get_or_init(|| {
        userbpf_testutil::compile_c(&repo("examples/targets/workload.c"), &tmp().join("examples/workload"), &[])
    })
    .clone()
}

/// An eBPF object compiled into a directory of the test's own.
fn object(src: &str, test: &str) -> PathBuf {
    userbpf_testutil::compile_bpf(&repo(src), &tmp().join("bpf").join(test))
}

#[test]
fn funclatency_counts_every_call_in_both_engines() {
    let obj = object("examples/bpf/funclatency.bpf.c", "counts");
    let target = workload();
    for engine in [
        &["--attach", "enter=work", "--attach", "leave=work"][..],
        &["--interpreter", "--attach", "enter=work", "--attach", "leave=work"][..],
    ] {
        let (out, err, ok) = userbpf_run(&obj, engine, &[target.to_str().unwrap(), "5000"]);
        assert!(ok, "{err}");
        assert!(out.contains("workload: 5000 calls of work()"), "the target ran: {out}");
        assert!(out.contains("@latency_hist:\n["), "a histogram: {out}");
        assert!(out.contains("value = { .calls = 5000, .total_ns = "), "every return seen: {out}");
        let bars: u64 = out
            .lines()
            .skip_while(|l| !l.starts_with("@latency_hist:"))
            .skip(1)
            .take_while(|l| l.starts_with('['))
            // "[1K, 2K)        4609 |@@@@   |": the count stands before the bar.
            .map(|l| l.split('|').next().unwrap().split_whitespace().last().unwrap().parse::<u64>().unwrap())
            .sum();
        assert_eq!(bars, 5000, "{out}");
    }
}

#[test]
fn a_faulting_program_is_refused_by_the_verifier() {
    let obj = object("crates/cli/tests/bpf/faulty.bpf.c", "faulty");
    let target = workload();
    let (_, err, ok) = userbpf_run(&obj, &["--attach", "faulty=work"], &[target.to_str().unwrap(), "10"]);
    assert!(!ok);
    assert!(err.contains("program `faulty` (section uprobe): instruction 7: R1 invalid mem access 'scalar'"), "{err}");
}

/// With the verifier off (USERBPF_VERIFY=0), the run-time checks still contain a fault.
#[test]
fn a_faulting_program_does_not_kill_the_target() {
    let obj = object("crates/cli/tests/bpf/faulty.bpf.c", "faulty");
    let target = workload();
    let (out, err, ok) = userbpf_run_env(
        &obj,
        &["--attach", "faulty=work"],
        &[target.to_str().unwrap(), "1000"],
        &[("USERBPF_VERIFY", "0")],
    );
    assert!(err.contains("USERBPF_VERIFY=0: program `faulty` runs unverified"), "the warning: {err}");
    assert!(ok, "{err}");
    assert!(out.contains("workload: 1000 calls of work()"), "the target ran to the end: {out}\n{err}");
    // work((i * 7919) % 4096): calls whose argument is a multiple of 10 fault; the rest count.
    let expected = (0..1000u64).filter(|i| (i * 7919) % 4096 % 10 != 0).count();
    assert!(out.contains(&format!("value = {{ .counted = {expected} }}")), "{out}");
}

/// `--no-verify` turns the verifier off as USERBPF_VERIFY=0 does, for `run` (in userbpf and
/// in the target's agent) and `prog run`, warning each time; without it the program is refused.
#[test]
fn no_verify_runs_a_refused_program_with_a_warning() {
    let obj = object("crates/cli/tests/bpf/faulty.bpf.c", "faulty-noverify");
    let target = workload();
    let (out, err, ok) =
        userbpf_run(&obj, &["--no-verify", "--attach", "faulty=work"], &[target.to_str().unwrap(), "100"]);
    assert!(ok, "{err}");
    assert!(err.contains("userbpf: warning: --no-verify: programs run unverified"), "the command's warning: {err}");
    assert!(err.contains("USERBPF_VERIFY=0: program `faulty` runs unverified"), "the program's warning: {err}");
    assert!(out.contains("workload: 100 calls of work()"), "{out}\n{err}");
    let prog_run = |extra: &[&str]| {
        std::process::Command::new(common::userbpf())
            .env("USERBPF_SHM_DIR", common::tmp())
            .args(["--session", "no-verify-prog-run", "prog", "run"])
            .args(extra)
            .arg(&obj)
            .output()
            .unwrap()
    };
    let refused = prog_run(&[]);
    assert!(!refused.status.success(), "{refused:?}");
    assert!(String::from_utf8_lossy(&refused.stderr).contains("R1 invalid mem access 'scalar'"), "{refused:?}");
    let unverified = prog_run(&["--no-verify"]);
    let err = String::from_utf8_lossy(&unverified.stderr);
    assert!(err.contains("--no-verify: programs run unverified"), "{err}");
    assert!(err.contains("program `faulty` runs unverified"), "{err}");
}

/// Map helpers given garbage key and value pointers: refused by the verifier; run unverified,
/// the helpers distrust the pointers (lookups give NULL, updates and deletes -EFAULT) and the
/// target lives (it died of SIGSEGV when they trusted them).
#[test]
fn unverified_garbage_map_pointers_do_not_kill_the_target() {
    let obj = object("crates/cli/tests/bpf/garbage_key.bpf.c", "garbage-key");
    let target = workload();
    let (_, err, ok) = userbpf_run(&obj, &["--attach", "garbage_key=work"], &[target.to_str().unwrap(), "10"]);
    assert!(!ok && err.contains("program `garbage_key`"), "refused by the verifier: {err}");
    let (out, err, ok) = userbpf_run_env(
        &obj,
        &["--attach", "garbage_key=work"],
        &[target.to_str().unwrap(), "1000"],
        &[("USERBPF_VERIFY", "0")],
    );
    assert!(ok, "{out}\n{err}");
    assert!(out.contains("workload: 1000 calls of work()"), "the target ran to the end: {out}\n{err}");
    assert!(out.contains(".survived = 1000"), "every call went through the helpers: {out}");
    assert!(out.contains(".found = 0"), "{out}");
}

/// A target dying of a fault in its own code after a program ran on its thread: `userbpf run`
/// says which signal, exits with 128 + it, and names the last program that ran there (known
/// for programs whose runs keep a run context: those calling helpers, the only ones whose
/// faults can happen outside JIT code, where they are contained).
#[test]
fn a_target_killed_by_a_fault_is_reported_with_the_last_program_on_its_thread() {
    let (err, code) = crash_run(&[]);
    assert_eq!(code, Some(128 + 11), "{err}");
    assert!(err.contains("was killed by signal SIGSEGV (11"), "{err}");
    assert!(
        err.contains("userbpf: the fault (SIGSEGV at 0x0 on thread ")
            && err.contains("came outside eBPF code; the last program that ran on that thread: `last_prog` (id "),
        "{err}"
    );
}

/// The same for a target that dropped root after it joined root's session (it can no longer
/// create files there when it faults: the report goes to the file its agent made at start).
#[test]
fn a_target_that_dropped_root_is_reported_too() {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if !userbpf_testutil::require(root, "root (the target drops it)") {
        return;
    }
    let (err, code) = crash_run(&["drop"]);
    assert_eq!(code, Some(128 + 11), "{err}");
    assert!(err.contains("the last program that ran on that thread: `last_prog` (id "), "{err}");
}

/// `userbpf run` of the crashing target with `args`: its stderr and exit code.
fn crash_run(args: &[&str]) -> (String, Option<i32>) {
    // Compiled once for both tests (they run in parallel).
    static BUILT: std::sync::OnceLock<(PathBuf, PathBuf)> = std::sync::OnceLock::new();
    let (obj, target) = BUILT.get_or_init(|| {
        let obj = object("crates/cli/tests/bpf/last_prog.bpf.c", "crash-last-prog");
        let target = userbpf_testutil::compile_c(
            &Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/targets/crash_target.c"),
            &common::tmp().join("crash_target"),
            &[],
        );
        (obj, target)
    });
    let out = std::process::Command::new(common::userbpf())
        .env("USERBPF_SHM_DIR", common::tmp())
        .args(["run", obj.to_str().unwrap(), "--attach", "last_prog=work", "--"])
        .arg(target)
        .args(args)
        .output()
        .unwrap();
    (String::from_utf8_lossy(&out.stderr).into_owned(), out.status.code())
}

/// `.rodata` is frozen at load (as libbpf freezes it) and its values are constants to the
/// verifier: code behind a `const volatile` flag that is 0 is never reached, and a program
/// the kernel accepts for that reason runs here too.
#[test]
fn frozen_rodata_values_are_constants_to_the_verifier() {
    let obj = object("crates/cli/tests/bpf/rodata_gate.bpf.c", "rodata-gate");
    let out = std::process::Command::new(common::userbpf())
        .env("USERBPF_SHM_DIR", common::tmp())
        .args(["--session", "rodata-gate", "prog", "run"])
        .arg(&obj)
        .output()
        .unwrap();
    let (stdout, err) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{stdout}{err}");
    assert!(stdout.contains("rodata_gate: r0 = 7"), "{stdout}");
}

#[test]
fn a_function_that_does_not_exist_is_reported() {
    let obj = object("examples/bpf/funclatency.bpf.c", "missing");
    let target = workload();
    // --allow-partial: the target runs on (without it `run` fails, see tests/objects.rs).
    let (out, err, ok) = userbpf_run(
        &obj,
        &["--allow-partial", "--attach", "enter=no_such_function", "--attach", "leave=work"],
        &[target.to_str().unwrap(), "10"],
    );
    assert!(ok, "the target runs on: {err}");
    assert!(out.contains("workload: 10 calls"), "{out}");
    assert!(err.contains("no_such_function"), "the failed attachment is named: {err}");
}

/// The same on the lean paths of programs using per-CPU arrays: without a helper (the JIT's
/// claiming entry) and with one (the runtime's native run): a fault ends the run and gives
/// the CPU slot back; the target runs on and every other call is counted, across the CPUs.
#[test]
fn a_faulting_per_cpu_program_does_not_kill_the_target_on_the_lean_paths() {
    for (src, prog) in [("faulty_percpu", "faulty_percpu"), ("faulty_helper", "faulty_helper")] {
        let obj = object(&format!("crates/cli/tests/bpf/{src}.bpf.c"), src);
        let target = workload();
        let attach = format!("{prog}=work");
        let (out, err, ok) = userbpf_run_env(
            &obj,
            &["--attach", &attach],
            &[target.to_str().unwrap(), "1000"],
            &[("USERBPF_VERIFY", "0")],
        );
        assert!(ok, "{src}: {err}");
        assert!(out.contains("workload: 1000 calls of work()"), "{src}: the target ran to the end: {out}\n{err}");
        let expected = (0..1000u64).filter(|i| (i * 7919) % 4096 % 10 != 0).count() as u64;
        // `key = 0, values = { cpu0 = A, cpu1 = B, ... }`: summed.
        let line = out
            .lines()
            .find(|l| l.trim_start().starts_with("key = 0, values = {"))
            .unwrap_or_else(|| panic!("{src}: no per-CPU values: {out}"));
        let sum: u64 = line
            .split('{')
            .nth(1)
            .unwrap()
            .split(',')
            .map(|c| c.split('=').nth(1).unwrap().trim().trim_end_matches('}').trim().parse::<u64>().unwrap())
            .sum();
        assert_eq!(sum, expected, "{src}: {out}");
    }
}

#[test]
fn a_target_killed_by_a_signal_is_reported_and_run_exits_as_a_shell_does() {
    // The target counts its calls, then dies of SIGSEGV: the maps are still printed, the
    // signal is named, and the status is 128 + 11, as a shell reports it.
    let obj = object("examples/bpf/funclatency.bpf.c", "killed");
    let target = workload();
    // The shell (the command, with the agent in it, whose SIGSEGV handler contains faults
    // of programs) is sent SIGSEGV by kill: it must die of it as it would without userbpf.
    let script = format!("{} 300 && kill -SEGV $$", target.display());
    let out = std::process::Command::new(common::userbpf())
        .env("USERBPF_AGENT", common::agent())
        .env("USERBPF_SHM_DIR", tmp())
        .args([
            "run",
            obj.to_str().unwrap(),
            "--attach",
            "enter=work",
            "--attach",
            "leave=work",
            "--allow-partial",
            "--",
            "sh",
            "-c",
            &script,
        ])
        .output()
        .unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(128 + libc::SIGSEGV), "{stderr}");
    assert!(stderr.contains("was killed by signal SIGSEGV (11: Segmentation fault)"), "{stderr}");
    assert!(stdout.contains("value = { .calls = 300, .total_ns = "), "the maps survive the target: {stdout}");
}

#[test]
fn start_exits_as_a_shell_does_when_its_command_dies_of_a_signal() {
    let shm = tmp().join("start-signal");
    std::fs::create_dir_all(&shm).unwrap();
    let out = std::process::Command::new(common::userbpf())
        .env("USERBPF_AGENT", common::agent())
        .env("USERBPF_SHM_DIR", &shm)
        .env("USERBPF_SESSION", "start-signal")
        .args(["start", "sh", "-c", "kill -USR1 $$"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(128 + libc::SIGUSR1), "{stderr}");
    assert!(stderr.contains("sh was killed by signal SIGUSR1 (10: User defined signal 1)"), "{stderr}");
    let out = std::process::Command::new(common::userbpf())
        .env("USERBPF_AGENT", common::agent())
        .env("USERBPF_SHM_DIR", &shm)
        .env("USERBPF_SESSION", "start-signal")
        .args(["start", "sh", "-c", "exit 7"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(7), "an exit code is passed on as it is");
}

/// `USERBPF_PERF_MAP=1`: the target names its stubs and JIT'd programs in /tmp/perf-PID.map
/// (perf's JIT symbol map); without it, no file.
#[test]
fn perf_map_names_stubs_and_programs() {
    let obj = object("examples/bpf/funclatency.bpf.c", "perfmap");
    let target = workload();
    // The shell prints its pid and execs the target: the same process, with the map of the
    // target's image (the shell's own lines go when the target's agent writes its first).
    let script = format!("echo pid $$; exec {} 300", target.display());
    let pid_of = |out: &str| out.lines().find_map(|l| l.strip_prefix("pid ")).unwrap().trim().to_string();
    let (out, err, ok) = userbpf_run_env(
        &obj,
        &["--attach", "enter=work", "--attach", "leave=work"],
        &["sh", "-c", &script],
        &[("USERBPF_PERF_MAP", "1")],
    );
    assert!(ok, "{err}");
    let path = format!("/tmp/perf-{}.map", pid_of(&out));
    let map = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}\n{err}"));
    std::fs::remove_file(&path).unwrap();
    let names: Vec<&str> = map.lines().map(|l| l.splitn(3, ' ').nth(2).unwrap()).collect();
    for want in ["bpf_prog_enter", "bpf_prog_leave", "userbpf_entry_stub_light", "userbpf_return_trampoline"] {
        assert!(names.contains(&want), "{want} in {map}");
    }
    assert!(names.iter().any(|n| n.starts_with("userbpf_site_stub@0x")), "{map}");
    assert!(names.iter().any(|n| n.starts_with("userbpf_relocated@0x")), "{map}");
    for l in map.lines() {
        let mut f = l.split(' ');
        let (at, len) = (u64::from_str_radix(f.next().unwrap(), 16), u64::from_str_radix(f.next().unwrap(), 16));
        assert!(at.is_ok_and(|a| a > 0) && len.is_ok_and(|n| n > 0), "{l}");
    }
    // Off by default.
    let (out, err, ok) =
        userbpf_run(&obj, &["--attach", "enter=work", "--attach", "leave=work"], &["sh", "-c", &script]);
    assert!(ok, "{err}");
    let path = format!("/tmp/perf-{}.map", pid_of(&out));
    assert!(!Path::new(&path).exists(), "{path} written unasked");
}
