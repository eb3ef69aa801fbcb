#!/usr/bin/env bash
# The whole test suite, as CI runs it (as root): installs what is missing,
# runs lint, builds the static x86_64 binary and type-checks the armv7 one,
# checks the Yocto layer, runs the unit and end-to-end tests (the fuzz
# corpus replayed among them: tests/fuzz_corpus.rs; finding new inputs is
# tests/fuzz.sh, a separate command) on the loopback control plane, a fast
# subset of upstream's node conformance specs and the cluster add-ons
# (kube-proxy, CoreDNS, metrics-server) on a kinglet node in-process, and
# the VM lab's smoke suite (a Debian 12 guest on cgroup v2 under qemu,
# kinglet from its .deb, a reboot offline), and stops everything it
# started. The same conformance subset and add-ons through containerd are
# separate commands (docs/testing.md), as are the heavy suites.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
# Each phase line says when it began, so a slow CI run shows where its time went.
phase() { echo "== $* (at $(( $(date +%s) - start )) s)"; }
KINGLET_SETUP_GO=0 tests/setup.sh
# Cargo builds in a target dir outside the clone, as the cross, fuzz and
# Go builds do: a fresh clone compiles the workspace's own crates, not
# every dependency again (and leaves no 10 GB tree behind). The repo's
# target/ still gets the logs and the static binaries.
export CARGO_TARGET_DIR=${KINGLET_CI_TARGET_DIR:-/var/cache/kinglet/ci-target}
export CARGO_INCREMENTAL=0
bins=$CARGO_TARGET_DIR/debug
# The quick bench (e2e_bench) measures the static binary the cross step
# below builds.
export KINGLET_BENCH_BIN=$PWD/target/$(uname -m)-unknown-linux-musl/release/kinglet
mkdir -p target

# The Go builds and the guest image (cached; minutes on a fresh machine)
# go beside the Rust work: what the tests need beside lint and the cross
# build, the rest (niced) beside the tests, which mostly wait.
rm -f target/prebuild-tests.rc target/prebuild-later.rc target/vm-smoke.rc
# In a process group of their own, so that an early exit ends them all.
setsid bash -c '
  rc=0
  tests/prebuild.sh tests >target/prebuild-tests.log 2>&1 || rc=$?
  echo "$rc" >target/prebuild-tests.rc
  [ "$rc" = 0 ] || exit "$rc"
  rc=0
  nice -n 19 tests/prebuild.sh later >target/prebuild-later.log 2>&1 || rc=$?
  echo "$rc" >target/prebuild-later.rc
  exit "$rc"' &
prebuild=$!
# await_file FILE LOG WHAT: until FILE says the build that writes it
# ended, then its exit code; a failure prints the build's log.
await_file() {
  until [ -s "$1" ]; do
    kill -0 "$prebuild" 2>/dev/null || break
    sleep 2
  done
  [ "$(cat "$1" 2>/dev/null)" = 0 ] && return 0
  echo "$3 failed:" >&2
  tail -n 40 "$2" >&2
  exit 1
}

export KINGLET_CLUSTER_DIR=${KINGLET_CLUSTER_DIR:-/tmp/kinglet-cluster}
vmjob=
armjob=
demojob=
trap 'tests/cluster/down.sh >/dev/null 2>&1 || true; kill -- -"$prebuild" 2>/dev/null || true; for j in "$vmjob" "$armjob" "$demojob"; do [ -z "$j" ] || kill -- -"$j" 2>/dev/null || true; done' EXIT

phase "lint"
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -- -D warnings
python3 tests/lint/modgraph.py
bash tests/lint/vendored.sh

phase "cross: the static x86_64 binary (15 MB budget); armv7 type-checked beside the tests"
# The ARM static builds (two more fat-LTO links, armv7's standard library
# built from source: about 10 minutes on a cold machine) and their runs on
# ARM guests are the VM lab's (tests/vm/run.sh --arch arm64|armhf); CI
# checks that the code compiles for armv7, which has both the unsigned
# c_char aarch64 has and the 32-bit widths (`cross/check.sh
# aarch64-unknown-linux-musl` is a command of its own). The check (6
# minutes cold, most of it armv7's standard library) runs niced beside the
# end-to-end tests, which mostly wait, in a process group of its own.
cross/build.sh x86_64-unknown-linux-musl | tee target/cross.log
# beside NAME CMD...: CMD niced, in a process group of its own, its output
# in target/NAME.log and its exit code in target/NAME.rc ($! is its job).
beside() {
  rm -f "target/$1.rc"
  setsid bash -c 'rc=0; nice -n 10 "${@:2}" >"target/$1.log" 2>&1 || rc=$?; echo "$rc" >"target/$1.rc"' _ "$@" &
}
# (In the cross build's target dir: the tests' own would make cargo wait.)
beside armv7-check env CARGO_TARGET_DIR="${KINGLET_CROSS_TARGET_DIR:-/var/cache/kinglet/cross-target}" \
  cross/check.sh armv7-unknown-linux-musleabihf
armjob=$!
# The demo's own build (tests/demo.sh's: `cross/build.sh TARGET --demo`,
# unoptimised; a target dir of its own), niced beside the tests, for the
# demo's test, which runs after the others.
beside demo-build env KINGLET_CROSS_TARGET_DIR="${KINGLET_DEMO_TARGET_DIR:-/var/cache/kinglet/demo-target}" \
  cross/build.sh x86_64-unknown-linux-musl --demo
demojob=$!
phase "the Yocto layer (packaging/yocto/check.py: no bitbake here)"
packaging/yocto/prepare.sh x86_64-unknown-linux-musl
python3 packaging/yocto/check.py x86_64

