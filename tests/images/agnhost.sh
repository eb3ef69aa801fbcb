#!/usr/bin/env bash
# Builds, offline, an OCI archive of upstream's test image agnhost: the
# binary built from the Go module k8s.io/kubernetes/test/images/agnhost at
# the release of the test control plane (cached outside the repo), on a
# busybox rootfs (Debian's busybox-static; upstream's base is Debian too):
#   agnhost.sh OUT.tar [NAME]        (NAME: kinglet.test/agnhost:<version>)
# ENTRYPOINT /agnhost, CMD pause, as upstream's Dockerfile.
set -euo pipefail
out=${1:?usage: agnhost.sh OUT.tar [NAME]}
here=$(cd "$(dirname "$0")" && pwd)
mod=$here/../cluster
version=$(awk '/^require k8s.io\/kubernetes/ {print $3}' "$mod/go.mod")
src="$(go env GOMODCACHE)/k8s.io/kubernetes@$version/test/images/agnhost"
agnhost_version=$(cat "$src/VERSION" 2>/dev/null || echo 2.66.1)
name=${2:-kinglet.test/agnhost:$agnhost_version}
key=$( (cat "$mod/go.mod" "$mod/go.sum"; echo "agnhost 1") | sha256sum | cut -c1-16)
cache=${KINGLET_CACHE_DIR:-/var/cache/kinglet}/agnhost-$agnhost_version-$key
if [ ! -x "$cache/agnhost" ]; then
  mkdir -p "$cache"
  tmp=$(mktemp -d "$cache/.build.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  cp "$mod/go.mod" "$mod/go.sum" "$tmp/"
  printf '//go:build tools\n\npackage cluster\n\nimport _ "k8s.io/kubernetes/test/images/agnhost"\n' > "$tmp/tools.go"
  echo "agnhost: building $agnhost_version (once)" >&2
  (cd "$tmp" && CGO_ENABLED=0 GOFLAGS=-mod=mod nice go build -trimpath \
    -ldflags "-s -w -X 'main.Version=$agnhost_version'" -o "$tmp/agnhost" k8s.io/kubernetes/test/images/agnhost)
  mv "$tmp/agnhost" "$cache/agnhost"
fi
work=$(mktemp -d)
trap 'rm -rf "$work" ${tmp:+"$tmp"}' EXIT
umoci init --layout "$work/layout"
umoci new --image "$work/layout:img"
umoci unpack --image "$work/layout:img" "$work/bundle" >/dev/null
r=$work/bundle/rootfs
mkdir -p "$r/bin" "$r/etc" "$r/tmp"
chmod 1777 "$r/tmp"
cp /bin/busybox "$r/bin/busybox"
for app in $(/bin/busybox --list); do
  [ "$app" = busybox ] || ln -sf busybox "$r/bin/$app"
done
cp "$cache/agnhost" "$r/agnhost"
cp "$src/porter/localhost.crt" "$src/porter/localhost.key" "$r/"
printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n' > "$r/etc/passwd"
printf 'root:x:0:\nnogroup:x:65534:\n' > "$r/etc/group"
umoci repack --image "$work/layout:img" "$work/bundle" >/dev/null
umoci config --image "$work/layout:img" --config.env PATH=/bin \
  --config.entrypoint /agnhost --config.cmd pause
skopeo --insecure-policy copy --quiet "oci:$work/layout:img" "oci-archive:$out:$name"
echo "$out"
