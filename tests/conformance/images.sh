#!/usr/bin/env bash
# Builds, offline, the images the selected conformance specs use and pushes
# them to the registry at REGISTRY (a local docker-registry), under the
# names e2e.test expects through its KUBE_TEST_REPO_LIST (see run.sh):
#   images.sh BIN_DIR REGISTRY        (BIN_DIR: what build.sh printed)
# Built from Debian's busybox-static (with bash-static, curl, netcat-openbsd
# and dig for agnhost, which the network and DNS helpers call) and the Go
# binaries build.sh made. Images whose upstream source cannot be built here
# are listed by run.sh as such.
set -euo pipefail
bin=${1:?usage: images.sh BIN_DIR REGISTRY}
reg=${2:?usage: images.sh BIN_DIR REGISTRY}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# shellcheck source=../images/lib.sh
. "$(dirname "$0")/../images/lib.sh"

# /bin/sh is bash-static in the agnhost image: Debian's busybox 1.35 is
# built as a standalone shell that prefers its own applets, so its `nc`
# (no -u) would run where alpine's busybox, upstream agnhost's base, finds
# the image's netcat-openbsd by PATH. The busybox image keeps busybox's
# ash, as upstream's: its messages are what specs compare (a read-only
# root's "/bin/sh: can't create /file: Read-only file system"), though
# 1.35's ash drops environment variables whose names are not identifiers,
# which 1.37's keeps (the ConfigMap and Secret "consumable via the
# environment" specs fail on that).
bash_as_sh() {
  cp /bin/bash-static "$1/bin/bash"
  ln -sf bash "$1/bin/sh"
}
fill_busybox() { rootfs "$1"; }
# What upstream's agnhost Dockerfile adds besides the binary: porter's
# localhost.crt/.key (HTTPS hooks and probes), /uploads, agnhost-2, and
# the image's own user and group.
agnhost_src="$(go env GOMODCACHE)/k8s.io/kubernetes@$(awk '/^require k8s.io\/kubernetes/ {print $3}' "$(dirname "$0")/../cluster/go.mod")/test/images/agnhost"
fill_agnhost() {
  rootfs "$1"
  cp "$bin/agnhost" "$1/agnhost"
  cp "$agnhost_src/porter/localhost.crt" "$agnhost_src/porter/localhost.key" "$1/"
  mkdir -p "$1/uploads"
  ln -sf agnhost "$1/agnhost-2"
  printf 'user-defined-in-image:x:1000:1000::/home/user-defined-in-image:/bin/sh\n' >> "$1/etc/passwd"
  printf 'user-defined-in-image:x:1000:\ngroup-defined-in-image:x:50000:user-defined-in-image\n' >> "$1/etc/group"
  bash_as_sh "$1"
  [ -x /usr/bin/curl ] && with_libs "$1" /usr/bin/curl /usr/bin/curl
  [ -x /bin/nc.openbsd ] && with_libs "$1" /bin/nc.openbsd /usr/bin/nc
  with_dns_tools "$1"
}
# dig, which the DNS specs' queriers run in agnhost (upstream's has
# alpine's bind-tools) and glibc-dns-testing (Debian's dnsutils), and
# getent, which they run for the hosts lookups (alpine's musl-utils in
# upstream's agnhost).
with_dns_tools() {
  with_libs "$1" /usr/bin/dig /usr/bin/dig
  with_libs "$1" /usr/bin/getent /usr/bin/getent
}
fill_pause() {
  rootfs "$1"
  printf '#!/bin/sh\ntrap "exit 0" TERM INT\nwhile :; do sleep 3600 & wait; done\n' > "$1/pause"
  chmod 755 "$1/pause"
}
fill_nonroot() {
  rootfs "$1"
  printf 'nonroot:x:1234:1234::/:/bin/sh\n' >> "$1/etc/passwd"
  printf 'nonroot:x:1234:\n' >> "$1/etc/group"
}
fill_nonewprivs() {
  rootfs "$1"
  cp "$bin/nnp" "$1/usr/local/bin/nnp"
  chmod 4755 "$1/usr/local/bin/nnp"
  printf 'nonroot:x:1234:1234::/:/bin/sh\n' >> "$1/etc/passwd"
}

