//! The eviction loop: kubelet's node-pressure model and Koordinator's BE
//! memory model (the decisions are the `qoslet-eviction` room's) run every
//! second and whenever the kernel says memory crossed a threshold (cgroup v1's
//! memory threshold notification), read the node and the pods directly, and
//! evict through an [`Evictor`] (CRI here). What it concludes is the agent's
//! [`EvictionView`]: the node conditions and their figures (admission reads
//! them), the recent evictions, the counters.
//!
//! Koordinator's BE CPU-satisfaction eviction samples the QoS engine's ticks
//! ([`be_cpu`]).

pub mod be_cpu;
mod candidates;
pub mod cri;
pub mod notify;
pub mod observe;
pub mod persist;
pub mod view;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use qoslet_cgroups::CgroupPath;
use qoslet_eviction::evictor::{EvictRequest, Evicted, Evictor, Model};
use qoslet_eviction::koord::{
    self, CpuHistory, CpuPolicy, CpuPolicyError, EvictionPolicy, Koord, MemoryPolicy, NodeMemory,
};
use qoslet_eviction::kubelet::CLEANUP_WAIT;
use qoslet_eviction::kubelet::{Kubelet, Observations, Pressure};
use qoslet_eviction::{Eviction, FsUse, Pod, PodStats, Requests, Signal};
use qoslet_hooks::class::{KubeQos, QosClass, LABEL_SKIP};
use qoslet_state::inventory::{ContainerEntry, Inventories, PodEntry};
use qoslet_state::store::{ContainerState, Store};
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

use self::candidates::{candidates, Candidate};
use self::observe::Sources;
use self::view::{model_index, unix_now};
pub use self::view::{Admission, EvictionView, Met, Record, MAX_RECORDS, READMIT_AFTER};
/// What the loop needs.
pub struct EvictionLoop {
    pub config: Eviction,
    pub sources: Sources,
    pub evictor: Arc<dyn Evictor>,
    pub interval: Duration,
    /// Where the records survive a restart (`None`: the state dir is unusable).
    pub persist: Option<Arc<persist::Persist>>,
    /// The `eviction:` section as reloads publish it (`None`: not reloaded).
    pub reload: Option<tokio::sync::watch::Receiver<Eviction>>,
}

/// The Koordinator BE memory policy in force, when it is enabled.
pub fn be_memory_policy(
    p: &qoslet_qos_engine::policy::ResourceThresholdStrategy,
) -> Option<Result<MemoryPolicy, koord::MemoryPolicyError>> {
    if !p.enable {
        return None;
    }
    Some(MemoryPolicy::new(
        Some(p.memory_evict_threshold_percent),
        p.memory_evict_lower_percent,
    ))
}

/// What one cycle read of the node, off the async workers.
struct Reading {
    obs: Observations,
    errors: Vec<(Signal, observe::ObserveError)>,
    /// Koordinator's node memory (used, capacity).
    koord_node: Option<NodeMemory>,
    /// The working set of the last victim's cgroup (`None`: gone).
    victim_ws: Option<i64>,
    /// When the reading started.
    started: Instant,
}

/// The victim kubelet's model waits for: its cgroup, its working set when
/// evicted, when.
struct Cleanup {
    uid: String,
    /// The signal it was evicted for (what its cleanup is).
    signal: Signal,
    cgroup: CgroupPath,
    working_set: i64,
    since: Instant,
}

/// How an eviction ended, as the loop settles it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    /// Stopped, gone, or (dry run) what would have been.
    Done,
    /// Accepted and under way (the Eviction API deletes the pod; kubelet
    /// stops it within its grace period): followed until the pod is gone.
    Stopping(Duration),
    /// A PodDisruptionBudget refused it: passed over [`REFUSED_BACKOFF`].
    Refused,
    Failed,
}

impl Outcome {
    fn accepted(self) -> bool {
        matches!(self, Self::Done | Self::Stopping(_))
    }
}

