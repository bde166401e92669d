//! Per-container decisions: what qoslet changes in a container's resources at
//! CreateContainer (so the runtime applies it at create), and which cgroup
//! settings it writes once the container runs (what CRI cannot carry).
//! Every setting comes with the rule that produced it (for `explain`).

use std::collections::{BTreeMap, BTreeSet};

use qoslet_cgroups::cgroup::{format_cpu_list, parse_cpu_list};
use qoslet_cgroups::{Device, Features, Knob};

use crate::batch::{parse_spec, pod_total, Batch, Caps, ANNOTATION_EXTENDED_RESOURCE_SPEC};
use crate::class::{KubeQos, PodClass, QosClass};
use crate::policy::{memory_qos, CpuPolicy, MemRequest, MemoryQos, ResourceQosStrategy};

/// Koordinator's scheduler writes the CPUs an LSE/LSR pod is bound to here: `{"cpuset":"0-3"}`.
pub const ANNOTATION_RESOURCE_STATUS: &str = "scheduling.koordinator.sh/resource-status";
/// A resource-status annotation longer than this is refused unread (Koordinator's are a few
/// hundred bytes; pod authors can write up to 256 KiB of annotations).
pub const MAX_RESOURCE_STATUS_BYTES: usize = 16 << 10;

/// What decisions need to know of the node (read once at start).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeFacts {
    /// Online CPUs (`/sys/devices/system/cpu/online`); empty: unknown, and then
    /// no annotation's cpuset is honoured.
    pub online_cpus: BTreeSet<u32>,
    /// CPUs kubelet reserves for the system (`--reserved-cpus`): never handed to a pod.
    pub reserved_cpus: BTreeSet<u32>,
    /// Node capacity in milli-CPUs and bytes of memory (0: unknown, no cap).
    pub milli_cpus: u64,
    pub memory_bytes: u64,
    /// The CPUs of each NUMA node, by node id (empty: unknown).
    pub numa: BTreeMap<u32, BTreeSet<u32>>,
}

/// The batch-resources annotation as this pod may use it: an untrusted pod's
/// only when its Kubernetes QoS is BestEffort (Koordinator's batch pods are:
/// batch resources are extended resources, so they carry no cpu/memory
/// requests). On a Burstable or Guaranteed pod labelled BE it would raise the
/// pod's CPU weight above what kubelet gave it.
fn batch_annotation<'a>(
    pc: PodClass,
    annotations: &'a BTreeMap<String, String>,
    warnings: &mut Vec<String>,
) -> Option<&'a str> {
    let a = annotations.get(ANNOTATION_EXTENDED_RESOURCE_SPEC)?;
    if pc.trusted || pc.kube == Some(KubeQos::BestEffort) {
        return Some(a);
    }
    warnings.push(format!(
        "{ANNOTATION_EXTENDED_RESOURCE_SPEC} ignored: the pod is {:?}, not BestEffort, and not trusted",
        pc.kube
    ));
    None
}

/// What kubelet asked for a container (its CRI resources), which qoslet's
/// decisions for an untrusted pod may narrow but never widen.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Requested<'a> {
    /// Memory limit in bytes (≤ 0: none).
    pub memory_limit: i64,
    /// CFS quota and period (quota ≤ 0: none).
    pub cpu_quota: i64,
    pub cpu_period: i64,
    /// The cpuset kubelet gave (its CPU manager; empty: none).
    pub cpuset_cpus: &'a str,
    /// kubelet's `oom_score_adj` (0: unknown): a Burstable container's memory
    /// request to within node memory / 1000 ([`kubelet_memory_request`]).
    pub oom_score_adj: i64,
    /// The pod's CPU limit in milli-cores (its sandbox's; 0: unknown): an
    /// untrusted pod's binding is sized by it, as the scheduler sizes the
    /// pod's one cpuset for all its containers.
    pub pod_milli_cpu: u64,
}

impl Requested<'_> {
    /// The CPU limit in milli-cores, if kubelet set one.
    fn milli_cpu(&self) -> Option<u64> {
        (self.cpu_quota > 0 && self.cpu_period > 0)
            .then(|| (self.cpu_quota as u64).saturating_mul(1000) / self.cpu_period as u64)
    }
}

fn nonzero(v: u64) -> Option<u64> {
    (v > 0).then_some(v)
}

fn min_opt(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// What decisions depend on besides the pod: the host and the policy.
#[derive(Debug, Clone, Copy)]
pub struct Context<'a> {
    pub features: &'a Features,
    /// cgroup v2 (memory QoS travels in CRI `unified`) or v1 (written after start).
    pub v2: bool,
    pub policy: &'a ResourceQosStrategy,
    pub page_size: u64,
    pub node: &'a NodeFacts,
    /// The policy's block device names resolved on this host (`/dev/vda` -> 254:0);
    /// a name missing here could not be resolved.
    pub devices: &'a BTreeMap<String, Device>,
    /// The LS share pool; `None`: not known here, and then no container is
    /// placed on it.
    pub share_pool: Option<SharePool<'a>>,
}

/// The LS share pool as decisions place containers on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SharePool<'a> {
    /// The CPUs no LSE/LSR pod is bound to ([`share_pool`]).
    pub cpus: &'a BTreeSet<u32>,
    /// Every CPU a container may run on now (online, and on cgroup v1 within
    /// its pod's cpuset): the pool is taken within it, and a pool that is all
    /// of it pins nothing.
    pub whole: &'a BTreeSet<u32>,
    /// Carry the pool even when it is all of `whole` (UpdateContainerResources:
    /// containerd re-applies the cpuset its spec kept from an earlier patch
    /// when kubelet's update carries none).
    pub explicit: bool,
}

/// What the sandbox config asked for the whole pod (kubelet's sum of its
/// containers' limits, `LinuxPodSandboxConfig.resources`; 0: none).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SandboxLimits {
    pub memory_limit: i64,
    /// CFS quota and period (quota ≤ 0: none).
    pub cpu_quota: i64,
    pub cpu_period: i64,
}

impl SandboxLimits {
    fn requested(&self) -> Requested<'static> {
        Requested {
            memory_limit: self.memory_limit,
            cpu_quota: self.cpu_quota,
            cpu_period: self.cpu_period,
            cpuset_cpus: "",
            oom_score_adj: 0,
            pod_milli_cpu: 0,
        }
    }

    /// The pod's CPU limit in milli-cores (0: none known).
    pub fn milli_cpu(&self) -> u64 {
        self.requested().milli_cpu().unwrap_or(0)
    }
}

/// A Burstable container's memory request as kubelet's `oom_score_adj` gives
/// it away (`GetContainerOOMScoreAdjust`: 1000 - 1000 x request / node
/// memory, kept within 3..=999): between (1000 - adj) and (1001 - adj)
/// thousandths of the node's memory (999 also stands for any request below a
/// thousandth; 3 for any above 99.7 %), no more than its limit. `None`: not a
/// Burstable value (Guaranteed and critical pods get -997, BestEffort 1000)
/// or the node's memory unknown.
pub fn kubelet_memory_request(
    adj: i64,
    node_memory: u64,
    limit: Option<u64>,
) -> Option<MemRequest> {
    if !(3..=999).contains(&adj) || node_memory == 0 {
        return None;
    }
    let at = |k: i64| (node_memory as u128 * k as u128 / 1000) as u64;
    let (lo, hi) = match adj {
        999 => (0, at(2)),
        3 => (at(997), node_memory),
        a => (at(1000 - a), at(1001 - a)),
    };
    let cap = |v: u64| limit.map_or(v, |l| v.min(l));
    Some(MemRequest {
        lo: cap(lo),
        hi: cap(hi),
    })
}

/// What memory QoS takes as a container's request: a Guaranteed pod's limit
/// (LSE/LSR outside kubepods too), a Burstable one's from kubelet's
/// `oom_score_adj`; `None`: unknown (a BestEffort pod's comes from its batch
/// resources).
fn container_memory_request(pc: PodClass, r: &Requested, node_memory: u64) -> Option<MemRequest> {
    let limit = (r.memory_limit > 0).then_some(r.memory_limit as u64);
    match pc.kube {
        Some(KubeQos::Guaranteed) => limit.map(MemRequest::exact),
        None if matches!(pc.class, QosClass::Lse | QosClass::Lsr) => limit.map(MemRequest::exact),
        Some(KubeQos::Burstable) => kubelet_memory_request(r.oom_score_adj, node_memory, limit),
        _ => None,
    }
}

/// The kernel's CFS period when kubelet gave none, in µs.
const DEFAULT_CFS_PERIOD_US: u64 = 100_000;

/// CPUs a container is bound to, and a warning when the annotation asked for more.
pub type Bound = (BTreeSet<u32>, Option<String>);

/// The CPUs a container of an LSE/LSR pod is bound to by its pod's
/// resource-status annotation, as this pod may have them ([`bound_cpus`]'s
/// rules), with a warning when narrowed; `Ok(None)`: not bound.
pub fn binding(
    pc: PodClass,
    pod_annotations: &BTreeMap<String, String>,
    requested: &Requested,
    node: &NodeFacts,
) -> Result<Option<Bound>, String> {
    if !matches!(pc.class, QosClass::Lse | QosClass::Lsr) {
        return Ok(None);
    }
    let Some(a) = pod_annotations.get(ANNOTATION_RESOURCE_STATUS) else {
        return Ok(None);
    };
    bound_cpus(a, pc, requested, node)
}

/// The LS share pool as koordlet's states informer computes it
/// (`calCPUSharePools`): `online` without every CPU a pod is bound to.
/// kubelet's reserved CPUs stay in it (koordlet's `calcNodeTopo`: Burstable
/// pods must keep somewhere to run). `bound`: the [`binding`]s of the LSE/LSR
/// pods ([`pod_binding`]) and of their running containers.
pub fn share_pool(
    online: &BTreeSet<u32>,
    bound: impl IntoIterator<Item = BTreeSet<u32>>,
) -> BTreeSet<u32> {
    let mut pool = online.clone();
    for b in bound {
        pool.retain(|c| !b.contains(c));
    }
    pool
}

/// The CPUs an LSE/LSR pod is bound to as a whole, by the same rules as its
/// containers' with the sandbox's limits ([`binding`]): what keeps its CPUs
/// out of the share pool while a container of it is not running (created,
/// restarting after a crash).
pub fn pod_binding(
    pc: PodClass,
    pod_annotations: &BTreeMap<String, String>,
    sandbox: &SandboxLimits,
    node: &NodeFacts,
) -> Option<BTreeSet<u32>> {
    binding(pc, pod_annotations, &sandbox.requested(), node)
        .ok()
        .flatten()
        .map(|(cpus, _)| cpus)
}

/// Every binding of one pod: the pod's own ([`pod_binding`]) and its
/// containers' ([`binding`], each with the pod's CPU limit), the CPUs that
/// leave the share pool. `containers`: what kubelet asked for each running one.
pub fn pod_bindings<'a>(
    pc: PodClass,
    pod_annotations: &BTreeMap<String, String>,
    sandbox: &SandboxLimits,
    containers: impl IntoIterator<Item = Requested<'a>>,
    node: &NodeFacts,
) -> Vec<BTreeSet<u32>> {
    let pod_milli_cpu = sandbox.milli_cpu();
    pod_binding(pc, pod_annotations, sandbox, node)
        .into_iter()
        .chain(containers.into_iter().filter_map(|r| {
            let r = Requested { pod_milli_cpu, ..r };
            binding(pc, pod_annotations, &r, node)
                .ok()
                .flatten()
                .map(|(cpus, _)| cpus)
        }))
        .collect()
}

/// The CFS quota a container bound to `cpus` may run without: koordlet
/// unsets it for any pod with a cpuset (`UnsetContainerCPUQuota`,
/// `UnsetPodCPUQuota`: `IsPodCfsQuotaNeedUnset`); for an untrusted pod only
/// when the CPUs it is bound to are no more than its CPU limit, so the
/// binding alone keeps it within what kubelet gave it. `Err`: why it stays.
fn unset_quota(pc: PodClass, cpus: &BTreeSet<u32>, requested: &Requested) -> Result<Knob, String> {
    let period = u64::try_from(requested.cpu_period)
        .ok()
        .filter(|p| *p > 0)
        .unwrap_or(DEFAULT_CFS_PERIOD_US);
    if !pc.trusted {
        let Some(milli) = requested.milli_cpu() else {
            return Err("no CPU limit to compare the binding with".into());
        };
        if cpus.len() as u64 * 1000 > milli {
            return Err(format!(
                "{} CPUs bound are more than the CPU limit {milli}m; CFS quota kept",
                cpus.len()
            ));
        }
    }
    Ok(Knob::CpuQuota {
        quota: None,
        period,
    })
}

/// Resource fields qoslet overrides in CRI `LinuxContainerResources`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResourcePatch {
    pub cpu_shares: Option<i64>,
    pub cpu_quota: Option<i64>,
    pub cpu_period: Option<i64>,
    pub memory_limit_in_bytes: Option<i64>,
    pub cpuset_cpus: Option<String>,
    /// cgroup v2 keys the runtime writes (`memory.min`, `memory.low`, `memory.high`).
    pub unified: BTreeMap<String, String>,
}

impl ResourcePatch {
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

/// How a decided setting reaches the container: the one type the hooks, the
/// engine's reconcile, `explain` and (next) the NRI plane read. A new QoS
/// setting is a [`Knob`] (the cgroups crate) decided here, and nowhere else.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Carried in the CRI request (CreateContainer, and again in kubelet's
    /// UpdateContainerResources): the runtime writes it at create.
    Cri(Knob),
    /// Written by qoslet into the cgroup: the pod's after RunPodSandbox, a
    /// container's after StartContainer (what CRI cannot carry).
    Cgroup(Knob),
    /// The container's tasks joined to its class's resctrl group after StartContainer.
    Resctrl(Resctrl),
}

/// A class's resctrl group as a container joins it (`resctrlQOS`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resctrl {
    pub class: QosClass,
    pub cat_range_start_percent: u32,
    pub cat_range_end_percent: u32,
    pub mba_percent: u32,
}

/// One decision with the rule behind it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub action: Action,
    /// Why, in words (`BE with batch-cpu limit 2000m`).
    pub because: String,
}

impl Decision {
    /// The cgroup setting, however it travels (`None` for resctrl).
    pub fn knob(&self) -> Option<&Knob> {
        match &self.action {
            Action::Cri(k) | Action::Cgroup(k) => Some(k),
            Action::Resctrl(_) => None,
        }
    }

