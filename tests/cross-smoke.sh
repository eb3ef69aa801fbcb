#!/usr/bin/env bash
# Runs a foreign-architecture kinglet under qemu-user as far as qemu-user
# allows (no containers: those need the kernel to run the foreign binary
# kinglet execs, and namespaces qemu-user does not emulate):
#   cross-smoke.sh QEMU BINARY
# --version, then the image store end to end: a busybox OCI archive (from
# Debian's busybox-static, tests/images/busybox.sh) is imported (layers
# unpacked, digests checked), listed, and removed, in a private root.
set -euo pipefail
qemu=${1:?usage: cross-smoke.sh QEMU BINARY}
bin=${2:?usage: cross-smoke.sh QEMU BINARY}
cd "$(dirname "$0")/.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$qemu" "$bin" --version
tests/images/busybox.sh "$work/busybox.tar" >/dev/null
k() { "$qemu" "$bin" --root-dir "$work/root" images "$@"; }
k import "$work/busybox.tar"
k ls | tee "$work/ls"
grep -q 'kinglet.test/busybox' "$work/ls" || { echo "cross-smoke: the imported image is not listed" >&2; exit 1; }
k rm kinglet.test/busybox:1
if k ls | grep -q 'kinglet.test/busybox'; then
  echo "cross-smoke: the removed image is still listed" >&2
  exit 1
fi
echo "cross-smoke: $(basename "$qemu"): version, image import, ls, rm: ok"
