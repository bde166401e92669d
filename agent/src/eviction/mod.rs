//! The eviction loop: kubelet's node-pressure model and Koordinator's BE
//! memory model (the decisions are the `qoslet-eviction` room's) run every
//! second and whenever the kernel says memory crossed a threshold (cgroup v1's
//! memory threshold notification), read the node and the pods directly, and
//! evict through an [`Evictor`] (CRI here). What it concludes is the agent's
//! [`EvictionView`]: the node conditions and their figures (admission reads
//! them), the recent evictions, the counters.
//!
//! Not yet here (issue 30, later steps): node-level disk reclaim (garbage
//! collection through CRI), BE CPU-satisfaction eviction, cgroup v2's PSI
//! trigger, hot reload of the `eviction:` section.

pub mod cri;
pub mod notify;
pub mod observe;

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use qoslet_eviction::evictor::{EvictRequest, Evicted, Evictor, Model};
use qoslet_eviction::koord::{self, EvictionPolicy, Koord, MemoryPolicy, NodeMemory};
use qoslet_eviction::kubelet::{Kubelet, Observations, Pressure};
use qoslet_eviction::{Condition, Eviction, Pod, PodStats, Requests, Signal};
use qoslet_hooks::class::{KubeQos, QosClass};
use qoslet_state::inventory::{Inventories, PodEntry};
use qoslet_state::store::Store;
use tracing::{debug, info, warn};

use self::observe::Sources;

/// Recent evictions kept for `ListEvictions` and `qoslet explain`.
pub const MAX_RECORDS: usize = 256;

/// One eviction (or, in dry run, one that would have been).
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    /// Unix seconds.
    pub at: u64,
    pub sandbox_id: String,
    pub uid: String,
    pub namespace: String,
    pub name: String,
    pub model: Model,
    pub signal: Option<Signal>,
    pub observed: Option<i64>,
    pub threshold: Option<i64>,
    pub grace_seconds: i64,
    pub message: String,
    pub dry_run: bool,
    /// `stopped`, `gone`, `refused: ...`, `failed: ...`, `dry run`.
    pub outcome: String,
}

/// A met threshold with its figures, for admission and `qoslet status`.
#[derive(Debug, Clone, PartialEq)]
pub struct Met {
    pub signal: Signal,
    pub observed: i64,
    pub threshold: i64,
    pub hard: bool,
}

/// What the loop concluded, shared with admission and the admin API.
#[derive(Debug, Default)]
pub struct EvictionView {
    pressure: RwLock<(Vec<Condition>, Vec<Met>)>,
    records: Mutex<VecDeque<Record>>,
    dry_run: std::sync::atomic::AtomicBool,
    /// Evictions by model: node-pressure, be-memory, be-cpu.
    pub evictions: [AtomicU64; 3],
    /// Admissions refused (or, in dry run, that would have been).
    pub refusals: AtomicU64,
    /// Kernel notifications that woke the loop.
    pub wakeups: AtomicU64,
    /// Evictions that failed.
    pub failures: AtomicU64,
}

fn model_index(m: Model) -> usize {
    match m {
        Model::Kubelet => 0,
        Model::BeMemory => 1,
        Model::BeCpu => 2,
    }
}

impl EvictionView {
    /// The node conditions now, with the thresholds met.
    pub fn pressure(&self) -> (Vec<Condition>, Vec<Met>) {
        self.pressure.read().unwrap().clone()
    }

    pub fn records(&self) -> Vec<Record> {
        self.records.lock().unwrap().iter().cloned().collect()
    }

    fn record(&self, r: Record) {
        let mut q = self.records.lock().unwrap();
        if q.len() >= MAX_RECORDS {
            q.pop_front();
        }
        q.push_back(r);
    }

