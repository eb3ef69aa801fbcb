#!/usr/bin/env bash
# Benchmark (prints figures, asserts nothing): what the kubelet API costs
# and how fast it answers, on a node joined to the loopback control plane.
#   tests/bench/api.sh [oci|cri]
# Figures: kinglet's PSS at 0 pods (before and after a scrape of each
# kind), then with 30 pods; /stats/summary and /metrics/resource latency at 30 pods (direct to
# the node with a client certificate, as metrics-server calls it);
# `kubectl exec -- true` round trips (kubectl's own start and the
# apiserver included); `kubectl logs` throughput on a 4 MB log (one
# file: the default containerLogMaxSize is 10 Mi).
set -euo pipefail
cd "$(dirname "$0")/../.."
kbin=${CARGO_TARGET_DIR:-target}/release/kinglet
export KINGLET_CLUSTER_DIR=${KINGLET_CLUSTER_DIR:-/tmp/kinglet-cluster}
# shellcheck source=lib.sh
. tests/bench/lib.sh
runtime=${1:-oci}
cargo build --release --locked --bin kinglet >&2
admin=$(tests/cluster/up.sh | tail -n1)
node=bench-api-$runtime-$$
work=$(mktemp -d /tmp/kinglet-bench-api.XXXXXX)
root=$work/root
kc=$(tests/cluster/node-kubeconfig.sh "$node" | tail -n1)
pki=$KINGLET_CLUSTER_DIR/pki
tests/images/busybox.sh "$work/busybox.tar" >/dev/null
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
config() {
  printf 'apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nhealthzPort: 0\nport: %s\nauthentication: {x509: {clientCAFile: %s}}\n' \
    "$1" "$pki/ca.crt" > "$work/config.yaml"
}
if [ "$runtime" = cri ]; then
  endpoint=$(tests/cluster/containerd-up.sh "$work/containerd" | tail -n1)
  ctr --address "$work/containerd/containerd.sock" -n k8s.io images import "$work/busybox.tar" >/dev/null
  rt_args=(--runtime cri --container-runtime-endpoint "$endpoint")
else
  "$kbin" --root-dir "$root" images import "$work/busybox.tar" >/dev/null
  rt_args=(--cni-conf-dir "")
fi
pid=
start() {
  "$kbin" --config "$work/config.yaml" --kubeconfig "$kc" --hostname-override "$node" \
    --node-ip 127.0.0.1 --root-dir "$root" --pod-log-dir "$work/logs" \
    --device-plugin-dir "$work/device-plugins" --pod-resources-dir "$work/pod-resources" --device-config "$work/devices.yaml" "${rt_args[@]}" >>"$work/kinglet.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 100); do
    kubectl --kubeconfig "$admin" get node "$node" 2>/dev/null | grep -qw Ready && break; sleep 0.2
  done
  sleep 5
  kill -0 "$pid" 2>/dev/null || { echo "kinglet exited:" >&2; tail -20 "$work/kinglet.log" >&2; exit 1; }
}
pss() { awk '/^Pss:/ {print $2}' "/proc/$pid/smaps_rollup"; }
cleanup() {
  set +e
  kubectl --kubeconfig "$admin" delete pods -l bench=api --grace-period=0 --force --wait=false >/dev/null 2>&1
  for _ in $(seq 1 240); do
    [ "$("$kbin" --root-dir "$root" pods ls | wc -l)" -le 1 ] && break
    sleep 0.5
  done
  [ -n "$pid" ] && kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null
  release_oci_root "$root"
  [ "$runtime" = cri ] && tests/cluster/containerd-down.sh "$work/containerd"
  kubectl --kubeconfig "$admin" delete node "$node" --wait=false >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
echo "machine: $(nproc) cores, $(awk '/MemTotal/ {print int($2/1024)}' /proc/meminfo) MiB, $(uname -r); runtime: $runtime"
echo "binary: $(stat -c %s "$kbin") bytes ($kbin)"
# (The API cannot be turned off to compare: `port: 0` is invalid, as
# upstream; the README compares with the figures from before it existed.)
config "$port"; start
echo "kinglet PSS, 0 pods, API on: $(pss) KiB"
# One scrape of each kind first: what serving them costs stays resident.
get() { curl -sfk --cert "$pki/admin.crt" --key "$pki/admin.key" -o /dev/null -w '%{time_total}\n' "https://127.0.0.1:$port$1"; }
get /stats/summary >/dev/null; get /metrics/resource >/dev/null; get /metrics >/dev/null
echo "kinglet PSS, 0 pods, after one scrape of each kind: $(pss) KiB"

pod() {
  printf '{"apiVersion":"v1","kind":"Pod","metadata":{"name":"%s","labels":{"bench":"api"}},"spec":{"nodeName":"%s","terminationGracePeriodSeconds":1,"containers":[{"name":"c","image":"kinglet.test/busybox:1","command":["sh","-c",%s]}]}}' \
    "$1" "$node" "$2"
}
for i in $(seq 1 30); do pod "p$i" '"sleep 3600"'; done | kubectl --kubeconfig "$admin" apply -f - >/dev/null
kubectl --kubeconfig "$admin" wait --for=condition=Ready pods -l bench=api --timeout=180s >/dev/null
sleep 10
echo "kinglet PSS, 30 pods, API on: $(pss) KiB"

pct() { sort -n | awk '{a[NR]=$1} END {printf "p50 %.1f ms, p90 %.1f ms, max %.1f ms (%d calls)\n", a[int(NR*0.5+0.5)]*1000, a[int(NR*0.9+0.5)]*1000, a[NR]*1000, NR}'; }
echo "/stats/summary at 30 pods: $(for _ in $(seq 1 20); do get /stats/summary; done | pct)"
echo "/metrics/resource at 30 pods: $(for _ in $(seq 1 20); do get /metrics/resource; done | pct)"
echo "kubectl exec p1 -- true: $(for _ in $(seq 1 10); do
  /usr/bin/time -f %e kubectl --kubeconfig "$admin" exec p1 -- true 2>&1 >/dev/null | tail -1
done | pct)"
echo "kubectl get --raw /version (kubectl's own floor): $(for _ in $(seq 1 10); do
  /usr/bin/time -f %e kubectl --kubeconfig "$admin" get --raw /version 2>&1 >/dev/null | tail -1
done | pct)"

pod logs '"yes 0123456789012345678901234567890123456789012345678901234567890123456789012345678901234567890123456789 | head -c 4000000; sleep 3600"' | kubectl --kubeconfig "$admin" apply -f - >/dev/null
kubectl --kubeconfig "$admin" wait --for=condition=Ready pod/logs --timeout=60s >/dev/null
for _ in $(seq 1 120); do
  n=$(kubectl --kubeconfig "$admin" logs logs 2>/dev/null | wc -c)
  [ "$n" -ge 4000000 ] && break; sleep 1
done
t=$( { /usr/bin/time -f %e kubectl --kubeconfig "$admin" logs logs > "$work/logs.out"; } 2>&1 | tail -1)
echo "kubectl logs of a $(stat -c %s "$work/logs.out")-byte log: ${t} s ($(python3 -c "print(round($(stat -c %s "$work/logs.out")/1e6/$t,1))") MB/s)"
