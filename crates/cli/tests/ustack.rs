//! User stacks taken at uprobes and uretprobes by `userbpf run`, compared with the kernel's
//! (bpftrace's `ustack` on the same target) and with the frames the target's code implies.
//!
//! The kernel's user callchain at a uprobe is the instruction pointer, then the return
//! address at `[sp]` only when the probed instruction is `push %rbp` (or `endbr64` on IBT
//! kernels), then the frame-pointer walk: at a frameless leaf the direct caller is missing.
//! At a uretprobe it starts at the return address.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

mod common;
use common::{agent, repo};

fn tmp() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("ustack")
}

/// The target's functions: (start, name), sorted.
fn symbols(target: &Path) -> Vec<(u64, String)> {
    let out = Command::new("nm").arg("-n").arg(target).output().expect("running nm");
    assert!(out.status.success());
    let mut syms: Vec<(u64, String)> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (a, t, n) = (f.next()?, f.next()?, f.next()?);
            if !matches!(t, "T" | "t") {
                return None;
            }
            Some((u64::from_str_radix(a, 16).ok()?, n.to_string()))
        })
        .collect();
    syms.sort();
    syms
}

/// `name+off` for an address of the target, or None outside its code.
fn symbolise(syms: &[(u64, String)], addr: u64) -> Option<String> {
    let end = syms.iter().find(|(_, n)| n == "_fini")?.0;
    if addr >= end || addr < syms.first()?.0 {
        return None;
    }
    let (start, name) = syms.iter().rev().find(|(a, _)| *a <= addr)?;
    Some(format!("{name}+{}", addr - start))
}

/// A stack as the target's frames (`name+off`), cut at the first frame outside it (libc's
/// frames differ from run to run).
fn frames(syms: &[(u64, String)], ips: &[u64]) -> Vec<String> {
    ips.iter().map_while(|&ip| symbolise(syms, ip)).collect()
}

/// `userbpf run`'s dump of stack trace maps: map name -> set of stacks.
fn our_stacks(out: &str, syms: &[(u64, String)]) -> BTreeMap<String, BTreeSet<Vec<String>>> {
    let mut res: BTreeMap<String, BTreeSet<Vec<String>>> = BTreeMap::new();
    let mut map = None;
    for l in out.lines() {
        if let Some(m) = l.strip_prefix('@').and_then(|m| m.strip_suffix(':')) {
            map = Some(m.to_string());
        } else if let (Some(m), Some(v)) = (&map, l.split_once(", value = ").map(|(_, v)| v)) {
            let bytes: Vec<u8> = v.split_whitespace().filter_map(|b| u8::from_str_radix(b, 16).ok()).collect();
            let ips: Vec<u64> = bytes.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap())).collect();
            if m.ends_with("_stacks") {
                res.entry(m.clone()).or_default().insert(frames(syms, &ips));
            }
        }
    }
    res
}

/// bpftrace's `@name[\n  frame\n  ...\n]: count` output: name -> set of stacks. Frames are
/// addresses (the target has exited when bpftrace prints) or `name+off`.
fn kernel_stacks(out: &str, syms: &[(u64, String)]) -> BTreeMap<String, BTreeSet<Vec<String>>> {
    let mut res: BTreeMap<String, BTreeSet<Vec<String>>> = BTreeMap::new();
    let mut cur: Option<(String, Vec<String>, bool)> = None;
    for l in out.lines() {
        if let Some(name) = l.strip_prefix('@').and_then(|n| n.strip_suffix('[')) {
            cur = Some((name.to_string(), Vec::new(), false));
        } else if l.starts_with("]:") {
            if let Some((name, f, _)) = cur.take() {
                res.entry(name).or_default().insert(f);
            }
        } else if let Some((_, f, done)) = cur.as_mut() {
            let t = l.trim();
            let frame = match t.strip_prefix("0x").map(|h| u64::from_str_radix(h, 16)) {
                Some(Ok(a)) => symbolise(syms, a),
                _ => t.split_once('+').filter(|(n, _)| syms.iter().any(|(_, s)| s == n)).map(|_| t.to_string()),
            };
            match frame {
                Some(fr) if !*done => f.push(fr),
                _ => *done = true,
            }
        }
    }
    res
}

