//! The agent assembled: [`Kubelet::start`] builds each part from the
//! settings (runtime, API client, pod sources, pod manager, status
//! manager, image GC, import dir, node agent, `/healthz`) and spawns its
//! task; [`Kubelet::wait`] runs until SIGTERM and shuts everything down
//! through one cancellation token. The parts hold the logic; this only
//! wires them.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use kinglet_runtime::Runtime;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::config::flags::{KUBERNETES_VERSION, RuntimeKind, Settings};
use crate::{config, health, images, node, pods};

/// Upstream's default `containerRuntimeEndpoint`.
const DEFAULT_CRI_ENDPOINT: &str = "unix:///run/containerd/containerd.sock";
/// Where cgroupfs is mounted (v1: one hierarchy per controller under it).
const CGROUP_MOUNT: &str = "/sys/fs/cgroup";

/// The running agent: its tasks and the token that stops them.
pub struct Kubelet {
    shutdown: CancellationToken,
    tasks: Vec<JoinHandle<()>>,
    /// The eviction manager's node conditions: node status and admission
    /// read them.
    pressure: Arc<crate::eviction::Pressure>,
    /// Image GC, shared with the eviction manager's disk reclaim.
    image_gc: Option<Arc<tokio::sync::Mutex<pods::images::gc::ImageGc>>>,
    /// Where image GC finds the node's pods (their images are pinned).
    gc_pods: Option<Arc<std::sync::OnceLock<pods::StatusView>>>,
    /// The runtime, and the in-process one itself when it is that: only
    /// [`Kubelet::wait_then_remove_pods`] (the demo's end) uses them.
    runtime: Option<Arc<dyn Runtime>>,
    oci: Option<Arc<kinglet_runtime_oci::OciRuntime>>,
    /// The Node's labels, which the node agent keeps current for
    /// admission, and the store it keeps the Node in.
    labels: Option<tokio::sync::watch::Sender<std::collections::BTreeMap<String, String>>>,
    /// The Node's `NoExecute` taints: admission reads them, the node agent
    /// keeps them current.
    taints: tokio::sync::watch::Sender<Vec<k8s_openapi::api::core::v1::Taint>>,
    store: Option<Arc<crate::store::LocalStore>>,
    /// The device manager: admission, the containers and the node status
    /// read it.
    devices: Option<Arc<crate::devices::DeviceManager>>,
}

/// Facts about the machine, read once at start: capacity and addresses
/// (which may take a name lookup) serve both the pods and the Node.
struct Host {
    machine: node::host::MachineInfo,
    addresses: Vec<(String, String)>,
}

/// The runtime chosen at start, and kinglet's image store when it serves
/// the in-process runtime (a CRI runtime keeps its own images).
struct Started {
    runtime: Arc<dyn Runtime>,
    id_scheme: String,
    store: Option<Arc<kinglet_runtime_oci::images::ImageStore>>,
}

impl Kubelet {
    pub async fn start(s: Settings) -> anyhow::Result<Kubelet> {
        info!(
            version = env!("CARGO_PKG_VERSION"),
            kubernetes = KUBERNETES_VERSION,
            node = %s.node_name,
            root_dir = %s.root_dir.display(),
            "starting kinglet"
        );
        std::fs::create_dir_all(&s.root_dir)
            .with_context(|| format!("cannot create root dir {}", s.root_dir.display()))?;
        // Root only: under it are pod specs, statuses and container configs,
        // which can carry Secret values.
        std::fs::set_permissions(
            &s.root_dir,
            std::os::unix::fs::PermissionsExt::from_mode(0o700),
        )
        .with_context(|| format!("cannot make root dir {} private", s.root_dir.display()))?;
        set_own_oom_score(s.config.oom_score_adj);
        let swaps = std::fs::read_to_string("/proc/swaps").unwrap_or_default();
        crate::cm::swap::check(s.config.fail_swap_on, &swaps)?;
        let mut k = Kubelet {
            shutdown: CancellationToken::new(),
            tasks: Vec::new(),
            pressure: Arc::default(),
            image_gc: None,
            gc_pods: None,
            runtime: None,
            oci: None,
            labels: None,
            taints: tokio::sync::watch::channel(Vec::new()).0,
            store: None,
            devices: None,
        };
        let mut started = k.start_runtime(&s).await?;
        let metrics = Arc::new(crate::metrics::Metrics::new(&s.node_name));
        started.runtime =
            pods::kuberuntime::instrumented::Instrumented::wrap(started.runtime, metrics.clone());
        k.runtime = Some(started.runtime.clone());
        let client = k.api_client(&s, &metrics).await?;
        let host = Host {
            machine: node::host::HostPaths::default().machine_info(),
            addresses: node::host::node_addresses(s.node_ip, &s.node_name),
        };
        let relist = health::Heartbeat::new(pods::pleg::RELIST_THRESHOLD);
        // Images first: the eviction manager reclaims through image GC.
        k.start_images(&s, &started).await;
        // Beside the pod records, where `kinglet pods ls` reads it.
        let link = client
            .is_some()
            .then(|| health::ApiLink::new(s.root_dir.join("pods").join("offline-since")));
        k.start_devices(&s).await;
        let api = (client.clone(), link.clone());
        k.start_pods(&s, &host, &started, api, metrics, relist.clone())?;
        let update = s.config.node_status_update_frequency.0;
        let syncloop = health::Heartbeat::new((update * 3).max(Duration::from_secs(30)));
        let checks = vec![("syncloop", syncloop.clone()), ("PLEG", relist)];
        k.start_healthz(&s, checks, link.clone()).await?;
        match client.zip(link) {
            Some((client, link)) => {
                k.start_node(&s, host, client, started.runtime, syncloop, link)?
            }
            None => k.beat_standalone(started.runtime, syncloop, update),
        }
        Ok(k)
    }

