#!/usr/bin/env bash
# `make demo`: the bundled example programs, assembled, disassembled and run by the JIT and
# by the interpreter, which must agree.
set -euo pipefail
cd "$(dirname "$0")/.."
u=target/release/userbpf
for src in examples/vm/*.asm; do
    name=${src%.asm}
    echo "== $src: $(head -n 1 "$src" | sed 's/^# *//')"
    hex=$("$u" asm "$src")
    echo "$hex" | "$u" disasm - | sed 's/^/   /'
    mem=()
    [ -f "$name.mem" ] && mem=("$(cat "$name.mem")")
    jit=$(echo "$hex" | "$u" exec "${mem[@]}")
    int=$(echo "$hex" | "$u" exec --interpreter "${mem[@]}")
    echo "   r0 = $jit (JIT), $int (interpreter)"
    [ "$jit" = "$int" ] || { echo "demo: JIT and interpreter disagree on $src" >&2; exit 1; }
done

echo
echo "== examples/bpf/latency.bpf.c: a clang-compiled object run 3 times with userbpf prog run"
"$u" --session "demo-$$" prog run target/bpf/latency.bpf.o --repeat 3 | grep -vE 'values = \{ (cpu[0-9]+ = 0(, )?)+ \}$'

echo
echo "== examples/bpf/funclatency.bpf.c on examples/targets/workload.c: uprobe + uretprobe with userbpf run"
"$u" run target/bpf/funclatency.bpf.o --attach enter=work --attach leave=work -- target/examples/workload 200000

echo
echo "== overhead of a counting uprobe on a noinline function (bench/uprobe's target and program)"
d=target/demo
mkdir -p "$d"
cc -O2 -g -fno-omit-frame-pointer -shared -fPIC -o "$d/libbenchlib.so" bench/uprobe/benchlib.c
cc -O2 -g -fno-omit-frame-pointer -o "$d/target" bench/uprobe/target.c -L"$d" -lbenchlib -Wl,-rpath,'$ORIGIN'
clang -target bpf -g -O2 -D__TARGET_ARCH_x86 -I/usr/include/x86_64-linux-gnu -DCOUNT_ENTRY -c -o "$d/count-entry.bpf.o" bench/uprobe/count.bpf.c
kload_err=$(cc -O2 -g -o "$d/kload" bench/uprobe/kload.c -lbpf 2>&1) || kload_err="building kload failed: $(echo "$kload_err" | head -n 1)"
[ -x "$d/kload" ] && kload_err=""
# Thread CPU ns per call of the target's loop (best of 3 runs), with the given prefix command.
cpu_ns() {
    local n=$1 best="" v
    shift
    for _ in 1 2 3; do
        v=$("$@" "$d/target" exe "$n" 2>/dev/null | sed -n 's/.*cpu_ns_per_call=\([0-9.]*\).*/\1/p' | head -n 1)
        [ -n "$v" ] || return 1
        best=$(awk -v a="$v" -v b="$best" 'BEGIN { print (b == "" || a < b) ? a : b }')
    done
    echo "$best"
}
base=$(cpu_ns 5000000 env)
ours=$(cpu_ns 5000000 "$u" run "$d/count-entry.bpf.o" --attach count_entry=bench_fn --)
ub=$(awk -v p="$ours" -v b="$base" 'BEGIN { d = p - b; if (d < 0.1) d = 0.1; printf "%.1f", d }')
kern=""
if [ -z "$kload_err" ]; then
    kern=$(cpu_ns 200000 "$d/kload" "$d/count-entry.bpf.o" "$d/target" bench_fn --) || kload_err="the kernel refused the uprobe (run as root on a kernel with uprobes and BPF)"
fi
if [ -n "$kern" ]; then
    awk -v u="$ub" -v k="$kern" -v b="$base" 'BEGIN { kd = k - b; printf "overhead per call: userbpf %s ns, kernel uprobe %.0f ns (%.0fx cheaper)\n", u, kd, kd / u }'
else
    echo "overhead per call: userbpf $ub ns, kernel uprobe not measured: $kload_err"
fi

echo
echo "== userbpf tool: funclatency, calls and trace on examples/targets/workload.c (tools/*.bpf.c)"
"$u" tool funclatency target/examples/workload:work -- target/examples/workload 20000
"$u" tool calls -n 5 'c:*printf*' -- target/examples/workload 1000
"$u" tool trace 'target/examples/workload:work (arg1 > 4092) "n=%d", arg1' 'r:target/examples/workload:work (retval < 2) "ret %ld", retval' -- target/examples/workload 10000

