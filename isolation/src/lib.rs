//! The isolation room: the pure policy (`qoslet-hooks`: typed decisions) and
//! the cgroup writer (`qoslet-cgroups`) applied at each lifecycle event of a
//! pod and its containers, with the engine's resctrl assigner. It follows the
//! published policy (`qoslet_qos_engine::source`). Its API is
//! transport-neutral ([`events`]): store records and [`Resources`] in, the
//! decision, its patch, its annotations and the direct cgroup writes out. The
//! CRI proxy's hook is a thin adapter over it (`qoslet_proxy::isolation`); the
//! NRI plugin is the next.
//!
//! * [`events`]: pod started; container create (patch + annotations), created
//!   (recorded), update (patch), started (cgroup writes, resctrl).
//! * [`node`]: the node's facts read once at start.
//! * `place`: the LS share pool a container is placed on.
//! * `write`: knobs written to a cgroup, the outcome recorded.
//! * `warned`: each warning about a pod logged once while it lives.
//!
//! Bad input (unknown class label, malformed annotation, hostile cgroup parent,
//! a missing kernel feature) is a logged warning and the pod runs as kubelet
//! asked.

use std::sync::Arc;

use qoslet_cgroups::resctrl::Resctrl;
use qoslet_cgroups::{Cgroups, Features, PodRoot};
use qoslet_hooks::decide::{self, NodeFacts};
use qoslet_hooks::policy::ResourceQosStrategy;
use qoslet_hooks::Trust;
use qoslet_state::inventory::InventorySource;

mod error;
pub mod events;
pub mod node;
mod place;
mod warned;
mod write;

pub use error::IsolationError;
pub use events::Created;
pub use node::node_facts;
pub use qoslet_hooks::decide::ResourcePatch;
pub use qoslet_state::store::{
    Resources, ANNOTATION_APPLIED, ANNOTATION_CLASS, ANNOTATION_REQUESTED,
};

pub struct Isolation {
    cgroups: Option<Arc<Cgroups>>,
    resctrl: Option<Arc<Resctrl>>,
    shared: PolicyHandle,
    /// Group identity's kernel switch (None: not managed here).
    sysctl: Option<Arc<qoslet_cgroups::sysctl::Sysctl>>,
    /// The agent's inventory, set once the store runs ([`Isolation::inventory_slot`]):
    /// the LS share pool is computed from it (unset: containers keep kubelet's cpusets).
    inventory: InventorySlot,
    /// The CPUs LSE/LSR pods are bound to, at the inventory generation they
    /// were computed at.
    bound: Arc<std::sync::Mutex<Option<BoundAt>>>,
    /// Where the online CPUs are read when a container is placed (`/sys`;
    /// `None`: the node facts' as read at start).
    sys_root: Option<std::path::PathBuf>,
    /// The warnings logged, per pod (each once while the pod lives).
    warned: Arc<warned::Warned>,
}

/// Bound CPUs, and the inventory generation and online CPUs they were computed at.
pub(crate) type BoundAt = (
    u64,
    std::collections::BTreeSet<u32>,
    Arc<qoslet_hooks::decide::BoundCpus>,
);

/// Where the composition hands the hook the agent's one inventory.
pub type InventorySlot = Arc<std::sync::OnceLock<Arc<dyn InventorySource>>>;

/// The policy the hooks read, swapped whole when the config file is reloaded
/// (each call reads one consistent policy).
#[derive(Clone)]
pub struct PolicyHandle(Arc<std::sync::RwLock<Arc<Shared>>>);

