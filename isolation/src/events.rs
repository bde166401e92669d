//! The lifecycle events, transport-neutral: a front end (the CRI proxy's
//! hook, the NRI plugin) converts its messages into store records and
//! [`Resources`] and calls these. Each is blocking (cgroupfs, sysfs): call it
//! off the thread that serves the runtime's caller.
//!
//! | event | when | returns |
//! |---|---|---|
//! | [`Isolation::pod_started`] | the pod's sandbox runs (its cgroup exists) | pod-level cgroup writes, recorded |
//! | [`Isolation::create_container`] | before the runtime creates a container | the decision, its patch, the annotations |
//! | [`Isolation::container_created`] | the runtime created it | what it carried, recorded |
//! | [`Isolation::update_container`] | before the runtime applies an update | the patch that keeps the class's settings |
//! | [`Isolation::container_started`] | the container runs | container cgroup writes and resctrl, recorded |
//! | [`Isolation::pod_removed`] | the pod's sandbox is removed | its warnings forgotten |
//!
//! A warning about a pod's input is logged once while the pod lives
//! (`warned`), however many events decide it again.

use std::collections::{BTreeMap, HashMap};

use qoslet_cgroups::{CgroupPath, Cgroups, Knob, PodRoot};
use qoslet_hooks::batch::SpecBatch;
use qoslet_hooks::decide::{self, Action, ContainerDecision, Decision, Requested, ResourcePatch};
use qoslet_hooks::{classify, ClassSource, PodClass, QosClass, Trust, Warning};
use qoslet_state::store::{
    ContainerRecord, ContainerState, PodRecord, Resources, Store, ANNOTATION_APPLIED,
    ANNOTATION_CLASS, ANNOTATION_REQUESTED,
};
use tracing::{debug, warn};

use crate::write::{record, write, Written};
use crate::{Isolation, IsolationError};

/// What isolation decides for a container about to be created.
#[derive(Debug, Clone)]
pub struct Created {
    pub class: QosClass,
    /// Every setting with its rule (`qoslet explain` shows them).
    pub decision: ContainerDecision,
    /// What the runtime applies with the container: CRI's resources, an NRI
    /// adjustment. Empty: nothing to change.
    pub patch: ResourcePatch,
    /// To put on the container: its class, the settings the patch carries
    /// (JSON), and kubelet's request before the patch (the runtime keeps
    /// only the patched config; a store rebuilt from it must not take
    /// qoslet's values for kubelet's).
    pub annotations: BTreeMap<String, String>,
}

impl Isolation {
    /// The pod's sandbox runs: its class is recorded and the pod-level
    /// settings CRI cannot carry (`cpu.idle`, group identity, batch limits on
    /// the pod cgroup, blkio) are written. `pod_id`: the store's pod.
    pub fn pod_started(&self, store: &Store, pod_id: &str) -> Result<(), IsolationError> {
        let shared = self.shared.get();
        let Some(pod) = store.pod(pod_id) else {
            return Ok(());
        };
        let Some(class) = self.class_of(&pod, &shared.trust) else {
            return Ok(());
        };
        store.set_pod_applied(&pod.id, "class", class.class.as_str());
        store.set_pod_applied(&pod.id, "class-source", &class_source(&pod, &shared.trust));
        // recorded for what ranks pods (eviction comes next); the pod's
        // spec.priority needs the Kubernetes API
        if let Some(pc) = qoslet_hooks::class::priority_class(&pod.labels) {
            store.set_pod_applied(&pod.id, "priority-class", pc);
        }
        let d = decide::pod(
            class,
            &pod.annotations,
            SpecBatch::of(spec_batch(store, &pod).as_ref().map(Option::as_deref)),
            &pod.sandbox_limits(),
            &shared.ctx(None),
        );
        self.log(&pod, None, &d.warnings);
        let cg = match CgroupPath::pod_under(&pod.cgroup_parent, &shared.pod_root) {
            Ok(cg) if !cg.as_str().is_empty() => cg,
            Ok(_) => return Ok(()),
            Err(e) => {
                warn!(pod = %pod.name, error = %e, "cgroup parent refused; pod-level settings skipped");
                return Ok(());
            }
        };
        if let (Some(sys), true) = (
            &self.sysctl,
            d.cgroup()
                .iter()
                .any(|k| matches!(k, Knob::GroupIdentity(_))),
        ) {
            if let Err(e) = sys.enable_group_identity() {
                warn!(error = %e, "group identity sysctl not set");
            }
        }
        let written = write(self.cgroups.as_deref(), &cg, &d.cgroup());
        if written.gone {
            return Ok(());
        }
        for (k, v) in written.entries(&cgroup_written(&d.decisions), shared.v2) {
            store.set_pod_applied(&pod.id, &k, &v);
        }
        written.result()
    }

    /// Before the runtime creates container `name` of `pod` (the store's
    /// record, or one built from the call when the store does not have it):
    /// its decision, the patch and the annotations. `requested`: what kubelet
    /// asked for (`None`: nothing). `None`: not qoslet's pod to touch.
    /// `store`: its cluster view of the pod (by UID) gives the spec's batch
    /// resources.
    pub fn create_container(
        &self,
        store: &Store,
        pod: &PodRecord,
        name: &str,
        requested: Option<&Resources>,
    ) -> Option<Created> {
        let shared = self.shared.get();
        let class = self.class_of(pod, &shared.trust)?;
        let pcg = CgroupPath::pod_under(&pod.cgroup_parent, &shared.pod_root).ok();
        let place = self
            .placer()
            .place(&shared.node, self.cgroups.as_deref(), pcg.as_ref());
        let kubelets = requested.cloned().unwrap_or_default();
        let d = decide::container(
            class,
            name,
            &pod.annotations,
            SpecBatch::of(spec_batch(store, pod).as_ref().map(Option::as_deref)),
            &with_pod(asked(&kubelets), pod),
            &shared.ctx(place.as_ref().map(|p| p.share(false))),
        );
        self.log(pod, Some(name), &d.warnings);
        let mut annotations: BTreeMap<String, String> = [(
            ANNOTATION_CLASS.to_string(),
            class.class.as_str().to_string(),
        )]
        .into();
        // the settings the patch carries (the runtime applies them with the
        // container), as a JSON object; those written to the cgroup at start
        // are recorded there, with their outcome
        let carried = carried(&d);
        if !carried.is_empty() {
            annotations.insert(ANNOTATION_APPLIED.into(), applied(&carried, shared.v2));
        }
        // always written, so a value already in the request is never taken for qoslet's
        if let Ok(json) = serde_json::to_string(&kubelets) {
            annotations.insert(ANNOTATION_REQUESTED.into(), json);
        }
        Some(Created {
            class: class.class,
            patch: d.patch(),
            decision: d,
            annotations,
        })
    }

