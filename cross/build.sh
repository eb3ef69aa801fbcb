#!/usr/bin/env bash
# Builds a fully static, stripped kinglet for TARGET:
#   x86_64-unknown-linux-musl | aarch64-unknown-linux-musl | armv7-unknown-linux-musleabihf
# Linking and the C parts of dependencies (ring) go through zig's cross
# toolchain via cargo-zigbuild, both installed from PyPI, so no per-target
# gcc is needed. Where rustup cannot install a target's standard library
# (armv7 musl on this build machine: rustup's download answers 404), the
# standard library is built from source (-Zbuild-std) on the pinned nightly
# below, installed through rustup with rust-src.
# Output: target/TARGET/release/kinglet; prints its size and fails a binary
# over the 15 MB budget. The build itself runs in a target dir outside the
# repo (KINGLET_CROSS_TARGET_DIR), like the Go builds, so a fresh clone
# rebuilds only kinglet's own crates.
set -euo pipefail
target=${1:?usage: cross/build.sh TARGET}
cd "$(dirname "$0")/.."
NIGHTLY=nightly-2026-05-20
BUDGET=$((15 * 1000 * 1000))

if ! command -v cargo-zigbuild >/dev/null || ! python3 -m ziglang version >/dev/null 2>&1; then
  python3 -m pip install --quiet --disable-pip-version-check ziglang cargo-zigbuild
fi
build=(cargo zigbuild --release --locked --target "$target" --bin kinglet)
if ! rustup target list --installed | grep -qx "$target" && ! rustup target add "$target" 2>/dev/null; then
  echo "cross/build.sh: no prebuilt standard library for $target; building it from source on $NIGHTLY" >&2
  rustup toolchain list | grep -q "^$NIGHTLY" ||
    rustup toolchain install "$NIGHTLY" --profile minimal -c rust-src >&2
  build=(cargo "+$NIGHTLY" zigbuild -Zbuild-std=std,panic_abort --release --locked --target "$target" --bin kinglet)
  # A standard library built from source comes without the musl start
  # files (crt1.o) and libc.a rustup's rust-std bundles: zig's own musl
  # provides them.
  v=CARGO_TARGET_$(echo "$target" | tr 'a-z-' 'A-Z_')_RUSTFLAGS
  export "$v=${!v:-} -C link-self-contained=no"
fi
export CARGO_TARGET_DIR=${KINGLET_CROSS_TARGET_DIR:-/var/cache/kinglet/cross-target}
mkdir -p "$CARGO_TARGET_DIR"
"${build[@]}"
out=target/$target/release
mkdir -p "$out"
install -m 755 "$CARGO_TARGET_DIR/$target/release/kinglet" "$out/kinglet.new"
mv "$out/kinglet.new" "$out/kinglet"
bin=$out/kinglet
file "$bin" 2>/dev/null | grep -q 'statically linked' || {
  file "$bin" >&2 || true
  echo "cross/build.sh: $bin is not statically linked" >&2
  exit 1
}
size=$(stat -c %s "$bin")
echo "$bin: $size bytes"
if [ "$size" -gt "$BUDGET" ]; then
  echo "cross/build.sh: $bin is $size bytes, over the $BUDGET-byte budget" >&2
  exit 1
fi
