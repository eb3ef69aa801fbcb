#!/usr/bin/env bash
# Benchmarks side by side with the upstream kubelet (prints figures, asserts
# nothing). Three nodes join the loopback control plane one after another,
# each with its own root, state, log dirs and pod network:
#   kubelet-containerd  the upstream kubelet (built from tests/cluster's Go
#                       module) with a private containerd, runc, CNI
#   kinglet-oci         kinglet's in-process runtime (CNI bridge too)
#   kinglet-cri         kinglet --runtime cri with a private containerd
# For each: binary size; memory (RSS/PSS) of the agent and of its runtime
# side at 0 pods and at each level; idle CPU (ms/min) at 0 pods and at the
# top level; pod startup latency p50/p90/p99 (created → Running via a
# watch, image present); deletion latency; API requests per minute at steady
# state (the apiserver's audit log, by node user); bytes written at idle,
# per pod start and per pod deletion, by the agent, by its runtime side and
# to the node's filesystem: each node's dirs (root, state, container logs,
# containerd's root and state) on an ext4 filesystem of their own on a loop
# device (journal included, as on a board's SD card), the agents' own logs
# on tmpfs (journald's business, not counted).
# Then (full run), or alone with --pressure, the memory-pressure reaction
# (pressure.py): each node's pods' cgroup capped at 600 MiB by node
# allocatable, the hard threshold allocatableMemory.available<150Mi, pods
# ramping 20, 100 and 500 MiB/s; into target/bench/pressure.{json,md,svg}
# (pressure_report.py) and, in the full run, the results' pressure rows.
# Output: a table on stdout, target/bench/results.{json,md}, and plots
# (matplotlib) target/bench/memory.svg and target/bench/startup.svg.
#   tests/bench/run.sh [--quick | --probes | --pressure | --writes [SECS] | --scale]
# (--quick: fewer pods and samples; --probes: 30 pods each with a readiness
# probe over HTTP and a liveness probe by exec, every 1-10 s, and the CPU
# and memory that costs, into target/bench/probes/; --writes: the write
# budget alone, idle windows of SECS (default 600) at 0, 10 and 110 pods,
# into target/bench/writes/; --scale: maxPods 500 and the curve at 110,
# 250 and 500 pods (memory, idle CPU and writes, API requests), pod
# networks of /22, into target/bench/scale/; BENCH_NODES picks the nodes,
# e.g. "kubelet-containerd kinglet-oci")
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=lib.sh
. tests/bench/lib.sh
quick=0 out=target/bench pressure=0 main=1 measure_pressure=0 max_pods=110
nodes=${BENCH_NODES:-kubelet-containerd kinglet-oci kinglet-cri}
[ "${1:-}" = --quick ] && quick=1
if [ "$quick" = 1 ]; then
  pods=10 levels=10 idle=5
  export BENCH_DELETES=5
elif [ "${1:-}" = --pressure ]; then
  pods=0 levels=0 idle=0 main=0 measure_pressure=1
elif [ "${1:-}" = --writes ]; then
  pods=10 levels=10,110 idle=${2:-600} out=target/bench/writes
  export BENCH_DELETES=10
elif [ "${1:-}" = --scale ]; then
  pods=50 levels=110,250,500 idle=60 out=target/bench/scale max_pods=500
  export BENCH_DELETES=20
elif [ "${1:-}" = --probes ]; then
  pods=30 levels=30 idle=60 out=target/bench/probes
  export BENCH_PROBES=1 BENCH_DELETES=10
else
  pods=50 levels=10,30,110 idle=60 measure_pressure=1
  export BENCH_DELETES=20
fi
export KINGLET_CLUSTER_DIR=${KINGLET_CLUSTER_DIR:-/tmp/kinglet-cluster}
start=$(date +%s)
tdir=${CARGO_TARGET_DIR:-target}
if [ -n "${KINGLET_BENCH_BIN:-}" ]; then
  # The test suite's quick run measures the static binary it has just
  # built (cross/build.sh), the one that ships, instead of linking a
  # release build of its own.
  kinglet_bin=$KINGLET_BENCH_BIN
else
  cargo build --release --locked --bin kinglet >&2
  kinglet_bin=$tdir/release/kinglet
fi
if [ "$quick" = 1 ] || [ "$max_pods" -gt 110 ]; then
  # The load driver: a debug build in the quick run (its figures are not
  # the README's) and the scale run (a watch client; the figures are of
  # the node's processes), optimised in the full run.
  cargo build --locked --example bench_pods >&2
  bench_pods=$tdir/debug/examples/bench_pods