    /// The device manager, restored from its checkpoint, and its sources:
    /// the built-in device classes and the device plugins' registration.
    async fn start_devices(&mut self, s: &Settings) {
        use crate::devices::{DeviceManager, builtin, plugin};
        let checkpoint = s.root_dir.join("device-manager").join("checkpoint.json");
        let devices = Arc::new(DeviceManager::load(checkpoint).await);
        let classes = s.device_classes.clone();
        let follow = builtin::start(classes, devices.clone(), self.shutdown.clone()).await;
        self.spawn(follow);
        let dir = s.device_plugin_dir.clone();
        self.spawn(plugin::Registrar::run(
            dir,
            devices.clone(),
            self.shutdown.clone(),
        ));
        self.devices = Some(devices);
    }

    fn spawn(&mut self, f: impl std::future::Future<Output = ()> + Send + 'static) {
        self.tasks.push(tokio::spawn(f));
    }

    async fn start_runtime(&mut self, s: &Settings) -> anyhow::Result<Started> {
        let cfg = &s.config;
        let log_max_size = config::parse_quantity(&cfg.container_log_max_size).unwrap_or(10 << 20);
        let log_max_files = cfg.container_log_max_files.max(2) as u32;
        if s.runtime == RuntimeKind::Oci {
            let store = images::open_store(&s.root_dir, &s.image_limits)?;
            let oci = start_oci(s, store.clone(), log_max_size, log_max_files).await?;
            self.oci = Some(oci.clone());
            return Ok(Started {
                runtime: oci,
                id_scheme: format!("{}://", kinglet_runtime_oci::RUNTIME_NAME),
                store: Some(store),
            });
        }
        let endpoint = if cfg.container_runtime_endpoint.is_empty() {
            DEFAULT_CRI_ENDPOINT
        } else {
            cfg.container_runtime_endpoint.as_str()
        };
        let cri = Arc::new(
            kinglet_runtime_cri::CriRuntime::new(
                endpoint,
                s.root_dir.join("runtime/cri"),
                "/sys/fs/cgroup",
            )
            .context("--container-runtime-endpoint")?,
        );
        // Container IDs are `<runtime name>://<id>`; the name comes from
        // Version, or the endpoint while the runtime is down.
        let name = match tokio::time::timeout(Duration::from_secs(3), cri.version()).await {
            Ok(Ok(v)) => v.runtime_name,
            _ if endpoint.contains("crio") => "cri-o".into(),
            _ => "containerd".into(),
        };
        info!(endpoint, runtime = %name, "pods run through CRI");
        let (c, stop) = (cri.clone(), self.shutdown.clone());
        self.spawn(async move { c.watch_events(stop.cancelled_owned()).await });
        let (c, stop) = (cri.clone(), self.shutdown.clone());
        self.spawn(async move {
            c.rotate_logs(log_max_size, log_max_files, stop.cancelled_owned())
                .await
        });
        Ok(Started {
            runtime: cri,
            id_scheme: format!("{name}://"),
            store: None,
        })
    }

    /// Pod sources (the API watch when connected, static files), the
    /// status manager and the pod manager.
    fn start_pods(
        &mut self,
        s: &Settings,
        host: &Host,
        started: &Started,
        (client, link): (Option<kube::Client>, Option<health::ApiLink>),
        metrics: Arc<crate::metrics::Metrics>,
        relist: health::Heartbeat,
    ) -> anyhow::Result<()> {
        let cfg = &s.config;
        let status_dir = s.root_dir.join("pods");
        let mut sources = Vec::new();
        let mut writer = None;
        if let Some(client) = &client {
            sources.push("api");
            let (w, task) = pods::status::api_writer::ApiWriter::start(
                client.clone(),
                s.node_name.clone(),
                self.shutdown.clone(),
            );
            self.tasks.push(task);
            writer = Some(w);
        }
        if !cfg.static_pod_path.is_empty() {
            sources.push("file");
        }
        let machine = &host.machine;
        let mut node_ctx = node_context(
            s,
            host,
            &started.id_scheme,
            client.clone(),
            metrics,
            link.as_ref(),
        );
        node_ctx.credential_providers = credential_providers(s, client.clone())?;
        node_ctx.devices = self.devices.clone();
        let store = node_ctx.store.clone();
        node_ctx.services = client
            .clone()
            .map(|c| pods::services::Services::start(c, self.shutdown.clone()));
        let status =
            pods::StatusManager::new(status_dir, writer).with_metrics(node_ctx.metrics.clone());
        if let Some(devices) = &self.devices {
            let lister = crate::devices::podresources::Lister::run(
                s.pod_resources_dir.clone(),
                devices.clone(),
                status.view(),
                self.shutdown.clone(),
            );
            self.spawn(lister);
        }
        if let Some(c) = &client {
            let metrics = node_ctx.metrics.clone();
            self.start_server(
                s,
                host,
                status.view(),
                c.clone(),
                started.runtime.clone(),
                metrics,
            )?;
        }
        let reserved = node::status::reservations(&cfg.system_reserved, &cfg.kube_reserved);
        let allocatable = self.allocatable(s, host, &reserved, store.as_ref())?;
        let view = status.view();
        if let Some(slot) = &self.gc_pods {
            let _ = slot.set(view.clone());
        }
        let metrics = node_ctx.metrics.clone();
        let (manager, killer, pod_tx, inputs) = pods::PodManager::new(
            started.runtime.clone(),
            node_ctx,
            sources,
            status,
            allocatable,
        );
        let pods_capacity = machine
            .memory_bytes
            .saturating_sub(reserved.get("memory").copied().unwrap_or(0));
        let eviction = self.eviction_manager(s, pods_capacity, view, started, killer, metrics)?;
        self.spawn(eviction.run(self.shutdown.clone()));
        let manager = manager
            .with_relist_heartbeat(relist)
            .with_pod_cgroup_sweep(std::path::PathBuf::from(CGROUP_MOUNT));
        self.start_sources(s, client, store, pod_tx);
        self.spawn(manager.run(inputs, self.shutdown.clone()));
        Ok(())
    }

