#!/usr/bin/env python3
"""The sslsniff benchmark (`make bench`): BCC's `sslsniff-bpfcc` (uprobes and uretprobes on
OpenSSL's SSL_read and SSL_write, each return copying the data into a perf buffer read by the
tool's Python) on nginx serving HTTPS to `wrk` (100 connections), everything from Debian:

- untraced: nginx alone;
- kernel: sslsniff-bpfcc through the kernel's uprobes;
- userbpf: `userbpf load sslsniff-bpfcc`, nginx under `userbpf start` in the same session.

Each round runs untraced, kernel, untraced, userbpf, untraced (a fresh nginx every run, and a
fresh sslsniff started before it): a traced run's share is measured against the mean of the
untraced runs just before and after it. Printed: requests per second (medians, with the spread
of the shares), the untraced baseline beside every share, nginx's worker CPU time per request
and what the probes add to it (one SSL_read and one SSL_write a request, each with its entry
and return probe: the per-call cost side by side, on the traced process itself, which the other
work on the machine moves less than the request rate), the share per second of nginx's CPU, the
events sslsniff printed and the samples its perf buffers reported lost, the CPU the tool's own
process took, and the load average; with SBENCH_PIN, nginx's CPU a request relative to wrk's
in the same run (both on CPU 0), whose share cancels the machine's drift between runs. Verdicts
against the issue's target (userbpf loses at most 5%): on requests per second, per second of
nginx's CPU, and (pinned) by nginx's CPU relative to wrk's.

After wrk, the tool's perf buffers are drained and every CPU's buffer is made to report the
samples it lost (see `Sslsniff.drain`), so printed + lost must equal the SSL_read/SSL_write
calls that moved data: two per request by nginx's access log.

Before the timed runs, a capture check (not timed; also crates/cli/tests/sslsniff.rs): a fixed
set of HTTPS requests (curl, paced) with sslsniff through the kernel, then through userbpf: the
events and bytes sslsniff captured must be the same in both and equal to what nginx's access log
says it read and wrote, none lost. Under wrk the tool's Python cannot keep up on either side
(the tool's perf buffers are 8 pages a CPU), so the timed runs lose samples and their captures
cannot be compared byte for byte: they are checked for completeness (printed + lost) instead.

sslsniff starts before nginx, and a canary process mapping the library tells when it has
attached (its stdout is a file, block-buffered: the header line cannot). So every timed run
measures probes that were in place from nginx's first request, on the kernel as through userbpf
(a worker that dropped root would also see links added later, through the session's broker).

The probes go on a private copy of libssl (nginx runs with LD_LIBRARY_PATH pointing at it and
sslsniff is told `-o -g -n --extra-lib openssl:COPY`): a kernel uprobe on the system's libssl
would plant its breakpoint in every process mapping it. wrk and curl use the system's libssl
and are never traced.

BCC compiles its programs against kernel headers: those of BCC_KERNEL_SOURCE when set, else of
scripts/bcc-kernel-source.sh (Debian's linux-headers of another version, merged), seen through
a tree of symbolic links in SBENCH_DIR/kheaders with include/linux/minmax.h wrapped: the 6.1
stable headers' min()/max() carry a compile-time type check that BCC's front-end refuses inside
sslsniff's program ("cannot call non-static helper function"; upstream BCC changed sslsniff
itself, bcc#5241), on the kernel as through userbpf, so the wrapper redefines them as plain
statement expressions, as older kernels had them.

It reports; it never fails on timing. Problems met on the way (a tool that does not start, a
capture that does not add up) are printed verbatim; with SBENCH_ONLY=check they make the exit
status 1.

Environment: SBENCH_SECONDS (seconds per wrk run, default 10), SBENCH_ROUNDS (default 3),
SBENCH_CONNECTIONS (default 100), SBENCH_THREADS (wrk threads, default 2), SBENCH_ONLY
(`check` for the capture check alone, `timed` for the timed runs alone), SBENCH_DIR (default
target/sslbench), USERBPF (the CLI, default target/release/userbpf), SBENCH_BASE (a directory
holding another build's `userbpf`, `libuserbpf_agent.so` and `libuserbpf_syscall_server.so`, e.g.
main's: its timed runs go beside ours in each round, "before" and "after" side by side),
SBENCH_CONFIGS (the traced configurations of the timed runs, comma-separated among `kernel`,
`userbpf-base`, `userbpf`, and `agent`: nginx under `userbpf start` with no tool, what the
agent costs without probes, `busy`: untraced nginx with a busy loop on the tool's CPU,
what another CPU's load costs nginx, and `thread`: untraced nginx with an idle thread
preloaded into each of its processes (bench/sslsniff/idle_thread), what being multi-threaded
costs it, as the agent's thread makes it; default the first three that apply), SBENCH_PROFILE
(a directory: each run records a `perf record -e cpu-clock` profile of nginx's worker during wrk there, CONFIG.data,
the untraced runs' as none.data; the last run's of each is kept), SBENCH_PIN (`1`: nginx and
wrk on CPU 0, the tool on CPU 1, in every run: the tool's Python then has a CPU of its own and
keeps up with the events, and nginx's CPU time a request shows what the probes cost it without
the tool taking turns on nginx's CPU and caches).

Also printed: the CPU time wrk and the tool take a request, and from them the ceiling the CPUs
set on the requests/s share when every CPU is busy (nginx, wrk and the tool share them): the
untraced runs' nginx + wrk CPU a request over that plus the tool's, i.e. the share a traced
run would keep if its probes cost nginx nothing. The tool's CPU is the same work on the kernel
and through userbpf (its Python reads and prints each event).

Each run's line also gives the context switches of nginx's worker a request (voluntary: it waited
for events; involuntary: it was preempted).

Also printed for the runs through userbpf: the `FUTEX_WAKE` calls nginx's probes made per request
(producers wake the tool's watcher thread: the counter in each perf event array's map file,
read before the tool stops) and the CPU the tool's watcher threads took (`userbpf-wake-*`, the
syscall server's threads that make its perf buffers' descriptors readable).
"""

