//! `userbpf run` on programs Debian ships (installed by `make test`), not only on bundled
//! targets: a uprobe on fio's per-I/O function, python3's USDT probe, dd's system calls.

use std::path::{Path, PathBuf};
use std::process::Command;

mod common;
use common::agent;

fn tmp() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).to_path_buf()
}

fn object() -> PathBuf {
    static ONCE: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    ONCE.get_or_init(|| {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/bpf/debian.bpf.c");
        userbpf_testutil::compile_bpf(&src, &tmp().join("bpf/debian"))
    })
    .clone()
}

/// A Debian program by its path, resolved (python3 is a symlink).
fn program(path: &str) -> String {
    let p = std::fs::canonicalize(path).unwrap_or_else(|e| panic!("{path}: {e} (make test installs it)"));
    p.to_str().unwrap().to_string()
}

/// Runs CMD with the object's programs attached: `run` wants every program placed, so each test
/// attaches all of them (a probe on a file the command does not map waits, silently).
fn userbpf_run(cmd: &[&str]) -> String {
    let (fio, py) = (program("/usr/bin/fio"), program("/usr/bin/python3"));
    let attach = [format!("queue={fio}:td_io_queue"), format!("py_gc={py}:python:gc__start")];
    let mut args = vec![];
    for a in &attach {
        args.extend(["--attach", a.as_str()]);
    }
    let out = Command::new(env!("CARGO_BIN_EXE_userbpf"))
        .env("USERBPF_AGENT", agent())
        .env("USERBPF_SHM_DIR", tmp())
        .arg("run")
        .arg(object())
        .args(&args)
        .arg("--")
        .args(cmd)
        .output()
        .unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(!stderr.contains("userbpf-agent:"), "no attach error: {stderr}");
    stdout.into_owned()
}

/// The value `userbpf run` printed for a global counter (`.name = N` in the .bss dump).
fn counter(out: &str, name: &str) -> i64 {
    let key = format!(".{name} = ");
    let at = out.find(&key).unwrap_or_else(|| panic!("{name} not printed: {out}")) + key.len();
    out[at..].split(|c: char| !c.is_ascii_digit() && c != '-').next().unwrap().parse().unwrap()
}

#[test]
fn fio_td_io_queue_is_counted_once_per_io() {
    let fio = program("/usr/bin/fio");
    // 4 MiB in 4 KiB blocks: 1024 I/Os, each queued once through td_io_queue.
    let out = userbpf_run(&[
        &fio,
        "--name=userbpf",
        "--ioengine=null",
        "--rw=randread",
        "--bs=4k",
        "--size=4m",
        "--numjobs=1",
        "--thread",
        "--output-format=terse",
    ]);
    assert_eq!(counter(&out, "io_queued"), 1024, "{out}");
}

#[test]
fn python3_gc_start_usdt_probe_sees_each_collection() {
    let py = program("/usr/bin/python3");
    let script = "import gc\ngc.disable()\nfor i in range(25):\n    gc.collect(1)\nprint('done')\n";
    let out = userbpf_run(&[&py, "-c", script]);
    assert!(out.contains("done"), "{out}");
    assert_eq!(counter(&out, "py_gc_1"), 25, "{out}");
}

#[test]
fn dd_read_and_write_system_calls_are_seen() {
    let dd = program("/usr/bin/dd");
    let out = userbpf_run(&[&dd, "if=/dev/zero", "of=/dev/null", "bs=1536", "count=300", "status=none"]);
    assert_eq!(counter(&out, "dd_reads"), 300, "{out}");
    assert_eq!(counter(&out, "dd_writes"), 300, "{out}");
}
