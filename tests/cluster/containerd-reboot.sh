#!/usr/bin/env bash
# What a reboot takes from the containerd that containerd-up.sh started in
# DIR, and only that: every process (containerd, its shims, the
# containers), every mount under DIR, the sandboxes' network namespaces
# (containerd keeps them under /run/netns, a tmpfs), the pods' cgroups and
# containerd's state dir (its /run). Its root dir — the metadata of
# sandboxes and containers, the images — stays, as on a disk after a power
# cut. Start it again with containerd-up.sh DIR.
#   containerd-reboot.sh DIR
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
. "$here/lib.sh"
dir=$(realpath -m "$1")
sock=$dir/containerd.sock
containerd_pod_state "$sock"
# The power goes: containerd, its shims and every process in the pods.
[ -f "$dir/containerd.pid" ] && kill -9 "$(cat "$dir/containerd.pid")" 2>/dev/null
pkill -9 -f -- "-address $sock" 2>/dev/null
for _ in $(seq 1 50); do
  left=0
  for cg in "${cgroups[@]}"; do
    for base in /sys/fs/cgroup /sys/fs/cgroup/*; do
      [ -d "$base$cg" ] || continue
      while read -r p; do
        [ -n "$p" ] && kill -9 "$p" 2>/dev/null && left=1
      done < <(find "$base$cg" -name cgroup.procs -exec cat {} + 2>/dev/null)
    done
  done
  [ "$left" = 0 ] && break
  sleep 0.1
done
awk -v d="$dir/" 'index($5, d) == 1 {print $5}' /proc/self/mountinfo | sort -r |
  while read -r m; do umount -l "$m" 2>/dev/null; done
for ns in "${netns[@]}"; do
  umount -l "$ns" 2>/dev/null
  rm -f "$ns"
done
for cg in "${cgroups[@]}"; do
  for base in /sys/fs/cgroup /sys/fs/cgroup/*; do
    [ -d "$base$cg" ] && find "$base$cg" -depth -type d -exec rmdir {} \; 2>/dev/null
  done
done
rm -rf "$dir/state" "$sock" "$sock.ttrpc"
exit 0
