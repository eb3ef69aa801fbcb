#!/usr/bin/env bash
# The hostile-client figures at the issue's sizes (the test suite runs the
# same tests smaller): the subPath race with 520 container starts on each
# runtime, 20,000 connections and 10,000 unique tokens against a joined
# node's kubelet API, 20 abandoned execs on each runtime. Prints the
# `figure:` lines the README publishes. As root, with the loopback control
# plane up (tests/cluster/up.sh) or startable.
#   tests/bench/hostile.sh [--starts N] [--connections N] [--tokens N]
set -euo pipefail
cd "$(dirname "$0")/../.."
starts=520 connections=20000 tokens=10000
while [ $# -gt 0 ]; do
  case $1 in
    --starts) starts=$2; shift 2 ;;
    --connections) connections=$2; shift 2 ;;
    --tokens) tokens=$2; shift 2 ;;
    *) echo "usage: hostile.sh [--starts N] [--connections N] [--tokens N]" >&2; exit 2 ;;
  esac
done
export KINGLET_SUBPATH_RACE_STARTS=$starts KINGLET_FLOOD_CONNECTIONS=$connections KINGLET_FLOOD_TOKENS=$tokens
cargo test --locked --no-fail-fast --test e2e_pods --test e2e_hostile_api -- \
  a_subpath floods abandoned --nocapture --test-threads 1 2>&1 | tee target/hostile-bench.log |
  grep -E '^(figure:|test result:)'
