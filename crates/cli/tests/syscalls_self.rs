//! System call tracepoints see every system call of the target once the agent is loaded
//! (glibc's internal calls included: fopen's and opendir's openat, the locale files' openat and
//! `__close_nocancel`), and no probe of any kind sees the agent's own work (its system calls
//! and mallocs on the target's main thread when a dlopen makes it sync its links, its watcher
//! thread's); a thread the target creates is seen from its first instruction, and clone3
//! returns in parent and child. bpftrace counts the target's calls between two markers (getpgid) once on the
//! kernel with the target alone, and once through `userbpf load` with the target under
//! `userbpf start` in either order: the counts must be the same.

mod common;

use common::*;

const SCRIPT: &str = r#"
tracepoint:syscalls:sys_enter_getpgid /comm == "self_target"/ { @m[pid]++; }
tracepoint:syscalls:sys_enter_openat /@m[pid] == 1/ { @openat = count(); }
tracepoint:syscalls:sys_exit_openat /@m[pid] == 1/ { @openat_ret = count(); }
tracepoint:syscalls:sys_enter_close /@m[pid] == 1/ { @close = count(); }
tracepoint:syscalls:sys_enter_read /@m[pid] == 1/ { @read = count(); }
tracepoint:syscalls:sys_enter_newfstatat /@m[pid] == 1/ { @newfstatat = count(); }
tracepoint:syscalls:sys_enter_getdents64 /@m[pid] == 1/ { @getdents64 = count(); }
tracepoint:syscalls:sys_enter_mprotect /@m[pid] == 1/ { @mprotect = count(); }
tracepoint:syscalls:sys_enter_munmap /@m[pid] == 1/ { @munmap = count(); }
tracepoint:syscalls:sys_enter_set_robust_list /@m[pid] == 1/ { @set_robust_list = count(); }
tracepoint:syscalls:sys_exit_clone3 /@m[pid] == 1/ { @clone3_ret = count(); }
tracepoint:syscalls:sys_enter_futex /@m[pid] == 1/ { @futex = count(); }
tracepoint:syscalls:sys_exit_futex /@m[pid] == 1/ { @futex_ret = count(); }
tracepoint:raw_syscalls:sys_enter /@m[pid] == 1/ { @all = count(); }
tracepoint:raw_syscalls:sys_exit /@m[pid] == 1/ { @all_ret = count(); }
uprobe:libc:malloc /@m[pid] == 1/ { @malloc = count(); }
"#;

fn self_target() -> std::path::PathBuf {
    static ONCE: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    ONCE.get_or_init(|| {
        let lib = userbpf_testutil::compile_c(
            &here("targets/dl_lib.c"),
            &tmp().join("self/libdl_lib.so"),
            &["-shared", "-fPIC"],
        );
        let def = format!("-DLIB=\"{}\"", lib.display());
        userbpf_testutil::compile_c(
            &here("targets/self_target.c"),
            &tmp().join("self/self_target"),
            &[&def, "-ldl", "-pthread"],
        )
    })
    .clone()
}

/// The maps bpftrace printed, `@name: N` lines sorted. Whether pthread_join waits (a futex
/// call) depends on timing: futex calls are left out of the counts of every call.
fn counts(out: &str) -> Vec<String> {
    let mut v: Vec<String> = out
        .lines()
        .filter(|l| l.starts_with('@') && !l.starts_with("@m[") && !l.starts_with("@futex"))
        .map(String::from)
        .collect();
    for (all, futex) in [("all", "futex"), ("all_ret", "futex_ret")] {
        let n = value(&v, all) - value_in(out, futex);
        v.retain(|l| !l.starts_with(&format!("@{all}: ")));
        v.push(format!("@{all} (without futex): {n}"));
    }
    v.sort();
    v
}

fn value(counts: &[String], name: &str) -> u64 {
    counts.iter().find_map(|l| l.strip_prefix(&format!("@{name}: "))).and_then(|v| v.trim().parse().ok()).unwrap_or(0)
}

fn value_in(out: &str, name: &str) -> u64 {
    value(&out.lines().map(String::from).collect::<Vec<_>>(), name)
}

#[test]
fn every_system_call_of_the_target_and_none_of_the_agent() {
    let target = self_target();
    let probed = vec!["malloc".to_string()];
    let (kout, kerr) = run_with(
        "self",
        Via::Kernel,
        Order::LoaderFirst,
        &["bpftrace", "-e", SCRIPT],
        "Attaching ",
        &target,
        &probed,
        Ending::Interrupt,
        &|_| true,
    );
    let kc = counts(&kout);
    // What the target certainly did (glibc's internal calls among them): the reference is sane.
    for (name, at_least) in [
        ("openat", 3),
        ("close", 3),
        ("getdents64", 2),
        ("malloc", 7),
        ("all", 20),
        ("clone3_ret", 2),
        ("set_robust_list", 1),
    ] {
        assert!(value_in(&kout, name) >= at_least, "the kernel's @{name} is below {at_least}\n{kout}\n{kerr}");
    }
    for order in [Order::LoaderFirst, Order::TargetFirst] {
        let (uout, uerr) = run_with(
            "self",
            Via::Userbpf,
            order,
            &["bpftrace", "-e", SCRIPT],
            "Attaching ",
            &target,
            &probed,
            Ending::Interrupt,
            &|_| true,
        );
        assert_eq!(
            counts(&uout),
            kc,
            "{order:?}: userbpf's counts differ from the kernel's\n=== kernel ===\n{kout}\n=== userbpf ===\n{uout}\n{uerr}"
        );
    }
}

/// Through `userbpf load`, the loader is a process of the session too: its programs see the
/// loader's system calls, never those of userbpf's threads in it (the syscall server's, made
/// as the loader attaches: one of them, a freshly started thread, had its first
/// `rt_sigprocmask` counted under its own name).
#[test]
fn the_loaders_userbpf_threads_make_no_calls_the_programs_see() {
    let session = session_name("loader-threads", Via::Userbpf, Order::LoaderFirst);
    let script = "tracepoint:raw_syscalls:sys_exit { @[comm] = count(); }";
    let mut loader = Proc::spawn("bpftrace", loader_command(Via::Userbpf, &session, &["bpftrace", "-e", script]));
    loader.wait_for("Attaching", "bpftrace attaching");
    for _ in 0..3 {
        let st = target_command(Via::Userbpf, &session, &["/bin/true"]).status().unwrap();
        assert!(st.success());
    }
    std::thread::sleep(std::time::Duration::from_millis(1500));
    interrupt(&mut loader);
    let _ = loader.wait_exit("bpftrace");
    let out = loader.stdout();
    remove_session(&session);
    assert!(out.contains("@[true]: "), "the target's calls are seen: {out}\n{}", loader.stderr());
    assert!(!out.contains("@[userbpf"), "a userbpf thread's call was seen: {out}");
}
