#!/usr/bin/env python3
"""The loader benchmark (`make bench`): fio's null engine unprobed, then with bpftrace counting
td_io_queue calls (`uprobe:/usr/bin/fio:td_io_queue { @c = count(); }`) through the kernel, and
the same bpftrace, unmodified, through `userbpf load` with fio under `userbpf start`.

Prints one Markdown table: IOPS, the share of the unprobed rate, and the count bpftrace printed
(which must cover every I/O fio issued). It reports; it never fails on timing. Problems met on
the way (a loader that does not start, a count that does not match) are printed verbatim.

Environment: LBENCH_FIO_RUNTIME (seconds per fio run, default 5), LBENCH_ROUNDS (runs per
configuration, alternating, the best kept, default 2), USERBPF (the CLI, default
target/release/userbpf, with libuserbpf_syscall_server.so and libuserbpf_agent.so beside it).
"""

import json
import os
import platform
import re
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
USERBPF = os.path.abspath(os.environ.get("USERBPF", os.path.join(ROOT, "target", "release", "userbpf")))
RUNTIME = int(os.environ.get("LBENCH_FIO_RUNTIME", "5"))
ROUNDS = max(1, int(os.environ.get("LBENCH_ROUNDS", "2")))
FIO = "/usr/bin/fio"
SCRIPT = f"uprobe:{FIO}:td_io_queue {{ @c = count(); }}"
TIMEOUT = 120
CONFIGS = ["none", "kernel", "userbpf"]
NAME = {"none": "no probe", "kernel": "bpftrace, kernel uprobe", "userbpf": "bpftrace through userbpf load"}

problems = []


def problem(what, detail=""):
    text = f"{what}: {detail.strip()}" if detail.strip() else what
    problems.append(text)
    print(f"  ! {text}", file=sys.stderr, flush=True)


def fio_cmd(out):
    return [FIO, "--name=lbench", "--ioengine=null", "--rw=randread", "--bs=4k", "--size=1g",
            f"--runtime={RUNTIME}", "--time_based", "--numjobs=1", "--output-format=json", f"--output={out}"]


def read_fio(out, what):
    try:
        with open(out) as f:
            job = json.load(f)["jobs"][0]["read"]
        return {"iops": job["iops"], "ios": job.get("total_ios", 0)}
    except (OSError, ValueError, KeyError, IndexError) as e:
        problem(f"{what}: no fio result ({e})")
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
    what = f"fio, {NAME[config]}"
    out = os.path.join(workdir, f"fio-{config}.json")
    if os.path.exists(out):
        os.unlink(out)
    if config == "none":
        r = subprocess.run(fio_cmd(out), capture_output=True, text=True, timeout=TIMEOUT)
        if r.returncode != 0:
            problem(f"{what}: fio failed", r.stderr[-2000:])
            return None
        return read_fio(out, what)
    env = dict(os.environ)
    session = f"lbench-{os.getpid()}"
    env["USERBPF_SESSION"] = session
    loader = ["bpftrace", "-e", SCRIPT]
    fio = fio_cmd(out)
    if config == "userbpf":
        loader = [USERBPF, "load"] + loader
        fio = [USERBPF, "start"] + fio
    lout, lerr = os.path.join(workdir, f"bpftrace-{config}.out"), os.path.join(workdir, f"bpftrace-{config}.err")
    with open(lout, "w") as o, open(lerr, "w") as e:
        bt = subprocess.Popen(loader, stdout=o, stderr=e, env=env)
    try:
        if not wait_for(bt, lout, "Attaching ", what):
            with open(lerr) as f:
                problem(f"{what}: bpftrace stderr", f.read()[-2000:])
            return None
        # "Attaching" is printed just before the probes are attached.
        time.sleep(1)
        r = subprocess.run(fio, capture_output=True, text=True, timeout=TIMEOUT, env=env)
        if r.returncode != 0:
            problem(f"{what}: fio failed (status {r.returncode})", (r.stderr + r.stdout)[-2000:])
            return None
        res = read_fio(out, what)
    finally:
        if bt.poll() is None:
            bt.send_signal(signal.SIGINT)
        try:
            bt.wait(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            bt.kill()
            bt.wait()
            problem(f"{what}: bpftrace did not exit on SIGINT")
    if res is None:
        return None
    with open(lout) as f:
        text = f.read()
    m = re.search(r"^@c: (\d+)$", text, re.M)
    res["hits"] = int(m.group(1)) if m else None
    if res["hits"] is None or res["hits"] < res["ios"]:
        with open(lerr) as f:
            err = f.read()
        problem(f"{what}: bpftrace counted {res['hits']} td_io_queue calls for {res['ios']} I/Os", (text + err)[-1500:])
    print(f"  {what}: {res['iops']:,.0f} IOPS, @c = {res['hits']}", file=sys.stderr, flush=True)
    return res


def main():
    for f in (USERBPF, os.path.join(os.path.dirname(USERBPF), "libuserbpf_syscall_server.so")):
        if not os.path.exists(f):
            sys.exit(f"loader-bench: {f} is missing: run `cargo build --release --workspace`")
    for tool in (FIO, "/usr/bin/bpftrace"):
        if not os.path.exists(tool):
            sys.exit(f"loader-bench: {tool} is missing (scripts/install-deps.sh installs it)")
    cpu = ""
    try:
        cpu = next(l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    res = {c: None for c in CONFIGS}
    failed = set()
    with tempfile.TemporaryDirectory(prefix="lbench-") as workdir:
        # Rounds alternate the configurations, so a burst of load hits them alike.
        for _ in range(ROUNDS):
            for c in CONFIGS:
                if c in failed:
                    continue
                r = run(c, workdir)
                if r is None:
                    failed.add(c)
                    res[c] = None
                elif res[c] is None or r["iops"] > res[c]["iops"]:
                    res[c] = r
    print(f"## loader benchmark: {time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPUs ({cpu}), Linux {platform.release()}")
    print()
    print(f"### fio --ioengine=null --rw=randread --bs=4k, one job, best of {ROUNDS} runs of {RUNTIME} s; "
          f"`bpftrace -e '{SCRIPT}'`")
    print()
    print("| fio under | IOPS | share of unprobed | bpftrace's @c |")
    print("|---|---:|---:|---:|")
    base = res["none"]["iops"] if res["none"] else None
    for c in CONFIGS:
        r = res[c]
        share = f"{100 * r['iops'] / base:.1f}%" if (r and base) else "–"
        iops = f"{r['iops']:,.0f}" if r else "failed"
        hits = f"{r['hits']:,}" if r and r.get("hits") is not None else "–"
        print(f"| {NAME[c]} | {iops} | {share} | {hits} |")
    if base and res["userbpf"]:
        s = 100 * res["userbpf"]["iops"] / base
        print()
        print(f"- {'met' if s >= 85 else 'NOT met'}: fio under bpftrace through userbpf ≥ 85% of its unprobed IOPS: {s:.1f}%")
    if problems:
        print()
        print("### Problems")
        print()
        for p in problems:
            print(f"- {p}")


if __name__ == "__main__":
    main()
