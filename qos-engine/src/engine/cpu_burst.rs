//! The CPU burst plugin (`cpuBurstStrategy`): CFS burst and scaled quotas.

use super::*;

/// Whether a pod gets CPU burst: koordlet's `IsPodCPUBurstable`, every pod
/// but those labelled LSR, LSE or BE (an unlabelled Guaranteed pod and SYSTEM
/// pods are in); only containers with a CPU limit are touched.
pub(super) fn burstable(p: &Pod) -> bool {
    !(p.by_label && matches!(p.class, QosClass::Lsr | QosClass::Lse | QosClass::Be))
}

/// What CPU burst reads besides the node: the quotas the last tick left, the
/// containers whose burst period is spent, the pods bound to CPUs.
pub(super) struct BurstInputs<'a> {
    pub(super) last: &'a HashMap<String, u64>,
    pub(super) limited: &'a std::collections::HashSet<String>,
    pub(super) bound: &'a std::collections::HashSet<String>,
}

pub(super) fn burst_plugin(
    state: &NodeState,
    policy: &Policy,
    env: &Env,
    inputs: &BurstInputs,
    plan: &mut Plan,
    warnings: &mut Vec<crate::error::Warning>,
) -> (Option<Pool>, HashMap<String, u64>) {
    let BurstInputs {
        last,
        limited,
        bound,
    } = *inputs;
    let b = &policy.burst;
    let mut quotas = HashMap::new();
    let burst_on = matches!(b.policy, BurstPolicy::CpuBurstOnly | BurstPolicy::Auto);
    let scale_on = matches!(b.policy, BurstPolicy::CfsQuotaBurstOnly | BurstPolicy::Auto);
    if burst_on && !env.features.cpu_burst {
        warnings.push(crate::error::Warning::NoCfsBurst);
    }
    let (pool_capacity, pool_usage) = burst_pool(state);
    let pool_state = burst::pool(pool_usage, pool_capacity, b);
    // a pod bound to CPUs runs without CFS quota (koordlet's cpuset hook): no
    // quota to scale, and a scaled one would undo the hook's -1
    for p in state
        .pods
        .iter()
        .filter(|p| burstable(p) && !bound.contains(&p.id))
    {
        // the pod's own cpuBurst annotation over the node's config
        let (pod_b, warning) = policy.burst.for_pod(&p.annotations, p.trusted);
        if let Some(wn) = warning {
            warnings.push(crate::error::Warning::PodBurst {
                pod: p.id.clone(),
                detail: wn,
            });
        }
        let b = &pod_b;
        let burst_on = matches!(b.policy, BurstPolicy::CpuBurstOnly | BurstPolicy::Auto);
        let scale_on = matches!(b.policy, BurstPolicy::CfsQuotaBurstOnly | BurstPolicy::Auto);
        let mut pod_sum = 0u64;
        let mut pod_period = 0u64;
        let mut all_limited = !p.containers.is_empty();
        let mut pod_scaled = false;
        // the pod's burst: the sum of its containers' (koordlet's applyCPUBurst)
        let mut pod_burst = 0u64;
        let mut pod_cur = 0u64;
        for c in &p.containers {
            if c.entry.cpu_quota <= 0 {
                all_limited = false;
                continue;
            }
            let limit = c.entry.cpu_quota as u64;
            let period = c.entry.cpu_period.max(1000) as u64;
            // never below kubelet's limit (an in-place resize up raises the floor)
            let cur = last.get(&c.entry.id).copied().unwrap_or(limit).max(limit);
            let d = burst::decide(
                &burst::Container {
                    limit_quota_us: limit,
                    period_us: period,
                    current_quota_us: cur,
                    throttled_ratio: c.throttled_ratio,
                    limited: limited.contains(&c.entry.id),
                },
                pool_state,
                b,
            );
            let target = if scale_on {
                d.quota_us.unwrap_or(cur)
            } else {
                limit
            };
            // the kernel checks every quota write against the burst in force: at most
            // the quota before and after this tick, and at most kubelet's limit, so the
            // runtime re-writing the limit (a cpuset-only update) never meets EINVAL
            if let (Some(bu), true) = (d.burst_us, env.features.cpu_burst) {
                let bu = bu.min(target).min(cur).min(limit);
                plan.add(w(
                    &c.entry.cgroup,
                    Knob::CpuBurst(bu),
                    Plugin::CpuBurst,
                    d.rule.clone(),
                ));
                pod_burst = pod_burst.saturating_add(bu);
            } else if !burst_on && env.features.cpu_burst {
                // as koordlet: burst off writes 0 (a burst left by an earlier run or
                // policy, which the executor does not remember, is reset too)
                plan.add(w(
                    &c.entry.cgroup,
                    Knob::CpuBurst(0),
                    Plugin::CpuBurst,
                    "cpuBurst off: no burst".into(),
                ));
            }
            pod_cur = pod_cur.saturating_add(cur);
            if scale_on || cur != limit {
                let rule = if scale_on {
                    d.rule.clone()
                } else {
                    "cfsQuotaBurst off: quota back to the limit".to_string()
                };
                plan.add(w(
                    &c.entry.cgroup,
                    Knob::CpuQuota {
                        quota: Some(target),
                        period,
                    },
                    Plugin::CpuBurst,
                    rule,
                ));
            }
            if target != limit {
                pod_scaled = true;
                quotas.insert(c.entry.id.clone(), target);
            }
            if pod_period == 0 {
                pod_period = period;
            }
            pod_sum += (target as f64 * pod_period as f64 / period as f64) as u64;
        }
        // the pod's own quota (kubelet: the sum of its containers' limits) follows
        if all_limited
            && (scale_on
                || pod_scaled
                || p.containers.iter().any(|c| last.contains_key(&c.entry.id)))
        {
            plan.add(w(
                &p.cgroup,
                Knob::CpuQuota {
                    quota: Some(pod_sum),
                    period: pod_period,
                },
                Plugin::CpuBurst,
                "the pod's quota: the sum of its containers' quotas".into(),
            ));
        }
        if !burst_on && env.features.cpu_burst && p.containers.iter().any(|c| c.entry.cpu_quota > 0)
        {
            plan.add(w(
                &p.cgroup,
                Knob::CpuBurst(0),
                Plugin::CpuBurst,
                "cpuBurst off: no burst".into(),
            ));
        }
        if burst_on && env.features.cpu_burst && pod_burst > 0 {
            // within the pod's quota before and after this tick (the kernel's rule),
            // unless some container (so the pod) has no limit
            let cap = if all_limited {
                pod_cur.min(pod_sum.max(1))
            } else {
                u64::MAX
            };
            plan.add(w(
                &p.cgroup,
                Knob::CpuBurst(pod_burst.min(cap)),
                Plugin::CpuBurst,
                "the pod's burst: the sum of its containers' bursts".into(),
            ));
        }
    }
    ((burst_on || scale_on).then_some(pool_state), quotas)
}
