//! The isolation room: the runtime hook that wires the pure policy
//! (`qoslet-hooks`: typed decisions) and the cgroup writer (`qoslet-cgroups`)
//! into the proxy's interception points, with the engine's resctrl assigner.
//! It follows the published policy (`qoslet_qos_engine::source`); the binary
//! only composes it. The NRI plane will apply the same decisions.
//!
//! * CreateContainer (before): the container's class decides a resource patch
//!   (BE batch resources -> cpu shares, CFS quota, memory limit) that the
//!   runtime applies at create, plus `qoslet.io/*` annotations.
//! * UpdateContainerResources (before): the same patch again, so kubelet's
//!   periodic updates do not undo it.
//! * RunPodSandbox / StartContainer (after): cgroup settings CRI cannot carry
//!   (`cpu.idle`, group identity) written to the pod's and container's cgroups.
//! * CreateContainer (after): what was applied is recorded in the store.
//!
//! Bad input (unknown class label, malformed annotation, hostile cgroup parent,
//! a missing kernel feature) is a logged warning and the pod runs as kubelet
//! asked.

use std::sync::Arc;

use qoslet_cgroups::resctrl::Resctrl;
use qoslet_cgroups::{CgroupPath, Cgroups, Features, Knob, PodRoot};
use qoslet_hooks::decide::{self, Action, ContainerDecision, Decision, NodeFacts, Requested};
use qoslet_hooks::policy::ResourceQosStrategy;
use qoslet_hooks::{classify, ClassSource, PodClass, QosClass, Trust};
use qoslet_proto::cri;
use qoslet_proxy::cri::{CriRequest, CriResponse, HookPoint};
use qoslet_proxy::pipeline::{BoxError, BoxFuture, HookContext, Stage};
use qoslet_proxy::Hook;
use qoslet_state::inventory::InventorySource;
use qoslet_state::store::{ContainerRecord, PodRecord, Store};
use tracing::{debug, warn};

pub use qoslet_state::store::{ANNOTATION_APPLIED, ANNOTATION_CLASS, ANNOTATION_REQUESTED};

pub struct Isolation {
    cgroups: Option<Arc<Cgroups>>,
    resctrl: Option<Arc<Resctrl>>,
    shared: PolicyHandle,
    /// Group identity's kernel switch (None: not managed here).
    sysctl: Option<Arc<qoslet_cgroups::sysctl::Sysctl>>,
    /// The agent's inventory, set once the store runs ([`Isolation::inventory_slot`]):
    /// the LS share pool is computed from it (unset: containers keep kubelet's cpusets).
    inventory: InventorySlot,
    /// The CPUs LSE/LSR pods are bound to, at the inventory generation they
    /// were computed at.
    bound: Arc<std::sync::Mutex<Option<BoundAt>>>,
    /// Where the online CPUs are read when a container is placed (`/sys`;
    /// `None`: the node facts' as read at start).
    sys_root: Option<std::path::PathBuf>,
}

/// Bound CPUs and the inventory generation they were computed at.
type BoundAt = (u64, Arc<std::collections::BTreeSet<u32>>);

/// Where the composition hands the hook the agent's one inventory.
pub type InventorySlot = Arc<std::sync::OnceLock<Arc<dyn InventorySource>>>;

/// The policy the hooks read, swapped whole when the config file is reloaded
/// (each call reads one consistent policy).
#[derive(Clone)]
pub struct PolicyHandle(Arc<std::sync::RwLock<Arc<Shared>>>);

