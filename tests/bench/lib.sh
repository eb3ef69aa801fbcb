# Shared by the benchmark scripts.
# shellcheck shell=bash

# release_oci_root ROOT: stops the container monitor of a (stopped) kinglet
# with that root dir after deleting its containers, and removes what its
# sandboxes left: network namespace mounts, pod cgroups, mounts under ROOT.
release_oci_root() {
  local root=$1 m parent n h
  if [ -S "$root/runtime/oci/monitor/monitor.sock" ]; then
    python3 - "$root/runtime/oci/monitor/monitor.sock" <<'PY' || true
import json, socket, sys
def call(req):
    s = socket.socket(socket.AF_UNIX); s.settimeout(10); s.connect(sys.argv[1])
    s.sendall((json.dumps(req) + "\n").encode()); d = b""
    while not d.endswith(b"\n"):
        c = s.recv(65536)
        if not c: break
        d += c
    return json.loads(d) if d else {}
for r in call({"op": "list"}).get("records", []):
    call({"op": "delete", "id": r["id"]})
try: call({"op": "exit"})
except Exception: pass
PY
  fi
  for m in "$root"/runtime/oci/sandboxes/*/meta.json; do
    [ -f "$m" ] || continue
    parent=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["cgroup_parent"])' "$m")
    for h in /sys/fs/cgroup /sys/fs/cgroup/*; do rmdir "$h/$parent" 2>/dev/null; done
  done
  awk -v d="$root/" 'index($5, d) == 1 {print $5}' /proc/self/mountinfo | sort -r |
    while read -r n; do umount -l "$n" 2>/dev/null; done
  return 0
}

# start_kinglet_node KINGLET WORK NODE NODE_IP RUNTIME REGISTRY ADMIN LOG [CONFIG]:
# joins a kinglet node to the cluster of ADMIN (a kubeconfig) with its dirs
# and CNI conflist under WORK (WORK/net.d, written by the caller), the
# suites' common configuration plus the KubeletConfiguration lines CONFIG;
# with RUNTIME cri through a private containerd on the same network, told
# that the local registry REGISTRY speaks plain HTTP (hosts.toml, read at
# each pull). Sets agent_pid; returns once the node is Ready (1 if not).
start_kinglet_node() {
  local kinglet=$1 work=$2 node=$3 node_ip=$4 runtime=$5 registry=$6 admin=$7 log=$8 config=${9:-}
  local kc port sock
  kc=$(tests/cluster/node-kubeconfig.sh "$node" | tail -n1)
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  mkdir -p "$work/logs"
  # The node shares the build machine's disk with its caches and build
  # trees: disk thresholds of 5% (upstream's defaults are 10/15%) keep a
  # busy disk from tainting it DiskPressure, which no test here is about.
  {
    printf 'apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nhealthzPort: 0\nport: %s\n' "$port"
    printf 'authentication: {x509: {clientCAFile: %s}}\n' "$KINGLET_CLUSTER_DIR/pki/ca.crt"
    printf 'evictionHard: {memory.available: 100Mi, nodefs.available: 5%%, nodefs.inodesFree: 5%%, imagefs.available: 5%%}\n'
    [ -z "$config" ] || printf '%s\n' "$config"
  } > "$work/config.yaml"
  # registry.k8s.io is served by the local registry too: manifests the
  # suites apply as they are (upstream's testing manifests) name it, and
  # no pull may leave the machine.
  printf 'mirrors:\n  registry.k8s.io:\n    endpoint: ["http://%s"]\n' "$registry" > "$work/registries.yaml"
  local runtime_args=(--image-registry-config "$work/registries.yaml")
  if [ "$runtime" = cri ]; then
    sock=$(tests/cluster/containerd-up.sh "$work/containerd" "$work/net.d" | tail -n1)
    local host
    for host in "$registry" registry.k8s.io; do
      mkdir -p "$work/containerd/certs.d/$host"
      printf 'server = "http://%s"\n[host."http://%s"]\n  capabilities = ["pull", "resolve"]\n' \
        "$registry" "$registry" > "$work/containerd/certs.d/$host/hosts.toml"
    done
    runtime_args=(--runtime cri --container-runtime-endpoint "$sock")
  fi
  "$kinglet" --config "$work/config.yaml" --kubeconfig "$kc" --hostname-override "$node" \
    --node-ip "$node_ip" --root-dir "$work/root" --pod-log-dir "$work/logs" \
    --device-plugin-dir "$work/device-plugins" --pod-resources-dir "$work/pod-resources" --device-config "$work/devices.yaml" --cni-conf-dir "$work/net.d" \
    "${runtime_args[@]}" >"$log" 2>&1 &
  agent_pid=$!
  for _ in $(seq 1 300); do
    [ "$(kubectl --kubeconfig "$admin" get node "$node" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" = True ] && return 0
    kill -0 "$agent_pid" 2>/dev/null || break
    sleep 0.2
  done
  echo "start_kinglet_node: $node not Ready" >&2
  tail -20 "$log" >&2
  return 1
}
