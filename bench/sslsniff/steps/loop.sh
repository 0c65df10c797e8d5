#!/bin/bash
# What sslsniff-bpfcc's probes add to a request in real time, on cold caches: sslloop.c makes
# nginx's three SSL calls a request (read 100 bytes, a read finding nothing, write 612 bytes)
# on the stand-in libssl (fakessl.c), with DLINES data lines and IKB KiB of code touched
# between requests, as nginx's own work evicts the probes' code and data, and the same calls
# on unprobed copies in alternate rounds. Runs under `userbpf start` with sslsniff-bpfcc
# loaded through `userbpf load`, on CPU 0 (sslsniff on CPU 1), one column per userbpf given
# (builds side by side: runs alternate between them), and beside them the same loop on a copy
# of the stand-in that sslsniff-bpfcc traces with the kernel's uprobes (LOOP_KERNEL=0: not);
# prints each run and the medians, and how many times the userbpf's added time the kernel's is.
#
#   bench/sslsniff/steps/loop.sh [USERBPF ...]    (default target/release/userbpf)
#   LOOP_RUNS (5), LOOP_REQUESTS (20000), LOOP_ROUNDS (21), LOOP_DLINES (1000), LOOP_IKB (24),
#   LOOP_STRIDE (64; 4160 evicts TLB entries too), LOOP_KERNEL (1), LOOP_BRANCHES (0; 1: the
#   code between requests is conditional branches, which evict the branch predictors' state)
#
# Needs BCC's kernel headers (see setup.sh).
set -e
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/setup.sh"
[ $# -gt 0 ] || set -- "$ROOT/target/release/userbpf"
RUNS=${LOOP_RUNS:-5}
COMMON="${LOOP_REQUESTS:-20000} ${LOOP_ROUNDS:-21} ${LOOP_DLINES:-1000} ${LOOP_IKB:-24}"
ARGS="$COMMON 1 ${LOOP_STRIDE:-64}"
export SSLLOOP_BRANCHES=${LOOP_BRANCHES:-0}
cc -O2 -fcf-protection=none -o "$B/sslloop" "$HERE/sslloop.c" -L"$B" -l:libssl.so.3 -Wl,-rpath,"$B"
# The kernel's side: the same loop on a copy of the stand-in of its own (another file, so that
# neither tool's probes reach the other's target), sslsniff-bpfcc attached to it by BCC.
mkdir -p "$B/k"
cp "$B/libssl.so.3" "$B/k/libssl.so.3"
cc -O2 -fcf-protection=none -o "$B/sslloop-k" "$HERE/sslloop.c" -L"$B/k" -l:libssl.so.3 -Wl,-rpath,"$B/k"
T=$(mktemp -d)
sniffs=()
cleanup() {
	for s in "${sniffs[@]}"; do
		kill -INT -"$s" 2>/dev/null || true
	done
	sleep 1
	for s in "${sniffs[@]}"; do
		kill -TERM -"$s" 2>/dev/null || true
	done
	rm -rf "$T"
}
trap cleanup EXIT
i=0
for U in "$@"; do
	i=$((i + 1))
	set -m
	# Its events printed to nothing but its header (unbuffered: the header shows it attached).
	PYTHONUNBUFFERED=1 USERBPF_SESSION=sloop-$$-$i taskset -c 1 "$U" load /usr/sbin/sslsniff-bpfcc -o -g -n \
		--extra-lib "openssl:$B/libssl.so.3" > >(sed -un '1,2p' >"$T/sniff$i") 2>"$T/sniff$i.err" &
	sniffs+=($!)
	set +m
	for _ in $(seq 300); do grep -q FUNC "$T/sniff$i" 2>/dev/null && break; sleep 0.1; done
	grep -q FUNC "$T/sniff$i" || { echo "sslsniff-bpfcc through $U did not start: $(cat "$T/sniff$i.err")" >&2; exit 1; }
done
KERNEL=${LOOP_KERNEL:-1}
if [ "$KERNEL" != 0 ]; then
	set -m
	# The same as through userbpf.
	PYTHONUNBUFFERED=1 taskset -c 1 /usr/sbin/sslsniff-bpfcc -o -g -n --extra-lib "openssl:$B/k/libssl.so.3" \
		> >(sed -un '1,2p' >"$T/ksniff") 2>"$T/ksniff.err" &
	sniffs+=($!)
	set +m
	for _ in $(seq 300); do grep -q FUNC "$T/ksniff" 2>/dev/null && break; sleep 0.1; done
	grep -q FUNC "$T/ksniff" || { echo "sslsniff-bpfcc on the kernel did not start: $(cat "$T/ksniff.err")" >&2; exit 1; }
fi
sleep 1
echo "ns a request (three SSL calls) probed, unprobed (the same process, rounds alternating) and added: median of each run's rounds;"
echo "$ARGS (requests a round, rounds, data lines, code KiB between requests, wait, data stride); $(date -u '+%F %H:%M') UTC"
for r in $(seq "$RUNS"); do
	line="run $r:"
	i=0
	for U in "$@"; do
		i=$((i + 1))
		v=$(USERBPF_SESSION=sloop-$$-$i taskset -c 0 "$U" start "$B/sslloop" $ARGS)
		echo "$v" >>"$T/u$i"
		line="$line  [$i] $v"
	done
	if [ "$KERNEL" != 0 ]; then
		v=$(taskset -c 0 "$B/sslloop-k" $COMMON 0 "${LOOP_STRIDE:-64}")
		echo "$v" >>"$T/k"
		line="$line  [kernel] $v"
	fi
	echo "$line"
done
med() { awk -v c="$2" '{print $c}' "$1" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
[ "$KERNEL" = 0 ] || echo "[kernel] sslsniff-bpfcc on kernel uprobes: added a request, median of runs: $(med "$T/k" 3) ns (unprobed $(med "$T/k" 2) ns)"
i=0
for U in "$@"; do
	i=$((i + 1))
	m=$(med "$T/u$i" 3)
	echo "[$i] $U: added a request, median of runs: $m ns (unprobed $(med "$T/u$i" 2) ns)$([ "$KERNEL" = 0 ] || awk -v k="$(med "$T/k" 3)" -v u="$m" 'BEGIN {printf ", the kernel adds %.1f× as much", k / u}')"
done