import glob
import os
import resource
import platform
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
USERBPF = os.path.abspath(os.environ.get("USERBPF", os.path.join(ROOT, "target", "release", "userbpf")))
SECONDS = int(os.environ.get("SBENCH_SECONDS", "10"))
ROUNDS = max(1, int(os.environ.get("SBENCH_ROUNDS", "3")))
CONNECTIONS = int(os.environ.get("SBENCH_CONNECTIONS", "100"))
THREADS = int(os.environ.get("SBENCH_THREADS", "2"))
ONLY = os.environ.get("SBENCH_ONLY", "")
BUILD = os.path.abspath(os.environ.get("SBENCH_DIR", os.path.join(ROOT, "target", "sslbench")))
NGINX = "/usr/sbin/nginx"
SSLSNIFF = "/usr/sbin/sslsniff-bpfcc"
WRK = "/usr/bin/wrk"
CURL = "/usr/bin/curl"
TIMEOUT = 180
# Share of the untraced request rate the issue sets as the target for userbpf.
TARGET = 95.0
# The pages nginx serves: the one wrk asks for and a larger one for the capture check (both
# within sslsniff's 8192-byte capture buffer: its perf buffer, 8 pages a CPU, then holds a
# burst of events while the tool's Python catches up, where larger ones are lost even at
# curl's pace, through the kernel too).
PAGES = {"index.html": 612, "page3k.html": 3000}
# The capture check's requests: (path, how many times), over one kept-alive connection.
CHECK_REQUESTS = [("/index.html", 10), ("/page3k.html", 10)]

BASE = os.environ.get("SBENCH_BASE", "")
# A directory for `perf record -e cpu-clock` profiles of nginx's worker during each traced run.
PROFILE = os.environ.get("SBENCH_PROFILE", "")
# SBENCH_PIN=1: nginx and wrk on CPU 0, the tool on CPU 1.
PIN = os.environ.get("SBENCH_PIN", "") not in ("", "0")
TASKSET = "/usr/bin/taskset"


def pinned(cmd, cpu):
    """`cmd` bound to CPU `cpu` when SBENCH_PIN is set (its threads and children inherit it)."""
    return [TASKSET, "-c", str(cpu)] + cmd if PIN else cmd
CONFIGS = {
    "none": "untraced",
    "kernel": "sslsniff-bpfcc, kernel uprobes",
    "userbpf": "sslsniff-bpfcc through userbpf load (nginx under userbpf start)",
    "agent": "no tool, nginx under userbpf start (the agent alone)",
    "busy": "no tool, a busy loop on the tool's CPU (what another CPU's load costs nginx)",
    "thread": "no tool, an idle thread preloaded into nginx (what being multi-threaded costs it)",
}
if BASE:
    CONFIGS["userbpf-base"] = f"the same, userbpf of {BASE}"
# The CLI each configuration through userbpf runs.
CLIS = {"userbpf": USERBPF, "agent": USERBPF, "userbpf-base": os.path.join(os.path.abspath(BASE), "userbpf") if BASE else ""}
TRACED = [c for c in os.environ.get("SBENCH_CONFIGS", "kernel,userbpf-base,userbpf").split(",") if c in CONFIGS
          and c != "none"]
# `struct PerfMeta` in a perf event array's map file (crates/maps/src/perf.rs): its magic at 128,
# the writers' FUTEX_WAKE count at 128 + 136.
PERF_MAGIC = b"UBPFPE\x01\x00"

problems = []


def problem(what, detail=""):
    text = f"{what}: {detail.strip()}" if detail.strip() else what
    problems.append(text)
    print(f"  ! {text}", file=sys.stderr, flush=True)


def log(text):
    print(f"  {text}", file=sys.stderr, flush=True)


def loadavg():
    try:
        return open("/proc/loadavg").read().split()[0]
    except OSError:
        return "?"


# ---- set-up ----

def system_libssl():
    out = subprocess.run(["ldd", NGINX], capture_output=True, text=True).stdout
    m = re.search(r"libssl\.so\.\S+ => (\S+)", out)
    if not m:
        sys.exit(f"sslsniff-bench: {NGINX} does not link libssl (ldd says: {out.strip()})")
    return os.path.realpath(m.group(1)), os.path.basename(m.group(1).split(" ")[0])


def symbol_offsets(lib, names):
    """File offsets of the functions `names` in the shared object `lib` (its first PT_LOAD
    maps offset 0 at address 0, so a symbol's value is its offset from the load base)."""
    out = subprocess.run(["nm", "-D", "--defined-only", lib], capture_output=True, text=True).stdout
    found = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1] in "Tt" and parts[2].split("@")[0] in names:
            found[parts[2].split("@")[0]] = int(parts[0], 16)
    missing = [n for n in names if n not in found]
    if missing:
        sys.exit(f"sslsniff-bench: {lib} has no {', '.join(missing)}")
    return found


