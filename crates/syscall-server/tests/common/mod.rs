//! Helpers shared by the integration tests of the syscall-server library.

#![allow(dead_code)]

use std::io::BufRead;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// A library built beside the test binary (`libuserbpf_syscall_server.so`,
/// `libuserbpf_agent.so`).
pub fn lib(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let lib = exe.parent().unwrap().parent().unwrap().join(name);
    assert!(lib.exists(), "{} is missing: build userbpf-agent and userbpf-syscall-server first", lib.display());
    lib
}

/// The tests' scratch directory.
pub fn tmp() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
}

/// A source file of the tests, in `tests/DIR`.
pub fn src(dir: &str, name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests").join(dir).join(name)
}

/// Reads lines until one is `want` (trimmed); panics at the end of the output or after 30 s.
pub fn wait_line(r: &mut impl BufRead, want: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut line = String::new();
    while Instant::now() < deadline {
        line.clear();
        if r.read_line(&mut line).unwrap() == 0 {
            panic!("end of output before {want:?}");
        }
        if line.trim() == want {
            return;
        }
    }
    panic!("no {want:?}");
}