    /// The runtime created `container_id` of the store's pod `pod_id`:
    /// records what the create carried. `annotations`: the container's as the
    /// runtime got them (without the class annotation the patch never reached
    /// it: it timed out or failed open, and nothing is recorded as applied);
    /// `requested`: kubelet's resources when the annotations do not say.
    pub fn container_created(
        &self,
        store: &Store,
        pod_id: &str,
        container_id: &str,
        name: &str,
        annotations: &HashMap<String, String>,
        requested: Option<&Resources>,
    ) {
        let shared = self.shared.get();
        let Some(pod) = store.pod(pod_id) else {
            return;
        };
        let Some(class) = self.class_of(&pod, &shared.trust) else {
            return;
        };
        let patched =
            annotations.get(ANNOTATION_CLASS).map(String::as_str) == Some(class.class.as_str());
        if !patched {
            store.set_container_applied(
                container_id,
                "error",
                "the CreateContainer hook's settings did not reach the runtime (it timed out or failed, fail-open)",
            );
            return;
        }
        // decided again from kubelet's own request (the one the runtime got
        // is patched), as create_container decided it
        let kubelets = annotations
            .get(ANNOTATION_REQUESTED)
            .and_then(|j| serde_json::from_str::<Resources>(j).ok())
            .or_else(|| requested.cloned())
            .unwrap_or_default();
        let pcg = CgroupPath::pod_under(&pod.cgroup_parent, &shared.pod_root).ok();
        let place = self
            .placer()
            .place(&shared.node, self.cgroups.as_deref(), pcg.as_ref());
        let d = decide::container(
            class,
            name,
            &pod.annotations,
            SpecBatch::of(spec_batch(store, &pod).as_ref().map(Option::as_deref)),
            &with_pod(asked(&kubelets), &pod),
            &shared.ctx(place.as_ref().map(|p| p.share(false))),
        );
        // settings written at start are recorded there, with their outcome
        record(
            store,
            container_id,
            class.class,
            &Written::default().entries(&carried(&d), shared.v2),
        );
    }

    /// Before the runtime applies kubelet's update `update` (`None`: an
    /// update without Linux resources) to `container_id`: the patch that
    /// keeps the class's settings (`None`: nothing to add). Lowers the CFS
    /// burst first where the new quota would fall below it (the kernel
    /// refuses the quota otherwise).
    pub fn update_container(
        &self,
        store: &Store,
        container_id: &str,
        update: Option<&Resources>,
    ) -> Option<ResourcePatch> {
        let shared = self.shared.get();
        let (c, pod, class) = self.known(store, container_id, &shared.trust)?;
        // kubelet may send a partial update (cpuset only): what it left out stands
        let mut merged = c.requested.clone().unwrap_or_default();
        if let Some(u) = update {
            merged.merge(u);
        }
        // the pool carried even when whole: containerd re-applies the cpuset
        // its spec kept from an earlier patch otherwise
        let pcg = CgroupPath::pod_under(&pod.cgroup_parent, &shared.pod_root).ok();
        let place = self
            .placer()
            .place(&shared.node, self.cgroups.as_deref(), pcg.as_ref());
        let d = decide::container(
            class,
            &c.name,
            &pod.annotations,
            SpecBatch::of(spec_batch(store, &pod).as_ref().map(Option::as_deref)),
            &with_pod(asked(&merged), &pod),
            &shared.ctx(place.as_ref().map(|p| p.share(true))),
        );
        let mut patch = d.patch();
        // v2: memory QoS carried at create stays in the runtime's spec, which
        // kubelet's update (without those unified keys) applies again: what
        // the class no longer sets goes back to its default
        if shared.v2 {
            let kubelets = update.map(|u| &u.unified);
            use qoslet_cgroups::files::{MEMORY_HIGH, MEMORY_LOW, MEMORY_MIN};
            // (the v2 file, as the store records it and CRI's unified map names it)
            for (key, default) in [(MEMORY_MIN, "0"), (MEMORY_LOW, "0"), (MEMORY_HIGH, "max")] {
                if c.applied.contains_key(key)
                    && !patch.unified.contains_key(key)
                    && !kubelets.is_some_and(|u| u.contains_key(key))
                {
                    // kubelet's own create-time value (its MemoryQoS), else the default
                    let back = c
                        .requested
                        .as_ref()
                        .and_then(|r| r.unified.get(key))
                        .map_or(default, String::as_str);
                    patch.unified.insert(key.into(), back.into());
                }
            }
        }
        if let Some(cg) = self.cgroups.as_deref() {
            let quota = patch.cpu_quota.unwrap_or(merged.cpu_quota);
            make_room_for_quota(cg, store, &pod, &c.id, quota, &shared.pod_root);
        }
        (!patch.is_empty()).then_some(patch)
    }

