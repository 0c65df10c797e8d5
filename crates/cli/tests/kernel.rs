//! `userbpf run` on objects holding kernel kinds next to user-space ones: each program where it
//! belongs, arrays used by both sides shared (the kernel's values mapped into the process),
//! hashes, LRU hashes and per-CPU maps shared through `bpf()`, checked against the same object
//! loaded by libbpf into the kernel alone, as root and with the target as nobody; and the
//! kernel's refusals passed on.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

mod common;
use common::{repo, userbpf_run};

fn tmp() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("kernel")
}

/// The tests run one at a time: the kernel programs count every process's renames to
/// "ubpfk*", and the binaries are built once.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Root, a BPF-capable kernel and the task_rename tracepoint.
fn kernel_ok() -> bool {
    // SAFETY: geteuid has no arguments and cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    userbpf_testutil::require(
        root && Path::new("/sys/kernel/tracing/events/task/task_rename").exists(),
        "root and the task/task_rename tracepoint (tracefs mounted) for kernel programs",
    )
}

fn built(src: &str, out: &str, libs: &[&str]) -> PathBuf {
    userbpf_testutil::compile_c(&repo(src), &tmp().join(out), libs)
}

fn object(src: &str) -> PathBuf {
    userbpf_testutil::compile_bpf(&repo(src), &tmp().join("bpf"))
}

/// "MAP KEY VALUE" lines of the libbpf reference.
fn reference(obj: &Path, renamer: &Path, n: &str) -> BTreeMap<(String, u64), u64> {
    let kref = built("crates/cli/tests/targets/loaders/kernel_ref.c", "kernel_ref", &["-lbpf"]);
    let r = renamer.to_str().unwrap();
    let out = Command::new(&kref).args([obj.to_str().unwrap(), "observe_hit", r, "observe", r, n]).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    let mut m = BTreeMap::new();
    for l in stdout.lines().filter(|l| !l.starts_with("renamer:")) {
        let f: Vec<&str> = l.split(' ').collect();
        let map = f[0].rsplit('.').next().filter(|_| f[0].contains('.')).map_or(f[0].to_string(), |s| format!(".{s}"));
        m.insert((map, f[1].parse().unwrap()), f[2].parse().unwrap());
    }
    m
}

/// `key = K, value = V` lines of `run`'s dump of its maps (per-CPU maps: `values = { cpu0 =
/// V, ... }`, summed over the CPUs).
fn dumped(out: &str) -> BTreeMap<(String, u64), u64> {
    let mut m = BTreeMap::new();
    let mut map = String::new();
    for l in out.lines() {
        if let Some(name) = l.strip_prefix('@').and_then(|l| l.strip_suffix(':')) {
            map = name.to_string();
        } else if let Some(rest) = l.strip_prefix("key = ")
            && let Some((k, v)) = rest.split_once(", value = ")
            && let (Ok(k), Ok(v)) = (k.parse(), v.parse())
        {
            m.insert((map.clone(), k), v);
        } else if let Some(rest) = l.strip_prefix("key = ")
            && let Some((k, v)) = rest.split_once(", values = { ")
            && let Ok(k) = k.parse()
        {
            let sum = v
                .trim_end_matches(" }")
                .split(", ")
                .map(|c| c.split_once(" = ").and_then(|(_, v)| v.parse::<u64>().ok()).expect("a CPU's value"))
                .sum();
            m.insert((map.clone(), k), sum);
        }
    }
    m
}

#[test]
fn a_tracepoint_and_a_uprobe_sharing_an_array_count_as_under_libbpf() {
    let _serial = serial();
    if !kernel_ok() {
        return;
    }
    let obj = object("crates/cli/tests/bpf/kernel_shared.bpf.c");
    let renamer = built("crates/cli/tests/targets/renamer.c", "renamer", &[]);
    let n = "200";
    // The kernel alone (libbpf; the uprobe a kernel uprobe on this test's own binary), then
    // userbpf with the system call tracepoint on each side. These run one after the other:
    // the tracepoint counts every process's renames to "ubpfk*".
    let want = reference(&obj, &renamer, n);
    for (name, value) in [("counts", 0), ("counts", 1), ("counts", 2), ("counts", 3)] {
        assert_eq!(want.get(&(name.to_string(), value)), Some(&200), "{want:?}");
    }
    for syscalls in ["process", "kernel"] {
        let (out, err, ok) = userbpf_run(
            &obj,
            &["--syscalls", syscalls, "--attach", "observe_hit=observe"],
            &[renamer.to_str().unwrap(), n],
        );
        assert!(ok, "{err}");
        assert!(out.contains("renamer: 200 renames"), "{out}");
        let got = dumped(&out);
        for (k, v) in &want {
            if k.0.starts_with('.') {
                continue;
            }
            // counts[1]: every uprobe hit saw exactly the renames the kernel had counted
            // before it (the kernel's writes seen as they happen).
            assert_eq!(got.get(k), Some(v), "{k:?} with --syscalls {syscalls}: {out}");
        }
        // .bss is shared too: the kernel's count of renames, seen by the uprobe as it grew.
        assert!(out.contains("value = { .kernel_renames = 200, .last_observed = 200, .seen_in_bss = 200 }"), "{out}");
    }
}

