//! Memory QoS: memory.min/low/high from requests and the class's percents,
//! a pod's `memoryQOS` annotation, the Anolis memory tunes.

use super::*;

/// A Burstable container's memory request as kubelet's `oom_score_adj` gives
/// it away (`GetContainerOOMScoreAdjust`: 1000 - 1000 x request / node
/// memory, kept within 3..=999): between (1000 - adj) and (1001 - adj)
/// thousandths of the node's memory (999 also stands for any request below a
/// thousandth; 3 for any above 99.7 %), no more than its limit. `None`: not a
/// Burstable value (Guaranteed and critical pods get -997, BestEffort 1000)
/// or the node's memory unknown.
pub fn kubelet_memory_request(
    adj: i64,
    node_memory: u64,
    limit: Option<u64>,
) -> Option<MemRequest> {
    if !(3..=999).contains(&adj) || node_memory == 0 {
        return None;
    }
    let at = |k: i64| (node_memory as u128 * k as u128 / 1000) as u64;
    let (lo, hi) = match adj {
        999 => (0, at(2)),
        3 => (at(997), node_memory),
        a => (at(1000 - a), at(1001 - a)),
    };
    let cap = |v: u64| limit.map_or(v, |l| v.min(l));
    Some(MemRequest {
        lo: cap(lo),
        hi: cap(hi),
    })
}

/// What memory QoS takes as a container's request: a Guaranteed pod's limit
/// (LSE/LSR outside kubepods too), a Burstable one's from kubelet's
/// `oom_score_adj`; `None`: unknown (a BestEffort pod's comes from its batch
/// resources).
pub(super) fn container_memory_request(
    pc: PodClass,
    r: &Requested,
    node_memory: u64,
) -> Option<MemRequest> {
    let limit = (r.memory_limit > 0).then_some(r.memory_limit as u64);
    match pc.kube {
        Some(KubeQos::Guaranteed) => limit.map(MemRequest::exact),
        None if matches!(pc.class, QosClass::Lse | QosClass::Lsr) => limit.map(MemRequest::exact),
        Some(KubeQos::Burstable) => kubelet_memory_request(r.oom_score_adj, node_memory, limit),
        _ => None,
    }
}

/// A pod's memory QoS: its class's, with what its [`ANNOTATION_MEMORY_QOS`]
/// asks over it as koordlet's `mergePodResourceQoSForMemoryQoS` takes it
/// (`policy: none` turns it off for the pod; `auto` starts from Koordinator's
/// defaults for its class; the fields given replace the class's, and turn it
/// on). An untrusted pod may only turn it off or lower what protects it
/// (min/low percent, priority), throttle itself earlier (throttlingPercent,
/// 1 or more), or reclaim earlier (wmarkMinAdj up); anything else it asks is
/// ignored with a warning.
pub fn pod_memory_qos(
    pc: PodClass,
    annotations: &BTreeMap<String, String>,
    policy: &ResourceQosStrategy,
    warnings: &mut Vec<Warning>,
) -> MemoryQos {
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Pod {
        #[serde(default)]
        policy: String,
        min_limit_percent: Option<i64>,
        low_limit_percent: Option<i64>,
        throttling_percent: Option<i64>,
        wmark_ratio: Option<i64>,
        wmark_scale_permill: Option<i64>,
        wmark_min_adj: Option<i64>,
        priority_enable: Option<i64>,
        priority: Option<i64>,
        oom_kill_group: Option<i64>,
    }
    let class = policy.of(pc.class).memory_qos.clone();
    let p = match qos_annotation::<Pod>(annotations, ANNOTATION_MEMORY_QOS) {
        Ok(Some(p)) => p,
        Ok(None) => return class,
        Err(e) => {
            warnings.push(e);
            return class;
        }
    };
    let off = MemoryQos {
        enable: false,
        ..class.clone()
    };
    let base = match p.policy.as_str() {
        "none" if pc.trusted => return off,
        // an untrusted pod's "none" drops what protects it, not what holds it
        // back (memory.high, an earlier reclaim, its OOM priority)
        "none" => {
            return MemoryQos {
                min_limit_percent: 0,
                low_limit_percent: 0,
                ..class
            }
        }
        "" | "default" => class.clone(),
        "auto" if !pc.trusted => {
            warnings.push(Warning::MemoryPolicyAuto);
            class.clone()
        }
        "auto" => MemoryQos {
            enable: class.enable,
            ..ResourceQosStrategy::default()
                .of(pc.class)
                .memory_qos
                .clone()
        },
        other => {
            warnings.push(Warning::MemoryPolicyUnknown {
                value: shown(other),
            });
            return class;
        }
    };
    let mut q = base;
    let mut ignored = Vec::new();
    {
        let mut take = |dst: &mut i64,
                        v: Option<i64>,
                        name: &'static str,
                        lowers: &dyn Fn(i64, i64) -> bool| {
            let Some(v) = v else { return };
            if pc.trusted || (class.enable && lowers(v, *dst)) {
                *dst = v;
            } else {
                ignored.push(name);
            }
        };
        let le = |v: i64, cur: i64| v <= cur;
        take(
            &mut q.min_limit_percent,
            p.min_limit_percent,
            "minLimitPercent",
            &le,
        );
        take(
            &mut q.low_limit_percent,
            p.low_limit_percent,
            "lowLimitPercent",
            &le,
        );
        take(&mut q.priority, p.priority, "priority", &le);
        take(
            &mut q.throttling_percent,
            p.throttling_percent,
            "throttlingPercent",
            &|v, cur| v >= 1 && (cur == 0 || v <= cur),
        );
        take(
            &mut q.wmark_min_adj,
            p.wmark_min_adj,
            "wmarkMinAdj",
            &|v, cur| v >= cur,
        );
        let never = |_: i64, _: i64| false;
        take(&mut q.wmark_ratio, p.wmark_ratio, "wmarkRatio", &never);
        take(
            &mut q.wmark_scale_permill,
            p.wmark_scale_permill,
            "wmarkScalePermill",
            &never,
        );
        take(
            &mut q.priority_enable,
            p.priority_enable,
            "priorityEnable",
            &never,
        );
        take(
            &mut q.oom_kill_group,
            p.oom_kill_group,
            "oomKillGroup",
            &never,
        );
    }
    let asked = [
        p.min_limit_percent,
        p.low_limit_percent,
        p.throttling_percent,
        p.wmark_ratio,
        p.wmark_scale_permill,
        p.wmark_min_adj,
        p.priority_enable,
        p.priority,
        p.oom_kill_group,
    ]
    .iter()
    .any(Option::is_some);
    // the pod's own fields turn memory QoS on for it (koordlet: they replace
    // the class's, whether or not the class has it on); an untrusted pod's only lower
    if pc.trusted && asked {
        q.enable = true;
    }
    if !ignored.is_empty() {
        warnings.push(Warning::MemoryRaise { fields: ignored });
    }
    let pct_ok = [
        q.min_limit_percent,
        q.low_limit_percent,
        q.throttling_percent,
    ]
    .iter()
    .all(|v| (0..=100).contains(v));
    if let Some((t, v, f)) = q
        .tunes()
        .into_iter()
        .find(|(t, v, _)| !t.range().contains(v))
    {
        warnings.push(Warning::MemoryTuneRange {
            field: f,
            tune: t,
            value: v,
        });
        return class;
    }
    if !pct_ok {
        warnings.push(Warning::MemoryPercent);
        return class;
    }
    q
}

