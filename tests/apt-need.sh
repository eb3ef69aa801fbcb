#!/usr/bin/env bash
# Installs, from Debian's packages, those of PKG... not installed yet.
#   tests/apt-need.sh PKG...
set -euo pipefail
need=()
for p in "$@"; do
  dpkg -s "$p" >/dev/null 2>&1 || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
  echo "apt-get install ${need[*]}" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
