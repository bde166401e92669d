//! One engine tick: the node's state in, a merged plan out. The plugins run
//! in a fixed order over the same plan:
//!
//! 1. reconcile: what the runtime hooks set on every pod and container (cpu
//!    QoS, memory QoS, batch resources, CPU binding, block I/O), re-derived
//!    from the current policy;
//! 2. CPU suppress: the BE allowance as a CFS quota on the besteffort parent
//!    or as a BE cpuset; the policy not in use is put back (unlimited quota,
//!    all CPUs);
//! 3. CPU burst: CFS burst and quota scaling for LS containers with limits.
//!
//! Where two plugins set the same file, the strictest value wins.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use qoslet_cgroups::{CgroupPath, Cgroups, Device, Features, Knob, KnobKind};
use qoslet_hooks::decide::{Context, NodeFacts};
use qoslet_hooks::policy::ResourceQosStrategy;
use qoslet_hooks::{KubeQos, QosClass};

use crate::burst::{self, BurstPolicy, CpuBurstStrategy, Pool};
use crate::execute::{Executor, Report};
use crate::plan::{Plan, Plugin, Write};
use crate::policy::{CpuSuppressPolicy, ResourceThresholdStrategy};
use crate::reconcile::{self, Container, Pod};
use crate::suppress::{self, Level};

/// The whole policy, with NodeSLO's names.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Policy {
    pub threshold: ResourceThresholdStrategy,
    pub burst: CpuBurstStrategy,
    pub qos: ResourceQosStrategy,
}

/// What the host offers (fixed while qoslet runs).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Env {
    pub features: Features,
    pub v2: bool,
    /// The policy's block devices resolved on this host.
    pub devices: BTreeMap<String, Device>,
    pub page_size: u64,
    /// Online and reserved CPUs, capacity (bounds for what pods' annotations ask).
    pub node: NodeFacts,
}

impl Env {
    /// The hooks' decision context for `policy` on this host.
    pub fn context<'a>(&'a self, policy: &'a ResourceQosStrategy) -> Context<'a> {
        Context {
            features: &self.features,
            v2: self.v2,
            policy,
            page_size: self.page_size.max(1),
            node: &self.node,
            devices: &self.devices,
            share_pool: None,
        }
    }
}

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

/// A tick's result.
#[derive(Debug, Clone, PartialEq)]
pub struct TickResult {
    pub plan: Plan,
    pub allowance_cores: f64,
    pub level: Level,
    pub non_be_usage_cores: f64,
    pub be_usage_cores: f64,
    /// The share pool's state (`None`: burst is off).
    pub pool: Option<Pool>,
    /// The LS containers' quotas after burst scaling, by container id.
    pub burst_quota: HashMap<String, u64>,
    /// Problems worth a log line (a policy the kernel cannot do here).
    pub warnings: Vec<String>,
}

fn w(cgroup: &CgroupPath, knob: Knob, plugin: Plugin, rule: String) -> Write {
    Write {
        cgroup: cgroup.clone(),
        knob,
        plugin,
        rule,
    }
}

/// The CPUs bound to LSE and to LSR pods, and which pods are bound.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BoundCpus {
    pub lse: BTreeSet<u32>,
    pub lsr: BTreeSet<u32>,
    pub pods: std::collections::HashSet<String>,
}

/// The reconcile writes of all pods (with memory protection summed up the
/// tree) and the CPUs bound to LSE/LSR pods.
pub fn reconcile_all(state: &NodeState, ctx: &Context) -> (Plan, BoundCpus) {
    let mut plan = Plan::new();
    // the CPUs online now (the NUMA layout follows hotplug) within the v1
    // ceiling: what pods may run on, bindings included
    // (only where the online CPUs are known at all: without sysfs the NUMA
    // layout is made up from the capacity, and nothing is bound against it)
    let mut node = ctx.node.clone();
    let now = state.all_cpus();
    if !now.is_empty() && !node.online_cpus.is_empty() {
        node.online_cpus = now;
    }
    let mut exclusive = BoundCpus::default();
    let mut bound = Vec::new();
    for p in &state.pods {
        for cpus in reconcile::bound(p, &node) {
            exclusive.pods.insert(p.id.clone());
            match p.class {
                QosClass::Lse => exclusive.lse.extend(&cpus),
                _ => exclusive.lsr.extend(&cpus),
            }
            bound.push(cpus);
        }
    }
    let pool = qoslet_hooks::decide::share_pool(&node.online_cpus, bound);
    let ctx = Context {
        node: &node,
        share_pool: Some(qoslet_hooks::decide::SharePool {
            cpus: &pool,
            whole: &node.online_cpus,
            explicit: false,
        }),
        ..*ctx
    };
    for p in &state.pods {
        reconcile::pod(p, &ctx, &mut plan);
    }
    reconcile::kube_qos(&state.qos_dirs, &ctx, &mut plan);
    (plan, exclusive)
}

/// Runs the plugins over `state` and merges their writes. `burst_quota`: the
/// LS quotas the last tick left (by container id; missing: the limit).
pub fn tick(
    state: &NodeState,
    policy: &Policy,
    env: &Env,
    burst_quota: &HashMap<String, u64>,
) -> TickResult {
    tick_with(
        state,
        policy,
        env,
        burst_quota,
        &Default::default(),
        None,
        &BTreeMap::new(),
    )
}

/// What others asked of the pods' ancestors' memory.min/low (by cgroup and knob name).
pub type Protection = BTreeMap<(CgroupPath, KnobKind), u64>;

/// [`tick`] with the reconcile writes and bound CPUs already known.
fn tick_with(
    state: &NodeState,
    policy: &Policy,
    env: &Env,
    burst_quota: &HashMap<String, u64>,
    limited: &std::collections::HashSet<String>,
    cached: Option<&(Plan, BoundCpus)>,
    external: &Protection,
) -> TickResult {
    let mut warnings = Vec::new();

    // 1. reconcile (reused when the pods and the policy are the last tick's), then
    // the ancestors' memory protection (which also follows what others wrote there)
    let (mut plan, exclusive) = match cached {
        Some(c) => (c.0.clone(), c.1.clone()),
        None => reconcile_all(state, &env.context(&policy.qos)),
    };
    memory_protection_up_the_tree(state, &mut plan, external);

    // 2. suppress
    let (mut be, mut non_be) = (0.0, 0.0);
    for p in &state.pods {
        match p.class {
            QosClass::Be => be += p.cpu_cores,
            _ => non_be += p.cpu_cores,
        }
    }
    if let Some(all) = state.be_usage_cores {
        be = be.max(all);
    }
    if let Some(all) = state.pods_usage_cores {
        non_be = non_be.max(all - be);
    }
    let t = &policy.threshold;
    let input = suppress::Input {
        capacity_cores: state.capacity_cores,
        non_be_pod_usage_cores: non_be,
        host_app_usage_cores: 0.0,
        system_usage_cores: state.system_usage_cores,
        reserved_cores: state.reserved_cores,
        be_usage_cores: be,
        current_quota_us: state.be_quota_us,
        period_us: state.period_us,
    };
    let mut s = suppress::cfs_quota(&input, t);
    if !state.usage_known {
        s.quota_us = None;
        s.rule = "node and system CPU not measured yet: the BE quota is left as it is".into();
    }
    let be_tree: Vec<&CgroupPath> = state
        .pods
        .iter()
        .filter(|p| p.class == QosClass::Be)
        .flat_map(|p| {
            std::iter::once(&p.cgroup)
                .chain(p.sandbox.as_ref())
                .chain(p.containers.iter().map(|c| &c.entry.cgroup))
        })
        .collect();
    let quota_on = t.enable && t.cpu_suppress_policy == CpuSuppressPolicy::CfsQuota;
    let cpuset_on = t.enable && t.cpu_suppress_policy == CpuSuppressPolicy::Cpuset;
    if quota_on {
        // unchanged (within the dead band) stays in the plan, so the plan always shows the rule
        if let Some(q) = s.quota_us.or(state.be_quota_us) {
            plan.add(w(
                &state.be_parent,
                Knob::CpuQuota {
                    quota: Some(q),
                    period: state.period_us,
                },
                Plugin::CpuSuppress,
                s.rule.clone(),
            ));
        }
        if !env.v2 {
            cap_be_children(state, s.quota_us.or(state.be_quota_us), &mut plan);
        }
    } else if state.be_quota_us.is_some() {
        let why = if t.enable {
            "suppress policy is cpuset"
        } else {
            "resourceUsedThresholdWithBE disabled"
        };
        plan.add(w(
            &state.be_parent,
            Knob::CpuQuota {
                quota: None,
                period: state.period_us,
            },
            Plugin::CpuSuppress,
            format!("{why}: the BE quota is put back to unlimited"),
        ));
    }
    let all = state.all_cpus();
    let pool = state.be_cpus();
    if state.static_cpu_manager && !all.is_empty() {
        // the besteffort parent, the BE pods and their sandboxes keep all CPUs
        // (after a switch from the other mode too), so kubelet's shared pool fits
        let list = if env.v2 {
            String::new()
        } else {
            crate::cpuset::format_cpus(&all)
        };
        let rule = "kubelet's static CPU manager: the BE cpuset is set on BE containers; their parents keep all CPUs";
        let containers: BTreeSet<&CgroupPath> =
            be_containers(state).map(|c| &c.entry.cgroup).collect();
        for cg in std::iter::once(&state.be_parent)
            .chain(be_tree.iter().copied())
            .filter(|cg| !containers.contains(cg))
        {
            plan.add(w(
                cg,
                Knob::CpusetCpus(list.clone()),
                Plugin::CpuSuppress,
                rule.into(),
            ));
        }
    }
    if cpuset_on && !all.is_empty() {
        let c = crate::cpuset::Input {
            // within the ceiling (v1 hotplug) and, under kubelet's static CPU
            // manager, its shared pool (the other CPUs are pods' exclusive ones);
            // kubelet's reserved CPUs are BE's too, as koordlet has them (it
            // leaves out only the node annotation's reservation)
            numa: state
                .numa
                .iter()
                .map(|n| n.iter().copied().filter(|c| pool.contains(c)).collect())
                .collect(),
            places: state.places.clone(),
            lse: exclusive.lse.clone(),
            lsr: exclusive.lsr.clone(),
            allowance_cores: s.allowance_cores,
            current: state.be_cpuset.clone(),
            node_cpus: state.numa.iter().map(Vec::len).sum(),
        };
        let next = if state.usage_known {
            crate::cpuset::be_cpuset(&c)
        } else {
            None
        };
        if let Some(cpus) = next.or_else(|| state.be_cpuset.clone()) {
            let list = crate::cpuset::format_cpus(&cpus);
            let rule = format!(
                "BE allowance {:.2} cores -> {} CPUs (not LSE's {}, LSR's {} in proportion; sibling pairs first)",
                s.allowance_cores,
                cpus.len(),
                exclusive.lse.len(),
                exclusive.lsr.len()
            );
            if state.static_cpu_manager {
                for c in be_containers(state) {
                    plan.add(w(
                        &c.entry.cgroup,
                        Knob::CpusetCpus(list.clone()),
                        Plugin::CpuSuppress,
                        format!("{rule}; kubelet's static CPU manager: BE containers only"),
                    ));
                }
            } else {
                be_cpuset_everywhere(state, &be_tree, &list, &rule, &mut plan);
            }
        }
    } else if state.static_cpu_manager && !all.is_empty() {
        // not suppressing: BE containers keep (or get back) kubelet's own cpuset
        for c in be_containers(state) {
            let (list, rule) = if !c.entry.cpuset_cpus.is_empty() {
                (
                    c.entry.cpuset_cpus.clone(),
                    "BE cpuset not suppressed: kubelet's cpuset (static CPU manager)",
                )
            } else if env.v2 {
                (String::new(), "BE cpuset not suppressed: inherited (empty)")
            } else {
                (
                    crate::cpuset::format_cpus(&all),
                    "BE cpuset not suppressed: all CPUs",
                )
            };
            plan.add(w(
                &c.entry.cgroup,
                Knob::CpusetCpus(list),
                Plugin::CpuSuppress,
                rule.into(),
            ));
        }
    } else if state.be_cpuset.as_ref().is_some_and(|c| *c != all) && !all.is_empty() {
        // v2: the empty value the runtime left (inherit the parent's), not a list
        // that would stay fixed through CPU hotplug; v1 has no inheriting value
        let (list, rule) = if env.v2 {
            (
                String::new(),
                "BE cpuset not suppressed: inherited again (empty)",
            )
        } else {
            (
                crate::cpuset::format_cpus(&all),
                "BE cpuset not suppressed: all CPUs again",
            )
        };
        be_cpuset_everywhere(state, &be_tree, &list, rule, &mut plan);
    }

    // 3. burst
    let (pool, burst_quota) = burst_plugin(
        state,
        policy,
        env,
        &BurstInputs {
            last: burst_quota,
            limited,
            bound: &exclusive.pods,
        },
        &mut plan,
        &mut warnings,
    );

    TickResult {
        plan,
        allowance_cores: s.allowance_cores,
        level: if quota_on || cpuset_on {
            s.level
        } else {
            Level::None
        },
        non_be_usage_cores: non_be,
        be_usage_cores: be,
        pool,
        burst_quota,
        warnings,
    }
}

