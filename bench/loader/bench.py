#!/usr/bin/env python3
"""The loader benchmark (`make bench`): fio's null engine unprobed, then probed on every
td_io_queue call by unmodified loaders, each through the kernel and through `userbpf load`
(fio under `userbpf start`):

- bpftrace `uprobe:FIO:td_io_queue { @c = count(); }`;
- bpftrace `uprobe:FIO:td_io_queue { @h = hist(arg0); }`;
- target/libbpf/percpu-counter (examples/libbpf/percpu-counter.*, a libbpf program with a
  skeleton): the most common counting pattern, `bpf_map_lookup_elem` of a
  BPF_MAP_TYPE_PERCPU_ARRAY slot then `*v += 1`, summed over CPUs at exit.
  FIO is a private copy of /usr/bin/fio (see LBENCH_DIR).

Each round runs every probed configuration once, with an unprobed run before and after each
(none, A, none, B, ..., none): a probed run's share is measured against the mean of its two
neighbouring unprobed runs, so a burst of load from other work hits both sides alike. Prints
one Markdown table: median IOPS, the median of those unprobed baselines beside each share, the
median share, the same share in I/Os per second of CPU time fio's job got (fio's usr_cpu +
sys_cpu: less moved by other work taking the machine's CPUs), and the hits the loader printed
(which must cover every I/O fio issued). The target is judged on the IOPS share. It reports; it never
fails on timing. Problems met on the way (a loader that does not start, a count that does not
match) are printed verbatim.

Environment: LBENCH_FIO_RUNTIME (seconds per fio run, default 5), LBENCH_ROUNDS (rounds,
default 3), LBENCH_ONLY (comma-separated configuration names, e.g. `none,percpu-userbpf`),
LBENCH_DIR (where fio is copied, default target/lbench: the probes are put on that copy, never
on /usr/bin/fio, which other processes run), USERBPF (the CLI, default target/release/userbpf,
with libuserbpf_syscall_server.so and libuserbpf_agent.so beside it).
"""

import json
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
COUNTER = os.path.join(ROOT, "target", "libbpf", "percpu-counter")
RUNTIME = int(os.environ.get("LBENCH_FIO_RUNTIME", "5"))
ROUNDS = max(1, int(os.environ.get("LBENCH_ROUNDS", "3")))
# fio is probed as a private copy: a kernel uprobe on /usr/bin/fio itself would plant its
# breakpoint in every process running it (other users' fio too, slowed down and counted).
FIO_SYSTEM = "/usr/bin/fio"
BUILD = os.path.abspath(os.environ.get("LBENCH_DIR", os.path.join(ROOT, "target", "lbench")))
FIO = os.path.join(BUILD, "fio")
FUNC = "td_io_queue"
COUNT_SCRIPT = f"uprobe:{FIO}:{FUNC} {{ @c = count(); }}"
HIST_SCRIPT = f"uprobe:{FIO}:{FUNC} {{ @h = hist(arg0); }}"
TIMEOUT = 120
# Share of the unprobed rate the issue sets as the target for the counting loaders through userbpf.
TARGET = 90.0


def bpftrace_count(text):
    m = re.search(r"^@c: (\d+)$", text, re.M)
    return int(m.group(1)) if m else None


def bpftrace_hist(text):
    """The sum of the histogram's buckets (`[lo, hi)  N |@@@|`)."""
    counts = re.findall(r"^\[[^\]\n]*[\])]\s+(\d+) \|", text, re.M)
    return sum(int(c) for c in counts) if counts else None


def counter_count(text):
    m = re.search(r"^count (\d+)$", text, re.M)
    return int(m.group(1)) if m else None


# name -> (label, loader argv or None, the line it prints once attached, hits from its stdout,
# through userbpf)
CONFIGS = {
    "none": ("no probe", None, None, None, False),
    "count-kernel": ("bpftrace `count()`, kernel uprobe", ["bpftrace", "-e", COUNT_SCRIPT], "Attaching ", bpftrace_count, False),
    "count-userbpf": ("bpftrace `count()` through userbpf load", ["bpftrace", "-e", COUNT_SCRIPT], "Attaching ", bpftrace_count, True),
    "hist-kernel": ("bpftrace `hist(arg0)`, kernel uprobe", ["bpftrace", "-e", HIST_SCRIPT], "Attaching ", bpftrace_hist, False),
    "hist-userbpf": ("bpftrace `hist(arg0)` through userbpf load", ["bpftrace", "-e", HIST_SCRIPT], "Attaching ", bpftrace_hist, True),
    "percpu-kernel": ("libbpf per-CPU array counter, kernel uprobe", [COUNTER, FIO, FUNC], "attached to ", counter_count, False),
    "percpu-userbpf": ("libbpf per-CPU array counter through userbpf load", [COUNTER, FIO, FUNC], "attached to ", counter_count, True),
}
# The rows held to the target.
TARGETED = ["count-userbpf", "percpu-userbpf"]

