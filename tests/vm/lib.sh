# Shared settings and helpers of the VM lab (tests/vm/): the guests' arch
# settings, the lab bridge and tap, booting a guest under qemu, and ssh.
# Everything stays on this machine: the guest sits on a bridge the lab
# makes (klvm0, 10.213.0.0/24), the host is .1, the guest .2.
# shellcheck shell=bash
VM_CACHE=${KINGLET_VM_CACHE:-${KINGLET_CACHE_DIR:-/var/cache/kinglet}/vm}
VM_BRIDGE=${KINGLET_VM_BRIDGE:-klvm0}
VM_TAP=${KINGLET_VM_TAP:-klvmtap0}
VM_HOST_IP=10.213.0.1
VM_GUEST_IP=10.213.0.2

# vm_arch_settings ARCH: the kernel package, qemu and console of that arch.
vm_arch_settings() {
  case "$1" in
    amd64)
      VM_KERNEL_PKG=linux-image-amd64 VM_QEMU=qemu-system-x86_64 VM_CONSOLE=ttyS0
      VM_MACHINE=(-M q35 -cpu max) VM_RUST_TARGET=x86_64-unknown-linux-musl VM_OCI_ARCH=amd64 ;;
    arm64)
      VM_KERNEL_PKG=linux-image-arm64 VM_QEMU=qemu-system-aarch64 VM_CONSOLE=ttyAMA0
      VM_MACHINE=(-M virt -cpu cortex-a53) VM_RUST_TARGET=aarch64-unknown-linux-musl VM_OCI_ARCH=arm64 ;;
    armhf)
      # armmp (no LPAE): the virt board's PCI window must stay below 4 GB.
      VM_KERNEL_PKG=linux-image-armmp VM_QEMU=qemu-system-arm VM_CONSOLE=ttyAMA0
      VM_MACHINE=(-M virt,highmem=off -cpu cortex-a15) VM_RUST_TARGET=armv7-unknown-linux-musleabihf VM_OCI_ARCH=arm ;;
    *) echo "vm: unknown arch $1 (amd64, arm64, armhf)" >&2; return 1 ;;
  esac
}

# vm_binfmt ARCH: registers Debian's qemu-user-static for ARCH with the
# kernel (mmdebstrap runs the foreign root's maintainer scripts through it).
vm_binfmt() {
  local q
  case "$1" in arm64) q=qemu-aarch64 ;; armhf) q=qemu-arm ;; esac
  [ -e /proc/sys/fs/binfmt_misc/register ] ||
    mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
  [ -e "/proc/sys/fs/binfmt_misc/$q" ] && return 0
  # Debian's systemd-binfmt line as it is (flags OPF: F opens the
  # interpreter now, so it works inside the chroot too; its wrapper needs P).
  sed -n '/^:/p' "/usr/lib/binfmt.d/$q.conf" >/proc/sys/fs/binfmt_misc/register
}

# vm_net_up: the lab bridge with the host's address and a tap on it.
vm_net_up() {
  ip link show "$VM_BRIDGE" >/dev/null 2>&1 || {
    ip link add "$VM_BRIDGE" type bridge
    ip addr add "$VM_HOST_IP/24" dev "$VM_BRIDGE"
  }
  ip link set "$VM_BRIDGE" up
  ip link show "$VM_TAP" >/dev/null 2>&1 || ip tuntap add dev "$VM_TAP" mode tap
  ip link set "$VM_TAP" master "$VM_BRIDGE" up
}

vm_net_down() {
  ip link del "$VM_TAP" 2>/dev/null || true
  ip link del "$VM_BRIDGE" 2>/dev/null || true
}