fn be_containers(state: &NodeState) -> impl Iterator<Item = &Container> {
    state
        .pods
        .iter()
        .filter(|p| p.class == QosClass::Be)
        .flat_map(|p| &p.containers)
}

/// The BE cpuset on the besteffort parent and every BE pod and container
/// (on v1 a child's CPUs must lie within its parent's; the executor orders them).
fn be_cpuset_everywhere(
    state: &NodeState,
    be_tree: &[&CgroupPath],
    list: &str,
    rule: &str,
    plan: &mut Plan,
) {
    for cg in std::iter::once(&state.be_parent).chain(be_tree.iter().copied()) {
        plan.add(w(
            cg,
            Knob::CpusetCpus(list.to_string()),
            Plugin::CpuSuppress,
            rule.to_string(),
        ));
    }
}

/// What [`restore_plan`] needs from the files (the caller reads them).
#[derive(Debug, Clone, Default)]
pub struct Found {
    /// CFS quota (`None`: unlimited) and period of the pods and containers.
    pub quotas: HashMap<CgroupPath, (Option<u64>, u64)>,
    /// Every cgroup under the besteffort parent (its pods, their containers and
    /// sandboxes, in the store or not).
    pub be_subtree: Vec<CgroupPath>,
}

/// The quota a bound pod's own cgroup had before qoslet unset it, as kubelet
/// sets it: the sum of its containers' limits when every one has a limit
/// (init containers and overhead aside), else none (`None`: `w` is not such a write).
fn bound_pod_quota(state: &NodeState, w: &Write) -> Option<Knob> {
    let Knob::CpuQuota {
        quota: None,
        period,
    } = w.knob
    else {
        return None;
    };
    let p = state.pods.iter().find(|p| p.cgroup == w.cgroup)?;
    if !matches!(p.class, QosClass::Lse | QosClass::Lsr) || p.containers.is_empty() {
        return None;
    }
    let mut sum = 0u128;
    for c in &p.containers {
        if c.entry.cpu_quota <= 0 {
            return None;
        }
        sum += c.entry.cpu_quota as u128 * period as u128 / c.entry.cpu_period.max(1000) as u128;
    }
    Some(Knob::CpuQuota {
        quota: Some(u64::try_from(sum).unwrap_or(u64::MAX)),
        period,
    })
}

/// What `qoslet restore` (and `qosEngine.restoreOnExit`) writes: every file
/// qoslet may have changed, back to the runtime's value or the kernel's
/// default, so that nothing qoslet did outlives it (new BE pods would inherit
/// a suppressed besteffort parent):
///
/// * the besteffort parent: no quota, all CPUs (v2: the inherited empty cpuset);
/// * every pod and container: group identity 0, SCHED_IDLE off, burst 0 (where
///   the kernel has them); CPU quota as kubelet set it (a scaled or capped
///   quota back to the limit; a pod's to the sum of its containers'), except
///   where the hooks' own CRI settings gave one (containerd holds those);
/// * BE pods and containers: the cpuset back to all CPUs (or kubelet's own);
/// * the kube QoS dirs: group identity and SCHED_IDLE off;
/// * memory.min/low/high and I/O limits qoslet's policy sets: the kernel's defaults.
pub fn restore_plan(state: &NodeState, policy: &Policy, env: &Env, found: &Found) -> Plan {
    const WHY: &str = "qoslet restore: the runtime's value / the kernel's default";
    let mut plan = Plan::new();
    let (mut reconciled, _) = reconcile_all(state, &env.context(&policy.qos));
    // the QoS dirs' memory.min/low on v2 are kubelet's too (MemoryQoS): left as
    // they are rather than zeroed under it; v1 has no other writer there
    if !env.v2 {
        memory_protection_up_the_tree(state, &mut reconciled, &Protection::new());
    }
    for r in reconciled.writes() {
        // a share-pool cpuset goes back to kubelet's; a bound pod's unset quota
        // to its containers' sum; what the runtime's spec holds stays
        let knob = reconciled
            .restore_of(&crate::plan::key(r))
            .cloned()
            .or_else(|| crate::execute::restore_value_on(&r.knob, env.v2))
            .or_else(|| bound_pod_quota(state, r))
            .unwrap_or_else(|| r.knob.clone());
        plan.add(w(&r.cgroup, knob, Plugin::Restore, WHY.into()));
    }
    let f = &env.features;
    let defaults = |plan: &mut Plan, cg: &CgroupPath| {
        let mut add = |k: Knob| {
            let wr = w(cg, k, Plugin::Restore, WHY.into());
            if !plan.contains(&crate::plan::key(&wr)) {
                plan.add(wr);
            }
        };
        if f.bvt {
            add(Knob::GroupIdentity(0));
        }
        if f.cpu_idle {
            add(Knob::CpuIdle(false));
        }
        if f.cpu_burst {
            add(Knob::CpuBurst(0));
        }
    };
    for (_, cg) in &state.qos_dirs {
        defaults(&mut plan, cg);
    }
    let all = state.all_cpus();
    let all_cpus = if env.v2 {
        Some(String::new())
    } else {
        (!all.is_empty()).then(|| crate::cpuset::format_cpus(&all))
    };
    if !state.be_parent.as_str().is_empty() {
        plan.add(w(
            &state.be_parent,
            Knob::CpuQuota {
                quota: None,
                period: state.period_us,
            },
            Plugin::Restore,
            WHY.into(),
        ));
        if let Some(c) = &all_cpus {
            plan.add(w(
                &state.be_parent,
                Knob::CpusetCpus(c.clone()),
                Plugin::Restore,
                WHY.into(),
            ));
        }
    }
    let planned =
        |plan: &Plan, cg: &CgroupPath, kind: KnobKind| plan.contains(&(cg.clone(), kind, None));
    let known: BTreeSet<&CgroupPath> = state
        .pods
        .iter()
        .flat_map(|p| p.containers.iter().map(|c| &c.entry.cgroup))
        .collect();
    for p in &state.pods {
        defaults(&mut plan, &p.cgroup);
        // quotas only where the file shows qoslet's change: a container above
        // kubelet's limit (burst scaling) or below it (a BE cap) goes back to the
        // limit; its pod loses exactly what scaling added (kubelet's own pod quota
        // counts init containers and overhead the store does not know)
        let pod_file = found.quotas.get(&p.cgroup).copied();
        let mut delta: i128 = 0;
        for c in &p.containers {
            defaults(&mut plan, &c.entry.cgroup);
            let period = c.entry.cpu_period.max(1000) as u64;
            if c.entry.cpu_quota > 0 && !planned(&plan, &c.entry.cgroup, KnobKind::CpuQuota) {
                let limit = c.entry.cpu_quota as u64;
                if let Some((Some(q), fp)) = found.quotas.get(&c.entry.cgroup).copied() {
                    // compared at the container's own period
                    let q = (q as u128 * period as u128 / fp.max(1) as u128) as u64;
                    if q != limit {
                        plan.add(w(
                            &c.entry.cgroup,
                            Knob::CpuQuota {
                                quota: Some(limit),
                                period,
                            },
                            Plugin::Restore,
                            WHY.into(),
                        ));
                        // only burst scaling moved the pod with its containers (a BE
                        // cap left the pod alone)
                        if let (Some((_, pp)), true) = (pod_file, q > limit) {
                            delta += (q as i128 - limit as i128) * pp as i128 / period as i128;
                        }
                    }
                }
            }
            if p.class == QosClass::Be && !planned(&plan, &c.entry.cgroup, KnobKind::CpusetCpus) {
                let own = (!c.entry.cpuset_cpus.is_empty()).then(|| c.entry.cpuset_cpus.clone());
                if let Some(cpus) = own.or_else(|| all_cpus.clone()) {
                    plan.add(w(
                        &c.entry.cgroup,
                        Knob::CpusetCpus(cpus),
                        Plugin::Restore,
                        WHY.into(),
                    ));
                }
            }
        }
        if let (Some((Some(pq), pp)), true) = (pod_file, delta != 0) {
            if !planned(&plan, &p.cgroup, KnobKind::CpuQuota) {
                let back = (pq as i128 - delta).max(suppress::MIN_QUOTA_US as i128) as u64;
                plan.add(w(
                    &p.cgroup,
                    Knob::CpuQuota {
                        quota: Some(back),
                        period: pp,
                    },
                    Plugin::Restore,
                    WHY.into(),
                ));
            }
        }
        if p.class == QosClass::Be && !planned(&plan, &p.cgroup, KnobKind::CpusetCpus) {
            if let Some(c) = &all_cpus {
                for cg in std::iter::once(&p.cgroup).chain(p.sandbox.as_ref()) {
                    plan.add(w(
                        cg,
                        Knob::CpusetCpus(c.clone()),
                        Plugin::Restore,
                        WHY.into(),
                    ));
                }
            }
        }
    }
    // the besteffort subtree as the kernel lists it: pods created after qoslet
    // stopped (v1 copies the parent's cpuset into a new cgroup) and sandboxes;
    // with kubelet's static CPU manager, containers qoslet does not know keep
    // kubelet's cpuset
    if let Some(c) = &all_cpus {
        for cg in &found.be_subtree {
            let container_level = cg.parent().is_some_and(|p| p != state.be_parent);
            if planned(&plan, cg, KnobKind::CpusetCpus)
                || known.contains(cg)
                || (state.static_cpu_manager && container_level)
            {
                continue;
            }
            plan.add(w(
                cg,
                Knob::CpusetCpus(c.clone()),
                Plugin::Restore,
                WHY.into(),
            ));
        }
    }
    plan
}

/// The ancestors whose memory.min/low qoslet sets: each pod's QoS dir and the
/// one above it.
pub fn protected_ancestors(state: &NodeState) -> BTreeSet<CgroupPath> {
    let mut out = BTreeSet::new();
    for p in &state.pods {
        let mut up = p.cgroup.parent();
        for _ in 0..2 {
            match up {
                Some(a) if !a.as_str().is_empty() => {
                    up = a.parent();
                    out.insert(a);
                }
                _ => break,
            }
        }
    }
    out
}

/// A cgroup's memory.min/low protects it only up to what its ancestors
/// protect: the QoS dir above each pod (`kubepods/burstable`) and the one
/// above that (`kubepods`) get the sum of their pods' protections, or what
/// something else asks there (`external`: kubelet's MemoryQoS writes its
/// own every minute) when that is more: the higher value wins, so the two
/// never take turns overwriting each other.
fn memory_protection_up_the_tree(state: &NodeState, plan: &mut Plan, external: &Protection) {
    // the managed ancestors (each pod's QoS dir and the one above), deepest first
    let ancestors = protected_ancestors(state);
    let mut order: Vec<&CgroupPath> = ancestors.iter().collect();
    order.sort_by_key(|c| {
        std::cmp::Reverse(c.as_str().split('/').filter(|s| !s.is_empty()).count())
    });
    for name in [KnobKind::MemoryMin, KnobKind::MemoryLow] {
        // what each ancestor's direct children claim: its pods' planned values, and
        // (from the deeper level, below) its child QoS dirs' final values
        let mut claims: BTreeMap<&CgroupPath, u64> = BTreeMap::new();
        for p in &state.pods {
            let v = match plan.get(&(p.cgroup.clone(), name, None)).map(|w| &w.knob) {
                Some(Knob::MemoryMin(v)) | Some(Knob::MemoryLow(v)) => *v,
                _ => continue,
            };
            if let Some(a) = p.cgroup.parent().and_then(|a| ancestors.get(&a)) {
                let e = claims.entry(a).or_default();
                *e = e.saturating_add(v);
            }
        }
        for a in &order {
            let sum = claims.get(a).copied().unwrap_or(0);
            let theirs = external.get(&((*a).clone(), name)).copied().unwrap_or(0);
            if sum == 0 && theirs == 0 {
                continue;
            }
            if theirs == u64::MAX {
                // "max" set by another writer: full protection, left as it is
                if let Some(up) = a.parent().and_then(|u| ancestors.get(&u)) {
                    let e = claims.entry(up).or_default();
                    *e = e.saturating_add(sum);
                }
                continue;
            }
            let v = sum.max(theirs);
            // a parent protects its children only up to its own value: it claims
            // what its children finally got, another writer's value included (so
            // kubelet's value on a QoS dir is not shared out with BE's on kubepods)
            if let Some(up) = a.parent().and_then(|u| ancestors.get(&u)) {
                let e = claims.entry(up).or_default();
                *e = e.saturating_add(v);
            }
            let what = name.name().replace('-', ".");
            let rule = if theirs > sum {
                format!("{theirs} set there by another writer (kubelet's MemoryQoS) is above what its children claim ({sum}): kept")
            } else {
                format!("what its children claim: their {what} (a child is protected only up to its parent's)")
            };
            let knob = if name == KnobKind::MemoryMin {
                Knob::MemoryMin(v)
            } else {
                Knob::MemoryLow(v)
            };
            plan.add(w(a, knob, Plugin::MemoryQos, rule));
        }
    }
}

