#!/usr/bin/env bash
# The cluster's own add-ons on a kinglet node, end to end:
#   tests/addons/run.sh [--runtime oci|cri] [--nodes 1|2] [--conformance FOCUS [--labels EXPR]
#                       [--serial] [--timeout DURATION] [--out DIR] [--procs N]]
# Builds kube-proxy and CoreDNS from their Go modules (build.sh, cached)
# and metrics-server (tests/cluster), makes their images and serves them
# from a private docker-registry, starts a control plane of its own whose
# `kubernetes` Service has an endpoint pods reach (the pods' bridge
# gateway), joins one kinglet node with clusterDNS set, and deploys, as a
# cluster operator would:
#  - kube-proxy as kubeadm deploys it (DaemonSet, privileged, hostNetwork,
#    the xtables lock and /lib/modules from the host, iptables mode);
#  - CoreDNS from upstream's own manifest (cluster/addons/dns/coredns)
#    behind the kube-dns Service;
#  - metrics-server from its own manifests (kustomize base), scraping the
#    node over the kubelet API, reached by the aggregator through its
#    Service's ClusterIP.
# Then a pod resolves kubernetes.default.svc.cluster.local and a test
# Service by name and reaches both through their ClusterIPs, and
# `kubectl top` answers. With --conformance, then runs the upstream specs
# matching FOCUS against this node (those that need Services by name or
# ClusterIP: kube-proxy and CoreDNS are there), JUnit and the table under
# target/addons/ (or --out): two at a time (--procs), those of the ginkgo label
# expression --labels (default: no [Disruptive], [Flaky], [Slow] or
# feature-gated spec), then with --serial the [Serial] ones one at a time.
# --nodes 2 joins a second kinglet node on a bridge and subnet of its own
# (pods of the two reach each other through the host's routes, their
# addresses unmasqueraded), for the specs that need two schedulable nodes
# (tests/conformance/full.sh). Prints a line per check and figures; exits
# non-zero on the first check that fails. Leaves nothing running: the node's pods,
# the control plane, the registry, the bridge, and kube-proxy's rules in
# the host's tables (kube-proxy --cleanup).
set -euo pipefail
cd "$(dirname "$0")/../.."
runtime=oci focus="" nodes=1 labels="" serial=no timeout=60m out=target/addons procs=2
usage="usage: run.sh [--runtime oci|cri] [--nodes 1|2] [--conformance FOCUS [--labels EXPR] [--serial] [--timeout DURATION] [--out DIR] [--procs N]]"
while [ $# -gt 0 ]; do
  case $1 in
    --runtime) runtime=$2; shift 2 ;;
    --nodes) nodes=$2; shift 2 ;;
    --conformance) focus=$2; shift 2 ;;
    --labels) labels=$2; shift 2 ;;
    --serial) serial=yes; shift ;;
    --timeout) timeout=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --procs) procs=$2; shift 2 ;;
    *) echo "$usage" >&2; exit 2 ;;
  esac
done
case $runtime in
  oci | cri) ;;
  *) echo "run.sh: --runtime $runtime: oci or cri" >&2; exit 2 ;;
esac
case $nodes in
  1 | 2) ;;
  *) echo "run.sh: --nodes $nodes: 1 or 2" >&2; exit 2 ;;
