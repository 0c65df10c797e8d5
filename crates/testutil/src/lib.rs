//! Test support shared by the crates' tests: compiling eBPF C sources with clang at test
//! time, into the build directory (objects are never committed), and the rule for tests
//! whose tool, privilege or data is missing ([`require`]: they fail, unless told to skip).

use std::path::{Path, PathBuf};
use std::process::Command;

/// Environment variable: `1` lets tests whose requirement (a tool, a privilege, the kernel's
/// BTF, the shared conformance suite) is missing pass with a `SKIPPED` line on stderr, on a
/// machine that cannot give it. Unset, as under `make test` (which installs and sets up what
/// the tests need) and in CI, a missing requirement fails the test.
pub const ALLOW_SKIP_ENV: &str = "USERBPF_ALLOW_SKIP";

/// Whether a test's requirement is met: `true` if `ok`. Otherwise the test fails, naming
/// `what` is missing, unless [`ALLOW_SKIP_ENV`] is `1`: then it prints what was skipped and
/// returns `false` (the caller returns without testing).
///
/// # Panics
/// When `ok` is false and skipping was not asked for.
pub fn require(ok: bool, what: &str) -> bool {
    if ok {
        return true;
    }
    if std::env::var(ALLOW_SKIP_ENV).is_ok_and(|v| v == "1") {
        eprintln!("SKIPPED ({ALLOW_SKIP_ENV}=1): {what}");
        return false;
    }
    panic!("missing: {what} (`make test` installs and sets up what the tests need; {ALLOW_SKIP_ENV}=1 skips such tests on a machine that cannot have it)");
}

/// clang flags for eBPF objects, as libbpf programs are built (x86-64 register layout).
pub const BPF_CFLAGS: [&str; 7] = ["-target", "bpf", "-g", "-O2", "-c", "-D__TARGET_ARCH_x86", "-I/usr/include/x86_64-linux-gnu"];

/// Compiles `src` into `out_dir` (created if needed); returns the object's path.
///
/// # Panics
/// If clang is missing or fails: tests need it (`make test` installs it).
pub fn compile_bpf(src: &Path, out_dir: &Path) -> PathBuf {
    std::fs::create_dir_all(out_dir).unwrap_or_else(|e| panic!("creating {}: {e}", out_dir.display()));
    let stem = src.file_name().and_then(|n| n.to_str()).and_then(|n| n.strip_suffix(".c")).unwrap_or("prog");
    let out = out_dir.join(format!("{stem}.o"));
    let status = Command::new("clang")
        .args(BPF_CFLAGS)
        .arg("-o")
        .arg(&out)
        .arg(src)
        .status()
        .unwrap_or_else(|e| panic!("running clang ({e}): run `make test`, which installs clang and libbpf-dev"));
    assert!(status.success(), "clang failed on {}", src.display());
    out
}

/// Compiles a C program (a target to trace) with frame pointers and debug info.
///
/// # Panics
/// If cc is missing or fails.
pub fn compile_c(src: &Path, out: &Path, extra: &[&str]) -> PathBuf {
    if let Some(d) = out.parent() {
        std::fs::create_dir_all(d).unwrap_or_else(|e| panic!("creating {}: {e}", d.display()));
    }
    let status = Command::new("cc")
        .args(["-O2", "-g", "-fno-omit-frame-pointer", "-o"])
        .arg(out)
        .arg(src)
        .args(extra)
        .status()
        .unwrap_or_else(|e| panic!("running cc: {e}"));
    assert!(status.success(), "cc failed on {}", src.display());
    out.to_path_buf()
}

/// A process that another one traces: `strace -o /dev/null sleep 30` and the pid of its
/// `sleep`, once strace traces it (strace first forks short-lived children of its own, to
/// check ptrace's features: the one returned is the child named `sleep` whose tracer is
/// strace). Kill the returned strace when done.
///
/// # Panics
/// If strace cannot be started (`make test` installs it) or its `sleep` does not appear
/// within 10 s.
// The strace child is handed to the caller, who kills and waits for it.
#[allow(clippy::zombie_processes)]
pub fn traced_sleep() -> (std::process::Child, u32) {
    let mut strace = Command::new("strace")
        .args(["-o", "/dev/null", "sleep", "30"])
        .spawn()
        .unwrap_or_else(|e| panic!("running strace ({e}): `make test` installs it"));
    let tracer = strace.id();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let kids = std::fs::read_to_string(format!("/proc/{tracer}/task/{tracer}/children")).unwrap_or_default();
        for pid in kids.split_whitespace().filter_map(|p| p.parse::<u32>().ok()) {
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
            let field = |name: &str| status.lines().find_map(|l| l.strip_prefix(name)).map(|v| v.trim().to_string());
            if field("Name:").as_deref() == Some("sleep") && field("TracerPid:").as_deref() == Some(tracer.to_string().as_str()) {
                return (strace, pid);
            }
        }
        if std::time::Instant::now() > deadline {
            let _ = strace.kill();
            let _ = strace.wait();
            panic!("strace's sleep did not start within 10 s");
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}
