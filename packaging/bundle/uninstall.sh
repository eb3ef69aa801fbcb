#!/bin/sh
# Removes what install.sh installed, or rolls back an upgrade:
#   uninstall.sh              stop kinglet, remove the binary and unit (the
#                             config, state and images stay: --purge removes
#                             /etc/kinglet and /var/lib/kinglet too, unless
#                             pods still have mounts under it)
#   uninstall.sh --rollback   put the previous binary back and restart
# The CNI plugins, conflist and 05-kinglet.network stay (other agents may
# use them; pods may still run on that network).
set -eu
systemd=false
if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then systemd=true; fi
case "${1:-}" in
  --rollback)
    [ -e /usr/bin/kinglet.bak ] || { echo "uninstall.sh: no /usr/bin/kinglet.bak to roll back to" >&2; exit 1; }
    mv /usr/bin/kinglet.bak /usr/bin/kinglet
    if $systemd; then systemctl try-restart kinglet.service; fi
    echo "rolled back to $(/usr/bin/kinglet --version | head -n1)"
    exit 0 ;;
  "" | --purge) ;;
  *) echo "usage: uninstall.sh [--rollback | --purge]" >&2; exit 2 ;;
esac
if $systemd; then
  systemctl disable --now kinglet.service >/dev/null 2>&1 || true
fi
rm -f /usr/bin/kinglet /usr/bin/kinglet.bak /etc/systemd/system/kinglet.service
if $systemd; then systemctl daemon-reload; fi
if [ "${1:-}" = --purge ]; then
  rm -rf /etc/kinglet
  if grep -q ' /var/lib/kinglet/' /proc/self/mountinfo; then
    echo "uninstall.sh: /var/lib/kinglet kept: pods still have mounts under it" >&2
  else
    rm -rf /var/lib/kinglet
  fi
fi
echo "kinglet removed"
