//! The seed scenario, simulated: a 1,024-core node with 400 LS pods (2
//! cores each, using 1.5 on average) and 200 BE pods (using 2 cores each),
//! and an LS burst from 600 to 750 cores at t = 10 s that ends at t = 50 s.
//!
//! The real engine (plan + executor) runs once a second on a synthetic cgroup
//! v1 tree; a CPU model plays the kernel: BE gets at most the besteffort
//! quota the engine wrote, and when the node is oversubscribed every demand
//! gets the same share of the CPUs (no priority: the worst case for LS).
//! What the engine reads each second is what the model measured that second,
//! as the metrics collector hands it over.

use std::path::Path;

use qoslet_cgroups::Cgroups;

use crate::engine::{Engine, Env, Policy};
use crate::policy::CpuSuppressPolicy;
use crate::synth::{self, Shape};

pub const CAPACITY: f64 = 1024.0;
pub const SYSTEM: f64 = 10.0;
pub const BE_DEMAND: f64 = 400.0;

/// LS demand in cores at second `t`: 600, and 750 from 10 s to 50 s.
pub fn ls_demand(t: u32) -> f64 {
    if (10..50).contains(&t) {
        750.0
    } else {
        600.0
    }
}

/// One second of the timeline.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub t: u32,
    pub ls_demand: f64,
    pub ls_usage: f64,
    pub be_usage: f64,
    /// The quota in force this second (`None`: unlimited).
    pub be_quota_cores: Option<f64>,
    /// What the engine decided at the end of the second.
    pub allowance_cores: f64,
    pub level: &'static str,
    pub files_written: usize,
    pub tick_ms: f64,
}

impl Row {
    pub const CSV_HEADER: &'static str = "t,ls_demand,ls_usage,ls_unmet,be_demand,be_usage,be_quota_cores,allowance_cores,level,files_written,tick_ms";

    pub fn ls_unmet(&self) -> f64 {
        self.ls_demand - self.ls_usage
    }

    pub fn csv(&self) -> String {
        format!(
            "{},{:.1},{:.1},{:.1},{BE_DEMAND:.1},{:.1},{},{:.1},{},{},{:.2}",
            self.t,
            self.ls_demand,
            self.ls_usage,
            self.ls_unmet(),
            self.be_usage,
            self.be_quota_cores
                .map(|q| format!("{q:.1}"))
                .unwrap_or_else(|| "unlimited".into()),
            self.allowance_cores,
            self.level,
            self.files_written,
            self.tick_ms
        )
    }
}

/// Why the scenario stopped.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error("building the synthetic node: {0}")]
    Build(#[from] std::io::Error),
    #[error(transparent)]
    Cgroups(#[from] qoslet_cgroups::CgroupError),
    #[error("the besteffort quota cannot be read")]
    NoQuota,
    #[error("engine errors at second {second}: {first} ({count} in all)")]
    Engine {
        second: u32,
        first: crate::error::EngineError,
        count: usize,
    },
}

/// Runs the scenario for `seconds` with cfsQuota suppress at `threshold` %,
/// the synthetic tree under `root` (removed afterwards).
pub fn run(threshold: i64, seconds: u32, root: &Path) -> Result<Vec<Row>, SimError> {
    let shape = Shape {
        ls_pods: 400,
        be_pods: 200,
        containers_per_pod: 1,
        ls_limit_cores: 0.0,
        cpus: 1024,
    };
    let mut pods = synth::build(root, &shape)?;
    let cg = Cgroups::detect(root)?;
    let env = Env {
        features: cg.host().features.clone(),
        page_size: 4096,
        ..Default::default()
    };
    let mut policy = Policy::default();
    policy.threshold.enable = true;
    policy.threshold.cpu_suppress_policy = CpuSuppressPolicy::CfsQuota;
    policy.threshold.cpu_suppress_threshold_percent = threshold;
    let mut engine = Engine::new(10);
    let mut rows = Vec::new();
    for t in 0..seconds {
        // the kernel, this second: BE capped by the quota in the tree
        let q = synth::be_quota(&cg).ok_or(SimError::NoQuota)?;
        let quota_cores = q.map(|q| q as f64 / 100_000.0);
        let ls_d = ls_demand(t);
        let be_d = BE_DEMAND.min(quota_cores.unwrap_or(f64::INFINITY));
        let total = ls_d + be_d + SYSTEM;
        let share = if total > CAPACITY {
            CAPACITY / total
        } else {
            1.0
        };
        let (ls, be, sys) = (ls_d * share, be_d * share, SYSTEM * share);
        // the metrics the engine reads: what this second measured
        synth::set_usage(&mut pods, ls, be);
        let state = synth::node_state(CAPACITY as u32, ls + be + sys, sys, &pods, q);
        let a = std::time::Instant::now();
        let r = engine.plan(&state, &policy, &env);
        let x = engine.execute(&r.plan, &cg);
        if let Some(first) = x.errors.first() {
            return Err(SimError::Engine {
                second: t,
                first: first.clone(),
                count: x.errors.len(),
            });
        }
        rows.push(Row {
            t,
            ls_demand: ls_d,
            ls_usage: ls,
            be_usage: be,
            be_quota_cores: quota_cores,
            allowance_cores: r.allowance_cores,
            level: r.level.as_str(),
            files_written: x.written,
            tick_ms: a.elapsed().as_secs_f64() * 1e3,
        });
    }
    let _ = std::fs::remove_dir_all(root);
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_seed_scenario_protects_ls_and_gives_be_back_its_share() {
        let root = std::env::temp_dir().join(format!("qoslet-sim-test-{}", std::process::id()));
        let rows = run(98, 60, &root).unwrap();
        // before the burst: BE runs nearly unthrottled (393.5 of the 400 cores it wants)
        assert!((rows[9].be_usage - 393.5).abs() < 0.1, "{:?}", rows[9]);
        assert_eq!(rows[9].ls_unmet(), 0.0);
        // the burst: LS is short for at most 3 seconds, then fully served
        let short: Vec<u32> = rows
            .iter()
            .filter(|r| r.ls_unmet() > 0.5)
            .map(|r| r.t)
            .collect();
        assert!(
            short.len() <= 3 && short.iter().all(|t| (10..13).contains(t)),
            "{short:?}"
        );
        // BE held at 1024 x 98% - 750 - 10 = 243.5 cores, with no writes once there
        let held: Vec<&Row> = rows[15..50].iter().collect();
        assert!(held.iter().all(|r| (r.be_usage - 243.5).abs() < 0.1));
        assert!(held.iter().all(|r| r.files_written == 0));
        // after: back stepwise (at most 10% of the node per tick) within 3 seconds
        assert!(rows[51].be_usage - rows[50].be_usage <= 102.4 + 0.1);
        assert!(
            (rows[53].be_usage - 393.5).abs() < 0.1,
            "{:?}",
            &rows[50..54]
        );
    }
}
