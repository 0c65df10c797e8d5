#!/usr/bin/env python3
"""The uprobe benchmark (`make bench`): what a probe hit costs with no probe, a kernel
uprobe and userbpf (JIT and interpreter), for uprobe, uretprobe and both, on a function of the
executable and one of a shared library; the hit of each way userbpf plants a probe (inline
jump, jump into the padding, breakpoint) on a short function beside the kernel's uprobe on the
same function; the hit of counting programs that use helpers and per-CPU maps (bpftrace's
count(), @x[tid] = count(), sum(arg0) and hist(arg0), unmodified, through the kernel and
through `userbpf load`; a libbpf per-CPU array counter through the kernel and `userbpf run`);
then fio's IOPS with a counting probe on td_io_queue (an array counter, and a per-CPU one),
beside the CPU time fio's thread spends per I/O (steady where the IOPS follow the load).

Builds its C pieces (target, libbenchlib.so, kload, the count-*.bpf.o objects) into
target/ubench/, measures, prints Markdown tables and whether the targets are met. It reports;
it never fails on timing, only when something cannot be built. Problems met on the way (a
failed attach, a crash, a counter that does not match the calls) are printed verbatim.

Environment: UBENCH_SECONDS (time per measurement, default 0.5), UBENCH_REPEATS (measured runs
per cell, the fastest kept, default 3), UBENCH_FIO_RUNTIME (seconds per fio run, default 3),
UBENCH_FIO_ROUNDS (fio runs per probe, alternating, the best kept, default 2),
UBENCH_DIR (build directory), USERBPF (the CLI, default target/release/userbpf, whose agent
libuserbpf_agent.so sits beside it).
"""

import json
import os
import platform
import re
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
BUILD = os.path.abspath(os.environ.get("UBENCH_DIR", os.path.join(ROOT, "target", "ubench")))
USERBPF = os.path.abspath(os.environ.get("USERBPF", os.path.join(ROOT, "target", "release", "userbpf")))
SECONDS = float(os.environ.get("UBENCH_SECONDS", "0.5"))
REPEATS = max(1, int(os.environ.get("UBENCH_REPEATS", "3")))
FIO_RUNTIME = int(os.environ.get("UBENCH_FIO_RUNTIME", "3"))
FIO_ROUNDS = max(1, int(os.environ.get("UBENCH_FIO_ROUNDS", "2")))
FIO = "/usr/bin/fio"
FIO_COPY = os.path.join(BUILD, "fio")
TIMEOUT = 180

TARGET = os.path.join(BUILD, "target")
LIB = os.path.join(BUILD, "libbenchlib.so")
KLOAD = os.path.join(BUILD, "kload")
MODES = ["entry", "return", "both"]
MODE_NAME = {"entry": "uprobe", "return": "uretprobe", "both": "uprobe + uretprobe", "percpu": "uprobe, per-CPU array counter"}
# Modes whose object has an entry program / a return program.
ENTRY_MODES = ("entry", "both", "percpu")
RETURN_MODES = ("return", "both")
ENGINES = ["none", "kernel", "jit", "interp"]
FN_NAME = {"exe": "bench_fn (executable)", "lib": "lib_fn (libbenchlib.so)"}
# The short functions of the method table: (function, its shape, the method it gets).
SHORT = {
    "jmp": ("sf_jmp", "7 bytes", "inline jump"),
    "pad": ("sf_pad", "4 bytes + padding", "jump into the padding"),
    "bp": ("sf_bp", "4 bytes, no padding", "breakpoint (int3 + SIGTRAP)"),
}
# Not probed: an int3 caught by an empty SIGTRAP handler (the breakpoint method's floor).
TRAP = ("sf_trap", "int3 + empty handler", "none")
ENGINE_NAME = {"none": "no probe", "kernel": "kernel", "jit": "userbpf JIT", "interp": "userbpf interpreter"}
# Calls of the calibration run, per engine (then scaled to SECONDS), and the most calls per run.
CALIBRATE = {"none": 2_000_000, "kernel": 2_000, "jit": 20_000, "interp": 20_000}
CALIBRATE_TRAP = 20_000
MAX_CALLS = 100_000_000

problems = []


def problem(what, detail):
    text = f"{what}: {detail.strip()}" if detail.strip() else what
    problems.append(text)
    print(f"  ! {text}", file=sys.stderr, flush=True)