impl PolicyHandle {
    fn get(&self) -> Arc<Shared> {
        self.0.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Follows a policy source: each policy it publishes is in force for the
    /// next calls (the devices come resolved; nothing here touches a file).
    pub fn follow(&self, mut rx: qoslet_qos_engine::source::PolicyRx) {
        let me = self.clone();
        tokio::spawn(async move {
            while rx.changed().await.is_ok() {
                let p = rx.borrow_and_update().clone();
                me.set_resolved(p.policy.resource_qos_strategy.clone(), p.devices.clone());
            }
        });
    }

    fn set_resolved(
        &self,
        policy: ResourceQosStrategy,
        devices: std::collections::BTreeMap<String, qoslet_cgroups::Device>,
    ) {
        let cur = self.get();
        let next = Arc::new(Shared {
            features: cur.features.clone(),
            v2: cur.v2,
            page_size: cur.page_size,
            node: cur.node.clone(),
            trust: cur.trust.clone(),
            pod_root: cur.pod_root.clone(),
            devices,
            policy,
        });
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = next;
    }
}

/// What every decision reads.
struct Shared {
    features: Features,
    v2: bool,
    page_size: u64,
    /// Online and reserved CPUs, capacity.
    node: NodeFacts,
    /// Whose labels and scheduler annotations are taken as they are.
    trust: Trust,
    /// Where kubelet puts pods.
    pod_root: PodRoot,
    policy: ResourceQosStrategy,
    /// The policy's block devices resolved on this host.
    devices: std::collections::BTreeMap<String, qoslet_cgroups::Device>,
}

impl Shared {
    /// The decisions' context; `pool`: the LS share pool, where known.
    fn ctx<'a>(&'a self, pool: Option<decide::SharePool<'a>>) -> decide::Context<'a> {
        decide::Context {
            features: &self.features,
            v2: self.v2,
            policy: &self.policy,
            page_size: self.page_size,
            node: &self.node,
            devices: &self.devices,
            share_pool: pool,
        }
    }
}

impl Isolation {
    /// `cgroups`: the host's cgroups, or `None` when none were found (then
    /// only CRI-carried settings are applied).
    pub fn new(
        cgroups: Option<Cgroups>,
        resctrl: Option<Resctrl>,
        policy: ResourceQosStrategy,
        node: NodeFacts,
        trust: Trust,
        pod_root: PodRoot,
    ) -> Self {
        let features = cgroups
            .as_ref()
            .map(|c| c.host().features.clone())
            .unwrap_or_default();
        let v2 = cgroups.as_ref().is_some_and(|c| c.host().is_v2());
        Self {
            cgroups: cgroups.map(Arc::new),
            resctrl: resctrl.map(Arc::new),
            sysctl: None,
            inventory: Default::default(),
            bound: Default::default(),
            sys_root: None,
            warned: Arc::default(),
            shared: PolicyHandle(Arc::new(std::sync::RwLock::new(Arc::new(Shared {
                features,
                v2,
                page_size: qoslet_cgroups::cgroup::page_size(),
                node,
                trust,
                pod_root,
                devices: qoslet_qos_engine::source::resolve_devices(&policy),
                policy,
            })))),
        }
    }

    /// Manages group identity's kernel switch under this procfs root: turned on
    /// when a pod gets group identity (so it applies without the QoS engine too).
    pub fn with_sysctl(mut self, proc_root: &std::path::Path) -> Self {
        self.sysctl = Some(Arc::new(qoslet_cgroups::sysctl::Sysctl::new(proc_root)));
        self
    }

    /// The handle that swaps the policy the hooks read.
    pub fn policy_handle(&self) -> PolicyHandle {
        self.shared.clone()
    }

    /// Where the composition sets the agent's inventory once the store runs.
    pub fn inventory_slot(&self) -> InventorySlot {
        self.inventory.clone()
    }

    /// Reads the online CPUs under this sysfs root when placing a container
    /// (CPU hotplug; without it, those read at start).
    pub fn with_sys_root(mut self, sys_root: &std::path::Path) -> Self {
        self.sys_root = Some(sys_root.into());
        self
    }

    fn placer(&self) -> place::Placer {
        place::Placer {
            inventory: self.inventory.clone(),
            bound: self.bound.clone(),
            sys_root: self.sys_root.clone(),
        }
    }
}
