# The full suite, sourced by tests/vm/run.sh after the smoke suite: eight
# pods of every kind through a reboot and a power cut with the control
# plane unreachable, what happens when it comes back, and boot-to-Ready
# online, and eviction under the guest's own memory pressure. (The 512 MB
# side by side with the upstream kubelet is the bench suite, bench.sh; its
# figures: docs/vm-lab.md, "Figures".)
# shellcheck shell=bash

img=$REGISTRY/kinglet/busybox:1
# Pods meant to ride out a long outage tolerate the node's unreachable and
# not-ready taints without a time limit, as edge users set them: a lone
# node's control plane may taint it NoExecute (upstream's full-disruption
# mode does not always hold it back, kubernetes issue 111385), and after
# the default 300 s the taint eviction deletes every pod without such a
# toleration, which kinglet then removes once back online, as the kubelet
# does. The offline part of this suite lasts longer than that.
offline='[{key: node.kubernetes.io/unreachable, operator: Exists, effect: NoExecute}, {key: node.kubernetes.io/not-ready, operator: Exists, effect: NoExecute}]'
# Every pod writes a counter where its volume is, once a second.
writer='i=0; while true; do i=$((i+1)); echo $i >"$OUT"; sleep 1; done'
kubectl apply -f - >/dev/null <<YAML
apiVersion: v1
kind: ConfigMap
metadata: {name: vm-config}
data: {greeting: hello-from-the-configmap}
---
apiVersion: v1
kind: Secret
metadata: {name: vm-secret}
stringData: {password: s3cret-offline}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: vm-web}
spec:
  replicas: 3
  selector: {matchLabels: {app: vm-web}}
  template:
    metadata: {labels: {app: vm-web}}
    spec:
      terminationGracePeriodSeconds: 2
      tolerations: $offline
      containers:
      - {name: web, image: $img, command: [sh, -c, '$writer'], env: [{name: OUT, value: /tmp/n}],
         resources: {requests: {cpu: 10m, memory: 8Mi}, limits: {memory: 32Mi}}}
---
apiVersion: v1
kind: Pod
metadata: {name: vm-configmap}
spec:
  terminationGracePeriodSeconds: 2
  tolerations: $offline
  containers:
  - {name: c, image: $img, command: [sh, -c, '$writer'], env: [{name: OUT, value: /tmp/n}],
     volumeMounts: [{name: cfg, mountPath: /cfg}]}
  volumes: [{name: cfg, configMap: {name: vm-config}}]
---
apiVersion: v1
kind: Pod
metadata: {name: vm-secret}
spec:
  terminationGracePeriodSeconds: 2
  tolerations: $offline
  containers:
  - {name: c, image: $img, command: [sh, -c, '$writer'], env: [{name: OUT, value: /tmp/n}],
     volumeMounts: [{name: s, mountPath: /secret}]}
  volumes: [{name: s, secret: {secretName: vm-secret}}]
---
apiVersion: v1
kind: Pod
metadata: {name: vm-token}
spec:
  terminationGracePeriodSeconds: 2
  tolerations: $offline
  containers:
  - {name: c, image: $img, command: [sh, -c, '$writer'], env: [{name: OUT, value: /tmp/n}],
     volumeMounts: [{name: t, mountPath: /token}]}
  volumes:
  - name: t
    projected: {sources: [{serviceAccountToken: {path: token, audience: vm-lab, expirationSeconds: 3600}}]}
---
apiVersion: v1
kind: Pod
metadata: {name: vm-tmpfs}
spec:
  terminationGracePeriodSeconds: 2
  tolerations: $offline
  containers:
  - {name: c, image: $img, command: [sh, -c, '$writer'], env: [{name: OUT, value: /mem/n}],
     volumeMounts: [{name: mem, mountPath: /mem}]}
  volumes: [{name: mem, emptyDir: {medium: Memory, sizeLimit: 4Mi}}]
---
apiVersion: v1
kind: Pod
metadata: {name: vm-ready}
spec:
  terminationGracePeriodSeconds: 2
  tolerations: $offline
  containers:
  - name: c
    image: $img
    command: [sh, -c, 'touch /tmp/ready; $writer']
    env: [{name: OUT, value: /tmp/n}]
    readinessProbe: {exec: {command: [test, -f, /tmp/ready]}, periodSeconds: 2}
