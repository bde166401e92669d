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
//! Never a refusal from here: a failed write is logged and counted, and the
//! pod runs as kubelet asked (fail-open).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use qoslet_isolation::Isolation;
use qoslet_nri::{api, Event, Handler, Refusal, RuntimeInfo, StateChange};
use qoslet_state::store::{ContainerState, Store};
use tracing::{debug, info, warn};

use crate::records;

/// The NRI front end's handler.
pub struct NriHandler {
    store: Store,
    /// `None`: isolation is off (`isolation: false`): the store is kept, nothing applied.
    iso: Option<Arc<Isolation>>,
    /// Isolation events that failed (a write refused, a cgroup missing).
    pub errors: AtomicU64,
    /// Containers a Synchronize adopted that qoslet did not know.
    pub adopted: AtomicU64,
}

impl NriHandler {
    pub fn new(store: Store, iso: Option<Arc<Isolation>>) -> NriHandler {
        NriHandler {
            store,
            iso,
            errors: AtomicU64::new(0),
            adopted: AtomicU64::new(0),
        }
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
        let pod = self.pod_of(&p);
        let mut rec = records::container(&c);
        // kubelet's own request: what the runtime has now, before any patch
        rec.requested = records::container_resources(&c);
        let requested = rec.requested.clone();
        let created = self
            .iso
            .as_ref()
            .and_then(|iso| iso.create_container(&pod, &c.name, requested.as_ref()));
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
        if let Some(u) = update {
            self.store.set_container_resources(&c.id, u);
        }
        Ok(api::UpdateContainerResponse {
            // kubelet's update must not undo the class's settings
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
