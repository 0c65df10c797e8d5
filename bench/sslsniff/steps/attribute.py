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
    where = collections.defaultdict(set)  # (object, function) -> the addresses stepped there
    for ip in ips:
        hit = next((n for lo, hi, n in named if lo <= ip < hi), None)
        if hit:
            funcs[("userbpf code", hit)] += 1
            where[("userbpf code", hit)].add(ip)
            continue
        for lo, hi, name in maps:
            if lo <= ip < hi:
                if name.startswith("/"):
                    addrs, names = symbols(name)
                    i = bisect.bisect_right(addrs, ip - base[name]) - 1
                    key = (name.rsplit("/", 1)[-1], names[i] if i >= 0 else "?")
                else:
                    key = (name, "?")
                break
        else:
            key = ("?", "?")
        funcs[key] += 1
        where[key].add(ip)
    return funcs, where


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
    both = [attribute(*files[i : i + 3]) for i in range(0, len(files), 3)]
    runs = [r for r, _ in both]
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
    # What a hit on cold caches has to fetch: each distinct 64-byte line of code is an
    # instruction cache fill, each distinct 4 KiB page an instruction TLB entry.
    print("Distinct code lines (64 bytes) / pages (4 KiB) a pair, by part:")
    print()
    row(["part", *labels])
    row(["---", *["---:"] * len(labels)])
    spans = []
    for _, w in both:
        sp = collections.defaultdict(set)
        for (o, f), a in w.items():
            sp[part(o, f)] |= a
        sp["**total**"] = set().union(*w.values())
        spans.append(sp)
    for name in [n for n, _ in PARTS] + ["**total**"]:
        row([name, *(f"{len({a >> 6 for a in sp[name]})} / {len({a >> 12 for a in sp[name]})}" for sp in spans)])
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
