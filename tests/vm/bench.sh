# The 512 MB board, side by side (sourced by tests/vm/run.sh --suite
# bench once kinglet is installed and its node Ready): in the same guest,
# first kinglet (as installed, in-process by default), then the upstream
# kubelet with the guest's containerd (Debian's), each measured the same
# way, one after the other:
#   boot to node Ready   an online reboot with the agent's unit enabled;
#                        the first Ready heartbeat of the new boot, by the
#                        guest's clock against its btime
#   memory at 0, 10, 30 pods   MemAvailable (what is left for pods) and the
#                        RSS and PSS of the agent and its runtime side
#                        (kinglet and its monitor; kubelet, containerd,
#                        the shims and the sandboxes' pause processes),
#                        20 s after the level is reached
#   pod startup p50/p90  each of the 30 pods created alone, from `kubectl
#                        create` to Running seen by a watch (the image
#                        already present)
# Prints `figure:` lines and the table (also target/vm/bench-ARCH.md).
# Asserts only that both agents run the 30 pods.
# shellcheck shell=bash

BENCH_PODS=30
BENCH_LEVELS="10 30"
BENCH_SETTLE=${KINGLET_VM_BENCH_SETTLE:-20}
mkdir -p "$VM_ROOT/target/vm"
bench_md=$VM_ROOT/target/vm/bench-$VM_ARCH.md

# bench_memory: "MEMAVAILABLE_KIB RSS_KIB PSS_KIB PROCESSES" of the agent
# and its runtime side in the guest (no python there: /proc read by sh).
bench_memory() {
  vm_ssh "$VM_KEY" 'sh -s' <<'SH'
rss=0 pss=0 n=0
for p in /proc/[0-9]*; do
  c=$(cat "$p/comm" 2>/dev/null) || continue
  case "$c" in
    kinglet | kubelet | containerd | containerd-shim*) ;;
    sleep)
      # A pause process: the sandbox image's sleep, a child of a shim.
      tr '\0' ' ' <"$p/cmdline" 2>/dev/null | grep -q '^/bin/sleep 2147483647' || continue
      pp=$(awk '/^PPid:/ {print $2}' "$p/status" 2>/dev/null)
      case "$(cat "/proc/$pp/comm" 2>/dev/null)" in containerd-shim*) ;; *) continue ;; esac ;;
    *) continue ;;
  esac
  r=$(awk '/^VmRSS:/ {print $2}' "$p/status" 2>/dev/null)
  s=$(awk '/^Pss:/ {print $2}' "$p/smaps_rollup" 2>/dev/null)
  rss=$((rss + ${r:-0})) pss=$((pss + ${s:-0})) n=$((n + 1))
done
echo "$(awk '/^MemAvailable:/ {print $2}' /proc/meminfo) $rss $pss $n"
SH
}

# bench_pod NAME: a BestEffort pod on NODE that sleeps.
bench_pod() {
  kubectl create -f - >/dev/null <<YAML
apiVersion: v1
kind: Pod
metadata: {name: $1, labels: {bench: vm}}
spec:
  nodeName: $bench_node
  terminationGracePeriodSeconds: 1
  containers:
  - {name: c, image: $REGISTRY/kinglet/busybox:1, command: [sleep, "100000000"]}
YAML
}

# bench_boot UNIT: an online reboot; prints the seconds from boot to the
# agent's unit active and to its node's first Ready heartbeat.
bench_boot() {
  local rebooted hb btime
  rebooted=$(date +%s)
  sleep 1
  vm_ssh "$VM_KEY" 'systemctl reboot' || true
  for _ in $(seq 1 60); do vm_ssh "$VM_KEY" true 2>/dev/null || break; sleep 1; done
  vm_wait_ssh 600
  hb=$(vm_wait_heartbeat_after "$bench_node" "$rebooted" 300) || fail "$bench_node: no Ready heartbeat from the new boot"
  btime=$(vm_ssh "$VM_KEY" "awk '/^btime/ {print \$2}' /proc/stat")
  echo "$(vm_since_boot "$1") $(( $(date -d "$hb" +%s) - btime ))"
}

