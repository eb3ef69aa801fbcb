//! kinglet: a kubelet for small machines.
//!
//! `main` is the edge: it parses flags and config (exiting with a message on
//! bad input, before any API call), sets up logging, picks the runtime, and
//! runs the node agent and local endpoints until SIGTERM.

mod backoff;
mod config;
mod demo;
mod health;
mod images;
mod node;
mod pods;
mod table;

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use kinglet_runtime::Runtime;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use config::flags::{Flags, KUBERNETES_VERSION, RuntimeKind, Settings};

/// Upstream's default `containerRuntimeEndpoint`.
const DEFAULT_CRI_ENDPOINT: &str = "unix:///run/containerd/containerd.sock";

fn main() -> ExitCode {
    let mut flags = Flags::parse();
    // Namespaces and the monitor need a process without threads.
    if let Some(config::flags::Command::Netns {
        net,
        ipc,
        uts,
        hostname,
    }) = &flags.command
    {
        let ns = kinglet_runtime_oci::network::PodNamespaces {
            net: net.clone(),
            ipc: ipc.clone(),
            uts: uts.clone().zip(hostname.clone()),
        };
        return match kinglet_runtime_oci::network::create_namespaces(&ns) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("kinglet netns: {e}");
                ExitCode::from(1)
            }
        };
    }
    // The monitor must start before any thread exists: it forks.
    if let Some(config::flags::Command::Monitor { dir }) = &flags.command {
        return match kinglet_runtime_oci::monitor::server::daemonize_and_serve(dir) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("kinglet monitor: {e}");
                ExitCode::from(1)
            }
        };
    }
    // One TLS provider for every client (the API and registries).
    let _ = rustls::crypto::ring::default_provider().install_default();
    if let Some(config::flags::Command::DemoApp) = &flags.command {
        demo::app();
    }
    if let Some(config::flags::Command::Demo) = &flags.command {
        match demo::prepare(&flags.root_dir) {
            Ok(cfg) => {
                eprintln!(
                    "kinglet demo: static pod 'demo' from image {}; watch it with: {} --root-dir {} pods ls",
                    demo::image_name(),
                    std::env::args().next().unwrap_or_default(),
                    flags.root_dir.display()
                );
                flags.config = Some(cfg);
                flags.kubeconfig = None;
                flags.command = None;
            }
            Err(e) => {
                eprintln!("kinglet demo: {e:#}");
                return ExitCode::from(1);
            }
        }
    }
    if let Some(config::flags::Command::Pods(config::flags::PodsCommand::Ls)) = &flags.command {
        print!("{}", pods::table(&flags.root_dir.join("pods")));
        return ExitCode::SUCCESS;
    }
    if let Some(config::flags::Command::Images(cmd)) = flags.command.take() {
        init_logging(&config::Logging::default());
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build();
        let result = rt.map_err(anyhow::Error::from).and_then(|rt| {
            rt.block_on(images::command(
                cmd,
                &flags.root_dir,
                &flags.image_registry_config,
            ))
        });
        return match result {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("kinglet: {e:#}");
                ExitCode::from(1)
            }
        };
    }
    let mut warnings = Vec::new();
    let hostname = || sysinfo::System::host_name().unwrap_or_else(|_| "localhost".into());
    let settings = match flags.settings(hostname, &mut |w| warnings.push(w)) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("kinglet: {e}");
            return ExitCode::from(1);
        }
    };
    init_logging(&settings.config.logging);
    for w in warnings {
        warn!("{w}");
    }
    // One thread: a node agent waits on the network and the kernel; a second
    // thread would only cost memory on the small machines kinglet runs on.
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("kinglet: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    match rt.block_on(run(settings)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            error!("{e:#}");
            eprintln!("kinglet: {e:#}");
            ExitCode::from(1)
        }
    }
}

