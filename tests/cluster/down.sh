#!/usr/bin/env bash
# Stops what up.sh started and removes the cluster's state (etcd data,
# kubeconfigs, logs) inside $KINGLET_CLUSTER_DIR; touches nothing else.
# The test CA is kept so certificates issued to tests stay valid.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
. "$here/lib.sh"
for name in metrics-server kube-scheduler kube-controller-manager kube-apiserver etcd; do
  if running "$name"; then
    pid=$(cat "$PIDS/$name.pid")
    kill "$pid" 2>/dev/null
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null
  fi
  rm -f "$PIDS/$name.pid"
done
[ "${KINGLET_CLUSTER_KEEP_DATA:-}" = 1 ] || rm -rf "$CLUSTER_DIR/etcd" "$CLUSTER_DIR/logs"
exit 0