    /// Prometheus lines: evictions by reason, refusals, wake-ups, failures,
    /// the node conditions.
    pub fn render(&self, out: &mut String) {
        let mut o = qoslet_metrics::prom::Out::new(std::mem::take(out));
        o.family(
            "qoslet_evictions_total",
            "counter",
            "Pods evicted by qoslet, by reason (in dry run: pods that would have been).",
        );
        for m in [Model::Kubelet, Model::BeMemory, Model::BeCpu] {
            o.sample(
                "qoslet_evictions_total",
                &[("reason", m.as_str())],
                self.evicted(m) as f64,
            );
        }
        let (conditions, _) = self.pressure();
        o.family(
            "qoslet_node_condition",
            "gauge",
            "1 while qoslet reports the node condition (kubelet's eviction model).",
        );
        for c in [
            Condition::MemoryPressure,
            Condition::DiskPressure,
            Condition::PidPressure,
        ] {
            let on = conditions.contains(&c) as u8 as f64;
            o.sample("qoslet_node_condition", &[("condition", c.as_str())], on);
        }
        for (name, help, v) in [
            (
                "qoslet_admission_refusals_total",
                "Pods refused admission under node pressure.",
                &self.refusals,
            ),
            (
                "qoslet_eviction_wakeups_total",
                "Kernel memory threshold notifications that woke the eviction loop.",
                &self.wakeups,
            ),
            (
                "qoslet_eviction_failures_total",
                "Evictions the runtime failed.",
                &self.failures,
            ),
        ] {
            o.single(name, "counter", help, v.load(Ordering::Relaxed) as f64);
        }
        *out = o.into_text();
    }

    /// Evictions counted for `m`.
    pub fn evicted(&self, m: Model) -> u64 {
        self.evictions[model_index(m)].load(Ordering::Relaxed)
    }

    /// Admission: while the node has a pressure condition, a BE pod (class
    /// BE, or Kubernetes BestEffort without a class) is refused with the
    /// signal, the value observed and the threshold; LS, LSR, LSE and SYSTEM
    /// pods never are. In dry run the refusal is logged and counted, and the
    /// pod admitted.
    pub fn admit(
        &self,
        class: Option<QosClass>,
        kube: Option<KubeQos>,
        subject: &str,
    ) -> Result<(), String> {
        let be = match class {
            Some(c) => c == QosClass::Be,
            None => kube == Some(KubeQos::BestEffort),
        };
        if !be {
            return Ok(());
        }
        let (conditions, met) = self.pressure();
        if conditions.is_empty() {
            return Ok(());
        }
        let figures: Vec<String> = met
            .iter()
            .map(|m| {
                let b = m.signal.in_bytes();
                format!(
                    "{} {} < {}",
                    m.signal,
                    qoslet_eviction::signal::format_amount(m.observed, b),
                    qoslet_eviction::signal::format_amount(m.threshold, b)
                )
            })
            .collect();
        let names: Vec<&str> = conditions.iter().map(|c| c.as_str()).collect();
        let msg = format!(
            "qoslet: the node has {} ({}): best-effort pods are not admitted",
            names.join(", "),
            if figures.is_empty() {
                "within the pressure transition period".to_string()
            } else {
                figures.join(", ")
            }
        );
        self.refusals.fetch_add(1, Ordering::Relaxed);
        if self.dry_run.load(Ordering::Relaxed) {
            info!(pod = %subject, reason = %msg, "dry run: would refuse");
            return Ok(());
        }
        info!(pod = %subject, reason = %msg, "refused");
        Err(msg)
    }
}

/// What the loop needs.
pub struct EvictionLoop {
    pub config: Eviction,
    pub sources: Sources,
    pub evictor: Arc<dyn Evictor>,
    pub interval: Duration,
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

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// The eviction models' view of the inventory's pods, with their memory read now.
fn pods(inv: &[PodEntry], sources: &Sources) -> Vec<(Pod, String)> {
    inv.iter()
        .map(|e| {
            let class = e.class.map(|c| c.class);
            let kube = e.class.and_then(|c| c.kube).or_else(|| {
                e.cgroup
                    .parent()
                    .and_then(|p| KubeQos::from_cgroup_parent(p.as_str()))
            });
            let mem = sources.cgroup_memory(&e.cgroup).ok();
            let source = e.annotations.get("kubernetes.io/config.source");
            let static_or_mirror = source.is_some_and(|s| s != "api")
                || e.annotations.contains_key("kubernetes.io/config.mirror");
            let trusted = e.class.is_some_and(|c| c.trusted);
            let memory_request = if kube == Some(KubeQos::Guaranteed) {
                e.containers.iter().map(|c| c.memory_limit.max(0)).sum()
            } else {
                0
            };
            let pod = Pod {
                uid: e.uid.clone(),
                namespace: e.namespace.clone(),
                name: e.name.clone(),
                priority: e.priority,
                static_or_mirror,
                kube_qos: kube,
                class,
                be_labelled: e
                    .class
                    .is_some_and(|c| c.by_label && c.class == QosClass::Be),
                eviction_policy: if trusted {
                    EvictionPolicy::parse(
                        e.annotations
                            .get(koord::ANNOTATION_EVICTION_POLICY)
                            .map(String::as_str),
                    )
                } else {
                    EvictionPolicy::Any
                },
                tolerates_memory_pressure: false,
                grace_seconds: None,
                requests: Requests {
                    memory: memory_request,
                    ..Default::default()
                },
                stats: mem.map(|m| PodStats {
                    working_set: Some(m.working_set),
                    memory_used: Some(m.anon),
                    processes: sources.cgroup_processes(&e.cgroup),
                    ..Default::default()
                }),
            };
            (pod, e.id.clone())
        })
        .collect()
}

/// The loop's state between cycles.
struct Cycle {
    cfg: EvictionLoop,
    kubelet: Kubelet,
    koord: Koord,
    view: Arc<EvictionView>,
    start: Instant,
    warned: BTreeMap<String, ()>,
}

impl Cycle {
    fn warn_once(&mut self, key: String, msg: &str) {
        if self.warned.len() < 1024 && self.warned.insert(key.clone(), ()).is_none() {
            warn!(what = %key, "{msg}");
        }
    }