problems = []


def problem(what, detail=""):
    text = f"{what}: {detail.strip()}" if detail.strip() else what
    problems.append(text)
    print(f"  ! {text}", file=sys.stderr, flush=True)


def fio_cmd(out):
    # --clocksource=cpu: left to itself fio picks the TSC or clock_gettime at start-up (its
    # TSC check fails now and then under load), and on this VM clock_gettime costs fio ~55 ns
    # more per I/O, probed or not: the choice, not the probe, made shares wander by 25-30%.
    return [FIO, "--name=lbench", "--ioengine=null", "--rw=randread", "--bs=4k", "--size=1g",
            f"--runtime={RUNTIME}", "--time_based", "--numjobs=1", "--clocksource=cpu",
            "--output-format=json", f"--output={out}"]


def read_fio(out, what):
    try:
        with open(out) as f:
            job = json.load(f)["jobs"][0]
        cpu = (job.get("usr_cpu", 0) + job.get("sys_cpu", 0)) / 100
        read = job["read"]
        # I/Os per second of CPU time fio's job thread got: what the probes cost, less
        # dependent than IOPS on how much of the machine other work takes.
        return {"iops": read["iops"], "ios": read.get("total_ios", 0), "cpu_rate": read["iops"] / cpu if cpu > 0 else None}
    except (OSError, ValueError, KeyError, IndexError) as e:
        try:
            with open(out, errors="replace") as f:
                head = f.read(600)
        except OSError:
            head = ""
        problem(f"{what}: no fio result ({e})", f"{out} begins with: {head!r}" if head else f"{out} is empty or missing")
        return None


def wait_for(proc, path, text, what):
    """Waits until the file `path` (the process's stdout) holds `text`."""
    deadline = time.time() + TIMEOUT
    while time.time() < deadline:
        with open(path) as f:
            if text in f.read():
                return True
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    with open(path) as f:
        problem(f"{what}: no {text!r}", f.read()[-2000:])
    return False


