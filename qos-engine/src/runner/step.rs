//! One tick of the loop as a synchronous function: [`Step::step`] takes the
//! fresh metrics tick, the inventory, the policy in force and the host, and
//! observes, plans, applies (or previews) and logs; it never awaits, so it is
//! tested without a runtime. [`Step`] is what the loop remembers between
//! ticks (the engine's memory, the besteffort parent and QoS dirs found, the
//! topology, the store's pods as of their generation, what is being logged).

use super::observe::{find_be_parent, find_qos_dirs, Look, Skeleton, Topology};
use super::*;
use crate::error::{EngineError, Once};

/// Ticks a node or system CPU figure the collector could not measure is
/// replaced by the last measured one.
const STALE_TICKS: u32 = 5;

/// A figure and the ticks since it was measured.
type Aged = (f64, u32);

/// The loop's memory between ticks.
pub(super) struct Step {
    engine: Engine,
    topology: Topology,
    be_parent: Option<CgroupPath>,
    qos_dirs: Vec<(qoslet_hooks::KubeQos, CgroupPath)>,
    /// Errors and warnings being reported (each logged once while it lasts).
    once: Once,
    /// The last node and system CPU figures the collector gave, and their age in ticks.
    last_node: Option<Aged>,
    last_system: Option<Aged>,
    level: crate::suppress::Level,
    seq: u64,
    skeleton: Option<Skeleton>,
    /// Containers whose burst-scaled quota was seeded from their file.
    seeded: HashSet<String>,
    cpu_manager: Option<CpuManagerState>,
}

/// What one tick works on.
pub(super) struct Input<'a> {
    pub settings: &'a Settings,
    pub cgroups: &'a Cgroups,
    pub rdt: Option<&'a Resctrl>,
    pub tick: &'a Tick,
    pub inventory: &'a Inventory,
    pub policy: &'a Policy,
    pub env: &'a Env,
}

/// A figure the collector could not measure this tick (a counter reset) is
/// the last measured one for a few ticks; before any, or older, it is
/// unknown and suppress leaves the BE quota as it is: never read as 0 (BE
/// would get the system's share) nor as the whole node (BE would be crushed
/// after every restart).
fn fresh(v: Option<f64>, last: &mut Option<Aged>) -> Option<f64> {
    match v {
        Some(v) => {
            *last = Some((v, 0));
            Some(v)
        }
        None => {
            let (v, age) = last.as_mut()?;
            *age += 1;
            (*age <= STALE_TICKS).then_some(*v)
        }
    }
}

impl Step {
    pub(super) fn new(verify_every: u64) -> Self {
        Self {
            engine: Engine::new(verify_every),
            topology: Topology::default(),
            be_parent: None,
            qos_dirs: Vec::new(),
            once: Once::default(),
            last_node: None,
            last_system: None,
            level: crate::suppress::Level::None,
            seq: 0,
            skeleton: None,
            seeded: HashSet::new(),
            cpu_manager: None,
        }
    }

