#!/usr/bin/env bash
# Issues a node client certificate (CN=system:node:NAME, O=system:nodes) from
# the test CA and prints, as its last line, a kubeconfig path that uses it.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
. "$here/lib.sh"
name=${1:?usage: node-kubeconfig.sh NODE-NAME}
[ -s "$PKI/ca.key" ] || { echo "node-kubeconfig.sh: no cluster CA; run up.sh first" >&2; exit 1; }
sign "node-$name" "system:node:$name" system:nodes
kubeconfig "$CLUSTER_DIR/kubeconfigs/node-$name.kubeconfig" "node-$name" "system:node:$name"
echo "$CLUSTER_DIR/kubeconfigs/node-$name.kubeconfig"
