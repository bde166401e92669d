//! One engine tick: the node's state in, a merged plan out. The plugins run
//! in a fixed order over the same plan:
//!
//! 1. reconcile: what the runtime hooks set on every pod and container (cpu
//!    QoS, memory QoS, batch resources, CPU binding, block I/O), re-derived
//!    from the current policy;
//! 2. CPU suppress: the BE allowance as a CFS quota on the besteffort parent
//!    or as a BE cpuset; the policy not in use is put back (unlimited quota,
//!    all CPUs);
//! 3. CPU burst: CFS burst and quota scaling for LS containers with limits.
//!
//! Where two plugins set the same file, the strictest value wins.
//!
//! * here: [`Policy`], [`Env`], [`TickResult`], [`Engine`] (the state kept
//!   between ticks: the executor, the reconcile reused while pods and policy stay).
//! * `state`: [`NodeState`] and the LS share pool.
//! * `tick`: one tick's plan, plugin by plugin, merged.
//! * `cpu_burst`: the CPU burst plugin.
//! * `protection`: memory protection up the tree.
//! * `restore`: what is put back, and how.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use qoslet_cgroups::{CgroupPath, Cgroups, Device, Features, Knob, KnobKind};
use qoslet_hooks::decide::{Context, NodeFacts};
use qoslet_hooks::policy::ResourceQosStrategy;
use qoslet_hooks::{KubeQos, QosClass};

use crate::burst::{self, BurstPolicy, CpuBurstStrategy, Pool};
use crate::execute::{Executor, Report};
use crate::plan::{Plan, Plugin, Write};
use crate::policy::{CpuSuppressPolicy, ResourceThresholdStrategy};
use crate::reconcile::{self, Container, Pod};
use crate::suppress::{self, Level};

mod cpu_burst;
mod protection;
mod restore;
mod state;
#[cfg(test)]
mod tests;
mod tick;

use cpu_burst::*;
pub use protection::*;
pub use restore::*;
pub use state::*;
pub use tick::*;

/// The whole policy, with NodeSLO's names.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Policy {
    pub threshold: ResourceThresholdStrategy,
    pub burst: CpuBurstStrategy,
    pub qos: ResourceQosStrategy,
}

/// What the host offers (fixed while qoslet runs).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Env {
    pub features: Features,
    pub v2: bool,
    /// The policy's block devices resolved on this host.
    pub devices: BTreeMap<String, Device>,
    pub page_size: u64,
    /// Online and reserved CPUs, capacity (bounds for what pods' annotations ask).
    pub node: NodeFacts,
}

impl Env {
    /// The hooks' decision context for `policy` on this host.
    pub fn context<'a>(&'a self, policy: &'a ResourceQosStrategy) -> Context<'a> {
        Context {
            features: &self.features,
            v2: self.v2,
            policy,
            page_size: self.page_size.max(1),
            node: &self.node,
            devices: &self.devices,
            share_pool: None,
        }
    }
}

/// A tick's result.
#[derive(Debug, Clone, PartialEq)]
pub struct TickResult {
    pub plan: Plan,
    pub allowance_cores: f64,
    pub level: Level,
    pub non_be_usage_cores: f64,
    pub be_usage_cores: f64,
    /// The share pool's state (`None`: burst is off).
    pub pool: Option<Pool>,
    /// The LS containers' quotas after burst scaling, by container id.
    pub burst_quota: HashMap<String, u64>,
    /// Problems worth a log line (a policy the kernel cannot do here).
    pub warnings: Vec<crate::error::Warning>,
}

fn w(cgroup: &CgroupPath, knob: Knob, plugin: Plugin, rule: String) -> Write {
    Write {
        cgroup: cgroup.clone(),
        knob,
        plugin,
        rule,
    }
}

/// The engine between ticks: the executor's memory, the LS quotas burst
/// scaled, and the last reconcile (reused while the pods and policy stay).
#[derive(Debug)]
pub struct Engine {
    executor: Executor,
    burst_quota: HashMap<String, u64>,
    /// Each burstable container's cfsQuotaBurstPeriodSeconds bucket.
    limiters: HashMap<String, burst::Limiter>,
    /// Where [`Engine::plan`]'s clock starts.
    started: std::time::Instant,
    reconciled: Option<Reconciled>,
    /// The ancestors' memory.min/low: what qoslet last planned there, and what
    /// another writer last put there.
    ours: Protection,
    theirs: Protection,
}

/// The last reconcile: for which pods (generation), policy and host, and its
/// writes and bound CPUs.
#[derive(Debug)]
struct Reconciled {
    generation: u64,
    policy: Policy,
    env: Env,
    /// The CPUs pods could use (the share pool is taken within them: hotplug).
    cpus: BTreeSet<u32>,
    out: (Plan, BoundCpus),
}

impl Engine {
    /// `verify_every`: re-read each file qoslet owns once every this many ticks.
    pub fn new(verify_every: u64) -> Self {
        Self {
            executor: Executor::new(verify_every),
            burst_quota: HashMap::new(),
            limiters: HashMap::new(),
            started: std::time::Instant::now(),
            reconciled: None,
            ours: Protection::new(),
            theirs: Protection::new(),
        }
    }

    /// Plans one tick (no I/O).
    pub fn plan(&mut self, state: &NodeState, policy: &Policy, env: &Env) -> TickResult {
        let now_s = self.started.elapsed().as_secs_f64();
        self.plan_at(state, policy, env, now_s)
    }

