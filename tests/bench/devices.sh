#!/usr/bin/env bash
# Benchmark (prints figures, asserts nothing): what the device manager costs
# kinglet in memory. Two fresh nodes, one after the other, same binary, same
# runtime, two pods each:
#   plain    two busybox pods; no device class declared, no plugin
#   devices  four device nodes declared in devices.yaml
#            (devices.kinglet.io/bench, made by mknod under the bench's dir),
#            upstream's sample device plugin as a pod (example.com/resource,
#            two devices), and a busybox pod holding one of each
# For each node, 20 s after its pods run: the agent's RSS and PSS (median of
# five samples 2 s apart), the in-process monitor's PSS and the plugin's.
#   tests/bench/devices.sh [oci|cri]
# KINGLET_BENCH_BIN: the binary to measure (default: a release build).
# No upstream kubelet column: its device manager's socket is hard-coded to
# /var/lib/kubelet/device-plugins, which the bench may not take from the
# host (every other bench and test keeps its sockets private).
set -euo pipefail
cd "$(dirname "$0")/../.."
export KINGLET_CLUSTER_DIR=${KINGLET_CLUSTER_DIR:-/tmp/kinglet-cluster}
# shellcheck source=lib.sh
. tests/bench/lib.sh
runtime=${1:-oci}
if [ -n "${KINGLET_BENCH_BIN:-}" ]; then
  kbin=$KINGLET_BENCH_BIN
else
  cargo build --release --locked --bin kinglet >&2
  kbin=${CARGO_TARGET_DIR:-target}/release/kinglet
fi
admin=$(tests/cluster/up.sh | tail -n1)
top=$(mktemp -d /tmp/kinglet-bench-dev.XXXXXX)
tests/images/busybox.sh "$top/busybox.tar" >/dev/null
plugin_tar=$top/plugin.tar
tests/images/sample-device-plugin.sh "$plugin_tar" kinglet.test/sample-device-plugin:bench >/dev/null
plugin_image=kinglet.test/sample-device-plugin:bench
busybox=kinglet.test/busybox:1

pid="" node="" work=""
stop() {
  set +e
  [ -n "$node" ] || return 0
  kubectl --kubeconfig "$admin" delete pods -l "bench=$node" --grace-period=0 --force --wait=false >/dev/null 2>&1
  for _ in $(seq 1 120); do
    [ "$("$kbin" --root-dir "$work/root" pods ls 2>/dev/null | wc -l)" -le 1 ] && break
    sleep 0.5
  done
  [ -n "$pid" ] && kill "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
  release_oci_root "$work/root"
  [ -d "$work/containerd" ] && tests/cluster/containerd-down.sh "$work/containerd"
  awk -v d="$work/" 'index($5, d) == 1 {print $5}' /proc/self/mountinfo | sort -r |
    while read -r m; do umount -l "$m" 2>/dev/null; done
  ip link del "kbd$(( $$ % 100000 ))" 2>/dev/null
  kubectl --kubeconfig "$admin" delete node "$node" --wait=false >/dev/null 2>&1
  pid="" node=""
  set -e
}
trap 'stop; rm -rf "$top"' EXIT

# pod NAME [LIMITS] [IMAGE] [VOLUME_DIR]: a pod on $node sleeping, with
# those resource limits; with VOLUME_DIR, the sample plugin's layout (its
# device-plugin dir mounted where it expects upstream's).
pod() {
  local name=$1 limits=${2:-} image=${3:-$busybox} dp=${4:-}
  {
    printf 'apiVersion: v1\nkind: Pod\nmetadata: {name: %s, labels: {bench: %s}}\nspec:\n' "$name" "$node"
    printf '  nodeName: %s\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: c\n' "$node"
    printf '    image: %s\n    imagePullPolicy: Never\n' "$image"
    if [ -n "$dp" ]; then
      printf '    env: [{name: PLUGIN_SOCK_DIR, value: /var/lib/kubelet/device-plugins}]\n'
      printf '    volumeMounts: [{name: dp, mountPath: /var/lib/kubelet/device-plugins}]\n'
      printf '  volumes: [{name: dp, hostPath: {path: %s}}]\n' "$dp"
    else
      printf '    command: [sleep, "100000"]\n'
      [ -z "$limits" ] || printf '    resources: {limits: {%s}}\n' "$limits"
    fi
  } | kubectl --kubeconfig "$admin" apply -f - >/dev/null
}

wait_running() {
  for _ in $(seq 1 300); do
    [ "$(kubectl --kubeconfig "$admin" get pod "$1" -o jsonpath='{.status.phase}' 2>/dev/null)" = Running ] && return 0
    sleep 0.2
  done
  echo "devices bench: $1 not Running" >&2
  kubectl --kubeconfig "$admin" describe pod "$1" >&2 || true
  return 1
}