def kernel_source():
    """BCC_KERNEL_SOURCE for sslsniff: the header tree of the environment's BCC_KERNEL_SOURCE or
    of scripts/bcc-kernel-source.sh, seen through SBENCH_DIR/kheaders (symbolic links) with
    include/linux/minmax.h wrapped (see the module documentation)."""
    base = os.environ.get("BCC_KERNEL_SOURCE")
    if not base:
        r = subprocess.run([os.path.join(ROOT, "scripts", "bcc-kernel-source.sh")], capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"sslsniff-bench: no kernel headers for BCC: {r.stderr.strip()}")
        base = r.stdout.strip()
    base = os.path.realpath(base)
    minmax = os.path.realpath(os.path.join(base, "include", "linux", "minmax.h"))
    if not os.path.exists(minmax):
        sys.exit(f"sslsniff-bench: {base} has no include/linux/minmax.h: not a kernel header tree")
    tree = os.path.join(BUILD, "kheaders")
    stamp = os.path.join(tree, ".sbench-from")
    if os.path.exists(stamp) and open(stamp).read() == base:
        return tree
    shutil.rmtree(tree, ignore_errors=True)
    os.makedirs(tree)
    subprocess.run(["cp", "-as", base + "/.", tree + "/"], check=True)
    wrapped = os.path.join(tree, "include", "linux", "minmax.h")
    os.unlink(wrapped)
    with open(wrapped, "w") as f:
        f.write("/* The kernel's minmax.h, with min() and max() as BCC can compile them (see bench/sslsniff/bench.py). */\n"
                f'#include "{minmax}"\n'
                "#undef min\n#undef max\n"
                "#define min(x, y) ({ typeof(x) __sb_x = (x); typeof(y) __sb_y = (y); __sb_x < __sb_y ? __sb_x : __sb_y; })\n"
                "#define max(x, y) ({ typeof(x) __sb_x = (x); typeof(y) __sb_y = (y); __sb_x > __sb_y ? __sb_x : __sb_y; })\n")
    with open(stamp, "w") as f:
        f.write(base)
    return tree


def page_text(size, name):
    """Deterministic text of `size` bytes."""
    line = f"<p>{name}: userbpf sslsniff benchmark page, fixed content.</p>\n"
    return (line * (size // len(line) + 1))[:size]


def setup():
    for f in [x for cli in CLIS.values() if cli for x in (cli, os.path.join(os.path.dirname(cli), "libuserbpf_syscall_server.so"),
                                                          os.path.join(os.path.dirname(cli), "libuserbpf_agent.so"))]:
        if not os.path.exists(f):
            sys.exit(f"sslsniff-bench: {f} is missing: run `make build`")
    for tool in (NGINX, SSLSNIFF, WRK, CURL, "/usr/bin/openssl"):
        if not os.path.exists(tool):
            sys.exit(f"sslsniff-bench: {tool} is missing (scripts/install-deps.sh installs it)")
    os.makedirs(BUILD, exist_ok=True)
    lib, soname = system_libssl()
    libdir = os.path.join(BUILD, "lib")
    os.makedirs(libdir, exist_ok=True)
    copy = os.path.join(libdir, soname)
    shutil.copy2(lib, copy)
    www = os.path.join(BUILD, "www")
    os.makedirs(www, exist_ok=True)
    for name, size in PAGES.items():
        with open(os.path.join(www, name), "w") as f:
            f.write(page_text(size, name))
    cert, key = os.path.join(BUILD, "cert.pem"), os.path.join(BUILD, "key.pem")
    if not (os.path.exists(cert) and os.path.exists(key)):
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", cert,
                        "-days", "3650", "-subj", "/CN=localhost"], check=True, capture_output=True)
    offsets = symbol_offsets(copy, ["SSL_read", "SSL_write"])
    return {"libdir": libdir, "lib": copy, "www": www, "cert": cert, "key": key, "offsets": offsets,
            "code": file_bytes(copy, offsets), "ksrc": kernel_source()}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- nginx ----

def nginx_conf(s, workdir, port):
    conf = os.path.join(workdir, "nginx.conf")
    temp = os.path.join(workdir, "tmp")
    os.makedirs(temp, exist_ok=True)
    with open(conf, "w") as f:
        f.write(f"""daemon off;
master_process on;
worker_processes 1;
pid {workdir}/nginx.pid;
error_log {workdir}/error.log warn;
events {{ worker_connections 4096; }}
http {{
  log_format counts "$request_length $bytes_sent";
  access_log {workdir}/access.log counts buffer=256k;
  keepalive_requests 1000000;
  client_body_temp_path {temp}/body;
  proxy_temp_path {temp}/proxy;
  fastcgi_temp_path {temp}/fastcgi;
  uwsgi_temp_path {temp}/uwsgi;
  scgi_temp_path {temp}/scgi;
  server {{
    listen 127.0.0.1:{port} ssl;
    ssl_certificate {s['cert']};
    ssl_certificate_key {s['key']};
    root {s['www']};
  }}
}}
""")
    return conf


def cpu_seconds(pid):
    """User + system CPU time of process `pid` (0 once it is gone)."""
    try:
        fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def context_switches(pid):
    """Voluntary and involuntary context switches of process `pid`'s main thread (nginx's
    worker: its only thread of its own), (0, 0) once it is gone."""
    try:
        status = open(f"/proc/{pid}/status").read()
    except OSError:
        return 0, 0
    get = lambda name: int(re.search(rf"^{name}:\s+(\d+)", status, re.M).group(1))
    return get("voluntary_ctxt_switches"), get("nonvoluntary_ctxt_switches")


def children(pid):
    """Process `pid`'s children (forked by any of its threads)."""
    kids = []
    for task in glob.glob(f"/proc/{pid}/task/*/children"):
        try:
            kids += [int(c) for c in open(task).read().split()]
        except OSError:
            pass
    return kids


def code_bytes(pid, lib, offsets):
    """The first 16 bytes of each probed function in process `pid`'s memory (None when the
    process does not map `lib`)."""
    base = None
    try:
        for line in open(f"/proc/{pid}/maps"):
            parts = line.split()
            if len(parts) >= 6 and parts[5] == lib and int(parts[2], 16) == 0:
                base = int(parts[0].split("-")[0], 16)
                break
        if base is None:
            return None
        got = {}
        with open(f"/proc/{pid}/mem", "rb") as mem:
            for name, off in offsets.items():
                mem.seek(base + off)
                got[name] = mem.read(16)
        return got
    except OSError:
        return None


