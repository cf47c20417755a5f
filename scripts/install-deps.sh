#!/usr/bin/env bash
# Installs the Debian packages Warren needs that are missing (when run as root), or says which
# to install. Used by `make up`, `make test` (as `install-deps.sh test`) and `make bench`.
#   procps, python3      tools the tests run inside sandboxes of the built-in `host` image
#   bubblewrap, runc     peers the benchmark compares against
#   nftables             networking (a later capability)
#   erofs-utils          layered images: mkfs.erofs writes layers, fsck.erofs checks them
#   busybox-static       a static busybox: the image tests build small root file systems with it
#   btrfs-progs          disk quotas: mkfs.btrfs makes the node's disk pool (once)
#   curl, git            what the E2B gateway's `base` template (the `host` image) offers, as
#                        E2B's base has them (installed only where no such command exists)
#   gcc, g++             function calls in C and C++ (the `host` image's toolchains)
#   postgresql           (tests only) the control plane's shared database: the tests start
#                        their own servers in their own data directories, never the system's
set -euo pipefail
want=(procps python3 gcc g++ bubblewrap runc nftables erofs-utils btrfs-progs)
if [ "${1:-}" = test ]; then
  want+=(postgresql)
fi
missing=()
installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
for p in "${want[@]}"; do
  installed "$p" || missing+=("$p")
done
for c in curl git; do
  command -v "$c" >/dev/null || installed "$c" || missing+=("$c")
done
# Debian's busybox (bookworm) is static too; either will do, and they conflict.
installed busybox || installed busybox-static || missing+=(busybox-static)
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
  echo "warren needs these Debian packages: ${missing[*]}" >&2
  echo "install them with: sudo apt-get install -y ${missing[*]}" >&2
  exit 1
fi
echo "installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
# No package's service is started by the install (PostgreSQL's system cluster, nftables'
# ruleset): Warren runs what it needs itself. policy-rc.d says so to invoke-rc.d, and goes
# again after (unless it was there before).
made=
if [ ! -e /usr/sbin/policy-rc.d ]; then
  printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
  chmod +x /usr/sbin/policy-rc.d
  made=1
fi
rc=0
{ apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null; } || rc=$?
[ -z "$made" ] || rm -f /usr/sbin/policy-rc.d
exit $rc
