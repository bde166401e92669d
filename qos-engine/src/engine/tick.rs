//! One tick's plan: every plugin's writes for the node as it is (reconcile of
//! the hooks' decisions, BE suppression, cpusets, bound pods' quotas), merged.

use super::*;

pub use qoslet_hooks::decide::BoundCpus;

/// The reconcile writes of all pods (with memory protection summed up the
/// tree) and the CPUs bound to LSE/LSR pods.
pub fn reconcile_all(state: &NodeState, ctx: &Context) -> (Plan, BoundCpus) {
    let mut plan = Plan::new();
    // the CPUs online now (the NUMA layout follows hotplug) within the v1
    // ceiling: what pods may run on, bindings included
    // (only where the online CPUs are known at all: without sysfs the NUMA
    // layout is made up from the capacity, and nothing is bound against it)
    let mut node = ctx.node.clone();
    let now = state.all_cpus();
    if !now.is_empty() && !node.online_cpus.is_empty() {
        node.online_cpus = now;
    }
    let mut exclusive = BoundCpus::default();
    for p in &state.pods {
        reconcile::bind(p, &node, &mut exclusive);
    }
    let pool = exclusive.share_pool(&node.online_cpus);
    let ctx = Context {
        node: &node,
        share_pool: Some(qoslet_hooks::decide::SharePool {
            cpus: &pool,
            whole: &node.online_cpus,
            explicit: false,
        }),
        ..*ctx
    };
    for p in &state.pods {
        reconcile::pod(p, &ctx, &mut plan);
    }
    reconcile::kube_qos(&state.qos_dirs, &ctx, &mut plan);
    (plan, exclusive)
}

/// Runs the plugins over `state` and merges their writes. `burst_quota`: the
/// LS quotas the last tick left (by container id; missing: the limit).
pub fn tick(
    state: &NodeState,
    policy: &Policy,
    env: &Env,
    burst_quota: &HashMap<String, u64>,
) -> TickResult {
    tick_with(
        state,
        policy,
        env,
        burst_quota,
        &Default::default(),
        None,
        &BTreeMap::new(),
    )
}

/// What others asked of the pods' ancestors' memory.min/low (by cgroup and knob name).
pub type Protection = BTreeMap<(CgroupPath, KnobKind), u64>;

