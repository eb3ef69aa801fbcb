# Shared by the benchmark scripts.
# shellcheck shell=bash

# release_oci_root ROOT: stops the container monitor of a (stopped) kinglet
# with that root dir after deleting its containers, and removes what its
# sandboxes left: network namespace mounts, pod cgroups, mounts under ROOT.
release_oci_root() {
  local root=$1 m parent n h
  if [ -S "$root/runtime/oci/monitor/monitor.sock" ]; then
    python3 - "$root/runtime/oci/monitor/monitor.sock" <<'PY' || true
import json, socket, sys
def call(req):
    s = socket.socket(socket.AF_UNIX); s.settimeout(10); s.connect(sys.argv[1])
    s.sendall((json.dumps(req) + "\n").encode()); d = b""
    while not d.endswith(b"\n"):
        c = s.recv(65536)
        if not c: break
        d += c
    return json.loads(d) if d else {}
for r in call({"op": "list"}).get("records", []):
    call({"op": "delete", "id": r["id"]})
try: call({"op": "exit"})
except Exception: pass
PY
  fi
  for m in "$root"/runtime/oci/sandboxes/*/meta.json; do
    [ -f "$m" ] || continue
    parent=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["cgroup_parent"])' "$m")
    for h in /sys/fs/cgroup /sys/fs/cgroup/*; do rmdir "$h/$parent" 2>/dev/null; done
  done
  awk -v d="$root/" 'index($5, d) == 1 {print $5}' /proc/self/mountinfo | sort -r |
    while read -r n; do umount -l "$n" 2>/dev/null; done
  return 0
}
