//! `userbpf run` on USDT probes (`<sys/sdt.h>`): programs written with libbpf's
//! `usdt.bpf.h` see every argument exactly (registers, memory, constants, sub-word sizes),
//! semaphores are raised while attached, and probes that cannot be attached say why.

use std::path::{Path, PathBuf};
use std::process::Command;

mod common;
use common::{agent, here};

fn tmp() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).to_path_buf()
}

/// The target (two files: usdt_guarded.c declares its semaphore), built once into its own
/// directory, which the tests run in (the object's section names `./usdt_target`).
fn target_dir() -> PathBuf {
    static ONCE: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    ONCE.get_or_init(|| {
        let dir = tmp().join("usdt");
        let guarded = here("targets/usdt_guarded.c");
        userbpf_testutil::compile_c(
            &here("targets/usdt_target.c"),
            &dir.join("usdt_target"),
            &[guarded.to_str().unwrap()],
        );
        dir
    })
    .clone()
}

fn object() -> PathBuf {
    static ONCE: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    ONCE.get_or_init(|| userbpf_testutil::compile_bpf(&here("bpf/usdt.bpf.c"), &tmp().join("bpf/usdt"))).clone()
}

fn run(extra: &[&str], n: u32) -> (String, String, bool) {
    let dir = target_dir();
    let out = Command::new(env!("CARGO_BIN_EXE_userbpf"))
        .current_dir(&dir)
        .env("USERBPF_AGENT", agent())
        .env("USERBPF_SHM_DIR", tmp())
        .arg("run")
        .arg(object())
        .args(extra)
        .arg("--")
        .arg("./usdt_target")
        .arg(n.to_string())
        .output()
        .unwrap();
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        out.status.success(),
    )
}

#[test]
fn usdt_arguments_arrive_exactly_in_both_engines() {
    let n = 100u32;
    let sum_i: i64 = (0..n as i64).sum();
    let sum_small: i64 = (0..n as i64).map(|i| (i + 250) & 0xff).sum();
    for engine in [&[][..], &["--interpreter"][..]] {
        let mut args = engine.to_vec();
        args.extend(["--attach", "on_two=app:two", "--attach", "on_guarded=./usdt_target:app:guarded"]);
        let (out, err, ok) = run(&args, n);
        assert!(ok, "{out}\n{err}");
        assert!(!err.contains("userbpf-agent:"), "no attach error: {err}");
        assert!(
            out.contains(&format!("usdt_target: {n} iterations, guarded probe enabled {n} times")),
            "semaphore raised: {out}"
        );
        let three = format!(
            ".three = {{ .hits = {n}, .sum_i = {sum_i}, .sum_mem = {}, .sum_const = {}, .arg_cnt = 3, .bad = 0 }}",
            -3 * sum_i,
            -7 * n as i64
        );
        assert!(out.contains(&three), "register, memory and constant arguments: {out}");
        let two =
            format!(".two = {{ .hits = {n}, .sum_small = {sum_small}, .sum_reg = {}, .arg_cnt = 2 }}", 1000 * sum_i);
        assert!(out.contains(&two), "a 1-byte register and a probe right after another: {out}");
        let guarded =
            format!(".guarded = {{ .hits = {n}, .sum_n = {sum_i}, .last_const = {}, .cookie = 0 }}", 0x1234567890i64);
        assert!(out.contains(&guarded), "the guarded probe: {out}");
        assert!(!out.contains("@__bpf_usdt_specs"), "libbpf's bookkeeping maps are not printed: {out}");
    }
}

#[test]
fn a_probe_not_attached_leaves_its_semaphore_down() {
    // on_guarded gets a probe that the command's executable does not have: `userbpf run` says
    // so (the agent, in a process whose executable lacks it, stays quiet: it may be a wrapper
    // of the target) and the semaphore stays 0.
    // --allow-partial: without it, a probe no process had fails the run (tests/objects.rs).
    let (out, err, ok) =
        run(&["--allow-partial", "--attach", "on_two=app:two", "--attach", "on_guarded=app:nosuch"], 10);
    assert!(ok, "{out}\n{err}");
    assert!(err.contains("USDT probe `app:nosuch` is not in") && err.contains("usdt_target"), "{err}");
    assert!(!err.contains("userbpf-agent:"), "{err}");
    assert!(out.contains("usdt_target: 10 iterations, guarded probe enabled 0 times"), "{out}");
    assert!(out.contains(".two = { .hits = 10,"), "{out}");
}

#[test]
fn a_usdt_program_without_a_target_is_refused() {
    let (_, err, ok) = run(&["--attach", "on_two=app:two"], 1);
    assert!(!ok);
    assert!(
        err.contains(
            "program `on_guarded` (section usdt) has no target: give one with --attach on_guarded=PROVIDER:NAME"
        ),
        "{err}"
    );
}

#[test]
fn a_probe_in_a_shared_library_is_found_by_its_file_name() {
    let dir = tmp().join("usdt_lib");
    let lib =
        userbpf_testutil::compile_c(&here("targets/usdt_lib.c"), &dir.join("libusdt_lib.so"), &["-shared", "-fPIC"]);
    let rpath = format!("-Wl,-rpath,{}", dir.display());
    let exe = userbpf_testutil::compile_c(
        &here("targets/usdt_lib_main.c"),
        &dir.join("usdt_lib_main"),
        &[lib.to_str().unwrap(), &rpath],
    );
    let obj = userbpf_testutil::compile_bpf(&here("bpf/usdt_lib.bpf.c"), &tmp().join("bpf/usdt_lib"));
    let out = Command::new(env!("CARGO_BIN_EXE_userbpf"))
        .env("USERBPF_AGENT", agent())
        .env("USERBPF_SHM_DIR", tmp())
        .arg("run")
        .arg(obj)
        .arg("--")
        .arg(exe)
        .arg("50")
        .output()
        .unwrap();
    let (out, err) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.contains("usdt_lib_main: 50 calls"), "{out}\n{err}");
    assert!(out.contains("value = { .hits = 50, .sum = 1225 }"), "{out}\n{err}");
}

#[test]
fn a_probe_in_a_library_loaded_later_is_attached_on_each_load() {
    let dir = tmp().join("usdt_dlopen");
    let lib =
        userbpf_testutil::compile_c(&here("targets/usdt_lib.c"), &dir.join("libusdt_lib.so"), &["-shared", "-fPIC"]);
    let exe = userbpf_testutil::compile_c(&here("targets/dlopen_target.c"), &dir.join("dlopen_target"), &["-ldl"]);
    let obj = userbpf_testutil::compile_bpf(&here("bpf/usdt_lib.bpf.c"), &tmp().join("bpf/usdt_dlopen"));
    let out = Command::new(env!("CARGO_BIN_EXE_userbpf"))
        .env("USERBPF_AGENT", agent())
        .env("USERBPF_SHM_DIR", tmp())
        .arg("run")
        .arg(obj)
        .arg("--")
        .arg(exe)
        .arg(&lib)
        .args(["3", "50", "usdt_lib_fn"])
        .output()
        .unwrap();
    let (out, err) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.contains("dlopen_target: 3 rounds of 50 calls"), "{out}\n{err}");
    assert!(!err.contains("userbpf-agent:"), "not mapped at start: nothing to say: {err}");
    // Each load of the library: its probe attached before dlopen returns, forgotten when it is
    // unloaded.
    assert!(out.contains("value = { .hits = 150, .sum = 3675 }"), "{out}\n{err}");
}
