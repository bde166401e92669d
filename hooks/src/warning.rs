//! What was wrong with a pod's input (its labels and annotations), or what the
//! host lacks, and what qoslet did instead: one typed value per problem. Each
//! has a stable [`Warning::kind`] for logs and for deduplication (a pod's
//! warning is logged once while the pod lives, however often it is decided
//! again), and its wording in `Display`.
//!
//! Values that come from a pod author are bounded before they are kept here.

use std::collections::BTreeSet;

use qoslet_cgroups::MemTune;

use crate::batch::BatchError;
use crate::class::{KubeQos, QosClass, LABEL_QOS_CLASS, LABEL_SKIP};
use crate::decide::{
    ANNOTATION_CPU_QOS, ANNOTATION_MEMORY_QOS, ANNOTATION_RESOURCE_STATUS,
    MAX_QOS_ANNOTATION_BYTES, MAX_RESOURCE_STATUS_BYTES,
};

/// At most this many characters of a pod author's value are kept (and shown).
pub const MAX_SHOWN: usize = 64;

/// The first [`MAX_SHOWN`] characters of `s`.
pub fn shown(s: &str) -> String {
    s.chars().take(MAX_SHOWN).collect()
}

const NO_MEMORY_QOS: &str = "memoryQOS is enabled but this kernel has no memory.min/low/high";

/// One problem with a pod's input or the host, and what was done instead.
#[derive(Debug, Clone, PartialEq, Eq, Hash, thiserror::Error)]
pub enum Warning {
    // -- the class labels
    #[error(
        "{LABEL_SKIP}=true ignored: namespace {namespace:?} is not trusted to opt out of isolation"
    )]
    SkipNotTrusted { namespace: String },
    #[error(
        "{LABEL_QOS_CLASS}={} would raise the class of a {kube:?} pod above {}; refused (namespace {namespace:?} is not trusted)",
        asked.as_str(),
        kube.class().as_str()
    )]
    ClassAboveKubeQos {
        asked: QosClass,
        kube: KubeQos,
        namespace: String,
    },
    #[error(
        "{LABEL_QOS_CLASS}={} on a pod outside kubepods refused (namespace {namespace:?} is not trusted)",
        asked.as_str()
    )]
    ClassOutsideKubepods { asked: QosClass, namespace: String },
    /// `value`: bounded ([`shown`]).
    #[error("unknown {LABEL_QOS_CLASS} {value:?}; using the Kubernetes QoS")]
    UnknownClass { value: String },

    // -- batch resources
    #[error(
        "batch resources of the {from} ignored: the pod is {}, not BestEffort, and not trusted",
        kube_name(*kube)
    )]
    BatchNotBestEffort {
        kube: Option<KubeQos>,
        /// Where they were read.
        from: crate::batch::Source,
    },
    #[error("{0}; batch resources ignored")]
    BatchSpec(BatchError),
    #[error("{0}; that value ignored")]
    BatchValue(BatchError),
    #[error("{}{field} {value} above the bound {bound}; capped", pod_prefix(*pod))]
    BatchCapped {
        /// At the pod's own cgroup (the sum of its containers').
        pod: bool,
        field: BatchField,
        value: u64,
        bound: u64,
    },

    // -- cpuQOS / memoryQOS annotations
    #[error("{key}: {problem}; ignored")]
    QosAnnotation {
        key: &'static str,
        problem: AnnotationProblem,
    },
    #[error("{ANNOTATION_CPU_QOS}: groupIdentity {value} is not -1..=2; ignored")]
    GroupIdentityRange { value: i64 },
    #[error("{ANNOTATION_MEMORY_QOS}: policy auto ignored (Koordinator's defaults may not hold a pod back as its class does; an untrusted pod only lowers it)")]
    MemoryPolicyAuto,
    /// `value`: bounded ([`shown`]).
    #[error("{ANNOTATION_MEMORY_QOS}: policy {value:?} is not none, default or auto; ignored")]
    MemoryPolicyUnknown { value: String },
    #[error(
        "{ANNOTATION_MEMORY_QOS}: {} would raise the pod's memory QoS above its class's (an untrusted pod only lowers it); ignored",
        fields.join(", ")
    )]
    MemoryRaise { fields: Vec<&'static str> },
    #[error(
        "{ANNOTATION_MEMORY_QOS}: {field} {value} is outside {:?} ({}); ignored",
        tune.range(),
        tune.file()
    )]
    MemoryTuneRange {
        field: &'static str,
        tune: MemTune,
        value: i64,
    },
    #[error("{ANNOTATION_MEMORY_QOS}: a percentage is outside 0-100; ignored")]
    MemoryPercent,

    // -- what the host lacks
    #[error("{NO_MEMORY_QOS}; pod level skipped")]
    NoMemoryQosPod,
    #[error("{NO_MEMORY_QOS} on cgroup v1; skipped")]
    NoMemoryQosV1,
    #[error("blkioQOS is enabled but this host has no blkio throttling / io controller; skipped")]
    NoBlkio,
    /// `name`: the policy's (an operator's), not a pod's.
    #[error("blkioQOS device {name:?} is not a block device on this host; skipped")]
    NotABlockDevice { name: String },

    // -- CPU binding and the share pool
    #[error("{ANNOTATION_RESOURCE_STATUS}: {0}; cpuset left as kubelet asked")]
    Binding(BindingRefused),
    /// `asked`: bounded ([`shown`]).
    #[error(
        "{ANNOTATION_RESOURCE_STATUS}: cpuset {asked} narrowed to {got} (online, unreserved{})",
        within_kubelet(kubelet)
    )]
    BindingNarrowed {
        asked: String,
        got: String,
        kubelet: Option<String>,
    },
    #[error("{}{reason}", pod_prefix(*pod))]
    QuotaKept { pod: bool, reason: QuotaKept },
    #[error("the share pool of NUMA nodes {nodes:?} is empty; the whole share pool instead")]
    NumaPoolEmpty { nodes: BTreeSet<u32> },
    #[error("{ANNOTATION_RESOURCE_STATUS}: NUMA nodes {nodes:?} are not this host's; the whole share pool instead")]
    NumaNodesUnknown { nodes: BTreeSet<u32> },
    #[error("the share pool{} is empty; cpuset left as kubelet asked", kubelet.as_deref().map(|k| format!(" within kubelet's cpuset {k}")).unwrap_or_default())]
    SharePoolEmpty { kubelet: Option<String> },
}

