//! Per-container decisions: what qoslet changes in a container's resources at
//! CreateContainer (so the runtime applies it at create), and which cgroup
//! settings it writes once the container runs (what CRI cannot carry).
//! Every setting comes with the rule that produced it (for `explain`).

use std::collections::BTreeMap;

use qoslet_cgroups::{Features, Knob};

use crate::batch::{parse_spec, Batch, ANNOTATION_EXTENDED_RESOURCE_SPEC};

/// Koordinator's scheduler writes the CPUs an LSE/LSR pod is bound to here: `{"cpuset":"0-3"}`.
pub const ANNOTATION_RESOURCE_STATUS: &str = "scheduling.koordinator.sh/resource-status";
use crate::class::QosClass;

/// Resource fields qoslet overrides in CRI `LinuxContainerResources`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResourcePatch {
    pub cpu_shares: Option<i64>,
    pub cpu_quota: Option<i64>,
    pub cpu_period: Option<i64>,
    pub memory_limit_in_bytes: Option<i64>,
    pub cpuset_cpus: Option<String>,
}

impl ResourcePatch {
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

/// One decision with its reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// The setting (`cpu.cfs_quota_us`, `cpu.idle`, ...).
    pub setting: String,
    pub value: String,
    /// Why, in words (`BE with batch-cpu limit 2000m`).
    pub because: String,
}

/// What qoslet does to one container.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ContainerDecision {
    /// Applied through CRI at CreateContainer (and re-applied at UpdateContainerResources).
    pub patch: ResourcePatch,
    /// Written to the container's cgroup after StartContainer.
    pub cgroup: Vec<Knob>,
    pub rules: Vec<Rule>,
    /// Input problems, for a logged warning (the container runs as kubelet asked).
    pub warnings: Vec<String>,
}

/// What qoslet does to a pod's own cgroup (the sandbox's cgroup parent).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodDecision {
    pub cgroup: Vec<Knob>,
    pub rules: Vec<Rule>,
}

fn rule(setting: &str, value: impl ToString, because: impl Into<String>) -> Rule {
    Rule {
        setting: setting.into(),
        value: value.to_string(),
        because: because.into(),
    }
}

/// CPU group identity settings for a class: bvt where the kernel has it,
/// otherwise SCHED_IDLE for BE on kernels with `cpu.idle`; LS untouched.
///
/// `cpu.idle` goes on the pod's cgroup only: the kernel refuses cpu.shares
/// writes (EINVAL) on an idle cgroup, and the runtime writes the container's
/// shares at every UpdateContainerResources; an idle pod cgroup makes all its
/// containers yield just the same.
fn identity(
    class: QosClass,
    features: &Features,
    pod_level: bool,
    knobs: &mut Vec<Knob>,
    rules: &mut Vec<Rule>,
) {
    if features.bvt {
        let v = match class {
            QosClass::Lse | QosClass::Lsr | QosClass::Ls => 2,
            QosClass::Be => -1,
            QosClass::System => 0,
        };
        knobs.push(Knob::GroupIdentity(v));
        rules.push(rule(
            "cpu.bvt.warp_ns",
            v,
            format!("group identity of class {}", class.as_str()),
        ));
    } else if class == QosClass::Be && features.cpu_idle && pod_level {
        knobs.push(Knob::CpuIdle(true));
        rules.push(rule(
            "cpu.idle",
            1,
            "BE runs SCHED_IDLE (no bvt on this kernel)",
        ));
    }
}

/// The pod-level decision (applied to the sandbox's cgroup parent after RunPodSandbox).
pub fn pod(class: QosClass, features: &Features) -> PodDecision {
    let mut d = PodDecision::default();
    identity(class, features, true, &mut d.cgroup, &mut d.rules);
    d
}