/// The Anolis memory files memory QoS sets to the class's values (wmark,
/// priority, OOM group), on pods and containers alike, where the kernel has
/// each; none while the class has memory QoS off (koordlet then writes its
/// `NoneMemoryQOS`: the executor puts each back to that).
pub fn memory_tunes(class: QosClass, q: &MemoryQos, ctx: &Context) -> Vec<Decision> {
    if !q.enable {
        return Vec::new();
    }
    q.tunes()
        .into_iter()
        .filter(|(t, _, _)| ctx.features.memory_tunes.has(*t))
        // oomKillGroup 0 leaves memory.oom.group as it is: kubelet (>= 1.28, v2)
        // sets 1 on containers, and koordlet's 0 would undo it
        .filter(|(t, v, _)| *t != qoslet_cgroups::MemTune::OomGroup || *v == 1)
        .map(|(t, v, f)| {
            cgroup(
                Knob::MemoryTune(t, v),
                format!("{} memoryQOS.{f} {v}", class.as_str()),
            )
        })
        .collect()
}

/// Memory QoS (memory.min/low/high) of a cgroup whose memory request is
/// known, as knobs with their reasons; `None` when the class has it off.
pub(super) fn memory_qos_settings(
    class: QosClass,
    q: &MemoryQos,
    request: MemRequest,
    limit: Option<u64>,
    ctx: &Context,
) -> Option<Vec<(Knob, String)>> {
    if !q.enable {
        return None;
    }
    let (min, low, high) = memory_qos(q, request, limit, ctx.node.memory_bytes, ctx.page_size);
    let req = if request.lo == request.hi {
        format!("request {}", request.lo)
    } else {
        format!(
            "request {}..{} (kubelet's oom_score_adj)",
            request.lo, request.hi
        )
    };
    let why = |f: &str, p: i64| format!("{} memoryQOS.{f} {p}% of {req}", class.as_str());
    let mut out = vec![
        (
            Knob::MemoryMin(min),
            why("minLimitPercent", q.min_limit_percent),
        ),
        (
            Knob::MemoryLow(low),
            why("lowLimitPercent", q.low_limit_percent),
        ),
    ];
    if high.is_some() {
        out.push((
            Knob::MemoryHigh(high),
            format!(
                "{} memoryQOS.throttlingPercent {}% between request and {}",
                class.as_str(),
                q.throttling_percent,
                if limit.is_some() {
                    "limit"
                } else {
                    "node memory (no limit)"
                }
            ),
        ));
    }
    Some(out)
}

/// A container's memory QoS: through CRI's `unified` map on cgroup v2 (the
/// runtime writes it at create), written after start on v1 kernels that have
/// the files, a warning elsewhere.
pub(super) fn memory(
    class: QosClass,
    q: &MemoryQos,
    request: MemRequest,
    limit: Option<u64>,
    ctx: &Context,
    d: &mut ContainerDecision,
) {
    let Some(settings) = memory_qos_settings(class, q, request, limit, ctx) else {
        return;
    };
    let via: fn(Knob, String) -> Decision = if ctx.v2 {
        cri
    } else if ctx.features.memory_qos {
        cgroup
    } else {
        d.warnings.push(Warning::NoMemoryQosV1);
        return;
    };
    d.decisions
        .extend(settings.into_iter().map(|(k, why)| via(k, why)));
}
