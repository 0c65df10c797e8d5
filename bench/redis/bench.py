#!/usr/bin/env python3
"""The redis hot-patch benchmark (`make bench`): SET/s of Debian's redis-server with its AOF on,
`appendfsync always`, `everysec`, and `always` under `userbpf run target/bpf/redis-fsync.bpf.o`
(the AOF fdatasync handed to io_uring with group commit, examples/bpf/redis-fsync.bpf.c).

Each configuration runs a fresh redis-server (its own directory on the disk the build lives
on, a free TCP port on 127.0.0.1, no RDB snapshots) and one
`redis-benchmark -t set -c 16 -r 1000000 -n N`; the three configurations run side by side,
alternating, ROUNDS times, and the table gives medians with each round's rates. Every share is
printed beside its baseline's rate. The fdatasync latency of that disk (the cost `always`
pays per batch) and the load average before and after are printed too, and for each
configuration the CPU time one SET cost (redis-server with all its threads, the kernel's
io-wq workers included, and redis-benchmark) and how idle the machine was: with 2 CPUs,
`everysec` keeps both busy, so a configuration that spends more CPU per SET cannot reach its
rate. It reports; it never fails on a rate.

Environment: RBENCH_ROUNDS (default 3), RBENCH_REQUESTS (N, default 100000), USERBPF (the
CLI, default target/release/userbpf, with libuserbpf_agent.so beside it).
"""

import os
import re
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
USERBPF = os.path.abspath(os.environ.get("USERBPF", os.path.join(ROOT, "target", "release", "userbpf")))
AGENT = os.path.join(os.path.dirname(USERBPF), "libuserbpf_agent.so")
OBJECT = os.path.join(ROOT, "target", "bpf", "redis-fsync.bpf.o")
ROUNDS = max(1, int(os.environ.get("RBENCH_ROUNDS", "3")))
REQUESTS = max(1000, int(os.environ.get("RBENCH_REQUESTS", "100000")))
CLIENTS = 16
CONFIGS = ["always", "everysec", "patched"]
NAME = {
    "always": "`appendfsync always`",
    "everysec": "`appendfsync everysec`",
    "patched": "`appendfsync always` + redis-fsync.bpf.o (io_uring group commit)",
}


def loadavg():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fdatasync_latency_us(dir_):
    """Median microseconds of a 100-byte append + fdatasync on `dir_`'s file system."""
    path = os.path.join(dir_, "fdatasync-probe")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    times = []
    try:
        for _ in range(200):
            os.write(fd, b"x" * 100)
            t = time.perf_counter_ns()
            os.fdatasync(fd)
            times.append((time.perf_counter_ns() - t) / 1000)
    finally:
        os.close(fd)
        os.unlink(path)
    return statistics.median(times)


def cpu_seconds(pid):
    """utime + stime of process `pid` (all its threads), in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_idle():
    """(idle + iowait, total) seconds of all CPUs since boot."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return (v[3] + v[4]) / os.sysconf("SC_CLK_TCK"), sum(v) / os.sysconf("SC_CLK_TCK")


def wait_ready(port, proc, what):
    deadline = time.time() + 60
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited ({proc.returncode}) before answering")
        r = subprocess.run(["redis-cli", "-p", str(port), "ping"], capture_output=True, text=True)
        if r.stdout.strip() == "PONG":
            return
        time.sleep(0.05)
    raise RuntimeError(f"{what} did not answer within 60 s")


def one(config, work):
    """One redis-server in `config`, one redis-benchmark: (SET/s, counters printed by run, CPU
    µs per SET of redis and of redis-benchmark, share of the machine's CPU time left idle)."""
    d = tempfile.mkdtemp(prefix=f"rbench-{config}-", dir=work)
    port = free_port()
    args = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", d, "--appendonly", "yes",
            "--appendfsync", "everysec" if config == "everysec" else "always", "--save", "", "--logfile", ""]
    if config == "patched":
        env = dict(os.environ, USERBPF_AGENT=AGENT)
        cmd = [USERBPF, "run", OBJECT, "--"] + args
    else:
        env, cmd = None, args
    server = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_ready(port, server, config)
        info = subprocess.run(["redis-cli", "-p", str(port), "info", "server"], capture_output=True, text=True).stdout
        pid = int(re.search(r"process_id:(\d+)", info).group(1))
        redis_cpu, children, idle = cpu_seconds(pid), resource.getrusage(resource.RUSAGE_CHILDREN), cpu_idle()
        r = subprocess.run(["redis-benchmark", "-p", str(port), "-t", "set", "-c", str(CLIENTS), "-r", "1000000",
                            "-n", str(REQUESTS), "--csv"], capture_output=True, text=True)
        m = re.search(r'^"SET","([0-9.]+)"', r.stdout, re.M)
        if not m:
            raise RuntimeError(f"redis-benchmark printed no SET rate: {r.stdout} {r.stderr}")
        rate = float(m.group(1))
        redis_cpu = cpu_seconds(pid) - redis_cpu
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        bench_cpu = after.ru_utime + after.ru_stime - children.ru_utime - children.ru_stime
        idle_after = cpu_idle()
        idle_share = (idle_after[0] - idle[0]) / max(1e-9, idle_after[1] - idle[1])
    finally:
        subprocess.run(["redis-cli", "-p", str(port), "shutdown", "nosave"], capture_output=True)
        try:
            out, err = server.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
            out, err = server.communicate()
        shutil.rmtree(d, ignore_errors=True)
    counters = {}
    if config == "patched":
        for k in ("patched", "deferred", "failed", "fallback"):
            m = re.search(rf"\.{k} = (\d+)", out)
            counters[k] = int(m.group(1)) if m else None
        if server.returncode != 0 or counters["patched"] is None:
            raise RuntimeError(f"userbpf run failed ({server.returncode}): {out} {err}")
    return rate, counters, (1e6 * redis_cpu / REQUESTS, 1e6 * bench_cpu / REQUESTS, idle_share)


