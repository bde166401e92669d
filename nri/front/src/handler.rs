//! The plugin's events as the isolation room's events, with the store kept
//! as the CRI proxy keeps it (the same records, the same decisions for the
//! same pod spec).
//!
//! | NRI event | store | isolation |
//! |---|---|---|
//! | Synchronize | runtime's pods and containers adopted (`Source::Nri`) | drift: an update where a container lacks its class's settings; pod and container writes for what qoslet did not know, after the answer |
//! | RunPodSandbox | pod added | `pod_started` (pod cgroup writes) |
//! | CreateContainer | container added | `create_container` -> the adjustment; `container_created` |
//! | StartContainer | running | `container_started` (cgroup writes, resctrl) |
//! | UpdateContainer | kubelet's resources kept | `update_container` -> an update of the same container |
//! | StopContainer / RemoveContainer | exited / removed | |
//! | StopPodSandbox / RemovePodSandbox | not ready / removed | `pod_removed` |
//!
//! One refusal only: admission under node pressure (the eviction loop's
//! view): the first CreateContainer of a BE pod's sandbox while the node
//! reports a pressure condition fails with the condition, signal, value and
//! threshold (the NRI form of kubelet's pod admission: a pod's later
//! containers, restarts included, are not refused).
//! Anything else that fails is logged and counted, and the pod runs as
//! kubelet asked (fail-open).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use qoslet_agent::eviction::{Admission, EvictionView};
use qoslet_hooks::class::{classify, ClassSource, Trust};
use qoslet_isolation::Isolation;
use qoslet_nri::{api, Event, Handler, Refusal, RuntimeInfo, StateChange};
use qoslet_state::store::{ContainerState, Store};
use tracing::{debug, info, warn};

use crate::records;

/// gRPC's RESOURCE_EXHAUSTED: what kubelet sees for a refused container.
const RESOURCE_EXHAUSTED: i32 = 8;

/// The NRI front end's handler.
pub struct NriHandler {
    store: Store,
    /// `None`: isolation is off (`isolation: false`): the store is kept, nothing applied.
    iso: Option<Arc<Isolation>>,
    /// Isolation events that failed (a write refused, a cgroup missing).
    pub errors: AtomicU64,
    /// Containers a Synchronize adopted that qoslet did not know.
    pub adopted: AtomicU64,
    /// Admission under node pressure (`None`: eviction off).
    admission: Option<(Arc<EvictionView>, Trust)>,
}

impl NriHandler {
    pub fn new(store: Store, iso: Option<Arc<Isolation>>) -> NriHandler {
        NriHandler {
            store,
            iso,
            errors: AtomicU64::new(0),
            adopted: AtomicU64::new(0),
            admission: None,
        }
    }

    /// Refuses BE containers while the eviction loop reports node pressure.
    pub fn with_admission(mut self, view: Arc<EvictionView>, trust: Trust) -> Self {
        self.admission = Some((view, trust));
        self
    }

    /// Admission of pod `p`'s container (see the module docs).
    fn admit(&self, p: &api::PodSandbox) -> Result<(), Refusal> {
        let Some((view, trust)) = &self.admission else {
            return Ok(());
        };
        // kubelet admits a pod once, before its sandbox: a pod that already
        // has a container here (an init container, a restart) was admitted
        if self
            .store
            .read_all(|_, containers| containers.values().any(|c| c.pod_id == p.id))
        {
            return Ok(());
        }
        let labels = p
            .labels
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let parent = p
            .linux
            .as_ref()
            .map(|l| l.cgroup_parent.as_str())
            .unwrap_or_default();
        let d = classify(&labels, &p.namespace, parent, trust);
        if d.source == ClassSource::Skipped {
            return Ok(());
        }
        let critical = Admission::critical_by_annotations(
            p.annotations.iter().map(|(k, v)| (k.as_str(), v.as_str())),
        );
        view.admit(&Admission {
            class: d.class,
            kube: d.kube,
            namespace: &p.namespace,
            name: &p.name,
            uid: &p.uid,
            critical,
        })
        .map_err(|msg| Refusal::with_code(RESOURCE_EXHAUSTED, msg))
    }

