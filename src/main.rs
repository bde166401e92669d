//! qoslet: a node agent that keeps latency-sensitive pods safe from best-effort
//! pods on shared Kubernetes nodes. This binary holds the CLI, config loading,
//! wiring and signal handling; the work happens in the library crates.

mod cli;
mod config;
mod isolation;

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "qoslet",
    version,
    about = "QoS node agent for co-located latency-sensitive and best-effort pods"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run the CRI proxy between kubelet and containerd.
    Proxy(ProxyArgs),
    /// Show the status of a running qoslet (over the admin socket).
    Status(cli::AdminArgs),
    /// List the pods and containers a running qoslet knows.
    Pods(cli::PodsArgs),
    /// Explain what qoslet applied to a pod and why (class, its source, each setting and its rule).
    Explain(cli::ExplainArgs),
}

#[derive(clap::Args)]
struct ProxyArgs {
    /// Socket kubelet talks to (kubelet's --container-runtime-endpoint).
    #[arg(long, value_name = "ENDPOINT")]
    listen: Option<String>,
    /// The real runtime qoslet forwards to.
    #[arg(long, value_name = "ENDPOINT")]
    runtime_endpoint: Option<String>,
    /// Socket of the admin API.
    #[arg(long, value_name = "ENDPOINT")]
    admin_listen: Option<String>,
    /// Directory for qoslet's state (store checkpoint).
    #[arg(long, value_name = "DIR")]
    state_dir: Option<PathBuf>,
    /// YAML config file; every flag above can be set there.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Log filter (error, warn, info, debug, trace, or a tracing filter); env QOSLET_LOG also works.
    #[arg(long)]
    log_level: Option<String>,
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("qoslet: cannot start the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let r = rt.block_on(async {
        match cli.cmd {
            Cmd::Proxy(a) => run_proxy(a).await,
            Cmd::Status(a) => cli::status(a).await,
            Cmd::Pods(a) => cli::pods(a).await,
            Cmd::Explain(a) => cli::explain(a).await,
        }
    });
    match r {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("qoslet: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn init_logging(level: &str) {
    let filter = std::env::var("QOSLET_LOG").unwrap_or_else(|_| level.to_string());
    let filter = tracing_subscriber::EnvFilter::try_new(&filter).unwrap_or_else(|e| {
        eprintln!("qoslet: bad log filter {filter:?} ({e}); using info");
        tracing_subscriber::EnvFilter::new("info")
    });
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .init();
}

async fn run_proxy(a: ProxyArgs) -> Result<()> {
    let (path, explicit) = match &a.config {
        Some(p) => (p.clone(), true),
        None => (PathBuf::from(config::DEFAULT_CONFIG), false),
    };
    let file = config::load(&path, explicit)?;
    init_logging(
        a.log_level
            .as_deref()
            .or(file.log_level.as_deref())
            .unwrap_or("info"),
    );

    let mut cfg = qoslet_proxy::ProxyConfig::default();
    if let Some(v) = a.listen.or(file.listen) {
        cfg.listen = v;
    }
    if let Some(v) = a.runtime_endpoint.or(file.runtime_endpoint) {
        cfg.runtime_endpoint = v;
    }
    if let Some(v) = a.admin_listen.or(file.admin_listen) {
        cfg.admin_listen = v;
    }
    if let Some(v) = a.state_dir.or(file.state_dir) {
        cfg.state_dir = v;
    }
    if let Some(v) = file.relay {
        cfg.relay = v;
    }
    if let Some(v) = file.max_message_bytes {
        cfg.max_message_bytes = v as usize;
    }
    if let Some(v) = &file.drain_timeout {
        cfg.drain_timeout = config::parse_duration(v)?;
    }
    if let Some(v) = &file.resync_interval {
        cfg.resync_interval = config::parse_duration(v)?;
    }
    let settings = hook_settings(file.hooks.as_ref())?;
    let pipeline = if file.isolation.unwrap_or(true) {
        let root = file
            .cgroup_root
            .clone()
            .unwrap_or_else(|| PathBuf::from("/sys/fs/cgroup"));
        let cgroups = match qoslet_cgroups::Cgroups::detect(&root) {
            Ok(c) => Some(c),
            Err(e) => {
                tracing::warn!(error = %e, "no cgroups found; only settings CRI carries will be applied");
                None
            }
        };
        let policy = file
            .policy
            .map(|p| p.resource_qos_strategy)
            .unwrap_or_default();
        let resctrl_root = file
            .resctrl_root
            .clone()
            .unwrap_or_else(|| PathBuf::from("/sys/fs/resctrl"));
        let resctrl = match qoslet_cgroups::resctrl::Resctrl::detect(&resctrl_root) {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %e, "resctrl unreadable; LLC/MBA isolation off");
                None
            }
        };
        let hook: std::sync::Arc<dyn qoslet_proxy::Hook> =
            std::sync::Arc::new(isolation::Isolation::new(cgroups, resctrl, policy));
        qoslet_proxy::Pipeline::with_hooks(vec![(hook, settings)])
    } else {
        qoslet_proxy::Pipeline::new()
    };

    let running = qoslet_proxy::start(cfg, pipeline).await?;
    wait_for_signal().await?;
    tracing::info!("signal received; draining");
    running.shutdown().await;
    tracing::info!("stopped");
    Ok(())
}

fn hook_settings(h: Option<&config::HooksConfig>) -> Result<qoslet_proxy::HookSettings> {
    let mut s = qoslet_proxy::HookSettings::default();
    if let Some(h) = h {
        if let Some(t) = &h.timeout {
            s.timeout = config::parse_duration(t)?;
        }
        if let Some(p) = h.failure_policy {
            s.policy = p;
        }
    }
    Ok(s)
}

async fn wait_for_signal() -> Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).context("SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("SIGINT handler")?;
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    Ok(())
}
