#!/usr/bin/env bash
# The VM lab: kinglet on the machines it is for. Boots a Debian 12 guest of
# ARCH under qemu (tests/vm/image.sh builds it from Debian's packages),
# installs the project's own .deb for that arch, joins the guest to a
# control plane on this machine, and checks what a user's board does:
#   tests/vm/run.sh [--arch amd64|arm64|armhf] [--suite smoke|full|bench|conformance] [--runtime oci|cri]
# smoke: boot, node Ready on cgroup v2, a pod from the lab registry with its
#   limits on the unified hierarchy, kubectl logs and exec through the
#   apiserver, then a reboot with the control plane unreachable: kinglet
#   starts by itself and the pod runs again offline; back online, status
#   converges and nothing restarts again.
# full: smoke, then tests/vm/full.sh (power cuts, eviction under real
#   memory pressure, the 8-pod reboot).
# bench: the 512 MB board side by side (tests/vm/bench.sh): kinglet, then
#   the upstream kubelet with containerd in the same guest; boot to Ready,
#   memory at 0/10/30 pods, pod startup.
# conformance: the conformance CI subset (tests/conformance/ci-specs.txt)
#   against the guest node (tests/vm/conformance.sh).
# Prints `figure:` lines; leaves nothing running (guest, bridge, control
# plane, registry, gate rule).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
cd "$root"
# shellcheck source=lib.sh
. "$here/lib.sh"
arch=amd64 suite=smoke runtime=oci
while [ $# -gt 0 ]; do
  case "$1" in
    --arch) arch=$2; shift 2 ;;
    --suite) suite=$2; shift 2 ;;
    --runtime) runtime=$2; shift 2 ;;
    *) echo "usage: tests/vm/run.sh [--arch amd64|arm64|armhf] [--suite smoke|full|bench|conformance] [--runtime oci|cri]" >&2; exit 2 ;;
  esac
done
case "$suite" in smoke | full | bench | conformance) ;; *) echo "tests/vm/run.sh: --suite is smoke, full, bench or conformance, not $suite" >&2; exit 2 ;; esac
case "$runtime" in oci | cri) ;; *) echo "tests/vm/run.sh: --runtime is oci or cri, not $runtime" >&2; exit 2 ;; esac
vm_arch_settings "$arch"
case "$arch" in amd64) qpkg=qemu-system-x86 ;; *) qpkg=qemu-system-arm ;; esac
tests/apt-need.sh "$qpkg" qemu-utils docker-registry skopeo umoci e2fsprogs openssh-client python3 >/dev/null
image_dir=$("$here/image.sh" "$arch" | tail -n1)
key=$image_dir/id_ed25519
work=$(mktemp -d /tmp/kinglet-vm.XXXXXX)
# The lab's own control plane: its own dir and ports, advertised on the
# lab bridge so the guest reaches it and it reaches the guest's kubelet.
export KINGLET_CLUSTER_DIR=$work/cluster KINGLET_ETCD_PORT=12479 KINGLET_ETCD_PEER_PORT=12480 \
  KINGLET_APISERVER_PORT=16543 KINGLET_KCM_PORT=20357 KINGLET_SCHEDULER_PORT=20359 \
  KINGLET_APISERVER_ADVERTISE=$VM_HOST_IP KINGLET_METRICS_SERVER=none
# A kept run keeps its control plane's logs (the audit log says who did
# what) and etcd data too.
[ "${KINGLET_VM_KEEP:-0}" = 1 ] && export KINGLET_CLUSTER_KEEP_DATA=1
REGISTRY=$VM_HOST_IP:15000
GATE_COMMENT=kinglet-test-gate-vm
export VM_ROOT=$root VM_WORK=$work VM_KEY=$key VM_ARCH=$arch VM_RUNTIME=$runtime REGISTRY GATE_COMMENT
qemu_pid=

cleanup() {
  set +e
  [ -n "$qemu_pid" ] && kill "$qemu_pid" 2>/dev/null && wait "$qemu_pid" 2>/dev/null
  vm_gate open
  [ -f "$work/registry.pid" ] && kill "$(cat "$work/registry.pid")" 2>/dev/null
  tests/cluster/down.sh >/dev/null 2>&1
  vm_net_down
  if [ "${KINGLET_VM_KEEP:-0}" = 1 ]; then echo "vm: kept $work" >&2; else rm -rf "$work"; fi
}
trap cleanup EXIT
# A signal ends the run through the EXIT trap too.
trap "exit 130" INT
trap "exit 143" TERM

vm_net_up
kc=$(tests/cluster/up.sh | tail -n1)
export KUBECONFIG=$kc
node=kinglet-vm
node_kc=$(tests/cluster/node-kubeconfig.sh "$node" | tail -n1)
kubectl config view --flatten --kubeconfig "$node_kc" | sed "s#https://127.0.0.1:#https://$VM_HOST_IP:#" >"$work/kubeconfig"
cp "$KINGLET_CLUSTER_DIR/pki/ca.crt" "$work/ca.crt"
vm_registry_up
vm_push_busybox "$image_dir"

# The project's own .deb for this arch, from the static binary.
bin=${KINGLET_BIN:-target/$VM_RUST_TARGET/release/kinglet}
[ -x "$bin" ] || cross/build.sh "$VM_RUST_TARGET" >&2
# A foreign binary runs under qemu-user first (cheap, and what it cannot
# do, unpack layers without openat2, the guest's kernel does below).
case "$arch" in
  arm64) tests/cross-smoke.sh qemu-aarch64-static "$bin" >&2 ;;
  armhf) tests/cross-smoke.sh qemu-arm-static "$bin" >&2 ;;
esac
deb=$(KINGLET_BIN=$bin packaging/deb/build.sh "$arch" | sed -n 's/: [0-9]* bytes$//p')
cp "$deb" "$work/kinglet.deb"

qemu-img create -q -f qcow2 -b "$image_dir/root.raw" -F raw "$work/disk.qcow2"
mem=${KINGLET_VM_MEM:-512}
qemu_pid=$(vm_boot "$image_dir" "$work/disk.qcow2" "$mem" "$work/console.log" "$work/monitor.sock")
export VM_QEMU_PID=$qemu_pid
vm_wait_ssh 600
echo "vm: $arch guest up ($(vm_ssh "$key" 'stat -fc %T /sys/fs/cgroup; nproc; uname -r' | tr '\n' ' '))"
vm_install_kinglet
vm_wait_node_ready 300
echo "figure: vm $arch $runtime first install: kinglet active after $(vm_since_boot kinglet) s of uptime"
VM_SUITE=$suite
case "$suite" in
  smoke) . "$here/smoke.sh" ;;
  full) VM_SUITE=smoke; . "$here/smoke.sh"; VM_SUITE=full; . "$here/full.sh" ;;
  bench) . "$here/bench.sh" ;;
  conformance) . "$here/conformance.sh" ;;
esac
echo "vm: $arch $suite ($runtime) passed"
