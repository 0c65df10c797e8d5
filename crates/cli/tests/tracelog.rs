//! bpf_printk where users read it: the lines of a uprobe program run by a target's agent are
//! in the session's trace pipe, in the kernel's trace_pipe format, for `userbpf tracelog` and
//! for a loader that opens `/sys/kernel/tracing/trace_pipe` through `userbpf load`.

use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;

mod common;
use common::{Proc, repo, tmp, userbpf};
use userbpf_runtime::{LinkRecord, Session};

fn shm() -> PathBuf {
    let d = tmp().join(format!("tracelog-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Loads printk.bpf.o into `session` (joined by this process) and links its program to
/// `work()` of the bundled workload; returns the session and the workload's path.
fn session_with_printk(name: &str) -> (Session, PathBuf) {
    // SAFETY: (of the environment change) every test of this file sets the same value.
    unsafe { std::env::set_var("USERBPF_SHM_DIR", shm()) };
    let dir = tmp().join(format!("tracelog-obj-{name}"));
    let obj = userbpf_testutil::compile_bpf(&common::here("bpf/printk.bpf.c"), &dir);
    let session = Session::open(name).unwrap();
    let slots = Arc::new(userbpf_runtime::context::CpuSlots::open(&session.layout().cpus()).unwrap());
    let opts = userbpf_runtime::loader::LoadOptions {
        engine: userbpf_runtime::Engine::Jit,
        helpers: userbpf_runtime::helpers::registry(),
        only: None,
    };
    let loaded =
        userbpf_runtime::load_object(&session, userbpf_object::Object::open(&obj).unwrap(), &opts, slots).unwrap();
    let exe = repo("target/examples/workload");
    assert!(exe.exists(), "{} missing: `make build` builds it", exe.display());
    session.add_link(LinkRecord::uprobe(loaded.programs[0].0.id, exe.display().to_string(), "work")).unwrap();
    std::mem::forget(loaded);
    (session, exe)
}

/// The argument of the workload's call `i` (examples/targets/workload.c).
fn arg(i: usize) -> usize {
    (i * 7919) % 4096
}

fn start(session: &str, exe: &std::path::Path, calls: &str) -> std::process::Output {
    Command::new(userbpf())
        .args(["start", exe.to_str().unwrap(), calls])
        .env("USERBPF_SESSION", session)
        .env("USERBPF_SHM_DIR", shm())
        .output()
        .unwrap()
}

/// `            comm-tid     [cpu] ..... secs.usecs: bpf_trace_printk: message` (the kernel's
/// trace_print_context, then the message).
fn check_line(line: &str, comm: &str, message: &str) {
    let (ctx, msg) =
        line.split_once(": bpf_trace_printk: ").unwrap_or_else(|| panic!("not a trace_pipe line: {line:?}"));
    assert_eq!(msg, message, "{line:?}");
    let task = &ctx[..ctx.find(" [").unwrap_or_else(|| panic!("{line:?}"))];
    let (c, tid) = task.trim_start().rsplit_once('-').unwrap();
    assert_eq!(c, comm, "{line:?}");
    assert!(tid.trim_end().parse::<u32>().is_ok(), "{line:?}");
    assert!(ctx.len() >= 17 && task.len() >= 16, "comm-pid is padded as the kernel pads it: {line:?}");
    let rest = &ctx[ctx.find(" [").unwrap() + 2..];
    let (cpu, rest) = rest.split_once("] ").unwrap();
    assert!(cpu.len() == 3 && cpu.parse::<u32>().is_ok(), "{line:?}");
    let (flags, ts) = rest.split_once(' ').unwrap();
    assert_eq!(flags.len(), 5, "{line:?}");
    let (secs, usecs) = ts.trim_start().split_once('.').unwrap();
    assert!(secs.parse::<u64>().is_ok() && usecs.len() == 6 && usecs.parse::<u32>().is_ok(), "{line:?}");
}

#[test]
fn tracelog_prints_what_a_targets_programs_printed() {
    let (session, exe) = session_with_printk("tracelog-a");
    let out = start(session.name(), &exe, "3");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let log = Command::new(userbpf())
        .args(["tracelog", "--no-wait"])
        .env("USERBPF_SESSION", session.name())
        .env("USERBPF_SHM_DIR", shm())
        .output()
        .unwrap();
    assert!(log.status.success(), "{}", String::from_utf8_lossy(&log.stderr));
    let text = String::from_utf8_lossy(&log.stdout).into_owned();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3, "{text}");
    for (i, l) in lines.iter().enumerate() {
        check_line(l, "workload", &format!("work called with {}", arg(i)));
    }
    // Read once: the pipe is empty now, as the kernel's trace_pipe after a read.
    let again = Command::new(userbpf())
        .args(["tracelog", "--no-wait"])
        .env("USERBPF_SESSION", session.name())
        .env("USERBPF_SHM_DIR", shm())
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&again.stdout), "");
}

#[test]
fn a_loader_reading_the_kernels_trace_pipe_gets_the_sessions_lines() {
    let (session, exe) = session_with_printk("tracelog-b");
    let mut cat = Proc::spawn("cat", {
        let mut c = Command::new(userbpf());
        c.args(["load", "cat", "/sys/kernel/tracing/trace_pipe"])
            .env("USERBPF_SESSION", session.name())
            .env("USERBPF_SHM_DIR", shm());
        c
    });
    let out = start(session.name(), &exe, "2");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    cat.wait_for(&format!("work called with {}\n", arg(1)), "the second line");
    cat.signal(libc::SIGTERM);
    cat.wait_exit("SIGTERM");
    let text = cat.stdout();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text}");
    check_line(lines[0], "workload", &format!("work called with {}", arg(0)));
    check_line(lines[1], "workload", &format!("work called with {}", arg(1)));
}

#[test]
fn bpftool_prog_tracelog_through_userbpf_load() {
    let (session, exe) = session_with_printk("tracelog-c");
    let mut bpftool = Proc::spawn("bpftool", {
        let mut c = Command::new(userbpf());
        c.args(["load", "bpftool", "prog", "tracelog"])
            .env("USERBPF_SESSION", session.name())
            .env("USERBPF_SHM_DIR", shm());
        c
    });
    let out = start(session.name(), &exe, "2");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    bpftool.wait_for(&format!("work called with {}\n", arg(1)), "the second line");
    bpftool.signal(libc::SIGINT);
    bpftool.wait_exit("SIGINT");
    let text = bpftool.stdout();
    let lines: Vec<&str> = text.lines().filter(|l| l.contains("bpf_trace_printk")).collect();
    assert_eq!(lines.len(), 2, "{text}");
    check_line(lines[0], "workload", &format!("work called with {}", arg(0)));
}
