//! The kernel as the oracle: small programs, each breaking one rule (`bad_*.c`) or keeping
//! it (`ok_*.c`), and every eBPF object the project builds, judged by the kernel's verifier
//! (real `bpf(BPF_PROG_LOAD)`) and by userbpf's in the same run.

mod common;

use std::path::{Path, PathBuf};

fn corpus() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/bpf");
    let mut v: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("tests/bpf")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "c"))
        .collect();
    v.sort();
    v
}

#[test]
fn corpus_verdicts_match_the_kernel() {
    if !userbpf_testutil::require(
        userbpf_testutil::kernel::may_load(),
        "root, to load programs into the kernel (bpf(BPF_PROG_LOAD))",
    ) {
        return;
    }
    let files = corpus();
    assert!(files.len() >= 40, "{} corpus programs", files.len());
    let mut failures = Vec::new();
    let (mut agree, mut total, mut refused) = (0, 0, 0);
    let (mut errnos, mut same_errno) = (0, 0);
    for f in &files {
        let name = f.file_name().unwrap().to_string_lossy().to_string();
        let expect_ok = name.starts_with("ok_");
        assert!(expect_ok || name.starts_with("bad_"), "{name}: corpus files are named ok_* or bad_*");
        let verdicts = common::judge_source(f, &common::out_dir()).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(!verdicts.is_empty(), "{name}: no program");
        for v in verdicts {
            total += 1;
            println!("{v}");
            if v.agree() {
                agree += 1;
            } else {
                failures.push(format!("disagree: {v}"));
            }
            if v.kernel.is_ok() != expect_ok {
                failures.push(format!("the kernel's verdict is not the one the file name promises: {v}"));
            }
            if v.userbpf.is_err() {
                refused += 1;
            }
            // ENOSPC: the kernel's log (4 MiB) overflowed, which hides its errno.
            if v.kernel_errno.is_some_and(|e| e != libc::ENOSPC) && v.userbpf_errno.is_some() {
                errnos += 1;
                if v.kernel_errno == v.userbpf_errno {
                    same_errno += 1;
                } else {
                    failures.push(format!("errno: kernel {:?}, userbpf {:?}: {v}", v.kernel_errno, v.userbpf_errno));
                }
            }
        }
    }
    println!("corpus: {agree}/{total} verdicts agree with the kernel ({refused} refused by userbpf)");
    println!("corpus: {same_errno}/{errnos} refusals get the kernel's errno");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Every eBPF object the project builds: examples and the test objects of the crates.
fn project_sources() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut v = Vec::new();
    for dir in [
        "examples/bpf",
        "examples/libbpf",
        "tools",
        "crates/cli/tests/bpf",
        "crates/object/tests/bpf",
        "crates/runtime/tests/bpf",
        "crates/vm/tests/bpf",
        "crates/agent/tests/bpf",
        "crates/syscall-server/tests/bpf",
        "crates/hook/tests/bpf",
    ] {
        let Ok(rd) = std::fs::read_dir(root.join(dir)) else { continue };
        for e in rd.flatten() {
            let p = e.path();
            if p.to_string_lossy().ends_with(".bpf.c") {
                v.push(p);
            }
        }
    }
    v.sort();
    v
}

/// Differences that remain, with the reason (file, program, why).
/// userbpf's `bpf_override_return` for uprobes (issue 11).
const OVERRIDE: &str = "bpf_override_return in a uprobe program: userbpf runs it (the function is skipped); a kernel built without CONFIG_BPF_KPROBE_OVERRIDE, as this one, refuses the helper at load, and one with it allows it only on kprobes of error-injectable kernel functions, never on uprobes";

/// userbpf's own helpers (ids from 1000, include/userbpf/helpers.h: io_uring).
const USERBPF_HELPERS: &str = "userbpf's own helpers (io_uring, ids from 1000) exist only in user space: the kernel refuses them as unknown functions";

/// userbpf's argument writes (issue 11).
const WRITABLE_ARGS: &str = "a store into an argument register of pt_regs in a SEC(\"uprobe.w\") program: userbpf's extension accepts it (the function runs with the new value); the kernel refuses every store into a kprobe program's context";

/// `bpf_snprintf`'s format rules are the runtime's, which the loader gives the verifier
/// (`Options::snprintf_format`); this harness runs the verifier alone.
const SNPRINTF_FORMAT: &str = "the format is checked by the runtime's rule, which the loader gives the verifier: through the loader the program is refused (crates/runtime/tests/refused.rs), and the rule agrees with the kernel's verifier on random formats (crates/runtime/tests/kernel_strings_differential.rs)";

