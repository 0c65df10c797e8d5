//! Perf events, rings and where programs run, through an unmodified libbpf loader
//! (tests/perf/perf_loader.c): uprobes attached with `bpf_program__attach_uprobe_opts`,
//! samples read with libbpf's own `perf_buffer` (perf event array + BPF output events
//! mmapped by libbpf) and `ring_buffer` (ringbuf map mmapped by libbpf), `.bss` read by lookup
//! and by mmap. Each run's summary line must be the kernel's for the same run.

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

mod common;
use common::{tmp, wait_line};

fn server_lib() -> PathBuf {
    common::lib("libuserbpf_syscall_server.so")
}

fn src(name: &str) -> PathBuf {
    common::src("perf", name)
}

struct Built {
    bpf: PathBuf,
    loader: PathBuf,
    target: PathBuf,
}

fn built() -> &'static Built {
    static B: std::sync::OnceLock<Built> = std::sync::OnceLock::new();
    B.get_or_init(|| {
        let dir = tmp().join(format!("perf-{}", std::process::id()));
        Built {
            bpf: userbpf_testutil::compile_bpf(&src("perf_events.bpf.c"), &dir),
            loader: userbpf_testutil::compile_c(&src("perf_loader.c"), &dir.join("perf_loader"), &["-lbpf"]),
            target: userbpf_testutil::compile_c(&src("perf_target.c"), &dir.join("perf_target"), &[]),
        }
    })
}

/// A command for the loader: run directly (the kernel) or served in `session`.
fn loader(args: &[&str], session: Option<&str>) -> Command {
    let b = built();
    let mut c = match session {
        None => Command::new(&b.loader),
        Some(s) => {
            let mut c = Command::new("sh");
            c.arg("-c")
                .arg("USERBPF_LOADER_PID=$$ exec \"$0\" \"$@\"")
                .arg(&b.loader)
                .env("LD_PRELOAD", server_lib())
                .env("USERBPF_SESSION", s)
                .env("USERBPF_SHM_DIR", shm());
            c
        }
    };
    c.arg(&b.bpf).args(args);
    c
}

fn shm() -> PathBuf {
    let d = tmp().join("shm");
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn summary(out: &std::process::Output) -> String {
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "loader failed: {}\n{text}\n{}", out.status, String::from_utf8_lossy(&out.stderr));
    let lines: Vec<&str> = text.lines().filter(|l| l.starts_with("perf=") || l.starts_with("after_detach")).collect();
    assert!(!lines.is_empty(), "no summary in\n{text}");
    lines.join("\n")
}

#[test]
fn uprobes_on_the_loader_itself_feed_perf_buffer_and_ring_buffer() {
    let kernel = summary(&loader(&["self", "10"], None).output().unwrap());
    assert_eq!(
        kernel,
        "perf=10 perf_sum=55 rb=10 rb_sum=55 lost=0 bad=0 hits=10 mmapped_hits=10 expect_sum=55\nafter_detach: hits=10 perf=10 rb=10"
    );
    let user = summary(&loader(&["self", "10"], Some("perf-self")).output().unwrap());
    assert_eq!(user, kernel);
    // The loader's links are gone with it (the session goes with its last member).
    assert!(session_links("perf-self").is_none_or(|n| n == 0));
}

fn session_links(name: &str) -> Option<usize> {
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    let dir = shm().join(format!("userbpf-{uid}-{name}")).join("links");
    Some(std::fs::read_dir(dir).ok()?.flatten().filter(|e| e.path().extension().is_some_and(|x| x == "json")).count())
}

/// A copy of the target binary for one test: the kernel halves of the tests put uprobes on the
/// binary they name, which the kernel plants in every process mapping it, so a test's
/// userbpf half on a shared binary would meet another test's kernel breakpoints.
fn own_target(name: &str) -> PathBuf {
    let copy = built().target.with_file_name(format!("perf_target_{name}"));
    std::fs::copy(&built().target, &copy).unwrap();
    copy
}

/// The target process (`bin`, a copy from [`own_target`]): served sessions get the server
/// library as their agent (what a child of the loader, or `userbpf start`, runs).
fn target(bin: &std::path::Path, session: Option<&str>) -> Child {
    let mut c = Command::new(bin);
    c.arg("10").stdin(Stdio::piped()).stdout(Stdio::piped());
    if let Some(s) = session {
        c.env("LD_PRELOAD", server_lib()).env("USERBPF_SESSION", s).env("USERBPF_SHM_DIR", shm());
    }
    // ETXTBSY: a child another test thread forked while `own_target` had the fresh copy open
    // for writing holds that descriptor until it execs; try again shortly.
    for _ in 0..100 {
        match c.spawn() {
            Err(e) if e.kind() == std::io::ErrorKind::ExecutableFileBusy => {
                std::thread::sleep(std::time::Duration::from_millis(20))
            }
            r => return r.unwrap(),
        }
    }
    c.spawn().unwrap()
}

