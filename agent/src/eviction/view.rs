//! What the eviction loop concludes, shared with admission and the admin
//! API: the node conditions and the thresholds met, the recent evictions and
//! refusals, the counters; and admission itself (a BE pod refused under
//! pressure, or lately evicted).

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, RwLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use qoslet_eviction::evictor::Model;
use qoslet_eviction::{Condition, Signal};
use qoslet_hooks::class::{KubeQos, QosClass};
use tracing::info;

/// Recent evictions kept for `ListEvictions` and `qoslet explain`.
pub const MAX_RECORDS: usize = 256;
/// A BE pod evicted is refused admission this long (kubelet recreates its sandbox).
pub const READMIT_AFTER: Duration = Duration::from_secs(120);
/// Evicted UIDs remembered at most.
const MAX_RECENT: usize = 4096;

/// One eviction (or, in dry run, one that would have been).
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    /// Unix seconds.
    pub at: u64,
    pub sandbox_id: String,
    pub uid: String,
    pub namespace: String,
    pub name: String,
    /// The model's reason (`node-pressure`, `be-memory`, ...) or `admission`.
    pub reason: &'static str,
    pub signal: Option<Signal>,
    pub observed: Option<i64>,
    pub threshold: Option<i64>,
    pub grace_seconds: i64,
    pub message: String,
    pub dry_run: bool,
    /// `stopped`, `gone`, `refused: ...`, `failed: ...`, `dry run`.
    pub outcome: String,
}

/// A pod asking to be admitted, as admission sees it.
#[derive(Debug, Clone, Copy)]
pub struct Admission<'a> {
    pub class: Option<QosClass>,
    pub kube: Option<KubeQos>,
    pub namespace: &'a str,
    pub name: &'a str,
    pub uid: &'a str,
    /// A static or mirror pod (kubelet admits critical pods whatever the pressure).
    pub critical: bool,
}

impl<'a> Admission<'a> {
    /// Whether pod annotations mark a static or mirror pod (kubelet sets
    /// `kubernetes.io/config.source` on every pod it runs, `api` for the API's).
    pub fn critical_by_annotations<'b>(
        mut annotations: impl Iterator<Item = (&'b str, &'b str)>,
    ) -> bool {
        annotations.any(|(k, v)| {
            (k == "kubernetes.io/config.source" && v != "api") || k == "kubernetes.io/config.mirror"
        })
    }
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
    pub(super) dry_run: std::sync::atomic::AtomicBool,
    /// Evictions by model: node-pressure, be-memory, be-cpu.
    pub evictions: [AtomicU64; 3],
    /// Admissions refused (or, in dry run, that would have been).
    pub refusals: AtomicU64,
    /// Kernel notifications that woke the loop.
    pub wakeups: AtomicU64,
    /// Pods evicted lately, by UID: kubelet recreates a stopped sandbox, so a
    /// BE pod evicted is not admitted again for [`READMIT_AFTER`].
    recent: Mutex<BTreeMap<String, (Instant, &'static str)>>,
    /// Evictions that failed.
    pub failures: AtomicU64,
    /// From the kernel's notification to the evictor's call, for the last
    /// evictions a notification led to (at most [`MAX_RECORDS`]).
    pub(super) latencies: Mutex<VecDeque<Duration>>,
    /// The store, for what the cluster says of a pod at admission (its
    /// priority, its tolerations).
    pub(super) store: std::sync::OnceLock<qoslet_state::Store>,
}