fn names(stack: &[String]) -> Vec<&str> {
    stack.iter().map(|f| f.split('+').next().unwrap()).collect()
}

#[test]
fn user_stacks_match_the_kernels_callchains() {
    let dir = tmp();
    // Not position-independent: the same addresses in both runs.
    let target = userbpf_testutil::compile_c(
        &repo("crates/cli/tests/targets/ustack_target.c"),
        &dir.join("ustack_target"),
        &["-no-pie", "-fno-optimize-sibling-calls"],
    );
    let syms = symbols(&target);
    let obj = userbpf_testutil::compile_bpf(&repo("crates/cli/tests/bpf/ustack.bpf.c"), &dir);
    let t = target.to_str().unwrap();

    let out = Command::new(env!("CARGO_BIN_EXE_userbpf"))
        .env("USERBPF_AGENT", agent())
        .env("USERBPF_SHM_DIR", &dir)
        .arg("run")
        .arg(&obj)
        .args([
            "--attach",
            "leaf=st_leaf",
            "--attach",
            "inner=st_inner",
            "--attach",
            "ebr=st_ebr",
            "--attach",
            "leaf_ret=st_leaf",
        ])
        .args(["--", t, "3"])
        .output()
        .unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && stdout.contains("ustack_target: 3 rounds"), "{stdout}\n{stderr}");
    assert!(stdout.contains(".errors = 0 }"), "every stack taken: {stdout}");
    let ours = our_stacks(&stdout, &syms);

    // What the target's code implies (the offsets are the calls' return addresses).
    let one = |m: &str| -> Vec<String> {
        let s = &ours[m];
        assert_eq!(s.len(), 1, "{m}: {s:?}");
        s.iter().next().unwrap().clone()
    };
    let leaf: BTreeSet<Vec<&str>> = ours["leaf_stacks"].iter().map(|s| names(s)).collect();
    assert_eq!(
        leaf,
        [vec!["st_leaf", "middle", "outer_a", "main"], vec!["st_leaf", "outer_b", "main"]].into_iter().collect(),
        "a frameless leaf starting with `mov`: its direct caller is missing"
    );
    assert_eq!(names(&one("inner_stacks")), ["st_inner", "middle", "outer_a", "main"], "push %rbp: [sp] is the caller");
    assert_eq!(one("inner_stacks")[0], "st_inner+0");
    let ret: BTreeSet<Vec<&str>> = ours["ret_stacks"].iter().map(|s| names(s)).collect();
    assert_eq!(
        ret,
        [vec!["st_inner", "middle", "outer_a", "main"], vec!["st_ebr", "outer_b", "main"]].into_iter().collect(),
        "a uretprobe starts at the return address"
    );
    // bpf_get_stack saw the last leaf hit (from outer_b).
    let last = stdout.split(".leaf_last = [").nth(1).and_then(|s| s.split(']').next()).unwrap_or_default();
    let last: Vec<u64> = last.split(", ").filter_map(|v| v.parse().ok()).collect();
    assert_eq!(names(&frames(&syms, &last)), ["st_leaf", "outer_b", "main"], "{stdout}");

    // The kernel, through bpftrace.
    let script = format!(
        "uprobe:{t}:st_leaf {{ @leaf_stacks[ustack(5)] = count(); }} uprobe:{t}:st_inner {{ @inner_stacks[ustack(5)] = count(); }} \
         uprobe:{t}:st_ebr {{ @ebr_stacks[ustack(5)] = count(); }} uretprobe:{t}:st_leaf {{ @ret_stacks[ustack(5)] = count(); }}"
    );
    let cmd = format!("{t} 3");
    let k = Command::new("bpftrace")
        .args(["-e", &script, "-c", &cmd])
        .output()
        .expect("running bpftrace (make test installs it)");
    let (kout, kerr) = (String::from_utf8_lossy(&k.stdout), String::from_utf8_lossy(&k.stderr));
    assert!(
        k.status.success() && kout.contains("ustack_target: 3 rounds"),
        "bpftrace on the kernel failed:\n{kout}\n{kerr}"
    );
    let kernel = kernel_stacks(&kout, &syms);
    assert_eq!(kernel.len(), 4, "{kout}");
    assert_eq!(ours, kernel, "userbpf (left) and the kernel (right) differ\nuserbpf:\n{stdout}\nkernel:\n{kout}");
}