fn run_with_target(bin: &std::path::Path, session: Option<&str>, target_first: bool) -> String {
    let path = bin.to_str().unwrap().to_string();
    let mut t = None;
    if target_first {
        let mut c = target(bin, session);
        wait_line(&mut BufReader::new(c.stdout.as_mut().unwrap()), "started");
        t = Some(c);
    }
    let mut l = loader(&[&path, "10"], session).stdout(Stdio::piped()).spawn().unwrap();
    let mut lout = BufReader::new(l.stdout.take().unwrap());
    wait_line(&mut lout, "ready");
    let mut t = match t {
        Some(t) => t,
        None => {
            let mut c = target(bin, session);
            wait_line(&mut BufReader::new(c.stdout.as_mut().unwrap()), "started");
            c
        }
    };
    if target_first {
        // The target's agent attaches links made after it started from its watcher thread:
        // give it the time to see them (the loader waits for the samples themselves).
        std::thread::sleep(Duration::from_millis(500));
    }
    t.stdin.as_mut().unwrap().write_all(b"go\n").unwrap();
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut lout, &mut rest).unwrap();
    let status = l.wait().unwrap();
    t.stdin.as_mut().unwrap().write_all(b"bye\n").unwrap();
    t.wait().unwrap();
    assert!(status.success(), "loader failed: {status}\n{rest}");
    rest.lines().find(|l| l.starts_with("perf=")).unwrap_or_else(|| panic!("no summary in\n{rest}")).to_string()
}

#[test]
fn a_target_started_after_the_loader_runs_its_programs() {
    let bin = own_target("after");
    let kernel = run_with_target(&bin, None, false);
    assert_eq!(kernel, "perf=10 perf_sum=55 rb=10 rb_sum=55 lost=0 bad=0 hits=10 mmapped_hits=10 expect_sum=55");
    assert_eq!(run_with_target(&bin, Some("perf-after"), false), kernel);
}

#[test]
fn a_target_started_before_the_loader_runs_its_programs() {
    let bin = own_target("before");
    let kernel = run_with_target(&bin, None, true);
    assert_eq!(run_with_target(&bin, Some("perf-before"), true), kernel);
}

/// A steady stream of samples (a call every 100 µs in the target, its programs writing to a
/// perf buffer and a ring buffer) read by libbpf's own poll loops: the server's watcher
/// threads linger between the loader's polls, so the target's programs make (almost) no
/// FUTEX_WAKE call; before lingering, most samples made one (main's server of 2026-11-26
/// 01:33: 1,981 for 2,000 perf samples).
/// The counts are the writers' own, in the map files (`struct PerfMeta` at 128 in a perf event
/// array's file, magic then the count at +136; a ring buffer's, map type 27 at 12 in the
/// header, `struct RbMeta` at 128 with the count at +200). The bound leaves room for a machine so busy that the stream stops for
/// 20 ms now and then.
#[test]
fn a_steady_stream_through_the_server_makes_no_wakeups() {
    const N: u64 = 2000;
    let session = "perf-stream";
    let copy = own_target("stream");
    let path = copy.to_str().unwrap().to_string();
    let mut l = loader(&[&path, &N.to_string()], Some(session)).stdout(Stdio::piped()).spawn().unwrap();
    let mut lout = BufReader::new(l.stdout.take().unwrap());
    wait_line(&mut lout, "ready");
    let mut t = Command::new(&copy);
    t.args([&N.to_string(), "100"]).stdin(Stdio::piped()).stdout(Stdio::piped());
    t.env("LD_PRELOAD", server_lib()).env("USERBPF_SESSION", session).env("USERBPF_SHM_DIR", shm());
    let mut t = t.spawn().unwrap();
    wait_line(&mut BufReader::new(t.stdout.as_mut().unwrap()), "started");
    t.stdin.as_mut().unwrap().write_all(b"go\n").unwrap();
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut lout, &mut rest).unwrap();
    let status = l.wait().unwrap();
    // The target still holds the maps: read their counters before it leaves.
    // SAFETY: getuid has no preconditions.
    let maps = shm().join(format!("userbpf-{}-{session}", unsafe { libc::getuid() })).join("maps");
    let (mut perf, mut ring) = (Vec::new(), Vec::new());
    for e in std::fs::read_dir(&maps).unwrap().flatten() {
        // Only the map files (maps/ID): ID.poll is a FIFO.
        if !e.file_type().is_ok_and(|t| t.is_file()) || e.path().extension().is_some() {
            continue;
        }
        let Ok(bytes) = std::fs::read(e.path()) else { continue };
        let Some(head) = bytes.get(..336) else { continue };
        let u64_at = |o: usize| u64::from_ne_bytes(head[o..o + 8].try_into().unwrap());
        if &head[128..136] == b"UBPFPE\x01\0" {
            perf.push(u64_at(264));
        } else if u32::from_ne_bytes(head[12..16].try_into().unwrap()) == 27 {
            ring.push(u64_at(328));
        }
    }
    t.stdin.as_mut().unwrap().write_all(b"bye\n").unwrap();
    t.wait().unwrap();
    assert!(status.success(), "loader failed: {status}\n{rest}");
    let want = format!("perf={N} perf_sum={s} rb={N} rb_sum={s} lost=0 bad=0", s = N * (N + 1) / 2);
    assert!(rest.lines().any(|l| l.starts_with(&want)), "want {want} in\n{rest}");
    assert_eq!((perf.len(), ring.len()), (1, 1), "one perf event array and one ring buffer in {}", maps.display());
    assert!(perf[0] <= N / 20, "{} FUTEX_WAKE calls for {N} perf samples", perf[0]);
    assert!(ring[0] <= N / 20, "{} FUTEX_WAKE calls for {N} ring buffer records", ring[0]);
}

