#!/usr/bin/env bash
# Benchmark (prints figures, asserts nothing): pod startup latency p50/p90/p99
# and the node's memory at 0, 10, 30 (and 110 in-process) pods, on a node
# joined to the loopback control plane.
#   tests/bench/pods.sh [PODS] [oci|cri] [IDLE_SECS]
# (IDLE_SECS > 0 also measures idle CPU over that window at 0 pods and at
# each level)
# oci: kinglet's in-process runtime (kinglet + its monitor);
# cri: kinglet --runtime cri with a private containerd (kinglet + containerd
# + shims + pause containers).
set -euo pipefail
cd "$(dirname "$0")/../.."
kbin=${CARGO_TARGET_DIR:-target}/release/kinglet
export KINGLET_CLUSTER_DIR=${KINGLET_CLUSTER_DIR:-/tmp/kinglet-cluster}
# shellcheck source=lib.sh
. tests/bench/lib.sh
pods=${1:-50}
runtime=${2:-oci}
idle=${3:-0}
cargo build --release --locked --bin kinglet --example bench_pods >&2
admin=$(tests/cluster/up.sh | tail -n1)
node=bench-$runtime-$$
work=$(mktemp -d /tmp/kinglet-bench-pods.XXXXXX)
root=$work/root
kc=$(tests/cluster/node-kubeconfig.sh "$node" | tail -n1)
tests/images/busybox.sh "$work/busybox.tar" >/dev/null
printf 'apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nhealthzPort: 0\nport: %s\nauthentication: {x509: {clientCAFile: %s}}\n' \
  "$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')" "$KINGLET_CLUSTER_DIR/pki/ca.crt" > "$work/config.yaml"
if [ "$runtime" = cri ]; then
  endpoint=$(tests/cluster/containerd-up.sh "$work/containerd" | tail -n1)
  ctr --address "$work/containerd/containerd.sock" -n k8s.io images import "$work/busybox.tar" >/dev/null
  rt_args=(--runtime cri --container-runtime-endpoint "$endpoint")
  levels=10,30
else
  "$kbin" --root-dir "$root" images import "$work/busybox.tar" >/dev/null
  rt_args=(--cni-conf-dir "")
  levels=10,30,110
fi
"$kbin" --config "$work/config.yaml" --kubeconfig "$kc" --hostname-override "$node" \
  --node-ip 127.0.0.1 --root-dir "$root" --pod-log-dir "$work/logs" \
  --device-plugin-dir "$work/device-plugins" --pod-resources-dir "$work/pod-resources" --device-config "$work/devices.yaml" "${rt_args[@]}" >"$work/kinglet.log" 2>&1 &
pid=$!
cleanup() {
  set +e
  kubectl --kubeconfig "$admin" delete pods -l bench=kinglet --grace-period=0 --force --wait=false >/dev/null 2>&1
  # Let kinglet tear its pods down (containers, sandboxes, cgroups).
  for _ in $(seq 1 240); do
    [ "$("$kbin" --root-dir "$root" pods ls | wc -l)" -le 1 ] && break
    sleep 0.5
  done
  kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null
  release_oci_root "$root"
  [ "$runtime" = cri ] && tests/cluster/containerd-down.sh "$work/containerd"
  kubectl --kubeconfig "$admin" delete node "$node" --wait=false >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
for _ in $(seq 1 100); do
  kubectl --kubeconfig "$admin" get node "$node" 2>/dev/null | grep -qw Ready && break; sleep 0.2
done
echo "machine: $(nproc) cores, $(awk '/MemTotal/ {print int($2/1024)}' /proc/meminfo) MiB, $(uname -r)"
echo "runtime: $runtime$([ "$runtime" = cri ] && echo " ($(containerd --version | cut -d' ' -f3), runc $(runc --version | head -1 | cut -d' ' -f3))")"
"${CARGO_TARGET_DIR:-target}/release/examples/bench_pods" "$admin" "$node" "$work" "$pods" "$levels" "$idle"