impl PolicyHandle {
    fn get(&self) -> Arc<Shared> {
        self.0.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Follows a policy source: each policy it publishes is in force for the
    /// next calls (the devices come resolved; nothing here touches a file).
    pub fn follow(&self, mut rx: qoslet_qos_engine::source::PolicyRx) {
        let me = self.clone();
        tokio::spawn(async move {
            while rx.changed().await.is_ok() {
                let p = rx.borrow_and_update().clone();
                me.set_resolved(p.policy.resource_qos_strategy.clone(), p.devices.clone());
            }
        });
    }

    fn set_resolved(
        &self,
        policy: ResourceQosStrategy,
        devices: std::collections::BTreeMap<String, qoslet_cgroups::Device>,
    ) {
        let cur = self.get();
        let next = Arc::new(Shared {
            features: cur.features.clone(),
            v2: cur.v2,
            page_size: cur.page_size,
            node: cur.node.clone(),
            trust: cur.trust.clone(),
            pod_root: cur.pod_root.clone(),
            devices,
            policy,
        });
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = next;
    }
}

/// What every decision reads.
struct Shared {
    features: Features,
    v2: bool,
    page_size: u64,
    /// Online and reserved CPUs, capacity.
    node: NodeFacts,
    /// Whose labels and scheduler annotations are taken as they are.
    trust: Trust,
    /// Where kubelet puts pods.
    pod_root: PodRoot,
    policy: ResourceQosStrategy,
    /// The policy's block devices resolved on this host.
    devices: std::collections::BTreeMap<String, qoslet_cgroups::Device>,
}

impl Shared {
    /// The decisions' context; `pool`: the LS share pool, where known.
    fn ctx<'a>(&'a self, pool: Option<decide::SharePool<'a>>) -> decide::Context<'a> {
        decide::Context {
            features: &self.features,
            v2: self.v2,
            policy: &self.policy,
            page_size: self.page_size,
            node: &self.node,
            devices: &self.devices,
            share_pool: pool,
        }
    }
}

/// The node's online CPUs, memory and reserved CPUs, read once at start
/// (`sys_root`/`proc_root`: `/sys` and `/proc` in production). What cannot be
/// read is left unknown, with a warning: then no annotation's cpuset is
/// honoured and batch resources are not capped by capacity.
pub fn node_facts(
    sys_root: &std::path::Path,
    proc_root: &std::path::Path,
    reserved: Option<&str>,
) -> NodeFacts {
    use qoslet_cgroups::cgroup::parse_cpu_list;
    let online_path = sys_root.join("devices/system/cpu/online");
    let online = std::fs::read_to_string(&online_path)
        .ok()
        .and_then(|s| parse_cpu_list(&s))
        .unwrap_or_else(|| {
            warn!(path = %online_path.display(), "online CPUs unknown; cpuset annotations will not be honoured");
            Default::default()
        });
    let memory = std::fs::read_to_string(proc_root.join("meminfo"))
        .ok()
        .and_then(|m| {
            m.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map(|kb| kb.saturating_mul(1024))
        .unwrap_or(0);
    // the NUMA layout (`node*/cpulist`), for pods the scheduler allocated on NUMA nodes
    let numa = std::fs::read_dir(sys_root.join("devices/system/node"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let n: u32 = e.file_name().to_str()?.strip_prefix("node")?.parse().ok()?;
            let cpus = std::fs::read_to_string(e.path().join("cpulist")).ok()?;
            Some((n, parse_cpu_list(cpus.trim())?))
        })
        .collect();
    NodeFacts {
        milli_cpus: online.len() as u64 * 1000,
        online_cpus: online,
        reserved_cpus: reserved.and_then(parse_cpu_list).unwrap_or_default(),
        memory_bytes: memory,
        numa,
    }
}

impl Isolation {
    /// `cgroups`: the host's cgroups, or `None` when none were found (then
    /// only CRI-carried settings are applied).
    pub fn new(
        cgroups: Option<Cgroups>,
        resctrl: Option<Resctrl>,
        policy: ResourceQosStrategy,
        node: NodeFacts,
        trust: Trust,
        pod_root: PodRoot,
    ) -> Self {
        let features = cgroups
            .as_ref()
            .map(|c| c.host().features.clone())
            .unwrap_or_default();
        let v2 = cgroups.as_ref().is_some_and(|c| c.host().is_v2());
        Self {
            cgroups: cgroups.map(Arc::new),
            resctrl: resctrl.map(Arc::new),
            sysctl: None,
            inventory: Default::default(),
            bound: Default::default(),
            sys_root: None,
            shared: PolicyHandle(Arc::new(std::sync::RwLock::new(Arc::new(Shared {
                features,
                v2,
                page_size: qoslet_cgroups::cgroup::page_size(),
                node,
                trust,
                pod_root,
                devices: qoslet_qos_engine::source::resolve_devices(&policy),
                policy,
            })))),
        }
    }

    /// Manages group identity's kernel switch under this procfs root: turned on
    /// when a pod gets group identity (so it applies without the QoS engine too).
    pub fn with_sysctl(mut self, proc_root: &std::path::Path) -> Self {
        self.sysctl = Some(Arc::new(qoslet_cgroups::sysctl::Sysctl::new(proc_root)));
        self
    }

    /// The handle that swaps the policy the hooks read.
    pub fn policy_handle(&self) -> PolicyHandle {
        self.shared.clone()
    }

    /// Where the composition sets the agent's inventory once the store runs.
    pub fn inventory_slot(&self) -> InventorySlot {
        self.inventory.clone()
    }

    /// Reads the online CPUs under this sysfs root when placing a container
    /// (CPU hotplug; without it, those read at start).
    pub fn with_sys_root(mut self, sys_root: &std::path::Path) -> Self {
        self.sys_root = Some(sys_root.into());
        self
    }

    fn placer(&self) -> Placer {
        Placer {
            inventory: self.inventory.clone(),
            bound: self.bound.clone(),
            sys_root: self.sys_root.clone(),
        }
    }
}

/// What places a container on the LS share pool, taken into a hook's future
/// (which runs off the thread that serves kubelet: it reads sysfs and cgroupfs).
struct Placer {
    inventory: InventorySlot,
    bound: Arc<std::sync::Mutex<Option<BoundAt>>>,
    sys_root: Option<std::path::PathBuf>,
}

/// The share pool where a container is placed now.
struct Placement {
    pool: std::collections::BTreeSet<u32>,
    whole: std::collections::BTreeSet<u32>,
}

impl Placement {
    fn share(&self, explicit: bool) -> decide::SharePool<'_> {
        decide::SharePool {
            cpus: &self.pool,
            whole: &self.whole,
            explicit,
        }
    }
}

impl Placer {
    /// The share pool for a container of the pod whose cgroup is `pod_cg`:
    /// the CPUs online now (on cgroup v1 within the pod's cpuset, which a
    /// container's must be inside) without those LSE/LSR pods are bound to.
    /// `None` before the inventory is set.
    fn place(
        &self,
        node: &NodeFacts,
        cgroups: Option<&Cgroups>,
        pod_cg: Option<&CgroupPath>,
    ) -> Option<Placement> {
        let inv = self.inventory.get()?.current();
        let bound = {
            let mut c = self.bound.lock().unwrap_or_else(|e| e.into_inner());
            match c.as_ref().filter(|(g, _)| *g == inv.generation) {
                Some((_, b)) => b.clone(),
                None => {
                    let b = Arc::new(inv.bound_cpus(node));
                    *c = Some((inv.generation, b.clone()));
                    b
                }
            }
        };
        let mut whole = self
            .sys_root
            .as_ref()
            .and_then(|s| std::fs::read_to_string(s.join("devices/system/cpu/online")).ok())
            .and_then(|s| qoslet_cgroups::cgroup::parse_cpu_list(s.trim()))
            .filter(|c| !c.is_empty())
            .unwrap_or_else(|| node.online_cpus.clone());
        if let (Some(cg), Some(p)) = (cgroups, pod_cg) {
            if !cg.host().is_v2() {
                if let Some(within) = cg.read_cpuset(p) {
                    whole.retain(|c| within.contains(c));
                }
            }
        }
        let pool = decide::share_pool(&whole, [bound.as_ref().clone()]);
        Some(Placement { pool, whole })
    }
}

/// The class of a pod, logging input problems.
fn class_of(pod: &PodRecord, trust: &Trust) -> Option<PodClass> {
    let d = classify(&pod.labels, &pod.namespace, &pod.cgroup_parent, trust);
    for w in &d.warnings {
        warn!(pod = %pod.name, namespace = %pod.namespace, "{w}");
    }
    d.pod_class()
}

/// A stored container, its pod and its class (`None`: not qoslet's to touch).
fn known(
    store: &Store,
    container_id: &str,
    trust: &Trust,
) -> Option<(ContainerRecord, PodRecord, PodClass)> {
    let c = store.container(container_id)?;
    let pod = store.pod_of(container_id)?;
    let class = class_of(&pod, trust)?;
    Some((c, pod, class))
}

/// What kubelet asked for a container's resources, as decisions take it.
fn requested(r: Option<&cri::LinuxContainerResources>) -> Requested<'_> {
    r.map(|r| Requested {
        memory_limit: r.memory_limit_in_bytes,
        cpu_quota: r.cpu_quota,
        cpu_period: r.cpu_period,
        cpuset_cpus: &r.cpuset_cpus,
        oom_score_adj: r.oom_score_adj,
        pod_milli_cpu: 0,
    })
    .unwrap_or_default()
}

/// Before an UpdateContainerResources whose CFS quota (`quota` µs, ≤ 0: none)
/// may fall below the burst the QoS engine set (an in-place resize down):
/// lowers the container's burst to the new quota, and the pod's to the new sum
/// of its containers' quotas (kubelet writes the pod cgroup after its
/// containers on a decrease), so neither write meets the kernel's EINVAL.
fn make_room_for_quota(
    cgroups: &Cgroups,
    store: &Store,
    pod: &PodRecord,
    container: &str,
    quota: i64,
    pod_root: &PodRoot,
) {
    if !cgroups.host().features.cpu_burst || quota <= 0 {
        return;
    }
    let Ok(pod_cg) = CgroupPath::pod_under(&pod.cgroup_parent, pod_root) else {
        return;
    };
    let pod_sum: Option<i64> = store.read_all(|_, ctrs| {
        ctrs.values()
            .filter(|c| {
                c.pod_id == pod.id && c.state == qoslet_state::store::ContainerState::Running
            })
            .map(|c| {
                let q = if c.id == container {
                    quota
                } else {
                    c.requested.as_ref().map_or(0, |r| r.cpu_quota)
                };
                (q > 0).then_some(q)
            })
            .sum()
    });
    let lower = |cg: &CgroupPath, max: i64| {
        let Ok(files) = cgroups.plan(&Knob::CpuBurst(0)) else {
            return;
        };
        let Some(f) = files.first() else { return };
        let cur: Option<i64> = cgroups
            .read(cg, f.controller, f.file)
            .ok()
            .and_then(|v| v.trim().parse().ok());
        if cur.is_some_and(|b| b > max) {
            if let Err(e) = cgroups.apply(cg, &Knob::CpuBurst(max as u64)) {
                warn!(cgroup = %cg, error = %e, "CFS burst not lowered before a smaller quota");
            }
        }
    };
    if let Ok(cg) = pod_cg.container(container) {
        lower(&cg, quota);
    }
    if let Some(sum) = pod_sum {
        lower(&pod_cg, sum);
    }
}

/// What the store holds of kubelet's asks, as decisions take it.
fn stored_requested(r: &qoslet_state::store::Resources) -> Requested<'_> {
    Requested {
        memory_limit: r.memory_limit_in_bytes,
        cpu_quota: r.cpu_quota,
        cpu_period: r.cpu_period,
        cpuset_cpus: &r.cpuset_cpus,
        oom_score_adj: r.oom_score_adj,
        pod_milli_cpu: 0,
    }
}