echo
echo "== userbpf tool iolatency: block I/O latency per user function (uprobes in fio, block tracepoints in the kernel), fio with direct I/O on a loop device"
if [ "$(id -u)" = 0 ] && command -v losetup > /dev/null && command -v fio > /dev/null; then
    truncate -s 64M "$d/iolatency.img"
    loopdev=$(losetup --direct-io=on -f --show "$d/iolatency.img")
    "$u" tool iolatency -- fio --name=demo --filename="$loopdev" --direct=1 --rw=randrw --bs=4k --size=8m \
        --ioengine=psync --fdatasync=32 --output=/dev/null | grep -v ' : 0 *|'
    losetup -d "$loopdev"
else
    echo "(skipped: needs root, losetup and fio)"
fi

echo
echo "== userbpf export: the maps of a session as Prometheus metrics (a scrape of /metrics)"
s="demo-export-$$"
"$u" --session "$s" export --listen 127.0.0.1:0 > "$d/export.out" &
exporter=$!
for _ in $(seq 100); do grep -q /metrics "$d/export.out" 2>/dev/null && break; sleep 0.05; done
"$u" --session "$s" prog run target/bpf/latency.bpf.o --repeat 10 > /dev/null
addr=$(sed -n 's|.*http://\([^/]*\)/metrics.*|\1|p' "$d/export.out")
python3 -c 'import sys, urllib.request; print(urllib.request.urlopen("http://" + sys.argv[1] + "/metrics").read().decode(), end="")' "$addr" | grep -E '^(# TYPE )?userbpf_(map_(slowest|latency_bss_calls|hist)[ {]|map_hist_(count|bucket\{le="(4095|\+Inf)")|programs )'
kill -INT "$exporter"
wait "$exporter"
echo "== userbpf export --config examples/export/latency.yaml --run-stats: metrics named by a config file, and the programs' run counters"
"$u" --session "$s" export --listen 127.0.0.1:0 --config examples/export/latency.yaml --run-stats > "$d/export2.out" &
exporter=$!
for _ in $(seq 100); do grep -q /metrics "$d/export2.out" 2>/dev/null && break; sleep 0.05; done
"$u" --session "$s" prog run target/bpf/latency.bpf.o --repeat 10 > /dev/null
addr=$(sed -n 's|.*http://\([^/]*\)/metrics.*|\1|p' "$d/export2.out")
python3 -c 'import sys, urllib.request; print(urllib.request.urlopen("http://" + sys.argv[1] + "/metrics").read().decode(), end="")' "$addr" | grep -E '^(# TYPE )?(app_slowest_call[ {]|app_call_latency_seconds |app_call_latency_seconds_(count|bucket\{le="(4.095e-6|\+Inf)")|userbpf_program_(runs|run_time_seconds|errors)_total[ {])'
kill -INT "$exporter"
wait "$exporter"

echo
echo "== userbpf tool aiocost: io_uring, native aio and POSIX aio phase by phase (tools/aiocost/aiobench.c's USDT probes), through userbpf and through the kernel"
"$u" tool aiocost -n 20 --rounds 1 --size-mb 8 --file target/aiocost-demo.dat

echo
echo "== BCC's funclatency-bpfcc (Debian's bpfcc-tools, unchanged) through userbpf load, on a workload started in its session"
s="demo-bcc-$$"
export BCC_KERNEL_SOURCE="${BCC_KERNEL_SOURCE:-$(scripts/bcc-kernel-source.sh)}"
# Job control on for this background job, so that it does not start with SIGINT ignored (as a
# non-interactive shell's background jobs do): Python then never sees the Ctrl-C below.
set -m
USERBPF_SESSION="$s" "$u" load funclatency-bpfcc -u target/examples/workload:work > "$d/bcc.out" 2>&1 &
loader=$!
set +m
for _ in $(seq 600); do grep -q "Tracing" "$d/bcc.out" 2>/dev/null && break; sleep 0.05; done
for _ in $(seq 100); do [ -n "$(ls /dev/shm/userbpf-$(id -u)-"$s"/links/*.json 2>/dev/null)" ] && break; sleep 0.05; done
USERBPF_SESSION="$s" "$u" start target/examples/workload 1000
kill -INT "$loader"
for _ in $(seq 600); do kill -0 "$loader" 2>/dev/null || break; sleep 0.05; done
if kill -0 "$loader" 2>/dev/null; then
    kill -KILL "$loader"
    echo "demo: funclatency-bpfcc did not end 30 s after SIGINT" >&2
    exit 1
fi
wait "$loader"
cat "$d/bcc.out"
