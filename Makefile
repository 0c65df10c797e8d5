# userbpf: `make demo` runs the main job on bundled examples; `make test` installs what is
# missing, builds and runs every test; `make bench` prints the benchmark tables and draws
# them as SVG charts into target/bench.

CARGO ?= cargo
USERBPF := target/release/userbpf

# eBPF C examples, compiled by clang into the build directory (never committed).
# include/ holds <userbpf/helpers.h> (userbpf's own helpers), which `make install` installs.
BPF_CFLAGS := -target bpf -g -O2 -D__TARGET_ARCH_x86 -I/usr/include/x86_64-linux-gnu -Iinclude
PREFIX ?= /usr/local
# libbpf programs with a skeleton (`bpftool gen skeleton`, generated into target/libbpf).
LIBBPF_EXAMPLES := $(patsubst examples/libbpf/%.bpf.c,target/libbpf/%,$(wildcard examples/libbpf/*.bpf.c))
# The eBPF side of `userbpf tool NAME` (tools/NAME.bpf.c), found by the CLI in target/tools.
TOOLS := $(patsubst tools/%.bpf.c,target/tools/%.bpf.o,$(wildcard tools/*.bpf.c)) target/tools/aiobench \
	target/tools/iolatency.bpf.o
EXAMPLES := $(patsubst examples/bpf/%.bpf.c,target/bpf/%.bpf.o,$(wildcard examples/bpf/*.bpf.c)) \
	$(patsubst examples/targets/%.c,target/examples/%,$(wildcard examples/targets/*.c)) \
	$(LIBBPF_EXAMPLES) $(TOOLS)

.PHONY: all deps build test lint unit conformance bench bench-tables demo clean examples install

all: build

deps:
	@scripts/install-deps.sh

build: deps
	$(CARGO) build --release --locked --workspace
	@$(MAKE) --no-print-directory examples

examples: $(EXAMPLES)

target/bpf/%.bpf.o: examples/bpf/%.bpf.c include/userbpf/helpers.h
	@mkdir -p $(dir $@)
	clang $(BPF_CFLAGS) -c -o $@ $<

target/tools/%.bpf.o: tools/%.bpf.c
	@mkdir -p $(dir $@)
	clang $(BPF_CFLAGS) -c -o $@ $<

# iolatency's object is also an example (examples/bpf/iolatency.bpf.c).
target/tools/iolatency.bpf.o: examples/bpf/iolatency.bpf.c
	@mkdir -p $(dir $@)
	clang $(BPF_CFLAGS) -c -o $@ $<

# aiocost's benchmark: io_uring (liburing), native AIO (libaio), POSIX AIO, with USDT probes.
target/tools/aiobench: tools/aiocost/aiobench.c
	@mkdir -p $(dir $@)
	cc -O2 -g -Wall -o $@ $< -luring -laio

target/examples/%: examples/targets/%.c
	@mkdir -p $(dir $@)
	cc -O2 -g -fno-omit-frame-pointer -o $@ $<

target/libbpf/%.bpf.o: examples/libbpf/%.bpf.c $(wildcard examples/libbpf/*.h)
	@mkdir -p $(dir $@)
	clang $(BPF_CFLAGS) -c -o $@ $<

target/libbpf/%.skel.h: target/libbpf/%.bpf.o
	bpftool gen skeleton $< name $(subst -,_,$*)_bpf > $@

.SECONDARY: $(LIBBPF_EXAMPLES:%=%.bpf.o) $(LIBBPF_EXAMPLES:%=%.skel.h)

$(LIBBPF_EXAMPLES): target/libbpf/%: examples/libbpf/%.c target/libbpf/%.skel.h
	cc -O2 -g -Wall -Itarget/libbpf -Iexamples/libbpf -o $@ $< -lbpf -lelf -lz

test: build lint unit conformance

# The rules the build enforces: rustfmt's layout (rustfmt.toml) and clippy with every warning
# an error, on top of the workspace lints of Cargo.toml (SAFETY comments, unsafe operations
# in unsafe functions, documented safety contracts).
lint:
	$(CARGO) fmt --all --check
	$(CARGO) clippy --release --locked --workspace --all-targets -- -D warnings

# BCC's tools (crates/cli/tests/bcc.rs) compile against the kernel headers the script sets up.
unit:
	BCC_KERNEL_SOURCE="$${BCC_KERNEL_SOURCE:-$$(scripts/bcc-kernel-source.sh)}" $(CARGO) test --release --locked --workspace

# The bpf_conformance suite through `userbpf exec`, JIT and interpreter (when ../shared is there).
conformance: build
	scripts/conformance.sh $(USERBPF)

# `make bench` prints the tables and keeps what it printed in target/bench/bench.md; then
# bench-plot (bench/src/plot.rs) draws every table into target/bench/NN-*.svg, listed with
# their titles in target/bench/charts.md (also when a benchmark failed: the tables so far).
# `make`, not $(MAKE): `make -n bench` then only prints this line (the flags still pass
# through MAKEFLAGS).
BENCH_DIR := target/bench

bench: build
	@mkdir -p $(BENCH_DIR)
	@PYTHONUNBUFFERED=1 bash -o pipefail -c 'make --no-print-directory bench-tables | tee $(BENCH_DIR)/bench.md'; rc=$$?; \
	$(CARGO) run --release --locked -q -p userbpf-bench --bin bench-plot -- $(BENCH_DIR)/bench.md $(BENCH_DIR); exit $$rc

bench-tables:
	$(CARGO) run --release --locked -p userbpf-bench --bin vm-bench
	$(CARGO) run --release --locked -p userbpf-bench --bin map-bench
	$(CARGO) run --release --locked -p userbpf-bench --bin wakeup-bench
	$(CARGO) run --release --locked -p userbpf-bench --bin helper-bench
	$(CARGO) run --release --locked -p userbpf-bench --bin verifier-bench -- --bpftrace $(wildcard target/bpf/*.bpf.o) $(wildcard target/tools/*.bpf.o) $(wildcard target/libbpf/*.bpf.o)
	USERBPF_VERIFY_FUZZ_COUNT=1000000 USERBPF_VERIFY_FUZZ_OBJECTS=100000 $(CARGO) test --release --locked -p userbpf-runtime --test verify_fuzz -- --nocapture
	$(CARGO) run --release --locked -p userbpf-bench --bin kernel-map-bench
	python3 bench/uprobe/bench.py
	python3 bench/override/bench.py
	python3 bench/loader/bench.py
	python3 bench/agent/bench.py
	python3 bench/syscalls/bench.py
	python3 bench/attach/bench.py
	python3 bench/redis/bench.py
	python3 bench/wakeups/latency.py
	python3 bench/sslsniff/bench.py
	bash bench/sslsniff/steps/steps.sh
	bash bench/sslsniff/steps/loop.sh

# userbpf's headers: <userbpf/helpers.h> for eBPF C programs (its own helpers, the override
# extensions), <userbpf/libbpf.h> for libbpf loaders.
install:
	install -d $(DESTDIR)$(PREFIX)/include/userbpf
	install -m 0644 include/userbpf/*.h $(DESTDIR)$(PREFIX)/include/userbpf/

demo: build
	@scripts/demo.sh
	@echo "== userbpf tool funclatency --svg: the histogram as a chart"; $(USERBPF) tool funclatency --svg target/funclatency.svg target/examples/workload:work -- target/examples/workload 20000 | tail -1

clean:
	$(CARGO) clean