    fn failed(&self, what: &str, id: &str, e: &dyn std::fmt::Display) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        warn!(event = what, id, error = %e, "isolation event failed; the pod runs as kubelet asked");
    }

    /// The store's pod `p`, added from the message when the store lacks it.
    fn pod_of(&self, p: &api::PodSandbox) -> qoslet_state::store::PodRecord {
        match self.store.pod(&p.id) {
            Some(rec) => rec,
            None => {
                let rec = records::pod(p);
                self.store.upsert_pod(rec.clone());
                rec
            }
        }
    }

    /// The update that gives container `c` its class's settings where it
    /// lacks them (`have`: its resources as the runtime has them).
    fn drift(
        &self,
        iso: &Isolation,
        id: &str,
        have: &qoslet_isolation::Resources,
    ) -> Option<api::ContainerUpdate> {
        let Some(patch) = iso.update_container(&self.store, id, None) else {
            debug!(container = %id, "drift: not qoslet's to change");
            return None;
        };
        let holds = records::holds(have, &patch);
        debug!(container = %id, holds, ?patch, ?have, "drift check");
        (!holds).then(|| update_of(id, &patch))
    }
}

fn update_of(id: &str, patch: &qoslet_isolation::ResourcePatch) -> api::ContainerUpdate {
    api::ContainerUpdate {
        container_id: id.to_string(),
        linux: Some(api::LinuxContainerUpdate {
            resources: Some(records::adjustment(patch)),
        }),
        // an update of a container that just went away must not fail the event
        ignore_failure: true,
    }
}

impl Handler for NriHandler {
    fn configure(&self, rt: &RuntimeInfo) -> Result<(), Refusal> {
        info!(runtime = %rt.name, version = %rt.version, "NRI front end configured");
        Ok(())
    }

    fn synchronize(
        &self,
        pods: Vec<api::PodSandbox>,
        containers: Vec<api::Container>,
    ) -> Result<Vec<api::ContainerUpdate>, Refusal> {
        let (seq, before) = self.store.snapshot_for_resync();
        let known_pods: std::collections::HashSet<&str> =
            before.pods.iter().map(|p| p.id.as_str()).collect();
        let known: std::collections::HashSet<&str> =
            before.containers.iter().map(|c| c.id.as_str()).collect();
        let after = qoslet_state::store::Snapshot {
            pods: pods.iter().map(records::pod).collect(),
            containers: containers.iter().map(records::container).collect(),
        };
        let new_pods: Vec<String> = pods
            .iter()
            .filter(|p| !known_pods.contains(p.id.as_str()))
            .map(|p| p.id.clone())
            .collect();
        let new_running: Vec<String> = after
            .containers
            .iter()
            .filter(|c| !known.contains(c.id.as_str()) && c.state == ContainerState::Running)
            .map(|c| c.id.clone())
            .collect();
        let (added, removed) = self.store.apply_resync(seq, &before, after);
        self.adopted.fetch_add(
            containers.len().saturating_sub(known.len()) as u64,
            Ordering::Relaxed,
        );
        info!(
            pods = pods.len(),
            containers = containers.len(),
            added,
            removed,
            "synchronized with the runtime"
        );
        let Some(iso) = &self.iso else {
            return Ok(vec![]);
        };
        let mut updates = vec![];
        for c in &containers {
            let state = records::container_state(c.state);
            if !matches!(state, ContainerState::Running | ContainerState::Created) {
                continue;
            }
            let have = records::container_resources(c).unwrap_or_default();
            if let Some(u) = self.drift(iso, &c.id, &have) {
                debug!(container = %c.id, "drift: the class's settings sent again");
                updates.push(u);
            }
        }
        // what qoslet did not know gets its direct writes, after the answer
        // (the runtime gives the whole Synchronize one request timeout)
        if !new_pods.is_empty() || !new_running.is_empty() {
            let (iso, store) = (iso.clone(), self.store.clone());
            let errors = Arc::new(AtomicU64::new(0));
            let e = errors.clone();
            let spawned = std::thread::Builder::new()
                .name("qoslet-nri-adopt".into())
                .spawn(move || {
                    for p in &new_pods {
                        if let Err(err) = iso.pod_started(&store, p) {
                            e.fetch_add(1, Ordering::Relaxed);
                            warn!(pod = %p, error = %err, "adopted pod: settings not written");
                        }
                    }
                    for c in &new_running {
                        if let Err(err) = iso.container_started(&store, c) {
                            e.fetch_add(1, Ordering::Relaxed);
                            warn!(container = %c, error = %err, "adopted container: settings not written");
                        }
                    }
                });
            if let Err(e) = spawned {
                self.failed("synchronize", "", &e);
            }
        }
        Ok(updates)
    }

