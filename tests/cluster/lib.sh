# Shared settings of the loopback control plane scripts. Everything lives
# under $KINGLET_CLUSTER_DIR; ports are private to these tests.
# shellcheck shell=bash
CLUSTER_DIR=${KINGLET_CLUSTER_DIR:-/tmp/kinglet-cluster}
ETCD_PORT=${KINGLET_ETCD_PORT:-12379}
ETCD_PEER_PORT=${KINGLET_ETCD_PEER_PORT:-12380}
APISERVER_PORT=${KINGLET_APISERVER_PORT:-16443}
KCM_PORT=${KINGLET_KCM_PORT:-20257}
SCHEDULER_PORT=${KINGLET_SCHEDULER_PORT:-20259}
METRICS_SERVER_PORT=${KINGLET_METRICS_SERVER_PORT:-20443}
# The Service range, and the address the apiserver advertises as the
# `kubernetes` Service's endpoint: loopback (no endpoint: pods cannot reach
# the API through the Service) unless a test that runs kube-proxy gives an
# address pods reach (the add-ons test: its pods' bridge gateway).
SERVICE_CIDR=${KINGLET_SERVICE_CIDR:-10.0.0.0/24}
KUBERNETES_SERVICE_IP=$(python3 -c 'import ipaddress,sys; print(ipaddress.ip_network(sys.argv[1])[1])' "$SERVICE_CIDR")
ADVERTISE_ADDRESS=${KINGLET_APISERVER_ADVERTISE:-127.0.0.1}
# host: metrics-server runs beside the control plane; none: not at all (a
# test deploys it as a pod).
METRICS_SERVER=${KINGLET_METRICS_SERVER:-host}
PKI=$CLUSTER_DIR/pki
PIDS=$CLUSTER_DIR/pids
LOGS=$CLUSTER_DIR/logs
SERVER=https://127.0.0.1:$APISERVER_PORT

# running NAME: true if the component started by these scripts is alive.
running() {
  local pid
  pid=$(cat "$PIDS/$1.pid" 2>/dev/null) || return 1
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null &&
    grep -q -- "$1" "/proc/$pid/cmdline" 2>/dev/null
}

# sign NAME CN O [extfile-lines]: a key and a certificate signed by the test CA.
sign() {
  local name=$1 cn=$2 o=$3 ext=${4:-}
  [ -s "$PKI/$name.crt" ] && return 0
  # Tests issue certificates concurrently: one signer at a time.
  exec 9>"$PKI/.lock"
  flock 9
  [ -s "$PKI/$name.crt" ] && { exec 9>&-; return 0; }
  local subj="/CN=$cn"
  [ -n "$o" ] && subj="/O=$o$subj"
  openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
    -keyout "$PKI/$name.key" -subj "$subj" -out "$PKI/$name.csr" 2>/dev/null
  printf '%s\n' "basicConstraints=CA:FALSE" "keyUsage=critical,digitalSignature,keyEncipherment" \
    "${ext:-extendedKeyUsage=clientAuth}" > "$PKI/$name.ext"
  openssl x509 -req -in "$PKI/$name.csr" -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" \
    -set_serial "0x$(openssl rand -hex 16)" -days 365 -sha256 -extfile "$PKI/$name.ext" -out "$PKI/$name.crt.tmp" 2>/dev/null
  chmod 600 "$PKI/$name.key"
  mv "$PKI/$name.crt.tmp" "$PKI/$name.crt"
  exec 9>&-
}

# kubeconfig FILE CERTNAME USER: a kubeconfig using that client certificate.
kubeconfig() {
  local file=$1 cert=$2 user=$3
  cat > "$file.tmp" <<KC
apiVersion: v1
kind: Config
clusters:
- name: kinglet-test
  cluster:
    server: $SERVER
    certificate-authority: $PKI/ca.crt
users:
- name: $user
  user:
    client-certificate: $PKI/$cert.crt
    client-key: $PKI/$cert.key
contexts:
- name: kinglet-test
  context: {cluster: kinglet-test, user: $user}
current-context: kinglet-test
KC
  chmod 600 "$file.tmp"
  mv "$file.tmp" "$file"
}

# containerd_pod_state SOCK: fills the arrays netns (the sandboxes' network
# namespaces, which containerd keeps in the host's netns dir) and cgroups
# (the pods' cgroups, /kubepods/<qos>/pod<uid>, the kubelet's to remove) of
# the containerd listening on SOCK.
containerd_pod_state() {
  local c="ctr --address $1 -n k8s.io" ctr_id ns cg
  netns=()
  cgroups=()
  [ -S "$1" ] || return 0
  for ctr_id in $($c containers ls -q 2>/dev/null); do
    while read -r ns; do netns+=("$ns"); done < <($c containers info "$ctr_id" 2>/dev/null |
      grep -o '"/var/run/netns/cni-[0-9a-f-]*"\|"/run/netns/cni-[0-9a-f-]*"' | tr -d '"' | sort -u)
    while read -r cg; do cgroups+=("$(dirname "$cg")"); done < <($c containers info "$ctr_id" 2>/dev/null |
      sed -n 's/.*"cgroupsPath": "\(\/kubepods[^"]*\)".*/\1/p')
  done
}

# release_ldflags VERSION: the -ldflags that stamp a k8s.io/kubernetes
# binary as that release, as upstream's release build does (the commit
# from the Go module proxy; run in a module that requires it).
release_ldflags() {
  local v=$1 commit minor ld="-s -w" p
  commit=$(go mod download -json "k8s.io/kubernetes@$v" | sed -n 's/.*"Hash": "\([0-9a-f]*\)".*/\1/p' | head -n1)
  minor=$(echo "$v" | cut -d. -f2)
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld+=" -X $p.gitVersion=$v -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitCommit=${commit:-unknown} -X $p.gitTreeState=clean"
  done
  echo "$ld"
}