YAML
# The static pod: a manifest in the guest's staticPodPath.
vm_ssh "$VM_KEY" "cat >/etc/kinglet/manifests/vm-static.yaml" <<YAML
apiVersion: v1
kind: Pod
metadata: {name: vm-static, namespace: default}
spec:
  terminationGracePeriodSeconds: 2
  tolerations: $offline
  containers:
  - {name: c, image: $img, command: [sh, -c, '$writer'], env: [{name: OUT, value: /tmp/n}]}
YAML
PODS=8
kubectl rollout status deploy/vm-web --timeout=300s >/dev/null || fail "vm-web did not roll out"
for p in vm-configmap vm-secret vm-token vm-tmpfs vm-ready vm-static-kinglet-vm; do
  until kubectl get pod "$p" >/dev/null 2>&1; do sleep 1; done
  kubectl wait --for=condition=Ready "pod/$p" --timeout=300s >/dev/null || { kubectl describe pod "$p" >&2; fail "$p not Ready"; }
done
echo "vm: $PODS pods Ready"

# vm_pod_uids: the uid of each pod in the guest's terms (a static pod's is
# its mirror's config.mirror annotation).
vm_pod_uids() {
  kubectl get pods -o jsonpath='{range .items[*]}{.metadata.annotations.kubernetes\.io/config\.mirror} {.metadata.uid}{"\n"}{end}' |
    awk '{print $1}'
}

# vm_wait_all_running N SECONDS: N pods Running in `kinglet pods ls`, and a
# process of each of UIDS (the global) running.
vm_wait_all_running() {
  local deadline=$(( $(date +%s) + $2 )) u
  while :; do
    local ok=1 n
    n=$(vm_ssh "$VM_KEY" "kinglet pods ls" 2>/dev/null | grep -c ' Running ' || true)
    if [ "${n:-0}" -ge "$1" ]; then
      for u in $UIDS; do vm_guest_pod_exec "$u" true 2>/dev/null || { ok=0; break; }; done
    else
      ok=0
    fi
    [ $ok = 1 ] && return 0
    [ "$(date +%s)" -lt "$deadline" ] || {
      vm_ssh "$VM_KEY" 'kinglet pods ls; journalctl -b -u kinglet --no-pager | tail -n 40' >&2
      fail "not all $1 pods run after $2 s"
    }
    sleep 1
  done
}

# vm_check_volumes: the configMap and secret as they were, offline.
vm_check_volumes() {
  local cm sec tok
  cm=$(kubectl get pod vm-configmap -o jsonpath='{.metadata.uid}')
  sec=$(kubectl get pod vm-secret -o jsonpath='{.metadata.uid}')
  tok=$(kubectl get pod vm-token -o jsonpath='{.metadata.uid}')
  [ "$(vm_guest_pod_exec "$cm" cat /cfg/greeting)" = hello-from-the-configmap ] || fail "the configMap volume lost its contents ($1)"
  [ "$(vm_guest_pod_exec "$sec" cat /secret/password)" = s3cret-offline ] || fail "the secret volume lost its contents ($1)"
  vm_guest_pod_exec "$tok" test -s /token/token || fail "the projected token is missing ($1)"
}

# While the control plane is away (its last state cached by the host's
# kubectl calls above, not asked again).
UIDS=$(vm_pod_uids)
vm_gate close

# (a) A clean reboot.
vm_ssh "$VM_KEY" 'systemctl reboot' || true
for _ in $(seq 1 60); do vm_ssh "$VM_KEY" true 2>/dev/null || break; sleep 1; done
vm_wait_ssh 600
vm_wait_all_running "$PODS" 600
echo "figure: vm $VM_ARCH $VM_RUNTIME reboot offline, $PODS pods: kinglet active $(vm_since_boot kinglet) s after boot, all pods running at $(vm_uptime) s"
vm_check_volumes "after the reboot"