    /// The container runs: the container-level settings CRI cannot carry
    /// (group identity, `cpu.idle`, v1 memory QoS) are written, and it joins
    /// its class's resctrl group.
    pub fn container_started(
        &self,
        store: &Store,
        container_id: &str,
    ) -> Result<(), IsolationError> {
        let shared = self.shared.get();
        let Some((c, pod, class)) = self.known(store, container_id, &shared.trust) else {
            return Ok(());
        };
        let stored = c.requested.clone().unwrap_or_default();
        let d = decide::container(
            class,
            &c.name,
            &pod.annotations,
            SpecBatch::of(spec_batch(store, &pod).as_ref().map(Option::as_deref)),
            &with_pod(asked(&stored), &pod),
            &shared.ctx(None),
        );
        let cg = match CgroupPath::pod_under(&pod.cgroup_parent, &shared.pod_root)
            .and_then(|p| p.container(&c.id))
        {
            Ok(cg) => cg,
            Err(e) => {
                warn!(pod = %pod.name, container = %c.name, error = %e, "cgroup path refused; container settings skipped");
                return Ok(());
            }
        };
        let cgroups = self.cgroups.as_deref();
        let written = write(cgroups, &cg, &d.cgroup());
        if written.gone {
            // the container ended meanwhile: no settings, no resctrl group
            return Ok(());
        }
        record(
            store,
            &c.id,
            class.class,
            &written.entries(&cgroup_written(&d.decisions), shared.v2),
        );
        written.result()?;
        if let (Some(rdt), Some(cgroups), Some(q)) = (self.resctrl.as_deref(), cgroups, d.resctrl())
        {
            let group = qoslet_qos_engine::resctrl::group_of(q.class);
            // the engine's assigner (every thread, as each tick does)
            let schemata = rdt.schemata(
                q.cat_range_start_percent,
                q.cat_range_end_percent,
                q.mba_percent,
            );
            match qoslet_qos_engine::resctrl::join(
                group,
                &schemata,
                std::slice::from_ref(&cg),
                rdt,
                cgroups,
            ) {
                Ok(_) => {}
                // (a Gone here is the resctrl group's: an error like any other)
                Err(source) => {
                    return Err(IsolationError::Resctrl {
                        group: group.to_string(),
                        source,
                    })
                }
            }
            store.set_container_applied(
                &c.id,
                "resctrl",
                &format!(
                    "group {group}: {} (resctrlQOS of class {})",
                    schemata.trim().replace('\n', " "),
                    q.class.as_str()
                ),
            );
        }
        Ok(())
    }
}

impl Isolation {
    /// The pod's sandbox is removed: what was logged about it is forgotten.
    pub fn pod_removed(&self, pod_id: &str) {
        self.warned.forget(pod_id);
    }

    /// Logs the warnings about `pod` (and its container `container`) not
    /// logged yet while it lives; the others at debug.
    fn log(&self, pod: &PodRecord, container: Option<&str>, warnings: &[Warning]) {
        for w in warnings {
            let c = container.unwrap_or("");
            if self.warned.first(&pod.id, w) {
                warn!(pod = %pod.name, namespace = %pod.namespace, container = c, kind = w.kind(), "{w}");
            } else {
                debug!(pod = %pod.name, namespace = %pod.namespace, container = c, kind = w.kind(), "{w}");
            }
        }
    }

    /// The class of a pod, logging input problems.
    fn class_of(&self, pod: &PodRecord, trust: &Trust) -> Option<PodClass> {
        let d = classify(&pod.labels, &pod.namespace, &pod.cgroup_parent, trust);
        self.log(pod, None, &d.warnings);
        d.pod_class()
    }

    /// A stored container, its pod and its class (`None`: not qoslet's to touch).
    fn known(
        &self,
        store: &Store,
        container_id: &str,
        trust: &Trust,
    ) -> Option<(ContainerRecord, PodRecord, PodClass)> {
        let c = store.container(container_id)?;
        let pod = store.pod_of(container_id)?;
        let class = self.class_of(&pod, trust)?;
        Some((c, pod, class))
    }
}

/// What kubelet asked for a container, as decisions take it.
fn asked(r: &Resources) -> Requested<'_> {
    Requested {
        memory_limit: r.memory_limit_in_bytes,
        cpu_quota: r.cpu_quota,
        cpu_period: r.cpu_period,
        cpuset_cpus: &r.cpuset_cpus,
        oom_score_adj: r.oom_score_adj,
        pod_milli_cpu: 0,
    }
}

/// What kubelet asked for a container, with its pod's CPU limit (an untrusted
/// pod's binding is sized by it).
fn with_pod<'a>(mut r: Requested<'a>, pod: &PodRecord) -> Requested<'a> {
    r.pod_milli_cpu = pod.sandbox_limits().milli_cpu();
    r
}

/// Where a pod's class comes from, in words (for `qoslet explain`).
fn class_source(pod: &PodRecord, trust: &Trust) -> String {
    match classify(&pod.labels, &pod.namespace, &pod.cgroup_parent, trust).source {
        ClassSource::Label => format!("label {}", qoslet_hooks::class::LABEL_QOS_CLASS),
        ClassSource::KubeQos(q) => {
            format!("Kubernetes QoS {q:?} (cgroup parent {})", pod.cgroup_parent)
        }
        ClassSource::Skipped => format!("label {} (skipped)", qoslet_hooks::class::LABEL_SKIP),
        ClassSource::Unknown => "none".into(),
    }
}

/// `qoslet.io/applied`: setting -> value, as a JSON object.
fn applied(ds: &[&Decision], v2: bool) -> String {
    let m: BTreeMap<String, String> = ds.iter().map(|d| d.setting(v2)).collect();
    serde_json::to_string(&m).unwrap_or_default()
}

/// The decisions the patch carries (the runtime applies them at create).
fn carried(d: &ContainerDecision) -> Vec<&Decision> {
    d.decisions
        .iter()
        .filter(|d| matches!(d.action, Action::Cri(_)))
        .collect()
}

