# Helpers to build small one-layer images offline (umoci) and push them
# to a registry (skopeo), shared by the conformance and add-ons images.
# The caller sets $work (a scratch dir) and $reg (the registry).
# shellcheck shell=bash

# A busybox rootfs in $1 (plus /etc/passwd and group with the users given),
# from the busybox binary $2 (default: this machine's, /bin/busybox; the VM
# lab gives a foreign arch's from its guest).
rootfs() {
  local r=$1
  mkdir -p "$r/bin" "$r/etc" "$r/tmp" "$r/usr/local/bin"
  chmod 1777 "$r/tmp"
  cp "${2:-/bin/busybox}" "$r/bin/busybox"
  for app in $(/bin/busybox --list); do
    [ "$app" = busybox ] || ln -sf busybox "$r/bin/$app"
  done
  printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n' > "$r/etc/passwd"
  printf 'root:x:0:\nnogroup:x:65534:\n' > "$r/etc/group"
  printf 'hosts: files dns\n' > "$r/etc/nsswitch.conf"
}

# copy_libs ROOTFS FILE: the libraries (and loader) FILE links to, into
# ROOTFS at their own paths.
copy_libs() {
  local r=$1 lib
  # [[:space:]], not \s: Debian's default awk (mawk) reads \s as "s", and
  # the loader line was missed (the image's curl then was "not found").
  for lib in $(ldd "$2" | awk '/=>/ {print $3} /^[[:space:]]*\/lib/ {print $1}'); do
    [ -e "$r$lib" ] && continue
    mkdir -p "$r$(dirname "$lib")"
    cp -L "$lib" "$r$lib"
  done
}

# Copies a dynamic executable and the libraries it needs into rootfs $1.
with_libs() {
  local r=$1 exe=$2 dest=$3
  mkdir -p "$r$(dirname "$dest")"
  cp "$exe" "$r$dest"
  copy_libs "$r" "$exe"
  # A missing loader or library shows here (127: cannot execute), not as
  # a spec failing later.
  local rc=0
  chroot "$r" "$dest" --version >/dev/null 2>&1 </dev/null || rc=$?
  [ "$rc" != 127 ] || { echo "images.sh: $exe does not run inside its image" >&2; return 1; }
}

# image NAME:TAG BUILD_FN [umoci config flags...]: a one-layer image from
# the rootfs BUILD_FN fills, pushed to the registry.
image() {
  local ref=$1 fill=$2
  shift 2
  local l="$work/layout" tag
  tag=$(echo "$ref" | tr '/:' '__')
  [ -d "$l" ] || umoci init --layout "$l"
  umoci new --image "$l:$tag"
  umoci unpack --image "$l:$tag" "$work/$tag" >/dev/null
  "$fill" "$work/$tag/rootfs"
  umoci repack --image "$l:$tag" "$work/$tag" >/dev/null
  # The PATH Docker and containerd give an image that sets none.
  umoci config --image "$l:$tag" --config.env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "$@"
  skopeo --insecure-policy copy --quiet --dest-tls-verify=false "oci:$l:$tag" "docker://$reg/$ref"
  echo "image: $reg/$ref" >&2
}

# serve_registry DIR: a private docker-registry on the first free loopback
# port from 15000, storing under DIR; sets reg (host:port) and reg_pid.
serve_registry() {
  local dir=$1 port=15000
  while (echo >"/dev/tcp/127.0.0.1/$port") 2>/dev/null; do port=$((port + 1)); done
  reg=127.0.0.1:$port
  mkdir -p "$dir"
  printf 'version: 0.1\nlog: {level: error}\nstorage: {filesystem: {rootdirectory: %s}}\nhttp: {addr: "%s"}\n' \
    "$dir/data" "$reg" > "$dir/registry.yml"
  docker-registry serve "$dir/registry.yml" >"$dir/registry.log" 2>&1 &
  reg_pid=$!
  for _ in $(seq 1 50); do curl -sf "http://$reg/v2/" >/dev/null && return 0; sleep 0.2; done
  echo "serve_registry: docker-registry did not answer on $reg" >&2
  return 1
}
