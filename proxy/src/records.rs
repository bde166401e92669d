//! CRI -> state: the store's records built from what kubelet sends and what
//! the runtime reports, in CRI's shapes. The store itself knows no transport;
//! this adapter is the only place CRI messages become records (the NRI front
//! end has its own beside it).

use std::collections::{BTreeMap, HashMap};

use qoslet_proto::cri;
use qoslet_state::store::{
    now_nanos, ContainerRecord, ContainerState, PodRecord, PodState, Resources, Source,
};

/// CRI's `LinuxContainerResources` as the store keeps them.
pub fn resources(r: &cri::LinuxContainerResources) -> Resources {
    Resources {
        cpu_period: r.cpu_period,
        cpu_quota: r.cpu_quota,
        cpu_shares: r.cpu_shares,
        memory_limit_in_bytes: r.memory_limit_in_bytes,
        memory_swap_limit_in_bytes: r.memory_swap_limit_in_bytes,
        oom_score_adj: r.oom_score_adj,
        cpuset_cpus: r.cpuset_cpus.clone(),
        cpuset_mems: r.cpuset_mems.clone(),
        unified: sorted(&r.unified),
    }
}

/// A CRI `PodSandboxState`.
pub fn pod_state(s: i32) -> PodState {
    match cri::PodSandboxState::try_from(s) {
        Ok(cri::PodSandboxState::SandboxReady) => PodState::Ready,
        Ok(cri::PodSandboxState::SandboxNotready) => PodState::NotReady,
        _ => PodState::Unknown,
    }
}

/// A CRI `ContainerState`.
pub fn container_state(s: i32) -> ContainerState {
    match cri::ContainerState::try_from(s) {
        Ok(cri::ContainerState::ContainerCreated) => ContainerState::Created,
        Ok(cri::ContainerState::ContainerRunning) => ContainerState::Running,
        Ok(cri::ContainerState::ContainerExited) => ContainerState::Exited,
        _ => ContainerState::Unknown,
    }
}

/// A pod as kubelet asks for it in `RunPodSandbox`.
pub fn pod(id: &str, c: &cri::PodSandboxConfig, runtime_handler: &str) -> PodRecord {
    let md = c.metadata.clone().unwrap_or_default();
    let linux = c.linux.as_ref();
    PodRecord {
        id: id.to_string(),
        name: md.name,
        namespace: md.namespace,
        uid: md.uid,
        attempt: md.attempt,
        labels: sorted(&c.labels),
        annotations: sorted(&c.annotations),
        cgroup_parent: linux.map(|l| l.cgroup_parent.clone()).unwrap_or_default(),
        runtime_handler: runtime_handler.to_string(),
        overhead: linux.and_then(|l| l.overhead.as_ref()).map(resources),
        resources: linux.and_then(|l| l.resources.as_ref()).map(resources),
        state: PodState::Ready,
        created_at: now_nanos(),
        // CRI does not carry the pod's priority (the cluster side does)
        priority: None,
        source: Source::Kubelet,
        applied: BTreeMap::new(),
    }
}

/// A container as kubelet asks for it in `CreateContainer`.
pub fn container(id: &str, pod_id: &str, c: &cri::ContainerConfig) -> ContainerRecord {
    let md = c.metadata.clone().unwrap_or_default();
    ContainerRecord {
        id: id.to_string(),
        pod_id: pod_id.to_string(),
        name: md.name,
        attempt: md.attempt,
        image: image(&c.image),
        labels: sorted(&c.labels),
        annotations: sorted(&c.annotations),
        requested: c
            .linux
            .as_ref()
            .and_then(|l| l.resources.as_ref())
            .map(resources),
        state: ContainerState::Created,
        created_at: now_nanos(),
        source: Source::Kubelet,
        applied: BTreeMap::new(),
    }
}

/// The image a container was asked with, or reported with (empty: none).
pub fn image(spec: &Option<cri::ImageSpec>) -> String {
    spec.as_ref().map(|i| i.image.clone()).unwrap_or_default()
}

/// A CRI map (a hash map: its order is random) in the store's sorted form.
pub fn sorted(m: &HashMap<String, String>) -> BTreeMap<String, String> {
    m.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod_config(name: &str) -> cri::PodSandboxConfig {
        cri::PodSandboxConfig {
            metadata: Some(cri::PodSandboxMetadata {
                name: name.into(),
                uid: "u".into(),
                namespace: "ns".into(),
                attempt: 1,
            }),
            labels: [("a".to_string(), "b".to_string())].into(),
            linux: Some(cri::LinuxPodSandboxConfig {
                cgroup_parent: "/kubepods/burstable/podu".into(),
                resources: Some(cri::LinuxContainerResources {
                    cpu_shares: 100,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn records_what_kubelet_asked() {
        let p = pod("p1", &pod_config("web"), "runc");
        assert_eq!(
            (p.name.as_str(), p.namespace.as_str(), p.attempt),
            ("web", "ns", 1)
        );
        assert_eq!(p.cgroup_parent, "/kubepods/burstable/podu");
        assert_eq!(p.resources.as_ref().unwrap().cpu_shares, 100);
        assert_eq!(p.labels.get("a").map(String::as_str), Some("b"));
        let c = container(
            "c1",
            "p1",
            &cri::ContainerConfig {
                metadata: Some(cri::ContainerMetadata {
                    name: "app".into(),
                    attempt: 2,
                }),
                image: Some(cri::ImageSpec {
                    image: "busybox".into(),
                    ..Default::default()
                }),
                envs: vec![cri::KeyValue {
                    key: "K".into(),
                    value: "V".into(),
                }],
                linux: Some(cri::LinuxContainerConfig {
                    resources: Some(cri::LinuxContainerResources {
                        memory_limit_in_bytes: 1 << 20,
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            },
        );
        assert_eq!(
            (c.name.as_str(), c.attempt, c.image.as_str()),
            ("app", 2, "busybox")
        );
        let json = serde_json::to_string(&c).unwrap();
        assert!(
            !json.contains("\"V\"") && !json.contains("envs"),
            "envs (secrets) are never kept: {json}"
        );
        assert_eq!(c.requested.unwrap().memory_limit_in_bytes, 1 << 20);
    }

    #[test]
    fn states_and_resources_as_cri_says() {
        assert_eq!(
            pod_state(cri::PodSandboxState::SandboxReady as i32),
            PodState::Ready
        );
        assert_eq!(pod_state(99), PodState::Unknown);
        assert_eq!(
            container_state(cri::ContainerState::ContainerExited as i32),
            ContainerState::Exited
        );
        assert_eq!(container_state(-1), ContainerState::Unknown);
        let r = resources(&cri::LinuxContainerResources {
            cpu_quota: -1,
            unified: [("memory.high".to_string(), "max".to_string())].into(),
            ..Default::default()
        });
        assert_eq!(r.cpu_quota, -1);
        assert_eq!(
            r.unified.get("memory.high").map(String::as_str),
            Some("max")
        );
        assert_eq!(pod("p", &Default::default(), "").priority, None);
    }
}