def file_bytes(lib, offsets):
    """The first 16 bytes of each function in the file (its segments map file offset = address)."""
    with open(lib, "rb") as f:
        got = {}
        for name, off in offsets.items():
            f.seek(off)
            got[name] = f.read(16)
        return got


def probed(pid, s):
    """Whether both functions are probed in process `pid`: their first bytes differ from the
    file's (the kernel's int3, userbpf's jump)."""
    now = code_bytes(pid, s["lib"], s["offsets"])
    return now is not None and all(now[k] != s["code"][k] for k in now)


def wait_probed(pid, s, what, alive=None):
    deadline = time.time() + TIMEOUT
    while time.time() < deadline and (alive is None or alive.poll() is None):
        if probed(pid, s):
            return
        time.sleep(0.1)
    raise RuntimeError(f"{what}: SSL_read/SSL_write not probed (first bytes in the file {s['code']}, "
                       f"in the process {code_bytes(pid, s['lib'], s['offsets'])})")


def no_sigint_ignored():
    # A loader started from a shell's background job inherits SIGINT ignored, and Python then
    # never raises KeyboardInterrupt: sslsniff would not stop on SIGINT.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Nginx:
    """nginx (one worker) on a private copy of libssl, under `userbpf start` when asked."""

    def __init__(self, s, workdir, session=None, cli=USERBPF, preload=None):
        self.workdir = workdir
        self.port = free_port()
        conf = nginx_conf(s, workdir, port=self.port)
        for f in ("access.log", "nginx.pid"):
            if os.path.exists(os.path.join(workdir, f)):
                os.unlink(os.path.join(workdir, f))
        env = dict(os.environ, LD_LIBRARY_PATH=s["libdir"])
        if preload:
            env["LD_PRELOAD"] = preload
        cmd = [NGINX, "-c", conf, "-p", workdir]
        if session:
            env["USERBPF_SESSION"] = session
            cmd = [cli, "start"] + cmd
        cmd = pinned(cmd, 0)
        self.out = open(os.path.join(workdir, "nginx.out"), "w")
        self.proc = subprocess.Popen(cmd, stdout=self.out, stderr=subprocess.STDOUT, env=env)
        self.master = self.worker = None
        deadline = time.time() + 30
        while time.time() < deadline and self.proc.poll() is None:
            try:
                self.master = int(open(os.path.join(workdir, "nginx.pid")).read())
                kids = children(self.master)
                if kids and self.accepts():
                    self.worker = kids[0]
                    break
            except (OSError, ValueError):
                pass
            time.sleep(0.05)
        if self.worker is None:
            self.stop()
            raise RuntimeError("nginx did not start: " + open(os.path.join(workdir, "nginx.out")).read()[-1500:])

    def accepts(self):
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                return True
        except OSError:
            return False

    def cpu_seconds(self):
        """The worker's user + system CPU time."""
        return cpu_seconds(self.worker)

    def stop(self):
        """Stops nginx (fast shutdown: the access log's buffer is written) and returns its
        access log's (requests, bytes read, bytes written)."""
        if self.proc.poll() is None:
            if self.master:
                try:
                    os.kill(self.master, signal.SIGTERM)
                except ProcessLookupError:
                    pass
            else:
                self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                problem("nginx did not stop on SIGTERM")
        self.out.close()
        reqs = rd = wr = 0
        try:
            for line in open(os.path.join(self.workdir, "access.log")):
                a, b = line.split()
                reqs, rd, wr = reqs + 1, rd + int(a), wr + int(b)
        except (OSError, ValueError):
            pass
        return reqs, rd, wr


# ---- sslsniff ----

# poll, epoll_wait, ppoll, epoll_pwait, epoll_pwait2 (x86-64 system call numbers, as
# /proc/PID/syscall gives them).
POLLS = {"7", "232", "271", "281", "441"}
EVENT = re.compile(r"^(READ/RECV|WRITE/SEND) +[0-9.]+ +\S+ +\d+ +(\d+)", re.M)
LOST = re.compile(r"^Possibly lost (\d+) samples", re.M)


