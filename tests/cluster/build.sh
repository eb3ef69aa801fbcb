#!/usr/bin/env bash
# Builds the loopback control plane (etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler) from the Go modules pinned in this folder, once. The binaries are
# cached outside the repository, keyed by the content of the module files and of
# this script, so a second run (or CI on the same machine) costs nothing.
# Prints the bin directory as its last line.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
k8s_version=$(awk '/^require k8s.io\/kubernetes/ {print $3}' "$here/go.mod")
# Bump when the build recipe below changes in a way that changes the binaries.
recipe=1
key=$( (cat "$here/go.mod" "$here/go.sum" "$here/etcd/go.mod" "$here/etcd/go.sum"; echo "$recipe") | sha256sum | cut -c1-16)
cache=${KINGLET_CACHE_DIR:-/var/cache/kinglet}/cluster-$k8s_version-$key
bin=$cache/bin
want=(etcd kube-apiserver kube-controller-manager kube-scheduler)
have=1
for b in "${want[@]}"; do [ -x "$bin/$b" ] || have=0; done
if [ "$have" = 1 ]; then echo "$bin"; exit 0; fi

export CGO_ENABLED=0 GOFLAGS=-mod=mod
mkdir -p "$cache"
tmp=$(mktemp -d "$cache/.build.XXXXXX")
chmod 755 "$tmp"
trap 'rm -rf "$tmp"' EXIT
start=$(date +%s)

# Version stamps as the upstream release build sets them, so `kube-apiserver
# --version` and /version report the real release.
commit=$(cd "$here" && go mod download -json "k8s.io/kubernetes@$k8s_version" |
  sed -n 's/.*"Hash": "\([0-9a-f]*\)".*/\1/p' | head -n1)
minor=$(echo "$k8s_version" | cut -d. -f2)
pkg=k8s.io/component-base/version
ldflags="-s -w"
for p in "$pkg" k8s.io/client-go/pkg/version; do
  ldflags+=" -X $p.gitVersion=$k8s_version -X $p.gitMajor=1 -X $p.gitMinor=$minor"
  ldflags+=" -X $p.gitCommit=${commit:-unknown} -X $p.gitTreeState=clean"
  ldflags+=" -X $p.buildDate=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
done

echo "building etcd ..." >&2
(cd "$here/etcd" && go build -trimpath -ldflags "-s -w" -o "$tmp/etcd" go.etcd.io/etcd/server/v3)
echo "building kubernetes $k8s_version control plane (slow the first time) ..." >&2
(cd "$here" && go build -trimpath -ldflags "$ldflags" -o "$tmp/" \
  k8s.io/kubernetes/cmd/kube-apiserver \
  k8s.io/kubernetes/cmd/kube-controller-manager \
  k8s.io/kubernetes/cmd/kube-scheduler)
rm -rf "$bin"
mv "$tmp" "$bin"
trap - EXIT
echo "built in $(( $(date +%s) - start )) s" >&2
echo "$bin"