/// The container-level decision.
pub fn container(
    class: QosClass,
    container_name: &str,
    pod_annotations: &BTreeMap<String, String>,
    features: &Features,
) -> ContainerDecision {
    let mut d = ContainerDecision::default();
    if class == QosClass::Be {
        if let Some(a) = pod_annotations.get(ANNOTATION_EXTENDED_RESOURCE_SPEC) {
            match parse_spec(a) {
                Ok(spec) => {
                    if let Some(b) = spec.get(container_name) {
                        batch(b, &mut d);
                    }
                }
                Err(e) => d.warnings.push(format!("{e}; batch resources ignored")),
            }
        }
    }
    if matches!(class, QosClass::Lse | QosClass::Lsr) {
        if let Some(a) = pod_annotations.get(ANNOTATION_RESOURCE_STATUS) {
            match bound_cpus(a) {
                Ok(Some(cpus)) => {
                    d.rules.push(rule(
                        "cpuset.cpus",
                        &cpus,
                        format!(
                            "{} pod bound to CPUs {cpus} by {ANNOTATION_RESOURCE_STATUS}",
                            class.as_str()
                        ),
                    ));
                    d.patch.cpuset_cpus = Some(cpus);
                }
                Ok(None) => {}
                Err(why) => d.warnings.push(format!(
                    "{ANNOTATION_RESOURCE_STATUS}: {why}; cpuset left as kubelet asked"
                )),
            }
        }
    }
    identity(class, features, false, &mut d.cgroup, &mut d.rules);
    d
}

/// The `cpuset` of a resource-status annotation, validated (`0-3,8`).
fn bound_cpus(annotation: &str) -> Result<Option<String>, String> {
    #[derive(serde::Deserialize)]
    struct Status {
        #[serde(default)]
        cpuset: Option<String>,
    }
    let v: serde_json::Value =
        serde_json::from_str(annotation).map_err(|e| format!("not JSON: {e}"))?;
    if !v.is_object() {
        return Err("not a JSON object".into());
    }
    let s: Status = serde_json::from_value(v).map_err(|e| e.to_string())?;
    let Some(cpus) = s
        .cpuset
        .map(|c| c.trim().to_string())
        .filter(|c| !c.is_empty())
    else {
        return Ok(None);
    };
    let well_formed = cpus
        .bytes()
        .all(|b| b.is_ascii_digit() || b == b',' || b == b'-')
        && qoslet_cgroups::cgroup::cpu_count(&cpus) > 0;
    if !well_formed || cpus.len() > 1024 {
        return Err(format!("malformed cpuset {cpus:?}"));
    }
    Ok(Some(cpus))
}

