#!/usr/bin/env bash
# Builds metrics-server from the Go module pinned in metrics-server/ (the
# cluster add-on `kubectl top` reads), once; cached outside the repository,
# keyed by the module files and this script. Prints the binary's path.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
mod=$here/metrics-server
version=$(awk '/^require sigs.k8s.io\/metrics-server/ {print $3}' "$mod/go.mod")
key=$( (cat "$mod/go.mod" "$mod/go.sum" "$0") | sha256sum | cut -c1-16)
cache=${KINGLET_CACHE_DIR:-/var/cache/kinglet}/metrics-server-$version-$key
if [ ! -x "$cache/metrics-server" ]; then
  mkdir -p "$cache"
  echo "building metrics-server $version ..." >&2
  start=$(date +%s)
  (cd "$mod" && CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath \
    -ldflags "-s -w -X sigs.k8s.io/metrics-server/pkg/version.gitVersion=$version" \
    -o "$cache/metrics-server.tmp" sigs.k8s.io/metrics-server/cmd/metrics-server)
  mv "$cache/metrics-server.tmp" "$cache/metrics-server"
  echo "built in $(( $(date +%s) - start )) s" >&2
fi
echo "$cache/metrics-server"
