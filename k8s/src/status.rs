//! How the cluster view stands: each watch ok or stale (the API server cannot
//! be reached: the last good view stays in force), what it holds, and what
//! the Eviction API and Events answered. Shown on `/metrics`.

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};

/// A watch of the cluster side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WatchName {
    Pods,
    Node,
}

impl WatchName {
    pub const ALL: [Self; 2] = [Self::Pods, Self::Node];
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pods => "pods",
            Self::Node => "node",
        }
    }
}

// 0: starting (the first list not done yet)
const OK: u8 = 1;
const STALE: u8 = 2;

#[derive(Debug, Default)]
struct Watch {
    /// 0 starting, [`OK`], [`STALE`]
    state: AtomicU8,
    objects: AtomicU64,
}

/// An outcome of the Eviction API.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EvictOutcome {
    /// 201: the API server accepted it (the pod is being deleted).
    Evicted,
    /// 429: a PodDisruptionBudget refused it.
    Refused,
    /// 404 or a UID that no longer matches: the pod is gone.
    Gone,
    /// Anything else.
    Failed,
}

impl EvictOutcome {
    pub const ALL: [Self; 4] = [Self::Evicted, Self::Refused, Self::Gone, Self::Failed];
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Evicted => "evicted",
            Self::Refused => "refused",
            Self::Gone => "gone",
            Self::Failed => "failed",
        }
    }
}

/// The cluster side's state and counters.
#[derive(Debug, Default)]
pub struct ClusterStatus {
    pods: Watch,
    node: Watch,
    evictions: [AtomicU64; 4],
    events_sent: AtomicU64,
    events_failed: AtomicU64,
    /// NodeMetric status writes: written, conflict, failed.
    reports: [AtomicU64; 3],
    /// The batch-resource advertiser, when `kubernetes.batchResources` is on.
    pub batch: std::sync::OnceLock<std::sync::Arc<crate::advertise::AdvertiseStatus>>,
}

const REPORTS: [&str; 3] = ["written", "conflict", "failed"];

impl ClusterStatus {
    fn watch(&self, w: WatchName) -> &Watch {
        match w {
            WatchName::Pods => &self.pods,
            WatchName::Node => &self.node,
        }
    }

    /// The watch is current and holds `objects`.
    pub fn ok(&self, w: WatchName, objects: u64) {
        let w = self.watch(w);
        w.state.store(OK, Ordering::Relaxed);
        w.objects.store(objects, Ordering::Relaxed);
    }

    /// The watch cannot reach the API server: its last view stays.
    pub fn stale(&self, w: WatchName) {
        self.watch(w).state.store(STALE, Ordering::Relaxed);
    }

    /// `starting`, `ok` or `stale`.
    pub fn state(&self, w: WatchName) -> &'static str {
        match self.watch(w).state.load(Ordering::Relaxed) {
            OK => "ok",
            STALE => "stale",
            _ => "starting",
        }
    }

    pub fn count_eviction(&self, o: EvictOutcome) {
        self.evictions[o as usize].fetch_add(1, Ordering::Relaxed);
    }

    pub fn evictions(&self, o: EvictOutcome) -> u64 {
        self.evictions[o as usize].load(Ordering::Relaxed)
    }

    pub fn count_event(&self, sent: bool) {
        if sent {
            &self.events_sent
        } else {
            &self.events_failed
        }
        .fetch_add(1, Ordering::Relaxed);
    }

    /// A NodeMetric status write: `written`, `conflict` or `failed`.
    pub fn count_report(&self, what: &str) {
        if let Some(i) = REPORTS.iter().position(|r| *r == what) {
            self.reports[i].fetch_add(1, Ordering::Relaxed);
        }
    }

    pub fn reports(&self, what: &str) -> u64 {
        REPORTS
            .iter()
            .position(|r| *r == what)
            .map_or(0, |i| self.reports[i].load(Ordering::Relaxed))
    }

    /// Prometheus lines.
    pub fn render(&self, out: &mut String) {
        let mut o = qoslet_metrics::prom::Out::new(std::mem::take(out));
        o.family(
            "qoslet_cluster_watch_state",
            "gauge",
            "1 for each cluster watch's state: starting, ok, stale (the API server cannot be reached; the last view stays in force).",
        );
        for w in WatchName::ALL {
            o.sample(
                "qoslet_cluster_watch_state",
                &[("watch", w.as_str()), ("state", self.state(w))],
                1.0,
            );
        }
        o.family(
            "qoslet_cluster_objects",
            "gauge",
            "Objects each cluster watch holds (the pods of this node; this node's Node).",
        );
        for w in WatchName::ALL {
            o.sample(
                "qoslet_cluster_objects",
                &[("watch", w.as_str())],
                self.watch(w).objects.load(Ordering::Relaxed) as f64,
            );
        }
        o.family(
            "qoslet_cluster_evictions_total",
            "counter",
            "Eviction API calls by outcome: evicted (201), refused (429, a PodDisruptionBudget), gone, failed.",
        );
        for e in EvictOutcome::ALL {
            o.sample(
                "qoslet_cluster_evictions_total",
                &[("outcome", e.as_str())],
                self.evictions(e) as f64,
            );
        }
        o.family(
            "qoslet_cluster_events_total",
            "counter",
            "Kubernetes Events qoslet recorded, by result.",
        );
        o.sample(
            "qoslet_cluster_events_total",
            &[("result", "sent")],
            self.events_sent.load(Ordering::Relaxed) as f64,
        );
        o.sample(
            "qoslet_cluster_events_total",
            &[("result", "failed")],
            self.events_failed.load(Ordering::Relaxed) as f64,
        );
        o.family(
            "qoslet_cluster_nodemetric_reports_total",
            "counter",
            "NodeMetric status writes by result: written, conflict (read again and retried), failed.",
        );
        for (i, r) in REPORTS.iter().enumerate() {
            o.sample(
                "qoslet_cluster_nodemetric_reports_total",
                &[("result", r)],
                self.reports[i].load(Ordering::Relaxed) as f64,
            );
        }
        if let Some(b) = self.batch.get() {
            b.render(&mut o);
        }
        *out = o.into_text();
    }
}

impl qoslet_agent::admin::ClusterView for ClusterStatus {
    fn render(&self, out: &mut String) {
        ClusterStatus::render(self, out);
    }

    fn batch(&self) -> Option<qoslet_agent::admin::BatchView> {
        self.batch.get().map(|b| b.view())
    }

    fn watches(&self) -> Vec<(&'static str, &'static str, u64)> {
        WatchName::ALL
            .iter()
            .map(|w| {
                (
                    w.as_str(),
                    self.state(*w),
                    self.watch(*w).objects.load(Ordering::Relaxed),
                )
            })
            .collect()
    }
}