    /// What admission may give pods: the node's CPU and memory less the
    /// reservations and the hard eviction thresholds, `maxPods`, its
    /// labels, the sysctl allowlist and the eviction manager's pressure.
    fn allocatable(
        &mut self,
        s: &Settings,
        host: &Host,
        reserved: &std::collections::BTreeMap<String, u64>,
        store: Option<&Arc<crate::store::LocalStore>>,
    ) -> anyhow::Result<pods::admit::Allocatable> {
        let cfg = &s.config;
        let (cpu, memory) = node::status::allocatable_cpu_memory(
            &host.machine,
            reserved,
            &cfg.eviction_thresholds()?,
        );
        Ok(pods::admit::Allocatable {
            cpu_milli: u128::from(cpu),
            memory: u128::from(memory),
            pods: cfg.max_pods.max(0) as usize,
            labels: pods::admit::NodeLabels::new(self.node_labels(s, store)),
            taints: pods::admit::NodeTaints::new(self.taints.subscribe()),
            sysctls: pods::sysctls::Allowlist::new(&cfg.allowed_unsafe_sysctls)
                .map_err(|e| anyhow::anyhow!("allowedUnsafeSysctls: {e}"))?,
            pressure: Some(self.pressure.clone()),
        })
    }

    /// The pod sources: the API watch (with its checkpoint) when connected,
    /// the static pod dir when configured.
    fn start_sources(
        &mut self,
        s: &Settings,
        client: Option<kube::Client>,
        store: Option<Arc<crate::store::LocalStore>>,
        pod_tx: tokio::sync::mpsc::Sender<pods::config::SourceUpdate>,
    ) {
        if let Some(client) = client {
            let checkpoint = pods::config::api::Checkpoint::new(
                store,
                s.root_dir.join("pods").join("api-checkpoint.json"),
            );
            let watch = pods::config::api::watch(
                client,
                s.node_name.clone(),
                checkpoint,
                pod_tx.clone(),
                self.shutdown.clone(),
            );
            self.spawn(watch);
        }
        if !s.config.static_pod_path.is_empty() {
            let dir = s.config.static_pod_path.clone().into();
            let watch =
                pods::config::file::watch(dir, s.node_name.clone(), pod_tx, self.shutdown.clone());
            self.spawn(watch);
        }
    }

    /// The pods' cgroup (node allocatable enforced on it) and the eviction
    /// manager watching it and the node.
    fn eviction_manager(
        &self,
        s: &Settings,
        pods_capacity: u64,
        view: pods::StatusView,
        started: &Started,
        killer: pods::PodKiller,
        metrics: Arc<crate::metrics::Metrics>,
    ) -> anyhow::Result<crate::eviction::Manager> {
        use crate::eviction::{self, signals};
        let cfg = &s.config;
        let mount = std::path::Path::new(CGROUP_MOUNT);
        let pods_cgroup = cfg.pods_cgroup();
        let enforce = cfg.enforce_node_allocatable.iter().any(|v| v == "pods");
        let pods = if enforce {
            match crate::cm::node_allocatable::ensure_pods_cgroup(
                mount,
                &pods_cgroup,
                Some(pods_capacity),
            ) {
                Ok(dir) => {
                    info!(cgroup = %dir.display(), memory_limit = pods_capacity, "node allocatable enforced on the pods cgroup");
                    Some(signals::MemCgroup::new(mount, &pods_cgroup))
                }
                Err(e) => {
                    warn!(error = %e, "cannot enforce node allocatable; allocatableMemory.available is not observed");
                    None
                }
            }
        } else {
            None
        };
        Ok(eviction::Manager {
            settings: eviction::Settings {
                thresholds: eviction::thresholds::all(&cfg.eviction_thresholds()?),
                transition: cfg.eviction_pressure_transition_period.0,
                max_pod_grace: Duration::from_secs(cfg.eviction_max_pod_grace_period.max(0) as u64),
                sources: signals::Sources {
                    host: node::host::HostPaths::default(),
                    root: signals::MemCgroup::new(mount, ""),
                    pods,
                    pods_capacity,
                    nodefs: s.root_dir.clone(),
                    imagefs: s.root_dir.clone(),
                },
                housekeeping: Duration::from_secs(10),
                storage: eviction::storage::Roots {
                    volumes: s.root_dir.join("volumes"),
                    logs: s.pod_log_dir.clone(),
                },
                image_gc: self.image_gc.clone(),
                pids_root: match signals::Hierarchy::detect(mount) {
                    signals::Hierarchy::V1 => mount.join("pids"),
                    signals::Hierarchy::V2 => mount.to_path_buf(),
                },
                pods_cgroup: pods_cgroup.clone(),
            },
            view,
            runtime: started.runtime.clone(),
            killer,
            metrics,
            pressure: self.pressure.clone(),
        })
    }