    /// One tick: the node observed, planned, applied (dry run: previewed),
    /// what changed logged; the tick as the admin API shows it.
    pub(super) fn step(&mut self, i: &Input) -> Last {
        let t0 = Instant::now();
        let (state, pol) = self.observe(i);
        let cg = i.cgroups;
        let result = self.engine.plan(&state, &pol, i.env);
        let (states, report, moved) = if i.settings.dry_run {
            let states = Executor::preview(&result.plan, cg)
                .into_iter()
                .map(|p| p.state())
                .collect();
            (states, None, 0)
        } else {
            let mut r = self.engine.execute(&result.plan, cg);
            let mut moved = 0;
            if let Some(rdt) = i.rdt {
                let groups = crate::resctrl::desired(&state.pods, &pol.qos, rdt);
                if !groups.is_empty() {
                    let sr = crate::resctrl::sync(&groups, rdt, cg);
                    moved = sr.moved;
                    for e in sr.errors {
                        if self.once.first(e.key()) {
                            warn!(error = %e, "resctrl reconcile (logged once while it lasts)");
                        }
                    }
                }
            }
            (std::mem::take(&mut r.states), Some(r), moved)
        };
        if result.level != self.level {
            info!(
                from = self.level.as_str(),
                to = result.level.as_str(),
                allowance_cores = format!("{:.2}", result.allowance_cores),
                "BE CPU suppress level changed"
            );
            self.level = result.level;
        }
        for w in &result.warnings {
            if self.once.first(w.key()) {
                warn!("{w}");
            }
        }
        let r = report.unwrap_or_default();
        for d in &r.drift {
            warn!(drift = %d, "cgroup drift put back");
        }
        for e in &r.errors {
            if self.once.first(e.key()) {
                warn!(error = %e, "QoS engine write failed (retried every tick; logged once while it fails)");
            }
        }
        self.once.end_tick();
        self.seq += 1;
        let took = t0.elapsed();
        debug!(writes = result.plan.len(), written = r.written, took = ?took, "QoS engine tick");
        let policy = match (pol.threshold.enable, pol.threshold.cpu_suppress_policy) {
            (false, _) => "disabled",
            (true, CpuSuppressPolicy::CfsQuota) => "cfsQuota",
            (true, CpuSuppressPolicy::Cpuset) => "cpuset",
        };
        Last {
            seq: self.seq,
            ts: i.tick.ts,
            state,
            result,
            states,
            counts: (r.written as u32, r.unchanged as u32, r.skipped as u32),
            gone: r.gone as u32,
            drift: r.drift,
            errors: r.errors,
            took,
            policy,
            resctrl_moved: moved as u32,
        }
    }