impl Warning {
    /// A stable name of what went wrong (a log field; not the subject).
    pub fn kind(&self) -> &'static str {
        match self {
            Warning::SkipNotTrusted { .. } => "skip-not-trusted",
            Warning::ClassAboveKubeQos { .. } => "class-above-kube-qos",
            Warning::ClassOutsideKubepods { .. } => "class-outside-kubepods",
            Warning::UnknownClass { .. } => "unknown-class",
            Warning::BatchNotBestEffort { .. } => "batch-not-besteffort",
            Warning::BatchSpec(_) => "batch-spec",
            Warning::BatchValue(_) => "batch-value",
            Warning::BatchCapped { .. } => "batch-capped",
            Warning::QosAnnotation { .. } => "qos-annotation",
            Warning::GroupIdentityRange { .. } => "group-identity-range",
            Warning::MemoryPolicyAuto => "memory-policy-auto",
            Warning::MemoryPolicyUnknown { .. } => "memory-policy-unknown",
            Warning::MemoryRaise { .. } => "memory-raise",
            Warning::MemoryTuneRange { .. } => "memory-tune-range",
            Warning::MemoryPercent => "memory-percent",
            Warning::NoMemoryQosPod | Warning::NoMemoryQosV1 => "no-memory-qos",
            Warning::NoBlkio => "no-blkio",
            Warning::NotABlockDevice { .. } => "not-a-block-device",
            Warning::Binding(_) => "binding-refused",
            Warning::BindingNarrowed { .. } => "binding-narrowed",
            Warning::QuotaKept { .. } => "quota-kept",
            Warning::NumaPoolEmpty { .. } => "numa-pool-empty",
            Warning::NumaNodesUnknown { .. } => "numa-nodes-unknown",
            Warning::SharePoolEmpty { .. } => "share-pool-empty",
        }
    }

    /// A problem of the host, not of the pod's input (the same for every pod).
    pub fn is_host(&self) -> bool {
        matches!(
            self,
            Warning::NoMemoryQosPod
                | Warning::NoMemoryQosV1
                | Warning::NoBlkio
                | Warning::NotABlockDevice { .. }
        )
    }
}

/// A batch resource field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BatchField {
    CpuLimit,
    CpuRequest,
    MemoryLimit,
    MemoryRequest,
}

impl std::fmt::Display for BatchField {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            BatchField::CpuLimit => "batch-cpu limit (milli)",
            BatchField::CpuRequest => "batch-cpu request (milli)",
            BatchField::MemoryLimit => "batch-memory limit",
            BatchField::MemoryRequest => "batch-memory request",
        })
    }
}

/// Why a JSON QoS annotation was not read.
#[derive(Debug, Clone, PartialEq, Eq, Hash, thiserror::Error)]
pub enum AnnotationProblem {
    #[error("{bytes} bytes, over the {MAX_QOS_ANNOTATION_BYTES}-byte cap")]
    TooLarge { bytes: usize },
    /// serde_json's message (its position, no more than a token of the input).
    #[error("{0}")]
    Json(String),
}

