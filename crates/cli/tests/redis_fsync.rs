//! The redis hot patch (examples/bpf/redis-fsync.bpf.c) end to end, on Debian's redis
//! (installed by `make test`): redis-server with `appendfsync always` under `userbpf run`, its
//! AOF fdatasyncs handed to io_uring with group commit (bpf_override_return skips libc's
//! fdatasync); several clients write distinct keys concurrently (redis makes no fdatasync
//! system call meanwhile, as the kernel counts them: `perf stat` on its tracepoint), then a
//! clean SHUTDOWN; a plain redis-server started on the same directory must then hold every
//! acknowledged write.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::{Proc, agent, repo, tmp, userbpf};

const CLIENTS: usize = 4;
const KEYS: usize = 1500;

fn object() -> PathBuf {
    userbpf_testutil::compile_bpf(&repo("examples/bpf/redis-fsync.bpf.c"), &tmp().join("bpf/redis"))
}

fn have(cmd: &str) -> bool {
    Command::new(cmd).arg("--version").output().is_ok_and(|o| o.status.success())
}

/// redis-cli on the unix socket, with `args`, feeding `input` on stdin; its stdout.
fn cli(sock: &Path, args: &[&str], input: &str) -> String {
    let mut child = Command::new("redis-cli")
        .arg("-s")
        .arg(sock)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("redis-cli");
    let mut stdin = child.stdin.take().unwrap();
    let input = input.to_string();
    let feeder = std::thread::spawn(move || {
        let _ = stdin.write_all(input.as_bytes());
    });
    let out = child.wait_with_output().unwrap();
    feeder.join().unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Shuts down whatever redis listens on the socket when dropped: a failing test kills
/// `userbpf run`, and its redis-server child would be left running.
struct ShutdownOnDrop(PathBuf);

impl Drop for ShutdownOnDrop {
    fn drop(&mut self) {
        if self.0.exists() {
            let _ = Command::new("redis-cli").arg("-s").arg(&self.0).args(["shutdown", "nosave"]).output();
        }
    }
}

/// Waits until redis answers PING on `sock`.
fn wait_ready(sock: &Path, server: &mut Proc) {
    let start = Instant::now();
    loop {
        if sock.exists() && cli(sock, &["ping"], "").trim() == "PONG" {
            return;
        }
        assert!(!server.exited(), "redis exited before answering\n{}\n{}", server.stdout(), server.stderr());
        assert!(start.elapsed() < common::STEP, "redis did not answer\n{}\n{}", server.stdout(), server.stderr());
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn redis_args(dir: &Path, sock: &Path) -> Vec<String> {
    [
        "--port",
        "0",
        "--unixsocket",
        sock.to_str().unwrap(),
        "--dir",
        dir.to_str().unwrap(),
        "--appendonly",
        "yes",
        "--appendfsync",
        "always",
        "--save",
        "",
        "--daemonize",
        "no",
        "--logfile",
        "",
    ]
    .map(String::from)
    .to_vec()
}

/// The value `userbpf run` printed for a global counter (`.name = N` in the .bss dump).
fn counter(out: &str, name: &str) -> u64 {
    let key = format!(".{name} = ");
    let at = out.find(&key).unwrap_or_else(|| panic!("{name} not printed: {out}")) + key.len();
    out[at..].split(|c: char| !c.is_ascii_digit()).next().unwrap().parse().unwrap()
}

#[test]
fn aof_holds_every_acknowledged_write_after_a_clean_shutdown() {
    patched_redis("jit", &[]);
}

#[test]
fn aof_holds_every_acknowledged_write_after_a_clean_shutdown_interpreter() {
    patched_redis("interp", &["--interpreter"]);
}

/// redis under `userbpf run [EXTRA] redis-fsync.bpf.o`, written to by concurrent clients,
/// shut down cleanly, then replayed by a plain redis.
fn patched_redis(tag: &str, extra: &[&str]) {
    if !userbpf_testutil::require(
        have("redis-server") && have("redis-cli") && have("perf"),
        "redis-server and redis-cli (Debian's redis-server, redis-tools), perf (linux-perf)",
    ) {
        return;
    }
    let dir = tmp().join(format!("redis-fsync-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    // In /tmp: a socket's path must fit in 108 bytes, wherever the build directory is.
    let sock = std::env::temp_dir().join(format!("userbpf-redis-{tag}-{}.sock", std::process::id()));
    let _cleanup = ShutdownOnDrop(sock.clone());

    let mut cmd = Command::new(userbpf());
    cmd.env("USERBPF_AGENT", agent())
        .env("USERBPF_SHM_DIR", tmp())
        .arg("run")
        .args(extra)
        .arg(object())
        .arg("--")
        .arg("redis-server")
        .args(redis_args(&dir, &sock));
    let mut server = Proc::spawn("userbpf run redis-server", cmd);
    wait_ready(&sock, &mut server);

    // The kernel counts redis's own fdatasync and io_uring_enter system calls meanwhile.
    let info = cli(&sock, &["info", "server"], "");
    let pid = info
        .lines()
        .find_map(|l| l.trim().strip_prefix("process_id:"))
        .unwrap_or_else(|| panic!("no process_id in INFO: {info}"))
        .to_string();
    let perf = Command::new("perf")
        .args(["stat", "-x,", "-e", "syscalls:sys_enter_fdatasync", "-e", "syscalls:sys_enter_io_uring_enter", "-p"])
        .arg(&pid)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("perf");
    // perf is counting once it holds both events for every thread of redis.
    let threads = std::fs::read_dir(format!("/proc/{pid}/task")).unwrap().count();
    let start = Instant::now();
    loop {
        let events = std::fs::read_dir(format!("/proc/{}/fd", perf.id()))
            .map(|d| {
                d.flatten()
                    .filter(|e| std::fs::read_link(e.path()).is_ok_and(|l| l.to_string_lossy().contains("perf_event")))
                    .count()
            })
            .unwrap_or(0);
        if events >= 2 * threads {
            break;
        }
        assert!(start.elapsed() < common::STEP, "perf did not attach to redis ({events} events, {threads} threads)");
        std::thread::sleep(Duration::from_millis(20));
    }

    // Concurrent clients, each writing its own keys one request at a time: every reply is an
    // acknowledgement redis gave after its AOF fdatasync returned.
    let acks: Vec<usize> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..CLIENTS)
            .map(|c| {
                let sock = sock.clone();
                s.spawn(move || {
                    let input: String =
                        (0..KEYS).map(|i| format!("SET k{c}:{i} v{c}:{i}:{}\n", i * 7919 % 10007)).collect();
                    cli(&sock, &[], &input).lines().filter(|l| *l == "OK").count()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(acks, vec![KEYS; CLIENTS], "every SET acknowledged");
    // SAFETY: kill(2) on perf, our child, not yet reaped.
    unsafe { libc::kill(perf.id() as i32, libc::SIGINT) };
    let perf = perf.wait_with_output().unwrap();
    let counts = String::from_utf8_lossy(&perf.stderr).into_owned();
    let syscalls = |event: &str| -> u64 {
        let line = counts.lines().find(|l| l.contains(event)).unwrap_or_else(|| panic!("perf: no {event}: {counts}"));
        line.split(',').next().unwrap().parse().unwrap_or_else(|_| panic!("perf: {line}"))
    };
    // libc's fdatasync never ran: bpf_override_return skipped it; io_uring did the work.
    assert_eq!(syscalls("sys_enter_fdatasync"), 0, "fdatasync system calls while clients wrote\n{counts}");
    assert!(syscalls("sys_enter_io_uring_enter") > 0, "io_uring_enter system calls\n{counts}");

    // A clean shutdown: redis flushes and fsyncs its AOF, exits; `run` prints the counters.
    cli(&sock, &["shutdown"], "");
    let status = server.wait_exit("redis SHUTDOWN");
    let (out, err) = (server.stdout(), server.stderr());
    assert!(status.success(), "userbpf run failed: {status:?}\n{out}\n{err}");
    assert!(!err.contains("userbpf-agent:"), "no attach error: {err}");
    let (patched, failed, fallback) = (counter(&out, "patched"), counter(&out, "failed"), counter(&out, "fallback"));
    // At least one AOF fdatasync per event-loop batch went through io_uring, none failed.
    assert!(patched >= 10, "fdatasyncs handed to io_uring: {patched}\n{out}");
    assert_eq!((failed, fallback), (0, 0), "{out}");
    assert!(counter(&out, "waited") >= patched - 1, "each waited for the previous one\n{out}");

    // A plain redis on the same directory replays the AOF: every acknowledged write is there.
    let mut cmd = Command::new("redis-server");
    cmd.args(redis_args(&dir, &sock));
    let mut plain = Proc::spawn("redis-server", cmd);
    wait_ready(&sock, &mut plain);
    assert_eq!(cli(&sock, &["dbsize"], "").trim(), (CLIENTS * KEYS).to_string());
    for c in 0..CLIENTS {
        let input: String = (0..KEYS).map(|i| format!("GET k{c}:{i}\n")).collect();
        let got: Vec<String> = cli(&sock, &[], &input).lines().map(String::from).collect();
        let want: Vec<String> = (0..KEYS).map(|i| format!("v{c}:{i}:{}", i * 7919 % 10007)).collect();
        assert_eq!(got, want, "client {c}'s keys after replaying the AOF");
    }
    cli(&sock, &["shutdown", "nosave"], "");
    plain.wait_exit("plain redis SHUTDOWN");
    let _ = std::fs::remove_dir_all(&dir);
}
