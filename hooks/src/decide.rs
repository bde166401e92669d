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
use crate::policy::{memory_qos, ResourceQosStrategy};

/// What decisions depend on besides the pod: the host and the policy.
#[derive(Debug, Clone, Copy)]
pub struct Context<'a> {
    pub features: &'a Features,
    /// cgroup v2 (memory QoS travels in CRI `unified`) or v1 (written after start).
    pub v2: bool,
    pub policy: &'a ResourceQosStrategy,
    pub page_size: u64,
}

/// Resource fields qoslet overrides in CRI `LinuxContainerResources`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResourcePatch {
    pub cpu_shares: Option<i64>,
    pub cpu_quota: Option<i64>,
    pub cpu_period: Option<i64>,
    pub memory_limit_in_bytes: Option<i64>,
    pub cpuset_cpus: Option<String>,
    /// cgroup v2 keys the runtime writes (`memory.min`, `memory.low`, `memory.high`).
    pub unified: BTreeMap<String, String>,
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
    ctx: &Context,
    pod_level: bool,
    knobs: &mut Vec<Knob>,
    rules: &mut Vec<Rule>,
) {
    let cpu = &ctx.policy.of(class).cpu_qos;
    if !cpu.enable {
        return;
    }
    if ctx.features.bvt {
        knobs.push(Knob::GroupIdentity(cpu.group_identity));
        rules.push(rule(
            "cpu.bvt.warp_ns",
            cpu.group_identity,
            format!("cpuQOS.groupIdentity of class {}", class.as_str()),
        ));
    } else if class == QosClass::Be && ctx.features.cpu_idle && pod_level && cpu.group_identity < 0
    {
        knobs.push(Knob::CpuIdle(true));
        rules.push(rule(
            "cpu.idle",
            1,
            "BE runs SCHED_IDLE (no bvt on this kernel)",
        ));
    }
}

/// The pod-level decision (applied to the sandbox's cgroup parent after RunPodSandbox).
pub fn pod(class: QosClass, ctx: &Context) -> PodDecision {
    let mut d = PodDecision::default();
    identity(class, ctx, true, &mut d.cgroup, &mut d.rules);
    d
}