/// A victim a budget refused is passed over this long (the next candidate
/// is taken; budgets change slowly).
const REFUSED_BACKOFF: Duration = Duration::from_secs(300);
/// A pod being deleted is followed this long past its grace period before
/// it may be chosen again.
const TERMINATING_MARGIN: Duration = Duration::from_secs(30);
/// A victim whose eviction failed is passed over this long.
const FAILED_BACKOFF: Duration = Duration::from_secs(30);
/// Readings slower than this are given up on for the cycle.
const READ_TIMEOUT: Duration = Duration::from_secs(5);
/// The loop's clock starts this far back, so that a restart's restored
/// times (minutes back at most) have a place on it.
const RESTORE_HORIZON: Duration = Duration::from_secs(900);
/// Cycles the kernel's notifications drive are at least this far apart.
const MIN_CYCLE_GAP: Duration = Duration::from_millis(100);

/// What an eviction needs, off the loop.
#[derive(Clone)]
struct Acting {
    view: Arc<EvictionView>,
    evictor: Arc<dyn Evictor>,
    store: Store,
    dry_run: bool,
    persist: Option<Arc<persist::Persist>>,
}

impl Acting {
    /// Evicts (or, in dry run, says it would) and records it.
    async fn evict(self, req: EvictRequest, latency: Option<Duration>) -> Outcome {
        if let Some(l) = latency {
            let mut q = self.view.latencies.lock().unwrap();
            if q.len() >= MAX_RECORDS {
                q.pop_front();
            }
            q.push_back(l);
        }
        let latency_ms = latency.map(|l| l.as_secs_f64() * 1000.0);
        let pod = format!("{}/{}", req.namespace, req.name);
        let outcome = if self.dry_run {
            info!(pod = %pod, model = req.model.as_str(), grace = req.grace_seconds, latency_ms = ?latency_ms, message = %req.message, "dry run: would evict");
            "dry run".to_string()
        } else {
            let outcome = match self.evictor.evict(&req).await {
                Ok(Evicted::Stopped) => {
                    self.store.set_pod_stopped(&req.sandbox_id);
                    "stopped".into()
                }
                Ok(Evicted::Stopping) => "stopping".into(),
                Ok(Evicted::Gone) => "gone".into(),
                Ok(Evicted::Refused(why)) => format!("refused: {why}"),
                Err(e) => {
                    self.view.failures.fetch_add(1, Ordering::Relaxed);
                    format!("failed: {}", e.reason)
                }
            };
            warn!(pod = %pod, model = req.model.as_str(), grace = req.grace_seconds, signal = ?req.signal.map(|s| s.as_str()), observed = ?req.observed, threshold = ?req.threshold, latency_ms = ?latency_ms, outcome = %outcome, message = %req.message, "evicted");
            outcome
        };
        let done = matches!(outcome.as_str(), "stopped" | "stopping" | "gone");
        let settled = if self.dry_run || matches!(outcome.as_str(), "stopped" | "gone") {
            Outcome::Done
        } else if outcome == "stopping" {
            Outcome::Stopping(Duration::from_secs(req.grace_seconds.max(1) as u64))
        } else if outcome.starts_with("refused") {
            Outcome::Refused
        } else {
            Outcome::Failed
        };
        if done || self.dry_run {
            // in dry run: what would have been
            self.view.evictions[model_index(req.model)].fetch_add(1, Ordering::Relaxed);
        }
        if done {
            self.view.evicted_uid(&req.uid, req.model.as_str());
        }
        self.view.record(Record {
            at: unix_now(),
            sandbox_id: req.sandbox_id.clone(),
            uid: req.uid.clone(),
            namespace: req.namespace.clone(),
            name: req.name.clone(),
            reason: req.model.as_str(),
            signal: req.signal,
            observed: req.observed,
            threshold: req.threshold,
            grace_seconds: req.grace_seconds,
            message: req.message.clone(),
            dry_run: self.dry_run,
            outcome,
        });
        if let Some(p) = &self.persist {
            let view = self.view.clone();
            p.save(move || view.records()).await;
        }
        settled
    }
}