# vm_boot DIR DISK MEM_MB LOG MONITOR_SOCKET: starts the guest in the
# background (TCG; KVM only when KINGLET_VM_KVM=1: nested KVM hangs in
# early boot here), console to LOG, the qemu monitor on a unix socket.
# A reboot inside the guest resets the machine and boots the same kernel.
vm_boot() {
  local dir=$1 disk=$2 mem=$3 log=$4 mon=$5 accel=tcg
  [ "${KINGLET_VM_KVM:-0}" = 1 ] && accel=kvm
  local netdev=virtio-net-pci
  setsid "$VM_QEMU" "${VM_MACHINE[@]}" -accel "$accel" -smp 1 -m "$mem" \
    -nographic -monitor "unix:$mon,server,nowait" -serial "file:$log" \
    -kernel "$dir/vmlinuz" -initrd "$dir/initrd.img" \
    -append "root=/dev/vda rw console=$VM_CONSOLE panic=10 net.ifnames=0" \
    -drive "file=$disk,format=qcow2,if=none,id=root,cache=writeback" \
    -device virtio-blk-pci,drive=root \
    -netdev "tap,id=n0,ifname=$VM_TAP,script=no,downscript=no" \
    -device "$netdev,netdev=n0,mac=52:54:00:6b:6c:02" \
    -rtc base=utc </dev/null >/dev/null 2>&1 &
  echo $!
}

# vm_monitor SOCKET COMMAND: one qemu monitor command (system_reset, quit).
vm_monitor() {
  python3 - "$1" "$2" <<'PY'
import socket, sys, time
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
s.recv(4096)
s.sendall((sys.argv[2] + "\n").encode())
time.sleep(0.5)
PY
}

# vm_ssh KEY ARGS...: a command in the guest as root.
vm_ssh() {
  local key=$1; shift
  ssh -q -i "$key" -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null \
    -o ConnectTimeout=5 -o ServerAliveInterval=5 -o ServerAliveCountMax=3 \
    -o BatchMode=yes "root@$VM_GUEST_IP" "$@"
}

vm_scp() {
  local key=$1; shift
  scp -q -i "$key" -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null \
    -o ConnectTimeout=5 -o BatchMode=yes "$@"
}

# The helpers below run inside tests/vm/run.sh, which sets VM_WORK, VM_KEY,
# VM_ARCH, VM_RUNTIME, REGISTRY, GATE_COMMENT, VM_SUITE and KUBECONFIG.

# fail MESSAGE: the suite fails. KINGLET_VM_HOLD=1 keeps the guest up for
# a look first (ssh -i $VM_KEY root@10.213.0.2).
fail() {
  echo "vm ${VM_SUITE:-}: $*" >&2
  [ "${KINGLET_VM_HOLD:-0}" = 1 ] && { echo "vm: holding the guest; kill $$ to end" >&2; sleep 3600; }
  exit 1
}

# vm_gate close|open: the control plane unreachable from the guest (its
# packets to the apiserver dropped, as a cut uplink does), or reachable.
vm_gate() {
  local rule=(INPUT -i "$VM_BRIDGE" -p tcp --dport "$KINGLET_APISERVER_PORT" -m comment --comment "$GATE_COMMENT" -j DROP)
  if [ "$1" = close ]; then
    iptables -w -C "${rule[@]}" 2>/dev/null || iptables -w -I "${rule[@]}"
  else
    while iptables -w -D "${rule[@]}" 2>/dev/null; do :; done
  fi
}

# The lab registry (Debian's docker-registry) on the bridge address.
vm_registry_up() {
  mkdir -p "$VM_WORK/registry"
  printf 'version: 0.1\nlog: {level: warn}\nstorage: {filesystem: {rootdirectory: %s}}\nhttp: {addr: "%s"}\n' \
    "$VM_WORK/registry" "$REGISTRY" >"$VM_WORK/registry.yml"
  setsid docker-registry serve "$VM_WORK/registry.yml" >"$VM_WORK/registry.log" 2>&1 </dev/null &
  echo $! >"$VM_WORK/registry.pid"
  for _ in $(seq 1 100); do
    curl -fsS "http://$REGISTRY/v2/" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "vm: the lab registry did not start" >&2; cat "$VM_WORK/registry.log" >&2; return 1
}

