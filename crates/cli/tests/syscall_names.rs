//! Every system call tracepoint of the kernel (`syscalls:sys_enter_NAME`, `sys_exit_NAME`, as
//! tracefs lists them on this machine) names a system call userbpf knows, under the kernel's
//! name (which is not always the call's: `umount` for umount2, `newstat` for stat); and the
//! numbers of the names the kernel spells its own way, and of the newest calls, are the
//! kernel's (each call is made once under the kernel's tracepoints, which report the number).
//! And every one of them, entry and exit, is attached by `userbpf run` or refused with a reason
//! (a call no hook of a process can see), never as an unknown system call.

use std::io::Write;
use std::process::{Command, Stdio};

mod common;
use common::*;

use userbpf_hook::syscalls;

/// The kernel's system call tracepoint names (NAME of sys_enter_NAME and sys_exit_NAME).
fn kernel_names() -> Vec<String> {
    let dirs = ["/sys/kernel/tracing/events/syscalls", "/sys/kernel/debug/tracing/events/syscalls"];
    let dir = dirs.iter().find(|d| std::path::Path::new(d).is_dir()).unwrap_or_else(|| {
        panic!("no tracefs with system call events at {dirs:?} (scripts/install-deps.sh mounts tracefs; as root: mount -t tracefs nodev /sys/kernel/tracing)")
    });
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| {
            let n = e.ok()?.file_name().into_string().ok()?;
            n.strip_prefix("sys_enter_").or_else(|| n.strip_prefix("sys_exit_")).map(str::to_string)
        })
        .collect();
    names.sort();
    names.dedup();
    assert!(names.len() > 300, "{dir} lists only {} system calls", names.len());
    names
}

#[test]
fn every_kernel_syscall_tracepoint_name_is_known() {
    let unknown: Vec<String> = kernel_names().into_iter().filter(|n| syscalls::number(n).is_none()).collect();
    assert!(unknown.is_empty(), "system call tracepoints of the kernel that userbpf does not know: {unknown:?}");
}

#[test]
fn numbers_of_renamed_and_new_calls_are_the_kernels() {
    // The kernel's own names, and calls newer than the table's first version: each made once
    // (with arguments that make it fail), its number read back from the kernel's tracepoint.
    let mut check: Vec<&str> = syscalls::TRACEPOINT_NAMES.iter().map(|(t, _)| *t).collect();
    check.extend([
        "uretprobe",
        "uprobe",
        "cachestat",
        "fchmodat2",
        "futex_wake",
        "futex_wait",
        "futex_requeue",
        "statmount",
        "listmount",
        "lsm_get_self_attr",
        "lsm_set_self_attr",
        "lsm_list_modules",
        "mseal",
        "setxattrat",
        "getxattrat",
        "listxattrat",
        "removexattrat",
        "open_tree_attr",
        "file_getattr",
        "file_setattr",
        "set_mempolicy_home_node",
        "rseq",
        "close_range",
    ]);
    let kernel = kernel_names();
    let check: Vec<&str> = check.into_iter().filter(|n| kernel.iter().any(|k| k == n)).collect();
    assert!(check.len() >= 6, "the kernel names none of {check:?}");
    let caller = userbpf_testutil::compile_c(&here("targets/nr_caller.c"), &tmp().join("syscall_names/nr_caller"), &[]);
    let probes: Vec<String> = check.iter().map(|n| format!("tracepoint:syscalls:sys_enter_{n}")).collect();
    let script =
        format!(r#"{} /comm == "nr_caller"/ {{ printf("%s %d\n", probe, args->__syscall_nr); }}"#, probes.join(","));
    let mut bt = Proc::spawn("bpftrace", {
        let mut c = Command::new("bpftrace");
        c.args(["-e", &script]);
        c
    });
    bt.wait_for("Attaching ", "attaching");
    // bpftrace prints "Attaching" before it attaches.
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let nrs: Vec<String> = check.iter().map(|n| syscalls::number(n).unwrap().to_string()).collect();
    let mut child = Command::new(&caller).args(&nrs).stdin(Stdio::piped()).spawn().unwrap();
    child.stdin.take().unwrap().write_all(b"go\n").unwrap();
    assert!(child.wait().unwrap().success(), "nr_caller failed");
    let last = format!("tracepoint:syscalls:sys_enter_{} ", check.last().unwrap());
    bt.wait_for(&last, "the last call's event");
    bt.signal(libc::SIGINT);
    bt.wait_exit("after SIGINT");
    let out = bt.stdout();
    for (n, nr) in check.iter().zip(&nrs) {
        let want = format!("tracepoint:syscalls:sys_enter_{n} {nr}\n");
        assert!(
            out.contains(&want),
            "userbpf's number of `{n}` is {nr}, the kernel's tracepoint reports otherwise:\n{out}"
        );
    }
}

#[test]
fn every_kernel_syscall_tracepoint_attaches_or_is_refused_with_a_reason() {
    let names = kernel_names();
    // One program per tracepoint, entry and exit, generated from the kernel's list.
    let mut src = String::from("#include <linux/bpf.h>\n#include <bpf/bpf_helpers.h>\nlong hits;\n");
    for n in &names {
        for k in ["enter", "exit"] {
            src.push_str(&format!("SEC(\"tp/syscalls/sys_{k}_{n}\") int {k}_{n}(void *ctx) {{ __sync_fetch_and_add(&hits, 1); return 0; }}\n"));
        }
    }
    src.push_str("char LICENSE[] SEC(\"license\") = \"GPL\";\n");
    let dir = tmp().join("syscall_names");
    std::fs::create_dir_all(&dir).unwrap();
    let c = dir.join("all_syscalls.bpf.c");
    std::fs::write(&c, src).unwrap();
    let obj = userbpf_testutil::compile_bpf(&c, &dir);
    let out = Command::new(userbpf())
        .env("USERBPF_AGENT", agent())
        .env("USERBPF_SHM_DIR", tmp())
        .arg("run")
        .arg(&obj)
        .args(["--", "/bin/true"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    let mut refused = std::collections::BTreeSet::new();
    for l in err.lines() {
        let Some(at) = l.find("syscalls/sys_") else { continue };
        let tp: String = l[at + "syscalls/".len()..].chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
        assert!(!l.contains("no x86-64 system call"), "a kernel tracepoint name userbpf does not know: {l}");
        let reason = l[at..].split_once(": ").map_or("", |(_, r)| r.trim());
        assert!(!reason.is_empty(), "{tp} refused without a reason: {l}");
        refused.insert(tp);
    }
    let total = names.len() * 2;
    // Most calls have a libc function that userbpf hooks.
    assert!(refused.len() * 2 < total, "{} of {total} system call tracepoints refused:\n{err}", refused.len());
    assert!(
        err.lines().filter(|l| l.contains("syscalls/sys_")).all(|l| l.contains("userbpf")),
        "every refusal comes from userbpf, naming the tracepoint:\n{err}"
    );
}
