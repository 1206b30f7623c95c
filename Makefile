# loopbus: `make run` starts a demo instance, `make test` runs every check.
CARGO ?= cargo
BIN := target/debug/loopbus

.PHONY: all build run test fmt lint bench fuzz footprint clean install dist repro-check dist-check build-offline

all: build

build:
	$(CARGO) build --locked

# Starts an instance named `demo` under the default channel root ($LOOPBUS_ROOT, else
# ~/.loopbus) on the built-in echo engine and prints a ready-to-paste curl line; from
# another shell, `target/debug/loopbus talk demo hello`. Stop it with Ctrl-C.
run: build
	@test -f "$${LOOPBUS_ROOT:-$$HOME/.loopbus}/demo/config.json" || $(BIN) init demo --no-serve-hint
	@$(BIN) serve demo --print-curl

test:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --locked --all-targets -- -D warnings
	RUSTDOCFLAGS="-D warnings" $(CARGO) doc --locked --no-deps
	$(CARGO) test --locked
	$(CARGO) test --locked --features fuzzing --lib

fmt:
	$(CARGO) fmt --all

# Builds the release binary and installs it as `loopbus` in cargo's bin directory
# ($CARGO_HOME/bin, by default ~/.cargo/bin), with the committed Cargo.lock.
install:
	$(CARGO) install --path . --locked

# Runs every fuzz target in fuzz/ for FUZZ_SECS seconds each (nightly and cargo-fuzz;
# never part of `make test`, which is stable-only). FUZZ_TARGETS picks a subset. The
# committed seeds in fuzz/corpus/TARGET are read only; new finds go to
# fuzz/target/corpus/TARGET, crashes to fuzz/artifacts/TARGET.
FUZZ_SECS ?= 60
# Extra libFuzzer flags, e.g. FUZZ_ARGS=-max_len=20000 to reach the 16 KiB head limit.
FUZZ_ARGS ?=
FUZZ_TARGETS ?= request_head request_split request_body response_body registry_file config_file
fuzz:
	@$(CARGO) fuzz --version >/dev/null 2>&1 || { echo "make fuzz needs cargo-fuzz: cargo install cargo-fuzz (and a nightly toolchain: rustup toolchain install nightly)"; exit 1; }
	@for target in $(FUZZ_TARGETS); do \
		echo "== fuzz $$target for $(FUZZ_SECS) s"; \
		mkdir -p fuzz/target/corpus/$$target; \
		(cd fuzz && $(CARGO) +nightly fuzz run $$target target/corpus/$$target corpus/$$target \
			-- -max_total_time=$(FUZZ_SECS) $(FUZZ_ARGS)) || exit 1; \
	done

# Source bundle, SBOM, a binary built from the bundle and SHA256SUMS, under dist/
# (docs/install.md: "Building without a network"). The logic is in scripts/dist.
dist:
	scripts/dist dist

# make dist, then a second build from the bundle elsewhere, compared byte for byte.
repro-check:
	scripts/dist repro-check

# Both, plus the SBOM against `cargo tree`, the built binary's /api/health, no build
# paths in it, and the bundle made twice (.ci/run runs it; it is not part of make test).
dist-check:
	scripts/dist check

# Inside a bundle from `make dist`: builds target/release/loopbus from vendor/ with no
# network. RUSTFLAGS (it replaces RUSTFLAGS of the environment and of cargo configs)
# maps this directory and cargo's home out of the paths kept in the binary, so the
# binary is the same wherever it is built (docs/install.md: "Verifying a binary").
CARGO_HOME_DIR = $(or $(CARGO_HOME),$(HOME)/.cargo)
build-offline:
	@test -d vendor || { echo "make build-offline runs in a bundle made by make dist (it has vendor/)" >&2; exit 2; }
	env -u CARGO_ENCODED_RUSTFLAGS \
		RUSTFLAGS="--remap-path-prefix=$(CURDIR)=. --remap-path-prefix=$(CARGO_HOME_DIR)=/cargo-home" \
		$(CARGO) build --release --offline --locked

# Non-test lines and lines of code per file, library and binary apart, and the pre-auth
# surface SECURITY.md's reading guide lists in Part 1 (tests/it/security_guide.rs holds the
# guide's figures against these).
footprint:
	@sh scripts/footprint

bench:
	$(CARGO) build --locked --release
	$(CARGO) run --locked --release --example bench

clean:
	$(CARGO) clean
	rm -rf .loopbus
