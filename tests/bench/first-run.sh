#!/usr/bin/env bash
# The README's main command as a new user meets it: a fresh clone of this
# repository, no build of it anywhere (a private cargo target dir, the
# cross build's binary cache off), `tests/demo.sh` started, and the
# seconds until the demo pod's first log line; then Ctrl-C, as the user
# would. Prints `figure:` lines: the whole, and the build's part.
#   tests/bench/first-run.sh [--cold-registry]
# --cold-registry: a private CARGO_HOME too, so every crate is downloaded
# again (what a machine that never built Rust pays; needs the crates
# registry reachable). The Rust toolchain, zig and the Debian packages the
# demo installs are not removed.
# Uses the demo's default ports: nothing else may run a kinglet meanwhile.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d /var/tmp/kinglet-first-run.XXXXXX)
demo=
cleanup() {
  [ -z "$demo" ] || kill -INT -- -"$demo" 2>/dev/null || true
  sleep 1
  [ -z "$demo" ] || kill -KILL -- -"$demo" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
git clone -q "$repo" "$work/kinglet"
export KINGLET_CROSS_TARGET_DIR=$work/target KINGLET_CROSS_CACHE=0
export KINGLET_DEMO_ROOT=$work/root
if [ "${1:-}" = --cold-registry ]; then
  export CARGO_HOME=$work/cargo-home
  mkdir -p "$CARGO_HOME"
fi
start=$(date +%s%N)
( cd "$work/kinglet" && exec setsid tests/demo.sh >"$work/demo.log" 2>&1 ) &
demo=$!
first_line() {
  cat "$work"/root/logs/default_demo-*/hello/0.log 2>/dev/null | grep -q "hello from the kinglet demo pod"
}
until first_line; do
  if ! kill -0 "$demo" 2>/dev/null; then
    echo "tests/demo.sh ended before the demo pod logged:" >&2
    tail -n 40 "$work/demo.log" >&2
    exit 1
  fi
  if [ $(( ($(date +%s%N) - start) / 1000000000 )) -gt 1800 ]; then
    echo "no first line in 30 minutes" >&2
    exit 1
  fi
  sleep 0.2
done
total=$(( ($(date +%s%N) - start) / 1000000 ))
bin=$work/kinglet/target/$(uname -m)-unknown-linux-musl/demo/kinglet
built=$(( ($(stat -c %Y "$bin") * 1000) - start / 1000000 ))
echo "figure: first run: tests/demo.sh on a fresh clone to the demo pod's first log line: $total ms (the binary built $built ms after the start; $(stat -c %s "$bin") bytes)"
kill -INT -- -"$demo"
wait "$demo" 2>/dev/null || true
demo=
