//! `qoslet nri`: the agent with the NRI plugin as its front end. Composition
//! only: the protocol is `qoslet-nri`'s, the events' adapter
//! `qoslet-nri-front`'s.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result};
use qoslet_nri::{Backoff, Options, Plugin};
use qoslet_nri_front::{NriFront, NriHandler};

pub const DEFAULT_SOCKET: &str = "/var/run/nri/nri.sock";
const DEFAULT_NAME: &str = "qoslet";
const DEFAULT_INDEX: &str = "50";

#[derive(clap::Args)]
pub struct NriArgs {
    /// The runtime's NRI socket (ignored when the runtime started qoslet
    /// itself and handed it a socket on fd 3).
    #[arg(long, value_name = "PATH")]
    nri_socket: Option<PathBuf>,
    /// The plugin's name (default qoslet).
    #[arg(long, value_name = "NAME")]
    plugin_name: Option<String>,
    /// The plugin's index, two digits (default 50).
    #[arg(long, value_name = "NN")]
    plugin_index: Option<String>,
    #[command(flatten)]
    agent: crate::AgentArgs,
}

pub async fn run(a: NriArgs) -> Result<()> {
    // fd 3 first, before anything opens a descriptor that could take its number
    let pre = qoslet_nri_front::preinstalled::take().map_err(anyhow::Error::msg)?;
    let defaults = qoslet_agent::AgentConfig::default();
    let p = crate::prepare(a.agent, &defaults.state_dir)?;
    let cfg = p.file.nri.clone().unwrap_or_default();
    let socket = a
        .nri_socket
        .or(cfg.socket.clone())
        .unwrap_or_else(|| PathBuf::from(DEFAULT_SOCKET));
    // a runtime-started plugin is named by the runtime (its file name)
    let (name, index) = match &pre {
        Some(pre) => (pre.name.clone(), pre.index.clone()),
        None => (
            a.plugin_name
                .or(cfg.plugin_name.clone())
                .unwrap_or_else(|| DEFAULT_NAME.into()),
            a.plugin_index
                .or(cfg.plugin_index.clone())
                .unwrap_or_else(|| DEFAULT_INDEX.into()),
        ),
    };
    let mut opts =
        Options::new(&name, &index, qoslet_nri_front::events()).context("NRI plugin name/index")?;
    if let Some(t) = cfg.hook_timeout {
        if t.0 >= std::time::Duration::from_secs(2) {
            tracing::warn!(timeout = ?t.0, "nri.hookTimeout is not under the runtime's default request timeout (2s): a slow event would disconnect the plugin");
        }
        opts.hook_timeout = t.0;
    }
    let shown = match &pre {
        Some(_) => "fd 3 (started by the runtime)".to_string(),
        None => socket.display().to_string(),
    };
    let agent_cfg = p.agent_config(qoslet_agent::AgentConfig {
        admin_listen: p
            .admin_listen
            .clone()
            .unwrap_or(defaults.admin_listen.clone()),
        state_dir: p.state_dir.clone().unwrap_or(defaults.state_dir.clone()),
        // a checkpoint written in proxy mode is another front end's: Synchronize rebuilds
        runtime_endpoint: format!("nri:{}", socket.display()),
        front: "nri",
        // a runtime-started plugin must register within the runtime's
        // registration timeout (5 s in NRI v0.6): it waits for an old
        // qoslet's lock only briefly, and fails fast rather than cost the runtime
        lock_wait: if pre.is_some() {
            std::time::Duration::from_secs(2)
        } else {
            defaults.lock_wait
        },
        ..defaults
    });
    let agent = qoslet_agent::Agent::start(agent_cfg).await?;
    p.watch_policy(&agent);
    let cluster = p.start_cluster(&agent).await?;
    let iso = p.isolation(&agent).map(Arc::new);
    let runtime_socket = p
        .file
        .runtime_endpoint
        .as_deref()
        .or(Some("unix:///run/containerd/containerd.sock"))
        .and_then(qoslet_state::endpoint::unix_path);
    let mut handler = NriHandler::new(agent.store().clone(), iso);
    if let Some(view) = p.start_eviction(&agent, runtime_socket, cluster.as_ref()) {
        handler = handler.with_admission(view, p.trust.clone());
    }
    let handler = Arc::new(handler);
    let plugin = Arc::new(Plugin::new(opts, handler.clone()));
    if !agent.attach(Arc::new(NriFront {
        plugin: plugin.clone(),
        handler,
        socket: shown,
    })) {
        anyhow::bail!("a front end is attached to this agent already");
    }
    let pl = plugin.clone();
    let preinstalled = pre.is_some();
    let mut session = match pre {
        // one session: the runtime's connection ends, so does the plugin it started
        Some(pre) => {
            pre.socket.set_nonblocking(true).context("fd 3")?;
            let io = tokio::net::UnixStream::from_std(pre.socket).context("fd 3")?;
            tokio::spawn(async move {
                if let Err(e) = pl.serve(io).await {
                    tracing::warn!(error = %e, "the NRI session on fd 3 failed");
                }
            })
        }
        None => {
            tracing::info!(socket = %socket.display(), plugin = %name, index = %index, "connecting to the runtime's NRI socket");
            tokio::spawn(async move { pl.run_socket(&socket, Backoff::default()).await })
        }
    };
    if let Err(e) = agent.start_loops(p.loops()).await {
        session.abort();
        plugin.close();
        agent.finish().await;
        return Err(e.into());
    }
    let ended = tokio::select! {
        r = crate::wait_for_signal() => {
            r?;
            tracing::info!("signal received; stopping");
            false
        }
        _ = &mut session, if preinstalled => {
            tracing::info!("the runtime closed the plugin's socket; stopping");
            true
        }
    };
    // the connection closes first (the runtime carries on without the
    // plugin), then the agent: final checkpoint, loops, restoreOnExit
    if !ended {
        session.abort();
        let _ = session.await;
    }
    plugin.close();
    drop(agent.finish().await);
    tracing::info!("stopped");
    Ok(())
}
