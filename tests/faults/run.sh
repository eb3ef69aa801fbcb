#!/usr/bin/env bash
# The fault-injection suite in one command (as root): starts the loopback
# control plane if needed, runs tests/e2e_faults.rs on both runtimes (kill
# -9 of the monitor and of kinglet, an offline reboot with the API cut,
# kills under Deployment churn, the API server unreachable for OUTAGE
# seconds under crash loops) and prints the fault table and the figures it
# measured, also written to target/faults/{table.md,figures.txt}.
#   tests/faults/run.sh [ROUNDS [OUTAGE]]
#   (churn rounds, default 8, CI runs 3; outage default 600 s, CI runs 45)
set -euo pipefail
cd "$(dirname "$0")/../.."
rounds=${1:-8}
outage=${2:-600}
export KINGLET_CLUSTER_DIR=${KINGLET_CLUSTER_DIR:-/tmp/kinglet-cluster}
tests/cluster/up.sh >/dev/null
out=target/faults
mkdir -p "$out"
set +e
KINGLET_FAULT_ROUNDS=$rounds KINGLET_FAULT_OUTAGE_SECS=$outage cargo test --locked --test e2e_faults -- --nocapture \
  2>&1 | tee "$out/test.log"
rc=${PIPESTATUS[0]}
set -e
grep -o 'figure: faults: .*' "$out/test.log" | sed 's/^figure: faults: //' > "$out/figures.txt" || true
grep '^|' "$out/figures.txt" > "$out/table.md" || true
echo "== fault table (churn rounds: $rounds, outage: $outage s)"
cat "$out/table.md"
echo "== figures"
grep -v '^|' "$out/figures.txt" || true
grep -E '^test result:' "$out/test.log" || true
exit "$rc"
