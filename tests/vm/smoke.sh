# The smoke suite, sourced by tests/vm/run.sh once the node is Ready: a
# pod with limits on cgroup v2 and an httpGet readiness probe (the node
# reaching the pod's IP), logs and exec through the apiserver, and a
# reboot with the control plane unreachable.
# shellcheck shell=bash

kubectl apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Pod
metadata: {name: vm-smoke}
spec:
  terminationGracePeriodSeconds: 2
  containers:
  - name: app
    image: $REGISTRY/kinglet/busybox:1
    command: [sh, -c, 'echo started; i=0; while true; do i=\$((i+1)); echo \$i >/tmp/ticks; sleep 2; done']
    resources: {requests: {cpu: 100m, memory: 32Mi}, limits: {cpu: 200m, memory: 64Mi}}
  # Ready only when kinglet, in the guest's root network namespace,
  # reaches the pod's IP on its bridge (an httpGet probe, as users write).
  - name: web
    image: $REGISTRY/kinglet/busybox:1
    command: [sh, -c, 'mkdir -p /www && echo ok >/www/index.html && exec httpd -f -p 8080 -h /www']
    readinessProbe: {httpGet: {path: /, port: 8080}, periodSeconds: 2, timeoutSeconds: 5}
YAML
kubectl wait --for=condition=Ready pod/vm-smoke --timeout=300s >/dev/null ||
  { kubectl describe pod vm-smoke >&2; vm_ssh "$VM_KEY" 'ip -br addr; ip route; networkctl list --no-pager' >&2; fail "vm-smoke not Ready"; }
echo "vm: the node reaches its pod: httpGet readiness probe on $(kubectl get pod vm-smoke -o jsonpath='{.status.podIP}'):8080 passed"
uid=$(kubectl get pod vm-smoke -o jsonpath='{.metadata.uid}')

# The pod's cgroup on the unified hierarchy: in the Burstable tier, the
# container's limits in cgroup v2's files.
cg=$(vm_ssh "$VM_KEY" "find /sys/fs/cgroup -type d \( -name '*${uid//-/_}*' -o -name '*$uid*' \) | head -n1")
[ -n "$cg" ] || fail "no cgroup for pod $uid in the guest"
echo "vm: pod cgroup $cg"
case "$cg" in *urstable*) ;; *) fail "pod cgroup $cg is not in the burstable tier" ;; esac
limits=$(vm_ssh "$VM_KEY" "for d in $cg/*/; do [ -f \$d/memory.max ] && echo \$(cat \$d/memory.max) \$(cat \$d/cpu.max) \$(cat \$d/cpu.weight) \$(cat \$d/memory.swap.max); done")
echo "vm: container cgroup memory.max cpu.max cpu.weight memory.swap.max: $limits"
echo "$limits" | grep -q '^67108864 20000 100000 [0-9]* 0$' || fail "container limits on cgroup v2 (NoSwap: memory.swap.max 0): got '$limits'"

# Through the apiserver to the guest's kubelet API.
kubectl logs vm-smoke -c app | grep -qx started || fail "kubectl logs: no 'started'"
[ "$(kubectl exec vm-smoke -c app -- cat /proc/1/cmdline | tr '\0' ' ')" != "" ] || fail "kubectl exec printed nothing"
kubectl exec vm-smoke -c app -- sh -c 'test -s /tmp/ticks' || fail "kubectl exec: /tmp/ticks missing"
echo "vm: kubectl logs and exec through the apiserver work"

# The eviction manager's cgroup v2 events: memory.events and the pods'
# own PSI trigger armed (with the node's PSI).
armed=$(vm_ssh "$VM_KEY" "journalctl -u kinglet --no-pager | grep 'memory pressure is watched' | tail -n1")
echo "$armed" | grep -q 'psi=true pods_psi=true memory_events=true' || fail "eviction events on cgroup v2: $armed"
# Pod and container PSI in the summary API, through the apiserver.
summary=$(kubectl get --raw /api/v1/nodes/kinglet-vm/proxy/stats/summary)
echo "$summary" | python3 -c '
import json, sys
s = json.load(sys.stdin)
p = next(p for p in s["pods"] if p["podRef"]["name"] == "vm-smoke")
c = p["containers"][0]
for what, v in (("node", s["node"]), ("pod", p), ("container", c)):
    for r in ("cpu", "memory"):
        assert "some" in v[r].get("psi", {}), (what, r, v[r])
    assert "full" in v["io"]["psi"], (what, v.get("io"))
print("vm: PSI of the node, the pod and its container in /stats/summary: memory some total", c["memory"]["psi"]["some"]["total"])
' || fail "PSI missing from /stats/summary"

# cAdvisor's families of the pod on cgroup v2 (what Prometheus' kubelet
# job scrapes): the container's limits as cgroup v2 has them, its CPU and
# memory, the pod's network.
kubectl get --raw /api/v1/nodes/kinglet-vm/proxy/metrics/cadvisor | python3 -c '
import sys
want = {"container_spec_memory_limit_bytes": 67108864.0, "container_spec_cpu_quota": 20000.0}
got = {}
for l in sys.stdin:
    if l.startswith("#") or "pod=\"vm-smoke\"" not in l:
        continue
    name, v = l.split("{", 1)[0], float(l.rsplit(" ", 1)[1])
    if "container=\"app\"" in l:
        got[name] = v
    elif "container=\"\"" in l and "interface=" in l:
        got["pod " + name] = v
