//! One engine tick: the node's state in, a merged plan out; and the executor
//! that applies a plan through the cgroups layer (idempotent writes: a
//! steady state writes nothing).

use std::collections::BTreeSet;

use qoslet_cgroups::{CgroupPath, Cgroups, Knob};

use crate::plan::{Plan, Write};
use crate::policy::{CpuSuppressPolicy, ResourceThresholdStrategy};
use crate::suppress::{self, Level};

/// A pod's usage as the engine sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct PodUsage {
    pub be: bool,
    pub cpu_cores: f64,
}

/// What one tick reads (from the store, the metrics cache and the cgroups).
#[derive(Debug, Clone, PartialEq)]
pub struct NodeState {
    pub capacity_cores: f64,
    pub system_usage_cores: f64,
    pub reserved_cores: f64,
    pub pods: Vec<PodUsage>,
    /// The besteffort parent cgroup (`kubepods/besteffort`, or the systemd slice).
    pub be_parent: CgroupPath,
    pub be_quota_us: Option<u64>,
    pub period_us: u64,
    /// For the cpuset policy: CPUs per NUMA node, CPUs bound to LSE/LSR, the BE cpuset now.
    pub numa: Vec<Vec<u32>>,
    pub exclusive: BTreeSet<u32>,
    pub be_cpuset: Option<BTreeSet<u32>>,
}

/// A tick's result.
#[derive(Debug, Clone, PartialEq)]
pub struct TickResult {
    pub plan: Plan,
    pub allowance_cores: f64,
    pub level: Level,
}

/// Runs the plugins over `state` and merges their writes.
pub fn tick(state: &NodeState, policy: &ResourceThresholdStrategy) -> TickResult {
    let mut plan = Plan::new();
    let (be, non_be) = state.pods.iter().fold((0.0, 0.0), |(b, n), p| {
        if p.be {
            (b + p.cpu_cores, n)
        } else {
            (b, n + p.cpu_cores)
        }
    });
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
    let s = suppress::cfs_quota(&input, policy);
    if policy.enable {
        match policy.cpu_suppress_policy {
            CpuSuppressPolicy::CfsQuota => {
                if let Some(q) = s.quota_us {
                    plan.add(Write {
                        cgroup: state.be_parent.clone(),
                        knob: Knob::CpuQuota {
                            quota: Some(q),
                            period: state.period_us,
                        },
                        plugin: "cpu-suppress",
                        rule: s.rule.clone(),
                    });
                }
            }
            CpuSuppressPolicy::Cpuset => {
                let c = crate::cpuset::Input {
                    numa: state.numa.clone(),
                    exclusive: state.exclusive.clone(),
                    allowance_cores: s.allowance_cores,
                    current: state.be_cpuset.clone(),
                };
                if let Some(cpus) = crate::cpuset::be_cpuset(&c) {
                    plan.add(Write {
                        cgroup: state.be_parent.clone(),
                        knob: Knob::CpusetCpus(crate::cpuset::format_cpus(&cpus)),
                        plugin: "cpu-suppress",
                        rule: format!(
                            "BE allowance {:.2} cores -> {} CPUs from the share pool",
                            s.allowance_cores,
                            cpus.len()
                        ),
                    });
                }
            }
        }
    }
    TickResult {
        plan,
        allowance_cores: s.allowance_cores,
        level: s.level,
    }
}

/// What executing a plan did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    pub written: usize,
    pub unchanged: usize,
    /// Failed writes, each naming the file and value; the others still ran.
    pub errors: Vec<String>,
}

