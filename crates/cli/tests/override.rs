//! `bpf_override_return` and argument writes in real processes (`userbpf run`, `userbpf
//! attach`), with the JIT and the interpreter: functions of every shape the hook probes
//! differently (inline jump, jump into the padding, breakpoint), a C function, libc's
//! `fdatasync`, recursion, threads, several programs on one function, return probes of an
//! overridden function, the registers the ABI says the caller keeps, a function running in
//! another thread while the probe is attached; what is refused (an override inside a
//! function, argument writes without `uprobe.w`).

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::{here, userbpf_run};

fn tmp() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("override")
}

fn target() -> PathBuf {
    static ONCE: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    ONCE.get_or_init(|| {
        userbpf_testutil::compile_c(&here("targets/override_target.c"), &tmp().join("override_target"), &["-pthread"])
    })
    .clone()
}

fn object(name: &str) -> PathBuf {
    userbpf_testutil::compile_bpf(&here(&format!("bpf/{name}.bpf.c")), &tmp().join("bpf"))
}

const ENGINES: [&[&str]; 2] = [&[], &["--interpreter"]];
/// The functions of `override_target sizes`, one per way the hook probes.
const FUNCS: [&str; 5] = ["ov_jmp", "ov_pad", "ov_bp", "ov_endbr", "ov_c"];

/// `userbpf run OBJ [ENGINE] --attach A... -- target ARGS`: stdout, asserting success.
fn run(obj: &Path, engine: &[&str], attach: &[&str], args: &[&str]) -> String {
    let mut extra: Vec<&str> = engine.to_vec();
    for a in attach {
        extra.push("--attach");
        extra.push(a);
    }
    let t = target();
    let mut cmd = vec![t.to_str().unwrap()];
    cmd.extend_from_slice(args);
    let (out, err, ok) = userbpf_run(obj, &extra, &cmd);
    assert!(ok, "{engine:?} {attach:?} {args:?}: {out}\n{err}");
    assert!(!err.contains("userbpf-agent:"), "{engine:?} {attach:?}: the agent complained: {err}");
    out
}

fn line_value(out: &str, prefix: &str) -> i64 {
    out.lines()
        .find_map(|l| l.strip_prefix(prefix))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no `{prefix}` line in {out}"))
}

/// ov_jmp (7 bytes: inline jump), ov_pad (4 bytes and padding: a jump into the padding),
/// ov_bp (4 bytes, no padding: a breakpoint), ov_endbr (endbr64 first, the jump after it),
/// ov_c (5 bytes): odd arguments skip the function and return 1000 + x; the other functions
/// of the run are untouched.
#[test]
fn entry_overrides_on_functions_of_every_size() {
    let obj = object("override");
    let n = 1000i64;
    let plain: i64 = (0..n).map(|i| 3 * i).sum();
    let overridden: i64 = (0..n).map(|i| if i % 2 == 1 { 1000 + i } else { 3 * i }).sum();
    for engine in ENGINES {
        for f in FUNCS {
            let out = run(&obj, engine, &[&format!("odd={f}")], &["sizes", &n.to_string()]);
            for g in FUNCS {
                let want = if g == f { overridden } else { plain };
                assert_eq!(line_value(&out, &format!("{g} sum ")), want, "{engine:?} override on {f}: {out}");
            }
            assert!(out.contains(&format!(".hits = {n},")), "{engine:?} {f}: every call ran the program: {out}");
        }
    }
}

/// The caller of an overridden function finds rbx, rbp, r12-r15 and rsp as it left them and
/// the direction flag clear (check_call verifies them after every call).
#[test]
fn the_caller_keeps_what_the_abi_says() {
    let obj = object("override");
    let n = 2000i64;
    let sum: i64 = (0..n).map(|i| if i % 2 == 1 { 1000 + i } else { 3 * i }).sum();
    for engine in ENGINES {
        let out = run(&obj, engine, &["odd=ov_check"], &["check", &n.to_string()]);
        assert!(out.contains(&format!("check ok {n} bad 0 sum {sum}\n")), "{engine:?}: {out}");
    }
}

/// Several programs on one function: they run as the kernel runs a probe's consumers, the last
/// attached first (`userbpf run` attaches in the object's order: `first`, then `second`; so
/// `second` runs, then `first`), and the last override to run is what the caller gets:
/// `first`'s 5.
#[test]
fn the_last_override_wins() {
    let obj = object("override");
    for engine in ENGINES {
        let out = run(&obj, engine, &["second=ov_c", "first=ov_c"], &["sizes", "100"]);
        assert_eq!(line_value(&out, "ov_c sum "), 500, "{engine:?}: {out}");
    }
}