fn batch(b: &Batch, d: &mut ContainerDecision) {
    let r = b.resources();
    if let Some(s) = r.cpu_shares {
        d.patch.cpu_shares = Some(s as i64);
        d.rules.push(rule(
            "cpu.shares",
            s,
            format!("BE batch-cpu request {}m", b.cpu_request_milli.unwrap_or(0)),
        ));
    }
    if let Some(q) = r.cpu_quota {
        d.patch.cpu_quota = Some(q as i64);
        d.patch.cpu_period = Some(r.cpu_period as i64);
        d.rules.push(rule(
            "cpu.cfs_quota_us",
            q,
            format!(
                "BE batch-cpu limit {}m per {} µs",
                b.cpu_limit_milli.unwrap_or(0),
                r.cpu_period
            ),
        ));
    }
    if let Some(m) = r.memory_limit {
        d.patch.memory_limit_in_bytes = Some(m as i64);
        d.rules
            .push(rule("memory.limit_in_bytes", m, "BE batch-memory limit"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SPEC: &str = r#"{"containers":{"app":{"requests":{"kubernetes.io/batch-cpu":"500"},"limits":{"kubernetes.io/batch-cpu":"1000","kubernetes.io/batch-memory":"256Mi"}}}}"#;

    fn ann(v: &str) -> BTreeMap<String, String> {
        [(ANNOTATION_EXTENDED_RESOURCE_SPEC.to_string(), v.to_string())].into()
    }

    fn upstream() -> Features {
        Features {
            cpu_idle: true,
            cpu_burst: true,
            ..Default::default()
        }
    }

    #[test]
    fn be_with_batch_resources_on_an_upstream_kernel() {
        let d = container(QosClass::Be, "app", &ann(SPEC), &upstream());
        assert_eq!(
            d.patch,
            ResourcePatch {
                cpu_shares: Some(512),
                cpu_quota: Some(100_000),
                cpu_period: Some(100_000),
                memory_limit_in_bytes: Some(256 << 20),
                cpuset_cpus: None,
            }
        );
        assert!(d.cgroup.is_empty(), "cpu.idle is a pod-level setting");
        assert_eq!(
            d.rules
                .iter()
                .map(|r| r.setting.as_str())
                .collect::<Vec<_>>(),
            vec!["cpu.shares", "cpu.cfs_quota_us", "memory.limit_in_bytes",]
        );
        assert!(d.warnings.is_empty());
    }

    #[test]
    fn classes_kernels_and_bad_input() {
        let bvt = Features {
            bvt: true,
            ..Default::default()
        };
        // (class, annotation, kernel, expected patch, expected container cgroup writes, warnings)
        type Case<'a> = (QosClass, &'a str, Features, ResourcePatch, Vec<Knob>, usize);
        let table: &[Case] = &[
            (
                QosClass::Ls,
                SPEC,
                upstream(),
                ResourcePatch::default(),
                vec![],
                0,
            ),
            (
                QosClass::Lsr,
                SPEC,
                bvt.clone(),
                ResourcePatch::default(),
                vec![Knob::GroupIdentity(2)],
                0,
            ),
            (
                QosClass::Be,
                "",
                bvt.clone(),
                ResourcePatch::default(),
                vec![Knob::GroupIdentity(-1)],
                1,
            ),
            (
                QosClass::Be,
                "{not json",
                upstream(),
                ResourcePatch::default(),
                vec![],
                1,
            ),
            (
                QosClass::Be,
                SPEC,
                Features::default(),
                ResourcePatch {
                    cpu_shares: Some(512),
                    cpu_quota: Some(100_000),
                    cpu_period: Some(100_000),
                    memory_limit_in_bytes: Some(256 << 20),
                    cpuset_cpus: None,
                },
                vec![],
                0,
            ),
            (
                QosClass::System,
                SPEC,
                bvt,
                ResourcePatch::default(),
                vec![Knob::GroupIdentity(0)],
                0,
            ),
        ];
        for (class, a, f, patch, knobs, warnings) in table {
            let d = container(*class, "app", &ann(a), f);
            assert_eq!(
                (&d.patch, &d.cgroup, d.warnings.len()),
                (patch, knobs, *warnings),
                "{class:?} {a:?} {f:?}"
            );
        }
        // another container of the pod: no batch entry, class settings only
        let d = container(QosClass::Be, "sidecar", &ann(SPEC), &upstream());
        assert!(d.patch.is_empty());
        assert!(d.cgroup.is_empty());
    }

    #[test]
    fn lsr_cpusets_from_the_scheduler() {
        let a = |v: &str| -> BTreeMap<String, String> {
            [(ANNOTATION_RESOURCE_STATUS.to_string(), v.to_string())].into()
        };
        let d = container(
            QosClass::Lsr,
            "app",
            &a(r#"{"cpuset":"0-3,8"}"#),
            &upstream(),
        );
        assert_eq!(d.patch.cpuset_cpus.as_deref(), Some("0-3,8"));
        assert_eq!(d.rules[0].setting, "cpuset.cpus");
        assert!(
            container(QosClass::Ls, "app", &a(r#"{"cpuset":"1"}"#), &upstream())
                .patch
                .is_empty(),
            "LS shares the pool"
        );
        for bad in [
            r#"{"cpuset":"1;rm -rf /"}"#,
            r#"{"cpuset":"x"}"#,
            "[]",
            "{",
            r#"{"cpuset":"3-1"}"#,
        ] {
            let d = container(QosClass::Lse, "app", &a(bad), &upstream());
            assert!(d.patch.is_empty() && d.warnings.len() == 1, "{bad}: {d:?}");
        }
        assert!(container(
            QosClass::Lsr,
            "app",
            &a(r#"{"numaNodeResources":[]}"#),
            &upstream()
        )
        .warnings
        .is_empty());
    }

    #[test]
    fn pod_level() {
        assert_eq!(
            pod(QosClass::Be, &upstream()).cgroup,
            vec![Knob::CpuIdle(true)]
        );
        assert!(pod(QosClass::Ls, &upstream()).cgroup.is_empty());
    }
}
