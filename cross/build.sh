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
# over the 15 MB budget. With --demo: the demo's build (Cargo.toml's
# `demo` profile: no optimisation, no LTO, a first run in minutes),
# target/TARGET/demo/kinglet, larger than the budget and not what ships. The build itself runs in a target dir outside the
# repo (KINGLET_CROSS_TARGET_DIR), like the Go builds, so a fresh clone
# rebuilds only kinglet's own crates.
set -euo pipefail
target=${1:?usage: cross/build.sh TARGET [--demo]}
profile=release
[ "${2:-}" = --demo ] && profile=demo
cd "$(dirname "$0")/.."
BUDGET=$((15 * 1000 * 1000))
# shellcheck source=lib.sh
. cross/lib.sh
cross_toolchain "$target"
build=("${CROSS_CARGO[@]}" zigbuild "${CROSS_STD[@]}" --profile "$profile" --locked --target "$target" --bin kinglet)
export CARGO_TARGET_DIR=${KINGLET_CROSS_TARGET_DIR:-/var/cache/kinglet/cross-target}
mkdir -p "$CARGO_TARGET_DIR"
out=target/$target/$profile
mkdir -p "$out"

# A binary of exactly these inputs, built by this script before, is
# reused (a fresh clone of an unchanged tree, CI after a run of the same
# commit): the key is the content of every file of the workspace the
# build reads (tracked or not), the command, the toolchain's version, zig's
# and the flags. The toolchain steps above always run. Not in a git
# checkout, or with KINGLET_CROSS_CACHE=0: always built.
cache_key() {
  local files
  files=$(git ls-files -co --exclude-standard -- Cargo.toml Cargo.lock src runtimes examples cross/build.sh cross/lib.sh 2>/dev/null) || return 1
  [ -n "$files" ] || return 1
  {
    echo "$files" | LC_ALL=C sort | xargs -d '\n' sha256sum
    echo "${build[*]}"
    if [ "${build[1]}" = "+$NIGHTLY" ]; then rustc "+$NIGHTLY" -vV; else rustc -vV; fi
    python3 -m ziglang version
    cargo-zigbuild --version
    # Cargo config outside the repo, and the environment cargo reads.
    cat "${CARGO_HOME:-$HOME/.cargo}"/config.toml "${CARGO_HOME:-$HOME/.cargo}"/config 2>/dev/null || true
    env | grep -E '^(CARGO_|RUSTFLAGS|RUSTC|RUSTDOC|CC|CFLAGS|AR)' | grep -v '^CARGO_TARGET_DIR=' | LC_ALL=C sort || true
  } | sha256sum | cut -c1-32
}
cache=${KINGLET_CROSS_BIN_CACHE:-/var/cache/kinglet/cross-bin}/$target/$profile
key=""
[ "${KINGLET_CROSS_CACHE:-1}" = 0 ] || key=$(cache_key) || key=""
if [ -n "$key" ] && [ -x "$cache/$key/kinglet" ]; then
  echo "cross/build.sh: $target: the binary of these exact inputs from the build cache ($cache/$key, built $(date -r "$cache/$key/kinglet" -u +%FT%TZ))"
  install -m 755 "$cache/$key/kinglet" "$out/kinglet.new"
else
  "${build[@]}"
  install -m 755 "$CARGO_TARGET_DIR/$target/$profile/kinglet" "$out/kinglet.new"
  if [ -n "$key" ]; then
    mkdir -p "$cache/$key.part"
    install -m 755 "$out/kinglet.new" "$cache/$key.part/kinglet"
    rm -rf "${cache:?}/$key" && mv "$cache/$key.part" "$cache/$key"
    # Keep the five newest per target.
    ls -1dt "$cache"/*/ 2>/dev/null | tail -n +6 | xargs -r rm -rf
  fi
fi
mv "$out/kinglet.new" "$out/kinglet"
bin=$out/kinglet
file "$bin" 2>/dev/null | grep -q 'statically linked' || {
  file "$bin" >&2 || true
  echo "cross/build.sh: $bin is not statically linked" >&2
  exit 1
}
size=$(stat -c %s "$bin")
echo "$bin: $size bytes"
if [ "$profile" = release ] && [ "$size" -gt "$BUDGET" ]; then
  echo "cross/build.sh: $bin is $size bytes, over the $BUDGET-byte budget" >&2
  exit 1
fi
