//! `userbpf load` passing the kernel's program kinds to the kernel: Debian's libbpf-tools
//! (biolatency, runqlat, biosnoop, opensnoop) give the output they give without userbpf, and
//! a libbpf loader mixing a uprobe and a tracepoint that share maps runs each half where it
//! belongs, with the same maps as when the kernel runs both.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

mod common;
use common::{repo, userbpf};

fn tmp() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("passthrough")
}

/// One at a time: the tools trace the whole machine, and the kernel counts every process's
/// renames to "ubpfk*".
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn tools_ok(tools: &[&str]) -> bool {
    // SAFETY: geteuid has no arguments and cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    userbpf_testutil::require(
        root && tools.iter().all(|t| Path::new("/usr/sbin").join(t).exists()),
        &format!("root and libbpf-tools' {} (apt install libbpf-tools)", tools.join(", ")),
    )
}

/// The test object `crates/cli/tests/bpf/NAME.bpf.c`, the renamer target and the libbpf loader
/// `kernel_ref` (object, uprobe program, target, ...), built for this test run.
fn object_renamer_and_loader(name: &str) -> (PathBuf, PathBuf, PathBuf) {
    let obj = userbpf_testutil::compile_bpf(&repo(&format!("crates/cli/tests/bpf/{name}.bpf.c")), &tmp().join("bpf"));
    let renamer = userbpf_testutil::compile_c(&repo("crates/cli/tests/targets/renamer.c"), &tmp().join("renamer"), &[]);
    let kref = userbpf_testutil::compile_c(
        &repo("crates/cli/tests/targets/loaders/kernel_ref.c"),
        &tmp().join("kernel_ref"),
        &["-lbpf"],
    );
    (obj, renamer, kref)
}

/// `argv` directly, or through `userbpf load` (extra options first) in a session of its own
/// (`userbpf load` execs the loader: the child's pid is the loader's); `during` runs with the
/// pid while it runs.
fn run(via_userbpf: bool, load_opts: &[&str], argv: &[&str], during: impl FnOnce(u32)) -> Output {
    let mut c = if via_userbpf {
        let mut c = Command::new(userbpf());
        c.arg("load").args(load_opts).args(argv);
        c.env("USERBPF_SESSION", format!("pt-{}", std::process::id())).env("USERBPF_SHM_DIR", tmp());
        c
    } else {
        let mut c = Command::new(argv[0]);
        c.args(&argv[1..]);
        c
    };
    std::fs::create_dir_all(tmp()).unwrap();
    let child = c.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    during(child.id());
    child.wait_with_output().unwrap()
}

/// Block I/O on the root disk while a tool runs: direct writes and reads of a file.
fn disk_io() {
    std::thread::sleep(Duration::from_millis(1500));
    let f = tmp().join("io.dat");
    for _ in 0..3 {
        let ok = Command::new("dd")
            .args(["if=/dev/zero", &format!("of={}", f.display()), "bs=4k", "count=256", "oflag=direct", "status=none"])
            .status()
            .unwrap()
            .success();
        assert!(ok);
        let ok = Command::new("dd")
            .args([&format!("if={}", f.display()), "of=/dev/null", "bs=4k", "iflag=direct", "status=none"])
            .status()
            .unwrap()
            .success();
        assert!(ok);
    }
}

/// A log2 histogram as libbpf-tools print it: the header, the bucket lines' shape, the total.
fn histogram(out: &str) -> (Vec<String>, u64) {
    let mut shape = Vec::new();
    let mut total = 0;
    for l in out.lines() {
        if let Some((range, rest)) = l.split_once(':') {
            let (range, rest) = (range.trim(), rest.trim());
            if range.contains("->") {
                let count: u64 = rest.split_whitespace().next().unwrap().parse().unwrap();
                total += count;
                shape.push("BUCKET".to_string());
                continue;
            }
        }
        if !l.trim().is_empty() {
            shape.push(l.trim().to_string());
        }
    }
    shape.dedup();
    (shape, total)
}