/// The loop's state between cycles.
struct Cycle {
    cfg: EvictionLoop,
    /// The agent's views (the QoS engine's, for BE CPU samples).
    views: Arc<crate::admin::Views>,
    /// BE CPU samples, one per engine tick, and the last tick's per-pod figures.
    cpu_history: CpuHistory,
    be_cpu_seq: Option<u64>,
    be_cpu_pods: HashMap<String, (i64, i64)>,
    kubelet: Kubelet,
    koord: Koord,
    view: Arc<EvictionView>,
    start: Instant,
    warned: BTreeMap<String, ()>,
    /// When the kernel's notification woke this cycle (`None`: the tick did).
    woke_at: Option<Instant>,
    /// kubelet's model: the eviction under way (one at a time), by pod UID.
    acting: Option<(String, JoinHandle<Outcome>)>,
    /// Pods an evictor is deleting (the Eviction API accepted them), by UID,
    /// until when they are followed: never chosen again meanwhile, and the
    /// cleanup of a non-memory victim waits for them.
    terminating: HashMap<String, Instant>,
    /// Pods a budget refused lately, by UID (every model passes them over).
    refused: HashMap<String, Instant>,
    /// kubelet's model: victims whose eviction failed lately.
    failed: HashMap<String, Instant>,
    /// How Koordinator-model evictions ended (their pod UIDs).
    outcomes: tokio::sync::mpsc::UnboundedSender<(String, Outcome)>,
    outcomes_rx: tokio::sync::mpsc::UnboundedReceiver<(String, Outcome)>,
    /// kubelet's model: the last victim, until its memory is released.
    cleanup: Option<Cleanup>,
    /// When the last reading succeeded.
    last_read: Instant,
    /// A reading still running (a hung filesystem): no second one is started.
    reading: Option<JoinHandle<Reading>>,
    /// Node-level disk reclaim under way.
    reclaiming: Option<JoinHandle<()>>,
    /// When the last disk reclaim finished: within [`CLEANUP_WAIT`] of it, a
    /// disk threshold still met evicts a pod (the reclaim was not enough).
    reclaimed_at: Arc<Mutex<Option<Instant>>>,
}

impl Cycle {
    /// A reloaded `eviction:` section: thresholds, grace periods, transition,
    /// scope, capacity, filesystems, dry run and the Koordinator gates take
    /// effect at once (kubelet's model keeps what it observed of thresholds
    /// that stay); `enable: false` idles the loop and clears its conditions.
    /// `imageMinimumGCAge` and turning a loop on that was off at start take a
    /// restart.
    fn reconfigure(&mut self, e: Eviction) {
        if e == self.cfg.config {
            return;
        }
        match self.cfg.sources.reconfigured(&e) {
            Ok(s) => self.cfg.sources = s,
            Err(err) => {
                warn!(error = %err, "eviction: the reloaded section is refused; the last good one stays");
                return;
            }
        }
        if e.enabled && self.cfg.config.enabled {
            self.kubelet.reconfigure(e.kubelet.clone());
        } else {
            // off, or back on: what was observed before is no longer so
            // (a soft threshold met again waits its grace period afresh)
            self.kubelet = Kubelet::new(e.kubelet.clone());
        }
        self.view.dry_run.store(e.dry_run, Ordering::Relaxed);
        if !e.enabled {
            self.view.set_pressure(vec![], vec![]);
        }
        info!(
            enabled = e.enabled,
            thresholds = e.kubelet.thresholds.len(),
            dry_run = e.dry_run,
            be_memory = e.be_memory_evict,
            be_cpu = e.be_cpu_evict,
            "eviction: reloaded section in force"
        );
        self.cfg.config = e;
    }

    fn warn_once(&mut self, key: String, msg: &str) {
        if self.warned.len() < 1024 && self.warned.insert(key.clone(), ()).is_none() {
            warn!(what = %key, "{msg}");
        }
    }

    fn acting(&self, store: &Store) -> Acting {
        Acting {
            view: self.view.clone(),
            evictor: self.cfg.evictor.clone(),
            store: store.clone(),
            dry_run: self.cfg.config.dry_run,
            persist: self.cfg.persist.clone(),
        }
    }

    fn publish(&self, p: &Pressure, obs: &Observations) {
        let met = p
            .met
            .iter()
            .chain(p.waiting.iter().map(|(t, _)| t))
            .filter_map(|t| {
                let o = obs.get(&t.signal)?;
                Some(Met {
                    signal: t.signal,
                    observed: o.available,
                    threshold: t.value.of(o.capacity),
                    hard: t.is_hard(),
                })
            })
            .collect::<Vec<Met>>();
        self.view.set_pressure(p.conditions.clone(), met);
    }

