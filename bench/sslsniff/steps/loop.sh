#!/bin/bash
# What sslsniff-bpfcc's probes add to a request in real time, on cold caches: sslloop.c makes
# nginx's three SSL calls a request (read 100 bytes, a read finding nothing, write 612 bytes)
# on the stand-in libssl (fakessl.c), with DLINES data lines and IKB KiB of code touched
# between requests, as nginx's own work evicts the probes' code and data, and the same calls
# on unprobed copies in alternate rounds. Runs under `userbpf start` with sslsniff-bpfcc
# loaded through `userbpf load`, on CPU
# 0 (sslsniff on CPU 1), and prints each run and the medians. One column per userbpf given,
# to compare builds side by side: runs alternate between them.
#
#   bench/sslsniff/steps/loop.sh [USERBPF ...]    (default target/release/userbpf)
#   LOOP_RUNS (5), LOOP_REQUESTS (20000), LOOP_ROUNDS (21), LOOP_DLINES (1000), LOOP_IKB (24), LOOP_STRIDE (64: 4160 evicts TLB entries too)
#
# Needs BCC's kernel headers (see setup.sh).
set -e
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/setup.sh"
[ $# -gt 0 ] || set -- "$ROOT/target/release/userbpf"
RUNS=${LOOP_RUNS:-5}
ARGS="${LOOP_REQUESTS:-20000} ${LOOP_ROUNDS:-21} ${LOOP_DLINES:-1000} ${LOOP_IKB:-24} 1 ${LOOP_STRIDE:-64}"
cc -O2 -fcf-protection=none -o "$B/sslloop" "$HERE/sslloop.c" -L"$B" -l:libssl.so.3 -Wl,-rpath,"$B"
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
	USERBPF_SESSION=sloop-$$-$i taskset -c 1 "$U" load /usr/sbin/sslsniff-bpfcc -o -g -n \
		--extra-lib "openssl:$B/libssl.so.3" >/dev/null 2>"$T/sniff$i" &
	sniffs+=($!)
	set +m
	for _ in $(seq 300); do grep -q FUNC "$T/sniff$i" 2>/dev/null && break; sleep 0.1; done
done
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
	echo "$line"
done
i=0
for U in "$@"; do
	i=$((i + 1))
	echo "[$i] $U: added a request, median of runs: $(awk '{print $3}' "$T/u$i" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}') ns (unprobed $(awk '{print $2}' "$T/u$i" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}') ns)"
done