def obj(mode):
    return os.path.join(BUILD, f"count-{mode}.bpf.o")


def build():
    os.makedirs(BUILD, exist_ok=True)
    bpf = ["clang", "-target", "bpf", "-g", "-O2", "-D__TARGET_ARCH_x86", "-I/usr/include/x86_64-linux-gnu"]
    cc = ["cc", "-O2", "-g", "-fno-omit-frame-pointer", "-Wall"]
    src = lambda f: os.path.join(HERE, f)
    steps = [
        cc + ["-shared", "-fPIC", "-o", LIB, src("benchlib.c")],
        cc + ["-o", TARGET, src("target.c"), f"-L{BUILD}", "-lbenchlib", "-Wl,-rpath,$ORIGIN"],
        cc + ["-o", KLOAD, src("kload.c"), "-lbpf"],
        bpf + ["-DCOUNT_ENTRY", "-c", "-o", obj("entry"), src("count.bpf.c")],
        bpf + ["-DCOUNT_RETURN", "-c", "-o", obj("return"), src("count.bpf.c")],
        bpf + ["-DCOUNT_ENTRY", "-DCOUNT_RETURN", "-c", "-o", obj("both"), src("count.bpf.c")],
        bpf + ["-DNOOP", "-DCOUNT_ENTRY", "-c", "-o", obj("noop-entry"), src("count.bpf.c")],
        bpf + ["-DNOOP", "-DCOUNT_RETURN", "-c", "-o", obj("noop-return"), src("count.bpf.c")],
        bpf + ["-DNOOP", "-DCOUNT_ENTRY", "-DCOUNT_RETURN", "-c", "-o", obj("noop-both"), src("count.bpf.c")],
        bpf + ["-DPERCPU", "-DCOUNT_ENTRY", "-c", "-o", obj("percpu-entry"), src("count.bpf.c")],
    ]
    for cmd in steps:
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"uprobe-bench: building failed: {' '.join(cmd)}\n{r.stderr}")
    agent = os.path.join(os.path.dirname(USERBPF), "libuserbpf_agent.so")
    for f in (USERBPF, agent):
        if not os.path.exists(f):
            sys.exit(f"uprobe-bench: {f} is missing: run `cargo build --release -p userbpf-cli -p userbpf-agent`")


def run(cmd, what, env=None):
    """Runs cmd; returns (stdout, stderr) or None after recording a problem."""
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT, env=env)
    except subprocess.TimeoutExpired as e:
        problem(f"{what}: timed out after {TIMEOUT} s", (e.stderr or b"").decode(errors="replace")[-2000:] if isinstance(e.stderr, bytes) else (e.stderr or "")[-2000:])
        return None
    if r.returncode != 0:
        sig = f" (killed by signal {-r.returncode})" if r.returncode < 0 else f" (exit status {r.returncode})"
        problem(f"{what}: failed{sig}", (r.stderr + r.stdout)[-2000:])
        return None
    return r.stdout, r.stderr


def agent_messages(stderr, what):
    lines = [l for l in stderr.splitlines() if l.startswith("userbpf") and "kernel_hits" not in l]
    if lines:
        problem(f"{what}: userbpf printed", "\n    ".join(lines[:5]))


def userbpf_hits(stdout):
    """The @hits map printed by `userbpf run` at exit: {key: value}."""
    hits, inside = {}, False
    for line in stdout.splitlines():
        if line.startswith("@"):
            inside = line.strip() == "@hits:"
            continue
        m = re.match(r"key = (\d+), value = (\d+)", line.strip())
        if inside and m:
            hits[int(m.group(1))] = int(m.group(2))
        # A per-CPU array: `key = K, values = { cpu0 = V, ... }`, summed.
        m = re.match(r"key = (\d+), values = \{(.*)\}", line.strip())
        if inside and m:
            hits[int(m.group(1))] = sum(int(v) for v in re.findall(r"= (\d+)", m.group(2)))
    return hits


def kernel_hits(stderr):
    m = re.search(r"kernel_hits entry=(\d+) return=(\d+)", stderr)
    return {0: int(m.group(1)), 1: int(m.group(2))} if m else {}


def mode_obj(mode):
    """The object of a probe mode (see build)."""
    return "percpu-entry" if mode == "percpu" else mode