    /// The setting's name and value: what qoslet writes itself as this host's
    /// layout names it (`cpu.cfs_quota_us` = `50000` on v1, `cpu.max` =
    /// `50000 100000` on v2); what CRI carries as CRI's fields are (v1-shaped:
    /// shares, quota, limit, whatever the runtime converts them to on v2, and
    /// `unified`'s own v2 keys).
    pub fn setting(&self, v2: bool) -> (String, String) {
        match &self.action {
            Action::Cri(k) => k.describe(false),
            Action::Cgroup(k) => k.describe(v2),
            Action::Resctrl(r) => (
                "resctrl".into(),
                format!(
                    "class {}: L3 {}-{}%, MB {}%",
                    r.class.as_str(),
                    r.cat_range_start_percent,
                    r.cat_range_end_percent,
                    r.mba_percent
                ),
            ),
        }
    }
}

/// What qoslet does to one container.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ContainerDecision {
    pub decisions: Vec<Decision>,
    /// Input problems, for a logged warning (the container runs as kubelet asked).
    pub warnings: Vec<String>,
}

impl ContainerDecision {
    /// The CRI-carried settings as the resource fields the runtime takes
    /// (CreateContainer, UpdateContainerResources; NRI's container adjustment
    /// has the same fields). Pure.
    pub fn patch(&self) -> ResourcePatch {
        let mut p = ResourcePatch::default();
        let int = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        for d in &self.decisions {
            let Action::Cri(k) = &d.action else { continue };
            match k {
                Knob::CpuShares(s) => p.cpu_shares = Some(int(*s)),
                Knob::CpuQuota { quota, period } => {
                    p.cpu_quota = Some(quota.map(int).unwrap_or(-1));
                    p.cpu_period = Some(int(*period));
                }
                Knob::MemoryLimit(m) => p.memory_limit_in_bytes = Some(m.map(int).unwrap_or(0)),
                Knob::CpusetCpus(c) => p.cpuset_cpus = Some(c.clone()),
                Knob::MemoryMin(_) | Knob::MemoryLow(_) | Knob::MemoryHigh(_) => {
                    let (file, value) = k.describe(true);
                    p.unified.insert(file, value);
                }
                // never decided via CRI: CRI has no field for them
                Knob::CpuIdle(_)
                | Knob::GroupIdentity(_)
                | Knob::CpuBurst(_)
                | Knob::IoLimit { .. }
                | Knob::MemoryTune(..) => {}
            }
        }
        p
    }

    /// The knobs qoslet writes into the container's cgroup after start.
    pub fn cgroup(&self) -> Vec<Knob> {
        cgroup_knobs(&self.decisions)
    }

    /// The resctrl group the container joins after start, if any.
    pub fn resctrl(&self) -> Option<Resctrl> {
        self.decisions.iter().find_map(|d| match d.action {
            Action::Resctrl(r) => Some(r),
            _ => None,
        })
    }
}

/// What qoslet does to a pod's own cgroup (the sandbox's cgroup parent): every
/// decision is [`Action::Cgroup`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodDecision {
    pub decisions: Vec<Decision>,
    /// Input problems, for a logged warning.
    pub warnings: Vec<String>,
}

impl PodDecision {
    pub fn cgroup(&self) -> Vec<Knob> {
        cgroup_knobs(&self.decisions)
    }
}

fn cgroup_knobs(ds: &[Decision]) -> Vec<Knob> {
    ds.iter()
        .filter_map(|d| match &d.action {
            Action::Cgroup(k) => Some(k.clone()),
            _ => None,
        })
        .collect()
}

/// The feature a decided setting belongs to (the engine's plugin name for
/// the settings the hooks decide, in `qoslet plan` and its gauges).
pub fn feature(k: &Knob) -> Plugin {
    match k {
        Knob::CpuIdle(_) | Knob::GroupIdentity(_) => Plugin::CpuQos,
        Knob::MemoryMin(_) | Knob::MemoryLow(_) | Knob::MemoryHigh(_) | Knob::MemoryTune(..) => {
            Plugin::MemoryQos
        }
        Knob::IoLimit { .. } => Plugin::Blkio,
        Knob::CpusetCpus(_) => Plugin::Cpuset,
        Knob::CpuShares(_) | Knob::CpuQuota { .. } | Knob::MemoryLimit(_) => Plugin::BatchResources,
        Knob::CpuBurst(_) => Plugin::CpuBurst,
    }
}

/// What wants a setting: a feature of the hooks' decisions, or a plugin of
/// the QoS engine (`qoslet plan --plugin` takes these names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Plugin {
    CpuSuppress,
    CpuBurst,
    CpuQos,
    MemoryQos,
    BatchResources,
    Cpuset,
    Blkio,
    /// The engine putting back what it no longer plans.
    Restore,
}

impl Plugin {
    pub const ALL: [Plugin; 8] = [
        Plugin::CpuSuppress,
        Plugin::CpuBurst,
        Plugin::CpuQos,
        Plugin::MemoryQos,
        Plugin::BatchResources,
        Plugin::Cpuset,
        Plugin::Blkio,
        Plugin::Restore,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Plugin::CpuSuppress => "cpu-suppress",
            Plugin::CpuBurst => "cpu-burst",
            Plugin::CpuQos => "cpu-qos",
            Plugin::MemoryQos => "memory-qos",
            Plugin::BatchResources => "batch-resources",
            Plugin::Cpuset => "cpuset",
            Plugin::Blkio => "blkio",
            Plugin::Restore => "restore",
        }
    }

    /// The plugin of a name (`None`: no such plugin).
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.as_str() == name)
    }
}

impl std::fmt::Display for Plugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

fn cri(knob: Knob, because: impl Into<String>) -> Decision {
    Decision {
        action: Action::Cri(knob),
        because: because.into(),
    }
}

fn cgroup(knob: Knob, because: impl Into<String>) -> Decision {
    Decision {
        action: Action::Cgroup(knob),
        because: because.into(),
    }
}

/// Whether koordlet's group identity rule is on: `cpuPolicy: groupIdentity`
/// and some class's cpuQOS enabled (groupidentity `parseRule`: `enable`).
/// While it is off, qoslet plans no group identity at all (a value it set
/// before is written back to 0 by the executor when it leaves the plan), so it
/// does not fight an operator's own settings.
pub fn group_identity_on(policy: &ResourceQosStrategy) -> bool {
    policy.cpu_policy == CpuPolicy::GroupIdentity
        && [&policy.lsr_class, &policy.ls_class, &policy.be_class]
            .iter()
            .any(|c| c.cpu_qos.enable)
}

/// A pod's group identity (`cpu.bvt_warp_ns`) as koordlet sets it
/// (groupidentity `bvtRule.getPodBvtValue`): its labelled class's
/// `groupIdentity` when that class's cpuQOS is on, else 0; a pod without a
/// class label, and a SYSTEM pod (koordlet has no class entry for either),
/// takes its Kubernetes QoS's value (Guaranteed: LSR's if on, else LS's).
pub fn group_identity(pc: PodClass, policy: &ResourceQosStrategy) -> (i64, String) {
    if policy.cpu_policy != CpuPolicy::GroupIdentity {
        return (0, "cpuPolicy is not groupIdentity".into());
    }
    let of = |c: QosClass| {
        let q = &policy.of(c).cpu_qos;
        q.enable.then_some(q.group_identity)
    };
    let by_kube = pc.class == QosClass::System || !pc.by_label;
    let (v, from) = match (by_kube, pc.class) {
        (true, _) => match pc.kube {
            Some(KubeQos::Guaranteed) => match (of(QosClass::Lsr), of(QosClass::Ls)) {
                (Some(v), _) => (Some(v), QosClass::Lsr),
                (None, v) => (v, QosClass::Ls),
            },
            Some(KubeQos::Burstable) => (of(QosClass::Ls), QosClass::Ls),
            Some(KubeQos::BestEffort) => (of(QosClass::Be), QosClass::Be),
            None => (None, pc.class),
        },
        (false, c) => (of(c), c),
    };
    match v {
        Some(v) => (
            v,
            format!("cpuQOS.groupIdentity of class {}", from.as_str()),
        ),
        None => (0, format!("cpuQOS off for class {}", from.as_str())),
    }
}

/// A pod's own CPU QoS (`{"enable": true, "groupIdentity": -1}`), which
/// koordlet's group identity hook takes over the class's for pods labelled LS
/// (groupidentity `SetPodBvtValue`: "only allow LS change to BE").
pub const ANNOTATION_CPU_QOS: &str = "koordinator.sh/cpuQOS";
/// A pod's own memory QoS (`{"policy": "none"}`, or fields over the class's).
pub const ANNOTATION_MEMORY_QOS: &str = "koordinator.sh/memoryQOS";
/// A pod-level JSON annotation longer than this is refused unread.
pub const MAX_QOS_ANNOTATION_BYTES: usize = 4 << 10;

/// Reads a pod's JSON QoS annotation (`None`: absent).
fn qos_annotation<T: serde::de::DeserializeOwned>(
    annotations: &BTreeMap<String, String>,
    key: &str,
) -> Result<Option<T>, String> {
    let Some(a) = annotations.get(key) else {
        return Ok(None);
    };
    if a.len() > MAX_QOS_ANNOTATION_BYTES {
        return Err(format!(
            "{key}: {} bytes, over the {MAX_QOS_ANNOTATION_BYTES}-byte cap; ignored",
            a.len()
        ));
    }
    serde_json::from_str(a)
        .map(Some)
        .map_err(|e| format!("{key}: {e}; ignored"))
}

/// The group identity a pod labelled LS asks for itself with
/// [`ANNOTATION_CPU_QOS`] over `class_value` (koordlet: `groupIdentity` when
/// given, 0 unless `enable` is true). An untrusted pod may only lower it (the
/// value koordlet allows, LS to BE, is a lowering). `Ok(None)`: not asked, or
/// not an LS-labelled pod.
fn pod_cpu_qos(
    pc: PodClass,
    annotations: &BTreeMap<String, String>,
    class_value: i64,
) -> Result<Option<(i64, String)>, String> {
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct CpuQos {
        enable: Option<bool>,
        group_identity: Option<i64>,
    }
    if !(pc.by_label && pc.class == QosClass::Ls) {
        return Ok(None);
    }
    let Some(c) = qos_annotation::<CpuQos>(annotations, ANNOTATION_CPU_QOS)? else {
        return Ok(None);
    };
    if let Some(g) = c.group_identity.filter(|g| !(-1..=2).contains(g)) {
        return Err(format!(
            "{ANNOTATION_CPU_QOS}: groupIdentity {g} is not -1..=2; ignored"
        ));
    }
    let asked = match (c.enable, c.group_identity) {
        (Some(true), Some(g)) => g,
        (Some(true), None) => class_value,
        _ => 0,
    };
    Ok(Some(if pc.trusted || asked <= class_value {
        (asked, format!("the pod's {ANNOTATION_CPU_QOS}: {asked}"))
    } else {
        (
            class_value,
            format!(
                "the pod's {ANNOTATION_CPU_QOS} asks {asked}, above its class's: an untrusted pod only lowers it"
            ),
        )
    }))
}

/// A pod's memory QoS: its class's, with what its [`ANNOTATION_MEMORY_QOS`]
/// asks over it as koordlet's `mergePodResourceQoSForMemoryQoS` takes it
/// (`policy: none` turns it off for the pod; `auto` starts from Koordinator's
/// defaults for its class; the fields given replace the class's, and turn it
/// on). An untrusted pod may only turn it off or lower what protects it
/// (min/low percent, priority), throttle itself earlier (throttlingPercent,
/// 1 or more), or reclaim earlier (wmarkMinAdj up); anything else it asks is
/// ignored with a warning.
pub fn pod_memory_qos(
    pc: PodClass,
    annotations: &BTreeMap<String, String>,
    policy: &ResourceQosStrategy,
    warnings: &mut Vec<String>,
) -> MemoryQos {
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Pod {
        #[serde(default)]
        policy: String,
        min_limit_percent: Option<i64>,
        low_limit_percent: Option<i64>,
        throttling_percent: Option<i64>,
        wmark_ratio: Option<i64>,
        wmark_scale_permill: Option<i64>,
        wmark_min_adj: Option<i64>,
        priority_enable: Option<i64>,
        priority: Option<i64>,
        oom_kill_group: Option<i64>,
    }
    let class = policy.of(pc.class).memory_qos.clone();
    let p = match qos_annotation::<Pod>(annotations, ANNOTATION_MEMORY_QOS) {
        Ok(Some(p)) => p,
        Ok(None) => return class,
        Err(e) => {
            warnings.push(e);
            return class;
        }
    };
    let off = MemoryQos {
        enable: false,
        ..class.clone()
    };
    let base = match p.policy.as_str() {
        "none" if pc.trusted => return off,
        // an untrusted pod's "none" drops what protects it, not what holds it
        // back (memory.high, an earlier reclaim, its OOM priority)
        "none" => {
            return MemoryQos {
                min_limit_percent: 0,
                low_limit_percent: 0,
                ..class
            }
        }
        "" | "default" => class.clone(),
        "auto" if !pc.trusted => {
            warnings.push(format!(
                "{ANNOTATION_MEMORY_QOS}: policy auto ignored (Koordinator's defaults may not hold a pod back as its class does; an untrusted pod only lowers it)"
            ));
            class.clone()
        }
        "auto" => MemoryQos {
            enable: class.enable,
            ..ResourceQosStrategy::default()
                .of(pc.class)
                .memory_qos
                .clone()
        },
        other => {
            warnings.push(format!(
                "{ANNOTATION_MEMORY_QOS}: policy {other:?} is not none, default or auto; ignored"
            ));
            return class;
        }
    };
    let mut q = base;
    let mut ignored = Vec::new();
    {
        let mut take =
            |dst: &mut i64, v: Option<i64>, name: &str, lowers: &dyn Fn(i64, i64) -> bool| {
                let Some(v) = v else { return };
                if pc.trusted || (class.enable && lowers(v, *dst)) {
                    *dst = v;
                } else {
                    ignored.push(name.to_string());
                }
            };
        let le = |v: i64, cur: i64| v <= cur;
        take(
            &mut q.min_limit_percent,
            p.min_limit_percent,
            "minLimitPercent",
            &le,
        );
        take(
            &mut q.low_limit_percent,
            p.low_limit_percent,
            "lowLimitPercent",
            &le,
        );
        take(&mut q.priority, p.priority, "priority", &le);
        take(
            &mut q.throttling_percent,
            p.throttling_percent,
            "throttlingPercent",
            &|v, cur| v >= 1 && (cur == 0 || v <= cur),
        );
        take(
            &mut q.wmark_min_adj,
            p.wmark_min_adj,
            "wmarkMinAdj",
            &|v, cur| v >= cur,
        );
        let never = |_: i64, _: i64| false;
        take(&mut q.wmark_ratio, p.wmark_ratio, "wmarkRatio", &never);
        take(
            &mut q.wmark_scale_permill,
            p.wmark_scale_permill,
            "wmarkScalePermill",
            &never,
        );
        take(
            &mut q.priority_enable,
            p.priority_enable,
            "priorityEnable",
            &never,
        );
        take(
            &mut q.oom_kill_group,
            p.oom_kill_group,
            "oomKillGroup",
            &never,
        );
    }
    let asked = [
        p.min_limit_percent,
        p.low_limit_percent,
        p.throttling_percent,
        p.wmark_ratio,
        p.wmark_scale_permill,
        p.wmark_min_adj,
        p.priority_enable,
        p.priority,
        p.oom_kill_group,
    ]
    .iter()
    .any(Option::is_some);
    // the pod's own fields turn memory QoS on for it (koordlet: they replace
    // the class's, whether or not the class has it on); an untrusted pod's only lower
    if pc.trusted && asked {
        q.enable = true;
    }
    if !ignored.is_empty() {
        warnings.push(format!(
            "{ANNOTATION_MEMORY_QOS}: {} would raise the pod's memory QoS above its class's (an untrusted pod only lowers it); ignored",
            ignored.join(", ")
        ));
    }
    let pct_ok = [
        q.min_limit_percent,
        q.low_limit_percent,
        q.throttling_percent,
    ]
    .iter()
    .all(|v| (0..=100).contains(v));
    if let Some((t, v, f)) = q
        .tunes()
        .into_iter()
        .find(|(t, v, _)| !t.range().contains(v))
    {
        warnings.push(format!(
            "{ANNOTATION_MEMORY_QOS}: {f} {v} is outside {:?} ({}); ignored",
            t.range(),
            t.file()
        ));
        return class;
    }
    if !pct_ok {
        warnings.push(format!(
            "{ANNOTATION_MEMORY_QOS}: a percentage is outside 0-100; ignored"
        ));
        return class;
    }
    q
}

