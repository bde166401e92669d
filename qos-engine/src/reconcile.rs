//! Reconcile: what the runtime hooks set on a pod and its containers when
//! they started (group identity, SCHED_IDLE, memory QoS, BE batch resources,
//! LSR/LSE CPU binding, block I/O limits), re-derived every tick from the
//! current policy with the hooks' own decision functions. The executor writes
//! only what differs, so this puts back drift and applies a reloaded policy
//! to running pods, and costs nothing at steady state.

use std::collections::{BTreeMap, BTreeSet};

use qoslet_cgroups::{CgroupPath, Knob};
use qoslet_hooks::batch::SpecBatch;
use qoslet_hooks::decide::{self, Action, Context, Decision, NodeFacts, Requested, SandboxLimits};
use qoslet_hooks::{KubeQos, PodClass, QosClass};
use qoslet_state::inventory::ContainerEntry;

use crate::plan::{Plan, Plugin, Write};

/// A pod as the engine sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct Pod {
    pub id: String,
    pub class: QosClass,
    /// The class came from the pod's label (not its Kubernetes QoS).
    pub by_label: bool,
    /// The pod's labels and scheduler annotations are trusted (`trust:`).
    pub trusted: bool,
    /// The Kubernetes QoS its cgroup parent shows.
    pub kube: Option<KubeQos>,
    pub cgroup: CgroupPath,
    pub annotations: BTreeMap<String, String>,
    /// The pod spec's batch resources, from the cluster view
    /// ([`qoslet_state::ClusterPod::batch`]; `None`: a pod the view does not
    /// know, `Some(None)`: a spec that asks for none).
    pub spec_batch: Option<Option<String>>,
    /// What the sandbox config asked for the whole pod.
    pub limits: SandboxLimits,
    /// The sandbox (pause) container's own cgroup, a child of the pod's that no
    /// CRI container record names (`None`: unknown or absent). On v1 a pod's
    /// cpuset cannot shrink below a child's, so it is written with the containers'.
    pub sandbox: Option<CgroupPath>,
    /// CPU used, cores (from the metrics cache; 0 when unknown).
    pub cpu_cores: f64,
    pub containers: Vec<Container>,
}

/// A running container: the inventory's entry (its id, cgroup and what
/// kubelet asked for), with its usage filled in per tick.
#[derive(Debug, Clone, PartialEq)]
pub struct Container {
    pub entry: ContainerEntry,
    /// From the metrics cache.
    pub cpu_cores: f64,
    pub throttled_ratio: f64,
}

impl Pod {
    /// An inventory pod as the engine plans it (its usage filled in per tick);
    /// `None` for a pod without a class (not qoslet's to touch).
    pub fn from_entry(p: &qoslet_state::inventory::PodEntry) -> Option<Self> {
        let pc = p.class?;
        Some(Pod {
            id: p.id.clone(),
            class: pc.class,
            by_label: pc.by_label,
            trusted: pc.trusted,
            kube: pc.kube,
            cgroup: p.cgroup.clone(),
            annotations: p.annotations.clone(),
            spec_batch: p.cluster.as_ref().map(|c| c.batch.clone()),
            limits: p.limits,
            sandbox: p.cgroup.container(&p.id).ok(),
            cpu_cores: 0.0,
            containers: p.containers.iter().map(Container::from_entry).collect(),
        })
    }

    /// The cluster view's word on its batch resources.
    pub fn spec_batch(&self) -> SpecBatch<'_> {
        SpecBatch::of(self.spec_batch.as_ref().map(Option::as_deref))
    }

    /// What kubelet asked for container `c` of this pod, with the pod's CPU
    /// limit (an untrusted pod's binding is sized by it).
    pub fn requested<'a>(&self, c: &'a Container) -> Requested<'a> {
        Requested {
            pod_milli_cpu: self.limits.milli_cpu(),
            ..c.requested()
        }
    }

    /// The class as the hooks' decisions take it.
    pub fn pod_class(&self) -> PodClass {
        PodClass {
            class: self.class,
            by_label: self.by_label,
            trusted: self.trusted,
            kube: self.kube,
        }
    }
}