/// What kubelet asked for a container, with its pod's CPU limit (an untrusted
/// pod's binding is sized by it).
fn with_pod<'a>(mut r: Requested<'a>, pod: &PodRecord) -> Requested<'a> {
    r.pod_milli_cpu = pod.sandbox_limits().milli_cpu();
    r
}

/// The container's name and the resources kubelet asked for.
fn name_and_resources(
    cfg: Option<&cri::ContainerConfig>,
) -> (String, Option<&cri::LinuxContainerResources>) {
    let name = cfg
        .and_then(|c| c.metadata.as_ref())
        .map(|m| m.name.clone())
        .unwrap_or_default();
    let r = cfg
        .and_then(|c| c.linux.as_ref())
        .and_then(|l| l.resources.as_ref());
    (name, r)
}

/// Where a pod's class comes from, in words (for `qoslet explain`).
fn class_source(pod: &PodRecord, trust: &Trust) -> String {
    match classify(&pod.labels, &pod.namespace, &pod.cgroup_parent, trust).source {
        ClassSource::Label => format!("label {}", qoslet_hooks::class::LABEL_QOS_CLASS),
        ClassSource::KubeQos(q) => {
            format!("Kubernetes QoS {q:?} (cgroup parent {})", pod.cgroup_parent)
        }
        ClassSource::Skipped => format!("label {} (skipped)", qoslet_hooks::class::LABEL_SKIP),
        ClassSource::Unknown => "none".into(),
    }
}

fn pod_from_config(c: &cri::PodSandboxConfig) -> PodRecord {
    qoslet_proxy::records::pod("", c, "")
}

fn resources_with(
    mut r: cri::LinuxContainerResources,
    p: &decide::ResourcePatch,
) -> cri::LinuxContainerResources {
    if let Some(v) = &p.cpuset_cpus {
        r.cpuset_cpus = v.clone();
    }
    if let Some(v) = p.cpu_shares {
        r.cpu_shares = v;
    }
    if let Some(v) = p.cpu_quota {
        r.cpu_quota = v;
    }
    if let Some(v) = p.cpu_period {
        r.cpu_period = v;
    }
    if let Some(v) = p.memory_limit_in_bytes {
        r.memory_limit_in_bytes = v;
    }
    for (k, v) in &p.unified {
        r.unified.insert(k.clone(), v.clone());
    }
    r
}

/// `qoslet.io/applied`: setting -> value, as a JSON object.
fn applied(ds: &[&Decision], v2: bool) -> String {
    let m: std::collections::BTreeMap<String, String> = ds.iter().map(|d| d.setting(v2)).collect();
    serde_json::to_string(&m).unwrap_or_default()
}

/// The decisions CRI carries (the runtime applies them at create).
fn carried(d: &ContainerDecision) -> Vec<&Decision> {
    d.decisions
        .iter()
        .filter(|d| matches!(d.action, Action::Cri(_)))
        .collect()
}

/// The decisions qoslet writes into the cgroup itself.
fn cgroup_written(ds: &[Decision]) -> Vec<&Decision> {
    ds.iter()
        .filter(|d| matches!(d.action, Action::Cgroup(_)))
        .collect()
}

/// Writes knobs to a cgroup. Every knob is tried: one the kernel refuses does
/// not keep the others from being applied. Each failure is logged; the first
/// is returned (the hook's failure policy counts it). Blocking: hooks run on
/// the blocking pool (the pipeline's rule), so this is called inline there.
fn write(cgroups: Option<&Cgroups>, cg: &CgroupPath, knobs: &[Knob]) -> Written {
    let Some(c) = cgroups else {
        return Written::default();
    };
    let mut failed = Vec::new();
    for k in knobs {
        match c.apply(cg, k) {
            Ok(_) => debug!(cgroup = %cg, knob = ?k, "applied"),
            Err(e) => {
                warn!(cgroup = %cg, knob = k.name(), error = %e, "cgroup setting not applied");
                failed.push((k.clone(), e));
            }
        }
    }
    Written { failed }
}

/// What [`write`] could not write: each knob with its error.
#[derive(Default)]
struct Written {
    failed: Vec<(Knob, qoslet_cgroups::CgroupError)>,
}

impl Written {
    /// Why the write of `knob` failed (`None`: it did not fail).
    fn failure(&self, knob: Option<&Knob>) -> Option<&qoslet_cgroups::CgroupError> {
        let knob = knob?;
        self.failed.iter().find(|(k, _)| k == knob).map(|(_, e)| e)
    }

    /// The hook's result: the first failure counts under its failure policy.
    fn result(self) -> Result<(), BoxError> {
        match self.failed.into_iter().next() {
            Some((_, e)) => Err(Box::new(e) as BoxError),
            None => Ok(()),
        }
    }

    /// `applied` entries as they are: a setting whose write failed says so.
    fn entries(&self, ds: &[&Decision], v2: bool) -> Vec<(String, String)> {
        ds.iter()
            .map(|d| {
                let (setting, value) = d.setting(v2);
                let v = match self.failure(d.knob()) {
                    Some(e) => format!("failed: {value} ({}): {e}", d.because),
                    None => format!("{value} ({})", d.because),
                };
                (setting, v)
            })
            .collect()
    }
}

fn record(store: &Store, container: &str, class: QosClass, rules: &[(String, String)]) {
    store.set_container_applied(container, "class", class.as_str());
    for (k, v) in rules {
        store.set_container_applied(container, k, v);
    }
}

impl Hook for Isolation {
    fn name(&self) -> &str {
        "isolation"
    }

    fn handles(&self, point: HookPoint, stage: Stage) -> bool {
        matches!(
            (point, stage),
            (HookPoint::CreateContainer, _)
                | (HookPoint::UpdateContainerResources, Stage::Before)
                | (HookPoint::RunPodSandbox, Stage::After)
                | (HookPoint::StartContainer, Stage::After)
        )
    }