# vm_push_busybox IMAGE_DIR: $REGISTRY/kinglet/busybox:1 for the guest's
# arch, from the busybox-static of the guest's own root (the right arch).
vm_push_busybox() {
  local b=$VM_WORK/busybox l=$VM_WORK/layout
  mkdir -p "$b"
  debugfs -R "dump /bin/busybox $b/busybox" "$1/root.raw" >/dev/null 2>&1
  chmod 755 "$b/busybox"
  umoci init --layout "$l"
  umoci new --image "$l:img"
  umoci unpack --image "$l:img" "$b/bundle" >/dev/null
  # shellcheck source=../images/lib.sh
  . "$VM_ROOT/tests/images/lib.sh"
  rootfs "$b/bundle/rootfs" "$b/busybox"
  umoci repack --image "$l:img" "$b/bundle" >/dev/null
  umoci config --image "$l:img" --architecture "$VM_OCI_ARCH" --os linux \
    --config.env PATH=/bin --config.cmd /bin/sh
  skopeo --insecure-policy copy --quiet --dest-tls-verify=false "oci:$l:img" \
    "docker://$REGISTRY/kinglet/busybox:1"
  # containerd's sandbox image (--runtime cri): the same busybox, asleep.
  umoci config --image "$l:img" --config.cmd /bin/sleep --config.cmd 2147483647
  skopeo --insecure-policy copy --quiet --dest-tls-verify=false "oci:$l:img" \
    "docker://$REGISTRY/kinglet/pause:1"
}

# vm_wait_ssh SECONDS: until the guest answers over ssh.
vm_wait_ssh() {
  local deadline=$(( $(date +%s) + $1 ))
  while ! vm_ssh "$VM_KEY" true 2>/dev/null; do
    kill -0 "$VM_QEMU_PID" 2>/dev/null || { echo "vm: qemu exited" >&2; tail -n 40 "$VM_WORK/console.log" >&2; return 1; }
    [ "$(date +%s)" -lt "$deadline" ] || { echo "vm: no ssh after $1 s" >&2; tail -n 40 "$VM_WORK/console.log" >&2; return 1; }
    sleep 2
  done
}

# vm_containerd_setup: the guest's containerd (Debian's) pulling from the
# lab registry (plain HTTP), with the lab's sandbox image (the default,
# registry.k8s.io/pause, is out of reach as on an air-gapped board),
# enabled and started.
vm_containerd_setup() {
  vm_ssh "$VM_KEY" "mkdir -p /etc/containerd/certs.d/$REGISTRY && printf 'server = \"http://$REGISTRY\"\n[host.\"http://$REGISTRY\"]\n  capabilities = [\"pull\", \"resolve\"]\n' >/etc/containerd/certs.d/$REGISTRY/hosts.toml &&
    printf 'version = 2\n[plugins.\"io.containerd.grpc.v1.cri\"]\n  sandbox_image = \"$REGISTRY/kinglet/pause:1\"\n[plugins.\"io.containerd.grpc.v1.cri\".registry]\n  config_path = \"/etc/containerd/certs.d\"\n[plugins.\"io.containerd.grpc.v1.cri\".cni]\n  bin_dir = \"/usr/lib/cni\"\n' >/etc/containerd/config.toml &&
    systemctl enable --now containerd >/dev/null 2>&1"
}

# vm_install_kinglet: the .deb as a user installs it, the node's
# kubeconfig and CA, the lab registry (plain HTTP), then the unit started.
vm_install_kinglet() {
  local args=
  vm_scp "$VM_KEY" "$VM_WORK/kinglet.deb" "$VM_WORK/kubeconfig" "$VM_WORK/ca.crt" "root@$VM_GUEST_IP:/root/"
  if [ "$VM_RUNTIME" = cri ]; then
    args="--runtime cri --container-runtime-endpoint unix:///run/containerd/containerd.sock"
    vm_containerd_setup
  fi
  vm_ssh "$VM_KEY" "set -e; dpkg -i /root/kinglet.deb >/dev/null
    install -m 600 /root/kubeconfig /etc/kinglet/kubeconfig
    install -D -m 644 /root/ca.crt /etc/kinglet/pki/ca.crt
    printf 'configs:\n  \"$REGISTRY\":\n    plain_http: true\n' >/etc/kinglet/registries.yaml
    echo 'KINGLET_ARGS=\"$args\"' >/etc/default/kinglet
    systemctl start kinglet || { journalctl -u kinglet --no-pager | tail -n 40; exit 1; }"
}

