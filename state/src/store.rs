//! The pod/container store: every pod and container on the node, what kubelet
//! asked for, and what qoslet applied.
//!
//! The store is in memory and shared (cheap clones of one handle). Mutations
//! move its generation, which any number of rooms subscribe to; one of them
//! ([`crate::checkpoint`]) writes it to the state dir atomically. It is
//! rebuilt at start from the checkpoint plus what the runtime reports (the
//! front ends' adapters build the records: CRI in the proxy, NRI beside it).
//! This module does no I/O itself and knows no transport.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use crate::cluster::ClusterPod;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

/// Annotation qoslet puts on containers it changed: the class.
pub const ANNOTATION_CLASS: &str = "qoslet.io/qos-class";
/// Annotation qoslet puts on containers it changed: what it set (`k=v,...`).
pub const ANNOTATION_APPLIED: &str = "qoslet.io/applied";
/// Annotation qoslet puts on containers whose resources it patched: kubelet's
/// own request (JSON [`Resources`]), since the runtime keeps only the patched one.
pub const ANNOTATION_REQUESTED: &str = "qoslet.io/requested";

/// Resources as kubelet expresses them for Linux (CRI `LinuxContainerResources`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Resources {
    pub cpu_period: i64,
    pub cpu_quota: i64,
    pub cpu_shares: i64,
    pub memory_limit_in_bytes: i64,
    pub memory_swap_limit_in_bytes: i64,
    pub oom_score_adj: i64,
    pub cpuset_cpus: String,
    pub cpuset_mems: String,
    pub unified: BTreeMap<String, String>,
}

impl Resources {
    /// Applies a partial update as containerd does: a field the update leaves
    /// 0 or empty keeps its value (kubelet's static CPU manager sends
    /// cpuset-only updates), `unified` entries are merged by key.
    pub fn merge(&mut self, u: &Resources) {
        let num = |dst: &mut i64, v: i64| {
            if v != 0 {
                *dst = v;
            }
        };
        num(&mut self.cpu_period, u.cpu_period);
        num(&mut self.cpu_quota, u.cpu_quota);
        num(&mut self.cpu_shares, u.cpu_shares);
        num(&mut self.memory_limit_in_bytes, u.memory_limit_in_bytes);
        num(
            &mut self.memory_swap_limit_in_bytes,
            u.memory_swap_limit_in_bytes,
        );
        num(&mut self.oom_score_adj, u.oom_score_adj);
        if !u.cpuset_cpus.is_empty() {
            self.cpuset_cpus = u.cpuset_cpus.clone();
        }
        if !u.cpuset_mems.is_empty() {
            self.cpuset_mems = u.cpuset_mems.clone();
        }
        for (k, v) in &u.unified {
            self.unified.insert(k.clone(), v.clone());
        }
    }
}

/// Lifecycle state of a pod sandbox.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PodState {
    Ready,
    NotReady,
    #[default]
    Unknown,
}

/// Lifecycle state of a container.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ContainerState {
    Created,
    Running,
    Exited,
    #[default]
    Unknown,
}

impl PodState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ready => "ready",
            Self::NotReady => "notready",
            Self::Unknown => "unknown",
        }
    }
}

impl ContainerState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Created => "created",
            Self::Running => "running",
            Self::Exited => "exited",
            Self::Unknown => "unknown",
        }
    }
}

/// Where an entry's "requested" data came from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    /// Seen in kubelet's own request through the proxy.
    #[default]
    Kubelet,
    /// Reconstructed from the runtime's status (qoslet was not running when it was created).
    Runtime,
    /// Told by the runtime through NRI (qoslet runs as a plugin: its events and
    /// synchronization carry the pod's and container's specs).
    Nri,
}

