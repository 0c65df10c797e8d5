//! `userbpf tool iolatency` on a loop device with direct I/O: every request of the command is
//! attributed to the user function that issued it (dd's libc `write`, fio's `td_io_queue`,
//! the outermost probed function), and the kernel's totals count the same requests.

mod common;

use std::path::PathBuf;
use std::process::Command;

use common::{repo, tmp, userbpf};
use userbpf_testutil::counted;

/// A loop device over a file of the test's own, with direct I/O; detached when dropped.
struct Loop(String);

impl Loop {
    fn new(name: &str) -> Loop {
        let img = tmp().join(format!("iolatency-{name}.img"));
        std::fs::create_dir_all(tmp()).unwrap();
        let f = std::fs::File::create(&img).unwrap();
        f.set_len(16 << 20).unwrap();
        let out = Command::new("losetup").args(["--direct-io=on", "-f", "--show"]).arg(&img).output().unwrap();
        assert!(out.status.success(), "losetup: {}", String::from_utf8_lossy(&out.stderr));
        Loop(String::from_utf8_lossy(&out.stdout).trim().to_string())
    }
    fn name(&self) -> &str {
        self.0.trim_start_matches("/dev/")
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = Command::new("losetup").args(["-d", &self.0]).status();
    }
}

fn ok() -> bool {
    // SAFETY: geteuid has no arguments and cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    let have = |c: &str| {
        Command::new("sh").args(["-c", &format!("command -v {c}")]).output().is_ok_and(|o| o.status.success())
    };
    userbpf_testutil::require(
        root && have("losetup") && have("fio") && std::path::Path::new("/sys/kernel/tracing/events/block").exists(),
        "root, losetup, fio and the block tracepoints",
    )
}

/// The tool's object, built from examples/bpf/iolatency.bpf.c.
fn tools_dir() -> PathBuf {
    static ONCE: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    ONCE.get_or_init(|| {
        let dir = tmp().join("iolatency-objects");
        userbpf_testutil::compile_bpf(&repo("examples/bpf/iolatency.bpf.c"), &dir);
        dir
    })
    .clone()
}

/// The tool's output and the kernel's skipped runs it reported ([`userbpf_testutil::kernel_skipped`]).
fn iolatency(args: &[&str]) -> (String, u64) {
    let out = Command::new(userbpf())
        .arg("tool")
        .arg("iolatency")
        .args(args)
        .env("USERBPF_TOOLS_DIR", tools_dir())
        .env("USERBPF_SHM_DIR", tmp())
        .output()
        .unwrap();
    let (so, se) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "iolatency {args:?}: {so}\n{se}");
    (so.into_owned(), userbpf_testutil::kernel_skipped(&se))
}

/// `(who, disk, op) -> requests` from the histogram headers, and each histogram's bucket sum
/// equal to its header's count.
fn totals(out: &str) -> Vec<(String, String, String, u64)> {
    let mut v = Vec::new();
    let mut lines = out.lines().peekable();
    while let Some(l) = lines.next() {
        let Some((head, n)) = l.rsplit_once(": ") else { continue };
        let Some(n) = n.strip_suffix(" requests").and_then(|n| n.parse::<u64>().ok()) else { continue };
        let parts: Vec<&str> = head.split(", ").collect();
        let (who, disk, op) = (parts[0], parts[1].trim_start_matches("disk = "), parts[2].trim_start_matches("op = "));
        lines.next(); // the units line
        let mut sum = 0;
        while let Some(b) = lines.peek().filter(|b| b.contains(" -> ")) {
            sum += b.split(':').nth(1).unwrap().split_whitespace().next().unwrap().parse::<u64>().unwrap();
            lines.next();
        }
        assert_eq!(sum, n, "{head}: {out}");
        v.push((who.to_string(), disk.to_string(), op.to_string(), n));
    }
    v
}

fn count(t: &[(String, String, String, u64)], who: &str, disk: &str, op: &str) -> Option<u64> {
    t.iter().find(|(w, d, o, _)| w == who && d == disk && o == op).map(|x| x.3)
}

#[test]
fn dd_writes_are_libc_writes_and_fio_ios_are_td_io_queue() {
    if !ok() {
        return;
    }
    let dev = Loop::new("dd");
    let of = format!("of={}", dev.0);
    let (out, skipped) =
        iolatency(&["--", "dd", "if=/dev/zero", &of, "bs=4k", "count=300", "oflag=direct", "status=none"]);
    let t = totals(&out);
    let got = |who: &str, want: u64| counted(count(&t, who, dev.name(), "write"), want, skipped);
    assert!(got("function libc:write", 300), "{out}");
    assert!(got("all requests (the kernel's totals)", 300), "{out}");

    // fio's psync engine: td_io_queue calls pwrite64; the outer function keeps the requests.
    let filename = format!("--filename={}", dev.0);
    let fio = [
        "fio",
        "--name=t",
        filename.as_str(),
        "--direct=1",
        "--rw=randwrite",
        "--bs=4k",
        "--size=1m",
        "--ioengine=psync",
        "--output=/dev/null",
    ];
    let (out, skipped) = iolatency(&[&["--"][..], &fio[..]].concat());
    let t = totals(&out);
    let got = |who: &str, want: u64| counted(count(&t, who, dev.name(), "write"), want, skipped);
    assert!(got("function fio:td_io_queue", 256), "{out}");
    assert_eq!(count(&t, "function libc:pwrite64", dev.name(), "write"), None, "{out}");
    assert!(got("all requests (the kernel's totals)", 256), "{out}");

    // -f picks the functions: only pwrite64 now.
    let (out, skipped) = iolatency(&[&["-f", "c:pwrite64", "--"][..], &fio[..]].concat());
    let t = totals(&out);
    assert!(counted(count(&t, "function c:pwrite64", dev.name(), "write"), 256, skipped), "{out}");
}

/// A bio larger than the device takes is split into several requests (here 1 MiB writes on a
/// loop device taking 64 KiB a request: 16 each); every one of them keeps the write's function
/// and operation (block_split hands them on), none counts as an unattributed "other".
#[test]
fn the_requests_of_a_split_bio_keep_its_function() {
    if !ok() {
        return;
    }
    let dev = Loop::new("split");
    // Put back when the test ends (the device is reused by others, and may keep its limits).
    struct Limit(String, String);
    impl Drop for Limit {
        fn drop(&mut self) {
            let _ = std::fs::write(&self.0, &self.1);
        }
    }
    let path = format!("/sys/block/{}/queue/max_sectors_kb", dev.name());
    let _limit = Limit(path.clone(), std::fs::read_to_string(&path).unwrap());
    std::fs::write(&path, "64").unwrap();
    let of = format!("of={}", dev.0);
    let (out, skipped) =
        iolatency(&["--", "dd", "if=/dev/zero", &of, "bs=1M", "count=8", "oflag=direct", "status=none"]);
    let t = totals(&out);
    let got = |who: &str, op: &str| count(&t, who, dev.name(), op);
    assert!(counted(got("function libc:write", "write"), 128, skipped), "{out}");
    assert!(counted(got("all requests (the kernel's totals)", "write"), 128, skipped), "{out}");
    assert_eq!(got("all requests (the kernel's totals)", "other"), None, "{out}");
}
