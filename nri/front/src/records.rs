//! NRI -> state: the store's records built from what the runtime tells the
//! plugin, and the isolation room's patch put into an NRI adjustment. The one
//! place NRI messages become records (the CRI proxy has its own beside it).
//!
//! Conventions: NRI wraps scalars (no message: unset), CRI and the store use
//! 0 for "unset"; an NRI adjustment sets only the fields the patch has.

use std::collections::{BTreeMap, HashMap};

use qoslet_isolation::{ResourcePatch, Resources, ANNOTATION_REQUESTED};
use qoslet_nri::api;
use qoslet_state::store::{
    now_nanos, ContainerRecord, ContainerState, PodRecord, PodState, Source,
};

/// The annotation kubelet puts on every container with its restart count.
const RESTART_COUNT: &str = "io.kubernetes.container.restartCount";

/// NRI's `LinuxResources` (and the container's OOM score) as the store keeps them.
pub fn resources(r: &api::LinuxResources, oom_score_adj: Option<&api::OptionalInt>) -> Resources {
    let cpu = r.cpu.as_ref();
    let mem = r.memory.as_ref();
    let i64_of = |v: Option<&api::OptionalInt64>| v.map_or(0, |v| v.value);
    Resources {
        cpu_period: cpu
            .and_then(|c| c.period.as_ref())
            .map_or(0, |v| i64::try_from(v.value).unwrap_or(i64::MAX)),
        cpu_quota: i64_of(cpu.and_then(|c| c.quota.as_ref())),
        cpu_shares: cpu
            .and_then(|c| c.shares.as_ref())
            .map_or(0, |v| i64::try_from(v.value).unwrap_or(i64::MAX)),
        memory_limit_in_bytes: i64_of(mem.and_then(|m| m.limit.as_ref())),
        memory_swap_limit_in_bytes: i64_of(mem.and_then(|m| m.swap.as_ref())),
        oom_score_adj: oom_score_adj.map_or(0, |v| v.value),
        cpuset_cpus: cpu.map(|c| c.cpus.clone()).unwrap_or_default(),
        cpuset_mems: cpu.map(|c| c.mems.clone()).unwrap_or_default(),
        unified: sorted(&r.unified),
    }
}

/// A container's own resources as the runtime reports them.
pub fn container_resources(c: &api::Container) -> Option<Resources> {
    let linux = c.linux.as_ref()?;
    let r = linux.resources.as_ref()?;
    Some(resources(r, linux.oom_score_adj.as_ref()))
}

/// An NRI `ContainerState`.
pub fn container_state(s: i32) -> ContainerState {
    match api::ContainerState::try_from(s) {
        Ok(api::ContainerState::ContainerCreated) => ContainerState::Created,
        Ok(api::ContainerState::ContainerRunning) | Ok(api::ContainerState::ContainerPaused) => {
            ContainerState::Running
        }
        Ok(api::ContainerState::ContainerStopped) => ContainerState::Exited,
        _ => ContainerState::Unknown,
    }
}

/// A pod as the runtime describes it (its sandbox runs: NRI reports no
/// other pods).
pub fn pod(p: &api::PodSandbox) -> PodRecord {
    let linux = p.linux.as_ref();
    PodRecord {
        id: p.id.clone(),
        name: p.name.clone(),
        namespace: p.namespace.clone(),
        uid: p.uid.clone(),
        attempt: 0,
        labels: sorted(&p.labels),
        annotations: sorted(&p.annotations),
        cgroup_parent: linux.map(|l| l.cgroup_parent.clone()).unwrap_or_default(),
        runtime_handler: p.runtime_handler.clone(),
        overhead: linux
            .and_then(|l| l.pod_overhead.as_ref())
            .map(|r| resources(r, None)),
        resources: linux
            .and_then(|l| l.pod_resources.as_ref())
            .map(|r| resources(r, None)),
        state: PodState::Ready,
        created_at: now_nanos(),
        priority: None,
        source: Source::Nri,
        applied: BTreeMap::new(),
    }
}

/// A container as the runtime describes it. `requested` is kubelet's own
/// request: the one qoslet recorded on the container when it patched it,
/// else the container's resources.
pub fn container(c: &api::Container) -> ContainerRecord {
    let requested = c
        .annotations
        .get(ANNOTATION_REQUESTED)
        .and_then(|j| serde_json::from_str::<Resources>(j).ok())
        .or_else(|| container_resources(c));
    ContainerRecord {
        id: c.id.clone(),
        pod_id: c.pod_sandbox_id.clone(),
        name: c.name.clone(),
        attempt: c
            .annotations
            .get(RESTART_COUNT)
            .and_then(|v| v.parse().ok())
            .unwrap_or(0),
        image: String::new(),
        labels: sorted(&c.labels),
        annotations: sorted(&c.annotations),
        requested,
        state: match container_state(c.state) {
            // a container being created is reported before it has a state
            ContainerState::Unknown => ContainerState::Created,
            s => s,
        },
        created_at: if c.created_at > 0 {
            c.created_at
        } else {
            now_nanos()
        },
        source: Source::Nri,
        applied: BTreeMap::new(),
    }
}

