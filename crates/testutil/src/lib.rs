//! Test support shared by the crates' tests: compiling eBPF C sources with clang at test
//! time, into the build directory (objects are never committed), and the rule for tests
//! whose tool, privilege or data is missing ([`require`]: they fail, unless told to skip),
//! a temporary directory removed on drop ([`TmpDir`]) and a deterministic pseudo-random
//! generator for fuzz loops ([`Rng`]).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

/// A fresh directory under the system's temporary directory, removed with its contents when
/// dropped. Its name holds the tag, the test process's pid and a counter, so tests running
/// at once never share one.
#[derive(Debug)]
pub struct TmpDir(PathBuf);

impl TmpDir {
    /// Creates `TMP/userbpf-TAG-PID-N` (emptied first if a crashed run left it).
    ///
    /// # Panics
    /// If the directory cannot be created.
    pub fn new(tag: &str) -> TmpDir {
        Self::new_in(&std::env::temp_dir(), tag)
    }

    /// As [`TmpDir::new`], under `parent` (e.g. `/dev/shm` for files that must be shared memory).
    ///
    /// # Panics
    /// If the directory cannot be created.
    pub fn new_in(parent: &Path, tag: &str) -> TmpDir {
        static N: AtomicU32 = AtomicU32::new(0);
        let p = parent.join(format!("userbpf-{tag}-{}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed)));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap_or_else(|e| panic!("creating {}: {e}", p.display()));
        TmpDir(p)
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.0
    }

    /// `name` inside the directory.
    pub fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl std::ops::Deref for TmpDir {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<Path> for TmpDir {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl Drop for TmpDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A deterministic pseudo-random generator (splitmix64): the same seed gives the same
/// sequence on every machine, so a failing fuzz case is reproduced from its seed.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// In `0..n`; 0 when `n` is 0.
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next_u64() % n }
    }

    /// An index in `0..n`; 0 when `n` is 0.
    pub fn index(&mut self, n: usize) -> usize {
        self.below(n as u64) as usize
    }

    /// In `lo..=hi` (`lo <= hi`).
    pub fn range(&mut self, lo: i64, hi: i64) -> i64 {
        lo.wrapping_add(self.below(hi.wrapping_sub(lo) as u64 + 1) as i64)
    }

    /// True with probability `num/den`.
    pub fn chance(&mut self, num: u64, den: u64) -> bool {
        self.below(den) < num
    }

    /// One of `items` (not empty).
    pub fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.index(items.len())]
    }

    /// A value near the edges of integer arithmetic (0, 1, 2, 10 and the limits of 8-, 16-,
    /// 32- and 64-bit signed and unsigned numbers, or their negations), a small signed one, or
    /// any: what fuzz loops give instructions and helpers to meet their corner cases often.
    pub fn edge_u64(&mut self) -> u64 {
        const EDGES: [u64; 17] = [
            0,
            1,
            2,
            10,
            0x7f,
            0x80,
            0xff,
            0x7fff,
            0x8000,
            0xffff,
            0x7fff_ffff,
            0x8000_0000,
            0xffff_ffff,
            0x1_0000_0000,
            0x7fff_ffff_ffff_ffff,
            0x8000_0000_0000_0000,
            u64::MAX,
        ];
        match self.below(4) {
            0 => self.pick(&EDGES),
            1 => self.pick(&EDGES).wrapping_neg(),
            2 => self.range(-300, 300) as u64,
            _ => self.next_u64(),
        }
    }

    /// `n` random bytes.
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next_u64() as u8).collect()
    }
}

/// The number in environment variable `name`, decimal or `0x` hex; `None` when it is unset.
///
/// # Panics
/// When it is set to something else than a number (a test run with a mistyped seed or count
/// must not quietly run the default).
pub fn env_u64(name: &str) -> Option<u64> {
    let v = std::env::var(name).ok()?;
    let v = v.trim();
    let parsed = match v.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => v.parse(),
    };
    Some(parsed.unwrap_or_else(|_| panic!("{name}={v:?} is not a number")))
}

/// A fuzz loop's first seed: environment variable `name` as a number ([`env_u64`]), or
/// `time` for one from the clock (printed by the loops, so that a failure can be
/// reproduced), else `default`.
pub fn seed_from_env(name: &str, default: u64) -> u64 {
    if std::env::var(name).ok().as_deref() == Some("time") {
        return std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64);
    }
    env_u64(name).unwrap_or(default)
}

pub mod kernel;

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
    panic!(
        "missing: {what} (`make test` installs and sets up what the tests need; {ALLOW_SKIP_ENV}=1 skips such tests on a machine that cannot have it)"
    );
}

/// clang flags for eBPF objects, as libbpf programs are built (x86-64 register layout).
pub const BPF_CFLAGS: [&str; 7] =
    ["-target", "bpf", "-g", "-O2", "-c", "-D__TARGET_ARCH_x86", "-I/usr/include/x86_64-linux-gnu"];

/// The project's headers for eBPF C (`include/`, holding `<userbpf/helpers.h>`).
pub fn include_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../include")
}

/// Compiles `src` into `out_dir` (created if needed), with the project's headers
/// ([`include_dir`]) on the include path; returns the object's path.
///
/// # Panics
/// If clang is missing or fails: tests need it (`make test` installs it).
pub fn compile_bpf(src: &Path, out_dir: &Path) -> PathBuf {
    std::fs::create_dir_all(out_dir).unwrap_or_else(|e| panic!("creating {}: {e}", out_dir.display()));
    let stem = src.file_name().and_then(|n| n.to_str()).and_then(|n| n.strip_suffix(".c")).unwrap_or("prog");
    let out = out_dir.join(format!("{stem}.o"));
    let status = Command::new("clang")
        .args(BPF_CFLAGS)
        .arg(format!("-I{}", include_dir().display()))
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
            if field("Name:").as_deref() == Some("sleep")
                && field("TracerPid:").as_deref() == Some(tracer.to_string().as_str())
            {
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

/// The runs of kernel programs a tool reports the kernel skipped (`userbpf: the kernel skipped
/// N runs of PROG`, printed when another eBPF program ran on the CPU an event came on): what
/// the tool's counts may be short by.
pub fn kernel_skipped(stderr: &str) -> u64 {
    stderr
        .lines()
        .filter_map(|l| l.strip_prefix("userbpf: the kernel skipped ")?.split(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// Whether a count `got` the kernel made is `want`, short by at most `skipped` runs the kernel
/// reported skipping (an event it dropped is never counted twice: never more than `want`).
pub fn counted(got: Option<u64>, want: u64, skipped: u64) -> bool {
    got.or((want <= skipped).then_some(0)).is_some_and(|g| g <= want && g + skipped >= want)
}