/// The group identity of the kube QoS dirs (`kubepods` 0, burstable the LS
/// value, besteffort the BE value), as koordlet's `kubeQOSDirParams`, and
/// whether each is SCHED_IDLE under `cpuPolicy: coreSched` (koordlet's
/// core_sched `IsKubeQOSCPUIdle`: a class with `schedIdle: 1`; the
/// Guaranteed dir follows LSR when LSR's cpuQOS is on, else LS).
pub fn kube_qos_dirs(policy: &ResourceQosStrategy) -> [(KubeQos, i64, bool); 3] {
    let gi = |c: QosClass| {
        let q = &policy.of(c).cpu_qos;
        if policy.cpu_policy == CpuPolicy::GroupIdentity && q.enable {
            q.group_identity
        } else {
            0
        }
    };
    let idle = |c: QosClass| {
        policy.cpu_policy == CpuPolicy::CoreSched && policy.of(c).cpu_qos.sched_idle == 1
    };
    let guaranteed = if policy.lsr_class.cpu_qos.enable {
        QosClass::Lsr
    } else {
        QosClass::Ls
    };
    [
        (KubeQos::Guaranteed, 0, idle(guaranteed)),
        (KubeQos::Burstable, gi(QosClass::Ls), idle(QosClass::Ls)),
        (KubeQos::BestEffort, gi(QosClass::Be), idle(QosClass::Be)),
    ]
}

/// CPU group identity settings for a pod or container: bvt where the kernel
/// has it, while koordlet's rule is on ([`group_identity_on`]; 0 for classes
/// that are off); otherwise, on kernels with `cpu.idle` (qoslet's addition for
/// upstream kernels, where koordlet does nothing), SCHED_IDLE for BE pods
/// whose class has cpuQOS on with a negative group identity. What is no
/// longer planned is written back to 0 by the engine's executor.
///
/// `cpu.idle` goes on the pod's cgroup only: the kernel refuses cpu.shares
/// writes (EINVAL) on an idle cgroup, and the runtime writes the container's
/// shares at every UpdateContainerResources; an idle pod cgroup makes all its
/// containers yield just the same.
fn identity(
    pc: PodClass,
    annotations: &BTreeMap<String, String>,
    ctx: &Context,
    pod_level: bool,
    out: &mut Vec<Decision>,
    warnings: &mut Vec<String>,
) {
    if ctx.features.bvt {
        if group_identity_on(ctx.policy) {
            let (v, why) = group_identity(pc, ctx.policy);
            let (v, why) = match pod_cpu_qos(pc, annotations, v) {
                Ok(Some((v2, how))) => (v2, format!("{why}; {how}")),
                Ok(None) => (v, why),
                Err(e) => {
                    warnings.push(e);
                    (v, why)
                }
            };
            out.push(cgroup(Knob::GroupIdentity(v), why));
        }
    } else if pc.class == QosClass::Be && ctx.features.cpu_idle && pod_level {
        let q = &ctx.policy.be_class.cpu_qos;
        if ctx.policy.cpu_policy == CpuPolicy::GroupIdentity && q.enable && q.group_identity < 0 {
            out.push(cgroup(
                Knob::CpuIdle(true),
                "BE runs SCHED_IDLE (no bvt on this kernel)",
            ));
        }
    }
}

/// The pod-level decision, applied to the pod's own cgroup (the sandbox's
/// cgroup parent) after RunPodSandbox: group identity; for BE pods with batch
/// resources the pod's CFS quota, shares and memory limit (the sum of its
/// containers'); memory QoS where the pod's memory request is known (BE batch
/// memory, or a guaranteed pod's limit from the sandbox config); the CFS quota
/// unset for a pod bound to CPUs; and the class's block I/O limits.
/// `sandbox`: what the sandbox config asked for the whole pod.
pub fn pod(
    pc: PodClass,
    pod_annotations: &BTreeMap<String, String>,
    sandbox: &SandboxLimits,
    ctx: &Context,
) -> PodDecision {
    let class = pc.class;
    let sandbox_memory_limit = sandbox.memory_limit;
    let mut d = PodDecision::default();
    let mq = pod_memory_qos(pc, pod_annotations, ctx.policy, &mut d.warnings);
    identity(
        pc,
        pod_annotations,
        ctx,
        true,
        &mut d.decisions,
        &mut d.warnings,
    );
    // a pod bound to CPUs runs without its CFS quota (the pod's own cgroup is
    // kubelet's: qoslet writes it; a wrong annotation is the containers' warning)
    if let Ok(Some((cpus, _))) = binding(pc, pod_annotations, &sandbox.requested(), ctx.node) {
        match unset_quota(pc, &cpus, &sandbox.requested()) {
            Ok(k) => d.decisions.push(cgroup(
                k,
                format!(
                    "{} pod bound to CPUs {}: CFS quota unset (koordlet's UnsetPodCPUQuota)",
                    class.as_str(),
                    format_cpu_list(&cpus)
                ),
            )),
            Err(why) => d.warnings.push(format!("pod: {why}")),
        }
    }
    let mut memory_request = None;
    if class == QosClass::Be {
        if let Some(a) = batch_annotation(pc, pod_annotations, &mut d.warnings) {
            match parse_spec(a) {
                Ok(parsed) if !parsed.containers.is_empty() => {
                    let spec = parsed.containers;
                    let caps = Caps {
                        milli_cpu: nonzero(ctx.node.milli_cpus),
                        memory: nonzero(ctx.node.memory_bytes),
                    };
                    let (total, warnings) = pod_total(&spec).bounded(&caps);
                    d.warnings
                        .extend(warnings.into_iter().map(|w| format!("pod: {w}")));
                    let r = total.resources();
                    // an idle (SCHED_IDLE) cgroup has no weight: the kernel refuses
                    // shares writes on it, and its containers' shares still apply
                    let idle = d.cgroup().contains(&Knob::CpuIdle(true));
                    if let (Some(s), false) = (r.cpu_shares, idle) {
                        d.decisions.push(cgroup(
                            Knob::CpuShares(s),
                            format!(
                                "BE pod: batch-cpu requests {}m in all",
                                total.cpu_request_milli.unwrap_or(0)
                            ),
                        ));
                    }
                    if let Some(q) = r.cpu_quota {
                        d.decisions.push(cgroup(
                            Knob::CpuQuota {
                                quota: Some(q),
                                period: r.cpu_period,
                            },
                            format!(
                                "BE pod: batch-cpu limits {}m in all",
                                total.cpu_limit_milli.unwrap_or(0)
                            ),
                        ));
                    }
                    if let Some(m) = r.memory_limit {
                        d.decisions.push(cgroup(
                            Knob::MemoryLimit(Some(m)),
                            "BE pod: batch-memory limits in all",
                        ));
                    }
                    // memory protection (min/low) from a batch request is a raise: trusted pods only
                    memory_request = total
                        .memory_request
                        .filter(|_| pc.trusted)
                        .map(|r| (r, total.memory_limit));
                }
                Ok(_) => {}
                Err(e) => d.warnings.push(format!("{e}; batch resources ignored")),
            }
        }
    }
    // a Guaranteed pod requests what it limits (a Burstable pod's sum is the
    // engine's, from its containers')
    let guaranteed = pc.kube == Some(KubeQos::Guaranteed)
        || (pc.kube.is_none() && matches!(class, QosClass::Lse | QosClass::Lsr));
    if class != QosClass::Be && guaranteed && sandbox_memory_limit > 0 {
        let l = sandbox_memory_limit as u64;
        memory_request = Some((l, Some(l)));
    }
    // the pod's own cgroup is not the runtime's: qoslet writes it on v1 and v2 alike
    if let Some(settings) = memory_request
        .and_then(|(req, lim)| memory_qos_settings(class, &mq, MemRequest::exact(req), lim, ctx))
    {
        if ctx.features.memory_qos {
            d.decisions
                .extend(settings.into_iter().map(|(k, why)| cgroup(k, why)));
        } else {
            d.warnings
                .push(format!("{NO_MEMORY_QOS}; pod level skipped"));
        }
    }
    d.decisions.extend(memory_tunes(class, &mq, ctx));
    blkio(class, ctx, &mut d);
    d
}

/// The Anolis memory files memory QoS sets to the class's values (wmark,
/// priority, OOM group), on pods and containers alike, where the kernel has
/// each; none while the class has memory QoS off (koordlet then writes its
/// `NoneMemoryQOS`: the executor puts each back to that).
pub fn memory_tunes(class: QosClass, q: &MemoryQos, ctx: &Context) -> Vec<Decision> {
    if !q.enable {
        return Vec::new();
    }
    q.tunes()
        .into_iter()
        .filter(|(t, _, _)| ctx.features.memory_tunes.has(*t))
        // oomKillGroup 0 leaves memory.oom.group as it is: kubelet (>= 1.28, v2)
        // sets 1 on containers, and koordlet's 0 would undo it
        .filter(|(t, v, _)| *t != qoslet_cgroups::MemTune::OomGroup || *v == 1)
        .map(|(t, v, f)| {
            cgroup(
                Knob::MemoryTune(t, v),
                format!("{} memoryQOS.{f} {v}", class.as_str()),
            )
        })
        .collect()
}

/// The class's block I/O limits (`blkioQOS`), per device the host has.
fn blkio(class: QosClass, ctx: &Context, d: &mut PodDecision) {
    let q = &ctx.policy.of(class).blkio_qos;
    if !q.enable {
        return;
    }
    if !ctx.features.blkio_throttle {
        d.warnings.push(
            "blkioQOS is enabled but this host has no blkio throttling / io controller; skipped"
                .into(),
        );
        return;
    }
    // volume groups and pod volumes need the pod's volume spec, which CRI does not carry
    for b in q.blocks.iter().filter(|b| b.block_type == "device") {
        let Some(device) = ctx.devices.get(&b.name) else {
            d.warnings.push(format!(
                "blkioQOS device {:?} is not a block device on this host; skipped",
                b.name
            ));
            continue;
        };
        let limits = b.limits();
        if limits == qoslet_cgroups::IoLimits::default() {
            continue;
        }
        d.decisions.push(cgroup(
            Knob::IoLimit {
                device: *device,
                limits,
            },
            format!("{} blkioQOS for {}", class.as_str(), b.name),
        ));
    }
}

/// The container-level decision. `requested`: what kubelet asked for the
/// container; qoslet narrows it (batch resources are capped by kubelet's limits
/// and the node's capacity), never widens it.
pub fn container(
    pc: PodClass,
    container_name: &str,
    pod_annotations: &BTreeMap<String, String>,
    requested: &Requested,
    ctx: &Context,
) -> ContainerDecision {
    let class = pc.class;
    let mut d = ContainerDecision::default();
    let mq = pod_memory_qos(pc, pod_annotations, ctx.policy, &mut d.warnings);
    if class == QosClass::Be {
        if let Some(a) = batch_annotation(pc, pod_annotations, &mut d.warnings) {
            match parse_spec(a) {
                Ok(parsed) => {
                    for e in &parsed.bad {
                        d.warnings.push(format!("{e}; that value ignored"));
                    }
                    if let Some(b) = parsed.containers.get(container_name) {
                        let caps = Caps {
                            milli_cpu: min_opt(nonzero(ctx.node.milli_cpus), requested.milli_cpu()),
                            memory: min_opt(
                                nonzero(ctx.node.memory_bytes),
                                nonzero(requested.memory_limit.max(0) as u64),
                            ),
                        };
                        let (b, warnings) = b.bounded(&caps);
                        d.warnings.extend(warnings);
                        batch(&b, &mut d);
                        // memory protection (min/low) from a batch request is a raise: trusted only
                        if let Some(req) = b.memory_request.filter(|_| pc.trusted) {
                            memory(
                                class,
                                &mq,
                                MemRequest::exact(req),
                                b.memory_limit,
                                ctx,
                                &mut d,
                            );
                        }
                    }
                }
                Err(e) => d.warnings.push(format!("{e}; batch resources ignored")),
            }
        }
    }
    let bound = match binding(pc, pod_annotations, requested, ctx.node) {
        Ok(Some((cpus, narrowed))) => {
            let list = format_cpu_list(&cpus);
            let why = format!(
                "{} pod bound to CPUs {list} by {ANNOTATION_RESOURCE_STATUS}",
                class.as_str()
            );
            d.decisions.push(cri(Knob::CpusetCpus(list.clone()), why));
            d.warnings.extend(narrowed);
            match unset_quota(pc, &cpus, requested) {
                Ok(k) => d.decisions.push(cri(
                    k,
                    format!(
                        "bound to CPUs {list}: CFS quota unset (koordlet's UnsetContainerCPUQuota)"
                    ),
                )),
                Err(why) => d.warnings.push(why),
            }
            true
        }
        Ok(None) => false,
        Err(why) => {
            d.warnings.push(format!(
                "{ANNOTATION_RESOURCE_STATUS}: {why}; cpuset left as kubelet asked"
            ));
            false
        }
    };
    if !bound {
        shared_cpus(pc, pod_annotations, requested, ctx, &mut d);
    }
    // a Guaranteed pod requests what it limits, a Burstable one what kubelet's
    // oom_score_adj tells (BE's come from its batch resources, above)
    if class != QosClass::Be {
        if let Some(req) = container_memory_request(pc, requested, ctx.node.memory_bytes) {
            let limit = (requested.memory_limit > 0).then_some(requested.memory_limit as u64);
            memory(class, &mq, req, limit, ctx, &mut d);
        }
    }
    d.decisions.extend(memory_tunes(class, &mq, ctx));
    identity(
        pc,
        pod_annotations,
        ctx,
        false,
        &mut d.decisions,
        &mut d.warnings,
    );
    let q = &ctx.policy.of(class).resctrl_qos;
    if q.enable {
        d.decisions.push(Decision {
            action: Action::Resctrl(Resctrl {
                class,
                cat_range_start_percent: q.cat_range_start_percent,
                cat_range_end_percent: q.cat_range_end_percent,
                mba_percent: q.mba_percent,
            }),
            because: format!("resctrlQOS of class {}", class.as_str()),
        });
    }
    d
}

