//! The QoS engine's runner: every tick (1 s by default, right after a fresh
//! metrics tick) it reads the inventory, the latest metrics and the published
//! policy, plans with the engine, and applies the plan (or, in dry-run mode,
//! only shows it), on a thread and runtime of its own (never the thread that
//! serves kubelet). It keeps the last tick for the admin API (`GetPlan`) and
//! the Prometheus gauges, and puts back what it changed on request
//! ([`restore`]). The binary only composes it: the ticks come from a
//! [`Ticks`] source (the metrics collector), the pods from an
//! [`InventorySource`], the policy from [`crate::source::PolicyRx`].
//!
//! * `mod.rs`: the settings, [`Shared`] and the async loop, which only waits
//!   (for a fresh metrics tick, a new policy, shutdown) and hands each tick to
//! * `step`: one tick as a synchronous function (observe, plan, apply, log),
//! * `observe`: what a tick reads of the node, and the one [`NodeState`]
//!   assembly (the tick's and [`restore`]'s),
//! * `view`: the last tick as `GetPlan` and Prometheus show it.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::engine::{Engine, Env, NodeState, Policy, TickResult};
use crate::execute::{Executor, WriteState};
use crate::policy::CpuSuppressPolicy;
use crate::reconcile::Pod;
use qoslet_cgroups::resctrl::Resctrl;
use qoslet_cgroups::{CgroupPath, Cgroups, KnobKind};
use qoslet_metrics::collect::Tick;
use qoslet_metrics::metric::sample;
use qoslet_metrics::Metric;
use qoslet_proto::admin;
use qoslet_state::inventory::{Inventory, InventorySource};
use tokio::sync::watch;
use tracing::{debug, error, info, warn};

pub use qoslet_metrics::collect::Ticks;

mod observe;
mod step;
#[cfg(test)]
mod tests;
mod view;

pub use observe::{restore, restore_preview};
use step::{Input, Step};
use view::Last;

/// kubelet's system and kube reserved CPU, in cores: the config file's
/// `qosEngine.reservedCpus` when it sets one, else what the cluster side
/// reads off this node's Node (capacity − allocatable), else none. Clones
/// share the cluster's value.
#[derive(Debug, Clone)]
pub struct Reserved {
    file: Option<f64>,
    /// f64 bits; NaN: the cluster has said nothing.
    cluster: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl Default for Reserved {
    fn default() -> Self {
        Self::from_file(None)
    }
}

impl Reserved {
    pub fn from_file(file: Option<f64>) -> Self {
        Self {
            file,
            cluster: std::sync::Arc::new(std::sync::atomic::AtomicU64::new(f64::NAN.to_bits())),
        }
    }

    /// What the Node says (`None`: nothing, or no longer).
    pub fn set_cluster(&self, cores: Option<f64>) {
        let v = cores
            .filter(|c| c.is_finite() && *c >= 0.0)
            .unwrap_or(f64::NAN);
        self.cluster
            .store(v.to_bits(), std::sync::atomic::Ordering::Relaxed);
    }

    /// The reserved cores in force.
    pub fn cores(&self) -> f64 {
        self.file.unwrap_or_else(|| {
            let c = f64::from_bits(self.cluster.load(std::sync::atomic::Ordering::Relaxed));
            if c.is_nan() {
                0.0
            } else {
                c
            }
        })
    }
}

/// Settings from flags and the config file.
#[derive(Debug, Clone)]
pub struct Settings {
    pub interval: Duration,
    pub dry_run: bool,
    /// `None`: found at run time (`kubepods/besteffort` or the systemd slice).
    pub be_parent: Option<CgroupPath>,
    /// kubelet's reserved CPU (the file's `reservedCpus`, or the cluster's Node).
    pub reserved: Reserved,
    /// Re-read each owned file once every this many ticks.
    pub verify_every: u64,
    pub sys_root: PathBuf,
    /// Whose class labels and scheduler annotations are taken as they are.
    pub trust: qoslet_hooks::Trust,
    /// Where kubelet puts pods (`kubeletCgroupRoot`).
    pub pod_root: qoslet_cgroups::PodRoot,
    /// procfs (the group identity sysctl).
    pub proc_root: PathBuf,
    /// On shutdown, put back what the engine changed ([`restore`]).
    pub restore_on_exit: bool,
    /// kubelet's CPU manager policy: `Some(true)` static, `Some(false)` none,
    /// `None`: read from kubelet's `cpu_manager_state` file at this path.
    pub cpu_manager: CpuManager,
}

/// kubelet's CPU manager policy, as configured or found, with kubelet's state
/// file (`<kubeletRootDir>/cpu_manager_state`).
#[derive(Debug, Clone, PartialEq)]
pub enum CpuManager {
    Static(PathBuf),
    None,
    /// `policyName` read from the state file.
    Auto(PathBuf),
}

/// What kubelet's CPU manager state says now.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CpuManagerState {
    pub is_static: bool,
    /// `defaultCpuSet`: the shared pool (the other CPUs are pods' exclusive ones).
    pub shared_pool: Option<BTreeSet<u32>>,
}

