//! Helpers shared by the integration tests of the syscall-server library.

#![allow(dead_code)]

use std::path::PathBuf;

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