#[test]
fn biolatency_and_runqlat_print_what_they_print_on_the_kernel() {
    let _s = serial();
    if !tools_ok(&["biolatency", "runqlat"]) {
        return;
    }
    for (tool, io) in [("biolatency", true), ("runqlat", false)] {
        let argv = [format!("/usr/sbin/{tool}"), "3".into(), "1".into()];
        let argv: Vec<&str> = argv.iter().map(|s| s.as_str()).collect();
        let mut outs = Vec::new();
        for via in [false, true] {
            let o = run(via, &[], &argv, |_| {
                if io {
                    disk_io()
                }
            });
            let (out, err) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
            assert!(o.status.success(), "{tool} (userbpf: {via}): {out}\n{err}");
            let (shape, total) = histogram(&out);
            assert!(total > 0, "{tool} (userbpf: {via}) counted nothing: {out}");
            outs.push((shape, out.into_owned()));
        }
        assert_eq!(outs[0].0, outs[1].0, "{tool}: the kernel's\n{}\nthrough userbpf\n{}", outs[0].1, outs[1].1);
    }
}

#[test]
fn biosnoop_fails_as_on_the_kernel() {
    let _s = serial();
    if !tools_ok(&["biosnoop"]) {
        return;
    }
    // This kernel refuses biosnoop's fentry program: the same refusal through userbpf.
    let direct = run(false, &[], &["/usr/sbin/biosnoop"], |_| {});
    let via = run(true, &[], &["/usr/sbin/biosnoop"], |_| {});
    let norm = |o: &Output| {
        String::from_utf8_lossy(&o.stderr)
            .lines()
            .filter(|l| !l.contains("BTF_LOAD"))
            .map(|l| l.to_string())
            .collect::<Vec<_>>()
    };
    assert_eq!(direct.status.code(), via.status.code());
    assert_eq!(norm(&direct), norm(&via));
    assert!(norm(&via).iter().any(|l| l.contains("blk_account_io_start")), "{:?}", norm(&via));
}

#[test]
fn opensnoop_with_kernel_syscalls_sees_every_process() {
    let _s = serial();
    if !tools_ok(&["opensnoop"]) {
        return;
    }
    let probe = tmp().join("opensnoop-probe-file");
    std::fs::create_dir_all(tmp()).unwrap();
    std::fs::write(&probe, "x").unwrap();
    for via in [false, true] {
        let o = run(via, &["--syscalls", "kernel"], &["/usr/sbin/opensnoop", "-n", "cat"], |pid| {
            std::thread::sleep(Duration::from_millis(2000));
            for _ in 0..3 {
                Command::new("cat").arg(&probe).stdout(Stdio::null()).status().unwrap();
                std::thread::sleep(Duration::from_millis(200));
            }
            std::thread::sleep(Duration::from_millis(500));
            // opensnoop ends on SIGINT.
            // SAFETY: kill has no memory arguments; `pid` is our child, not yet reaped.
            unsafe { libc::kill(pid as i32, libc::SIGINT) };
        });
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(out.starts_with("PID    COMM              FD ERR PATH"), "userbpf: {via}: {out}");
        let seen = out.lines().filter(|l| l.contains(" cat ") && l.ends_with(probe.to_str().unwrap())).count();
        assert_eq!(seen, 3, "userbpf: {via}: {out}\n{}", String::from_utf8_lossy(&o.stderr));
    }
}

/// The "MAP KEY VALUE" lines of the reference loader.
fn map_lines(out: &str) -> Vec<String> {
    let mut v: Vec<String> = out.lines().filter(|l| !l.starts_with("renamer:")).map(|l| l.to_string()).collect();
    v.sort();
    v
}

#[test]
fn a_libbpf_loader_mixing_a_uprobe_and_a_tracepoint_runs_each_half_where_it_belongs() {
    let _s = serial();
    if !tools_ok(&[]) {
        return;
    }
    let (obj, renamer, kref) = object_renamer_and_loader("kernel_shared");
    let (o, r, k) = (obj.to_str().unwrap(), renamer.to_str().unwrap(), kref.to_str().unwrap());
    // The kernel runs everything (the uprobe a kernel uprobe on this test's own binary).
    let direct = Command::new(k).args([o, "observe_hit", r, "observe", r, "100"]).output().unwrap();
    assert!(direct.status.success(), "{}", String::from_utf8_lossy(&direct.stderr));
    // Through userbpf: the uprobe and the system call tracepoint in the target (started with
    // `userbpf start` in the loader's session), task_rename in the kernel.
    let ubpf = userbpf();
    let u = ubpf.to_str().unwrap();
    let via =
        run(true, &[], &[k, o, "observe_hit", r, "observe", "env", "-u", "LD_PRELOAD", u, "start", r, "100"], |_| {});
    let (out, err) = (String::from_utf8_lossy(&via.stdout), String::from_utf8_lossy(&via.stderr));
    assert!(via.status.success(), "{out}\n{err}");
    let want = map_lines(&String::from_utf8_lossy(&direct.stdout));
    assert!(want.contains(&"counts 1 100".to_string()), "{want:?}");
    assert_eq!(map_lines(&out), want, "{err}");
}

