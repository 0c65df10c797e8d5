//! bpf() commands through libbpf's low-level API (tests/c/bpf_calls.c), run against the
//! kernel and under the syscall server: each result line (return value, errno, values read
//! back, info fields, verifier log contents) must be the same.

use std::path::PathBuf;
use std::process::Command;

/// The server library built beside this test (target/<profile>/).
fn server_lib() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap().parent().unwrap();
    let lib = dir.join("libuserbpf_syscall_server.so");
    assert!(
        lib.exists(),
        "{} is missing: build the crate first (cargo build --release -p userbpf-syscall-server)",
        lib.display()
    );
    lib
}

/// The C program, compiled once per test process.
fn program() -> PathBuf {
    static PROG: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    PROG.get_or_init(|| {
        let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/c/bpf_calls.c");
        let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("bpf_calls-{}", std::process::id()));
        userbpf_testutil::compile_c(&src, &out, &["-lbpf"])
    })
    .clone()
}

/// Runs the program's `section` directly (the kernel) or as a served loader in session
/// `session` (the shell's pid is the loader's, kept by `exec`).
fn run(section: &str, served: Option<&str>) -> String {
    let prog = program();
    let out = match served {
        None => Command::new(&prog).arg(section).output().unwrap(),
        Some(session) => {
            let shm = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("shm");
            std::fs::create_dir_all(&shm).unwrap();
            Command::new("sh")
                .arg("-c")
                .arg("USERBPF_LOADER_PID=$$ exec \"$0\" \"$1\"")
                .arg(&prog)
                .arg(section)
                .env("LD_PRELOAD", server_lib())
                .env("USERBPF_SESSION", session)
                .env("USERBPF_SHM_DIR", &shm)
                .output()
                .unwrap()
        }
    };
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{section} ({served:?}) failed: {}\n{text}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

fn compare(section: &str) {
    let kernel = run(section, None);
    let user = run(section, Some(&format!("bpfcalls-{section}")));
    assert!(!kernel.trim().is_empty());
    let (k, u): (Vec<&str>, Vec<&str>) = (kernel.lines().collect(), user.lines().collect());
    for (i, (a, b)) in k.iter().zip(u.iter()).enumerate() {
        assert_eq!(a, b, "{section}: line {i} differs (kernel, then userbpf)\nkernel:\n{kernel}\nuserbpf:\n{user}");
    }
    assert_eq!(k.len(), u.len(), "{section}: line counts differ\nkernel:\n{kernel}\nuserbpf:\n{user}");
}

#[test]
fn map_element_operations_match_the_kernel() {
    compare("maps");
}

#[test]
fn map_batch_operations_match_the_kernel() {
    compare("batch");
}

#[test]
fn descriptor_valued_maps_and_percpu_batches_match_the_kernel() {
    compare("fdmaps");
}

#[test]
fn program_loads_logs_info_and_test_runs_match_the_kernel() {
    compare("progs");
}

#[test]
fn perf_links_match_the_kernel() {
    compare("links");
}

/// A uprobe event on the test program itself (the kernel's uprobe PMU, and H4's through the server).
#[test]
fn task_fd_query_of_a_uprobe_event_matches_the_kernel() {
    compare("fdquery");
}

#[test]
fn btf_loads_and_info_match_the_kernel() {
    compare("btf");
}

/// The kernel's own BTF (vmlinux, modules) listed, opened and read as on the kernel (bpftrace
/// finds the types of tracepoint records this way).
#[test]
fn kernel_btf_objects_match_the_kernel() {
    compare("kbtf");
    assert!(run("kbtf", None).contains("kbtf vmlinux id_ok=1"), "the kernel serves vmlinux BTF here");
}

#[test]
fn unknown_commands_and_bad_attributes_match_the_kernel() {
    compare("misc");
}

/// Pins live in the session (the real BPF filesystem is not touched, and may not be mounted).
#[test]
fn pins_are_recorded_in_the_session() {
    let session = format!("bpfcalls-pins-{}", std::process::id());
    let out = run("pins", Some(&session));
    assert_eq!(
        out, "u: pin 0\nu: pin_again -17\nu: obj_get same=1\nu: obj_get_missing -2\nu: pin_outside_bpffs -1\n",
        "{out}"
    );
    // The pinned map keeps the session after the loader left: a second loader gets it.
    let again = run("pins-get", Some(&session));
    assert!(again.contains("u: obj_get_pinned_earlier 1"), "{again}");
    assert!(again.contains("u: update_frozen_by_another_loader -1"), "frozen in every process: {again}");
    // Pins keep the session: remove it (as rm of a bpffs pin would).
    let shm = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("shm");
    for e in std::fs::read_dir(&shm).unwrap().flatten() {
        if e.file_name().to_string_lossy().ends_with(&format!("-{session}")) {
            std::fs::remove_dir_all(e.path()).unwrap();
        }
    }
}
