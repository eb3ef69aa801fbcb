#!/usr/bin/env bash
# Type-checks and lints kinglet for a cross TARGET without building it
# (no code generation, no link: a minute or two where cross/build.sh takes
# five to ten): what CI runs for the ARM targets, whose static builds and
# runs are the VM lab's (tests/vm/run.sh --arch arm64|armhf).
#   cross/check.sh aarch64-unknown-linux-musl | armv7-unknown-linux-musleabihf
set -euo pipefail
target=${1:?usage: cross/check.sh TARGET}
cd "$(dirname "$0")/.."
# shellcheck source=lib.sh
. cross/lib.sh
cross_toolchain "$target"
# Build scripts (ring's C and assembly) still run: zig compiles them.
# clippy where the stable toolchain has the target; plain check on the
# nightly (installed without clippy) where the standard library is built.
if [ ${#CROSS_STD[@]} -eq 0 ]; then
  exec cargo-zigbuild clippy --locked --target "$target" --bin kinglet -- -D warnings
fi
RUSTUP_TOOLCHAIN=${CROSS_CARGO[1]#+} exec cargo-zigbuild check "${CROSS_STD[@]}" --locked --target "$target" --bin kinglet