/// A pod sandbox.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct PodRecord {
    pub id: String,
    pub name: String,
    pub namespace: String,
    pub uid: String,
    pub attempt: u32,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    pub cgroup_parent: String,
    pub runtime_handler: String,
    pub overhead: Option<Resources>,
    pub resources: Option<Resources>,
    pub state: PodState,
    /// Unix nanoseconds.
    pub created_at: i64,
    /// The pod's `spec.priority`, when a source knows it (the cluster side;
    /// CRI does not carry it).
    pub priority: Option<i32>,
    pub source: Source,
    /// What qoslet applied: setting -> value.
    pub applied: BTreeMap<String, String>,
}

impl PodRecord {
    /// What the sandbox asked for the whole pod (its own resources), as the
    /// decisions take it.
    pub fn sandbox_limits(&self) -> qoslet_hooks::decide::SandboxLimits {
        self.resources
            .as_ref()
            .map(|r| qoslet_hooks::decide::SandboxLimits {
                memory_limit: r.memory_limit_in_bytes,
                cpu_quota: r.cpu_quota,
                cpu_period: r.cpu_period,
            })
            .unwrap_or_default()
    }
}

/// A container.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ContainerRecord {
    pub id: String,
    pub pod_id: String,
    pub name: String,
    pub attempt: u32,
    pub image: String,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    // No `envs`: kubelet resolves secretKeyRef into CRI envs, and nothing in qoslet
    // reads them, so they are never kept (nor checkpointed).
    /// What kubelet asked for: CreateContainer's resources, then its UpdateContainerResources.
    pub requested: Option<Resources>,
    pub state: ContainerState,
    pub created_at: i64,
    pub source: Source,
    pub applied: BTreeMap<String, String>,
}

/// Now, in Unix nanoseconds (records' `created_at`).
pub fn now_nanos() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0)
}

/// A point-in-time copy of the store (also the checkpoint's payload).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Snapshot {
    pub pods: Vec<PodRecord>,
    pub containers: Vec<ContainerRecord>,
}

#[derive(Default)]
struct Inner {
    // shared records: a snapshot (the checkpoint) takes references under the
    // lock and copies outside it; a write copies a record only while a
    // snapshot still holds it
    pods: HashMap<String, Arc<PodRecord>>,
    containers: HashMap<String, Arc<ContainerRecord>>,
    /// Counts kubelet's changes (the calls qoslet forwarded).
    seq: u64,
    /// Entry id -> `seq` of kubelet's last change to it, removals included (a
    /// tombstone), kept until no resync that started earlier can still apply.
    touched: HashMap<String, u64>,
    /// The cluster's pods of this node by UID (not checkpointed).
    cluster: HashMap<String, Arc<ClusterPod>>,
}

impl Inner {
    /// Notes that kubelet changed `id` now.
    fn touch(&mut self, id: &str) {
        self.seq += 1;
        self.touched.insert(id.to_string(), self.seq);
        // only a resync pruned these; a front end that resyncs rarely (NRI:
        // at each registration) must not keep every id ever touched. A resync
        // spans far fewer than TOUCHED_KEPT changes.
        if self.touched.len() > 2 * TOUCHED_KEPT {
            let floor = self.seq.saturating_sub(TOUCHED_KEPT as u64);
            self.touched.retain(|_, &mut t| t > floor);
        }
    }

    /// Whether kubelet changed `id` after `seq`.
    fn touched_after(&self, id: &str, seq: u64) -> bool {
        self.touched.get(id).is_some_and(|&t| t > seq)
    }
}

/// The most recent changes remembered for a resync's race check.
const TOUCHED_KEPT: usize = 4096;

/// Shared handle to the store. Clones are cheap and see the same data.
#[derive(Clone)]
pub struct Store {
    inner: Arc<RwLock<Inner>>,
    /// The generation, read without a lock on every call path.
    generation: Arc<AtomicU64>,
    /// The generation again, for any number of subscribers ([`Store::subscribe`]).
    changes: Arc<watch::Sender<u64>>,
}

