#!/usr/bin/env bash
# Installs kinglet on this machine: the binary, the systemd unit and, if none
# exists, the default config. An existing config is never overwritten; the
# previous binary and config are kept as *.bak for rollback (README: "Upgrade
# and rollback").
#   packaging/install.sh BINARY [KUBECONFIG]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bin=${1:?usage: install.sh BINARY [KUBECONFIG]}
kubeconfig=${2:-}
"$bin" --version >/dev/null

install -d -m 755 /usr/bin /etc/systemd/system /usr/share/doc/kinglet
install -d -m 700 /etc/kinglet /etc/kinglet/manifests /var/lib/kinglet
[ -e /usr/bin/kinglet ] && cp -p /usr/bin/kinglet /usr/bin/kinglet.bak
install -m 755 "$bin" /usr/bin/kinglet.new && mv /usr/bin/kinglet.new /usr/bin/kinglet
install -m 644 "$here/../systemd/kinglet.service" /etc/systemd/system/kinglet.service
install -m 644 "$here/../README.md" /usr/share/doc/kinglet/README.md
if [ -e /etc/kinglet/config.yaml ]; then
  cp -p /etc/kinglet/config.yaml /etc/kinglet/config.yaml.bak
else
  install -m 600 -o root -g root "$here/config.yaml" /etc/kinglet/config.yaml
fi
if [ -n "$kubeconfig" ]; then
  install -m 600 -o root -g root "$kubeconfig" /etc/kinglet/kubeconfig
fi
if command -v systemctl >/dev/null && [ -d /run/systemd/system ]; then
  systemctl daemon-reload
  echo "installed; start with: systemctl enable --now kinglet"
else
  echo "installed (no systemd running here)"
fi