    /// Image GC over the runtime (both runtimes) and, for kinglet's own
    /// store, the import directory, whose archives present at start are
    /// imported before any pod starts.
    async fn start_images(&mut self, s: &Settings, started: &Started) {
        let cfg = &s.config;
        let policy = pods::images::gc::Policy {
            high_percent: cfg.image_gc_high_threshold_percent.clamp(0, 100) as u8,
            low_percent: cfg.image_gc_low_threshold_percent.clamp(0, 100) as u8,
            min_age: cfg.image_minimum_gc_age.0,
        };
        let gc = pods::images::gc::ImageGc::new(started.runtime.clone(), policy);
        self.gc_pods = Some(gc.pods_slot());
        let gc = Arc::new(tokio::sync::Mutex::new(gc));
        self.image_gc = Some(gc.clone());
        self.spawn(pods::images::gc::ImageGc::run(gc, self.shutdown.clone()));
        if let Some(store) = &started.store {
            images::import_pending(store, &s.import_dir).await;
            let watch = images::watch_import_dir(
                store.clone(),
                s.import_dir.clone(),
                self.shutdown.clone(),
            );
            self.spawn(watch);
        }
    }

    /// The API client from `--kubeconfig` (after a TLS bootstrap when
    /// `--bootstrap-kubeconfig` is given and the kubeconfig has no usable
    /// certificate), with its client certificate renewed before expiry
    /// when `rotateCertificates` is on.
    async fn api_client(
        &mut self,
        s: &Settings,
        metrics: &Arc<crate::metrics::Metrics>,
    ) -> anyhow::Result<Option<kube::Client>> {
        use crate::certificate::{self as cert, client as cc};
        let Some(path) = &s.kubeconfig else {
            return Ok(None);
        };
        if !kubeconfig_to_join(path, s.bootstrap_kubeconfig.as_deref()).await {
            let root = s.root_dir.clone();
            if tokio::task::spawn_blocking(move || joined_before(&root))
                .await
                .unwrap_or(true)
            {
                anyhow::bail!(
                    "cannot read kubeconfig {}: it does not exist, and this node has been joined to a cluster (its root dir {} keeps that cluster's pods): refusing to run standalone, which would stop them; restore the kubeconfig, or remove the root dir to start afresh",
                    path.display(),
                    s.root_dir.display()
                );
            }
            warn!(
                kubeconfig = %path.display(),
                "the kubeconfig does not exist and no --bootstrap-kubeconfig is given: running standalone; put a kubeconfig there and restart kinglet to join a cluster"
            );
            return Ok(None);
        }
        let pki = s.root_dir.join("pki");
        if let Some(bootstrap) = &s.bootstrap_kubeconfig {
            cert::bootstrap::ensure(path, bootstrap, &pki, &s.node_name).await?;
        }
        let kubeconfig = kube::config::Kubeconfig::read_from(path)
            .with_context(|| format!("cannot read kubeconfig {}", path.display()))?;
        let client_cfg = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
            .await
            .with_context(|| format!("invalid kubeconfig {}", path.display()))?;
        let pair = cc::kubeconfig_pair(&client_cfg, path);
        let (true, Some(pair)) = (s.config.rotate_certificates, pair.clone()) else {
            if s.config.rotate_certificates {
                info!(
                    "rotateCertificates: the kubeconfig authenticates without a client certificate; nothing to rotate"
                );
            }
            let client = kube::Client::try_from(client_cfg)
                .with_context(|| format!("cannot build an API client from {}", path.display()))?;
            if let Some(pair) = pair {
                let load = Arc::new(move || Some(pair.clone()));
                let watch = cert::watch_expiry(
                    "client",
                    load,
                    client.clone(),
                    s.node_name.clone(),
                    self.shutdown.clone(),
                );
                self.spawn(watch);
            }
            return Ok(Some(client));
        };
        let store = cert::Store::client(&pki);
        let pair = cc::initial(&store, pair);
        let current = cc::ClientCert::new(&pair);
        let client = cc::build(&client_cfg, current.clone())
            .with_context(|| format!("cannot build an API client from {}", path.display()))?;
        let rotator = cert::Rotator {
            kind: cert::Kind::Client,
            store,
            template: cert::Template::client(&s.node_name),
            client: client.clone(),
            apply: Arc::new(move |p| current.set(p)),
            metrics: metrics.clone(),
        };
        self.spawn(rotator.run(Some(pair), self.shutdown.clone()));
        Ok(Some(client))
    }

