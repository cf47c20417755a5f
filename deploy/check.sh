#!/usr/bin/env bash
# Checks the deployment files as far as this machine allows (`make test` runs it):
# - every Kubernetes manifest, strictly, against the Kubernetes schema (kubernetes-validate,
#   from PyPI, pinned below, in the git-ignored deploy/.venv or $WARREN_DEPLOY_VENV), and the
#   kustomization rendered with `kubectl kustomize` where kubectl is installed;
# - the systemd units with `systemd-analyze verify`, pointed at a built `warren` binary.
# Nothing is applied to a cluster and no unit is started: no cluster or systemd runs here.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
venv=${WARREN_DEPLOY_VENV:-$here/.venv}
version=1.37.0
if [ ! -x "$venv/bin/kubernetes-validate" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check "kubernetes-validate==$version"
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for f in "$here"/kubernetes/*.yaml; do
  [ "$(basename "$f")" = kustomization.yaml ] && continue
  "$venv/bin/kubernetes-validate" --strict --quiet "$f"
done
if command -v kubectl >/dev/null; then
  kubectl kustomize "$here/kubernetes" > "$tmp/rendered.yaml"
  "$venv/bin/kubernetes-validate" --strict --quiet "$tmp/rendered.yaml"
  echo "deploy: kustomization rendered and valid"
else
  echo "deploy: no kubectl here: the kustomization was not rendered (each manifest was checked)"
fi
if command -v systemd-analyze >/dev/null; then
  bin=${WARREN_BIN:-$root/target/debug/warren}
  for u in "$here"/systemd/*.service; do
    # The unit as installed, with the binary where this checkout built it and the
    # environment file optional (it is the operator's to write).
    sed -e "s|/usr/local/bin/warren|$bin|" -e 's|^EnvironmentFile=/|EnvironmentFile=-/|' "$u" > "$tmp/$(basename "$u")"
  done
  systemd-analyze verify "$tmp"/*.service
  echo "deploy: systemd units verified"
else
  echo "deploy: no systemd-analyze here: the units were not verified"
fi
echo "deploy: manifests valid against Kubernetes $version"