def main():
    for tool in ("redis-server", "redis-benchmark", "redis-cli"):
        if not shutil.which(tool):
            sys.exit(f"bench/redis: {tool} is missing (make build installs redis-server and redis-tools)")
    for f in (USERBPF, AGENT, OBJECT):
        if not os.path.exists(f):
            sys.exit(f"bench/redis: {f} is missing (make build)")
    work = tempfile.mkdtemp(prefix="rbench-", dir=os.path.join(ROOT, "target"))
    try:
        load_before = loadavg()
        lat = fdatasync_latency_us(work)
        rates = {c: [] for c in CONFIGS}
        cpu = {c: [] for c in CONFIGS}
        counters = []
        for _ in range(ROUNDS):
            for c in CONFIGS:
                rate, cnt, use = one(c, work)
                rates[c].append(rate)
                cpu[c].append(use)
                if cnt:
                    counters.append(cnt)
        load_after = loadavg()
        lat_after = fdatasync_latency_us(work)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    med = {c: statistics.median(v) for c, v in rates.items()}
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    print(f"\n## redis SET/s with the AOF on ({stamp})\n")
    print(f"redis-benchmark -t set -c {CLIENTS} -r 1000000 -n {REQUESTS}, {ROUNDS} rounds, configurations alternating; "
          f"median fdatasync of a 100-byte append on this disk: {lat:.0f} µs before, {lat_after:.0f} µs after; "
          f"load average {load_before} before, {load_after} after.\n")
    print("| configuration | SET/s (median) | rounds | share of everysec | everysec SET/s | share of always | always SET/s |")
    print("|---|---:|---|---:|---:|---:|---:|")
    for c in CONFIGS:
        rounds = ", ".join(f"{r:,.0f}" for r in rates[c])
        print(f"| {NAME[c]} | {med[c]:,.0f} | {rounds} | {100 * med[c] / med['everysec']:.1f}% | {med['everysec']:,.0f} "
              f"| {med[c] / med['always']:.2f}× | {med['always']:,.0f} |")
    print("\n| configuration | CPU µs per SET: redis (all threads) | redis-benchmark | total | machine idle |")
    print("|---|---:|---:|---:|---:|")
    for c in CONFIGS:
        r, b, i = (statistics.median(u[k] for u in cpu[c]) for k in range(3))
        print(f"| {NAME[c]} | {r:.1f} | {b:.1f} | {statistics.median(u[0] + u[1] for u in cpu[c]):.1f} | {100 * i:.0f}% |")
    tot = {k: sum(c[k] or 0 for c in counters) for k in ("patched", "deferred", "failed", "fallback")}
    cycle_us = statistics.median([1e6 * (REQUESTS / c["patched"]) / r for c, r in zip(counters, rates["patched"])])
    print(f"\nPatched runs: {tot['patched']:,} AOF fdatasyncs through io_uring "
          f"({ROUNDS * REQUESTS / max(1, tot['patched']):.1f} SETs per fdatasync: the commands redis ran while the "
          f"previous one was in flight, their replies held; one every {cycle_us:,.0f} µs, median); "
          f"{tot['deferred']:,} fdatasync calls found one in flight and held their replies; {tot['failed']} failed, "
          f"{tot['fallback']} fell back to the real fdatasync.")
    bound = CLIENTS / (statistics.median([lat, lat_after]) / 1e6)
    print(f"With one fdatasync in flight, a batch holds at most one request per client: the patched rate is at most "
          f"{CLIENTS} / fdatasync latency = {bound:,.0f} SET/s at the latency measured before and after the runs "
          f"(it varies with the disk's other users).")
    total = {c: statistics.median(u[0] + u[1] for u in cpu[c]) for c in CONFIGS}
    print(f"CPU: a SET cost {total['patched']:.1f} µs patched against {total['everysec']:.1f} µs with everysec; "
          f"on {os.cpu_count()} CPUs that alone caps the patched rate at {1e6 * os.cpu_count() / total['patched']:,.0f} SET/s "
          f"({100 * total['everysec'] / total['patched']:.0f}% of everysec's CPU-bound rate).")
    share = 100 * med["patched"] / med["everysec"]
    verdict = "met" if share >= 90 else "not met"
    print(f"Target: patched at least 90% of everysec's SET/s: {verdict} ({share:.1f}% of {med['everysec']:,.0f}).")


if __name__ == "__main__":
    main()