/// ov_rec(10) recurses through ten frames; the call with n == 5 is overridden (1000), so its
/// callers add 5 to it.
#[test]
fn recursion() {
    let obj = object("override");
    for engine in ENGINES {
        let out = run(&obj, engine, &["rec=ov_rec"], &["rec", "10"]);
        assert_eq!(line_value(&out, "rec "), 1005, "{engine:?}: {out}");
        // 300 frames deep, overridden near the bottom.
        let out = run(&obj, engine, &["rec=ov_rec"], &["rec", "300"]);
        assert_eq!(line_value(&out, "rec "), 295 + 1000, "{engine:?}: {out}");
    }
}

/// libc's fdatasync, in a shared library: fdatasync(999) (a bad descriptor, EBADF) returns 0
/// without reaching the kernel; a real file's still syncs (0).
#[test]
fn in_a_shared_library() {
    let obj = object("override");
    let libc = libc_path();
    let at = format!("sync_bad={}:fdatasync", libc.display());
    for engine in ENGINES {
        let out = run(&obj, engine, &[&at], &["lib"]);
        assert!(out.contains("fdatasync bad 0 errno 0\n"), "{engine:?}: {out}");
        assert!(out.contains("fdatasync file 0\n"), "{engine:?}: {out}");
    }
    // Without the program: EBADF.
    let out = Command::new(target()).arg("lib").output().unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains(&format!("fdatasync bad -1 errno {}\n", libc::EBADF)));
}

/// The libc the target maps (from ldd).
fn libc_path() -> PathBuf {
    let out = Command::new("ldd").arg(target()).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.lines()
        .find(|l| l.contains("libc.so"))
        .and_then(|l| l.split("=>").nth(1))
        .and_then(|r| r.split_whitespace().next())
        .map(PathBuf::from)
        .unwrap_or_else(|| panic!("no libc in ldd's output: {text}"))
}

/// Eight threads calling the overridden function at once: every thread gets its overrides.
#[test]
fn threads() {
    let obj = object("override");
    let n = 20000i64;
    let want: i64 = (0..n).map(|i| if i % 2 == 1 { 1000 + i } else { 3 * i }).sum();
    for engine in ENGINES {
        let out = run(&obj, engine, &["odd=ov_c"], &["threads", "8", &n.to_string()]);
        for k in 0..8 {
            assert_eq!(line_value(&out, &format!("thread {k} sum ")), want, "{engine:?} thread {k}: {out}");
        }
        assert!(out.contains(&format!(".hits = {},", 8 * n)), "{engine:?}: {out}");
    }
}

/// A uretprobe replaces return values (multiples of 9 become 7777).
#[test]
fn return_overrides() {
    let obj = object("override");
    let want: i64 = (0..100i64).map(|i| if (3 * i) % 9 == 0 { 7777 } else { 3 * i }).sum();
    for engine in ENGINES {
        for f in FUNCS {
            let out = run(&obj, engine, &[&format!("ret9={f}")], &["sizes", "100"]);
            assert_eq!(line_value(&out, &format!("{f} sum ")), want, "{engine:?} {f}: {out}");
        }
    }
}

/// The return probes of an overridden function fire, seeing the override's value, as the
/// kernel's kretprobes do (on every probe method, the lean path and the general one).
#[test]
fn return_probes_see_the_override() {
    let obj = object("override");
    let n = 100i64;
    let want: i64 = (0..n).map(|i| if i % 2 == 1 { 1000 + i } else { 3 * i }).sum();
    for engine in ENGINES {
        for f in FUNCS {
            let out = run(&obj, engine, &[&format!("odd={f}"), &format!("ret_count={f}")], &["sizes", &n.to_string()]);
            assert_eq!(line_value(&out, &format!("{f} sum ")), want, "{engine:?} {f}: {out}");
            assert!(
                out.contains(&format!(".hits = {n}, .ret_seen = {n}, .ret_sum = {want} }}")),
                "{engine:?} {f}: every return seen with its value: {out}"
            );
        }
    }
}