def probe_cmd(engine, mode, binary, func, cmd, noop=False):
    if engine == "kernel":
        return [KLOAD, obj(mode_obj(mode)), binary, func, "--"] + cmd
    spec = func if binary == TARGET else f"{binary}:{func}"
    attach = []
    if mode in ENTRY_MODES:
        attach += ["--attach", f"count_entry={spec}"]
    if mode in RETURN_MODES:
        attach += ["--attach", f"count_return={spec}"]
    return [USERBPF, "run", obj(f"noop-{mode}" if noop else mode_obj(mode))] + (["--interpreter"] if engine == "interp" else []) + attach + ["--"] + cmd


def measure_once(engine, where, mode, n, what, noop=False):
    binary, func = (TARGET, "bench_fn") if where == "exe" else (LIB, "lib_fn") if where == "lib" else (TARGET, TRAP[0]) if where == "trap" else (TARGET, SHORT[where][0])
    cmd = [TARGET, where, str(n)]
    if engine != "none":
        cmd = probe_cmd(engine, mode, binary, func, cmd, noop)
    out = run(cmd, what)
    if out is None:
        return None
    stdout, stderr = out
    m = re.search(r"ns_per_call=([\d.]+) cpu_ns_per_call=([\d.]+)", stdout)
    if not m:
        problem(f"{what}: the target printed no timing", stdout[-1000:] + stderr[-1000:])
        return None
    if engine != "none" and noop:
        agent_messages(stderr, what)
    elif engine != "none":
        agent_messages(stderr, what)
        hits = kernel_hits(stderr) if engine == "kernel" else userbpf_hits(stdout)
        want = {0: n if mode in ENTRY_MODES else 0, 1: n if mode in RETURN_MODES else 0}
        got = {k: hits.get(k) for k in (0, 1)}
        if got != want:
            problem(f"{what}: the probe counted entry={got[0]} return={got[1]}, expected entry={want[0]} return={want[1]} for {n} calls", "")
            return None
    return float(m.group(2)), float(m.group(1))


def measure(engine, where, mode, noop=False):
    place = f"{SHORT[where][0]} ({SHORT[where][2]})" if where in SHORT else f"{TRAP[0]} ({TRAP[1]})" if where == "trap" else "function in the " + ("executable" if where == "exe" else "shared library")
    what = f"no probe, {place}" if engine == "none" else f"{ENGINE_NAME[engine]}, {MODE_NAME[mode]}{' (empty program)' if noop else ''}, {place}"
    n0 = CALIBRATE_TRAP if where == "trap" else CALIBRATE[engine]
    first = measure_once(engine, where, mode, n0, what, noop)
    if first is None:
        return None
    n = int(min(MAX_CALLS, max(n0, SECONDS * 1e9 / max(first[0], 0.1))))
    best = None
    for _ in range(REPEATS):
        r = measure_once(engine, where, mode, n, what, noop)
        if r is None:
            return None
        best = r if best is None or r[0] < best[0] else best
    print(f"  {what}: {best[0]:.2f} ns/call CPU ({best[1]:.2f} wall), {n} calls", file=sys.stderr, flush=True)
    return {"cpu": best[0], "wall": best[1], "calls": n}


def fmt_ns(v):
    if v is None:
        return "failed"
    return f"{v:,.1f}" if abs(v) < 1000 else f"{v:,.0f}"


def fmt_ratio(a, b):
    if a is None or b is None or b <= 0:
        return "–"
    return f"{a / b:,.1f}×"


