#!/usr/bin/env bash
# kinglet's main job on this machine, set up from nothing, offline (as
# root): installs only what kinglet itself needs (the CNI plugins and
# iptables its pods' network uses; the Rust musl target and zig as the
# cross linker, through cross/build.sh), builds the static kinglet (the
# demo's build profile: unoptimised, minutes on 2 cores; `cross/build.sh
# TARGET` is the size-optimised release), then
# runs `kinglet demo`: standalone (no API server), it packs itself into a
# demo image, imports it, and runs a static pod from it until Ctrl-C, which
# stops the pod and everything it ran. The control plane and the upstream
# kubelet are built only by the test and bench commands. In another shell:
#   target/<arch>-unknown-linux-musl/demo/kinglet --root-dir /var/lib/kinglet-demo pods ls
#   tail -f /var/lib/kinglet-demo/logs/default_demo-*/hello/0.log
# Every file it writes is under that root dir (KINGLET_DEMO_ROOT); remove
# the dir to forget the demo.
set -euo pipefail
cd "$(dirname "$0")/.."
tests/apt-need.sh file iptables containernetworking-plugins
case $(uname -m) in
  x86_64) target=x86_64-unknown-linux-musl ;;
  aarch64 | arm64) target=aarch64-unknown-linux-musl ;;
  armv7l | armv8l) target=armv7-unknown-linux-musleabihf ;; # a 32-bit Pi OS
  *) echo "tests/demo.sh: no kinglet target for $(uname -m) (x86_64, aarch64, armv7)" >&2; exit 1 ;;
esac
cross/build.sh "$target" --demo
root=${KINGLET_DEMO_ROOT:-/var/lib/kinglet-demo}
exec "target/$target/demo/kinglet" --root-dir "$root" demo