/// The patch as NRI resources: only the fields it sets.
pub fn adjustment(p: &ResourcePatch) -> api::LinuxResources {
    let u64_of = |v: i64| api::OptionalUInt64 {
        value: u64::try_from(v).unwrap_or(0),
    };
    let cpu = (p.cpu_shares.is_some()
        || p.cpu_quota.is_some()
        || p.cpu_period.is_some()
        || p.cpuset_cpus.is_some())
    .then(|| api::LinuxCpu {
        shares: p.cpu_shares.map(u64_of),
        quota: p.cpu_quota.map(|v| api::OptionalInt64 { value: v }),
        period: p.cpu_period.map(u64_of),
        cpus: p.cpuset_cpus.clone().unwrap_or_default(),
        mems: String::new(),
    });
    let memory = p.memory_limit_in_bytes.map(|v| api::LinuxMemory {
        limit: Some(api::OptionalInt64 { value: v }),
        ..Default::default()
    });
    api::LinuxResources {
        memory,
        cpu,
        unified: p
            .unified
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        ..Default::default()
    }
}

/// Whether resources `have` already hold every setting of patch `p`. The
/// unified keys count only when the runtime reports any: NRI before v0.10
/// (containerd 1.7, 2.0, 2.1) never copies `unified` into what it sends, so
/// every container would look drifted and be updated at every Synchronize
/// (the settings themselves are written at StartContainer and by the engine).
pub fn holds(have: &Resources, p: &ResourcePatch) -> bool {
    p.cpu_shares.is_none_or(|v| v == have.cpu_shares)
        && p.cpu_quota.is_none_or(|v| v == have.cpu_quota)
        && p.cpu_period.is_none_or(|v| v == have.cpu_period)
        && p.memory_limit_in_bytes
            .is_none_or(|v| v == have.memory_limit_in_bytes)
        && p.cpuset_cpus
            .as_ref()
            .is_none_or(|v| *v == have.cpuset_cpus)
        && (have.unified.is_empty()
            || p.unified
                .iter()
                .all(|(k, v)| have.unified.get(k) == Some(v)))
}

fn sorted(m: &HashMap<String, String>) -> BTreeMap<String, String> {
    m.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unset_is_zero_and_zero_stays_set() {
        let r = resources(
            &api::LinuxResources {
                cpu: Some(api::LinuxCpu {
                    shares: Some(api::OptionalUInt64 { value: 2 }),
                    period: Some(api::OptionalUInt64 { value: 100_000 }),
                    cpus: "0-1".into(),
                    ..Default::default()
                }),
                ..Default::default()
            },
            Some(&api::OptionalInt { value: 1000 }),
        );
        assert_eq!(
            (
                r.cpu_shares,
                r.cpu_quota,
                r.cpu_period,
                r.memory_limit_in_bytes
            ),
            (2, 0, 100_000, 0)
        );
        assert_eq!((r.oom_score_adj, r.cpuset_cpus.as_str()), (1000, "0-1"));
        // a patch's quota of 0 is not "unset" on the wire
        let a = adjustment(&ResourcePatch {
            cpu_quota: Some(0),
            ..Default::default()
        });
        assert_eq!(a.cpu.unwrap().quota, Some(api::OptionalInt64 { value: 0 }));
        assert!(adjustment(&ResourcePatch::default()) == api::LinuxResources::default());
    }

    #[test]
    fn records_take_kubelets_request_from_qoslets_annotation() {
        let mut c = api::Container {
            id: "c1".into(),
            pod_sandbox_id: "p1".into(),
            name: "app".into(),
            state: api::ContainerState::ContainerRunning as i32,
            linux: Some(api::LinuxContainer {
                resources: Some(api::LinuxResources {
                    cpu: Some(api::LinuxCpu {
                        quota: Some(api::OptionalInt64 { value: 200_000 }),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        c.annotations.insert(RESTART_COUNT.into(), "3".into());
        let r = container(&c);
        assert_eq!(
            (r.attempt, r.state, r.source),
            (3, ContainerState::Running, Source::Nri)
        );
        assert_eq!(r.requested.unwrap().cpu_quota, 200_000);
        c.annotations
            .insert(ANNOTATION_REQUESTED.into(), r#"{"cpu_shares":2}"#.into());
        let r = container(&c);
        assert_eq!(r.requested.as_ref().unwrap().cpu_quota, 0);
        assert_eq!(r.requested.unwrap().cpu_shares, 2);
        // hostile values: a restart count that is no number
        c.annotations.insert(RESTART_COUNT.into(), "-1; rm".into());
        assert_eq!(container(&c).attempt, 0);
    }

    #[test]
    fn holds_compares_only_what_the_patch_sets() {
        let have = Resources {
            cpu_shares: 2,
            cpu_quota: 200_000,
            ..Default::default()
        };
        let p = ResourcePatch {
            cpu_quota: Some(200_000),
            ..Default::default()
        };
        assert!(holds(&have, &p));
        let p = ResourcePatch {
            cpu_quota: Some(100_000),
            ..Default::default()
        };
        assert!(!holds(&have, &p));
        // unified keys: compared only when the runtime reports unified at all
        let p = ResourcePatch {
            unified: [("memory.min".to_string(), "1048576".to_string())].into(),
            ..Default::default()
        };
        assert!(holds(&have, &p), "NRI < v0.10 reports no unified map");
        let mut have = have;
        have.unified.insert("memory.min".into(), "0".into());
        assert!(!holds(&have, &p));
        have.unified.insert("memory.min".into(), "1048576".into());
        assert!(holds(&have, &p));
    }
}
