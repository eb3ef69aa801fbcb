#!/usr/bin/env bash
# Runs kinglet's fuzz targets (fuzz/, cargo-fuzz and libFuzzer on a pinned
# nightly) for SECONDS each (default 30, what CI runs; 600 and more for a
# real campaign), every target or those named. The corpus in
# fuzz/corpus/<target> is kept in the repo and grows with what a run finds;
# a crash fails the run and leaves its input in fuzz/artifacts/<target>/
# (add it to the corpus once fixed: the corpus is replayed every run, so it
# is the regression test). Prints one figure line per target.
#   tests/fuzz.sh [SECONDS] [TARGET...]
# KINGLET_FUZZ_BUILD=dev builds without optimisation (what CI does: the
# kinglet crate compiles in about a minute instead of ten; fewer
# executions per second); the default is cargo-fuzz's optimised build.
set -euo pipefail
cd "$(dirname "$0")/.."
NIGHTLY=nightly-2026-05-20
secs=${1:-30}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(config manifest image_reference layer api_request spdy_frame cert_der)
rustup toolchain list | grep -q "^$NIGHTLY" || rustup toolchain install "$NIGHTLY" --profile minimal >&2
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked >&2
export CARGO_TARGET_DIR=${KINGLET_FUZZ_TARGET_DIR:-/var/cache/kinglet/fuzz-target}
cd fuzz
mode=(-O)
[ "${KINGLET_FUZZ_BUILD:-}" = dev ] && mode=(--dev)
cargo "+$NIGHTLY" fuzz build "${mode[@]}" >&2
rc=0
for t in "${targets[@]}"; do
  mkdir -p "corpus/$t"
  log=$(mktemp)
  if cargo "+$NIGHTLY" fuzz run "${mode[@]}" "$t" -- -max_total_time="$secs" -rss_limit_mb=2048 -timeout=10 >"$log" 2>&1; then
    crashes=0
  else
    crashes=1
    rc=1
    grep -E 'panicked|ERROR|SUMMARY|Test unit written' "$log" | head -n 20 >&2 || true
  fi
  runs=$(sed -n 's/^Done \([0-9]*\) runs in \([0-9]*\) second.*/\1/p' "$log" | tail -n1)
  if [ -z "$runs" ]; then runs=$(grep -oE '^#[0-9]+' "$log" | tail -n1 | tr -d '#'); fi
  corpus=$(find "corpus/$t" -type f | wc -l)
  echo "figure: fuzz $t: ${runs:-0} executions in ${secs} s, $crashes crashes, corpus $corpus inputs"
  rm -f "$log"
done
exit $rc