/// Hash, LRU hash, per-CPU hash and per-CPU array shared by a kernel tracepoint and a uprobe
/// (reached through bpf() from the process): the same numbers as libbpf in the kernel.
#[test]
fn a_tracepoint_and_a_uprobe_sharing_hash_maps_count_as_under_libbpf() {
    let _serial = serial();
    if !kernel_ok() {
        return;
    }
    let obj = object("crates/cli/tests/bpf/kernel_shared_hash.bpf.c");
    let renamer = built("crates/cli/tests/targets/renamer.c", "renamer", &[]);
    let n = 200u64;
    let want = reference(&obj, &renamer, &n.to_string());
    let mut expect = BTreeMap::new();
    for (map, key) in [("hits", 0), ("hits", 1), ("hits", 2), ("hits", 3), ("hits", 5), ("lru", 0), ("lru", 1)] {
        expect.insert((map.to_string(), key), n);
    }
    for (map, key, v) in [("pc", 0, n), ("pc", 1, n), ("pca", 0, n), ("pca", 1, n), ("pca", 2, 0), ("pca", 3, 0)] {
        expect.insert((map.to_string(), key), v);
    }
    assert_eq!(want, expect, "libbpf's reference");
    for engine in [&[][..], &["--interpreter"][..]] {
        let mut args = vec!["--attach", "observe_hit=observe"];
        args.extend_from_slice(engine);
        let (out, err, ok) = userbpf_run(&obj, &args, &[renamer.to_str().unwrap(), &n.to_string()]);
        assert!(ok, "{err}");
        assert!(out.contains("renamer: 200 renames"), "{out}");
        assert_eq!(dumped(&out), want, "{engine:?}: {out}");
    }
}

/// `userbpf run` with only the capabilities a kernel program needs (CAP_BPF, CAP_PERFMON, and
/// CAP_DAC_READ_SEARCH for tracefs), as nobody, and its command as nobody without any
/// capability: the target gets the shared maps' descriptors from `run` (no CAP_SYS_ADMIN to
/// open them by id): arrays mapped, hashes through bpf().
#[test]
fn a_target_without_privileges_shares_the_kernels_maps() {
    let _serial = serial();
    if !kernel_ok()
        || !userbpf_testutil::require(Path::new("/usr/bin/setpriv").exists(), "setpriv (util-linux) to drop privileges")
    {
        return;
    }
    let shm = tmp().join("nobody-shm");
    std::fs::create_dir_all(&shm).unwrap();
    std::fs::set_permissions(&shm, std::os::unix::fs::PermissionsExt::from_mode(0o1777)).unwrap();
    let renamer = built("crates/cli/tests/targets/renamer.c", "renamer", &[]);
    for (src, n) in
        [("crates/cli/tests/bpf/kernel_shared.bpf.c", 60u64), ("crates/cli/tests/bpf/kernel_shared_hash.bpf.c", 60)]
    {
        let obj = object(src);
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
            .arg(common::userbpf())
            .env("USERBPF_AGENT", common::agent())
            .env("USERBPF_SHM_DIR", &shm)
            .arg("run")
            .arg(&obj)
            .args([
                "--attach",
                "observe_hit=observe",
                "--",
                "/usr/bin/setpriv",
                "--inh-caps=-all",
                "--ambient-caps=-all",
                "--",
                "/bin/sh",
                "-c",
            ])
            .arg(format!("grep -E '^(Uid|CapEff)' /proc/self/status; exec {} {n}", renamer.display()))
            .output()
            .unwrap();
        let (out, err) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(
            out.contains("CapEff:\t0000000000000000") && out.contains("Uid:\t65534"),
            "the target is unprivileged: {out}"
        );
        assert!(out.contains(&format!("renamer: {n} renames")), "{src}: {out}{err}");
        let got = dumped(&out);
        if src.contains("hash") {
            for (map, key) in
                [("hits", 0), ("hits", 1), ("hits", 2), ("hits", 3), ("hits", 5), ("lru", 1), ("pc", 1), ("pca", 1)]
            {
                assert_eq!(got.get(&(map.to_string(), key)), Some(&n), "{map}[{key}]: {out}{err}");
            }
        } else {
            for k in 0..3 {
                assert_eq!(got.get(&("counts".to_string(), k)), Some(&n), "counts[{k}]: {out}{err}");
            }
        }
    }
}