/// [`tick`] with the reconcile writes and bound CPUs already known.
pub(super) fn tick_with(
    state: &NodeState,
    policy: &Policy,
    env: &Env,
    burst_quota: &HashMap<String, u64>,
    limited: &std::collections::HashSet<String>,
    cached: Option<&(Plan, BoundCpus)>,
    external: &Protection,
) -> TickResult {
    let mut warnings = Vec::new();

    // 1. reconcile (reused when the pods and the policy are the last tick's), then
    // the ancestors' memory protection (which also follows what others wrote there)
    let (mut plan, exclusive) = match cached {
        Some(c) => (c.0.clone(), c.1.clone()),
        None => reconcile_all(state, &env.context(&policy.qos)),
    };
    memory_protection_up_the_tree(state, &mut plan, external);

    // 2. suppress
    let (mut be, mut non_be) = (0.0, 0.0);
    for p in &state.pods {
        match p.class {
            QosClass::Be => be += p.cpu_cores,
            _ => non_be += p.cpu_cores,
        }
    }
    if let Some(all) = state.be_usage_cores {
        be = be.max(all);
    }
    if let Some(all) = state.pods_usage_cores {
        non_be = non_be.max(all - be);
    }
    let t = &policy.threshold;
    let input = suppress::Input {
        capacity_cores: state.capacity_cores,
        non_be_pod_usage_cores: non_be,
        host_app_usage_cores: 0.0,
        system_usage_cores: state.system_usage_cores,
        reserved_cores: state.reserved_cores,
        be_usage_cores: be,
        current_quota_us: state.be_quota_us,
        period_us: state.period_us,
    };
    let mut s = suppress::cfs_quota(&input, t);
    if !state.usage_known {
        s.quota_us = None;
        s.rule = "node and system CPU not measured yet: the BE quota is left as it is".into();
    }
    let be_tree: Vec<&CgroupPath> = state
        .pods
        .iter()
        .filter(|p| p.class == QosClass::Be)
        .flat_map(|p| {
            std::iter::once(&p.cgroup)
                .chain(p.sandbox.as_ref())
                .chain(p.containers.iter().map(|c| &c.entry.cgroup))
        })
        .collect();
    let quota_on = t.enable && t.cpu_suppress_policy == CpuSuppressPolicy::CfsQuota;
    let cpuset_on = t.enable && t.cpu_suppress_policy == CpuSuppressPolicy::Cpuset;
    if quota_on {
        // unchanged (within the dead band) stays in the plan, so the plan always shows the rule
        if let Some(q) = s.quota_us.or(state.be_quota_us) {
            plan.add(w(
                &state.be_parent,
                Knob::CpuQuota {
                    quota: Some(q),
                    period: state.period_us,
                },
                Plugin::CpuSuppress,
                s.rule.clone(),
            ));
        }
        if !env.v2 {
            cap_be_children(state, s.quota_us.or(state.be_quota_us), &mut plan);
        }
    } else if state.be_quota_us.is_some() {
        let why = if t.enable {
            "suppress policy is cpuset"
        } else {
            "resourceUsedThresholdWithBE disabled"
        };
        plan.add(w(
            &state.be_parent,
            Knob::CpuQuota {
                quota: None,
                period: state.period_us,
            },
            Plugin::CpuSuppress,
            format!("{why}: the BE quota is put back to unlimited"),
        ));
    }
    let all = state.all_cpus();
    let pool = state.be_cpus();
    if state.static_cpu_manager && !all.is_empty() {
        // the besteffort parent, the BE pods and their sandboxes keep all CPUs
        // (after a switch from the other mode too), so kubelet's shared pool fits
        let list = if env.v2 {
            String::new()
        } else {
            crate::cpuset::format_cpus(&all)
        };
        let rule = "kubelet's static CPU manager: the BE cpuset is set on BE containers; their parents keep all CPUs";
        let containers: BTreeSet<&CgroupPath> =
            be_containers(state).map(|c| &c.entry.cgroup).collect();
        for cg in std::iter::once(&state.be_parent)
            .chain(be_tree.iter().copied())
            .filter(|cg| !containers.contains(cg))
        {
            plan.add(w(
                cg,
                Knob::CpusetCpus(list.clone()),
                Plugin::CpuSuppress,
                rule.into(),
            ));
        }
    }
    if cpuset_on && !all.is_empty() {
        let c = crate::cpuset::Input {
            // within the ceiling (v1 hotplug) and, under kubelet's static CPU
            // manager, its shared pool (the other CPUs are pods' exclusive ones);
            // kubelet's reserved CPUs are BE's too, as koordlet has them (it
            // leaves out only the node annotation's reservation)
            numa: state
                .numa
                .iter()
                .map(|n| n.iter().copied().filter(|c| pool.contains(c)).collect())
                .collect(),
            places: state.places.clone(),
            lse: exclusive.lse.clone(),
            lsr: exclusive.lsr.clone(),
            allowance_cores: s.allowance_cores,
            current: state.be_cpuset.clone(),
            node_cpus: state.numa.iter().map(Vec::len).sum(),
        };
        let next = if state.usage_known {
            crate::cpuset::be_cpuset(&c)
        } else {
            None
        };
        if let Some(cpus) = next.or_else(|| state.be_cpuset.clone()) {
            let list = crate::cpuset::format_cpus(&cpus);
            let rule = format!(
                "BE allowance {:.2} cores -> {} CPUs (not LSE's {}, LSR's {} in proportion; sibling pairs first)",
                s.allowance_cores,
                cpus.len(),
                exclusive.lse.len(),
                exclusive.lsr.len()
            );
            if state.static_cpu_manager {
                for c in be_containers(state) {
                    plan.add(w(
                        &c.entry.cgroup,
                        Knob::CpusetCpus(list.clone()),
                        Plugin::CpuSuppress,
                        format!("{rule}; kubelet's static CPU manager: BE containers only"),
                    ));
                }
            } else {
                be_cpuset_everywhere(state, &be_tree, &list, &rule, &mut plan);
            }
        }
    } else if state.static_cpu_manager && !all.is_empty() {
        // not suppressing: BE containers keep (or get back) kubelet's own cpuset
        for c in be_containers(state) {
            let (list, rule) = if !c.entry.cpuset_cpus.is_empty() {
                (
                    c.entry.cpuset_cpus.clone(),
                    "BE cpuset not suppressed: kubelet's cpuset (static CPU manager)",
                )
            } else if env.v2 {
                (String::new(), "BE cpuset not suppressed: inherited (empty)")
            } else {
                (
                    crate::cpuset::format_cpus(&all),
                    "BE cpuset not suppressed: all CPUs",
                )
            };
            plan.add(w(
                &c.entry.cgroup,
                Knob::CpusetCpus(list),
                Plugin::CpuSuppress,
                rule.into(),
            ));
        }
    } else if state.be_cpuset.as_ref().is_some_and(|c| *c != all) && !all.is_empty() {
        // v2: the empty value the runtime left (inherit the parent's), not a list
        // that would stay fixed through CPU hotplug; v1 has no inheriting value
        let (list, rule) = if env.v2 {
            (
                String::new(),
                "BE cpuset not suppressed: inherited again (empty)",
            )
        } else {
            (
                crate::cpuset::format_cpus(&all),
                "BE cpuset not suppressed: all CPUs again",
            )
        };
        be_cpuset_everywhere(state, &be_tree, &list, rule, &mut plan);
    }

    // 3. burst
    let (pool, burst_quota) = burst_plugin(
        state,
        policy,
        env,
        &BurstInputs {
            last: burst_quota,
            limited,
            bound: &exclusive.pods,
        },
        &mut plan,
        &mut warnings,
    );

    TickResult {
        plan,
        allowance_cores: s.allowance_cores,
        level: if quota_on || cpuset_on {
            s.level
        } else {
            Level::None
        },
        non_be_usage_cores: non_be,
        be_usage_cores: be,
        pool,
        burst_quota,
        warnings,
    }
}