    fn create_container(
        &self,
        req: api::CreateContainerRequest,
    ) -> Result<api::CreateContainerResponse, Refusal> {
        let (Some(p), Some(c)) = (req.pod, req.container) else {
            return Ok(Default::default());
        };
        if p.id.is_empty() || c.id.is_empty() {
            return Ok(Default::default());
        }
        self.admit(&p)?;
        let pod = self.pod_of(&p);
        let mut rec = records::container(&c);
        // kubelet's own request: what the runtime has now, before any patch
        rec.requested = records::container_resources(&c);
        let requested = rec.requested.clone();
        let created = self
            .iso
            .as_ref()
            .and_then(|iso| iso.create_container(&self.store, &pod, &c.name, requested.as_ref()));
        let Some(created) = created else {
            self.store.upsert_container(rec);
            return Ok(Default::default());
        };
        rec.annotations.extend(
            created
                .annotations
                .iter()
                .map(|(k, v)| (k.clone(), v.clone())),
        );
        let annotations: HashMap<String, String> = rec
            .annotations
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        self.store.upsert_container(rec);
        if let Some(iso) = &self.iso {
            iso.container_created(
                &self.store,
                &p.id,
                &c.id,
                &c.name,
                &annotations,
                requested.as_ref(),
            );
        }
        let linux = (!created.patch.is_empty()).then(|| api::LinuxContainerAdjustment {
            resources: Some(records::adjustment(&created.patch)),
        });
        Ok(api::CreateContainerResponse {
            adjust: Some(api::ContainerAdjustment {
                annotations: created.annotations.into_iter().collect(),
                linux,
            }),
            update: vec![],
            evict: vec![],
        })
    }

    fn create_abandoned(&self, container_id: &str) {
        // created without the adjustment: forget what the call recorded; its
        // StartContainer adopts it as a container qoslet did not see created
        if !container_id.is_empty() && self.store.remove_container(container_id).is_some() {
            warn!(container = %container_id, "CreateContainer answered late (no change): its record is dropped");
        }
    }

    fn update_container(
        &self,
        req: api::UpdateContainerRequest,
    ) -> Result<api::UpdateContainerResponse, Refusal> {
        let Some(c) = req.container else {
            return Ok(Default::default());
        };
        let update = req.linux_resources.as_ref().map(|r| {
            let oom = c.linux.as_ref().and_then(|l| l.oom_score_adj.as_ref());
            records::resources(r, oom)
        });
        let patch = self
            .iso
            .as_ref()
            .and_then(|iso| iso.update_container(&self.store, &c.id, update.as_ref()));
        // kubelet's update must not undo the class's settings; but an update
        // that already holds them gets none back (the runtime would replace
        // kubelet's request with its NRI round trip, which drops fields)
        let patch = patch.filter(|p| !update.as_ref().is_some_and(|u| records::holds(u, p)));
        if let Some(u) = update {
            self.store.set_container_resources(&c.id, u);
        }
        Ok(api::UpdateContainerResponse {
            update: patch.map(|p| update_of(&c.id, &p)).into_iter().collect(),
            evict: vec![],
        })
    }