/// A system call tracepoint attached by libbpf runs in the loader (only the loader's own
/// calls are counted, by pid), and a CPU clock event runs a `perf_event` program until its
/// link is destroyed.
#[test]
fn syscall_tracepoints_and_cpu_clock_events() {
    let kernel = summary_tp(&loader(&["tp", "0"], None).output().unwrap());
    assert_eq!(kernel, "tp=7 ticked=1 stopped=1");
    assert_eq!(summary_tp(&loader(&["tp", "0"], Some("perf-tp")).output().unwrap()), kernel);
}

fn summary_tp(out: &std::process::Output) -> String {
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "loader failed: {}\n{text}\n{}", out.status, String::from_utf8_lossy(&out.stderr));
    text.lines().find(|l| l.starts_with("tp=")).unwrap_or_else(|| panic!("no summary in\n{text}")).to_string()
}

/// libbpf's `bpf_program__attach_usdt` on a semaphore-guarded probe of a running target:
/// libbpf opens uprobe events with the semaphore as `ref_ctr_offset`; the probe must fire
/// (semaphore raised while attached), the program must read its argument through libbpf's
/// spec map and cookie, and the semaphore must be back to 0 after the link is destroyed.
#[test]
fn usdt_semaphores_are_raised_while_attached() {
    assert_eq!(run_usdt(None), "fired=10 | fired=10 sum=55 | detached | semaphore=0");
    assert_eq!(run_usdt(Some("perf-usdt")), "fired=10 | fired=10 sum=55 | detached | semaphore=0");
}

fn run_usdt(session: Option<&str>) -> String {
    let dir = tmp().join(format!("perf-usdt-{}", std::process::id()));
    let bpf = userbpf_testutil::compile_bpf(&src("perf_usdt.bpf.c"), &dir);
    let ldr = userbpf_testutil::compile_c(&src("perf_usdt_loader.c"), &dir.join("perf_usdt_loader"), &["-lbpf"]);
    let tgt = userbpf_testutil::compile_c(&src("perf_usdt_target.c"), &dir.join("perf_usdt_target"), &[]);
    let mut t = Command::new(&tgt);
    t.arg("10").stdin(Stdio::piped()).stdout(Stdio::piped());
    let mut l = match session {
        None => Command::new(&ldr),
        Some(s) => {
            t.env("LD_PRELOAD", server_lib()).env("USERBPF_SESSION", s).env("USERBPF_SHM_DIR", shm());
            let mut c = Command::new("sh");
            c.arg("-c")
                .arg("USERBPF_LOADER_PID=$$ exec \"$0\" \"$@\"")
                .arg(&ldr)
                .env("LD_PRELOAD", server_lib())
                .env("USERBPF_SESSION", s)
                .env("USERBPF_SHM_DIR", shm());
            c
        }
    };
    let mut t = t.spawn().unwrap();
    let mut tout = BufReader::new(t.stdout.take().unwrap());
    wait_line(&mut tout, "started");
    let mut l = l.arg(&bpf).arg(&tgt).stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
    let mut lout = BufReader::new(l.stdout.take().unwrap());
    wait_line(&mut lout, "ready");
    if session.is_some() {
        // The running target's agent attaches the new link from its watcher thread.
        std::thread::sleep(Duration::from_millis(500));
    }
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
