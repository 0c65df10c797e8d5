#!/usr/bin/env python3
"""The override benchmark (`make bench`): what a call overridden by bpf_override_return costs
(the function skipped, the caller given 7), with the JIT (the lean path, and the general path
with USERBPF_NO_LEAN=1) and the interpreter, beside the same probe and program not overriding
(the function runs), the unprobed call, and the kernel's uprobe hit with an empty program (the
kernel cannot override a uprobe at all: the reference is what a kernel probe costs).

Uses bench/uprobe's target and kernel loader (built by its build step into target/ubench/):
`target exe|lib|bp N` calls bench_fn (executable), lib_fn (libbenchlib.so) or sf_bp (4 bytes,
probed with a breakpoint) N times and prints the ns per call around the loop and the sum of
the results, which tells whether every call was overridden (7 N).

Every cell is the median of UBENCH_REPEATS runs (default 5) of about UBENCH_SECONDS (default
0.5 s). It reports; it never fails on timing, only when something cannot be built.
"""

import os
import re
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "bench", "uprobe"))
import bench as ub  # noqa: E402  (bench/uprobe/bench.py: build, run, the target and kload)

SECONDS = float(os.environ.get("UBENCH_SECONDS", "0.5"))
REPEATS = max(1, int(os.environ.get("UBENCH_REPEATS", "5")))
WHERE = {
    "exe": ("bench_fn", ub.TARGET, "bench_fn (executable, inline jump)"),
    "lib": ("lib_fn", ub.LIB, "lib_fn (libbenchlib.so, inline jump)"),
    "bp": ("sf_bp", ub.TARGET, "sf_bp (4 bytes, breakpoint)"),
}
# (row name, engine, program, extra environment)
CONFIGS = [
    ("no probe (the function runs)", "none", None, {}),
    ("kernel uprobe, empty program (no override possible)", "kernel", None, {}),
    ("userbpf JIT, program not overriding (the function runs)", "jit", "never", {}),
    ("userbpf JIT, override (the function skipped)", "jit", "always", {}),
    ("userbpf JIT general path (USERBPF_NO_LEAN=1), override", "jit", "always", {"USERBPF_NO_LEAN": "1"}),
    ("userbpf interpreter, program not overriding", "interp", "never", {}),
    ("userbpf interpreter, override", "interp", "always", {}),
]
CALIBRATE = {"none": 2_000_000, "kernel": 2_000, "jit": 50_000, "interp": 20_000}


def obj(prog):
    return os.path.join(ub.BUILD, f"override-{prog}.bpf.o")


def build():
    ub.build()
    bpf = ["clang", "-target", "bpf", "-g", "-O2", "-D__TARGET_ARCH_x86", "-I/usr/include/x86_64-linux-gnu", "-c"]
    src = os.path.join(HERE, "override.bpf.c")
    for prog, flags in (("always", ["-DALWAYS"]), ("never", [])):
        r = subprocess.run(bpf + flags + ["-o", obj(prog), src], capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"override-bench: building failed: {r.stderr}")


def once(where, engine, prog, env_extra, n, what):
    func, binary, _ = WHERE[where]
    cmd = [ub.TARGET, where, str(n)]
    if engine == "kernel":
        cmd = [ub.KLOAD, ub.obj("noop-entry"), binary, func, "--"] + cmd
    elif engine != "none":
        spec = func if binary == ub.TARGET else f"{binary}:{func}"
        cmd = [ub.USERBPF, "run", obj(prog)] + (["--interpreter"] if engine == "interp" else []) + ["--attach", f"ov={spec}", "--"] + cmd
    env = dict(os.environ, **env_extra)
    out = ub.run(cmd, what, env=env)
    if out is None:
        return None
    stdout, stderr = out
    if engine in ("jit", "interp"):
        ub.agent_messages(stderr, what)
    m = re.search(r"ns_per_call=([\d.]+) cpu_ns_per_call=([\d.]+) calls=(\d+) sum=(-?\d+)", stdout)
    if not m:
        ub.problem(f"{what}: the target printed no timing", stdout[-1000:] + stderr[-1000:])
        return None
    total = int(m.group(4))
    if prog == "always" and total != 7 * n:
        ub.problem(f"{what}: sum {total}, expected {7 * n}: not every call was overridden", "")
        return None
    if prog != "always" and total == 7 * n:
        ub.problem(f"{what}: the calls were overridden", "")
        return None
    return float(m.group(2))


def measure(where, name, engine, prog, env_extra):
    what = f"{name}, {WHERE[where][2]}"
    first = once(where, engine, prog, env_extra, CALIBRATE[engine], what)
    if first is None:
        return None
    n = int(min(ub.MAX_CALLS, max(CALIBRATE[engine], SECONDS * 1e9 / max(first, 0.1))))
    runs = []
    for _ in range(REPEATS):
        r = once(where, engine, prog, env_extra, n, what)
        if r is None:
            return None
        runs.append(r)
    med = statistics.median(runs)
    print(f"  {what}: median {med:.2f} ns/call CPU over {REPEATS} runs ({min(runs):.2f}-{max(runs):.2f}), {n} calls", file=sys.stderr, flush=True)
    return med


def main():
    t0 = time.time()
    build()
    load = os.getloadavg()[0]
    print(f"\n### bpf_override_return: ns per call (CPU time), median of {REPEATS} runs, load average {load:.1f}, {time.strftime('%Y-%m-%d %H:%M')}\n")
    results = {}
    for where in WHERE:
        for name, engine, prog, env_extra in CONFIGS:
            results[(where, name)] = measure(where, name, engine, prog, env_extra)
    cols = list(WHERE)
    print("| configuration | " + " | ".join(WHERE[w][2] for w in cols) + " |")
    print("|---|" + "---:|" * len(cols))
    for name, *_ in CONFIGS:
        cells = []
        for w in cols:
            v = results[(w, name)]
            base = results[(w, CONFIGS[0][0])]
            if v is None:
                cells.append("–")
            elif base is None or name == CONFIGS[0][0]:
                cells.append(f"{v:.1f}")
            else:
                cells.append(f"{v:.1f} (+{v - base:.1f})")
        print(f"| {name} | " + " | ".join(cells) + " |")
    print("\n(+N: added over the unprobed call in the same column.)\n")
    print("| override cost | " + " | ".join(WHERE[w][2] for w in cols) + " |")
    print("|---|" + "---:|" * len(cols))
    rows = [
        ("JIT: overridden call, ns", CONFIGS[3][0], None),
        ("JIT: overridden call − same probe not overriding, ns", CONFIGS[3][0], CONFIGS[2][0]),
        ("interpreter: overridden call, ns", CONFIGS[6][0], None),
        ("interpreter: overridden call − same probe not overriding, ns", CONFIGS[6][0], CONFIGS[5][0]),
        ("kernel uprobe hit (empty program) / JIT overridden call", CONFIGS[1][0], CONFIGS[3][0]),
    ]
    for label, a, b in rows:
        cells = []
        for w in cols:
            va, vb = results[(w, a)], results[(w, b)] if b else None
            if va is None or (b and vb is None):
                cells.append("–")
            elif label.startswith("kernel"):
                cells.append(f"{va / vb:.0f}×")
            elif b:
                cells.append(f"{va - vb:+.1f}")
            else:
                cells.append(f"{va:.1f}")
        print(f"| {label} | " + " | ".join(cells) + " |")
    if ub.problems:
        print("\nProblems:")
        for p in ub.problems:
            print(f"- {p}")
    print(f"(override-bench took {time.time() - t0:.0f} s)")


if __name__ == "__main__":
    main()
