//! `userbpf run` with system call tracepoints (every call, through system call dispatch): records laid out as
//! the kernel's (per-call and raw_syscalls), return values as the kernel reports them
//! (`-errno`), raw tracepoints, and what cannot be attached in a process.

use std::path::{Path, PathBuf};
use std::process::Command;

mod common;
use common::{agent, here};

fn tmp() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).to_path_buf()
}

fn target() -> PathBuf {
    static ONCE: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    ONCE.get_or_init(|| {
        userbpf_testutil::compile_c(&here("targets/syscalls_target.c"), &tmp().join("syscalls/syscalls_target"), &[])
    })
    .clone()
}

fn object(name: &str) -> PathBuf {
    userbpf_testutil::compile_bpf(&here(&format!("bpf/{name}.bpf.c")), &tmp().join("bpf").join(name))
}

fn run(obj: &Path, extra: &[&str], n: u32) -> (String, String, bool) {
    common::userbpf_run(obj, extra, &[target().to_str().unwrap(), &n.to_string()])
}

#[test]
fn syscall_tracepoints_see_every_call_in_both_engines() {
    let obj = object("syscalls");
    for engine in [&[][..], &["--interpreter"][..]] {
        let (out, err, ok) = run(&obj, engine, 100);
        assert!(ok, "{out}\n{err}");
        assert!(!err.contains("userbpf-agent:"), "every link attached: {err}");
        assert!(out.contains("syscalls_target: 100 iterations, 100 failed opens"), "{out}");
        let want = ".counts = { .null_opens = 100, .null_fdcwd = 100, .null_wronly = 100, .missing_opens = 100, .openat_nr = 257, \
                    .exit_enoent = 100, .exit_fd = 100, .last_ret = -2, .raw_writes5 = 100, .getppid = 200, .raw_tp_write_ret5 = 100, .raw_tp_orig_ax_ok = 100 }";
        assert!(out.contains(want), "open() as openat(AT_FDCWD, ...), -ENOENT, raw records, syscall(): {out}");
    }
}

#[test]
fn tracepoints_a_process_cannot_have_are_refused() {
    // Without --allow-partial the command does not start (see tests/objects.rs). The
    // scheduler tracepoint runs in the kernel unless forced into the process (tests/kernel.rs).
    let (out, err, ok) = run(&object("tp_refused"), &["--allow-partial", "--side", "on_switch=process"], 10);
    assert!(ok, "{out}\n{err}");
    assert!(
        err.contains(
            "program `on_switch` (tracepoint sched/sched_switch) cannot be attached: only system call tracepoints"
        ),
        "{err}"
    );
    // Every system call is seen through dispatch, clone's (which has no plain libc wrapper)
    // too: nothing else is refused.
    assert!(!err.contains("userbpf-agent:"), "{err}");
    // getppid() and syscall(SYS_getppid) each run 10 times; both returns are seen.
    assert!(out.contains(".clones = 0, .getppids = 20 }"), "{out}");
}

#[test]
fn signals_the_program_sends_only_because_userbpfs_threads_exist_are_not_seen() {
    // Each setresuid makes glibc signal every other thread: the program's worker (seen, as on
    // the kernel) and the agent's threads (which the kernel's programs would not see: they do
    // not exist there). bpftrace on the kernel counts the same 26 tgkill and 1 tkill.
    let exe = userbpf_testutil::compile_c(
        &here("targets/setxid_target.c"),
        &tmp().join("syscalls/setxid_target"),
        &["-pthread"],
    );
    let (out, err, ok) = common::userbpf_run(&object("signals_sent"), &[], &[exe.to_str().unwrap(), "25"]);
    assert!(ok, "{out}\n{err}");
    assert!(!err.contains("userbpf-agent:"), "{err}");
    assert!(out.contains("setxid_target: 25 setresuid calls, 0 failed"), "{out}\n{err}");
    assert!(out.contains(".counts = { .tgkill = 26, .tgkill_setxid = 25, .tkill = 1 }"), "{out}\n{err}");
}