    fn before(
        &self,
        ctx: HookContext,
        req: Arc<CriRequest>,
    ) -> BoxFuture<Result<Option<CriRequest>, BoxError>> {
        let (shared, cgroups, placer) = (self.shared.get(), self.cgroups.clone(), self.placer());
        Box::pin(async move {
            match &*req {
                CriRequest::CreateContainer(r) => {
                    let pod = ctx
                        .store
                        .pod(&r.pod_sandbox_id)
                        .or_else(|| r.sandbox_config.as_ref().map(pod_from_config));
                    let (Some(pod), Some(cfg)) = (pod, r.config.as_ref()) else {
                        return Ok(None);
                    };
                    let Some(class) = class_of(&pod, &shared.trust) else {
                        return Ok(None);
                    };
                    let (name, res) = name_and_resources(Some(cfg));
                    let pcg = CgroupPath::pod_under(&pod.cgroup_parent, &shared.pod_root).ok();
                    let place = placer.place(&shared.node, cgroups.as_deref(), pcg.as_ref());
                    let d = decide::container(
                        class,
                        &name,
                        &pod.annotations,
                        &with_pod(requested(res), &pod),
                        &shared.ctx(place.as_ref().map(|p| p.share(false))),
                    );
                    for w in &d.warnings {
                        warn!(pod = %pod.name, container = %name, "{w}");
                    }
                    let mut annotations: std::collections::HashMap<String, String> = [(
                        ANNOTATION_CLASS.to_string(),
                        class.class.as_str().to_string(),
                    )]
                    .into();
                    // the settings CRI carries (the runtime applies them with the
                    // container), as a JSON object; those written to the cgroup at
                    // start are recorded there, with their outcome
                    let carried = carried(&d);
                    if !carried.is_empty() {
                        annotations.insert(ANNOTATION_APPLIED.into(), applied(&carried, shared.v2));
                    }
                    // what kubelet asked, before qoslet's patch: containerd keeps only
                    // the patched config, and a store rebuilt from it must not take
                    // qoslet's values for kubelet's (always written, so a value already
                    // in the request is never taken for qoslet's)
                    let kubelets = res
                        .map(qoslet_proxy::records::resources)
                        .unwrap_or_default();
                    if let Ok(json) = serde_json::to_string(&kubelets) {
                        annotations.insert(ANNOTATION_REQUESTED.into(), json);
                    }
                    let patch = d.patch();
                    let resources = (!patch.is_empty())
                        .then(|| resources_with(cri::LinuxContainerResources::default(), &patch));
                    Ok(Some(CriRequest::CreateContainer(
                        cri::CreateContainerRequest {
                            config: Some(cri::ContainerConfig {
                                annotations,
                                linux: resources.map(|r| cri::LinuxContainerConfig {
                                    resources: Some(r),
                                    ..Default::default()
                                }),
                                ..Default::default()
                            }),
                            ..Default::default()
                        },
                    )))
                }
                CriRequest::UpdateContainerResources(r) => {
                    let Some((c, pod, class)) = known(&ctx.store, &r.container_id, &shared.trust)
                    else {
                        return Ok(None);
                    };
                    // kubelet may send a partial update (cpuset only): what it left out stands
                    let mut merged = c.requested.clone().unwrap_or_default();
                    if let Some(l) = &r.linux {
                        merged.merge(&qoslet_proxy::records::resources(l));
                    }
                    // the pool carried even when whole: containerd re-applies the
                    // cpuset its spec kept from an earlier patch otherwise
                    let pcg = CgroupPath::pod_under(&pod.cgroup_parent, &shared.pod_root).ok();
                    let place = placer.place(&shared.node, cgroups.as_deref(), pcg.as_ref());
                    let d = decide::container(
                        class,
                        &c.name,
                        &pod.annotations,
                        &with_pod(stored_requested(&merged), &pod),
                        &shared.ctx(place.as_ref().map(|p| p.share(true))),
                    );
                    // the kernel checks the quota the runtime is about to write against
                    // the CFS burst the engine set: lower the burst first where needed
                    let mut patch = d.patch();
                    // v2: memory QoS carried at create stays in containerd's spec,
                    // which kubelet's update (without those unified keys) applies
                    // again: what the class no longer sets goes back to its default
                    if shared.v2 {
                        let kubelets = r.linux.as_ref().map(|l| &l.unified);
                        for (key, default) in [
                            ("memory.min", "0"),
                            ("memory.low", "0"),
                            ("memory.high", "max"),
                        ] {
                            if c.applied.contains_key(key)
                                && !patch.unified.contains_key(key)
                                && !kubelets.is_some_and(|u| u.contains_key(key))
                            {
                                // kubelet's own create-time value (its MemoryQoS), else the default
                                let back = c
                                    .requested
                                    .as_ref()
                                    .and_then(|r| r.unified.get(key))
                                    .map_or(default, String::as_str);
                                patch.unified.insert(key.into(), back.into());
                            }
                        }
                    }
                    if let Some(cg) = cgroups.as_deref() {
                        let quota = patch.cpu_quota.unwrap_or(merged.cpu_quota);
                        make_room_for_quota(cg, &ctx.store, &pod, &c.id, quota, &shared.pod_root);
                    }
                    if patch.is_empty() {
                        return Ok(None);
                    }
                    // kubelet's update must not undo the class's settings: they win where qoslet owns them
                    Ok(Some(CriRequest::UpdateContainerResources(
                        cri::UpdateContainerResourcesRequest {
                            linux: Some(resources_with(
                                cri::LinuxContainerResources::default(),
                                &patch,
                            )),
                            ..Default::default()
                        },
                    )))
                }
                _ => Ok(None),
            }
        })
    }