impl Container {
    /// An inventory container as the engine plans it (usage filled in per tick).
    pub fn from_entry(c: &ContainerEntry) -> Self {
        Container {
            entry: c.clone(),
            cpu_cores: 0.0,
            throttled_ratio: 0.0,
        }
    }

    /// What kubelet asked for, as the hooks' decisions take it.
    pub fn requested(&self) -> Requested<'_> {
        self.entry.requested()
    }
}

/// Adds the cgroup setting of a decision (CRI-carried or written by the
/// hooks alike: the runtime wrote the former into the same file) with its
/// rule, and what the file goes back to when the decision is gone (`back`).
fn add(plan: &mut Plan, cg: &CgroupPath, d: &Decision, v2: bool, back: Option<Knob>) {
    let Some(k) = d.knob() else {
        return; // resctrl: the engine's resctrl sync keeps the groups
    };
    // the file as this layout names it (the runtime wrote a CRI-carried
    // setting into the same file the engine now keeps)
    let (setting, value) = k.describe(v2);
    let w = Write {
        cgroup: cg.clone(),
        knob: k.clone(),
        plugin: decide::feature(k),
        rule: format!("{setting} = {value}: {}", d.because),
    };
    if let Some(b) = back {
        plan.restore_to(&w, b);
    }
    plan.add(w);
}

/// What a container's share-pool cpuset goes back to once the pool is all of
/// the CPUs again (or the container is bound after all): kubelet's cpuset, or
/// without one what the runtime left, the parent's CPUs (v2: the empty value,
/// inherited; v1: every CPU it may use).
fn pool_restore(r: &Requested, v2: bool, whole: &BTreeSet<u32>) -> Option<Knob> {
    let k = r.cpuset_cpus.trim();
    if !k.is_empty() {
        Some(Knob::CpusetCpus(k.to_string()))
    } else if v2 {
        Some(Knob::CpusetCpus(String::new()))
    } else {
        (!whole.is_empty())
            .then(|| Knob::CpusetCpus(qoslet_cgroups::cgroup::format_cpu_list(whole)))
    }
}

/// The kube QoS dirs' group identity (kernels with bvt, while koordlet's rule
/// is on) and SCHED_IDLE (kernels with `cpu.idle`, under `cpuPolicy:
/// coreSched`), as koordlet's kube-QoS-level reconcilers keep them; when
/// turned off they leave the plan and the executor writes 0 back.
pub fn kube_qos(dirs: &[(KubeQos, CgroupPath)], ctx: &Context, plan: &mut Plan) {
    let want = decide::kube_qos_dirs(ctx.policy);
    let bvt_on = decide::group_identity_on(ctx.policy);
    let core_sched = ctx.policy.cpu_policy == qoslet_hooks::policy::CpuPolicy::CoreSched;
    for (kube, cg) in dirs {
        let Some(&(_, bvt, idle)) = want.iter().find(|w| w.0 == *kube) else {
            continue;
        };
        if ctx.features.bvt && bvt_on {
            plan.add(Write {
                cgroup: cg.clone(),
                knob: Knob::GroupIdentity(bvt),
                plugin: Plugin::CpuQos,
                rule: format!(
                    "{kube:?} kube QoS dir: group identity {bvt} (koordlet's kubeQOSDirParams)"
                ),
            });
        }
        // koordlet's calculateQoSResources: the QoS dir takes its class's
        // (Guaranteed LSR's, Burstable LS's, BestEffort BE's) OOM priority; not
        // its OOM group (qoslet's choice: memory.oom.group on a QoS dir makes an
        // OOM kill every pod of the tier, on kubepods every pod of the node)
        let class = match kube {
            KubeQos::Guaranteed => QosClass::Lsr,
            KubeQos::Burstable => QosClass::Ls,
            KubeQos::BestEffort => QosClass::Be,
        };
        for d in decide::memory_tunes(class, &ctx.policy.of(class).memory_qos, ctx) {
            if let Some(
                k @ Knob::MemoryTune(
                    qoslet_cgroups::MemTune::UsePriorityOom | qoslet_cgroups::MemTune::Priority,
                    _,
                ),
            ) = d.knob()
            {
                plan.add(Write {
                    cgroup: cg.clone(),
                    knob: k.clone(),
                    plugin: Plugin::MemoryQos,
                    rule: format!("{kube:?} kube QoS dir: {}", d.because),
                });
            }
        }
        if ctx.features.cpu_idle && core_sched && idle {
            plan.add(Write {
                cgroup: cg.clone(),
                knob: Knob::CpuIdle(idle),
                plugin: Plugin::CpuQos,
                rule: format!(
                    "{kube:?} kube QoS dir: cpu.idle {} (cpuPolicy {:?}, schedIdle)",
                    u8::from(idle),
                    ctx.policy.cpu_policy
                ),
            });
        }
    }
}