    /// The serving certificate: requested from the cluster
    /// (`serverTLSBootstrap`, which upstream lets win over the files), the
    /// configured files (reloaded on change), or self-signed.
    fn serving_cert(
        &mut self,
        s: &Settings,
        names: Vec<String>,
        client: kube::Client,
        metrics: Arc<crate::metrics::Metrics>,
    ) -> anyhow::Result<Arc<crate::certificate::serving::ServingCert>> {
        use crate::certificate::{self as cert, serving};
        let cfg = &s.config;
        let pki = s.root_dir.join("pki");
        if cfg.server_tls_bootstrap {
            let store = cert::Store::server(&pki);
            let current = store.load().filter(|p| p.valid_for(0));
            let served = serving::ServingCert::new(current.as_ref());
            if current.is_none() {
                info!(
                    "serverTLSBootstrap: no serving certificate yet; the kubelet API refuses TLS until the one requested is approved"
                );
            }
            let apply = served.clone();
            let rotator = cert::Rotator {
                kind: cert::Kind::Serving,
                store,
                template: cert::Template::serving(&s.node_name, names),
                client,
                apply: Arc::new(move |p| apply.set(p)),
                metrics,
            };
            self.spawn(rotator.run(current, self.shutdown.clone()));
            return Ok(served);
        }
        if !cfg.tls_cert_file.is_empty() && !cfg.tls_private_key_file.is_empty() {
            let (crt, key) = (
                cfg.tls_cert_file.as_ref(),
                cfg.tls_private_key_file.as_ref(),
            );
            let (served, reload) = serving::from_files(crt, key, self.shutdown.clone())?;
            self.spawn(reload);
            let (crt, key) = (crt.to_path_buf(), key.to_path_buf());
            let load = Arc::new(move || cert::Pair::from_files(&crt, &key).ok());
            let stop = self.shutdown.clone();
            self.spawn(cert::watch_expiry(
                "serving",
                load,
                client,
                s.node_name.clone(),
                stop,
            ));
            return Ok(served);
        }
        Ok(serving::self_signed(&pki, &names)?)
    }

    /// The kubelet API on `address:port` (0: off), for a node joined to a
    /// cluster (standalone nodes have no API server to check callers with).
    fn start_server(
        &mut self,
        s: &Settings,
        host: &Host,
        view: pods::StatusView,
        client: kube::Client,
        runtime: Arc<dyn Runtime>,
        metrics: Arc<crate::metrics::Metrics>,
    ) -> anyhow::Result<()> {
        // (`port` is validated 1–65535, as upstream: the API is always on.)
        let cfg = &s.config;
        let ip: std::net::IpAddr = cfg.address.parse().context("address")?;
        let addr = SocketAddr::new(ip, cfg.port as u16);
        let nonempty = |p: &str| (!p.is_empty()).then(|| std::path::PathBuf::from(p));
        let mut names = vec![s.node_name.clone()];
        names.extend(host.addresses.iter().map(|(_, a)| a.clone()));
        names.dedup();
        let options = crate::server::TlsOptions {
            client_ca: nonempty(&cfg.authentication.x509.client_ca_file),
            cipher_suites: cfg.tls_cipher_suites.clone(),
            min_version: cfg.tls_min_version.clone(),
        };
        let served = self.serving_cert(s, names, client.clone(), metrics.clone())?;
        let tls = crate::server::tls_config(&options, served)?;
        let auth = crate::server::auth::Auth::new(
            Some(client),
            s.node_name.clone(),
            cfg.authentication.anonymous.enabled,
            cfg.authentication.webhook.enabled,
            cfg.authentication.webhook.cache_ttl.0,
            cfg.authorization.mode == "AlwaysAllow",
        );
        let state = Arc::new(crate::server::State {
            auth,
            log_root: s.pod_log_dir.clone(),
            configz: serde_json::to_vec(&serde_json::json!({"kubeletconfig": &s.config}))
                .unwrap_or_default()
                .into(),
            stats: crate::server::stats::Sampler::new(
                s.node_name.clone(),
                runtime.clone(),
                view.clone(),
                s.root_dir.clone(),
                s.root_dir.clone(),
            )
            .with_pods_cgroup(cfg.pods_cgroup()),
            view,
            runtime,
            metrics,
            stream_idle_timeout: cfg.streaming_connection_idle_timeout.0,
        });
        let limit = |l, name| crate::server::Listener::new(l, s.max_connections, name);
        let listener = limit(crate::server::bind(addr)?, "kubelet API");
        info!(%addr, max_connections = s.max_connections, "serving the kubelet API");
        if cfg.read_only_port > 0 {
            let ro = SocketAddr::new(ip, cfg.read_only_port as u16);
            let l = limit(crate::server::bind(ro)?, "read-only port");
            warn!(addr = %ro, "serving the read-only port: pods and stats without authentication");
            self.spawn(crate::server::serve_read_only(
                l,
                state.clone(),
                self.shutdown.clone(),
            ));
        }
        self.spawn(crate::server::serve(
            listener,
            tls,
            state,
            self.shutdown.clone(),
        ));
        Ok(())
    }