else
  cargo build --release --locked --example bench_pods >&2
  bench_pods=$tdir/release/examples/bench_pods
fi
kubelet=$(tests/bench/build-kubelet.sh | tail -n1)
admin=$(tests/cluster/up.sh | tail -n1)
mkdir -p "$out"
work=$(mktemp -d /tmp/kinglet-bench.XXXXXX)
tests/images/busybox.sh "$work/busybox.tar" >/dev/null

# The upstream kubelet sets kernel tunables when it starts; put them back.
sysctls=(vm/overcommit_memory vm/panic_on_oom kernel/panic kernel/panic_on_oops kernel/keys/root_maxkeys kernel/keys/root_maxbytes)
declare -A saved
for s in "${sysctls[@]}"; do saved[$s]=$(cat "/proc/sys/$s" 2>/dev/null || true); done

agent_pid="" node="" dir="" loopdev=""
stop_node() {
  set +e
  [ -n "$node" ] || return 0
  kubectl --kubeconfig "$admin" delete pods -l bench=kinglet --grace-period=0 --force --wait=false >/dev/null 2>&1
  if [ -n "$agent_pid" ]; then
    kill "$agent_pid" 2>/dev/null
    for _ in $(seq 1 50); do kill -0 "$agent_pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$agent_pid" 2>/dev/null
    wait "$agent_pid" 2>/dev/null
  fi
  # kinglet's monitor and its containers; containerd and its containers.
  release_oci_root "$dir/root"
  [ -d "$dir/containerd" ] && tests/cluster/containerd-down.sh "$dir/containerd"
  awk -v d="$dir/" 'index($5, d) == 1 {print $5}' /proc/self/mountinfo | sort -r |
    while read -r m; do umount -l "$m" 2>/dev/null; done
  # Pod cgroups the upstream kubelet leaves (it never removes its QoS tiers).
  for h in /sys/fs/cgroup /sys/fs/cgroup/*; do
    for q in kubepods/besteffort kubepods/burstable; do
      for p in "$h/$q"/pod*; do [ -d "$p" ] && find "$p" -depth -type d -exec rmdir {} + 2>/dev/null; done
    done
  done
  [ -n "${bridge:-}" ] && ip link del "$bridge" 2>/dev/null
  # The pressure runs' private cgroup roots.
  for h in /sys/fs/cgroup/*/; do
    [ -d "$h$node" ] && find "$h$node" -depth -type d -exec rmdir {} + 2>/dev/null
  done
  kubectl --kubeconfig "$admin" delete node "$node" --wait=false >/dev/null 2>&1
  if [ -n "$loopdev" ]; then
    umount "$dir" 2>/dev/null || umount -l "$dir" 2>/dev/null
    losetup -d "$loopdev"
    rm -f "$dir.img"
  fi
  agent_pid="" node="" loopdev=""
  set -e
}
finish() {
  stop_node
  for s in "${sysctls[@]}"; do
    [ -n "${saved[$s]}" ] && echo "${saved[$s]}" > "/proc/sys/$s" 2>/dev/null
  done
  rm -rf "$work" ${logs:+"$logs"}
}
trap finish EXIT
logs=$(mktemp -d /dev/shm/kinglet-bench.XXXXXX)

wait_ready() {
  for _ in $(seq 1 300); do
    [ "$(kubectl --kubeconfig "$admin" get node "$1" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" = True ] && return 0
    kill -0 "$agent_pid" 2>/dev/null || { echo "bench: the agent of $1 exited" >&2; return 1; }
    sleep 0.2
  done
  echo "bench: $1 not Ready" >&2
  return 1
}

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