/// cgroup v1 refuses a parent CFS quota below any child's (as a share of
/// the period): BE pods and containers with their own quota are capped at
/// the besteffort parent's, and given their own back when it grows again
/// (the strictest-wins merge keeps the lower of the two).
fn cap_be_children(state: &NodeState, parent_quota: Option<u64>, plan: &mut Plan) {
    let Some(pq) = parent_quota else { return };
    let ratio = pq as f64 / state.period_us.max(1) as f64;
    let mut caps = Vec::new();
    for p in state.pods.iter().filter(|p| p.class == QosClass::Be) {
        let mut own: Vec<(&CgroupPath, Option<(u64, u64)>)> = Vec::new();
        own.push((&p.cgroup, None));
        for c in &p.containers {
            let kubelet = (c.entry.cpu_quota > 0).then(|| {
                (
                    c.entry.cpu_quota as u64,
                    c.entry.cpu_period.max(1000) as u64,
                )
            });
            own.push((&c.entry.cgroup, kubelet));
        }
        for (cg, kubelet) in own {
            let planned = match plan
                .get(&((*cg).clone(), KnobKind::CpuQuota, None))
                .map(|w| &w.knob)
            {
                Some(Knob::CpuQuota {
                    quota: Some(q),
                    period,
                }) => Some((*q, *period)),
                _ => None,
            };
            let Some((q, period)) = planned.or(kubelet) else {
                continue;
            };
            // at the child's own period, unless the floor would then lift it above the
            // parent's ratio (a short period: 2000 us of 10000 is 20 % where the parent
            // allows 2 %, and v1 refuses it): then at the parent's period and quota
            let own = (ratio * period as f64) as u64;
            let (cap, cap_period) = if own >= suppress::MIN_QUOTA_US {
                (own, period)
            } else if period >= state.period_us {
                (suppress::MIN_QUOTA_US, period)
            } else {
                (pq, state.period_us)
            };
            if (q as u128) * (cap_period as u128) > (cap as u128) * (period as u128) {
                caps.push(w(cg, Knob::CpuQuota { quota: Some(cap), period: cap_period }, Plugin::CpuSuppress, format!("cgroup v1: a BE cgroup's quota may not exceed the besteffort parent's ({pq} us of {} us); capped from {q} us of {period} us", state.period_us)));
            } else if planned.is_none() {
                caps.push(w(
                    cg,
                    Knob::CpuQuota {
                        quota: Some(q),
                        period,
                    },
                    Plugin::CpuSuppress,
                    "the kubelet quota, within the besteffort parent's".into(),
                ));
            }
        }
    }
    for c in caps {
        plan.add(c);
    }
}

/// The CPU share pool as koordlet's cpuburst `getNodeStateForBurst` sizes it:
/// the node's cores minus the CPU requests of pods labelled LSE/LSR, and the
/// node's usage (system included) minus the usage of pods labelled LSE/LSR/BE.
/// (capacity, usage) in cores.
pub fn share_pool(state: &NodeState) -> (f64, f64) {
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

/// Whether a pod gets CPU burst: koordlet's `IsPodCPUBurstable`, every pod
/// but those labelled LSR, LSE or BE (an unlabelled Guaranteed pod and SYSTEM
/// pods are in); only containers with a CPU limit are touched.
fn burstable(p: &Pod) -> bool {
    !(p.by_label && matches!(p.class, QosClass::Lsr | QosClass::Lse | QosClass::Be))
}

/// What CPU burst reads besides the node: the quotas the last tick left, the
/// containers whose burst period is spent, the pods bound to CPUs.
struct BurstInputs<'a> {
    last: &'a HashMap<String, u64>,
    limited: &'a std::collections::HashSet<String>,
    bound: &'a std::collections::HashSet<String>,
}

fn burst_plugin(
    state: &NodeState,
    policy: &Policy,
    env: &Env,
    inputs: &BurstInputs,
    plan: &mut Plan,
    warnings: &mut Vec<String>,
) -> (Option<Pool>, HashMap<String, u64>) {
    let BurstInputs {
        last,
        limited,
        bound,
    } = *inputs;
    let b = &policy.burst;
    let mut quotas = HashMap::new();
    let burst_on = matches!(b.policy, BurstPolicy::CpuBurstOnly | BurstPolicy::Auto);
    let scale_on = matches!(b.policy, BurstPolicy::CfsQuotaBurstOnly | BurstPolicy::Auto);
    if burst_on && !env.features.cpu_burst {
        warnings.push("cpuBurstStrategy asks for CFS burst, but this kernel has no cpu.cfs_burst_us / cpu.max.burst; only quota scaling is done".into());
    }
    let (pool_capacity, pool_usage) = share_pool(state);
    let pool_state = burst::pool(pool_usage, pool_capacity, b);
    // a pod bound to CPUs runs without CFS quota (koordlet's cpuset hook): no
    // quota to scale, and a scaled one would undo the hook's -1
    for p in state
        .pods
        .iter()
        .filter(|p| burstable(p) && !bound.contains(&p.id))
    {
        // the pod's own cpuBurst annotation over the node's config
        let (pod_b, warning) = policy.burst.for_pod(&p.annotations, p.trusted);
        if let Some(wn) = warning {
            warnings.push(format!("pod {}: {wn}", p.id));
        }
        let b = &pod_b;
        let burst_on = matches!(b.policy, BurstPolicy::CpuBurstOnly | BurstPolicy::Auto);
        let scale_on = matches!(b.policy, BurstPolicy::CfsQuotaBurstOnly | BurstPolicy::Auto);
        let mut pod_sum = 0u64;
        let mut pod_period = 0u64;
        let mut all_limited = !p.containers.is_empty();
        let mut pod_scaled = false;
        // the pod's burst: the sum of its containers' (koordlet's applyCPUBurst)
        let mut pod_burst = 0u64;
        let mut pod_cur = 0u64;
        for c in &p.containers {
            if c.entry.cpu_quota <= 0 {
                all_limited = false;
                continue;
            }
            let limit = c.entry.cpu_quota as u64;
            let period = c.entry.cpu_period.max(1000) as u64;
            // never below kubelet's limit (an in-place resize up raises the floor)
            let cur = last.get(&c.entry.id).copied().unwrap_or(limit).max(limit);
            let d = burst::decide(
                &burst::Container {
                    limit_quota_us: limit,
                    period_us: period,
                    current_quota_us: cur,
                    throttled_ratio: c.throttled_ratio,
                    limited: limited.contains(&c.entry.id),
                },
                pool_state,
                b,
            );
            let target = if scale_on {
                d.quota_us.unwrap_or(cur)
            } else {
                limit
            };
            // the kernel checks every quota write against the burst in force: at most
            // the quota before and after this tick, and at most kubelet's limit, so the
            // runtime re-writing the limit (a cpuset-only update) never meets EINVAL
            if let (Some(bu), true) = (d.burst_us, env.features.cpu_burst) {
                let bu = bu.min(target).min(cur).min(limit);
                plan.add(w(
                    &c.entry.cgroup,
                    Knob::CpuBurst(bu),
                    Plugin::CpuBurst,
                    d.rule.clone(),
                ));
                pod_burst = pod_burst.saturating_add(bu);
            } else if !burst_on && env.features.cpu_burst {
                // as koordlet: burst off writes 0 (a burst left by an earlier run or
                // policy, which the executor does not remember, is reset too)
                plan.add(w(
                    &c.entry.cgroup,
                    Knob::CpuBurst(0),
                    Plugin::CpuBurst,
                    "cpuBurst off: no burst".into(),
                ));
            }
            pod_cur = pod_cur.saturating_add(cur);
            if scale_on || cur != limit {
                let rule = if scale_on {
                    d.rule.clone()
                } else {
                    "cfsQuotaBurst off: quota back to the limit".to_string()
                };
                plan.add(w(
                    &c.entry.cgroup,
                    Knob::CpuQuota {
                        quota: Some(target),
                        period,
                    },
                    Plugin::CpuBurst,
                    rule,
                ));
            }
            if target != limit {
                pod_scaled = true;
                quotas.insert(c.entry.id.clone(), target);
            }
            if pod_period == 0 {
                pod_period = period;
            }
            pod_sum += (target as f64 * pod_period as f64 / period as f64) as u64;
        }
        // the pod's own quota (kubelet: the sum of its containers' limits) follows
        if all_limited
            && (scale_on
                || pod_scaled
                || p.containers.iter().any(|c| last.contains_key(&c.entry.id)))
        {
            plan.add(w(
                &p.cgroup,
                Knob::CpuQuota {
                    quota: Some(pod_sum),
                    period: pod_period,
                },
                Plugin::CpuBurst,
                "the pod's quota: the sum of its containers' quotas".into(),
            ));
        }
        if !burst_on && env.features.cpu_burst && p.containers.iter().any(|c| c.entry.cpu_quota > 0)
        {
            plan.add(w(
                &p.cgroup,
                Knob::CpuBurst(0),
                Plugin::CpuBurst,
                "cpuBurst off: no burst".into(),
            ));
        }
        if burst_on && env.features.cpu_burst && pod_burst > 0 {
            // within the pod's quota before and after this tick (the kernel's rule),
            // unless some container (so the pod) has no limit
            let cap = if all_limited {
                pod_cur.min(pod_sum.max(1))
            } else {
                u64::MAX
            };
            plan.add(w(
                &p.cgroup,
                Knob::CpuBurst(pod_burst.min(cap)),
                Plugin::CpuBurst,
                "the pod's burst: the sum of its containers' bursts".into(),
            ));
        }
    }
    ((burst_on || scale_on).then_some(pool_state), quotas)
}

/// The engine between ticks: the executor's memory, the LS quotas burst
/// scaled, and the last reconcile (reused while the pods and policy stay).
#[derive(Debug)]
pub struct Engine {
    executor: Executor,
    burst_quota: HashMap<String, u64>,
    /// Each burstable container's cfsQuotaBurstPeriodSeconds bucket.
    limiters: HashMap<String, burst::Limiter>,
    /// Where [`Engine::plan`]'s clock starts.
    started: std::time::Instant,
    reconciled: Option<Reconciled>,
    /// The ancestors' memory.min/low: what qoslet last planned there, and what
    /// another writer last put there.
    ours: Protection,
    theirs: Protection,
}

/// The last reconcile: for which pods (generation), policy and host, and its
/// writes and bound CPUs.
#[derive(Debug)]
struct Reconciled {
    generation: u64,
    policy: Policy,
    env: Env,
    /// The CPUs pods could use (the share pool is taken within them: hotplug).
    cpus: BTreeSet<u32>,
    out: (Plan, BoundCpus),
}

impl Engine {
    /// `verify_every`: re-read each file qoslet owns once every this many ticks.
    pub fn new(verify_every: u64) -> Self {
        Self {
            executor: Executor::new(verify_every),
            burst_quota: HashMap::new(),
            limiters: HashMap::new(),
            started: std::time::Instant::now(),
            reconciled: None,
            ours: Protection::new(),
            theirs: Protection::new(),
        }
    }

    /// Plans one tick (no I/O).
    pub fn plan(&mut self, state: &NodeState, policy: &Policy, env: &Env) -> TickResult {
        let now_s = self.started.elapsed().as_secs_f64();
        self.plan_at(state, policy, env, now_s)
    }

    /// The containers whose cfsQuotaBurstPeriodSeconds bucket is empty at
    /// `now_s` (their usage as a share of their limit spent since the last tick).
    fn limit_bursts(
        &mut self,
        state: &NodeState,
        policy: &Policy,
        now_s: f64,
    ) -> std::collections::HashSet<String> {
        let mut out = std::collections::HashSet::new();
        let mut seen = std::collections::HashSet::new();
        for p in state.pods.iter().filter(|p| burstable(p)) {
            // the pod's own cpuBurst annotation over the node's config
            let (b, _) = policy.burst.for_pod(&p.annotations, p.trusted);
            let scale_on = matches!(b.policy, BurstPolicy::CfsQuotaBurstOnly | BurstPolicy::Auto);
            if !scale_on || b.cfs_quota_burst_period_seconds < 0 {
                continue;
            }
            for c in p.containers.iter().filter(|c| c.entry.cpu_quota > 0) {
                seen.insert(c.entry.id.clone());
                let limit_cores = c.entry.cpu_quota as f64 / c.entry.cpu_period.max(1000) as f64;
                let fresh = || {
                    burst::Limiter::new(
                        &c.entry.id,
                        b.cfs_quota_burst_period_seconds,
                        b.cfs_quota_burst_percent,
                        now_s,
                    )
                };
                let l = self
                    .limiters
                    .entry(c.entry.id.clone())
                    .or_insert_with(fresh);
                if !l.is_for(b.cfs_quota_burst_period_seconds, b.cfs_quota_burst_percent) {
                    *l = fresh();
                }
                // usage not measured (0): neither spent nor saved, as koordlet
                // counts a failed query at the limit
                let usage = if c.cpu_cores > 0.0 {
                    c.cpu_cores / limit_cores * 100.0
                } else {
                    100.0
                };
                if !l.allow(now_s, usage) {
                    out.insert(c.entry.id.clone());
                }
            }
        }
        self.limiters
            .retain(|id, l| seen.contains(id) && !l.expired(now_s));
        out
    }