    fn after(
        &self,
        ctx: HookContext,
        req: Arc<CriRequest>,
        resp: Arc<CriResponse>,
    ) -> BoxFuture<Result<(), BoxError>> {
        let (shared, cgroups, resctrl, sysctl) = (
            self.shared.get(),
            self.cgroups.clone(),
            self.resctrl.clone(),
            self.sysctl.clone(),
        );
        let placer = self.placer();
        Box::pin(async move {
            match (&*req, &*resp) {
                (CriRequest::RunPodSandbox(_), CriResponse::RunPodSandbox(o)) => {
                    let Some(pod) = ctx.store.pod(&o.pod_sandbox_id) else {
                        return Ok(());
                    };
                    let Some(class) = class_of(&pod, &shared.trust) else {
                        return Ok(());
                    };
                    ctx.store
                        .set_pod_applied(&pod.id, "class", class.class.as_str());
                    ctx.store.set_pod_applied(
                        &pod.id,
                        "class-source",
                        &class_source(&pod, &shared.trust),
                    );
                    // recorded for what ranks pods (eviction comes next); the
                    // pod's spec.priority needs the Kubernetes API
                    if let Some(pc) = qoslet_hooks::class::priority_class(&pod.labels) {
                        ctx.store.set_pod_applied(&pod.id, "priority-class", pc);
                    }
                    let d = decide::pod(
                        class,
                        &pod.annotations,
                        &pod.sandbox_limits(),
                        &shared.ctx(None),
                    );
                    for w in &d.warnings {
                        warn!(pod = %pod.name, namespace = %pod.namespace, "{w}");
                    }
                    let cg = match CgroupPath::pod_under(&pod.cgroup_parent, &shared.pod_root) {
                        Ok(cg) if !cg.as_str().is_empty() => cg,
                        Ok(_) => return Ok(()),
                        Err(e) => {
                            warn!(pod = %pod.name, error = %e, "cgroup parent refused; pod-level settings skipped");
                            return Ok(());
                        }
                    };
                    if let (Some(sys), true) = (
                        &sysctl,
                        d.cgroup()
                            .iter()
                            .any(|k| matches!(k, Knob::GroupIdentity(_))),
                    ) {
                        if let Err(e) = sys.enable_group_identity() {
                            warn!(error = %e, "group identity sysctl not set");
                        }
                    }
                    let written = write(cgroups.as_deref(), &cg, &d.cgroup());
                    for (k, v) in written.entries(&cgroup_written(&d.decisions), shared.v2) {
                        ctx.store.set_pod_applied(&pod.id, &k, &v);
                    }
                    written.result()
                }
                (CriRequest::CreateContainer(r), CriResponse::CreateContainer(o)) => {
                    let Some(pod) = ctx.store.pod(&r.pod_sandbox_id) else {
                        return Ok(());
                    };
                    let Some(class) = class_of(&pod, &shared.trust) else {
                        return Ok(());
                    };
                    // the request as it reached the runtime: without the class annotation
                    // the "before" hook's patch never made it (it timed out or failed
                    // open), and nothing it decided may be recorded as applied
                    let patched = r.config.as_ref().is_some_and(|c| {
                        c.annotations.get(ANNOTATION_CLASS).map(String::as_str)
                            == Some(class.class.as_str())
                    });
                    if !patched {
                        ctx.store.set_container_applied(
                            &o.container_id,
                            "error",
                            "the CreateContainer hook's settings did not reach the runtime (it timed out or failed, fail-open)",
                        );
                        return Ok(());
                    }
                    // decided again from kubelet's own request (the one the runtime got
                    // is patched), as the "before" hook decided it
                    let (name, res) = name_and_resources(r.config.as_ref());
                    let kubelets = r
                        .config
                        .as_ref()
                        .and_then(|c| c.annotations.get(ANNOTATION_REQUESTED))
                        .and_then(|j| {
                            serde_json::from_str::<qoslet_state::store::Resources>(j).ok()
                        });
                    let pcg = CgroupPath::pod_under(&pod.cgroup_parent, &shared.pod_root).ok();
                    let place = placer.place(&shared.node, cgroups.as_deref(), pcg.as_ref());
                    let pool = place.as_ref().map(|p| p.share(false));
                    let d = match &kubelets {
                        Some(k) => decide::container(
                            class,
                            &name,
                            &pod.annotations,
                            &with_pod(stored_requested(k), &pod),
                            &shared.ctx(pool),
                        ),
                        None => decide::container(
                            class,
                            &name,
                            &pod.annotations,
                            &with_pod(requested(res), &pod),
                            &shared.ctx(pool),
                        ),
                    };
                    // settings written at start are recorded there, with their outcome
                    record(
                        &ctx.store,
                        &o.container_id,
                        class.class,
                        &Written::default().entries(&carried(&d), shared.v2),
                    );
                    Ok(())
                }
                (CriRequest::StartContainer(r), _) => {
                    let Some((c, pod, class)) = known(&ctx.store, &r.container_id, &shared.trust)
                    else {
                        return Ok(());
                    };
                    let stored = c.requested.clone().unwrap_or_default();
                    let d = decide::container(
                        class,
                        &c.name,
                        &pod.annotations,
                        &with_pod(stored_requested(&stored), &pod),
                        &shared.ctx(None),
                    );
                    let cg = match CgroupPath::pod_under(&pod.cgroup_parent, &shared.pod_root)
                        .and_then(|p| p.container(&c.id))
                    {
                        Ok(cg) => cg,
                        Err(e) => {
                            warn!(pod = %pod.name, container = %c.name, error = %e, "cgroup path refused; container settings skipped");
                            return Ok(());
                        }
                    };
                    let written = write(cgroups.as_deref(), &cg, &d.cgroup());
                    record(
                        &ctx.store,
                        &c.id,
                        class.class,
                        &written.entries(&cgroup_written(&d.decisions), shared.v2),
                    );
                    written.result()?;
                    if let (Some(rdt), Some(cgroups), Some(q)) = (resctrl, cgroups, d.resctrl()) {
                        {
                            let class = q.class;
                            let (id, store) = (c.id.clone(), ctx.store.clone());
                            let group = qoslet_qos_engine::resctrl::group_of(class);
                            // blocking, inline: hooks run on the blocking pool; the engine's
                            // assigner (every thread, as each tick does)
                            let schemata = rdt.schemata(
                                q.cat_range_start_percent,
                                q.cat_range_end_percent,
                                q.mba_percent,
                            );
                            let r = qoslet_qos_engine::resctrl::join(
                                group,
                                &schemata,
                                std::slice::from_ref(&cg),
                                &rdt,
                                &cgroups,
                            )
                            .map(|_| schemata.trim().replace('\n', " "));
                            match r {
                                Ok(schemata) => store.set_container_applied(
                                    &id,
                                    "resctrl",
                                    &format!(
                                        "group {group}: {schemata} (resctrlQOS of class {})",
                                        class.as_str()
                                    ),
                                ),
                                Err(e) => return Err(Box::new(e) as BoxError),
                            }
                        }
                    }
                    Ok(())
                }
                _ => Ok(()),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use qoslet_cgroups::memfs::MemFs;
    use qoslet_state::store::ContainerRecord;

    /// A store holding one BE-labelled pod and its container `app`.
    fn be_pod_with_app(pod_id: &str, parent: &str, cid: &str) -> Store {
        let store = Store::new();
        let mut pod = PodRecord {
            id: pod_id.into(),
            name: "batch".into(),
            cgroup_parent: parent.into(),
            ..Default::default()
        };
        pod.labels
            .insert("koordinator.sh/qosClass".into(), "BE".into());
        store.upsert_pod(pod);
        store.upsert_container(ContainerRecord {
            id: cid.into(),
            pod_id: pod_id.into(),
            name: "app".into(),
            ..Default::default()
        });
        store
    }

    fn tree(tag: &str, files: &[(&str, &str)]) -> std::path::PathBuf {
        qoslet_cgroups::testing::tree(&format!("iso-{tag}"), files)
    }

    /// An inventory the test sets (the agent's follows the store).
    struct Fixed(std::sync::Mutex<Arc<qoslet_state::inventory::Inventory>>);
    impl InventorySource for Fixed {
        fn current(&self) -> Arc<qoslet_state::inventory::Inventory> {
            self.0.lock().unwrap().clone()
        }
    }

    /// Issue 14 item 5 at CreateContainer: an LS container is created on the
    /// share pool of the inventory (the node without the CPUs a running LSR
    /// container is bound to), an LSR container bound by its annotation and
    /// without CFS quota; before the inventory is set, kubelet's cpusets stand.
    #[tokio::test]
    async fn containers_are_created_on_the_share_pool_or_their_binding() {
        use qoslet_state::inventory::{ContainerEntry, Inventory, PodEntry};
        let node = NodeFacts {
            online_cpus: (0..4).collect(),
            milli_cpus: 4000,
            ..Default::default()
        };
        let hook = Isolation::new(
            None,
            None,
            ResourceQosStrategy::default(),
            node,
            Trust::default(),
            PodRoot::default(),
        );
        let store = Store::new();
        let bound = r#"{"cpuset":"2-3"}"#;
        for (id, class, parent, ann) in [
            ("pls", "LS", "/kubepods/burstable/podpls", None),
            ("plsr", "LSR", "/kubepods/podplsr", Some(bound)),
        ] {
            let mut pod = PodRecord {
                id: id.into(),
                name: id.into(),
                cgroup_parent: parent.into(),
                ..Default::default()
            };
            pod.labels
                .insert("koordinator.sh/qosClass".into(), class.into());
            if let Some(a) = ann {
                pod.annotations
                    .insert(decide::ANNOTATION_RESOURCE_STATUS.into(), a.into());
            }
            store.upsert_pod(pod);
        }
        let create = |pod: &str| {
            Arc::new(CriRequest::CreateContainer(cri::CreateContainerRequest {
                pod_sandbox_id: pod.into(),
                config: Some(cri::ContainerConfig {
                    metadata: Some(cri::ContainerMetadata {
                        name: "app".into(),
                        attempt: 0,
                    }),
                    linux: Some(cri::LinuxContainerConfig {
                        resources: Some(cri::LinuxContainerResources {
                            cpu_quota: 200_000,
                            cpu_period: 100_000,
                            ..Default::default()
                        }),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }))
        };
        let patched = |r: Option<CriRequest>| match r {
            Some(CriRequest::CreateContainer(c)) => c
                .config
                .and_then(|c| c.linux)
                .and_then(|l| l.resources)
                .map(|r| (r.cpuset_cpus, r.cpu_quota))
                .unwrap_or_default(),
            other => panic!("{other:?}"),
        };
        let ctx = || HookContext {
            store: store.clone(),
        };
        let ls = hook.before(ctx(), create("pls")).await.unwrap();
        assert_eq!(
            patched(ls),
            (String::new(), 0),
            "no inventory yet: kubelet's"
        );
        // the LSR pod's container runs, bound to CPUs 2-3
        let lsr = PodEntry {
            id: "plsr".into(),
            name: "plsr".into(),
            namespace: String::new(),
            uid: String::new(),
            labels: Default::default(),
            created_at: 0,
            priority: None,
            cgroup: CgroupPath::parse("/kubepods/podplsr").unwrap(),
            class: Some(PodClass {
                class: QosClass::Lsr,
                by_label: true,
                trusted: false,
                kube: Some(qoslet_hooks::KubeQos::Guaranteed),
            }),
            annotations: [(
                decide::ANNOTATION_RESOURCE_STATUS.to_string(),
                bound.to_string(),
            )]
            .into(),
            limits: Default::default(),
            containers: vec![ContainerEntry {
                id: "c1".into(),
                name: "app".into(),
                cgroup: CgroupPath::parse("/kubepods/podplsr/c1").unwrap(),
                memory_limit: 0,
                cpu_quota: 200_000,
                cpu_period: 100_000,
                cpuset_cpus: String::new(),
                oom_score_adj: 0,
                cpu_shares: 0,
            }],
        };
        let inv = Arc::new(Fixed(std::sync::Mutex::new(Arc::new(Inventory {
            generation: 1,
            pods: vec![lsr.clone()],
        }))));
        let _ = hook.inventory_slot().set(inv.clone());
        let ls = hook.before(ctx(), create("pls")).await.unwrap();
        assert_eq!(patched(ls), ("0-1".into(), 0), "the share pool");
        let lsr_c = hook.before(ctx(), create("plsr")).await.unwrap();
        assert_eq!(patched(lsr_c), ("2-3".into(), -1), "bound, no CFS quota");
        // the LSR container restarting (not running): its pod's binding, sized by
        // the sandbox's limit, keeps CPUs 2-3 out of the pool
        let mut restarting = lsr;
        restarting.containers.clear();
        restarting.limits = decide::SandboxLimits {
            memory_limit: 0,
            cpu_quota: 200_000,
            cpu_period: 100_000,
        };
        let restarting_entry = restarting.clone();
        *inv.0.lock().unwrap() = Arc::new(Inventory {
            generation: 2,
            pods: vec![restarting],
        });
        let ls = hook.before(ctx(), create("pls")).await.unwrap();
        assert_eq!(patched(ls), ("0-1".into(), 0), "still the share pool");
        // the LSR pod gone: the pool is every CPU; a create pins nothing, and
        // kubelet's update carries every CPU (containerd would re-apply the
        // cpuset its spec kept from the create otherwise)
        *inv.0.lock().unwrap() = Arc::new(Inventory {
            generation: 3,
            pods: Vec::new(),
        });
        let ls = hook.before(ctx(), create("pls")).await.unwrap();
        assert_eq!(patched(ls), (String::new(), 0), "nothing pinned");
        store.upsert_container(ContainerRecord {
            id: "cls".into(),
            pod_id: "pls".into(),
            name: "app".into(),
            ..Default::default()
        });
        let update = Arc::new(CriRequest::UpdateContainerResources(
            cri::UpdateContainerResourcesRequest {
                container_id: "cls".into(),
                linux: Some(cri::LinuxContainerResources {
                    cpu_quota: 200_000,
                    cpu_period: 100_000,
                    ..Default::default()
                }),
                ..Default::default()
            },
        ));
        match hook.before(ctx(), update).await.unwrap() {
            Some(CriRequest::UpdateContainerResources(u)) => {
                assert_eq!(u.linux.unwrap().cpuset_cpus, "0-3")
            }
            other => panic!("{other:?}"),
        }
        // on cgroup v1 the pool is taken within the pod's own cpuset (a
        // container's must be inside it): the pod's 1-3 minus bound 2-3
        let (_m, cgroups) = MemFs::v1_tree(&[
            ("cpu/cgroup.procs", ""),
            ("cpuset/cgroup.procs", ""),
            ("cpuset/kubepods/burstable/podpls/cpuset.cpus", "1-3\n"),
        ]);
        let narrow = Isolation::new(
            Some(cgroups),
            None,
            ResourceQosStrategy::default(),
            NodeFacts {
                online_cpus: (0..4).collect(),
                milli_cpus: 4000,
                ..Default::default()
            },
            Trust::default(),
            PodRoot::default(),
        );
        *inv.0.lock().unwrap() = Arc::new(Inventory {
            generation: 4,
            pods: vec![restarting_entry],
        });
        let _ = narrow.inventory_slot().set(inv.clone());
        let ls = narrow.before(ctx(), create("pls")).await.unwrap();
        assert_eq!(patched(ls), ("1".into(), 0));
    }

    /// Review of issue 14 item 8: on cgroup v2 the memory QoS a create carried
    /// in `unified` stays in containerd's spec, and kubelet's update (without
    /// those keys) would apply it again: once the class no longer sets it, the
    /// update carries the defaults.
    #[tokio::test]
    async fn v2_updates_put_back_memory_qos_the_class_no_longer_sets() {
        let m = MemFs::new();
        m.set("kubepods.slice/memory.min", "0\n");
        let cgroups = m.v2(qoslet_cgroups::Features {
            memory_qos: true,
            ..Default::default()
        });
        let hook = Isolation::new(
            Some(cgroups),
            None,
            ResourceQosStrategy::default(), // memory QoS off
            NodeFacts::default(),
            Trust::default(),
            PodRoot::default(),
        );
        let store = Store::new();
        let mut pod = PodRecord {
            id: "p1".into(),
            name: "web".into(),
            cgroup_parent: "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1.slice"
                .into(),
            ..Default::default()
        };
        pod.labels
            .insert("koordinator.sh/qosClass".into(), "LS".into());
        store.upsert_pod(pod);
        let mut c = ContainerRecord {
            id: "c1".into(),
            pod_id: "p1".into(),
            name: "app".into(),
            ..Default::default()
        };
        // what the create carried while the class had memory QoS on
        c.applied.insert("memory.min".into(), "1073741824".into());
        c.applied.insert("memory.high".into(), "2147483648".into());
        // kubelet's own create-time memory.high (its MemoryQoS gate)
        c.requested = Some(qoslet_state::store::Resources {
            unified: [("memory.high".to_string(), "3221225472".to_string())].into(),
            ..Default::default()
        });
        store.upsert_container(c);
        let update = |unified: &[(&str, &str)]| {
            Arc::new(CriRequest::UpdateContainerResources(
                cri::UpdateContainerResourcesRequest {
                    container_id: "c1".into(),
                    linux: Some(cri::LinuxContainerResources {
                        cpu_quota: 200_000,
                        cpu_period: 100_000,
                        unified: unified
                            .iter()
                            .map(|(k, v)| (k.to_string(), v.to_string()))
                            .collect(),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
            ))
        };
        let ctx = || HookContext {
            store: store.clone(),
        };
        let got = |r: Option<CriRequest>| match r {
            Some(CriRequest::UpdateContainerResources(u)) => u.linux.unwrap().unified,
            other => panic!("{other:?}"),
        };
        let u = got(hook.before(ctx(), update(&[])).await.unwrap());
        assert_eq!(u.get("memory.min").map(String::as_str), Some("0"));
        assert_eq!(
            u.get("memory.high").map(String::as_str),
            Some("3221225472"),
            "kubelet's create-time value, not the default"
        );
        assert!(!u.contains_key("memory.low"), "never carried: not touched");
        // kubelet's own value (its MemoryQoS) stands
        let u = got(hook
            .before(ctx(), update(&[("memory.min", "5")]))
            .await
            .unwrap());
        assert!(!u.contains_key("memory.min"), "{u:?}");
    }

    /// Issue 15 item 5: `applied` says what happened. A cgroup write the kernel
    /// refused is recorded as failed (not as applied), and a CreateContainer
    /// whose "before" patch never reached the runtime (the hook timed out,
    /// fail-open) records nothing as applied.
    #[tokio::test]
    async fn applied_records_failed_writes_and_unpatched_creates() {
        let cid = "d".repeat(64);
        // an Anolis-shaped root (group identity offered), a container cgroup without the file
        let container = format!("cpu/kubepods/besteffort/pod2/{cid}/cgroup.procs");
        let (_m, cgroups) = MemFs::v1_tree(&[
            ("cpu/cgroup.procs", ""),
            ("cpu/cpu.bvt_warp_ns", "0\n"),
            (container.as_str(), ""),
        ]);
        let mut policy = ResourceQosStrategy::default();
        policy.be_class.cpu_qos.enable = true;
        let hook = Isolation::new(
            Some(cgroups),
            None,
            policy,
            NodeFacts::default(),
            Trust::default(),
            PodRoot::default(),
        );
        let store = be_pod_with_app("p2", "/kubepods/besteffort/pod2", &cid);
        let ctx = HookContext {
            store: store.clone(),
        };
        let r = hook
            .after(
                ctx.clone(),
                Arc::new(CriRequest::StartContainer(cri::StartContainerRequest {
                    container_id: cid.clone(),
                })),
                Arc::new(CriResponse::StartContainer(Default::default())),
            )
            .await;
        assert!(
            r.is_err(),
            "the failure still counts under the failure policy"
        );
        let applied = store.container(&cid).unwrap().applied;
        assert!(
            applied["cpu.bvt_warp_ns"].starts_with("failed: -1"),
            "{applied:?}"
        );
        // a CreateContainer that reached the runtime without qoslet's patch
        let create = cri::CreateContainerRequest {
            pod_sandbox_id: "p2".into(),
            config: Some(cri::ContainerConfig {
                metadata: Some(cri::ContainerMetadata {
                    name: "late".into(),
                    attempt: 0,
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        // (the proxy records the container before the "after" hooks run)
        store.upsert_container(ContainerRecord {
            id: "late".into(),
            pod_id: "p2".into(),
            name: "late".into(),
            ..Default::default()
        });
        hook.after(
            ctx,
            Arc::new(CriRequest::CreateContainer(create)),
            Arc::new(CriResponse::CreateContainer(cri::CreateContainerResponse {
                container_id: "late".into(),
            })),
        )
        .await
        .unwrap();
        let late = store.container("late").unwrap().applied;
        assert!(!late.contains_key("class"), "{late:?}");
        assert!(
            late["error"].contains("did not reach the runtime"),
            "{late:?}"
        );
    }

    /// StartContainer of a BE container with resctrl enabled, on kernel-shaped trees:
    /// the BE group gets Koordinator's schemata and the container's processes.
    #[tokio::test]
    async fn be_container_joins_the_be_resctrl_group() {
        let cid = "c".repeat(64);
        let cg = format!("cpu/kubepods/besteffort/pod1/{cid}");
        let (procs, tasks) = (format!("{cg}/cgroup.procs"), format!("{cg}/tasks"));
        let (_m, cgroups) = MemFs::v1_tree(&[
            ("cpu/cgroup.procs", ""),
            ("cpu/cpu.idle", "0\n"),
            (procs.as_str(), "123\n456\n"),
            // 789 is a second thread of process 456: resctrl assigns threads
            (tasks.as_str(), "123\n456\n789\n"),
            ("memory/cgroup.procs", ""),
        ]);
        let rdt = tree(
            "rdt",
            &[
                ("schemata", "L3:0=7ff\nMB:0=100\n"),
                ("info/L3/cbm_mask", "7ff\n"),
                ("info/L3/num_closids", "16\n"),
                ("info/MB/min_bandwidth", "10\n"),
                ("info/MB/bandwidth_gran", "10\n"),
                // the group as the kernel creates it on mkdir
                ("BE/schemata", "L3:0=7ff\nMB:0=100\n"),
                ("BE/tasks", ""),
            ],
        );
        let mut policy = ResourceQosStrategy::default();
        policy.be_class.resctrl_qos.enable = true;
        let hook = Isolation::new(
            Some(cgroups),
            Resctrl::detect(&rdt).unwrap(),
            policy,
            NodeFacts::default(),
            Trust::default(),
            PodRoot::default(),
        );
        let store = be_pod_with_app("p1", "/kubepods/besteffort/pod1", &cid);
        let req = Arc::new(CriRequest::StartContainer(cri::StartContainerRequest {
            container_id: cid.clone(),
        }));
        let resp = Arc::new(CriResponse::StartContainer(Default::default()));
        hook.after(
            HookContext {
                store: store.clone(),
            },
            req,
            resp,
        )
        .await
        .unwrap();
        // a plain file in the tree keeps the last single-line write of each task:
        // the last is a thread no process list names (every thread is assigned)
        assert_eq!(
            std::fs::read_to_string(rdt.join("BE/tasks")).unwrap(),
            "789"
        );
        assert_eq!(
            std::fs::read_to_string(rdt.join("BE/schemata")).unwrap(),
            "L3:0=f\n",
            "BE: LLC 0-30% of 11 ways"
        );
        let applied = store.container(&cid).unwrap().applied;
        assert!(
            applied["resctrl"].starts_with("group BE: L3:0=f MB:0=100"),
            "{applied:?}"
        );
        assert_eq!(applied["class"], "BE");
        std::fs::remove_dir_all(&rdt).unwrap();
    }

    /// Resctrl is off by default (Koordinator's default), so nothing happens without the policy.
    #[tokio::test]
    async fn resctrl_is_off_by_default() {
        let rdt = tree(
            "rdt-off",
            &[
                ("schemata", "L3:0=7ff\n"),
                ("info/L3/cbm_mask", "7ff\n"),
                ("BE/schemata", "L3:0=7ff\n"),
                ("BE/tasks", ""),
            ],
        );
        let (_m, cgroups) = MemFs::v1_tree(&[
            ("cpu/cgroup.procs", ""),
            ("cpu/kubepods/besteffort/pod1/x/cgroup.procs", "1\n"),
        ]);
        let hook = Isolation::new(
            Some(cgroups),
            Resctrl::detect(&rdt).unwrap(),
            ResourceQosStrategy::default(),
            NodeFacts::default(),
            Trust::default(),
            PodRoot::default(),
        );
        let store = Store::new();
        let mut pod = PodRecord {
            id: "p1".into(),
            cgroup_parent: "/kubepods/besteffort/pod1".into(),
            ..Default::default()
        };
        pod.labels
            .insert("koordinator.sh/qosClass".into(), "BE".into());
        store.upsert_pod(pod);
        store.upsert_container(ContainerRecord {
            id: "x".into(),
            pod_id: "p1".into(),
            ..Default::default()
        });
        let req = Arc::new(CriRequest::StartContainer(cri::StartContainerRequest {
            container_id: "x".into(),
        }));
        hook.after(
            HookContext {
                store: store.clone(),
            },
            req,
            Arc::new(CriResponse::StartContainer(Default::default())),
        )
        .await
        .unwrap();
        assert_eq!(std::fs::read_to_string(rdt.join("BE/tasks")).unwrap(), "");
        std::fs::remove_dir_all(&rdt).unwrap();
    }

    /// A BE pod with batch resources on a cgroup v2 host (kernel-shaped tree):
    /// the pod's cgroup gets cpu.idle, its summed quota and memory limit, memory
    /// QoS and the class's io.max; the container's memory QoS travels in CRI's
    /// `unified` map at CreateContainer.
    #[tokio::test]
    async fn be_pod_on_cgroup_v2() {
        let pod_dir = "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1.slice";
        let m = MemFs::new();
        m.set("kubepods.slice/cpu.idle", "0\n");
        for (f, c) in [
            ("cpu.idle", "0\n"),
            ("cpu.weight", "1\n"),
            ("cpu.max", "max 100000\n"),
            ("memory.max", "max\n"),
            ("memory.min", "0\n"),
            ("memory.low", "0\n"),
            ("memory.high", "max\n"),
            ("io.max", ""),
        ] {
            m.set(&format!("{pod_dir}/{f}"), c);
        }
        // what detection finds on such a v2 host: cpu.idle below the root, the
        // memory and io controllers enabled
        let cgroups = m.v2(qoslet_cgroups::Features {
            cpu_idle: true,
            memory_qos: true,
            blkio_throttle: true,
            ..Default::default()
        });
        let policy: ResourceQosStrategy = serde_json::from_str(
            r#"{"beClass":{"cpuQOS":{"enable":true},"memoryQOS":{"enable":true,"minLimitPercent":50,"lowLimitPercent":100,"throttlingPercent":50},
                "blkioQOS":{"enable":true,"blocks":[{"name":"8:16","ioCfg":{"writeBPS":1048576}}]}}}"#,
        )
        .unwrap();
        policy.validate().unwrap();
        let hook = Isolation::new(
            Some(cgroups),
            None,
            policy,
            NodeFacts::default(),
            // a Koordinator cluster: the webhook validated the batch annotation
            // (memory protection from a batch request is for trusted pods only)
            Trust {
                control_plane: true,
                ..Trust::default()
            },
            PodRoot::default(),
        );
        let store = Store::new();
        let mut pod = PodRecord {
            id: "p1".into(),
            name: "batch".into(),
            cgroup_parent: format!("/{pod_dir}"),
            ..Default::default()
        };
        pod.labels
            .insert("koordinator.sh/qosClass".into(), "BE".into());
        pod.annotations.insert(
            qoslet_hooks::batch::ANNOTATION_EXTENDED_RESOURCE_SPEC.into(),
            r#"{"containers":{"app":{"requests":{"kubernetes.io/batch-cpu":"1000","kubernetes.io/batch-memory":"64Mi"},"limits":{"kubernetes.io/batch-cpu":"2000","kubernetes.io/batch-memory":"128Mi"}}}}"#.into(),
        );
        store.upsert_pod(pod.clone());
        let hc = || HookContext {
            store: store.clone(),
        };
        hook.after(
            hc(),
            Arc::new(CriRequest::RunPodSandbox(Default::default())),
            Arc::new(CriResponse::RunPodSandbox(cri::RunPodSandboxResponse {
                pod_sandbox_id: "p1".into(),
            })),
        )
        .await
        .unwrap();
        let read = |f: &str| m.at(&format!("{pod_dir}/{f}")).unwrap();
        assert_eq!(read("cpu.idle"), "1");
        assert_eq!(read("cpu.max"), "200000 100000", "batch-cpu limit 2000m");
        assert_eq!(
            read("cpu.weight"),
            "1",
            "an idle cgroup's weight is not written (the kernel refuses it)"
        );
        assert_eq!(read("memory.max"), (128u64 << 20).to_string());
        assert_eq!(read("memory.min"), (32u64 << 20).to_string());
        assert_eq!(read("memory.low"), (64u64 << 20).to_string());
        assert_eq!(read("memory.high"), (96u64 << 20).to_string());
        assert_eq!(
            read("io.max"),
            "8:16 rbps=max wbps=1048576 riops=max wiops=max"
        );
        let applied = store.pod("p1").unwrap().applied;
        assert!(
            applied["io.max 8:16"].contains("BE blkioQOS for 8:16"),
            "{applied:?}"
        );
        assert!(!applied.contains_key("error"), "{applied:?}");

        // CreateContainer: the container's memory QoS rides in CRI's unified map
        let create = cri::CreateContainerRequest {
            pod_sandbox_id: "p1".into(),
            config: Some(cri::ContainerConfig {
                metadata: Some(cri::ContainerMetadata {
                    name: "app".into(),
                    attempt: 0,
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let out = hook
            .before(hc(), Arc::new(CriRequest::CreateContainer(create)))
            .await
            .unwrap();
        let Some(CriRequest::CreateContainer(patch)) = out else {
            panic!("no patch: {out:?}")
        };
        let r = patch.config.unwrap().linux.unwrap().resources.unwrap();
        assert_eq!(r.unified["memory.min"], (32u64 << 20).to_string());
        assert_eq!(r.unified["memory.low"], (64u64 << 20).to_string());
        assert_eq!(r.cpu_quota, 200_000);
        assert_eq!(r.memory_limit_in_bytes, 128 << 20);
    }
}
