#!/usr/bin/env bash
# Builds the upstream node-conformance binaries at the release of the test
# control plane (tests/cluster/go.mod): e2e.test, the ginkgo CLI at the
# version k8s.io/kubernetes pins, agnhost, nnp (the nonewprivs image's
# program) and, asked, sample-apiserver. Cached outside the repo like the control plane:
#   ${KINGLET_CACHE_DIR:-/var/cache/kinglet}/conformance-<version>-<key>/
# Prints that directory last. Builds in a copy of go.mod/go.sum, so the
# repo's files and the control plane's cache key stay untouched.
set -euo pipefail
cd "$(dirname "$0")/../cluster"
cluster_dir=$(pwd)
recipe=1
version=$(awk '/^require k8s.io\/kubernetes/ {print $3}' go.mod)
agnhost_version=$(cat "$(go env GOMODCACHE)/k8s.io/kubernetes@$version/test/images/agnhost/VERSION" 2>/dev/null || echo 2.66.1)
key=$( (cat go.mod go.sum; echo "conformance $recipe") | sha256sum | cut -c1-16)
out=${KINGLET_CACHE_DIR:-/var/cache/kinglet}/conformance-$version-$key
mkdir -p "$out"
tmp=$(mktemp -d "$out/.build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
cp go.mod go.sum "$tmp/"
export CGO_ENABLED=0 GOFLAGS=-mod=mod
# With --sample-apiserver, the aggregator spec's extension apiserver too
# (its own module, at the same release; the full run wants it, the
# subsets do not; added to the cache dir on its own, so an older cache
# keeps its e2e.test).
if [ "${1:-}" = --sample-apiserver ] && [ ! -x "$out/sample-apiserver" ]; then
  echo "conformance: building sample-apiserver ${version/v1/v0}" >&2
  (cd "$tmp" && go get "k8s.io/sample-apiserver@${version/v1/v0}" >&2 &&
    nice go build -trimpath -ldflags "-s -w" -o "$tmp/sample-apiserver" k8s.io/sample-apiserver)
  mv "$tmp/sample-apiserver" "$out/sample-apiserver"
  cp go.mod go.sum "$tmp/"
fi
if [ -x "$out/e2e.test" ] && [ -x "$out/ginkgo" ] && [ -x "$out/agnhost" ] && [ -x "$out/nnp" ]; then
  echo "$out"
  exit 0
fi
cat > "$tmp/tools.go" <<'GO'
//go:build tools

package cluster

import (
	_ "github.com/onsi/ginkgo/v2/ginkgo"
	_ "k8s.io/kubernetes/test/e2e"
	_ "k8s.io/kubernetes/test/images/agnhost"
	_ "k8s.io/kubernetes/test/images/nonewprivs"
)
GO
cd "$tmp"
# shellcheck source=../cluster/lib.sh
. "$cluster_dir/lib.sh"
ld=$(release_ldflags "$version")
echo "conformance: building e2e.test $version (long the first time)" >&2
nice go test -c -trimpath -ldflags "$ld" -o "$tmp/e2e.test" k8s.io/kubernetes/test/e2e
nice go build -trimpath -ldflags "-s -w" -o "$tmp/ginkgo" github.com/onsi/ginkgo/v2/ginkgo
nice go build -trimpath -ldflags "-s -w -X 'main.Version=$agnhost_version'" -o "$tmp/agnhost" k8s.io/kubernetes/test/images/agnhost
nice go build -trimpath -ldflags "-s -w" -o "$tmp/nnp" k8s.io/kubernetes/test/images/nonewprivs
echo "$agnhost_version" > "$tmp/agnhost.version"
for f in e2e.test ginkgo agnhost nnp agnhost.version; do mv "$tmp/$f" "$out/$f"; done
echo "$out"