    async fn evict(&self, req: EvictRequest, store: &Store) -> bool {
        let dry = self.cfg.config.dry_run;
        let outcome = if dry {
            "dry run".to_string()
        } else {
            match self.cfg.evictor.evict(&req).await {
                Ok(Evicted::Stopped) => {
                    store.set_pod_stopped(&req.sandbox_id);
                    "stopped".into()
                }
                Ok(Evicted::Gone) => "gone".into(),
                Ok(Evicted::Refused(why)) => format!("refused: {why}"),
                Err(e) => {
                    self.view.failures.fetch_add(1, Ordering::Relaxed);
                    format!("failed: {}", e.reason)
                }
            }
        };
        let done = outcome == "stopped" || outcome == "gone";
        if done {
            self.view.evictions[model_index(req.model)].fetch_add(1, Ordering::Relaxed);
        }
        let level_dry = dry;
        if level_dry {
            info!(pod = %format!("{}/{}", req.namespace, req.name), model = req.model.as_str(), grace = req.grace_seconds, message = %req.message, "dry run: would evict");
        } else {
            warn!(pod = %format!("{}/{}", req.namespace, req.name), model = req.model.as_str(), grace = req.grace_seconds, signal = ?req.signal.map(|s| s.as_str()), observed = ?req.observed, threshold = ?req.threshold, outcome = %outcome, message = %req.message, "evicted");
        }
        self.view.record(Record {
            at: unix_now(),
            sandbox_id: req.sandbox_id.clone(),
            uid: req.uid.clone(),
            namespace: req.namespace.clone(),
            name: req.name.clone(),
            model: req.model,
            signal: req.signal,
            observed: req.observed,
            threshold: req.threshold,
            grace_seconds: req.grace_seconds,
            message: req.message.clone(),
            dry_run: dry,
            outcome,
        });
        done || dry
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
            .collect();
        *self.view.pressure.write().unwrap() = (p.conditions.clone(), met);
    }

