//! A synthetic node for the benchmark and the simulation: a cgroup v1 tree
//! shaped like the kernel's (the files the engine reads and writes, with the
//! kernel's defaults) and the pods in it, as the engine sees them.

use std::io;
use std::path::Path;

use qoslet_cgroups::{CgroupPath, Cgroups};
use qoslet_hooks::QosClass;

use crate::engine::NodeState;
use crate::reconcile::{Container, Pod};

/// `--name VALUE` from a bench binary's arguments, or `default`.
pub fn flag<T: std::str::FromStr>(args: &[String], name: &str, default: T) -> T {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The besteffort parent every synthetic node has.
pub fn be_parent() -> CgroupPath {
    CgroupPath::parse("kubepods/besteffort").expect("a valid cgroup path")
}

/// The besteffort parent's CFS quota as the tree says (`Some(None)`:
/// unlimited; `None`: the files cannot be read).
pub fn be_quota(cg: &Cgroups) -> Option<Option<u64>> {
    cg.read_cpu_quota(&be_parent()).map(|(q, _)| q)
}

/// What the engine reads of a synthetic node with `cpus` CPUs (one NUMA node,
/// no reserved CPUs), its usage in cores and its besteffort quota.
pub fn node_state(
    cpus: u32,
    node_usage_cores: f64,
    system_usage_cores: f64,
    pods: &[Pod],
    be_quota_us: Option<u64>,
) -> NodeState {
    NodeState {
        pods_usage_cores: None,
        be_usage_cores: None,
        usage_known: true,
        capacity_cores: f64::from(cpus),
        node_usage_cores,
        system_usage_cores,
        reserved_cores: 0.0,
        pods: pods.to_vec(),
        be_parent: be_parent(),
        be_quota_us,
        period_us: 100_000,
        numa: vec![(0..cpus).collect()],
        places: Default::default(),
        be_cpuset: None,
        qos_dirs: Vec::new(),
        cpuset_ceiling: None,
        static_cpu_manager: false,
        shared_pool: None,
        ancestors: std::collections::BTreeMap::new(),
        pods_generation: Some(1),
    }
}

/// What to build.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    pub ls_pods: usize,
    pub be_pods: usize,
    pub containers_per_pod: usize,
    /// Each LS container's CPU limit, in cores (0: none).
    pub ls_limit_cores: f64,
    pub cpus: u32,
}

/// One cgroup's files in each controller's hierarchy (`root/<controller>/<cg>/<file>`).
fn cgroup_files(root: &Path, cg: &str, cpus: u32) -> io::Result<()> {
    for (f, v) in [
        ("cpu/cpu.cfs_quota_us", "-1\n".to_string()),
        ("cpu/cpu.cfs_period_us", "100000\n".into()),
        ("cpu/cpu.shares", "1024\n".into()),
        ("cpu/cpu.idle", "0\n".into()),
        ("cpu/cpu.cfs_burst_us", "0\n".into()),
        ("cpu/tasks", String::new()),
        ("cpu/cgroup.procs", String::new()),
        ("cpuset/cpuset.cpus", format!("0-{}\n", cpus - 1)),
        ("cpuset/cgroup.procs", String::new()),
        (
            "memory/memory.limit_in_bytes",
            "9223372036854771712\n".into(),
        ),
        ("memory/cgroup.procs", String::new()),
    ] {
        let (controller, file) = f.split_once('/').unwrap_or_default();
        let d = root.join(controller).join(cg);
        std::fs::create_dir_all(&d)?;
        std::fs::write(d.join(file), v)?;
    }
    Ok(())
}