esac
# shellcheck source=../bench/lib.sh
. tests/bench/lib.sh
# shellcheck source=../images/lib.sh
. tests/images/lib.sh
start=$(date +%s)
# A control plane of its own, and a Service range of its own: kube-proxy's
# rules live in the host's tables, where they must not catch the Services
# of the suite's cluster (10.0.0.0/24).
export KINGLET_CLUSTER_DIR=/tmp/kinglet-addons-cluster
export KINGLET_ETCD_PORT=15379 KINGLET_ETCD_PEER_PORT=15380 KINGLET_APISERVER_PORT=19443
export KINGLET_KCM_PORT=23257 KINGLET_SCHEDULER_PORT=23259
export KINGLET_SERVICE_CIDR=10.0.1.0/24 KINGLET_METRICS_SERVER=none
bridge=kad0 subnet=10.244.79.0/24 gateway=10.244.79.1 dns_ip=10.0.1.10
# The second node's pods: a bridge and /24 of their own.
bridge2=kad1 subnet2=10.244.80.0/24 gateway2=10.244.80.1
export KINGLET_APISERVER_ADVERTISE=$gateway
kinglet=${KINGLET_BIN:-target/debug/kinglet}
[ -x "$kinglet" ] || cargo build --locked --bin kinglet >&2
mkdir -p "$out"

addons=$(tests/addons/build.sh | tail -n1)
metrics_server=$(tests/cluster/build-metrics-server.sh | tail -n1)
work=$(mktemp -d /tmp/kinglet-addons.XXXXXX)
reg_pid="" agents=() lock_made=""
cleanup() {
  set +e
  local a w
  for a in "${agents[@]}"; do kill "$a" 2>/dev/null && wait "$a" 2>/dev/null; done
  for w in "$work" "$work/b"; do
    [ -d "$w/root" ] && release_oci_root "$w/root"
    [ "$runtime" = cri ] && [ -d "$w/containerd" ] && tests/cluster/containerd-down.sh "$w/containerd" >/dev/null 2>&1
  done
  # What kube-proxy wrote into the host's tables goes with it.
  "$addons/kube-proxy" --cleanup >/dev/null 2>&1
  [ -n "$lock_made" ] && rm -f /run/xtables.lock
  [ -n "$reg_pid" ] && kill "$reg_pid" 2>/dev/null && wait "$reg_pid" 2>/dev/null
  ip link del "$bridge" 2>/dev/null
  ip link del "$bridge2" 2>/dev/null
  tests/cluster/down.sh >/dev/null 2>&1
  rm -rf "$work" "$KINGLET_CLUSTER_DIR"
}
trap cleanup EXIT
trap 'exit 143' TERM
trap 'exit 130' INT
[ -e /run/xtables.lock ] || lock_made=1

fail() {
  echo "addons: FAIL $*" >&2
  kubectl --kubeconfig "$admin" get pods -A -o wide >&2 || true
  kubectl --kubeconfig "$admin" get events -A --sort-by=.lastTimestamp 2>/dev/null | tail -n 20 >&2 || true
  local ns pod
  while read -r ns pod; do
    echo "--- logs of $ns/$pod (last, then previous, run)" >&2
    kubectl --kubeconfig "$admin" -n "$ns" logs "$pod" --all-containers --tail 15 >&2 || true
    kubectl --kubeconfig "$admin" -n "$ns" logs "$pod" --all-containers --tail 15 --previous >&2 || true
  done < <(kubectl --kubeconfig "$admin" get pods -A --no-headers -o custom-columns=:metadata.namespace,:metadata.name 2>/dev/null)
  tail -n 30 "$out/kinglet.log" >&2
  exit 1
}
# until SECONDS WHAT CMD...: retries CMD until it succeeds.
until_ok() {
  local limit=$1 what=$2 t0
  shift 2
  t0=$(date +%s)
  until "$@" >/dev/null 2>&1; do
    [ $(( $(date +%s) - t0 )) -lt "$limit" ] || fail "$what (not within $limit s)"
    sleep 1
  done
  echo "addons: ok $what ($(( $(date +%s) - t0 )) s)"
}

# The pods' bridge first, with the gateway address the apiserver
# advertises (the CNI bridge plugin takes the bridge as it finds it).
make_bridge() {
  ip link del "$1" 2>/dev/null || true
  ip link add "$1" type bridge
  ip addr add "$2/24" dev "$1"
  ip link set "$1" up
}
make_bridge "$bridge" "$gateway"
[ "$nodes" = 1 ] || make_bridge "$bridge2" "$gateway2"
serve_registry "$work/registry"
tests/addons/images.sh "$addons" "$metrics_server" "$reg"