#[test]
fn an_execve_returns_in_the_new_image() {
    // sh, started with the agent, execs true: the kernel reports each execve's return (0) in
    // the image it made, under the new name: sh's own (its entry made by userbpf, not seen)
    // and true's (its entry seen in sh).
    let (out, err, ok) = common::userbpf_run(&object("exec_exit"), &[], &["sh", "-c", "exec /bin/true"]);
    assert!(ok, "{out}\n{err}");
    assert!(!err.contains("userbpf-agent:"), "{err}");
    assert!(out.contains(".counts = { .enter = 1, .exit = 2, .exit_ok = 2, .exit_in_true = 1 }"), "{out}\n{err}");
}

#[test]
fn a_forked_childs_calls_are_the_programs_only() {
    // Five children, each calling getppid: the calls bpftrace counts on the kernel for the
    // same program (after its dynamic loader's), and none of the agent's fork handlers (its
    // statistics file, membarrier's registration), which the kernel would never see.
    let exe = userbpf_testutil::compile_c(&here("targets/forks_target.c"), &tmp().join("syscalls/forks_target"), &[]);
    let (out, err, ok) = common::userbpf_run(&object("fork_calls"), &[], &[exe.to_str().unwrap(), "5"]);
    assert!(ok, "{out}\n{err}");
    assert!(!err.contains("userbpf-agent:"), "{err}");
    assert!(out.contains("forks_target: 5 of 5 children ok"), "{out}\n{err}");
    let want =
        ".counts = { .clone = 5, .getppid = 5, .wait4 = 5, .getpid = 0, .openat = 0, .ftruncate = 0, .membarrier = 0 }";
    assert!(out.contains(want), "{out}\n{err}");
}

#[test]
fn system_calls_made_outside_libc_are_seen_through_syscall_user_dispatch() {
    let exe = userbpf_testutil::compile_c(
        &here("targets/raw_syscalls_target.c"),
        &tmp().join("syscalls/raw_syscalls_target"),
        &["-pthread"],
    );
    let obj = object("raw_syscalls");
    for engine in [&[][..], &["--interpreter"][..]] {
        let out = Command::new(env!("CARGO_BIN_EXE_userbpf"))
            .env("USERBPF_AGENT", agent())
            .env("USERBPF_SHM_DIR", tmp())
            .arg("run")
            .arg(&obj)
            .args(engine)
            .arg("--")
            .arg(&exe)
            .arg("500")
            .output()
            .unwrap();
        let (out, err) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(!err.contains("userbpf-agent:"), "{err}");
        // Inline `syscall` in the main thread, in a thread created later (pthread_create's
        // probe turns dispatch on there) and in a forked child (turned on again after fork);
        // the raw rt_sigprocmask applied to the thread's mask, the raw write done.
        assert!(out.contains("raw write\n"), "{out}\n{err}");
        assert!(
            out.contains("raw_syscalls_target: 500 raw getppid calls in each of 3 processes/threads, 0 mismatches"),
            "{out}\n{err}"
        );
        // 3 x 500 raw calls and libc's getppid() once (seen at its wrapper), on enter and exit,
        // per call and in raw_syscalls; the raw write with its arguments.
        let want =
            ".counts = { .enter = 1501, .exit_ok = 1501, .exit_bad = 0, .raw_getppid = 1501, .raw_write_len = 1 }";
        assert!(out.contains(want), "{out}\n{err}");
    }
}

#[test]
fn every_call_is_seen_from_busy_threads_masked_signals_handlers_and_a_child() {
    let exe = userbpf_testutil::compile_c(
        &here("targets/syscalls_stress.c"),
        &tmp().join("syscalls/syscalls_stress"),
        &["-pthread"],
    );
    let out = Command::new(env!("CARGO_BIN_EXE_userbpf"))
        .env("USERBPF_AGENT", agent())
        .env("USERBPF_SHM_DIR", tmp())
        .arg("run")
        .arg(object("getppid_count"))
        .arg("--")
        .arg(&exe)
        .output()
        .unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("syscalls_stress: 50 signals handled, child status 0"), "{stdout}\n{stderr}");
    // 4 x (20000 + 20 with every signal blocked), 50 in the handler, 1000 in the child.
    assert!(stdout.contains(".enter = 81130, .exit_ok = 81130 }"), "{stdout}\n{stderr}");
}
