#!/usr/bin/env bash
# The vendored libcontainer is youki's 0.7.0 release plus its patches
# (libcontainer-*.patch: the armv7 fix, the test double kept out of
# non-test builds) and nothing else: the copy with every patch taken back
# out must match the release's files (libcontainer-0.7.0.sha256, made from
# the published .crate) one for one. Offline; fails naming what differs.
set -euo pipefail
cd "$(dirname "$0")/../../runtimes/third_party"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cp -a libcontainer/. "$tmp/"
rm -f "$tmp/.cargo-ok"
for p in libcontainer-*.patch; do
  patch -s -R -p0 -d "$tmp" < "$p"
done
(cd "$tmp" && sha256sum --quiet -c "$OLDPWD/libcontainer-0.7.0.sha256")
extra=$(cd "$tmp" && find . -type f | sort | comm -23 - <(awk '{print $2}' "$OLDPWD/libcontainer-0.7.0.sha256" | sort))
if [ -n "$extra" ]; then
  echo "vendored libcontainer: files not in the 0.7.0 release: $extra" >&2
  exit 1
fi
echo "vendored libcontainer: the 0.7.0 release plus $(echo libcontainer-*.patch) only"
