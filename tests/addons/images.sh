#!/usr/bin/env bash
# Builds, offline, the images of the add-ons test and pushes them to the
# registry at REGISTRY:
#   images.sh ADDONS_DIR METRICS_SERVER REGISTRY
# (ADDONS_DIR: what build.sh printed; METRICS_SERVER: the binary
# tests/cluster/build-metrics-server.sh made.)
#  - kube-proxy: the static kube-proxy and the host's iptables (its
#    xtables multi-binary in the host's mode, nft or legacy, with its
#    extensions and libraries). Upstream's distroless-iptables image carries
#    both modes and picks with iptables-wrapper; the host's own mode is
#    what that wrapper would pick here.
#  - coredns, metrics-server: the static binary alone, as upstream's
#    distroless images.
#  - client: busybox with curl, the pod that resolves names and connects.
set -euo pipefail
addons=${1:?usage: images.sh ADDONS_DIR METRICS_SERVER REGISTRY}
metrics_server=${2:?usage: images.sh ADDONS_DIR METRICS_SERVER REGISTRY}
reg=${3:?usage: images.sh ADDONS_DIR METRICS_SERVER REGISTRY}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# shellcheck source=../images/lib.sh
. "$(dirname "$0")/../images/lib.sh"

fill_kube_proxy() {
  local r=$1 mode multi x
  rootfs "$r"
  mkdir -p "$r/usr/local/bin" "$r/usr/sbin" "$r/run" "$r/var/lib/kube-proxy"
  cp "$addons/kube-proxy" "$r/usr/local/bin/kube-proxy"
  mode=$(iptables -V | grep -o 'nf_tables\|legacy' || echo legacy)
  multi=xtables-legacy-multi
  [ "$mode" = nf_tables ] && multi=xtables-nft-multi
  with_libs "$r" "/usr/sbin/$multi" "/usr/sbin/$multi"
  for x in iptables iptables-save iptables-restore ip6tables ip6tables-save ip6tables-restore; do
    ln -sf "$multi" "$r/usr/sbin/$x"
  done
  # The match and target extensions are loaded at run time (dlopen), so
  # ldd of the binary does not name them.
  local ext
  # (Resolved: where /lib is a link to /usr/lib, iptables looks under
  # /usr/lib, and in the image /lib is a directory of its own.)
  ext=$(readlink -f "$(dirname "$(ldd "/usr/sbin/$multi" | awk '/libxtables/ {print $3}')")/xtables")
  mkdir -p "$r$ext"
  cp -L "$ext"/*.so "$r$ext/"
  for x in "$ext"/*.so; do copy_libs "$r" "$x"; done
  [ -e /etc/protocols ] && cp /etc/protocols "$r/etc/"
  # The binary runs and finds an extension (as kube-proxy's first listing
  # of the nat table needs them).
  chroot "$r" /usr/sbin/iptables -m comment -h >/dev/null
}
fill_coredns() {
  mkdir -p "$1/etc"
  cp "$addons/coredns" "$1/coredns"
}
fill_metrics_server() {
  mkdir -p "$1/etc" "$1/tmp"
  chmod 1777 "$1/tmp"
  cp "$metrics_server" "$1/metrics-server"
}
fill_client() {
  rootfs "$1"
  with_libs "$1" /usr/bin/curl /usr/bin/curl
}

k8s=$(basename "$addons" | cut -d- -f2)
image "kube-proxy:$k8s" fill_kube_proxy --config.entrypoint /usr/local/bin/kube-proxy
image "coredns/coredns:$(cat "$addons/coredns.version")" fill_coredns --config.entrypoint /coredns
image "metrics-server/metrics-server:$(basename "$(dirname "$metrics_server")" | cut -d- -f3)" \
  fill_metrics_server --config.entrypoint /metrics-server
image "kinglet-test/client:1" fill_client --config.cmd sh