    fn stop_container(
        &self,
        req: api::StopContainerRequest,
    ) -> Result<api::StopContainerResponse, Refusal> {
        if let Some(c) = req.container {
            self.store
                .set_container_state(&c.id, ContainerState::Exited);
        }
        Ok(Default::default())
    }

    fn state_change(&self, ch: StateChange) -> Result<(), Refusal> {
        let pod = ch.pod.as_ref();
        let ctr = ch.container.as_ref();
        match ch.event {
            Some(Event::RunPodSandbox) => {
                let Some(p) = pod.filter(|p| !p.id.is_empty()) else {
                    return Ok(());
                };
                self.store.upsert_pod(records::pod(p));
                if let Some(iso) = &self.iso {
                    if let Err(e) = iso.pod_started(&self.store, &p.id) {
                        self.failed("run_pod_sandbox", &p.id, &e);
                    }
                }
            }
            Some(Event::StartContainer) => {
                let Some(c) = ctr.filter(|c| !c.id.is_empty()) else {
                    return Ok(());
                };
                if !self.store.has_container(&c.id) {
                    // created while qoslet was away: known from here on
                    if let Some(p) = pod {
                        self.pod_of(p);
                    }
                    self.store.upsert_container(records::container(c));
                }
                self.store
                    .set_container_state(&c.id, ContainerState::Running);
                if let Some(iso) = &self.iso {
                    if let Err(e) = iso.container_started(&self.store, &c.id) {
                        self.failed("start_container", &c.id, &e);
                    }
                }
            }
            Some(Event::StopContainer) => {
                if let Some(c) = ctr {
                    self.store
                        .set_container_state(&c.id, ContainerState::Exited);
                }
            }
            Some(Event::RemoveContainer) => {
                if let Some(c) = ctr {
                    self.store.remove_container(&c.id);
                }
            }
            Some(Event::StopPodSandbox) => {
                if let Some(p) = pod {
                    self.store.set_pod_stopped(&p.id);
                }
            }
            Some(Event::RemovePodSandbox) => {
                if let Some(p) = pod {
                    self.store.remove_pod(&p.id);
                    if let Some(iso) = &self.iso {
                        iso.pod_removed(&p.id);
                    }
                }
            }
            other => debug!(event = ?other, "NRI event not used"),
        }
        Ok(())
    }