pub(super) fn model_index(m: Model) -> usize {
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

    /// Publishes the node conditions and the thresholds met (the loop does,
    /// each cycle; a condition held for its transition period keeps the
    /// figures that raised it).
    pub fn set_pressure(&self, conditions: Vec<Condition>, met: Vec<Met>) {
        let mut w = self.pressure.write().unwrap();
        let met = if met.is_empty() && !conditions.is_empty() {
            std::mem::take(&mut w.1)
        } else {
            met
        };
        *w = (conditions, met);
    }

    /// Notification → evictor call, for the last evictions a notification led to.
    pub fn latencies(&self) -> Vec<Duration> {
        self.latencies.lock().unwrap().iter().copied().collect()
    }

    pub fn records(&self) -> Vec<Record> {
        self.records.lock().unwrap().iter().cloned().collect()
    }

    /// The admin API's `ListEvictions`: conditions, thresholds met, and the
    /// records of `namespace` / `name` (empty: every one).
    pub fn list(&self, namespace: &str, name: &str) -> qoslet_proto::admin::ListEvictionsResponse {
        use qoslet_proto::admin;
        let (conditions, met) = self.pressure();
        admin::ListEvictionsResponse {
            enabled: true,
            dry_run: self.dry_run.load(Ordering::Relaxed),
            conditions: conditions.iter().map(|c| c.as_str().to_string()).collect(),
            met: met
                .iter()
                .map(|m| admin::ThresholdMet {
                    signal: m.signal.as_str().into(),
                    observed: m.observed,
                    threshold: m.threshold,
                    hard: m.hard,
                })
                .collect(),
            records: self
                .records()
                .into_iter()
                .filter(|r| {
                    (namespace.is_empty() || r.namespace == namespace)
                        && (name.is_empty() || r.name == name)
                })
                .map(|r| admin::EvictionRecord {
                    timestamp: r.at as i64,
                    namespace: r.namespace,
                    name: r.name,
                    uid: r.uid,
                    sandbox_id: r.sandbox_id,
                    reason: r.reason.into(),
                    signal: r.signal.map(|s| s.as_str().to_string()).unwrap_or_default(),
                    observed: r.observed.unwrap_or(0),
                    threshold: r.threshold.unwrap_or(0),
                    grace_seconds: r.grace_seconds,
                    message: r.message,
                    dry_run: r.dry_run,
                    outcome: r.outcome,
                })
                .collect(),
        }
    }

    /// Takes back the records a previous run kept: each pod it evicted
    /// within [`READMIT_AFTER`] is refused admission for the rest of it.
    pub(super) fn restore(&self, records: Vec<Record>, now_unix: u64) {
        for r in records {
            let done = matches!(r.outcome.as_str(), "stopped" | "stopping" | "gone") && !r.dry_run;
            let ago = Duration::from_secs(now_unix.saturating_sub(r.at));
            if done && r.reason != "admission" && r.reason != "node-reclaim" && ago < READMIT_AFTER
            {
                if let Some(at) = Instant::now().checked_sub(ago) {
                    let mut recent = self.recent.lock().unwrap();
                    if recent.len() < MAX_RECENT {
                        recent.insert(r.uid.clone(), (at, r.reason));
                    }
                }
            }
            self.record(r);
        }
    }

    pub(super) fn record(&self, r: Record) {
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

    /// Remembers that the pod with `uid` was evicted (for admission).
    pub(super) fn evicted_uid(&self, uid: &str, reason: &'static str) {
        if uid.is_empty() {
            return;
        }
        let mut r = self.recent.lock().unwrap();
        r.retain(|_, (at, _)| at.elapsed() < READMIT_AFTER);
        if r.len() >= MAX_RECENT {
            if let Some(k) = r
                .iter()
                .min_by_key(|(_, (at, _))| *at)
                .map(|(k, _)| k.clone())
            {
                r.remove(&k);
            }
        }
        r.insert(uid.to_string(), (Instant::now(), reason));
    }

    /// Admission: a BE pod (class BE, or Kubernetes BestEffort without a
    /// class) is refused while the node has a pressure condition, with the
    /// signal, the value observed and the threshold, and for
    /// [`READMIT_AFTER`] after qoslet evicted it; critical pods (static,
    /// mirror) and LS, LSR, LSE and SYSTEM pods never are. In dry run the
    /// refusal is logged, recorded and counted, and the pod admitted.
    pub fn admit(&self, a: &Admission<'_>) -> Result<(), String> {
        let be = match a.class {
            Some(c) => c == QosClass::Be,
            None => a.kube == Some(KubeQos::BestEffort),
        };
        if !be || a.critical {
            return Ok(());
        }
        // what the cluster says: kubelet admits critical pods (priority at
        // least system-cluster-critical's), and under memory pressure alone a
        // pod that tolerates the memory-pressure taint
        let cluster = self.store.get().and_then(|s| s.cluster_pod(a.uid));
        if cluster.as_ref().and_then(|c| c.priority).unwrap_or(0)
            >= qoslet_eviction::pod::SYSTEM_CRITICAL_PRIORITY
        {
            return Ok(());
        }
        let (namespace, name) = (a.namespace, a.name);
        let subject = format!("{namespace}/{name}");
        let (conditions, met) = self.pressure();
        let recent = self
            .recent
            .lock()
            .unwrap()
            .get(a.uid)
            .filter(|(at, _)| at.elapsed() < READMIT_AFTER)
            .map(|(at, reason)| (at.elapsed(), *reason));
        if conditions.is_empty() && recent.is_none() {
            return Ok(());
        }
        // a pod qoslet evicted lately is kept off whatever it tolerates (it
        // would be stopped again at once)
        if recent.is_none()
            && cluster.is_some_and(|c| c.tolerates_memory_pressure)
            && conditions.iter().all(|c| *c == Condition::MemoryPressure)
        {
            return Ok(());
        }
        if conditions.is_empty() {
            let (ago, reason) = recent.unwrap_or_default();
            let msg = format!(
                "qoslet: this pod was evicted {}s ago ({reason}); best-effort pods are not admitted again for {}s",
                ago.as_secs(),
                READMIT_AFTER.as_secs()
            );
            return self.refuse(namespace, name, &subject, None, msg);
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
        self.refuse(namespace, name, &subject, met.first(), msg)
    }

    fn refuse(
        &self,
        namespace: &str,
        name: &str,
        subject: &str,
        first: Option<&Met>,
        msg: String,
    ) -> Result<(), String> {
        self.refusals.fetch_add(1, Ordering::Relaxed);
        let dry = self.dry_run.load(Ordering::Relaxed);
        let cut = |s: &str| s.chars().take(253).collect::<String>();
        // kubelet retries a refused sandbox every few seconds: one record per
        // pod, brought up to date, so refusals do not push evictions out
        {
            let mut q = self.records.lock().unwrap();
            if let Some(r) = q.iter_mut().rev().find(|r| {
                r.reason == "admission" && r.namespace == cut(namespace) && r.name == cut(name)
            }) {
                r.at = unix_now();
                r.message = msg.clone();
                // the figures of the pressure that started it stay, when the
                // condition now only lasts its transition period
                if let Some(m) = first {
                    r.signal = Some(m.signal);
                    r.observed = Some(m.observed);
                    r.threshold = Some(m.threshold);
                }
                drop(q);
                if dry {
                    return Ok(());
                }
                return Err(msg);
            }
        }
        self.record(Record {
            at: unix_now(),
            sandbox_id: String::new(),
            uid: String::new(),
            namespace: cut(namespace),
            name: cut(name),
            reason: "admission",
            signal: first.map(|m| m.signal),
            observed: first.map(|m| m.observed),
            threshold: first.map(|m| m.threshold),
            grace_seconds: 0,
            message: msg.clone(),
            dry_run: dry,
            outcome: if dry { "dry run" } else { "refused admission" }.into(),
        });
        if dry {
            info!(pod = %subject, reason = %msg, "dry run: would refuse");
            return Ok(());
        }
        info!(pod = %subject, reason = %msg, "refused");
        Err(msg)
    }
}

pub(super) fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod<'a>(class: Option<QosClass>, kube: Option<KubeQos>, name: &'a str) -> Admission<'a> {
        Admission {
            class,
            kube,
            namespace: "ns",
            name,
            uid: name,
            critical: false,
        }
    }

    fn pressed(v: &EvictionView) {
        v.set_pressure(
            vec![Condition::MemoryPressure],
            vec![Met {
                signal: Signal::MemoryAvailable,
                observed: 120 << 20,
                threshold: 300 << 20,
                hard: true,
            }],
        );
    }

    #[test]
    fn admission_refuses_only_best_effort_pods_under_pressure() {
        let v = EvictionView::default();
        let be = pod(Some(QosClass::Be), None, "be");
        assert!(v.admit(&be).is_ok(), "no pressure");
        pressed(&v);
        let err = v.admit(&be).unwrap_err();
        assert!(
            err.contains("MemoryPressure") && err.contains("memory.available 120Mi < 300Mi"),
            "{err}"
        );
        // BestEffort without a class: refused; LS classes and Burstable: never
        assert!(v
            .admit(&pod(None, Some(KubeQos::BestEffort), "b2"))
            .is_err());
        for c in [QosClass::Ls, QosClass::Lsr, QosClass::Lse, QosClass::System] {
            assert!(v
                .admit(&pod(Some(c), Some(KubeQos::BestEffort), "ls"))
                .is_ok());
        }
        assert!(v.admit(&pod(None, Some(KubeQos::Burstable), "bu")).is_ok());
        // a static pod is admitted whatever its class
        let mut st = pod(Some(QosClass::Be), None, "static");
        st.critical = true;
        assert!(v.admit(&st).is_ok());
        // repeated refusals of one pod are one record, kept up to date
        for _ in 0..5 {
            let _ = v.admit(&be);
        }
        let recs: Vec<Record> = v.records().into_iter().filter(|r| r.name == "be").collect();
        assert_eq!(recs.len(), 1);
        assert_eq!(recs[0].signal, Some(Signal::MemoryAvailable));
        assert_eq!(v.refusals.load(Ordering::Relaxed), 7);
    }

    /// With the cluster side: kubelet's admission rules that need the pod
    /// spec. System-critical priority is admitted; a pod that tolerates the
    /// memory-pressure taint is admitted under MemoryPressure alone, not
    /// under DiskPressure, and not when qoslet evicted it lately.
    #[test]
    fn admission_with_the_clusters_priority_and_tolerations() {
        let v = EvictionView::default();
        let store = qoslet_state::Store::new();
        let _ = v.store.set(store.clone());
        let cp = |uid: &str, priority: i32, tolerates: bool| qoslet_state::ClusterPod {
            uid: uid.into(),
            namespace: "ns".into(),
            name: uid.into(),
            priority: Some(priority),
            tolerates_memory_pressure: tolerates,
            ..Default::default()
        };
        store.upsert_cluster_pod(cp("crit", 2_000_000_000, false));
        store.upsert_cluster_pod(cp("ds", 0, true));
        store.upsert_cluster_pod(cp("plain", 0, false));
        pressed(&v);
        let be = |n| pod(Some(QosClass::Be), Some(KubeQos::BestEffort), n);
        assert!(v.admit(&be("crit")).is_ok(), "system-critical priority");
        assert!(v.admit(&be("ds")).is_ok(), "tolerates memory pressure");
        assert!(v.admit(&be("plain")).is_err());
        v.evicted_uid("ds", "node-pressure");
        assert!(v.admit(&be("ds")).is_err(), "evicted lately");
        v.set_pressure(
            vec![Condition::MemoryPressure, Condition::DiskPressure],
            vec![],
        );
        store.upsert_cluster_pod(cp("ds2", 0, true));
        assert!(v.admit(&be("ds2")).is_err(), "DiskPressure too");
        assert!(v.admit(&be("crit")).is_ok());
    }

    #[test]
    fn an_evicted_be_pod_is_not_admitted_again_for_a_while() {
        let v = EvictionView::default();
        v.evicted_uid("be", "be-memory");
        let err = v.admit(&pod(Some(QosClass::Be), None, "be")).unwrap_err();
        assert!(
            err.contains("evicted") && err.contains("be-memory"),
            "{err}"
        );
        assert!(v.admit(&pod(Some(QosClass::Be), None, "other")).is_ok());
    }

    #[test]
    fn a_dry_run_admits_and_records() {
        let v = EvictionView::default();
        v.dry_run.store(true, Ordering::Relaxed);
        pressed(&v);
        assert!(v.admit(&pod(Some(QosClass::Be), None, "be")).is_ok());
        assert_eq!(v.records()[0].outcome, "dry run");
        let list = v.list("ns", "be");
        assert!(list.dry_run && list.records.len() == 1 && list.conditions == ["MemoryPressure"]);
    }

    #[test]
    fn static_and_mirror_annotations_are_critical() {
        let c = |kv: &[(&'static str, &'static str)]| {
            Admission::critical_by_annotations(kv.iter().copied())
        };
        assert!(c(&[("kubernetes.io/config.source", "file")]));
        assert!(c(&[("kubernetes.io/config.mirror", "abc")]));
        assert!(!c(&[("kubernetes.io/config.source", "api")]));
        assert!(!c(&[]));
    }
}