/// The decisions qoslet writes into the cgroup itself.
fn cgroup_written(ds: &[Decision]) -> Vec<&Decision> {
    ds.iter()
        .filter(|d| matches!(d.action, Action::Cgroup(_)))
        .collect()
}

/// Before an update whose CFS quota (`quota` µs, ≤ 0: none) may fall below
/// the burst the QoS engine set (an in-place resize down): lowers the
/// container's burst to the new quota, and the pod's to the new sum of its
/// containers' quotas (kubelet writes the pod cgroup after its containers on
/// a decrease), so neither write meets the kernel's EINVAL.
fn make_room_for_quota(
    cgroups: &Cgroups,
    store: &Store,
    pod: &PodRecord,
    container: &str,
    quota: i64,
    pod_root: &PodRoot,
) {
    if !cgroups.host().features.cpu_burst || quota <= 0 {
        return;
    }
    let Ok(pod_cg) = CgroupPath::pod_under(&pod.cgroup_parent, pod_root) else {
        return;
    };
    let pod_sum: Option<i64> = store.read_all(|_, ctrs| {
        ctrs.values()
            .filter(|c| c.pod_id == pod.id && c.state == ContainerState::Running)
            .map(|c| {
                let q = if c.id == container {
                    quota
                } else {
                    c.requested.as_ref().map_or(0, |r| r.cpu_quota)
                };
                (q > 0).then_some(q)
            })
            .sum()
    });
    let lower = |cg: &CgroupPath, max: i64| {
        let Ok(files) = cgroups.plan(&Knob::CpuBurst(0)) else {
            return;
        };
        let Some(f) = files.first() else { return };
        let cur: Option<i64> = cgroups
            .read(cg, f.controller, f.file)
            .ok()
            .and_then(|v| v.trim().parse().ok());
        if cur.is_some_and(|b| b > max) {
            if let Err(e) = cgroups.apply(cg, &Knob::CpuBurst(max as u64)) {
                warn!(cgroup = %cg, error = %e, "CFS burst not lowered before a smaller quota");
            }
        }
    };
    if let Ok(cg) = pod_cg.container(container) {
        lower(&cg, quota);
    }
    if let Some(sum) = pod_sum {
        lower(&pod_cg, sum);
    }
}

/// The pod spec's batch resources, from the cluster view of the pod (by
/// UID; `None`: no cluster, or a pod it does not know; `Some(None)`: a spec
/// that asks for none).
fn spec_batch(store: &Store, pod: &PodRecord) -> Option<Option<String>> {
    if pod.uid.is_empty() {
        return None;
    }
    Some(store.cluster_pod(&pod.uid)?.batch.clone())
}

#[cfg(test)]
mod tests {
    use super::*;
    use qoslet_cgroups::memfs::MemFs;
    use qoslet_cgroups::resctrl::Resctrl;
    use qoslet_hooks::decide::NodeFacts;
    use qoslet_hooks::policy::ResourceQosStrategy;
    use qoslet_state::inventory::InventorySource;
    use std::sync::Arc;

    /// A store holding one BE-labelled pod and its container `app`.
    fn be_pod_with_app(pod_id: &str, parent: &str, cid: &str) -> Store {
        let store = Store::new();
        let mut pod = PodRecord {
            id: pod_id.into(),
            name: "batch".into(),
            cgroup_parent: parent.into(),
            ..Default::default()
        };
        pod.labels
            .insert("koordinator.sh/qosClass".into(), "BE".into());
        store.upsert_pod(pod);
        store.upsert_container(ContainerRecord {
            id: cid.into(),
            pod_id: pod_id.into(),
            name: "app".into(),
            ..Default::default()
        });
        store
    }

    fn tree(tag: &str, files: &[(&str, &str)]) -> std::path::PathBuf {
        qoslet_cgroups::testing::tree(&format!("iso-{tag}"), files)
    }

    /// An inventory the test sets (the agent's follows the store).
    struct Fixed(std::sync::Mutex<Arc<qoslet_state::inventory::Inventory>>);
    impl InventorySource for Fixed {
        fn current(&self) -> Arc<qoslet_state::inventory::Inventory> {
            self.0.lock().unwrap().clone()
        }
    }

    /// An untrusted LSR pod in the inventory, bound by its resource-status
    /// annotation, without containers or limits.
    fn lsr_entry(status: &str) -> qoslet_state::inventory::PodEntry {
        qoslet_state::inventory::PodEntry {
            id: "plsr".into(),
            name: "plsr".into(),
            namespace: String::new(),
            uid: String::new(),
            labels: Default::default(),
            created_at: 0,
            priority: None,
            cluster: None,
            cgroup: CgroupPath::parse("/kubepods/podplsr").unwrap(),
            class: Some(lsr_class()),
            annotations: [(
                decide::ANNOTATION_RESOURCE_STATUS.to_string(),
                status.to_string(),
            )]
            .into(),
            limits: Default::default(),
            containers: Vec::new(),
        }
    }

    fn lsr_class() -> PodClass {
        PodClass {
            class: QosClass::Lsr,
            by_label: true,
            trusted: false,
            kube: Some(qoslet_hooks::KubeQos::Guaranteed),
        }
    }