#[test]
fn a_ring_buffer_written_by_a_kernel_program_is_read_as_on_the_kernel() {
    let _s = serial();
    if !tools_ok(&[]) {
        return;
    }
    let obj = userbpf_testutil::compile_bpf(&repo("crates/cli/tests/bpf/kernel_ringbuf.bpf.c"), &tmp().join("bpf"));
    let renamer = userbpf_testutil::compile_c(&repo("crates/cli/tests/targets/renamer.c"), &tmp().join("renamer"), &[]);
    let rbref = userbpf_testutil::compile_c(
        &repo("crates/cli/tests/targets/loaders/ringbuf_ref.c"),
        &tmp().join("ringbuf_ref"),
        &["-lbpf"],
    );
    let argv = [rbref.to_str().unwrap(), obj.to_str().unwrap(), renamer.to_str().unwrap(), "50"];
    let want: Vec<String> = (1..=50).map(|i| format!("ubpfk{i}")).collect();
    for via in [false, true] {
        let o = run(via, &[], &argv, |_| {});
        let (out, err) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
        assert!(o.status.success(), "userbpf: {via}: {out}\n{err}");
        let got: Vec<String> = out.lines().filter(|l| l.starts_with("ubpfk")).map(|l| l.to_string()).collect();
        assert_eq!(got, want, "userbpf: {via}: {out}\n{err}");
    }
}

/// Hash, LRU hash, per-CPU hash and per-CPU array shared by a kernel tracepoint and a uprobe,
/// through an unmodified libbpf loader: the uprobe in the target reaches them through bpf(),
/// and every number equals the kernel's alone.
#[test]
fn a_libbpf_loader_sharing_hash_maps_between_a_tracepoint_and_a_uprobe_counts_as_on_the_kernel() {
    let _s = serial();
    if !tools_ok(&[]) {
        return;
    }
    let (obj, renamer, kref) = object_renamer_and_loader("kernel_shared_hash");
    let (o, r, k) = (obj.to_str().unwrap(), renamer.to_str().unwrap(), kref.to_str().unwrap());
    let direct = Command::new(k).args([o, "observe_hit", r, "observe", r, "100"]).output().unwrap();
    assert!(direct.status.success(), "{}", String::from_utf8_lossy(&direct.stderr));
    let want = map_lines(&String::from_utf8_lossy(&direct.stdout));
    for l in ["hits 0 100", "hits 1 100", "hits 2 100", "hits 5 100", "lru 1 100", "pc 1 100", "pca 1 100"] {
        assert!(want.contains(&l.to_string()), "{l}: {want:?}");
    }
    let u = userbpf();
    let u = u.to_str().unwrap();
    let via =
        run(true, &[], &[k, o, "observe_hit", r, "observe", "env", "-u", "LD_PRELOAD", u, "start", r, "100"], |_| {});
    let (out, err) = (String::from_utf8_lossy(&via.stdout), String::from_utf8_lossy(&via.stderr));
    assert!(via.status.success(), "{out}\n{err}");
    assert_eq!(map_lines(&out), want, "{err}");
}

