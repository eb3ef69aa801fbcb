# The toolchain of a cross target, shared by cross/build.sh and
# cross/check.sh: zig's linker and C compiler through cargo-zigbuild (from
# PyPI), and where rustup cannot install a target's standard library
# (armv7 musl on this build machine: rustup's download answers 404), the
# standard library built from source (-Zbuild-std) on the pinned nightly
# below, installed through rustup with rust-src.
# shellcheck shell=bash
NIGHTLY=nightly-2026-05-20

# cross_toolchain TARGET: installs what building for TARGET needs and sets
# CROSS_CARGO (the cargo command, with its toolchain) and CROSS_STD (the
# build-std flags, if any).
cross_toolchain() {
  local target=$1
  if ! command -v cargo-zigbuild >/dev/null || ! python3 -m ziglang version >/dev/null 2>&1; then
    python3 -m pip install --quiet --disable-pip-version-check ziglang cargo-zigbuild
  fi
  CROSS_CARGO=(cargo) CROSS_STD=()
  rustup target list --installed | grep -qx "$target" || rustup target add "$target" 2>/dev/null || {
    echo "cross: no prebuilt standard library for $target; building it from source on $NIGHTLY" >&2
    rustup toolchain list | grep -q "^$NIGHTLY" ||
      rustup toolchain install "$NIGHTLY" --profile minimal -c rust-src >&2
    # The same nightly installed by tests/fuzz.sh first has no rust-src.
    rustup component list --toolchain "$NIGHTLY" --installed | grep -q '^rust-src' ||
      rustup component add rust-src --toolchain "$NIGHTLY" >&2
    CROSS_CARGO=(cargo "+$NIGHTLY") CROSS_STD=(-Zbuild-std=std,panic_abort)
    # A standard library built from source comes without the musl start
    # files (crt1.o) and libc.a rustup's rust-std bundles: zig's own musl
    # provides them.
    local v
    v=CARGO_TARGET_$(echo "$target" | tr 'a-z-' 'A-Z_')_RUSTFLAGS
    export "$v=${!v:-} -C link-self-contained=no"
  }
}