impl Default for Store {
    fn default() -> Self {
        Self {
            inner: Arc::default(),
            generation: Arc::default(),
            changes: Arc::new(watch::Sender::new(0)),
        }
    }
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (pods, containers) = self.counts();
        f.debug_struct("Store")
            .field("generation", &self.generation())
            .field("pods", &pods)
            .field("containers", &containers)
            .finish()
    }
}

impl Store {
    pub fn new() -> Self {
        Self::default()
    }

    fn write<R>(&self, f: impl FnOnce(&mut Inner) -> R) -> R {
        self.write_if(|s| (f(s), true))
    }

    /// [`Store::write`] that marks the store changed (a new generation, a
    /// checkpoint) only when `f` says it changed something.
    fn write_if<R>(&self, f: impl FnOnce(&mut Inner) -> (R, bool)) -> R {
        let (r, changed) = {
            let mut g = self.inner.write().unwrap_or_else(|e| e.into_inner());
            f(&mut g)
        };
        if changed {
            let next = self.generation.fetch_add(1, Ordering::AcqRel) + 1;
            // two writers may publish out of order: a subscriber only ever sees it grow
            self.changes.send_if_modified(|g| {
                let newer = next > *g;
                if newer {
                    *g = next;
                }
                newer
            });
        }
        r
    }

