# Sourced by steps.sh and loop.sh (HERE set to this folder): ROOT, the build folder B with the
# stand-in libssl (fakessl.c) built in it, and BCC's kernel headers as bench/sslsniff/bench.py
# sets them up (target/sslbench/kheaders: run `SBENCH_ONLY=check python3
# bench/sslsniff/bench.py` once), or BCC_KERNEL_SOURCE.
ROOT=$(cd "$HERE/../../.." && pwd)
B=$ROOT/target/sslbench/steps
export BCC_KERNEL_SOURCE=${BCC_KERNEL_SOURCE:-$ROOT/target/sslbench/kheaders}
[ -d "$BCC_KERNEL_SOURCE" ] || { echo "no $BCC_KERNEL_SOURCE: run SBENCH_ONLY=check python3 bench/sslsniff/bench.py once" >&2; exit 1; }
mkdir -p "$B"
cc -O2 -shared -fPIC -o "$B/libssl.so.3" "$HERE/fakessl.c"
