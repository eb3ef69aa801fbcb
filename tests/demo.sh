#!/usr/bin/env bash
# kinglet's main job on this machine, set up from nothing (as root): builds
# kinglet, starts the loopback control plane, and runs kinglet in the
# foreground as node "kinglet-demo" until Ctrl-C. In another shell:
#   kubectl --kubeconfig /tmp/kinglet-cluster/admin.kubeconfig get nodes -o wide
set -euo pipefail
cd "$(dirname "$0")/.."
tests/setup.sh
cargo build --release --locked --bin kinglet
export KINGLET_CLUSTER_DIR=${KINGLET_CLUSTER_DIR:-/tmp/kinglet-cluster}
admin=$(tests/cluster/up.sh | tail -n1)
trap 'tests/cluster/down.sh' EXIT
kubeconfig=$(tests/cluster/node-kubeconfig.sh kinglet-demo | tail -n1)
echo "control plane up; kubectl --kubeconfig $admin get nodes" >&2
target/release/kinglet --kubeconfig "$kubeconfig" --hostname-override kinglet-demo \
  --node-ip 127.0.0.1 --root-dir "${KINGLET_DEMO_ROOT:-/tmp/kinglet-demo}" &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid; tests/cluster/down.sh' EXIT
for _ in $(seq 1 100); do
  kubectl --kubeconfig "$admin" get node kinglet-demo 2>/dev/null | grep -qw Ready && break
  sleep 0.2
done
kubectl --kubeconfig "$admin" get nodes -o wide
wait $pid