# glibc-dns-testing: what matters is a glibc `hostname` (its -f resolves
# through glibc's NSS, files then dns, as upstream's Debian-based image).
fill_glibc_dns() {
  rootfs "$1"
  rm -f "$1/bin/hostname"
  with_libs "$1" /bin/hostname /bin/hostname
  with_dns_tools "$1"
}

# kitten and nautilus (the Update Demo specs): agnhost's test-webserver
# serving a data.json that names the image's picture, as upstream's.
fill_picture() {
  local name=$1 root=$2
  fill_agnhost "$root"
  printf '{\n  "image": "%s.jpg"\n}\n' "$name" > "$root/data.json"
  cp "$agnhost_src/../$name/html/$name.jpg" "$root/$name.jpg"
}
fill_kitten() { fill_picture kitten "$1"; }
fill_nautilus() { fill_picture nautilus "$1"; }

# nginx (the ReplicationController, Pods and EndpointSlice specs run it as
# a web server on port 80): a stand-in, busybox's httpd serving nginx's
# welcome page; no nginx can be built here offline.
fill_nginx() {
  rootfs "$1"
  mkdir -p "$1/usr/share/nginx/html"
  printf '<!DOCTYPE html>\n<html><head><title>Welcome to nginx!</title></head><body><h1>Welcome to nginx!</h1></body></html>\n' \
    > "$1/usr/share/nginx/html/index.html"
}

# The aggregator spec's extension apiserver and its etcd (the control
# plane's own etcd build, where upstream's image has /usr/local/bin/etcd),
# when build.sh made it (--sample-apiserver).
fill_sample_apiserver() {
  rootfs "$1"
  cp "$bin/sample-apiserver" "$1/kube-sample-apiserver"
}
fill_etcd() {
  rootfs "$1"
  cp "$("$(dirname "$0")/../cluster/build.sh" | tail -n1)/etcd" "$1/usr/local/bin/etcd"
}

agnhost=$(cat "$bin/agnhost.version")
image "e2e-test-images/agnhost:$agnhost" fill_agnhost --config.entrypoint /agnhost --config.cmd pause
image "e2e-test-images/agnhost:2.55" fill_agnhost --config.entrypoint /agnhost --config.cmd pause
image "e2e-test-images/busybox:1.37.0-2" fill_busybox --config.cmd sh
image "pause:3.10.2" fill_pause --config.entrypoint /pause
image "e2e-test-images/nonroot:1.5" fill_nonroot --config.user 1234 --config.cmd sh
image "e2e-test-images/nonewprivs:1.4" fill_nonewprivs --config.user 1234 --config.cmd nnp
image "e2e-test-images/glibc-dns-testing:2.1.1" fill_glibc_dns --config.cmd sh
image "e2e-test-images/kitten:1.8" fill_kitten --config.entrypoint /agnhost --config.cmd test-webserver
image "e2e-test-images/nautilus:1.8" fill_nautilus --config.entrypoint /agnhost --config.cmd test-webserver
for v in 1.27.0-2 1.28.0-2; do
  image "e2e-test-images/nginx:$v" fill_nginx --config.cmd httpd --config.cmd -f --config.cmd -p --config.cmd 80 \
    --config.cmd -h --config.cmd /usr/share/nginx/html --config.exposedports 80/tcp
done
if [ -x "$bin/sample-apiserver" ]; then
  image "e2e-test-images/sample-apiserver:1.29.2" fill_sample_apiserver --config.entrypoint /kube-sample-apiserver
  image "etcd:3.7.0-0" fill_etcd --config.cmd /usr/local/bin/etcd
fi