    /// Issue 28 item 7: the placer binds the pods against the CPUs online
    /// now, as the engine does, and again when they change: an LSR pod bound
    /// to CPUs 2-3 that came online after the start keeps them out of the
    /// share pool (bound against the start-time 0-1, its binding was refused
    /// and an LS container was placed on its CPUs).
    #[test]
    fn the_share_pool_follows_cpu_hotplug() {
        use qoslet_state::inventory::{Inventory, PodEntry};
        let sys = tree("hotplug", &[("devices/system/cpu/online", "0-1\n")]);
        let hook = Isolation::new(
            None,
            None,
            ResourceQosStrategy::default(),
            NodeFacts {
                online_cpus: (0..2).collect(),
                milli_cpus: 2000,
                ..Default::default()
            },
            Trust::default(),
            PodRoot::default(),
        )
        .with_sys_root(&sys);
        let store = Store::new();
        let mut pod = PodRecord {
            id: "pls".into(),
            name: "pls".into(),
            cgroup_parent: "/kubepods/burstable/podpls".into(),
            ..Default::default()
        };
        pod.labels
            .insert("koordinator.sh/qosClass".into(), "LS".into());
        store.upsert_pod(pod);
        let lsr = PodEntry {
            class: Some(PodClass {
                trusted: true,
                ..lsr_class()
            }),
            limits: decide::SandboxLimits {
                memory_limit: 0,
                cpu_quota: 200_000,
                cpu_period: 100_000,
            },
            ..lsr_entry(r#"{"cpuset":"2-3"}"#)
        };
        let inv = Arc::new(Fixed(std::sync::Mutex::new(Arc::new(Inventory {
            generation: 1,
            pods: vec![lsr],
        }))));
        let _ = hook.inventory_slot().set(inv);
        let asked = Resources {
            cpu_quota: 100_000,
            cpu_period: 100_000,
            ..Default::default()
        };
        let cpuset = || {
            hook.create_container(&store, &store.pod("pls").unwrap(), "app", Some(&asked))
                .expect("a classed pod")
                .patch
                .cpuset_cpus
                .unwrap_or_default()
        };
        // CPUs 2-3 offline: nothing to bind to, the pool is every online CPU
        assert_eq!(cpuset(), "", "the whole node: nothing pinned");
        // CPUs 2-3 come online (the same store generation): bound again now
        std::fs::write(sys.join("devices/system/cpu/online"), "0-3\n").unwrap();
        assert_eq!(cpuset(), "0-1", "the LSR pod's CPUs left out");
        let _ = std::fs::remove_dir_all(&sys);
    }

    /// Issue 14 item 5 at CreateContainer: an LS container is created on the
    /// share pool of the inventory (the node without the CPUs a running LSR
    /// container is bound to), an LSR container bound by its annotation and
    /// without CFS quota; before the inventory is set, kubelet's cpusets stand.
    #[test]
    fn containers_are_created_on_the_share_pool_or_their_binding() {
        use qoslet_state::inventory::{ContainerEntry, Inventory, PodEntry};
        let node = NodeFacts {
            online_cpus: (0..4).collect(),
            milli_cpus: 4000,
            ..Default::default()
        };
        let hook = Isolation::new(
            None,
            None,
            ResourceQosStrategy::default(),
            node,
            Trust::default(),
            PodRoot::default(),
        );
        let store = Store::new();
        let bound = r#"{"cpuset":"2-3"}"#;
        for (id, class, parent, ann) in [
            ("pls", "LS", "/kubepods/burstable/podpls", None),
            ("plsr", "LSR", "/kubepods/podplsr", Some(bound)),
        ] {
            let mut pod = PodRecord {
                id: id.into(),
                name: id.into(),
                cgroup_parent: parent.into(),
                ..Default::default()
            };
            pod.labels
                .insert("koordinator.sh/qosClass".into(), class.into());
            if let Some(a) = ann {
                pod.annotations
                    .insert(decide::ANNOTATION_RESOURCE_STATUS.into(), a.into());
            }
            store.upsert_pod(pod);
        }
        let asked = Resources {
            cpu_quota: 200_000,
            cpu_period: 100_000,
            ..Default::default()
        };
        // (the patch's cpuset and CFS quota; unset: empty and 0)
        let create = |iso: &Isolation, pod: &str| {
            let c = iso
                .create_container(&store, &store.pod(pod).unwrap(), "app", Some(&asked))
                .expect("a classed pod");
            (
                c.patch.cpuset_cpus.unwrap_or_default(),
                c.patch.cpu_quota.unwrap_or(0),
            )
        };
        let ls = create(&hook, "pls");
        assert_eq!(ls, (String::new(), 0), "no inventory yet: kubelet's");
        // the LSR pod's container runs, bound to CPUs 2-3
        let lsr = PodEntry {
            containers: vec![ContainerEntry {
                id: "c1".into(),
                name: "app".into(),
                cgroup: CgroupPath::parse("/kubepods/podplsr/c1").unwrap(),
                memory_limit: 0,
                cpu_quota: 200_000,
                cpu_period: 100_000,
                cpuset_cpus: String::new(),
                oom_score_adj: 0,
                cpu_shares: 0,
            }],
            ..lsr_entry(bound)
        };
        let inv = Arc::new(Fixed(std::sync::Mutex::new(Arc::new(Inventory {
            generation: 1,
            pods: vec![lsr.clone()],
        }))));
        let _ = hook.inventory_slot().set(inv.clone());
        assert_eq!(create(&hook, "pls"), ("0-1".into(), 0), "the share pool");
        assert_eq!(
            create(&hook, "plsr"),
            ("2-3".into(), -1),
            "bound, no CFS quota"
        );
        // the LSR container restarting (not running): its pod's binding, sized by
        // the sandbox's limit, keeps CPUs 2-3 out of the pool
        let mut restarting = lsr;
        restarting.containers.clear();
        restarting.limits = decide::SandboxLimits {
            memory_limit: 0,
            cpu_quota: 200_000,
            cpu_period: 100_000,
        };
        let restarting_entry = restarting.clone();
        *inv.0.lock().unwrap() = Arc::new(Inventory {
            generation: 2,
            pods: vec![restarting],
        });
        assert_eq!(
            create(&hook, "pls"),
            ("0-1".into(), 0),
            "still the share pool"
        );
        // the LSR pod gone: the pool is every CPU; a create pins nothing, and
        // kubelet's update carries every CPU (containerd would re-apply the
        // cpuset its spec kept from the create otherwise)
        *inv.0.lock().unwrap() = Arc::new(Inventory {
            generation: 3,
            pods: Vec::new(),
        });
        assert_eq!(create(&hook, "pls"), (String::new(), 0), "nothing pinned");
        store.upsert_container(ContainerRecord {
            id: "cls".into(),
            pod_id: "pls".into(),
            name: "app".into(),
            ..Default::default()
        });
        let u = hook.update_container(&store, "cls", Some(&asked)).unwrap();
        assert_eq!(u.cpuset_cpus.as_deref(), Some("0-3"));
        // on cgroup v1 the pool is taken within the pod's own cpuset (a
        // container's must be inside it): the pod's 1-3 minus bound 2-3
        let (_m, cgroups) = MemFs::v1_tree(&[
            ("cpu/cgroup.procs", ""),
            ("cpuset/cgroup.procs", ""),
            ("cpuset/kubepods/burstable/podpls/cpuset.cpus", "1-3\n"),
        ]);
        let narrow = Isolation::new(
            Some(cgroups),
            None,
            ResourceQosStrategy::default(),
            NodeFacts {
                online_cpus: (0..4).collect(),
                milli_cpus: 4000,
                ..Default::default()
            },
            Trust::default(),
            PodRoot::default(),
        );
        *inv.0.lock().unwrap() = Arc::new(Inventory {
            generation: 4,
            pods: vec![restarting_entry],
        });
        let _ = narrow.inventory_slot().set(inv.clone());
        assert_eq!(create(&narrow, "pls"), ("1".into(), 0));
    }

    /// Review of issue 14 item 8: on cgroup v2 the memory QoS a create carried
    /// in `unified` stays in containerd's spec, and kubelet's update (without
    /// those keys) would apply it again: once the class no longer sets it, the
    /// update carries the defaults.
    #[test]
    fn v2_updates_put_back_memory_qos_the_class_no_longer_sets() {
        let m = MemFs::new();
        m.set("kubepods.slice/memory.min", "0\n");
        let cgroups = m.v2(qoslet_cgroups::Features {
            memory_qos: true,
            ..Default::default()
        });
        let hook = Isolation::new(
            Some(cgroups),
            None,
            ResourceQosStrategy::default(), // memory QoS off
            NodeFacts::default(),
            Trust::default(),
            PodRoot::default(),
        );
        let store = Store::new();
        let mut pod = PodRecord {
            id: "p1".into(),
            name: "web".into(),
            cgroup_parent: "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1.slice"
                .into(),
            ..Default::default()
        };
        pod.labels
            .insert("koordinator.sh/qosClass".into(), "LS".into());
        store.upsert_pod(pod);
        let mut c = ContainerRecord {
            id: "c1".into(),
            pod_id: "p1".into(),
            name: "app".into(),
            ..Default::default()
        };
        // what the create carried while the class had memory QoS on
        c.applied.insert("memory.min".into(), "1073741824".into());
        c.applied.insert("memory.high".into(), "2147483648".into());
        // kubelet's own create-time memory.high (its MemoryQoS gate)
        c.requested = Some(qoslet_state::store::Resources {
            unified: [("memory.high".to_string(), "3221225472".to_string())].into(),
            ..Default::default()
        });
        store.upsert_container(c);
        let update = |unified: &[(&str, &str)]| {
            let u = Resources {
                cpu_quota: 200_000,
                cpu_period: 100_000,
                unified: unified
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
                ..Default::default()
            };
            hook.update_container(&store, "c1", Some(&u))
                .map(|p| p.unified)
                .unwrap_or_default()
        };
        let u = update(&[]);
        assert_eq!(u.get("memory.min").map(String::as_str), Some("0"));
        assert_eq!(
            u.get("memory.high").map(String::as_str),
            Some("3221225472"),
            "kubelet's create-time value, not the default"
        );
        assert!(!u.contains_key("memory.low"), "never carried: not touched");
        // kubelet's own value (its MemoryQoS) stands
        let u = update(&[("memory.min", "5")]);
        assert!(!u.contains_key("memory.min"), "{u:?}");
    }

    /// Issue 15 item 5: `applied` says what happened. A cgroup write the kernel
    /// refused is recorded as failed (not as applied), and a CreateContainer
    /// whose "before" patch never reached the runtime (the hook timed out,
    /// fail-open) records nothing as applied.
    #[test]
    fn applied_records_failed_writes_and_unpatched_creates() {
        let cid = "d".repeat(64);
        // an Anolis-shaped root (group identity offered), a container cgroup without the file
        let container = format!("cpu/kubepods/besteffort/pod2/{cid}/cgroup.procs");
        let (_m, cgroups) = MemFs::v1_tree(&[
            ("cpu/cgroup.procs", ""),
            ("cpu/cpu.bvt_warp_ns", "0\n"),
            (container.as_str(), ""),
        ]);
        let mut policy = ResourceQosStrategy::default();
        policy.be_class.cpu_qos.enable = true;
        let hook = Isolation::new(
            Some(cgroups),
            None,
            policy,
            NodeFacts::default(),
            Trust::default(),
            PodRoot::default(),
        );
        let store = be_pod_with_app("p2", "/kubepods/besteffort/pod2", &cid);
        let r = hook.container_started(&store, &cid);
        assert!(
            r.is_err(),
            "the failure still counts under the failure policy"
        );
        let applied = store.container(&cid).unwrap().applied;
        assert!(
            applied["cpu.bvt_warp_ns"].starts_with("failed: -1"),
            "{applied:?}"
        );
        // a CreateContainer that reached the runtime without qoslet's patch
        // (the proxy records the container before the "after" hooks run)
        store.upsert_container(ContainerRecord {
            id: "late".into(),
            pod_id: "p2".into(),
            name: "late".into(),
            ..Default::default()
        });
        hook.container_created(&store, "p2", "late", "late", &Default::default(), None);
        let late = store.container("late").unwrap().applied;
        assert!(!late.contains_key("class"), "{late:?}");
        assert!(
            late["error"].contains("did not reach the runtime"),
            "{late:?}"
        );
    }

    /// StartContainer of a BE container with resctrl enabled, on kernel-shaped trees:
    /// the BE group gets Koordinator's schemata and the container's processes.
    #[test]
    fn be_container_joins_the_be_resctrl_group() {
        let cid = "c".repeat(64);
        let cg = format!("cpu/kubepods/besteffort/pod1/{cid}");
        let (procs, tasks) = (format!("{cg}/cgroup.procs"), format!("{cg}/tasks"));
        let (_m, cgroups) = MemFs::v1_tree(&[
            ("cpu/cgroup.procs", ""),
            ("cpu/cpu.idle", "0\n"),
            (procs.as_str(), "123\n456\n"),
            // 789 is a second thread of process 456: resctrl assigns threads
            (tasks.as_str(), "123\n456\n789\n"),
            ("memory/cgroup.procs", ""),
        ]);
        let rdt = tree(
            "rdt",
            &[
                ("schemata", "L3:0=7ff\nMB:0=100\n"),
                ("info/L3/cbm_mask", "7ff\n"),
                ("info/L3/num_closids", "16\n"),
                ("info/MB/min_bandwidth", "10\n"),
                ("info/MB/bandwidth_gran", "10\n"),
                // the group as the kernel creates it on mkdir
                ("BE/schemata", "L3:0=7ff\nMB:0=100\n"),
                ("BE/tasks", ""),
            ],
        );
        let mut policy = ResourceQosStrategy::default();
        policy.be_class.resctrl_qos.enable = true;
        let hook = Isolation::new(
            Some(cgroups),
            Resctrl::detect(&rdt).unwrap(),
            policy,
            NodeFacts::default(),
            Trust::default(),
            PodRoot::default(),
        );
        let store = be_pod_with_app("p1", "/kubepods/besteffort/pod1", &cid);
        hook.container_started(&store, &cid).unwrap();
        // a plain file in the tree keeps the last single-line write of each task:
        // the last is a thread no process list names (every thread is assigned)
        assert_eq!(
            std::fs::read_to_string(rdt.join("BE/tasks")).unwrap(),
            "789"
        );
        assert_eq!(
            std::fs::read_to_string(rdt.join("BE/schemata")).unwrap(),
            "L3:0=f\n",
            "BE: LLC 0-30% of 11 ways"
        );
        let applied = store.container(&cid).unwrap().applied;
        assert!(
            applied["resctrl"].starts_with("group BE: L3:0=f MB:0=100"),
            "{applied:?}"
        );
        assert_eq!(applied["class"], "BE");
        std::fs::remove_dir_all(&rdt).unwrap();
    }

    /// Resctrl is off by default (Koordinator's default), so nothing happens without the policy.
    #[test]
    fn resctrl_is_off_by_default() {
        let rdt = tree(
            "rdt-off",
            &[
                ("schemata", "L3:0=7ff\n"),
                ("info/L3/cbm_mask", "7ff\n"),
                ("BE/schemata", "L3:0=7ff\n"),
                ("BE/tasks", ""),
            ],
        );
        let (_m, cgroups) = MemFs::v1_tree(&[
            ("cpu/cgroup.procs", ""),
            ("cpu/kubepods/besteffort/pod1/x/cgroup.procs", "1\n"),
        ]);
        let hook = Isolation::new(
            Some(cgroups),
            Resctrl::detect(&rdt).unwrap(),
            ResourceQosStrategy::default(),
            NodeFacts::default(),
            Trust::default(),
            PodRoot::default(),
        );
        let store = Store::new();
        let mut pod = PodRecord {
            id: "p1".into(),
            cgroup_parent: "/kubepods/besteffort/pod1".into(),
            ..Default::default()
        };
        pod.labels
            .insert("koordinator.sh/qosClass".into(), "BE".into());
        store.upsert_pod(pod);
        store.upsert_container(ContainerRecord {
            id: "x".into(),
            pod_id: "p1".into(),
            ..Default::default()
        });
        hook.container_started(&store, "x").unwrap();
        assert_eq!(std::fs::read_to_string(rdt.join("BE/tasks")).unwrap(), "");
        std::fs::remove_dir_all(&rdt).unwrap();
    }

    /// A BE pod with batch resources on a cgroup v2 host (kernel-shaped tree):
    /// the pod's cgroup gets cpu.idle, its summed quota and memory limit, memory
    /// QoS and the class's io.max; the container's memory QoS travels in CRI's
    /// `unified` map at CreateContainer.
    #[test]
    fn be_pod_on_cgroup_v2() {
        let pod_dir = "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1.slice";
        let m = MemFs::new();
        m.set("kubepods.slice/cpu.idle", "0\n");
        for (f, c) in [
            ("cpu.idle", "0\n"),
            ("cpu.weight", "1\n"),
            ("cpu.max", "max 100000\n"),
            ("memory.max", "max\n"),
            ("memory.min", "0\n"),
            ("memory.low", "0\n"),
            ("memory.high", "max\n"),
            ("io.max", ""),
        ] {
            m.set(&format!("{pod_dir}/{f}"), c);
        }
        // what detection finds on such a v2 host: cpu.idle below the root, the
        // memory and io controllers enabled
        let cgroups = m.v2(qoslet_cgroups::Features {
            cpu_idle: true,
            memory_qos: true,
            blkio_throttle: true,
            ..Default::default()
        });
        let policy: ResourceQosStrategy = serde_json::from_str(
            r#"{"beClass":{"cpuQOS":{"enable":true},"memoryQOS":{"enable":true,"minLimitPercent":50,"lowLimitPercent":100,"throttlingPercent":50},
                "blkioQOS":{"enable":true,"blocks":[{"name":"8:16","ioCfg":{"writeBPS":1048576}}]}}}"#,
        )
        .unwrap();
        policy.validate().unwrap();
        let hook = Isolation::new(
            Some(cgroups),
            None,
            policy,
            NodeFacts::default(),
            // a Koordinator cluster: the webhook validated the batch annotation
            // (memory protection from a batch request is for trusted pods only)
            Trust {
                control_plane: true,
                ..Trust::default()
            },
            PodRoot::default(),
        );
        let store = Store::new();
        let mut pod = PodRecord {
            id: "p1".into(),
            name: "batch".into(),
            cgroup_parent: format!("/{pod_dir}"),
            ..Default::default()
        };
        pod.labels
            .insert("koordinator.sh/qosClass".into(), "BE".into());
        pod.annotations.insert(
            qoslet_hooks::batch::ANNOTATION_EXTENDED_RESOURCE_SPEC.into(),
            r#"{"containers":{"app":{"requests":{"kubernetes.io/batch-cpu":"1000","kubernetes.io/batch-memory":"64Mi"},"limits":{"kubernetes.io/batch-cpu":"2000","kubernetes.io/batch-memory":"128Mi"}}}}"#.into(),
        );
        store.upsert_pod(pod.clone());
        hook.pod_started(&store, "p1").unwrap();
        let read = |f: &str| m.at(&format!("{pod_dir}/{f}")).unwrap();
        assert_eq!(read("cpu.idle"), "1");
        assert_eq!(read("cpu.max"), "200000 100000", "batch-cpu limit 2000m");
        assert_eq!(
            read("cpu.weight"),
            "1",
            "an idle cgroup's weight is not written (the kernel refuses it)"
        );
        assert_eq!(read("memory.max"), (128u64 << 20).to_string());
        assert_eq!(read("memory.min"), (32u64 << 20).to_string());
        assert_eq!(read("memory.low"), (64u64 << 20).to_string());
        assert_eq!(read("memory.high"), (96u64 << 20).to_string());
        assert_eq!(
            read("io.max"),
            "8:16 rbps=max wbps=1048576 riops=max wiops=max"
        );
        let applied = store.pod("p1").unwrap().applied;
        assert!(
            applied["io.max 8:16"].contains("BE blkioQOS for 8:16"),
            "{applied:?}"
        );
        assert!(!applied.contains_key("error"), "{applied:?}");

