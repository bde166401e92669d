//! The agent core: what runs whatever the front end (and with none): the
//! state dir's lock, the store loaded from its checkpoint and the task that
//! keeps the checkpoint current, and the admin socket. Front ends attach to it
//! ([`Agent::attach`]); the loops (metrics, engine) report to it through
//! [`Agent::views`].
//!
//! Order at start: the admin socket first (a live qoslet on it: refuse at
//! once), then the state dir's lock (waiting out an overlapping restart's
//! drain), then the checkpoint. At stop: the front end drains first (its calls
//! still change the store), then [`Agent::finish`] stops the admin API and
//! writes the final checkpoint.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use qoslet_cgroups::PodRoot;
use qoslet_hooks::Trust;
use qoslet_qos_engine::source::PolicyConfig;
use qoslet_state::checkpoint::{Checkpoint, LoadError};
use qoslet_state::inventory::Inventories;
use qoslet_state::statefile::{self, InstanceLock, StateError};
use qoslet_state::store::{Snapshot, Store};
use qoslet_wire::endpoint::{bind_unix, parse_unix, EndpointError};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{error, info, warn};

use crate::admin::{AdminService, Views};
use crate::front::{FrontEnd, FrontEnds};
use crate::hub::PolicyHub;

/// Settings of the agent core (the binary fills them from flags and the config file).
#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// The admin API (`unix:///run/qoslet/admin.sock`).
    pub admin_listen: String,
    /// Where the store's checkpoint lives (`/var/lib/qoslet`).
    pub state_dir: PathBuf,
    /// The runtime the store describes: a checkpoint of another runtime is foreign.
    pub runtime_endpoint: String,
    /// Minimum time between two checkpoint writes.
    pub checkpoint_interval: Duration,
    /// How long to wait for the state dir's lock (an overlapping restart's drain).
    pub lock_wait: Duration,
    /// Whether metrics are configured at all (the admin API says "off" otherwise).
    pub metrics_on: bool,
    /// Whose class labels and scheduler annotations are believed (the inventory's classes).
    pub trust: Trust,
    /// Where kubelet puts pods (`kubeletCgroupRoot`).
    pub pod_root: PodRoot,
    /// The config file's `policy:` as read at start (`None`: it has none),
    /// the file source's first offer to the policy hub.
    pub policy: Option<PolicyConfig>,
    /// The front end this agent runs for (`proxy`, `nri`), written in the
    /// state dir's lock: one front end per node, and a second is told which holds it.
    pub front: &'static str,
}

impl Default for AgentConfig {
    fn default() -> Self {
        Self {
            admin_listen: "unix:///run/qoslet/admin.sock".into(),
            state_dir: PathBuf::from("/var/lib/qoslet"),
            runtime_endpoint: "unix:///run/containerd/containerd.sock".into(),
            checkpoint_interval: Duration::from_millis(100),
            lock_wait: Duration::from_secs(35),
            metrics_on: true,
            trust: Trust::default(),
            pod_root: PodRoot::default(),
            policy: None,
            front: "proxy",
        }
    }
}

