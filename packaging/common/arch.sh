# Sourced: maps a Debian architecture ($1) to the Rust target kinglet is
# built for: sets deb_arch and rust_target, or exits naming the choices.
case "${1:-}" in
  amd64 | x86_64) deb_arch=amd64 rust_target=x86_64-unknown-linux-musl ;;
  arm64 | aarch64) deb_arch=arm64 rust_target=aarch64-unknown-linux-musl ;;
  armhf | armv7) deb_arch=armhf rust_target=armv7-unknown-linux-musleabihf ;;
  *) echo "usage: $0 amd64|arm64|armhf" >&2; exit 2 ;;
esac