tests/cluster/down.sh >/dev/null 2>&1 || true
rm -rf "$KINGLET_CLUSTER_DIR"
admin=$(tests/cluster/up.sh | tail -n1)
k() { kubectl --kubeconfig "$admin" "$@"; }
node=kinglet-addons node2=kinglet-addons-b
# Two nodes' pods reach each other through the host's routes with their
# own addresses (as a cluster network does): no masquerade between them.
masq=true pod_cidr=$subnet
[ "$nodes" = 1 ] || masq=false pod_cidr=10.244.0.0/16
# join WORK NODE BRIDGE SUBNET GATEWAY LOG: a kinglet node on its own
# bridge, dirs and cgroup root (two on one host must not count each
# other's pods); appends its pid to agents.
join() {
  local w=$1 n=$2 br=$3 sn=$4 gw=$5 log=$6
  mkdir -p "$w/net.d" "$w/lib-modules"
  cat > "$w/net.d/10-kinglet.conflist" <<JSON
{"cniVersion": "1.0.0", "name": "$n", "plugins": [
  {"type": "bridge", "bridge": "$br", "isGateway": true, "isDefaultGateway": true, "ipMasq": $masq,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": "$sn"}]], "dataDir": "$w/ipam"}},
  {"type": "portmap", "capabilities": {"portMappings": true}}]}
JSON
  start_kinglet_node "$kinglet" "$w" "$n" "$gw" "$runtime" "$reg" "$admin" "$log" \
    "clusterDNS: [$dns_ip]
clusterDomain: cluster.local
cgroupRoot: /$n" || fail "node $n Ready"
  agents+=("$agent_pid")
  echo "addons: ok node $n Ready"
}
join "$work" "$node" "$bridge" "$subnet" "$gateway" "$out/kinglet.log"
[ "$nodes" = 1 ] || join "$work/b" "$node2" "$bridge2" "$subnet2" "$gateway2" "$out/kinglet-b.log"

deploy_start=$(date +%s)
# One kube-proxy for the host's one network stack, on the first node.
KUBE_PROXY_NODE=$node tests/addons/manifests.sh "$reg" "$addons" "$metrics_server" "$work" "$pod_cidr" "$dns_ip" |
  k apply -f - >/dev/null
k apply -k "$work/metrics-server" >/dev/null

# kube-proxy: its pod runs, and its rules for the kube-dns Service are in
# the host's nat table.
until_ok 120 "kube-proxy Running" sh -c "kubectl --kubeconfig $admin -n kube-system get pods -l k8s-app=kube-proxy -o jsonpath='{.items[0].status.phase}' | grep -qx Running"
until_ok 60 "kube-proxy's rule for kube-dns in the host's nat table" sh -c "iptables -t nat -S KUBE-SERVICES | grep -q '$dns_ip/32'"
# CoreDNS is Ready only once its kubernetes plugin listed Services and
# EndpointSlices, through the `kubernetes` Service's ClusterIP.
until_ok 180 "CoreDNS Ready (it reached the API through 10.0.1.1)" \
  k -n kube-system wait --for=condition=Ready pod -l k8s-app=kube-dns --timeout=5s
until_ok 120 "web and client pods Ready" k wait --for=condition=Ready pod -l addons-test --timeout=5s
c() { k exec client -- "$@"; }
# check WHAT WANT CMD...: CMD in the client pod prints WANT within 30 s.
# Retried: a pod Ready is not yet its Service's rule in the host's tables
# (the EndpointSlice controller, then kube-proxy's next sync), nor a new
# Service in CoreDNS's cache; a loaded CI machine showed that gap.
check() {
  local what=$1 want=$2 got t0
  shift 2
  t0=$(date +%s)
  # The output decides, not the exit status: busybox nslookup exits 1 when
  # any search domain is NXDOMAIN, even with the answer printed.
  until got=$(c "$@" 2>&1); echo "$got" | grep -q -- "$want"; do
    if [ $(( $(date +%s) - t0 )) -ge 30 ]; then
      echo "$got" >&2
      fail "$what: wanted $want (not within 30 s)"
    fi
    sleep 1
  done
  echo "addons: ok $what ($(( $(date +%s) - t0 )) s)"
}
web_ip=$(k get service web -o jsonpath='{.spec.clusterIP}')
check "the client pod resolves kubernetes.default.svc.cluster.local to 10.0.1.1" "10.0.1.1" \
  nslookup kubernetes.default.svc.cluster.local
check "the client pod reaches the API through kubernetes.default" "^ok$" \
  curl -sk --max-time 10 https://kubernetes.default.svc.cluster.local/livez
check "the client pod resolves the Service web (search path) to $web_ip" "$web_ip" nslookup web
check "the client pod reaches web through its ClusterIP by name" "hello from web" \
  curl -s --max-time 10 http://web/
dns_ready=$(( $(date +%s) - deploy_start ))
until_ok 180 "metrics-server Ready" k -n kube-system wait --for=condition=Ready pod -l k8s-app=metrics-server --timeout=5s
until_ok 120 "kubectl top node $node" sh -c "kubectl --kubeconfig $admin top node $node --no-headers | grep -q '^$node '"
until_ok 120 "kubectl top pod (CoreDNS)" sh -c "kubectl --kubeconfig $admin -n kube-system top pod --no-headers | grep -q '^coredns-'"
rss=$(awk '/VmRSS/ {print $2}' "/proc/${agents[0]}/status")
pods=$(k get pods -A --field-selector "spec.nodeName=$node" --no-headers | wc -l)
echo "figure: addons ($runtime): kube-proxy, CoreDNS and the test Services answering ${dns_ready} s after the manifests were applied"
echo "figure: addons ($runtime): kinglet RSS $((rss / 1024)) MiB with $pods pods (kube-proxy, CoreDNS, metrics-server, web, client)"
echo "addons ($runtime): all checks passed in $(( $(date +%s) - start )) s"

# Upstream specs on this cluster, add-ons running.
if [ -n "$focus" ]; then
  bin=$(tests/conformance/build.sh --sample-apiserver | tail -n1)
  tests/conformance/images.sh "$bin" "$reg"
  # shellcheck source=../conformance/lib.sh
  . tests/conformance/lib.sh
  repo_list "$reg" > "$work/repo-list.yaml"
  t0=$(date +%s)
  rm -f "$out"/junit*.xml
  selection=${labels:-$CONFORMANCE_SELECTION}
  # suite LABELS PROCS REPORT LOG: one ginkgo run of the specs with LABELS.
  suite() {
    KUBE_TEST_REPO_LIST=$work/repo-list.yaml \
      "$bin/ginkgo" --procs="$2" --timeout="$timeout" --no-color --output-dir="$out" --junit-report="$3" \
      "$bin/e2e.test" -- --kubeconfig="$admin" --provider=local \
      --kube-test-repo-list="$work/repo-list.yaml" --report-dir="$out" \
      --ginkgo.focus="$focus" --ginkgo.label-filter="$1" --ginkgo.no-color \
      --ginkgo.timeout="$timeout" >"$out/$4" 2>&1 || true
  }
  if [ "$serial" = yes ]; then
    suite "($selection) && !Serial" "$procs" junit.xml e2e.log
    suite "($selection) && Serial" 1 junit-serial.xml e2e-serial.log
  else
    suite "$selection" "$procs" junit.xml e2e.log
  fi
  python3 tests/conformance/report.py "$out" "$(( $(date +%s) - t0 ))" "$runtime"
  head -n1 "$out/table.txt" | grep -q ' 0 failed' || fail "upstream specs failed (see $out/e2e.log)"
fi