    /// A number that changes whenever the store does (to cache views of it).
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// A receiver of the store's generation: its `changed()` resolves after
    /// each change (changes in a burst coalesce). Any number may subscribe
    /// (the checkpoint writer, the engine, eviction, a front end); each sees
    /// only changes made after it subscribed.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    fn read<R>(&self, f: impl FnOnce(&Inner) -> R) -> R {
        let g = self.inner.read().unwrap_or_else(|e| e.into_inner());
        f(&g)
    }

    pub fn upsert_pod(&self, pod: PodRecord) {
        self.write(|s| {
            s.touch(&pod.id);
            s.pods.insert(pod.id.clone(), Arc::new(pod))
        });
    }

    pub fn upsert_container(&self, c: ContainerRecord) {
        self.write(|s| {
            s.touch(&c.id);
            s.containers.insert(c.id.clone(), Arc::new(c))
        });
    }

    pub fn set_pod_state(&self, id: &str, state: PodState) {
        self.write(|s| {
            if let Some(p) = s.pods.get_mut(id) {
                Arc::make_mut(p).state = state;
            }
        });
    }

    /// StopPodSandbox: the pod is not ready and all its containers have exited.
    pub fn set_pod_stopped(&self, id: &str) {
        self.write(|s| {
            s.touch(id);
            if let Some(p) = s.pods.get_mut(id) {
                Arc::make_mut(p).state = PodState::NotReady;
            }
            let ids: Vec<String> = s
                .containers
                .values_mut()
                .filter(|c| c.pod_id == id)
                .map(|c| {
                    Arc::make_mut(c).state = ContainerState::Exited;
                    c.id.clone()
                })
                .collect();
            for c in ids {
                s.touch(&c);
            }
        });
    }

    pub fn set_container_state(&self, id: &str, state: ContainerState) {
        self.write(|s| {
            s.touch(id);
            if let Some(c) = s.containers.get_mut(id) {
                Arc::make_mut(c).state = state;
            }
        });
    }

    pub fn has_pod(&self, id: &str) -> bool {
        self.read(|s| s.pods.contains_key(id))
    }

    pub fn has_container(&self, id: &str) -> bool {
        self.read(|s| s.containers.contains_key(id))
    }

    /// A container state the runtime reported (an event): never back from
    /// exited (the runtime never restarts an id; a late "started" event must not
    /// undo an exit already seen), and a change only if it is one.
    pub fn observe_container_state(&self, id: &str, state: ContainerState) {
        self.write_if(|s| {
            let changed = match s.containers.get_mut(id) {
                Some(c)
                    if c.state != state
                        && !(c.state == ContainerState::Exited
                            && state != ContainerState::Exited) =>
                {
                    Arc::make_mut(c).state = state;
                    true
                }
                _ => false,
            };
            if changed {
                s.touch(id);
            }
            ((), changed)
        });
    }

    /// The runtime reported the sandbox stopped (its task exited): the pod is not
    /// ready. Its containers keep their own states (they may still run until
    /// kubelet stops them; their own events say when they exit).
    pub fn observe_pod_not_ready(&self, id: &str) {
        self.write_if(|s| {
            let changed = match s.pods.get_mut(id) {
                Some(p) if p.state == PodState::Ready => {
                    Arc::make_mut(p).state = PodState::NotReady;
                    true
                }
                _ => false,
            };
            if changed {
                s.touch(id);
            }
            ((), changed)
        });
    }

    /// Records kubelet's `UpdateContainerResources`, merged over what it asked
    /// before as containerd merges it (a partial update keeps the rest).
    pub fn set_container_resources(&self, id: &str, r: Resources) {
        self.write(|s| {
            if let Some(c) = s.containers.get_mut(id) {
                let c = Arc::make_mut(c);
                match &mut c.requested {
                    Some(cur) => cur.merge(&r),
                    None => c.requested = Some(r),
                }
            }
        });
    }

    /// Records what qoslet applied to a pod (`key` -> `value`).
    pub fn set_pod_applied(&self, id: &str, key: &str, value: &str) {
        self.write_if(|s| {
            let changed = match s.pods.get_mut(id) {
                Some(p) if p.applied.get(key).map(String::as_str) != Some(value) => {
                    Arc::make_mut(p).applied.insert(key.into(), value.into());
                    true
                }
                _ => false,
            };
            ((), changed)
        });
    }

    /// Records what qoslet applied to a container (`key` -> `value`).
    pub fn set_container_applied(&self, id: &str, key: &str, value: &str) {
        self.write_if(|s| {
            let changed = match s.containers.get_mut(id) {
                Some(c) if c.applied.get(key).map(String::as_str) != Some(value) => {
                    Arc::make_mut(c).applied.insert(key.into(), value.into());
                    true
                }
                _ => false,
            };
            ((), changed)
        });
    }

    /// Removes a pod and every container of it.
    pub fn remove_pod(&self, id: &str) -> Option<PodRecord> {
        self.write(|s| {
            s.touch(id);
            let gone: Vec<String> = s
                .containers
                .values()
                .filter(|c| c.pod_id == id)
                .map(|c| c.id.clone())
                .collect();
            for c in gone {
                s.touch(&c);
                s.containers.remove(&c);
            }
            s.pods.remove(id).map(Arc::unwrap_or_clone)
        })
    }

    pub fn remove_container(&self, id: &str) -> Option<ContainerRecord> {
        self.write(|s| {
            s.touch(id);
            s.containers.remove(id).map(Arc::unwrap_or_clone)
        })
    }

    /// The cluster's pods of this node, all at once (after a list): a new
    /// generation only when something the agent reads changed.
    pub fn replace_cluster_pods(&self, pods: Vec<ClusterPod>) {
        self.write_if(|s| {
            let next: HashMap<String, Arc<ClusterPod>> = pods
                .into_iter()
                .map(|p| (p.uid.clone(), Arc::new(p)))
                .collect();
            let changed = next.len() != s.cluster.len()
                || next
                    .iter()
                    .any(|(uid, p)| s.cluster.get(uid).is_none_or(|q| q != p));
            if changed {
                s.cluster = next;
            }
            ((), changed)
        });
    }

    /// One cluster pod added or changed (a new generation only when it differs).
    pub fn upsert_cluster_pod(&self, pod: ClusterPod) {
        self.write_if(|s| {
            if s.cluster.get(&pod.uid).is_some_and(|q| **q == pod) {
                return ((), false);
            }
            s.cluster.insert(pod.uid.clone(), Arc::new(pod));
            ((), true)
        });
    }

    /// One cluster pod deleted.
    pub fn remove_cluster_pod(&self, uid: &str) {
        self.write_if(|s| ((), s.cluster.remove(uid).is_some()));
    }

    /// What the cluster says of the pod with this UID.
    pub fn cluster_pod(&self, uid: &str) -> Option<Arc<ClusterPod>> {
        self.read(|s| s.cluster.get(uid).cloned())
    }

    /// Every cluster pod known.
    pub fn cluster_pod_list(&self) -> Vec<Arc<ClusterPod>> {
        self.read(|s| s.cluster.values().cloned().collect())
    }

    /// How many cluster pods are known.
    pub fn cluster_pods(&self) -> usize {
        self.read(|s| s.cluster.len())
    }

    pub fn pod(&self, id: &str) -> Option<PodRecord> {
        self.read(|s| s.pods.get(id).map(|p| PodRecord::clone(p)))
    }

    pub fn container(&self, id: &str) -> Option<ContainerRecord> {
        self.read(|s| s.containers.get(id).map(|c| ContainerRecord::clone(c)))
    }

    /// The pod a container belongs to.
    pub fn pod_of(&self, container_id: &str) -> Option<PodRecord> {
        self.read(|s| {
            s.containers
                .get(container_id)
                .and_then(|c| s.pods.get(&c.pod_id))
                .map(|p| PodRecord::clone(p))
        })
    }

    /// Read access to every pod and container without copying them (`f` runs
    /// under the store's lock: keep it short).
    pub fn read_all<R>(
        &self,
        f: impl FnOnce(&HashMap<String, Arc<PodRecord>>, &HashMap<String, Arc<ContainerRecord>>) -> R,
    ) -> R {
        self.read(|s| f(&s.pods, &s.containers))
    }

    /// [`Store::read_all`] with the cluster's pods by UID.
    pub fn read_all_with_cluster<R>(
        &self,
        f: impl FnOnce(
            &HashMap<String, Arc<PodRecord>>,
            &HashMap<String, Arc<ContainerRecord>>,
            &HashMap<String, Arc<ClusterPod>>,
        ) -> R,
    ) -> R {
        self.read(|s| f(&s.pods, &s.containers, &s.cluster))
    }

    /// (pods, containers)
    pub fn counts(&self) -> (usize, usize) {
        self.read(|s| (s.pods.len(), s.containers.len()))
    }

    /// A sorted copy of everything (pods by namespace/name, containers by pod/name).
    pub fn snapshot(&self) -> Snapshot {
        // only references are taken under the lock (kubelet's calls wait on it);
        // the copies and the sorting happen after
        let (pods, containers): (Vec<Arc<PodRecord>>, Vec<Arc<ContainerRecord>>) = self.read(|s| {
            (
                s.pods.values().cloned().collect(),
                s.containers.values().cloned().collect(),
            )
        });
        let mut pods: Vec<PodRecord> = pods.into_iter().map(Arc::unwrap_or_clone).collect();
        pods.sort_by(|a, b| (&a.namespace, &a.name, &a.id).cmp(&(&b.namespace, &b.name, &b.id)));
        let mut containers: Vec<ContainerRecord> =
            containers.into_iter().map(Arc::unwrap_or_clone).collect();
        containers.sort_by(|a, b| (&a.pod_id, &a.name, &a.id).cmp(&(&b.pod_id, &b.name, &b.id)));
        Snapshot { pods, containers }
    }

    /// [`Store::snapshot`] with the point it was taken at, for a resync.
    pub fn snapshot_for_resync(&self) -> (u64, Snapshot) {
        let seq = self.read(|s| s.seq);
        // seq first: a change between the two is newer than `seq` and so wins
        (seq, self.snapshot())
    }

    /// Applies a resync: `before` is the snapshot the runtime listing started
    /// from (taken at `seq`), `after` what the front end's rebuild made
    /// of it. kubelet's calls that landed during the listing win: an entry
    /// kubelet removed after `seq` is not brought back, one it changed keeps
    /// the store's state. Otherwise entries the runtime lacks are removed only
    /// if they were already in `before` (so a pod created during the listing
    /// survives); entries only the runtime has are added; entries in both keep
    /// the store's data and take the runtime's state. Returns (added, removed).
    pub fn apply_resync(&self, seq: u64, before: &Snapshot, after: Snapshot) -> (usize, usize) {
        let (mut added, mut removed, mut states) = (0, 0, 0);
        self.write_if(|s| {
            let after_pods: HashMap<&str, &PodRecord> =
                after.pods.iter().map(|p| (p.id.as_str(), p)).collect();
            let after_ctrs: HashMap<&str, &ContainerRecord> = after
                .containers
                .iter()
                .map(|c| (c.id.as_str(), c))
                .collect();
            for p in &before.pods {
                if !after_pods.contains_key(p.id.as_str())
                    && !s.touched_after(&p.id, seq)
                    && s.pods.remove(&p.id).is_some()
                {
                    removed += 1;
                }
            }
            for c in &before.containers {
                if !after_ctrs.contains_key(c.id.as_str())
                    && !s.touched_after(&c.id, seq)
                    && s.containers.remove(&c.id).is_some()
                {
                    removed += 1;
                }
            }
            for p in &after.pods {
                let newer = s.touched_after(&p.id, seq);
                match s.pods.get_mut(&p.id) {
                    Some(_) if newer => {}
                    Some(cur) if cur.state != p.state => {
                        Arc::make_mut(cur).state = p.state;
                        states += 1;
                    }
                    Some(_) => {}
                    None if newer => {} // removed by kubelet during the listing
                    None => {
                        s.pods.insert(p.id.clone(), Arc::new(p.clone()));
                        added += 1;
                    }
                }
            }
            for c in &after.containers {
                let newer = s.touched_after(&c.id, seq);
                match s.containers.get_mut(&c.id) {
                    Some(_) if newer => {}
                    Some(cur) if cur.state != c.state => {
                        Arc::make_mut(cur).state = c.state;
                        states += 1;
                    }
                    Some(_) => {}
                    None if newer => {}
                    None => {
                        s.containers.insert(c.id.clone(), Arc::new(c.clone()));
                        added += 1;
                    }
                }
            }
            // what no later resync can still race with
            s.touched.retain(|_, &mut t| t > seq);
            // an unchanged store stays the same generation: no checkpoint
            // rewrite, no rebuilt views in the engine and collector
            ((), added + removed + states > 0)
        });
        (added, removed)
    }

    /// Replaces the whole content (used by the rebuild at start).
    pub fn replace(&self, snap: Snapshot) {
        self.write(|s| {
            s.pods = snap
                .pods
                .into_iter()
                .map(|p| (p.id.clone(), Arc::new(p)))
                .collect();
            s.containers = snap
                .containers
                .into_iter()
                .map(|c| (c.id.clone(), Arc::new(c)))
                .collect();
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resync_bookkeeping_stays_bounded_without_resyncs() {
        let store = Store::new();
        for i in 0..20_000 {
            store.set_container_state(&format!("c{i}"), ContainerState::Running);
        }
        let kept = store.read(|s| s.touched.len());
        assert!(kept <= 2 * TOUCHED_KEPT, "{kept} ids remembered");
        // the latest changes are still known to a resync
        assert!(store.read(|s| s.touched_after("c19999", 0)));
    }

    fn pod(id: &str, name: &str) -> PodRecord {
        PodRecord {
            id: id.into(),
            name: name.into(),
            namespace: "ns".into(),
            state: PodState::Ready,
            ..Default::default()
        }
    }

    /// Every subscriber sees a change, not one of them (issue 28); a burst
    /// coalesces; an unchanged write wakes nobody.
    #[tokio::test]
    async fn many_subscribers_each_see_each_change() {
        let s = Store::new();
        let mut subs: Vec<_> = (0..3).map(|_| s.subscribe()).collect();
        s.upsert_pod(pod("p", "a"));
        s.upsert_pod(pod("q", "b"));
        for rx in &mut subs {
            assert!(rx.has_changed().unwrap());
            rx.changed().await.unwrap();
            assert_eq!(*rx.borrow_and_update(), s.generation());
            assert!(!rx.has_changed().unwrap(), "the burst coalesced");
        }
        s.set_pod_applied("p", "k", "v");
        s.set_pod_applied("p", "k", "v"); // the same value again: no change
        let g = s.generation();
        for rx in &mut subs {
            rx.changed().await.unwrap();
            assert_eq!(*rx.borrow_and_update(), g);
            assert!(!rx.has_changed().unwrap());
        }
        // a late subscriber sees only what comes after it
        let late = s.subscribe();
        assert!(!late.has_changed().unwrap());
        s.remove_pod("q");
        assert!(late.has_changed().unwrap());
    }

    /// kubelet's static CPU manager sends cpuset-only updates; containerd keeps
    /// the rest, and so does the store (issue 12: the caps read from it).
    #[test]
    fn partial_updates_merge_like_containerd() {
        let s = Store::new();
        s.upsert_container(ContainerRecord {
            id: "c".into(),
            requested: Some(Resources {
                cpu_period: 100_000,
                cpu_quota: 100_000,
                memory_limit_in_bytes: 64 << 20,
                cpuset_cpus: "0-3".into(),
                ..Default::default()
            }),
            ..Default::default()
        });
        s.set_container_resources(
            "c",
            Resources {
                cpuset_cpus: "1".into(),
                ..Default::default()
            },
        );
        let r = s.container("c").unwrap().requested.unwrap();
        assert_eq!(
            (r.cpu_quota, r.memory_limit_in_bytes, r.cpuset_cpus.as_str()),
            (100_000, 64 << 20, "1")
        );
        s.set_container_resources(
            "c",
            Resources {
                memory_limit_in_bytes: 32 << 20,
                ..Default::default()
            },
        );
        let r = s.container("c").unwrap().requested.unwrap();
        assert_eq!(
            (r.memory_limit_in_bytes, r.cpuset_cpus.as_str()),
            (32 << 20, "1")
        );
    }

    #[test]
    fn removing_a_pod_removes_its_containers() {
        let s = Store::new();
        s.upsert_pod(pod("p1", "a"));
        s.upsert_pod(pod("p2", "b"));
        for (c, p) in [("c1", "p1"), ("c2", "p1"), ("c3", "p2")] {
            s.upsert_container(ContainerRecord {
                id: c.into(),
                pod_id: p.into(),
                ..Default::default()
            });
        }
        assert_eq!(s.pod_of("c3").unwrap().id, "p2");
        assert!(s.remove_pod("p1").is_some());
        assert_eq!(s.counts(), (1, 1));
        assert!(s.container("c1").is_none());
        assert!(s.remove_container("c3").is_some());
        assert_eq!(s.counts(), (1, 0));
    }

    #[test]
    fn resync_merges_instead_of_replacing() {
        let s = Store::new();
        let pod = |id: &str| PodRecord {
            id: id.into(),
            ..Default::default()
        };
        s.upsert_pod(pod("gone"));
        s.upsert_pod(pod("kept"));
        s.set_pod_applied("kept", "k", "v");
        let (seq, before) = s.snapshot_for_resync();
        // during the listing, kubelet creates "new" through the proxy
        s.upsert_pod(pod("new"));
        // the runtime says: "kept" (now not ready) and "foreign" (created behind qoslet's back)
        let after = Snapshot {
            pods: vec![
                PodRecord {
                    state: PodState::NotReady,
                    ..pod("kept")
                },
                PodRecord {
                    source: Source::Runtime,
                    ..pod("foreign")
                },
            ],
            containers: vec![],
        };
        assert_eq!(s.apply_resync(seq, &before, after), (1, 1));
        assert!(s.pod("gone").is_none());
        assert!(s.pod("new").is_some(), "created during the listing: kept");
        let kept = s.pod("kept").unwrap();
        assert_eq!(
            (kept.state, kept.applied["k"].as_str()),
            (PodState::NotReady, "v")
        );
        assert_eq!(s.pod("foreign").unwrap().source, Source::Runtime);
    }

    /// Issue 15 item 5: a resync that finds nothing new, or an `applied`
    /// value recorded again, leaves the generation (and the checkpoint) alone.
    #[test]
    fn unchanged_store_keeps_its_generation() {
        let s = Store::new();
        s.upsert_pod(PodRecord {
            id: "p".into(),
            state: PodState::Ready,
            ..Default::default()
        });
        s.set_pod_applied("p", "class", "BE");
        let g = s.generation();
        s.set_pod_applied("p", "class", "BE");
        let (seq, before) = s.snapshot_for_resync();
        assert_eq!(s.apply_resync(seq, &before, before.clone()), (0, 0));
        assert_eq!(s.generation(), g, "nothing changed");
        s.set_pod_applied("p", "class", "LS");
        assert_ne!(s.generation(), g);
    }

    /// Issue 15: kubelet's calls that land between a resync's listing and
    /// its apply win: a removed pod is not brought back, a stopped one is not
    /// made Ready again (nor its containers Running).
    #[test]
    fn resync_never_reverts_kubelet_calls_made_during_the_listing() {
        let s = Store::new();
        let pod = |id: &str| PodRecord {
            id: id.into(),
            state: PodState::Ready,
            ..Default::default()
        };
        let ctr = |id: &str, pod: &str| ContainerRecord {
            id: id.into(),
            pod_id: pod.into(),
            state: ContainerState::Running,
            ..Default::default()
        };
        s.upsert_pod(pod("removed"));
        s.upsert_container(ctr("rc", "removed"));
        s.upsert_pod(pod("stopped"));
        s.upsert_container(ctr("sc", "stopped"));
        let (seq, before) = s.snapshot_for_resync();
        // the runtime's listing still has both, running
        let after = before.clone();
        // meanwhile kubelet removes one and stops the other through qoslet
        s.remove_pod("removed");
        s.set_pod_stopped("stopped");
        assert_eq!(s.apply_resync(seq, &before, after), (0, 0));
        assert!(s.pod("removed").is_none(), "not resurrected");
        assert!(s.container("rc").is_none(), "nor its container");
        assert_eq!(s.pod("stopped").unwrap().state, PodState::NotReady);
        assert_eq!(s.container("sc").unwrap().state, ContainerState::Exited);
        // the next resync, started after those calls, applies the runtime's view again
        let (seq2, before2) = s.snapshot_for_resync();
        let mut after2 = before2.clone();
        after2.pods.retain(|p| p.id != "stopped");
        after2.containers.clear();
        assert_eq!(s.apply_resync(seq2, &before2, after2), (0, 2));
        assert_eq!(s.counts(), (0, 0));
    }

    #[test]
    fn state_resources_and_applied_updates() {
        let s = Store::new();
        s.upsert_pod(pod("p", "a"));
        s.upsert_container(ContainerRecord {
            id: "c".into(),
            pod_id: "p".into(),
            ..Default::default()
        });
        s.set_container_state("c", ContainerState::Running);
        s.set_container_resources(
            "c",
            Resources {
                cpu_quota: 5,
                ..Default::default()
            },
        );
        s.set_container_applied("c", "cpu.idle", "1");
        s.set_pod_state("p", PodState::NotReady);
        s.set_pod_applied("p", "class", "BE");
        let c = s.container("c").unwrap();
        assert_eq!(
            (c.state, c.requested.unwrap().cpu_quota),
            (ContainerState::Running, 5)
        );
        assert_eq!(c.applied["cpu.idle"], "1");
        assert_eq!(s.pod("p").unwrap().state, PodState::NotReady);
        assert_eq!(s.pod("p").unwrap().applied["class"], "BE");
        // unknown ids are ignored, not created
        s.set_container_state("nope", ContainerState::Exited);
        assert_eq!(s.counts(), (1, 1));
    }
}
