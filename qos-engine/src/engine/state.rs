//! The node as a tick sees it: pods, containers, usage, the BE parent, the
//! LS share pool.

use super::*;

/// What one tick reads (from the store, the metrics cache and the cgroups).
#[derive(Debug, Clone, PartialEq)]
pub struct NodeState {
    pub capacity_cores: f64,
    /// All of the node's CPU use (for the share pool).
    pub node_usage_cores: f64,
    /// Node usage minus all pods.
    pub system_usage_cores: f64,
    /// CPU use of the pods' root cgroup (every pod), when known: the non-BE
    /// share is it minus the BE pods', so a pod without a reading this tick
    /// (its first, a read error) still counts.
    pub pods_usage_cores: Option<f64>,
    /// CPU use of the besteffort QoS cgroup (every BE pod), when known: a BE
    /// pod without a reading this tick still counts as BE, not as LS.
    pub be_usage_cores: Option<f64>,
    /// Whether the node and system figures are measured (not this agent's
    /// first tick): when not, CPU suppress leaves the BE quota and cpuset as
    /// they are rather than act on a guess.
    pub usage_known: bool,
    /// kubelet's system + kube reserved CPU.
    pub reserved_cores: f64,
    pub pods: Vec<Pod>,
    /// The besteffort parent cgroup (`kubepods/besteffort`, or the systemd slice).
    pub be_parent: CgroupPath,
    /// Its quota now (`None`: unlimited) and period.
    pub be_quota_us: Option<u64>,
    pub period_us: u64,
    /// Online CPUs per NUMA node.
    pub numa: Vec<Vec<u32>>,
    /// Each CPU's core and socket (hyper-thread siblings share a core); a CPU
    /// missing here counts as its own core on socket 0.
    pub places: BTreeMap<u32, crate::cpuset::CpuPlace>,
    /// The BE parent's cpuset now (`None`: unknown).
    pub be_cpuset: Option<BTreeSet<u32>>,
    /// The kube QoS dirs this node has (`kubepods`, its burstable and besteffort
    /// children), for their group identity / SCHED_IDLE.
    pub qos_dirs: Vec<(KubeQos, CgroupPath)>,
    /// v1: the CPUs of the besteffort parent's own parent. A CPU brought back
    /// online returns to the root cpuset only, so "all CPUs" for the BE tree is
    /// what the NUMA layout lists within these (`None`: no such bound).
    pub cpuset_ceiling: Option<BTreeSet<u32>>,
    /// kubelet's CPU manager policy is `static`: kubelet gives every container a
    /// cpuset (the shared pool, or its own CPUs), so the BE cpuset is written on
    /// BE containers only, as koordlet's `applyCPUSetWithStaticPolicy` does; the
    /// besteffort parent and pods keep all CPUs, so a new BE container created
    /// with the shared pool stays inside its parents (v1 refuses it otherwise).
    /// `be_cpuset` is then a BE container's.
    pub static_cpu_manager: bool,
    /// kubelet's shared pool (`defaultCpuSet` of its `cpu_manager_state`) under
    /// the static policy: CPUs outside it are pods' exclusive ones.
    pub shared_pool: Option<BTreeSet<u32>>,
    /// memory.min / memory.low (`KnobKind::MemoryMin`, `MemoryLow`) of the pods'
    /// ancestors (their QoS dir and `kubepods`) as read this tick; empty when not
    /// read. A value qoslet did not write there (kubelet's MemoryQoS writes its
    /// own) is kept if higher than qoslet's sum, never fought.
    pub ancestors: BTreeMap<(CgroupPath, KnobKind), u64>,
    /// Names this set of pods: the same value on the next tick promises the
    /// same pods, classes, annotations and limits (usage aside), so the
    /// reconcile writes are reused (`None`: always recomputed).
    pub pods_generation: Option<u64>,
}

impl NodeState {
    /// Every CPU the BE tree may use: the NUMA layout's, within the ceiling.
    pub fn all_cpus(&self) -> BTreeSet<u32> {
        self.numa
            .iter()
            .flatten()
            .copied()
            .filter(|c| self.cpuset_ceiling.as_ref().is_none_or(|x| x.contains(c)))
            .collect()
    }

