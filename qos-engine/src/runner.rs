//! The QoS engine's runner: every tick (1 s by default, right after a fresh
//! metrics tick) it reads the inventory, the latest metrics and the published
//! policy, plans with the engine, and applies the plan (or, in dry-run mode,
//! only shows it), on a thread and runtime of its own (never the thread that
//! serves kubelet). It keeps the last tick for the admin API (`GetPlan`) and
//! the Prometheus gauges, and puts back what it changed on request
//! ([`restore`]). The binary only composes it: the ticks come from a
//! [`Ticks`] source (the metrics collector), the pods from an
//! [`InventorySource`], the policy from [`crate::source::PolicyRx`].

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

/// Settings from flags and the config file.
#[derive(Debug, Clone)]
pub struct Settings {
    pub interval: Duration,
    pub dry_run: bool,
    /// `None`: found at run time (`kubepods/besteffort` or the systemd slice).
    pub be_parent: Option<CgroupPath>,
    pub reserved_cores: f64,
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

/// One tick as the admin API shows it.
struct Last {
    seq: u64,
    ts: u32,
    state: NodeState,
    result: TickResult,
    /// Per write, in plan order.
    states: Vec<WriteState>,
    drift: Vec<String>,
    errors: Vec<String>,
    counts: (u32, u32, u32),
    took: Duration,
    policy: &'static str,
    resctrl_moved: u32,
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

/// Ticks a node or system CPU figure the collector could not measure is
/// replaced by the last measured one.
const STALE_TICKS: u32 = 5;

/// A figure and the ticks since it was measured.
type Aged = (f64, u32);

/// The CPUs of each NUMA node, else all online CPUs as one node, else
/// `0..capacity` (sysfs as `qoslet_cgroups::topology` reads it).
fn numa(sys_root: &Path, capacity: f64) -> Vec<Vec<u32>> {
    use qoslet_cgroups::topology;
    let nodes = topology::numa_nodes(sys_root);
    if !nodes.is_empty() {
        return nodes
            .into_values()
            .map(|c| c.into_iter().collect())
            .collect();
    }
    if let Some(c) = topology::online_cpus(sys_root) {
        return vec![c.into_iter().collect()];
    }
    vec![(0..capacity.max(1.0) as u32).collect()]
}

/// Each CPU's core and socket; a CPU whose core cannot be read is left out
/// (it then counts as its own core on socket 0).
fn places(sys_root: &Path, numa: &[Vec<u32>]) -> BTreeMap<u32, crate::cpuset::CpuPlace> {
    use qoslet_cgroups::topology;
    numa.iter()
        .flatten()
        .filter_map(|&c| {
            Some((
                c,
                crate::cpuset::CpuPlace {
                    core: topology::core_of(sys_root, c)?,
                    socket: topology::socket_of(sys_root, c).unwrap_or(0),
                },
            ))
        })
        .collect()
}

/// The NUMA layout and the CPUs' places, read again whenever the online CPUs
/// change (CPU hotplug): one small sysfs read per tick.
#[derive(Default)]
struct Topology {
    seen: Option<Option<String>>,
    numa: Vec<Vec<u32>>,
    places: BTreeMap<u32, crate::cpuset::CpuPlace>,
}

impl Topology {
    fn refresh(&mut self, sys_root: &Path, capacity: f64) -> &Self {
        let online = qoslet_cgroups::topology::online_text(sys_root);
        if self.seen.as_ref() != Some(&online) {
            self.numa = numa(sys_root, capacity);
            self.places = places(sys_root, &self.numa);
            self.seen = Some(online);
        }
        self
    }
}

/// The besteffort parent: as configured, else the first of the cgroupfs and
/// systemd drivers' names that exists.
/// The drivers to look under, the pods' own first (`systemd`: what the
/// store's pods use, if known).
fn drivers(systemd: Option<bool>) -> [bool; 2] {
    match systemd {
        Some(true) => [true, false],
        _ => [false, true],
    }
}

fn find_be_parent(
    cgroups: &Cgroups,
    configured: Option<&CgroupPath>,
    root: &qoslet_cgroups::PodRoot,
    systemd: Option<bool>,
) -> Option<CgroupPath> {
    if let Some(c) = configured {
        return Some(c.clone());
    }
    drivers(systemd)
        .into_iter()
        .map(|systemd| root.qos_dirs(systemd)[2].clone())
        .find(|cg| cgroups.read(cg, "cpu", "cgroup.procs").is_ok())
}

/// The kube QoS dirs of whichever cgroup driver this node's kubelet uses
/// (empty until kubepods exists).
fn find_qos_dirs(
    cgroups: &Cgroups,
    root: &qoslet_cgroups::PodRoot,
    systemd: Option<bool>,
) -> Vec<(qoslet_hooks::KubeQos, CgroupPath)> {
    use qoslet_hooks::KubeQos;
    let exists = |cg: &CgroupPath| cgroups.read(cg, "cpu", "cgroup.procs").is_ok();
    drivers(systemd)
        .into_iter()
        .map(|systemd| root.qos_dirs(systemd))
        .find(|d| exists(&d[0]))
        .map(|[g, b, e]| {
            [
                (KubeQos::Guaranteed, g),
                (KubeQos::Burstable, b),
                (KubeQos::BestEffort, e),
            ]
            .into_iter()
            .filter(|(_, cg)| exists(cg))
            .collect()
        })
        .unwrap_or_default()
}

/// The store's ready pods and running containers as the engine sees them,
/// rebuilt only when the store changes (paths validated, classes decided once).
struct Skeleton {
    generation: u64,
    pods: Vec<Pod>,
    /// Per pod: its metrics entity and its containers' (same order as `pods`).
    entities: Vec<(String, Vec<String>)>,
}

impl Skeleton {
    fn build(inv: &qoslet_state::Inventory) -> Self {
        let pods: Vec<Pod> = inv.pods.iter().filter_map(Pod::from_entry).collect();
        let entities = pods
            .iter()
            .map(|p| {
                (
                    format!("pod/{}", p.id),
                    p.containers
                        .iter()
                        .map(|c| format!("container/{}", c.entry.id))
                        .collect(),
                )
            })
            .collect();
        Self {
            generation: inv.generation,
            pods,
            entities,
        }
    }

