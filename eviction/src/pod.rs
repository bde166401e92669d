//! What the eviction models know of a pod: its identity, priority, class,
//! requests and the stats read for it. Transport-neutral: the agent fills it
//! from the store (CRI or NRI), the metrics tick and, in a cluster, the API.

use qoslet_hooks::class::{KubeQos, QosClass};

/// kubelet's `SystemCriticalPriority`: pods at or above it are never evicted.
pub const SYSTEM_CRITICAL_PRIORITY: i32 = 2_000_000_000;

/// One pod, as both models rank it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Pod {
    pub uid: String,
    pub namespace: String,
    pub name: String,
    /// `spec.priority` when known (`None` without a cluster: CRI does not carry it).
    pub priority: Option<i32>,
    /// Critical whatever its priority: a static or mirror pod (kubelet's
    /// `IsCriticalPod` besides priority), or one the node shows is critical
    /// (kubelet gives a node-critical pod's containers `oom_score_adj` -997).
    pub critical: bool,
    pub kube_qos: Option<KubeQos>,
    /// The Koordinator class qoslet gave it (a trusted label, or the Kubernetes QoS).
    pub class: Option<QosClass>,
    /// Whether the class came from a `koordinator.sh/qosClass: BE` label (the
    /// only pods Koordinator's BE model takes).
    pub be_labelled: bool,
    /// Which BE features may evict it (`koordinator.sh/eviction-policy`,
    /// honoured only where the pod's annotations are trusted).
    pub eviction_policy: crate::koord::EvictionPolicy,
    /// Tolerates `node.kubernetes.io/memory-pressure:NoSchedule` (admission).
    pub tolerates_memory_pressure: bool,
    /// `terminationGracePeriodSeconds` when known.
    pub grace_seconds: Option<i64>,
    pub requests: Requests,
    /// `None`: no stats were read for the pod (kubelet ranks it first).
    pub stats: Option<PodStats>,
}

/// A pod's requests (kubelet's `GetResourceRequestQuantity`: containers
/// summed, init containers' max, overhead added).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Requests {
    pub memory: i64,
    pub ephemeral_storage: i64,
    /// `kubernetes.io/batch-cpu`, in milli-cores (Koordinator's BE CPU model).
    pub batch_cpu_milli: i64,
}

/// Bytes and inodes a filesystem holds for a pod.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FsUse {
    pub bytes: i64,
    pub inodes: i64,
}

/// Stats read for a pod.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PodStats {
    /// Memory working set (usage − inactive file), kubelet's memory figure.
    pub working_set: Option<i64>,
    /// Anonymous + unevictable memory, Koordinator's BE memory figure.
    pub memory_used: Option<i64>,
    /// CPU used, milli-cores.
    pub cpu_milli: Option<i64>,
    pub processes: Option<u64>,
    pub rootfs: FsUse,
    pub logs: FsUse,
    pub local_volumes: FsUse,
    /// Per container, for the eviction message.
    pub containers: Vec<ContainerStats>,
}

/// A container's figures for the eviction message.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ContainerStats {
    pub name: String,
    pub working_set: Option<i64>,
    pub memory_request: i64,
    /// Writable layer + logs, bytes (kubelet's container ephemeral-storage use).
    pub disk_used: Option<i64>,
    pub ephemeral_request: i64,
}

impl Pod {
    /// kubelet's `PodPriority`: 0 when unset.
    pub fn priority_or_zero(&self) -> i32 {
        self.priority.unwrap_or(0)
    }

    /// kubelet's `IsCriticalPod`: static, mirror or system-critical priority.
    pub fn is_critical(&self) -> bool {
        self.critical || self.priority_or_zero() >= SYSTEM_CRITICAL_PRIORITY
    }

    /// `namespace/name`, for messages.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}
