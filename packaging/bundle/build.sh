#!/usr/bin/env bash
# Builds the air-gap bundle for ARCH (amd64, arm64, armhf):
# target/bundle/kinglet-<version>-<arch>.tar.gz, one directory holding
#   kinglet                  the static binary (cross/build.sh)
#   kinglet.service          the systemd unit
#   config.yaml              the default config (CIS defaults)
#   10-kinglet.conflist      the default CNI network (bridge kinglet0)
#   kinglet.network          systemd-networkd leaves that network alone
#   cni/                     static CNI plugins bridge, host-local, portmap,
#                            loopback (packaging/bundle/cni.sh, from the Go
#                            module containernetworking/plugins)
#   images/                  OCI or docker-save archives, imported by kinglet
#                            at its first start (KINGLET_BUNDLE_IMAGES)
#   manifests/               static pods to run (KINGLET_BUNDLE_MANIFESTS)
#   install.sh uninstall.sh  README.md
# KINGLET_BIN=FILE packs that binary instead of building one.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/../.."
. packaging/common/arch.sh "${1:-}"
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n1)
bin=${KINGLET_BIN:-}
if [ -z "$bin" ]; then
  cross/build.sh "$rust_target" >&2
  bin=target/$rust_target/release/kinglet
fi
cni=$(packaging/bundle/cni.sh "$deb_arch")
name=kinglet-$version-$deb_arch
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
d=$work/$name
install -d "$d/cni" "$d/images" "$d/manifests"
install -m 755 "$bin" "$d/kinglet"
install -m 644 systemd/kinglet.service "$d/kinglet.service"
install -m 600 packaging/config.yaml "$d/config.yaml"
install -m 644 packaging/common/10-kinglet.conflist "$d/10-kinglet.conflist"
install -m 644 packaging/common/kinglet.network "$d/kinglet.network"
install -m 755 "$cni"/* "$d/cni/"
install -m 755 packaging/bundle/install.sh packaging/bundle/uninstall.sh "$d/"
install -m 644 packaging/bundle/README.md "$d/README.md"
for f in ${KINGLET_BUNDLE_IMAGES:-}; do install -m 644 "$f" "$d/images/"; done
for f in ${KINGLET_BUNDLE_MANIFESTS:-}; do install -m 600 "$f" "$d/manifests/"; done
mkdir -p target/bundle
out=target/bundle/$name.tar.gz
tar -C "$work" --owner=0 --group=0 -czf "$out.part" "$name"
mv "$out.part" "$out"
echo "$out: $(stat -c %s "$out") bytes"
