# Warren: `make up` builds and runs the all-in-one platform; `make test` checks everything.
CARGO ?= cargo

.PHONY: all deps build up test bench bench-images clean

all: build

deps:
	@scripts/install-deps.sh

# Release build. The guest agent is then rebuilt small (profile `guest`: opt-level z, LTO,
# panic=abort, stripped) and static, so it runs in any image and costs little per sandbox, and
# put beside `warren`, where the node looks for it. It is installed as a new file renamed over
# the old one, never written in place: a running node's inits may be executing the old one
# (`cp` onto it fails with "Text file busy"), and a rename leaves them their file.
build: deps
	$(CARGO) build --release --workspace
	$(CARGO) rustc --profile guest -q -p warren-guest --bin warren-guest -- -C target-feature=+crt-static
	cp target/guest/warren-guest target/release/.warren-guest.tmp
	mv -f target/release/.warren-guest.tmp target/release/warren-guest

up: build
	target/release/warren up

test:
	@scripts/install-deps.sh test
	$(CARGO) fmt --all --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	$(CARGO) build --workspace
	$(CARGO) test --workspace
	fuzz/run.sh
	sdk/python/run-tests.sh
	sdk/e2b/run-tests.sh
	deploy/check.sh
	scripts/contract/run.sh

bench: build
	target/release/warren-bench

# Sandboxes from a ~1 GB image on an emulated remote file system (sshfs over a shaped veth
# between two network namespaces it makes): on demand versus full pull.
# It needs sshfs and sshd; they are installed without starting the ssh service (policy-rc.d):
# the script runs its own sshd inside a namespace it makes.
bench-images: build
	@if ! command -v sshfs >/dev/null || ! command -v sshd >/dev/null; then \
	  made=; [ -e /usr/sbin/policy-rc.d ] || { printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d; chmod +x /usr/sbin/policy-rc.d; made=1; }; \
	  apt-get install -y -q --no-install-recommends sshfs openssh-server; rc=$$?; \
	  [ -z "$$made" ] || rm -f /usr/sbin/policy-rc.d; [ $$rc -eq 0 ]; fi
	bench/remote-images.sh

clean:
	$(CARGO) clean