    async fn start_healthz(
        &mut self,
        s: &Settings,
        checks: Vec<(&'static str, health::Heartbeat)>,
        link: Option<health::ApiLink>,
    ) -> anyhow::Result<()> {
        let cfg = &s.config;
        let checks = Arc::new(checks);
        // An upgrade of this binary on trial commits itself here.
        self.spawn(crate::upgrade::watch_trial(
            s.root_dir.clone(),
            checks.clone(),
            self.shutdown.clone(),
        ));
        if let Some(every) = health::watchdog_interval() {
            info!(interval = ?every, "systemd watchdog on");
            self.spawn(health::watchdog(
                checks.clone(),
                every,
                crate::health::notify_systemd,
                self.shutdown.clone(),
            ));
        }
        if cfg.healthz_port == 0 {
            return Ok(());
        }
        let ip = cfg
            .healthz_bind_address
            .parse()
            .context("healthzBindAddress")?;
        let addr = SocketAddr::new(ip, cfg.healthz_port as u16);
        let listener = health::bind(addr)
            .await
            .with_context(|| format!("cannot listen on {addr} for /healthz"))?;
        info!(%addr, "serving /healthz");
        self.spawn(health::serve(listener, checks, link, self.shutdown.clone()));
        Ok(())
    }

    /// The labels admission starts from: the template's (`--node-labels`
    /// and the well-known ones, which registration reconciles onto the
    /// Node) over those of the Node kept in the store, so that an offline
    /// start admits against what an admin labelled the node with.
    fn node_labels(
        &mut self,
        s: &Settings,
        store: Option<&Arc<crate::store::LocalStore>>,
    ) -> tokio::sync::watch::Receiver<std::collections::BTreeMap<String, String>> {
        let mut labels = store
            .and_then(|st| node::stored_labels(st))
            .unwrap_or_default();
        labels.extend(node::NodeTemplate::from_settings(s).labels);
        let (tx, rx) = tokio::sync::watch::channel(labels);
        self.labels = Some(tx);
        self.store = store.cloned();
        rx
    }

    fn start_node(
        &mut self,
        s: &Settings,
        facts: Host,
        client: kube::Client,
        runtime: Arc<dyn Runtime>,
        heartbeat: health::Heartbeat,
        link: health::ApiLink,
    ) -> anyhow::Result<()> {
        let cfg = &s.config;
        let host = node::host::HostPaths::default();
        let agent = node::NodeAgent {
            client,
            template: node::NodeTemplate::from_settings(s),
            runtime,
            host,
            root_dir: s.root_dir.clone(),
            status: node::status::StatusConfig {
                machine: facts.machine,
                max_pods: cfg.max_pods,
                kubelet_version: format!(
                    "{KUBERNETES_VERSION}+kinglet-{}",
                    env!("CARGO_PKG_VERSION")
                ),
                kubelet_port: cfg.port,
                // The kubelet API streams exec and attach over WebSockets
                // itself (crate::server::exec): the apiserver proxies them
                // as they are instead of translating them to SPDY.
                declared_features: vec!["ExtendWebSocketsToKubelet".into()],
                addresses: facts.addresses,
                thresholds: cfg.eviction_thresholds()?,
                reserved: node::status::reservations(&cfg.system_reserved, &cfg.kube_reserved),
                pressure_transition: cfg.eviction_pressure_transition_period.0,
                pressure: Some(self.pressure.clone()),
            },
            update_frequency: cfg.node_status_update_frequency.0,
            report_frequency: cfg.node_status_report_frequency.0,
            lease_duration_seconds: cfg.node_lease_duration_seconds,
            heartbeat,
            link,
            labels: self.labels.take().unwrap_or_else(|| {
                tokio::sync::watch::channel(node::NodeTemplate::from_settings(s).labels).0
            }),
            taints: self.taints.clone(),
            store: self.store.clone(),
            devices: self.devices.clone(),
        };
        self.spawn(agent.run(self.shutdown.clone()));
        Ok(())
    }

    /// Standalone: nothing else beats, so beat while the runtime answers.
    fn beat_standalone(
        &mut self,
        runtime: Arc<dyn Runtime>,
        hb: health::Heartbeat,
        every: Duration,
    ) {
        info!("standalone mode, no API server");
        let stop = self.shutdown.clone();
        self.spawn(async move {
            loop {
                if runtime.status().await.is_ok() {
                    hb.beat();
                }
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(every) => {}
                }
            }
        });
    }

    /// Runs as [`Kubelet::wait`], then stops and removes every pod the
    /// runtime runs and the in-process runtime's monitor: the demo ends
    /// with nothing left running. (A node agent leaves its pods running
    /// across its own restarts, as upstream's kubelet does.)
    pub async fn wait_then_remove_pods(mut self) -> anyhow::Result<()> {
        let runtime = self.runtime.take();
        let oci = self.oci.take();
        self.wait().await?;
        let Some(runtime) = runtime else {
            return Ok(());
        };
        info!("removing every pod");
        remove_all_pods(&*runtime).await?;
        if let Some(oci) = oci {
            oci.stop_monitor().await.context("stopping the monitor")?;
        }
        info!("every pod removed; the monitor stopped");
        Ok(())
    }

