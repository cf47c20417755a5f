#!/usr/bin/env bash
# The API contract run: schemathesis (a schema-driven fuzzer) against a real `warren up`, driven
# by the served /v1/openapi.json. It fails on any server error (5xx) and on any answer the
# document does not describe (status code, content type, body schema, headers).
#
# Three bounded passes:
#   1. valid key, `--checks all`, positive and negative data (the few exceptions are below,
#      each with its reason);
#   2. a wrong key: every operation that needs a key must answer the documented 401;
#   3. negative mode alone: data that breaks the schema must be refused with a documented 4xx.
#
#   scripts/contract/run.sh            # from anywhere, as root; `make test` runs it last
#   CONTRACT_EXAMPLES=50 scripts/contract/run.sh   # more cases per operation (default 8)
#   CONTRACT_SEED=7 scripts/contract/run.sh        # other cases (default seed 1)
#
# It starts its own `warren up` (target/debug/warren, or $WARREN_BIN) on a free loopback port
# with its own data directory, cgroup parent and small node limits (node.toml beside this
# script), and stops it by pid on exit, failure included, with every sandbox, cgroup and mount
# it made. Schemathesis (pinned below) lives in the git-ignored virtual environment
# scripts/contract/.venv, or $WARREN_CONTRACT_VENV.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
venv=${WARREN_CONTRACT_VENV:-$here/.venv}
python=${PYTHON:-python3}
warren=${WARREN_BIN:-$root/target/debug/warren}
examples=${CONTRACT_EXAMPLES:-8}
seed=${CONTRACT_SEED:-1}
schemathesis_version=4.32.5

if [ "$(id -u)" != 0 ]; then
  echo "contract: needs root (warren up makes namespaces, cgroups and mounts)" >&2
  exit 1
fi
if [ ! -x "$warren" ]; then
  echo "contract: $warren is missing: run cargo build --workspace first (make test does)" >&2
  exit 1
fi
if [ ! -x "$venv/bin/python" ]; then
  if ! "$python" -m venv "$venv"; then
    echo "contract: cannot make a virtual environment with $python;" \
         "install Python 3.9+ with venv (Debian: apt-get install python3-venv)" >&2
    exit 1
  fi
fi
"$venv/bin/python" -m pip install -q --disable-pip-version-check "schemathesis==$schemathesis_version"

work=$(mktemp -d /tmp/warren-contract.XXXXXX)
data=$work/data
mkdir -p "$data"
cgroup_parent=warren-contract-$(basename "$work" | tr -dc 'a-zA-Z0-9' | tr 'A-Z' 'a-z')
# A free port below the ephemeral range, so no client's source port takes it.
port=
for _ in $(seq 200); do
  p=$((20000 + RANDOM % 12000))
  if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then port=$p; break; fi
done
[ -n "$port" ] || { echo "contract: no free port in 20000-31999" >&2; exit 1; }
url=http://127.0.0.1:$port
pid=
# The node's sandbox network adds interfaces and a firewall table to the network namespace it
# runs in: it and the fuzzer run in a namespace of this run's own (`nsenter`, not `ip netns
# exec`, which would remount /sys and hide the cgroup hierarchies).
netns=warren-contract-$$
inns() { nsenter --net="/run/netns/$netns" -- "$@"; }