fn init_logging(cfg: &config::Logging) {
    use tracing_subscriber::filter::{LevelFilter, Targets};
    use tracing_subscriber::prelude::*;
    let level = match cfg.verbosity {
        0 | 1 => LevelFilter::INFO,
        2..=4 => LevelFilter::DEBUG,
        _ => LevelFilter::TRACE,
    };
    // kube's client logs every failed request itself; kinglet logs the same
    // failure once, with the node or object it concerns, so the client's own
    // lines only appear at high verbosity.
    let kube_level = if cfg.verbosity >= 4 {
        level
    } else {
        LevelFilter::OFF
    };
    let filter = Targets::new()
        .with_default(level)
        .with_target("kube_client", kube_level);
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(false);
    if cfg.format == "json" {
        tracing_subscriber::registry()
            .with(fmt.json().with_filter(filter))
            .init();
    } else {
        tracing_subscriber::registry()
            .with(fmt.with_filter(filter))
            .init();
    }
}

async fn run(s: Settings) -> anyhow::Result<()> {
    info!(
        version = env!("CARGO_PKG_VERSION"),
        kubernetes = KUBERNETES_VERSION,
        node = %s.node_name,
        root_dir = %s.root_dir.display(),
        "starting kinglet"
    );
    std::fs::create_dir_all(&s.root_dir)
        .with_context(|| format!("cannot create root dir {}", s.root_dir.display()))?;

    let shutdown = CancellationToken::new();
    let cfg = &s.config;
    let mut tasks = Vec::new();
    let log_max_size = config::parse_quantity(&cfg.container_log_max_size).unwrap_or(10 << 20);
    let log_max_files = cfg.container_log_max_files.max(2) as u32;

    // kinglet's image store serves the in-process runtime; a CRI runtime
    // keeps (and imports, and collects) its own images.
    type Started = (
        Arc<dyn Runtime>,
        String,
        Option<Arc<kinglet_runtime_oci::images::ImageStore>>,
    );
    let (runtime, id_scheme, store): Started = match s.runtime {
        RuntimeKind::Oci => {
            let store = images::open_store(&s.root_dir)?;
            (
                start_oci(&s, store.clone(), log_max_size, log_max_files).await?,
                format!("{}://", kinglet_runtime_oci::RUNTIME_NAME),
                Some(store),
            )
        }
        RuntimeKind::Cri => {
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
            // Container IDs are `<runtime name>://<id>`; the name comes
            // from Version, or the endpoint while the runtime is down.
            let name = match tokio::time::timeout(Duration::from_secs(3), cri.version()).await {
                Ok(Ok(v)) => v.runtime_name,
                _ if endpoint.contains("crio") => "cri-o".into(),
                _ => "containerd".into(),
            };
            info!(endpoint, runtime = %name, "pods run through CRI");
            let (c, stop) = (cri.clone(), shutdown.clone());
            tasks.push(tokio::spawn(async move {
                c.watch_events(stop.cancelled_owned()).await
            }));
            let (c, stop) = (cri.clone(), shutdown.clone());
            tasks.push(tokio::spawn(async move {
                c.rotate_logs(log_max_size, log_max_files, stop.cancelled_owned())
                    .await
            }));
            (cri as Arc<dyn Runtime>, format!("{name}://"), None)
        }
    };

    let client = match &s.kubeconfig {
        Some(path) => {
            let kubeconfig = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("cannot read kubeconfig {}", path.display()))?;
            let client_cfg = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
                .await
                .with_context(|| format!("invalid kubeconfig {}", path.display()))?;
            Some(
                kube::Client::try_from(client_cfg).with_context(|| {
                    format!("cannot build an API client from {}", path.display())
                })?,
            )
        }
        None => None,
    };

    // Pods: static manifests and, when connected, the API server.
    let (pod_tx, pod_rx) = tokio::sync::mpsc::channel(16);
    let mut sources = Vec::new();
    let mut sink: Option<Arc<dyn pods::StatusSink>> = None;
    if let Some(client) = &client {
        sources.push("api");
        std::fs::create_dir_all(s.root_dir.join("pods"))?;
        tasks.push(tokio::spawn(pods::api::watch(
            client.clone(),
            s.node_name.clone(),
            s.root_dir.join("pods/api-checkpoint.json"),
            pod_tx.clone(),
            shutdown.clone(),
        )));
        let (api_sink, task) =
            pods::api::status_manager(client.clone(), s.node_name.clone(), shutdown.clone());
        tasks.push(task);
        sink = Some(Arc::new(api_sink));
    }
    if !cfg.static_pod_path.is_empty() {
        sources.push("file");
        tasks.push(tokio::spawn(pods::file::watch(
            cfg.static_pod_path.clone().into(),
            s.node_name.clone(),
            pod_tx.clone(),
            shutdown.clone(),
        )));
    }
    let machine = node::host::HostPaths::default().machine_info();
    let addresses = node::host::node_addresses(s.node_ip, &s.node_name);
    let node_ip = addresses
        .iter()
        .find(|(t, _)| t == "InternalIP")
        .map(|(_, a)| a.clone())
        .unwrap_or_else(|| "127.0.0.1".into());
    let manager = pods::PodManager {
        runtime: runtime.clone(),
        node: pods::convert::NodeContext {
            node_name: s.node_name.clone(),
            node_ip,
            memory_capacity: machine.memory_bytes,
            cluster_dns: cfg.cluster_dns.clone(),
            cluster_domain: cfg.cluster_domain.clone(),
            pod_pids_limit: cfg.pod_pids_limit,
            log_root: s.pod_log_dir.display().to_string(),
            volume_root: s.root_dir.join("volumes").display().to_string(),
            min_oom_score_adj: {
                let min = pods::convert::min_oom_score_adj();
                if min > -1000 {
                    warn!(
                        min,
                        "no CAP_SYS_RESOURCE: OOM score adjustments below {min} (Guaranteed pods' -997) are raised to it"
                    );
                }
                min
            },
            container_id_scheme: id_scheme,
            objects: client.clone().map(|c| {
                Arc::new(pods::api::ApiObjects(c)) as Arc<dyn pods::convert::ObjectSource>
            }),
        },
        status_dir: s.root_dir.join("pods"),
        sources,
        sink,
        allocatable: {
            // As the node reports it: capacity less reservations, the hard
            // memory eviction threshold and hugepages.
            let reserved = node::status::reservations(&cfg.system_reserved, &cfg.kube_reserved);
            let hard_mem = cfg
                .eviction_thresholds()?
                .hard
                .get("memory.available")
                .map_or(0, |t| t.resolve(machine.memory_bytes));
            let memory = machine
                .memory_bytes
                .saturating_sub(reserved.get("memory").copied().unwrap_or(0))
                .saturating_sub(hard_mem)
                .saturating_sub(machine.hugepages.values().sum());
            pods::admit::Allocatable {
                cpu_milli: u128::from(machine.cpus) * 1000
                    - u128::from(reserved.get("cpu").copied().unwrap_or(0))
                        .min(u128::from(machine.cpus) * 1000),
                memory: u128::from(memory),
                pods: cfg.max_pods.max(0) as usize,
                labels: node::NodeTemplate::from_settings(&s).labels,
            }
        },
    };
    tasks.push(tokio::spawn(manager.run(pod_rx, shutdown.clone())));
    drop(pod_tx);
    if let Some(store) = &store {
        tasks.push(tokio::spawn(images::watch_import_dir(
            store.clone(),
            s.import_dir.clone(),
            shutdown.clone(),
        )));
        tasks.push(tokio::spawn(images::gc_loop(
            store.clone(),
            cfg.image_gc_high_threshold_percent as u8,
            cfg.image_gc_low_threshold_percent as u8,
            cfg.image_minimum_gc_age.0,
            shutdown.clone(),
        )));
    }
    let update = cfg.node_status_update_frequency.0;
    let heartbeat = health::Heartbeat::new((update * 3).max(Duration::from_secs(30)));

    if cfg.healthz_port != 0 {
        let ip = cfg
            .healthz_bind_address
            .parse()
            .context("healthzBindAddress")?;
        let addr = SocketAddr::new(ip, cfg.healthz_port as u16);
        let listener = health::bind(addr)
            .await
            .with_context(|| format!("cannot listen on {addr} for /healthz"))?;
        info!(%addr, "serving /healthz");
        tasks.push(tokio::spawn(health::serve(
            listener,
            heartbeat.clone(),
            shutdown.clone(),
        )));
    }

    match client {
        Some(client) => {
            let host = node::host::HostPaths::default();
            let agent = node::NodeAgent {
                client,
                template: node::NodeTemplate::from_settings(&s),
                runtime,
                host,
                root_dir: s.root_dir.clone(),
                status: node::status::StatusConfig {
                    machine,
                    max_pods: cfg.max_pods,
                    kubelet_version: format!(
                        "{KUBERNETES_VERSION}+kinglet-{}",
                        env!("CARGO_PKG_VERSION")
                    ),
                    kubelet_port: cfg.port,
                    addresses,
                    thresholds: cfg.eviction_thresholds()?,
                    reserved: node::status::reservations(&cfg.system_reserved, &cfg.kube_reserved),
                    pressure_transition: cfg.eviction_pressure_transition_period.0,
                },
                update_frequency: update,
                report_frequency: cfg.node_status_report_frequency.0,
                lease_duration_seconds: cfg.node_lease_duration_seconds,
                heartbeat: heartbeat.clone(),
            };
            tasks.push(tokio::spawn(agent.run(shutdown.clone())));
        }
        None => {
            info!("no --kubeconfig: standalone mode, no API server");
            // Nothing else beats in standalone mode yet; keep /healthz honest
            // by beating while the runtime answers.
            let hb = heartbeat.clone();
            let stop = shutdown.clone();
            tasks.push(tokio::spawn(async move {
                loop {
                    if runtime.status().await.is_ok() {
                        hb.beat();
                    }
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        _ = tokio::time::sleep(update) => {}
                    }
                }
            }));
        }
    }

    notify_systemd("READY=1");
    wait_for_signal().await?;
    info!("shutting down");
    notify_systemd("STOPPING=1");
    shutdown.cancel();
    // In-flight API calls get a short grace; SIGTERM must end us within 5 s.
    let all = futures::future::join_all(tasks);
    if tokio::time::timeout(Duration::from_secs(3), all)
        .await
        .is_err()
    {
        warn!("tasks did not stop within 3s; exiting anyway");
    }
    Ok(())
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

