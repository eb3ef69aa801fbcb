#!/usr/bin/env bash
# Installs what kinglet's build, demo and tests need on a fresh Debian
# machine (as root), and builds the loopback control plane (cached outside
# the repo). Safe to run again: it only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

tests/apt-need.sh openssl curl file patch qemu-user-static iproute2 iptables kmod procps docker-registry skopeo umoci busybox-static bash-static netcat-openbsd apache2-utils bind9-dnsutils \
  containerd runc containernetworking-plugins debootstrap libfaketime prometheus
# A gate's DROP rule a killed test left behind (tests/common/gate.rs).
while iptables -w -S INPUT 2>/dev/null | grep -q kinglet-test-gate; do
  rule=$(iptables -w -S INPUT | grep kinglet-test-gate | head -n1 | sed 's/^-A /-D /')
  eval "iptables -w $rule"
done
for tool in cargo go kubectl; do
  command -v "$tool" >/dev/null || { echo "setup: $tool is required and missing" >&2; exit 1; }
done
for t in x86_64-unknown-linux-musl aarch64-unknown-linux-musl; do
  rustup target list --installed | grep -qx "$t" || rustup target add "$t" >&2
done
if ! command -v cargo-zigbuild >/dev/null || ! python3 -m ziglang version >/dev/null 2>&1; then
  python3 -m pip install --quiet --disable-pip-version-check ziglang cargo-zigbuild
fi
# The benchmark's plots (tests/bench/report.py, pressure_report.py).
python3 -c 'import matplotlib' 2>/dev/null ||
  python3 -m pip install --quiet --disable-pip-version-check matplotlib
# The control plane and the upstream kubelet (the side-by-side benchmark,
# tests/bench/run.sh); tests/run.sh builds them itself, beside other work
# (KINGLET_SETUP_GO=0).
if [ "${KINGLET_SETUP_GO:-1}" = 1 ]; then
  tests/cluster/build.sh >/dev/null
  tests/bench/build-kubelet.sh >/dev/null
fi