    /// The node as this tick finds it, and the policy to plan with (CPU
    /// suppress off while no besteffort parent is found).
    fn observe(&mut self, i: &Input) -> (NodeState, Policy) {
        let (s, cg, t, inv) = (i.settings, i.cgroups, i.tick, i.inventory);
        let rebuilt = self.skeleton.as_ref().map(|k| k.generation) != Some(inv.generation);
        if rebuilt {
            let mut k = Skeleton::build(inv);
            k.find_sandboxes(cg);
            // a container whose cpuset kubelet changed (its update wrote the file,
            // e.g. the static CPU manager's new shared pool) is written again now,
            // not at its next drift check
            if let Some(old) = &self.skeleton {
                let before: HashMap<&str, &str> = old
                    .pods
                    .iter()
                    .flat_map(|p| &p.containers)
                    .map(|c| (c.entry.id.as_str(), c.entry.cpuset_cpus.as_str()))
                    .collect();
                for c in k.pods.iter().flat_map(|p| &p.containers) {
                    if before
                        .get(c.entry.id.as_str())
                        .is_some_and(|b| *b != c.entry.cpuset_cpus)
                    {
                        self.engine.forget(&c.entry.cgroup, KnobKind::CpusetCpus);
                    }
                }
            }
            self.skeleton = Some(k);
        }
        // the cgroup driver kubelet's pods use (a node that switched drivers may
        // keep the other's empty kubepods)
        let systemd = self.skeleton.as_ref().and_then(Skeleton::systemd);
        if self.be_parent.is_none() || (rebuilt && s.be_parent.is_none()) {
            self.be_parent = find_be_parent(cg, s.be_parent.as_ref(), &s.pod_root, systemd);
        }
        if self.qos_dirs.len() < 3 || rebuilt {
            self.qos_dirs = find_qos_dirs(cg, &s.pod_root, systemd);
        }
        // Anolis kernels apply group identity only with this sysctl on
        // (koordlet turns it on whenever a class's cpuQOS is)
        if i.env.features.bvt
            && !s.dry_run
            && qoslet_hooks::decide::group_identity_on(&i.policy.qos)
        {
            let sysctl = qoslet_cgroups::sysctl::Sysctl::new(&s.proc_root);
            match sysctl.enable_group_identity() {
                Ok(Some(qoslet_cgroups::fs::Outcome::Written)) => {
                    info!("group identity enabled (kernel.sched_group_identity_enabled)")
                }
                Ok(_) => {}
                Err(e) => {
                    let e = EngineError::GroupIdentitySysctl {
                        error: e.to_string(),
                    };
                    if self.once.first(e.key()) {
                        warn!(error = %e, "group identity sysctl");
                    }
                }
            }
        }
        if rebuilt || self.cpu_manager.is_none() {
            let now = s.cpu_manager.read();
            if self.cpu_manager.as_ref().map(|m| m.is_static) != Some(now.is_static) {
                info!(
                    static_policy = now.is_static,
                    "kubelet's CPU manager policy"
                );
            }
            self.cpu_manager = Some(now);
        }
        let capacity = sample(&t.node, Metric::CpuCapacity).unwrap_or(1.0);
        let mut pol = i.policy.clone();
        if self.be_parent.is_none() {
            if pol.threshold.enable {
                let w = crate::error::Warning::NoBeParent;
                if self.once.first(w.key()) {
                    warn!("{w}");
                }
            }
            pol.threshold.enable = false;
        }
        let (pods, generation) = match &self.skeleton {
            Some(k) => (k.with_usage(t), k.generation),
            None => (Vec::new(), 0),
        };
        let cpu_manager = self.cpu_manager.clone().unwrap_or_default();
        let look = Look {
            cgroups: cg,
            be_parent: self.be_parent.as_ref(),
            topology: self.topology.refresh(&s.sys_root, capacity),
            qos_dirs: &self.qos_dirs,
            cpu_manager: &cpu_manager,
            capacity,
            reserved: s.reserved.cores(),
        };
        let mut state = look.node_state(pods, Some(generation));
        // the capacity as measured (0 while the collector has none)
        state.capacity_cores = sample(&t.node, Metric::CpuCapacity).unwrap_or(0.0);
        let node = fresh(sample(&t.node, Metric::CpuUsage), &mut self.last_node);
        let system = fresh(sample(&t.system, Metric::CpuUsage), &mut self.last_system);
        state.usage_known = node.is_some() && system.is_some();
        state.node_usage_cores = node.unwrap_or(0.0);
        state.system_usage_cores = system.unwrap_or(0.0);
        state.pods_usage_cores = sample(&t.pods_root, Metric::CpuUsage);
        state.be_usage_cores = sample(&t.be, Metric::CpuUsage);
        if i.env.features.memory_qos {
            // the ancestors' protection as another writer (kubelet) may have left it
            for a in crate::engine::protected_ancestors(&state) {
                for (name, file) in [
                    (KnobKind::MemoryMin, qoslet_cgroups::files::MEMORY_MIN),
                    (KnobKind::MemoryLow, qoslet_cgroups::files::MEMORY_LOW),
                ] {
                    // "max": full protection someone asked for (left alone)
                    if let Some(v) = cg.read_memory_protection(&a, file) {
                        state.ancestors.insert((a.clone(), name), v);
                    }
                }
            }
        }
        if rebuilt {
            // burst scaling's state is the files': a container first seen (after a
            // restart, say) starts from the quota its cgroup holds
            let live: HashSet<&str> = state
                .pods
                .iter()
                .flat_map(|p| p.containers.iter().map(|c| c.entry.id.as_str()))
                .collect();
            self.seeded.retain(|id| live.contains(id.as_str()));
            for c in state.pods.iter().flat_map(|p| &p.containers) {
                if c.entry.cpu_quota > 0 && self.seeded.insert(c.entry.id.clone()) {
                    let q = cg.read_cpu_quota(&c.entry.cgroup).and_then(|(q, period)| {
                        q.map(|q| q * c.entry.cpu_period as u64 / period.max(1))
                    });
                    self.engine.seed_quota(c, q);
                }
            }
        }
        (state, pol)
    }
}