/// Tells systemd (Type=notify) about our state; a no-op outside systemd.
fn notify_systemd(state: &str) {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    let sock = match std::os::unix::net::UnixDatagram::unbound() {
        Ok(s) => s,
        Err(_) => return,
    };
    let bytes = path.as_encoded_bytes();
    let result = if let Some(abstract_name) = bytes.strip_prefix(b"@") {
        use std::os::linux::net::SocketAddrExt;
        std::os::unix::net::SocketAddr::from_abstract_name(abstract_name)
            .and_then(|a| sock.send_to_addr(state.as_bytes(), &a))
    } else {
        sock.send_to(state.as_bytes(), &path)
    };
    if let Err(e) = result {
        warn!(error = %e, "cannot notify systemd");
    }
}

/// The in-process runtime: images from kinglet's store, CNI, and the
/// container monitor started (or found running).
async fn start_oci(
    s: &config::flags::Settings,
    store: Arc<kinglet_runtime_oci::images::ImageStore>,
    log_max_size: u64,
    log_max_files: u32,
) -> anyhow::Result<Arc<dyn Runtime>> {
    // A bad registry configuration is a start-up error, like a bad config.
    let puller = Arc::new(images::puller(store, &s.registry_config)?);
    let mut oci = kinglet_runtime_oci::OciRuntime::new(
        s.root_dir.join("runtime/oci"),
        "/sys/fs/cgroup",
        puller,
    )
    .with_log_rotation(log_max_size, log_max_files);
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