/// `SEC("uprobe.w")`: ov_args(a, b) runs with a + 1 and 2 * b.
#[test]
fn argument_writes() {
    let obj = object("override_args");
    let n = 100i64;
    let want: i64 = (0..n).map(|i| (i + 1) * 1000 + 4 * i).sum();
    for engine in ENGINES {
        let out = run(&obj, engine, &["args=ov_args"], &["args", &n.to_string()]);
        assert_eq!(line_value(&out, "args sum "), want, "{engine:?}: {out}");
    }
}

/// The same store in a plain uprobe section is refused at load, naming the instruction and
/// the section that would allow it; so is an override inside a function or on a USDT probe
/// (the kernel's rule: function entries only).
#[test]
fn what_is_refused() {
    let obj = object("override_args_refused");
    let t = target();
    let (_, err, ok) = userbpf_run(&obj, &["--attach", "args=ov_args"], &[t.to_str().unwrap(), "args", "3"]);
    assert!(!ok);
    assert!(
        err.contains("program `args` (section uprobe): instruction 2: invalid bpf_context access off=112 size=8"),
        "{err}"
    );
    assert!(err.contains("SEC(\"uprobe.w"), "the hint names the extension: {err}");

    let obj = object("override_usdt");
    let (_, err, ok) = userbpf_run(&obj, &["--attach", "usdt_ov=ov:here"], &[t.to_str().unwrap(), "usdt", "3"]);
    assert!(!ok);
    assert!(
        err.contains(
            "program `usdt_ov` calls bpf_override_return, which needs a probe at a function's entry, not USDT probe ov:here"
        ),
        "{err}"
    );
    let obj = object("override");
    let (_, err, ok) = userbpf_run(&obj, &["--attach", "odd=ov_check+4"], &[t.to_str().unwrap(), "check", "3"]);
    assert!(!ok);
    assert!(
        err.contains(
            "program `odd` calls bpf_override_return, which needs a probe at a function's entry; ov_check+4 is 4 bytes into its function"
        ),
        "{err}"
    );
}

/// A thread is inside ov_slow, another calls ov_c(3) in a tight loop (in its first bytes while
/// they are patched), and the main thread calls ov_c(1) on request, when `userbpf attach` puts
/// the override in: the call in progress finishes as it began (21), every call returns what
/// the function computes (9) or the override (1003), and once attached ov_c(1) returns 1001.
#[test]
fn attached_while_the_function_runs_in_another_thread() {
    use userbpf_runtime::{LinkRecord, Session};
    let shm = tmp().join(format!("shm-{}", std::process::id()));
    std::fs::create_dir_all(&shm).unwrap();
    // SAFETY: (of the environment change) only this test of the file reads it.
    unsafe { std::env::set_var("USERBPF_SHM_DIR", &shm) };
    let t = target();
    let mut child = Command::new(&t).arg("wait").stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut stdin = child.stdin.take().unwrap();
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line, "inside\n");
    let mut calls = |stdin: &mut std::process::ChildStdin| {
        stdin.write_all(b"call\n").unwrap();
        let mut l = String::new();
        out.read_line(&mut l).unwrap();
        l
    };
    assert_eq!(calls(&mut stdin), "c 3\n");

    let session = Session::open("override-attach").unwrap();
    let obj = object("override");
    let slots = std::sync::Arc::new(userbpf_runtime::context::CpuSlots::open(&session.layout().cpus()).unwrap());
    let opts = userbpf_runtime::loader::LoadOptions {
        engine: userbpf_runtime::Engine::Jit,
        helpers: userbpf_runtime::helpers::registry(),
        only: None,
    };
    let loaded =
        userbpf_runtime::load_object(&session, userbpf_object::Object::open(&obj).unwrap(), &opts, slots).unwrap();
    let prog_id = loaded.programs.iter().find(|p| p.0.name == "odd").expect("program odd").0.id;
    let bss = loaded.maps.iter().find(|m| m.record.name.ends_with(".bss")).unwrap().map.clone();
    let hits = || {
        let mut v = vec![0u8; bss.value_buf_size()];
        bss.lookup_elem(&0u32.to_le_bytes(), &mut v).unwrap();
        u64::from_le_bytes(v[..8].try_into().unwrap())
    };
    for f in ["ov_c", "ov_slow"] {
        session.add_link(LinkRecord::uprobe(prog_id, t.display().to_string(), f)).unwrap();
    }
    let r = Command::new(common::userbpf())
        .args(["attach", &child.id().to_string(), "--session", "override-attach"])
        .env("USERBPF_SHM_DIR", &shm)
        .output()
        .unwrap();
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let l = calls(&mut stdin);
        if l == "c 1001\n" {
            break;
        }
        assert_eq!(l, "c 3\n");
        assert!(Instant::now() < deadline, "ov_c is never overridden");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(calls(&mut stdin), "c 1001\n");
    assert!(hits() >= 2);
    stdin.write_all(b"go\n").unwrap();
    drop(stdin);
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut out, &mut rest).unwrap();
    assert!(child.wait().unwrap().success(), "{rest}");
    assert_eq!(
        rest, "slow 21\nspin bad 0 overridden some\n",
        "the call in progress ran to its end; the thread calling ov_c in a loop while it was patched got 9, then 1003"
    );
}

