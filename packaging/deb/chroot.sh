#!/usr/bin/env bash
# Prints the path of a minimal Debian bookworm root (debootstrap
# --variant=minbase) for testing the package in, made once and cached
# outside the repo (/var/cache/kinglet/chroot-bookworm). Tests mount an
# overlay over it, so it stays pristine.
set -euo pipefail
dir=${KINGLET_CHROOT:-/var/cache/kinglet/chroot-bookworm}
if [ ! -x "$dir/usr/bin/dpkg" ]; then
  command -v debootstrap >/dev/null || {
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap >/dev/null
  }
  rm -rf "$dir.part"
  debootstrap --variant=minbase bookworm "$dir.part" http://deb.debian.org/debian >&2
  rm -rf "$dir"
  mv "$dir.part" "$dir"
fi
echo "$dir"
