//! Wiring of the CRI front end: binds the CRI socket, rebuilds the agent's
//! store from the runtime, and serves kubelet until shutdown, then drains
//! in-flight calls (the agent core, `qoslet-agent`, owns the rest).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body::Body as _;
use tokio::net::UnixListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

use crate::backend::{Backend, H2Body};
use crate::forward::{Forwarder, ProxyStats};
use crate::pipeline::Pipeline;
use qoslet_agent::{Agent, AgentConfig, AgentError};
use qoslet_state::store::Store;
use qoslet_wire::authority::AuthorityFix;
use qoslet_wire::endpoint::{bind_unix, parse_unix, EndpointError};

/// Settings of the proxy (the binary fills them from flags and the config file).
#[derive(Debug, Clone)]
pub struct ProxyConfig {
    /// kubelet's `--container-runtime-endpoint` (`unix:///run/qoslet/qoslet.sock`).
    pub listen: String,
    /// The backend runtime (`unix:///run/containerd/containerd.sock`).
    pub runtime_endpoint: String,
    /// The admin API (`unix:///run/qoslet/admin.sock`).
    pub admin_listen: String,
    /// Where the store's checkpoint lives (`/var/lib/qoslet`).
    pub state_dir: PathBuf,
    /// Per-message size limit, each way.
    pub max_message_bytes: usize,
    /// How long SIGTERM waits for in-flight calls.
    pub drain_timeout: Duration,
    /// How often the store is reconciled with the runtime.
    pub resync_interval: Duration,
    /// Minimum time between two checkpoint writes.
    pub checkpoint_interval: Duration,
}

impl Default for ProxyConfig {
    fn default() -> Self {
        Self {
            listen: "unix:///run/qoslet/qoslet.sock".into(),
            runtime_endpoint: "unix:///run/containerd/containerd.sock".into(),
            admin_listen: "unix:///run/qoslet/admin.sock".into(),
            state_dir: PathBuf::from("/var/lib/qoslet"),
            max_message_bytes: crate::grpc::DEFAULT_MAX_MESSAGE,
            drain_timeout: Duration::from_secs(30),
            resync_interval: Duration::from_secs(60),
            checkpoint_interval: Duration::from_millis(100),
        }
    }
}

impl ProxyConfig {
    /// The agent core's settings this proxy runs on (`metrics_on`: whether
    /// the configuration turns metrics on).
    pub fn agent(&self, metrics_on: bool) -> AgentConfig {
        AgentConfig {
            admin_listen: self.admin_listen.clone(),
            state_dir: self.state_dir.clone(),
            runtime_endpoint: self.runtime_endpoint.clone(),
            checkpoint_interval: self.checkpoint_interval,
            // an overlapping restart drains for up to its drain timeout
            lock_wait: self.drain_timeout + Duration::from_secs(5),
            metrics_on,
            ..AgentConfig::default()
        }
    }
}

/// Errors starting the proxy.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("listen: {0}")]
    Listen(EndpointError),
    #[error("runtime-endpoint: {0}")]
    Backend(EndpointError),
    #[error("listen and admin-listen are the same socket {0}")]
    SameSocket(String),
    #[error(transparent)]
    Agent(#[from] AgentError),
}

/// The CRI socket, bound before the agent starts: a live qoslet on it is
/// refused at once, and kubelet's connections wait in its backlog (not
/// refused) while the agent waits out an overlapping restart's drain.
pub struct Bound {
    listener: UnixListener,
    backend: Backend,
}

/// Binds the CRI socket of `cfg` (and checks its runtime endpoint).
pub async fn bind(cfg: &ProxyConfig) -> Result<Bound, StartError> {
    let listen_path = parse_unix(&cfg.listen).map_err(StartError::Listen)?;
    if parse_unix(&cfg.admin_listen).is_ok_and(|a| a == listen_path) {
        return Err(StartError::SameSocket(cfg.listen.clone()));
    }
    let backend = Backend::new(&cfg.runtime_endpoint).map_err(StartError::Backend)?;
    let listener = bind_unix(&listen_path).await.map_err(StartError::Listen)?;
    Ok(Bound { listener, backend })
}