    /// Runs until SIGTERM or SIGINT, then stops every task.
    pub async fn wait(self) -> anyhow::Result<()> {
        crate::health::notify_systemd("READY=1");
        tokio::select! {
            r = wait_for_signal() => r?,
            // A part that must stop the agent (an upgrade's failed trial).
            _ = self.shutdown.cancelled() => {}
        }
        info!("shutting down");
        crate::health::notify_systemd("STOPPING=1");
        self.shutdown.cancel();
        // In-flight API calls get a short grace; SIGTERM must end us within 5 s.
        let all = futures::future::join_all(self.tasks);
        if tokio::time::timeout(Duration::from_secs(3), all)
            .await
            .is_err()
        {
            warn!("tasks did not stop within 3s; exiting anyway");
        }
        Ok(())
    }
}

/// kinglet's own `oom_score_adj` (`oomScoreAdj`), as upstream's kubelet
/// sets its own: without `CAP_SYS_RESOURCE` a lower score is refused, and
/// that is said once.
fn set_own_oom_score(adj: i32) {
    if let Err(e) = std::fs::write("/proc/self/oom_score_adj", adj.to_string()) {
        warn!(oom_score_adj = adj, error = %e, "cannot set kinglet's own OOM score");
    }
}

async fn wait_for_signal() -> anyhow::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).context("cannot handle SIGTERM")?;
    let mut int = signal(SignalKind::interrupt()).context("cannot handle SIGINT")?;
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    Ok(())
}

/// The image credential provider plugins of
/// `--image-credential-provider-config`; a bad config or a missing
/// executable is a start-up error, as upstream's.
fn credential_providers(
    s: &Settings,
    client: Option<kube::Client>,
) -> anyhow::Result<Option<Arc<pods::images::providers::CredentialProviders>>> {
    let Some((config, bin_dir)) = &s.credential_providers else {
        return Ok(None);
    };
    let p = pods::images::providers::CredentialProviders::load(config, bin_dir, client)?;
    info!(config = %config.display(), providers = ?p, "image credential provider plugins");
    Ok(Some(Arc::new(p)))
}

/// What pod specs are turned into runtime configs with.
fn node_context(
    s: &Settings,
    host: &Host,
    id_scheme: &str,
    client: Option<kube::Client>,
    metrics: Arc<crate::metrics::Metrics>,
    link: Option<&health::ApiLink>,
) -> crate::pods::worker::NodeContext {
    let cfg = &s.config;
    let node_ip = host
        .addresses
        .iter()
        .find(|(t, _)| t == "InternalIP")
        .map(|(_, a)| a.clone())
        .unwrap_or_else(|| "127.0.0.1".into());
    let min_oom_score_adj = crate::cm::qos::min_oom_score_adj();
    if min_oom_score_adj > -1000 {
        warn!(
            min = min_oom_score_adj,
            "no CAP_SYS_RESOURCE: OOM score adjustments below {min_oom_score_adj} (Guaranteed pods' -997) are raised to it"
        );
    }
    crate::pods::worker::NodeContext {
        facts: pods::util::NodeFacts {
            node_name: s.node_name.clone(),
            pods_cgroup: cfg.pods_cgroup(),
            node_ip,
            memory_capacity: host.machine.memory_bytes,
            cpu_capacity_milli: u64::from(host.machine.cpus) * 1000,
            cluster_dns: cfg.cluster_dns.clone(),
            cluster_domain: cfg.cluster_domain.clone(),
            pod_pids_limit: cfg.pod_pids_limit,
            log_root: s.pod_log_dir.display().to_string(),
            volume_root: s.root_dir.join("volumes").display().to_string(),
            pods_dir: s.root_dir.join("pods").display().to_string(),
            min_oom_score_adj,
            container_id_scheme: id_scheme.to_string(),
            etc_hosts: "/etc/hosts".into(),
            swap: crate::cm::swap::detect(
                std::path::Path::new("/sys/fs/cgroup"),
                cfg.memory_swap.swap_behavior == "LimitedSwap",
                host.machine.swap_bytes,
            ),
        },
        store: match crate::store::LocalStore::open(&s.root_dir) {
            Ok(st) => Some(Arc::new(st)),
            Err(e) => {
                warn!(error = %e, "no local store: pods whose volumes read the API server cannot start while it is unreachable");
                None
            }
        },
        clock: pods::util::Clock::System,
        started: Some(tokio::time::Instant::now()),
        services: None,
        metrics,
        volume_sources: client
            .clone()
            .map(|c| Arc::new(pods::volumes::Sources::new(c, &s.node_name, link.cloned()))),
        objects: client.map(|c| {
            Arc::new(pods::objects::ApiObjects(c)) as Arc<dyn crate::pods::util::ObjectSource>
        }),
        credential_providers: None,
        devices: None,
        image_pulls: Arc::new(pods::images::PullSlots::new(cfg.image_pull_slots())),
    }
}

