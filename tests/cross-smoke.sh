#!/usr/bin/env bash
# Runs a foreign-architecture kinglet under qemu-user as far as qemu-user
# allows (no containers: those need the kernel to run the foreign binary
# kinglet execs, and namespaces qemu-user does not emulate):
#   cross-smoke.sh QEMU BINARY
# --version; the config parser (a bad field refused, named, exit 1);
# `pods ls` and `images ls` on an empty root; then the image store end to
# end (a busybox OCI archive from Debian's busybox-static imported, listed,
# removed) where qemu-user has openat2 (qemu 9 and later). Older qemu-user
# (Debian 12's 7.2) answers openat2 with ENOSYS, and kinglet then refuses
# to unpack layers, by design (it needs openat2 to unpack them safely):
# that refusal, clear and not a crash, is what is checked there.
set -euo pipefail
qemu=${1:?usage: cross-smoke.sh QEMU BINARY}
bin=${2:?usage: cross-smoke.sh QEMU BINARY}
cd "$(dirname "$0")/.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "cross-smoke ($qemu): $*" >&2; exit 1; }
"$qemu" "$bin" --version
printf 'apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nmaxPods: -3\n' >"$work/bad.yaml"
if "$qemu" "$bin" --root-dir "$work/root" --config "$work/bad.yaml" 2>"$work/err"; then
  fail "a bad config was accepted"
fi
grep -q maxPods "$work/err" || fail "the bad config's error does not name maxPods: $(cat "$work/err")"
"$qemu" "$bin" --root-dir "$work/root" pods ls | grep -q NAMESPACE || fail "pods ls printed no table"
k() { "$qemu" "$bin" --root-dir "$work/root" images "$@"; }
k ls >/dev/null
tests/images/busybox.sh "$work/busybox.tar" >/dev/null
if k import "$work/busybox.tar" 2>"$work/err"; then
  k ls | grep -q 'kinglet.test/busybox' || fail "the imported image is not listed"
  k rm kinglet.test/busybox:1
  if k ls | grep -q 'kinglet.test/busybox'; then fail "the removed image is still listed"; fi
  echo "cross-smoke: $(basename "$qemu"): version, config, pods ls, image import/ls/rm: ok"
else
  grep -q 'openat2 is not available' "$work/err" || fail "image import failed: $(cat "$work/err")"
  echo "cross-smoke: $(basename "$qemu"): version, config, pods ls, images ls: ok; image import refused clearly (this qemu-user has no openat2)"
fi
