#!/usr/bin/env bash
# Starts the loopback control plane (etcd, kube-apiserver, kube-scheduler,
# kube-controller-manager) and the metrics-server add-on under $KINGLET_CLUSTER_DIR, building it first if
# needed. Idempotent: components already running are left alone, dead ones
# are started again on the data they had. Writes admin.kubeconfig.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
. "$here/lib.sh"
bin=$("$here/build.sh" | tail -n1)
metrics_server=$("$here/build-metrics-server.sh" | tail -n1)
mkdir -p "$PKI" "$PIDS" "$LOGS" "$CLUSTER_DIR/etcd" "$CLUSTER_DIR/kubeconfigs"
chmod 700 "$CLUSTER_DIR"

# The test CA and the control plane's certificates, made once.
if [ ! -s "$PKI/ca.crt" ]; then
  openssl req -x509 -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
    -keyout "$PKI/ca.key" -subj "/CN=kinglet-test-ca" -days 3650 -sha256 \
    -out "$PKI/ca.crt.tmp" 2>/dev/null
  mv "$PKI/ca.crt.tmp" "$PKI/ca.crt"
fi
sign apiserver kube-apiserver "" \
  "extendedKeyUsage=serverAuth
subjectAltName=IP:127.0.0.1,IP:$KUBERNETES_SERVICE_IP,IP:$ADVERTISE_ADDRESS,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
sign admin kinglet-admin system:masters
sign apiserver-kubelet-client kube-apiserver-kubelet-client system:masters
sign controller-manager system:kube-controller-manager ""
sign scheduler system:kube-scheduler ""
# The aggregator's client certificate (what it proxies metrics.k8s.io with).
sign front-proxy-client front-proxy-client ""
if [ ! -s "$PKI/sa.key" ]; then
  openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out "$PKI/sa.key" 2>/dev/null
  openssl pkey -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub"
fi
kubeconfig "$CLUSTER_DIR/admin.kubeconfig" admin kinglet-admin
kubeconfig "$CLUSTER_DIR/kubeconfigs/controller-manager.kubeconfig" controller-manager system:kube-controller-manager
kubeconfig "$CLUSTER_DIR/kubeconfigs/scheduler.kubeconfig" scheduler system:kube-scheduler

# start NAME ARGS...: runs a component in its own session, logging to a file.
start() {
  local name=$1 exe=$bin/$1; shift
  [ "$name" = metrics-server ] && exe=$metrics_server
  running "$name" && return 0
  setsid "$exe" "$@" >>"$LOGS/$name.log" 2>&1 < /dev/null &
  echo $! > "$PIDS/$name.pid"
}

