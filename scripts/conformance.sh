#!/usr/bin/env bash
# Runs the bpf_conformance suite through `userbpf exec`, with the JIT and with the
# interpreter. Usage: scripts/conformance.sh USERBPF_BINARY [CONFORMANCE_DIR]
set -euo pipefail
bin=$(realpath "$1")
dir=${2:-}
if [ -z "$dir" ]; then
    for d in ../shared/conformance ../../shared/conformance; do
        [ -f "$d/run.py" ] && { dir=$d; break; }
    done
fi
if [ -z "$dir" ] || [ ! -f "$dir/run.py" ]; then
    if [ "${USERBPF_ALLOW_SKIP:-}" = 1 ]; then
        echo "conformance: SKIPPED (USERBPF_ALLOW_SKIP=1): ../shared/conformance not found"
        exit 0
    fi
    echo "conformance: ../shared/conformance (the bpf_conformance suite beside the repository) not found;" \
        "USERBPF_ALLOW_SKIP=1 skips it on a machine without it" >&2
    exit 1
fi
status=0
for mode in "" "--interpreter"; do
    echo "conformance: userbpf exec ${mode:-(JIT)}"
    python3 "$dir/run.py" run --cpu v4 --include-groups callx \
        --plugin "$bin exec $mode" "$dir/tests" | grep -v '^PASS' || status=1
done
exit $status