/// A running proxy on its agent. Dropping it does not stop it: call [`Running::shutdown`].
pub struct Running {
    pub store: Store,
    pub stats: Arc<ProxyStats>,
    agent: Agent,
    tasks: Vec<JoinHandle<()>>,
}

impl Running {
    /// Stops accepting, drains in-flight calls (up to the drain timeout), then
    /// finishes the agent (admin API stopped, final checkpoint written) and
    /// returns the state dir's lock (drop it once everything else is written there).
    pub async fn shutdown(self) -> Option<qoslet_state::statefile::InstanceLock> {
        self.agent.signal_shutdown();
        for t in self.tasks {
            let _ = t.await;
        }
        // the final checkpoint after the drain: a call that was still in flight
        // (a RunPodSandbox in CNI setup) is in it, with what qoslet applied
        self.agent.finish().await
    }

    /// A receiver that turns true at shutdown.
    pub fn shutdown_signal(&self) -> watch::Receiver<bool> {
        self.agent.shutdown_signal()
    }

    /// The agent this proxy is the front end of.
    pub fn agent(&self) -> &Agent {
        &self.agent
    }
}

/// Starts an agent with the proxy in front: binds the CRI socket, starts the
/// agent core, rebuilds the store and serves (metrics not configured).
pub async fn start(cfg: ProxyConfig, pipeline: Pipeline) -> Result<Running, StartError> {
    let bound = bind(&cfg).await?;
    let agent = Agent::start(cfg.agent(false)).await?;
    Ok(serve(agent, bound, cfg, pipeline).await)
}

/// The proxy as `agent`'s front end: rebuilds the store from the checkpoint
/// and the runtime, and serves kubelet on `bound` in background tasks.
pub async fn serve(agent: Agent, bound: Bound, cfg: ProxyConfig, pipeline: Pipeline) -> Running {
    let Bound { listener, backend } = bound;
    let store = agent.store().clone();
    let rebuilt = crate::rebuild::reconcile(
        &mut backend.runtime(),
        agent.checkpointed().clone(),
        Duration::from_secs(5),
    )
    .await;
    let mut synced = false;
    match rebuilt {
        Ok(r) => {
            info!(
                pods = r.snapshot.pods.len(),
                containers = r.snapshot.containers.len(),
                left_out = r.left_out,
                "store rebuilt from checkpoint and runtime"
            );
            store.replace(r.snapshot);
            // anything left out is asked for again on the short retry, not a minute later
            synced = r.left_out == 0;
        }
        Err(e) => {
            warn!(error = %e, "runtime not listable yet; serving with the checkpoint, will retry")
        }
    }

    let rx = agent.shutdown_signal();
    let stats = Arc::new(ProxyStats::default());
    let forwarder = Arc::new(Forwarder::new(
        backend.clone(),
        pipeline.clone(),
        store.clone(),
        stats.clone(),
        cfg.max_message_bytes,
        rx.clone(),
    ));
    let attached = agent.attach(Arc::new(crate::front::CriFront {
        stats: stats.clone(),
        pipeline,
        backend: backend.clone(),
        listen: cfg.listen.clone(),
    }));
    if !attached {
        // one front end per agent: this one still serves, unseen by the admin API
        tracing::error!(
            "a front end is attached to this agent already; the CRI proxy's counters are not shown"
        );
    }
    let tasks = vec![
        tokio::spawn(serve_proxy(
            listener,
            forwarder,
            rx.clone(),
            cfg.drain_timeout,
        )),
        tokio::spawn(resync(
            backend,
            store.clone(),
            rx,
            cfg.resync_interval,
            synced,
        )),
    ];
    info!(listen = %cfg.listen, runtime = %cfg.runtime_endpoint, "qoslet proxy serving");
    Running {
        store,
        stats,
        agent,
        tasks,
    }
}