    /// [`Engine::plan`] at `now_s` seconds on the engine's clock.
    pub fn plan_at(
        &mut self,
        state: &NodeState,
        policy: &Policy,
        env: &Env,
        now_s: f64,
    ) -> TickResult {
        let cpus = state.all_cpus();
        let hit = match (&self.reconciled, state.pods_generation) {
            (Some(r), Some(now)) => {
                r.generation == now && r.policy == *policy && r.env == *env && r.cpus == cpus
            }
            _ => false,
        };
        if !hit {
            self.reconciled = state.pods_generation.map(|g| {
                let out = reconcile_all(state, &env.context(&policy.qos));
                Reconciled {
                    generation: g,
                    policy: policy.clone(),
                    env: env.clone(),
                    cpus: cpus.clone(),
                    out,
                }
            });
        }
        // cfsQuotaBurstPeriodSeconds: each scaled container's token bucket
        let limited = self.limit_bursts(state, policy, now_s);
        let cached = self.reconciled.as_ref().map(|r| &r.out);
        // a value in an ancestor's file that is not the one qoslet planned there
        // was written by someone else (a first sight counts as qoslet's own: an
        // earlier run's value must not pin the protection forever)
        let page = env.page_size.max(1);
        for (k, &file) in &state.ancestors {
            if file == u64::MAX {
                // "max" is never qoslet's own value
                self.theirs.insert(k.clone(), file);
                continue;
            }
            match self.ours.get(k) {
                // the kernel keeps whole pages: qoslet's value reads back rounded down
                Some(&mine) if mine / page * page != file && mine != file => {
                    self.theirs.insert(k.clone(), file);
                }
                _ => {}
            }
        }
        self.theirs.retain(|k, _| state.ancestors.contains_key(k));
        let t = tick_with(
            state,
            policy,
            env,
            &self.burst_quota,
            &limited,
            cached,
            &self.theirs,
        );
        self.burst_quota = t.burst_quota.clone();
        // what qoslet planned on each ancestor read this tick (nothing planned: 0,
        // so a value another writer puts there later is told apart)
        self.ours = state
            .ancestors
            .keys()
            .map(
                |k| match t.plan.get(&(k.0.clone(), k.1, None)).map(|w| &w.knob) {
                    Some(Knob::MemoryMin(v) | Knob::MemoryLow(v)) => (k.clone(), *v),
                    _ => (k.clone(), 0),
                },
            )
            .collect();
        t
    }

    /// Takes the quota found in a burstable container's cgroup as the state
    /// burst scaling left it in (an earlier run, before a restart): a quota above
    /// kubelet's limit is then scaled on from there, or put back to the limit
    /// when scaling is off. Only for containers not seen before; a quota at or
    /// below the limit says nothing (the limit is the floor).
    pub fn seed_quota(&mut self, container: &Container, file_quota_us: Option<u64>) {
        if container.entry.cpu_quota <= 0 || self.burst_quota.contains_key(&container.entry.id) {
            return;
        }
        // read at the container's own period
        if let Some(q) = file_quota_us.filter(|q| *q > container.entry.cpu_quota as u64) {
            self.burst_quota.insert(container.entry.id.clone(), q);
        }
    }

    /// The next plan writes this file even if its value is unchanged (another
    /// writer is known to have rewritten it, e.g. kubelet's cpuset update).
    pub fn forget(&mut self, cgroup: &CgroupPath, kind: KnobKind) {
        self.executor.forget(cgroup, kind);
    }

    /// Applies a plan.
    pub fn execute(&mut self, plan: &Plan, cgroups: &Cgroups) -> Report {
        self.executor.execute(plan, cgroups)
    }