wait_for() {
  local what=$1; shift
  for _ in $(seq 1 300); do
    "$@" >/dev/null 2>&1 && return 0
    sleep 0.2
  done
  echo "up.sh: $what did not become ready; see $LOGS" >&2
  tail -n 20 "$LOGS"/*.log >&2
  exit 1
}

start etcd --name kinglet-test --data-dir "$CLUSTER_DIR/etcd" \
  --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
  --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
  --initial-cluster "kinglet-test=http://127.0.0.1:$ETCD_PEER_PORT" \
  --listen-metrics-urls "" --unsafe-no-fsync --log-level warn
wait_for etcd curl -fsS "http://127.0.0.1:$ETCD_PORT/health"

# Requests by nodes are audited (metadata only), so benchmarks can count
# each node agent's API requests; pod deletions by anyone too, so a test can
# count what the node does from a deletion on.
cat > "$CLUSTER_DIR/audit-policy.yaml" <<'YAML'
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: Metadata
  userGroups: ["system:nodes"]
- level: Metadata
  verbs: [delete]
  resources: [{group: "", resources: [pods]}]
- level: None
YAML
# On loopback unless an address pods reach is advertised (then the
# `kubernetes` Service gets it as its endpoint, as in a real cluster).
bind=127.0.0.1 reconciler=none
if [ "$ADVERTISE_ADDRESS" != 127.0.0.1 ]; then bind=0.0.0.0 reconciler=lease; fi
# As in production: the Node authorizer and NodeRestriction are on.
start kube-apiserver --etcd-servers "http://127.0.0.1:$ETCD_PORT" \
  --audit-policy-file "$CLUSTER_DIR/audit-policy.yaml" --audit-log-path "$LOGS/audit.log" \
  --audit-log-maxsize 100 --audit-log-maxbackup 1 \
  --bind-address "$bind" --advertise-address "$ADVERTISE_ADDRESS" --secure-port "$APISERVER_PORT" \
  --endpoint-reconciler-type "$reconciler" \
  --tls-cert-file "$PKI/apiserver.crt" --tls-private-key-file "$PKI/apiserver.key" \
  --client-ca-file "$PKI/ca.crt" \
  --kubelet-client-certificate "$PKI/apiserver-kubelet-client.crt" \
  --kubelet-client-key "$PKI/apiserver-kubelet-client.key" \
  --kubelet-preferred-address-types InternalIP,Hostname \
  --service-account-issuer https://kubernetes.default.svc.cluster.local \
  --service-account-key-file "$PKI/sa.pub" --service-account-signing-key-file "$PKI/sa.key" \
  --service-cluster-ip-range "$SERVICE_CIDR" --allow-privileged=true \
  --authorization-mode Node,RBAC --enable-admission-plugins NodeRestriction \
  --enable-bootstrap-token-auth --profiling=false --v 1 \
  --requestheader-client-ca-file "$PKI/ca.crt" --requestheader-allowed-names front-proxy-client \
  --requestheader-username-headers X-Remote-User --requestheader-group-headers X-Remote-Group \
  --requestheader-extra-headers-prefix X-Remote-Extra- \
  --proxy-client-cert-file "$PKI/front-proxy-client.crt" --proxy-client-key-file "$PKI/front-proxy-client.key"
wait_for kube-apiserver kubectl --kubeconfig "$CLUSTER_DIR/admin.kubeconfig" get --raw /readyz

start kube-controller-manager --kubeconfig "$CLUSTER_DIR/kubeconfigs/controller-manager.kubeconfig" \
  --authentication-kubeconfig "$CLUSTER_DIR/kubeconfigs/controller-manager.kubeconfig" \
  --authorization-kubeconfig "$CLUSTER_DIR/kubeconfigs/controller-manager.kubeconfig" \
  --bind-address 127.0.0.1 --secure-port "$KCM_PORT" --leader-elect=false \
  --service-account-private-key-file "$PKI/sa.key" --root-ca-file "$PKI/ca.crt" \
  --cluster-signing-cert-file "$PKI/ca.crt" --cluster-signing-key-file "$PKI/ca.key" \
  --use-service-account-credentials=true --controllers '*,bootstrapsigner,tokencleaner' \
  --service-cluster-ip-range "$SERVICE_CIDR" --profiling=false --v 1
start kube-scheduler --kubeconfig "$CLUSTER_DIR/kubeconfigs/scheduler.kubeconfig" \
  --authentication-kubeconfig "$CLUSTER_DIR/kubeconfigs/scheduler.kubeconfig" \
  --authorization-kubeconfig "$CLUSTER_DIR/kubeconfigs/scheduler.kubeconfig" \
  --bind-address 127.0.0.1 --secure-port "$SCHEDULER_PORT" --leader-elect=false --profiling=false --v 1
wait_for kube-controller-manager curl -fsSk "https://127.0.0.1:$KCM_PORT/healthz"
wait_for kube-scheduler curl -fsSk "https://127.0.0.1:$SCHEDULER_PORT/healthz"
# metrics-server, as the add-on `kubectl top` reads: it scrapes each node's
# /metrics/resource on the port the node reports (kinglet's self-signed
# serving certificate: not verified, as kind and k3d set it up); the
# aggregator reaches it through an ExternalName service (loopback IPs are
# not valid endpoints).
admin_kc=$CLUSTER_DIR/admin.kubeconfig
if [ "$METRICS_SERVER" = host ]; then
  start metrics-server --kubeconfig "$admin_kc" --authentication-kubeconfig "$admin_kc" \
    --authorization-kubeconfig "$admin_kc" --bind-address 127.0.0.1 --secure-port "$METRICS_SERVER_PORT" \
    --cert-dir "$CLUSTER_DIR/metrics-server" --kubelet-insecure-tls --kubelet-use-node-status-port \
    --kubelet-preferred-address-types InternalIP --metric-resolution 10s --kubelet-request-timeout 5s --v 1
  kubectl --kubeconfig "$admin_kc" apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Service
metadata: {name: metrics-server, namespace: kube-system}
spec: {type: ExternalName, externalName: localhost}
---
apiVersion: apiregistration.k8s.io/v1
kind: APIService
metadata: {name: v1beta1.metrics.k8s.io}
spec:
  group: metrics.k8s.io
  version: v1beta1
  service: {name: metrics-server, namespace: kube-system, port: $METRICS_SERVER_PORT}
  insecureSkipTLSVerify: true
  groupPriorityMinimum: 100
  versionPriority: 100
YAML
  wait_for metrics.k8s.io kubectl --kubeconfig "$admin_kc" get --raw /apis/metrics.k8s.io/v1beta1
fi
# Pods can only be created once the default service account exists.
wait_for "default service account" kubectl --kubeconfig "$CLUSTER_DIR/admin.kubeconfig" -n default get serviceaccount default
echo "$CLUSTER_DIR/admin.kubeconfig"
