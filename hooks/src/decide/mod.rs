//! Per-container decisions: what qoslet changes in a container's resources at
//! CreateContainer (so the runtime applies it at create), and which cgroup
//! settings it writes once the container runs (what CRI cannot carry).
//! Every setting comes with the rule that produced it (for `explain`).
//!
//! * here: the inputs ([`Requested`], [`Context`], [`NodeFacts`]), the
//!   decision types ([`Decision`], [`Action`], [`ContainerDecision`],
//!   [`PodDecision`], [`ResourcePatch`], [`Plugin`]), [`pod`] and [`container`].
//! * `cpuset`: bindings, the LS share pool, NUMA nodes.
//! * `identity`: group identity / `cpu.idle`, `cpuQOS`, the QoS dirs.
//! * `memory`: memory QoS, `memoryQOS`, the memory tunes.
//! * `blkio`: a class's block I/O limits.
//! * `annotations`: the annotations read, bounded.

use std::collections::{BTreeMap, BTreeSet};

use qoslet_cgroups::cgroup::{format_cpu_list, parse_cpu_list};
use qoslet_cgroups::{Device, Features, Knob};

use crate::batch::{parse_spec, pod_total, Batch, Caps, Source, SpecBatch};
use crate::class::{KubeQos, PodClass, QosClass};
use crate::policy::{memory_qos, CpuPolicy, MemRequest, MemoryQos, ResourceQosStrategy};
use crate::warning::{shown, AnnotationProblem, BindingRefused, QuotaKept, Warning};

mod annotations;
mod blkio;
mod cpuset;
mod identity;
mod memory;
#[cfg(test)]
mod tests;

pub use annotations::*;
use blkio::*;
pub use cpuset::*;
pub use identity::*;
pub use memory::*;

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
    pub warnings: Vec<Warning>,
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
    pub warnings: Vec<Warning>,
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

/// The pod-level decision, applied to the pod's own cgroup (the sandbox's
/// cgroup parent) after RunPodSandbox: group identity; for BE pods with batch
/// resources the pod's CFS quota, shares and memory limit (the sum of its
/// containers'); memory QoS where the pod's memory request is known (BE batch
/// memory, or a guaranteed pod's limit from the sandbox config); the CFS quota
/// unset for a pod bound to CPUs; and the class's block I/O limits.
/// `sandbox`: what the sandbox config asked for the whole pod;
/// `spec_batch`: the pod spec's batch resources ([`crate::batch::source`]).
pub fn pod(
    pc: PodClass,
    pod_annotations: &BTreeMap<String, String>,
    spec_batch: SpecBatch,
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
            Err(reason) => d.warnings.push(Warning::QuotaKept { pod: true, reason }),
        }
    }
    let mut memory_request = None;
    if class == QosClass::Be {
        if let Some((a, source)) = batch_input(pc, pod_annotations, spec_batch, &mut d.warnings) {
            match parse_spec(a) {
                Ok(parsed) if !parsed.containers.is_empty() => {
                    let spec = parsed.containers;
                    let caps = Caps {
                        milli_cpu: nonzero(ctx.node.milli_cpus),
                        memory: nonzero(ctx.node.memory_bytes),
                    };
                    let (total, warnings) = pod_total(&spec).bounded(&caps, true);
                    d.warnings.extend(warnings);
                    let r = total.resources();
                    // an idle (SCHED_IDLE) cgroup has no weight: the kernel refuses
                    // shares writes on it, and its containers' shares still apply
                    let idle = d.cgroup().contains(&Knob::CpuIdle(true));
                    if let (Some(s), false) = (r.cpu_shares, idle) {
                        d.decisions.push(cgroup(
                            Knob::CpuShares(s),
                            format!(
                                "BE pod: batch-cpu requests {}m in all ({source})",
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
                                "BE pod: batch-cpu limits {}m in all ({source})",
                                total.cpu_limit_milli.unwrap_or(0)
                            ),
                        ));
                    }
                    if let Some(m) = r.memory_limit {
                        d.decisions.push(cgroup(
                            Knob::MemoryLimit(Some(m)),
                            format!("BE pod: batch-memory limits in all ({source})"),
                        ));
                    }
                    // memory protection (min/low) from a batch request is a raise: trusted pods only
                    memory_request = total
                        .memory_request
                        .filter(|_| pc.trusted)
                        .map(|r| (r, total.memory_limit));
                }
                Ok(_) => {}
                Err(e) => d.warnings.push(Warning::BatchSpec(e)),
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
            d.warnings.push(Warning::NoMemoryQosPod);
        }
    }
    d.decisions.extend(memory_tunes(class, &mq, ctx));
    blkio(class, ctx, &mut d);
    d
}

/// The container-level decision. `requested`: what kubelet asked for the
/// container; qoslet narrows it (batch resources are capped by kubelet's limits
/// and the node's capacity), never widens it.
pub fn container(
    pc: PodClass,
    container_name: &str,
    pod_annotations: &BTreeMap<String, String>,
    spec_batch: SpecBatch,
    requested: &Requested,
    ctx: &Context,
) -> ContainerDecision {
    let class = pc.class;
    let mut d = ContainerDecision::default();
    let mq = pod_memory_qos(pc, pod_annotations, ctx.policy, &mut d.warnings);
    if class == QosClass::Be {
        if let Some((a, source)) = batch_input(pc, pod_annotations, spec_batch, &mut d.warnings) {
            match parse_spec(a) {
                Ok(parsed) => {
                    for e in &parsed.bad {
                        d.warnings.push(Warning::BatchValue(e.clone()));
                    }
                    if let Some(b) = parsed.containers.get(container_name) {
                        let caps = Caps {
                            milli_cpu: min_opt(nonzero(ctx.node.milli_cpus), requested.milli_cpu()),
                            memory: min_opt(
                                nonzero(ctx.node.memory_bytes),
                                nonzero(requested.memory_limit.max(0) as u64),
                            ),
                        };
                        let (b, warnings) = b.bounded(&caps, false);
                        d.warnings.extend(warnings);
                        batch(&b, source, &mut d);
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
                Err(e) => d.warnings.push(Warning::BatchSpec(e)),
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
                Err(reason) => d.warnings.push(Warning::QuotaKept { pod: false, reason }),
            }
            true
        }
        Ok(None) => false,
        Err(why) => {
            d.warnings.push(Warning::Binding(why));
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

fn batch(b: &Batch, source: Source, d: &mut ContainerDecision) {
    let r = b.resources();
    if let Some(s) = r.cpu_shares {
        d.decisions.push(cri(
            Knob::CpuShares(s),
            format!(
                "BE batch-cpu request {}m ({source})",
                b.cpu_request_milli.unwrap_or(0)
            ),
        ));
    }
    if let Some(q) = r.cpu_quota {
        d.decisions.push(cri(
            Knob::CpuQuota {
                quota: Some(q),
                period: r.cpu_period,
            },
            format!(
                "BE batch-cpu limit {}m per {} µs ({source})",
                b.cpu_limit_milli.unwrap_or(0),
                r.cpu_period
            ),
        ));
    }
    if let Some(m) = r.memory_limit {
        d.decisions.push(cri(
            Knob::MemoryLimit(Some(m)),
            format!("BE batch-memory limit ({source})"),
        ));
    }
}
