//! Resctrl reconcile: each class whose `resctrlQOS` is enabled has one
//! control group (`LSR` for LSE/LSR, `LS`, `BE`, `SYSTEM`) with the class's
//! LLC ways and memory bandwidth. Every tick the groups' schemata are put
//! back if changed, and every thread of the class's containers (threads
//! started or forked since the last tick included) is moved into its group.

use std::collections::{BTreeMap, BTreeSet};

use qoslet_cgroups::resctrl::Resctrl;
use qoslet_cgroups::{CgroupPath, Cgroups};
use qoslet_hooks::policy::ResourceQosStrategy;
use qoslet_hooks::QosClass;

use crate::reconcile::Pod;

/// The resctrl group of a class.
pub fn group_of(class: QosClass) -> &'static str {
    match class {
        QosClass::Lse | QosClass::Lsr => "LSR",
        QosClass::Ls => "LS",
        QosClass::Be => "BE",
        QosClass::System => "SYSTEM",
    }
}

/// One group as it should be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Group {
    pub schemata: String,
    pub containers: Vec<CgroupPath>,
    /// The class and its `resctrlQOS`, in words.
    pub rule: String,
}

/// The groups the policy asks for, with their containers. Pure.
pub fn desired(
    pods: &[Pod],
    policy: &ResourceQosStrategy,
    rdt: &Resctrl,
) -> BTreeMap<&'static str, Group> {
    let mut out: BTreeMap<&'static str, Group> = BTreeMap::new();
    for p in pods {
        let q = &policy.of(p.class).resctrl_qos;
        if !q.enable {
            continue;
        }
        let g = out.entry(group_of(p.class)).or_insert_with(|| Group {
            schemata: rdt.schemata(
                q.cat_range_start_percent,
                q.cat_range_end_percent,
                q.mba_percent,
            ),
            containers: Vec::new(),
            rule: format!(
                "{} resctrlQOS: LLC {}-{}%, memory bandwidth {}%",
                p.class.as_str(),
                q.cat_range_start_percent,
                q.cat_range_end_percent,
                q.mba_percent
            ),
        });
        g.containers
            .extend(p.containers.iter().map(|c| c.entry.cgroup.clone()));
    }
    out
}

/// What a sync did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SyncReport {
    pub groups: usize,
    /// Threads moved into their group this tick.
    pub moved: usize,
    pub errors: Vec<crate::error::EngineError>,
}

/// Brings the groups in line: schemata written where they differ, missing
/// threads moved in. A container that vanished meanwhile is skipped.
pub fn sync(
    groups: &BTreeMap<&'static str, Group>,
    rdt: &Resctrl,
    cgroups: &Cgroups,
) -> SyncReport {
    let mut r = SyncReport::default();
    for (name, g) in groups {
        match join(name, &g.schemata, &g.containers, rdt, cgroups) {
            Ok(n) => {
                r.groups += 1;
                r.moved += n;
            }
            Err(e) => r.errors.push(crate::error::EngineError::Resctrl {
                group: name.to_string(),
                error: e.to_string(),
            }),
        }
    }
    r
}

