# userbpf: `make demo` runs the main job on bundled examples; `make test` installs what is
# missing, builds and runs every test; `make bench` prints the benchmark tables.

CARGO ?= cargo
USERBPF := target/release/userbpf

.PHONY: all deps build test unit conformance bench demo clean

all: build

deps:
	@scripts/install-deps.sh

build: deps
	$(CARGO) build --release --locked --workspace

test: build unit conformance

unit:
	$(CARGO) test --release --locked --workspace

# The bpf_conformance suite through `userbpf exec`, JIT and interpreter (when ../shared is there).
conformance: build
	scripts/conformance.sh $(USERBPF)

bench: build
	$(CARGO) run --release --locked -p userbpf-bench --bin vm-bench

demo: build
	@scripts/demo.sh

clean:
	$(CARGO) clean