    /// Keeps the BE pods' sandbox cgroups that exist (the pause container's:
    /// the cpuset suppress writes them with the containers; other pods' are not
    /// read).
    fn find_sandboxes(&mut self, cgroups: &Cgroups) {
        for p in &mut self.pods {
            if p.class != qoslet_hooks::QosClass::Be {
                p.sandbox = None;
            } else if let Some(sb) = &p.sandbox {
                if cgroups.read(sb, "cpuset", "cgroup.procs").is_err() {
                    p.sandbox = None;
                }
            }
        }
    }

    /// The pods with this tick's usage.
    fn with_usage(&self, t: &Tick) -> Vec<Pod> {
        let readings: HashMap<&str, &qoslet_metrics::collect::Reading> = t
            .readings
            .iter()
            .map(|r| (r.target.entity.as_str(), r))
            .collect();
        let usage = |entity: &str, m: Metric| {
            readings
                .get(entity)
                .and_then(|r| sample(&r.samples, m))
                .unwrap_or(0.0)
        };
        let mut pods = self.pods.clone();
        for (p, (pe, ces)) in pods.iter_mut().zip(&self.entities) {
            p.cpu_cores = usage(pe, Metric::CpuUsage);
            for (c, ce) in p.containers.iter_mut().zip(ces) {
                c.cpu_cores = usage(ce, Metric::CpuUsage);
                c.throttled_ratio = usage(ce, Metric::CpuThrottledRatio);
            }
        }
        pods
    }
}

/// Puts back every file the engine (and the hooks' own cgroup writes) may
/// have changed, for the pods in `inv`: the besteffort parent's quota and
/// cpuset, scaled LS quotas, bursts, group identity, SCHED_IDLE, memory QoS
/// (see [`crate::engine::restore_plan`]). Cgroups that are gone
/// are skipped. Runs the kernel-ordered executor once.
pub fn restore(
    cgroups: &Cgroups,
    s: &Settings,
    inv: &Inventory,
    policy: &Policy,
    env: &Env,
) -> crate::execute::Report {
    Executor::new(1).execute(&restore_plan(cgroups, s, inv, policy, env), cgroups)
}

/// [`restore`]'s writes and what each would do (dry run).
pub fn restore_preview(
    cgroups: &Cgroups,
    s: &Settings,
    inv: &Inventory,
    policy: &Policy,
    env: &Env,
) -> Vec<(crate::plan::Write, crate::execute::Preview)> {
    let plan = restore_plan(cgroups, s, inv, policy, env);
    let previews = Executor::preview(&plan, cgroups);
    plan.writes().iter().cloned().zip(previews).collect()
}

fn restore_plan(
    cgroups: &Cgroups,
    s: &Settings,
    inv: &Inventory,
    policy: &Policy,
    env: &Env,
) -> crate::plan::Plan {
    let mut k = Skeleton::build(inv);
    k.find_sandboxes(cgroups);
    let systemd = k
        .pods
        .first()
        .map(|p| p.cgroup.as_str().contains(".slice/"));
    let be_parent = find_be_parent(cgroups, s.be_parent.as_ref(), &s.pod_root, systemd);
    let (be_quota_us, period_us) = be_parent
        .as_ref()
        .and_then(|bp| cgroups.read_cpu_quota(bp))
        .unwrap_or((None, 100_000));
    let capacity = std::thread::available_parallelism()
        .map(|n| n.get() as f64)
        .unwrap_or(1.0);
    let be_parent = be_parent.unwrap_or_else(CgroupPath::root);
    let v1 = !cgroups.host().is_v2();
    let mut found = crate::engine::Found::default();
    for p in &k.pods {
        for cg in std::iter::once(&p.cgroup).chain(p.containers.iter().map(|c| &c.entry.cgroup)) {
            if let Some(q) = cgroups.read_cpu_quota(cg) {
                found.quotas.insert(cg.clone(), q);
            }
        }
    }
    if !be_parent.as_str().is_empty() {
        for pod in cgroups.children(&be_parent, "cpuset") {
            found.be_subtree.extend(cgroups.children(&pod, "cpuset"));
            found.be_subtree.push(pod);
        }
    }
    let state = NodeState {
        capacity_cores: capacity,
        node_usage_cores: 0.0,
        system_usage_cores: 0.0,
        pods_usage_cores: None,
        be_usage_cores: None,
        usage_known: true,
        reserved_cores: s.reserved_cores,
        pods: k.pods,
        cpuset_ceiling: be_parent
            .parent()
            .filter(|_| v1)
            .and_then(|p| cgroups.read_cpuset(&p)),
        be_parent,
        be_quota_us,
        period_us,
        numa: numa(&s.sys_root, capacity),
        places: BTreeMap::new(),
        be_cpuset: None,
        qos_dirs: find_qos_dirs(cgroups, &s.pod_root, systemd),
        static_cpu_manager: s.cpu_manager.is_static(),
        shared_pool: s.cpu_manager.read().shared_pool,
        ancestors: BTreeMap::new(),
        pods_generation: None,
    };
    let plan = crate::engine::restore_plan(&state, policy, env, &found);
    // pods removed since the store last saw them: nothing to put back
    let mut live = crate::plan::Plan::new();
    for w in plan.writes() {
        if cgroups.read(&w.cgroup, "cpu", "cgroup.procs").is_ok() {
            live.add(w.clone());
        }
    }
    live
}

/// The besteffort parent as this tick read it.
struct BeParent {
    path: CgroupPath,
    /// Quota (`None`: unlimited) and period; `None` when unreadable.
    quota: Option<(Option<u64>, u64)>,
    cpuset: Option<BTreeSet<u32>>,
}

/// What the tick reads: the pods with their usage, the node's figures from the
/// latest metrics, and the besteffort parent.
fn node_state(
    t: &Tick,
    pods: Vec<Pod>,
    generation: u64,
    be: BeParent,
    topo: &Topology,
    reserved: f64,
    qos_dirs: Vec<(qoslet_hooks::KubeQos, CgroupPath)>,
) -> NodeState {
    let g = |s: &[(Metric, f64)], m| sample(s, m).unwrap_or(0.0);
    let (be_quota_us, period_us) = be.quota.unwrap_or((None, 100_000));
    NodeState {
        capacity_cores: g(&t.node, Metric::CpuCapacity),
        node_usage_cores: g(&t.node, Metric::CpuUsage),
        system_usage_cores: g(&t.system, Metric::CpuUsage),
        pods_usage_cores: sample(&t.pods_root, Metric::CpuUsage),
        be_usage_cores: sample(&t.be, Metric::CpuUsage),
        usage_known: true,
        reserved_cores: reserved,
        pods,
        be_parent: be.path,
        be_quota_us,
        period_us,
        numa: topo.numa.clone(),
        places: topo.places.clone(),
        be_cpuset: be.cpuset,
        qos_dirs,
        cpuset_ceiling: None,
        static_cpu_manager: false,
        shared_pool: None,
        ancestors: BTreeMap::new(),
        pods_generation: Some(generation),
    }
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
        let mut policy = {
            let p = policy_rx.borrow_and_update().clone();
            env.devices = p.devices.clone();
            *lock(&self.policy_error) = p.error.clone().unwrap_or_default();
            self.set_not_implemented(&p.policy.not_implemented);
            p.policy.engine()
        };
        let mut engine = Engine::new(s.verify_every);
        let mut ticker = tokio::time::interval(s.interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        let mut last_ts = 0u32;
        let mut topology = Topology::default();
        let mut be_parent: Option<CgroupPath> = None;
        let mut qos_dirs: Vec<(qoslet_hooks::KubeQos, CgroupPath)> = Vec::new();
        let mut logged: HashSet<String> = HashSet::new();
        // the last node and system CPU figures the collector gave, and their age in ticks
        let (mut last_node, mut last_system): (Option<Aged>, Option<Aged>) = (None, None);
        let mut level = crate::suppress::Level::None;
        let mut seq = 0u64;
        let mut skeleton: Option<Skeleton> = None;
        let mut seeded: HashSet<String> = HashSet::new();
        let mut cpu_manager: Option<CpuManagerState> = None;
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
                let p = policy_rx.borrow_and_update().clone();
                policy = p.policy.engine();
                env.devices = p.devices.clone();
                *lock(&self.policy_error) = p.error.clone().unwrap_or_default();
                self.set_not_implemented(&p.policy.not_implemented);
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
            let t0 = Instant::now();
            let cg = &self.cgroups;
            let inv = inventory.current();
            let rebuilt = skeleton.as_ref().map(|k| k.generation) != Some(inv.generation);
            if rebuilt {
                let mut k = Skeleton::build(&inv);
                k.find_sandboxes(cg);
                // a container whose cpuset kubelet changed (its update wrote the file,
                // e.g. the static CPU manager's new shared pool) is written again now,
                // not at its next drift check
                if let Some(old) = &skeleton {
                    let before: HashMap<&str, &str> = old
                        .pods
                        .iter()
                        .flat_map(|p| &p.containers)
                        .map(|c| (c.entry.id.as_str(), c.entry.cpuset_cpus.as_str()))
                        .collect();
                    for c in k.pods.iter().flat_map(|p| &p.containers) {
                        if before
                            .get(c.entry.id.as_str())
                            .is_some_and(|b| *b != c.entry.cpuset_cpus)
                        {
                            engine.forget(&c.entry.cgroup, KnobKind::CpusetCpus);
                        }
                    }
                }
                skeleton = Some(k);
            }
            // the cgroup driver kubelet's pods use (a node that switched drivers may
            // keep the other's empty kubepods)
            let systemd = skeleton.as_ref().and_then(|k| {
                k.pods
                    .first()
                    .map(|p| p.cgroup.as_str().contains(".slice/"))
            });
            if be_parent.is_none() || (rebuilt && s.be_parent.is_none()) {
                be_parent = find_be_parent(cg, s.be_parent.as_ref(), &s.pod_root, systemd);
            }
            if qos_dirs.len() < 3 || rebuilt {
                qos_dirs = find_qos_dirs(cg, &s.pod_root, systemd);
            }
            // Anolis kernels apply group identity only with this sysctl on
            // (koordlet turns it on whenever a class's cpuQOS is)
            if env.features.bvt
                && !s.dry_run
                && qoslet_hooks::decide::group_identity_on(&policy.qos)
            {
                let sysctl = qoslet_cgroups::sysctl::Sysctl::new(&s.proc_root);
                match sysctl.enable_group_identity() {
                    Ok(Some(qoslet_cgroups::fs::Outcome::Written)) => {
                        info!("group identity enabled (kernel.sched_group_identity_enabled)")
                    }
                    Ok(_) => {}
                    Err(e) => {
                        if logged.insert(e.to_string()) {
                            warn!(error = %e, "group identity sysctl not set");
                        }
                    }
                }
            }
            let capacity = sample(&t.node, Metric::CpuCapacity).unwrap_or(1.0);
            let topo = topology.refresh(&s.sys_root, capacity);
            let mut pol = policy.clone();
            let be = match &be_parent {
                Some(bp) => BeParent {
                    path: bp.clone(),
                    quota: cg.read_cpu_quota(bp),
                    cpuset: cg.read_cpuset(bp),
                },
                None => {
                    if pol.threshold.enable && logged.insert("no-be-parent".into()) {
                        warn!("no besteffort parent cgroup found (set qosEngine.beParent); CPU suppress is off until it appears");
                    }
                    pol.threshold.enable = false;
                    BeParent {
                        path: CgroupPath::root(),
                        quota: None,
                        cpuset: None,
                    }
                }
            };
            let pods = skeleton
                .as_ref()
                .map(|k| k.with_usage(&t))
                .unwrap_or_default();
            let generation = skeleton.as_ref().map(|k| k.generation).unwrap_or(0);
            let state = node_state(
                &t,
                pods,
                generation,
                be,
                topo,
                s.reserved_cores,
                qos_dirs.clone(),
            );
            let mut state = state;
            // a figure the collector could not measure this tick (a counter
            // reset) is the last measured one for a few ticks; before any, or
            // older, it is unknown and suppress leaves the BE quota as it is:
            // never read as 0 (BE would get the system's share) nor as the
            // whole node (BE would be crushed after every restart)
            let fresh = |v: Option<f64>, last: &mut Option<(f64, u32)>| match v {
                Some(v) => {
                    *last = Some((v, 0));
                    Some(v)
                }
                None => {
                    let (v, age) = last.as_mut()?;
                    *age += 1;
                    (*age <= STALE_TICKS).then_some(*v)
                }
            };
            let node = fresh(sample(&t.node, Metric::CpuUsage), &mut last_node);
            let system = fresh(sample(&t.system, Metric::CpuUsage), &mut last_system);
            state.usage_known = node.is_some() && system.is_some();
            state.node_usage_cores = node.unwrap_or(0.0);
            state.system_usage_cores = system.unwrap_or(0.0);
            if !cg.host().is_v2() {
                state.cpuset_ceiling = state.be_parent.parent().and_then(|p| cg.read_cpuset(&p));
            }
            if rebuilt || cpu_manager.is_none() {
                let now = s.cpu_manager.read();
                if cpu_manager.as_ref().map(|m| m.is_static) != Some(now.is_static) {
                    info!(
                        static_policy = now.is_static,
                        "kubelet's CPU manager policy"
                    );
                }
                cpu_manager = Some(now);
            }
            let m = cpu_manager.clone().unwrap_or_default();
            state.static_cpu_manager = m.is_static;
            state.shared_pool = m.shared_pool;
            if state.static_cpu_manager {
                // the BE cpuset lives on BE containers only: the smallest of a few of
                // theirs (one kubelet just created still has the whole shared pool)
                state.be_cpuset = state
                    .pods
                    .iter()
                    .filter(|p| p.class == qoslet_hooks::QosClass::Be)
                    .flat_map(|p| &p.containers)
                    .filter_map(|c| cg.read_cpuset(&c.entry.cgroup))
                    .take(4)
                    .min_by_key(|c| c.len());
            }
            if env.features.memory_qos {
                // the ancestors' protection as another writer (kubelet) may have left it
                for a in crate::engine::protected_ancestors(&state) {
                    for (name, file) in [
                        (KnobKind::MemoryMin, qoslet_cgroups::files::MEMORY_MIN),
                        (KnobKind::MemoryLow, qoslet_cgroups::files::MEMORY_LOW),
                    ] {
                        // "max": full protection someone asked for (left alone)
                        if let Some(v) = cg.read_memory_protection(&a, file) {
                            state.ancestors.insert((a.clone(), name), v);
                        }
                    }
                }
            }
            if rebuilt {
                // burst scaling's state is the files': a container first seen (after a
                // restart, say) starts from the quota its cgroup holds
                let live: HashSet<&str> = state
                    .pods
                    .iter()
                    .flat_map(|p| p.containers.iter().map(|c| c.entry.id.as_str()))
                    .collect();
                seeded.retain(|id| live.contains(id.as_str()));
                for c in state.pods.iter().flat_map(|p| &p.containers) {
                    if c.entry.cpu_quota > 0 && seeded.insert(c.entry.id.clone()) {
                        let q = cg.read_cpu_quota(&c.entry.cgroup).and_then(|(q, period)| {
                            q.map(|q| q * c.entry.cpu_period as u64 / period.max(1))
                        });
                        engine.seed_quota(c, q);
                    }
                }
            }
            let result = engine.plan(&state, &pol, &env);
            let (states, report, moved) = if s.dry_run {
                let states = Executor::preview(&result.plan, cg)
                    .into_iter()
                    .map(|p| p.state())
                    .collect();
                (states, None, 0)
            } else {
                let mut r = engine.execute(&result.plan, cg);
                let mut moved = 0;
                if let Some(rdt) = &rdt {
                    let groups = crate::resctrl::desired(&state.pods, &pol.qos, rdt);
                    if !groups.is_empty() {
                        let sr = crate::resctrl::sync(&groups, rdt, cg);
                        moved = sr.moved;
                        for e in sr.errors {
                            if logged.insert(e.clone()) {
                                warn!(error = %e, "resctrl reconcile");
                            }
                        }
                    }
                }
                (std::mem::take(&mut r.states), Some(r), moved)
            };
            if result.level != level {
                info!(
                    from = level.as_str(),
                    to = result.level.as_str(),
                    allowance_cores = format!("{:.2}", result.allowance_cores),
                    "BE CPU suppress level changed"
                );
                level = result.level;
            }
            for w in &result.warnings {
                if logged.insert(w.clone()) {
                    warn!("{w}");
                }
            }
            let (drift, errors, counts) = match report {
                Some(r) => {
                    for d in &r.drift {
                        warn!(drift = %d, "cgroup drift put back");
                    }
                    for e in &r.errors {
                        if logged.insert(e.clone()) {
                            warn!(error = %e, "QoS engine write failed (retried every tick; logged once)");
                        }
                    }
                    self.writes.fetch_add(r.written as u64, Ordering::Relaxed);
                    self.drift
                        .fetch_add(r.drift.len() as u64, Ordering::Relaxed);
                    self.errors
                        .fetch_add(r.errors.len() as u64, Ordering::Relaxed);
                    self.gone.fetch_add(r.gone as u64, Ordering::Relaxed);
                    (
                        r.drift,
                        r.errors,
                        (r.written as u32, r.unchanged as u32, r.skipped as u32),
                    )
                }
                None => (Vec::new(), Vec::new(), (0, 0, 0)),
            };
            if logged.len() > 10_000 {
                logged.clear();
            }
            seq += 1;
            self.ticks.fetch_add(1, Ordering::Relaxed);
            let took = t0.elapsed();
            debug!(writes = result.plan.len(), written = counts.0, took = ?took, "QoS engine tick");
            let policy_name = match (pol.threshold.enable, pol.threshold.cpu_suppress_policy) {
                (false, _) => "disabled",
                (true, CpuSuppressPolicy::CfsQuota) => "cfsQuota",
                (true, CpuSuppressPolicy::Cpuset) => "cpuset",
            };
            *lock(&self.last) = Some(Arc::new(Last {
                seq,
                ts: t.ts,
                state,
                result,
                states,
                drift,
                errors,
                counts,
                took,
                policy: policy_name,
                resctrl_moved: moved as u32,
            }));
        }
        if s.restore_on_exit && !s.dry_run {
            // done by the composition once the proxy has drained (calls still in
            // flight may start pods and run hooks until then)
            *lock(&self.on_exit) = Some((s, policy, env));
        }
        info!("QoS engine stopped");
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

    /// The latest tick for the admin API.
    pub fn plan(&self, req: &admin::GetPlanRequest) -> admin::GetPlanResponse {
        let Some(l) = lock(&self.last).clone() else {
            return admin::GetPlanResponse {
                dry_run: self.dry_run,
                policy_error: lock(&self.policy_error).clone(),
                not_implemented: lock(&self.not_implemented).clone(),
                ..Default::default()
            };
        };
        let r = &l.result;
        let writes = r
            .plan
            .writes()
            .iter()
            .zip(&l.states)
            .filter(|(w, _)| req.plugin.is_empty() || w.plugin.as_str() == req.plugin)
            .filter(|(w, _)| req.cgroup.is_empty() || w.cgroup.as_str().contains(&req.cgroup))
            .filter(|(_, st)| !req.changes_only || st.changes())
            .map(|(w, st)| admin::PlanWrite {
                cgroup: w.cgroup.as_str().to_string(),
                setting: w.knob.name().into(),
                files: self
                    .cgroups
                    .plan(&w.knob)
                    .map(|fs| {
                        fs.into_iter()
                            .map(|f| admin::PlanFile {
                                path: self
                                    .cgroups
                                    .path_of(&w.cgroup, &f)
                                    .map(|p| p.display().to_string())
                                    .unwrap_or_else(|e| format!("({e})")),
                                value: f.value,
                            })
                            .collect()
                    })
                    .unwrap_or_default(),
                plugin: w.plugin.as_str().into(),
                rule: w.rule.clone(),
                state: st.as_str().into_owned(),
            })
            .collect();
        admin::GetPlanResponse {
            tick: l.seq,
            timestamp: i64::from(l.ts),
            dry_run: self.dry_run,
            suppress_policy: l.policy.into(),
            capacity_cores: l.state.capacity_cores,
            non_be_usage_cores: r.non_be_usage_cores,
            be_usage_cores: r.be_usage_cores,
            system_usage_cores: l.state.system_usage_cores,
            reserved_cores: l.state.reserved_cores,
            allowance_cores: r.allowance_cores,
            level: r.level.as_str().into(),
            share_pool: r
                .pool
                .map(|p| format!("{p:?}").to_lowercase())
                .unwrap_or_default(),
            be_parent: l.state.be_parent.as_str().into(),
            be_quota_us: l.state.be_quota_us.map(|q| q as i64).unwrap_or(-1),
            writes,
            written: l.counts.0,
            unchanged: l.counts.1,
            skipped: l.counts.2,
            drift: l.drift.clone(),
            errors: l.errors.clone(),
            warnings: r.warnings.clone(),
            tick_seconds: l.took.as_secs_f64(),
            policy_error: lock(&self.policy_error).clone(),
            resctrl_moved: l.resctrl_moved,
            not_implemented: lock(&self.not_implemented).clone(),
            // the agent adds the sources as they stand when it answers
            ..Default::default()
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

    /// The engine's Prometheus lines.
    pub fn render(&self, out: &mut String) {
        let last = lock(&self.last).clone();
        let mut o = qoslet_metrics::prom::Out::new(std::mem::take(out));
        if let Some(l) = &last {
            o.single(
                "qoslet_be_suppress_level",
                "gauge",
                "BE CPU suppress pressure: 0 none, 1 mid (BE held below what it wants), 2 high (BE at the floor).",
                f64::from(l.result.level.value()),
            );
            o.single(
                "qoslet_be_cpu_allowance_cores",
                "gauge",
                "CPU the BE pods may use now, in cores.",
                l.result.allowance_cores,
            );
            o.single(
                "qoslet_engine_tick_seconds",
                "gauge",
                "Time the QoS engine's last tick took.",
                l.took.as_secs_f64(),
            );
            o.single(
                "qoslet_engine_plan_writes",
                "gauge",
                "Settings in the QoS engine's last plan.",
                l.result.plan.len() as f64,
            );
        }
        o.single(
            "qoslet_engine_dry_run",
            "gauge",
            "1 when the QoS engine only plans and never writes.",
            f64::from(u8::from(self.dry_run)),
        );
        for (name, help, v) in [
            (
                "qoslet_engine_ticks_total",
                "QoS engine ticks.",
                &self.ticks,
            ),
            (
                "qoslet_engine_writes_total",
                "cgroup files the QoS engine changed.",
                &self.writes,
            ),
            (
                "qoslet_engine_drift_total",
                "Files someone else changed that the QoS engine put back.",
                &self.drift,
            ),
            (
                "qoslet_engine_errors_total",
                "Failed QoS engine writes.",
                &self.errors,
            ),
            (
                "qoslet_engine_gone_total",
                "QoS engine writes skipped because their cgroup was gone (its pod or container ended since the inventory).",
                &self.gone,
            ),
        ] {
            o.single(name, "counter", help, v.load(Ordering::Relaxed) as f64);
        }
        *out = o.into_text();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::ResourceThresholdStrategy;
    use crate::source::{PolicyConfig, Published};
    use qoslet_hooks::{PodClass, QosClass};
    use qoslet_state::inventory::{ContainerEntry, PodEntry};

    /// Ticks pushed by the test, as the metrics collector would.
    #[derive(Default)]
    struct FakeTicks {
        latest: Mutex<Option<Arc<Tick>>>,
        ticked: tokio::sync::Notify,
    }

    impl FakeTicks {
        fn push(&self, ts: u32, node_cores: f64) {
            *lock(&self.latest) = Some(Arc::new(Tick {
                ts,
                node: vec![(Metric::CpuCapacity, 4.0), (Metric::CpuUsage, node_cores)],
                system: vec![(Metric::CpuUsage, 0.1)],
                be: vec![(Metric::CpuUsage, 0.0)],
                ..Default::default()
            }));
            self.ticked.notify_waiters();
        }
    }

    impl Ticks for FakeTicks {
        fn latest(&self) -> Option<Arc<Tick>> {
            lock(&self.latest).clone()
        }
        fn ticked(&self) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + '_>> {
            Box::pin(self.ticked.notified())
        }
    }

    /// The synthetic node's pods as an inventory.
    struct FakeInventory(Arc<Inventory>);

    impl InventorySource for FakeInventory {
        fn current(&self) -> Arc<Inventory> {
            self.0.clone()
        }
    }

    fn inventory(pods: &[Pod]) -> Inventory {
        Inventory {
            generation: 1,
            pods: pods
                .iter()
                .map(|p| PodEntry {
                    id: p.id.clone(),
                    name: p.id.clone(),
                    namespace: "ns".into(),
                    uid: String::new(),
                    labels: Default::default(),
                    created_at: 0,
                    priority: None,
                    cgroup: p.cgroup.clone(),
                    class: Some(PodClass {
                        class: p.class,
                        by_label: true,
                        trusted: true,
                        kube: None,
                    }),
                    annotations: Default::default(),
                    limits: Default::default(),
                    containers: p
                        .containers
                        .iter()
                        .map(|c| ContainerEntry {
                            id: c.entry.id.clone(),
                            name: c.entry.name.clone(),
                            cgroup: c.entry.cgroup.clone(),
                            memory_limit: c.entry.memory_limit,
                            cpu_quota: c.entry.cpu_quota,
                            cpu_period: c.entry.cpu_period,
                            cpuset_cpus: c.entry.cpuset_cpus.clone(),
                            oom_score_adj: c.entry.oom_score_adj,
                            cpu_shares: 0,
                        })
                        .collect(),
                })
                .collect(),
        }
    }

    /// The runner's loop under paused time: it ticks once per fresh metrics tick
    /// (never on a stale one), plans from the inventory and the published policy,
    /// writes the BE quota when LS load rises, takes a reloaded policy at its next
    /// tick, and stops on shutdown.
    #[tokio::test(start_paused = true)]
    async fn the_loop_ticks_on_fresh_metrics_follows_the_policy_and_stops() {
        let d = scratch("runner");
        let shape = crate::synth::Shape {
            ls_pods: 2,
            be_pods: 2,
            containers_per_pod: 1,
            ls_limit_cores: 2.0,
            cpus: 4,
        };
        let pods = crate::synth::build(&d, &shape).unwrap();
        assert!(pods.iter().any(|p| p.class == QosClass::Be));
        let cg = Cgroups::detect(&d).unwrap();
        let shared = Shared::new(cg.clone(), false);
        let settings = Settings {
            interval: Duration::from_secs(1),
            dry_run: false,
            be_parent: Some(crate::synth::be_parent()),
            reserved_cores: 0.0,
            verify_every: 10,
            sys_root: d.join("sys"),
            trust: Default::default(),
            pod_root: Default::default(),
            proc_root: d.join("proc"),
            restore_on_exit: false,
            cpu_manager: CpuManager::None,
        };
        let mut policy = PolicyConfig {
            resource_used_threshold_with_be: ResourceThresholdStrategy {
                enable: true,
                cpu_suppress_policy: CpuSuppressPolicy::CfsQuota,
                ..Default::default()
            },
            ..Default::default()
        };
        let (ptx, prx) = watch::channel(Arc::new(Published::new(policy.clone())));
        let env = Env {
            features: cg.host().features.clone(),
            v2: false,
            devices: Default::default(),
            page_size: 4096,
            node: Default::default(),
        };
        let ticks = Arc::new(FakeTicks::default());
        let inv = Arc::new(FakeInventory(Arc::new(inventory(&pods))));
        let (stop, stopped) = watch::channel(false);
        let task =
            tokio::spawn(
                shared
                    .clone()
                    .run(settings, prx, env, None, ticks.clone(), inv, stopped),
            );
        let tick_no = |s: &Shared| lock(&s.last).as_ref().map(|l| l.seq).unwrap_or(0);
        // no metrics yet: no tick
        tokio::time::sleep(Duration::from_millis(2500)).await;
        assert_eq!(tick_no(&shared), 0);
        // a fresh tick each second: planned right after it (not at the loop's next
        // second), one engine tick each, the BE quota cut for LS load
        for ts in 1..=3 {
            ticks.push(ts, 3.5);
            tokio::time::sleep(Duration::from_millis(10)).await;
            assert_eq!(
                tick_no(&shared),
                u64::from(ts),
                "planned right after metrics tick {ts}"
            );
            tokio::time::sleep(Duration::from_millis(990)).await;
        }
        assert_eq!(tick_no(&shared), 3, "one tick per fresh metrics tick");
        let quota = crate::synth::be_quota(&cg).unwrap();
        assert!(
            quota.is_some_and(|q| q < 400_000),
            "BE capped under LS load: {quota:?}"
        );
        // the same metrics tick again: nothing planned
        tokio::time::sleep(Duration::from_millis(3000)).await;
        assert_eq!(
            tick_no(&shared),
            3,
            "a stale metrics tick is not planned again"
        );
        // a reloaded policy (suppress off) is in force at the next tick
        policy.resource_used_threshold_with_be.enable = false;
        ptx.send(Arc::new(Published::new(policy))).unwrap();
        ticks.push(4, 3.5);
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(tick_no(&shared), 4);
        assert_eq!(
            lock(&shared.last).as_ref().map(|l| l.policy),
            Some("disabled"),
            "the reloaded policy is the one planned with"
        );
        stop.send(true).unwrap();
        tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .expect("the loop stops on shutdown")
            .unwrap();
        let _ = std::fs::remove_dir_all(&d);
    }

    fn scratch(tag: &str) -> PathBuf {
        qoslet_cgroups::testing::tree::<&str, &str>(&format!("runner-{tag}"), &[])
    }

    /// Issue 15 item 12: the NUMA layout follows CPU hotplug.
    #[test]
    fn topology_is_read_again_when_cpus_go_online() {
        let d = scratch("topology");
        let node = |n: u32, cpus: &str| {
            let p = d.join(format!("devices/system/node/node{n}"));
            std::fs::create_dir_all(&p).unwrap();
            std::fs::write(p.join("cpulist"), cpus).unwrap();
        };
        std::fs::create_dir_all(d.join("devices/system/cpu")).unwrap();
        std::fs::write(d.join("devices/system/cpu/online"), "0-1\n").unwrap();
        node(0, "0-1\n");
        // hyper-thread siblings: CPUs 0 and 2 share core 0, 1 and 3 core 1, on socket 0
        for (cpu, siblings) in [(0, "0,2"), (1, "1,3"), (2, "0,2"), (3, "1,3")] {
            let p = d.join(format!("devices/system/cpu/cpu{cpu}/topology"));
            std::fs::create_dir_all(&p).unwrap();
            // core ids that mislead (arm64 clusters restart them): siblings decide
            std::fs::write(p.join("core_id"), "0\n").unwrap();
            std::fs::write(p.join("thread_siblings_list"), format!("{siblings}\n")).unwrap();
            std::fs::write(p.join("physical_package_id"), "0\n").unwrap();
        }
        let mut t = Topology::default();
        assert_eq!(t.refresh(&d, 2.0).numa, [vec![0, 1]]);
        node(1, "2-3\n");
        assert_eq!(
            t.refresh(&d, 2.0).numa,
            [vec![0, 1]],
            "no change online: no re-read"
        );
        std::fs::write(d.join("devices/system/cpu/online"), "0-3\n").unwrap();
        let t = t.refresh(&d, 4.0);
        assert_eq!(t.numa, [vec![0, 1], vec![2, 3]]);
        let cores: Vec<(u32, u32)> = t.places.iter().map(|(c, p)| (*c, p.core)).collect();
        assert_eq!(cores, [(0, 0), (1, 1), (2, 0), (3, 1)]);
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn numa_nodes_from_sys_with_fallbacks() {
        let d = scratch("numa");
        for (n, l) in [("node1", "4-7\n"), ("node0", "0-3\n")] {
            std::fs::create_dir_all(d.join("devices/system/node").join(n)).unwrap();
            std::fs::write(d.join("devices/system/node").join(n).join("cpulist"), l).unwrap();
        }
        assert_eq!(numa(&d, 8.0), vec![vec![0, 1, 2, 3], vec![4, 5, 6, 7]]);
        std::fs::remove_dir_all(d.join("devices/system/node")).unwrap();
        std::fs::create_dir_all(d.join("devices/system/cpu")).unwrap();
        std::fs::write(d.join("devices/system/cpu/online"), "0-1\n").unwrap();
        assert_eq!(numa(&d, 8.0), vec![vec![0, 1]]);
        assert_eq!(numa(&d.join("none"), 3.0), vec![vec![0, 1, 2]]);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn be_parent_and_its_quota_on_v1_and_v2() {
        let d = scratch("quota");
        for (f, c) in [
            ("v1/cpu/cgroup.procs", ""),
            ("v1/cpu/kubepods/besteffort/cgroup.procs", ""),
            ("v1/cpu/kubepods/besteffort/cpu.cfs_quota_us", "-1\n"),
            ("v1/cpu/kubepods/besteffort/cpu.cfs_period_us", "100000\n"),
            ("v2/cgroup.controllers", "cpu memory\n"),
            (
                "v2/kubepods.slice/kubepods-besteffort.slice/cgroup.procs",
                "",
            ),
            (
                "v2/kubepods.slice/kubepods-besteffort.slice/cpu.max",
                "20000 50000\n",
            ),
        ] {
            std::fs::create_dir_all(d.join(f).parent().unwrap()).unwrap();
            std::fs::write(d.join(f), c).unwrap();
        }
        let v1 = Cgroups::detect(&d.join("v1")).unwrap();
        let bp = find_be_parent(&v1, None, &qoslet_cgroups::PodRoot::default(), None).unwrap();
        assert_eq!(bp.as_str(), "kubepods/besteffort");
        assert_eq!(v1.read_cpu_quota(&bp), Some((None, 100_000)));
        let v2 = Cgroups::detect(&d.join("v2")).unwrap();
        let bp = find_be_parent(&v2, None, &qoslet_cgroups::PodRoot::default(), None).unwrap();
        assert_eq!(bp.as_str(), "kubepods.slice/kubepods-besteffort.slice");
        assert_eq!(v2.read_cpu_quota(&bp), Some((Some(20_000), 50_000)));
        let other = CgroupPath::parse("/custom/be").unwrap();
        assert_eq!(
            find_be_parent(&v2, Some(&other), &qoslet_cgroups::PodRoot::default(), None),
            Some(other)
        );
        std::fs::remove_dir_all(&d).unwrap();
    }
}
