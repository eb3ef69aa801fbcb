#!/usr/bin/env bash
# Builds, offline, an OCI archive of upstream's sample device plugin: the
# binary built from k8s.io/kubernetes/test/images/sample-device-plugin at
# the release of the test control plane (cached outside the repo), on a
# busybox rootfs (upstream's base is alpine):
#   sample-device-plugin.sh OUT.tar [NAME]
#   (NAME: kinglet.test/sample-device-plugin:<version>)
#   sample-device-plugin.sh --build-only   (the binary into the cache only)
# ENTRYPOINT as upstream's Dockerfile: /sampledeviceplugin -alsologtostderr.
set -euo pipefail
out=${1:?usage: sample-device-plugin.sh OUT.tar [NAME]}
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
. "$here/lib.sh"
mod=$here/../cluster
version=$(awk '/^require k8s.io\/kubernetes/ {print $3}' "$mod/go.mod")
pkg=k8s.io/kubernetes/test/images/sample-device-plugin
src="$(go env GOMODCACHE)/k8s.io/kubernetes@$version/test/images/sample-device-plugin"
plugin_version=$(cat "$src/VERSION" 2>/dev/null || echo 1.8)
name=${2:-kinglet.test/sample-device-plugin:$plugin_version}
key=$( (cat "$mod/go.mod" "$mod/go.sum"; echo "sample-device-plugin 1") | sha256sum | cut -c1-16)
cache=${KINGLET_CACHE_DIR:-/var/cache/kinglet}/sample-device-plugin-$plugin_version-$key
if [ ! -x "$cache/sampledeviceplugin" ]; then
  mkdir -p "$cache"
  tmp=$(mktemp -d "$cache/.build.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  cp "$mod/go.mod" "$mod/go.sum" "$tmp/"
  printf '//go:build tools\n\npackage cluster\n\nimport _ "%s"\n' "$pkg" > "$tmp/tools.go"
  echo "sample-device-plugin: building $plugin_version (once)" >&2
  (cd "$tmp" && CGO_ENABLED=0 GOFLAGS=-mod=mod nice go build -trimpath -ldflags "-s -w" \
    -o "$tmp/sampledeviceplugin" "$pkg")
  mv "$tmp/sampledeviceplugin" "$cache/sampledeviceplugin"
fi
[ "$out" != --build-only ] || exit 0
work=$(mktemp -d)
trap 'rm -rf "$work" ${tmp:+"$tmp"}' EXIT
umoci init --layout "$work/layout"
umoci new --image "$work/layout:img"
umoci unpack --image "$work/layout:img" "$work/bundle" >/dev/null
r=$work/bundle/rootfs
rootfs "$r"
cp "$cache/sampledeviceplugin" "$r/sampledeviceplugin"
umoci repack --image "$work/layout:img" "$work/bundle" >/dev/null
umoci config --image "$work/layout:img" --config.env PATH=/bin \
  --config.entrypoint /sampledeviceplugin --config.cmd -alsologtostderr
skopeo --insecure-policy copy --quiet "oci:$work/layout:img" "oci-archive:$out:$name"
echo "$out"
