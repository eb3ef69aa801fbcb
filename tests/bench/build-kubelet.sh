#!/usr/bin/env bash
# Builds the upstream kubelet from the same Kubernetes Go module as the test
# control plane (tests/cluster/go.mod), once; cached outside the repository
# beside the control plane. The module is copied first: resolving the
# kubelet's extra dependencies must not touch the repository's go.sum (nor
# the control plane's cache key). Prints the kubelet's path as its last line.
set -euo pipefail
here=$(cd "$(dirname "$0")/../cluster" && pwd)
k8s_version=$(awk '/^require k8s.io\/kubernetes/ {print $3}' "$here/go.mod")
recipe=1
key=$( (cat "$here/go.mod" "$here/go.sum"; echo "kubelet $recipe") | sha256sum | cut -c1-16)
cache=${KINGLET_CACHE_DIR:-/var/cache/kinglet}/kubelet-$k8s_version-$key
if [ -x "$cache/kubelet" ]; then echo "$cache/kubelet"; exit 0; fi
export CGO_ENABLED=0 GOFLAGS=-mod=mod
mkdir -p "$cache"
tmp=$(mktemp -d "$cache/.build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
cp "$here/go.mod" "$here/go.sum" "$tmp/"
printf '//go:build tools\n\npackage cluster\n\nimport _ "k8s.io/kubernetes/cmd/kubelet"\n' > "$tmp/tools.go"
commit=$(cd "$tmp" && go mod download -json "k8s.io/kubernetes@$k8s_version" |
  sed -n 's/.*"Hash": "\([0-9a-f]*\)".*/\1/p' | head -n1)
minor=$(echo "$k8s_version" | cut -d. -f2)
ldflags="-s -w"
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldflags+=" -X $p.gitVersion=$k8s_version -X $p.gitMajor=1 -X $p.gitMinor=$minor"
  ldflags+=" -X $p.gitCommit=${commit:-unknown} -X $p.gitTreeState=clean"
done
start=$(date +%s)
echo "building the upstream kubelet $k8s_version (slow the first time) ..." >&2
(cd "$tmp" && go build -trimpath -ldflags "$ldflags" -o "$tmp/kubelet.bin" k8s.io/kubernetes/cmd/kubelet)
mv "$tmp/kubelet.bin" "$cache/kubelet"
echo "built in $(( $(date +%s) - start )) s" >&2
echo "$cache/kubelet"