/// Errors starting the agent.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("admin-listen: {0}")]
    Admin(EndpointError),
    #[error("state-dir: {0}")]
    State(#[from] StateError),
    #[error("metrics: {0}")]
    Metrics(#[from] qoslet_metrics::service::ServiceError),
}

/// A running agent. Dropping it does not stop it: call [`Agent::finish`].
pub struct Agent {
    store: Store,
    /// The store's one inventory (metrics, engine and isolation share it).
    inventory: Arc<Inventories>,
    /// Where the policy's sources offer it and its followers subscribe.
    hub: Arc<PolicyHub>,
    /// The loops started ([`Agent::start_loops`]), stopped at [`Agent::finish`].
    pub(crate) loops: std::sync::Mutex<crate::loops::Running>,
    /// What the checkpoint held at start (a front end's rebuild starts from it).
    checkpointed: Snapshot,
    views: Arc<Views>,
    pub(crate) front: FrontEnds,
    shutdown: watch::Sender<bool>,
    /// The admin socket, bound at start and served from [`Agent::serve_admin`]
    /// (until then its clients wait in the backlog, as for the CRI socket).
    admin_pending: std::sync::Mutex<Option<(tokio::net::UnixListener, AdminService)>>,
    admin: std::sync::Mutex<Option<JoinHandle<()>>>,
    /// The checkpoint writer, stopped only after the front end has drained.
    checkpoint: Option<(watch::Sender<bool>, JoinHandle<()>)>,
    /// Held until the final checkpoint is written (and handed to the caller,
    /// who writes the metrics snapshot into the same dir).
    lock: Option<InstanceLock>,
    /// The lock of a state dir qoslet could not make private (no checkpoint
    /// there, but still one qoslet at a time).
    _unchecked_lock: Option<InstanceLock>,
    admin_listen: String,
    /// The state dir, when it is private and this agent holds its lock.
    state_dir: Option<PathBuf>,
}

impl Agent {
    /// Starts the agent core: binds the admin socket, takes the state dir,
    /// loads the checkpoint and serves the admin API.
    pub async fn start(cfg: AgentConfig) -> Result<Agent, AgentError> {
        let admin_path = parse_unix(&cfg.admin_listen).map_err(AgentError::Admin)?;
        let admin_listener = bind_unix(&admin_path).await.map_err(AgentError::Admin)?;
        // private, and one qoslet at a time. It is only a cache: unusable,
        // qoslet serves without it.
        let mut unchecked_lock = None;
        let lock = match statefile::ensure_private_dir(&cfg.state_dir) {
            Ok(()) => Some(
                statefile::lock_within(
                    &cfg.state_dir,
                    cfg.lock_wait,
                    &format!("qoslet {}", cfg.front),
                )
                .await?,
            ),
            Err(e) => {
                error!(error = %e, "state dir unusable; serving without a checkpoint");
                // still one qoslet at a time where the dir can be locked at all
                if cfg.state_dir.is_dir() && !cfg.state_dir.is_symlink() {
                    match statefile::lock_as(&cfg.state_dir, &format!("qoslet {}", cfg.front)) {
                        Err(e @ StateError::Locked { .. }) => return Err(e.into()),
                        Err(e) => warn!(error = %e, "state dir not lockable either"),
                        Ok(l) => unchecked_lock = Some(l),
                    }
                }
                None
            }
        };
        let store = Store::new();
        let checkpoint = Checkpoint::new(&cfg.state_dir, &cfg.runtime_endpoint);
        let checkpointed = match lock.as_ref().map(|_| checkpoint.load()) {
            None => Snapshot::default(),
            Some(Ok(s)) => {
                info!(pods = s.pods.len(), containers = s.containers.len(), path = %checkpoint.path().display(), "checkpoint loaded");
                s
            }
            Some(Err(LoadError::Missing(p))) => {
                info!(path = %p.display(), "no checkpoint; starting from the runtime");
                Snapshot::default()
            }
            Some(Err(e)) => {
                warn!(error = %e, "checkpoint ignored; rebuilding from the runtime");
                Snapshot::default()
            }
        };
        store.replace(checkpointed.clone());
        let (shutdown, _) = watch::channel(false);
        let views = Arc::new(Views::new(cfg.metrics_on));
        let front = FrontEnds::default();
        let hub = PolicyHub::new(cfg.policy);
        let admin = AdminService {
            hub: hub.clone(),
            views: views.clone(),
            store: store.clone(),
            front: front.clone(),
            started: Instant::now(),
            state_dir: cfg.state_dir.display().to_string(),
        };
        let checkpoint = lock.is_some().then(|| {
            let (stop, stopped) = watch::channel(false);
            let task =
                tokio::spawn(checkpoint.run(store.clone(), stopped, cfg.checkpoint_interval));
            (stop, task)
        });
        info!(admin = %cfg.admin_listen, state_dir = %cfg.state_dir.display(), "qoslet agent serving");
        Ok(Agent {
            state_dir: lock.is_some().then(|| cfg.state_dir.clone()),
            hub,
            inventory: Inventories::new(store.clone(), cfg.trust, cfg.pod_root),
            loops: Default::default(),
            store,
            checkpointed,
            views,
            front,
            shutdown,
            admin_pending: std::sync::Mutex::new(Some((admin_listener, admin))),
            admin: std::sync::Mutex::new(None),
            checkpoint,
            lock,
            _unchecked_lock: unchecked_lock,
            admin_listen: cfg.admin_listen,
        })
    }

    /// The state dir, when it is private and this agent holds its lock
    /// (where a room may keep what must survive a restart).
    pub fn state_dir(&self) -> Option<&std::path::Path> {
        self.state_dir.as_deref()
    }

    /// The store (shared: clones see the same data).
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The store's one inventory.
    pub fn inventory(&self) -> &Arc<Inventories> {
        &self.inventory
    }

    /// The policy hub (sources offer to it; `subscribe()` follows the policy in force).
    pub fn policy(&self) -> &Arc<PolicyHub> {
        &self.hub
    }

    /// What the checkpoint held at start.
    pub fn checkpointed(&self) -> &Snapshot {
        &self.checkpointed
    }

    /// Where the agent's loops report to the admin API.
    pub fn views(&self) -> &Arc<Views> {
        &self.views
    }

    /// The admin socket's endpoint.
    pub fn admin_listen(&self) -> &str {
        &self.admin_listen
    }

    /// Attaches the front end that serves the runtime's calls, once its store
    /// is rebuilt, and serves the admin API; false if one is attached already
    /// (one front end per agent).
    #[must_use]
    pub fn attach(&self, f: Arc<dyn FrontEnd>) -> bool {
        let attached = self.front.attach(f);
        self.serve_admin();
        attached
    }

    /// Serves the admin API (once; [`Agent::attach`] does it after the front
    /// end's rebuild, so no client sees the store half-built; an agent with no
    /// front end calls it itself).
    pub fn serve_admin(&self) {
        let pending = self
            .admin_pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some((listener, admin)) = pending {
            let task = tokio::spawn(crate::admin::serve(
                listener,
                admin,
                self.shutdown.subscribe(),
            ));
            *self.admin.lock().unwrap_or_else(|e| e.into_inner()) = Some(task);
        }
    }

    /// A receiver that turns true when the agent stops (front ends and loops follow it).
    pub fn shutdown_signal(&self) -> watch::Receiver<bool> {
        self.shutdown.subscribe()
    }

    /// Tells everything that follows [`Agent::shutdown_signal`] to stop.
    pub fn signal_shutdown(&self) {
        // stored even when no one listens yet (a later subscriber sees it)
        self.shutdown.send_replace(true);
    }

    /// Stops the admin API, writes the final checkpoint (call it after the
    /// front end has drained: a call still in flight is then in it), stops the
    /// loops (the metrics snapshot is written), puts back what the engine
    /// changed when `restoreOnExit` is on (pods started by calls still in
    /// flight included), and returns the state dir's lock.
    /// Keeps a loop's task, awaited at [`Agent::finish`] (it ends on the
    /// shutdown signal).
    pub fn add_task(&self, t: JoinHandle<()>) {
        self.loops
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .tasks
            .push(t);
    }

    pub async fn finish(self) -> Option<InstanceLock> {
        self.signal_shutdown();
        let task = self.admin.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(task) = task {
            let _ = task.await;
        }
        if let Some((stop, task)) = self.checkpoint {
            let _ = stop.send(true);
            let _ = task.await;
        }
        let loops = std::mem::take(&mut *self.loops.lock().unwrap_or_else(|e| e.into_inner()));
        for t in loops.tasks {
            let _ = t.await;
        }
        if let Some(engine) = loops.engine {
            let inventory = self.inventory.clone();
            let _ = tokio::task::spawn_blocking(move || engine.restore_on_exit(&*inventory)).await;
        }
        self.lock
    }
}