/// A container not bound to CPUs runs on the share pool, as koordlet's
/// cpuset rule (`getContainerCPUSet`) places it: a pod labelled LS always; a
/// pod of another class that is not BestEffort while kubelet gives no cpuset
/// (its CPU manager policy is `none`). Where kubelet gives a cpuset (the
/// static policy's shared pool), an LS pod gets the share pool within it and
/// any other keeps kubelet's (koordlet: "do nothing"). BE and BestEffort
/// pods keep what kubelet gave (koordlet clears a BestEffort pod's; qoslet's
/// cpuset suppress writes BE cpusets itself, and with suppress off kubelet's
/// shared pool keeps BE off Guaranteed pods' exclusive CPUs). Only while the
/// pool is smaller than the CPUs the container may use (a CPU is bound), or
/// when asked to carry it explicitly: otherwise pinning changes nothing.
fn shared_cpus(
    pc: PodClass,
    annotations: &BTreeMap<String, String>,
    requested: &Requested,
    ctx: &Context,
    d: &mut ContainerDecision,
) {
    let Some(p) = ctx.share_pool else {
        return;
    };
    // BE's cpusets are cpuset suppress's (the engine writes BE pods' cgroups:
    // a container cpuset outside its pod's is refused on v1)
    if pc.class == QosClass::Be || pc.kube == Some(KubeQos::BestEffort) {
        return;
    }
    let pool: BTreeSet<u32> = p.cpus.intersection(p.whole).copied().collect();
    // the scheduler's NUMA allocation (resource-status numaNodeResources with
    // CPU): the share pools of those nodes only (koordlet's isNUMAAware
    // branch, before any other rule; it only narrows, so any pod may ask it)
    if let Some(nodes) = numa_nodes(annotations) {
        let on: BTreeSet<u32> = nodes
            .iter()
            .filter_map(|n| ctx.node.numa.get(n))
            .flatten()
            .copied()
            .collect();
        if !on.is_empty() {
            let cpus: BTreeSet<u32> = pool.intersection(&on).copied().collect();
            let kubelet = parse_cpu_list(requested.cpuset_cpus.trim()).filter(|k| !k.is_empty());
            let cpus: BTreeSet<u32> = match kubelet {
                Some(k) => cpus.intersection(&k).copied().collect(),
                None => cpus,
            };
            if cpus.is_empty() {
                // nothing of those nodes left: the node-wide pool, as without it
                d.warnings.push(format!(
                    "the share pool of NUMA nodes {nodes:?} is empty; the whole share pool instead"
                ));
            } else if cpus != *p.whole || p.explicit {
                let list = format_cpu_list(&cpus);
                d.decisions.push(cri(
                    Knob::CpusetCpus(list.clone()),
                    format!(
                        "{} pod on the share pool of NUMA nodes {nodes:?} (its {ANNOTATION_RESOURCE_STATUS} numaNodeResources): CPUs {list}",
                        pc.class.as_str()
                    ),
                ));
                return;
            } else {
                return;
            }
        } else {
            d.warnings.push(format!(
                "{ANNOTATION_RESOURCE_STATUS}: NUMA nodes {nodes:?} are not this host's; the whole share pool instead"
            ));
        }
    }
    if pool == *p.whole && !p.explicit {
        return;
    }
    let ls = pc.by_label && pc.class == QosClass::Ls;
    let kubelet = requested.cpuset_cpus.trim();
    let (cpus, why) = if kubelet.is_empty() {
        (pool, "the share pool".to_string())
    } else if !ls {
        return;
    } else {
        let Some(k) = parse_cpu_list(kubelet) else {
            return;
        };
        (
            pool.intersection(&k).copied().collect(),
            format!("the share pool within kubelet's cpuset {kubelet}"),
        )
    };
    if cpus.is_empty() {
        d.warnings
            .push(format!("{why} is empty; cpuset left as kubelet asked"));
        return;
    }
    let list = format_cpu_list(&cpus);
    d.decisions.push(cri(
        Knob::CpusetCpus(list.clone()),
        format!(
            "{} pod on {why}: CPUs {list} (no LSE/LSR pod is bound to them)",
            pc.class.as_str()
        ),
    ));
}

/// Memory QoS (memory.min/low/high) of a cgroup whose memory request is
/// known, as knobs with their reasons; `None` when the class has it off.
fn memory_qos_settings(
    class: QosClass,
    q: &MemoryQos,
    request: MemRequest,
    limit: Option<u64>,
    ctx: &Context,
) -> Option<Vec<(Knob, String)>> {
    if !q.enable {
        return None;
    }
    let (min, low, high) = memory_qos(q, request, limit, ctx.node.memory_bytes, ctx.page_size);
    let req = if request.lo == request.hi {
        format!("request {}", request.lo)
    } else {
        format!(
            "request {}..{} (kubelet's oom_score_adj)",
            request.lo, request.hi
        )
    };
    let why = |f: &str, p: i64| format!("{} memoryQOS.{f} {p}% of {req}", class.as_str());
    let mut out = vec![
        (
            Knob::MemoryMin(min),
            why("minLimitPercent", q.min_limit_percent),
        ),
        (
            Knob::MemoryLow(low),
            why("lowLimitPercent", q.low_limit_percent),
        ),
    ];
    if high.is_some() {
        out.push((
            Knob::MemoryHigh(high),
            format!(
                "{} memoryQOS.throttlingPercent {}% between request and {}",
                class.as_str(),
                q.throttling_percent,
                if limit.is_some() {
                    "limit"
                } else {
                    "node memory (no limit)"
                }
            ),
        ));
    }
    Some(out)
}

const NO_MEMORY_QOS: &str = "memoryQOS is enabled but this kernel has no memory.min/low/high";

/// A container's memory QoS: through CRI's `unified` map on cgroup v2 (the
/// runtime writes it at create), written after start on v1 kernels that have
/// the files, a warning elsewhere.
fn memory(
    class: QosClass,
    q: &MemoryQos,
    request: MemRequest,
    limit: Option<u64>,
    ctx: &Context,
    d: &mut ContainerDecision,
) {
    let Some(settings) = memory_qos_settings(class, q, request, limit, ctx) else {
        return;
    };
    let via: fn(Knob, String) -> Decision = if ctx.v2 {
        cri
    } else if ctx.features.memory_qos {
        cgroup
    } else {
        d.warnings
            .push(format!("{NO_MEMORY_QOS} on cgroup v1; skipped"));
        return;
    };
    d.decisions
        .extend(settings.into_iter().map(|(k, why)| via(k, why)));
}

/// The NUMA nodes the scheduler allocated the pod's CPUs on (resource-status
/// `numaNodeResources` entries with `cpu` or `kubernetes.io/batch-cpu`
/// above zero, as koordlet's `isNUMAAware`); `None`: no such allocation (or
/// an annotation that cannot be read, which the binding's rules warn of).
pub fn numa_nodes(annotations: &BTreeMap<String, String>) -> Option<BTreeSet<u32>> {
    #[derive(serde::Deserialize)]
    struct Node {
        node: u32,
        #[serde(default)]
        resources: Option<BTreeMap<String, serde_json::Value>>,
    }
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Status {
        #[serde(default)]
        numa_node_resources: Vec<Node>,
    }
    let a = annotations.get(ANNOTATION_RESOURCE_STATUS)?;
    if a.len() > MAX_RESOURCE_STATUS_BYTES {
        return None;
    }
    let s: Status = serde_json::from_str(a).ok()?;
    let positive = |v: &serde_json::Value| {
        let text = match v {
            serde_json::Value::String(s) => s.clone(),
            serde_json::Value::Number(n) => n.to_string(),
            _ => return false,
        };
        crate::quantity::Quantity::parse(text.trim())
            .ok()
            .and_then(|q| q.milli_value())
            .is_some_and(|m| m != 0)
    };
    // NUMA-aware once any entry allocates CPU; then every entry's node (koordlet)
    let entries = &s.numa_node_resources[..s.numa_node_resources.len().min(1024)];
    let aware = entries.iter().any(|n| {
        n.resources.as_ref().is_some_and(|r| {
            ["cpu", "kubernetes.io/batch-cpu"]
                .iter()
                .any(|k| r.get(*k).is_some_and(positive))
        })
    });
    let nodes: BTreeSet<u32> = entries.iter().map(|n| n.node).collect();
    (aware && !nodes.is_empty()).then_some(nodes)
}

/// The `cpuset` of a resource-status annotation, as this pod may have it:
/// only for a class set by label or a trusted pod (a Guaranteed pod without
/// an LSE/LSR label keeps kubelet's cpuset), only online and unreserved CPUs,
/// and for an untrusted pod only CPUs within kubelet's own cpuset (the static
/// CPU manager's exclusive CPUs of other pods are outside it). Returns the
/// canonical list and, when the annotation asked for more, a warning.
fn bound_cpus(
    annotation: &str,
    pc: PodClass,
    requested: &Requested,
    node: &NodeFacts,
) -> Result<Option<Bound>, String> {
    let kubelet_cpuset = requested.cpuset_cpus;
    #[derive(serde::Deserialize)]
    struct Status {
        #[serde(default)]
        cpuset: Option<String>,
    }
    if annotation.len() > MAX_RESOURCE_STATUS_BYTES {
        return Err(format!(
            "{} bytes, over the {MAX_RESOURCE_STATUS_BYTES}-byte cap; not read",
            annotation.len()
        ));
    }
    let v: serde_json::Value =
        serde_json::from_str(annotation).map_err(|e| format!("not JSON: {e}"))?;
    if !v.is_object() {
        return Err("not a JSON object".into());
    }
    let s: Status = serde_json::from_value(v).map_err(|e| e.to_string())?;
    let Some(cpus) = s
        .cpuset
        .map(|c| c.trim().to_string())
        .filter(|c| !c.is_empty())
    else {
        return Ok(None);
    };
    if !pc.by_label && !pc.trusted {
        return Err(format!(
            "the pod's class {} is inferred from its Kubernetes QoS, not set by label, and the pod is not trusted",
            pc.class.as_str()
        ));
    }
    let short: String = cpus.chars().take(64).collect();
    let wanted = parse_cpu_list(&cpus)
        .filter(|c| !c.is_empty())
        .ok_or_else(|| format!("malformed cpuset {short:?}"))?;
    if node.online_cpus.is_empty() {
        return Err("this node's online CPUs are unknown".into());
    }
    let mut got: BTreeSet<u32> = wanted
        .intersection(&node.online_cpus)
        .filter(|c| !node.reserved_cpus.contains(c))
        .copied()
        .collect();
    let mut within = String::new();
    if !pc.trusted && !kubelet_cpuset.trim().is_empty() {
        match parse_cpu_list(kubelet_cpuset) {
            Some(k) => got.retain(|c| k.contains(c)),
            None => return Err(format!("kubelet's cpuset {kubelet_cpuset:?} is malformed")),
        }
        within = format!(" and kubelet's cpuset {kubelet_cpuset}");
    }
    if got.is_empty() {
        return Err(format!(
            "none of the CPUs {short} is online and unreserved{within}"
        ));
    }
    // an untrusted pod binds to no more whole CPUs than its own limit (the
    // scheduler gives an LSE/LSR pod exactly that many): bound CPUs leave the
    // share pool of every other pod, and run without CFS quota
    if !pc.trusted {
        // the pod's limit where known: the scheduler binds the pod, all its
        // containers to the same CPUs (a 1-CPU sidecar of a 4-CPU pod too)
        let Some(milli) = requested.milli_cpu().max(nonzero(requested.pod_milli_cpu)) else {
            return Err("the container has no CPU limit to size a binding by".into());
        };
        let most = milli / 1000;
        if got.len() as u64 > most {
            return Err(format!(
                "{} CPUs asked, more than the container's CPU limit ({milli}m) allows",
                got.len()
            ));
        }
    }
    let narrowed = (got != wanted).then(|| {
        format!(
            "{ANNOTATION_RESOURCE_STATUS}: cpuset {short} narrowed to {} (online, unreserved{within})",
            format_cpu_list(&got)
        )
    });
    Ok(Some((got, narrowed)))
}