    pub fn known_files(&self) -> usize {
        self.executor.known_files()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reconcile::Container;
    use qoslet_cgroups::memfs::MemFs;

    fn pod(id: &str, class: QosClass, parent: &str, cores: f64, quota: i64) -> Pod {
        let cg = CgroupPath::parse(&format!("{parent}/pod{id}")).unwrap();
        Pod {
            id: id.into(),
            class,
            by_label: true,
            trusted: true,
            kube: None,
            cgroup: cg.clone(),
            annotations: BTreeMap::new(),
            limits: Default::default(),
            sandbox: None,
            cpu_cores: cores,
            containers: vec![Container {
                entry: qoslet_state::inventory::ContainerEntry {
                    id: format!("c{id}"),
                    name: "main".into(),
                    cgroup: cg.container(&format!("c{id}")).unwrap(),
                    memory_limit: 0,
                    cpu_quota: quota,
                    cpu_period: 100_000,
                    cpuset_cpus: String::new(),
                    oom_score_adj: 0,
                    cpu_shares: 0,
                },
                cpu_cores: cores,
                throttled_ratio: 0.5,
            }],
        }
    }

    fn state(ls: f64, be: f64, quota: Option<u64>) -> NodeState {
        NodeState {
            pods_usage_cores: None,
            be_usage_cores: None,
            usage_known: true,
            capacity_cores: 16.0,
            node_usage_cores: ls + be + 0.5,
            system_usage_cores: 0.5,
            reserved_cores: 1.0,
            pods: vec![
                pod("ls", QosClass::Ls, "/kubepods/burstable", ls, 200_000),
                pod("be", QosClass::Be, "/kubepods/besteffort", be, -1),
            ],
            be_parent: CgroupPath::parse("/kubepods/besteffort").unwrap(),
            be_quota_us: quota,
            period_us: 100_000,
            numa: vec![(0..16).collect()],
            places: BTreeMap::new(),
            be_cpuset: None,
            qos_dirs: Vec::new(),
            cpuset_ceiling: None,
            static_cpu_manager: false,
            shared_pool: None,
            ancestors: BTreeMap::new(),
            pods_generation: None,
        }
    }

    fn cfs(threshold: i64) -> Policy {
        Policy {
            threshold: ResourceThresholdStrategy {
                enable: true,
                cpu_suppress_threshold_percent: threshold,
                cpu_suppress_policy: CpuSuppressPolicy::CfsQuota,
                ..Default::default()
            },
            ..Default::default()
        }
    }

    fn suppress_writes(t: &TickResult) -> Vec<&Write> {
        t.plan
            .writes()
            .iter()
            .filter(|w| w.plugin == Plugin::CpuSuppress)
            .collect()
    }

    fn tree() -> (std::sync::Arc<MemFs>, Cgroups) {
        let mut files = vec![
            ("cpu/cgroup.procs".to_string(), ""),
            ("cpuset/cgroup.procs".to_string(), ""),
        ];
        for cg in [
            "kubepods/besteffort",
            "kubepods/besteffort/podbe",
            "kubepods/besteffort/podbe/cbe",
            "kubepods/burstable/podls",
            "kubepods/burstable/podls/cls",
        ] {
            files.push((format!("cpu/{cg}/cpu.cfs_quota_us"), "-1\n"));
            files.push((format!("cpu/{cg}/cpu.cfs_period_us"), "100000\n"));
            files.push((format!("cpuset/{cg}/cpuset.cpus"), "0-15\n"));
        }
        MemFs::v1_tree(&files)
    }

    /// Issue 14 item 5 on a v1 tree: an LSR pod bound to CPUs 2-3 runs
    /// without CFS quota (pod and container, koordlet's
    /// `SetContainerCPUSetAndUnsetCFS` / `UnsetPodCPUQuota` reconcilers); the LS
    /// pod moves to the share pool without them (`calCPUSharePools`); when the
    /// binding goes (here: the pod is no longer trusted nor labelled), quota and
    /// cpusets go back to kubelet's, and the LS pod back to every CPU.
    #[test]
    fn cpuset_bound_pods_unset_quota_and_ls_share_the_rest() {
        let mut files = vec![
            ("cpu/cgroup.procs".to_string(), ""),
            ("cpuset/cgroup.procs".to_string(), ""),
        ];
        for (cg, quota) in [
            ("kubepods/burstable/podls", "200000\n"),
            ("kubepods/burstable/podls/cls", "200000\n"),
            ("kubepods/podlsr", "200000\n"),
            ("kubepods/podlsr/clsr", "200000\n"),
        ] {
            files.push((format!("cpu/{cg}/cpu.cfs_quota_us"), quota));
            files.push((format!("cpu/{cg}/cpu.cfs_period_us"), "100000\n"));
            files.push((format!("cpuset/{cg}/cpuset.cpus"), "0-15\n"));
        }
        let (m, cg) = MemFs::v1_tree(&files);
        let env = Env {
            features: cg.host().features.clone(),
            node: NodeFacts {
                online_cpus: (0..16).collect(),
                ..Default::default()
            },
            ..Default::default()
        };
        let mut lsr = pod("lsr", QosClass::Lsr, "/kubepods", 1.0, 200_000);
        lsr.annotations.insert(
            qoslet_hooks::decide::ANNOTATION_RESOURCE_STATUS.into(),
            r#"{"cpuset":"2-3"}"#.into(),
        );
        lsr.limits = qoslet_hooks::decide::SandboxLimits {
            memory_limit: 0,
            cpu_quota: 200_000,
            cpu_period: 100_000,
        };
        let ls = pod("ls", QosClass::Ls, "/kubepods/burstable", 1.0, 200_000);
        let mut s = state(1.0, 0.0, None);
        s.pods = vec![ls.clone(), lsr.clone()];
        let mut e = Engine::new(1);
        let get = |f: &str| m.at(f).unwrap();
        let t = e.plan(&s, &Policy::default(), &env);
        let r = e.execute(&t.plan, &cg);
        assert!(r.errors.is_empty(), "{r:?}");
        assert_eq!(get("cpuset/kubepods/podlsr/clsr/cpuset.cpus"), "2-3");
        assert_eq!(get("cpu/kubepods/podlsr/clsr/cpu.cfs_quota_us"), "-1");
        assert_eq!(get("cpu/kubepods/podlsr/cpu.cfs_quota_us"), "-1");
        assert_eq!(
            get("cpuset/kubepods/burstable/podls/cls/cpuset.cpus"),
            "0-1,4-15"
        );
        assert_eq!(
            get("cpu/kubepods/burstable/podls/cls/cpu.cfs_quota_us"),
            "200000"
        );
        // the LSR container not running (a crash, a restart): its pod's binding
        // still keeps its CPUs out of the pool
        let mut restarting = lsr.clone();
        restarting.containers.clear();
        s.pods = vec![ls.clone(), restarting];
        let t = e.plan(&s, &Policy::default(), &env);
        assert_eq!(
            t.plan
                .get(&(
                    ls.containers[0].entry.cgroup.clone(),
                    KnobKind::CpusetCpus,
                    None
                ))
                .map(|w| w.knob.clone()),
            Some(Knob::CpusetCpus("0-1,4-15".into()))
        );
        // the LSR pod gone: the LS container back on every CPU (once); the
        // binding's quota -1 is what the runtime keeps, never "restored" under it
        s.pods = vec![ls.clone()];
        let t = e.plan(&s, &Policy::default(), &env);
        assert!(
            !t.plan
                .writes()
                .iter()
                .any(|w| matches!(w.knob, Knob::CpusetCpus(_))),
            "nothing pinned: {:?}",
            t.plan.writes()
        );
        let r = e.execute(&t.plan, &cg);
        assert!(r.errors.is_empty(), "{r:?}");
        assert_eq!(
            get("cpuset/kubepods/burstable/podls/cls/cpuset.cpus"),
            "0-15"
        );
        assert_eq!(get("cpu/kubepods/podlsr/clsr/cpu.cfs_quota_us"), "-1");
        // `qoslet restore` puts the bound pod's own quota back to its containers'
        // sum (kubelet's); the containers' stay as the runtime has them
        let mut s2 = s.clone();
        s2.pods.push(lsr.clone());
        let plan = restore_plan(&s2, &Policy::default(), &env, &Found::default());
        assert_eq!(
            plan.get(&(lsr.cgroup.clone(), KnobKind::CpuQuota, None))
                .map(|w| w.knob.clone()),
            Some(Knob::CpuQuota {
                quota: Some(200_000),
                period: 100_000
            })
        );
        assert_eq!(
            plan.get(&(
                ls.containers[0].entry.cgroup.clone(),
                KnobKind::CpusetCpus,
                None
            ))
            .map(|w| w.knob.clone()),
            Some(Knob::CpusetCpus("0-15".into())),
            "a share-pool cpuset back to every CPU"
        );
        // and stay so (restored once, not rewritten every tick)
        let before = m.writes().len();
        let t = e.plan(&s, &Policy::default(), &env);
        let r = e.execute(&t.plan, &cg);
        assert!(r.errors.is_empty(), "{r:?}");
        assert_eq!(m.writes().len(), before);
    }

    /// Issue 14: on an Anolis-shaped tree (`cpu.bvt_warp_ns` in every cgroup),
    /// group identity lands on the pods, their containers and the kube QoS
    /// dirs (kubepods 0, burstable LS 2, besteffort BE -1, as koordlet's
    /// groupidentity rule), and turning cpuQOS off writes 0 back everywhere.
    #[test]
    fn group_identity_on_an_anolis_tree_and_written_back_when_off() {
        let mut files = vec![("cpu/cgroup.procs".to_string(), "")];
        let dirs = [
            "kubepods",
            "kubepods/besteffort",
            "kubepods/besteffort/podbe",
            "kubepods/besteffort/podbe/cbe",
            "kubepods/burstable",
            "kubepods/burstable/podls",
            "kubepods/burstable/podls/cls",
        ];
        for cg in dirs {
            files.push((format!("cpu/{cg}/cgroup.procs"), ""));
            files.push((format!("cpu/{cg}/cpu.bvt_warp_ns"), "0\n"));
            files.push((format!("cpu/{cg}/cpu.cfs_quota_us"), "-1\n"));
            files.push((format!("cpu/{cg}/cpu.cfs_period_us"), "100000\n"));
        }
        let (m, cg) = MemFs::v1_tree(&files);
        assert!(cg.host().features.bvt, "cpu.bvt_warp_ns detected");
        let env = Env {
            features: cg.host().features.clone(),
            ..Default::default()
        };
        let mut s = state(1.0, 1.0, None);
        s.qos_dirs = vec![
            (KubeQos::Guaranteed, CgroupPath::parse("kubepods").unwrap()),
            (
                KubeQos::Burstable,
                CgroupPath::parse("kubepods/burstable").unwrap(),
            ),
            (
                KubeQos::BestEffort,
                CgroupPath::parse("kubepods/besteffort").unwrap(),
            ),
        ];
        let read = |cg: &str| m.at(&format!("cpu/{cg}/cpu.bvt_warp_ns")).unwrap();
        let mut p = Policy::default();
        for c in [
            &mut p.qos.lsr_class,
            &mut p.qos.ls_class,
            &mut p.qos.be_class,
        ] {
            c.cpu_qos.enable = true;
        }
        let mut e = Engine::new(1);
        let t = e.plan(&s, &p, &env);
        let r = e.execute(&t.plan, &cg);
        assert!(r.errors.is_empty(), "{:?}", r.errors);
        // kubepods, besteffort dir, BE pod, its container, burstable dir, LS pod, its container
        let got: Vec<String> = dirs.iter().map(|c| read(c)).collect();
        assert_eq!(got, ["0", "-1", "-1", "-1", "2", "2", "2"], "{dirs:?}");
        // cpuQOS off: 0 written back everywhere
        let off = Policy::default();
        let t = e.plan(&s, &off, &env);
        let r = e.execute(&t.plan, &cg);
        assert!(r.errors.is_empty(), "{:?}", r.errors);
        for c in dirs {
            assert_eq!(read(c), "0", "{c}");
        }
    }

    /// Issue 13: figures the collector has not measured (the agent's first
    /// tick) leave the BE quota as it is; a pod without a reading this tick is
    /// still counted through the pods' root cgroup.
    #[test]
    fn unmeasured_usage_leaves_the_quota_and_unread_pods_still_count() {
        let env = Env::default();
        let p = cfs(50);
        let mut e = Engine::new(10);
        let mut s = state(6.0, 4.0, Some(300_000));
        s.usage_known = false;
        let t = e.plan(&s, &p, &env);
        let w = suppress_writes(&t);
        assert_eq!(
            w[0].knob,
            Knob::CpuQuota {
                quota: Some(300_000),
                period: 100_000
            },
            "left as it is: {w:?}"
        );
        assert!(w[0].rule.contains("not measured"), "{}", w[0].rule);
        // an unlimited quota stays unlimited
        let mut s = state(6.0, 4.0, None);
        s.usage_known = false;
        assert!(suppress_writes(&e.plan(&s, &p, &env)).is_empty());
        // the LS pod has no reading (0), but the pods' root used 10 cores, 4 of
        // them BE: LS is 6, so BE gets 16 x 50% - 6 - 1 = 1 core, not 7
        let mut s = state(0.0, 4.0, None);
        s.pods_usage_cores = Some(10.0);
        let t = e.plan(&s, &p, &env);
        assert_eq!(
            suppress_writes(&t)[0].knob,
            Knob::CpuQuota {
                quota: Some(100_000),
                period: 100_000
            }
        );
        // a BE pod without a reading this tick (0 here) while the besteffort
        // cgroup used 4 cores: those 4 are BE, not LS (10 - 0 would leave BE
        // nothing), so the result is the same 1 core
        let mut s = state(0.0, 0.0, None);
        s.pods_usage_cores = Some(10.0);
        s.be_usage_cores = Some(4.0);
        let t = e.plan(&s, &p, &env);
        assert_eq!(
            suppress_writes(&t)[0].knob,
            Knob::CpuQuota {
                quota: Some(100_000),
                period: 100_000
            }
        );
    }

    #[test]
    fn ls_load_cuts_be_quota_and_steady_state_writes_nothing() {
        let (m, cg) = tree();
        let env = Env::default();
        let p = cfs(50);
        let mut e = Engine::new(10);
        // 16 x 50% - LS 6 - max(system 0.5, reserved 1) = 1 core for BE
        let t = e.plan(&state(6.0, 4.0, None), &p, &env);
        assert_eq!(t.level, Level::Mid);
        assert_eq!(suppress_writes(&t).len(), 1);
        let r = e.execute(&t.plan, &cg);
        assert_eq!((r.written, r.errors.len()), (1, 0), "{r:?}");
        let q = m.at("cpu/kubepods/besteffort/cpu.cfs_quota_us").unwrap();
        assert_eq!(q, "100000");
        // steady state: the plugin keeps the quota, the executor writes nothing
        let t = e.plan(&state(6.0, 4.0, Some(100_000)), &p, &env);
        assert_eq!(
            suppress_writes(&t)[0].knob,
            Knob::CpuQuota {
                quota: Some(100_000),
                period: 100_000
            }
        );
        assert!(suppress_writes(&t)[0].rule.contains("unchanged"));
        assert_eq!(e.execute(&t.plan, &cg).written, 0);
        // LS load gone: restored stepwise (at most 1.6 cores per tick on 16 CPUs)
        let t = e.plan(&state(0.0, 4.0, Some(100_000)), &p, &env);
        assert_eq!(
            suppress_writes(&t)[0].knob,
            Knob::CpuQuota {
                quota: Some(260_000),
                period: 100_000
            }
        );
        // suppress disabled: the quota goes back to unlimited
        let mut off = cfs(50);
        off.threshold.enable = false;
        let t = e.plan(&state(6.0, 4.0, Some(100_000)), &off, &env);
        assert_eq!(
            suppress_writes(&t)[0].knob,
            Knob::CpuQuota {
                quota: None,
                period: 100_000
            }
        );
        assert_eq!(t.level, Level::None);
    }

    #[test]
    fn v1_be_children_are_capped_under_the_parent_and_given_back_their_own() {
        let (m, cg) = tree();
        let mut s = state(7.0, 4.0, None);
        s.pods[1].containers[0].entry.cpu_quota = 300_000; // the BE container's own 3 cores
        let mut e = Engine::new(10);
        let t = e.plan(&s, &cfs(50), &Env::default());
        let w = suppress_writes(&t);
        assert_eq!(w.len(), 2, "{w:?}");
        let r = e.execute(&t.plan, &cg);
        assert!(r.errors.is_empty(), "{r:?}");
        // 16 x 50% - 7 - 1 = 0 -> the floor
        let read = |f: &str| m.at(f).unwrap();
        assert_eq!(read("cpu/kubepods/besteffort/cpu.cfs_quota_us"), "2000");
        assert_eq!(
            read("cpu/kubepods/besteffort/podbe/cbe/cpu.cfs_quota_us"),
            "2000"
        );
        // LS gone: the parent grows stepwise, the child gets its own 3 cores back once under it
        s.pods[0].cpu_cores = 0.0;
        for _ in 0..6 {
            s.be_quota_us = Some(
                read("cpu/kubepods/besteffort/cpu.cfs_quota_us")
                    .parse()
                    .unwrap(),
            );
            let t = e.plan(&s, &cfs(50), &Env::default());
            let r = e.execute(&t.plan, &cg);
            assert!(r.errors.is_empty(), "{r:?}");
            let parent: u64 = read("cpu/kubepods/besteffort/cpu.cfs_quota_us")
                .parse()
                .unwrap();
            let child: u64 = read("cpu/kubepods/besteffort/podbe/cbe/cpu.cfs_quota_us")
                .parse()
                .unwrap();
            assert!(child <= parent, "child {child} under parent {parent}");
        }
        assert_eq!(
            read("cpu/kubepods/besteffort/podbe/cbe/cpu.cfs_quota_us"),
            "300000"
        );
    }

    #[test]
    fn cpuset_policy_covers_the_be_tree_and_is_put_back_when_off() {
        let (m, cg) = tree();
        let p = Policy {
            threshold: ResourceThresholdStrategy {
                enable: true,
                cpu_suppress_threshold_percent: 50,
                ..Default::default()
            },
            ..Default::default()
        };
        let mut e = Engine::new(10);
        let t = e.plan(&state(6.0, 4.0, None), &p, &Env::default());
        let w = suppress_writes(&t);
        assert_eq!(w.len(), 3, "parent, pod, container: {w:?}");
        // the lowest cores first (koordlet's calculateBESuppressCPUSetPolicy)
        assert!(w.iter().all(|w| w.knob == Knob::CpusetCpus("0-1".into())));
        let r = e.execute(&t.plan, &cg);
        assert!(r.errors.is_empty(), "{r:?}");
        assert_eq!(
            m.at("cpuset/kubepods/besteffort/podbe/cbe/cpuset.cpus")
                .unwrap(),
            "0-1"
        );
        let mut s = state(6.0, 4.0, None);
        s.be_cpuset = Some([0, 1].into());
        let mut off = p.clone();
        off.threshold.cpu_suppress_policy = CpuSuppressPolicy::CfsQuota;
        let t = e.plan(&s, &off, &Env::default());
        assert!(t
            .plan
            .writes()
            .iter()
            .any(|w| w.knob == Knob::CpusetCpus("0-15".into())));
    }

    #[test]
    fn memory_protection_is_summed_up_to_the_qos_dir_and_kubepods() {
        let spec = r#"{"containers":{"main":{"requests":{"kubernetes.io/batch-memory":"1Gi"},"limits":{"kubernetes.io/batch-memory":"2Gi"}}}}"#;
        let mut s = state(1.0, 1.0, None);
        let mut second = s.pods[1].clone();
        second.id = "be2".into();
        second.cgroup = CgroupPath::parse("/kubepods/besteffort/podbe2").unwrap();
        second.containers[0].entry.cgroup = second.cgroup.container("cbe2").unwrap();
        s.pods.push(second);
        for p in s.pods.iter_mut().filter(|p| p.class == QosClass::Be) {
            p.annotations.insert(
                "node.koordinator.sh/extended-resource-spec".into(),
                spec.into(),
            );
        }
        let mut p = cfs(50);
        p.qos.be_class.memory_qos.enable = true;
        p.qos.be_class.memory_qos.min_limit_percent = 50;
        let env = Env {
            features: Features {
                memory_qos: true,
                ..Default::default()
            },
            ..Default::default()
        };
        let t = tick(&s, &p, &env, &HashMap::new());
        let min = |cg: &str| {
            t.plan
                .get(&(CgroupPath::parse(cg).unwrap(), KnobKind::MemoryMin, None))
                .map(|w| w.knob.clone())
        };
        assert_eq!(
            min("kubepods/besteffort/podbe"),
            Some(Knob::MemoryMin(512 << 20))
        );
        assert_eq!(min("kubepods/besteffort"), Some(Knob::MemoryMin(1 << 30)));
        assert_eq!(min("kubepods"), Some(Knob::MemoryMin(1 << 30)));
        assert_eq!(min("kubepods/burstable"), None, "no LS protection asked");
    }

    /// Review of issue 15 item 10: a parent claims what its children finally
    /// got (kubelet's value on the burstable dir plus BE's sum, not the larger
    /// of the two, so BE does not share out LS's protection); qoslet's own value
    /// read back page-rounded is not another writer's; and another writer's
    /// value stays planned when qoslet's sum drops to 0 (never written down to 0).
    #[test]
    fn ancestors_claim_their_childrens_final_values() {
        let spec = r#"{"containers":{"main":{"requests":{"kubernetes.io/batch-memory":"1Gi"},"limits":{"kubernetes.io/batch-memory":"2Gi"}}}}"#;
        let mut s = state(1.0, 1.0, None);
        s.pods[1].annotations.insert(
            "node.koordinator.sh/extended-resource-spec".into(),
            spec.into(),
        );
        let mut p = cfs(50);
        p.qos.be_class.memory_qos.enable = true;
        p.qos.be_class.memory_qos.min_limit_percent = 30;
        let env = Env {
            features: Features {
                memory_qos: true,
                ..Default::default()
            },
            page_size: 4096,
            ..Default::default()
        };
        let kp = CgroupPath::parse("kubepods").unwrap();
        let bu = CgroupPath::parse("kubepods/burstable").unwrap();
        let be = CgroupPath::parse("kubepods/besteffort").unwrap();
        let gib = 1u64 << 30;
        let min = |t: &TickResult, cg: &CgroupPath| match t
            .plan
            .get(&(cg.clone(), KnobKind::MemoryMin, None))
            .map(|w| &w.knob)
        {
            Some(Knob::MemoryMin(v)) => Some(*v),
            _ => None,
        };
        let be_min = gib * 30 / 100; // 322122547: not a whole number of pages
        let mut e = Engine::new(1);
        s.ancestors = BTreeMap::from([
            ((kp.clone(), KnobKind::MemoryMin), 0),
            ((bu.clone(), KnobKind::MemoryMin), 0),
            ((be.clone(), KnobKind::MemoryMin), 0),
        ]);
        let t = e.plan(&s, &p, &env);
        assert_eq!(min(&t, &be), Some(be_min));
        // the files as the kernel keeps them (whole pages), kubelet's 8 GiB on burstable
        s.ancestors = BTreeMap::from([
            ((kp.clone(), KnobKind::MemoryMin), be_min / 4096 * 4096),
            ((bu.clone(), KnobKind::MemoryMin), 8 * gib),
            ((be.clone(), KnobKind::MemoryMin), be_min / 4096 * 4096),
        ]);
        let t = e.plan(&s, &p, &env);
        assert_eq!(
            min(&t, &be),
            Some(be_min),
            "its own rounded value is not another writer's"
        );
        assert_eq!(min(&t, &bu), Some(8 * gib), "kubelet's value kept");
        assert_eq!(
            min(&t, &kp),
            Some(8 * gib + be_min),
            "the children's claims, summed"
        );
        // BE's protection gone: burstable keeps kubelet's value (not written down to 0)
        s.pods[1].annotations.clear();
        let t = e.plan(&s, &p, &env);
        assert_eq!(min(&t, &bu), Some(8 * gib));
        assert_eq!(min(&t, &kp), Some(8 * gib));
    }

    /// Issue 15 item 10: kubelet's MemoryQoS writes its own memory.min on the
    /// QoS dirs every minute. qoslet keeps the higher of that and its pods' sum
    /// instead of writing its sum back each time; a value found at the first
    /// sight (an earlier run's own) does not pin the protection.
    #[test]
    fn an_ancestors_memory_min_from_another_writer_is_kept_when_higher() {
        let spec = r#"{"containers":{"main":{"requests":{"kubernetes.io/batch-memory":"1Gi"},"limits":{"kubernetes.io/batch-memory":"2Gi"}}}}"#;
        let mut s = state(1.0, 1.0, None);
        s.pods[1].annotations.insert(
            "node.koordinator.sh/extended-resource-spec".into(),
            spec.into(),
        );
        let mut p = cfs(50);
        p.qos.be_class.memory_qos.enable = true;
        p.qos.be_class.memory_qos.min_limit_percent = 100;
        let env = Env {
            features: Features {
                memory_qos: true,
                ..Default::default()
            },
            ..Default::default()
        };
        let kp = CgroupPath::parse("kubepods").unwrap();
        let be = CgroupPath::parse("kubepods/besteffort").unwrap();
        let gib = 1u64 << 30;
        let files = |kubepods: u64, besteffort: u64| {
            BTreeMap::from([
                ((kp.clone(), KnobKind::MemoryMin), kubepods),
                ((be.clone(), KnobKind::MemoryMin), besteffort),
            ])
        };
        let min = |t: &TickResult, cg: &CgroupPath| match t
            .plan
            .get(&(cg.clone(), KnobKind::MemoryMin, None))
            .map(|w| &w.knob)
        {
            Some(Knob::MemoryMin(v)) => *v,
            k => panic!("{k:?}"),
        };
        let mut e = Engine::new(1);
        // an earlier run left 5 GiB: taken as qoslet's own, so its sum applies
        s.ancestors = files(5 * gib, 0);
        let t = e.plan(&s, &p, &env);
        assert_eq!((min(&t, &kp), min(&t, &be)), (gib, gib));
        // kubelet writes 3 GiB on kubepods: kept (no fight)
        s.ancestors = files(3 * gib, gib);
        let t = e.plan(&s, &p, &env);
        assert_eq!(min(&t, &kp), 3 * gib);
        assert!(t
            .plan
            .get(&(kp.clone(), KnobKind::MemoryMin, None))
            .unwrap()
            .rule
            .contains("kept"));
        // and stays kept on the next tick (the file now holds what qoslet planned)
        let t = e.plan(&s, &p, &env);
        assert_eq!(min(&t, &kp), 3 * gib);
        // kubelet lowers it below the pods' sum: the sum wins
        s.ancestors = files(gib / 2, gib);
        let t = e.plan(&s, &p, &env);
        assert_eq!(min(&t, &kp), gib);
        // the stateless tick (no files read) plans the sum
        s.ancestors = files(3 * gib, gib);
        assert_eq!(min(&tick(&s, &p, &env, &HashMap::new()), &kp), gib);
    }

    #[test]
    fn reconcile_is_reused_for_the_same_pods_and_policy_only() {
        let env = Env {
            features: Features {
                cpu_idle: true,
                ..Default::default()
            },
            ..Default::default()
        };
        let mut s = state(1.0, 1.0, None);
        s.pods_generation = Some(7);
        let mut p = cfs(50);
        p.qos.be_class.cpu_qos.enable = true;
        let mut e = Engine::new(10);
        let idle = |t: &TickResult| {
            t.plan
                .writes()
                .iter()
                .any(|w| w.knob == Knob::CpuIdle(true))
        };
        let first = e.plan(&s, &p, &env);
        assert!(idle(&first));
        assert_eq!(
            e.plan(&s, &p, &env).plan,
            first.plan,
            "reused: the same plan"
        );
        p.qos.be_class.cpu_qos.enable = false;
        assert!(
            !idle(&e.plan(&s, &p, &env)),
            "a new policy is reconciled at once"
        );
        p.qos.be_class.cpu_qos.enable = true;
        s.pods.pop();
        s.pods_generation = Some(8);
        assert!(
            !idle(&e.plan(&s, &p, &env)),
            "new pods are reconciled at once"
        );
    }

    /// Issue 14 item 6, as koordlet's cpuburst plugin does it
    /// (`IsPodCPUBurstable`, `getNodeStateForBurst`, `applyCPUBurst`): every pod
    /// but those labelled LSR/LSE/BE bursts; the pod's burst is the sum of its
    /// containers'; the share pool is the node minus LSE/LSR requests, its usage
    /// the node's minus LSE/LSR/BE usage.
    #[test]
    fn burst_eligibility_pod_sum_and_share_pool_as_koordlet() {
        let mut p = cfs(65);
        p.burst.policy = BurstPolicy::CpuBurstOnly;
        p.burst.cpu_burst_percent = 50;
        let env = Env {
            features: Features {
                cpu_burst: true,
                ..Default::default()
            },
            ..Default::default()
        };
        let mut s = state(1.0, 1.0, None);
        let labelled_lsr = pod("lsr", QosClass::Lsr, "/kubepods", 2.0, 400_000);
        let unlabelled_gu = Pod {
            by_label: false,
            ..pod("gu", QosClass::Lsr, "/kubepods", 0.5, 200_000)
        };
        let system = pod("sys", QosClass::System, "/kubepods/burstable", 0.1, 100_000);
        let mut two = pod("two", QosClass::Ls, "/kubepods/burstable", 0.2, 100_000);
        let mut second = two.containers[0].clone();
        second.entry.id = "ctwo2".into();
        second.entry.cgroup = two.cgroup.container("ctwo2").unwrap();
        two.containers.push(second);
        s.pods.extend([labelled_lsr, unlabelled_gu, system, two]);
        let t = Engine::new(10).plan(&s, &p, &env);
        let burst_of = |cg: &str| {
            t.plan
                .writes()
                .iter()
                .find_map(|w| match (&w.knob, w.cgroup.as_str() == cg) {
                    (Knob::CpuBurst(b), true) => Some(*b),
                    _ => None,
                })
        };
        assert_eq!(
            burst_of("kubepods/podlsr/clsr"),
            None,
            "labelled LSR: no burst"
        );
        assert_eq!(burst_of("kubepods/podbe/cbe"), None, "BE: no burst");
        assert_eq!(
            burst_of("kubepods/podgu/cgu"),
            Some(100_000),
            "unlabelled Guaranteed: 50%"
        );
        assert_eq!(
            burst_of("kubepods/burstable/podsys/csys"),
            Some(50_000),
            "SYSTEM"
        );
        assert_eq!(
            burst_of("kubepods/burstable/podtwo"),
            Some(100_000),
            "pod: 2 x 50,000"
        );
        assert_eq!(burst_of("kubepods/burstable/podls"), Some(100_000));
        // the share pool: 16 cores - 4 (the LSR pod's request); usage: the node's
        // 5 minus the LSR pod's 2 and the BE pod's 1 (the unlabelled Guaranteed pod stays in)
        s.node_usage_cores = 5.0;
        let (cap, usage) = share_pool(&s);
        assert!((cap - 12.0).abs() < 1e-9, "{cap}");
        assert!((usage - 2.0).abs() < 1e-9, "{usage}");
    }

    /// Review of issue 15 item 7: the kernel checks each quota write against
    /// the burst in force. Switching from quota scaling to burst only must not
    /// leave a burst above the limit the quota returns to; a burst never exceeds
    /// kubelet's limit (the runtime re-writes it on a cpuset-only update); and an
    /// in-place resize up is never held below the new limit.
    #[test]
    fn bursts_stay_within_the_quota_kubelet_and_the_kernel_write() {
        let env = Env {
            features: Features {
                cpu_burst: true,
                ..Default::default()
            },
            ..Default::default()
        };
        let mut p = cfs(65);
        p.burst.policy = BurstPolicy::Auto;
        let mut e = Engine::new(10);
        let of = |t: &TickResult, cg: &str, burst: bool| {
            t.plan
                .writes()
                .iter()
                .find_map(|w| match (&w.knob, w.cgroup.as_str() == cg) {
                    (Knob::CpuBurst(b), true) if burst => Some(*b),
                    (Knob::CpuQuota { quota, .. }, true) if !burst => *quota,
                    _ => None,
                })
        };
        let c = "kubepods/burstable/podls/cls";
        for _ in 0..3 {
            let t = e.plan(&state(1.0, 1.0, None), &p, &env);
            assert!(
                of(&t, c, true).unwrap() <= 200_000,
                "burst within the limit"
            );
        }
        p.burst.policy = BurstPolicy::CpuBurstOnly;
        let t = e.plan(&state(1.0, 1.0, None), &p, &env);
        assert_eq!(of(&t, c, false), Some(200_000), "quota back to the limit");
        assert_eq!(
            of(&t, c, true),
            Some(200_000),
            "burst within the quota written"
        );
        // kubelet resizes the container up to 4 CPUs: the quota follows at once
        p.burst.policy = BurstPolicy::Auto;
        e.plan(&state(1.0, 1.0, None), &p, &env);
        let mut s = state(10.0, 1.0, None);
        s.pods[0].containers[0].entry.cpu_quota = 400_000;
        let t = e.plan(&s, &p, &env);
        assert!(
            of(&t, c, false).unwrap_or(400_000) >= 400_000,
            "{:?}",
            of(&t, c, false)
        );
    }

    #[test]
    fn burst_scales_ls_quota_while_the_pool_is_idle_and_gives_it_back() {
        let mut p = cfs(65);
        p.burst.policy = BurstPolicy::Auto;
        let env = Env {
            features: Features {
                cpu_burst: true,
                ..Default::default()
            },
            ..Default::default()
        };
        let mut e = Engine::new(10);
        let quota_of = |t: &TickResult, cg: &str| {
            t.plan
                .writes()
                .iter()
                .find_map(|w| match (&w.knob, w.cgroup.as_str() == cg) {
                    (Knob::CpuQuota { quota, .. }, true) => *quota,
                    _ => None,
                })
        };
        // idle pool (2.5 of 16 cores), container throttled: x1.2 per tick, pod follows
        let t = e.plan(&state(1.0, 1.0, None), &p, &env);
        assert_eq!(quota_of(&t, "kubepods/burstable/podls/cls"), Some(240_000));
        assert_eq!(quota_of(&t, "kubepods/burstable/podls"), Some(240_000));
        assert!(
            t.plan
                .writes()
                .iter()
                .any(|w| w.knob == Knob::CpuBurst(200_000)),
            "burst clamped to the quota"
        );
        let t = e.plan(&state(1.0, 1.0, None), &p, &env);
        assert_eq!(quota_of(&t, "kubepods/burstable/podls/cls"), Some(288_000));
        // overloaded pool: x0.8 back toward the limit
        let t = e.plan(&state(10.0, 1.0, None), &p, &env);
        assert_eq!(quota_of(&t, "kubepods/burstable/podls/cls"), Some(230_400));
        // burst turned off: back to the limit at once
        p.burst.policy = BurstPolicy::None;
        let t = e.plan(&state(1.0, 1.0, None), &p, &env);
        assert_eq!(quota_of(&t, "kubepods/burstable/podls/cls"), Some(200_000));
        assert_eq!(quota_of(&t, "kubepods/burstable/podls"), Some(200_000));
        let t = e.plan(&state(1.0, 1.0, None), &p, &env);
        assert_eq!(
            quota_of(&t, "kubepods/burstable/podls/cls"),
            None,
            "no longer owned"
        );
    }

    /// Issue 15 item 9: burst scaling's state is the file's. After a restart
    /// (a new engine) an LS quota left at 3x the limit by an earlier run's
    /// scaling is put back to the limit when scaling is off, and scaled down
    /// from there (not from the limit) when it is on and the pool is overloaded.
    #[test]
    fn a_scaled_quota_found_after_a_restart_is_taken_from_the_file() {
        let s = state(1.0, 1.0, None);
        let ls = &s.pods[0].containers[0];
        let quota_of = |t: &TickResult| {
            t.plan
                .writes()
                .iter()
                .find(|w| w.cgroup == ls.entry.cgroup && w.knob.kind() == KnobKind::CpuQuota)
                .map(|w| w.knob.clone())
        };
        // scaling off: without the seed nothing is written (the defect)
        let mut e = Engine::new(1);
        assert_eq!(
            quota_of(&e.plan(&s, &Policy::default(), &Env::default())),
            None
        );
        let mut e = Engine::new(1);
        e.seed_quota(ls, Some(600_000));
        let t = e.plan(&s, &Policy::default(), &Env::default());
        assert_eq!(
            quota_of(&t),
            Some(Knob::CpuQuota {
                quota: Some(200_000),
                period: 100_000
            })
        );
        // then the limit is the state: no more seed, no more write after it is put back
        assert!(t.burst_quota.is_empty());
        // scaling on, pool overloaded: 600000 x 0.8
        let mut p = Policy::default();
        p.burst.policy = BurstPolicy::CfsQuotaBurstOnly;
        let mut busy = s.clone();
        busy.node_usage_cores = 15.0;
        let mut e = Engine::new(1);
        e.seed_quota(ls, Some(600_000));
        assert_eq!(
            quota_of(&e.plan(&busy, &p, &Env::default())),
            Some(Knob::CpuQuota {
                quota: Some(480_000),
                period: 100_000
            })
        );
        // a file at or below the limit says nothing; a seed never overrides what the engine knows
        let mut e = Engine::new(1);
        e.seed_quota(ls, Some(100_000));
        assert_eq!(
            quota_of(&e.plan(&s, &Policy::default(), &Env::default())),
            None
        );
    }

    /// Burst off writes 0 on every limited container and its pod (koordlet's
    /// behaviour), so a burst an earlier run left is reset after a restart.
    #[test]
    fn burst_off_writes_zero() {
        let s = state(1.0, 1.0, None);
        let mut env = Env::default();
        env.features.cpu_burst = true;
        let t = tick(&s, &Policy::default(), &env, &HashMap::new());
        let bursts: Vec<(String, Knob)> = t
            .plan
            .writes()
            .iter()
            .filter(|w| w.knob.kind() == KnobKind::CpuBurst)
            .map(|w| (w.cgroup.as_str().to_string(), w.knob.clone()))
            .collect();
        assert_eq!(
            bursts,
            vec![
                ("kubepods/burstable/podls/cls".into(), Knob::CpuBurst(0)),
                ("kubepods/burstable/podls".into(), Knob::CpuBurst(0)),
            ]
        );
    }

    /// Issue 15 item 12: a BE child with a shorter CFS period than the
    /// besteffort parent is capped at the parent's ratio, never lifted above
    /// it by the 2000 us floor (v1 refuses a child above its parent's ratio).
    #[test]
    fn a_short_period_child_stays_within_the_parents_ratio() {
        let mut s = state(1.0, 1.0, Some(2_000));
        s.pods[1].containers[0].entry.cpu_quota = 5_000;
        s.pods[1].containers[0].entry.cpu_period = 10_000;
        let mut plan = Plan::new();
        cap_be_children(&s, Some(2_000), &mut plan);
        let c = plan
            .get(&(
                s.pods[1].containers[0].entry.cgroup.clone(),
                KnobKind::CpuQuota,
                None,
            ))
            .unwrap();
        match c.knob {
            Knob::CpuQuota {
                quota: Some(q),
                period,
            } => assert!(
                (q as f64 / period as f64) <= 2_000.0 / 100_000.0 + 1e-9 && q >= 1_000,
                "{q}/{period}"
            ),
            ref k => panic!("{k:?}"),
        }
    }

    /// Issue 15 item 12: on v2 the BE cpuset goes back to the inherited empty
    /// value, not a fixed list.
    #[test]
    fn v2_cpuset_restore_is_the_empty_value() {
        let mut s = state(1.0, 1.0, None);
        s.be_cpuset = Some((0..4).collect());
        let env = Env {
            v2: true,
            ..Default::default()
        };
        let t = tick(&s, &Policy::default(), &env, &HashMap::new());
        let sets: Vec<&Knob> = t
            .plan
            .writes()
            .iter()
            .filter(|w| w.knob.kind() == KnobKind::CpusetCpus)
            .map(|w| &w.knob)
            .collect();
        assert_eq!(sets.len(), 3, "parent, pod, container");
        assert!(sets.iter().all(|k| **k == Knob::CpusetCpus(String::new())));
        let env = Env::default();
        let t = tick(&s, &Policy::default(), &env, &HashMap::new());
        assert!(t
            .plan
            .writes()
            .iter()
            .filter(|w| w.knob.kind() == KnobKind::CpusetCpus)
            .all(|w| w.knob == Knob::CpusetCpus("0-15".into())));
        // and the v2 plan executes on a v2-shaped tree (the empty value is written)
        let mut files = vec![(
            "cgroup.controllers".to_string(),
            "cpuset cpu io memory pids\n",
        )];
        for cg in [
            "kubepods/besteffort",
            "kubepods/besteffort/podbe",
            "kubepods/besteffort/podbe/cbe",
        ] {
            files.push((format!("{cg}/cpuset.cpus"), "0-3\n"));
        }
        let m = MemFs::new();
        for (f, c) in &files {
            m.set(f, c);
        }
        let cg = m.v2(Default::default());
        assert!(cg.host().is_v2());
        let env = Env {
            v2: true,
            ..Default::default()
        };
        let t = tick(&s, &Policy::default(), &env, &HashMap::new());
        let r = Executor::new(1).execute(&t.plan, &cg);
        assert!(r.errors.is_empty(), "{:?}", r.errors);
        assert_eq!(
            m.at("kubepods/besteffort/podbe/cbe/cpuset.cpus").unwrap(),
            ""
        );
    }

    /// Issue 15 item 11: the restore plan on a suppressed v1 tree puts the
    /// besteffort quota and cpuset back, the LS quota to kubelet's limit and
    /// its burst to 0, and executes in an order the kernel accepts.
    #[test]
    fn restore_plan_puts_back_quota_cpuset_and_burst() {
        let (m, _) = tree();
        for cg in [
            "",
            "kubepods/besteffort",
            "kubepods/besteffort/podbe",
            "kubepods/besteffort/podbe/cbe",
            "kubepods/burstable/podls",
            "kubepods/burstable/podls/cls",
        ] {
            m.set(
                &format!("cpu/{cg}/cpu.cfs_burst_us").replace("//", "/"),
                "0\n",
            );
        }
        let set = |f: &str, v: &str| m.set(f, v);
        set("cpu/kubepods/besteffort/cpu.cfs_quota_us", "2000\n");
        set("cpuset/kubepods/besteffort/cpuset.cpus", "14-15\n");
        set("cpuset/kubepods/besteffort/podbe/cpuset.cpus", "14-15\n");
        set("cpuset/kubepods/besteffort/podbe/cbe/cpuset.cpus", "15\n");
        set(
            "cpu/kubepods/burstable/podls/cls/cpu.cfs_quota_us",
            "600000\n",
        );
        set(
            "cpu/kubepods/burstable/podls/cls/cpu.cfs_burst_us",
            "200000\n",
        );
        let cg = m.detect_v1();
        let env = Env {
            features: cg.host().features.clone(),
            ..Default::default()
        };
        assert!(env.features.cpu_burst, "burst detected off the tree");
        let s = state(1.0, 1.0, Some(2_000));
        // what the caller reads: the quotas, and the besteffort subtree (a pod the
        // store never saw, left on CPU 15)
        set(
            "cpu/kubepods/besteffort/podbe/cbe/cpu.cfs_quota_us",
            "50000\n",
        );
        set("cpu/kubepods/burstable/podls/cpu.cfs_quota_us", "650000\n");
        set("cpuset/kubepods/besteffort/podnew/cpuset.cpus", "15\n");
        let mut found = Found::default();
        let q = |cg: &str, v: Option<u64>| (CgroupPath::parse(cg).unwrap(), (v, 100_000));
        found.quotas.extend([
            q("kubepods/burstable/podls/cls", Some(600_000)),
            // kubelet's pod quota had 50000 more than its container (an init container, overhead)
            q("kubepods/burstable/podls", Some(650_000)),
            // a BE container kubelet gave no quota: not qoslet's to change
            q("kubepods/besteffort/podbe/cbe", Some(50_000)),
        ]);
        found.be_subtree = [
            "kubepods/besteffort/podbe",
            "kubepods/besteffort/podbe/cbe",
            "kubepods/besteffort/podnew",
        ]
        .iter()
        .map(|c| CgroupPath::parse(c).unwrap())
        .collect();
        let plan = restore_plan(&s, &Policy::default(), &env, &found);
        let r = Executor::new(1).execute(&plan, &cg);
        assert!(r.errors.is_empty(), "{:?}", r.errors);
        let get = |f: &str| m.at(f).unwrap();
        assert_eq!(get("cpu/kubepods/besteffort/cpu.cfs_quota_us"), "-1");
        for cg in ["", "/podbe", "/podbe/cbe"] {
            assert_eq!(
                get(&format!("cpuset/kubepods/besteffort{cg}/cpuset.cpus")),
                "0-15"
            );
        }
        assert_eq!(
            get("cpu/kubepods/burstable/podls/cls/cpu.cfs_quota_us"),
            "200000"
        );
        assert_eq!(
            get("cpu/kubepods/burstable/podls/cls/cpu.cfs_burst_us"),
            "0"
        );
        assert_eq!(
            get("cpu/kubepods/burstable/podls/cpu.cfs_quota_us"),
            "250000",
            "the pod loses what scaling added, keeps kubelet's own extra"
        );
        assert_eq!(
            get("cpu/kubepods/besteffort/podbe/cbe/cpu.cfs_quota_us"),
            "50000"
        );
        assert_eq!(get("cpuset/kubepods/besteffort/podnew/cpuset.cpus"), "0-15");
    }

    /// Issue 15 item 10: with kubelet's static CPU manager the BE cpuset goes
    /// on BE containers only (the parent and pods keep all CPUs, so a new BE
    /// container given the shared pool is inside them), and comes back to
    /// kubelet's own cpuset when suppression stops.
    #[test]
    fn static_cpu_manager_suppresses_on_containers_only() {
        let mut s = state(6.0, 4.0, None);
        s.static_cpu_manager = true;
        s.pods[1].containers[0].entry.cpuset_cpus = "0-13".into();
        let mut p = cfs(50);
        p.threshold.cpu_suppress_policy = CpuSuppressPolicy::Cpuset;
        let sets = |t: &TickResult| -> Vec<(String, Knob)> {
            t.plan
                .writes()
                .iter()
                .filter(|w| w.knob.kind() == KnobKind::CpusetCpus)
                .map(|w| (w.cgroup.as_str().to_string(), w.knob.clone()))
                .collect()
        };
        let t = tick(&s, &p, &Env::default(), &HashMap::new());
        let got = sets(&t);
        assert_eq!(got.len(), 3, "{got:?}");
        for (cg, k) in &got {
            if cg == "kubepods/besteffort/podbe/cbe" {
                assert_eq!(*k, Knob::CpusetCpus("0-1".into()), "the suppressed set");
            } else {
                assert_eq!(*k, Knob::CpusetCpus("0-15".into()), "{cg} keeps all CPUs");
            }
        }
        let t = tick(&s, &cfs(50), &Env::default(), &HashMap::new());
        assert!(sets(&t).contains(&(
            "kubepods/besteffort/podbe/cbe".to_string(),
            Knob::CpusetCpus("0-13".into())
        )));
        // the same node without the static policy narrows the parent and the pod too
        s.static_cpu_manager = false;
        assert_eq!(
            sets(&tick(&s, &p, &Env::default(), &HashMap::new())).len(),
            3
        );
    }

    /// Issue 14 item 7: the cpuset policy as koordlet's `adjustByCPUSet`
    /// takes CPUs: never LSE's, LSR's in proportion; kubelet's reserved CPUs
    /// are BE's too (koordlet leaves out only the node annotation's reservation).
    #[test]
    fn be_cpuset_leaves_lse_cpus_and_takes_lsr_in_proportion() {
        let mut s = state(6.0, 4.0, None);
        for (id, class, cpus) in [("lsr", QosClass::Lsr, "2-3"), ("lse", QosClass::Lse, "4-5")] {
            let mut p = pod(id, class, "/kubepods", 0.0, 200_000);
            p.annotations.insert(
                qoslet_hooks::decide::ANNOTATION_RESOURCE_STATUS.into(),
                format!(r#"{{"cpuset":"{cpus}"}}"#),
            );
            s.pods.push(p);
        }
        let env = Env {
            node: NodeFacts {
                online_cpus: (0..16).collect(),
                reserved_cpus: [0, 1].into(),
                ..Default::default()
            },
            ..Default::default()
        };
        let mut p = cfs(100);
        p.threshold.cpu_suppress_policy = CpuSuppressPolicy::Cpuset;
        let t = tick(&s, &p, &env, &HashMap::new());
        let be = t
            .plan
            .get(&(s.be_parent.clone(), KnobKind::CpusetCpus, None))
            .expect("the BE cpuset");
        // allowance 16 x 100% - 6 - max(0.5, 1) = 9 CPUs of the 14 not LSE's:
        // 9 x 2/14 = 1 from LSR's {2, 3}, 8 from the rest, lowest first
        assert_eq!(be.knob, Knob::CpusetCpus("0-2,6-11".into()), "{}", be.rule);
    }

    /// Issue 14 item 8: a Burstable pod's own memory protection is its
    /// containers' (their requests from kubelet's oom_score_adj), and the kube
    /// QoS dirs get their class's OOM priority where the kernel has the files.
    #[test]
    fn burstable_pods_protect_their_containers_sum_and_qos_dirs_their_oom_priority() {
        let gib = 1u64 << 30;
        let mut s = state(1.0, 0.0, None);
        let mut ls = pod("ls", QosClass::Ls, "/kubepods/burstable", 1.0, 200_000);
        ls.kube = Some(KubeQos::Burstable);
        let mut second = ls.containers[0].clone();
        second.entry.id = "cls2".into();
        second.entry.name = "side".into();
        second.entry.cgroup = ls.cgroup.container("cls2").unwrap();
        ls.containers.push(second);
        for c in &mut ls.containers {
            c.entry.oom_score_adj = 996; // 4 GiB each on a 1000 GiB node
            c.entry.memory_limit = (8 * gib) as i64;
        }
        s.pods = vec![ls.clone()];
        s.qos_dirs = vec![(
            KubeQos::Burstable,
            CgroupPath::parse("/kubepods/burstable").unwrap(),
        )];
        let mut features = Features {
            memory_qos: true,
            ..Default::default()
        };
        features.memory_tunes = features
            .memory_tunes
            .with(qoslet_cgroups::MemTune::Priority);
        let env = Env {
            features,
            node: NodeFacts {
                memory_bytes: 1000 * gib,
                ..Default::default()
            },
            ..Default::default()
        };
        let mut p = Policy::default();
        p.qos.ls_class.memory_qos.enable = true;
        p.qos.ls_class.memory_qos.min_limit_percent = 50;
        p.qos.ls_class.memory_qos.priority = 8;
        let t = tick(&s, &p, &env, &HashMap::new());
        let get = |cg: &CgroupPath, name| {
            t.plan
                .get(&(cg.clone(), name, None))
                .map(|w| w.knob.clone())
        };
        assert_eq!(
            get(&ls.containers[0].entry.cgroup, KnobKind::MemoryMin),
            Some(Knob::MemoryMin(2 * gib))
        );
        assert_eq!(
            get(&ls.cgroup, KnobKind::MemoryMin),
            Some(Knob::MemoryMin(4 * gib)),
            "the pod: its containers' sum"
        );
        let dir = CgroupPath::parse("/kubepods/burstable").unwrap();
        assert_eq!(
            get(
                &dir,
                KnobKind::MemoryTune(qoslet_cgroups::MemTune::Priority)
            ),
            Some(Knob::MemoryTune(qoslet_cgroups::MemTune::Priority, 8))
        );
        assert_eq!(
            get(
                &ls.cgroup,
                KnobKind::MemoryTune(qoslet_cgroups::MemTune::Priority)
            ),
            Some(Knob::MemoryTune(qoslet_cgroups::MemTune::Priority, 8))
        );
        // off: none of it planned (the executor writes NoneMemoryQOS back)
        let t = tick(&s, &Policy::default(), &env, &HashMap::new());
        assert!(
            !t.plan
                .writes()
                .iter()
                .any(|w| w.plugin == Plugin::MemoryQos),
            "{:?}",
            t.plan.writes()
        );
    }

    /// Issue 14: cfsQuotaBurstPeriodSeconds. A container held at 3x its limit
    /// (throttled, the share pool idle) is scaled up only while its bucket
    /// lasts, then scaled back down to the limit; without the setting it stays up.
    #[test]
    fn cfs_quota_burst_period_bounds_how_long_a_quota_stays_scaled_up() {
        let mut s = state(0.0, 0.0, None);
        s.capacity_cores = 64.0;
        s.node_usage_cores = 6.5;
        let mut ls = pod("ls", QosClass::Ls, "/kubepods/burstable", 6.0, 200_000);
        ls.containers[0].cpu_cores = 6.0; // 300 % of its 2-core limit
        s.pods = vec![ls.clone()];
        let id = ls.containers[0].entry.id.clone();
        let run = |s: &NodeState, period: i64| {
            let mut p = Policy::default();
            p.burst.policy = BurstPolicy::CfsQuotaBurstOnly;
            p.burst.cfs_quota_burst_period_seconds = period;
            let mut e = Engine::new(1);
            (0..30)
                .map(|t| {
                    let r = e.plan_at(s, &p, &Env::default(), t as f64);
                    r.burst_quota.get(&id).copied().unwrap_or(200_000)
                })
                .collect::<Vec<u64>>()
        };
        let unbounded = run(&s, -1);
        assert_eq!(
            *unbounded.last().unwrap(),
            600_000,
            "scaled up to 300 % and kept: {unbounded:?}"
        );
        // 5 s: 5 x 200 = 1000 percent-seconds, spent at 200 a second
        let bounded = run(&s, 5);
        let top = *bounded.iter().max().unwrap();
        assert!(top > 200_000, "scaled up first: {bounded:?}");
        assert_eq!(
            *bounded.last().unwrap(),
            200_000,
            "then back to the limit: {bounded:?}"
        );
        let first_down = bounded.windows(2).position(|w| w[1] < w[0]).unwrap();
        assert!(
            first_down <= 6,
            "within the period (and a bucket started at most half full): {bounded:?}"
        );
        // the pod's own koordinator.sh/cpuBurst (koordlet's genPodBurstConfig) over
        // the node's unbounded config: the same bound; `policy: none`: never scaled
        for a in [
            r#"{"cfsQuotaBurstPeriodSeconds":5}"#,
            r#"{"policy":"none"}"#,
        ] {
            s.pods[0].annotations =
                [(burst::ANNOTATION_CPU_BURST.to_string(), a.to_string())].into();
            let r = run(&s, -1);
            assert_eq!(*r.last().unwrap(), 200_000, "{a}: {r:?}");
            if a.contains("none") {
                assert!(r.iter().all(|q| *q == 200_000), "{r:?}");
            } else {
                assert!(r.iter().any(|q| *q > 200_000), "{r:?}");
            }
        }
    }

    /// Review of issue 14 item 5: a pod bound to CPUs (here a trusted,
    /// unlabelled Guaranteed pod) runs without quota: burst scaling leaves it.
    #[test]
    fn burst_leaves_pods_bound_to_cpus() {
        let mut s = state(1.0, 0.0, None);
        let mut g = pod("g", QosClass::Lsr, "/kubepods", 1.0, 200_000);
        g.by_label = false;
        g.annotations.insert(
            qoslet_hooks::decide::ANNOTATION_RESOURCE_STATUS.into(),
            r#"{"cpuset":"2-3"}"#.into(),
        );
        s.pods = vec![g.clone()];
        let env = Env {
            node: NodeFacts {
                online_cpus: (0..16).collect(),
                ..Default::default()
            },
            ..Default::default()
        };
        let mut p = Policy::default();
        p.burst.policy = BurstPolicy::Auto;
        let t = tick(&s, &p, &env, &HashMap::new());
        let q = t
            .plan
            .get(&(
                g.containers[0].entry.cgroup.clone(),
                KnobKind::CpuQuota,
                None,
            ))
            .map(|w| w.knob.clone());
        assert_eq!(
            q,
            Some(Knob::CpuQuota {
                quota: None,
                period: 100_000
            }),
            "the hook's -1 stands: {:?}",
            t.plan.writes()
        );
        assert!(t.burst_quota.is_empty(), "{:?}", t.burst_quota);
        // the online CPUs unknown (no sysfs: the NUMA layout is made up from the
        // capacity): nothing is bound against it, the pod is burst-scaled
        let t = tick(&s, &p, &Env::default(), &HashMap::new());
        assert!(t.burst_quota.contains_key(&g.containers[0].entry.id));
        // unbound, the same pod is burst-scaled as before
        s.pods[0].annotations.clear();
        let t = tick(&s, &p, &env, &HashMap::new());
        assert!(t.burst_quota.contains_key(&g.containers[0].entry.id));
    }

    /// Review of issue 15 items 10-12: the BE cpuset never takes CPUs outside
    /// kubelet's shared pool under the static policy (they are Guaranteed pods'
    /// exclusive ones) nor above the v1 ceiling after a CPU came back online.
    #[test]
    fn be_cpuset_stays_in_the_shared_pool_and_under_the_ceiling() {
        let mut p = cfs(50);
        p.threshold.cpu_suppress_policy = CpuSuppressPolicy::Cpuset;
        let set_of = |s: &NodeState| -> BTreeSet<u32> {
            let t = tick(s, &p, &Env::default(), &HashMap::new());
            let w = t
                .plan
                .get(&(
                    s.pods[1].containers[0].entry.cgroup.clone(),
                    KnobKind::CpusetCpus,
                    None,
                ))
                .unwrap();
            match &w.knob {
                Knob::CpusetCpus(l) => crate::cpuset::parse_cpus(l).unwrap(),
                k => panic!("{k:?}"),
            }
        };
        let mut s = state(6.0, 4.0, None);
        assert!(set_of(&s).contains(&0), "the lowest cores first");
        s.static_cpu_manager = true;
        s.shared_pool = Some((4..16).collect());
        let got = set_of(&s);
        assert!(!got.is_empty() && got.iter().all(|c| *c >= 4), "{got:?}");
        let mut s = state(6.0, 4.0, None);
        s.cpuset_ceiling = Some((2..16).collect());
        let got = set_of(&s);
        assert!(!got.is_empty() && got.iter().all(|c| *c >= 2), "{got:?}");
    }

    /// Review: a BE container capped below its limit is given its limit back
    /// by restore, and its pod (which the cap did not touch) is left alone.
    #[test]
    fn restore_gives_a_capped_be_container_its_limit_and_leaves_its_pod() {
        let mut s = state(1.0, 1.0, Some(2_000));
        s.pods[1].containers[0].entry.cpu_quota = 200_000;
        let be_c = s.pods[1].containers[0].entry.cgroup.clone();
        let be_p = s.pods[1].cgroup.clone();
        let mut found = Found::default();
        found.quotas.insert(be_c.clone(), (Some(50_000), 100_000));
        found.quotas.insert(be_p.clone(), (Some(200_000), 100_000));
        let plan = restore_plan(&s, &Policy::default(), &Env::default(), &found);
        assert_eq!(
            plan.get(&(be_c, KnobKind::CpuQuota, None))
                .map(|w| w.knob.clone()),
            Some(Knob::CpuQuota {
                quota: Some(200_000),
                period: 100_000
            })
        );
        assert!(plan.get(&(be_p, KnobKind::CpuQuota, None)).is_none());
    }
}