/// A libbpf loader through `userbpf load`: bpf_override_return in a SEC("uprobe") program and
/// an argument write in a SEC("uprobe.w") one (registered with libbpf by
/// include/userbpf/libbpf.h, which asks for it with a prog_flags bit), auto-attached, on
/// bt_target run under `userbpf start` (JIT, then interpreter): its workload's sum moves by
/// exactly what they change.
#[test]
fn through_a_libbpf_loader() {
    use common::{Proc, Via, loader_command, parse_ready, private_copy, target_command, wait_attached};
    let dir = tmp().join("loader");
    let target = private_copy(&common::bt_target(), &dir);
    let tpath = target.to_str().unwrap().to_string();
    let obj = dir.join("override_load.bpf.o");
    let st = Command::new("clang")
        .args(userbpf_testutil::BPF_CFLAGS)
        .arg(format!("-DTARGET=\"{tpath}\""))
        .arg("-o")
        .arg(&obj)
        .arg(here("bpf/override_load.bpf.c"))
        .status()
        .unwrap();
    assert!(st.success(), "clang override_load.bpf.c");
    let loader = dir.join("override_loader");
    let st = Command::new("cc")
        .args(["-O2", "-g", "-Wall", "-Werror", "-I"])
        .arg(common::repo("include"))
        .arg("-o")
        .arg(&loader)
        .arg(here("targets/loaders/override_loader.c"))
        .args(["-lbpf", "-lelf", "-lz"])
        .status()
        .unwrap();
    assert!(st.success(), "cc override_loader.c");
    // The workload's sum without programs.
    let base = Command::new(&target).arg("--now").output().unwrap();
    let base = String::from_utf8_lossy(&base.stdout).into_owned();
    let base: i64 =
        base.trim().strip_prefix("target: sum ").and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("{base}"));

    for interpreter in [false, true] {
        let session = format!("override-loader-{}-{interpreter}", std::process::id());
        let mut l = Proc::spawn(
            "override_loader",
            loader_command(Via::Userbpf, &session, &[loader.to_str().unwrap(), obj.to_str().unwrap()]),
        );
        l.wait_for("attached\n", "attaching");
        let mut cmd = target_command(Via::Userbpf, &session, &[&tpath]);
        if interpreter {
            cmd.env("USERBPF_INTERPRETER", "1");
        }
        let mut t = Proc::spawn("bt_target", cmd);
        t.wait_for("\nend\n", "its ready lines");
        let ready = parse_ready(&t.stdout());
        wait_attached(&mut t, &ready, &["add".to_string(), "six".to_string()], &mut l);
        t.send("go\n");
        t.wait_for("done ", "the end of its workload");
        common::interrupt(&mut l);
        assert!(l.wait_exit("after SIGINT").success(), "{}\n{}", l.stdout(), l.stderr());
        t.close_stdin();
        assert!(t.wait_exit("once its stdin closed").success());
        common::remove_session(&session);
        let out = t.stdout();
        let done: i64 = out
            .lines()
            .find_map(|x| x.strip_prefix("done "))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("{out}"));
        // add(105, 5): 110 -> 1000000; six(a, ...) x 12: a + 1, so 100000 more each.
        assert_eq!(
            done - base,
            (1_000_000 - 110) + 12 * 100_000,
            "interpreter {interpreter}: target: {out}\nloader: {}{}",
            l.stdout(),
            l.stderr()
        );
        assert!(l.stdout().contains("add_hits 30 six_hits 12\n"), "interpreter {interpreter}: {}", l.stdout());
    }
}