# (b) A power cut while the pods write: a reset with no shutdown.
sleep 5
vm_monitor "$VM_WORK/monitor.sock" system_reset
sleep 2
vm_wait_ssh 600
vm_wait_all_running "$PODS" 600
echo "figure: vm $VM_ARCH $VM_RUNTIME power cut offline, $PODS pods: kinglet active $(vm_since_boot kinglet) s after boot, all pods running at $(vm_uptime) s"
vm_check_volumes "after the power cut"
vm_ssh "$VM_KEY" 'kinglet images ls' | grep -q kinglet/busybox || fail "the image store lost the image in the power cut"

# (c) A power cut during an image import: kinglet starts, the store is
# consistent (the image there or not, never half), and the import works.
vm_ssh "$VM_KEY" 'mkdir -p /root/imp && cd /root/imp && mkdir -p r/bin && cp /bin/busybox r/bin/ &&
  dd if=/dev/urandom of=r/blob bs=1M count=48 status=none && tar -C r -cf layer.tar . && echo ok' | grep -q ok ||
  fail "could not make a layer in the guest"
# A one-layer docker-save archive made in the guest (no tools needed).
vm_ssh "$VM_KEY" 'cd /root/imp && d=$(sha256sum layer.tar | cut -d" " -f1) &&
  printf "{\"architecture\":\"%s\",\"os\":\"linux\",\"config\":{\"Cmd\":[\"/bin/busybox\",\"sleep\",\"3600\"]},\"rootfs\":{\"type\":\"layers\",\"diff_ids\":[\"sha256:%s\"]}}" '"$VM_OCI_ARCH"' $d >config.json &&
  c=$(sha256sum config.json | cut -d" " -f1) && mv config.json $c.json && mkdir -p $d && mv layer.tar $d/layer.tar &&
  printf "[{\"Config\":\"%s.json\",\"RepoTags\":[\"kinglet.lab/big:1\"],\"Layers\":[\"%s/layer.tar\"]}]" $c $d >manifest.json &&
  tar -cf /root/big.tar $c.json $d manifest.json && rm -rf /root/imp && sync && echo ok' | grep -q ok || fail "could not make the archive"
# The copy into the import dir is not synced: the cut may leave it whole,
# short or absent, and kinglet must start whichever it finds.
vm_ssh "$VM_KEY" 'cp /root/big.tar /var/lib/kinglet/images/import/big.tar'
sleep 1
vm_monitor "$VM_WORK/monitor.sock" system_reset
sleep 2
vm_wait_ssh 600
vm_wait_all_running "$PODS" 600
vm_ssh "$VM_KEY" 'systemctl is-active kinglet' | grep -qx active || fail "kinglet is not active after a power cut during an import"
vm_ssh "$VM_KEY" 'kinglet images ls >/dev/null && kinglet images import /root/big.tar >/dev/null && kinglet images ls' |
  grep -q kinglet.lab/big || fail "the image store is not usable after a power cut during an import"
echo "vm: a power cut during an image import: kinglet up, the store usable, the import done again"

# Back online: a pod deleted meanwhile is removed, the rest converge and
# nothing restarts needlessly.
victim=$(kubectl get pods -l app=vm-web -o jsonpath='{.items[0].metadata.name}')
victim_uid=$(kubectl get pod "$victim" -o jsonpath='{.metadata.uid}')
kubectl delete pod "$victim" --wait=false >/dev/null
vm_gate open
vm_wait_node_ready 300
kubectl wait --for=delete "pod/$victim" --timeout=300s >/dev/null || fail "$victim, deleted while offline, is still there"
kubectl rollout status deploy/vm-web --timeout=300s >/dev/null || fail "vm-web did not converge"
for p in vm-configmap vm-secret vm-token vm-tmpfs vm-ready vm-static-kinglet-vm; do
  kubectl wait --for=condition=Ready "pod/$p" --timeout=300s >/dev/null || fail "$p not Ready back online"
done
vm_guest_pod_exec "$victim_uid" true 2>/dev/null && fail "$victim's containers still run in the guest"
r1=$(kubectl get pods -o jsonpath='{range .items[*]}{.metadata.name}={.status.containerStatuses[0].restartCount} {end}')
sleep 20
r2=$(kubectl get pods -o jsonpath='{range .items[*]}{.metadata.name}={.status.containerStatuses[0].restartCount} {end}')
[ "$r1" = "$r2" ] || fail "containers restarted once online: $r1 then $r2"
echo "vm: back online: $victim removed, all pods Ready, restart counts steady ($r2)"