cleanup() {
  local rc=$?
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  fi
  # Whatever is left in this run's own cgroups (it may have died): kill it, remove them.
  for parent in /sys/fs/cgroup/*/"$cgroup_parent" /sys/fs/cgroup/"$cgroup_parent"; do
    [ -d "$parent" ] || continue
    find "$parent" -name cgroup.procs -exec cat {} + 2>/dev/null | xargs -r kill -KILL 2>/dev/null || true
    for _ in $(seq 50); do
      find "$parent" -depth -type d -exec rmdir {} + 2>/dev/null || true
      [ -d "$parent" ] || break
      sleep 0.1
    done
  done
  # Mounts under the data directory (layers, the disk pool), deepest first.
  awk -v d="$data" 'index($5, d) == 1 {print $5}' /proc/self/mountinfo | sort -r |
    while read -r m; do umount -l "$m" 2>/dev/null || true; done
  ip netns del "$netns" 2>/dev/null || true
  if [ "$rc" != 0 ] && [ -f "$work/warren-up.log" ]; then
    echo "contract: warren up's log (last lines):" >&2
    tail -n 40 "$work/warren-up.log" >&2
  fi
  rm -rf "$work"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
ip netns add "$netns"
ip -n "$netns" link set lo up

WARREN_LOG=warn nsenter --net="/run/netns/$netns" -- "$warren" up --config "$here/node.toml" --data-dir "$data" \
  --listen "127.0.0.1:$port" --cgroup-parent "$cgroup_parent" --kill-sandboxes-on-exit --e2b-listen off \
  </dev/null >"$work/warren-up.log" 2>&1 &
pid=$!
for _ in $(seq 300); do
  if [ -s "$data/admin.key" ] && inns "$venv/bin/python" -c \
    "import urllib.request,sys; urllib.request.urlopen('$url/v1/health', timeout=1)" 2>/dev/null; then
    break
  fi
  kill -0 "$pid" 2>/dev/null || { echo "contract: warren up exited" >&2; exit 1; }
  sleep 0.1
done
key=$(cat "$data/admin.key")

# Never fuzzed: image pull reaches out to registries (traffic here stays on loopback).
st() {
  (cd "$here" && SCHEMATHESIS_HOOKS=hooks inns "$venv/bin/schemathesis" --no-color run "$url/v1/openapi.json" \
    --exclude-path /v1/images/pull \
    --max-examples "$examples" --seed "$seed" --workers 1 --request-timeout 60 \
    --generation-database none --suppress-health-check all "$@")
}

# Where the answer to a request the document allows depends on what the document cannot
# hold, the check that every schema-valid request is accepted is left out (every other check
# runs): a create's ranges are the node's (cpu up to 1000 x its cores, memory up to its
# physical memory, pids up to its max_pids, timeout up to its max_timeout; the 400 names the
# range), an image upload must be an image, and requests about the sandbox depend on its state
# (its users, files, processes, image); a network policy's rules are checked against what the
# node never lets a sandbox reach (its own addresses, the pools, link-local) and for host bits
# in CIDRs, which no pattern says.
# A function call's acceptance depends on the image's toolchains (a language whose compiler
# the machine lacks is a 400 that names it), which no schema can say.
stateful=(--include-name "POST /v1/sandboxes" --include-name "POST /v1/images"
  --include-name "PUT /v1/tasks/{task}/network"
  --include-name "POST /v1/fncall/run" --include-name "POST /v1/fncall/batch"
  --include-name "POST /run_code"
  --include-path-regex '^/v1/sandboxes/[{]id[}]')
# A directory's tar is as large as the directory (the host image's / holds the host's /usr):
# not downloaded with a good key.
echo "contract: 1/3 valid key, every check"
st --checks all -H "Authorization: Bearer $key" \
  --exclude-name "POST /v1/sandboxes" --exclude-name "POST /v1/images" \
  --exclude-name "PUT /v1/tasks/{task}/network" \
  --exclude-name "POST /v1/fncall/run" --exclude-name "POST /v1/fncall/batch" \
  --exclude-name "POST /run_code" \
  --exclude-path-regex '^/v1/sandboxes/[{]id[}]'
st --checks all --exclude-checks positive_data_acceptance -H "Authorization: Bearer $key" \
  "${stateful[@]}" --exclude-name "GET /v1/sandboxes/{id}/files/tar"
echo "contract: 2/3 a wrong key"
st --checks not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance,response_headers_conformance \
  -H "Authorization: Bearer wrn_not-a-key"
echo "contract: 3/3 negative mode"
fncall=(--include-name "POST /v1/fncall/run" --include-name "POST /v1/fncall/batch"
  --include-name "POST /run_code")
st --mode negative --checks all -H "Authorization: Bearer $key" \
  --exclude-name "POST /v1/fncall/run" --exclude-name "POST /v1/fncall/batch" \
  --exclude-name "POST /run_code"
st --mode negative --checks all --exclude-checks positive_data_acceptance \
  -H "Authorization: Bearer $key" "${fncall[@]}"
echo "contract: passed"