/// Applies a plan (parents before children when limits grow, children first
/// when they shrink); each write is idempotent.
pub fn execute(plan: &Plan, cgroups: &Cgroups) -> Report {
    let mut r = Report::default();
    let writes: Vec<(CgroupPath, Knob)> = plan
        .writes()
        .iter()
        .map(|w| (w.cgroup.clone(), w.knob.clone()))
        .collect();
    match cgroups.apply_ordered(&writes) {
        Ok(done) => {
            for (_, o) in done {
                match o {
                    qoslet_cgroups::fs::Outcome::Written => r.written += 1,
                    qoslet_cgroups::fs::Outcome::Unchanged => r.unchanged += 1,
                }
            }
        }
        Err(e) => {
            // apply_ordered stops at the first error: every write is tried on its
            // own (writes done before the error count as unchanged here)
            r.errors.push(e.to_string());
            for (cg, k) in &writes {
                match cgroups.apply(cg, k) {
                    Ok(qoslet_cgroups::fs::Outcome::Written) => r.written += 1,
                    Ok(qoslet_cgroups::fs::Outcome::Unchanged) => r.unchanged += 1,
                    Err(e) => r.errors.push(e.to_string()),
                }
            }
            r.errors.sort();
            r.errors.dedup();
        }
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(ls: f64, be: f64, quota: Option<u64>) -> NodeState {
        NodeState {
            capacity_cores: 16.0,
            system_usage_cores: 0.5,
            reserved_cores: 1.0,
            pods: vec![
                PodUsage {
                    be: false,
                    cpu_cores: ls,
                },
                PodUsage {
                    be: true,
                    cpu_cores: be,
                },
            ],
            be_parent: CgroupPath::parse("/kubepods/besteffort").unwrap(),
            be_quota_us: quota,
            period_us: 100_000,
            numa: vec![(0..16).collect()],
            exclusive: BTreeSet::new(),
            be_cpuset: None,
        }
    }

    fn cfs(threshold: i64) -> ResourceThresholdStrategy {
        ResourceThresholdStrategy {
            cpu_suppress_threshold_percent: threshold,
            cpu_suppress_policy: CpuSuppressPolicy::CfsQuota,
            ..Default::default()
        }
    }

    fn tree(tag: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("qoslet-engine-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        for (f, c) in [
            ("cpu/cgroup.procs", ""),
            ("cpu/kubepods/besteffort/cpu.cfs_quota_us", "-1\n"),
            ("cpu/kubepods/besteffort/cpu.cfs_period_us", "100000\n"),
        ] {
            let p = d.join(f);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, c).unwrap();
        }
        d
    }

    #[test]
    fn ls_load_cuts_be_quota_and_steady_state_writes_nothing() {
        let d = tree("suppress");
        let cg = Cgroups::detect(&d).unwrap();
        let p = cfs(50);
        // 16 x 50% - LS 6 - max(system 0.5, reserved 1) = 1 core for BE
        let t = tick(&state(6.0, 4.0, None), &p);
        assert_eq!(t.level, Level::Mid);
        assert_eq!(t.plan.writes().len(), 1);
        let r = execute(&t.plan, &cg);
        assert_eq!((r.written, r.errors.len()), (1, 0), "{r:?}");
        let q =
            std::fs::read_to_string(d.join("cpu/kubepods/besteffort/cpu.cfs_quota_us")).unwrap();
        assert_eq!(q, "100000");
        // the same again: nothing to write
        assert_eq!(execute(&t.plan, &cg).written, 0);
        // steady state: the plugin itself asks for nothing
        assert!(tick(&state(6.0, 4.0, Some(100_000)), &p).plan.is_empty());
        // LS load gone: restored stepwise (at most 1.6 cores per tick on 16 CPUs)
        let t = tick(&state(0.0, 4.0, Some(100_000)), &p);
        assert_eq!(
            t.plan.writes()[0].knob,
            Knob::CpuQuota {
                quota: Some(260_000),
                period: 100_000
            }
        );
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_failed_write_is_reported_and_the_others_still_run() {
        let d = tree("errors");
        let cg = Cgroups::detect(&d).unwrap();
        let mut plan = Plan::new();
        for (path, q) in [("/kubepods/gone", 50_000), ("/kubepods/besteffort", 70_000)] {
            plan.add(Write {
                cgroup: CgroupPath::parse(path).unwrap(),
                knob: Knob::CpuQuota {
                    quota: Some(q),
                    period: 100_000,
                },
                plugin: "test",
                rule: String::new(),
            });
        }
        let r = execute(&plan, &cg);
        assert_eq!(r.written, 1, "{r:?}");
        assert_eq!(r.errors.len(), 1, "{r:?}");
        assert!(r.errors[0].contains("gone"), "{r:?}");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn disabled_or_cpuset() {
        let mut p = cfs(50);
        p.enable = false;
        assert!(tick(&state(6.0, 4.0, None), &p).plan.is_empty());
        let p = ResourceThresholdStrategy {
            cpu_suppress_threshold_percent: 50,
            ..Default::default()
        };
        let t = tick(&state(6.0, 4.0, None), &p);
        assert_eq!(
            t.plan.writes()[0].knob,
            Knob::CpusetCpus("14-15".into()),
            "at least 2 cores"
        );
    }
}
