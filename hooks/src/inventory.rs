//! One inventory: the pods and containers qoslet acts on, as the store holds
//! them at one generation, with their cgroup paths validated and their class
//! decided once. The metrics collector and the QoS engine read it (and the
//! NRI plane and eviction will), instead of each walking the store and
//! classifying every pod again. The composition builds it from the store
//! (`src/inventory.rs`); this is the data, shared as `Arc<Inventory>`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use qoslet_cgroups::CgroupPath;

use crate::class::PodClass;
use crate::decide;

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
    /// Its own cgroup, validated (never empty, never outside the kubelet root).
    pub cgroup: CgroupPath,
    /// Its class with where it came from (`None`: not qoslet's to touch:
    /// skipped by label, or no class).
    pub class: Option<PodClass>,
    pub annotations: BTreeMap<String, String>,
    /// What the sandbox config asked for the whole pod.
    pub limits: crate::decide::SandboxLimits,
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
}

impl Inventory {
    /// The number of containers in all pods.
    pub fn containers(&self) -> usize {
        self.pods.iter().map(|p| p.containers.len()).sum()
    }

    /// Every CPU an LSE/LSR pod of this inventory is bound to (its
    /// [`decide::pod_binding`] and its running containers' [`decide::binding`]s):
    /// what [`decide::share_pool`] leaves out.
    pub fn bound_cpus(&self, node: &decide::NodeFacts) -> BTreeSet<u32> {
        self.pods
            .iter()
            .filter_map(|p| Some((p.class?, p)))
            .flat_map(|(pc, p)| {
                let containers = p.containers.iter().map(ContainerEntry::requested);
                decide::pod_bindings(pc, &p.annotations, &p.limits, containers, node)
            })
            .flatten()
            .collect()
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