    /// kubelet's node-level reclaim for a disk signal: true while it is under
    /// way or about to start (no pod this cycle); false once a reclaim ended
    /// lately and the threshold is still met (a pod goes), or when the
    /// evictor cannot reclaim.
    fn reclaim_first(&mut self, signal: Signal, read_started: Instant) -> bool {
        if self.reclaiming.as_ref().is_some_and(|t| !t.is_finished()) {
            return true;
        }
        let ended = *self.reclaimed_at.lock().unwrap();
        if let Some(at) = ended {
            // the figures must be read after the reclaim ended (kubelet
            // observes again before it evicts any pod)
            if at >= read_started {
                return true;
            }
            if at.elapsed() < CLEANUP_WAIT {
                return false;
            }
        }
        if self.cfg.config.dry_run {
            info!(signal = %signal, "dry run: would garbage-collect containers and images before any pod");
            *self.reclaimed_at.lock().unwrap() = Some(Instant::now());
            return false;
        }
        if self.cfg.evictor.reclaim_disk().is_none() {
            self.warn_once(
                format!("reclaim {signal}"),
                &format!(
                    "{signal} is met and the evictor cannot reclaim disk: pods are evicted at once"
                ),
            );
            return false;
        }
        let evictor = self.cfg.evictor.clone();
        let view = self.view.clone();
        let done = self.reclaimed_at.clone();
        self.reclaiming = Some(tokio::spawn(async move {
            let Some(gc) = evictor.reclaim_disk() else {
                return;
            };
            let r = gc.await;
            warn!(signal = %signal, containers = r.containers, images = ?r.images, errors = ?r.errors, "node-level reclaim (garbage collection) before any pod");
            view.record(Record {
                at: unix_now(),
                sandbox_id: String::new(),
                uid: String::new(),
                namespace: String::new(),
                name: String::new(),
                reason: "node-reclaim",
                signal: Some(signal),
                observed: None,
                threshold: None,
                grace_seconds: 0,
                message: format!(
                    "removed {} exited containers and {} unused images ({}){}",
                    r.containers,
                    r.images.len(),
                    r.images.join(", "),
                    if r.errors.is_empty() {
                        String::new()
                    } else {
                        format!("; errors: {}", r.errors.join("; "))
                    }
                ),
                dry_run: false,
                outcome: "reclaimed".into(),
            });
            *done.lock().unwrap() = Some(Instant::now());
        }));
        true
    }

    /// Reads the node and the pods off the async workers, within [`READ_TIMEOUT`].
    async fn read(&mut self) -> Option<Reading> {
        let mut task = match self.reading.take() {
            Some(t) => t,
            None => {
                let now = self.start.elapsed();
                let sources = self.cfg.sources.clone();
                let victim = self.cleanup.as_ref().map(|c| c.cgroup.clone());
                let started = Instant::now();
                tokio::task::spawn_blocking(move || {
                    let (obs, errors) = sources.observe(now);
                    let koord_node = sources
                        .koord_node_memory()
                        .ok()
                        .map(|(used, capacity)| NodeMemory { used, capacity });
                    let victim_ws = victim
                        .as_ref()
                        .and_then(|cg| sources.cgroup_memory(cg).ok())
                        .map(|m| m.working_set);
                    Reading {
                        obs,
                        errors,
                        koord_node,
                        victim_ws,
                        started,
                    }
                })
            }
        };
        match tokio::time::timeout(READ_TIMEOUT, &mut task).await {
            Ok(Ok(r)) => Some(r),
            Ok(Err(_)) => None,
            Err(_) => {
                self.warn_once(
                    "read".into(),
                    "reading the node took over 5 s (a hung filesystem?): this cycle decides nothing",
                );
                self.reading = Some(task);
                None
            }
        }
    }

    /// The pods with their memory, read only when a model needs them (a
    /// threshold met): a node under no pressure reads no pod's files.
    async fn candidates(
        &mut self,
        inventories: &Inventories,
        store: &Store,
    ) -> Option<Vec<Candidate>> {
        let sources = self.cfg.sources.clone();
        let inv = inventories.current();
        let store = store.clone();
        let task = tokio::task::spawn_blocking(move || candidates(&inv.pods, &sources, &store));
        match tokio::time::timeout(READ_TIMEOUT, task).await {
            Ok(Ok(c)) => Some(c),
            _ => {
                self.warn_once(
                    "pods".into(),
                    "reading the pods' memory took over 5 s: this cycle evicts nothing",
                );
                None
            }
        }
    }

