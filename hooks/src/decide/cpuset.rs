//! CPU placement: a pod's binding from its resource-status annotation, the LS
//! share pool, NUMA nodes, and the CFS quota a bound container goes without.

use super::*;

/// The kernel's CFS period when kubelet gave none, in µs.
pub(super) const DEFAULT_CFS_PERIOD_US: u64 = 100_000;

/// CPUs a container is bound to, and a warning when the annotation asked for more.
pub type Bound = (BTreeSet<u32>, Option<Warning>);

/// The CPUs a container of an LSE/LSR pod is bound to by its pod's
/// resource-status annotation, as this pod may have them (`bound_cpus`'s
/// rules), with a warning when narrowed; `Ok(None)`: not bound.
pub fn binding(
    pc: PodClass,
    pod_annotations: &BTreeMap<String, String>,
    requested: &Requested,
    node: &NodeFacts,
) -> Result<Option<Bound>, BindingRefused> {
    if !matches!(pc.class, QosClass::Lse | QosClass::Lsr) {
        return Ok(None);
    }
    let Some(a) = pod_annotations.get(ANNOTATION_RESOURCE_STATUS) else {
        return Ok(None);
    };
    bound_cpus(a, pc, requested, node)
}

/// The CPUs bound to LSE and to LSR pods, and which pods are bound: what
/// leaves the LS share pool. The one computation of it, for the hooks'
/// placement of a new container and for the engine's tick alike, from the
/// store's pods and the CPUs online now.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BoundCpus {
    pub lse: BTreeSet<u32>,
    pub lsr: BTreeSet<u32>,
    pub pods: std::collections::HashSet<String>,
}

impl BoundCpus {
    /// Adds pod `id`'s bindings: its own ([`pod_binding`]) and its containers'.
    pub fn add<'a>(
        &mut self,
        id: &str,
        pc: PodClass,
        pod_annotations: &BTreeMap<String, String>,
        sandbox: &SandboxLimits,
        containers: impl IntoIterator<Item = Requested<'a>>,
        node: &NodeFacts,
    ) {
        for cpus in pod_bindings(pc, pod_annotations, sandbox, containers, node) {
            self.pods.insert(id.to_string());
            match pc.class {
                QosClass::Lse => self.lse.extend(&cpus),
                _ => self.lsr.extend(&cpus),
            }
        }
    }

    /// Every bound CPU.
    pub fn cpus(&self) -> BTreeSet<u32> {
        self.lse.union(&self.lsr).copied().collect()
    }

    /// The LS share pool of `online`: [`share_pool`] without these CPUs.
    pub fn share_pool(&self, online: &BTreeSet<u32>) -> BTreeSet<u32> {
        share_pool(online, [self.lse.clone(), self.lsr.clone()])
    }
}

/// The LS share pool as koordlet's states informer computes it
/// (`calCPUSharePools`): `online` without every CPU a pod is bound to.
/// kubelet's reserved CPUs stay in it (koordlet's `calcNodeTopo`: Burstable
/// pods must keep somewhere to run). `bound`: the [`binding`]s of the LSE/LSR
/// pods ([`pod_binding`]) and of their running containers ([`BoundCpus`]).
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
pub(super) fn unset_quota(
    pc: PodClass,
    cpus: &BTreeSet<u32>,
    requested: &Requested,
) -> Result<Knob, QuotaKept> {
    let period = u64::try_from(requested.cpu_period)
        .ok()
        .filter(|p| *p > 0)
        .unwrap_or(DEFAULT_CFS_PERIOD_US);
    if !pc.trusted {
        let Some(milli) = requested.milli_cpu() else {
            return Err(QuotaKept::NoLimit);
        };
        if cpus.len() as u64 * 1000 > milli {
            return Err(QuotaKept::OverLimit {
                cpus: cpus.len(),
                milli,
            });
        }
    }
    Ok(Knob::CpuQuota {
        quota: None,
        period,
    })
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
pub(super) fn shared_cpus(
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
                d.warnings.push(Warning::NumaPoolEmpty {
                    nodes: nodes.clone(),
                });
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
            d.warnings.push(Warning::NumaNodesUnknown { nodes });
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
        d.warnings.push(Warning::SharePoolEmpty {
            kubelet: (!kubelet.is_empty()).then(|| kubelet.to_string()),
        });
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
pub(super) fn bound_cpus(
    annotation: &str,
    pc: PodClass,
    requested: &Requested,
    node: &NodeFacts,
) -> Result<Option<Bound>, BindingRefused> {
    let kubelet_cpuset = requested.cpuset_cpus;
    #[derive(serde::Deserialize)]
    struct Status {
        #[serde(default)]
        cpuset: Option<String>,
    }
    if annotation.len() > MAX_RESOURCE_STATUS_BYTES {
        return Err(BindingRefused::TooLarge {
            bytes: annotation.len(),
        });
    }
    let v: serde_json::Value =
        serde_json::from_str(annotation).map_err(|e| BindingRefused::NotJson(e.to_string()))?;
    if !v.is_object() {
        return Err(BindingRefused::NotObject);
    }
    let s: Status = serde_json::from_value(v).map_err(|e| BindingRefused::Shape(e.to_string()))?;
    let Some(cpus) = s
        .cpuset
        .map(|c| c.trim().to_string())
        .filter(|c| !c.is_empty())
    else {
        return Ok(None);
    };
    if !pc.by_label && !pc.trusted {
        return Err(BindingRefused::NotByLabel { class: pc.class });
    }
    let short = shown(&cpus);
    let wanted = parse_cpu_list(&cpus)
        .filter(|c| !c.is_empty())
        .ok_or_else(|| BindingRefused::Malformed {
            cpus: short.clone(),
        })?;
    if node.online_cpus.is_empty() {
        return Err(BindingRefused::OnlineUnknown);
    }
    let mut got: BTreeSet<u32> = wanted
        .intersection(&node.online_cpus)
        .filter(|c| !node.reserved_cpus.contains(c))
        .copied()
        .collect();
    let mut within = None;
    if !pc.trusted && !kubelet_cpuset.trim().is_empty() {
        match parse_cpu_list(kubelet_cpuset) {
            Some(k) => got.retain(|c| k.contains(c)),
            None => return Err(BindingRefused::KubeletMalformed(shown(kubelet_cpuset))),
        }
        within = Some(kubelet_cpuset.to_string());
    }
    if got.is_empty() {
        return Err(BindingRefused::NoneOnline {
            cpus: short,
            kubelet: within,
        });
    }
    // an untrusted pod binds to no more whole CPUs than its own limit (the
    // scheduler gives an LSE/LSR pod exactly that many): bound CPUs leave the
    // share pool of every other pod, and run without CFS quota
    if !pc.trusted {
        // the pod's limit where known: the scheduler binds the pod, all its
        // containers to the same CPUs (a 1-CPU sidecar of a 4-CPU pod too)
        let Some(milli) = requested.milli_cpu().max(nonzero(requested.pod_milli_cpu)) else {
            return Err(BindingRefused::NoLimit);
        };
        let most = milli / 1000;
        if got.len() as u64 > most {
            return Err(BindingRefused::OverLimit {
                cpus: got.len(),
                milli,
            });
        }
    }
    let narrowed = (got != wanted).then(|| Warning::BindingNarrowed {
        asked: short,
        got: format_cpu_list(&got),
        kubelet: within,
    });
    Ok(Some((got, narrowed)))
}