impl CpuManager {
    /// Reads kubelet's state (again whenever the pods change: kubelet may have
    /// restarted with another policy, and its pool changes as Guaranteed pods
    /// come and go).
    pub fn read(&self) -> CpuManagerState {
        #[derive(serde::Deserialize)]
        struct File {
            #[serde(rename = "policyName", default)]
            policy_name: String,
            #[serde(rename = "defaultCpuSet", default)]
            default_cpu_set: String,
        }
        let file = |path: &Path| {
            std::fs::read(path)
                .ok()
                .filter(|b| b.len() < 1 << 20)
                .and_then(|b| serde_json::from_slice::<File>(&b).ok())
        };
        let pool =
            |f: &File| crate::cpuset::parse_cpus(&f.default_cpu_set).filter(|c| !c.is_empty());
        match self {
            CpuManager::None => CpuManagerState::default(),
            CpuManager::Static(path) => CpuManagerState {
                is_static: true,
                shared_pool: file(path).as_ref().and_then(pool),
            },
            CpuManager::Auto(path) => match file(path) {
                Some(f) if f.policy_name == "static" => CpuManagerState {
                    is_static: true,
                    shared_pool: pool(&f),
                },
                _ => CpuManagerState::default(),
            },
        }
    }

    pub fn is_static(&self) -> bool {
        self.read().is_static
    }
}

