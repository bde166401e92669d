//! What the admin API and Prometheus see of the loop: the last tick
//! ([`Last`]) as `GetPlan` answers it, and the engine's gauges and counters.

use super::*;

/// One tick as the admin API shows it.
pub(super) struct Last {
    pub(super) seq: u64,
    pub(super) ts: u32,
    pub(super) state: NodeState,
    pub(super) result: TickResult,
    /// Per write, in plan order.
    pub(super) states: Vec<WriteState>,
    pub(super) drift: Vec<String>,
    pub(super) errors: Vec<crate::error::EngineError>,
    /// Written, unchanged, skipped.
    pub(super) counts: (u32, u32, u32),
    /// Writes to cgroups that were gone.
    pub(super) gone: u32,
    pub(super) took: Duration,
    pub(super) policy: &'static str,
    pub(super) resctrl_moved: u32,
}

impl Shared {
    /// BE CPU as the last tick saw it, with the tick's sequence number (a
    /// new one per tick): Koordinator's BE CPU-satisfaction eviction's input.
    pub fn be_cpu(&self) -> Option<(u64, crate::engine::BeCpu)> {
        let l = lock(&self.last).clone()?;
        Some((l.seq, l.state.be_cpu()))
    }

    /// The latest tick for the admin API.
    pub fn plan(&self, req: &admin::GetPlanRequest) -> admin::GetPlanResponse {
        let Some(l) = lock(&self.last).clone() else {
            return admin::GetPlanResponse {
                dry_run: self.dry_run,
                policy_error: lock(&self.policy_error).clone(),
                not_implemented: lock(&self.not_implemented).clone(),
                ..Default::default()
            };
        };
        let r = &l.result;
        let writes = r
            .plan
            .writes()
            .iter()
            .zip(&l.states)
            .filter(|(w, _)| req.plugin.is_empty() || w.plugin.as_str() == req.plugin)
            .filter(|(w, _)| req.cgroup.is_empty() || w.cgroup.as_str().contains(&req.cgroup))
            .filter(|(_, st)| !req.changes_only || st.changes())
            .map(|(w, st)| admin::PlanWrite {
                cgroup: w.cgroup.as_str().to_string(),
                setting: w.knob.name().into(),
                files: self
                    .cgroups
                    .plan(&w.knob)
                    .map(|fs| {
                        fs.into_iter()
                            .map(|f| admin::PlanFile {
                                path: self
                                    .cgroups
                                    .path_of(&w.cgroup, &f)
                                    .map(|p| p.display().to_string())
                                    .unwrap_or_else(|e| format!("({e})")),
                                value: f.value,
                            })
                            .collect()
                    })
                    .unwrap_or_default(),
                plugin: w.plugin.as_str().into(),
                rule: w.rule.clone(),
                state: st.as_str().into_owned(),
            })
            .collect();
        admin::GetPlanResponse {
            tick: l.seq,
            timestamp: i64::from(l.ts),
            dry_run: self.dry_run,
            suppress_policy: l.policy.into(),
            capacity_cores: l.state.capacity_cores,
            non_be_usage_cores: r.non_be_usage_cores,
            be_usage_cores: r.be_usage_cores,
            system_usage_cores: l.state.system_usage_cores,
            reserved_cores: l.state.reserved_cores,
            allowance_cores: r.allowance_cores,
            level: r.level.as_str().into(),
            share_pool: r
                .pool
                .map(|p| format!("{p:?}").to_lowercase())
                .unwrap_or_default(),
            be_parent: l.state.be_parent.as_str().into(),
            be_quota_us: l.state.be_quota_us.map(|q| q as i64).unwrap_or(-1),
            writes,
            written: l.counts.0,
            unchanged: l.counts.1,
            skipped: l.counts.2,
            drift: l.drift.clone(),
            errors: l.errors.iter().map(ToString::to_string).collect(),
            warnings: r.warnings.iter().map(ToString::to_string).collect(),
            tick_seconds: l.took.as_secs_f64(),
            policy_error: lock(&self.policy_error).clone(),
            resctrl_moved: l.resctrl_moved,
            not_implemented: lock(&self.not_implemented).clone(),
            // the agent adds the sources as they stand when it answers
            ..Default::default()
        }
    }

    /// The engine's Prometheus lines.
    pub fn render(&self, out: &mut String) {
        let last = lock(&self.last).clone();
        let mut o = qoslet_metrics::prom::Out::new(std::mem::take(out));
        if let Some(l) = &last {
            o.single(
                "qoslet_be_suppress_level",
                "gauge",
                "BE CPU suppress pressure: 0 none, 1 mid (BE held below what it wants), 2 high (BE at the floor).",
                f64::from(l.result.level.value()),
            );
            o.single(
                "qoslet_be_cpu_allowance_cores",
                "gauge",
                "CPU the BE pods may use now, in cores.",
                l.result.allowance_cores,
            );
            o.single(
                "qoslet_engine_tick_seconds",
                "gauge",
                "Time the QoS engine's last tick took.",
                l.took.as_secs_f64(),
            );
            o.single(
                "qoslet_engine_plan_writes",
                "gauge",
                "Settings in the QoS engine's last plan.",
                l.result.plan.len() as f64,
            );
        }
        o.single(
            "qoslet_engine_dry_run",
            "gauge",
            "1 when the QoS engine only plans and never writes.",
            f64::from(u8::from(self.dry_run)),
        );
        for (name, help, v) in [
            (
                "qoslet_engine_ticks_total",
                "QoS engine ticks.",
                &self.ticks,
            ),
            (
                "qoslet_engine_writes_total",
                "cgroup files the QoS engine changed.",
                &self.writes,
            ),
            (
                "qoslet_engine_drift_total",
                "Files someone else changed that the QoS engine put back.",
                &self.drift,
            ),
            (
                "qoslet_engine_errors_total",
                "Failed QoS engine writes.",
                &self.errors,
            ),
            (
                "qoslet_engine_gone_total",
                "QoS engine writes skipped because their cgroup was gone (its pod or container ended since the inventory).",
                &self.gone,
            ),
        ] {
            o.single(name, "counter", help, v.load(Ordering::Relaxed) as f64);
        }
        *out = o.into_text();
    }
}