/// Adds the CPUs `p` and its containers are bound to (LSE/LSR, by its
/// resource-status annotation as the hooks accept it) to `bound`: they leave
/// the share pool.
pub fn bind(p: &Pod, node: &NodeFacts, bound: &mut decide::BoundCpus) {
    let containers = p.containers.iter().map(Container::requested);
    bound.add(
        &p.id,
        p.pod_class(),
        &p.annotations,
        &p.limits,
        containers,
        node,
    );
}

/// Whether container `c` of `p` is bound to CPUs.
fn container_bound(p: &Pod, c: &Container, node: &NodeFacts) -> bool {
    matches!(
        decide::binding(p.pod_class(), &p.annotations, &p.requested(c), node),
        Ok(Some(_))
    )
}

/// Adds what the hooks would set on `p` and its containers now (`ctx` with
/// the share pool of every pod's [`bound`] CPUs).
pub fn pod(p: &Pod, ctx: &Context, plan: &mut Plan) {
    let spec = p.spec_batch();
    let d = decide::pod(p.pod_class(), &p.annotations, spec, &p.limits, ctx);
    for d in &d.decisions {
        add(plan, &p.cgroup, d, ctx.v2, None);
    }
    // a pod whose own request is not in CRI (Burstable: only its containers'
    // are, through kubelet's oom_score_adj) protects what its containers claim
    // (koordlet's calculatePodResources: the pod's request x min% / low%)
    let mut sums = [(0u64, false); 2];
    for c in &p.containers {
        let r = p.requested(c);
        let d = decide::container(p.pod_class(), &c.entry.name, &p.annotations, spec, &r, ctx);
        // a cpuset that is not the container's binding is its share-pool place,
        // which goes back when the pool is whole again (a binding, a batch limit
        // or a quota unset stays as the runtime keeps it: the pod's annotation
        // and spec do not change while it runs)
        let bound = container_bound(p, c, ctx.node);
        for d in &d.decisions {
            match d.knob() {
                Some(Knob::MemoryMin(v)) => sums[0] = (sums[0].0.saturating_add(*v), true),
                Some(Knob::MemoryLow(v)) => sums[1] = (sums[1].0.saturating_add(*v), true),
                _ => {}
            }
            let back = match (&d.action, ctx.share_pool) {
                (Action::Cri(Knob::CpusetCpus(_)), Some(pool)) if !bound => {
                    pool_restore(&r, ctx.v2, pool.whole)
                }
                _ => None,
            };
            add(plan, &c.entry.cgroup, d, ctx.v2, back);
        }
    }
    let own = |kind: qoslet_cgroups::KnobKind| {
        d.decisions
            .iter()
            .any(|d| d.knob().is_some_and(|k| k.kind() == kind))
    };
    if ctx.features.memory_qos {
        for ((sum, any), knob) in sums
            .into_iter()
            .zip([Knob::MemoryMin(0), Knob::MemoryLow(0)])
        {
            if !any || own(knob.kind()) {
                continue;
            }
            let knob = match knob {
                Knob::MemoryMin(_) => Knob::MemoryMin(sum),
                _ => Knob::MemoryLow(sum),
            };
            let (setting, value) = knob.describe(ctx.v2);
            plan.add(Write {
                cgroup: p.cgroup.clone(),
                knob,
                plugin: Plugin::MemoryQos,
                rule: format!(
                    "{setting} = {value}: the sum of its containers' (the pod's request is theirs)"
                ),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use qoslet_cgroups::Features;
    use qoslet_hooks::policy::ResourceQosStrategy;

    const ANNOTATION_SPEC: &str = qoslet_hooks::batch::ANNOTATION_EXTENDED_RESOURCE_SPEC;

    fn be_pod() -> Pod {
        let spec = r#"{"containers":{"work":{"requests":{"kubernetes.io/batch-cpu":"500","kubernetes.io/batch-memory":"1Gi"},"limits":{"kubernetes.io/batch-cpu":"1000","kubernetes.io/batch-memory":"2Gi"}}}}"#;
        Pod {
            id: "p1".into(),
            class: QosClass::Be,
            by_label: true,
            trusted: true,
            kube: None,
            cgroup: CgroupPath::parse("/kubepods/besteffort/podp1").unwrap(),
            annotations: [(ANNOTATION_SPEC.to_string(), spec.to_string())].into(),
            spec_batch: None,
            limits: Default::default(),
            sandbox: None,
            cpu_cores: 0.0,
            containers: vec![Container {
                entry: ContainerEntry {
                    id: "c1".into(),
                    name: "work".into(),
                    cgroup: CgroupPath::parse("/kubepods/besteffort/podp1/c1").unwrap(),
                    memory_limit: 0,
                    cpu_quota: 0,
                    cpu_period: 100_000,
                    cpuset_cpus: String::new(),
                    oom_score_adj: 0,
                    cpu_shares: 0,
                },
                cpu_cores: 0.0,
                throttled_ratio: 0.0,
            }],
        }
    }

    #[test]
    fn be_pod_gets_what_the_hooks_set_with_rules() {
        let features = Features {
            cpu_idle: true,
            memory_qos: true,
            ..Default::default()
        };
        let mut policy = ResourceQosStrategy::default();
        policy.be_class.memory_qos.enable = true;
        policy.be_class.cpu_qos.enable = true;
        let devices = BTreeMap::new();
        let ctx = Context {
            features: &features,
            v2: false,
            policy: &policy,
            page_size: 4096,
            node: &Default::default(),
            devices: &devices,
            share_pool: None,
        };
        let mut plan = Plan::new();
        pod(&be_pod(), &ctx, &mut plan);
        let find = |cg: &str, name: &str| {
            plan.writes()
                .iter()
                .find(|w| w.cgroup.as_str().ends_with(cg) && w.knob.name() == name)
                .cloned()
        };
        let idle = find("podp1", "cpu-idle").expect("pod cpu.idle");
        assert_eq!(idle.knob, Knob::CpuIdle(true));
        assert_eq!(idle.plugin, Plugin::CpuQos);
        let q = find("c1", "cpu-quota").expect("container quota");
        assert_eq!(
            q.knob,
            Knob::CpuQuota {
                quota: Some(100_000),
                period: 100_000
            }
        );
        assert!(q.rule.contains("batch-cpu"), "{}", q.rule);
        let m = find("c1", "memory-min").expect("container memory.min");
        assert_eq!(m.plugin, Plugin::MemoryQos);
        assert!(
            find("podp1", "memory-limit").is_some(),
            "pod batch memory sum"
        );
        // issue 46: the same pod whose batch resources are only in its spec
        // (no webhook wrote the annotation) gets the same writes, by the spec
        let mut from_spec = be_pod();
        let a = from_spec.annotations.remove(ANNOTATION_SPEC).unwrap();
        from_spec.spec_batch = Some(Some(a));
        let mut spec_plan = Plan::new();
        pod(&from_spec, &ctx, &mut spec_plan);
        let knobs = |p: &Plan| {
            p.writes()
                .iter()
                .map(|w| (w.cgroup.clone(), w.knob.clone()))
                .collect::<Vec<_>>()
        };
        assert_eq!(knobs(&spec_plan), knobs(&plan));
        let q = spec_plan
            .writes()
            .iter()
            .find(|w| w.cgroup.as_str().ends_with("c1") && w.knob.name() == "cpu-quota")
            .cloned()
            .unwrap();
        assert!(q.rule.ends_with("(pod spec)"), "{}", q.rule);
        // policy reloaded with memory QoS off: no memory QoS writes
        let mut off = policy.clone();
        off.be_class.memory_qos.enable = false;
        let ctx = Context {
            policy: &off,
            ..ctx
        };
        let mut plan = Plan::new();
        pod(&be_pod(), &ctx, &mut plan);
        assert!(!plan.writes().iter().any(|w| w.plugin == Plugin::MemoryQos));
    }
}
