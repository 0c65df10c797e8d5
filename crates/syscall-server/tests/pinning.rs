//! Maps pinned by libbpf itself (`LIBBPF_PIN_BY_NAME`) through the syscall-server library:
//! libbpf checks with `statfs` that the pin directory is on the BPF filesystem before it pins,
//! and this machine has no bpffs mounted at /sys/fs/bpf; pins are the session's, so the
//! library reports the BPF filesystem there. A second loader in the same session reuses the
//! pinned map (libbpf's `bpf_obj_get` and compatibility check) and sees the first one's value,
//! as a bpffs pin outlives its loader.

use std::process::Command;

mod common;
use common::{lib, tmp};

fn src(name: &str) -> std::path::PathBuf {
    common::src("c", name)
}

#[test]
fn a_map_pinned_by_name_is_pinned_and_reused_by_the_next_loader() {
    let dir = tmp().join(format!("pinning-{}", std::process::id()));
    let bpf = userbpf_testutil::compile_bpf(&src("pin.bpf.c"), &dir);
    let ldr = userbpf_testutil::compile_c(&src("pin_loader.c"), &dir.join("pin_loader"), &["-lbpf"]);
    let shm = dir.join("shm");
    std::fs::create_dir_all(&shm).unwrap();
    let session = format!("pin-{}", std::process::id());
    let run = || {
        let out = Command::new("sh")
            .arg("-c")
            .arg("USERBPF_LOADER_PID=$$ exec \"$0\" \"$@\"")
            .arg(&ldr)
            .arg(&bpf)
            .env("LD_PRELOAD", lib("libuserbpf_syscall_server.so"))
            .env("USERBPF_SESSION", &session)
            .env("USERBPF_SHM_DIR", &shm)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "loader failed: {text}{}", String::from_utf8_lossy(&out.stderr));
        text
    };
    assert_eq!(run(), "runs 1 pinned at /sys/fs/bpf/pinned_runs\n");
    assert_eq!(run(), "runs 2 pinned at /sys/fs/bpf/pinned_runs\n");
    // Nothing was written to the real /sys/fs/bpf.
    assert!(!std::path::Path::new("/sys/fs/bpf/pinned_runs").exists());
    let _ = std::fs::remove_dir_all(&dir);
}
