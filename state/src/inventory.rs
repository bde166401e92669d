//! The one inventory of the agent: the pods and containers qoslet acts on, as
//! the store holds them at one generation, with their cgroup paths validated
//! and their class decided once. The metrics collector and the QoS engine read
//! it (and the NRI front end and eviction will), instead of each walking the
//! store and classifying every pod again. Asking again at the same generation
//! returns the cached `Arc` (two callers racing after a change may each build
//! one, outside the lock).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use qoslet_cgroups::{CgroupPath, PodRoot};
use qoslet_hooks::class::PodClass;
use qoslet_hooks::{decide, Trust};

use crate::cluster::ClusterPod;
use crate::store::{ContainerState, PodState, Store};

/// The ready pods and their running containers at one store generation.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Inventory {
    /// The store generation this was built from.
    pub generation: u64,
    /// Ready pods whose cgroup parent is a pod's own cgroup under the kubelet
    /// root (others are left out: qoslet neither reads nor writes them), by id.
    pub pods: Vec<PodEntry>,
}

/// A ready pod.
#[derive(Debug, Clone, PartialEq)]
pub struct PodEntry {
    pub id: String,
    pub name: String,
    pub namespace: String,
    /// The Kubernetes pod UID (from the sandbox metadata).
    pub uid: String,
    /// The pod's labels (input of its author: read, never trusted).
    pub labels: BTreeMap<String, String>,
    /// When the sandbox was created (Unix nanoseconds).
    pub created_at: i64,
    /// The pod's `spec.priority`, when a source knows it (the cluster side);
    /// CRI does not carry it.
    pub priority: Option<i32>,
    /// What the API server says of it (joined by UID; `None`: no cluster, or
    /// a pod the cluster does not know, such as a static pod's sandbox).
    pub cluster: Option<Arc<ClusterPod>>,
    /// Its own cgroup, validated (never empty, never outside the kubelet root).
    pub cgroup: CgroupPath,
    /// Its class with where it came from (`None`: not qoslet's to touch:
    /// skipped by label, or no class).
    pub class: Option<PodClass>,
    pub annotations: BTreeMap<String, String>,
    /// What the sandbox config asked for the whole pod.
    pub limits: decide::SandboxLimits,
    /// Its running containers, by id.
    pub containers: Vec<ContainerEntry>,
}

/// A running container.
#[derive(Debug, Clone, PartialEq)]
pub struct ContainerEntry {
    pub id: String,
    pub name: String,
    /// Its cgroup (the pod's child), validated.
    pub cgroup: CgroupPath,
    /// What kubelet asked for: memory limit (0: none), CFS quota (≤ 0: none)
    /// and period (the kernel's 100 ms when kubelet gave none).
    pub memory_limit: i64,
    pub cpu_quota: i64,
    pub cpu_period: i64,
    /// The cpuset kubelet asked for (empty: none).
    pub cpuset_cpus: String,
    /// kubelet's `oom_score_adj` (0: unknown).
    pub oom_score_adj: i64,
    /// The CPU shares kubelet asked for (0: none given).
    pub cpu_shares: i64,
}

impl Inventory {
    /// The number of containers in all pods.
    pub fn containers(&self) -> usize {
        self.pods.iter().map(|p| p.containers.len()).sum()
    }

    /// The CPUs the LSE/LSR pods of this inventory are bound to (each pod's
    /// [`decide::pod_binding`] and its containers' [`decide::binding`]s), by
    /// [`decide::BoundCpus::add`]: what the share pool leaves out.
    pub fn bound(&self, node: &decide::NodeFacts) -> decide::BoundCpus {
        let mut b = decide::BoundCpus::default();
        for p in &self.pods {
            if let Some(pc) = p.class {
                let containers = p.containers.iter().map(ContainerEntry::requested);
                b.add(&p.id, pc, &p.annotations, &p.limits, containers, node);
            }
        }
        b
    }
}

impl ContainerEntry {
    /// What kubelet asked for, as the decisions take it.
    pub fn requested(&self) -> decide::Requested<'_> {
        decide::Requested {
            memory_limit: self.memory_limit,
            cpu_quota: self.cpu_quota,
            cpu_period: self.cpu_period,
            cpuset_cpus: &self.cpuset_cpus,
            oom_score_adj: self.oom_score_adj,
            pod_milli_cpu: 0,
        }
    }
}

/// Where consumers get the inventory of the store as it is now (built at most
/// once per store generation).
pub trait InventorySource: Send + Sync + 'static {
    fn current(&self) -> Arc<Inventory>;
}

/// The inventory of a store, rebuilt when the store's generation moves.
pub struct Inventories {
    store: Store,
    trust: Trust,
    pod_root: PodRoot,
    cached: Mutex<Option<Arc<Inventory>>>,
}

impl InventorySource for Inventories {
    fn current(&self) -> Arc<Inventory> {
        Inventories::current(self)
    }
}

impl Inventories {
    pub fn new(store: Store, trust: Trust, pod_root: PodRoot) -> Arc<Self> {
        Arc::new(Self {
            store,
            trust,
            pod_root,
            cached: Mutex::new(None),
        })
    }

    /// The inventory of the store as it is now (built at most once per
    /// generation, by whichever consumer asks first).
    pub fn current(&self) -> Arc<Inventory> {
        let generation = self.store.generation();
        let lock = || self.cached.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = lock().as_ref().filter(|i| i.generation == generation) {
            return i.clone();
        }
        // built outside the lock: the collector (on the thread that serves
        // kubelet) never waits for the engine's build, nor the engine for its
        let i = Arc::new(build(&self.store, generation, &self.trust, &self.pod_root));
        let mut cached = lock();
        if cached.as_ref().is_none_or(|c| c.generation < generation) {
            *cached = Some(i.clone());
        }
        i
    }
}

