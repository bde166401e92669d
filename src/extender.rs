//! `qoslet scheduler-extender`: kube-scheduler's extender API with
//! Koordinator LoadAware's filter and score (`qoslet_scheduler`), from its
//! own cache of Nodes, NodeMetrics and Pods. It shares no state with the
//! node agent: only the logging and signal set-up of this binary.

use std::path::PathBuf;

use anyhow::{Context, Result};

use crate::{config, init_logging, wait_for_signal};

#[derive(clap::Args)]
pub struct ExtenderArgs {
    /// kubeconfig of the API server (default: the in-cluster service account).
    #[arg(long, value_name = "FILE")]
    kubeconfig: Option<PathBuf>,
    /// Address kube-scheduler calls (its `urlPrefix`).
    #[arg(long, value_name = "ADDR", default_value = "0.0.0.0:10262")]
    listen: std::net::SocketAddr,
    /// LoadAwareSchedulingArgs (YAML or JSON, koord-scheduler's field names;
    /// default: its defaults).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// The largest request body read, bytes (1 KiB to 1 GiB).
    #[arg(long, value_name = "BYTES", default_value_t = qoslet_scheduler::serve::DEFAULT_MAX_BODY,
          value_parser = clap::value_parser!(u64).range(1024..=1 << 30))]
    max_body_bytes: u64,
    /// How long the node a pod scored best on holds it, until the pod watch
    /// shows its binding (e.g. 30s).
    #[arg(long, value_name = "DURATION", default_value = "30s")]
    assume_ttl: config::Dur,
    /// Log filter (error, warn, info, debug, trace, or a tracing filter); env QOSLET_LOG also works.
    #[arg(long, default_value = "info")]
    log_level: String,
}

pub async fn run(a: ExtenderArgs) -> Result<()> {
    init_logging(&a.log_level);
    let args = match &a.config {
        Some(path) => {
            let text =
                std::fs::read_to_string(path).with_context(|| format!("{}", path.display()))?;
            qoslet_scheduler::read_args(&text)
                .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?
        }
        None => qoslet_scheduler::args::Args::default(),
    };
    let (tx, rx) = tokio::sync::watch::channel(false);
    let signals = wait_for_signal();
    tokio::pin!(signals);
    let run = qoslet_scheduler::run(
        qoslet_scheduler::Options {
            kubeconfig: a.kubeconfig,
            listen: a.listen,
            args,
            max_body: a.max_body_bytes as usize,
            assume_ttl_ms: a.assume_ttl.0.as_millis() as i64,
        },
        rx,
    );
    tokio::pin!(run);
    tokio::select! {
        r = &mut run => return r.map_err(|e| anyhow::anyhow!(e)),
        r = &mut signals => r?,
    }
    let _ = tx.send(true);
    run.await.map_err(|e| anyhow::anyhow!(e))
}
