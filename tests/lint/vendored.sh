#!/usr/bin/env bash
# Each vendored crate in runtimes/third_party is its crates.io release plus
# its patches (<crate>-*.patch) and nothing else: the copy with every patch
# taken back out must match the release's files (<crate>-<version>.sha256,
# made from the published .crate) one for one. Offline; fails naming what
# differs.
set -euo pipefail
cd "$(dirname "$0")/../../runtimes/third_party"
for list in *.sha256; do
  release=${list%.sha256}
  crate=${release%-*}
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  cp -a "$crate/." "$tmp/"
  rm -f "$tmp/.cargo-ok"
  for p in "$crate"-*.patch; do
    patch -s -R -p0 -d "$tmp" < "$p"
  done
  (cd "$tmp" && sha256sum --quiet -c "$OLDPWD/$list")
  extra=$(cd "$tmp" && find . -type f | sort | comm -23 - <(awk '{print $2}' "$OLDPWD/$list" | sort))
  if [ -n "$extra" ]; then
    echo "vendored $crate: files not in the $release release: $extra" >&2
    exit 1
  fi
  rm -rf "$tmp"
  echo "vendored $crate: the $release release plus $(echo "$crate"-*.patch) only"
done