for k, v in want.items():
    assert got.get(k) == v, (k, got.get(k))
assert got.get("container_cpu_usage_seconds_total", 0) > 0, got
assert got.get("container_memory_working_set_bytes", 0) > 0, got
assert got.get("pod container_network_receive_bytes_total", 0) > 0, got
print("vm: /metrics/cadvisor on cgroup v2: app at %.2f s of CPU, %d KiB working set, limits 64Mi and 20000/100000" % (
    got["container_cpu_usage_seconds_total"], got["container_memory_working_set_bytes"] // 1024))
' || fail "/metrics/cadvisor on cgroup v2"

# A reboot with the control plane unreachable: kinglet comes back by
# itself (its unit is enabled) and runs the pod again, offline.
restarts_before=$(kubectl get pod vm-smoke -o jsonpath='{.status.containerStatuses[0].restartCount}')
vm_gate close
vm_ssh "$VM_KEY" 'systemctl reboot' || true
# The old sshd goes away before the new one answers.
for _ in $(seq 1 60); do vm_ssh "$VM_KEY" true 2>/dev/null || break; sleep 1; done
vm_wait_ssh 600
vm_wait_guest_pod_running vm-smoke "$uid" 300
offline_running=$(vm_uptime)
vm_ssh "$VM_KEY" 'systemd-analyze blame --no-pager | head -n 15; systemd-analyze critical-chain kinglet.service --no-pager; systemctl show kinglet -p ExecStartPre -p ExecMainStartTimestampMonotonic -p ActiveEnterTimestampMonotonic -p InactiveExitTimestampMonotonic; journalctl -b -u kinglet -o short-monotonic --no-pager | head -n 25' >&2 || true
echo "figure: vm $VM_ARCH $VM_RUNTIME reboot offline: kinglet active $(vm_since_boot kinglet) s after boot, the pod Running at $offline_running s"
# Running means its process: the ticks grow.
t1=$(vm_guest_pod_exec "$uid" cat /tmp/ticks) || fail "the pod does not run offline"
sleep 5
t2=$(vm_guest_pod_exec "$uid" cat /tmp/ticks) || fail "the pod does not run offline"
[ "${t2:-0}" -gt "${t1:-0}" ] || fail "the pod's ticks did not grow offline ($t1 then $t2)"

vm_gate open
vm_wait_node_ready 300
kubectl wait --for=condition=Ready pod/vm-smoke --timeout=300s >/dev/null || fail "vm-smoke not Ready back online"
r1=$(kubectl get pod vm-smoke -o jsonpath='{.status.containerStatuses[0].restartCount}')
sleep 20
r2=$(kubectl get pod vm-smoke -o jsonpath='{.status.containerStatuses[0].restartCount}')
[ "$r1" = "$r2" ] || fail "the container restarted again once online ($r1 then $r2)"
echo "vm: back online: restartCount $restarts_before before the reboot, $r1 after, steady"
# After the reboot: what these two write and allocate in the guest slows
# its next boot (the reboot figure, measured before them, stays
# comparable).
# Swap on (a swap file, as on a Pi): kinglet starts with it (the packaged
# config's failSwapOn: false) and reports it in nodeInfo.swap; with
# LimitedSwap, a Burstable container's memory.swap.max is its memory
# request's share of the swap, upstream's formula, and a container without a
# memory request gets none.
vm_ssh "$VM_KEY" 'fallocate -l 96M /swapfile && chmod 600 /swapfile && mkswap -q /swapfile && swapon /swapfile &&
  sed -i "s/swapBehavior: NoSwap/swapBehavior: LimitedSwap/" /etc/kinglet/config.yaml && systemctl restart kinglet' ||
  fail "swap on and LimitedSwap"
vm_wait_node_ready 120
read -r mem_kib swap_kib < <(vm_ssh "$VM_KEY" "awk '/^MemTotal:/ {m=\$2} /^SwapTotal:/ {s=\$2} END {print m, s}' /proc/meminfo")
[ "$(kubectl get node kinglet-vm -o jsonpath='{.status.nodeInfo.swap.capacity}')" = "$((swap_kib * 1024))" ] ||
  fail "nodeInfo.swap.capacity is not the guest's SwapTotal ($swap_kib KiB)"
kubectl apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Pod
metadata: {name: vm-swap}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - {name: swapper, image: $REGISTRY/kinglet/busybox:1, command: [sleep, "3600"], resources: {requests: {memory: 32Mi}, limits: {memory: 64Mi}}}
  - {name: none, image: $REGISTRY/kinglet/busybox:1, command: [sleep, "3600"]}
YAML
kubectl wait --for=condition=Ready pod/vm-swap --timeout=120s >/dev/null || fail "vm-swap not Ready"
swap_uid=$(kubectl get pod vm-swap -o jsonpath='{.metadata.uid}')
want=$(python3 -c "print(int((32 << 20) / ($mem_kib * 1024) * ($swap_kib * 1024)))")
# The kernel keeps it rounded down to a page.
page=$(vm_ssh "$VM_KEY" getconf PAGESIZE)
want=$(( want / page * page ))
got=$(vm_ssh "$VM_KEY" "d=\$(find /sys/fs/cgroup -type d -name 'pod$swap_uid' | head -n1); cat \$d/*/memory.swap.max | sort -n | tr '\n' ' '")
# (Through CRI the pause container's cgroup is among them too.)
{ echo " $got" | grep -q " 0 " && echo " $got" | grep -q " $want "; } ||
  fail "LimitedSwap: memory.swap.max of the pod's cgroups '$got', want 0 and $want"
echo "vm: LimitedSwap on cgroup v2: memory.swap.max $want for 32Mi of ${mem_kib} KiB with ${swap_kib} KiB of swap, 0 without a memory request"
kubectl delete pod vm-swap --wait=true --timeout=60s >/dev/null
# Swap off again and NoSwap back (in effect at the next restart: the
# upgrade's below).
vm_ssh "$VM_KEY" 'swapoff /swapfile && rm /swapfile && sed -i "s/swapBehavior: LimitedSwap/swapBehavior: NoSwap/" /etc/kinglet/config.yaml' ||
  fail "swap off"

# `kinglet upgrade` under systemd, the pod running throughout: first to a
# binary that exits at start (it passes --version, as a bad build would):
# the unit's guard puts the previous one back after its third start; then
# to a good one through the package, committed once healthy for 30 s. The
# container is never restarted.
upgrade_pod_unchanged() {
  local r t
  r=$(kubectl get pod vm-smoke -o jsonpath='{.status.containerStatuses[0].restartCount}')
  [ "$r" = "$restarts_before_upgrade" ] || fail "$1: the container restarted ($restarts_before_upgrade then $r)"
  t=$(vm_guest_pod_exec "$uid" cat /tmp/ticks) || fail "$1: the pod does not run"
  [ "${t:-0}" -gt "$ticks_before_upgrade" ] || fail "$1: the pod's ticks went from $ticks_before_upgrade to $t"
}
restarts_before_upgrade=$(kubectl get pod vm-smoke -o jsonpath='{.status.containerStatuses[0].restartCount}')
ticks_before_upgrade=$(vm_guest_pod_exec "$uid" cat /tmp/ticks) || fail "the pod does not run"
sum_before=$(vm_ssh "$VM_KEY" 'sha256sum /usr/bin/kinglet' | cut -d' ' -f1)
vm_ssh "$VM_KEY" 'printf "%s\n" "#!/bin/sh" "[ \"\$1\" = --version ] && { echo \"kinglet 9.9.9-broken\"; exit 0; }" "echo broken build >&2; exit 1" > /root/kinglet-broken && chmod 755 /root/kinglet-broken'
t0=$(date +%s.%N)
out=$(vm_ssh "$VM_KEY" 'kinglet upgrade --timeout 3m --commit-after 10s /root/kinglet-broken' 2>&1) && fail "the broken upgrade reported success: $out"
t1=$(date +%s.%N)
echo "$out" | grep -q 'rolled back: kinglet 9.9.9-broken was started 3 times' || fail "kinglet upgrade: $out"
[ "$(vm_ssh "$VM_KEY" 'sha256sum /usr/bin/kinglet' | cut -d' ' -f1)" = "$sum_before" ] || fail "/usr/bin/kinglet is not the previous binary after the rollback"
vm_ssh "$VM_KEY" 'systemctl is-active -q kinglet' || fail "kinglet not active after the rollback"
vm_wait_node_ready 120
upgrade_pod_unchanged "the rollback"
echo "figure: vm $VM_ARCH $VM_RUNTIME upgrade to a binary that exits at start: rolled back by the unit's guard in $(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.1f", b - a}') s, 0 container restarts"
# The good one as a user upgrades the package: dpkg -i of the .deb over
# the installed one (preinst keeps the replaced binary, postinst puts the
# new one on trial with `kinglet upgrade --installed`).
t0=$(date +%s.%N)
out=$(vm_ssh "$VM_KEY" 'dpkg -i /root/kinglet.deb' 2>&1) || fail "the package upgrade: $out"
t1=$(date +%s.%N)
echo "$out" | grep -q 'committed' || fail "the package upgrade: $out"
vm_ssh "$VM_KEY" 'grep -q "\"phase\": *\"Committed\"" /var/lib/kinglet/upgrade/state.json' || fail "no committed trial recorded"
vm_wait_node_ready 120
upgrade_pod_unchanged "the upgrade"
echo "figure: vm $VM_ARCH $VM_RUNTIME package upgrade (dpkg -i): committed after $(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.1f", b - a}') s (30 s of it healthy), 0 container restarts"

kubectl delete pod vm-smoke --wait=true --timeout=120s >/dev/null