def run(config, workdir):
    label, loader, marker, hits_of, through_userbpf = CONFIGS[config]
    what = f"fio, {label}"
    out = os.path.join(workdir, f"fio-{config}.json")
    if os.path.exists(out):
        os.unlink(out)
    if loader is None:
        r = subprocess.run(fio_cmd(out), capture_output=True, text=True, timeout=TIMEOUT)
        if r.returncode != 0:
            problem(f"{what}: fio failed", r.stderr[-2000:])
            return None
        res = read_fio(out, what)
        if res:
            print(f"  {what}: {res['iops']:,.0f} IOPS", file=sys.stderr, flush=True)
        return res
    env = dict(os.environ)
    env["USERBPF_SESSION"] = f"lbench-{os.getpid()}-{config}"
    fio = fio_cmd(out)
    if through_userbpf:
        loader = [USERBPF, "load"] + loader
        fio = [USERBPF, "start"] + fio
    lout, lerr = os.path.join(workdir, f"loader-{config}.out"), os.path.join(workdir, f"loader-{config}.err")
    with open(lout, "w") as o, open(lerr, "w") as e:
        ld = subprocess.Popen(loader, stdout=o, stderr=e, env=env)
    try:
        if not wait_for(ld, lout, marker, what):
            with open(lerr) as f:
                problem(f"{what}: loader's stderr", f.read()[-2000:])
            return None
        # bpftrace prints "Attaching" just before it attaches its probes.
        time.sleep(1)
        r = subprocess.run(fio, capture_output=True, text=True, timeout=TIMEOUT, env=env)
        if r.returncode != 0:
            problem(f"{what}: fio failed (status {r.returncode})", (r.stderr + r.stdout)[-2000:])
            return None
        res = read_fio(out, what)
    finally:
        if ld.poll() is None:
            ld.send_signal(signal.SIGINT)
        try:
            ld.wait(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            ld.kill()
            ld.wait()
            problem(f"{what}: the loader did not exit on SIGINT")
    if res is None:
        return None
    with open(lout) as f:
        text = f.read()
    res["hits"] = hits_of(text)
    # At least fio's I/Os (fio's own threads may call td_io_queue beyond them).
    if res["hits"] is None or res["hits"] < res["ios"]:
        with open(lerr) as f:
            err = f.read()
        problem(f"{what}: the loader counted {res['hits']} {FUNC} calls for {res['ios']} I/Os", (text + err)[-1500:])
    print(f"  {what}: {res['iops']:,.0f} IOPS, hits {res['hits']}", file=sys.stderr, flush=True)
    return res


def loadavg():
    try:
        return open("/proc/loadavg").read().split()[0]
    except OSError:
        return "?"


def main():
    for f in (USERBPF, os.path.join(os.path.dirname(USERBPF), "libuserbpf_syscall_server.so"), COUNTER):
        if not os.path.exists(f):
            sys.exit(f"loader-bench: {f} is missing: run `make build`")
    for tool in (FIO_SYSTEM, "/usr/bin/bpftrace"):
        if not os.path.exists(tool):
            sys.exit(f"loader-bench: {tool} is missing (scripts/install-deps.sh installs it)")
    os.makedirs(BUILD, exist_ok=True)
    shutil.copy2(FIO_SYSTEM, FIO)
    only = [c for c in os.environ.get("LBENCH_ONLY", "").split(",") if c]
    for c in only:
        if c not in CONFIGS:
            sys.exit(f"loader-bench: unknown configuration {c!r} in LBENCH_ONLY (known: {', '.join(CONFIGS)})")
    configs = [c for c in CONFIGS if not only or c in only or c == "none"]
    cpu = ""
    try:
        cpu = next(l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    probed = [c for c in configs if c != "none"]
    # Per probed configuration: (its result, the mean unprobed IOPS of the runs beside it, the
    # mean unprobed I/Os per CPU-second of the same runs).
    pairs = {c: [] for c in probed}
    unprobed = []
    loads = [loadavg()]
    failed = {}
    with tempfile.TemporaryDirectory(prefix="lbench-") as workdir:
        before = run("none", workdir)
        if before:
            unprobed.append(before["iops"])
        for _ in range(ROUNDS):
            for c in probed:
                # A configuration that failed twice is not run again.
                r = None if failed.get(c, 0) >= 2 else run(c, workdir)
                if r is None:
                    failed[c] = failed.get(c, 0) + 1
                after = run("none", workdir)
                if after:
                    unprobed.append(after["iops"])
                sides = [x for x in (before, after) if x]
                if r and sides:
                    rates = [x["cpu_rate"] for x in sides if x["cpu_rate"]]
                    pairs[c].append((r, sum(x["iops"] for x in sides) / len(sides), sum(rates) / len(rates) if rates else None))
                before = after
            loads.append(loadavg())
    print(f"## loader benchmark: {time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPUs ({cpu}), Linux {platform.release()}, "
          f"load average {' → '.join(loads)} (before, after each round)")
    print()
    print(f"### fio --ioengine=null --rw=randread --bs=4k, one job, {ROUNDS} rounds of {RUNTIME} s runs, medians; "
          f"each share against the mean of the unprobed runs just before and after it")
    print()
    print("| fio under | IOPS | unprobed IOPS | share of unprobed | share per fio CPU-second | hits (loader's count) |")
    print("|---|---:|---:|---:|---:|---:|")
    if unprobed:
        print(f"| {CONFIGS['none'][0]} ({len(unprobed)} runs) | {statistics.median(unprobed):,.0f} | "
              f"{min(unprobed):,.0f} – {max(unprobed):,.0f} | 100% | 100% | – |")
    else:
        print(f"| {CONFIGS['none'][0]} | failed | – | – | – | – |")
    shares = {}
    for c in probed:
        label = CONFIGS[c][0]
        if not pairs[c]:
            print(f"| {label} | failed | – | – | – | – |")
            continue
        iops = statistics.median(r["iops"] for r, _, _ in pairs[c])
        base = statistics.median(b for _, b, _ in pairs[c])
        share = statistics.median(100 * r["iops"] / b for r, b, _ in pairs[c])
        shares[c] = share
        cpu_shares = [100 * r["cpu_rate"] / rb for r, _, rb in pairs[c] if r["cpu_rate"] and rb]
        cpu_text = f"{statistics.median(cpu_shares):.1f}%" if cpu_shares else "–"
        hits = [r["hits"] for r, _, _ in pairs[c] if r.get("hits") is not None]
        hits_text = f"{int(statistics.median(hits)):,}" if hits else "–"
        print(f"| {label} | {iops:,.0f} | {base:,.0f} | {share:.1f}% | {cpu_text} | {hits_text} |")
    print()
    print("Scripts: `" + COUNT_SCRIPT + "`, `" + HIST_SCRIPT + "`; the libbpf counter is target/libbpf/percpu-counter "
          f"(`{FIO} {FUNC}`).")
    for c in TARGETED:
        if c in shares:
            print(f"- {'met' if shares[c] >= TARGET else 'NOT met'}: fio under the {CONFIGS[c][0]} keeps "
                  f"≥ {TARGET:.0f}% of its unprobed IOPS: {shares[c]:.1f}%")
    if problems:
        print()
        print("### Problems")
        print()
        for p in problems:
            print(f"- {p}")


if __name__ == "__main__":
    main()
