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
mod kubelet;
mod node;
mod pods;
mod table;

use std::process::ExitCode;

use clap::Parser;
use tracing::{error, warn};

use config::flags::Flags;

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
    match rt.block_on(async { kubelet::Kubelet::start(settings).await?.wait().await }) {
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

/// Tells systemd (Type=notify) about our state; a no-op outside systemd.
pub(crate) fn notify_systemd(state: &str) {
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
