#!/usr/bin/env bash
# Builds kinglet's Debian package for ARCH (amd64, arm64, armhf) into
# target/deb/kinglet_<version>_<arch>.deb, with dpkg-deb (no cargo-deb: the
# binary is one static file, so a plain recipe says all). Contents:
#   /usr/bin/kinglet                       the static binary (cross/build.sh)
#   /usr/lib/systemd/system/kinglet.service
#   /etc/kinglet/config.yaml               conffile, mode 600, CIS defaults
#   /etc/cni/net.d/10-kinglet.conflist     conffile: bridge kinglet0, 10.88.0.0/16
#   /usr/lib/tmpfiles.d/kinglet.conf       /var/lib/kinglet 700, /var/log/pods
#   /usr/lib/systemd/network/05-kinglet.network  networkd leaves the pod network alone
#   /usr/share/doc/kinglet/                README, docs/, copyright
# KINGLET_BIN=FILE packs that binary instead of building one;
# KINGLET_DEB_VERSION overrides the version (Cargo.toml's).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/../.."
. packaging/common/arch.sh "${1:-}"
version=${KINGLET_DEB_VERSION:-$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n1)}
bin=${KINGLET_BIN:-}
if [ -z "$bin" ]; then
  cross/build.sh "$rust_target" >&2
  bin=target/$rust_target/release/kinglet
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
r=$work/root
install -D -m 755 "$bin" "$r/usr/bin/kinglet"
install -D -m 644 systemd/kinglet.service "$r/usr/lib/systemd/system/kinglet.service"
install -d -m 700 "$r/etc/kinglet"
install -m 600 packaging/config.yaml "$r/etc/kinglet/config.yaml"
install -D -m 644 packaging/common/10-kinglet.conflist "$r/etc/cni/net.d/10-kinglet.conflist"
install -D -m 644 packaging/common/kinglet.tmpfiles "$r/usr/lib/tmpfiles.d/kinglet.conf"
install -D -m 644 packaging/common/kinglet.network "$r/usr/lib/systemd/network/05-kinglet.network"
install -D -m 644 README.md "$r/usr/share/doc/kinglet/README.md"
# The pages the README links to, where its links lead.
find docs -type f -exec install -D -m 644 {} "$r/usr/share/doc/kinglet/{}" \;
install -D -m 644 packaging/deb/copyright "$r/usr/share/doc/kinglet/copyright"
install -d "$r/DEBIAN"
size_kb=$(du -sk --exclude=DEBIAN "$r" | cut -f1)
sed -e "s/@VERSION@/$version/" -e "s/@ARCH@/$deb_arch/" -e "s/@SIZE@/$size_kb/" \
  packaging/deb/control >"$r/DEBIAN/control"
printf '%s\n' /etc/kinglet/config.yaml /etc/cni/net.d/10-kinglet.conflist >"$r/DEBIAN/conffiles"
for s in preinst postinst prerm postrm; do
  install -m 755 "packaging/deb/$s" "$r/DEBIAN/$s"
done
mkdir -p target/deb
out=target/deb/kinglet_${version}_${deb_arch}.deb
dpkg-deb --root-owner-group -Zxz --build "$r" "$out" >/dev/null
echo "$out: $(stat -c %s "$out") bytes"