/// The container-level decision.
/// `kubelet_memory_limit`: the memory limit kubelet asked for (0 = none).
pub fn container(
    class: QosClass,
    container_name: &str,
    pod_annotations: &BTreeMap<String, String>,
    kubelet_memory_limit: i64,
    ctx: &Context,
) -> ContainerDecision {
    let mut d = ContainerDecision::default();
    if class == QosClass::Be {
        if let Some(a) = pod_annotations.get(ANNOTATION_EXTENDED_RESOURCE_SPEC) {
            match parse_spec(a) {
                Ok(spec) => {
                    if let Some(b) = spec.get(container_name) {
                        batch(b, &mut d);
                        if let Some(req) = b.memory_request {
                            memory(class, req, b.memory_limit, ctx, &mut d);
                        }
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
    // Guaranteed pods (LSR/LSE) request what they limit; other classes' memory requests are
    // not in CRI (they need the pod spec)
    if matches!(class, QosClass::Lse | QosClass::Lsr) && kubelet_memory_limit > 0 {
        memory(
            class,
            kubelet_memory_limit as u64,
            Some(kubelet_memory_limit as u64),
            ctx,
            &mut d,
        );
    }
    identity(class, ctx, false, &mut d.cgroup, &mut d.rules);
    d
}

/// Memory QoS (memory.min/low/high) for a container whose request is known.
fn memory(
    class: QosClass,
    request: u64,
    limit: Option<u64>,
    ctx: &Context,
    d: &mut ContainerDecision,
) {
    let q = &ctx.policy.of(class).memory_qos;
    if !q.enable {
        return;
    }
    let (min, low, high) = memory_qos(q, request, limit, ctx.page_size);
    let why =
        |f: &str, p: i64| format!("{} memoryQOS.{f} {p}% of request {request}", class.as_str());
    let mut set = vec![
        (
            "memory.min",
            min.to_string(),
            why("minLimitPercent", q.min_limit_percent),
        ),
        (
            "memory.low",
            low.to_string(),
            why("lowLimitPercent", q.low_limit_percent),
        ),
    ];
    if let Some(h) = high {
        set.push((
            "memory.high",
            h.to_string(),
            format!(
                "{} memoryQOS.throttlingPercent {}% between request and limit",
                class.as_str(),
                q.throttling_percent
            ),
        ));
    }
    if ctx.v2 {
        for (k, v, because) in set {
            d.patch.unified.insert(k.into(), v.clone());
            d.rules.push(rule(k, v, because));
        }
    } else if ctx.features.memory_qos {
        d.cgroup.push(Knob::MemoryMin(min));
        d.cgroup.push(Knob::MemoryLow(low));
        if high.is_some() {
            d.cgroup.push(Knob::MemoryHigh(high));
        }
        for (k, v, because) in set {
            d.rules.push(rule(k, v, because));
        }
    } else {
        d.warnings.push(
            "memoryQOS is enabled but this kernel has no memory.min/low/high on cgroup v1; skipped"
                .into(),
        );
    }
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
    use crate::policy::{MemoryQos, ResourceQosStrategy};

    fn run(
        class: QosClass,
        name: &str,
        ann: &BTreeMap<String, String>,
        f: &Features,
    ) -> ContainerDecision {
        let p = ResourceQosStrategy::default();
        container(
            class,
            name,
            ann,
            0,
            &Context {
                features: f,
                v2: false,
                policy: &p,
                page_size: 4096,
            },
        )
    }

    fn run_pod(class: QosClass, f: &Features) -> PodDecision {
        let p = ResourceQosStrategy::default();
        pod(
            class,
            &Context {
                features: f,
                v2: false,
                policy: &p,
                page_size: 4096,
            },
        )
    }

    #[test]
    fn memory_qos_per_host_and_policy() {
        let mut p = ResourceQosStrategy::default();
        let on = MemoryQos {
            enable: true,
            min_limit_percent: 100,
            low_limit_percent: 100,
            throttling_percent: 80,
            ..Default::default()
        };
        p.be_class.memory_qos = on.clone();
        p.lsr_class.memory_qos = on;
        let spec = r#"{"containers":{"app":{"requests":{"kubernetes.io/batch-memory":"64Mi"},"limits":{"kubernetes.io/batch-memory":"128Mi"}}}}"#;
        let a: BTreeMap<String, String> = [(
            ANNOTATION_EXTENDED_RESOURCE_SPEC.to_string(),
            spec.to_string(),
        )]
        .into();
        let upstream = Features {
            cpu_idle: true,
            ..Default::default()
        };
        // cgroup v2: through CRI's unified map
        let d = container(
            QosClass::Be,
            "app",
            &a,
            0,
            &Context {
                features: &upstream,
                v2: true,
                policy: &p,
                page_size: 4096,
            },
        );
        assert_eq!(
            d.patch.unified.get("memory.min").map(String::as_str),
            Some("67108864")
        );
        assert_eq!(
            d.patch.unified.get("memory.high").map(String::as_str),
            Some(
                (((64u64 << 20) + (64u64 << 20) * 80 / 100) / 4096 * 4096)
                    .to_string()
                    .as_str()
            )
        );
        // cgroup v1 without the files: a warning, nothing written
        let d = container(
            QosClass::Be,
            "app",
            &a,
            0,
            &Context {
                features: &upstream,
                v2: false,
                policy: &p,
                page_size: 4096,
            },
        );
        assert!(d.patch.unified.is_empty() && d.warnings.len() == 1);
        // cgroup v1 with them (Alibaba kernels): written after start
        let ali = Features {
            memory_qos: true,
            ..Default::default()
        };
        let d = container(
            QosClass::Be,
            "app",
            &a,
            0,
            &Context {
                features: &ali,
                v2: false,
                policy: &p,
                page_size: 4096,
            },
        );
        assert!(d.cgroup.contains(&Knob::MemoryMin(64 << 20)));
        // LSR: the request is the limit kubelet asked for
        let d = container(
            QosClass::Lsr,
            "app",
            &BTreeMap::new(),
            1 << 30,
            &Context {
                features: &upstream,
                v2: true,
                policy: &p,
                page_size: 4096,
            },
        );
        assert_eq!(
            d.patch.unified.get("memory.low").map(String::as_str),
            Some("1073741824")
        );
        // off by default
        let d = container(
            QosClass::Lsr,
            "app",
            &BTreeMap::new(),
            1 << 30,
            &Context {
                features: &upstream,
                v2: true,
                policy: &ResourceQosStrategy::default(),
                page_size: 4096,
            },
        );
        assert!(d.patch.unified.is_empty());
    }

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
        let d = run(QosClass::Be, "app", &ann(SPEC), &upstream());
        assert_eq!(
            d.patch,
            ResourcePatch {
                cpu_shares: Some(512),
                cpu_quota: Some(100_000),
                cpu_period: Some(100_000),
                memory_limit_in_bytes: Some(256 << 20),
                cpuset_cpus: None,
                unified: BTreeMap::new(),
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
                    unified: BTreeMap::new(),
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
            let d = run(*class, "app", &ann(a), f);
            assert_eq!(
                (&d.patch, &d.cgroup, d.warnings.len()),
                (patch, knobs, *warnings),
                "{class:?} {a:?} {f:?}"
            );
        }
        // another container of the pod: no batch entry, class settings only
        let d = run(QosClass::Be, "sidecar", &ann(SPEC), &upstream());
        assert!(d.patch.is_empty());
        assert!(d.cgroup.is_empty());
    }

    #[test]
    fn lsr_cpusets_from_the_scheduler() {
        let a = |v: &str| -> BTreeMap<String, String> {
            [(ANNOTATION_RESOURCE_STATUS.to_string(), v.to_string())].into()
        };
        let d = run(
            QosClass::Lsr,
            "app",
            &a(r#"{"cpuset":"0-3,8"}"#),
            &upstream(),
        );
        assert_eq!(d.patch.cpuset_cpus.as_deref(), Some("0-3,8"));
        assert_eq!(d.rules[0].setting, "cpuset.cpus");
        assert!(
            run(QosClass::Ls, "app", &a(r#"{"cpuset":"1"}"#), &upstream())
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
            let d = run(QosClass::Lse, "app", &a(bad), &upstream());
            assert!(d.patch.is_empty() && d.warnings.len() == 1, "{bad}: {d:?}");
        }
        assert!(run(
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
            run_pod(QosClass::Be, &upstream()).cgroup,
            vec![Knob::CpuIdle(true)]
        );
        assert!(run_pod(QosClass::Ls, &upstream()).cgroup.is_empty());
    }
}
