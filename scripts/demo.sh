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
