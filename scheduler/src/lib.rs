//! Load-aware placement for kube-scheduler's extender API (crate
//! `qoslet-scheduler`, issue 47): Koordinator LoadAware's semantics, so that
//! a vanilla kube-scheduler places pods by what nodes really use (the
//! NodeMetric qoslet reports) and not only by requests.
//!
//! * [`args`]: `LoadAwareSchedulingArgs` with its own field names, defaults
//!   and validation.
//! * [`estimate`]: what a pod will use before its node reports it.
//! * [`load`]: one node's load, kept incrementally as LoadAware's assign
//!   cache keeps it (NodeMetric usage plus the estimates it does not show yet).
//! * [`rank`]: Filter and Score, and the extender's 0-10 scale.
//!
//! * [`facts`]: the API's objects (Pod, Node, NodeMetric) as those read them.
//! * [`cache`]: the scheduler's own cache of the cluster, with tentative
//!   assignments; [`watch`] feeds it (list and watch, relist on 410).
//! * [`extender`]: Filter and Prioritize over the cache; [`wire`]: the
//!   extender API's v1 JSON; [`serve`]: the HTTP front.
//!
//! The first five are pure (no I/O, no async) and table-tested; [`run`]
//! puts the watches and the front together (`qoslet scheduler-extender`).
//! It depends on the cluster room's shared part (`qoslet-kube-api`), never
//! on the node agent.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

pub mod args;
pub mod cache;
pub mod estimate;
pub mod extender;
pub mod facts;
pub mod load;
pub mod rank;
pub mod serve;
pub mod watch;
pub mod wire;

/// What `qoslet scheduler-extender` runs with.
#[derive(Debug)]
pub struct Options {
    /// `None`: the in-cluster service account.
    pub kubeconfig: Option<PathBuf>,
    pub listen: SocketAddr,
    pub args: args::Args,
    pub max_body: usize,
    /// How long the node a pod scored best on holds it (ms).
    pub assume_ttl_ms: i64,
}

/// Reads a config file: a `LoadAwareSchedulingArgs` object in YAML or JSON
/// (koord-scheduler's field names; `apiVersion` and `kind` allowed).
pub fn read_args(text: &str) -> Result<args::Args, String> {
    let f: args::ArgsFile = serde_saphyr::from_str(text).map_err(|e| e.to_string())?;
    args::Args::from_file(f)
}

/// Runs the extender until `shutdown`: the watches feed the cache, the
/// front answers from it.
pub async fn run(o: Options, shutdown: tokio::sync::watch::Receiver<bool>) -> Result<(), String> {
    let client = qoslet_kube_api::connect::client(o.kubeconfig.as_deref())
        .await
        .map_err(|e| e.to_string())?;
    let listener = tokio::net::TcpListener::bind(o.listen)
        .await
        .map_err(|e| format!("listen on {}: {e}", o.listen))?;
    let mut ext = extender::Extender::new(o.args);
    ext.assume_ttl_ms = o.assume_ttl_ms;
    let ext = Arc::new(ext);
    let status = Arc::new(watch::Status::default());
    let front = Arc::new(serve::Front::new(ext.clone(), status.clone(), o.max_body));
    tracing::info!(listen = %o.listen, "scheduler extender serving /filter and /prioritize");
    tokio::join!(
        watch::follow_all(client, ext, status, shutdown.clone()),
        serve::serve(listener, front, shutdown),
    );
    Ok(())
}

#[cfg(test)]
mod tests;