    fn shutdown(&self) {
        info!("the runtime asked the NRI plugin to shut down");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use qoslet_cgroups::memfs::MemFs;
    use qoslet_isolation::{ANNOTATION_APPLIED, ANNOTATION_CLASS, ANNOTATION_REQUESTED};

    const POD_DIR: &str = "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1.slice";

    /// The proxy adapter's test case (`proxy/src/isolation.rs`) in NRI's
    /// shapes: the same pod spec gets the same settings, as an adjustment.
    fn setup() -> (Arc<MemFs>, NriHandler, Store) {
        let m = MemFs::new();
        for (f, c) in [
            ("cpu.idle", "0\n"),
            ("cpu.weight", "1\n"),
            ("cpu.max", "max 100000\n"),
            ("memory.max", "max\n"),
            ("memory.min", "0\n"),
            ("memory.low", "0\n"),
            ("memory.high", "max\n"),
        ] {
            m.set(&format!("{POD_DIR}/{f}"), c);
        }
        let cgroups = m.v2(qoslet_cgroups::Features {
            cpu_idle: true,
            memory_qos: true,
            ..Default::default()
        });
        let policy: qoslet_hooks::policy::ResourceQosStrategy = serde_json::from_str(
            r#"{"beClass":{"cpuQOS":{"enable":true},"memoryQOS":{"enable":true,"minLimitPercent":50,"lowLimitPercent":100}}}"#,
        )
        .unwrap();
        let iso = Isolation::new(
            Some(cgroups),
            None,
            policy,
            Default::default(),
            qoslet_hooks::Trust {
                control_plane: true,
                ..Default::default()
            },
            Default::default(),
        );
        let store = Store::new();
        (
            m,
            NriHandler::new(store.clone(), Some(Arc::new(iso))),
            store,
        )
    }

    fn pod() -> api::PodSandbox {
        api::PodSandbox {
            id: "p1".into(),
            name: "batch".into(),
            uid: "u1".into(),
            annotations: [(
                qoslet_hooks::batch::ANNOTATION_EXTENDED_RESOURCE_SPEC.to_string(),
                r#"{"containers":{"app":{"requests":{"kubernetes.io/batch-cpu":"1000","kubernetes.io/batch-memory":"64Mi"},"limits":{"kubernetes.io/batch-cpu":"2000","kubernetes.io/batch-memory":"128Mi"}}}}"#.to_string(),
            )]
            .into(),
            linux: Some(api::LinuxPodSandbox {
                cgroup_parent: format!("/{POD_DIR}"),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn container(id: &str) -> api::Container {
        api::Container {
            id: id.into(),
            pod_sandbox_id: "p1".into(),
            name: "app".into(),
            linux: Some(api::LinuxContainer {
                resources: Some(api::LinuxResources {
                    cpu: Some(api::LinuxCpu {
                        shares: Some(api::OptionalUInt64 { value: 2 }),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                oom_score_adj: Some(api::OptionalInt { value: 1000 }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// Admission in NRI mode: under memory pressure a new BE pod's first
    /// container is refused with RESOURCE_EXHAUSTED and the figures; an LS
    /// pod's is not, nor a pod's that was admitted before.
    #[test]
    fn a_be_container_is_refused_under_pressure() {
        use qoslet_agent::eviction::{EvictionView, Met};
        let (_m, h, store) = setup();
        let view = Arc::new(EvictionView::default());
        let h = h.with_admission(view.clone(), qoslet_hooks::Trust::default());
        let create = |p: api::PodSandbox| {
            h.create_container(api::CreateContainerRequest {
                pod: Some(p),
                container: Some(container("c9")),
            })
        };
        assert!(create(pod()).is_ok(), "no pressure");
        view.set_pressure(
            vec![qoslet_eviction::Condition::MemoryPressure],
            vec![Met {
                signal: qoslet_eviction::Signal::MemoryAvailable,
                observed: 100 << 20,
                threshold: 200 << 20,
                hard: true,
            }],
        );
        // p1 has a container already (admitted before the pressure): its
        // next one (a restart, the main container after an init one) is not refused
        assert!(create(pod()).is_ok(), "an admitted pod's container refused");
        let mut fresh = pod();
        fresh.id = "p3".into();
        fresh.uid = "u3".into();
        let r = create(fresh).unwrap_err();
        assert_eq!(r.code, RESOURCE_EXHAUSTED);
        assert!(
            r.message.contains("memory.available 100Mi < 200Mi"),
            "{}",
            r.message
        );
        let mut ls = pod();
        ls.id = "p2".into();
        ls.linux.as_mut().unwrap().cgroup_parent = "/kubepods/burstable/podp2".into();
        assert!(create(ls).is_ok(), "an LS pod refused");
        let _ = store;
    }

    #[test]
    fn nri_events_carry_the_rooms_decisions() {
        let (m, h, store) = setup();
        h.state_change(StateChange {
            event: Some(Event::RunPodSandbox),
            pod: Some(pod()),
            container: None,
        })
        .unwrap();
        assert_eq!(m.at(&format!("{POD_DIR}/cpu.idle")).unwrap(), "1");
        let p = store.pod("p1").unwrap();
        assert_eq!((p.applied["class"].as_str(), p.uid.as_str()), ("BE", "u1"));
        assert_eq!(p.source, qoslet_state::store::Source::Nri);

        let r = h
            .create_container(api::CreateContainerRequest {
                pod: Some(pod()),
                container: Some(container("c1")),
            })
            .unwrap();
        let adj = r.adjust.unwrap();
        let res = adj.linux.unwrap().resources.unwrap();
        let cpu = res.cpu.unwrap();
        assert_eq!(cpu.quota, Some(api::OptionalInt64 { value: 200_000 }));
        assert_eq!(
            res.memory.unwrap().limit,
            Some(api::OptionalInt64 { value: 128 << 20 })
        );
        assert_eq!(res.unified["memory.min"], (32u64 << 20).to_string());
        assert_eq!(adj.annotations[ANNOTATION_CLASS], "BE");
        assert!(adj.annotations[ANNOTATION_APPLIED].contains("memory.min"));
        assert!(adj.annotations[ANNOTATION_REQUESTED].contains("\"oom_score_adj\":1000"));
        let c = store.container("c1").unwrap();
        assert_eq!(c.applied["class"], "BE", "{:?}", c.applied);
        assert_eq!(c.requested.unwrap().cpu_shares, 2, "kubelet's own request");

        // kubelet's update (cpuset only) gets the class's settings back
        let u = h
            .update_container(api::UpdateContainerRequest {
                pod: Some(pod()),
                container: Some(container("c1")),
                linux_resources: Some(api::LinuxResources {
                    cpu: Some(api::LinuxCpu {
                        cpus: "0-1".into(),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
            })
            .unwrap();
        assert_eq!(u.update.len(), 1);
        let res = u.update[0].linux.clone().unwrap().resources.unwrap();
        assert_eq!(
            res.cpu.unwrap().quota,
            Some(api::OptionalInt64 { value: 200_000 })
        );
        assert_eq!(res.unified["memory.low"], (64u64 << 20).to_string());
        assert_eq!(
            store
                .container("c1")
                .unwrap()
                .requested
                .unwrap()
                .cpuset_cpus,
            "0-1"
        );

        // stop and remove: the store forgets
        h.stop_container(api::StopContainerRequest {
            pod: None,
            container: Some(container("c1")),
        })
        .unwrap();
        assert_eq!(store.container("c1").unwrap().state, ContainerState::Exited);
        for (event, p, c) in [
            (Event::RemoveContainer, None, Some(container("c1"))),
            (Event::RemovePodSandbox, Some(pod()), None),
        ] {
            h.state_change(StateChange {
                event: Some(event),
                pod: p,
                container: c,
            })
            .unwrap();
        }
        assert_eq!(store.counts(), (0, 0));
    }

    #[test]
    fn synchronize_adopts_and_sends_drift_once() {
        let (_m, h, store) = setup();
        let mut patched = container("c2");
        patched.state = api::ContainerState::ContainerRunning as i32;
        let mut bare = patched.clone();
        bare.id = "c3".into();
        // c2 already holds its class's settings (it was created through qoslet)
        patched.linux.as_mut().unwrap().resources = Some(api::LinuxResources {
            cpu: Some(api::LinuxCpu {
                shares: Some(api::OptionalUInt64 { value: 1024 }),
                quota: Some(api::OptionalInt64 { value: 200_000 }),
                period: Some(api::OptionalUInt64 { value: 100_000 }),
                ..Default::default()
            }),
            memory: Some(api::LinuxMemory {
                limit: Some(api::OptionalInt64 { value: 128 << 20 }),
                ..Default::default()
            }),
            unified: [
                ("memory.min".to_string(), (32u64 << 20).to_string()),
                ("memory.low".to_string(), (64u64 << 20).to_string()),
            ]
            .into(),
            ..Default::default()
        });
        patched.annotations.insert(
            ANNOTATION_REQUESTED.into(),
            r#"{"cpu_shares":2,"oom_score_adj":1000}"#.into(),
        );
        let updates = h.synchronize(vec![pod()], vec![patched, bare]).unwrap();
        assert_eq!(store.counts(), (1, 2));
        let ids: Vec<&str> = updates.iter().map(|u| u.container_id.as_str()).collect();
        assert_eq!(
            ids,
            ["c3"],
            "only the container created without qoslet drifted"
        );
        assert!(updates[0].ignore_failure);
        assert_eq!(
            store.container("c2").unwrap().requested.unwrap().cpu_shares,
            2
        );
    }
}
