//! `bpf()` reached through `dlsym`'s `syscall` (tests/c/dlsym_syscall.c) is served like a
//! direct call: every way the loader finds `syscall` creates a session map under the server,
//! a kernel map without it, and other lookups answer as libc's dlsym does.

use std::path::PathBuf;
use std::process::Command;

mod common;

fn run(served: bool) -> String {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/c/dlsym_syscall.c");
    let prog = userbpf_testutil::compile_c(
        &src,
        &common::tmp().join(format!("dlsym_syscall-{}", std::process::id())),
        &["-ldl"],
    );
    let out = if served {
        let shm = common::tmp().join("shm");
        std::fs::create_dir_all(&shm).unwrap();
        Command::new("sh")
            .arg("-c")
            .arg("USERBPF_LOADER_PID=$$ exec \"$0\"")
            .arg(&prog)
            .env("LD_PRELOAD", common::lib("libuserbpf_syscall_server.so"))
            .env("USERBPF_SESSION", "dlsym")
            .env("USERBPF_SHM_DIR", &shm)
            .output()
            .unwrap()
    } else {
        Command::new(&prog).output().unwrap()
    };
    assert!(out.status.success(), "{}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn syscall_found_by_dlsym_is_served() {
    let ways = ["dlsym(libc)", "dlsym(RTLD_NEXT)", "dlsym(RTLD_DEFAULT)", "call"];
    let expect = |what: &str| {
        ways.iter().map(|w| format!("{w}: {what}\n")).collect::<String>() + "getpid found: 1\nmissing: 1\n"
    };
    assert_eq!(run(false), expect("kernel map"));
    assert_eq!(run(true), expect("session map"));
}
