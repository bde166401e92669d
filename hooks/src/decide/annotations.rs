//! The pod annotations decisions read (Koordinator's `resource-status`,
//! `cpuQOS`, `memoryQOS`, the batch resource spec), bounded in size: pod
//! authors' input.

use super::*;

/// Koordinator's scheduler writes the CPUs an LSE/LSR pod is bound to here: `{"cpuset":"0-3"}`.
pub const ANNOTATION_RESOURCE_STATUS: &str = "scheduling.koordinator.sh/resource-status";
/// A resource-status annotation longer than this is refused unread (Koordinator's are a few
/// hundred bytes; pod authors can write up to 256 KiB of annotations).
pub const MAX_RESOURCE_STATUS_BYTES: usize = 16 << 10;

/// The pod's batch resources as this pod may use them ([`batch::source`]:
/// the pod spec's, else the annotation): an untrusted pod's only when its
/// Kubernetes QoS is BestEffort (Koordinator's batch pods are: batch
/// resources are extended resources, so they carry no cpu/memory requests).
/// On a Burstable or Guaranteed pod labelled BE they would raise the pod's
/// CPU weight above what kubelet gave it. A pod whose spec asks for no
/// batch resources is still read from its annotation, as koordlet reads a
/// hand-written one where no webhook runs (the trust rule above bounds it).
pub(super) fn batch_input<'a>(
    pc: PodClass,
    annotations: &'a BTreeMap<String, String>,
    spec: SpecBatch<'a>,
    warnings: &mut Vec<Warning>,
) -> Option<(&'a str, Source)> {
    let (a, source) = crate::batch::source(annotations, spec)?;
    if pc.trusted || pc.kube == Some(KubeQos::BestEffort) {
        return Some((a, source));
    }
    warnings.push(Warning::BatchNotBestEffort {
        kube: pc.kube,
        from: source,
    });
    None
}

/// A pod's own CPU QoS (`{"enable": true, "groupIdentity": -1}`), which
/// koordlet's group identity hook takes over the class's for pods labelled LS
/// (groupidentity `SetPodBvtValue`: "only allow LS change to BE").
pub const ANNOTATION_CPU_QOS: &str = "koordinator.sh/cpuQOS";
/// A pod's own memory QoS (`{"policy": "none"}`, or fields over the class's).
pub const ANNOTATION_MEMORY_QOS: &str = "koordinator.sh/memoryQOS";
/// A pod-level JSON annotation longer than this is refused unread.
pub const MAX_QOS_ANNOTATION_BYTES: usize = 4 << 10;

/// Reads a pod's JSON QoS annotation (`None`: absent).
pub(super) fn qos_annotation<T: serde::de::DeserializeOwned>(
    annotations: &BTreeMap<String, String>,
    key: &'static str,
) -> Result<Option<T>, Warning> {
    let Some(a) = annotations.get(key) else {
        return Ok(None);
    };
    let problem = if a.len() > MAX_QOS_ANNOTATION_BYTES {
        AnnotationProblem::TooLarge { bytes: a.len() }
    } else {
        match serde_json::from_str(a) {
            Ok(v) => return Ok(Some(v)),
            Err(e) => AnnotationProblem::Json(e.to_string()),
        }
    };
    Err(Warning::QosAnnotation { key, problem })
}
