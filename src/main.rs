//! kinglet: a kubelet for small machines.
//!
//! `main` is the edge (the parts are the library, `lib.rs`): one match on
//! the subcommand. Without one, kinglet
//! parses flags and config (exiting with a message on bad input, before any
//! API call), sets up logging and runs the [`kubelet::Kubelet`], which
//! assembles the parts, until SIGTERM.

use std::process::ExitCode;

use clap::Parser;
use tracing::{error, warn};

use kinglet::config::flags::{Command, Flags, PodsCommand};
use kinglet::{config, demo, images, kubelet, pods};

fn main() -> ExitCode {
    let mut flags = Flags::parse();
    match flags.command.take() {
        // Namespaces and the monitor need a process without threads (the
        // monitor forks): both run before anything else exists.
        Some(Command::Netns {
            net,
            ipc,
            uts,
            hostname,
        }) => {
            let ns = kinglet_runtime_oci::network::PodNamespaces {
                net,
                ipc,
                uts: uts.zip(hostname),
            };
            exit(
                "kinglet netns",
                kinglet_runtime_oci::network::create_namespaces(&ns),
            )
        }
        Some(Command::Monitor { dir }) => exit(
            "kinglet monitor",
            kinglet_runtime_oci::monitor::server::daemonize_and_serve(&dir),
        ),
        Some(Command::DemoApp) => demo::app(),
        Some(Command::Upgrade(args)) => upgrade(args, &flags.root_dir),
        Some(Command::UpgradeGuard) => {
            match kinglet::upgrade::guard(&flags.root_dir) {
                Ok(Some(reason)) => eprintln!("kinglet upgrade-guard: rolled back: {reason}"),
                Ok(None) => {}
                Err(e) => eprintln!("kinglet upgrade-guard: {e}"),
            }
            // Never in the way of a start.
            ExitCode::SUCCESS
        }
        Some(Command::Pods(PodsCommand::Ls)) => {
            print!("{}", pods::table(&flags.root_dir.join("pods")));
            ExitCode::SUCCESS
        }
        Some(Command::Images(cmd)) => {
            let roots = install_tls(&flags.root_dir);
            init_logging(&config::Logging::default());
            roots.log();
            // Outside the agent: upstream's default imagefs.available.
            let result = flags
                .image_limits(15)
                .map_err(anyhow::Error::from)
                .and_then(|limits| {
                    block_on(images::command(
                        cmd,
                        &flags.root_dir,
                        &flags.image_registry_config,
                        &limits,
                    ))
                });
            exit("kinglet", result.map_err(|e| format!("{e:#}")))
        }
        Some(Command::Demo) => match demo::prepare(&flags.root_dir) {
            Ok(cfg) => {
                eprintln!(
                    "kinglet demo: static pod 'demo' from image {}; watch it with: {} --root-dir {} pods ls",
                    demo::image_name(),
                    std::env::args().next().unwrap_or_default(),
                    flags.root_dir.display()
                );
                flags.config = Some(cfg);
                flags.kubeconfig = None;
                demo::keep_under_root(&mut flags);
                agent(flags, true)
            }
            Err(e) => exit("kinglet demo", Err(format!("{e:#}"))),
        },
        None => agent(flags, false),
    }
}

/// One TLS provider for every client (the API and registries), and on a
/// system without CA certificates, a trust file that makes registry clients
/// buildable (see [`images::without_system_roots`]). Called while the
/// process has one thread: it may set `SSL_CERT_FILE`.
fn install_tls(root_dir: &std::path::Path) -> Roots {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let made = images::without_system_roots(root_dir)
        .or_else(|_| images::without_system_roots(&std::env::temp_dir()));
    match made {
        Ok(Some(file)) => {
            // SAFETY: no other thread exists yet (the async runtime is
            // built later, on this thread), so nothing reads the
            // environment while it changes.
            unsafe { std::env::set_var("SSL_CERT_FILE", &file) };
            Roots::Missing(file)
        }
        Ok(None) => Roots::System,
        Err(e) => Roots::Failed(e),
    }
}

/// What [`install_tls`] found, logged once logging is set up.
enum Roots {
    System,
    Missing(std::path::PathBuf),
    Failed(std::io::Error),
}

impl Roots {
    fn log(&self) {
        match self {
            Roots::System => {}
            Roots::Missing(f) => warn!(
                trust_file = %f.display(),
                "this system has no CA certificates (install ca-certificates): registries are trusted only over plain HTTP or with a CA in registries.yaml"
            ),
            Roots::Failed(e) => warn!(
                error = %e,
                "this system has no CA certificates and no trust file could be made: image pulls will fail"
            ),
        }
    }
}

/// The exit code of a command, its error printed after `what`.
fn exit<E: std::fmt::Display>(what: &str, r: Result<(), E>) -> ExitCode {
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{what}: {e}");
            ExitCode::from(1)
        }
    }
}

/// Runs `f` on one thread: a node agent waits on the network and the
/// kernel; a second thread would only cost memory on the small machines
/// kinglet runs on.
fn block_on<F: std::future::Future<Output = anyhow::Result<()>>>(f: F) -> anyhow::Result<()> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| anyhow::anyhow!("cannot start the async runtime: {e}"))?
        .block_on(f)
}

/// The node agent: settings from flags and config (exiting with a message
/// naming the field on bad input, before any API call), then the kubelet
/// until SIGTERM; with `remove_pods` (the demo), the pods go with it.
fn agent(flags: Flags, remove_pods: bool) -> ExitCode {
    let roots = install_tls(&flags.root_dir);
    let mut warnings = Vec::new();
    let hostname = || sysinfo::System::host_name().unwrap_or_else(|_| "localhost".into());
    let settings = match flags.settings(hostname, &mut |w| warnings.push(w)) {
        Ok(s) => s,
        Err(e) => return exit("kinglet", Err(e)),
    };
    init_logging(&settings.config.logging);
    roots.log();
    for w in warnings {
        warn!("{w}");
    }
    let run = async {
        let k = kubelet::Kubelet::start(settings).await?;
        if remove_pods {
            k.wait_then_remove_pods().await
        } else {
            k.wait().await
        }
    };
    match block_on(run) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            error!("{e:#}");
            exit("kinglet", Err(format!("{e:#}")))
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
    } else if under_journald() {
        // The journal stamps every line itself: a second time is noise.
        tracing_subscriber::registry()
            .with(fmt.without_time().with_filter(filter))
            .init();
    } else {
        tracing_subscriber::registry()
            .with(fmt.with_filter(filter))
            .init();
    }
}

/// Whether stderr is the journal's stream (systemd sets `JOURNAL_STREAM`
/// to its `device:inode`; a child that inherited the variable but not the
/// stream does not match).
fn under_journald() -> bool {
    use std::os::unix::fs::MetadataExt;
    let Some(v) = std::env::var_os("JOURNAL_STREAM") else {
        return false;
    };
    let Ok(m) = std::fs::metadata("/proc/self/fd/2") else {
        return false;
    };
    v.to_str() == Some(&format!("{}:{}", m.dev(), m.ino()))
}

/// `kinglet upgrade`: [`kinglet::upgrade::run`], its outcome printed.
fn upgrade(args: kinglet::upgrade::UpgradeArgs, root_dir: &std::path::Path) -> ExitCode {
    let result = args
        .options()
        .and_then(|o| kinglet::upgrade::run(root_dir, &o));
    match result {
        Ok(outcome) => {
            println!("kinglet upgrade: {outcome}");
            ExitCode::SUCCESS
        }
        Err(e) => exit("kinglet upgrade", Err(e)),
    }
}