# bench_agent LABEL UNIT: the whole measurement of one agent, whose node
# ($bench_node) is Ready and whose unit starts it at boot.
bench_agent() {
  local label=$1 unit=$2 boot m i t0 t1 times=()
  boot=$(bench_boot "$unit")
  echo "figure: vm $VM_ARCH bench $label: unit active ${boot% *} s after boot, node Ready ${boot#* } s after boot"
  # The image pulled once (every startup below finds it present).
  bench_pod bench-warm
  kubectl wait --for=jsonpath='{.status.phase}'=Running pod/bench-warm --timeout=600s >/dev/null ||
    fail "$label: the warm-up pod did not run"
  kubectl delete pod bench-warm --wait=true --timeout=300s >/dev/null
  sleep "$BENCH_SETTLE"
  m=$(bench_memory)
  echo "figure: vm $VM_ARCH bench $label 0 pods: $(bench_memory_words "$m")"
  echo "$label 0 $m" >>"$VM_WORK/bench.txt"
  for i in $(seq 1 "$BENCH_PODS"); do
    t0=$(date +%s%N)
    bench_pod "bench-$i"
    kubectl wait --for=jsonpath='{.status.phase}'=Running "pod/bench-$i" --timeout=600s >/dev/null ||
      fail "$label: bench-$i did not run ($(kubectl get pod "bench-$i" -o jsonpath='{.status}'))"
    t1=$(date +%s%N)
    times+=($(( (t1 - t0) / 1000000 )))
    case " $BENCH_LEVELS " in
      *" $i "*)
        sleep "$BENCH_SETTLE"
        m=$(bench_memory)
        echo "figure: vm $VM_ARCH bench $label $i pods: $(bench_memory_words "$m")"
        echo "$label $i $m" >>"$VM_WORK/bench.txt" ;;
    esac
  done
  local sorted
  sorted=$(printf '%s\n' "${times[@]}" | sort -n)
  local p50 p90
  p50=$(echo "$sorted" | awk -v n="${#times[@]}" 'NR == int((n + 1) / 2)')
  p90=$(echo "$sorted" | awk -v n="${#times[@]}" 'NR == int(n * 0.9 + 0.5)')
  echo "figure: vm $VM_ARCH bench $label pod startup: p50 $p50 ms, p90 $p90 ms ($BENCH_PODS pods, one at a time)"
  echo "$label startup $p50 $p90" >>"$VM_WORK/bench.txt"
  echo "$label boot ${boot% *} ${boot#* }" >>"$VM_WORK/bench.txt"
  kubectl delete pods -l bench=vm --wait=true --timeout=600s >/dev/null
}

bench_memory_words() {
  # shellcheck disable=SC2086
  set -- $1
  echo "MemAvailable $(( $1 / 1024 )) MiB, agent and runtime RSS $(( $2 / 1024 )) MiB, PSS $(( $3 / 1024 )) MiB ($4 processes)"
}