run_node() {
  local kind=$1
  dir=$work/$kind
  node=bench-$kind-$$
  log=$logs/$kind.log
  # The node's own filesystem: 4 GiB, ext4 with its journal, every inode
  # table written now (no lazy initialisation writing in the windows).
  mkdir -p "$dir"
  truncate -s 4G "$dir.img"
  mkfs.ext4 -q -F -N 65536 -E lazy_itable_init=0,lazy_journal_init=0 "$dir.img"
  loopdev=$(losetup -f --show "$dir.img")
  mount "$loopdev" "$dir"
  mkdir -p "$dir/logs"
  local kc
  kc=$(tests/cluster/node-kubeconfig.sh "$node" | tail -n1)
  local endpoint="" extra=""
  if [ "$pressure" = 1 ]; then
    # Pods under a private cgroup root capped at 600 MiB by node allocatable.
    local total
    total=$(( $(awk '/^MemTotal:/ {print $2}' /proc/meminfo) * 1024 ))
    for h in /sys/fs/cgroup/*/; do mkdir -p "$h$node" 2>/dev/null || true; done
    extra=$(printf 'cgroupRoot: /%s\nsystemReserved: {memory: "%s"}\nevictionPressureTransitionPeriod: 10s\n' "$node" "$(( total - 600 * 1048576 ))")
  fi
  case $kind in
    kubelet-containerd | kinglet-cri)
      # containerd's state dir on tmpfs, as /run/containerd is on a host,
      # and its log with the agents' (kinglet keeps its runtime state on
      # disk: its pods come back after an offline reboot).
      mkdir -p "$dir/containerd/state"
      mount -t tmpfs -o size=256m,mode=0711 tmpfs "$dir/containerd/state"
      ln -s "$logs/$kind.containerd.log" "$dir/containerd/containerd.log"
      local subnet=""
      [ "$max_pods" -gt 250 ] && subnet=10.208.$(( $$ % 60 * 4 )).0/22
      endpoint=$(CONTAINERD_SUBNET=${subnet:-${CONTAINERD_SUBNET:-}} tests/cluster/containerd-up.sh "$dir/containerd" | tail -n1)
      ctr --address "$dir/containerd/containerd.sock" -n k8s.io images import "$work/busybox.tar" >/dev/null
      bridge=$(tr -d '\n ' < "$dir/containerd/net.d/10-kinglet-test.conflist" | grep -o '"bridge":"[^"]*"' | cut -d'"' -f4)
      ;;
    kinglet-oci)
      "$kinglet_bin" --root-dir "$dir/root" images import "$work/busybox.tar" >/dev/null
      bridge=kbo$(( $$ % 100000 ))
      mkdir -p "$dir/net.d"
      local subnet=10.209.$(( $$ % 250 )).0/24
      [ "$max_pods" -gt 250 ] && subnet=10.209.$(( $$ % 60 * 4 )).0/22
      printf '{"cniVersion": "1.0.0", "name": "bench", "plugins": [{"type": "bridge", "bridge": "%s", "isGateway": true, "ipMasq": false, "ipam": {"type": "host-local", "ranges": [[{"subnet": "%s"}]], "dataDir": "%s/ipam"}}, {"type": "portmap", "capabilities": {"portMappings": true}}]}\n' \
        "$bridge" "$subnet" "$dir" > "$dir/net.d/10-bench.conflist"
      ;;
  esac
  case $kind in
    kubelet-containerd)
      cat > "$dir/config.yaml" <<YAML
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: 127.0.0.1
port: $(free_port)
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $(free_port)
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: $KINGLET_CLUSTER_DIR/pki/ca.crt}
authorization: {mode: AlwaysAllow}
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
containerRuntimeEndpoint: $endpoint
podLogsDir: $dir/logs
resolvConf: /etc/resolv.conf
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
maxPods: $max_pods
YAML
      if [ "$pressure" = 1 ]; then
        printf '%s\nevictionHard: {allocatableMemory.available: 150Mi}\n' "$extra" >> "$dir/config.yaml"
      else
        echo 'evictionHard: {memory.available: 100Mi, nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%"}' >> "$dir/config.yaml"
      fi
      "$kubelet" --kubeconfig "$kc" --config "$dir/config.yaml" --root-dir "$dir/root" \
        --cert-dir "$dir/pki" --hostname-override "$node" --node-ip 127.0.0.1 --v 1 \
        >"$log" 2>&1 &
      ;;
    kinglet-oci | kinglet-cri)
      printf 'apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nhealthzPort: 0\nport: %s\nauthentication: {x509: {clientCAFile: %s}}\n' \
        "$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')" "$KINGLET_CLUSTER_DIR/pki/ca.crt" > "$dir/config.yaml"
      [ "$pressure" = 1 ] && printf '%s\nevictionHard: {allocatableMemory.available: 150Mi}\n' "$extra" >> "$dir/config.yaml"
      echo "maxPods: $max_pods" >> "$dir/config.yaml"
      local rt_args=(--cni-conf-dir "$dir/net.d")
      [ "$kind" = kinglet-cri ] && rt_args=(--runtime cri --container-runtime-endpoint "$endpoint")
      "$kinglet_bin" --config "$dir/config.yaml" --kubeconfig "$kc" --hostname-override "$node" \
        --node-ip 127.0.0.1 --root-dir "$dir/root" --pod-log-dir "$dir/logs" \
        --device-plugin-dir "$dir/device-plugins" --pod-resources-dir "$dir/pod-resources" --device-config "$dir/devices.yaml" "${rt_args[@]}" \
        >"$log" 2>&1 &
      ;;
  esac
  agent_pid=$!
  if ! wait_ready "$node"; then
    tail -20 "$log" >&2
    local result=$work/$kind.json
    [ "$pressure" = 1 ] && result=$work/$kind.pressure.json
    echo "{\"node\": \"$kind\", \"error\": \"not Ready\"}" > "$result"
    stop_node
    return 0
  fi
  echo "== $kind" >&2
  if [ "$pressure" = 1 ]; then
    python3 tests/bench/pressure.py "$admin" "$node" "$log" \
      "/sys/fs/cgroup/memory/$node/kubepods" "$work/$kind.pressure.json" 20 100 500 >&2 || true
    stop_node
    return 0
  fi
  BENCH_FS_DEV=$(basename "$loopdev") "$bench_pods" "$admin" "$node" "$dir" "$pods" "$levels" "$idle" "$dir/result.json" >&2
  # Sizes: the agent, and the runtime side's executables.
  local agent_bin runtime_bins=()
  case $kind in
    kubelet-containerd) agent_bin=$kubelet; runtime_bins=(containerd containerd-shim-runc-v2 runc) ;;
    kinglet-oci) agent_bin="$kinglet_bin" ;;
    kinglet-cri) agent_bin="$kinglet_bin"; runtime_bins=(containerd containerd-shim-runc-v2 runc) ;;
  esac
  local runtime_size=0
  for b in "${runtime_bins[@]}"; do
    runtime_size=$(( runtime_size + $(stat -Lc %s "$(command -v "$b")") ))
  done
  python3 - "$dir/result.json" "$work/$kind.json" "$kind" "$node" "$(stat -Lc %s "$agent_bin")" "$runtime_size" \
    "$KINGLET_CLUSTER_DIR/logs/audit.log" <<'PY'
import json, sys, datetime
src, dst, kind, node, agent_size, runtime_size, audit = sys.argv[1:8]
r = json.load(open(src))
r.update(node=kind, agent_binary_bytes=int(agent_size), runtime_binary_bytes=int(runtime_size))
user = "system:node:" + node
def parse(ts):
    return datetime.datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()
for c in r.get("cpu", []):
    n = 0
    try:
        with open(audit) as f:
            for line in f:
                if user not in line:
                    continue
                e = json.loads(line)
                if e.get("user", {}).get("username") != user or e.get("stage") not in ("ResponseComplete", "ResponseStarted"):
                    continue
                # A watch shows up as ResponseStarted; everything else once, complete.
                if e.get("stage") == "ResponseStarted" and e.get("verb") != "watch":
                    continue
                t = parse(e.get("stageTimestamp") or e["requestReceivedTimestamp"])
                if c["start_unix"] <= t < c["end_unix"]:
                    n += 1
        c["api_requests_per_min"] = n * 60.0 / max(1, c["end_unix"] - c["start_unix"])
    except FileNotFoundError:
        c["api_requests_per_min"] = None
json.dump(r, open(dst, "w"), indent=1)
PY
  stop_node
}

if [ "$main" = 1 ]; then
  for kind in $nodes; do
    run_node "$kind"
  done
fi
if [ "$measure_pressure" = 1 ]; then
  pressure=1
  for kind in kubelet-containerd kinglet-oci kinglet-cri; do
    run_node "$kind"
  done
  python3 tests/bench/pressure_report.py "$out" "$work"/kubelet-containerd.pressure.json \
    "$work"/kinglet-oci.pressure.json "$work"/kinglet-cri.pressure.json
  export BENCH_PRESSURE=1
  [ "$main" = 1 ] || exit 0
fi
results=()
for kind in $nodes; do results+=("$work/$kind.json"); done
python3 tests/bench/report.py "$out" "$quick" "$(( $(date +%s) - start ))" "${results[@]}"
