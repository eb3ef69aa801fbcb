#!/usr/bin/env bash
# kinglet's main job on this machine, set up from nothing, offline (as
# root): builds the static kinglet, then runs `kinglet demo`: standalone (no
# API server), it packs itself into a demo image, imports it, and runs a
# static pod from it until Ctrl-C. In another shell:
#   target/<arch>-unknown-linux-musl/release/kinglet --root-dir /var/lib/kinglet-demo pods ls
#   tail -f /var/log/pods/default_demo-*/hello/0.log
set -euo pipefail
cd "$(dirname "$0")/.."
tests/setup.sh
target=$(uname -m)-unknown-linux-musl
cross/build.sh "$target"
root=${KINGLET_DEMO_ROOT:-/var/lib/kinglet-demo}
exec "target/$target/release/kinglet" --root-dir "$root" demo