    async fn run_once(
        &mut self,
        store: &Store,
        inventories: &Inventories,
        policy: Option<Result<MemoryPolicy, koord::MemoryPolicyError>>,
        cpu: Option<Result<CpuPolicy, CpuPolicyError>>,
    ) {
        let now = self.start.elapsed();
        self.settle().await;
        self.be_cpu_round(now, cpu, store, inventories).await;
        let Some(Reading {
            obs,
            errors,
            koord_node,
            victim_ws,
            started,
            ..
        }) = self.read().await
        else {
            // no reading for longer than the transition period: the node's
            // conditions are not known any more, and admission must not go
            // on refusing on stale figures
            let stale = self.cfg.config.kubelet.transition.max(CLEANUP_WAIT);
            if self.last_read.elapsed() > stale && !self.view.pressure().0.is_empty() {
                self.warn_once(
                    "stale conditions".into(),
                    "no reading of the node for longer than the pressure transition period: its conditions are cleared (admission admits) until one succeeds",
                );
                self.view.set_pressure(vec![], vec![]);
            }
            return;
        };
        self.last_read = Instant::now();
        for (signal, e) in errors {
            self.warn_once(
                format!("observe {signal}"),
                &format!("cannot observe {signal}: {e}"),
            );
        }
        let pressure = self.kubelet.observe(now, &obs);
        self.publish(&pressure, &obs);
        let be_due = match (&policy, koord_node) {
            (Some(Ok(p)), Some(n)) if n.capacity > 0 => {
                (n.used as i128 * 100 / n.capacity as i128) as i64 >= p.threshold_percent()
                    && !self.koord.memory_cooling(now)
            }
            _ => false,
        };
        if pressure.starved.is_none() && !be_due {
            if let Some(Err(e)) = &policy {
                self.warn_once(
                    "be-memory policy".into(),
                    &format!("BE memory eviction skipped: {e}"),
                );
            }
            return;
        }
        let Some(mut candidates) = self.candidates(inventories, store).await else {
            return;
        };
        // a disk signal: kubelet ranks by each pod's disk use (writable
        // layers, logs, emptyDir volumes); read for the pods that may go (BE)
        if pressure
            .starved
            .as_ref()
            .is_some_and(|s| !s.signal.is_memory() && s.signal != Signal::PidAvailable)
        {
            self.fill_disk(&mut candidates, store).await;
        }
        let plain: Vec<Pod> = candidates.iter().map(|c| c.pod.clone()).collect();
        // a pod being deleted is gone once its sandbox left the inventory
        self.terminating
            .retain(|uid, _| plain.iter().any(|p| p.uid == *uid));
        // kubelet's model: one pod at a time, and none until the last one is
        // cleaned up (memory: its cgroup gone or its working set halved;
        // other signals: its processes gone), 30 s at most
        if let Some(c) = &self.cleanup {
            // other signals: once the stop ended (the pod cgroup's processes
            // would count the sandbox kubelet recreates)
            let released = if c.signal.is_memory() {
                victim_ws.is_none_or(|ws| ws <= c.working_set / 2)
            } else {
                self.acting.as_ref().is_none_or(|(_, t)| t.is_finished())
                    && !self.terminating.contains_key(&c.uid)
            };
            if released || c.since.elapsed() >= CLEANUP_WAIT {
                self.cleanup = None;
                if let Some(p) = &self.cfg.persist {
                    p.set_victim(None);
                }
            }
        }
        // Koordinator's BE memory model first: BE pods go before kubelet's
        // model picks from every pod; a cycle where it evicted picks none
        let mut be_evicted = false;
        match (policy, koord_node) {
            (Some(Err(e)), _) => self.warn_once(
                "be-memory policy".into(),
                &format!("BE memory eviction skipped: {e}"),
            ),
            (Some(Ok(policy)), Some(node)) if !self.koord.memory_cooling(now) => {
                if let Some(task) = koord::memory_task(policy, node, &plain) {
                    // kubelet's victim being stopped counts as released
                    let victim = self.cleanup.as_ref().map(|c| c.uid.clone());
                    let round = koord::execute(
                        std::slice::from_ref(&task),
                        &plain,
                        |p| {
                            self.koord.was_evicted(&p.uid, now)
                                || victim.as_ref() == Some(&p.uid)
                                || self.terminating.contains_key(&p.uid)
                                || self.refused.contains_key(&p.uid)
                        },
                        |_, _| true,
                    );
                    let latency = self.woke_at.map(|t| t.elapsed());
                    for (i, _) in &round.evicted {
                        let c = &candidates[*i];
                        let req = EvictRequest {
                            sandbox_id: c.sandbox_id.clone(),
                            uid: c.pod.uid.clone(),
                            namespace: c.pod.namespace.clone(),
                            name: c.pod.name.clone(),
                            grace_seconds: 0,
                            model: Model::BeMemory,
                            signal: None,
                            observed: Some(node.used),
                            threshold: Some(node.capacity / 100 * policy.threshold_percent()),
                            message: format!("qoslet BE memory eviction: {}", task.reason),
                        };
                        // koordlet's kill is optimistic too: the round counts
                        // what it asked for; a failure is recorded, counted,
                        // and the pod forgotten (tried again next round)
                        self.spawn_koord(store, req, latency);
                    }
                    be_evicted = !round.evicted.is_empty();
                    self.koord.record(now, &round, &plain);
                }
            }
            _ => {}
        }
        let busy = self.acting.as_ref().is_some_and(|(_, t)| !t.is_finished());
        if let Some(starved) = pressure.starved.clone() {
            if be_evicted {
                debug!(
                    "the BE model evicted this cycle; kubelet's model waits for the next reading"
                );
            } else if busy || self.cleanup.is_some() {
                debug!("the last eviction is still under way or being cleaned up");
            } else if pressure.node_reclaim_first(self.kubelet.settings().dedicated_imagefs)
                && self.reclaim_first(starved.signal, started)
            {
                debug!(signal = %starved.signal, "node-level reclaim before any pod");
            } else {
                self.failed.retain(|_, at| at.elapsed() < FAILED_BACKOFF);
                // a CRI-only eviction frees no disk and no PIDs for good:
                // kubelet recreates the pod in place, and only BE pods are
                // kept off by admission, so for those signals only BE pods
                // are candidates (kubelet's own eviction handles the rest;
                // in a cluster, the Eviction API deletes the pod)
                let be_only = !starved.signal.is_memory();
                let eligible: Vec<bool> = plain
                    .iter()
                    .map(|p| {
                        !self.failed.contains_key(&p.uid)
                            && !self.refused.contains_key(&p.uid)
                            && !self.terminating.contains_key(&p.uid)
                            && !store.cluster_pod(&p.uid).is_some_and(|c| c.deleting)
                            && !self.koord.was_evicted(&p.uid, now)
                            && (!be_only || is_be(p))
                    })
                    .collect();
                let victim = self
                    .kubelet
                    .victims(&starved, &plain, &obs)
                    .into_iter()
                    .find(|v| eligible[v.index]);
                match victim {
                    None if be_only => self.warn_once(
                        format!("no BE pod for {}", starved.signal),
                        &format!(
                            "{} is met and no best-effort pod is left to evict: qoslet evicts only BE pods for disk and PID signals (kubelet's eviction handles the others)",
                            starved.signal
                        ),
                    ),
                    None => {}
                    Some(v) => {
                        let c = &candidates[v.index];
                        let o = obs.get(&starved.signal).copied();
                        let req = EvictRequest {
                            sandbox_id: c.sandbox_id.clone(),
                            uid: c.pod.uid.clone(),
                            namespace: c.pod.namespace.clone(),
                            name: c.pod.name.clone(),
                            grace_seconds: v.grace_seconds,
                            model: Model::Kubelet,
                            signal: Some(starved.signal),
                            observed: o.map(|o| o.available),
                            threshold: o.map(|o| starved.value.of(o.capacity)),
                            message: v.message.clone(),
                        };
                        let working_set = c
                            .pod
                            .stats
                            .as_ref()
                            .and_then(|s| s.working_set)
                            .unwrap_or(0);
                        self.cleanup = Some(Cleanup {
                            uid: c.pod.uid.clone(),
                            signal: starved.signal,
                            cgroup: c.cgroup.clone(),
                            working_set,
                            since: Instant::now(),
                        });
                        self.kubelet.evicted(&c.pod.uid, now);
                        if let Some(p) = self.cfg.persist.clone() {
                            p.set_victim(Some(persist::Victim {
                                uid: c.pod.uid.clone(),
                                signal: Some(starved.signal.as_str().into()),
                                cgroup: c.cgroup.as_str().to_string(),
                                working_set,
                                at: unix_now(),
                            }));
                            // kept before the stop (a restart during a long
                            // stop still knows its victim)
                            let view = self.view.clone();
                            tokio::spawn(async move { p.save(move || view.records()).await });
                        }
                        let latency = self.woke_at.map(|t| t.elapsed());
                        self.acting = Some((
                            c.pod.uid.clone(),
                            tokio::spawn(self.acting(store).evict(req, latency)),
                        ));
                    }
                }
            }
        }
    }