pub(super) fn be_containers(state: &NodeState) -> impl Iterator<Item = &Container> {
    state
        .pods
        .iter()
        .filter(|p| p.class == QosClass::Be)
        .flat_map(|p| &p.containers)
}

/// The BE cpuset on the besteffort parent and every BE pod and container
/// (on v1 a child's CPUs must lie within its parent's; the executor orders them).
pub(super) fn be_cpuset_everywhere(
    state: &NodeState,
    be_tree: &[&CgroupPath],
    list: &str,
    rule: &str,
    plan: &mut Plan,
) {
    for cg in std::iter::once(&state.be_parent).chain(be_tree.iter().copied()) {
        plan.add(w(
            cg,
            Knob::CpusetCpus(list.to_string()),
            Plugin::CpuSuppress,
            rule.to_string(),
        ));
    }
}

/// The quota a bound pod's own cgroup had before qoslet unset it, as kubelet
/// sets it: the sum of its containers' limits when every one has a limit
/// (init containers and overhead aside), else none (`None`: `w` is not such a write).
pub(super) fn bound_pod_quota(state: &NodeState, w: &Write) -> Option<Knob> {
    let Knob::CpuQuota {
        quota: None,
        period,
    } = w.knob
    else {
        return None;
    };
    let p = state.pods.iter().find(|p| p.cgroup == w.cgroup)?;
    if !matches!(p.class, QosClass::Lse | QosClass::Lsr) || p.containers.is_empty() {
        return None;
    }
    let mut sum = 0u128;
    for c in &p.containers {
        if c.entry.cpu_quota <= 0 {
            return None;
        }
        sum += c.entry.cpu_quota as u128 * period as u128 / c.entry.cpu_period.max(1000) as u128;
    }
    Some(Knob::CpuQuota {
        quota: Some(u64::try_from(sum).unwrap_or(u64::MAX)),
        period,
    })
}

/// cgroup v1 refuses a parent CFS quota below any child's (as a share of
/// the period): BE pods and containers with their own quota are capped at
/// the besteffort parent's, and given their own back when it grows again
/// (the strictest-wins merge keeps the lower of the two).
pub(super) fn cap_be_children(state: &NodeState, parent_quota: Option<u64>, plan: &mut Plan) {
    let Some(pq) = parent_quota else { return };
    let ratio = pq as f64 / state.period_us.max(1) as f64;
    let mut caps = Vec::new();
    for p in state.pods.iter().filter(|p| p.class == QosClass::Be) {
        let mut own: Vec<(&CgroupPath, Option<(u64, u64)>)> = Vec::new();
        own.push((&p.cgroup, None));
        for c in &p.containers {
            let kubelet = (c.entry.cpu_quota > 0).then(|| {
                (
                    c.entry.cpu_quota as u64,
                    c.entry.cpu_period.max(1000) as u64,
                )
            });
            own.push((&c.entry.cgroup, kubelet));
        }
        for (cg, kubelet) in own {
            let planned = match plan
                .get(&((*cg).clone(), KnobKind::CpuQuota, None))
                .map(|w| &w.knob)
            {
                Some(Knob::CpuQuota {
                    quota: Some(q),
                    period,
                }) => Some((*q, *period)),
                _ => None,
            };
            let Some((q, period)) = planned.or(kubelet) else {
                continue;
            };
            // at the child's own period, unless the floor would then lift it above the
            // parent's ratio (a short period: 2000 us of 10000 is 20 % where the parent
            // allows 2 %, and v1 refuses it): then at the parent's period and quota
            let own = (ratio * period as f64) as u64;
            let (cap, cap_period) = if own >= suppress::MIN_QUOTA_US {
                (own, period)
            } else if period >= state.period_us {
                (suppress::MIN_QUOTA_US, period)
            } else {
                (pq, state.period_us)
            };
            if (q as u128) * (cap_period as u128) > (cap as u128) * (period as u128) {
                caps.push(w(cg, Knob::CpuQuota { quota: Some(cap), period: cap_period }, Plugin::CpuSuppress, format!("cgroup v1: a BE cgroup's quota may not exceed the besteffort parent's ({pq} us of {} us); capped from {q} us of {period} us", state.period_us)));
            } else if planned.is_none() {
                caps.push(w(
                    cg,
                    Knob::CpuQuota {
                        quota: Some(q),
                        period,
                    },
                    Plugin::CpuSuppress,
                    "the kubelet quota, within the besteffort parent's".into(),
                ));
            }
        }
    }
    for c in caps {
        plan.add(c);
    }
}
