#!/usr/bin/env bash
# The builds the test suite needs besides kinglet's own, each cached
# outside the repo and skipped when cached (see each script):
#   tests/prebuild.sh tests   what the end-to-end tests need: the control
#                             plane, the upstream kubelet (the quick bench),
#                             metrics-server, the sample device plugin
#   tests/prebuild.sh later   what the phases after them need: e2e.test and
#                             the conformance images' programs, kube-proxy
#                             and CoreDNS, the amd64 VM guest image
# tests/run.sh runs the first beside the Rust lint and cross build and the
# second beside the end-to-end tests (which mostly wait), so a fresh
# machine does not wait for them one after the other.
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
  tests)
    tests/cluster/build.sh
    tests/bench/build-kubelet.sh
    tests/cluster/build-metrics-server.sh
    tests/images/sample-device-plugin.sh --build-only ;;
  later)
    tests/conformance/build.sh
    tests/addons/build.sh
    tests/vm/image.sh amd64 ;;
  *) echo "usage: tests/prebuild.sh tests|later" >&2; exit 2 ;;
esac
