//! kinglet's own Prometheus metrics, under upstream kubelet names where
//! they exist: counters and histograms the pod parts update as things
//! happen (probes, pod starts, PLEG relists), and gauges read at scrape
//! time (running pods and containers), the certificates' time left and
//! renewal errors, evictions, and every runtime call's count, errors and
//! duration (upstream's `kubelet_runtime_operations_*`, recorded by
//! [`crate::pods::kuberuntime::instrumented`]). Served on the kubelet API's
//! `/metrics` as OpenMetrics text.

use std::sync::Mutex;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProbeLabels {
    pub probe_type: String,
    pub result: String,
    pub container: String,
    pub pod: String,
    pub namespace: String,
    pub pod_uid: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabels {
    pub container_state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SignalLabels {
    pub eviction_signal: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OperationLabels {
    pub operation_type: &'static str,
}

/// A histogram with upstream's runtime operation buckets:
/// `ExponentialBuckets(.005, 2.5, 14)`.
type OperationHistograms = Family<OperationLabels, Histogram, fn() -> Histogram>;

fn operation_histogram() -> Histogram {
    Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
        0.005, 2.5, 14,
    ))
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NodeLabels {
    pub node: String,
}

/// The registry and the metrics in it.
pub struct Metrics {
    registry: Registry,
    pub probes: Family<ProbeLabels, Counter>,
    pub pod_start: Histogram,
    pub pleg_relist: Histogram,
    pub running_pods: Gauge,
    pub running_containers: Family<StateLabels, Gauge>,
    node_name: Family<NodeLabels, Gauge>,
    /// `kubelet_evictions`, by eviction signal.
    pub evictions: Family<SignalLabels, Counter>,
    client_ttl: Gauge,
    server_ttl: Gauge,
    client_renew_errors: Counter,
    server_renew_errors: Counter,
    runtime_operations: Family<OperationLabels, Counter>,
    runtime_errors: Family<OperationLabels, Counter>,
    runtime_durations: OperationHistograms,
    /// Encoding takes the registry by reference; scrapes are serialized.
    encode: Mutex<()>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new("")
    }
}

impl Metrics {
    pub fn new(node: &str) -> Self {
        // Upstream's buckets: pod start in seconds up to 20 minutes, PLEG
        // relists from 5 ms.
        let pod_start = Histogram::new([
            0.5, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 20.0, 30.0, 45.0, 60.0, 120.0, 180.0,
            240.0, 300.0, 360.0, 480.0, 600.0, 900.0, 1200.0,
        ]);
        let pleg_relist = Histogram::new([
            0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
        ]);
        let m = Metrics {
            registry: Registry::default(),
            evictions: Family::default(),
            client_ttl: Gauge::default(),
            server_ttl: Gauge::default(),
            client_renew_errors: Counter::default(),
            server_renew_errors: Counter::default(),
            runtime_operations: Family::default(),
            runtime_errors: Family::default(),
            runtime_durations: Family::new_with_constructor(operation_histogram),
            probes: Family::default(),
            pod_start,
            pleg_relist,
            running_pods: Gauge::default(),
            running_containers: Family::default(),
            node_name: Family::default(),
            encode: Mutex::new(()),
        };
        m.node_name
            .get_or_create(&NodeLabels { node: node.into() })
            .set(1);
        m.registered()
    }

    /// Registers every metric under upstream's name and help.
    fn registered(mut self) -> Self {
        let r = &mut self.registry;
        r.register(
            "prober_probe",
            "Cumulative number of a liveness, readiness or startup probe for a container by result",
            self.probes.clone(),
        );
        r.register(
            "kubelet_pod_start_duration_seconds",
            "Duration in seconds from kubelet seeing a pod for the first time to the pod starting to run",
            self.pod_start.clone(),
        );
        r.register(
            "kubelet_pleg_relist_duration_seconds",
            "Duration in seconds for relisting pods in PLEG",
            self.pleg_relist.clone(),
        );
        r.register(
            "kubelet_running_pods",
            "Number of pods that have a running pod sandbox",
            self.running_pods.clone(),
        );
        r.register(
            "kubelet_running_containers",
            "Number of containers currently running",
            self.running_containers.clone(),
        );
        r.register(
            "kubelet_node_name",
            "The node's name. The count is always 1",
            self.node_name.clone(),
        );
        r.register(
            "kubelet_evictions",
            "Cumulative number of pod evictions by eviction signal",
            self.evictions.clone(),
        );
        r.register(
            "kubelet_certificate_manager_client_ttl_seconds",
            "Gauge of the TTL (time-to-live) of the Kubelet's client certificate",
            self.client_ttl.clone(),
        );
        r.register(
            "kubelet_certificate_manager_server_ttl_seconds",
            "Gauge of the shortest TTL (time-to-live) of the Kubelet's serving certificate",
            self.server_ttl.clone(),
        );
        r.register(
            "kubelet_certificate_manager_client_expiration_renew_errors",
            "Counter of certificate renewal errors",
            self.client_renew_errors.clone(),
        );
        r.register(
            "kubelet_server_expiration_renew_errors",
            "Counter of certificate renewal errors",
            self.server_renew_errors.clone(),
        );
        r.register(
            "kubelet_runtime_operations",
            "Cumulative number of runtime operations by operation type",
            self.runtime_operations.clone(),
        );
        r.register(
            "kubelet_runtime_operations_errors",
            "Cumulative number of runtime operation errors by operation type",
            self.runtime_errors.clone(),
        );
        r.register(
            "kubelet_runtime_operations_duration_seconds",
            "Duration in seconds of runtime operations. Broken down by operation type",
            self.runtime_durations.clone(),
        );
        self
    }

    /// One runtime call: its operation type (upstream's names), how long
    /// it took and whether it failed.
    pub fn runtime_operation(&self, op: &'static str, took: Duration, failed: bool) {
        let l = OperationLabels { operation_type: op };
        self.runtime_operations.get_or_create(&l).inc();
        self.runtime_durations
            .get_or_create(&l)
            .observe(took.as_secs_f64());
        if failed {
            self.runtime_errors.get_or_create(&l).inc();
        }
    }

    /// A certificate's time left, in seconds.
    pub fn certificate_ttl(&self, kind: crate::certificate::kind::Kind, secs: i64) {
        match kind {
            crate::certificate::kind::Kind::Client => self.client_ttl.set(secs),
            crate::certificate::kind::Kind::Serving => self.server_ttl.set(secs),
        };
    }

    /// A failed certificate renewal.
    pub fn certificate_renew_error(&self, kind: crate::certificate::kind::Kind) {
        match kind {
            crate::certificate::kind::Kind::Client => self.client_renew_errors.inc(),
            crate::certificate::kind::Kind::Serving => self.server_renew_errors.inc(),
        };
    }

    /// One probe run: `result` is upstream's `successful`, `failed` or
    /// `unknown`.
    pub fn probe(
        &self,
        kind: &str,
        result: &str,
        container: &str,
        pod: &k8s_openapi::api::core::v1::Pod,
    ) {
        let m = &pod.metadata;
        self.probes
            .get_or_create(&ProbeLabels {
                probe_type: kind.into(),
                result: result.into(),
                container: container.into(),
                pod: m.name.clone().unwrap_or_default(),
                namespace: m.namespace.clone().unwrap_or_default(),
                pod_uid: m.uid.clone().unwrap_or_default(),
            })
            .inc();
    }

    pub fn pod_started(&self, after: Duration) {
        self.pod_start.observe(after.as_secs_f64());
    }

    pub fn relisted(&self, took: Duration) {
        self.pleg_relist.observe(took.as_secs_f64());
    }

    /// The registry as OpenMetrics text.
    pub fn encode(&self) -> String {
        let _g = self.encode.lock().unwrap_or_else(|e| e.into_inner());
        let mut out = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        let _ = &self.node_name;
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstream_names_in_the_text() {
        let m = Metrics::new("pi");
        let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(
            serde_json::json!({"metadata": {"name": "p", "namespace": "ns", "uid": "u"}}),
        )
        .unwrap();
        m.probe("Readiness", "successful", "c", &pod);
        m.pod_started(Duration::from_millis(1500));
        m.relisted(Duration::from_millis(3));
        m.running_pods.set(2);
        m.runtime_operation("create_container", Duration::from_millis(20), false);
        m.runtime_operation("start_container", Duration::from_millis(5), true);
        let text = m.encode();
        for want in [
            "prober_probe_total{probe_type=\"Readiness\",result=\"successful\",container=\"c\",pod=\"p\",namespace=\"ns\",pod_uid=\"u\"} 1",
            "kubelet_pod_start_duration_seconds_count 1",
            "kubelet_pleg_relist_duration_seconds_bucket{le=\"0.005\"} 1",
            "kubelet_running_pods 2",
            "kubelet_node_name{node=\"pi\"} 1",
            "kubelet_runtime_operations_total{operation_type=\"create_container\"} 1",
            "kubelet_runtime_operations_errors_total{operation_type=\"start_container\"} 1",
            "kubelet_runtime_operations_duration_seconds_bucket{le=\"0.03125\",operation_type=\"create_container\"} 1",
        ] {
            assert!(text.contains(want), "{want} missing from\n{text}");
        }
    }
}
