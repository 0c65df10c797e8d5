//! Injection into a running process: the library is loaded by the target's own dlopen, its
//! function runs with the argument given, the target goes on as if nothing happened (a
//! thread blocked in read() and one in nanosleep() see no EINTR), and what cannot work is
//! refused with the reason.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

fn tmp() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("inject-{}", std::process::id()))
}

fn src(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c").join(name)
}

fn built() -> &'static (PathBuf, PathBuf) {
    static B: std::sync::OnceLock<(PathBuf, PathBuf)> = std::sync::OnceLock::new();
    B.get_or_init(|| {
        let target = userbpf_testutil::compile_c(&src("target.c"), &tmp().join("target"), &["-pthread", "-ldl"]);
        let lib = userbpf_testutil::compile_c(&src("lib.c"), &tmp().join("libinjected.so"), &["-shared", "-fPIC"]);
        (target, lib)
    })
}

fn start() -> (Child, BufReader<std::process::ChildStdout>, i32) {
    let mut c = Command::new(&built().0).arg(&built().1).stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
    let mut out = BufReader::new(c.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    let pid = line.trim().strip_prefix("ready ").and_then(|p| p.parse().ok()).unwrap_or_else(|| panic!("{line:?}"));
    // Let both threads block in their calls.
    std::thread::sleep(std::time::Duration::from_millis(50));
    (c, out, pid)
}

fn finish(mut c: Child, mut out: BufReader<std::process::ChildStdout>) -> String {
    c.stdin.as_mut().unwrap().write_all(b"hello\n").unwrap();
    let mut text = String::new();
    std::io::Read::read_to_string(&mut out, &mut text).unwrap();
    assert!(c.wait().unwrap().success());
    text
}

#[test]
fn a_library_is_loaded_and_called_in_a_running_process() {
    let (c, out, pid) = start();
    let r = userbpf_inject::inject(pid, &built().1, "inject_init", b"session-x").unwrap();
    assert_eq!(r.ret as i32, 43, "inject_init's return: its constructor ran once first");
    assert_ne!(r.handle, 0);
    assert_eq!(r.tid, pid, "the main thread, blocked in read(), is borrowed");
    eprintln!("pause of thread {}: {:?}", r.tid, r.pause);
    assert_eq!(finish(c, out), "read hello\ninjected session-x\neintr 0\n");
}

#[test]
fn a_second_injection_finds_the_library_loaded() {
    let (c, out, pid) = start();
    let lib = &built().1;
    userbpf_inject::inject(pid, lib, "inject_init", b"first").unwrap();
    let r = userbpf_inject::inject(pid, lib, "inject_init", b"second").unwrap();
    assert_eq!(r.ret as i32, 43, "not loaded twice: the constructor ran once");
    assert_eq!(finish(c, out), "read hello\ninjected second\neintr 0\n");
}

#[test]
fn what_cannot_work_is_refused_with_the_reason() {
    let lib = &built().1;
    let gone = userbpf_inject::inject(i32::MAX - 1, lib, "inject_init", b"").unwrap_err().to_string();
    assert!(gone.contains("does not exist"), "{gone}");
    // A library that does not exist: the target's own dlopen says why, and the target lives on.
    let (c, out, pid) = start();
    let e = userbpf_inject::inject(pid, Path::new("/nonexistent/lib.so"), "f", b"").unwrap_err().to_string();
    assert!(e.contains("No such file"), "{e}");
    let e = userbpf_inject::inject(pid, lib, "no_such_function", b"").unwrap_err().to_string();
    assert!(e.contains("no_such_function"), "{e}");
    assert_eq!(finish(c, out), "read hello\ninjected \neintr 0\n", "loaded (by the second call), never initialised");
    // A process already traced.
    let (mut traced, sleep_pid) = userbpf_testutil::traced_sleep();
    let e = userbpf_inject::inject(sleep_pid as i32, lib, "inject_init", b"").unwrap_err().to_string();
    assert!(e.contains("already traced"), "{e}");
    traced.kill().unwrap();
    traced.wait().unwrap();
}

#[test]
fn a_function_of_a_library_already_loaded_is_called_without_loading_it() {
    let (c, out, pid) = start();
    let lib = &built().1;
    // Not loaded yet: said, and nothing is mapped.
    let maps = || std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    let e = userbpf_inject::call_loaded(pid, lib, "inject_init", b"x").unwrap_err();
    assert!(matches!(e, userbpf_inject::InjectError::NotLoaded { .. }), "{e}");
    assert!(e.to_string().contains("is not loaded in process"), "{e}");
    assert!(!maps().contains("libinjected.so"));
    userbpf_inject::inject(pid, lib, "inject_init", b"first").unwrap();
    let before = maps();
    let r = userbpf_inject::call_loaded(pid, lib, "inject_init", b"again").unwrap();
    assert_eq!(r.ret as i32, 43, "the same library: its constructor ran once");
    assert_eq!(maps(), before, "nothing mapped");
    assert_eq!(finish(c, out), "read hello\ninjected again\neintr 0\n");
}
