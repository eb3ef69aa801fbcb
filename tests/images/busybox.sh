#!/usr/bin/env bash
# Builds, offline, an OCI archive of a busybox image from Debian's
# busybox-static with umoci and skopeo (real tools, no registry):
#   busybox.sh OUT.tar [NAME [STOPSIGNAL [CMD...]]]
# (NAME defaults to kinglet.test/busybox:1; no STOPSIGNAL by default, "" for
# none; CMD defaults to /bin/sh)
set -euo pipefail
out=${1:?usage: busybox.sh OUT.tar [NAME]}
name=${2:-kinglet.test/busybox:1}
stopsignal=${3:-}
shift $(( $# < 3 ? $# : 3 ))
cmd=("$@")
[ ${#cmd[@]} -gt 0 ] || cmd=(/bin/sh)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
umoci init --layout "$work/layout"
umoci new --image "$work/layout:img"
umoci unpack --image "$work/layout:img" "$work/bundle" >/dev/null
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
rootfs "$work/bundle/rootfs"
umoci repack --image "$work/layout:img" "$work/bundle" >/dev/null
cmd_flags=()
for c in "${cmd[@]}"; do cmd_flags+=(--config.cmd "$c"); done
umoci config --image "$work/layout:img" "${cmd_flags[@]}" --config.env PATH=/bin
if [ -n "$stopsignal" ]; then
  umoci config --image "$work/layout:img" --config.stopsignal "$stopsignal"
fi
skopeo --insecure-policy copy --quiet "oci:$work/layout:img" "oci-archive:$out:$name"
echo "$out"