def uprobe_tables():
    res, hooks = {}, {}
    for where in ("exe", "lib"):
        res[(where, "none")] = measure("none", where, None)
        for mode in MODES:
            for engine in ("kernel", "jit", "interp"):
                res[(where, mode, engine)] = measure(engine, where, mode)
        for mode in MODES:
            hooks[(where, mode)] = measure("jit", where, mode, noop=True)
    print()
    print(f"### Probe hit cost: a noinline function called in a loop (ns per call, thread CPU time, fastest of {REPEATS} runs of ~{SECONDS} s)")
    print()
    print("| function | probe | no probe | kernel | userbpf JIT | userbpf interp. | kernel hit | JIT hit | interp. hit | kernel hit / JIT hit | kernel hit / interp. hit |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    hit = {}
    for where in ("exe", "lib"):
        base = res[(where, "none")]
        b = base["cpu"] if base else None
        for mode in MODES:
            cells, hits = [], {}
            for engine in ("kernel", "jit", "interp"):
                r = res[(where, mode, engine)]
                cells.append(r["cpu"] if r else None)
                hits[engine] = (r["cpu"] - b) if (r and b is not None) else None
            hit[(where, mode)] = hits
            fn = FN_NAME[where]
            row = [fn, MODE_NAME[mode], fmt_ns(b)] + [fmt_ns(c) for c in cells]
            row += [fmt_ns(hits[e]) for e in ("kernel", "jit", "interp")]
            row += [fmt_ratio(hits["kernel"], hits["jit"]), fmt_ratio(hits["kernel"], hits["interp"])]
            print("| " + " | ".join(row) + " |")
    print()
    print("Hit = probed minus unprobed ns per call (for uprobe + uretprobe: both hits of one call).")
    print("Wall-clock ns per call of the same runs (includes time spent waiting for a CPU on a busy")
    print("machine, and any part of a kernel trap not charged to the thread):")
    print()
    print("| function | probe | no probe | kernel | userbpf JIT | userbpf interp. |")
    print("|---|---|---:|---:|---:|---:|")
    for where in ("exe", "lib"):
        base = res[(where, "none")]
        fn = FN_NAME[where]
        for mode in MODES:
            cells = [res[(where, mode, e)] for e in ("kernel", "jit", "interp")]
            row = [fn, MODE_NAME[mode], fmt_ns(base["wall"] if base else None)] + [fmt_ns(c["wall"] if c else None) for c in cells]
            print("| " + " | ".join(row) + " |")
    print()
    print("The probe machinery alone: the same probes running programs that return at once (JIT;")
    print("hit = probed minus unprobed ns per call). The counting program above adds its map lookup")
    print("(inlined) and an atomic add, which costs several ns by itself on this machine:")
    print()
    print("| function | probe | userbpf JIT, empty program | hit |")
    print("|---|---|---:|---:|")
    for (where, mode), r in hooks.items():
        base = res[(where, "none")]
        h = (r["cpu"] - base["cpu"]) if (r and base) else None
        hit[(where, mode)]["empty"] = h
        print(f"| {FN_NAME[where]} | {MODE_NAME[mode]} | {fmt_ns(r['cpu'] if r else None)} | {fmt_ns(h)} |")
    print()
    calls = {}
    for k, r in res.items():
        if r:
            calls.setdefault(k[-1] if len(k) == 3 else "none", []).append(r["calls"])
    print("Calls per run: " + ", ".join(f"{ENGINE_NAME[e]} {min(calls[e]):,}–{max(calls[e]):,}" for e in ENGINES if e in calls) + ".")
    base = res[("exe", "none")]
    hit["base_exe"] = base["cpu"] if base else None
    return hit


def method_table():
    """The hit of each probe method on a short function (3 * x), beside the kernel's uprobe on
    the same function, uprobe and uretprobe, all in this run."""
    res = {}
    for where in SHORT:
        res[(where, "none")] = measure("none", where, None)
        for mode in ("entry", "return"):
            for engine in ("kernel", "jit"):
                res[(where, mode, engine)] = measure(engine, where, mode)
    floor = measure("none", "trap", None)
    print()
    print(f"### Probe methods on a short function (3 * x, called through a pointer): ns per call, thread CPU time, fastest of {REPEATS} runs of ~{SECONDS} s")
    print()
    print("| function | userbpf's method | probe | no probe | kernel | userbpf JIT | kernel hit | userbpf hit | kernel hit / userbpf hit |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|")
    hits = {}
    for where, (fn, shape, method) in SHORT.items():
        base = res[(where, "none")]
        b = base["cpu"] if base else None
        for mode in ("entry", "return"):
            k, j = res[(where, mode, "kernel")], res[(where, mode, "jit")]
            kh = (k["cpu"] - b) if (k and b is not None) else None
            jh = (j["cpu"] - b) if (j and b is not None) else None
            hits[(where, mode)] = (kh, jh)
            row = [f"{fn} ({shape})", method, MODE_NAME[mode], fmt_ns(b), fmt_ns(k["cpu"] if k else None),
                   fmt_ns(j["cpu"] if j else None), fmt_ns(kh), fmt_ns(jh), fmt_ratio(kh, jh)]
            print("| " + " | ".join(row) + " |")
    print()
    print("The method follows from the function's shape (the hook crate's tests check which one each")
    print("shape gets). A breakpoint hit is the SIGTRAP's delivery and return (two kernel entries),")
    print("then the same path as a jump; the kernel's uprobe traps too, then single-steps or")
    print("emulates the instruction and runs its program. The floor of a breakpoint on this machine,")
    b = res[("bp", "none")]
    fl = (floor["cpu"] - b["cpu"]) if (floor and b) else None
    print(f"an `int3` caught by an empty SIGTRAP handler in the same loop (no userbpf): {fmt_ns(fl)} ns a hit.")
    return hits


def fio_cmd(out):
    # --clocksource=cpu: fio otherwise picks its clock at start-up, the TSC (rdtsc, ~150 ns of
    # fio's own work per I/O here) or clock_gettime when its TSC check fails (~205 ns per
    # I/O on this VM), a choice that changed from run to run under load and moved the IOPS
    # of probed and unprobed runs alike by 25-30%. Pinned, every run reads the same clock.
    return [FIO_COPY, "--name=ubench", "--ioengine=null", "--rw=randread", "--bs=4k", "--size=1g",
            f"--runtime={FIO_RUNTIME}", "--time_based", "--numjobs=1", "--clocksource=cpu",
            "--output-format=json", f"--output={out}"]


# fio configurations: (engine, probe mode); the per-CPU counter (count.bpf.c -DPERCPU) beside
# the array one.
FIO_CONFIGS = [("none", None), ("kernel", "entry"), ("jit", "entry"), ("interp", "entry"), ("kernel", "percpu"), ("jit", "percpu")]


def fio_name(config):
    engine, mode = config
    return ENGINE_NAME[engine] + (", per-CPU array counter" if mode == "percpu" else "")


def fio_run(config):
    engine, mode = config
    out = os.path.join(BUILD, f"fio-{engine}-{mode}.json")
    if os.path.exists(out):
        os.unlink(out)
    cmd = fio_cmd(out)
    what = f"fio, {fio_name(config)}"
    if engine != "none":
        cmd = probe_cmd(engine, mode, FIO_COPY, "td_io_queue", cmd)
    r = run(cmd, what)
    if r is None:
        return None
    stdout, stderr = r
    try:
        with open(out) as f:
            job = json.load(f)["jobs"][0]["read"]
    except (OSError, ValueError, KeyError, IndexError) as e:
        problem(f"{what}: no fio result ({e})", stdout[-1000:] + stderr[-1000:])
        return None
    res = {"iops": job["iops"], "ios": job.get("total_ios", 0)}
    # The CPU time fio's job got per I/O (its usr + sys share of the job's runtime): what the
    # probe adds to each I/O, unlike the IOPS unmoved by time spent waiting for a CPU on a
    # busy machine (the IOPS of the same configuration move by a factor of two under load).
    try:
        j = json.load(open(out))["jobs"][0]
        if res["ios"]:
            res["cpu_ns"] = (j["usr_cpu"] + j["sys_cpu"]) / 100 * j["job_runtime"] * 1e6 / res["ios"]
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        pass
    if engine != "none":
        agent_messages(stderr, what)
        hits = (kernel_hits(stderr) if engine == "kernel" else userbpf_hits(stdout)).get(0)
        res["hits"] = hits
        if not hits or hits < res["ios"]:
            problem(f"{what}: td_io_queue counted {hits} hits for {res['ios']} I/Os", "")
    print(f"  {what}: {res['iops']:,.0f} IOPS" + (f", {res.get('hits')} hits" if engine != "none" else ""), file=sys.stderr, flush=True)
    return res


def fio_table():
    if not os.path.exists(FIO):
        problem("fio", f"{FIO} is not installed (apt-get install fio)")
        return None
    syms = subprocess.run(["readelf", "-W", "--dyn-syms", FIO], capture_output=True, text=True).stdout
    if not re.search(r"\bFUNC\b.*\btd_io_queue$", syms, re.M):
        problem("fio", f"td_io_queue is not a function in {FIO}'s .dynsym (the binary is stripped): no probe possible")
        return None
    # A private copy: a kernel uprobe is placed on a file (every process mapping it), so
    # another tool probing /usr/bin/fio meanwhile would put its breakpoints into these runs
    # (and, when it detaches, write the original bytes back over userbpf's patch).
    import shutil
    shutil.copy2(FIO, FIO_COPY)
    # Rounds alternate the probes, so a burst of load on the machine hits them alike; the
    # best round of each is kept.
    res = {c: None for c in FIO_CONFIGS}
    cpu = {c: [] for c in FIO_CONFIGS}
    failed = set()
    for _ in range(FIO_ROUNDS):
        for c in FIO_CONFIGS:
            if c in failed:
                continue
            r = fio_run(c)
            if r is None:
                failed.add(c)
                res[c] = None
                continue
            if r.get("cpu_ns") is not None:
                cpu[c].append(r["cpu_ns"])
            if res[c] is None or r["iops"] > res[c]["iops"]:
                res[c] = r
    import statistics
    cpu_med = {c: (statistics.median(v) if v and c not in failed else None) for c, v in cpu.items()}
    print()
    print(f"### fio --ioengine=null --rw=randread --bs=4k, one job, best of {FIO_ROUNDS} runs of {FIO_RUNTIME} s; a counting uprobe on td_io_queue")
    print()
    print("| probe | IOPS | share of unprobed | fio CPU ns per I/O (median) | added ns per I/O | share by CPU time | td_io_queue hits |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    none = res[("none", None)]
    base = none["iops"] if none else None
    base_cpu = cpu_med[("none", None)]
    for c in FIO_CONFIGS:
        r = res[c]
        share = f"{100 * r['iops'] / base:.1f}%" if (r and base) else "–"
        iops = f"{r['iops']:,.0f}" if r else "failed"
        hits = f"{r['hits']:,}" if r and r.get("hits") is not None else "–"
        ns = cpu_med[c]
        ns_s = f"{ns:.1f}" if ns is not None else "–"
        added = f"{ns - base_cpu:+.1f}" if (ns is not None and base_cpu) else "–"
        by_cpu = f"{100 * base_cpu / ns:.1f}%" if (ns and base_cpu) else "–"
        print(f"| {fio_name(c)} | {iops} | {share} | {ns_s} | {added} | {by_cpu} | {hits} |")
    print()
    print("The share by CPU time is the unprobed CPU ns per I/O over the probed one (medians over the "
          "rounds): what the probe costs fio's thread, steady where the IOPS follow the machine's load.")
    shares = {(e if m != "percpu" else f"{e}-percpu"): (100 * r["iops"] / base if (r and base) else None) for (e, m), r in res.items()}
    for (e, m) in FIO_CONFIGS:
        ns = cpu_med[(e, m)]
        shares[(e if m != "percpu" else f"{e}-percpu") + "-cpu"] = 100 * base_cpu / ns if (ns and base_cpu) else None
    return shares


# bpftrace programs for the hit-cost table: (name, probe body, how to check the count from
# bpftrace's output for N calls of bench_fn(i), i = 0..N-1, on one thread).
BPFTRACE = [
    ("count()", "@c = count();", lambda out, n: _bt_scalar(out, "c") == n),
    ("@x[tid] = count()", "@x[tid] = count();", lambda out, n: sum(_bt_keyed(out, "x").values()) == n),
    ("sum(arg0)", "@s = sum(arg0);", lambda out, n: _bt_scalar(out, "s") == n * (n - 1) // 2),
    ("hist(arg0)", "@h = hist(arg0);", lambda out, n: _bt_hist_total(out, "h") == n),
]
BPFTRACE_CALLS = {"kernel": 50_000, "userbpf": 20_000_000}


def _bt_scalar(out, name):
    m = re.search(rf"^@{name}: (\d+)$", out, re.M)
    return int(m.group(1)) if m else None


def _bt_keyed(out, name):
    return {int(k): int(v) for k, v in re.findall(rf"^@{name}\[(\d+)\]: (\d+)$", out, re.M)}


def _bt_hist_total(out, name):
    m = re.search(rf"^@{name}: *\n((?:.*\n?)*)", out, re.M)
    if not m:
        return None
    total = 0
    for line in m.group(1).splitlines():
        b = re.match(r"^[\[(].*?[\])]\s+(\d+)\s*\|", line)
        if not b:
            break
        total += int(b.group(1))
    return total


def bpftrace_once(engine, body, check, n, what):
    """One run of TARGET exe N under `bpftrace -e 'uprobe:TARGET:bench_fn { BODY }'`, through
    the kernel or through `userbpf load` (the target under `userbpf start`). Returns the
    target's CPU ns per call, or None after recording a problem."""
    import signal
    import tempfile
    script = f"uprobe:{TARGET}:bench_fn {{ {body} }}"
    env = dict(os.environ)
    env["USERBPF_SESSION"] = f"ubench-bt-{os.getpid()}"
    loader = ["bpftrace", "-e", script]
    cmd = [TARGET, "exe", str(n)]
    if engine == "userbpf":
        loader = [USERBPF, "load"] + loader
        cmd = [USERBPF, "start"] + cmd
    with tempfile.TemporaryDirectory(prefix="ubench-bt-") as d:
        lout, lerr = os.path.join(d, "out"), os.path.join(d, "err")
        with open(lout, "w") as o, open(lerr, "w") as e:
            bt = subprocess.Popen(loader, stdout=o, stderr=e, env=env)
        r = None
        try:
            deadline = time.time() + TIMEOUT
            while time.time() < deadline and bt.poll() is None:
                with open(lout) as f:
                    if "Attaching " in f.read():
                        break
                time.sleep(0.05)
            else:
                with open(lerr) as f:
                    problem(f"{what}: bpftrace did not start", f.read()[-2000:])
                return None
            # "Attaching" is printed just before the probes are attached: through userbpf,
            # wait for the session's link (what `userbpf start` attaches), else a second.
            links = f"/dev/shm/userbpf-{os.getuid()}-{env['USERBPF_SESSION']}/links"
            while engine == "userbpf" and time.time() < deadline and bt.poll() is None:
                if any(f.endswith(".json") for f in (os.listdir(links) if os.path.isdir(links) else [])):
                    break
                time.sleep(0.05)
            time.sleep(0.2 if engine == "userbpf" else 1)
            r = run(cmd, what, env)
        finally:
            if bt.poll() is None:
                bt.send_signal(signal.SIGINT)
            try:
                bt.wait(timeout=TIMEOUT)
            except subprocess.TimeoutExpired:
                bt.kill()
                bt.wait()
                problem(f"{what}: bpftrace did not exit on SIGINT", "")
        if r is None:
            return None
        with open(lout) as f:
            out = f.read()
        m = re.search(r"ns_per_call=([\d.]+) cpu_ns_per_call=([\d.]+)", r[0])
        if not m:
            problem(f"{what}: the target printed no timing", r[0][-1000:] + r[1][-1000:])
            return None
        if not check(out, n):
            with open(lerr) as f:
                problem(f"{what}: bpftrace's map does not account for the {n} calls", (out + f.read())[-1500:])
            return None
        return float(m.group(2))


def bpftrace_table(base):
    """The hit of bpftrace programs through the kernel and through `userbpf load`, beside the
    unprobed call and a libbpf per-CPU array counter (`userbpf run` and the kernel)."""
    if subprocess.run(["which", "bpftrace"], capture_output=True).returncode != 0:
        problem("bpftrace", "bpftrace is not installed (scripts/install-deps.sh installs it)")
        return {}
    rows, hits = [], {}
    for name, body, check in BPFTRACE:
        cells = {}
        for engine in ("kernel", "userbpf"):
            what = f"bpftrace {name}, {'kernel uprobe' if engine == 'kernel' else 'userbpf load'}"
            best = None
            for _ in range(REPEATS):
                v = bpftrace_once(engine, body, check, BPFTRACE_CALLS[engine], what)
                if v is None:
                    best = None
                    break
                best = v if best is None or v < best else best
            if best is not None:
                print(f"  {what}: {best:.2f} ns/call CPU", file=sys.stderr, flush=True)
            cells[engine] = best
        rows.append((f"bpftrace `{body}`", cells))
    pc = {e: measure(e, "exe", "percpu") for e in ("kernel", "jit")}
    rows.append(("libbpf per-CPU array counter (`userbpf run`)", {"kernel": pc["kernel"] and pc["kernel"]["cpu"], "userbpf": pc["jit"] and pc["jit"]["cpu"]}))
    print()
    print(f"### Hit cost of counting programs: bench_fn called in a loop (ns per call, thread CPU time, fastest of {REPEATS} runs)")
    print()
    print("| program | no probe | kernel | userbpf | kernel hit | userbpf hit | kernel hit / userbpf hit |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, cells in rows:
        k, u = cells.get("kernel"), cells.get("userbpf")
        kh = k - base if (k is not None and base is not None) else None
        uh = u - base if (u is not None and base is not None) else None
        hits[name] = uh
        print(f"| {name} | {fmt_ns(base)} | {fmt_ns(k)} | {fmt_ns(u)} | {fmt_ns(kh)} | {fmt_ns(uh)} | {fmt_ratio(kh, uh)} |")
    print()
    print(f"Hit = probed minus unprobed ns per call. bpftrace runs unmodified (`bpftrace -e "
          f"'uprobe:TARGET:bench_fn {{ ... }}'`), through the kernel, and through `userbpf load` with "
          f"the target under `userbpf start`; {BPFTRACE_CALLS['kernel']:,} calls per kernel run, "
          f"{BPFTRACE_CALLS['userbpf']:,} per userbpf run. The libbpf counter is count.bpf.c -DPERCPU.")
    return hits


def verdict(ok, text):
    print(f"- {'met' if ok else 'NOT met'}: {text}")


def main():
    t0 = time.time()
    build()
    cpu = ""
    try:
        cpu = next(l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    print(f"## uprobe benchmark: {time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPUs ({cpu}), Linux {platform.release()}")
    hit = uprobe_tables()
    methods = method_table()
    base = hit.get("base_exe")
    counting = bpftrace_table(base)
    fio = fio_table()

    print()
    print("### Targets")
    print()
    for where, name in (("exe", "executable"), ("lib", "shared library")):
        h = hit[(where, "entry")]
        j = h["jit"]
        e = h.get("empty")
        verdict(j is not None and j <= 10, f"uprobe hit ≤ 10 ns (JIT, {name}): {fmt_ns(j)} ns with the counting program, {fmt_ns(e)} ns with an empty one")
        h = hit[(where, "return")]
        j, k, e = h["jit"], h["kernel"], h.get("empty")
        verdict(j is not None and j <= 20, f"uretprobe hit ≤ 20 ns (JIT, {name}): {fmt_ns(j)} ns with the counting program, {fmt_ns(e)} ns with an empty one")
        verdict(j is not None and k is not None and j > 0 and k / j >= 200,
                f"uretprobe hit ≥ 200× cheaper than the kernel's (JIT, {name}): {fmt_ratio(k, j)}")
    for where, (fn, shape, method) in SHORT.items():
        kh, jh = methods[(where, "entry")]
        verdict(jh is not None and kh is not None and 0 < jh < kh,
                f"{method} on {fn} ({shape}) cheaper than the kernel's uprobe: {fmt_ns(jh)} ns against {fmt_ns(kh)} ns a hit ({fmt_ratio(kh, jh)})")
    if fio:
        pct = lambda v: f"{v:.1f}%" if v is not None else "failed"
        s = fio.get("jit")
        verdict(s is not None and s >= 90, f"fio under userbpf (JIT) ≥ 90% of its unprobed IOPS: {pct(s)} (by CPU time {pct(fio.get('jit-cpu'))}; interpreter {pct(fio.get('interp'))}, kernel uprobe {pct(fio.get('kernel'))})")
        s = fio.get("jit-percpu")
        verdict(s is not None and s >= 90, f"fio under a per-CPU counting program (userbpf JIT) ≥ 90% of its unprobed IOPS: {pct(s)} (by CPU time {pct(fio.get('jit-percpu-cpu'))}; kernel uprobe {pct(fio.get('kernel-percpu'))})")
    for name, h in counting.items():
        verdict(h is not None and h <= 15, f"{name}: hit ≤ 15 ns: {fmt_ns(h)} ns")
    print()
    if problems:
        print("### Problems")
        print()
        for p in problems:
            print("- " + p.replace("\n", "\n  "))
    else:
        print("No problems: every probe attached and counted every call.")
    print()
    print(f"(uprobe-bench took {time.time() - t0:.0f} s)")


if __name__ == "__main__":
    main()
