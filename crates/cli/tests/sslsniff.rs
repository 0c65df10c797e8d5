//! BCC's `sslsniff-bpfcc` (Debian's bpfcc-tools, unchanged) through `userbpf load` captures
//! what it captures through the kernel: nginx, on a private copy of libssl, serves a fixed set
//! of HTTPS requests made by curl, once with sslsniff on the kernel's uprobes and once through
//! `userbpf load` with nginx under `userbpf start`; the SSL_read and SSL_write events and bytes
//! sslsniff printed must be equal in both and equal to what nginx's access log says it read and
//! wrote, with no sample lost. This is the capture check of bench/sslsniff/bench.py (one
//! implementation of the set-up: nginx, the library copy, the canary that tells when the tool
//! has attached, BCC_KERNEL_SOURCE), run alone; not timed.

use std::path::Path;
use std::process::Command;

mod common;
use common::{repo, tmp, userbpf};

#[test]
fn sslsniff_captures_the_same_bytes_as_on_the_kernel() {
    let tools = ["/usr/sbin/nginx", "/usr/sbin/sslsniff-bpfcc", "/usr/bin/curl", "/usr/bin/wrk", "/usr/bin/openssl"];
    let missing: Vec<&str> = tools.iter().copied().filter(|t| !Path::new(t).exists()).collect();
    if !userbpf_testutil::require(missing.is_empty(), &format!("{} (Debian's packages)", missing.join(", "))) {
        return;
    }
    let headers = std::env::var_os("BCC_KERNEL_SOURCE").is_some()
        || std::fs::read_dir("/usr/src")
            .map(|d| d.flatten().any(|e| e.file_name().to_string_lossy().ends_with("-amd64")))
            .unwrap_or(false);
    if !userbpf_testutil::require(headers, "kernel headers for BCC (linux-headers-amd64, or BCC_KERNEL_SOURCE)") {
        return;
    }
    // SAFETY: geteuid has no preconditions.
    if !userbpf_testutil::require(unsafe { libc::geteuid() } == 0, "root (kernel uprobes for the reference run)") {
        return;
    }
    let out = Command::new("python3")
        .arg(repo("bench/sslsniff/bench.py"))
        .env("SBENCH_ONLY", "check")
        .env("SBENCH_DIR", tmp().join("sslsniff"))
        .env("USERBPF", userbpf())
        .output()
        .unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "the capture check failed:\n{stdout}\n{stderr}");
    // The two rows: kernel, then userbpf; their counts (everything after the label) are equal.
    let rows: Vec<&str> =
        stdout.lines().filter(|l| l.starts_with("| sslsniff-bpfcc") && !l.contains("SSL_read events")).collect();
    assert_eq!(rows.len(), 2, "{stdout}");
    let counts = |row: &str| row.split_once(" | ").map(|(_, rest)| rest.to_string()).unwrap();
    assert_eq!(counts(rows[0]), counts(rows[1]), "{stdout}");
    assert!(stdout.contains("- equal: "), "{stdout}");
}
