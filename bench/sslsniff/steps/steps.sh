#!/bin/bash
# Instructions sslsniff-bpfcc's probes cost a read+write pair through `userbpf load`, counted
# by single-stepping one pair (SSL_read of 100 bytes, SSL_write of 612, nginx's sizes in
# bench/sslsniff) of a stand-in libssl (fakessl.c) after 200,000 warm-up pairs, then
# attributed to stubs, programs, map operations and helpers (attribute.py; the stubs and
# JIT'd programs named through USERBPF_PERF_MAP), with the code lines and pages they ran and
# the data lines and pages they touched (bench/src/datapages.rs). Callgrind cannot count this
# path: valgrind refuses rseq, so under it every hit takes the general path. One column per userbpf given,
# to compare builds side by side. Stepping a pair takes a tenth of a second or so, so caches
# that refresh by time (comm and uid/gid: 10 ms; the TSC clock's calibration: 1 s) refresh
# inside the stepped pair: their refreshes (getuid, prctl, clock_gettime) show in its count,
# where at full speed a thread pays them once per 10 ms or per second.
#
#   bench/sslsniff/steps/steps.sh [USERBPF ...]    (default target/release/userbpf)
#   KEEP_STEPS=DIR keeps the stepped addresses, states, maps and perf maps in DIR
#   (attribute.py and data-pages read them again).
#
# Needs BCC's kernel headers (see setup.sh).
set -e
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/setup.sh"
[ $# -gt 0 ] || set -- "$ROOT/target/release/userbpf"
cc -O2 -fcf-protection=none -o "$B/sslstep" "$HERE/sslstep.c" -L"$B" -l:libssl.so.3 -Wl,-rpath,"$B"
cc -O2 -o "$B/stepper" "$ROOT/bench/uprobe/steps/stepper.c"
T=$(mktemp -d)
trap '[ -n "$KEEP_STEPS" ] && cp -r "$T" "$KEEP_STEPS"; rm -rf "$T"' EXIT

# step OUT CMD...: runs CMD (which starts sslstep), prints the steps of one pair; with OUT,
# OUT.ips, OUT.states and OUT.maps get the addresses, the registers and bytes of every
# instruction, and the maps.
step() {
	local out=$1 job pid=
	shift
	"$@" >"$T/out" 2>"$T/err" &
	job=$!
	for _ in $(seq 400); do
		pid=$(sed -n 's/^ready //p' "$T/err")
		[ -n "$pid" ] && break
		sleep 0.05
	done
	[ -n "$pid" ] || { echo "sslstep did not start: $(tail -3 "$T/err")" >&2; kill $job; return 1; }
	if [ -n "$out" ]; then
		timeout 120 "$B/stepper" "$pid" "$out.ips" "$out.maps" "$out.states"
		cp "/tmp/perf-$pid.map" "$out.perfmap" 2>/dev/null || true
		rm -f "/tmp/perf-$pid.map"
	else
		timeout 60 "$B/stepper" "$pid"
	fi
	wait $job
}

base=$(step "" "$B/sslstep" 0)
echo "unprobed: $base instructions a read+write pair"
files=() states=() labels=() i=0
for U in "$@"; do
	U=$(realpath "$U")
	i=$((i + 1))
	export USERBPF_SESSION=ssteps-$$-$i
	set -m
	"$U" load /usr/sbin/sslsniff-bpfcc -o -g -n --extra-lib "openssl:$B/libssl.so.3" >"$T/sniff" 2>&1 &
	sniff=$!
	set +m
	for _ in $(seq 300); do grep -q FUNC "$T/sniff" && break; sleep 0.1; done
	n=$(USERBPF_PERF_MAP=1 step "$T/run$i" "$U" start "$B/sslstep" 1)
	kill -INT -$sniff 2>/dev/null || true
	sleep 1
	kill -TERM -$sniff 2>/dev/null || true
	wait $sniff || true
	echo "$U: $((n - base)) instructions a pair more than unprobed"
	files+=("$T/run$i.ips" "$T/run$i.maps" "$T/run$i.perfmap")
	states+=("$T/run$i.states" "$T/run$i.maps")
	d=$(dirname "$U")
	d=${d%/target/release}
	labels+=("$(basename "$d")")
done
echo
python3 "$HERE/attribute.py" "${files[@]}" -- "${labels[@]}"
echo
"$ROOT/target/release/data-pages" --skip libssl.so.3 "${states[@]}" -- "${labels[@]}"
