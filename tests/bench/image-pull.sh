#!/usr/bin/env bash
# Benchmark (prints figures, asserts nothing): pull + unpack of a ~50 MB
# image from a loopback registry by kinglet and by containerd (`ctr images
# pull`, which also unpacks into its overlayfs snapshotter), and kinglet's
# peak RSS during the pull and during an import of the same image from a file.
#   tests/bench/image-pull.sh [SIZE_MB] [RUNS]
set -euo pipefail
cd "$(dirname "$0")/../.."
size=${1:-50}
runs=${2:-3}
cargo build --release --locked --bin kinglet >&2
bin=${CARGO_TARGET_DIR:-$PWD/target}/release/kinglet
work=$(mktemp -d /tmp/kinglet-bench-pull.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  umount -R "$work/containerd/root" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

arch=$(uname -m); case $arch in x86_64) arch=amd64;; aarch64) arch=arm64;; armv7l) arch=arm;; esac
layers_bytes=$(python3 tests/bench/mkimage.py "$work/layout" bench "$size" "$arch")
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
cat > "$work/registry.yml" <<YML
version: 0.1
log: {level: error}
storage: {filesystem: {rootdirectory: $work/registry}}
http: {addr: 127.0.0.1:$port}
YML
docker-registry serve "$work/registry.yml" >"$work/registry.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 100); do curl -fs "http://127.0.0.1:$port/v2/" >/dev/null && break; sleep 0.1; done
skopeo --insecure-policy copy --quiet --dest-tls-verify=false "oci:$work/layout:bench" "docker://127.0.0.1:$port/bench/app:1"
skopeo --insecure-policy copy --quiet "oci:$work/layout:bench" "oci-archive:$work/app.tar:bench/app:1"
ref=127.0.0.1:$port/bench/app:1

# peak RSS (KiB) and wall time (s) of a command
measure() { /usr/bin/time -f '%M %e' "$@" 2>&1 >/dev/null | tail -n1; }
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

kl_rss=(); kl_time=(); im_rss=(); im_time=(); ctr_time=()
for i in $(seq 1 "$runs"); do
  read -r rss t < <(measure "$bin" --root-dir "$work/kl$i" images pull "$ref")
  kl_rss+=("$rss"); kl_time+=("$t")
  read -r rss t < <(measure "$bin" --root-dir "$work/im$i" images import "$work/app.tar")
  im_rss+=("$rss"); im_time+=("$t")
done
read -r idle_rss _ < <(measure "$bin" --root-dir "$work/kl1" images ls)

# containerd on a private root, state dir and socket.
mkdir -p "$work/containerd"
cat > "$work/containerd/config.toml" <<TOML
version = 2
root = "$work/containerd/root"
state = "$work/containerd/state"
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = "$work/containerd/containerd.sock"
TOML
containerd --config "$work/containerd/config.toml" >"$work/containerd.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 100); do [ -S "$work/containerd/containerd.sock" ] && break; sleep 0.1; done
for i in $(seq 1 "$runs"); do
  ctr -a "$work/containerd/containerd.sock" -n "bench$i" images pull --plain-http "$ref" >/dev/null
  # time it again from a cold content store in a fresh namespace... content
  # is shared across namespaces, so measure on a freshly pruned store instead.
  ctr -a "$work/containerd/containerd.sock" -n "bench$i" images rm "$ref" >/dev/null
  ctr -a "$work/containerd/containerd.sock" -n "bench$i" content prune references >/dev/null 2>&1 || true
  start=$(date +%s.%N)
  ctr -a "$work/containerd/containerd.sock" -n "cold$i" images pull --plain-http "$ref" >/dev/null
  end=$(date +%s.%N)
  ctr_time+=("$(echo "$end - $start" | bc -l)")
  ctr -a "$work/containerd/containerd.sock" -n "cold$i" images rm "$ref" >/dev/null
done
ctrd_rss=$(awk '/VmHWM/ {print $2}' "/proc/${pids[1]}/status")

kt=$(printf '%s\n' "${kl_time[@]}" | median); kr=$(printf '%s\n' "${kl_rss[@]}" | median)
it=$(printf '%s\n' "${im_time[@]}" | median); ir=$(printf '%s\n' "${im_rss[@]}" | median)
ct=$(printf '%s\n' "${ctr_time[@]}" | median)
echo "image: ${size} MB of content, $((layers_bytes / 1048576)) MiB compressed in 3 gzip layers; median of $runs runs; $(nproc) cores"
printf '%-44s %10s %14s\n' "" "wall (s)" "peak RSS (MiB)"
printf '%-44s %10s %14.1f\n' "kinglet images pull (download + unpack)" "$kt" "$(echo "$kr/1024" | bc -l)"
printf '%-44s %10s %14.1f\n' "kinglet images import (oci-archive file)" "$it" "$(echo "$ir/1024" | bc -l)"
printf '%-44s %10s %14.1f\n' "kinglet images ls (baseline process)" "-" "$(echo "$idle_rss/1024" | bc -l)"
printf '%-44s %10.2f %14.1f\n' "ctr images pull (containerd daemon)" "$ct" "$(echo "$ctrd_rss/1024" | bc -l)"
