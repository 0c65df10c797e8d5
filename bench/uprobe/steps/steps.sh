#!/bin/bash
# Instructions a probe hit costs, counted by single-stepping one hit of bench_fn (callgrind
# cannot: valgrind refuses rseq, so under it every hit takes the general path): the steps
# between stepme's two SIGSTOPs, probed minus unprobed. For bpftrace's counting programs
# through `userbpf load`, the libbpf per-CPU array counter and an empty program through
# `userbpf run` (bench/uprobe's objects: run bench.py once first to build them).
#
#   bench/uprobe/steps/steps.sh [USERBPF]    (default target/release/userbpf)
set -e
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../../.." && pwd)
U=$(realpath "${1:-$ROOT/target/release/userbpf}")
B=$ROOT/target/ubench/steps
mkdir -p "$B"
cc -O2 -fcf-protection=none -o "$B/stepme" "$HERE/stepme.c"
cc -O2 -o "$B/stepper" "$HERE/stepper.c"
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT

# step CMD...: runs CMD (which starts stepme), prints the steps of one call.
step() {
	"$@" >"$T/out" 2>"$T/err" &
	local job=$! pid=
	for _ in $(seq 400); do
		pid=$(sed -n 's/^ready //p' "$T/err")
		[ -n "$pid" ] && break
		sleep 0.05
	done
	[ -n "$pid" ] || { echo "stepme did not start: $(tail -3 "$T/err")" >&2; kill $job; return 1; }
	timeout 60 "$B/stepper" "$pid"
	wait $job
}

base=$(step "$B/stepme" 0)
echo "unprobed: $base instructions between the stops"
export USERBPF_SESSION=steps-$$
for body in '@c = count();' '@x[tid] = count();' '@s = sum(arg0);' '@h = hist(arg0);'; do
	"$U" load bpftrace -e "uprobe:$B/stepme:bench_fn { $body }" >"$T/bt" 2>&1 &
	bt=$!
	for _ in $(seq 100); do grep -q Attaching "$T/bt" && break; sleep 0.1; done
	sleep 0.5
	n=$(step "$U" start "$B/stepme" 1)
	kill -INT $bt; wait $bt || true
	echo "bpftrace \`$body\`: $((n - base)) instructions a hit"
done
for o in percpu-entry:"libbpf per-CPU array counter" noop-entry:"empty program"; do
	n=$(step "$U" run "$ROOT/target/ubench/count-${o%%:*}.bpf.o" --attach count_entry=bench_fn -- "$B/stepme" 1)
	echo "${o#*:} (userbpf run): $((n - base)) instructions a hit"
done