/// The in-process runtime: images from kinglet's store, CNI, and the
/// container monitor started (or found running).
async fn start_oci(
    s: &config::flags::Settings,
    store: Arc<kinglet_runtime_oci::images::ImageStore>,
    log_max_size: u64,
    log_max_files: u32,
) -> anyhow::Result<Arc<kinglet_runtime_oci::OciRuntime>> {
    // A bad registry configuration is a start-up error, like a bad config.
    let puller = Arc::new(images::puller(store, &s.registry_config)?);
    let mut oci = kinglet_runtime_oci::OciRuntime::new(
        s.root_dir.join("runtime/oci"),
        "/sys/fs/cgroup",
        puller,
    )
    .with_log_rotation(log_max_size, log_max_files)
    .with_cdi_spec_dirs(s.cdi_spec_dirs.clone());
    if !s.cni_conf_dir.as_os_str().is_empty() {
        let cni = kinglet_runtime_oci::network::Cni {
            conf_dir: s.cni_conf_dir.clone(),
            bin_dirs: s.cni_bin_dirs.clone(),
            cache_dir: s.root_dir.join("cni/results"),
        };
        let default = kinglet_runtime_oci::network::default_conflist(
            "kinglet0",
            "10.88.0.0/16",
            &s.root_dir.join("cni/networks"),
        );
        match cni.install_default(&default) {
            Ok(true) => {
                info!(dir = %s.cni_conf_dir.display(), "installed the default CNI conflist (bridge kinglet0, 10.88.0.0/16)")
            }
            Ok(false) => {}
            Err(e) => {
                warn!(dir = %s.cni_conf_dir.display(), error = %e, "cannot install the default CNI conflist")
            }
        }
        oci = oci.with_cni(cni);
    }
    let exe = std::env::current_exe().context("cannot find kinglet's own executable")?;
    if let Err(e) = oci.start_monitor(&exe).await {
        // The node reports NotReady with the reason until it answers.
        warn!(error = %e, "the container monitor did not start");
    }
    Ok(Arc::new(oci))
}

/// Stops (grace 5 s), then removes every container and sandbox `runtime`
/// knows.
async fn remove_all_pods(runtime: &dyn Runtime) -> anyhow::Result<()> {
    let grace = Duration::from_secs(5);
    let containers = runtime.list_containers().await?;
    let stops = containers
        .iter()
        .map(|c| runtime.stop_container(&c.id, grace));
    for r in futures::future::join_all(stops).await {
        r?;
    }
    for c in &containers {
        runtime.remove_container(&c.id).await?;
    }
    for sb in runtime.list_pod_sandboxes().await? {
        runtime.remove_pod_sandbox(&sb.id).await?;
    }
    Ok(())
}

/// Whether `--kubeconfig` joins a cluster. A kubeconfig path that does not
/// exist, with no bootstrap kubeconfig to write it, means standalone: the
/// shipped unit always passes `--kubeconfig /etc/kinglet/kubeconfig`, and a
/// machine installed from the air-gap bundle runs its static pods before
/// anyone puts a kubeconfig there. (A deliberate difference: upstream's
/// kubelet exits, and systemd restarts it until kubeadm writes the file.)
/// Any other error (a file there but unreadable) is left to the read, which
/// fails with its path.
async fn kubeconfig_to_join(path: &Path, bootstrap: Option<&Path>) -> bool {
    bootstrap.is_some() || !matches!(tokio::fs::try_exists(path).await, Ok(false))
}

/// Whether `root` is a joined node's: a client certificate of its own, or
/// the cluster's pods or Node kept in its store. Such a node with its
/// kubeconfig gone (a dangling link, `/etc` not mounted yet) must not run
/// standalone: the file source alone would make every API pod an orphan.
fn joined_before(root: &Path) -> bool {
    let kept = |name: &str| {
        crate::store::LocalStore::open(root)
            .is_ok_and(|st| matches!(st.get_node(name), Ok(Some(_))))
    };
    root.join("pki/kubelet-client-current.pem").exists()
        || root.join("api-checkpoint.json").exists()
        || kept("api/pods")
        || kept("node")
        || std::fs::read_dir(root.join("store/api-pods")).is_ok_and(|mut d| d.next().is_some())
}

#[cfg(test)]
mod tests {
    use super::{joined_before, kubeconfig_to_join};

    #[test]
    fn a_root_that_kept_a_clusters_pods_was_joined() {
        let dir = tempfile::tempdir().unwrap();
        assert!(!joined_before(dir.path()));
        let st = crate::store::LocalStore::open(dir.path()).unwrap();
        st.put_node("api/pods", b"[]").unwrap();
        assert!(joined_before(dir.path()));
        let dir = tempfile::tempdir().unwrap();
        let st = crate::store::LocalStore::open(dir.path()).unwrap();
        st.put_member("api-pods", "u1", b"{}").unwrap();
        assert!(joined_before(dir.path()));
    }

    #[tokio::test]
    async fn a_missing_kubeconfig_without_a_bootstrap_one_means_standalone() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("kubeconfig");
        assert!(!kubeconfig_to_join(&missing, None).await);
        // A bootstrap kubeconfig writes it: join.
        assert!(kubeconfig_to_join(&missing, Some(&dir.path().join("b"))).await);
        // There (even if it turns out unreadable): join, and fail on it.
        std::fs::write(&missing, "not yaml: [").unwrap();
        assert!(kubeconfig_to_join(&missing, None).await);
    }
}