#[test]
fn the_interpreter_sees_the_kernels_writes_too() {
    let _serial = serial();
    if !kernel_ok() {
        return;
    }
    let obj = object("crates/cli/tests/bpf/kernel_shared.bpf.c");
    let renamer = built("crates/cli/tests/targets/renamer.c", "renamer", &[]);
    let (out, err, ok) =
        userbpf_run(&obj, &["--interpreter", "--attach", "observe_hit=observe"], &[renamer.to_str().unwrap(), "50"]);
    assert!(ok, "{err}");
    let got = dumped(&out);
    for k in 0..3 {
        assert_eq!(got.get(&("counts".to_string(), k)), Some(&50), "counts[{k}]: {out}");
    }
}

#[test]
fn not_load_leaves_the_kernel_program_out() {
    let _serial = serial();
    if !kernel_ok() {
        return;
    }
    let obj = object("crates/cli/tests/bpf/kernel_shared.bpf.c");
    let renamer = built("crates/cli/tests/targets/renamer.c", "renamer", &[]);
    let (out, err, ok) = userbpf_run(
        &obj,
        &["--not-load", "on_*", "--attach", "observe_hit=observe"],
        &[renamer.to_str().unwrap(), "30"],
    );
    assert!(ok, "{err}");
    let got = dumped(&out);
    // No kernel program: no renames counted, no call saw a matching count (the first call
    // saw 0 against i = 1), every call seen; the map stayed in the session.
    assert_eq!(got.get(&("counts".to_string(), 0)), Some(&0), "{out}");
    assert_eq!(got.get(&("counts".to_string(), 1)), Some(&0), "{out}");
    assert_eq!(got.get(&("counts".to_string(), 2)), Some(&30), "{out}");
    assert_eq!(got.get(&("counts".to_string(), 3)), Some(&0), "{out}");
    assert!(!out.contains("@by_digit:\nkey"), "the kernel-only map stays empty: {out}");
    // The same through the environment, as bpftime's BPFTIME_NOT_LOAD_PATTERN.
    let (out, err, ok) = common::userbpf_run_env(
        &obj,
        &["--attach", "observe_hit=observe"],
        &[renamer.to_str().unwrap(), "30"],
        &[("USERBPF_NOT_LOAD_PATTERN", "on_rename")],
    );
    assert!(ok, "{err}");
    let got = dumped(&out);
    assert_eq!(got.get(&("counts".to_string(), 0)), Some(&0), "{out}");
    assert_eq!(got.get(&("counts".to_string(), 3)), Some(&30), "the syscall tracepoint still ran: {out}");
}

#[test]
fn the_kernels_refusals_are_passed_on() {
    let _serial = serial();
    if !kernel_ok() {
        return;
    }
    let obj = object("crates/cli/tests/bpf/kernel_refused.bpf.c");
    let progs = ["oob_value", "fentry_prog", "kprobe_prog", "btf_prog", "raw_prog", "shared_queue", "queue_user"];
    let only = |keep: &[&str]| -> Vec<String> {
        progs.iter().filter(|p| !keep.contains(p)).flat_map(|p| ["--not-load".to_string(), p.to_string()]).collect()
    };
    let run = |keep: &[&str]| {
        let args = only(keep);
        let args: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
        userbpf_run(&obj, &args, &["true"])
    };
    // The verifier's refusal: its log, naming the instruction.
    let (_, err, ok) = run(&["oob_value"]);
    assert!(!ok);
    assert!(
        err.contains("kernel program `oob_value`: (section tracepoint/task/task_rename) the kernel refused it"),
        "{err}"
    );
    assert!(err.contains("the kernel verifier's log:"), "{err}");
    assert!(err.contains("invalid access to map value, value_size=8 off=8 size=8"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    // fentry: refused by this kernel before its verifier runs.
    let (_, err, ok) = run(&["fentry_prog"]);
    assert!(!ok);
    assert!(
        err.contains("kernel program `fentry_prog`: (section fentry/do_nanosleep) the kernel refused to load it"),
        "{err}"
    );
    // kprobe: loads, but this kernel has no kprobes to attach to.
    let (_, err, ok) = run(&["kprobe_prog"]);
    assert!(!ok);
    assert!(
        err.contains("kernel program `kprobe_prog`: (section kprobe/do_nanosleep) the kernel refused to attach it"),
        "{err}"
    );
    // tp_btf and raw_tp: loaded and attached.
    for p in ["btf_prog", "raw_prog"] {
        let (out, err, ok) = run(&[p]);
        assert!(ok, "{p}: {err}");
        assert!(out.contains("@m:"), "{out}");
    }
    // A queue used by both sides cannot be shared: refused, naming the map and the programs.
    let (_, err, ok) = run(&["shared_queue", "queue_user"]);
    assert!(!ok);
    assert!(
        err.contains("map `q` (queue) is used by kernel program `shared_queue` and by user-space program `queue_user`, and cannot be shared"),
        "{err}"
    );
}
