//! userbpf's io_uring helpers inside a real target under `userbpf run`, JIT and interpreter:
//! a descriptor that is not open, an unreadable buffer and an fsync of a pipe give their
//! negative errno on every call, and the target runs to its end.

use std::path::{Path, PathBuf};

mod common;
use common::{repo, userbpf_run};

fn tmp() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).to_path_buf()
}

/// The value `userbpf run` printed for a global counter (`.name = N` in the .bss dump).
fn counter(out: &str, name: &str) -> u64 {
    let key = format!(".{name} = ");
    let at = out.find(&key).unwrap_or_else(|| panic!("{name} not printed: {out}")) + key.len();
    out[at..].split(|c: char| !c.is_ascii_digit()).next().unwrap().parse().unwrap()
}

#[test]
fn failing_operations_give_negative_errnos_in_a_target() {
    let target =
        userbpf_testutil::compile_c(&repo("examples/targets/workload.c"), &tmp().join("io_uring/workload"), &[]);
    let obj = userbpf_testutil::compile_bpf(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/bpf/io_uring_target.bpf.c"),
        &tmp().join("io_uring/bpf"),
    );
    for engine in [&["--attach", "probe=work"][..], &["--interpreter", "--attach", "probe=work"][..]] {
        let (out, err, ok) = userbpf_run(&obj, engine, &[target.to_str().unwrap(), "300"]);
        assert!(ok, "{engine:?}: {err}");
        assert!(out.contains("workload: 300 calls of work()"), "{engine:?}: the target ran to its end: {out}\n{err}");
        for c in ["calls", "ebadf_sync", "ebadf_write", "efault", "einval", "idle"] {
            assert_eq!(counter(&out, c), 300, "{engine:?} {c}: {out}");
        }
        assert_eq!(counter(&out, "other"), 0, "{engine:?}: {out}");
    }
}

#[test]
fn a_kernel_program_calling_an_io_uring_helper_is_refused_with_its_name() {
    let obj = userbpf_testutil::compile_bpf(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/bpf/io_uring_kernel.bpf.c"),
        &tmp().join("io_uring/bpf"),
    );
    let (out, err, ok) = userbpf_run(&obj, &[], &["true"]);
    assert!(!ok, "a tracepoint the kernel runs may not call userbpf's helpers: {out}\n{err}");
    assert!(
        err.contains("program `on_rename` runs in the kernel") && err.contains("bpf_io_uring_fdatasync (id 1002)"),
        "the refusal names the program and the helper: {err}"
    );
}
