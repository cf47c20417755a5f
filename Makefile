# Warren: `make up` builds and runs the all-in-one platform; `make test` checks everything.
CARGO ?= cargo

.PHONY: all deps build up test bench clean

all: build

deps:
	@scripts/install-deps.sh

# Release build. The guest agent is then rebuilt as a static executable, so that it runs in any
# image (it is exec'd before the sandbox's root is pivoted, but VMs and foreign images need it).
build: deps
	$(CARGO) build --release --workspace
	$(CARGO) rustc --release -q -p warren-guest --bin warren-guest -- -C target-feature=+crt-static

up: build
	target/release/warren up

test: deps
	$(CARGO) fmt --all --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	$(CARGO) build --workspace
	$(CARGO) test --workspace

bench: build
	target/release/warren-bench

clean:
	$(CARGO) clean
