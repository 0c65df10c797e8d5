#!/usr/bin/env python3
"""The agent-start benchmark (`make bench`): what the agent adds to a process's start, and what
attaching its session's links at start adds, in system calls and microseconds, beside the
target's own start without userbpf.

The target (start_target.c) does next to nothing. It is started N times in each configuration,
alternating, directly with the agent preloaded (as `userbpf start` does, without the CLI's own
process):
- no agent;
- the agent, in a new empty session (the process makes it, and removes it at exit);
- the agent, in a session with one uprobe link on the target (one inline hook placed);
- the agent, in a session with a `raw_syscalls/sys_enter` link (every system call hook);
- the agent, in a session with a link on every `syscalls:sys_enter_*` tracepoint of the kernel's
  (one program each, as bpftrace's `tracepoint:syscalls:sys_enter_*`).
A session's links are held by `userbpf run OBJ -- sleep` for the time of the run.

Prints a Markdown table: median and minimum wall time per process (fork, exec, run, exit, as
the parent sees it), the time added over the target's own start, and the process's system
calls (counted by `perf stat -e raw_syscalls:sys_enter`, the agent's threads included); then
what each part costs, beside the target's own start: the agent's start (empty session − no
agent), the attach of one uprobe link and the attach of every system call hook (each − the
empty session). It reports; it never fails on timing.

Environment: ABENCH_RUNS (starts per configuration, default 200), USERBPF (the CLI, default
target/release/userbpf, with libuserbpf_agent.so beside it).
"""

import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
USERBPF = os.path.abspath(os.environ.get("USERBPF", os.path.join(ROOT, "target", "release", "userbpf")))
AGENT = os.path.join(os.path.dirname(USERBPF), "libuserbpf_agent.so")
RUNS = max(5, int(os.environ.get("ABENCH_RUNS", "200")))
CONFIGS = ["none", "empty", "uprobe", "syscalls", "tracepoints"]
NAME = {
    "none": "no agent (the target's own start)",
    "empty": "agent, a new empty session (made and removed by the process)",
    "uprobe": "agent, one uprobe link attached at start",
    "syscalls": "agent, raw_syscalls/sys_enter link (every system call hook)",
    "tracepoints": "agent, a link on every syscalls:sys_enter_* tracepoint",
}
TRACEFS = next((d for d in ("/sys/kernel/tracing/events/syscalls", "/sys/kernel/debug/tracing/events/syscalls") if os.path.isdir(d)), None)
problems = []


def problem(what, detail=""):
    text = f"{what}: {detail.strip()}" if detail.strip() else what
    if text in problems:
        return
    problems.append(text)
    print(f"  ! {text}", file=sys.stderr, flush=True)


def build(workdir):
    target = os.path.join(workdir, "start_target")
    subprocess.run(["cc", "-O2", "-g", "-fno-omit-frame-pointer", "-o", target, os.path.join(HERE, "start_target.c")], check=True)
    objs = {}
    # One program per syscalls:sys_enter_* tracepoint of the kernel's (as bpftrace's
    # tracepoint:syscalls:sys_enter_* makes them).
    names = sorted(n for n in os.listdir(TRACEFS) if n.startswith("sys_enter_")) if TRACEFS else []
    if names:
        src = ["#include <linux/bpf.h>", "#include <bpf/bpf_helpers.h>", "long calls;"]
        src += [f'SEC("tracepoint/syscalls/{n}") int {n}(void *ctx) {{ __sync_fetch_and_add(&calls, 1); return 0; }}' for n in names]
        src.append('char LICENSE[] SEC("license") = "GPL";')
        with open(os.path.join(workdir, "start_tracepoints.bpf.c"), "w") as f:
            f.write("\n".join(src) + "\n")
        out = os.path.join(workdir, "start_tracepoints.bpf.o")
        subprocess.run(["clang", "-target", "bpf", "-g", "-O2", "-D__TARGET_ARCH_x86", "-I/usr/include/x86_64-linux-gnu",
                        "-c", "-o", out, os.path.join(workdir, "start_tracepoints.bpf.c")], check=True)
        objs["start_tracepoints"] = out
        objs["tracepoint_links"] = len(names)
        NAME["tracepoints"] = f"agent, a link on every syscalls:sys_enter_* tracepoint ({len(names)} links)"
    else:
        problem("no tracefs: the configuration with every syscalls:sys_enter_* tracepoint is left out")
    for name in ("start_uprobe", "start_syscalls"):
        out = os.path.join(workdir, f"{name}.bpf.o")
        subprocess.run(["clang", "-target", "bpf", "-g", "-O2", "-D__TARGET_ARCH_x86", "-I/usr/include/x86_64-linux-gnu",
                        "-c", "-o", out, os.path.join(HERE, f"{name}.bpf.c")], check=True)
        objs[name] = out
    return target, objs


def holder(obj, attach, shm, links_wanted=1):
    """`userbpf run OBJ -- sleep`: a session holding the object's links; returns (process, session)."""
    env = dict(os.environ, USERBPF_SHM_DIR=shm)
    cmd = [USERBPF, "run", obj] + (["--attach", attach] if attach else []) + ["--", "sleep", "3600"]
    # A process group of its own: the holder and its `sleep` are ended together.
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, start_new_session=True)
    session = f"run-{p.pid}"
    links = os.path.join(shm, f"userbpf-{os.getuid()}-{session}", "links")
    deadline = time.time() + 30
    while time.time() < deadline:
        if os.path.isdir(links) and sum(f.endswith(".json") for f in os.listdir(links)) >= links_wanted:
            return p, session
        if p.poll() is not None:
            break
        time.sleep(0.05)
    problem(f"userbpf run {os.path.basename(obj)}: no link in the session", p.stderr.read().decode() if p.poll() is not None else "")
    end_holder(p)
    return None, None


