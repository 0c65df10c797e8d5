#!/usr/bin/env python3
"""System call tracepoint benchmark (`make bench`): the cost of one traced system call, side by
side in one run.

The target (target.c) calls getppid() N times through libc's wrapper, then N times through an
inline `syscall` instruction of its own, and prints the nanoseconds per call of each. It runs,
alternating, R times in each configuration:
- unprobed (no agent, no tracepoint): the baseline;
- userbpf: `userbpf run count.bpf.o -- target` (a `syscalls/sys_enter_getppid` program
  counting): libc's wrapper is a rewritten site (a jump to a trampoline), the inline
  instruction goes through Syscall User Dispatch (a SIGSYS);
- userbpf with USERBPF_SYSCALL_REWRITE=0: libc's wrapper through dispatch too;
- userbpf with a program on another call only (`sys_enter_getpid`): what every call costs
  while some system call tracepoint is attached;
- kernel: the same count in the kernel (bpftrace `tracepoint:syscalls:sys_enter_getppid
  { @c = count(); }`) while the target runs without userbpf.
Prints a Markdown table of the medians (ns per call) and what each adds over the unprobed
call. Reports; never fails on timing.

Environment: SBENCH_RUNS (default 7), SBENCH_CALLS (default 200000), USERBPF (the CLI).
"""

import os
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
RUNS = max(3, int(os.environ.get("SBENCH_RUNS", "7")))
CALLS = int(os.environ.get("SBENCH_CALLS", "200000"))


def run(cmd, env=None, count=False):
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    m = re.search(r"libc ([\d.]+) inline ([\d.]+)", r.stdout)
    if r.returncode != 0 or not m:
        print(f"  ! {' '.join(cmd)}: exit {r.returncode}: {r.stderr[-400:]}", file=sys.stderr)
        return None
    if count:
        # The program's count, as `userbpf run` prints its maps at exit: every call of both
        # kinds (the warm-up round and the timed ones).
        c = re.search(r"calls = (\d+)", r.stdout)
        want = 2 * (CALLS // 21) * 22
        if not c or int(c.group(1)) != want:
            print(f"  ! the program counted {c.group(1) if c else 'nothing'} of {want} calls", file=sys.stderr)
    return float(m.group(1)), float(m.group(2))


def main():
    if not os.path.exists(USERBPF):
        sys.exit(f"syscall-bench: {USERBPF} is missing: run `make build`")
    work = tempfile.mkdtemp(prefix="userbpf-sbench-")
    try:
        target = os.path.join(work, "target")
        subprocess.run(["cc", "-O2", "-o", target, os.path.join(HERE, "target.c")], check=True)
        objs = {}
        for name in ("count", "other"):
            objs[name] = os.path.join(work, f"{name}.bpf.o")
            subprocess.run(["clang", "-target", "bpf", "-g", "-O2", "-D__TARGET_ARCH_x86", "-I/usr/include/x86_64-linux-gnu",
                            "-c", "-o", objs[name], os.path.join(HERE, f"{name}.bpf.c")], check=True)
        obj = objs["count"]
        env = dict(os.environ, USERBPF_SHM_DIR=work)
        off = dict(env, USERBPF_SYSCALL_REWRITE="0")
        res = {k: [] for k in ("none", "userbpf", "sud", "other", "kernel")}
        bpftrace = shutil.which("bpftrace")
        for _ in range(RUNS):
            res["none"].append(run([target, str(CALLS)]))
            res["userbpf"].append(run([USERBPF, "run", obj, "--", target, str(CALLS)], env, count=True))
            res["sud"].append(run([USERBPF, "run", obj, "--", target, str(CALLS)], off, count=True))
            res["other"].append(run([USERBPF, "run", objs["other"], "--", target, str(CALLS)], env))
            if bpftrace:
                bt = subprocess.Popen([bpftrace, "-e", "tracepoint:syscalls:sys_enter_getppid { @c = count(); }"],
                                      stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
                line = bt.stdout.readline()  # "Attaching 1 probe..."
                time.sleep(0.2)
                res["kernel"].append(run([target, str(CALLS)]) if "Attaching" in line else None)
                bt.send_signal(signal.SIGINT)
                try:
                    bt.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    bt.kill()
                    bt.wait()
        med = {k: (statistics.median(x[0] for x in v if x), statistics.median(x[1] for x in v if x))
               for k, v in res.items() if any(v)}
        load = os.getloadavg()[0]
        print(f"\n### System call tracepoints: one traced getppid() (ns per call, median of {RUNS} runs of {CALLS} calls; load {load:.1f})\n")
        print("| configuration | libc's wrapper | added over unprobed | inline `syscall` | added over unprobed |")
        print("|---|---:|---:|---:|---:|")
        base = med["none"]
        names = {
            "none": "unprobed (no agent, no tracepoint)",
            "userbpf": "userbpf: libc's site rewritten / inline through dispatch (SIGSYS)",
            "sud": "userbpf, USERBPF_SYSCALL_REWRITE=0: both through dispatch",
            "other": "userbpf, a program on sys_enter_getpid only (getppid has none)",
            "kernel": "kernel tracepoint (bpftrace count())",
        }
        for k in ("none", "userbpf", "sud", "other", "kernel"):
            if k not in med:
                continue
            a, b = med[k]
            print(f"| {names[k]} | {a:,.0f} | {a - base[0]:+,.0f} | {b:,.0f} | {b - base[1]:+,.0f} |")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