    /// The CPUs a BE cpuset may take: [`NodeState::all_cpus`], and under kubelet's
    /// static CPU manager only its shared pool.
    pub fn be_cpus(&self) -> BTreeSet<u32> {
        let mut all = self.all_cpus();
        if let (true, Some(pool)) = (self.static_cpu_manager, &self.shared_pool) {
            all.retain(|c| pool.contains(c));
        }
        all
    }
}

/// The CPU share pool as koordlet's cpuburst `getNodeStateForBurst` sizes it
/// (in cores, from requests: not the CPU set [`qoslet_hooks::decide::BoundCpus`]
/// leaves, which is where containers are placed):
/// the node's cores minus the CPU requests of pods labelled LSE/LSR, and the
/// node's usage (system included) minus the usage of pods labelled LSE/LSR/BE.
/// (capacity, usage) in cores.
pub fn burst_pool(state: &NodeState) -> (f64, f64) {
    let mut capacity = state.capacity_cores;
    let mut usage = state.node_usage_cores;
    for p in state.pods.iter().filter(|p| p.by_label) {
        if matches!(p.class, QosClass::Lse | QosClass::Lsr) {
            // a Guaranteed pod requests what it limits
            capacity -= p
                .containers
                .iter()
                .filter(|c| c.entry.cpu_quota > 0 && c.entry.cpu_period > 0)
                .map(|c| c.entry.cpu_quota as f64 / c.entry.cpu_period as f64)
                .sum::<f64>();
        }
        if matches!(p.class, QosClass::Lse | QosClass::Lsr | QosClass::Be) {
            usage -= p.cpu_cores;
        }
    }
    (capacity, usage.max(0.0))
}

/// BE CPU as Koordinator's BE CPU-satisfaction eviction reads it (koordlet's
/// BE resource collector), from what one tick observed; milli-cores.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BeCpu {
    /// The real BE limit: the BE cpuset's CPUs × 1000 (all of the BE tree's
    /// when unknown), capped by the besteffort parent's CFS quota.
    pub real_limit_milli: i64,
    /// The batch-cpu requests of the pods labelled BE whose annotations are
    /// trusted (`trust:`): a pod author's own figure would let one BE pod
    /// make every other BE pod look starved and evicted.
    pub request_milli: i64,
    /// Pods labelled BE with a batch-cpu request that was not counted (not trusted).
    pub untrusted: usize,
    /// What the besteffort parent used (`None`: not measured this tick).
    pub usage_milli: Option<i64>,
    /// Per BE pod (sandbox id): CPU used and its batch-cpu request counted.
    pub pods: HashMap<String, (i64, i64)>,
}

impl NodeState {
    /// [`BeCpu`] as this tick sees it.
    pub fn be_cpu(&self) -> BeCpu {
        use qoslet_hooks::batch::{parse_spec, pod_total, source, Caps};
        let milli = |cores: f64| (cores * 1000.0).round() as i64;
        let cpus = self
            .be_cpuset
            .as_ref()
            .map(|s| s.len())
            .unwrap_or_else(|| self.all_cpus().len()) as i64;
        let mut real_limit_milli = cpus * 1000;
        if let Some(q) = self.be_quota_us {
            let by_quota = (q as i128 * 1000 / self.period_us.max(1) as i128) as i64;
            real_limit_milli = real_limit_milli.min(by_quota);
        }
        let caps = Caps {
            milli_cpu: (self.capacity_cores > 0.0).then(|| milli(self.capacity_cores) as u64),
            memory: None,
        };
        let mut out = BeCpu {
            real_limit_milli,
            usage_milli: self.be_usage_cores.map(milli),
            ..Default::default()
        };
        for p in self
            .pods
            .iter()
            .filter(|p| p.by_label && p.class == QosClass::Be)
        {
            let request = source(&p.annotations, p.spec_batch())
                .and_then(|(a, _)| parse_spec(a).ok())
                .and_then(|s| {
                    pod_total(&s.containers)
                        .bounded(&caps, true)
                        .0
                        .cpu_request_milli
                })
                .map(|r| i64::try_from(r).unwrap_or(i64::MAX))
                .unwrap_or(0);
            let counted = if p.trusted {
                request
            } else {
                out.untrusted += usize::from(request > 0);
                0
            };
            out.request_milli = out.request_milli.saturating_add(counted);
            out.pods.insert(p.id.clone(), (milli(p.cpu_cores), counted));
        }
        out
    }
}
