//! The runtime as the pod parts call it, timed: every call counted and
//! its duration and failure recorded under upstream's
//! `kubelet_runtime_operations_*` metrics, with upstream's operation names
//! (its `instrumented_services.go`). The pod start path broken down —
//! sandbox, container creation, start — reads from them, for kinglet and
//! the upstream kubelet alike.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use kinglet_runtime::{
    ContainerConfig, ContainerResources, ContainerStatus, ExecResult, FsUsage, ImageFailure,
    ImageInfo, ImageMountsError, PullAuth, Runtime, RuntimeError, RuntimeStatus, RuntimeVersion,
    SandboxConfig, SandboxStatus, Usage, exec,
};

use crate::metrics::Metrics;

/// `inner`, timed into `metrics`.
pub struct Instrumented {
    inner: Arc<dyn Runtime>,
    metrics: Arc<Metrics>,
}

impl Instrumented {
    pub fn wrap(inner: Arc<dyn Runtime>, metrics: Arc<Metrics>) -> Arc<dyn Runtime> {
        Arc::new(Instrumented { inner, metrics })
    }

    /// Awaits `f`, recording it as `op`.
    fn timed<'a, T: Send + 'a, E: Send + 'a>(
        &'a self,
        op: &'static str,
        f: BoxFuture<'a, Result<T, E>>,
    ) -> BoxFuture<'a, Result<T, E>> {
        Box::pin(async move {
            let t = Instant::now();
            let out = f.await;
            self.metrics
                .runtime_operation(op, t.elapsed(), out.is_err());
            out
        })
    }
}

impl Runtime for Instrumented {
    fn version(&self) -> BoxFuture<'_, Result<RuntimeVersion, RuntimeError>> {
        self.timed("version", self.inner.version())
    }
    fn status(&self) -> BoxFuture<'_, Result<RuntimeStatus, RuntimeError>> {
        self.timed("status", self.inner.status())
    }
    fn run_pod_sandbox<'a>(
        &'a self,
        cfg: &'a SandboxConfig,
    ) -> BoxFuture<'a, Result<SandboxStatus, RuntimeError>> {
        self.timed("run_podsandbox", self.inner.run_pod_sandbox(cfg))
    }
    fn remove_pod_sandbox<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<(), RuntimeError>> {
        self.timed("remove_podsandbox", self.inner.remove_pod_sandbox(id))
    }
    fn list_pod_sandboxes(&self) -> BoxFuture<'_, Result<Vec<SandboxStatus>, RuntimeError>> {
        self.timed("list_podsandbox", self.inner.list_pod_sandboxes())
    }
    fn create_container<'a>(
        &'a self,
        sandbox_id: &'a str,
        cfg: &'a ContainerConfig,
        sandbox: &'a SandboxConfig,
    ) -> BoxFuture<'a, Result<String, RuntimeError>> {
        let f = self.inner.create_container(sandbox_id, cfg, sandbox);
        self.timed("create_container", f)
    }
    fn start_container<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<(), RuntimeError>> {
        self.timed("start_container", self.inner.start_container(id))
    }
    fn stop_container<'a>(
        &'a self,
        id: &'a str,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<(), RuntimeError>> {
        self.timed("stop_container", self.inner.stop_container(id, timeout))
    }
    fn remove_container<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<(), RuntimeError>> {
        self.timed("remove_container", self.inner.remove_container(id))
    }
    fn update_container_resources<'a>(
        &'a self,
        id: &'a str,
        resources: &'a ContainerResources,
    ) -> BoxFuture<'a, Result<(), RuntimeError>> {
        let f = self.inner.update_container_resources(id, resources);
        self.timed("update_container", f)
    }
    fn list_containers(&self) -> BoxFuture<'_, Result<Vec<ContainerStatus>, RuntimeError>> {
        self.timed("list_containers", self.inner.list_containers())
    }
    fn pull_image<'a>(
        &'a self,
        image: &'a str,
        auth: &'a [PullAuth],
    ) -> BoxFuture<'a, Result<ImageInfo, ImageFailure>> {
        self.timed("pull_image", self.inner.pull_image(image, auth))
    }
    fn image_status<'a>(
        &'a self,
        image: &'a str,
    ) -> BoxFuture<'a, Result<Option<ImageInfo>, ImageFailure>> {
        self.timed("image_status", self.inner.image_status(image))
    }
    fn list_images(&self) -> BoxFuture<'_, Result<Vec<ImageInfo>, RuntimeError>> {
        self.timed("list_images", self.inner.list_images())
    }
    fn remove_image<'a>(&'a self, image: &'a str) -> BoxFuture<'a, Result<(), RuntimeError>> {
        self.timed("remove_image", self.inner.remove_image(image))
    }
    fn image_fs_info(&self) -> BoxFuture<'_, Result<Vec<FsUsage>, RuntimeError>> {
        self.timed("image_fs_info", self.inner.image_fs_info())
    }
    fn exec<'a>(
        &'a self,
        id: &'a str,
        opts: &'a exec::ExecOptions,
    ) -> BoxFuture<'a, Result<exec::ExecSession, RuntimeError>> {
        self.timed("exec", self.inner.exec(id, opts))
    }
    fn attach<'a>(
        &'a self,
        id: &'a str,
        opts: &'a exec::ExecOptions,
    ) -> BoxFuture<'a, Result<exec::ExecSession, RuntimeError>> {
        self.timed("attach", self.inner.attach(id, opts))
    }
    fn port_forward<'a>(
        &'a self,
        sandbox_id: &'a str,
        port: u16,
    ) -> BoxFuture<'a, Result<exec::PortStream, RuntimeError>> {
        self.timed("port_forward", self.inner.port_forward(sandbox_id, port))
    }
    fn exec_sync<'a>(
        &'a self,
        id: &'a str,
        cmd: &'a [String],
        timeout: Duration,
    ) -> BoxFuture<'a, Result<ExecResult, RuntimeError>> {
        self.timed("exec_sync", self.inner.exec_sync(id, cmd, timeout))
    }
    fn container_stats(&self) -> BoxFuture<'_, Result<Vec<Usage>, RuntimeError>> {
        self.timed("list_container_stats", self.inner.container_stats())
    }
    fn pod_sandbox_stats(&self) -> BoxFuture<'_, Result<Vec<Usage>, RuntimeError>> {
        self.timed("list_podsandbox_stats", self.inner.pod_sandbox_stats())
    }
    fn image_mounts(&self) -> BoxFuture<'_, Result<(), ImageMountsError>> {
        self.inner.image_mounts()
    }
    fn changes(&self) -> Option<Arc<tokio::sync::Notify>> {
        self.inner.changes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn calls_are_counted_timed_and_their_errors_too() {
        let fake = Arc::new(kinglet_runtime::fake::FakeRuntime::default());
        let metrics = Arc::new(Metrics::new("n"));
        let rt = Instrumented::wrap(fake, metrics.clone());
        rt.list_containers().await.unwrap();
        assert!(rt.start_container("no-such-container").await.is_err());
        let text = metrics.encode();
        for want in [
            "kubelet_runtime_operations_total{operation_type=\"list_containers\"} 1",
            "kubelet_runtime_operations_errors_total{operation_type=\"start_container\"} 1",
            "kubelet_runtime_operations_duration_seconds_count{operation_type=\"start_container\"} 1",
        ] {
            assert!(text.contains(want), "{want} missing from\n{text}");
        }
        assert!(!text.contains("errors_total{operation_type=\"list_containers\"}"));
    }
}
