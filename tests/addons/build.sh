#!/usr/bin/env bash
# Builds the cluster add-ons the add-ons test runs on a kinglet node, from
# their Go modules at the releases that match the test control plane:
# kube-proxy from k8s.io/kubernetes (tests/cluster/go.mod) and CoreDNS at
# the version kubeadm of that release deploys (tests/addons/coredns/go.mod,
# with only the plugins of Kubernetes' own Corefile). Cached outside the
# repo like the control plane:
#   ${KINGLET_CACHE_DIR:-/var/cache/kinglet}/addons-<version>-<key>/
# Prints that directory last.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cluster=$here/../cluster
recipe=1
version=$(awk '/^require k8s.io\/kubernetes/ {print $3}' "$cluster/go.mod")
key=$( (cat "$cluster/go.mod" "$cluster/go.sum" "$here/coredns/go.mod" "$here/coredns/go.sum" \
  "$here/coredns/main.go"; echo "addons $recipe") | sha256sum | cut -c1-16)
out=${KINGLET_CACHE_DIR:-/var/cache/kinglet}/addons-$version-$key
if [ -x "$out/kube-proxy" ] && [ -x "$out/coredns" ]; then
  echo "$out"
  exit 0
fi
mkdir -p "$out"
tmp=$(mktemp -d "$out/.build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
export CGO_ENABLED=0 GOFLAGS=-mod=mod
start=$(date +%s)
# kube-proxy in a copy of the control plane's module, so its go.sum (and
# the control plane's cache key) stay untouched; stamped as the release.
mkdir "$tmp/kp"
cp "$cluster/go.mod" "$cluster/go.sum" "$tmp/kp/"
printf '//go:build tools\n\npackage cluster\n\nimport _ "k8s.io/kubernetes/cmd/kube-proxy"\n' > "$tmp/kp/tools.go"
# shellcheck source=../cluster/lib.sh
. "$cluster/lib.sh"
ld=$(cd "$tmp/kp" && release_ldflags "$version")
echo "addons: building kube-proxy $version" >&2
(cd "$tmp/kp" && nice go build -trimpath -ldflags "$ld" -o "$tmp/kube-proxy" k8s.io/kubernetes/cmd/kube-proxy)
coredns_version=$(grep -o 'github.com/coredns/coredns v[0-9.]*' "$here/coredns/go.mod" | awk '{print $2}')
echo "addons: building CoreDNS $coredns_version" >&2
cp -r "$here/coredns" "$tmp/coredns-src"
(cd "$tmp/coredns-src" && nice go build -trimpath -ldflags "-s -w" -o "$tmp/coredns" .)
echo "$coredns_version" > "$tmp/coredns.version"
for f in kube-proxy coredns coredns.version; do mv "$tmp/$f" "$out/$f"; done
echo "addons: built in $(( $(date +%s) - start )) s" >&2
echo "$out"