/// What the loop shares with the admin API and the Prometheus endpoint.
pub struct Shared {
    cgroups: Cgroups,
    dry_run: bool,
    last: Mutex<Option<Arc<Last>>>,
    policy_error: Mutex<String>,
    /// NodeSLO fields of the policy in force that qoslet does not act on.
    not_implemented: Mutex<Vec<String>>,
    /// What the engine left for [`Shared::restore_on_exit`].
    on_exit: Mutex<Option<(Settings, Policy, Env)>>,
    ticks: AtomicU64,
    writes: AtomicU64,
    drift: AtomicU64,
    errors: AtomicU64,
    /// Writes skipped because their cgroup was gone (its pod or container ended).
    gone: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Shared {
    pub fn new(cgroups: Cgroups, dry_run: bool) -> Arc<Self> {
        Arc::new(Self {
            cgroups,
            dry_run,
            last: Mutex::new(None),
            policy_error: Mutex::new(String::new()),
            not_implemented: Mutex::new(Vec::new()),
            on_exit: Mutex::new(None),
            ticks: AtomicU64::new(0),
            writes: AtomicU64::new(0),
            drift: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            gone: AtomicU64::new(0),
        })
    }

    /// Starts the loop.
    #[allow(clippy::too_many_arguments)]
    pub fn start(
        self: &Arc<Self>,
        s: Settings,
        policy_rx: crate::source::PolicyRx,
        env: Env,
        rdt: Option<Resctrl>,
        metrics: Arc<dyn Ticks>,
        inventory: Arc<dyn InventorySource>,
        shutdown: watch::Receiver<bool>,
    ) -> tokio::task::JoinHandle<()> {
        // the engine's own thread and runtime: its cgroup and sysfs I/O, the config
        // reload and the planning never run on the thread that serves kubelet
        let me = self.clone();
        let (done, finished) = tokio::sync::oneshot::channel::<()>();
        let spawned = std::thread::Builder::new()
            .name("qoslet-engine".into())
            .spawn(move || {
                match tokio::runtime::Builder::new_current_thread()
                    .enable_time()
                    .build()
                {
                    Ok(rt) => {
                        rt.block_on(me.run(s, policy_rx, env, rdt, metrics, inventory, shutdown))
                    }
                    Err(e) => error!(error = %e, "QoS engine runtime not started"),
                }
                let _ = done.send(());
            });
        if let Err(e) = spawned {
            error!(error = %e, "QoS engine thread not started");
        }
        tokio::spawn(async move {
            let _ = finished.await;
        })
    }

    #[allow(clippy::too_many_arguments)]
    async fn run(
        self: Arc<Self>,
        s: Settings,
        mut policy_rx: crate::source::PolicyRx,
        mut env: Env,
        rdt: Option<Resctrl>,
        metrics: Arc<dyn Ticks>,
        inventory: Arc<dyn InventorySource>,
        mut shutdown: watch::Receiver<bool>,
    ) {
        info!(interval = ?s.interval, dry_run = s.dry_run, "QoS engine on");
        let mut policy = self.take_policy(&mut policy_rx, &mut env);
        let mut step = Step::new(s.verify_every);
        let mut ticker = tokio::time::interval(s.interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        let mut last_ts = 0u32;
        loop {
            tokio::select! {
                _ = ticker.tick() => {}
                _ = shutdown.changed() => break,
            }
            // fresh metrics: wait (at most one interval) for a tick newer than the last
            // one used; the wake-up is asked for before looking, so a tick published
            // in between is not missed
            let next = metrics.ticked();
            if metrics.latest().is_none_or(|t| t.ts == last_ts) {
                tokio::select! {
                    _ = tokio::time::timeout(s.interval, next) => {}
                    _ = shutdown.changed() => break,
                }
            }
            // the policy source's latest (the hooks follow the same channel)
            if policy_rx.has_changed().unwrap_or(false) {
                policy = self.take_policy(&mut policy_rx, &mut env);
            }
            let Some(t) = metrics.latest() else {
                debug!("QoS engine: no metrics yet");
                continue;
            };
            if t.ts == last_ts {
                debug!("QoS engine: no fresh metrics this tick; skipped");
                continue;
            }
            last_ts = t.ts;
            let inv = inventory.current();
            let last = step.step(&Input {
                settings: &s,
                cgroups: &self.cgroups,
                rdt: rdt.as_ref(),
                tick: &t,
                inventory: &inv,
                policy: &policy,
                env: &env,
            });
            self.record(last);
        }
        if s.restore_on_exit && !s.dry_run {
            // done by the composition once the proxy has drained (calls still in
            // flight may start pods and run hooks until then)
            *lock(&self.on_exit) = Some((s, policy, env));
        }
        info!("QoS engine stopped");
    }

    /// The policy just published: the engine's view of it, its devices into
    /// `env`, its error and unimplemented fields kept for `GetPlan`.
    fn take_policy(&self, rx: &mut crate::source::PolicyRx, env: &mut Env) -> Policy {
        let p = rx.borrow_and_update().clone();
        env.devices = p.devices.clone();
        *lock(&self.policy_error) = p.error.clone().unwrap_or_default();
        self.set_not_implemented(&p.policy.not_implemented);
        p.policy.engine()
    }

    /// Counts a tick and keeps it for the admin API.
    fn record(&self, l: Last) {
        self.ticks.fetch_add(1, Ordering::Relaxed);
        self.writes
            .fetch_add(u64::from(l.counts.0), Ordering::Relaxed);
        self.drift
            .fetch_add(l.drift.len() as u64, Ordering::Relaxed);
        self.errors
            .fetch_add(l.errors.len() as u64, Ordering::Relaxed);
        self.gone.fetch_add(u64::from(l.gone), Ordering::Relaxed);
        *lock(&self.last) = Some(Arc::new(l));
    }

    /// `qosEngine.restoreOnExit`: after the engine stopped and the proxy drained,
    /// puts back what qoslet changed for the pods the store holds now.
    pub fn restore_on_exit(&self, inv: &dyn InventorySource) {
        let Some((s, policy, env)) = lock(&self.on_exit).take() else {
            return;
        };
        let r = restore(&self.cgroups, &s, &inv.current(), &policy, &env);
        info!(
            written = r.written,
            unchanged = r.unchanged,
            errors = r.errors.len(),
            "restoreOnExit: the runtime's values and the kernel's defaults put back"
        );
        for e in &r.errors {
            warn!(error = %e, "restore");
        }
    }

    /// Records (and logs, once per field) the NodeSLO fields qoslet does not act on.
    pub fn set_not_implemented(&self, fields: &[String]) {
        let mut cur = lock(&self.not_implemented);
        for f in fields.iter().filter(|f| !cur.contains(f)) {
            info!(field = %f, "NodeSLO field not implemented by qoslet (kept aside; see qoslet plan)");
        }
        *cur = fields.to_vec();
    }
}