/// `userbpf load --side` and `--not-load` (and `USERBPF_NOT_LOAD_PATTERN`): the system call
/// tracepoint forced into the kernel counts a process outside the session; a program left out
/// does nothing while the loader carries on; a kernel-only event refuses a program forced to
/// the processes.
#[test]
fn load_selects_programs_and_sides() {
    let _s = serial();
    if !tools_ok(&[]) {
        return;
    }
    let (obj, renamer, kref) = object_renamer_and_loader("kernel_shared");
    let (o, r, k) = (obj.to_str().unwrap(), renamer.to_str().unwrap(), kref.to_str().unwrap());
    let u = userbpf();
    let u = u.to_str().unwrap();
    let lines = |opts: &[&str], env: &[(&str, &str)], in_session: bool| {
        let mut argv = vec![k, o, "observe_hit", r, "observe", "env", "-u", "LD_PRELOAD"];
        if in_session {
            argv.extend([u, "start"]);
        }
        argv.extend([r, "60"]);
        let mut c = Command::new(u);
        c.arg("load").args(opts).args(&argv).envs(env.iter().copied());
        c.env("USERBPF_SESSION", format!("pt-{}", std::process::id())).env("USERBPF_SHM_DIR", tmp());
        let o = c.output().unwrap();
        let (out, err) =
            (String::from_utf8_lossy(&o.stdout).into_owned(), String::from_utf8_lossy(&o.stderr).into_owned());
        (o.status.success(), map_lines(&out), err)
    };
    // The renamer outside the session: only the kernel's programs see it. The system call
    // tracepoint counts it (counts[3]) only when forced into the kernel.
    let (ok, got, err) = lines(&[], &[], false);
    assert!(ok, "{err}");
    assert!(got.contains(&"counts 0 60".to_string()) && got.contains(&"counts 3 0".to_string()), "{got:?}\n{err}");
    let (ok, got, err) = lines(&["--side", "on_prct*=kernel"], &[], false);
    assert!(ok, "{err}");
    assert!(got.contains(&"counts 0 60".to_string()) && got.contains(&"counts 3 60".to_string()), "{got:?}\n{err}");
    // In the session, with the kernel's task_rename program left out (empty): no kernel
    // count, no by_digit entry; the uprobe and the system call tracepoint still count.
    for (opts, env) in
        [(&["--not-load", "on_rename"][..], &[][..]), (&[][..], &[("USERBPF_NOT_LOAD_PATTERN", "on_ren*")][..])]
    {
        let (ok, got, err) = lines(opts, env, true);
        assert!(ok, "{err}");
        for l in ["counts 0 0", "counts 2 60", "counts 3 60"] {
            assert!(got.contains(&l.to_string()), "{l}: {got:?}\n{err}");
        }
        assert!(!got.iter().any(|l| l.starts_with("by_digit")), "{got:?}");
    }
    // task_rename exists only in the kernel: the attach fails (EINVAL, our reason in the trace
    // of served calls).
    let (ok, _, err) = lines(&["--side", "on_rename=process"], &[("USERBPF_TRACE_BPF", "1")], true);
    assert!(!ok);
    assert!(err.contains("failed to attach to tracepoint 'task/task_rename': Invalid argument"), "{err}");
    assert!(
        err.contains(
            "program `on_rename` is forced to the processes (--side), but its event exists only in the kernel"
        ),
        "{err}"
    );
}

/// A tracepoint program the kernel's verifier refuses fails at BPF_PROG_LOAD through `userbpf
/// load` as on the kernel, with the kernel's log in the loader's buffer (libbpf prints it),
/// even with userbpf's own verifier off (where the runtime would have accepted it and the
/// kernel would have refused it only at attach).
#[test]
fn a_tracepoint_program_the_kernel_refuses_fails_at_load_with_its_log() {
    let _s = serial();
    if !tools_ok(&[]) {
        return;
    }
    let obj = userbpf_testutil::compile_bpf(&repo("crates/cli/tests/bpf/kernel_verdict.bpf.c"), &tmp().join("bpf"));
    let kref = userbpf_testutil::compile_c(
        &repo("crates/cli/tests/targets/loaders/kernel_ref.c"),
        &tmp().join("kernel_ref"),
        &["-lbpf"],
    );
    let argv = [kref.to_str().unwrap(), obj.to_str().unwrap(), "none", "/bin/true", "none", "true"];
    for (via, opts) in [(false, &[][..]), (true, &[][..]), (true, &["--no-verify"][..])] {
        let o = run(via, opts, &argv, |_| {});
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{via} {opts:?}: {err}");
        assert!(err.contains("kernel_ref: loading"), "refused at load, not at attach: {via} {opts:?}: {err}");
        assert!(err.contains("invalid access to map value, value_size=8 off=8 size=8"), "{via} {opts:?}: {err}");
    }
}

/// A loop device over a file of the test's own, with direct I/O; detached when dropped.
struct Loop(String);

impl Loop {
    fn new(name: &str) -> Loop {
        let img = tmp().join(format!("passthrough-{name}.img"));
        std::fs::create_dir_all(tmp()).unwrap();
        std::fs::File::create(&img).unwrap().set_len(16 << 20).unwrap();
        let out = Command::new("losetup").args(["--direct-io=on", "-f", "--show"]).arg(&img).output().unwrap();
        assert!(out.status.success(), "losetup: {}", String::from_utf8_lossy(&out.stderr));
        Loop(String::from_utf8_lossy(&out.stdout).trim().to_string())
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = Command::new("losetup").args(["-d", &self.0]).status();
    }
}

