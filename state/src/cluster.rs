//! What the cluster says of a pod that CRI cannot (`spec.priority`, its
//! priority class, Kubernetes QoS, requests and limits, tolerations, grace
//! period), joined to the runtime's records by pod UID. Transport-neutral:
//! the cluster side (`qoslet-kube`) fills it from the API server's Pods; the
//! store keeps it apart from the records (it is not checkpointed: a restart
//! lists the pods again).

/// CPU (millicores) and memory (bytes) of a pod, as the scheduler counts
/// them: the sum over its containers, at least any one init container's,
/// plus the pod's overhead.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PodAmounts {
    pub cpu_milli: i64,
    pub memory: i64,
}

/// One pod of this node as the API server has it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterPod {
    pub uid: String,
    pub namespace: String,
    pub name: String,
    /// `spec.priority`.
    pub priority: Option<i32>,
    /// `spec.priorityClassName`.
    pub priority_class: Option<String>,
    /// `status.qosClass`: `Guaranteed`, `Burstable` or `BestEffort`.
    pub qos_class: Option<String>,
    pub requests: PodAmounts,
    /// 0: no limit on some container (the pod is unbounded).
    pub limits: PodAmounts,
    /// `spec.terminationGracePeriodSeconds`.
    pub grace_seconds: Option<i64>,
    /// Whether it tolerates the `node.kubernetes.io/memory-pressure`
    /// NoSchedule taint (kubelet admits such a BestEffort pod under memory pressure).
    pub tolerates_memory_pressure: bool,
    /// Deletion requested (`metadata.deletionTimestamp`).
    pub deleting: bool,
    /// `status.phase` (`Pending`, `Running`, ...).
    pub phase: Option<String>,
    /// Its `koordinator.sh/priority-class` label (at most 64 characters).
    pub priority_label: Option<String>,
    /// Its `koordinator.sh/qosClass` label (at most 64 characters).
    pub qos_label: Option<String>,
    /// Its containers' `kubernetes.io/batch-cpu`/`batch-memory` requests and
    /// limits in the `extended-resource-spec` annotation's JSON shape (what
    /// Koordinator's webhook would write; `None`: the spec names neither).
    pub batch: Option<String>,
}
