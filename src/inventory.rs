//! The one inventory of the agent (see `qoslet_hooks::inventory`), built from
//! the store once per store generation: cgroup paths validated and classes
//! decided here, once, for every consumer (the metrics collector, the QoS
//! engine). Asking again at the same generation returns the cached `Arc`
//! (two callers racing after a change may each build one, outside the lock).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use qoslet_cgroups::{CgroupPath, PodRoot};
use qoslet_hooks::inventory::{ContainerEntry, Inventory, PodEntry};
use qoslet_hooks::Trust;
use qoslet_proxy::store::{ContainerState, PodState, Store};

/// The inventory of a store, rebuilt when the store's generation moves.
pub struct Inventories {
    store: Store,
    trust: Trust,
    pod_root: PodRoot,
    cached: Mutex<Option<Arc<Inventory>>>,
}

impl qoslet_hooks::inventory::InventorySource for Inventories {
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
    let mut pods = store.read_all(|pods, containers| {
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
                cgroup: cg,
                class,
                annotations: p.annotations.clone(),
                limits: qoslet_isolation::sandbox_limits(p),
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
    use qoslet_proto::cri;
    use qoslet_proxy::store::{ContainerRecord, PodRecord};

    fn sandbox(id: &str, parent: &str, class: Option<&str>) -> cri::PodSandboxConfig {
        cri::PodSandboxConfig {
            metadata: Some(cri::PodSandboxMetadata {
                name: format!("n-{id}"),
                namespace: "ns".into(),
                uid: id.into(),
                attempt: 0,
            }),
            labels: class
                .map(|c| {
                    [(
                        qoslet_hooks::class::LABEL_QOS_CLASS.to_string(),
                        c.to_string(),
                    )]
                    .into()
                })
                .unwrap_or_default(),
            linux: Some(cri::LinuxPodSandboxConfig {
                cgroup_parent: parent.into(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn built_once_per_generation_with_paths_and_classes() {
        let store = Store::new();
        let pod = |id, parent, class| {
            store.upsert_pod(PodRecord::from_config(id, &sandbox(id, parent, class), ""))
        };
        let container = |id: &str, name: &str| {
            let cfg = cri::ContainerConfig {
                metadata: Some(cri::ContainerMetadata {
                    name: name.into(),
                    attempt: 0,
                }),
                ..Default::default()
            };
            store.upsert_container(ContainerRecord::from_config(id, "p1", &cfg));
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
