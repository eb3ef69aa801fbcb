#!/usr/bin/env bash
# Upstream node conformance against one kinglet node:
#   tests/conformance/run.sh [--focus REGEX] [--skip REGEX] [--runtime oci|cri] [--timeout 2h] [--no-serial]
#                            [--labels EXPR]
# Builds the upstream e2e.test and ginkgo at the control plane's release
# (build.sh, cached), the images the specs use into a private local
# docker-registry (images.sh), starts the loopback control plane with only
# this node in it, joins a kinglet node (release build, private dirs and CNI
# network; with --runtime cri, a private containerd pulling from the local
# registry), and runs every [NodeConformance] spec (or those of the ginkgo
# label expression --labels, e.g. 'NodeConformance || Conformance') that is not [Serial],
# [Disruptive], [Flaky], [Slow] or [Feature:*] (or those matching --focus),
# two at a time, then the [Serial] ones one at a time (unless --no-serial).
# Prints a table (selected, passed, failed, skipped) and each
# failure with its first line; JUnit and the table go under
# target/conformance/. Leaves nothing running.
set -euo pipefail
cd "$(dirname "$0")/../.."
focus="" skip="" runtime=oci timeout=2h serial=yes labels=NodeConformance
while [ $# -gt 0 ]; do
  case $1 in
    --focus) focus=$2; shift 2 ;;
    --skip) skip=$2; shift 2 ;;
    --runtime) runtime=$2; shift 2 ;;
    --timeout) timeout=$2; shift 2 ;;
    --no-serial) serial=no; shift ;;
    --labels) labels=$2; shift 2 ;;
    *) echo "usage: run.sh [--focus REGEX] [--skip REGEX] [--runtime oci|cri] [--timeout DURATION] [--no-serial] [--labels EXPR]" >&2; exit 2 ;;
  esac
done
case $runtime in
  oci | cri) ;;
  *) echo "run.sh: --runtime $runtime: oci or cri" >&2; exit 2 ;;
esac
# shellcheck source=../bench/lib.sh
. tests/bench/lib.sh
export KINGLET_CLUSTER_DIR=${KINGLET_CLUSTER_DIR:-/tmp/kinglet-cluster}
# KINGLET_CONFORMANCE_OUT: where the report goes; KINGLET_BIN: a kinglet
# already built (the CI subset runs the suite's debug build).
out=${KINGLET_CONFORMANCE_OUT:-target/conformance}
mkdir -p "$out"
start=$(date +%s)

bin=$(tests/conformance/build.sh | tail -n1)
kinglet=${KINGLET_BIN:-}
if [ -z "$kinglet" ]; then
  cargo build --release --locked --bin kinglet >&2
  kinglet=target/release/kinglet
fi

work=$(mktemp -d /tmp/kinglet-conformance.XXXXXX)
# The pods' bridge and /24, per run: two runs at once (CI's subset beside
# a full run) must not share a bridge, nor remove each other's.
bridge=${KINGLET_CONFORMANCE_BRIDGE:-kcf0}
subnet=${KINGLET_CONFORMANCE_SUBNET:-10.244.77.0/24}
reg_pid="" agent_pid=""
cleanup() {
  set +e
  [ -n "$agent_pid" ] && kill "$agent_pid" 2>/dev/null && wait "$agent_pid" 2>/dev/null
  release_oci_root "$work/root"
  [ "$runtime" = cri ] && tests/cluster/containerd-down.sh "$work/containerd" >/dev/null 2>&1
  [ -n "$reg_pid" ] && kill "$reg_pid" 2>/dev/null && wait "$reg_pid" 2>/dev/null
  ip link del "$bridge" 2>/dev/null
  rm -rf "$work"
  tests/cluster/down.sh >/dev/null 2>&1
}
trap cleanup EXIT
# A signal ends the run through the EXIT trap too (bash skips it otherwise).
trap 'exit 143' TERM
trap 'exit 130' INT

# The registry the images are served from (loopback: plain HTTP).
# shellcheck source=../images/lib.sh
. tests/images/lib.sh
serve_registry "$work/registry"
registry=$reg
tests/conformance/images.sh "$bin" "$registry"
# shellcheck source=lib.sh
. tests/conformance/lib.sh
repo_list "$registry" > "$work/repo-list.yaml"

# A fresh control plane: the e2e framework waits for every Node to be
# Ready, so nodes other tests left behind must not be there.
tests/cluster/down.sh >/dev/null 2>&1 || true
admin=$(tests/cluster/up.sh | tail -n1)
node=kinglet-conformance
mkdir -p "$work/net.d"
# A private bridge and /24 for the pods (never the host's /etc/cni).
cat > "$work/net.d/10-kinglet.conflist" <<JSON
{"cniVersion": "1.0.0", "name": "kinglet-conformance", "plugins": [
  {"type": "bridge", "bridge": "$bridge", "isGateway": true, "ipMasq": true,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": "$subnet"}]], "dataDir": "$work/ipam"}},
  {"type": "portmap", "capabilities": {"portMappings": true}}]}
JSON
start_kinglet_node "$kinglet" "$work" "$node" 127.0.0.1 "$runtime" "$registry" "$admin" "$out/kinglet.log"

selection=$CONFORMANCE_SELECTION
# suite LABELS PROCS REPORT LOG: one ginkgo run of the specs with LABELS.
suite() {
  local args=(--kubeconfig="$admin" --provider=local --kube-test-repo-list="$work/repo-list.yaml"
    --report-dir="$out" --ginkgo.timeout="$timeout" --ginkgo.label-filter="$1"
    --ginkgo.no-color)
  [ -n "$focus" ] && args+=(--ginkgo.focus="$focus")
  [ -n "$skip" ] && args+=(--ginkgo.skip="$skip")
  # The repo list in the environment too: packages that compute image
  # names at init (the kubectl specs' manifests) read it before the flag.
  KUBE_TEST_REPO_LIST=$work/repo-list.yaml \
    "$bin/ginkgo" --procs="$2" --timeout="$timeout" --no-color --output-dir="$out" --junit-report="$3" \
    "$bin/e2e.test" -- "${args[@]}" >"$out/$4" 2>&1
}
set +e
# The CLI merges the parallel processes' reports into one JUnit file.
rm -f "$out"/junit*.xml
suite "($labels) && !Serial && $selection" 2 junit.xml e2e.log
# The [Serial] specs alone on the node, one at a time.
[ "$serial" = yes ] && suite "($labels) && Serial && $selection" 1 junit-serial.xml e2e-serial.log
set -e
python3 tests/conformance/report.py "$out" "$(( $(date +%s) - start ))" "$runtime"
exit 0