/// biolatency on a loop device of the test's own, during a fixed number of direct writes:
/// its histogram counts exactly those requests, on the kernel and through `userbpf load`.
#[test]
fn biolatency_counts_every_direct_write_on_a_loop_device_as_on_the_kernel() {
    let _s = serial();
    if !tools_ok(&["biolatency"])
        || !userbpf_testutil::require(
            Command::new("sh").args(["-c", "command -v losetup"]).output().is_ok_and(|o| o.status.success()),
            "losetup",
        )
    {
        return;
    }
    let dev = Loop::new("biolatency");
    let disk = dev.0.trim_start_matches("/dev/").to_string();
    // Whatever udev reads of a new device, before the tool starts.
    let _ = Command::new("udevadm").arg("settle").status();
    std::thread::sleep(Duration::from_millis(500));
    let n = 150;
    for via in [false, true] {
        let o = run(via, &[], &["/usr/sbin/biolatency", "-d", &disk], |pid| {
            // Attached: its two kernel links (request issued, completed) exist.
            let links = || {
                std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| {
                    d.flatten()
                        .filter(|e| {
                            std::fs::read_link(e.path()).is_ok_and(|l| l.to_string_lossy().contains("bpf_link"))
                        })
                        .count()
                })
            };
            for _ in 0..600 {
                if links() >= 2 {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            assert!(links() >= 2, "biolatency (userbpf: {via}) did not attach");
            let ok = Command::new("dd")
                .args([
                    "if=/dev/zero",
                    &format!("of={}", dev.0),
                    "bs=4k",
                    &format!("count={n}"),
                    "oflag=direct",
                    "status=none",
                ])
                .status()
                .unwrap()
                .success();
            assert!(ok);
            // SAFETY: kill sends SIGINT to the tool (or the loader that is it), our child.
            unsafe { libc::kill(pid as i32, libc::SIGINT) };
        });
        let (out, err) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
        assert!(o.status.success(), "biolatency (userbpf: {via}): {out}\n{err}");
        let (_, total) = histogram(&out);
        assert_eq!(total, n, "biolatency -d {disk} (userbpf: {via}) counts every write: {out}\n{err}");
    }
}

/// The loader as nobody with only the capabilities its kernel programs need (CAP_BPF,
/// CAP_PERFMON, CAP_DAC_READ_SEARCH for tracefs), its target as nobody without any: the target
/// gets the shared maps' descriptors from the loader (no CAP_SYS_ADMIN to open them by id),
/// and the numbers are the kernel's.
#[test]
fn an_unprivileged_target_of_a_loader_shares_its_kernel_maps() {
    let _s = serial();
    if !tools_ok(&[])
        || !userbpf_testutil::require(std::path::Path::new("/usr/bin/setpriv").exists(), "setpriv (util-linux)")
    {
        return;
    }
    let (obj, renamer, kref) = object_renamer_and_loader("kernel_shared_hash");
    let shm = tmp().join("nobody-shm");
    std::fs::create_dir_all(&shm).unwrap();
    std::fs::set_permissions(&shm, std::os::unix::fs::PermissionsExt::from_mode(0o1777)).unwrap();
    let (o, r, k) = (obj.to_str().unwrap(), renamer.to_str().unwrap(), kref.to_str().unwrap());
    let direct = Command::new(k).args([o, "observe_hit", r, "observe", r, "80"]).output().unwrap();
    assert!(direct.status.success(), "{}", String::from_utf8_lossy(&direct.stderr));
    let want = map_lines(&String::from_utf8_lossy(&direct.stdout));
    let u = userbpf();
    let caps = "+bpf,+perfmon,+dac_read_search";
    let out = Command::new("/usr/bin/setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            &format!("--inh-caps={caps}"),
            &format!("--ambient-caps={caps}"),
            "--",
        ])
        .arg(&u)
        .env("USERBPF_SHM_DIR", &shm)
        .env("USERBPF_SESSION", format!("pt-nobody-{}", std::process::id()))
        .args(["load", k, o, "observe_hit", r, "observe", "env", "-u", "LD_PRELOAD", "/usr/bin/setpriv"])
        .args(["--inh-caps=-all", "--ambient-caps=-all", "--", "/bin/sh", "-c"])
        .arg(format!("grep -E '^(Uid|CapEff)' /proc/self/status; exec {} start {r} 80", u.display()))
        .output()
        .unwrap();
    let (stdout, err) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{err}");
    assert!(stdout.contains("CapEff:\t0000000000000000") && stdout.contains("Uid:\t65534"), "{stdout}");
    let got: Vec<String> =
        map_lines(&stdout).into_iter().filter(|l| !l.starts_with("Uid") && !l.starts_with("CapEff")).collect();
    assert_eq!(got, want, "{err}");
}
