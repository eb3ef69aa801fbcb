#!/usr/bin/env bash
# Starts Debian's containerd (with runc and the CNI plugins) for the tests on
# a private root, state dir, socket and CNI network — never the system's —
# with the sandbox (pause) image loaded offline, and prints unix://<socket>
# as its last line.
#   containerd-up.sh [DIR [CNI_CONF_DIR]]
# DIR defaults to $KINGLET_CLUSTER_DIR/containerd; CNI_CONF_DIR, a conflist
# dir of the caller's, replaces the generated one.
# Environment: CONTAINERD_BRIDGE, CONTAINERD_SUBNET pick the pod network
# (default: a bridge and a /24 derived from DIR, so several instances can
# run at once).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
. "$here/lib.sh"
dir=$(realpath -m "${1:-$CLUSTER_DIR/containerd}")
sum=$(printf '%s' "$dir" | cksum | cut -d' ' -f1)
bridge=${CONTAINERD_BRIDGE:-kcd$((sum % 100000))}
subnet=${CONTAINERD_SUBNET:-10.$((210 + sum % 40)).$((sum / 40 % 250)).0/24}
sock=$dir/containerd.sock
pause=kinglet.test/pause:1

if [ -S "$sock" ] && [ -f "$dir/containerd.pid" ] && kill -0 "$(cat "$dir/containerd.pid")" 2>/dev/null; then
  echo "unix://$sock"
  exit 0
fi
cni_dir=$(realpath -m "${2:-$dir/net.d}")
mkdir -p "$dir/root" "$dir/state" "$dir/ipam" "$dir/images" "$dir/certs.d" "$cni_dir"
echo "$cni_dir" > "$dir/cni-conf-dir"
[ -n "${2:-}" ] || cat > "$dir/net.d/10-kinglet-test.conflist" <<JSON
{"cniVersion": "1.0.0", "name": "kinglet-test",
 "plugins": [
  {"type": "bridge", "bridge": "$bridge", "isGateway": true, "ipMasq": false,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": "$subnet"}]], "dataDir": "$dir/ipam"}},
  {"type": "portmap", "capabilities": {"portMappings": true}}]}
JSON
cat > "$dir/config.toml" <<TOML
version = 2
root = "$dir/root"
state = "$dir/state"
disabled_plugins = ["io.containerd.internal.v1.opt", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.aufs", "io.containerd.tracing.processor.v1.otlp"]
[grpc]
  address = "$sock"
[ttrpc]
  address = "$sock.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$pause"
  # Lets containers have OOM scores below containerd's own only where it
  # has CAP_SYS_RESOURCE (test sandboxes may not).
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".registry]
    # Per-registry hosts.toml files, read at each pull (tests add theirs).
    config_path = "$dir/certs.d"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$cni_dir"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
TOML
containerd --config "$dir/config.toml" >"$dir/containerd.log" 2>&1 &
echo $! > "$dir/containerd.pid"
for _ in $(seq 1 100); do
  [ -S "$sock" ] && ctr --address "$sock" version >/dev/null 2>&1 && break
  sleep 0.1
done
ctr --address "$sock" version >/dev/null 2>&1 || { tail -20 "$dir/containerd.log" >&2; exit 1; }

# The pause image: busybox sleeping, built offline like the test images.
if ! ctr --address "$sock" -n k8s.io images ls -q | grep -qx "$pause"; then
  "$here/../images/busybox.sh" "$dir/images/pause.tar" "$pause" "" /bin/sleep 2147483647 >/dev/null
  ctr --address "$sock" -n k8s.io images import "$dir/images/pause.tar" >/dev/null
fi
# Pinned, as containerd marks the sandbox image it pulls itself (imported
# with ctr it is not): CRI reports it `pinned` and image GC spares it.
ctr --address "$sock" -n k8s.io images label "$pause" io.cri-containerd.pinned=pinned >/dev/null
echo "unix://$sock"
