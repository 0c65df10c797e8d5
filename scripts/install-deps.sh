#!/usr/bin/env bash
# Installs what building and testing userbpf needs, from Debian's packages. Idempotent: a
# package is installed only when the command it provides is missing.
set -euo pipefail

need=()
want() { # want COMMAND PACKAGE
    command -v "$1" >/dev/null 2>&1 || need+=("$2")
}
want python3 python3
want cc gcc
want llvm-objdump llvm
want llvm-mc llvm
want clang clang
want bpftool bpftool
want fio fio
# make bench counts system calls with perf stat.
want perf linux-perf
want strace strace
# The loader tests (`userbpf load`) compare against the real tools through the kernel.
want bpftrace bpftrace
# The exporter's test (`userbpf export`) checks a real scrape with Prometheus's own parser.
want promtool prometheus
# The redis hot patch's test and benchmark (examples/bpf/redis-fsync.bpf.c, bench/redis).
want redis-server redis-server
want redis-benchmark redis-tools
# The sslsniff benchmark (bench/sslsniff): BCC's sslsniff on nginx serving HTTPS to wrk (BCC
# and the kernel headers: below).
want nginx nginx
want wrk wrk
want openssl openssl
want curl curl
[ -x /usr/sbin/funclatency ] && [ -x /usr/sbin/bashreadline ] && [ -x /usr/sbin/gethostlatency ] || need+=(libbpf-tools)
[ -f /usr/include/bpf/bpf_helpers.h ] || need+=(libbpf-dev)
# BCC's Python tools, compared through the kernel and `userbpf load` (crates/cli/tests/bcc.rs),
# and kernel headers for their run-time compiler (another version than the running kernel's:
# scripts/bcc-kernel-source.sh makes a tree of them for BCC_KERNEL_SOURCE).
want funclatency-bpfcc bpfcc-tools
[ -f /usr/lib/python3/dist-packages/bcc/__init__.py ] || need+=(python3-bpfcc)
ls -d /usr/src/linux-headers-*/include/generated >/dev/null 2>&1 || need+=(linux-headers-amd64)
# `userbpf tool aiocost`'s benchmark (tools/aiocost/aiobench.c) reads through io_uring and libaio.
[ -f /usr/include/liburing.h ] || need+=(liburing-dev)
[ -f /usr/include/libaio.h ] || need+=(libaio-dev)
[ -f /usr/include/x86_64-linux-gnu/sys/sdt.h ] || [ -f /usr/include/sys/sdt.h ] || need+=(systemtap-sdt-dev)

if ! command -v cargo >/dev/null 2>&1; then
    echo "install-deps: cargo (Rust 1.95) is required and is not on PATH" >&2
    exit 1
fi

if [ ${#need[@]} -gt 0 ]; then
    mapfile -t need < <(printf '%s\n' "${need[@]}" | sort -u)
    echo "install-deps: installing ${need[*]}"
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    export DEBIAN_FRONTEND=noninteractive
    $sudo apt-get update -qq
    $sudo apt-get install -y -qq --no-install-recommends "${need[@]}"
fi

# The kernel-side references of the tests (libbpf and bpftrace attaching tracepoints) read the
# tracing filesystem, which a fresh machine or container may not have mounted.
mount_if_missing() { # mount_if_missing TYPE DIR PROBE
    [ -e "$3" ] && return 0
    [ "$(id -u)" -eq 0 ] || { echo "install-deps: $2 is not mounted (needs root: mount -t $1 nodev $2)" >&2; return 0; }
    mount -t "$1" nodev "$2" && echo "install-deps: mounted $1 at $2"
}
mount_if_missing tracefs /sys/kernel/tracing /sys/kernel/tracing/events
mount_if_missing debugfs /sys/kernel/debug /sys/kernel/debug/tracing