# vm_node_ready: true if the node's Ready condition is True.
vm_node_ready() {
  [ "$(kubectl get node kinglet-vm -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" = True ]
}

vm_wait_node_ready() {
  local deadline=$(( $(date +%s) + $1 ))
  until vm_node_ready; do
    [ "$(date +%s)" -lt "$deadline" ] || { echo "vm: node not Ready after $1 s" >&2; vm_ssh "$VM_KEY" 'journalctl -u kinglet --no-pager | tail -n 40' >&2; return 1; }
    sleep 1
  done
}

# vm_wait_heartbeat_after NODE SINCE SECONDS: prints the time of NODE's
# first Ready heartbeat later than SINCE (Unix seconds): after a reboot,
# the first Ready status of the new boot (the API still shows the old
# boot's Ready until the grace period ends).
vm_wait_heartbeat_after() {
  local deadline=$(( $(date +%s) + $3 )) hb
  while :; do
    hb=$(kubectl get node "$1" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status} {.status.conditions[?(@.type=="Ready")].lastHeartbeatTime}' 2>/dev/null)
    if [ "${hb%% *}" = True ] && [ "$(date -d "${hb#* }" +%s)" -gt "$2" ]; then
      echo "${hb#* }"
      return 0
    fi
    [ "$(date +%s)" -lt "$deadline" ] || { echo "vm: no Ready heartbeat of $1 after $3 s ($hb)" >&2; return 1; }
    sleep 1
  done
}

# vm_since_boot UNIT: the seconds from boot (kernel start) to UNIT active.
vm_since_boot() {
  vm_ssh "$VM_KEY" "systemctl show -p ActiveEnterTimestampMonotonic --value $1" |
    awk '{printf "%.1f", $1 / 1000000}'
}

# vm_uptime: the guest's seconds since boot, now.
vm_uptime() {
  vm_ssh "$VM_KEY" 'cut -d" " -f1 /proc/uptime'
}

# vm_wait_guest_pod_running NAME UID SECONDS: until `kinglet pods ls` in the
# guest (what an operator without the control plane sees) says Running and
# a process of the pod runs.
vm_wait_guest_pod_running() {
  local deadline=$(( $(date +%s) + $3 ))
  until vm_ssh "$VM_KEY" "kinglet pods ls" 2>/dev/null | awk -v p="$1" '$2 == p' | grep -q Running &&
    vm_guest_pod_exec "$2" true 2>/dev/null; do
    [ "$(date +%s)" -lt "$deadline" ] || {
      echo "vm: $1 not Running in the guest after $3 s" >&2
      vm_ssh "$VM_KEY" 'kinglet pods ls; journalctl -b -u kinglet --no-pager | tail -n 60' >&2
      return 1
    }
    sleep 1
  done
}

# vm_guest_pod_exec UID CMD...: CMD in the mount namespace of a process of
# pod UID, found through its cgroup (no apiserver needed): the first of the
# pod's processes where it succeeds (not every one is a container's).
vm_guest_pod_exec() {
  local uid=$1; shift
  vm_ssh "$VM_KEY" "d=\$(find /sys/fs/cgroup -type d \( -name '*${uid//-/_}*' -o -name '*$uid*' \) | head -n1)
    [ -n \"\$d\" ] || { echo 'no cgroup for pod $uid' >&2; exit 1; }
    for pid in \$(cat \$d/cgroup.procs \$d/*/cgroup.procs 2>/dev/null); do
      nsenter -t \$pid -m -- $* 2>/dev/null && exit 0
    done
    echo 'no process of pod $uid runs: $*' >&2; exit 1"
}