class Sslsniff:
    """sslsniff-bpfcc on the private libssl, through `userbpf load` when given a session. Started
    before nginx, so the probes are in place from nginx's first request."""

    def __init__(self, s, workdir, session=None, cli=USERBPF):
        self.session = session
        self.outp, self.errp = os.path.join(workdir, "sslsniff.out"), os.path.join(workdir, "sslsniff.err")
        env = dict(os.environ, BCC_KERNEL_SOURCE=s["ksrc"])
        cmd = [SSLSNIFF, "-o", "-g", "-n", "--extra-lib", f"openssl:{s['lib']}"]
        if session:
            env["USERBPF_SESSION"] = session
            cmd = [cli, "load"] + cmd
        cmd = pinned(cmd, 1)
        with open(self.outp, "w") as o, open(self.errp, "w") as e:
            self.proc = subprocess.Popen(cmd, stdout=o, stderr=e, env=env, preexec_fn=no_sigint_ignored)
        # The tool's stdout is a file (block-buffered): its header line cannot say when it has
        # attached. A canary process mapping the library (under `userbpf start` in the session
        # for userbpf) shows it: both functions' first bytes change (int3, or userbpf's jump).
        cenv = dict(os.environ, LD_LIBRARY_PATH=s["libdir"])
        ccmd = [sys.executable, "-c", "import ctypes, os, sys, time; ctypes.CDLL(sys.argv[1]); "
                "print(os.getpid(), flush=True); time.sleep(3600)", s["lib"]]
        if session:
            cenv["USERBPF_SESSION"] = session
            ccmd = [cli, "start"] + ccmd
        canary = subprocess.Popen(ccmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=cenv, text=True)
        pid = None
        try:
            pid = int(canary.stdout.readline())
            wait_probed(pid, s, "sslsniff's canary", alive=self.proc)
        except (RuntimeError, ValueError) as e:
            err = self.stop_raw()
            raise RuntimeError(f"sslsniff did not attach ({e}): {err[-2000:]}")
        finally:
            if pid and pid != canary.pid:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            canary.kill()
            canary.wait()
        # The tool's own process: `userbpf load` becomes it (exec), and it may have forked
        # helpers of the same name.
        self.tool = self.proc.pid
        # The perf buffers are opened after the attach calls: a sample sent before its CPU's
        # buffer is open is dropped without a trace (the kernel's -ENOENT), so wait until the
        # tool's main thread sits in its event loop's poll.
        deadline = time.time() + TIMEOUT
        while self.proc.poll() is None:
            try:
                nr = open(f"/proc/{self.tool}/syscall").read().split()[0]
            except (OSError, IndexError):
                nr = ""
            if nr in POLLS:
                break
            if time.time() > deadline:
                err = self.stop_raw()
                raise RuntimeError(f"sslsniff never reached its poll loop: {err[-2000:]}")
            time.sleep(0.05)

    def cpu_seconds(self):
        return cpu_seconds(self.tool)

    def watcher_seconds(self):
        """CPU time of the tool's watcher threads (`userbpf-wake-*`, the syscall server's)."""
        total = 0.0
        for task in glob.glob(f"/proc/{self.tool}/task/*"):
            try:
                if open(os.path.join(task, "comm")).read().startswith("userbpf-wake"):
                    f = open(os.path.join(task, "stat")).read().rsplit(")", 1)[1].split()
                    total += (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
            except (OSError, IndexError, ValueError):
                pass
        return total

    def futex_wakes(self):
        """FUTEX_WAKE calls the programs made on the session's perf event arrays so far (None
        through the kernel)."""
        if not self.session:
            return None
        total = 0
        for f in glob.glob(f"/dev/shm/userbpf-{os.getuid()}-{self.session}/maps/*"):
            try:
                with open(f, "rb") as fh:
                    head = fh.read(272)
            except OSError:
                continue
            if len(head) == 272 and head[128:136] == PERF_MAGIC:
                total += int.from_bytes(head[264:272], "little")
        return total

    def stop_raw(self):
        # SIGINT, repeated: one that lands while the tool's Python is inside its perf buffer
        # callback is swallowed by ctypes ("Exception ignored"), and the tool polls on. Not
        # too soon: a second one would interrupt BCC's detaching at exit.
        deadline = time.time() + 60
        while self.proc.poll() is None and time.time() < deadline:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                pass
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
            problem("sslsniff did not exit on SIGINT")
        return open(self.errp, errors="replace").read()

    def drain(self, nginx):
        """Lets the tool print what waits in its perf buffers, and has every CPU's buffer
        report the samples it lost: a lost count is written only in front of the next sample
        that fits in that CPU's buffer, so nginx's worker serves one more request on each CPU
        (nginx logs them; they count as requests)."""
        time.sleep(1)
        affinity = os.sched_getaffinity(nginx.worker)
        try:
            for cpu in sorted(affinity):
                os.sched_setaffinity(nginx.worker, {cpu})
                subprocess.run([CURL, "-sk", "--http1.1", "-o", "/dev/null", f"https://127.0.0.1:{nginx.port}/index.html"],
                               capture_output=True, timeout=60)
        finally:
            os.sched_setaffinity(nginx.worker, affinity)
        time.sleep(1)

    def stop(self):
        """Stops the tool and returns what it captured: events and bytes per direction, lost."""
        err = self.stop_raw()
        got = {"READ/RECV": [0, 0], "WRITE/SEND": [0, 0]}
        with open(self.outp, errors="replace") as f:
            for m in EVENT.finditer(f.read()):
                got[m.group(1)][0] += 1
                got[m.group(1)][1] += int(m.group(2))
        lost = sum(int(n) for n in LOST.findall(err))
        other = "\n".join(l for l in err.splitlines() if not LOST.match(l) and l.strip())
        return {"reads": got["READ/RECV"][0], "read_bytes": got["READ/RECV"][1], "writes": got["WRITE/SEND"][0],
                "write_bytes": got["WRITE/SEND"][1], "lost": lost, "stderr": other}


# ---- the capture check ----

def capture(s, config):
    session = f"sbench-{os.getpid()}-check-{config}" if config == "userbpf" else None
    with tempfile.TemporaryDirectory(prefix="sbench-check-") as workdir:
        try:
            sniff = Sslsniff(s, workdir, session)
        except RuntimeError as e:
            problem(f"capture check, {CONFIGS[config]}", str(e))
            return None
        try:
            nginx = Nginx(s, workdir, session)
            wait_probed(nginx.worker, s, "nginx's worker")
        except RuntimeError as e:
            sniff.stop()
            problem(f"capture check, {CONFIGS[config]}", str(e))
            return None
        urls = [f"https://127.0.0.1:{nginx.port}{path}" for path, n in CHECK_REQUESTS for _ in range(n)]
        # Paced (10 a second): the tool's perf buffer (8 pages a CPU) holds a few responses, and
        # on a loaded machine its Python may wait long for a CPU: at curl's full pace both the
        # kernel's and userbpf's runs lose samples now and then.
        cmd = [CURL, "-sk", "--http1.1", "--rate", "10/s"]
        for u in urls:
            cmd += [u, "-o", "/dev/null"]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            problem(f"capture check, {CONFIGS[config]}: curl failed ({r.returncode})", r.stderr)
        time.sleep(1)
        got = sniff.stop()
        got["log"] = nginx.stop()
        if got["stderr"]:
            problem(f"capture check, {CONFIGS[config]}: sslsniff's stderr", got["stderr"])
        return got


def capture_check(s):
    results = {c: capture(s, c) for c in ("kernel", "userbpf")}
    n = sum(k for _, k in CHECK_REQUESTS)
    print(f"### Capture check: {n} HTTPS requests by curl (" + ", ".join(f"{k}× {p}" for p, k in CHECK_REQUESTS)
          + "), one connection, 10 a second")
    print()
    print("| sslsniff-bpfcc | SSL_read events | bytes | SSL_write events | bytes | lost | nginx's log: requests, bytes read, written |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for c, g in results.items():
        if g is None:
            print(f"| {CONFIGS[c]} | failed | | | | | |")
            continue
        print(f"| {CONFIGS[c]} | {g['reads']} | {g['read_bytes']:,} | {g['writes']} | {g['write_bytes']:,} | {g['lost']} | "
              f"{g['log'][0]}, {g['log'][1]:,}, {g['log'][2]:,} |")
    print()
    keys = ("reads", "read_bytes", "writes", "write_bytes", "lost")
    ok = all(results.values())
    for c, g in results.items():
        if g is None:
            continue
        reqs, rd, wr = g["log"]
        if reqs != n or g["lost"] or g["read_bytes"] != rd or g["write_bytes"] != wr or g["reads"] != n:
            ok = False
            problem(f"capture check, {CONFIGS[c]}: captured {g['reads']} reads of {g['read_bytes']} bytes, "
                    f"{g['writes']} writes of {g['write_bytes']} bytes, {g['lost']} lost; nginx logged {reqs} "
                    f"requests, {rd} bytes read, {wr} written")
    if all(results.values()) and any(results["kernel"][k] != results["userbpf"][k] for k in keys):
        ok = False
        problem("capture check: the kernel's and userbpf's captures differ")
    print(f"- {'equal' if ok else 'NOT equal'}: the bytes sslsniff captured through the kernel and through userbpf, "
          "and nginx's own count")
    print()


# ---- the timed runs ----

def wrk(port):
    """Runs wrk; returns (requests/s, wrk's CPU seconds)."""
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    r = subprocess.run(pinned([WRK, f"-t{THREADS}", f"-c{CONNECTIONS}", f"-d{SECONDS}s",
                               f"https://127.0.0.1:{port}/index.html"], 0),
                       capture_output=True, text=True, timeout=SECONDS + TIMEOUT)
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (ru1.ru_utime + ru1.ru_stime) - (ru0.ru_utime + ru0.ru_stime)
    rate = re.search(r"^Requests/sec:\s+([0-9.]+)", r.stdout, re.M)
    if r.returncode != 0 or not rate:
        raise RuntimeError(f"wrk failed ({r.returncode}): {(r.stdout + r.stderr)[-1500:]}")
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)|Socket errors: .*", r.stdout)
    if errors:
        problem("wrk reported errors", errors.group(0))
    return float(rate.group(1)), cpu


def idle_thread_lib(workdir):
    """bench/sslsniff/idle_thread/idle_thread.c built into `workdir` (the `thread` configuration's
    preload), once."""
    so = os.path.join(workdir, "libidle_thread.so")
    if not os.path.exists(so):
        src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "idle_thread", "idle_thread.c")
        subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-pthread", "-o", so, src], check=True)
    return so