async fn serve_proxy(
    listener: UnixListener,
    fwd: Arc<Forwarder>,
    mut shutdown: watch::Receiver<bool>,
    drain: Duration,
) {
    // the connection tasks (each owning its calls' tasks), so the ones still
    // running at the drain deadline end there (not after the final checkpoint
    // and restoreOnExit)
    let mut conns = tokio::task::JoinSet::new();
    let (deadline, deadline_rx) = watch::channel(false);
    loop {
        while conns.try_join_next().is_some() {}
        let stream = tokio::select! {
            r = listener.accept() => match r {
                Ok((s, _)) => s,
                Err(e) => {
                    warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = stopped(&mut shutdown) => break,
        };
        conns.spawn(serve_connection(
            stream,
            fwd.clone(),
            shutdown.clone(),
            deadline_rx.clone(),
        ));
    }
    drop(listener);
    info!(connections = conns.len(), "draining proxy connections");
    let all_done = async { while conns.join_next().await.is_some() {} };
    if tokio::time::timeout(drain, all_done).await.is_ok() {
        info!("proxy drained");
        return;
    }
    warn!(timeout = ?drain, "drain timeout; closing remaining calls");
    // calls still running past the deadline end here: each connection aborts
    // its calls and waits until they are gone, so none touches the store after
    // the final checkpoint; a connection that does not answer within a second
    // (it cannot: nothing it waits on blocks) is aborted
    let _ = deadline.send(true);
    let all_gone = async { while conns.join_next().await.is_some() {} };
    if tokio::time::timeout(Duration::from_secs(1), all_gone)
        .await
        .is_err()
    {
        conns.abort_all();
        while conns.join_next().await.is_some() {}
    }
}

/// qoslet's HTTP/2 server settings for kubelet's connections.
fn server_settings() -> h2::server::Builder {
    let mut b = h2::server::Builder::new();
    // neither the header-list limit nor the frame size is set: h2's defaults are
    // grpc-go's (16 MiB enforced and not advertised, 16 KiB frames), so a client
    // meets the limits containerd enforces, and h2's CONTINUATION-flood limit
    // (which follows the frame size) lets a full 16 MiB block through in
    // 16 KiB frames (qoslet_wire::limits)
    b.max_concurrent_streams(1024)
        // a malformed request is reset at stream level (authority.rs), as
        // containerd resets it, however many a connection sends: h2's default
        // budget of 1,024 such resets per connection would end in GOAWAY
        .max_local_error_reset_streams(None)
        .initial_window_size(4 << 20)
        .initial_connection_window_size(16 << 20)
        // per stream, what qoslet holds of an answer its client has not read yet
        .max_send_buffer_size(1 << 20);
    b
}

/// One kubelet connection, HTTP/2 terminated on h2 (driven directly: each call
/// a task of this connection, its answer's HEADERS, DATA and trailers queued
/// together so they leave in one write), with a runtime connection of its own.
/// At shutdown: GOAWAY (graceful, then final), in-flight calls finish, event
/// streams end with UNAVAILABLE.
async fn serve_connection(
    stream: tokio::net::UnixStream,
    fwd: Arc<Forwarder>,
    mut shutdown: watch::Receiver<bool>,
    mut deadline: watch::Receiver<bool>,
) {
    fwd.stats()
        .connections_terminated
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let io = AuthorityFix::new(stream);
    let client = io.client_settings();
    let handshake = server_settings().handshake::<_, Bytes>(io);
    let mut conn = match tokio::select! {
        r = handshake => r,
        _ = stopped(&mut shutdown) => return,
    } {
        Ok(c) => c,
        Err(e) => {
            debug!(error = %e, "proxy connection: HTTP/2 handshake failed");
            return;
        }
    };
    // this client's own connection to the runtime, closed with it; made at its
    // first call (after the client's SETTINGS), with the client's header-list limit
    let backend = fwd.own_backend(client);
    // aborted and awaited when the connection ends (or at the drain deadline)
    let mut calls = tokio::task::JoinSet::new();
    let mut draining = *shutdown.borrow();
    if draining {
        conn.graceful_shutdown();
    }
    // made once, not at every turn of the loop: each is a watch wait that
    // registers with its channel (a lock) when made and leaves it when dropped
    // (callgrind: 600 instructions a call when made anew at each turn)
    let mut stopping = std::pin::pin!(stopped(&mut shutdown));
    let mut out_of_time = std::pin::pin!(stopped(&mut deadline));
    loop {
        tokio::select! {
            r = conn.accept() => match r {
                Some(Ok((req, respond))) => {
                    // boxed: the task then holds a pointer, so its allocation stays
                    // small; a call's whole state inline made it a large aligned
                    // allocation, which costs glibc a consolidation of its free
                    // lists on every call (callgrind)
                    calls.spawn(Box::pin(serve_call(
                        fwd.clone(),
                        backend.clone(),
                        req,
                        respond,
                    )));
                }
                Some(Err(e)) => {
                    debug!(error = %e, "proxy connection ended with an error");
                    break;
                }
                None => break,
            },
            Some(_) = calls.join_next(), if !calls.is_empty() => {}
            // (polled again only before it resolved: draining guards it)
            _ = &mut stopping, if !draining => {
                draining = true;
                conn.graceful_shutdown();
            }
            _ = &mut out_of_time => break,
        }
    }
    // the connection is gone (or out of time): what is still running cannot answer
    calls.abort_all();
    while calls.join_next().await.is_some() {}
}

/// One call: the forwarder's answer, written back as the client's window allows.
/// A client that resets the stream cancels the call (and so the runtime's stream).
async fn serve_call(
    fwd: Arc<Forwarder>,
    backend: Backend,
    req: http::Request<h2::RecvStream>,
    mut respond: h2::server::SendResponse<Bytes>,
) {
    // boxed: the call's future is large, and a task's future is copied as it
    // is spawned and again as its stage changes (callgrind: 2-3k instructions a call)
    let call = Box::pin(fwd.handle_on(req.map(H2Body::new), &backend));
    let resp = tokio::select! {
        biased;
        r = call => r,
        _ = std::future::poll_fn(|cx| respond.poll_reset(cx)) => return,
    };
    let (head, body) = resp.into_parts();
    if let Some(crate::forward::ResetStream(reason)) = head.extensions.get() {
        respond.send_reset(*reason);
        return;
    }
    // a trailers-only answer (the status in its HEADERS) keeps END_STREAM on them
    let end = body.is_end_stream();
    let mut send = match respond.send_response(http::Response::from_parts(head, ()), end) {
        Ok(s) => s,
        Err(e) => {
            debug!(error = %e, "answer not sent");
            respond.send_reset(h2::Reason::INTERNAL_ERROR);
            return;
        }
    };
    if !end {
        crate::h2io::pipe(body, &mut send, None, h2::Reason::INTERNAL_ERROR).await;
    }
}

/// Reconciles the store with the runtime every `interval` (sooner after a failed
/// start or a pass that left entries out: 2 s, doubling while entries stay
/// out), so entries removed behind qoslet's back go away.
async fn resync(
    backend: Backend,
    store: Store,
    mut shutdown: watch::Receiver<bool>,
    interval: Duration,
    mut synced: bool,
) {
    let mut retry = Duration::from_secs(2);
    loop {
        let wait = if synced {
            interval
        } else {
            retry.min(interval)
        };
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = stopped(&mut shutdown) => return,
        }
        // while the runtime is down, do not copy the store every retry
        if !synced {
            let probe = tokio::time::timeout(
                Duration::from_secs(2),
                backend
                    .runtime()
                    .version(qoslet_proto::cri::VersionRequest {
                        version: String::new(),
                    }),
            )
            .await;
            if !matches!(probe, Ok(Ok(_))) {
                continue;
            }
        }
        let (seq, before) = store.snapshot_for_resync();
        match crate::rebuild::reconcile(
            &mut backend.runtime(),
            before.clone(),
            Duration::from_secs(10),
        )
        .await
        {
            Ok(after) => {
                // merge, not replace: calls that completed during the listing must not be lost
                let (added, removed) = store.apply_resync(seq, &before, after.snapshot);
                if added + removed > 0 {
                    info!(added, removed, "store resynced with the runtime");
                }
                synced = after.left_out == 0;
                retry = if synced {
                    Duration::from_secs(2)
                } else {
                    (retry * 2).min(interval)
                };
            }
            Err(e) => debug!(error = %e, "resync failed"),
        }
    }
}

/// Resolves once the shutdown flag is true.
pub(crate) async fn stopped(rx: &mut watch::Receiver<bool>) {
    let _ = rx.wait_for(|v| *v).await;
}
