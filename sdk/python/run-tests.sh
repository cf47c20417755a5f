#!/usr/bin/env bash
# The Python SDK's tests, against real `warren up`s that the tests start and stop themselves
# (as root; each on its own data dir, port and cgroup parent). `make test` calls this after
# `cargo build --workspace`; the tests use the newer of target/debug/warren and
# target/release/warren, or $WARREN_BIN.
#
#   sdk/python/run-tests.sh              # from anywhere; extra arguments go to pytest
#   sdk/python/run-tests.sh -k replay -x
#
# The virtual environment is sdk/python/.venv (git-ignored), or $WARREN_SDK_VENV.
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
"$venv/bin/python" -m pip install -q --disable-pip-version-check "$here" pytest pytest-asyncio

cd "$here"
exec "$venv/bin/python" -m pytest -p no:cacheprovider "$@"