# The upstream kubelet into the guest: the static build the host bench
# uses (tests/bench/build-kubelet.sh), Debian's containerd (set up as
# --runtime cri sets it up), a node of its own, a unit enabled at boot.
bench_install_kubelet() {
  local kubelet kc
  kubelet=$(tests/bench/build-kubelet.sh | tail -n1)
  kc=$(tests/cluster/node-kubeconfig.sh kubelet-vm | tail -n1)
  kubectl config view --flatten --kubeconfig "$kc" | sed "s#https://127.0.0.1:#https://$VM_HOST_IP:#" >"$VM_WORK/kubelet.kubeconfig"
  vm_scp "$VM_KEY" "$kubelet" "$VM_WORK/kubelet.kubeconfig" "root@$VM_GUEST_IP:/root/"
  vm_containerd_setup
  vm_ssh "$VM_KEY" "set -e
    install -m 755 /root/kubelet /usr/local/bin/kubelet
    install -D -m 600 /root/kubelet.kubeconfig /etc/kubelet-bench/kubeconfig
    cat >/etc/kubelet-bench/config.yaml <<YAML
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
authentication: {anonymous: {enabled: false}, webhook: {enabled: true}, x509: {clientCAFile: /etc/kinglet/pki/ca.crt}}
authorization: {mode: Webhook}
cgroupDriver: cgroupfs
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
readOnlyPort: 0
YAML
    cat >/etc/systemd/system/kubelet-bench.service <<UNIT
[Unit]
Description=the upstream kubelet (VM lab bench)
After=containerd.service network-online.target
Wants=containerd.service
[Service]
ExecStart=/usr/local/bin/kubelet --config /etc/kubelet-bench/config.yaml --kubeconfig /etc/kubelet-bench/kubeconfig --hostname-override kubelet-vm --node-ip $VM_GUEST_IP --v 1
Restart=always
[Install]
WantedBy=multi-user.target
UNIT
    systemctl daemon-reload
    systemctl enable --now kubelet-bench >/dev/null 2>&1"
}

: >"$VM_WORK/bench.txt"
bench_node=kinglet-vm
bench_agent "kinglet-$VM_RUNTIME" kinglet
# kinglet off for good (its unit disabled, its pods gone), then the
# upstream kubelet and containerd in the same guest.
left=$(vm_ssh "$VM_KEY" 'systemctl disable --now kinglet >/dev/null 2>&1; kinglet pods ls | tail -n +2 | wc -l')
[ "$left" = 0 ] || fail "kinglet still lists $left pods after the bench's were deleted"
kubectl delete node kinglet-vm --wait=false >/dev/null
bench_install_kubelet
bench_node=kubelet-vm
deadline=$(( $(date +%s) + 300 ))
until [ "$(kubectl get node kubelet-vm -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" = True ]; do
  [ "$(date +%s)" -lt "$deadline" ] || { vm_ssh "$VM_KEY" 'journalctl -u kubelet-bench --no-pager | tail -n 40' >&2; fail "the upstream kubelet's node not Ready"; }
  sleep 2
done
bench_agent kubelet-containerd kubelet-bench

# The table: one column per agent.
{
  echo "512 MB $VM_ARCH guest (qemu TCG, 1 vCPU, Debian 12, cgroup v2), $(date -u +%F), \`tests/vm/run.sh --arch $VM_ARCH --suite bench\`"
  echo
  awk -v runtime="$VM_RUNTIME" '
    { k = $1; ks[k] = 1 }
    $2 == "boot" { boot[k] = $3 " / " $4 " s" }
    $2 == "startup" { st[k] = $3 " / " $4 " ms" }
    $2 ~ /^[0-9]+$/ { avail[k, $2] = int($3 / 1024) " MiB"; rss[k, $2] = int($4 / 1024) " / " int($5 / 1024) " MiB" }
    END {
      a = "kinglet-" runtime; b = "kubelet-containerd"
      printf "| | kinglet (%s) | upstream kubelet + containerd |\n|---|---|---|\n", runtime == "oci" ? "in-process" : "CRI, containerd"
      printf "| boot to the agent'"'"'s unit active / to node Ready | %s | %s |\n", boot[a], boot[b]
      n = split("0 10 30", lv, " ")
      for (i = 1; i <= n; i++) printf "| MemAvailable, %d pods | %s | %s |\n", lv[i], avail[a, lv[i]], avail[b, lv[i]]
      for (i = 1; i <= n; i++) printf "| agent + runtime RSS / PSS, %d pods | %s | %s |\n", lv[i], rss[a, lv[i]], rss[b, lv[i]]
      printf "| pod startup p50 / p90 (30 pods, one at a time) | %s | %s |\n", st[a], st[b]
    }' "$VM_WORK/bench.txt"
} | tee "$bench_md"