const KNOWN_DIFFERENCES: &[(&str, &str, &str)] = &[
    ("crates/runtime/tests/bpf/bad_format.bpf.c", "with_precision", SNPRINTF_FORMAT),
    ("crates/runtime/tests/bpf/bad_format.bpf.c", "with_too_few", SNPRINTF_FORMAT),
    ("crates/cli/tests/bpf/override_args.bpf.c", "args", WRITABLE_ARGS),
    ("crates/cli/tests/bpf/override_load.bpf.c", "w_six", WRITABLE_ARGS),
    ("examples/bpf/redis-fsync.bpf.c", "fdatasync_enter", USERBPF_HELPERS),
    ("examples/bpf/redis-fsync.bpf.c", "replies_enter", USERBPF_HELPERS),
    ("examples/bpf/redis-fsync.bpf.c", "epoll_enter", USERBPF_HELPERS),
    ("examples/bpf/redis-fsync.bpf.c", "aof_switch_enter", USERBPF_HELPERS),
    ("examples/bpf/redis-fsync.bpf.c", "aof_stop_enter", USERBPF_HELPERS),
    ("examples/bpf/redis-fsync.bpf.c", "write_client_enter", OVERRIDE),
    ("crates/cli/tests/bpf/io_uring_kernel.bpf.c", "on_rename", USERBPF_HELPERS),
    ("crates/cli/tests/bpf/io_uring_target.bpf.c", "probe", USERBPF_HELPERS),
    ("crates/runtime/tests/bpf/io_uring.bpf.c", "write_and_sync", USERBPF_HELPERS),
    ("crates/runtime/tests/bpf/io_uring.bpf.c", "fsync_fd", USERBPF_HELPERS),
    ("crates/runtime/tests/bpf/io_uring.bpf.c", "wait_idle", USERBPF_HELPERS),
    ("crates/cli/tests/bpf/override.bpf.c", "odd", OVERRIDE),
    ("crates/cli/tests/bpf/override.bpf.c", "first", OVERRIDE),
    ("crates/cli/tests/bpf/override.bpf.c", "second", OVERRIDE),
    ("crates/cli/tests/bpf/override.bpf.c", "rec", OVERRIDE),
    ("crates/cli/tests/bpf/override.bpf.c", "sync_bad", OVERRIDE),
    ("crates/cli/tests/bpf/override.bpf.c", "ret9", OVERRIDE),
    ("crates/cli/tests/bpf/override_usdt.bpf.c", "usdt_ov", OVERRIDE),
    ("crates/cli/tests/bpf/override_load.bpf.c", "ov_add", OVERRIDE),
    (
        "crates/object/tests/bpf/globals.bpf.c",
        "prog_three",
        "the kernel verifies a global (non-static) function once on its own, from the BTF types of its arguments, and refuses a call passing a pointer to an untyped argument; userbpf verifies every call of a function in its caller's context, as for static functions",
    ),
    (
        "crates/runtime/tests/bpf/missing_helper.bpf.c",
        "uses_task_btf",
        "bpf_get_current_task_btf returns a kernel task_struct: userbpf does not implement it and refuses the call",
    ),
];

#[test]
fn project_objects_match_the_kernel() {
    if !userbpf_testutil::require(
        userbpf_testutil::kernel::may_load(),
        "root, to load programs into the kernel (bpf(BPF_PROG_LOAD))",
    ) {
        return;
    }
    let out = common::out_dir().join("project");
    let (mut agree, mut total) = (0, 0);
    let mut differences = Vec::new();
    for src in project_sources() {
        let stem = src.file_name().unwrap().to_string_lossy().replace(".bpf.c", "");
        let dir = out.join(src.parent().unwrap().to_string_lossy().replace('/', "_"));
        std::fs::create_dir_all(&dir).unwrap();
        // Some test objects do not compile on purpose or need headers of their own.
        let status = std::process::Command::new("clang")
            .args(userbpf_testutil::BPF_CFLAGS)
            .arg("-I")
            .arg(src.parent().unwrap())
            .arg("-I")
            .arg(userbpf_testutil::include_dir())
            .arg("-o")
            .arg(dir.join(format!("{stem}.o")))
            .arg(&src)
            .stderr(std::process::Stdio::null())
            .status()
            .unwrap();
        if !status.success() {
            println!("skipped (does not compile): {}", src.display());
            continue;
        }
        let shown =
            src.strip_prefix(Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")).unwrap_or(&src).display().to_string();
        match common::judge_object(&dir.join(format!("{stem}.o")), &shown) {
            Ok(verdicts) => {
                for v in verdicts {
                    total += 1;
                    println!("{v}");
                    if v.agree() {
                        agree += 1;
                    } else if let Some((_, _, why)) =
                        KNOWN_DIFFERENCES.iter().find(|(f, p, _)| *f == v.file && *p == v.program)
                    {
                        println!("KNOWN DIFFERENCE ({why}): {v}");
                    } else {
                        differences.push(v.to_string());
                    }
                }
            }
            Err(e) => println!("skipped (object refused before verification): {shown}: {e}"),
        }
    }
    println!("project objects: {agree}/{total} verdicts agree with the kernel");
    for d in &differences {
        println!("DIFFERENCE: {d}");
    }
    assert!(total >= 20, "only {total} programs judged");
    assert!(differences.is_empty(), "{} differences:\n{}", differences.len(), differences.join("\n"));
}
