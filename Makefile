# loopbus: `make run` starts a demo instance, `make test` runs every check.
CARGO ?= cargo
DEMO_DIR := .loopbus/demo
BIN := target/debug/loopbus

.PHONY: all build run test fmt lint bench clean

all: build

build:
	$(CARGO) build --locked

# Starts an instance named `demo` under ./.loopbus/ on the built-in echo engine and
# prints a ready-to-paste curl line. Stop it with Ctrl-C.
run: build
	@test -f $(DEMO_DIR)/config.json || $(BIN) init $(DEMO_DIR)
	@$(BIN) serve --state-dir $(DEMO_DIR) --print-curl

test:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --locked --all-targets -- -D warnings
	RUSTDOCFLAGS="-D warnings" $(CARGO) doc --locked --no-deps
	$(CARGO) test --locked

fmt:
	$(CARGO) fmt --all

bench:
	$(CARGO) build --locked --release
	$(CARGO) run --locked --release --example bench

clean:
	$(CARGO) clean
	rm -rf .loopbus