/// Builds the tree under `root` (v1: `root/cpu/...`, `root/cpuset/...`,
/// `root/memory/...`) and returns the pods in it.
pub fn build(root: &Path, s: &Shape) -> io::Result<Vec<Pod>> {
    let _ = std::fs::remove_dir_all(root);
    let mut pods = Vec::new();
    let mut all = vec![
        String::new(),
        "kubepods".into(),
        "kubepods/besteffort".into(),
        "kubepods/burstable".into(),
    ];
    let mut add = |class: QosClass, parent: &str, n: usize, pods: &mut Vec<Pod>| {
        for i in 0..n {
            let id = format!("{}{i:05}", if class == QosClass::Be { "be" } else { "ls" });
            let pcg = format!("{parent}/pod{id}");
            all.push(pcg.clone());
            let containers = (0..s.containers_per_pod)
                .map(|c| {
                    let cid = format!("{id}c{c}");
                    all.push(format!("{pcg}/{cid}"));
                    let limited = class == QosClass::Ls && s.ls_limit_cores > 0.0;
                    Container {
                        entry: qoslet_state::inventory::ContainerEntry {
                            id: cid.clone(),
                            name: format!("c{c}"),
                            cgroup: CgroupPath::parse(&format!("{pcg}/{cid}"))
                                .expect("synthetic path"),
                            memory_limit: 0,
                            cpu_quota: if limited {
                                (s.ls_limit_cores * 100_000.0) as i64
                            } else {
                                0
                            },
                            cpu_period: 100_000,
                            cpuset_cpus: String::new(),
                            oom_score_adj: 0,
                            cpu_shares: 0,
                        },
                        cpu_cores: 0.0,
                        throttled_ratio: 0.0,
                    }
                })
                .collect();
            pods.push(Pod {
                id,
                class,
                by_label: true,
                trusted: true,
                kube: None,
                cgroup: CgroupPath::parse(&pcg).expect("synthetic path"),
                annotations: Default::default(),
                spec_batch: None,
                limits: Default::default(),
                sandbox: None,
                cpu_cores: 0.0,
                containers,
            });
        }
    };
    add(QosClass::Ls, "kubepods/burstable", s.ls_pods, &mut pods);
    add(QosClass::Be, "kubepods/besteffort", s.be_pods, &mut pods);
    for cg in &all {
        cgroup_files(root, cg, s.cpus)?;
    }
    Ok(pods)
}

/// Spreads usage over the pods: `ls_cores` evenly over the non-BE pods,
/// `be_cores` over the BE pods, each pod's evenly over its containers.
pub fn set_usage(pods: &mut [Pod], ls_cores: f64, be_cores: f64) {
    let nbe = pods
        .iter()
        .filter(|p| p.class == QosClass::Be)
        .count()
        .max(1) as f64;
    let nls = pods
        .iter()
        .filter(|p| p.class != QosClass::Be)
        .count()
        .max(1) as f64;
    for p in pods.iter_mut() {
        let u = if p.class == QosClass::Be {
            be_cores / nbe
        } else {
            ls_cores / nls
        };
        p.cpu_cores = u;
        let n = p.containers.len().max(1) as f64;
        for c in &mut p.containers {
            c.cpu_cores = u / n;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tree_the_cgroups_layer_recognises() {
        let d = std::env::temp_dir().join(format!("qoslet-synth-{}", std::process::id()));
        let pods = build(
            &d,
            &Shape {
                ls_pods: 2,
                be_pods: 1,
                containers_per_pod: 2,
                ls_limit_cores: 2.0,
                cpus: 8,
            },
        )
        .unwrap();
        assert_eq!(pods.len(), 3);
        assert_eq!(pods[0].containers[1].entry.cpu_quota, 200_000);
        let cg = qoslet_cgroups::Cgroups::detect(&d).unwrap();
        assert!(cg.host().features.cpu_idle && cg.host().features.cpu_burst);
        let be = CgroupPath::parse("kubepods/besteffort/podbe00000/be00000c1").unwrap();
        assert_eq!(cg.read(&be, "cpuset", "cpuset.cpus").unwrap().trim(), "0-7");
        std::fs::remove_dir_all(&d).unwrap();
    }
}
