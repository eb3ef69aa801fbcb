#!/usr/bin/env bash
# Builds the CNI plugins kinglet's default conflist uses (bridge,
# host-local, portmap, loopback), static (CGO_ENABLED=0), for a Debian
# ARCH (amd64, arm64, armhf), from the Go module
# github.com/containernetworking/plugins at the version below; cached
# outside the repo. Prints the directory that holds them.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../common/arch.sh" "${1:-}"
VERSION=v1.9.1
case $deb_arch in
  amd64) goarch=amd64 goarm= ;;
  arm64) goarch=arm64 goarm= ;;
  armhf) goarch=arm goarm=7 ;;
esac
cache=${KINGLET_CACHE:-/var/cache/kinglet}
out=$cache/cni-plugins-$VERSION-$deb_arch
plugins=(bridge host-local portmap loopback)
if [ ! -x "$out/loopback" ]; then
  mod=$cache/cni-plugins-$VERSION-src
  mkdir -p "$mod"
  if [ ! -f "$mod/go.sum" ]; then
    (cd "$mod" && cat >go.mod <<MOD
module kinglet.local/cni
go 1.24
require github.com/containernetworking/plugins $VERSION
MOD
      {
        printf '//go:build tools\n\npackage cni\n\nimport (\n'
        for p in main/bridge main/loopback ipam/host-local meta/portmap; do
          printf '\t_ "github.com/containernetworking/plugins/plugins/%s"\n' "$p"
        done
        printf ')\n'
      } >tools.go
      go mod tidy >&2)
  fi
  rm -rf "$out.part"
  mkdir -p "$out.part"
  for p in "${plugins[@]}"; do
    case $p in host-local) pkg=ipam/host-local ;; portmap) pkg=meta/portmap ;; *) pkg=main/$p ;; esac
    (cd "$mod" && CGO_ENABLED=0 GOOS=linux GOARCH=$goarch GOARM=$goarm \
      go build -trimpath -ldflags '-s -w' -o "$out.part/$p" "github.com/containernetworking/plugins/plugins/$pkg")
  done
  rm -rf "$out"
  mv "$out.part" "$out"
fi
echo "$out"
