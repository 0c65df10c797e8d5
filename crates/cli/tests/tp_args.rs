//! bpftrace's `args->` of system call tracepoints (the kernel's record types, which bpftrace
//! finds in the kernel's BTF), each one-liner run once through the kernel and once unmodified
//! through `userbpf load bpftrace` with the target under `userbpf start`: the outputs must be
//! the same, and the kernel's must hold what the target is known to do (so that two empty or
//! broken outputs cannot pass).
//!
//! The target (targets/loaders/tp_target.c) makes the same system calls in every run; each test
//! runs it under a name of its own (its `comm`, which the scripts filter on), so that tests
//! running at once do not see each other's calls through the kernel's system-wide tracepoints.
//! A uprobe on its `mark()`, last in each script, tells when the probes are attached.

mod common;

use common::*;

/// tp_target.c compiled once, and copied to a file named `name` (the target's comm in the
/// test; run_with then runs a private copy of that file, under the same name).
fn target_named(name: &str) -> std::path::PathBuf {
    static ONCE: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    let bin = ONCE.get_or_init(|| {
        userbpf_testutil::compile_c(&here("targets/loaders/tp_target.c"), &tmp().join("tp_args/tp_target"), &[])
    });
    let dir = tmp().join("tp_args").join(format!("{name}.d"));
    std::fs::create_dir_all(&dir).unwrap();
    let dst = dir.join(name);
    let _ = std::fs::remove_file(&dst);
    std::fs::copy(bin, &dst).unwrap_or_else(|e| panic!("copying {} to {}: {e}", bin.display(), dst.display()));
    dst
}

/// Runs `script` ("{T}" = the target's path, "{C}" = its comm) through the kernel, then
/// through userbpf in each of `orders`; `expect` must appear in the kernel's output.
fn compare(test: &str, script: &str, orders: &[Order], expect: &[&str]) {
    let target = target_named(test);
    let script = script.replace("{C}", test);
    let probed = probed_functions(&script);
    let run = |via, order| {
        run_with(
            test,
            via,
            order,
            &["bpftrace", "-e", &script],
            "Attaching ",
            &target,
            &probed,
            Ending::Interrupt,
            &|_| true,
        )
    };
    let (kout, kerr) = run(Via::Kernel, Order::LoaderFirst);
    for e in expect {
        assert!(kout.contains(e), "the kernel's output lacks {e:?} (is the test target right?)\n{kout}\n{kerr}");
    }
    let kn = normalise_bpftrace(&kout);
    for &order in orders {
        let (uout, uerr) = run(Via::Userbpf, order);
        assert!(!uerr.contains("BTF"), "{test} ({order:?}): bpftrace complains about BTF through userbpf:\n{uerr}");
        assert_same_output(&format!("{test} ({order:?})"), &kn, &normalise_bpftrace(&uout), &kout, &uout, &uerr);
    }
}

#[test]
fn sys_enter_openat_filename_flags_and_mode() {
    // open(path-i, i odd ? O_RDONLY|O_CLOEXEC : O_WRONLY|O_CREAT, 0640 + i) for i < 5, then
    // openat(AT_FDCWD, ".../at", O_RDWR). glibc passes the system call a mode only with
    // O_CREAT (else 0); userbpf, tracing the call at libc's open(), reports the mode argument
    // the caller passed whatever the flags (a known difference, not this test's subject): the
    // mode is printed for O_CREAT opens only.
    compare(
        "tpa_open",
        r#"tracepoint:syscalls:sys_enter_openat /comm == "{C}" && strncmp(str(args->filename), "/nonexistent/", 13) == 0/ { printf("%s %d %x %d\n", str(args->filename), args->dfd, args->flags, args->flags & 0x40 ? args->mode : 0); @n = count(); } uprobe:{T}:mark { @m = count(); }"#,
        &[Order::LoaderFirst, Order::TargetFirst],
        &[
            "/nonexistent/userbpf-tp/file-0 -100 41 416\n",
            "/nonexistent/userbpf-tp/file-1 -100 80000 0\n",
            "/nonexistent/userbpf-tp/file-4 -100 41 420\n",
            "/nonexistent/userbpf-tp/at -100 2 0\n",
            "@n: 6\n",
            "@m: 2\n",
        ],
    );
}

#[test]
fn sys_exit_read_ret_paired_with_sys_enter_read() {
    // On descriptor 77: 3 reads of 100 bytes of /dev/zero, one once it is closed (-EBADF), 37
    // bytes of a pipe, then its end (0); each asks for 100 bytes.
    compare(
        "tpa_read",
        r#"tracepoint:syscalls:sys_enter_read /comm == "{C}" && args->fd == 77/ { @in[tid] = args->count; } tracepoint:syscalls:sys_exit_read /comm == "{C}" && @in[tid]/ { @ret[args->ret] = count(); @asked = sum(@in[tid]); delete(@in[tid]); } uprobe:{T}:mark { @m = count(); }"#,
        &[Order::LoaderFirst],
        &["@ret[-9]: 1\n", "@ret[37]: 1\n", "@ret[0]: 1\n", "@ret[100]: 3\n", "@asked: 600\n"],
    );
}

#[test]
fn raw_syscalls_sys_enter_id_and_args() {
    // getppid() 7 times, umask(022) 3 times and umask(077) twice.
    compare(
        "tpa_raw",
        r#"tracepoint:raw_syscalls:sys_enter /comm == "{C}" && (args->id == 110 || args->id == 95)/ { @id[args->id] = count(); if (args->id == 95) { @umask[args->args[0]] = count(); } } uprobe:{T}:mark { @m = count(); }"#,
        &[Order::LoaderFirst],
        &["@id[110]: 7\n", "@id[95]: 5\n", "@umask[18]: 3\n", "@umask[63]: 2\n"],
    );
}

#[test]
fn sys_enter_umount_is_umount2_as_the_kernel_names_it() {
    // umount2(path, 0) 3 times, umount(path) twice: all the umount2 system call, -ENOENT.
    compare(
        "tpa_umount",
        r#"tracepoint:syscalls:sys_enter_umount /comm == "{C}"/ { @e[str(args->name), args->flags] = count(); } tracepoint:syscalls:sys_exit_umount /comm == "{C}"/ { @r[args->ret] = count(); } uprobe:{T}:mark { @m = count(); }"#,
        &[Order::LoaderFirst],
        &["@e[/nonexistent/userbpf-tp, 0]: 5\n", "@r[-2]: 5\n"],
    );
}
