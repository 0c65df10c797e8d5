#!/usr/bin/env python3
"""Delivery latency of perf buffer events end to end (`make bench`): a BCC Python tool, unchanged
through `userbpf load` and directly on the kernel, with a uprobe on a small target's `tick()`
writing `bpf_ktime_get_ns()` to a perf buffer; the tool's callback subtracts it from its own
CLOCK_MONOTONIC (the same clock on both sides), so the figure is everything from the probe to
the tool's Python: the producer's write, the wake-up (or, under userbpf, the syscall server's
watcher thread noticing the ring: crates/maps/src/linger.rs), the perf buffer descriptor polling
readable, BCC's epoll and its callback.

The target calls `tick()` N times, GAP ms apart (nanosleep): 200 ms apart every event comes after
a quiet period (under userbpf the watcher sleeps on the futex and the probe wakes it), 5 and 1 ms
apart events come while the watcher lingers (no wake-up; it looks every 1 ms at most). Printed
per configuration and gap: events received, latency median, 90th percentile and maximum, and the
load average. It reports; it never fails on timing.

Environment: USERBPF (the CLI, default target/release/userbpf), WBENCH_BASE (a directory with
another build's `userbpf` and its libraries, e.g. main's: measured beside ours),
BCC_KERNEL_SOURCE (kernel headers for BCC; default: scripts/bcc-kernel-source.sh).
"""

import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
USERBPF = os.path.abspath(os.environ.get("USERBPF", os.path.join(ROOT, "target", "release", "userbpf")))
BASE = os.environ.get("WBENCH_BASE", "")
PYTHON = "/usr/bin/python3"  # Debian's, with python3-bpfcc
GAPS = [("200", 15), ("5", 200), ("1", 500)]

TARGET = r"""
#include <stdlib.h>
#include <time.h>
__attribute__((noinline)) long tick(long x) { asm volatile("" ::: "memory"); return x; }
int main(int argc, char **argv) {
	long n = atol(argv[1]);
	double gap_ms = atof(argv[2]);
	struct timespec ts = { (time_t)(gap_ms / 1000), (long)((gap_ms - 1000 * (long)(gap_ms / 1000)) * 1e6) };
	for (long i = 0; i < n; i++) {
		tick(i);
		nanosleep(&ts, NULL);
	}
	return 0;
}
"""

TOOL = r"""
import ctypes, os, subprocess, sys, time
from bcc import BPF
target, n, gap = sys.argv[1], int(sys.argv[2]), sys.argv[3]
b = BPF(text='''
#include <uapi/linux/ptrace.h>
BPF_PERF_OUTPUT(ev);
int on_tick(struct pt_regs *ctx) { u64 t = bpf_ktime_get_ns(); ev.perf_submit(ctx, &t, sizeof t); return 0; }
''')
b.attach_uprobe(name=target, sym="tick", fn_name="on_tick")
lat = []
def cb(cpu, data, size):
    lat.append(time.monotonic_ns() - ctypes.cast(data, ctypes.POINTER(ctypes.c_uint64)).contents.value)
b["ev"].open_perf_buffer(cb)
cmd = [target, str(n), gap]
if os.environ.get("WBENCH_CLI"):
    cmd = [os.environ["WBENCH_CLI"], "start"] + cmd
p = subprocess.Popen(cmd)
while p.poll() is None:
    b.perf_buffer_poll(200)
b.perf_buffer_poll(500)
lat.sort()
if lat:
    print(f"RESULT {len(lat)} {lat[len(lat) // 2] / 1e3:.0f} {lat[int(len(lat) * 0.9)] / 1e3:.0f} {lat[-1] / 1e3:.0f}", flush=True)
else:
    print("RESULT 0", flush=True)
"""


def loadavg():
    try:
        return open("/proc/loadavg").read().split()[0]
    except OSError:
        return "?"


def kernel_source():
    ks = os.environ.get("BCC_KERNEL_SOURCE")
    if ks:
        return ks
    r = subprocess.run([os.path.join(ROOT, "scripts", "bcc-kernel-source.sh")], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"latency bench: no kernel headers for BCC: {r.stderr.strip()}")
    return r.stdout.strip()


def main():
    load0 = loadavg()
    ks = kernel_source()
    configs = [("kernel", None)]
    if BASE:
        configs.append((f"userbpf load, {BASE}", os.path.join(os.path.abspath(BASE), "userbpf")))
    configs.append(("userbpf load", USERBPF))
    with tempfile.TemporaryDirectory(prefix="wbench-lat-") as d:
        target = os.path.join(d, "tick")
        src = os.path.join(d, "tick.c")
        open(src, "w").write(TARGET)
        subprocess.run(["cc", "-O2", "-o", target, src], check=True)
        tool = os.path.join(d, "tool.py")
        open(tool, "w").write(TOOL)
        print("## Delivery latency: a perf buffer event from a uprobe to BCC's Python callback")
        print()
        print("A BCC tool (uprobe on a target's `tick()`, `bpf_ktime_get_ns()` into a perf buffer, the callback "
              "subtracting it from CLOCK_MONOTONIC), on the kernel and unchanged through `userbpf load` "
              "(the target under `userbpf start`); events GAP ms apart.")
        print()
        print("| configuration | pace | events | latency median µs | latency p90 µs | latency max µs |")
        print("|---|---:|---:|---:|---:|---:|")
        for name, cli in configs:
            for gap, n in GAPS:
                env = dict(os.environ, BCC_KERNEL_SOURCE=ks)
                cmd = [PYTHON, tool, target, str(n), gap]
                if cli:
                    env.update(USERBPF_SESSION=f"wbench-lat-{os.getpid()}", WBENCH_CLI=cli)
                    cmd = [cli, "load"] + cmd
                r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
                got = next((l.split()[1:] for l in r.stdout.splitlines() if l.startswith("RESULT")), None)
                if not got or got[0] == "0":
                    print(f"| {name} | 1 every {gap} ms | failed: {(r.stdout + r.stderr).strip()[-300:]!r} | | | |")
                    continue
                print(f"| {name} | 1 every {gap} ms | {got[0]} / {n} | {got[1]} | {got[2]} | {got[3]} |", flush=True)
    print()
    print(f"Load average {load0} at the start, {loadavg()} at the end.")


if __name__ == "__main__":
    main()