    /// Notes how an eviction ended: a pod being deleted is followed until it
    /// is gone (or its grace period and a margin passed), a refused one is
    /// passed over.
    fn note(&mut self, uid: &str, outcome: Outcome, now: Instant) {
        match outcome {
            Outcome::Stopping(grace) => {
                self.terminating
                    .insert(uid.to_string(), now + grace + TERMINATING_MARGIN);
            }
            Outcome::Refused => {
                self.refused.insert(uid.to_string(), now);
            }
            Outcome::Done | Outcome::Failed => {}
        }
    }

    /// A Koordinator-model eviction on its own task; a failure is reported
    /// back so the pod is forgotten (not counted as released) next cycle.
    pub(super) fn spawn_koord(&self, store: &Store, req: EvictRequest, latency: Option<Duration>) {
        let acting = self.acting(store);
        let tx = self.outcomes.clone();
        let uid = req.uid.clone();
        tokio::spawn(async move {
            let _ = tx.send((uid, acting.evict(req, latency).await));
        });
    }

    /// What ended since the last cycle: Koordinator-model evictions that
    /// failed are forgotten; kubelet's model's failed or refused victim
    /// stops the cleanup wait and is passed over for [`FAILED_BACKOFF`].
    async fn settle(&mut self) {
        let now = Instant::now();
        self.refused
            .retain(|_, at| now.duration_since(*at) < REFUSED_BACKOFF);
        self.terminating.retain(|_, until| now < *until);
        while let Ok((uid, outcome)) = self.outcomes_rx.try_recv() {
            self.note(&uid, outcome, now);
            if !outcome.accepted() {
                self.koord.forget(&uid);
            }
        }
        if self.acting.as_ref().is_some_and(|(_, t)| t.is_finished()) {
            if let Some((uid, t)) = self.acting.take() {
                let outcome = t.await.unwrap_or(Outcome::Failed);
                self.note(&uid, outcome, now);
                if !outcome.accepted() {
                    if outcome == Outcome::Failed {
                        self.failed.insert(uid, Instant::now());
                    }
                    self.cleanup = None;
                    if let Some(p) = &self.cfg.persist {
                        p.set_victim(None);
                        let view = self.view.clone();
                        p.save(move || view.records()).await;
                    }
                }
            }
        }
    }
}

