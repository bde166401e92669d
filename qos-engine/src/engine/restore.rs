//! Putting back what the engine changed (`qoslet restore`, `restoreOnExit`).

use super::*;

/// What [`restore_plan`] needs from the files (the caller reads them).
#[derive(Debug, Clone, Default)]
pub struct Found {
    /// CFS quota (`None`: unlimited) and period of the pods and containers.
    pub quotas: HashMap<CgroupPath, (Option<u64>, u64)>,
    /// Every cgroup under the besteffort parent (its pods, their containers and
    /// sandboxes, in the store or not).
    pub be_subtree: Vec<CgroupPath>,
}

/// What `qoslet restore` (and `qosEngine.restoreOnExit`) writes: every file
/// qoslet may have changed, back to the runtime's value or the kernel's
/// default, so that nothing qoslet did outlives it (new BE pods would inherit
/// a suppressed besteffort parent):
///
/// * the besteffort parent: no quota, all CPUs (v2: the inherited empty cpuset);
/// * every pod and container: group identity 0, SCHED_IDLE off, burst 0 (where
///   the kernel has them); CPU quota as kubelet set it (a scaled or capped
///   quota back to the limit; a pod's to the sum of its containers'), except
///   where the hooks' own CRI settings gave one (containerd holds those);
/// * BE pods and containers: the cpuset back to all CPUs (or kubelet's own);
/// * the kube QoS dirs: group identity and SCHED_IDLE off;
/// * memory.min/low/high and I/O limits qoslet's policy sets: the kernel's defaults.
pub fn restore_plan(state: &NodeState, policy: &Policy, env: &Env, found: &Found) -> Plan {
    const WHY: &str = "qoslet restore: the runtime's value / the kernel's default";
    let mut plan = Plan::new();
    let (mut reconciled, _) = reconcile_all(state, &env.context(&policy.qos));
    // the QoS dirs' memory.min/low on v2 are kubelet's too (MemoryQoS): left as
    // they are rather than zeroed under it; v1 has no other writer there
    if !env.v2 {
        memory_protection_up_the_tree(state, &mut reconciled, &Protection::new());
    }
    for r in reconciled.writes() {
        // a share-pool cpuset goes back to kubelet's; a bound pod's unset quota
        // to its containers' sum; what the runtime's spec holds stays
        let knob = reconciled
            .restore_of(&crate::plan::key(r))
            .cloned()
            .or_else(|| crate::execute::restore_value_on(&r.knob, env.v2))
            .or_else(|| bound_pod_quota(state, r))
            .unwrap_or_else(|| r.knob.clone());
        plan.add(w(&r.cgroup, knob, Plugin::Restore, WHY.into()));
    }
    let f = &env.features;
    let defaults = |plan: &mut Plan, cg: &CgroupPath| {
        let mut add = |k: Knob| {
            let wr = w(cg, k, Plugin::Restore, WHY.into());
            if !plan.contains(&crate::plan::key(&wr)) {
                plan.add(wr);
            }
        };
        if f.bvt {
            add(Knob::GroupIdentity(0));
        }
        if f.cpu_idle {
            add(Knob::CpuIdle(false));
        }
        if f.cpu_burst {
            add(Knob::CpuBurst(0));
        }
    };
    for (_, cg) in &state.qos_dirs {
        defaults(&mut plan, cg);
    }
    let all = state.all_cpus();
    let all_cpus = if env.v2 {
        Some(String::new())
    } else {
        (!all.is_empty()).then(|| crate::cpuset::format_cpus(&all))
    };
    if !state.be_parent.as_str().is_empty() {
        plan.add(w(
            &state.be_parent,
            Knob::CpuQuota {
                quota: None,
                period: state.period_us,
            },
            Plugin::Restore,
            WHY.into(),
        ));
        if let Some(c) = &all_cpus {
            plan.add(w(
                &state.be_parent,
                Knob::CpusetCpus(c.clone()),
                Plugin::Restore,
                WHY.into(),
            ));
        }
    }
    let planned =
        |plan: &Plan, cg: &CgroupPath, kind: KnobKind| plan.contains(&(cg.clone(), kind, None));
    let known: BTreeSet<&CgroupPath> = state
        .pods
        .iter()
        .flat_map(|p| p.containers.iter().map(|c| &c.entry.cgroup))
        .collect();
    for p in &state.pods {
        defaults(&mut plan, &p.cgroup);
        // quotas only where the file shows qoslet's change: a container above
        // kubelet's limit (burst scaling) or below it (a BE cap) goes back to the
        // limit; its pod loses exactly what scaling added (kubelet's own pod quota
        // counts init containers and overhead the store does not know)
        let pod_file = found.quotas.get(&p.cgroup).copied();
        let mut delta: i128 = 0;
        for c in &p.containers {
            defaults(&mut plan, &c.entry.cgroup);
            let period = c.entry.cpu_period.max(1000) as u64;
            if c.entry.cpu_quota > 0 && !planned(&plan, &c.entry.cgroup, KnobKind::CpuQuota) {
                let limit = c.entry.cpu_quota as u64;
                if let Some((Some(q), fp)) = found.quotas.get(&c.entry.cgroup).copied() {
                    // compared at the container's own period
                    let q = (q as u128 * period as u128 / fp.max(1) as u128) as u64;
                    if q != limit {
                        plan.add(w(
                            &c.entry.cgroup,
                            Knob::CpuQuota {
                                quota: Some(limit),
                                period,
                            },
                            Plugin::Restore,
                            WHY.into(),
                        ));
                        // only burst scaling moved the pod with its containers (a BE
                        // cap left the pod alone)
                        if let (Some((_, pp)), true) = (pod_file, q > limit) {
                            delta += (q as i128 - limit as i128) * pp as i128 / period as i128;
                        }
                    }
                }
            }
            if p.class == QosClass::Be && !planned(&plan, &c.entry.cgroup, KnobKind::CpusetCpus) {
                let own = (!c.entry.cpuset_cpus.is_empty()).then(|| c.entry.cpuset_cpus.clone());
                if let Some(cpus) = own.or_else(|| all_cpus.clone()) {
                    plan.add(w(
                        &c.entry.cgroup,
                        Knob::CpusetCpus(cpus),
                        Plugin::Restore,
                        WHY.into(),
                    ));
                }
            }
        }
        if let (Some((Some(pq), pp)), true) = (pod_file, delta != 0) {
            if !planned(&plan, &p.cgroup, KnobKind::CpuQuota) {
                let back = (pq as i128 - delta).max(suppress::MIN_QUOTA_US as i128) as u64;
                plan.add(w(
                    &p.cgroup,
                    Knob::CpuQuota {
                        quota: Some(back),
                        period: pp,
                    },
                    Plugin::Restore,
                    WHY.into(),
                ));
            }
        }
        if p.class == QosClass::Be && !planned(&plan, &p.cgroup, KnobKind::CpusetCpus) {
            if let Some(c) = &all_cpus {
                for cg in std::iter::once(&p.cgroup).chain(p.sandbox.as_ref()) {
                    plan.add(w(
                        cg,
                        Knob::CpusetCpus(c.clone()),
                        Plugin::Restore,
                        WHY.into(),
                    ));
                }
            }
        }
    }
    // the besteffort subtree as the kernel lists it: pods created after qoslet
    // stopped (v1 copies the parent's cpuset into a new cgroup) and sandboxes;
    // with kubelet's static CPU manager, containers qoslet does not know keep
    // kubelet's cpuset
    if let Some(c) = &all_cpus {
        for cg in &found.be_subtree {
            let container_level = cg.parent().is_some_and(|p| p != state.be_parent);
            if planned(&plan, cg, KnobKind::CpusetCpus)
                || known.contains(cg)
                || (state.static_cpu_manager && container_level)
            {
                continue;
            }
            plan.add(w(
                cg,
                Knob::CpusetCpus(c.clone()),
                Plugin::Restore,
                WHY.into(),
            ));
        }
    }
    plan
}