def timed(s, config, workdir):
    session = f"sbench-{os.getpid()}-{config}" if config.startswith("userbpf") or config == "agent" else None
    cli = CLIS.get(config, USERBPF)
    sniff = nginx = None
    try:
        if config not in ("none", "agent", "busy", "thread"):
            sniff = Sslsniff(s, workdir, session, cli)
        nginx = Nginx(s, workdir, session, cli, preload=idle_thread_lib(workdir) if config == "thread" else None)
        if sniff:
            wait_probed(nginx.worker, s, "nginx's worker")
        cpu0, tool0, wall0 = nginx.cpu_seconds(), sniff.cpu_seconds() if sniff else 0, time.time()
        switches0 = context_switches(nginx.worker)
        watch0, wakes0 = (sniff.watcher_seconds(), sniff.futex_wakes()) if sniff else (0, None)
        busy = None
        if config == "busy":
            busy = subprocess.Popen(pinned([sys.executable, "-c", "while True: pass"], 1))
        prof = None
        if PROFILE:
            os.makedirs(PROFILE, exist_ok=True)
            prof = subprocess.Popen(["perf", "record", "-q", "-e", "cpu-clock", "-F", "2000", "-p", str(nginx.worker),
                                     "-o", os.path.join(PROFILE, f"{config}.data")],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        rate, wrk_cpu = wrk(nginx.port)
        if busy:
            busy.kill()
            busy.wait()
        if prof:
            prof.send_signal(signal.SIGINT)
            prof.wait()
        cpu = nginx.cpu_seconds() - cpu0
        switches = [b - a for a, b in zip(switches0, context_switches(nginx.worker))]
        wall = time.time() - wall0
        tool_cpu = 100 * (sniff.cpu_seconds() - tool0) / wall if sniff else None
        watch_cpu = 100 * (sniff.watcher_seconds() - watch0) / wall if sniff else None
        wakes = sniff.futex_wakes() if sniff else None
        wakes = wakes - wakes0 if wakes is not None and wakes0 is not None else None
        if sniff:
            sniff.drain(nginx)
    except RuntimeError as e:
        if sniff:
            sniff.stop()
        if nginx:
            nginx.stop()
        problem(f"{CONFIGS[config]}", str(e))
        return None
    got = sniff.stop() if sniff else {}
    reqs, _, _ = nginx.stop()
    tool_s = tool_cpu * wall / 100 if sniff else 0.0
    res = {"rate": rate, "requests": reqs, "cpu_us": 1e6 * cpu / reqs if reqs else None, "tool_cpu": tool_cpu,
           "wrk_us": 1e6 * wrk_cpu / reqs if reqs else None, "tool_us": 1e6 * tool_s / reqs if reqs else None,
           "watch_cpu": watch_cpu, "wakes": wakes / reqs if wakes is not None and reqs else None,
           "switches": [x / reqs for x in switches] if reqs else None}
    if sniff:
        res.update(got)
        if got["stderr"]:
            problem(f"{CONFIGS[config]}: sslsniff's stderr", got["stderr"])
        # Every request is one SSL_read and one SSL_write that moved data: each was printed or
        # counted lost.
        if got["reads"] + got["writes"] + got["lost"] != 2 * reqs:
            problem(f"{CONFIGS[config]}: sslsniff printed {got['reads'] + got['writes']} events and lost {got['lost']}, "
                    f"for {reqs} requests nginx logged (2 events each)")
    log(f"{CONFIGS[config]}: {rate:,.0f} requests/s, {reqs} requests, nginx {res['cpu_us'] or 0:.1f} µs CPU a request"
        + (f" ({res['switches'][0]:.3f} voluntary and {res['switches'][1]:.3f} involuntary context switches a request)"
           if res["switches"] else "")
        + f", wrk {res['wrk_us'] or 0:.1f} µs" + (f", the tool {res['tool_us'] or 0:.1f} µs" if sniff else "")
        + (f", sslsniff printed {got['reads'] + got['writes']} lost {got['lost']}, its CPU {tool_cpu:.0f}%" if sniff else "")
        + (f", FUTEX_WAKE {res['wakes']:.4f} a request, watcher CPU {watch_cpu:.1f}%" if res.get("wakes") is not None else ""))
    return res


def print_cpu_budget(traced, pairs, untraced):
    """Where the CPU time of a request goes (medians), and the requests/s share the CPUs allow:
    unpinned, nginx, wrk and the tool share every CPU, so the tool's CPU comes out of theirs;
    pinned (SBENCH_PIN), nginx and wrk share CPU 0 and the tool has CPU 1 to itself."""
    if not untraced or any(x.get("wrk_us") is None for x in untraced):
        return
    n0 = statistics.median(x["cpu_us"] for x in untraced)
    w0 = statistics.median(x["wrk_us"] for x in untraced)
    busy = statistics.median(x["rate"] * (x["cpu_us"] + x["wrk_us"]) / 1e6 for x in untraced)
    if PIN:
        print(f"CPU time a request, nginx and wrk on CPU 0, the tool on CPU 1: untraced, nginx {n0:.1f} µs + wrk "
              f"{w0:.1f} µs ({busy:.2f} CPUs busy). Predicted share: the untraced nginx + wrk CPU a request over the "
              "traced run's (CPU 0 is the bottleneck).")
        print()
        print("| nginx | nginx µs | wrk µs | the tool's µs (CPU 1) | share the CPU times predict |")
        print("|---|---:|---:|---:|---:|")
    else:
        print(f"CPU time a request: untraced, nginx {n0:.1f} µs + wrk {w0:.1f} µs, {busy:.2f} of the "
              f"{os.cpu_count()} CPUs busy. Ceiling: the share of the untraced requests/s left when every CPU is busy "
              "and the tool's CPU comes out of nginx's and wrk's, with probes that cost nginx nothing (the tool "
              "does the same work per event on the kernel and through userbpf). Predicted: the untraced nginx + wrk "
              "CPU a request over the traced run's nginx + wrk + tool.")
        print()
        print("| nginx | nginx µs | wrk µs | the tool's µs | ceiling from the tool's CPU | share the CPU times predict |")
        print("|---|---:|---:|---:|---:|---:|")
    for c in traced:
        rs = [r for r, _, _ in pairs[c] if r.get("tool_us") is not None]
        if not rs:
            continue
        n = statistics.median(r["cpu_us"] for r in rs)
        w = statistics.median(r["wrk_us"] for r in rs)
        t = statistics.median(r["tool_us"] for r in rs)
        if PIN:
            print(f"| {CONFIGS[c]} | {n:.1f} | {w:.1f} | {t:.1f} | {100 * (n0 + w0) / (n + w):.1f}% |")
        else:
            print(f"| {CONFIGS[c]} | {n:.1f} | {w:.1f} | {t:.1f} | {100 * (n0 + w0) / (n0 + w0 + t):.1f}% | "
                  f"{100 * (n0 + w0) / (n + w + t):.1f}% |")
    print()


def print_relative_cpu(traced, ratios):
    """nginx's CPU a request relative to wrk's in the same run (SBENCH_PIN: both on CPU 0). wrk
    does the same work a request whether nginx is traced or not, and the machine's speed, which
    moves the request rate by a third from one run to the next here, moves both alike: the
    ratio's share (untraced ratio over traced) is what the probes cost nginx, with that drift
    cancelled (wrk's own time still carries what sharing CPU 0's caches with the probes costs
    it)."""
    shares = {}
    if not PIN or not any(ratios[c] for c in traced):
        return shares
    print("nginx's CPU a request over wrk's, in the same run (both on CPU 0: the machine's drift cancels out); "
          "share: the untraced runs' ratio beside each traced run over the traced run's.")
    print()
    print("| nginx | nginx ÷ wrk CPU a request (untraced) | share by it |")
    print("|---|---:|---:|")
    for c in traced:
        if not ratios[c]:
            continue
        each = [100 * b / t for t, b in ratios[c]]
        shares[c] = statistics.median(each)
        print(f"| {CONFIGS[c]} | {statistics.median(t for t, _ in ratios[c]):.3f} "
              f"({statistics.median(b for _, b in ratios[c]):.3f}) | {statistics.median(each):.1f}% "
              f"({min(each):.0f}–{max(each):.0f}%) |")
    print()
    return shares


def main():
    s = setup()
    cpu = ""
    try:
        cpu = next(l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    loads = [loadavg()]
    nginx_v = subprocess.run([NGINX, "-v"], capture_output=True, text=True).stderr.strip()
    print(f"## sslsniff benchmark: {time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} CPUs ({cpu}), Linux {platform.release()}")
    print()
    print(f"{nginx_v}, one worker, libssl {os.path.basename(os.path.realpath(system_libssl()[0]))} (a private copy); "
          f"BCC_KERNEL_SOURCE={s['ksrc']}")
    print()
    if ONLY in ("", "check"):
        capture_check(s)
    if ONLY in ("", "timed"):
        traced = TRACED
        pairs = {c: [] for c in traced}
        # nginx's CPU a request over wrk's, in the untraced runs beside each traced run and in it.
        ratios = {c: [] for c in traced}
        untraced = []
        with tempfile.TemporaryDirectory(prefix="sbench-") as workdir:
            before = timed(s, "none", workdir)
            if before:
                untraced.append(before)
            for _ in range(ROUNDS):
                for c in traced:
                    r = timed(s, c, workdir)
                    after = timed(s, "none", workdir)
                    if after:
                        untraced.append(after)
                    sides = [x for x in (before, after) if x]
                    if r and sides:
                        pairs[c].append((r, sum(x["rate"] for x in sides) / len(sides),
                                         sum(x["cpu_us"] for x in sides) / len(sides)))
                        if r.get("wrk_us") and all(x.get("wrk_us") for x in sides):
                            ratios[c].append((r["cpu_us"] / r["wrk_us"],
                                              sum(x["cpu_us"] / x["wrk_us"] for x in sides) / len(sides)))
                    before = after
                loads.append(loadavg())
        print(f"### wrk -t{THREADS} -c{CONNECTIONS} -d{SECONDS}s on a {PAGES['index.html']}-byte page, {ROUNDS} rounds, "
              f"medians; load average {' → '.join(loads)} (before, after each round)")
        print()
        print("Each share against the mean of the untraced runs just before and after it.")
        print()
        print("| nginx | requests/s | untraced requests/s | share of untraced | nginx CPU µs a request (untraced) | "
              "added a request (SSL_read + SSL_write) | share per nginx CPU-second | sslsniff printed / lost | sslsniff's CPU | "
              "FUTEX_WAKE a request | watcher threads' CPU |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        if untraced:
            rates = [x["rate"] for x in untraced]
            print(f"| {CONFIGS['none']} ({len(untraced)} runs) | {statistics.median(rates):,.0f} | "
                  f"{min(rates):,.0f} – {max(rates):,.0f} | 100% | "
                  f"{statistics.median(x['cpu_us'] for x in untraced):.1f} | – | 100% | – | – | – | – |")
        shares, cpu_shares = {}, {}
        for c in traced:
            if not pairs[c]:
                print(f"| {CONFIGS[c]} | failed | | | | | | | | | |")
                continue
            rate = statistics.median(r["rate"] for r, _, _ in pairs[c])
            base = statistics.median(b for _, b, _ in pairs[c])
            each = [100 * r["rate"] / b for r, b, _ in pairs[c]]
            shares[c] = statistics.median(each)
            cpu_us = statistics.median(r["cpu_us"] for r, _, _ in pairs[c])
            cpu_base = statistics.median(cb for _, _, cb in pairs[c])
            added = statistics.median(r["cpu_us"] - cb for r, _, cb in pairs[c])
            cpu_share = statistics.median(100 * cb / r["cpu_us"] for r, _, cb in pairs[c])
            cpu_shares[c] = cpu_share
            tool_cpu = statistics.median(r["tool_cpu"] or 0 for r, _, _ in pairs[c])
            printed = statistics.median(r.get("reads", 0) + r.get("writes", 0) for r, _, _ in pairs[c])
            lost = statistics.median(r.get("lost", 0) for r, _, _ in pairs[c])
            wakes = [r["wakes"] for r, _, _ in pairs[c] if r.get("wakes") is not None]
            watch = [r["watch_cpu"] for r, _, _ in pairs[c] if r.get("wakes") is not None]
            print(f"| {CONFIGS[c]} | {rate:,.0f} | {base:,.0f} | {shares[c]:.1f}% ({min(each):.0f}–{max(each):.0f}%) | "
                  f"{cpu_us:.1f} ({cpu_base:.1f}) | {added:.2f} µs | {cpu_share:.1f}% | {printed:,.0f} / {lost:,.0f} | "
                  f"{tool_cpu:.0f}% of a CPU | {f'{statistics.median(wakes):.4f}' if wakes else '–'} | "
                  f"{f'{statistics.median(watch):.1f}% of a CPU' if watch else '–'} |")
        print()
        print_cpu_budget(traced, pairs, untraced)
        ratio_shares = print_relative_cpu(traced, ratios)
        if "userbpf" in shares:
            print(f"- {'met' if shares['userbpf'] >= TARGET else 'NOT met'}: nginx traced by sslsniff-bpfcc through "
                  f"userbpf keeps ≥ {TARGET:.0f}% of its untraced requests/s: {shares['userbpf']:.1f}%"
                  + (f" (the kernel: {shares['kernel']:.1f}%)" if "kernel" in shares else ""))
            print(f"- {'met' if cpu_shares['userbpf'] >= TARGET else 'NOT met'}: the same per second of nginx's CPU "
                  f"(what the probes cost the traced process, less moved by other work and by the tool's own Python "
                  f"taking a CPU): {cpu_shares['userbpf']:.1f}%"
                  + (f" (the kernel: {cpu_shares['kernel']:.1f}%)" if "kernel" in cpu_shares else ""))
            if "userbpf" in ratio_shares:
                print(f"- {'met' if ratio_shares['userbpf'] >= TARGET else 'NOT met'}: the same by nginx's CPU a "
                      f"request relative to wrk's in the same run (the machine's drift cancelled): "
                      f"{ratio_shares['userbpf']:.1f}%")
    if problems:
        print()
        print("### Problems")
        print()
        for p in problems:
            print(f"- {p}")
        if ONLY == "check":
            sys.exit(1)


if __name__ == "__main__":
    main()