    async fn run_once(
        &mut self,
        store: &Store,
        inventories: &Inventories,
        policy: Option<Result<MemoryPolicy, koord::MemoryPolicyError>>,
    ) {
        let now = self.start.elapsed();
        let sources = self.cfg.sources.clone();
        let inv = inventories.current();
        let read = tokio::task::spawn_blocking(move || {
            let (obs, errors) = sources.observe(now);
            let pods = pods(&inv.pods, &sources);
            let node = sources.node_memory().ok().map(|(o, _)| NodeMemory {
                used: o.capacity - o.available,
                capacity: o.capacity,
            });
            (obs, errors, pods, node)
        })
        .await;
        let Ok((obs, errors, pods, node)) = read else {
            return;
        };
        for (signal, e) in errors {
            self.warn_once(
                format!("observe {signal}"),
                &format!("cannot observe {signal}: {e}"),
            );
        }
        let pressure = self.kubelet.observe(now, &obs);
        self.publish(&pressure, &obs);
        let (plain, ids): (Vec<Pod>, Vec<String>) = pods.into_iter().unzip();
        // kubelet's model: one pod a cycle, after the last is cleaned up
        if let Some(starved) = pressure.starved.clone() {
            if self.kubelet.cleaning_up(now, &plain) {
                debug!("the last evicted pod is still being cleaned up");
            } else if pressure.node_reclaim_first(self.kubelet.settings().dedicated_imagefs) {
                self.warn_once(
                    format!("reclaim {}", starved.signal),
                    &format!("{} is met: node-level reclaim (image and container garbage collection) is not implemented yet; no pod is evicted for disk", starved.signal),
                );
            } else {
                let o = obs.get(&starved.signal).copied();
                for v in self.kubelet.victims(&starved, &plain, &obs) {
                    let p = &plain[v.index];
                    let req = EvictRequest {
                        sandbox_id: ids[v.index].clone(),
                        uid: p.uid.clone(),
                        namespace: p.namespace.clone(),
                        name: p.name.clone(),
                        grace_seconds: v.grace_seconds,
                        model: Model::Kubelet,
                        signal: Some(starved.signal),
                        observed: o.map(|o| o.available),
                        threshold: o.map(|o| starved.value.of(o.capacity)),
                        message: v.message.clone(),
                    };
                    if self.evict(req, store).await {
                        self.kubelet.evicted(&p.uid, now);
                        break;
                    }
                }
            }
        }
        // Koordinator's BE memory model
        match (policy, node) {
            (Some(Err(e)), _) => self.warn_once(
                "be-memory policy".into(),
                &format!("BE memory eviction skipped: {e}"),
            ),
            (Some(Ok(policy)), Some(node)) if !self.koord.memory_cooling(now) => {
                if let Some(task) = koord::memory_task(policy, node, &plain) {
                    let mut chosen = vec![];
                    let round = koord::execute(
                        std::slice::from_ref(&task),
                        &plain,
                        |p| self.koord.was_evicted(&p.uid, now),
                        |p, _| {
                            chosen.push(p.uid.clone());
                            true
                        },
                    );
                    let mut evicted = koord::Round {
                        released: round.released.clone(),
                        short: round.short.clone(),
                        ..Default::default()
                    };
                    for (i, f) in round.evicted {
                        let p = &plain[i];
                        let req = EvictRequest {
                            sandbox_id: ids[i].clone(),
                            uid: p.uid.clone(),
                            namespace: p.namespace.clone(),
                            name: p.name.clone(),
                            grace_seconds: 0,
                            model: Model::BeMemory,
                            signal: None,
                            observed: Some(node.used),
                            threshold: Some(node.capacity / 100 * policy.threshold_percent()),
                            message: format!("qoslet BE memory eviction: {}", task.reason),
                        };
                        if self.evict(req, store).await {
                            evicted.evicted.push((i, f));
                        }
                    }
                    self.koord.record(now, &evicted, &plain);
                }
            }
            _ => {}
        }
    }
}

impl crate::Agent {
    /// Starts the eviction loop; its view is the agent's from here on.
    pub fn start_eviction(&self, cfg: EvictionLoop) -> Arc<EvictionView> {
        let view = Arc::new(EvictionView::default());
        view.dry_run.store(cfg.config.dry_run, Ordering::Relaxed);
        self.views().set_eviction(view.clone());
        let store = self.store().clone();
        let inventories = self.inventory().clone();
        let mut shutdown = self.shutdown_signal();
        let mut policy = self.policy().subscribe();
        let kubelet = Kubelet::new(cfg.config.kubelet.clone());
        let start = Instant::now();
        let mut cycle = Cycle {
            koord: Koord::new(Duration::ZERO),
            kubelet,
            view: view.clone(),
            start,
            warned: BTreeMap::new(),
            cfg,
        };
        info!(
            thresholds = cycle.cfg.config.kubelet.thresholds.len(),
            dry_run = cycle.cfg.config.dry_run,
            evictor = cycle.cfg.evictor.name(),
            "eviction on"
        );
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(cycle.cfg.interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut notifiers = notify::Notifiers::default();
            loop {
                let be = be_memory_policy(&policy.borrow().policy.resource_used_threshold_with_be);
                cycle.run_once(&store, &inventories, be).await;
                // cgroup files: armed off the async workers
                let (sources, thresholds) = (
                    cycle.cfg.sources.clone(),
                    cycle.kubelet.settings().thresholds.clone(),
                );
                let rt = tokio::runtime::Handle::current();
                let mut n = std::mem::take(&mut notifiers);
                notifiers = tokio::task::spawn_blocking(move || {
                    let wanted = notify::wanted(&sources, &thresholds);
                    n.rearm_blocking(wanted, &rt);
                    n
                })
                .await
                .unwrap_or_default();
                tokio::select! {
                    _ = tick.tick() => {}
                    _ = notifiers.crossed() => {
                        cycle.view.wakeups.fetch_add(1, Ordering::Relaxed);
                        debug!("the kernel says memory crossed a threshold");
                    }
                    _ = policy.changed() => {}
                    _ = shutdown.changed() => {
                        if *shutdown.borrow() {
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
