#!/usr/bin/env bash
# Prints the add-ons test's manifests (run.sh applies them), and writes
# metrics-server's kustomization under WORK/metrics-server:
#   manifests.sh REGISTRY ADDONS_DIR METRICS_SERVER WORK POD_CIDR DNS_IP
# kube-proxy is kubeadm's (cmd/kubeadm/app/phases/addons/proxy), CoreDNS
# upstream's (cluster/addons/dns/coredns/coredns.yaml.base), metrics-server
# its own (manifests/base), each with only the images, addresses and the
# differences below changed.
set -euo pipefail
reg=$1 addons=$2 metrics_server=$3 work=$4 pod_cidr=$5 dns_ip=$6
here=$(cd "$(dirname "$0")" && pwd)
k8s=$(awk '/^require k8s.io\/kubernetes/ {print $3}' "$here/../cluster/go.mod")
mod=$(go env GOMODCACHE)
apiserver=https://127.0.0.1:${KINGLET_APISERVER_PORT:?}

# kube-proxy. Differences from kubeadm's: the host's sysctls are left
# alone (no localhost NodePorts, so no route_localnet; conntrack limits and
# timeouts as they are); its metrics and healthz ports on loopback ports of
# their own; /lib/modules from a test dir when the host has none (this
# machine's kernel has no modules directory; kube-proxy only reads it).
# KUBE_PROXY_NODE: the one node it runs on (nodes sharing a host share its
# network stack: one kube-proxy writes its tables).
proxy_node=""
[ -z "${KUBE_PROXY_NODE:-}" ] || proxy_node=", kubernetes.io/hostname: $KUBE_PROXY_NODE"
modules=/lib/modules
[ -d /lib/modules ] || modules=$work/lib-modules
cat <<YAML
apiVersion: v1
kind: ServiceAccount
metadata: {name: kube-proxy, namespace: kube-system}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: kubeadm:node-proxier}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: system:node-proxier}
subjects: [{kind: ServiceAccount, name: kube-proxy, namespace: kube-system}]
---
kind: ConfigMap
apiVersion: v1
metadata: {name: kube-proxy, namespace: kube-system, labels: {app: kube-proxy}}
data:
  kubeconfig.conf: |-
    apiVersion: v1
    kind: Config
    clusters:
    - cluster:
        certificate-authority: /var/run/secrets/kubernetes.io/serviceaccount/ca.crt
        server: $apiserver
      name: default
    contexts:
    - context:
        cluster: default
        namespace: default
        user: default
      name: default
    current-context: default
    users:
    - name: default
      user:
        tokenFile: /var/run/secrets/kubernetes.io/serviceaccount/token
  config.conf: |-
    apiVersion: kubeproxy.config.k8s.io/v1alpha1
    kind: KubeProxyConfiguration
    clientConnection: {kubeconfig: /var/lib/kube-proxy/kubeconfig.conf}
    mode: iptables
    clusterCIDR: $pod_cidr
    iptables: {localhostNodePorts: false}
    conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
    metricsBindAddress: 127.0.0.1:20249
    healthzBindAddress: 127.0.0.1:20256
---
apiVersion: apps/v1
kind: DaemonSet
metadata:
  labels: {k8s-app: kube-proxy}
  name: kube-proxy
  namespace: kube-system
spec:
  selector:
    matchLabels: {k8s-app: kube-proxy}
  updateStrategy: {type: RollingUpdate}
  template:
    metadata:
      labels: {k8s-app: kube-proxy}
    spec:
      priorityClassName: system-node-critical
      containers:
      - name: kube-proxy
        image: $reg/kube-proxy:$k8s
        imagePullPolicy: IfNotPresent
        command:
        - /usr/local/bin/kube-proxy
        - --config=/var/lib/kube-proxy/config.conf
        - --hostname-override=\$(NODE_NAME)
        securityContext: {privileged: true}
        volumeMounts:
        - {mountPath: /var/lib/kube-proxy, name: kube-proxy}
        - {mountPath: /run/xtables.lock, name: xtables-lock, readOnly: false}
        - {mountPath: /lib/modules, name: lib-modules, readOnly: true}
        env:
        - name: NODE_NAME
          valueFrom: {fieldRef: {fieldPath: spec.nodeName}}
      hostNetwork: true
      serviceAccountName: kube-proxy
      volumes:
      - {name: kube-proxy, configMap: {name: kube-proxy}}
      - {name: xtables-lock, hostPath: {path: /run/xtables.lock, type: FileOrCreate}}
      - {name: lib-modules, hostPath: {path: $modules}}
      tolerations: [{operator: Exists}]
      nodeSelector: {kubernetes.io/os: linux$proxy_node}
---
YAML

# CoreDNS: upstream's manifest as the addon manager's sed fills it in.
coredns_version=$(cat "$addons/coredns.version")
sed -e "s/__DNS__DOMAIN__/cluster.local/g" -e "s/__DNS__SERVER__/$dns_ip/g" \
  -e "s/__DNS__MEMORY__LIMIT__/170Mi/g" \
  -e "s#registry.k8s.io/coredns/coredns:$coredns_version#$reg/coredns/coredns:$coredns_version#" \
  "$mod/k8s.io/kubernetes@$k8s/cluster/addons/dns/coredns/coredns.yaml.base"
echo "---"

# The test's own Service and the pod that looks it up.
cat <<YAML
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: default}
spec:
  replicas: 1
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web, addons-test: "true"}}
    spec:
      containers:
      - name: web
        image: $reg/kinglet-test/client:1
        command: [sh, -c, "mkdir -p /www && echo hello from web > /www/index.html && exec httpd -f -p 8080 -h /www"]
        ports: [{containerPort: 8080}]
        readinessProbe: {tcpSocket: {port: 8080}, periodSeconds: 2}
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: default}
spec:
  selector: {app: web}
  ports: [{port: 80, targetPort: 8080}]
---
apiVersion: v1
kind: Pod
metadata: {name: client, namespace: default, labels: {addons-test: "true"}}
spec:
  containers:
  - name: client
    image: $reg/kinglet-test/client:1
    command: [sleep, "3600"]
YAML

# metrics-server: its own base, with kind's and the project's own test
# overlay's --kubelet-insecure-tls (kinglet's serving certificate is
# self-signed unless serverTLSBootstrap is on).
ms_version=$(basename "$(dirname "$metrics_server")" | cut -d- -f3)
mkdir -p "$work/metrics-server"
cp -r "$mod/sigs.k8s.io/metrics-server@$ms_version/manifests/base" "$work/metrics-server/base"
chmod -R u+w "$work/metrics-server"
cat > "$work/metrics-server/kustomization.yaml" <<YAML
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources: [base]
images:
- name: gcr.io/k8s-staging-metrics-server/metrics-server
  newName: $reg/metrics-server/metrics-server
  newTag: $ms_version
patches:
- target: {group: apps, version: v1, kind: Deployment, name: metrics-server}
  patch: |
    - op: add
      path: /spec/template/spec/containers/0/args/-
      value: --kubelet-insecure-tls
YAML