        // CreateContainer: the container's memory QoS rides in the patch's unified map
        let r = hook
            .create_container(&store, &pod, "app", None)
            .unwrap()
            .patch;
        assert_eq!(r.unified["memory.min"], (32u64 << 20).to_string());
        assert_eq!(r.unified["memory.low"], (64u64 << 20).to_string());
        assert_eq!(r.cpu_quota, Some(200_000));
        assert_eq!(r.memory_limit_in_bytes, Some(128 << 20));
    }

    /// The neutral create event, class by class: who the pod is (labels,
    /// cgroup parent, an untrusted namespace) decides whether isolation
    /// touches it and with what class; kubelet's request is always recorded.
    #[test]
    fn create_container_by_class_table() {
        const BE: &str = "koordinator.sh/qosClass";
        const SKIP: &str = "runtimeproxy.koordinator.sh/skip-hookserver";
        // (what, labels, cgroup parent, the class isolation gives; None: not touched)
        type Row<'a> = (&'a str, &'a [(&'a str, &'a str)], &'a str, Option<&'a str>);
        let rows: &[Row] = &[
            (
                "BestEffort, no label",
                &[],
                "/kubepods/besteffort/pod1",
                Some("BE"),
            ),
            (
                "Burstable, no label",
                &[],
                "/kubepods/burstable/pod1",
                Some("LS"),
            ),
            ("Guaranteed, no label", &[], "/kubepods/pod1", Some("LSR")),
            (
                "a label may lower the class",
                &[(BE, "BE")],
                "/kubepods/burstable/pod1",
                Some("BE"),
            ),
            (
                "an untrusted label may not raise it",
                &[(BE, "LSE")],
                "/kubepods/burstable/pod1",
                Some("LS"),
            ),
            (
                "an unknown label: the Kubernetes QoS",
                &[(BE, "GOLD")],
                "/kubepods/besteffort/pod1",
                Some("BE"),
            ),
            (
                "an untrusted skip is ignored",
                &[(SKIP, "true")],
                "/kubepods/besteffort/pod1",
                Some("BE"),
            ),
            (
                "outside kubepods: not qoslet's",
                &[],
                "/system.slice/x",
                None,
            ),
            (
                "outside kubepods, labelled: refused",
                &[(BE, "BE")],
                "/system.slice/x",
                None,
            ),
        ];
        let iso = Isolation::new(
            None,
            None,
            ResourceQosStrategy::default(),
            NodeFacts::default(),
            Trust::default(),
            PodRoot::default(),
        );
        let asked = Resources {
            memory_limit_in_bytes: 64 << 20,
            cpu_quota: 50_000,
            cpu_period: 100_000,
            ..Default::default()
        };
        for (what, labels, parent, class) in rows {
            let mut pod = PodRecord {
                id: "p".into(),
                name: "web".into(),
                namespace: "team".into(),
                cgroup_parent: parent.to_string(),
                ..Default::default()
            };
            for (k, v) in labels.iter() {
                pod.labels.insert(k.to_string(), v.to_string());
            }
            let got = iso.create_container(&Store::new(), &pod, "app", Some(&asked));
            assert_eq!(got.as_ref().map(|c| c.class.as_str()), *class, "{what}");
            if let Some(c) = got {
                assert_eq!(c.annotations[ANNOTATION_CLASS], c.class.as_str(), "{what}");
                let recorded: Resources =
                    serde_json::from_str(&c.annotations[ANNOTATION_REQUESTED]).unwrap();
                assert_eq!(recorded, asked, "{what}: kubelet's request, as asked");
                assert!(
                    c.patch.is_empty(),
                    "{what}: default policy, no batch resources: {:?}",
                    c.patch
                );
            }
        }
    }
}
