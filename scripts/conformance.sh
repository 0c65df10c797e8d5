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
    echo "conformance: ../shared/conformance not found, suite not run"
    exit 0
fi
status=0
for mode in "" "--interpreter"; do
    echo "conformance: userbpf exec ${mode:-(JIT)}"
    python3 "$dir/run.py" run --cpu v4 --include-groups callx \
        --plugin "$bin exec $mode" "$dir/tests" | grep -v '^PASS' || status=1
done
exit $status
