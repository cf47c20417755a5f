#!/usr/bin/env bash
# Builds the fuzz targets and runs each for a bounded time (`make test` runs it).
#
#   fuzz/run.sh [SECONDS] [TARGET...]     default: 25 seconds each, every target
#
# libFuzzer through the `libfuzzer-sys` crate, on the stable compiler: rustc's stable
# `-C passes=sancov-module` and `-C llvm-args=-sanitizer-coverage-*` flags instrument the code
# as cargo-fuzz's nightly build does (no sanitizer: the code has no `unsafe`; panics, overflow
# checks, debug assertions, timeouts and memory blow-ups are what a run finds). The build is
# for the host triple given explicitly, so the flags skip build scripts and proc macros.
#
# Each run is seeded (-seed=1) and starts from the checked-in corpus (fuzz/corpus/<target>,
# read only); what it learns goes to fuzz/target/corpus/<target>. A crash, timeout or
# out-of-memory fails the script and leaves the input in fuzz/artifacts/<target>/; replay it
# with `fuzz/target/<triple>/release/<target> fuzz/artifacts/<target>/<file>`, and make it a
# unit test beside the parser. See docs/fuzzing.md.
set -euo pipefail
cd "$(dirname "$0")"
secs=${1:-${FUZZ_SECONDS:-25}}
shift || true
all=(tls_client_hello http_requests dns_message connect_envelope guest_frames image_unpack image_import
  seccomp_policy)
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=("${all[@]}")

triple=$(rustc -vV | sed -n 's/^host: //p')
flags=(
  -Cpasses=sancov-module
  -Cllvm-args=-sanitizer-coverage-level=4
  -Cllvm-args=-sanitizer-coverage-inline-8bit-counters
  -Cllvm-args=-sanitizer-coverage-pc-table
  -Cllvm-args=-sanitizer-coverage-trace-compares
  --cfg fuzzing
)
export RUSTFLAGS="${flags[*]}"
export CARGO_TARGET_DIR="$PWD/target"
start=$(date +%s)
cargo build --release --target "$triple" --bins
built=$(date +%s)

# The image target unpacks into directories of its own temporary directory.
tmp="$PWD/target/tmp"
rm -rf "$tmp"
mkdir -p "$tmp"
export TMPDIR="$tmp"

failed=()
table=()
for t in "${targets[@]}"; do
  mkdir -p "target/corpus/$t" "artifacts/$t"
  log="target/$t.log"
  echo "fuzz: $t for ${secs}s"
  rc=0
  "target/$triple/release/$t" -seed=1 -max_total_time="$secs" -timeout=60 -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="artifacts/$t/" \
    "target/corpus/$t" "corpus/$t" >"$log" 2>&1 || rc=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | cut -d' ' -f2)
  if [ "$rc" -ne 0 ]; then
    tail -n 40 "$log" >&2
    found=$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log" | tail -1)
    echo "fuzz: $t FAILED (exit $rc): the input is fuzz/${found:-artifacts/$t/}; the log fuzz/$log" >&2
    failed+=("$t")
  fi
  table+=("$(printf '%-18s %12s %8s %s' "$t" "${execs:-?}" "${cov:-?}" "$([ "$rc" -eq 0 ] && echo ok || echo FAILED)")")
done
rm -rf "$tmp"
printf '%-18s %12s %8s %s\n' target executions coverage result
printf '%s\n' "${table[@]}"
echo "fuzz: build $((built - start))s, runs $(($(date +%s) - built))s"
[ ${#failed[@]} -eq 0 ] || { echo "fuzz: crashes in ${failed[*]}" >&2; exit 1; }
