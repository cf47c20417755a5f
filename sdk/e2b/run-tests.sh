#!/usr/bin/env bash
# The E2B gateway against the unmodified `e2b` SDK from PyPI, at each version in E2B_VERSIONS
# (default: 2.45.1, the last that checks key forms and calls the v1 create and connect
# routes, and 2.63.0, the newest at the time of writing, on the v2 routes). Each version gets a
# virtual environment of its own (sdk/e2b/.venv/<version>, git-ignored) and runs the same
# tests against a real `warren up` the tests start (as root; its own data dir, ports and
# cgroup parent). `make test` calls this after `cargo build --workspace`.
#
#   sdk/e2b/run-tests.sh              # extra arguments go to pytest
#   E2B_VERSIONS=2.63.0 sdk/e2b/run-tests.sh -k list -x
#
# pytest runs in a network namespace of its own, warren-e2b-<pid>, deleted on exit: the
# sandboxes get networks (E2B's internet access is the default), never in the machine's.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
python=${PYTHON:-python3}
versions=${E2B_VERSIONS:-2.45.1 2.63.0}

netns=warren-e2b-$$
cleanup() { ip netns delete "$netns" 2>/dev/null || true; }
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
if ! ip netns add "$netns"; then
  echo "run-tests.sh: cannot make the network namespace $netns (needs root and iproute2)" >&2
  exit 1
fi
ip -n "$netns" link set lo up

rc=0
for v in $versions; do
  venv=$here/.venv/$v
  if [ ! -x "$venv/bin/python" ]; then
    if ! "$python" -m venv "$venv"; then
      echo "run-tests.sh: cannot make a virtual environment with $python;" \
           "install Python 3.9+ with venv (Debian: apt-get install python3-venv)" >&2
      exit 1
    fi
  fi
  "$venv/bin/python" -m pip install -q --disable-pip-version-check "e2b==$v" pytest pytest-asyncio
  echo "== e2b $v"
  (cd "$here" && WARREN_E2B_NETNS=$netns nsenter --net="/run/netns/$netns" -- \
    "$venv/bin/python" -m pytest -p no:cacheprovider "$@") || rc=$?
done
exit "$rc"
