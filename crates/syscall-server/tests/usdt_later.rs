//! A USDT probe guarded by a semaphore, in a target started AFTER the loader attached it
//! (libbpf's `bpf_program__attach_usdt`: a uprobe event with `ref_ctr_offset`), the target
//! running under the agent alone (`userbpf start`: no syscall-server library in it). The
//! kernel raises the semaphore when such a process maps the file; under userbpf the target's
//! agent does, once, and lowers it when the link goes. Same output as the kernel's run.

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};

mod common;
use common::{lib, tmp, wait_line};

fn src(name: &str) -> PathBuf {
    common::src("perf", name)
}

fn shm() -> PathBuf {
    let d = tmp().join("shm");
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Loader first (served in `session`, or the kernel's), then the target; the target's and
/// the loader's lines joined.
fn run(session: Option<&str>) -> String {
    let dir = tmp().join(format!("usdt-later-{}", std::process::id()));
    let bpf = userbpf_testutil::compile_bpf(&src("perf_usdt.bpf.c"), &dir);
    let ldr = userbpf_testutil::compile_c(&src("perf_usdt_loader.c"), &dir.join("perf_usdt_loader"), &["-lbpf"]);
    let tgt = userbpf_testutil::compile_c(&src("perf_usdt_target.c"), &dir.join("perf_usdt_target"), &[]);
    let mut l = match session {
        None => Command::new(&ldr),
        Some(s) => {
            let mut c = Command::new("sh");
            c.arg("-c")
                .arg("USERBPF_LOADER_PID=$$ exec \"$0\" \"$@\"")
                .arg(&ldr)
                .env("LD_PRELOAD", lib("libuserbpf_syscall_server.so"))
                .env("USERBPF_SESSION", s)
                .env("USERBPF_SHM_DIR", shm());
            c
        }
    };
    let mut l = l.arg(&bpf).arg(&tgt).stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
    let mut lout = BufReader::new(l.stdout.take().unwrap());
    wait_line(&mut lout, "ready");
    // The target starts now, with the agent only (as `userbpf start` runs it).
    let mut t = Command::new(&tgt);
    t.arg("10").stdin(Stdio::piped()).stdout(Stdio::piped());
    if let Some(s) = session {
        t.env("LD_PRELOAD", lib("libuserbpf_agent.so")).env("USERBPF_SESSION", s).env("USERBPF_SHM_DIR", shm());
    }
    let mut t = t.spawn().unwrap();
    let mut tout = BufReader::new(t.stdout.take().unwrap());
    wait_line(&mut tout, "started");
    let mut out = Vec::new();
    let mut line = String::new();
    t.stdin.as_mut().unwrap().write_all(b"go\n").unwrap();
    tout.read_line(&mut line).unwrap();
    out.push(line.trim().to_string());
    l.stdin.as_mut().unwrap().write_all(b"go\n").unwrap();
    for _ in 0..2 {
        line.clear();
        lout.read_line(&mut line).unwrap();
        out.push(line.trim().to_string());
    }
    assert!(l.wait().unwrap().success());
    t.stdin.as_mut().unwrap().write_all(b"bye\n").unwrap();
    line.clear();
    tout.read_line(&mut line).unwrap();
    out.push(line.trim().to_string());
    t.wait().unwrap();
    out.join(" | ")
}

#[test]
fn a_target_started_later_under_the_agent_raises_the_semaphore_once() {
    let kernel = run(None);
    assert_eq!(kernel, "fired=10 | fired=10 sum=55 | detached | semaphore=0", "the kernel's run");
    assert_eq!(run(Some("usdt-later")), kernel);
}