/// Puts group `name` in line (its schemata) and moves every thread of
/// `containers` that is not in it yet into it: the one assigner, used by the
/// tick and by the hook at container start. Threads, not processes: `tasks`
/// (v1) / `cgroup.threads` (v2), since resctrl assigns each thread on its own
/// and a process's other threads would stay in the default group. Returns the
/// threads moved; a container that exited meanwhile is skipped.
pub fn join(
    name: &str,
    schemata: &str,
    containers: &[CgroupPath],
    rdt: &Resctrl,
    cgroups: &Cgroups,
) -> Result<usize, qoslet_cgroups::CgroupError> {
    let threads_file = if cgroups.host().is_v2() {
        "cgroup.threads"
    } else {
        "tasks"
    };
    let dir = rdt.ensure_group(name, schemata)?;
    let present: BTreeSet<u32> = qoslet_cgroups::fs::read(&dir.join("tasks"))?
        .split_whitespace()
        .filter_map(|t| t.parse().ok())
        .collect();
    let mut missing = Vec::new();
    for cg in containers {
        if let Ok(t) = cgroups.read(cg, "cpu", threads_file) {
            missing.extend(
                t.split_whitespace()
                    .filter_map(|t| t.parse::<u32>().ok())
                    .filter(|t| !present.contains(t)),
            );
        }
    }
    rdt.assign(&dir, &missing)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reconcile::Container;

    fn tree(tag: &str, files: &[(&str, &str)]) -> std::path::PathBuf {
        crate::testing::tree(&format!("rdt-{tag}"), files)
    }

    #[test]
    fn be_threads_join_the_be_group_and_schemata_are_put_back() {
        let d = tree(
            "sync",
            &[
                ("resctrl/schemata", "L3:0=7ff\nMB:0=100\n"),
                ("resctrl/tasks", "1\n2\n"),
                ("resctrl/info/L3/cbm_mask", "7ff\n"),
                ("resctrl/info/L3/num_closids", "16\n"),
                ("resctrl/info/MB/min_bandwidth", "10\n"),
                ("resctrl/info/MB/bandwidth_gran", "10\n"),
                // the kernel makes these when the group directory is created
                ("resctrl/BE/schemata", "L3:0=7ff\nMB:0=100\n"),
                ("resctrl/BE/tasks", "41\n"),
                ("cgroup/cpu/cgroup.procs", ""),
                (
                    "cgroup/cpu/kubepods/besteffort/podb/c1/tasks",
                    "41\n42\n43\n",
                ),
            ],
        );
        let rdt = Resctrl::detect(&d.join("resctrl")).unwrap().unwrap();
        let cg = Cgroups::detect(&d.join("cgroup")).unwrap();
        let mut policy = ResourceQosStrategy::default();
        policy.be_class.resctrl_qos.enable = true;
        let pod = |class, id: &str| Pod {
            id: id.into(),
            class,
            by_label: true,
            trusted: true,
            kube: None,
            cgroup: CgroupPath::parse(&format!("/kubepods/besteffort/pod{id}")).unwrap(),
            annotations: Default::default(),
            spec_batch: None,
            limits: Default::default(),
            sandbox: None,
            cpu_cores: 0.0,
            containers: vec![
                Container {
                    entry: qoslet_state::inventory::ContainerEntry {
                        id: "c1".into(),
                        name: "w".into(),
                        cgroup: CgroupPath::parse(&format!("/kubepods/besteffort/pod{id}/c1"))
                            .unwrap(),
                        memory_limit: 0,
                        cpu_quota: 0,
                        cpu_period: 100_000,
                        cpuset_cpus: String::new(),
                        oom_score_adj: 0,
                        cpu_shares: 0,
                    },
                    cpu_cores: 0.0,
                    throttled_ratio: 0.0,
                },
                Container {
                    entry: qoslet_state::inventory::ContainerEntry {
                        id: "gone".into(),
                        name: "x".into(),
                        cgroup: CgroupPath::parse(&format!("/kubepods/besteffort/pod{id}/gone"))
                            .unwrap(),
                        memory_limit: 0,
                        cpu_quota: 0,
                        cpu_period: 100_000,
                        cpuset_cpus: String::new(),
                        oom_score_adj: 0,
                        cpu_shares: 0,
                    },
                    cpu_cores: 0.0,
                    throttled_ratio: 0.0,
                },
            ],
        };
        let pods = [pod(QosClass::Be, "b"), pod(QosClass::Ls, "l")];
        let g = desired(&pods, &policy, &rdt);
        assert_eq!(
            g.keys().copied().collect::<Vec<_>>(),
            ["BE"],
            "LS resctrl is off"
        );
        assert_eq!(g["BE"].schemata, "L3:0=f\nMB:0=100\n");
        let r = sync(&g, &rdt, &cg);
        assert!(r.errors.is_empty(), "{r:?}");
        // a file stands in for the kernel's tasks file: each write replaces it
        assert_eq!(r.moved, 2, "42 and 43 (41 is in already)");
        assert_eq!(
            std::fs::read_to_string(d.join("resctrl/BE/schemata")).unwrap(),
            "L3:0=f\n",
            "only the schemata line that differed was written"
        );
        std::fs::remove_dir_all(&d).unwrap();
    }
}
