//! Where a container goes on the LS share pool: the CPUs online now (on
//! cgroup v1 within its pod's cpuset) without those LSE/LSR pods are bound to,
//! from the agent's inventory.

use std::sync::Arc;

use qoslet_cgroups::{CgroupPath, Cgroups};
use qoslet_hooks::decide::{self, NodeFacts};

use crate::{BoundAt, InventorySlot};

/// What places a container on the LS share pool, taken into a hook's future
/// (which runs off the thread that serves kubelet: it reads sysfs and cgroupfs).
pub(crate) struct Placer {
    pub(crate) inventory: InventorySlot,
    pub(crate) bound: Arc<std::sync::Mutex<Option<BoundAt>>>,
    pub(crate) sys_root: Option<std::path::PathBuf>,
}

/// The share pool where a container is placed now.
pub(crate) struct Placement {
    pool: std::collections::BTreeSet<u32>,
    whole: std::collections::BTreeSet<u32>,
}

impl Placement {
    pub(crate) fn share(&self, explicit: bool) -> decide::SharePool<'_> {
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
    pub(crate) fn place(
        &self,
        node: &NodeFacts,
        cgroups: Option<&Cgroups>,
        pod_cg: Option<&CgroupPath>,
    ) -> Option<Placement> {
        let inv = self.inventory.get()?.current();
        let online = self
            .sys_root
            .as_ref()
            .and_then(|s| qoslet_cgroups::topology::online_cpus(s))
            .unwrap_or_else(|| node.online_cpus.clone());
        // the pods' bindings (BoundCpus, the one computation the engine's tick
        // uses too) against the CPUs online now (the engine: online within the
        // v1 ceiling), again when the store or the online CPUs change
        let bound = {
            let mut c = self.bound.lock().unwrap_or_else(|e| e.into_inner());
            match c
                .as_ref()
                .filter(|(g, on, _)| *g == inv.generation && *on == online)
            {
                Some((_, _, b)) => b.clone(),
                None => {
                    let now = NodeFacts {
                        online_cpus: online.clone(),
                        ..node.clone()
                    };
                    let b = Arc::new(inv.bound(&now));
                    *c = Some((inv.generation, online.clone(), b.clone()));
                    b
                }
            }
        };
        let mut whole = online;
        if let (Some(cg), Some(p)) = (cgroups, pod_cg) {
            if !cg.host().is_v2() {
                if let Some(within) = cg.read_cpuset(p) {
                    whole.retain(|c| within.contains(c));
                }
            }
        }
        let pool = bound.share_pool(&whole);
        Some(Placement { pool, whole })
    }
}