def end_holder(p):
    """Ends a holder and the command it runs (its process group)."""
    try:
        os.killpg(p.pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    try:
        p.wait(timeout=10)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()


def env_for(config, sessions, shm):
    env = dict(os.environ, USERBPF_SHM_DIR=shm)
    env.pop("LD_PRELOAD", None)
    if config != "none":
        env["LD_PRELOAD"] = AGENT
        env["USERBPF_SESSION"] = sessions.get(config) or f"abench-empty-{os.getpid()}"
    return env


def syscalls(target, env):
    r = subprocess.run(["perf", "stat", "-x,", "-e", "raw_syscalls:sys_enter", "--", target], env=env, capture_output=True, text=True)
    m = re.search(r"^(\d+),,raw_syscalls:sys_enter", r.stderr, re.M)
    if not m:
        problem("perf stat gave no count", r.stderr[-500:])
        return None
    return int(m.group(1))


def main():
    for f in (USERBPF, AGENT):
        if not os.path.exists(f):
            sys.exit(f"agent-bench: {f} is missing: run `cargo build --release --workspace`")
    for tool in ("perf", "clang", "cc"):
        if not shutil.which(tool):
            sys.exit(f"agent-bench: {tool} is missing (scripts/install-deps.sh installs it)")
    cpu = ""
    try:
        cpu = next(l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    times = {c: [] for c in CONFIGS}
    counts = {}
    with tempfile.TemporaryDirectory(prefix="abench-") as workdir:
        shm = os.path.join(workdir, "shm")
        os.mkdir(shm)
        target, objs = build(workdir)
        held, sessions = [], {}
        try:
            holders = [("uprobe", objs["start_uprobe"], f"on_entry={target}:bench_entry", 1), ("syscalls", objs["start_syscalls"], None, 1)]
            if "start_tracepoints" in objs:
                holders.append(("tracepoints", objs["start_tracepoints"], None, objs["tracepoint_links"]))
            for config, obj, attach, wanted in holders:
                p, s = holder(obj, attach, shm, wanted)
                if p:
                    held.append(p)
                    sessions[config] = s
            live = [c for c in CONFIGS if c in ("none", "empty") or c in sessions]
            envs = {c: env_for(c, sessions, shm) for c in live}
            for c in live:
                counts[c] = syscalls(target, envs[c])
            # Alternating, so that a burst of load hits every configuration alike.
            for _ in range(RUNS):
                for c in live:
                    t0 = time.perf_counter()
                    r = subprocess.run([target], env=envs[c], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
                    times[c].append(time.perf_counter() - t0)
                    if r.returncode != 0 or r.stderr:
                        # The target's stderr holds the agent's messages (an address varies).
                        detail = re.sub(r"0x[0-9a-f]+", "0x…", r.stderr.decode()[-500:])
                        problem(f"{NAME[c]}: the target exited {r.returncode}", detail)
        finally:
            for p in held:
                end_holder(p)
    load = os.getloadavg()[0]
    print(f"## agent start benchmark: {time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPUs ({cpu}), Linux {platform.release()}, load average {load:.1f}")
    print()
    print(f"### a process that does nothing, started {RUNS} times per configuration (alternating); the agent preloaded as `userbpf start` does")
    print()
    print("| configuration | median µs per process | min µs | added over no agent (median) | system calls | added system calls |")
    print("|---|---:|---:|---:|---:|---:|")
    base = statistics.median(times["none"]) if times["none"] else None
    for c in CONFIGS:
        if not times[c]:
            print(f"| {NAME[c]} | failed | | | | |")
            continue
        med, lo = statistics.median(times[c]), min(times[c])
        added = f"{1e6 * (med - base):,.0f}" if base is not None and c != "none" else "–"
        n = counts.get(c)
        dn = f"{n - counts['none']:,}" if n is not None and counts.get("none") is not None and c != "none" else "–"
        print(f"| {NAME[c]} | {1e6 * med:,.0f} | {1e6 * lo:,.0f} | {added} | {n if n is not None else '–'} | {dn} |")
    print()
    print("### what each part costs (differences of the medians and of the counts above)")
    print()
    print("| part | µs (median) | system calls | baseline: the target's own start |")
    print("|---|---:|---:|---:|")
    parts = [
        ("the agent's start (empty session − no agent)", "empty", "none"),
        ("attach of one uprobe link (uprobe − empty session)", "uprobe", "empty"),
        ("attach of every system call hook (raw_syscalls − empty session)", "syscalls", "empty"),
        ("attach of a link on every syscalls:sys_enter_* tracepoint (− empty session)", "tracepoints", "empty"),
    ]
    own = f"{1e6 * base:,.0f} µs, {counts.get('none', '–')} calls" if base is not None else "–"
    for label, a, b in parts:
        if not times[a] or not times[b]:
            print(f"| {label} | failed | | {own} |")
            continue
        dt = 1e6 * (statistics.median(times[a]) - statistics.median(times[b]))
        dn = f"{counts[a] - counts[b]:,}" if counts.get(a) is not None and counts.get(b) is not None else "–"
        print(f"| {label} | {dt:,.0f} | {dn} | {own} |")
    if problems:
        print()
        print("### Problems")
        print()
        for p in problems:
            print(f"- {p}")


if __name__ == "__main__":
    main()