/// Builds the inventory of `store` (taken as at `generation`).
pub fn build(store: &Store, generation: u64, trust: &Trust, pod_root: &PodRoot) -> Inventory {
    let mut pods = store.read_all_with_cluster(|pods, containers, cluster| {
        let mut by_pod: HashMap<&str, Vec<ContainerEntry>> = HashMap::new();
        let mut out: Vec<PodEntry> = Vec::new();
        let mut cgs: HashMap<&str, CgroupPath> = HashMap::new();
        for p in pods.values().filter(|p| p.state == PodState::Ready) {
            match CgroupPath::pod_under(&p.cgroup_parent, pod_root) {
                Ok(cg) if !cg.as_str().is_empty() => {
                    cgs.insert(p.id.as_str(), cg);
                }
                _ => {}
            }
        }
        for c in containers
            .values()
            .filter(|c| c.state == ContainerState::Running)
        {
            let Some(pcg) = cgs.get(c.pod_id.as_str()) else {
                continue;
            };
            let Ok(cg) = pcg.container(&c.id) else {
                continue;
            };
            let r = c.requested.clone().unwrap_or_default();
            by_pod
                .entry(c.pod_id.as_str())
                .or_default()
                .push(ContainerEntry {
                    id: c.id.clone(),
                    name: c.name.clone(),
                    cgroup: cg,
                    memory_limit: r.memory_limit_in_bytes,
                    cpu_quota: r.cpu_quota,
                    cpu_period: if r.cpu_period > 0 {
                        r.cpu_period
                    } else {
                        100_000
                    },
                    cpuset_cpus: r.cpuset_cpus,
                    oom_score_adj: r.oom_score_adj,
                    cpu_shares: r.cpu_shares,
                });
        }
        for p in pods.values().filter(|p| p.state == PodState::Ready) {
            let Some(cg) = cgs.remove(p.id.as_str()) else {
                continue;
            };
            let class = qoslet_hooks::classify(&p.labels, &p.namespace, &p.cgroup_parent, trust)
                .pod_class();
            let mut containers = by_pod.remove(p.id.as_str()).unwrap_or_default();
            containers.sort_by(|a, b| a.id.cmp(&b.id));
            out.push(PodEntry {
                id: p.id.clone(),
                name: p.name.clone(),
                namespace: p.namespace.clone(),
                uid: p.uid.clone(),
                labels: p.labels.clone(),
                created_at: p.created_at,
                priority: p
                    .priority
                    .or_else(|| cluster.get(&p.uid).and_then(|c| c.priority)),
                cluster: cluster.get(&p.uid).cloned(),
                cgroup: cg,
                class,
                annotations: p.annotations.clone(),
                limits: p.sandbox_limits(),
                containers,
            });
        }
        out
    });
    pods.sort_by(|a, b| a.id.cmp(&b.id));
    Inventory { generation, pods }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{ContainerRecord, PodRecord};
    use qoslet_hooks::class::LABEL_QOS_CLASS;

    #[test]
    fn built_once_per_generation_with_paths_and_classes() {
        let store = Store::new();
        let pod = |id: &str, parent: &str, class: Option<&str>| {
            store.upsert_pod(PodRecord {
                id: id.into(),
                name: format!("n-{id}"),
                namespace: "ns".into(),
                uid: format!("uid-{id}"),
                labels: class
                    .map(|c| [(LABEL_QOS_CLASS.to_string(), c.to_string())].into())
                    .unwrap_or_default(),
                cgroup_parent: parent.into(),
                state: PodState::Ready,
                created_at: 1_700_000_000_000_000_000,
                priority: Some(-5),
                ..Default::default()
            })
        };
        let container = |id: &str, name: &str| {
            store.upsert_container(ContainerRecord {
                id: id.into(),
                pod_id: "p1".into(),
                name: name.into(),
                requested: Some(crate::store::Resources {
                    cpu_shares: 2,
                    ..Default::default()
                }),
                ..Default::default()
            });
            store.set_container_state(id, ContainerState::Running);
        };
        pod("p1", "/kubepods/besteffort/podp1", Some("BE"));
        // a hostile parent (outside the kubelet root) is left out
        pod("p2", "/system.slice", None);
        container("c1", "work");
        container("c0", "created-only");
        store.set_container_state("c0", ContainerState::Created);
        let inv = Inventories::new(store.clone(), Trust::default(), PodRoot::default());
        let a = inv.current();
        assert_eq!(a.pods.len(), 1, "{a:?}");
        let p = &a.pods[0];
        assert_eq!(p.cgroup.as_str(), "kubepods/besteffort/podp1");
        assert_eq!(p.class.map(|c| c.class), Some(qoslet_hooks::QosClass::Be));
        assert_eq!(p.containers.len(), 1);
        assert_eq!(
            p.containers[0].cgroup.as_str(),
            "kubepods/besteffort/podp1/c1"
        );
        assert_eq!(p.containers[0].cpu_period, 100_000);
        assert_eq!(p.containers[0].cpu_shares, 2);
        assert_eq!(
            (p.uid.as_str(), p.created_at, p.priority),
            ("uid-p1", 1_700_000_000_000_000_000, Some(-5))
        );
        assert_eq!(
            p.labels.get(LABEL_QOS_CLASS).map(String::as_str),
            Some("BE")
        );
        assert!(
            Arc::ptr_eq(&a, &inv.current()),
            "same generation: the same inventory"
        );
        container("c2", "side");
        let b = inv.current();
        assert!(!Arc::ptr_eq(&a, &b));
        assert_eq!(b.containers(), 2);
    }
}