wait_allocatable() {
  for _ in $(seq 1 300); do
    [ "$(kubectl --kubeconfig "$admin" get node "$node" -o jsonpath="{.status.allocatable.${1//./\\.}}" 2>/dev/null)" = "$2" ] && return 0
    sleep 0.2
  done
  echo "devices bench: $node's allocatable $1 never $2" >&2
  return 1
}

# measure KIND: prints "KIND rss_kib pss_kib monitor_pss_kib plugin_pss_kib".
measure() {
  sleep 20
  local rss=() pss=() mon=0 plug=0 m
  for _ in 1 2 3 4 5; do
    rss+=("$(awk '/^VmRSS:/ {print $2}' "/proc/$pid/status")")
    pss+=("$(awk '/^Pss:/ {print $2}' "/proc/$pid/smaps_rollup")")
    sleep 2
  done
  # The in-process runtime's monitor: the kinglet process running
  # `monitor` for this node's root dir.
  m=$(pgrep -f -- "monitor --dir $work/root" | head -n1 || true)
  [ -z "$m" ] || mon=$(awk '/^Pss:/ {print $2}' "/proc/$m/smaps_rollup")
  # The plugin's own process (comm is cut at 15 characters), for scale.
  m=$(pgrep -x sampledeviceplu | head -n1 || true)
  [ -z "$m" ] || plug=$(awk '/^Pss:/ {print $2}' "/proc/$m/smaps_rollup")
  printf '%s %s %s %s %s\n' "$1" \
    "$(printf '%s\n' "${rss[@]}" | sort -n | sed -n 3p)" \
    "$(printf '%s\n' "${pss[@]}" | sort -n | sed -n 3p)" "$mon" "$plug"
}

# node_up KIND: a fresh node with its own dirs, both images present.
node_up() {
  work=$top/$1
  node=bench-dev-$1-$$
  mkdir -p "$work/net.d" "$work/device-plugins"
  printf '{"cniVersion": "1.0.0", "name": "bench", "plugins": [{"type": "bridge", "bridge": "kbd%d", "isGateway": true, "ipMasq": false, "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.212.%d.0/24"}]], "dataDir": "%s/ipam"}}]}\n' \
    $(( $$ % 100000 )) $(( $$ % 250 )) "$work" > "$work/net.d/10-bench.conflist"
  if [ "$runtime" = oci ]; then
    "$kbin" --root-dir "$work/root" images import "$top/busybox.tar" "$plugin_tar" >/dev/null
  fi
  start_kinglet_node "$kbin" "$work" "$node" 127.0.0.1 "$runtime" 127.0.0.1:9 "$admin" "$work/kinglet.log"
  pid=$agent_pid
  if [ "$runtime" = cri ]; then
    local t
    for t in "$top/busybox.tar" "$plugin_tar"; do
      ctr --address "$work/containerd/containerd.sock" -n k8s.io images import "$t" >/dev/null
    done
  fi
}

echo "machine: $(nproc) cores, $(awk '/MemTotal/ {print int($2/1024)}' /proc/meminfo) MiB, $(uname -r); runtime: $runtime"
echo "binary: $(stat -Lc %s "$kbin") bytes ($kbin)"
results=()

node_up plain
pod "$node-a"; pod "$node-b"
wait_running "$node-a"; wait_running "$node-b"
results+=("$(measure plain)")
stop

work=$top/devices
mkdir -p "$work/dev"
for i in 0 1 2 3; do mknod "$work/dev/kbench$i" c 1 3; done
printf 'devices:\n- resource: devices.kinglet.io/bench\n  paths: [%s/dev/kbench*]\n' "$work" > "$work/devices.yaml"
node_up devices
pod "$node-plugin" "" "$plugin_image" "$work/device-plugins"
wait_allocatable example.com/resource 2
wait_allocatable devices.kinglet.io/bench 4
pod "$node-a" "example.com/resource: 1, devices.kinglet.io/bench: 1"
wait_running "$node-plugin"; wait_running "$node-a"
results+=("$(measure devices)")
stop

printf '\n| node (%s, 2 pods) | agent RSS KiB | agent PSS KiB | monitor PSS KiB | plugin PSS KiB |\n| --- | --- | --- | --- | --- |\n' "$runtime"
for r in "${results[@]}"; do
  read -r kind rss pss mon plug <<<"$r"
  printf '| %s | %s | %s | %s | %s |\n' "$kind" "$rss" "$pss" "$mon" "$plug"
done
read -r _ rss0 pss0 _ <<<"${results[0]}"
read -r _ rss1 pss1 _ <<<"${results[1]}"
printf '\ndevice manager on (a plugin registered, 4 built-in devices, a pod holding one of each): RSS %+d KiB, PSS %+d KiB\n' \
  $(( rss1 - rss0 )) $(( pss1 - pss0 ))
