//! The redis hot patch (examples/bpf/redis-fsync.bpf.c) end to end, on Debian's redis
//! (installed by `make test`): redis-server with `appendfsync always` under `userbpf run`, its
//! AOF fdatasyncs handed to io_uring with group commit (bpf_override_return skips libc's
//! fdatasync; replies held while the previous fdatasync runs); several clients write distinct
//! keys concurrently while the kernel watches redis on tracepoints (bpftrace): no fdatasync
//! system call, one io_uring fsync in flight at a time, and no reply sent while an AOF write
//! is not yet covered by a submitted fsync (the durability rule). Then a clean SHUTDOWN; a
//! plain redis-server started on the same directory must hold every acknowledged write.

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

/// A kernel bpftrace script watching redis `pid` (its AOF on descriptor `aof`): prints `ready`
/// once attached, and at exit its fdatasync system calls, the io_uring fsyncs submitted, those
/// submitted while another was in flight (`overlapping`), its AOF writes, the writes of its
/// main thread to other descriptors above 2 (`replies`: to clients' sockets), and those made
/// while an AOF write was not yet covered by a submitted fsync (`early`).
fn durability_script(pid: i32, aof: i32) -> String {
    format!(
        r#"BEGIN {{ printf("ready\n"); }}
tracepoint:syscalls:sys_enter_fdatasync /pid == {pid}/ {{ @fdatasync = @fdatasync + 1; }}
tracepoint:syscalls:sys_enter_write /tid == {pid} && args->fd == {aof}/ {{ @dirty = 1; @aof_writes = @aof_writes + 1; }}
tracepoint:syscalls:sys_enter_write /tid == {pid} && args->fd > 2 && args->fd != {aof}/ {{
  @replies = @replies + 1; if (@dirty) {{ @early = @early + 1; }}
}}
tracepoint:syscalls:sys_enter_writev /tid == {pid} && args->fd > 2 && args->fd != {aof}/ {{
  @replies = @replies + 1; if (@dirty) {{ @early = @early + 1; }}
}}
tracepoint:io_uring:io_uring_submit_req /pid == {pid} && args->opcode == 3/ {{
  if (@in_flight) {{ @overlapping = @overlapping + 1; }}
  @in_flight = 1; @dirty = 0; @submitted = @submitted + 1;
}}
tracepoint:io_uring:io_uring_complete /pid == {pid}/ {{ @in_flight = 0; }}
END {{
  printf("fdatasync=%d submitted=%d overlapping=%d aof_writes=%d replies=%d early=%d\n",
    @fdatasync, @submitted, @overlapping, @aof_writes, @replies, @early);
  clear(@fdatasync); clear(@submitted); clear(@overlapping); clear(@aof_writes); clear(@replies);
  clear(@early); clear(@dirty); clear(@in_flight);
}}"#
    )
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

/// CLIENTS concurrent clients, each writing KEYS keys `PREFIX{client}:{i}` one request at a
/// time: every reply is an acknowledgement. The number each got.
fn write_keys(sock: &Path, prefix: &str) -> Vec<usize> {
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..CLIENTS)
            .map(|c| {
                s.spawn(move || {
                    let input: String =
                        (0..KEYS).map(|i| format!("SET {prefix}{c}:{i} v{c}:{i}:{}\n", i * 7919 % 10007)).collect();
                    cli(sock, &[], &input).lines().filter(|l| *l == "OK").count()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// redis under `userbpf run [EXTRA] redis-fsync.bpf.o`, written to by concurrent clients,
/// shut down cleanly, then replayed by a plain redis.
fn patched_redis(tag: &str, extra: &[&str]) {
    if !userbpf_testutil::require(
        have("redis-server") && have("redis-cli") && have("bpftrace"),
        "redis-server and redis-cli (Debian's redis-server, redis-tools), bpftrace",
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

    // The kernel watches redis meanwhile (bpftrace on tracepoints): its fdatasync system
    // calls, the io_uring fsyncs it submits and completes, its AOF writes and its replies.
    let info = cli(&sock, &["info", "server"], "");
    let pid: i32 = info
        .lines()
        .find_map(|l| l.trim().strip_prefix("process_id:"))
        .unwrap_or_else(|| panic!("no process_id in INFO: {info}"))
        .parse()
        .unwrap();
    let aof_fd = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .flatten()
        .find(|e| std::fs::read_link(e.path()).is_ok_and(|l| l.to_string_lossy().ends_with(".incr.aof")))
        .unwrap_or_else(|| panic!("redis {pid} has no incr AOF open"))
        .file_name()
        .to_string_lossy()
        .parse::<i32>()
        .unwrap();
    let mut watch = Proc::spawn("bpftrace", {
        let mut c = Command::new("bpftrace");
        c.args(["-e", &durability_script(pid, aof_fd)]);
        c
    });
    watch.wait_for("ready", "bpftrace attached");

    // Concurrent clients, each writing its own keys one request at a time: every reply is an
    // acknowledgement.
    let acks = write_keys(&sock, "k");
    assert_eq!(acks, vec![KEYS; CLIENTS], "every SET acknowledged");
    common::interrupt(&mut watch);
    watch.wait_exit("bpftrace");
    let seen = watch.stdout();
    let count = |name: &str| -> u64 {
        let key = format!("{name}=");
        let at = seen.find(&key).unwrap_or_else(|| panic!("bpftrace printed no {name}: {seen}")) + key.len();
        seen[at..].split(|c: char| !c.is_ascii_digit()).next().unwrap().parse().unwrap()
    };
    // libc's fdatasync never ran: bpf_override_return skipped it; io_uring did the work.
    assert_eq!(count("fdatasync"), 0, "fdatasync system calls while clients wrote\n{seen}");
    assert!(count("submitted") >= 10, "io_uring fsyncs\n{seen}");
    assert!(count("aof_writes") >= count("submitted"), "{seen}");
    assert!(count("replies") >= (CLIENTS * KEYS) as u64, "{seen}");
    // The durability rule, as the kernel saw it: one fsync in flight at a time, and no reply
    // while an AOF write is not yet covered by a submitted fsync.
    assert_eq!(count("overlapping"), 0, "an fsync submitted while another was in flight\n{seen}");
    assert_eq!(count("early"), 0, "replies sent before their AOF write's fsync was submitted\n{seen}");

    // More writes while redis rewrites its AOF again and again (BGREWRITEAOF: a new AOF
    // descriptor each time, the old one fsynced and closed by a redis thread), which the
    // example drains before: nothing fails, nothing acknowledged is lost.
    let stop = std::sync::atomic::AtomicBool::new(false);
    let (acks, rewrites) = std::thread::scope(|s| {
        let rewriter = s.spawn(|| {
            let mut started = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                started += cli(&sock, &["bgrewriteaof"], "").contains("started") as usize;
                std::thread::sleep(Duration::from_millis(50));
            }
            started
        });
        let acks = write_keys(&sock, "r");
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        (acks, rewriter.join().unwrap())
    });
    assert_eq!(acks, vec![KEYS; CLIENTS], "every SET acknowledged during the rewrites");
    assert!(rewrites > 0, "no AOF rewrite started");

    // A clean shutdown: redis flushes and fsyncs its AOF, exits; `run` prints the counters.
    cli(&sock, &["shutdown"], "");
    let status = server.wait_exit("redis SHUTDOWN");
    let (out, err) = (server.stdout(), server.stderr());
    assert!(status.success(), "userbpf run failed: {status:?}\n{out}\n{err}");
    assert!(!err.contains("userbpf-agent:"), "no attach error: {err}");
    let (patched, failed, fallback) = (counter(&out, "patched"), counter(&out, "failed"), counter(&out, "fallback"));
    // The AOF fdatasyncs went through io_uring, none failed; those that found the previous one
    // still in flight held their replies instead of waiting.
    assert!(patched >= 10, "fdatasyncs handed to io_uring: {patched}\n{out}");
    assert_eq!((failed, fallback), (0, 0), "{out}");
    assert!(counter(&out, "deferred") > 0, "no fdatasync found the previous one in flight: the hold never ran\n{out}");

    // A plain redis on the same directory replays the AOF: every acknowledged write is there.
    let mut cmd = Command::new("redis-server");
    cmd.args(redis_args(&dir, &sock));
    let mut plain = Proc::spawn("redis-server", cmd);
    wait_ready(&sock, &mut plain);
    assert_eq!(cli(&sock, &["dbsize"], "").trim(), (2 * CLIENTS * KEYS).to_string());
    for (c, p) in (0..CLIENTS).flat_map(|c| [(c, "k"), (c, "r")]) {
        let input: String = (0..KEYS).map(|i| format!("GET {p}{c}:{i}\n")).collect();
        let got: Vec<String> = cli(&sock, &[], &input).lines().map(String::from).collect();
        let want: Vec<String> = (0..KEYS).map(|i| format!("v{c}:{i}:{}", i * 7919 % 10007)).collect();
        assert_eq!(got, want, "client {c}'s keys {p}* after replaying the AOF");
    }
    cli(&sock, &["shutdown", "nosave"], "");
    plain.wait_exit("plain redis SHUTDOWN");
    let _ = std::fs::remove_dir_all(&dir);
}
