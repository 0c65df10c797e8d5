//! What the agent costs a process in system calls (issue 18, item 2), counted by `strace -f
//! -c` (never timed): the agent's start in an empty session, the attach of one uprobe link,
//! the attach of every system call hook (a `raw_syscalls/sys_enter` link), and of a link on each
//! of the kernel's `syscalls:sys_enter_*` tracepoints, each made while the target starts (the benchmark's target and objects, bench/agent). Trampoline space is
//! found without a search: no `mmap` fails (a page-by-page search with `MAP_FIXED_NOREPLACE`
//! made tens of thousands of failing calls in large processes). The bounds are generous (about
//! twice what was measured on 2026-11-25: the start 378 system calls, a uprobe 163, every system
//! call hook 280) and far below the search's cost.

use std::path::{Path, PathBuf};
use std::process::Command;

use userbpf_runtime::{LinkRecord, Session};

mod common;
use common::{agent, load_counter, repo};

fn tmp() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("attach_cost")
}

fn shm() -> PathBuf {
    let d = tmp().join("shm");
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The system calls of the process tree of `env [LD_PRELOAD=agent USERBPF_SESSION=session]
/// target`: the total, and the failed `mmap` calls.
fn count(target: &Path, session: Option<&str>, out: &str) -> (u64, u64) {
    let file = tmp().join(out);
    let mut c = Command::new("strace");
    c.args(["-f", "-c", "-o"]).arg(&file).arg("env");
    if let Some(s) = session {
        c.arg(format!("LD_PRELOAD={}", agent().display())).arg(format!("USERBPF_SESSION={s}"));
    }
    let st = c
        .arg(target)
        .env("USERBPF_SHM_DIR", shm())
        .env_remove("LD_PRELOAD")
        .env_remove("USERBPF_SESSION")
        .status()
        .unwrap();
    assert!(st.success(), "{st}");
    let text = std::fs::read_to_string(&file).unwrap();
    let row = |name: &str| -> Option<(u64, u64)> {
        let line = text.lines().find(|l| l.split_whitespace().last() == Some(name))?;
        let f: Vec<&str> = line.split_whitespace().collect();
        // % time, seconds, usecs/call, calls, [errors,] name
        let calls = f.get(3)?.parse().ok()?;
        let errors = if f.len() == 6 { f[4].parse().ok()? } else { 0 };
        Some((calls, errors))
    };
    let total = row("total").unwrap_or_else(|| panic!("no total in {text}")).0;
    (total, row("mmap").map_or(0, |r| r.1))
}

/// The kernel's `sys_enter_*` tracepoints (tracefs).
fn syscall_tracepoints() -> Vec<String> {
    let dir = ["/sys/kernel/tracing/events/syscalls", "/sys/kernel/debug/tracing/events/syscalls"]
        .into_iter()
        .find(|d| Path::new(d).is_dir());
    let mut v: Vec<String> = dir
        .and_then(|d| std::fs::read_dir(d).ok())
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| e.file_name().into_string().ok())
                .filter(|n| n.starts_with("sys_enter_"))
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

#[test]
fn starting_and_attaching_cost_a_bounded_number_of_system_calls() {
    if !userbpf_testutil::require(Command::new("strace").arg("-V").output().is_ok_and(|o| o.status.success()), "strace")
    {
        return;
    }
    if !userbpf_testutil::require(!syscall_tracepoints().is_empty(), "tracefs (the kernel's syscalls tracepoints)") {
        return;
    }
    let target = userbpf_testutil::compile_c(&repo("bench/agent/start_target.c"), &tmp().join("start_target"), &[]);
    let pid = std::process::id();
    let sessions: Vec<(String, Option<(&str, LinkRecord)>)> = vec![
        (format!("cost-empty-{pid}"), None),
        (
            format!("cost-uprobe-{pid}"),
            Some(("start_uprobe", LinkRecord::uprobe(0, target.display().to_string(), "bench_entry"))),
        ),
        (
            format!("cost-syscalls-{pid}"),
            Some((
                "start_syscalls",
                LinkRecord {
                    id: 0,
                    prog_id: 0,
                    kind: "tracepoint".into(),
                    path: String::new(),
                    func: Some("raw_syscalls/sys_enter".into()),
                    offset: 0,
                    cookie: 0,
                    pid: None,
                },
            )),
        ),
    ];
    let mut held = Vec::new();
    let mut hits = Vec::new();
    // Every `syscalls:sys_enter_*` tracepoint of the kernel's, one link each (as bpftrace's
    // `tracepoint:syscalls:sys_enter_*` makes them), all with one program.
    let names = syscall_tracepoints();
    let every = format!("cost-every-{pid}");
    {
        let session = Session::open_in(&shm(), &every).unwrap();
        let object = userbpf_testutil::compile_bpf(&repo("bench/agent/start_syscalls.bpf.c"), &tmp().join("bpf"));
        let (prog_id, h) = load_counter(&session, &object);
        for n in &names {
            let record = LinkRecord {
                id: 0,
                prog_id,
                kind: "tracepoint".into(),
                path: String::new(),
                func: Some(format!("syscalls/{n}")),
                offset: 0,
                cookie: 0,
                pid: None,
            };
            session.add_link(record).unwrap();
        }
        hits.push(h);
        held.push(session);
    }
    for (name, link) in &sessions {
        // SAFETY: getuid has no preconditions.
        let uid = unsafe { libc::getuid() };
        let _ = std::fs::remove_dir_all(shm().join(format!("userbpf-{uid}-{name}")));
        if let Some((obj, record)) = link {
            let session = Session::open_in(&shm(), name).unwrap();
            let object = userbpf_testutil::compile_bpf(&repo(&format!("bench/agent/{obj}.bpf.c")), &tmp().join("bpf"));
            let (prog_id, h) = load_counter(&session, &object);
            session.add_link(LinkRecord { prog_id, ..record.clone() }).unwrap();
            hits.push(h);
            held.push(session);
        }
    }
    let (none, _) = count(&target, None, "none.txt");
    let (empty, empty_failed) = count(&target, Some(&sessions[0].0), "empty.txt");
    let (uprobe, uprobe_failed) = count(&target, Some(&sessions[1].0), "uprobe.txt");
    let (syscalls, syscalls_failed) = count(&target, Some(&sessions[2].0), "syscalls.txt");
    let (all, all_failed) = count(&target, Some(&every), "every.txt");
    eprintln!(
        "system calls: none {none}, empty session {empty}, uprobe {uprobe}, every system call hook {syscalls}, {} tracepoint links {all}",
        names.len()
    );
    // The links were attached: their programs ran.
    assert!(hits[0]() >= 1, "the syscalls:sys_enter_* tracepoints did not fire");
    assert!(hits[1]() >= 1, "the uprobe did not fire");
    assert!(hits[2]() >= 1, "the system call tracepoint did not fire");
    assert_eq!(
        (empty_failed, uprobe_failed, syscalls_failed, all_failed),
        (0, 0, 0, 0),
        "failed mmap calls: a search for trampoline space"
    );
    // Linear in the links (a few files each): 5,595 over the empty session for 360 links on
    // 2026-11-25, where reading every program record for each link made over a million.
    assert!(
        all - empty <= 100 * names.len() as u64,
        "attaching {} tracepoint links: {} system calls",
        names.len(),
        all - empty
    );
    assert!(empty - none <= 800, "the agent's start: {} system calls", empty - none);
    assert!(uprobe - empty <= 400, "attaching one uprobe: {} system calls", uprobe - empty);
    assert!(syscalls - empty <= 600, "attaching every system call hook: {} system calls", syscalls - empty);
}