/// Why a resource-status binding was not used.
#[derive(Debug, Clone, PartialEq, Eq, Hash, thiserror::Error)]
pub enum BindingRefused {
    #[error("{bytes} bytes, over the {MAX_RESOURCE_STATUS_BYTES}-byte cap; not read")]
    TooLarge { bytes: usize },
    #[error("not JSON: {0}")]
    NotJson(String),
    #[error("not a JSON object")]
    NotObject,
    #[error("{0}")]
    Shape(String),
    #[error(
        "the pod's class {} is inferred from its Kubernetes QoS, not set by label, and the pod is not trusted",
        class.as_str()
    )]
    NotByLabel { class: QosClass },
    /// `cpus`: bounded ([`shown`]).
    #[error("malformed cpuset {cpus:?}")]
    Malformed { cpus: String },
    #[error("this node's online CPUs are unknown")]
    OnlineUnknown,
    #[error("kubelet's cpuset {0:?} is malformed")]
    KubeletMalformed(String),
    /// `cpus`: bounded ([`shown`]).
    #[error(
        "none of the CPUs {cpus} is online and unreserved{}",
        within_kubelet(kubelet)
    )]
    NoneOnline {
        cpus: String,
        kubelet: Option<String>,
    },
    #[error("the container has no CPU limit to size a binding by")]
    NoLimit,
    #[error("{cpus} CPUs asked, more than the container's CPU limit ({milli}m) allows")]
    OverLimit { cpus: usize, milli: u64 },
}

/// Why a bound pod keeps its CFS quota.
#[derive(Debug, Clone, PartialEq, Eq, Hash, thiserror::Error)]
pub enum QuotaKept {
    #[error("no CPU limit to compare the binding with")]
    NoLimit,
    #[error("{cpus} CPUs bound are more than the CPU limit {milli}m; CFS quota kept")]
    OverLimit { cpus: usize, milli: u64 },
}

fn pod_prefix(pod: bool) -> &'static str {
    if pod {
        "pod: "
    } else {
        ""
    }
}

fn within_kubelet(kubelet: &Option<String>) -> String {
    kubelet
        .as_deref()
        .map(|k| format!(" and kubelet's cpuset {k}"))
        .unwrap_or_default()
}

fn kube_name(kube: Option<KubeQos>) -> &'static str {
    match kube {
        Some(KubeQos::Guaranteed) => "Guaranteed",
        Some(KubeQos::Burstable) => "Burstable",
        Some(KubeQos::BestEffort) => "BestEffort",
        None => "of unknown Kubernetes QoS",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wording_keeps_what_the_logs_said() {
        let table: &[(Warning, &str)] = &[
            (
                Warning::UnknownClass { value: "GOLD".into() },
                "unknown koordinator.sh/qosClass \"GOLD\"; using the Kubernetes QoS",
            ),
            (
                Warning::BatchCapped {
                    pod: true,
                    field: BatchField::CpuLimit,
                    value: 9000,
                    bound: 2000,
                },
                "pod: batch-cpu limit (milli) 9000 above the bound 2000; capped",
            ),
            (
                Warning::Binding(BindingRefused::NoneOnline {
                    cpus: "60-63".into(),
                    kubelet: Some("0-3".into()),
                }),
                "scheduling.koordinator.sh/resource-status: none of the CPUs 60-63 is online and unreserved and kubelet's cpuset 0-3; cpuset left as kubelet asked",
            ),
            (
                Warning::SharePoolEmpty { kubelet: None },
                "the share pool is empty; cpuset left as kubelet asked",
            ),
            (
                Warning::QuotaKept {
                    pod: false,
                    reason: QuotaKept::OverLimit { cpus: 4, milli: 2000 },
                },
                "4 CPUs bound are more than the CPU limit 2000m; CFS quota kept",
            ),
            (
                Warning::MemoryTuneRange {
                    field: "wmarkRatio",
                    tune: MemTune::WmarkRatio,
                    value: 101,
                },
                "koordinator.sh/memoryQOS: wmarkRatio 101 is outside 0..=100 (memory.wmark_ratio); ignored",
            ),
        ];
        for (w, text) in table {
            assert_eq!(w.to_string(), *text, "{w:?}");
        }
    }

    #[test]
    fn shown_bounds_by_characters() {
        let long = "é".repeat(1000);
        assert_eq!(shown(&long).chars().count(), MAX_SHOWN);
        assert_eq!(shown("0-3"), "0-3");
    }
}
