#!/usr/bin/env bash
# The Python SDK's tests, against real `warren up`s that the tests start and stop themselves
# (as root; each on its own data dir, port and cgroup parent). `make test` calls this after
# `cargo build --workspace`; the tests use the newer of target/debug/warren and
# target/release/warren, or $WARREN_BIN.
#
#   sdk/python/run-tests.sh              # from anywhere; extra arguments go to pytest
#   sdk/python/run-tests.sh -k replay -x
#
# The virtual environment is sdk/python/.venv (git-ignored), or $WARREN_SDK_VENV. pytest runs
# in a network namespace of its own, warren-pytest-<pid>, deleted on exit.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
venv=${WARREN_SDK_VENV:-$here/.venv}
python=${PYTHON:-python3}

if [ ! -x "$venv/bin/python" ]; then
  if ! "$python" -m venv "$venv"; then
    echo "run-tests.sh: cannot make a virtual environment with $python;" \
         "install Python 3.9+ with venv (Debian: apt-get install python3-venv)" >&2
    exit 1
  fi
fi
"$venv/bin/python" -m pip install -q --disable-pip-version-check "$here" pytest pytest-asyncio \
  sandbox-fusion==0.3.7

# The tests' nodes give their sandboxes networks: interfaces, routes and an nftables table in
# the network namespace they run in, and one such node per namespace. So pytest runs in a network
# namespace of its own (loopback only: the tests reach their nodes on 127.0.0.1), never the
# machine's, and the namespace goes when the run ends, however it ends. Only the network
# namespace changes: `ip netns exec` would also remount /sys and hide the cgroup hierarchies.
netns=warren-pytest-$$
cleanup() { ip netns delete "$netns" 2>/dev/null || true; }
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
if ! ip netns add "$netns"; then
  echo "run-tests.sh: cannot make the network namespace $netns (needs root and iproute2)" >&2
  exit 1
fi
ip -n "$netns" link set lo up

cd "$here"
rc=0
WARREN_PYTEST_NETNS=$netns nsenter --net="/run/netns/$netns" -- \
  "$venv/bin/python" -m pytest -p no:cacheprovider "$@" || rc=$?
exit "$rc"
