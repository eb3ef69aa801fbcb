#!/bin/sh
# Installs this kinglet bundle offline (as root), from its own directory:
#   /usr/bin/kinglet, the unit in /etc/systemd/system, /etc/kinglet/config.yaml
#   (kept if present), the static pods in manifests/ into
#   /etc/kinglet/manifests, the CNI plugins into /opt/cni/bin and the
#   default conflist into /etc/cni/net.d (each only where none is there),
#   /etc/systemd/network/05-kinglet.network (networkd leaves the pod
#   network alone),
#   and images/ into kinglet's import dir, read at its next start.
# An upgrade keeps the previous binary as /usr/bin/kinglet.bak (rollback:
# uninstall.sh --rollback) and puts the new one on trial in a running
# agent (`kinglet upgrade --installed`: rolled back by itself unless it
# stays healthy), which stops no pod. Starts kinglet through systemd when
# systemd runs.
set -eu
src=$(cd "$(dirname "$0")" && pwd)
"$src/kinglet" --version >/dev/null
install -d -m 755 /usr/bin /etc/systemd/system /etc/systemd/network /opt/cni/bin /etc/cni/net.d /var/log/pods
install -d -m 700 /etc/kinglet /etc/kinglet/manifests /var/lib/kinglet /var/lib/kinglet/images/import
if [ -e /usr/bin/kinglet ]; then cp -p /usr/bin/kinglet /usr/bin/kinglet.bak; fi
install -m 755 "$src/kinglet" /usr/bin/kinglet.new
mv /usr/bin/kinglet.new /usr/bin/kinglet
install -m 644 "$src/kinglet.service" /etc/systemd/system/kinglet.service
[ -e /etc/kinglet/config.yaml ] || install -m 600 "$src/config.yaml" /etc/kinglet/config.yaml
for f in "$src"/manifests/*; do
  [ -e "$f" ] && install -m 600 "$f" /etc/kinglet/manifests/
done
for p in "$src"/cni/*; do
  [ -e "/opt/cni/bin/$(basename "$p")" ] || install -m 755 "$p" /opt/cni/bin/
done
if ! ls /etc/cni/net.d/*.conflist /etc/cni/net.d/*.conf >/dev/null 2>&1; then
  install -m 644 "$src/10-kinglet.conflist" /etc/cni/net.d/10-kinglet.conflist
fi
install -m 644 "$src/kinglet.network" /etc/systemd/network/05-kinglet.network
for i in "$src"/images/*; do
  [ -e "$i" ] || continue
  # Renamed into place: the import dir only takes whole files.
  install -m 600 "$i" "/var/lib/kinglet/images/import/.$(basename "$i").part"
  mv "/var/lib/kinglet/images/import/.$(basename "$i").part" "/var/lib/kinglet/images/import/$(basename "$i")"
done
if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
  systemctl daemon-reload
  if systemctl -q is-active systemd-networkd.service; then networkctl reload >/dev/null 2>&1 || true; fi
  systemctl enable kinglet.service >/dev/null 2>&1 || true
  if systemctl is-active -q kinglet.service && [ -e /usr/bin/kinglet.bak ]; then
    # The new binary on trial: committed once healthy, else the unit's
    # guard puts the previous one back (docs/upgrade.md).
    if ! /usr/bin/kinglet upgrade --installed /usr/bin/kinglet.bak --install-path /usr/bin/kinglet \
      --root-dir /var/lib/kinglet; then
      echo "kinglet: the new binary did not stay healthy and was rolled back (journalctl -u kinglet)" >&2
      exit 1
    fi
  elif systemctl is-active -q kinglet.service; then
    systemctl restart kinglet.service
  else
    systemctl start kinglet.service
  fi
  echo "kinglet $("/usr/bin/kinglet" --version | head -n1): installed and started (journalctl -u kinglet)"
else
  echo "kinglet installed (no systemd here): run /usr/bin/kinglet --config /etc/kinglet/config.yaml"
fi
