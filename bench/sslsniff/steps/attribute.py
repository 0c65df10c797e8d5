#!/usr/bin/env python3
"""Where the instructions of a stepped read+write pair went (bench/sslsniff/steps/steps.sh).

attribute.py IPS MAPS PERFMAP [IPS MAPS PERFMAP ...] -- LABEL [LABEL ...]

IPS: the address of every instruction stepped (stepper's output); MAPS: the target's
/proc/PID/maps; PERFMAP: its /tmp/perf-PID.map (USERBPF_PERF_MAP=1: userbpf's stubs and JIT'd
programs by name). Prints instructions per pair by part and by function, one column per build.
Every byte `rep movsb` copies is a step of its own: the guarded copy's steps are bytes, shown
apart. libc's internal functions (its memcpy) show under the exported symbol before them."""
import bisect
import collections
import re
import subprocess
import sys

_syms = {}


def symbols(path):
    """Sorted (address, name) of the functions in an ELF file (static table, else dynamic)."""
    if path not in _syms:
        s = []
        for extra in ([], ["-D"]):
            out = subprocess.run(["nm", "-C", "--defined-only", *extra, path], capture_output=True, text=True).stdout
            for line in out.splitlines():
                p = line.split(" ", 2)
                if len(p) == 3 and p[1] in "tTwWiI":
                    s.append((int(p[0], 16), p[2]))
            if s:
                break
        s.sort()
        _syms[path] = ([a for a, _ in s], [n for _, n in s])
    return _syms[path]


def attribute(ips_path, maps_path, perfmap_path):
    ips = [int(line, 16) for line in open(ips_path) if line.strip()][:-1]  # the last: at the stop
    maps, base = [], {}
    for line in open(maps_path):
        p = line.split()
        lo, hi = (int(x, 16) for x in p[0].split("-"))
        name = p[5] if len(p) > 5 else "[anon]"
        maps.append((lo, hi, name))
        if name.startswith("/") and name not in base:
            base[name] = lo - int(p[2], 16)
    named = []
    try:
        for line in open(perfmap_path):
            a, n, name = line.rstrip("\n").split(" ", 2)
            named.append((int(a, 16), int(a, 16) + int(n, 16), re.sub(r"@0x[0-9a-f]+$", "", name)))
    except FileNotFoundError:
        pass
    funcs = collections.Counter()
    for ip in ips:
        hit = next((n for lo, hi, n in named if lo <= ip < hi), None)
        if hit:
            funcs[("userbpf code", hit)] += 1
            continue
        for lo, hi, name in maps:
            if lo <= ip < hi:
                if name.startswith("/"):
                    addrs, names = symbols(name)
                    i = bisect.bisect_right(addrs, ip - base[name]) - 1
                    funcs[(name.rsplit("/", 1)[-1], names[i] if i >= 0 else "?")] += 1
                else:
                    funcs[(name, "?")] += 1
                break
        else:
            funcs[("?", "?")] += 1
    return funcs


PARTS = [
    ("probe stubs and trampolines", lambda o, f: o == "userbpf code" and f.startswith("userbpf_")),
    ("the programs (JIT'd code)", lambda o, f: o == "userbpf code" and f.startswith("bpf_prog_")),
    ("run set-up (lean_run, CPU slot)", lambda o, f: "lean_run" in f or "runtime::program" in f or "context::" in f),
    ("hash map operations", lambda o, f: "maps::hash" in f),
    ("perf event output", lambda o, f: "maps::perf" in f or "helpers::output" in f),
    ("guarded copy: bytes (rep movsb)", lambda o, f: f == "userbpf_guard_copy"),
    ("other helpers", lambda o, f: "runtime::helpers" in f or "vm::guard" in f or "maps::" in f),
    ("vDSO (clock_gettime, getcpu)", lambda o, f: o == "[vdso]"),
    ("libc (memcpy, clock_gettime, sched_getcpu)", lambda o, f: o.startswith("libc.so")),
    ("dynamic loader (__tls_get_addr)", lambda o, f: o.startswith("ld-linux")),
    ("the target (SSL_read, SSL_write, main)", lambda o, f: True),
]


def part(o, f):
    return next(name for name, test in PARTS if test(o, f))


def main():
    args = sys.argv[1:]
    sep = args.index("--")
    files, labels = args[:sep], args[sep + 1 :]
    runs = [attribute(*files[i : i + 3]) for i in range(0, len(files), 3)]
    def row(cells):
        print("| " + " | ".join(cells) + " |")

    by_part = [collections.Counter() for _ in runs]
    for r, c in zip(runs, by_part):
        for (o, f), n in r.items():
            c[part(o, f)] += n
    print("Instructions a read+write pair, by part:")
    print()
    row(["part", *labels])
    row(["---", *["---:"] * len(labels)])
    for name, _ in PARTS:
        row([name, *(f"{c[name]:,}" for c in by_part)])
    row(["**total**", *(f"**{sum(c.values()):,}**" for c in by_part)])
    print()
    print("By function (the 30 largest):")
    print()
    row(["function (object)", *labels])
    row(["---", *["---:"] * len(labels)])
    keys = collections.Counter()
    for r in runs:
        keys.update(r)
    for (o, f), _ in keys.most_common(30):
        label = f if o == "userbpf code" else f"{f[:70]} ({o})"
        row([label.replace("|", "/"), *(f"{r[(o, f)]:,}" for r in runs)])

if __name__ == "__main__":
    main()
