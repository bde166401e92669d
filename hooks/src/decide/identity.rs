//! CPU QoS identity: group identity (`cpu.bvt_warp_ns`) or `cpu.idle` by
//! class, a pod's `cpuQOS` annotation, the Kubernetes QoS dirs' values.

use super::*;

/// Whether koordlet's group identity rule is on: `cpuPolicy: groupIdentity`
/// and some class's cpuQOS enabled (groupidentity `parseRule`: `enable`).
/// While it is off, qoslet plans no group identity at all (a value it set
/// before is written back to 0 by the executor when it leaves the plan), so it
/// does not fight an operator's own settings.
pub fn group_identity_on(policy: &ResourceQosStrategy) -> bool {
    policy.cpu_policy == CpuPolicy::GroupIdentity
        && [&policy.lsr_class, &policy.ls_class, &policy.be_class]
            .iter()
            .any(|c| c.cpu_qos.enable)
}

/// A pod's group identity (`cpu.bvt_warp_ns`) as koordlet sets it
/// (groupidentity `bvtRule.getPodBvtValue`): its labelled class's
/// `groupIdentity` when that class's cpuQOS is on, else 0; a pod without a
/// class label, and a SYSTEM pod (koordlet has no class entry for either),
/// takes its Kubernetes QoS's value (Guaranteed: LSR's if on, else LS's).
pub fn group_identity(pc: PodClass, policy: &ResourceQosStrategy) -> (i64, String) {
    if policy.cpu_policy != CpuPolicy::GroupIdentity {
        return (0, "cpuPolicy is not groupIdentity".into());
    }
    let of = |c: QosClass| {
        let q = &policy.of(c).cpu_qos;
        q.enable.then_some(q.group_identity)
    };
    let by_kube = pc.class == QosClass::System || !pc.by_label;
    let (v, from) = match (by_kube, pc.class) {
        (true, _) => match pc.kube {
            Some(KubeQos::Guaranteed) => match (of(QosClass::Lsr), of(QosClass::Ls)) {
                (Some(v), _) => (Some(v), QosClass::Lsr),
                (None, v) => (v, QosClass::Ls),
            },
            Some(KubeQos::Burstable) => (of(QosClass::Ls), QosClass::Ls),
            Some(KubeQos::BestEffort) => (of(QosClass::Be), QosClass::Be),
            None => (None, pc.class),
        },
        (false, c) => (of(c), c),
    };
    match v {
        Some(v) => (
            v,
            format!("cpuQOS.groupIdentity of class {}", from.as_str()),
        ),
        None => (0, format!("cpuQOS off for class {}", from.as_str())),
    }
}

/// The group identity a pod labelled LS asks for itself with
/// [`ANNOTATION_CPU_QOS`] over `class_value` (koordlet: `groupIdentity` when
/// given, 0 unless `enable` is true). An untrusted pod may only lower it (the
/// value koordlet allows, LS to BE, is a lowering). `Ok(None)`: not asked, or
/// not an LS-labelled pod.
pub(super) fn pod_cpu_qos(
    pc: PodClass,
    annotations: &BTreeMap<String, String>,
    class_value: i64,
) -> Result<Option<(i64, String)>, Warning> {
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct CpuQos {
        enable: Option<bool>,
        group_identity: Option<i64>,
    }
    if !(pc.by_label && pc.class == QosClass::Ls) {
        return Ok(None);
    }
    let Some(c) = qos_annotation::<CpuQos>(annotations, ANNOTATION_CPU_QOS)? else {
        return Ok(None);
    };
    if let Some(g) = c.group_identity.filter(|g| !(-1..=2).contains(g)) {
        return Err(Warning::GroupIdentityRange { value: g });
    }
    let asked = match (c.enable, c.group_identity) {
        (Some(true), Some(g)) => g,
        (Some(true), None) => class_value,
        _ => 0,
    };
    Ok(Some(if pc.trusted || asked <= class_value {
        (asked, format!("the pod's {ANNOTATION_CPU_QOS}: {asked}"))
    } else {
        (
            class_value,
            format!(
                "the pod's {ANNOTATION_CPU_QOS} asks {asked}, above its class's: an untrusted pod only lowers it"
            ),
        )
    }))
}

/// The group identity of the kube QoS dirs (`kubepods` 0, burstable the LS
/// value, besteffort the BE value), as koordlet's `kubeQOSDirParams`, and
/// whether each is SCHED_IDLE under `cpuPolicy: coreSched` (koordlet's
/// core_sched `IsKubeQOSCPUIdle`: a class with `schedIdle: 1`; the
/// Guaranteed dir follows LSR when LSR's cpuQOS is on, else LS).
pub fn kube_qos_dirs(policy: &ResourceQosStrategy) -> [(KubeQos, i64, bool); 3] {
    let gi = |c: QosClass| {
        let q = &policy.of(c).cpu_qos;
        if policy.cpu_policy == CpuPolicy::GroupIdentity && q.enable {
            q.group_identity
        } else {
            0
        }
    };
    let idle = |c: QosClass| {
        policy.cpu_policy == CpuPolicy::CoreSched && policy.of(c).cpu_qos.sched_idle == 1
    };
    let guaranteed = if policy.lsr_class.cpu_qos.enable {
        QosClass::Lsr
    } else {
        QosClass::Ls
    };
    [
        (KubeQos::Guaranteed, 0, idle(guaranteed)),
        (KubeQos::Burstable, gi(QosClass::Ls), idle(QosClass::Ls)),
        (KubeQos::BestEffort, gi(QosClass::Be), idle(QosClass::Be)),
    ]
}

/// CPU group identity settings for a pod or container: bvt where the kernel
/// has it, while koordlet's rule is on ([`group_identity_on`]; 0 for classes
/// that are off); otherwise, on kernels with `cpu.idle` (qoslet's addition for
/// upstream kernels, where koordlet does nothing), SCHED_IDLE for BE pods
/// whose class has cpuQOS on with a negative group identity. What is no
/// longer planned is written back to 0 by the engine's executor.
///
/// `cpu.idle` goes on the pod's cgroup only: the kernel refuses cpu.shares
/// writes (EINVAL) on an idle cgroup, and the runtime writes the container's
/// shares at every UpdateContainerResources; an idle pod cgroup makes all its
/// containers yield just the same.
pub(super) fn identity(
    pc: PodClass,
    annotations: &BTreeMap<String, String>,
    ctx: &Context,
    pod_level: bool,
    out: &mut Vec<Decision>,
    warnings: &mut Vec<Warning>,
) {
    if ctx.features.bvt {
        if group_identity_on(ctx.policy) {
            let (v, why) = group_identity(pc, ctx.policy);
            let (v, why) = match pod_cpu_qos(pc, annotations, v) {
                Ok(Some((v2, how))) => (v2, format!("{why}; {how}")),
                Ok(None) => (v, why),
                Err(e) => {
                    warnings.push(e);
                    (v, why)
                }
            };
            out.push(cgroup(Knob::GroupIdentity(v), why));
        }
    } else if pc.class == QosClass::Be && ctx.features.cpu_idle && pod_level {
        let q = &ctx.policy.be_class.cpu_qos;
        if ctx.policy.cpu_policy == CpuPolicy::GroupIdentity && q.enable && q.group_identity < 0 {
            out.push(cgroup(
                Knob::CpuIdle(true),
                "BE runs SCHED_IDLE (no bvt on this kernel)",
            ));
        }
    }
}
