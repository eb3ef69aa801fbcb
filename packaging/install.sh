#!/usr/bin/env bash
# Installs kinglet on this machine: the binary, the systemd unit and, if none
# exists, the default config. An existing config is never overwritten; the
# previous binary and config are kept as *.bak for rollback (README: "Upgrade
# and rollback").
#   packaging/install.sh BINARY [KUBECONFIG]
# DESTDIR=DIR installs under DIR instead of / (packaging, and the test of
# the installed files' modes); systemd is then left alone.
set -euo pipefail
d=${DESTDIR:-}
here=$(cd "$(dirname "$0")" && pwd)
bin=${1:?usage: install.sh BINARY [KUBECONFIG]}
kubeconfig=${2:-}
"$bin" --version >/dev/null

install -d -m 755 "$d"/usr/bin "$d"/etc/systemd/system "$d"/usr/share/doc/kinglet
install -d -m 700 "$d"/etc/kinglet "$d"/etc/kinglet/manifests "$d"/var/lib/kinglet
[ -e "$d"/usr/bin/kinglet ] && cp -p "$d"/usr/bin/kinglet "$d"/usr/bin/kinglet.bak
install -m 755 "$bin" "$d"/usr/bin/kinglet.new && mv "$d"/usr/bin/kinglet.new "$d"/usr/bin/kinglet
install -m 644 "$here/../systemd/kinglet.service" "$d"/etc/systemd/system/kinglet.service
install -m 644 "$here/../README.md" "$d"/usr/share/doc/kinglet/README.md
(cd "$here/.." && find docs -type f -exec install -D -m 644 {} "$d/usr/share/doc/kinglet/{}" \;)
if [ -e "$d"/etc/kinglet/config.yaml ]; then
  cp -p "$d"/etc/kinglet/config.yaml "$d"/etc/kinglet/config.yaml.bak
else
  install -m 600 -o root -g root "$here/config.yaml" "$d"/etc/kinglet/config.yaml
fi
if [ -n "$kubeconfig" ]; then
  install -m 600 -o root -g root "$kubeconfig" "$d"/etc/kinglet/kubeconfig
fi
if [ -z "$d" ] && command -v systemctl >/dev/null && [ -d /run/systemd/system ]; then
  systemctl daemon-reload
  echo "installed; start with: systemctl enable --now kinglet"
else
  echo "installed (no systemd running here)"
fi
