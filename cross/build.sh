#!/usr/bin/env bash
# Builds a fully static, stripped kinglet for TARGET:
#   x86_64-unknown-linux-musl | aarch64-unknown-linux-musl | armv7-unknown-linux-musleabihf
# Linking and the C parts of dependencies (ring) go through zig's cross
# toolchain via cargo-zigbuild, both installed from PyPI, so no per-target
# gcc is needed. Output: target/TARGET/release/kinglet; prints its size.
set -euo pipefail
target=${1:?usage: cross/build.sh TARGET}
cd "$(dirname "$0")/.."

if ! command -v cargo-zigbuild >/dev/null || ! python3 -m ziglang version >/dev/null 2>&1; then
  python3 -m pip install --quiet --disable-pip-version-check ziglang cargo-zigbuild
fi
if ! rustup target list --installed | grep -qx "$target"; then
  rustup target add "$target" || {
    echo "cross/build.sh: the Rust standard library for $target cannot be installed here." >&2
    echo "Build it from source instead: rustup component add rust-src, then" >&2
    echo "  RUSTC_BOOTSTRAP=1 cargo zigbuild -Zbuild-std=std,panic_abort --release --target $target" >&2
    exit 2
  }
fi
cargo zigbuild --release --locked --target "$target" --bin kinglet
bin=target/$target/release/kinglet
file "$bin" 2>/dev/null | grep -q 'statically linked' || {
  file "$bin" >&2 || true
  echo "cross/build.sh: $bin is not statically linked" >&2
  exit 1
}
echo "$bin: $(stat -c %s "$bin") bytes"