phase "waiting for the control plane's build"
await_file target/prebuild-tests.rc target/prebuild-tests.log "the Go builds the tests need (tests/prebuild.sh tests)"
tests/cluster/down.sh >/dev/null 2>&1 || true
tests/cluster/up.sh >/dev/null

phase "tests (unit and end to end); the VM lab's smoke suite beside them"
# The VM lab's smoke suite (an amd64 guest on cgroup v2, kinglet from its
# .deb, a reboot offline; tests/vm/run.sh --suite full and the ARM guests
# are separate commands) runs beside the tests, which mostly wait, once
# the guest image is built: one emulated vCPU, niced, with a control
# plane, bridge and registry of its own. In a process group of its own,
# ended with the rest on an early exit (its EXIT trap tears the lab down).
KINGLET_BIN=$KINGLET_BENCH_BIN PREBUILD=$prebuild setsid bash -c '
  until [ -s target/prebuild-later.rc ]; do kill -0 "$PREBUILD" 2>/dev/null || break; sleep 5; done
  if [ "$(cat target/prebuild-later.rc 2>/dev/null)" != 0 ]; then
    echo "the guest image was not built (target/prebuild-later.log)" >target/vm-smoke.log
    echo 1 >target/vm-smoke.rc; exit 1
  fi
  rc=0
  nice -n 10 tests/vm/run.sh --arch amd64 --suite smoke >target/vm-smoke.log 2>&1 || rc=$?
  echo "$rc" >target/vm-smoke.rc' &
vmjob=$!
# Two test binaries at a time (tests/parallel.py; the quick bench and
# eviction alone), they mostly wait; within a binary, tests share the
# control plane and use private node names, dirs, subnets and ports.
set +e
mkdir -p target/tests
cargo test --workspace --locked --no-run --message-format=json-render-diagnostics >target/tests/build.json
rc=$?
if [ "$rc" = 0 ]; then
  python3 tests/parallel.py --skip e2e_demo 2>&1 | tee target/test.log
  rc=${PIPESTATUS[0]}
  wait "$demojob"
  if [ "$(cat target/demo-build.rc 2>/dev/null)" = 0 ]; then
    python3 tests/parallel.py --only e2e_demo 2>&1 | tee -a target/test.log
    [ "${PIPESTATUS[0]}" = 0 ] || rc=1
  else
    echo "the demo's build failed (target/demo-build.log):" | tee -a target/test.log
    tail -n 40 target/demo-build.log
    rc=1
  fi
  cargo test --workspace --locked --doc 2>&1 | tee -a target/test.log
  [ "${PIPESTATUS[0]}" = 0 ] || rc=1
fi
phase "waiting for the conformance and add-on builds"
wait "$prebuild" || { echo "the Go builds and the guest image (tests/prebuild.sh later) failed:" >&2; tail -n 40 target/prebuild-later.log >&2; exit 1; }
phase "conformance: the fast subset (tests/conformance/ci-specs.txt), in-process"
# Upstream's own specs against a kinglet node (the debug build the tests
# just made), on a control plane of their own. The same specs through
# containerd: tests/conformance/ci.sh --runtime cri (a separate command).
cargo build --locked --bin kinglet 2>&1 | tail -n1
KINGLET_BIN=$bins/kinglet tests/conformance/ci.sh 2>&1 | tee target/conformance-ci.log
crc=${PIPESTATUS[0]}
phase "add-ons: kube-proxy, CoreDNS and metrics-server on a kinglet node, in-process"
# The cluster's own add-ons, built from their Go modules, on a control
# plane of their own (tests/addons/run.sh; --runtime cri is a separate
# command).
KINGLET_BIN=$bins/kinglet tests/addons/run.sh 2>&1 | tee target/addons-ci.log
arc=${PIPESTATUS[0]}
phase "waiting for the VM lab's smoke suite and the armv7 check"
wait "$vmjob"
cat target/vm-smoke.log
vrc=$(cat target/vm-smoke.rc 2>/dev/null || echo 1)
wait "$armjob"
xrc=$(cat target/armv7-check.rc 2>/dev/null || echo 1)
[ "$xrc" = 0 ] || tail -n 40 target/armv7-check.log
set -e
summary=$(grep -E '^test result:' target/test.log || true)
passed=$(echo "$summary" | awk '{s+=$4} END {print s+0}')
failed=$(echo "$summary" | awk '{s+=$6} END {print s+0}')
ignored=$(echo "$summary" | awk '{s+=$8} END {print s+0}')
phase "figures"
grep -E '^figure:' target/test.log || true
sed -n 's/^\(target\/.*\/kinglet\): \([0-9]*\) bytes$/figure: static binary \1 \2 bytes/p' target/cross.log || true
grep -E '^conformance' target/conformance-ci.log || true
grep -E '^figure:|^addons \(' target/addons-ci.log || true
grep -E '^figure:' target/vm-smoke.log || true
echo "suite time: $(( $(date +%s) - start )) s"
if [ "$rc" != 0 ] && [ "$failed" = 0 ]; then failed=1; fi
echo "$passed passed, $failed failed, $ignored skipped"
[ "$vrc" = 0 ] || echo "the VM lab's smoke suite failed (target/vm-smoke.log)"
[ "$arc" = 0 ] || echo "the add-ons test failed (target/addons-ci.log)"
[ "$xrc" = 0 ] || echo "the armv7 check failed (target/armv7-check.log)"
[ "$rc" = 0 ] && [ "$crc" = 0 ] && [ "$arc" = 0 ] && [ "$vrc" = 0 ] && [ "$xrc" = 0 ]