# An online reboot: boot to kinglet, to node Ready (the first Ready status
# kinglet posts in the new boot, by the guest's clock against its btime).
rebooted=$(date +%s)
vm_ssh "$VM_KEY" 'systemctl reboot' || true
for _ in $(seq 1 60); do vm_ssh "$VM_KEY" true 2>/dev/null || break; sleep 1; done
vm_wait_ssh 600
hb=$(vm_wait_heartbeat_after kinglet-vm "$rebooted" 300) || fail "no Ready status from the new boot"
btime=$(vm_ssh "$VM_KEY" "awk '/^btime/ {print \$2}' /proc/stat")
echo "figure: vm $VM_ARCH $VM_RUNTIME reboot online: kinglet active $(vm_since_boot kinglet) s after boot, node Ready $(( $(date -d "$hb" +%s) - btime )) s after boot"
# Eviction under the guest's own memory pressure (no artificial cap): a
# pod filling a memory-backed emptyDir, 8 MiB a second, is evicted before
# the kernel's OOM killer acts; kinglet, its container monitor and the
# quiet pods live on.
# First every pod back after the online reboot, and its status settled.
UIDS=$(vm_pod_uids)
vm_wait_all_running "$PODS" 600
for p in $(kubectl get pods -o jsonpath='{.items[*].metadata.name}'); do
  kubectl wait --for=condition=Ready "pod/$p" --timeout=300s >/dev/null || fail "$p not Ready after the online reboot"
done
sleep 15
agent_pid=$(vm_ssh "$VM_KEY" 'systemctl show -p MainPID --value kinglet')
monitor_pid=$(vm_ssh "$VM_KEY" 'pgrep -f "kinglet monitor" | head -n1')
quiet_restarts=$(kubectl get pod vm-configmap -o jsonpath='{.status.containerStatuses[0].restartCount}')
kubectl apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Pod
metadata: {name: vm-hog}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: hog
    image: $img
    command: [sh, -c, 'i=0; while true; do dd if=/dev/zero of=/mem/f\$i bs=1M count=8 2>/dev/null; i=\$((i+1)); sleep 1; done']
    volumeMounts: [{name: mem, mountPath: /mem}]
  volumes: [{name: mem, emptyDir: {medium: Memory}}]
YAML
deadline=$(( $(date +%s) + 600 ))
until [ "$(kubectl get pod vm-hog -o jsonpath='{.status.reason}' 2>/dev/null)" = Evicted ]; do
  [ "$(date +%s)" -lt "$deadline" ] || { kubectl describe pod vm-hog >&2; fail "the memory hog was not evicted in 600 s"; }
  sleep 2
done
echo "vm: $(kubectl get pod vm-hog -o jsonpath='{.status.message}')"
ooms=$(vm_ssh "$VM_KEY" 'journalctl -k -b --no-pager | grep -c "Out of memory: Killed process" || true')
[ "${ooms:-0}" = 0 ] || fail "the kernel OOM killer acted $ooms times before or beside the eviction"
[ "$(vm_ssh "$VM_KEY" 'systemctl show -p MainPID --value kinglet')" = "$agent_pid" ] || fail "kinglet restarted under memory pressure"
vm_ssh "$VM_KEY" "kill -0 $monitor_pid" || fail "the container monitor died under memory pressure"
now=$(kubectl get pod vm-configmap -o jsonpath='{.status.containerStatuses[0].restartCount}')
[ "$now" = "$quiet_restarts" ] || fail "a quiet pod restarted under memory pressure ($quiet_restarts, then $now)"
echo "vm: memory pressure on the guest's own 512 MB: the hog evicted, no OOM kill, kinglet, its monitor and the quiet pods untouched"
kubectl delete pod vm-hog --wait=true --timeout=120s >/dev/null

kubectl delete deploy/vm-web pod/vm-configmap pod/vm-secret pod/vm-token pod/vm-tmpfs pod/vm-ready --wait=true --timeout=180s >/dev/null
vm_ssh "$VM_KEY" 'rm -f /etc/kinglet/manifests/vm-static.yaml'
