#!/usr/bin/env bash
# Copies the static kinglet for each given Rust target (default: all three
# that cross/build.sh made) into the layer as kinglet-<arch>, the name the
# recipe's SRC_URI expects; builds none.
set -euo pipefail
cd "$(dirname "$0")/../.."
files=packaging/yocto/meta-kinglet/recipes-containers/kinglet/files
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(x86_64-unknown-linux-musl aarch64-unknown-linux-musl armv7-unknown-linux-musleabihf)
for t in "${targets[@]}"; do
  case $t in
    x86_64-*) a=x86_64 ;;
    aarch64-*) a=aarch64 ;;
    armv7-*) a=armv7 ;;
    *) echo "prepare.sh: unknown target $t" >&2; exit 2 ;;
  esac
  install -m 755 "target/$t/release/kinglet" "$files/kinglet-$a"
done