fn batch(b: &Batch, d: &mut ContainerDecision) {
    let r = b.resources();
    if let Some(s) = r.cpu_shares {
        d.decisions.push(cri(
            Knob::CpuShares(s),
            format!("BE batch-cpu request {}m", b.cpu_request_milli.unwrap_or(0)),
        ));
    }
    if let Some(q) = r.cpu_quota {
        d.decisions.push(cri(
            Knob::CpuQuota {
                quota: Some(q),
                period: r.cpu_period,
            },
            format!(
                "BE batch-cpu limit {}m per {} µs",
                b.cpu_limit_milli.unwrap_or(0),
                r.cpu_period
            ),
        ));
    }
    if let Some(m) = r.memory_limit {
        d.decisions
            .push(cri(Knob::MemoryLimit(Some(m)), "BE batch-memory limit"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{MemoryQos, ResourceQosStrategy};

    /// Koordinator's defaults with cpuQOS on for every class (as deploy/qoslet.yaml).
    fn cpu_on() -> ResourceQosStrategy {
        let mut p = ResourceQosStrategy::default();
        for c in [
            &mut p.lsr_class,
            &mut p.ls_class,
            &mut p.be_class,
            &mut p.system_class,
        ] {
            c.cpu_qos.enable = true;
        }
        p
    }

    /// A 16-CPU node with 64 GiB, two NUMA nodes of 8 CPUs.
    fn node() -> NodeFacts {
        NodeFacts {
            online_cpus: (0..16).collect(),
            reserved_cpus: BTreeSet::new(),
            milli_cpus: 16_000,
            memory_bytes: 64 << 30,
            numa: [(0, (0..8).collect()), (1, (8..16).collect())].into(),
        }
    }

    /// A class set by an untrusted pod's label, on a pod of the Kubernetes QoS
    /// that class usually has.
    fn labelled(class: QosClass) -> PodClass {
        PodClass {
            class,
            by_label: true,
            trusted: false,
            kube: match class {
                QosClass::Be => Some(KubeQos::BestEffort),
                QosClass::Ls => Some(KubeQos::Burstable),
                QosClass::Lsr | QosClass::Lse => Some(KubeQos::Guaranteed),
                QosClass::System => None,
            },
        }
    }

    /// The same, from a trusted pod.
    fn trusted(class: QosClass) -> PodClass {
        PodClass {
            trusted: true,
            ..labelled(class)
        }
    }

    fn run(
        class: QosClass,
        name: &str,
        ann: &BTreeMap<String, String>,
        f: &Features,
    ) -> ContainerDecision {
        run_as(labelled(class), name, ann, f)
    }

    fn run_as(
        pc: PodClass,
        name: &str,
        ann: &BTreeMap<String, String>,
        f: &Features,
    ) -> ContainerDecision {
        let p = cpu_on();
        container(
            pc,
            name,
            ann,
            &Requested::default(),
            &Context {
                features: f,
                v2: false,
                policy: &p,
                page_size: 4096,
                node: &node(),
                devices: &BTreeMap::new(),
                share_pool: None,
            },
        )
    }

    fn run_pod(class: QosClass, f: &Features) -> PodDecision {
        let p = cpu_on();
        pod(
            labelled(class),
            &BTreeMap::new(),
            &SandboxLimits::default(),
            &Context {
                features: f,
                v2: false,
                policy: &p,
                page_size: 4096,
                node: &node(),
                devices: &BTreeMap::new(),
                share_pool: None,
            },
        )
    }

    /// kubelet's `GetContainerOOMScoreAdjust` (Burstable: 1000 - 1000 x
    /// request / node memory, within 3..=999) read backwards.
    #[test]
    fn kubelets_oom_score_adj_gives_a_burstable_request_away() {
        let gib = 1u64 << 30;
        let node = 1000 * gib; // a thousandth of the node is 1 GiB
        let r = |adj, limit| kubelet_memory_request(adj, node, limit).map(|r| (r.lo, r.hi));
        // 4 GiB requested: adj 996
        assert_eq!(r(996, None), Some((4 * gib, 5 * gib)));
        assert_eq!(
            r(996, Some(4 * gib + 1)),
            Some((4 * gib, 4 * gib + 1)),
            "within the limit"
        );
        // kubelet's clamps: 999 is any request under 2 thousandths; 3 anything above 99.7 %
        assert_eq!(r(999, None), Some((0, 2 * gib)));
        assert_eq!(r(3, None), Some((997 * gib, node)));
        // Guaranteed / critical (-997), BestEffort (1000), unknown (0): not Burstable values
        for adj in [-997, 1000, 0, 2, -1] {
            assert_eq!(r(adj, None), None, "{adj}");
        }
        assert_eq!(
            kubelet_memory_request(500, 0, None),
            None,
            "node memory unknown"
        );
        // the formula forward, for a few requests on a 64 GiB node: always within the bounds
        let node = 64 * gib;
        for req in [1u64, 100 << 20, gib, 3 * gib + 7, 63 * gib] {
            let adj = (1000 - (1000 * req as u128 / node as u128) as i64).clamp(3, 999);
            let b = kubelet_memory_request(adj, node, None).unwrap();
            assert!(b.lo <= req && req <= b.hi, "{req}: {b:?}");
        }
    }

    /// Issue 14 item 8: memory QoS for LS and SYSTEM pods (koordlet's
    /// `calculateContainerResources` from the container's request), the
    /// request from kubelet's oom_score_adj, and the Anolis files written
    /// where the kernel has them.
    #[test]
    fn memory_qos_for_ls_and_system_and_the_anolis_files() {
        let gib = 1u64 << 30;
        let mut p = ResourceQosStrategy::default();
        let on = MemoryQos {
            enable: true,
            min_limit_percent: 50,
            low_limit_percent: 100,
            throttling_percent: 50,
            priority_enable: 1,
            priority: 6,
            oom_kill_group: 1,
            ..p.ls_class.memory_qos.clone()
        };
        p.ls_class.memory_qos = on.clone();
        p.system_class.memory_qos = MemoryQos {
            wmark_ratio: 0,
            ..on
        };
        let mut n = node();
        n.memory_bytes = 1000 * gib;
        let anolis = Features {
            memory_qos: true,
            memory_tunes: qoslet_cgroups::MemTune::ALL
                .into_iter()
                .fold(Default::default(), |s, t| s.with(t)),
            ..Default::default()
        };
        let run_with = |p: &ResourceQosStrategy,
                        pc: PodClass,
                        adj: i64,
                        limit: i64,
                        f: &Features,
                        v2: bool| {
            container(
                pc,
                "app",
                &BTreeMap::new(),
                &Requested {
                    memory_limit: limit,
                    oom_score_adj: adj,
                    ..Default::default()
                },
                &Context {
                    features: f,
                    v2,
                    policy: p,
                    page_size: 4096,
                    node: &n,
                    devices: &BTreeMap::new(),
                    share_pool: None,
                },
            )
        };
        let run = |pc: PodClass, adj: i64, limit: i64, f: &Features, v2: bool| {
            run_with(&p, pc, adj, limit, f, v2)
        };
        // an LS container with 4 GiB requested (adj 996) and an 8 GiB limit, on v2
        let d = run(labelled(QosClass::Ls), 996, (8 * gib) as i64, &anolis, true);
        let u = d.patch().unified;
        assert_eq!(
            u["memory.min"],
            (2 * gib).to_string(),
            "50% of the request's low end"
        );
        assert_eq!(u["memory.low"], (4 * gib).to_string());
        // throttling from the high end: 5 + (8 - 5) x 50% = 6.5 GiB
        assert_eq!(u["memory.high"], (13 * gib / 2).to_string());
        let tunes: Vec<(&str, String)> = d
            .cgroup()
            .iter()
            .filter(|k| matches!(k, Knob::MemoryTune(..)))
            .map(|k| {
                let (f, v) = k.describe(true);
                (
                    qoslet_cgroups::MemTune::ALL
                        .into_iter()
                        .find(|t| t.file() == f)
                        .unwrap()
                        .file(),
                    v,
                )
            })
            .collect();
        assert_eq!(
            tunes,
            [
                ("memory.wmark_ratio", "95".to_string()),
                ("memory.wmark_scale_factor", "20".into()),
                ("memory.wmark_min_adj", "-25".into()),
                ("memory.use_priority_oom", "1".into()),
                ("memory.priority", "6".into()),
                ("memory.oom.group", "1".into()),
            ]
        );
        // no limit: the node's memory stands for it (koordlet: allocatable)
        let d = run(labelled(QosClass::Ls), 996, 0, &anolis, true);
        let h: u64 = d.patch().unified["memory.high"].parse().unwrap();
        assert_eq!(h, (5 * gib + (995 * gib) / 2) / 4096 * 4096);
        // SYSTEM on a Burstable pod, v1 Anolis: written after start
        let sys = PodClass {
            kube: Some(KubeQos::Burstable),
            ..labelled(QosClass::System)
        };
        let d = run(sys, 996, (8 * gib) as i64, &anolis, false);
        assert!(d.cgroup().contains(&Knob::MemoryMin(2 * gib)), "{d:?}");
        assert!(d
            .cgroup()
            .contains(&Knob::MemoryTune(qoslet_cgroups::MemTune::WmarkRatio, 0)));
        // a kernel without the Anolis files: memory.min/low/high only
        let upstream_v2 = Features {
            memory_qos: true,
            ..Default::default()
        };
        let d = run(
            labelled(QosClass::Ls),
            996,
            (8 * gib) as i64,
            &upstream_v2,
            true,
        );
        assert!(!d.patch().unified.is_empty());
        assert!(!d.cgroup().iter().any(|k| matches!(k, Knob::MemoryTune(..))));
        // a Guaranteed LS pod requests its limit; a BestEffort one (adj 1000) nothing
        let g = PodClass {
            kube: Some(KubeQos::Guaranteed),
            ..labelled(QosClass::Ls)
        };
        let d = run(g, -997, (2 * gib) as i64, &upstream_v2, true);
        assert_eq!(d.patch().unified["memory.min"], gib.to_string());
        let be = PodClass {
            kube: Some(KubeQos::BestEffort),
            ..labelled(QosClass::Ls)
        };
        let d = run(be, 1000, 0, &upstream_v2, true);
        assert!(d.patch().unified.is_empty());
        // kubelet's -997 on a Burstable pod (a critical one): no request known
        let d = run(sys, -997, (8 * gib) as i64, &upstream_v2, true);
        assert!(d.patch().unified.is_empty());
        // oomKillGroup 0 leaves memory.oom.group to kubelet (it sets 1 on v2)
        let zero = MemoryQos {
            oom_kill_group: 0,
            ..p.ls_class.memory_qos.clone()
        };
        let mut p0 = p.clone();
        p0.ls_class.memory_qos = zero;
        let d = run_with(
            &p0,
            labelled(QosClass::Ls),
            996,
            (8 * gib) as i64,
            &anolis,
            true,
        );
        assert!(!d
            .cgroup()
            .iter()
            .any(|k| matches!(k, Knob::MemoryTune(qoslet_cgroups::MemTune::OomGroup, _))));
        // memory QoS off for the class: nothing at all
        let mut off = p.clone();
        off.ls_class.memory_qos.enable = false;
        let d = run_with(
            &off,
            labelled(QosClass::Ls),
            996,
            (8 * gib) as i64,
            &anolis,
            true,
        );
        assert!(d.patch().is_empty() && d.cgroup().is_empty(), "{d:?}");
    }

    #[test]
    fn memory_qos_per_host_and_policy() {
        let mut p = ResourceQosStrategy::default();
        let on = MemoryQos {
            enable: true,
            min_limit_percent: 100,
            low_limit_percent: 100,
            throttling_percent: 80,
            ..Default::default()
        };
        p.be_class.memory_qos = on.clone();
        p.lsr_class.memory_qos = on;
        let spec = r#"{"containers":{"app":{"requests":{"kubernetes.io/batch-memory":"64Mi"},"limits":{"kubernetes.io/batch-memory":"128Mi"}}}}"#;
        let a: BTreeMap<String, String> = [(
            ANNOTATION_EXTENDED_RESOURCE_SPEC.to_string(),
            spec.to_string(),
        )]
        .into();
        let upstream = Features {
            cpu_idle: true,
            ..Default::default()
        };
        // cgroup v2: through CRI's unified map
        let d = container(
            trusted(QosClass::Be),
            "app",
            &a,
            &Requested::default(),
            &Context {
                features: &upstream,
                v2: true,
                policy: &p,
                page_size: 4096,
                node: &node(),
                devices: &BTreeMap::new(),
                share_pool: None,
            },
        );
        assert_eq!(
            d.patch().unified.get("memory.min").map(String::as_str),
            Some("67108864")
        );
        assert_eq!(
            d.patch().unified.get("memory.high").map(String::as_str),
            Some(
                (((64u64 << 20) + (64u64 << 20) * 80 / 100) / 4096 * 4096)
                    .to_string()
                    .as_str()
            )
        );
        // each memory setting is decided once, as CRI-carried, and named as v2 names it
        let mem: Vec<_> = d
            .decisions
            .iter()
            .filter(|x| matches!(x.knob(), Some(Knob::MemoryMin(_) | Knob::MemoryHigh(_))))
            .collect();
        assert_eq!(mem.len(), 2);
        assert!(mem.iter().all(|x| matches!(x.action, Action::Cri(_))));
        assert_eq!(
            mem[0].setting(true),
            ("memory.min".into(), "67108864".into())
        );
        assert!(d.cgroup().is_empty(), "nothing written by qoslet on v2");
        // cgroup v1 without the files: a warning, nothing written
        let d = container(
            trusted(QosClass::Be),
            "app",
            &a,
            &Requested::default(),
            &Context {
                features: &upstream,
                v2: false,
                policy: &p,
                page_size: 4096,
                node: &node(),
                devices: &BTreeMap::new(),
                share_pool: None,
            },
        );
        assert!(d.patch().unified.is_empty() && d.warnings.len() == 1);
        // cgroup v1 with them (Alibaba kernels): written after start
        let ali = Features {
            memory_qos: true,
            ..Default::default()
        };
        let d = container(
            trusted(QosClass::Be),
            "app",
            &a,
            &Requested::default(),
            &Context {
                features: &ali,
                v2: false,
                policy: &p,
                page_size: 4096,
                node: &node(),
                devices: &BTreeMap::new(),
                share_pool: None,
            },
        );
        assert!(d.cgroup().contains(&Knob::MemoryMin(64 << 20)));
        // LSR: the request is the limit kubelet asked for
        let d = container(
            labelled(QosClass::Lsr),
            "app",
            &BTreeMap::new(),
            &Requested {
                memory_limit: 1 << 30,
                ..Default::default()
            },
            &Context {
                features: &upstream,
                v2: true,
                policy: &p,
                page_size: 4096,
                node: &node(),
                devices: &BTreeMap::new(),
                share_pool: None,
            },
        );
        assert_eq!(
            d.patch().unified.get("memory.low").map(String::as_str),
            Some("1073741824")
        );
        // off by default
        let d = container(
            labelled(QosClass::Lsr),
            "app",
            &BTreeMap::new(),
            &Requested {
                memory_limit: 1 << 30,
                ..Default::default()
            },
            &Context {
                features: &upstream,
                v2: true,
                policy: &ResourceQosStrategy::default(),
                page_size: 4096,
                node: &node(),
                devices: &BTreeMap::new(),
                share_pool: None,
            },
        );
        assert!(d.patch().unified.is_empty());
    }

    const SPEC: &str = r#"{"containers":{"app":{"requests":{"kubernetes.io/batch-cpu":"500"},"limits":{"kubernetes.io/batch-cpu":"1000","kubernetes.io/batch-memory":"256Mi"}}}}"#;

    fn ann(v: &str) -> BTreeMap<String, String> {
        [(ANNOTATION_EXTENDED_RESOURCE_SPEC.to_string(), v.to_string())].into()
    }

    fn upstream() -> Features {
        Features {
            cpu_idle: true,
            cpu_burst: true,
            ..Default::default()
        }
    }

    #[test]
    fn be_with_batch_resources_on_an_upstream_kernel() {
        let d = run(QosClass::Be, "app", &ann(SPEC), &upstream());
        assert_eq!(
            d.patch(),
            ResourcePatch {
                cpu_shares: Some(512),
                cpu_quota: Some(100_000),
                cpu_period: Some(100_000),
                memory_limit_in_bytes: Some(256 << 20),
                cpuset_cpus: None,
                unified: BTreeMap::new(),
            }
        );
        assert!(d.cgroup().is_empty(), "cpu.idle is a pod-level setting");
        assert_eq!(
            d.decisions
                .iter()
                .map(|r| r.setting(false).0)
                .collect::<Vec<_>>(),
            vec!["cpu.shares", "cpu.cfs_quota_us", "memory.limit_in_bytes",]
        );
        assert!(d.warnings.is_empty());
    }

    #[test]
    fn classes_kernels_and_bad_input() {
        let bvt = Features {
            bvt: true,
            ..Default::default()
        };
        // (class, annotation, kernel, expected patch, expected container cgroup writes, warnings)
        type Case<'a> = (QosClass, &'a str, Features, ResourcePatch, Vec<Knob>, usize);
        let table: &[Case] = &[
            (
                QosClass::Ls,
                SPEC,
                upstream(),
                ResourcePatch::default(),
                vec![],
                0,
            ),
            (
                QosClass::Lsr,
                SPEC,
                bvt.clone(),
                ResourcePatch::default(),
                vec![Knob::GroupIdentity(2)],
                0,
            ),
            (
                QosClass::Be,
                "",
                bvt.clone(),
                ResourcePatch::default(),
                vec![Knob::GroupIdentity(-1)],
                1,
            ),
            (
                QosClass::Be,
                "{not json",
                upstream(),
                ResourcePatch::default(),
                vec![],
                1,
            ),
            (
                QosClass::Be,
                SPEC,
                Features::default(),
                ResourcePatch {
                    cpu_shares: Some(512),
                    cpu_quota: Some(100_000),
                    cpu_period: Some(100_000),
                    memory_limit_in_bytes: Some(256 << 20),
                    cpuset_cpus: None,
                    unified: BTreeMap::new(),
                },
                vec![],
                0,
            ),
            (
                QosClass::System,
                SPEC,
                bvt,
                ResourcePatch::default(),
                vec![Knob::GroupIdentity(0)],
                0,
            ),
        ];
        for (class, a, f, patch, knobs, warnings) in table {
            let d = run(*class, "app", &ann(a), f);
            assert_eq!(
                (&d.patch(), &d.cgroup(), d.warnings.len()),
                (patch, knobs, *warnings),
                "{class:?} {a:?} {f:?}"
            );
        }
        // another container of the pod: no batch entry, class settings only
        let d = run(QosClass::Be, "sidecar", &ann(SPEC), &upstream());
        assert!(d.patch().is_empty());
        assert!(d.cgroup().is_empty());
    }

    #[test]
    fn lsr_cpusets_from_the_scheduler() {
        let a = |v: &str| -> BTreeMap<String, String> {
            [(ANNOTATION_RESOURCE_STATUS.to_string(), v.to_string())].into()
        };
        let d = run_as(
            trusted(QosClass::Lsr),
            "app",
            &a(r#"{"cpuset":"0-3,8"}"#),
            &upstream(),
        );
        assert_eq!(d.patch().cpuset_cpus.as_deref(), Some("0-3,8"));
        assert_eq!(d.decisions[0].setting(false).0, "cpuset.cpus");
        assert!(
            run(QosClass::Ls, "app", &a(r#"{"cpuset":"1"}"#), &upstream())
                .patch()
                .is_empty(),
            "LS shares the pool"
        );
        for bad in [
            r#"{"cpuset":"1;rm -rf /"}"#,
            r#"{"cpuset":"x"}"#,
            "[]",
            "{",
            r#"{"cpuset":"3-1"}"#,
        ] {
            let d = run_as(trusted(QosClass::Lse), "app", &a(bad), &upstream());
            assert!(
                d.patch().is_empty() && d.warnings.len() == 1,
                "{bad}: {d:?}"
            );
        }
        assert!(run_as(
            trusted(QosClass::Lsr),
            "app",
            &a(r#"{"numaNodeResources":[]}"#),
            &upstream()
        )
        .warnings
        .is_empty());
    }

    /// Issue 14 item 5: pods with and without a cpuset, as koordlet's cpuset
    /// hook places them (`pkg/koordlet/runtimehooks/hooks/cpuset`:
    /// `SetContainerCPUSetAndUnsetCFS`, `UnsetContainerCPUQuota` /
    /// `IsPodCfsQuotaNeedUnset`, `cpusetRule.getContainerCPUSet`), on a
    /// 16-CPU node whose share pool has lost CPUs 2-3 to an LSR pod.
    #[test]
    fn cpuset_pods_and_the_share_pool_as_koordlets_cpuset_hook() {
        let p = ResourceQosStrategy::default();
        let online = node().online_cpus;
        let pool = share_pool(&online, [BTreeSet::from([2, 3])]);
        let unset = Some(-1);
        let kube = |pc: PodClass, k: KubeQos| PodClass {
            kube: Some(k),
            ..pc
        };
        let unlabelled = |c: QosClass, k: KubeQos| PodClass {
            class: c,
            by_label: false,
            trusted: false,
            kube: Some(k),
        };
        let bound = r#"{"cpuset":"2-3"}"#;
        let numa0 = r#"{"numaNodeResources":[{"node":0,"resources":{"cpu":"4","memory":"4Gi"}}]}"#;
        let numa_both = r#"{"numaNodeResources":[{"node":0,"resources":{"cpu":"2"}},{"node":1,"resources":{"kubernetes.io/batch-cpu":"2k"}}]}"#;
        let numa_mem = r#"{"numaNodeResources":[{"node":1,"resources":{"memory":"4Gi"}}]}"#;
        let numa7 = r#"{"numaNodeResources":[{"node":7,"resources":{"cpu":"1"}}]}"#;
        // (pod, annotation, kubelet's quota (period 100 ms), kubelet's cpuset,
        //  expected cpuset, expected quota, warnings)
        type Case<'a> = (
            PodClass,
            &'a str,
            i64,
            &'a str,
            Option<&'a str>,
            Option<i64>,
            usize,
        );
        #[rustfmt::skip]
        let table: &[Case] = &[
            // getContainerCPUSet: the annotation's cpuset; UnsetContainerCPUQuota: -1
            (trusted(QosClass::Lsr), bound, 200_000, "", Some("2-3"), unset, 0),
            (trusted(QosClass::Lse), bound, -1, "", Some("2-3"), unset, 0),
            // an untrusted pod bound within its 2-CPU limit: quota unset too
            (labelled(QosClass::Lsr), bound, 200_000, "", Some("2-3"), unset, 0),
            // ... but 2 CPUs for a 1.5-CPU limit, or one CPU for 10m: not bound (the
            // scheduler binds whole CPUs), kubelet's quota stands; on the share pool
            (labelled(QosClass::Lsr), bound, 150_000, "", Some("0-1,4-15"), None, 1),
            (labelled(QosClass::Lsr), r#"{"cpuset":"5"}"#, 1_000, "", Some("0-1,4-15"), None, 1),
            // QoS=LS: all share pool (kubelet's none policy)
            (labelled(QosClass::Ls), "", 200_000, "", Some("0-1,4-15"), None, 0),
            // QoS=LS under kubelet's static policy: the share pool within kubelet's shared pool
            (labelled(QosClass::Ls), "", 200_000, "0-7", Some("0-1,4-7"), None, 0),
            (labelled(QosClass::Ls), "", 200_000, "2-3", None, None, 1),
            // no QoS label, Burstable / Guaranteed, none policy: all share pool
            (unlabelled(QosClass::Ls, KubeQos::Burstable), "", 200_000, "", Some("0-1,4-15"), None, 0),
            (unlabelled(QosClass::Lsr, KubeQos::Guaranteed), "", 200_000, "", Some("0-1,4-15"), None, 0),
            // ... static policy: kubelet's cpuset stands ("do nothing")
            (unlabelled(QosClass::Lsr, KubeQos::Guaranteed), "", 200_000, "4-5", None, None, 0),
            // SYSTEM (no system QoS cpuset here): as its Kubernetes QoS
            (kube(labelled(QosClass::System), KubeQos::Burstable), "", 200_000, "", Some("0-1,4-15"), None, 0),
            // BestEffort, and BE on any Kubernetes QoS: kubelet's cpuset stands
            // (cpuset suppress writes BE pods' cgroups; koordlet clears BestEffort's)
            (labelled(QosClass::Be), "", -1, "", None, None, 0),
            (labelled(QosClass::Be), "", -1, "0-15", None, None, 0),
            (unlabelled(QosClass::Be, KubeQos::BestEffort), "", -1, "", None, None, 0),
            (kube(labelled(QosClass::Be), KubeQos::Burstable), "", 200_000, "", None, None, 0),
            // an LS pod's cpuset annotation binds nothing (Koordinator's scheduler binds LSE/LSR)
            (labelled(QosClass::Ls), bound, 200_000, "", Some("0-1,4-15"), None, 0),
            // isNUMAAware: the share pool of the NUMA nodes the scheduler allocated
            // the pod's CPUs on (node 0: 0-7 without the bound 2-3), whatever its class
            (labelled(QosClass::Ls), numa0, 200_000, "", Some("0-1,4-7"), None, 0),
            (unlabelled(QosClass::Lsr, KubeQos::Guaranteed), numa0, 200_000, "4-5", Some("4-5"), None, 0),
            (labelled(QosClass::Ls), numa_both, 200_000, "", Some("0-1,4-15"), None, 0),
            // no CPU on the node entry (memory only): not NUMA-aware
            (labelled(QosClass::Ls), numa_mem, 200_000, "", Some("0-1,4-15"), None, 0),
            // a node this host does not have: a warning, the whole share pool
            (labelled(QosClass::Ls), numa7, 200_000, "", Some("0-1,4-15"), None, 1),
            // BE: left to cpuset suppress
            (labelled(QosClass::Be), numa0, -1, "", None, None, 0),
        ];
        for (pc, a, quota, kubelet, cpuset, q, warnings) in table {
            let ann: BTreeMap<String, String> = if a.is_empty() {
                BTreeMap::new()
            } else {
                [(ANNOTATION_RESOURCE_STATUS.to_string(), a.to_string())].into()
            };
            let d = container(
                *pc,
                "app",
                &ann,
                &Requested {
                    cpu_quota: *quota,
                    cpu_period: 100_000,
                    cpuset_cpus: kubelet,
                    memory_limit: 0,
                    oom_score_adj: 0,
                    pod_milli_cpu: 0,
                },
                &Context {
                    features: &upstream(),
                    v2: false,
                    policy: &p,
                    page_size: 4096,
                    node: &node(),
                    devices: &BTreeMap::new(),
                    share_pool: Some(SharePool {
                        cpus: &pool,
                        whole: &online,
                        explicit: false,
                    }),
                },
            );
            let patch = d.patch();
            assert_eq!(
                (
                    patch.cpuset_cpus.as_deref(),
                    patch.cpu_quota,
                    d.warnings.len()
                ),
                (*cpuset, *q, *warnings),
                "{pc:?} {a} quota {quota} kubelet {kubelet:?}: {d:?}"
            );
            if q.is_some() {
                assert_eq!(patch.cpu_period, Some(100_000));
            }
        }
        // a share pool that is all the CPUs pins nothing, unless asked to carry
        // it (UpdateContainerResources); no share pool known: nothing
        let ctx = |pool: Option<SharePool<'static>>| {
            let d = container(
                labelled(QosClass::Ls),
                "app",
                &BTreeMap::new(),
                &Requested::default(),
                &Context {
                    features: &upstream(),
                    v2: false,
                    policy: &p,
                    page_size: 4096,
                    node: &node(),
                    devices: &BTreeMap::new(),
                    share_pool: pool,
                },
            );
            d.patch().cpuset_cpus
        };
        let whole: &'static BTreeSet<u32> = Box::leak(Box::new(online.clone()));
        let share = |explicit| SharePool {
            cpus: whole,
            whole,
            explicit,
        };
        assert_eq!(ctx(Some(share(false))), None);
        assert_eq!(ctx(Some(share(true))).as_deref(), Some("0-15"));
        assert_eq!(ctx(None), None);
        // the pool is taken within what the container may use (its pod's cpuset on v1)
        let narrow: &'static BTreeSet<u32> = Box::leak(Box::new((0..8).collect()));
        let d = ctx(Some(SharePool {
            cpus: Box::leak(Box::new(pool.clone())),
            whole: narrow,
            explicit: false,
        }));
        assert_eq!(d.as_deref(), Some("0-1,4-7"));
    }

    /// Review: the scheduler binds a pod, all its containers to the same CPUs
    /// (koordlet takes the pod's cpuset for every container): an untrusted
    /// pod's binding is sized by the pod's limit, each container's quota unset
    /// only within its own.
    #[test]
    fn every_container_of_a_bound_pod_shares_its_cpus() {
        let ann: BTreeMap<String, String> = [(
            ANNOTATION_RESOURCE_STATUS.to_string(),
            r#"{"cpuset":"2-5"}"#.to_string(),
        )]
        .into();
        let p = ResourceQosStrategy::default();
        // a 4-CPU pod: a 3-CPU app and a 1-CPU sidecar
        for (quota, pod, cpuset, unset) in [
            (300_000, 400_000, Some("2-5"), false),
            (100_000, 400_000, Some("2-5"), false),
            (400_000, 400_000, Some("2-5"), true),
            // the pod's limit unknown: the container's own
            (100_000, 0, None, false),
        ] {
            let d = container(
                labelled(QosClass::Lsr),
                "app",
                &ann,
                &Requested {
                    cpu_quota: quota,
                    cpu_period: 100_000,
                    pod_milli_cpu: pod / 100,
                    ..Default::default()
                },
                &Context {
                    features: &upstream(),
                    v2: false,
                    policy: &p,
                    page_size: 4096,
                    node: &node(),
                    devices: &BTreeMap::new(),
                    share_pool: None,
                },
            );
            let patch = d.patch();
            assert_eq!(patch.cpuset_cpus.as_deref(), cpuset, "{quota} {pod}: {d:?}");
            assert_eq!(patch.cpu_quota == Some(-1), unset, "{quota} {pod}: {d:?}");
        }
    }

    /// koordlet's `UnsetPodCPUQuota` on the pod's own cgroup: for an untrusted
    /// pod only while the CPUs bound are within the sandbox's CPU limit.
    #[test]
    fn a_pod_bound_to_cpus_runs_without_its_quota() {
        let p = ResourceQosStrategy::default();
        let ann: BTreeMap<String, String> = [(
            ANNOTATION_RESOURCE_STATUS.to_string(),
            r#"{"cpuset":"2-3"}"#.to_string(),
        )]
        .into();
        let limits = |q: i64, period: i64| SandboxLimits {
            memory_limit: 0,
            cpu_quota: q,
            cpu_period: period,
        };
        let unset = |period| Knob::CpuQuota {
            quota: None,
            period,
        };
        // (pod, sandbox quota and period, unset at period?)
        let table = [
            (trusted(QosClass::Lsr), -1, 0, Some(100_000)),
            (labelled(QosClass::Lsr), 200_000, 100_000, Some(100_000)),
            (labelled(QosClass::Lse), 150_000, 50_000, Some(50_000)),
            // 2 CPUs for a 1.5-CPU limit; no limit to size a binding by: not bound
            (labelled(QosClass::Lsr), 150_000, 100_000, None),
            (labelled(QosClass::Lsr), -1, 0, None),
            (labelled(QosClass::Ls), 200_000, 100_000, None),
        ];
        for (pc, q, period, want) in table {
            let d = pod(
                pc,
                &ann,
                &limits(q, period),
                &Context {
                    features: &Features::default(),
                    v2: false,
                    policy: &p,
                    page_size: 4096,
                    node: &node(),
                    devices: &BTreeMap::new(),
                    share_pool: None,
                },
            );
            let got = d
                .cgroup()
                .into_iter()
                .find(|k| matches!(k, Knob::CpuQuota { .. }));
            assert_eq!(got, want.map(unset), "{pc:?} {q}: {d:?}");
            assert_eq!(
                pod_binding(pc, &ann, &limits(q, period), &node()).is_some(),
                want.is_some(),
                "the pod's binding keeps its CPUs out of the pool"
            );
        }
    }

    /// koordlet's `calCPUSharePools`: every CPU a pod is bound to leaves the
    /// LS pool; kubelet's reserved CPUs stay in it (`calcNodeTopo`).
    #[test]
    fn share_pool_is_the_cpus_no_pod_is_bound_to() {
        let online: BTreeSet<u32> = (0..8).collect();
        let pool = share_pool(&online, [BTreeSet::from([2, 3]), BTreeSet::from([3, 4])]);
        assert_eq!(format_cpu_list(&pool), "0-1,5-7");
        assert_eq!(format_cpu_list(&share_pool(&online, [])), "0-7");
    }

    /// Issue 12: the scheduler's cpuset annotation as a pod author could write it.
    #[test]
    fn resource_status_cpusets_by_trust_and_node() {
        let mut n = node();
        n.reserved_cpus = [0, 1].into();
        let p = ResourceQosStrategy::default();
        let hostile = format!(r#"{{"cpuset":"{}"}}"#, "0-65536,".repeat(32 << 10));
        // (class, by label, trusted, kubelet's cpuset, annotation, expected cpuset, warnings)
        type Case<'a> = (
            QosClass,
            bool,
            bool,
            &'a str,
            &'a str,
            Option<&'a str>,
            usize,
        );
        let table: &[Case] = &[
            // a Guaranteed pod without an LSE/LSR label keeps kubelet's cpuset
            (
                QosClass::Lsr,
                false,
                false,
                "",
                r#"{"cpuset":"2-3"}"#,
                None,
                1,
            ),
            (
                QosClass::Lsr,
                true,
                false,
                "",
                r#"{"cpuset":"3,2"}"#,
                Some("2-3"),
                0,
            ),
            // never reserved CPUs, never CPUs the node does not have
            (
                QosClass::Lse,
                true,
                false,
                "",
                r#"{"cpuset":"0-3"}"#,
                Some("2-3"),
                1,
            ),
            (
                QosClass::Lsr,
                true,
                false,
                "",
                r#"{"cpuset":"14-20"}"#,
                Some("14-15"),
                1,
            ),
            (
                QosClass::Lsr,
                true,
                false,
                "",
                r#"{"cpuset":"20-30"}"#,
                None,
                1,
            ),
            (
                QosClass::Lsr,
                true,
                false,
                "",
                r#"{"cpuset":"0-1"}"#,
                None,
                1,
            ),
            // an untrusted pod stays within kubelet's cpuset (others' exclusive CPUs are outside it)
            (
                QosClass::Lsr,
                true,
                false,
                "4-7",
                r#"{"cpuset":"2-5"}"#,
                Some("4-5"),
                1,
            ),
            (
                QosClass::Lsr,
                true,
                false,
                "8-9",
                r#"{"cpuset":"2-5"}"#,
                None,
                1,
            ),
            // trusted (Koordinator's scheduler): the annotation wins over kubelet's, within the node
            (
                QosClass::Lsr,
                true,
                true,
                "4-7",
                r#"{"cpuset":"2-5"}"#,
                Some("2-5"),
                0,
            ),
            (
                QosClass::Lsr,
                false,
                true,
                "",
                r#"{"cpuset":"2-3"}"#,
                Some("2-3"),
                0,
            ),
            // hostile or malformed input: a warning, kubelet's cpuset
            (QosClass::Lsr, true, true, "", &hostile, None, 1),
            (
                QosClass::Lsr,
                true,
                true,
                "",
                r#"{"cpuset":"99999999999"}"#,
                None,
                1,
            ),
            (
                QosClass::Lsr,
                true,
                false,
                "x",
                r#"{"cpuset":"2"}"#,
                None,
                1,
            ),
            // an untrusted pod binds to no more CPUs than its 4-CPU limit
            (
                QosClass::Lsr,
                true,
                false,
                "",
                r#"{"cpuset":"2-6"}"#,
                None,
                1,
            ),
            (
                QosClass::Lsr,
                true,
                true,
                "",
                r#"{"cpuset":"2-6"}"#,
                Some("2-6"),
                0,
            ),
            // LS shares the pool
            (QosClass::Ls, true, true, "", r#"{"cpuset":"2-3"}"#, None, 0),
        ];
        for (class, by_label, trusted, kubelet, a, want, warnings) in table {
            let ann: BTreeMap<String, String> =
                [(ANNOTATION_RESOURCE_STATUS.to_string(), a.to_string())].into();
            let d = container(
                PodClass {
                    class: *class,
                    by_label: *by_label,
                    trusted: *trusted,
                    kube: Some(KubeQos::Guaranteed),
                },
                "app",
                &ann,
                &Requested {
                    cpuset_cpus: kubelet,
                    cpu_quota: 400_000,
                    cpu_period: 100_000,
                    ..Default::default()
                },
                &Context {
                    features: &upstream(),
                    v2: false,
                    policy: &p,
                    page_size: 4096,
                    node: &n,
                    devices: &BTreeMap::new(),
                    share_pool: None,
                },
            );
            let short: String = a.chars().take(40).collect();
            assert_eq!(
                (d.patch().cpuset_cpus.as_deref(), d.warnings.len()),
                (*want, *warnings),
                "{class:?} label={by_label} trusted={trusted} kubelet={kubelet:?} {short}: {:?}",
                d.warnings
            );
            assert!(
                d.warnings.iter().all(|w| w.len() < 400),
                "warnings stay short"
            );
        }
    }

    /// Review of issue 12: lowering a Burstable pod to BE must not let its
    /// batch annotation raise its CPU weight, nor an untrusted batch request
    /// buy memory protection.
    #[test]
    fn untrusted_batch_annotations_only_on_besteffort_pods_and_without_protection() {
        let mut p = ResourceQosStrategy::default();
        p.be_class.memory_qos = MemoryQos {
            enable: true,
            min_limit_percent: 100,
            low_limit_percent: 100,
            ..Default::default()
        };
        let spec = r#"{"containers":{"app":{"requests":{"kubernetes.io/batch-cpu":"4000","kubernetes.io/batch-memory":"1Gi"},"limits":{"kubernetes.io/batch-cpu":"4000","kubernetes.io/batch-memory":"2Gi"}}}}"#;
        let v2 = Features {
            memory_qos: true,
            ..Default::default()
        };
        let go = |pc: PodClass| {
            container(
                pc,
                "app",
                &ann(spec),
                &Requested::default(),
                &Context {
                    features: &v2,
                    v2: true,
                    policy: &p,
                    page_size: 4096,
                    node: &node(),
                    devices: &BTreeMap::new(),
                    share_pool: None,
                },
            )
        };
        let burstable_as_be = PodClass {
            kube: Some(KubeQos::Burstable),
            ..labelled(QosClass::Be)
        };
        let d = go(burstable_as_be);
        assert_eq!(d.patch().cpu_shares, None, "no weight from the annotation");
        assert!(d.warnings[0].contains("not BestEffort"), "{:?}", d.warnings);
        let d = go(labelled(QosClass::Be));
        assert_eq!(d.patch().cpu_shares, Some(4096));
        assert!(
            !d.patch().unified.contains_key("memory.min"),
            "no protection"
        );
        let d = go(PodClass {
            trusted: true,
            ..burstable_as_be
        });
        assert_eq!(d.patch().cpu_shares, Some(4096));
        assert_eq!(
            d.patch().unified.get("memory.min").map(String::as_str),
            Some("1073741824")
        );
    }

    /// Batch resources narrow what kubelet gave and stay within the node; never widen.
    #[test]
    fn batch_resources_are_bounded_by_kubelet_and_the_node() {
        let p = ResourceQosStrategy::default();
        let mut n = node();
        n.milli_cpus = 500;
        let d = container(
            labelled(QosClass::Be),
            "app",
            &ann(SPEC),
            &Requested {
                memory_limit: 128 << 20,
                ..Default::default()
            },
            &Context {
                features: &upstream(),
                v2: false,
                policy: &p,
                page_size: 4096,
                node: &n,
                devices: &BTreeMap::new(),
                share_pool: None,
            },
        );
        assert_eq!(
            d.patch().memory_limit_in_bytes,
            Some(128 << 20),
            "kubelet's 128Mi, not 256Mi"
        );
        assert_eq!(d.patch().cpu_quota, Some(50_000), "the node's 500m");
        assert_eq!(d.warnings.len(), 2, "{:?}", d.warnings);
        // kubelet's own CPU limit bounds it too
        let d = container(
            labelled(QosClass::Be),
            "app",
            &ann(SPEC),
            &Requested {
                cpu_quota: 20_000,
                cpu_period: 100_000,
                ..Default::default()
            },
            &Context {
                features: &upstream(),
                v2: false,
                policy: &p,
                page_size: 4096,
                node: &node(),
                devices: &BTreeMap::new(),
                share_pool: None,
            },
        );
        assert_eq!(d.patch().cpu_quota, Some(20_000));
    }

    /// Issue 14 item 9: the pod-level `koordinator.sh/cpuQOS` annotation, as
    /// koordlet's groupidentity `SetPodBvtValue` takes it (LS-labelled pods
    /// only; `groupIdentity` when given, 0 unless enabled), bounded for
    /// untrusted pods (only lowered).
    #[test]
    fn a_pods_cpu_qos_annotation_over_its_class() {
        let bvt = Features {
            bvt: true,
            ..Default::default()
        };
        let gi = |pc: PodClass, a: &str| {
            let ann: BTreeMap<String, String> =
                [(ANNOTATION_CPU_QOS.to_string(), a.to_string())].into();
            let d = container(
                pc,
                "app",
                &ann,
                &Requested::default(),
                &Context {
                    features: &bvt,
                    v2: false,
                    policy: &cpu_on(),
                    page_size: 4096,
                    node: &node(),
                    devices: &BTreeMap::new(),
                    share_pool: None,
                },
            );
            let v = d.cgroup().iter().find_map(|k| match k {
                Knob::GroupIdentity(v) => Some(*v),
                _ => None,
            });
            (v, d.warnings.len())
        };
        let table: &[(PodClass, &str, Option<i64>, usize)] = &[
            // LS to BE: what koordlet allows
            (
                labelled(QosClass::Ls),
                r#"{"enable":true,"groupIdentity":-1}"#,
                Some(-1),
                0,
            ),
            // disabled (or enable unset): 0
            (labelled(QosClass::Ls), r#"{"enable":false}"#, Some(0), 0),
            (
                labelled(QosClass::Ls),
                r#"{"groupIdentity":-1}"#,
                Some(0),
                0,
            ),
            (labelled(QosClass::Ls), r#"{"enable":true}"#, Some(2), 0),
            // out of range, malformed: a warning, the class's value
            (
                labelled(QosClass::Ls),
                r#"{"enable":true,"groupIdentity":5}"#,
                Some(2),
                1,
            ),
            (labelled(QosClass::Ls), "{", Some(2), 1),
            // not an LS-labelled pod: the annotation is not read
            (
                labelled(QosClass::Be),
                r#"{"enable":true,"groupIdentity":2}"#,
                Some(-1),
                0,
            ),
            (
                trusted(QosClass::Lsr),
                r#"{"enable":true,"groupIdentity":-1}"#,
                Some(2),
                0,
            ),
        ];
        for (pc, a, want, warnings) in table {
            assert_eq!(gi(*pc, a), (*want, *warnings), "{pc:?} {a}");
        }
        // an untrusted pod may not raise itself above its class's value; a trusted one may
        let mut low = cpu_on();
        low.ls_class.cpu_qos.group_identity = 0;
        let raised = r#"{"enable":true,"groupIdentity":2}"#;
        let ann: BTreeMap<String, String> =
            [(ANNOTATION_CPU_QOS.to_string(), raised.to_string())].into();
        for (pc, want) in [(labelled(QosClass::Ls), 0), (trusted(QosClass::Ls), 2)] {
            let d = pod(
                pc,
                &ann,
                &SandboxLimits::default(),
                &Context {
                    features: &bvt,
                    v2: false,
                    policy: &low,
                    page_size: 4096,
                    node: &node(),
                    devices: &BTreeMap::new(),
                    share_pool: None,
                },
            );
            assert!(
                d.cgroup().contains(&Knob::GroupIdentity(want)),
                "{pc:?}: {d:?}"
            );
        }
    }

    /// Issue 14 item 9: the pod-level `koordinator.sh/memoryQOS` annotation as
    /// koordlet's `mergePodResourceQoSForMemoryQoS` takes it, bounded for
    /// untrusted pods.
    #[test]
    fn a_pods_memory_qos_annotation_over_its_class() {
        let mut p = ResourceQosStrategy::default();
        p.ls_class.memory_qos.enable = true;
        p.ls_class.memory_qos.min_limit_percent = 50;
        p.ls_class.memory_qos.low_limit_percent = 80;
        p.ls_class.memory_qos.throttling_percent = 60;
        let qp = |p: &ResourceQosStrategy, pc: PodClass, a: &str| {
            let ann: BTreeMap<String, String> =
                [(ANNOTATION_MEMORY_QOS.to_string(), a.to_string())].into();
            let mut w = Vec::new();
            let m = pod_memory_qos(pc, &ann, p, &mut w);
            (
                m.enable,
                m.min_limit_percent,
                m.low_limit_percent,
                m.throttling_percent,
                w.len(),
            )
        };
        let q = |pc: PodClass, a: &str| qp(&p, pc, a);
        let ls = labelled(QosClass::Ls);
        let tls = trusted(QosClass::Ls);
        // (enable, min%, low%, throttling%, warnings)
        type Got = (bool, i64, i64, i64, usize);
        let table: &[(PodClass, &str, Got)] = &[
            // an untrusted pod's none drops its protection, keeps its throttling
            (ls, r#"{"policy":"none"}"#, (true, 0, 0, 60, 0)),
            (tls, r#"{"policy":"none"}"#, (false, 50, 80, 60, 0)),
            // an untrusted pod's auto would take Koordinator's defaults (no throttling): ignored
            (
                ls,
                r#"{"policy":"auto","throttlingPercent":100}"#,
                (true, 50, 80, 60, 2),
            ),
            (ls, r#"{"minLimitPercent":20}"#, (true, 20, 80, 60, 0)),
            // raises from an untrusted pod: ignored, with a warning
            (
                ls,
                r#"{"minLimitPercent":90,"lowLimitPercent":10}"#,
                (true, 50, 10, 60, 1),
            ),
            (ls, r#"{"throttlingPercent":0}"#, (true, 50, 80, 60, 1)),
            (ls, r#"{"throttlingPercent":30}"#, (true, 50, 80, 30, 0)),
            (
                tls,
                r#"{"minLimitPercent":90,"throttlingPercent":0}"#,
                (true, 90, 80, 0, 0),
            ),
            // auto: Koordinator's defaults for the class (0 %), the class's switch
            (tls, r#"{"policy":"auto"}"#, (true, 0, 0, 0, 0)),
            (ls, r#"{"policy":"sometimes"}"#, (true, 50, 80, 60, 1)),
            (ls, r#"{"minLimitPercent":"x"}"#, (true, 50, 80, 60, 1)),
            (tls, r#"{"minLimitPercent":101}"#, (true, 50, 80, 60, 1)),
        ];
        for (pc, a, want) in table {
            assert_eq!(q(*pc, a), *want, "{pc:?} {a}");
        }
        // a class with memory QoS off: a trusted pod's fields turn it on for the
        // pod (they replace the class's); an untrusted pod's cannot
        let mut off = p.clone();
        off.ls_class.memory_qos.enable = false;
        assert!(qp(&off, tls, r#"{"minLimitPercent":40}"#).0);
        assert!(!qp(&off, ls, r#"{"minLimitPercent":40}"#).0);
    }

    /// Group identity as koordlet sets it (groupidentity/rule.go, `parseRule`,
    /// `getPodBvtValue`, `getKubeQOSDirBvtValue`): a class's value when its
    /// cpuQOS is on, 0 when off (written back), SYSTEM by its Kubernetes QoS,
    /// kube QoS dirs kubepods 0 / burstable LS / besteffort BE, all 0 under
    /// coreSched.
    #[test]
    fn group_identity_as_koordlet_sets_it() {
        let on = cpu_on();
        let off = ResourceQosStrategy::default();
        let mut only_be = ResourceQosStrategy::default();
        only_be.be_class.cpu_qos.enable = true;
        let mut only_ls = ResourceQosStrategy::default();
        only_ls.ls_class.cpu_qos.enable = true;
        let mut core = cpu_on();
        core.cpu_policy = CpuPolicy::CoreSched;
        core.be_class.cpu_qos.sched_idle = 1;
        let sys = |kube| PodClass {
            kube: Some(kube),
            ..labelled(QosClass::System)
        };
        // (pod, policy, value)
        let table: &[(PodClass, &ResourceQosStrategy, i64)] = &[
            (labelled(QosClass::Lsr), &on, 2),
            (labelled(QosClass::Lse), &on, 2),
            (labelled(QosClass::Ls), &on, 2),
            (labelled(QosClass::Be), &on, -1),
            (labelled(QosClass::Be), &off, 0),
            (labelled(QosClass::Ls), &only_be, 0),
            (labelled(QosClass::Be), &only_be, -1),
            (sys(KubeQos::Guaranteed), &on, 2),
            (sys(KubeQos::Guaranteed), &only_be, 0),
            (sys(KubeQos::BestEffort), &on, -1),
            (labelled(QosClass::Be), &core, 0),
            // an unlabelled Guaranteed pod with LS on and LSR off: LS's value (koordlet's
            // kubeQOSPodParams), not LSR's
            (
                PodClass {
                    by_label: false,
                    ..labelled(QosClass::Lsr)
                },
                &only_ls,
                2,
            ),
            (
                PodClass {
                    by_label: false,
                    ..labelled(QosClass::Be)
                },
                &only_be,
                -1,
            ),
        ];
        for (pc, p, want) in table {
            assert_eq!(group_identity(*pc, p).0, *want, "{pc:?} {:?}", p.cpu_policy);
        }
        assert_eq!(
            kube_qos_dirs(&on),
            [
                (KubeQos::Guaranteed, 0, false),
                (KubeQos::Burstable, 2, false),
                (KubeQos::BestEffort, -1, false)
            ]
        );
        assert_eq!(
            kube_qos_dirs(&off).map(|d| d.1),
            [0, 0, 0],
            "off: written back to 0"
        );
        assert_eq!(
            kube_qos_dirs(&core),
            [
                (KubeQos::Guaranteed, 0, false),
                (KubeQos::Burstable, 0, false),
                (KubeQos::BestEffort, 0, true)
            ],
            "coreSched: no bvt, SCHED_IDLE on the besteffort dir (schedIdle: 1)"
        );
        // on a bvt kernel: with the rule on, a class that is off gets 0; with it
        // off, nothing is planned (the executor writes back what it set before)
        let bvt = Features {
            bvt: true,
            ..Default::default()
        };
        let on_bvt = |p: &ResourceQosStrategy| {
            container(
                labelled(QosClass::Ls),
                "app",
                &BTreeMap::new(),
                &Requested::default(),
                &Context {
                    features: &bvt,
                    v2: false,
                    policy: p,
                    page_size: 4096,
                    node: &node(),
                    devices: &BTreeMap::new(),
                    share_pool: None,
                },
            )
        };
        let d = on_bvt(&only_be);
        assert_eq!(d.cgroup(), vec![Knob::GroupIdentity(0)]);
        assert_eq!(d.decisions[0].setting(false).0, "cpu.bvt_warp_ns");
        assert!(on_bvt(&off).cgroup().is_empty());
    }

    #[test]
    fn pod_level() {
        assert_eq!(
            run_pod(QosClass::Be, &upstream()).cgroup(),
            vec![Knob::CpuIdle(true)]
        );
        assert!(run_pod(QosClass::Ls, &upstream()).cgroup().is_empty());
    }

    fn pod_with(
        class: QosClass,
        ann: &[(&str, &str)],
        sandbox_limit: i64,
        f: &Features,
        v2: bool,
        p: &ResourceQosStrategy,
        devices: &BTreeMap<String, Device>,
    ) -> PodDecision {
        let a: BTreeMap<String, String> = ann
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        pod(
            trusted(class),
            &a,
            &SandboxLimits {
                memory_limit: sandbox_limit,
                ..Default::default()
            },
            &Context {
                features: f,
                v2,
                policy: p,
                page_size: 4096,
                node: &node(),
                devices,
                share_pool: None,
            },
        )
    }

    #[test]
    fn be_pod_quota_is_the_sum_of_its_containers() {
        let spec = r#"{"containers":{"a":{"requests":{"kubernetes.io/batch-cpu":"500","kubernetes.io/batch-memory":"64Mi"},"limits":{"kubernetes.io/batch-cpu":"1000","kubernetes.io/batch-memory":"128Mi"}},"b":{"requests":{"kubernetes.io/batch-cpu":"500"},"limits":{"kubernetes.io/batch-cpu":"1000","kubernetes.io/batch-memory":"64Mi"}}}}"#;
        let p = cpu_on();
        let none = BTreeMap::new();
        let d = pod_with(
            QosClass::Be,
            &[(ANNOTATION_EXTENDED_RESOURCE_SPEC, spec)],
            0,
            &upstream(),
            false,
            &p,
            &none,
        );
        assert_eq!(
            d.cgroup(),
            vec![
                Knob::CpuIdle(true),
                Knob::CpuQuota {
                    quota: Some(200_000),
                    period: 100_000
                },
                Knob::MemoryLimit(Some(192 << 20)),
            ]
        );
        assert!(d.decisions.iter().any(|r| r.setting(false)
            == ("cpu.cfs_quota_us".into(), "200000".into())
            && r.because.contains("2000m")));
        // on v2 the same decision names cpu.max, with its period
        assert!(d
            .decisions
            .iter()
            .any(|r| r.setting(true) == ("cpu.max".into(), "200000 100000".into())));
        // without cpu.idle (bvt kernels, or cpuQOS off) the pod gets the summed shares
        let bvt = Features {
            bvt: true,
            ..Default::default()
        };
        let d = pod_with(
            QosClass::Be,
            &[(ANNOTATION_EXTENDED_RESOURCE_SPEC, spec)],
            0,
            &bvt,
            false,
            &p,
            &none,
        );
        assert!(d.cgroup().contains(&Knob::CpuShares(1024)), "{d:?}");
        assert!(d.cgroup().contains(&Knob::GroupIdentity(-1)));
        // not BE, or no spec, or a malformed one: identity only (and a warning)
        let d = pod_with(
            QosClass::Ls,
            &[(ANNOTATION_EXTENDED_RESOURCE_SPEC, spec)],
            0,
            &upstream(),
            false,
            &p,
            &none,
        );
        assert!(d.cgroup().is_empty());
        let d = pod_with(
            QosClass::Be,
            &[(ANNOTATION_EXTENDED_RESOURCE_SPEC, "{nope")],
            0,
            &upstream(),
            false,
            &p,
            &none,
        );
        assert_eq!(d.cgroup(), vec![Knob::CpuIdle(true)]);
        assert_eq!(d.warnings.len(), 1, "{d:?}");
    }

    #[test]
    fn pod_memory_qos_where_the_request_is_known() {
        let mut p = ResourceQosStrategy::default();
        p.lsr_class.memory_qos = MemoryQos {
            enable: true,
            min_limit_percent: 100,
            low_limit_percent: 0,
            ..Default::default()
        };
        let none = BTreeMap::new();
        let v2 = Features {
            memory_qos: true,
            ..Default::default()
        };
        let d = pod_with(QosClass::Lsr, &[], 1 << 30, &v2, true, &p, &none);
        assert!(d.cgroup().contains(&Knob::MemoryMin(1 << 30)), "{d:?}");
        assert!(d.cgroup().contains(&Knob::MemoryLow(0)));
        // a guaranteed pod has no room between request and limit: no memory.high
        assert!(!d.cgroup().iter().any(|k| matches!(k, Knob::MemoryHigh(_))));
        // v1 without the files: a warning, nothing written
        let d = pod_with(QosClass::Lsr, &[], 1 << 30, &upstream(), false, &p, &none);
        assert!(d.cgroup().is_empty() && d.warnings.len() == 1, "{d:?}");
        // off by policy (LS default): nothing
        let d = pod_with(QosClass::Ls, &[], 1 << 30, &v2, true, &p, &none);
        assert!(d.cgroup().is_empty() && d.warnings.is_empty());
    }

    #[test]
    fn blkio_limits_per_class_and_device() {
        let mut p = ResourceQosStrategy::default();
        p.be_class.blkio_qos = crate::policy::BlkIoQos {
            enable: true,
            blocks: vec![
                crate::policy::BlockCfg {
                    name: "/dev/vda".into(),
                    block_type: "device".into(),
                    read_bps: 10 << 20,
                    write_iops: 200,
                    ..Default::default()
                },
                crate::policy::BlockCfg {
                    name: "/dev/gone".into(),
                    block_type: "device".into(),
                    read_bps: 1,
                    ..Default::default()
                },
            ],
        };
        let vda = Device {
            major: 254,
            minor: 0,
        };
        let devices: BTreeMap<String, Device> = [("/dev/vda".to_string(), vda)].into();
        let f = Features {
            blkio_throttle: true,
            ..Default::default()
        };
        let d = pod_with(QosClass::Be, &[], 0, &f, false, &p, &devices);
        assert_eq!(
            d.cgroup(),
            vec![Knob::IoLimit {
                device: vda,
                limits: qoslet_cgroups::IoLimits {
                    read_bps: Some(10 << 20),
                    write_iops: Some(200),
                    ..Default::default()
                }
            }]
        );
        assert_eq!(
            d.decisions[0].setting(false),
            (
                "blkio.throttle 254:0".into(),
                "rbps=10485760 wbps=max riops=max wiops=200".into()
            )
        );
        assert_eq!(d.decisions[0].setting(true).0, "io.max 254:0");
        assert!(d.warnings[0].contains("/dev/gone"), "{d:?}");
        assert!(pod_with(QosClass::Ls, &[], 0, &f, false, &p, &devices)
            .cgroup()
            .is_empty());
        let d = pod_with(
            QosClass::Be,
            &[],
            0,
            &Features::default(),
            false,
            &p,
            &devices,
        );
        assert!(
            d.cgroup().is_empty() && d.warnings.len() == 1,
            "no io controller: {d:?}"
        );
    }
}
