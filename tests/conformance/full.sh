#!/usr/bin/env bash
# The whole upstream [Conformance] suite (what `sonobuoy --mode
# certified-conformance` runs) against a cluster whose only nodes are two
# kinglet nodes on this machine, with kube-proxy and CoreDNS running on
# them as a cluster operator deploys them:
#   tests/conformance/full.sh [--runtime oci|cri] [--focus REGEX] [--timeout 4h] [--no-serial]
# The add-ons test's cluster (tests/addons/run.sh --nodes 2: its own
# control plane, registry, bridges, checks) then every [Conformance] spec
# (or those of them matching --focus): six at a time (most of a spec's
# time is waiting: the machine's two cores stay mostly idle), the [Serial]
# ones alone at the end (ginkgo runs its Serial specs after the others,
# one at a time; --no-serial leaves them out). JUnit, the logs and the
# table (selected, passed, failed, each failure's first line) under
# target/conformance-full/<runtime>/. About an hour here; CI runs the
# subset (ci.sh) instead.
set -euo pipefail
cd "$(dirname "$0")/../.."
runtime=oci focus='\[Conformance\]' timeout=4h labels=Conformance
while [ $# -gt 0 ]; do
  case $1 in
    --runtime) runtime=$2; shift 2 ;;
    --focus) focus="\\[Conformance\\].*($2)|($2).*\\[Conformance\\]"; shift 2 ;;
    --timeout) timeout=$2; shift 2 ;;
    --no-serial) labels='Conformance && !Serial'; shift ;;
    *) echo "usage: full.sh [--runtime oci|cri] [--focus REGEX] [--timeout DURATION] [--no-serial]" >&2; exit 2 ;;
  esac
done
export KINGLET_BIN=${KINGLET_BIN:-target/release/kinglet}
[ -x "$KINGLET_BIN" ] || cargo build --release --locked --bin kinglet >&2
exec tests/addons/run.sh --runtime "$runtime" --nodes 2 --conformance "$focus" \
  --labels "$labels" --procs 6 --timeout "$timeout" --out "target/conformance-full/$runtime"