    /// The containers whose cfsQuotaBurstPeriodSeconds bucket is empty at
    /// `now_s` (their usage as a share of their limit spent since the last tick).
    fn limit_bursts(
        &mut self,
        state: &NodeState,
        policy: &Policy,
        now_s: f64,
    ) -> std::collections::HashSet<String> {
        let mut out = std::collections::HashSet::new();
        let mut seen = std::collections::HashSet::new();
        for p in state.pods.iter().filter(|p| burstable(p)) {
            // the pod's own cpuBurst annotation over the node's config
            let (b, _) = policy.burst.for_pod(&p.annotations, p.trusted);
            let scale_on = matches!(b.policy, BurstPolicy::CfsQuotaBurstOnly | BurstPolicy::Auto);
            if !scale_on || b.cfs_quota_burst_period_seconds < 0 {
                continue;
            }
            for c in p.containers.iter().filter(|c| c.entry.cpu_quota > 0) {
                seen.insert(c.entry.id.clone());
                let limit_cores = c.entry.cpu_quota as f64 / c.entry.cpu_period.max(1000) as f64;
                let fresh = || {
                    burst::Limiter::new(
                        &c.entry.id,
                        b.cfs_quota_burst_period_seconds,
                        b.cfs_quota_burst_percent,
                        now_s,
                    )
                };
                let l = self
                    .limiters
                    .entry(c.entry.id.clone())
                    .or_insert_with(fresh);
                if !l.is_for(b.cfs_quota_burst_period_seconds, b.cfs_quota_burst_percent) {
                    *l = fresh();
                }
                // usage not measured (0): neither spent nor saved, as koordlet
                // counts a failed query at the limit
                let usage = if c.cpu_cores > 0.0 {
                    c.cpu_cores / limit_cores * 100.0
                } else {
                    100.0
                };
                if !l.allow(now_s, usage) {
                    out.insert(c.entry.id.clone());
                }
            }
        }
        self.limiters
            .retain(|id, l| seen.contains(id) && !l.expired(now_s));
        out
    }

    /// [`Engine::plan`] at `now_s` seconds on the engine's clock.
    pub fn plan_at(
        &mut self,
        state: &NodeState,
        policy: &Policy,
        env: &Env,
        now_s: f64,
    ) -> TickResult {
        let cpus = state.all_cpus();
        let hit = match (&self.reconciled, state.pods_generation) {
            (Some(r), Some(now)) => {
                r.generation == now && r.policy == *policy && r.env == *env && r.cpus == cpus
            }
            _ => false,
        };
        if !hit {
            self.reconciled = state.pods_generation.map(|g| {
                let out = reconcile_all(state, &env.context(&policy.qos));
                Reconciled {
                    generation: g,
                    policy: policy.clone(),
                    env: env.clone(),
                    cpus: cpus.clone(),
                    out,
                }
            });
        }
        // cfsQuotaBurstPeriodSeconds: each scaled container's token bucket
        let limited = self.limit_bursts(state, policy, now_s);
        let cached = self.reconciled.as_ref().map(|r| &r.out);
        // a value in an ancestor's file that is not the one qoslet planned there
        // was written by someone else (a first sight counts as qoslet's own: an
        // earlier run's value must not pin the protection forever)
        let page = env.page_size.max(1);
        for (k, &file) in &state.ancestors {
            if file == u64::MAX {
                // "max" is never qoslet's own value
                self.theirs.insert(k.clone(), file);
                continue;
            }
            match self.ours.get(k) {
                // the kernel keeps whole pages: qoslet's value reads back rounded down
                Some(&mine) if mine / page * page != file && mine != file => {
                    self.theirs.insert(k.clone(), file);
                }
                _ => {}
            }
        }
        self.theirs.retain(|k, _| state.ancestors.contains_key(k));
        let t = tick_with(
            state,
            policy,
            env,
            &self.burst_quota,
            &limited,
            cached,
            &self.theirs,
        );
        self.burst_quota = t.burst_quota.clone();
        // what qoslet planned on each ancestor read this tick (nothing planned: 0,
        // so a value another writer puts there later is told apart)
        self.ours = state
            .ancestors
            .keys()
            .map(
                |k| match t.plan.get(&(k.0.clone(), k.1, None)).map(|w| &w.knob) {
                    Some(Knob::MemoryMin(v) | Knob::MemoryLow(v)) => (k.clone(), *v),
                    _ => (k.clone(), 0),
                },
            )
            .collect();
        t
    }

    /// Takes the quota found in a burstable container's cgroup as the state
    /// burst scaling left it in (an earlier run, before a restart): a quota above
    /// kubelet's limit is then scaled on from there, or put back to the limit
    /// when scaling is off. Only for containers not seen before; a quota at or
    /// below the limit says nothing (the limit is the floor).
    pub fn seed_quota(&mut self, container: &Container, file_quota_us: Option<u64>) {
        if container.entry.cpu_quota <= 0 || self.burst_quota.contains_key(&container.entry.id) {
            return;
        }
        // read at the container's own period
        if let Some(q) = file_quota_us.filter(|q| *q > container.entry.cpu_quota as u64) {
            self.burst_quota.insert(container.entry.id.clone(), q);
        }
    }

    /// The next plan writes this file even if its value is unchanged (another
    /// writer is known to have rewritten it, e.g. kubelet's cpuset update).
    pub fn forget(&mut self, cgroup: &CgroupPath, kind: KnobKind) {
        self.executor.forget(cgroup, kind);
    }

    /// Applies a plan.
    pub fn execute(&mut self, plan: &Plan, cgroups: &Cgroups) -> Report {
        self.executor.execute(plan, cgroups)
    }

    pub fn known_files(&self) -> usize {
        self.executor.known_files()
    }
}