/// A BE pod (class BE, or Kubernetes BestEffort without a class): the ones
/// admission keeps off the node under pressure.
fn is_be(p: &Pod) -> bool {
    match p.class {
        Some(c) => c == QosClass::Be,
        None => p.kube_qos == Some(KubeQos::BestEffort),
    }
}

impl crate::Agent {
    /// Starts the eviction loop; its view is the agent's from here on.
    pub fn start_eviction(&self, cfg: EvictionLoop) -> Arc<EvictionView> {
        let view = Arc::new(EvictionView::default());
        view.dry_run.store(cfg.config.dry_run, Ordering::Relaxed);
        self.views().set_eviction(view.clone());
        let store = self.store().clone();
        let _ = view.store.set(store.clone());
        let inventories = self.inventory().clone();
        let mut shutdown = self.shutdown_signal();
        let mut policy = self.policy().subscribe();
        let kubelet = Kubelet::new(cfg.config.kubelet.clone());
        // far enough back that what a previous run kept (minutes at most) has
        // a place on the loop's clock
        let start = Instant::now()
            .checked_sub(RESTORE_HORIZON)
            .unwrap_or_else(Instant::now);
        let (outcomes, outcomes_rx) = tokio::sync::mpsc::unbounded_channel();
        let mut cycle = Cycle {
            views: self.views().clone(),
            cpu_history: CpuHistory::default(),
            be_cpu_seq: None,
            be_cpu_pods: HashMap::new(),
            koord: Koord::new(start.elapsed()),
            kubelet,
            view: view.clone(),
            start,
            warned: BTreeMap::new(),
            woke_at: None,
            acting: None,
            failed: HashMap::new(),
            terminating: HashMap::new(),
            refused: HashMap::new(),
            outcomes,
            outcomes_rx,
            cleanup: None,
            reading: None,
            last_read: Instant::now(),
            reclaiming: None,
            reclaimed_at: Arc::new(Mutex::new(None)),
            cfg,
        };
        info!(
            thresholds = cycle.cfg.config.kubelet.thresholds.len(),
            dry_run = cycle.cfg.config.dry_run,
            evictor = cycle.cfg.evictor.name(),
            "eviction on"
        );
        // before admission can be asked anything (the front end serves
        // after this): a small private file, read once at start
        if let Some(p) = cycle.cfg.persist.clone() {
            cycle.restore(p.load());
        }
        let mut reload = cycle.cfg.reload.take();
        if let Some(r) = reload.as_mut() {
            r.mark_unchanged();
        }
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(cycle.cfg.interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut notifiers = notify::Notifiers::default();
            loop {
                let started = Instant::now();
                // (the select below marks a change seen: compare instead)
                if let Some(e) = reload.as_mut().and_then(|r| {
                    let cur = r.borrow_and_update();
                    (*cur != cycle.cfg.config).then(|| cur.clone())
                }) {
                    cycle.reconfigure(e);
                }
                let (be, cpu) = {
                    let p = policy.borrow();
                    let t = &p.policy.resource_used_threshold_with_be;
                    let c = &cycle.cfg.config;
                    (
                        be_memory_policy(t).filter(|_| c.be_memory_evict),
                        be_cpu::be_cpu_policy(t, cycle.cfg.interval).filter(|_| c.be_cpu_evict),
                    )
                };
                // nothing to decide (no threshold, no BE model on): no reading
                // at all, no notifier armed; admission still refuses the pods
                // evicted lately
                let active = cycle.cfg.config.enabled
                    && (!cycle.kubelet.settings().thresholds.is_empty()
                        || be.is_some()
                        || cpu.is_some());
                if active {
                    tokio::select! {
                        _ = cycle.run_once(&store, &inventories, be, cpu) => {}
                        _ = shutdown.changed() => break,
                    }
                } else if !cycle.view.pressure().0.is_empty() {
                    cycle.view.set_pressure(vec![], vec![]);
                }
                cycle.woke_at = None;
                // cgroup files: armed off the async workers
                let (sources, thresholds) = (
                    cycle.cfg.sources.clone(),
                    cycle.kubelet.settings().thresholds.clone(),
                );
                let be_percent =
                    match be_memory_policy(&policy.borrow().policy.resource_used_threshold_with_be)
                    {
                        Some(Ok(p)) if cycle.cfg.config.be_memory_evict => {
                            Some(p.threshold_percent())
                        }
                        _ => None,
                    };
                let rt = tokio::runtime::Handle::current();
                let mut n = std::mem::take(&mut notifiers);
                notifiers = if !active {
                    Default::default()
                } else {
                    tokio::task::spawn_blocking(move || {
                        let wanted = notify::wanted(&sources, &thresholds, be_percent);
                        n.rearm_blocking(wanted, &rt);
                        n.watch_v2_blocking(notify::wanted_v2(&sources), &rt);
                        n
                    })
                    .await
                    .unwrap_or_default()
                };
                tokio::select! {
                    _ = tick.tick() => {}
                    _ = notifiers.crossed() => {
                        // a notification storm (usage swinging around a
                        // level) runs cycles no closer than MIN_CYCLE_GAP
                        if let Some(rest) = MIN_CYCLE_GAP.checked_sub(started.elapsed()) {
                            tokio::time::sleep(rest).await;
                        }
                        cycle.woke_at = Some(Instant::now());
                        cycle.view.wakeups.fetch_add(1, Ordering::Relaxed);
                        debug!("the kernel says memory crossed a threshold");
                    }
                    r = policy.changed() => {
                        if r.is_err() {
                            break;
                        }
                    }
                    Ok(()) = async {
                        match reload.as_mut() {
                            Some(r) => r.changed().await,
                            None => std::future::pending().await,
                        }
                    } => {}
                    r = shutdown.changed() => {
                        if r.is_err() || *shutdown.borrow() {
                            break;
                        }
                    }
                }
            }
        });
        self.add_task(task);
        view
    }
}
