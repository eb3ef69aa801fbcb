#!/usr/bin/env bash
# Stops what containerd-up.sh started in DIR and removes it: containers are
# killed and deleted (their shims exit), containerd stops, mounts under DIR
# go, the bridge goes. Touches nothing else.
#   containerd-down.sh [DIR]
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
. "$here/lib.sh"
dir=$(realpath -m "${1:-$CLUSTER_DIR/containerd}")
sock=$dir/containerd.sock
cni_dir=$(cat "$dir/cni-conf-dir" 2>/dev/null || echo "$dir/net.d")
bridge=$(cat "$cni_dir"/*.conflist 2>/dev/null | tr -d '\n ' | grep -o '"bridge":"[^"]*"' | head -1 | cut -d'"' -f4)
# The sandboxes' netns and the pods' cgroups, released once their
# processes are gone.
containerd_pod_state "$sock"
if [ -S "$sock" ]; then
  c="ctr --address $sock -n k8s.io"
  for t in $($c tasks ls -q 2>/dev/null); do
    $c tasks kill -s SIGKILL "$t" >/dev/null 2>&1
  done
  for t in $($c tasks ls -q 2>/dev/null); do
    for _ in $(seq 1 30); do
      $c tasks delete "$t" >/dev/null 2>&1 && break
      sleep 0.1
    done
  done
  for ctr_id in $($c containers ls -q 2>/dev/null); do
    $c containers rm "$ctr_id" >/dev/null 2>&1
  done
fi
if [ -f "$dir/containerd.pid" ]; then
  pid=$(cat "$dir/containerd.pid")
  if grep -q containerd "/proc/$pid/cmdline" 2>/dev/null; then
    kill "$pid" 2>/dev/null
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null
  fi
fi
for cg in "${cgroups[@]}"; do
  for base in /sys/fs/cgroup /sys/fs/cgroup/*; do
    [ -d "$base$cg" ] && rmdir "$base$cg" 2>/dev/null
  done
done
for ns in "${netns[@]}"; do
  umount "$ns" 2>/dev/null
  rm -f "$ns"
done
# Shims of this containerd (their -address names its socket), if any remain.
pkill -9 -f -- "-address $sock" 2>/dev/null
awk -v d="$dir/" 'index($5, d) == 1 {print $5}' /proc/self/mountinfo | sort -r |
  while read -r m; do umount -l "$m" 2>/dev/null; done
[ -n "$bridge" ] && ip link del "$bridge" 2>/dev/null
rm -rf "$dir"
exit 0
