//! kubelet's node-pressure eviction model (v1.28's eviction manager), as a
//! state machine fed with observations: thresholds met (with minimum reclaim
//! while a threshold stays met), soft thresholds held for their grace period,
//! node conditions held for the pressure transition period, the threshold to
//! act on first (memory before the rest), whether node-level reclaim may fix
//! it (disk: dead containers and unused images), the pods ranked, one victim
//! a cycle, the message kubelet writes, and admission under pressure.
//!
//! No I/O: the agent observes, garbage-collects and stops pods.

pub mod rank;

use std::collections::BTreeMap;
use std::time::Duration;

use qoslet_hooks::class::KubeQos;

use crate::pod::Pod;
use crate::signal::{format_amount, Condition, Resource, Signal};
use crate::threshold::Threshold;

/// One signal's reading: what is available and of what capacity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Observation {
    pub available: i64,
    pub capacity: i64,
    /// When it was read (`None`: unknown, always taken as new).
    pub at: Option<Duration>,
}

pub type Observations = BTreeMap<Signal, Observation>;

/// `thresholdsMet`: the thresholds whose signal is observed below the
/// threshold's amount (plus its minimum reclaim when `enforce_min_reclaim`).
pub fn thresholds_met(
    thresholds: &[Threshold],
    obs: &Observations,
    enforce_min_reclaim: bool,
) -> Vec<Threshold> {
    thresholds
        .iter()
        .filter(|t| {
            let Some(o) = obs.get(&t.signal) else {
                return false;
            };
            let mut q = t.value.of(o.capacity);
            if enforce_min_reclaim {
                if let Some(m) = t.min_reclaim {
                    q = q.saturating_add(m.of(o.capacity));
                }
            }
            q > o.available
        })
        .cloned()
        .collect()
}

/// kubelet's configuration of the model.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    pub thresholds: Vec<Threshold>,
    /// `evictionPressureTransitionPeriod` (kubelet's default 5 m).
    pub transition: Duration,
    /// `evictionMaxPodGracePeriod`, seconds (0: the pod's own).
    pub max_pod_grace_seconds: i64,
    /// Whether images live on a filesystem of their own (imagefs ≠ nodefs).
    pub dedicated_imagefs: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            thresholds: Vec::new(),
            transition: Duration::from_secs(300),
            max_pod_grace_seconds: 0,
            dedicated_imagefs: false,
        }
    }
}

/// What one observation cycle concluded.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Pressure {
    /// The node conditions to report (held for the transition period).
    pub conditions: Vec<Condition>,
    /// Thresholds met long enough to act on, memory first.
    pub met: Vec<Threshold>,
    /// Soft thresholds met but still within their grace period, with the time left.
    pub waiting: Vec<(Threshold, Duration)>,
    /// The threshold to reclaim for, if any.
    pub starved: Option<Threshold>,
}

impl Pressure {
    /// Whether node-level reclaim (container and image garbage collection)
    /// comes before any pod for the starved signal.
    pub fn node_reclaim_first(&self, dedicated_imagefs: bool) -> bool {
        match self.starved.as_ref().map(|t| t.signal) {
            Some(Signal::ImagefsAvailable | Signal::ImagefsInodesFree) => true,
            Some(Signal::NodefsAvailable | Signal::NodefsInodesFree) => !dedicated_imagefs,
            _ => false,
        }
    }
}

/// The pod chosen, with how long it may take to stop and why.
#[derive(Debug, Clone, PartialEq)]
pub struct Victim {
    /// Index into the pods given to [`Kubelet::victims`].
    pub index: usize,
    pub grace_seconds: i64,
    pub signal: Signal,
    pub message: String,
    /// kubelet's event annotations: `offending_containers`,
    /// `offending_containers_usage`, `starved_resource`.
    pub annotations: BTreeMap<&'static str, String>,
}

/// Why admission refused a pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    pub conditions: Vec<Condition>,
    pub message: String,
}

/// The grace period of a hard eviction: later kubelets' "immediate" second
/// (v1.28 passed 0, which its pod workers turned into the pod's full grace).
pub const HARD_EVICTION_GRACE_SECONDS: i64 = 1;
/// kubelet's default `terminationGracePeriodSeconds`.
pub const DEFAULT_POD_GRACE_SECONDS: i64 = 30;
/// How long kubelet waits for an evicted pod to be cleaned up before it
/// evicts again (`waitForPodsCleanup`).
pub const CLEANUP_WAIT: Duration = Duration::from_secs(30);

/// The model's state between cycles.
#[derive(Debug, Clone, Default)]
pub struct Kubelet {
    settings: Settings,
    first_observed: Vec<(Threshold, Duration)>,
    met: Vec<Threshold>,
    conditions_seen: BTreeMap<Condition, Duration>,
    conditions: Vec<Condition>,
    last_obs: BTreeMap<Signal, Option<Duration>>,
    /// The pod last evicted (UID) and when: no other pod is evicted while it
    /// is still listed, up to [`CLEANUP_WAIT`].
    evicting: Option<(String, Duration)>,
}

impl Kubelet {
    pub fn new(settings: Settings) -> Self {
        Self {
            settings,
            ..Default::default()
        }
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// Takes new settings; what is remembered of thresholds still configured
    /// (when each was first met, whether it is met) is kept, with the new
    /// threshold's minimum reclaim; conditions no threshold can raise any
    /// more are dropped.
    pub fn reconfigure(&mut self, settings: Settings) {
        let now_of = |t: &Threshold| settings.thresholds.iter().find(|n| n.same(t)).cloned();
        self.first_observed = std::mem::take(&mut self.first_observed)
            .into_iter()
            .filter_map(|(t, at)| now_of(&t).map(|n| (n, at)))
            .collect();
        self.met = std::mem::take(&mut self.met)
            .iter()
            .filter_map(now_of)
            .collect();
        self.conditions_seen.retain(|c, _| {
            settings
                .thresholds
                .iter()
                .any(|t| t.signal.condition() == *c)
        });
        self.settings = settings;
    }

    /// Records that the pod with `uid` was evicted at `now`.
    pub fn evicted(&mut self, uid: &str, now: Duration) {
        self.evicting = Some((uid.to_string(), now));
    }

    /// Whether the last evicted pod is still being cleaned up: while it is
    /// listed, and for at most [`CLEANUP_WAIT`], no pod is evicted.
    pub fn cleaning_up(&mut self, now: Duration, pods: &[Pod]) -> bool {
        let Some((uid, at)) = &self.evicting else {
            return false;
        };
        if now.saturating_sub(*at) < CLEANUP_WAIT && pods.iter().any(|p| &p.uid == uid) {
            return true;
        }
        self.evicting = None;
        false
    }

    /// The conditions reported by the last cycle.
    pub fn conditions(&self) -> &[Condition] {
        &self.conditions
    }

    /// One cycle of kubelet's `synchronize`, up to choosing the threshold to
    /// reclaim for.
    pub fn observe(&mut self, now: Duration, obs: &Observations) -> Pressure {
        let all = &self.settings.thresholds;
        let mut thresholds = thresholds_met(all, obs, false);
        if !self.met.is_empty() {
            // a threshold acted on stays met until its minimum reclaim is back
            for t in thresholds_met(&self.met, obs, true) {
                if !thresholds.iter().any(|x| x.same(&t)) {
                    thresholds.push(t);
                }
            }
        }
        let first_observed: Vec<(Threshold, Duration)> = thresholds
            .iter()
            .map(|t| {
                let at = self
                    .first_observed
                    .iter()
                    .find(|(x, _)| x.same(t))
                    .map(|(_, at)| *at)
                    .unwrap_or(now);
                (t.clone(), at)
            })
            .collect();
        // conditions come from thresholds met, grace or not
        for t in &thresholds {
            self.conditions_seen.insert(t.signal.condition(), now);
        }
        let transition = self.settings.transition;
        self.conditions_seen
            .retain(|_, at| now.saturating_sub(*at) < transition);
        // reported while last seen within the transition period (kubelet's
        // `nodeConditionsObservedSince`: strictly less than the period)
        let conditions: Vec<Condition> = self.conditions_seen.keys().copied().collect();
        let mut met = Vec::new();
        let mut waiting = Vec::new();
        for (t, at) in &first_observed {
            let held = now.saturating_sub(*at);
            if held >= t.grace {
                met.push(t.clone());
            } else {
                waiting.push((t.clone(), t.grace - held));
            }
        }
        self.first_observed = first_observed;
        self.conditions = conditions.clone();
        self.met = met.clone();
        // act only on observations newer than the last acted on
        let mut fresh: Vec<Threshold> = met
            .into_iter()
            .filter(
                |t| match (obs.get(&t.signal), self.last_obs.get(&t.signal)) {
                    (None, _) => false,
                    (Some(o), last) => match (o.at, last.copied().flatten()) {
                        (None, _) | (_, None) => true,
                        (Some(new), Some(old)) => new > old,
                    },
                },
            )
            .collect();
        self.last_obs = obs.iter().map(|(s, o)| (*s, o.at)).collect();
        // memory signals first (kubelet's byEvictionPriority); among them,
        // hard before soft (kubelet's order there is a map's, i.e. random: a
        // soft threshold first would give the victim a long grace period
        // while a hard one is met)
        fresh.sort_by_key(|t| (!t.signal.is_memory(), !t.is_hard()));
        let starved = fresh.first().cloned();
        Pressure {
            conditions,
            met: fresh,
            waiting,
            starved,
        }
    }

    /// After node-level reclaim: whether it was enough (no threshold at all
    /// is met any more, minimum reclaims counted), so no pod need go.
    pub fn reclaimed_enough(&self, obs: &Observations) -> bool {
        thresholds_met(&self.settings.thresholds, obs, true).is_empty()
    }

    /// The pods to evict for `starved`, in kubelet's order, each with its
    /// grace period and message; critical pods are left out. The caller
    /// evicts the first it can, and only one a cycle.
    pub fn victims(&self, starved: &Threshold, pods: &[Pod], obs: &Observations) -> Vec<Victim> {
        let mut order: Vec<&Pod> = pods.iter().collect();
        rank::rank(starved.signal, &mut order, self.settings.dedicated_imagefs);
        order
            .into_iter()
            .filter(|p| !p.is_critical())
            .map(|p| {
                let index = pods
                    .iter()
                    .position(|x| std::ptr::eq(x, p))
                    .unwrap_or_default();
                let own = p.grace_seconds.unwrap_or(DEFAULT_POD_GRACE_SECONDS).max(1);
                let grace_seconds = if starved.is_hard() {
                    HARD_EVICTION_GRACE_SECONDS
                } else if self.settings.max_pod_grace_seconds > 0 {
                    // later kubelets: never more than the pod's own
                    self.settings.max_pod_grace_seconds.min(own)
                } else {
                    // kubelet's override is evictionMaxPodGracePeriod, 0 by
                    // default: killed at once, never the pod's own period (a
                    // pod author's hour would hold every other eviction)
                    HARD_EVICTION_GRACE_SECONDS
                };
                let (message, annotations) = message(starved, p, obs);
                Victim {
                    index,
                    grace_seconds,
                    signal: starved.signal,
                    message,
                    annotations,
                }
            })
            .collect()
    }

    /// kubelet's eviction admit handler: no conditions, or a critical pod,
    /// admits; memory pressure alone refuses only BestEffort pods that do not
    /// tolerate it; any other pressure refuses every non-critical pod.
    pub fn admit(&self, pod: &Pod) -> Result<(), Refused> {
        admit(&self.conditions, pod)
    }
}

/// Admission under `conditions` (see [`Kubelet::admit`]).
pub fn admit(conditions: &[Condition], pod: &Pod) -> Result<(), Refused> {
    if conditions.is_empty() || pod.is_critical() {
        return Ok(());
    }
    if conditions == [Condition::MemoryPressure] {
        let best_effort = pod.kube_qos == Some(KubeQos::BestEffort);
        if !best_effort || pod.tolerates_memory_pressure {
            return Ok(());
        }
    }
    let names: Vec<&str> = conditions.iter().map(|c| c.as_str()).collect();
    Err(Refused {
        conditions: conditions.to_vec(),
        message: format!("The node had condition: [{}]. ", names.join(" ")),
    })
}

/// kubelet's `evictionMessage`: the starved resource, the threshold and what
/// was available, and each container using more memory than it requests.
pub fn message(
    starved: &Threshold,
    pod: &Pod,
    obs: &Observations,
) -> (String, BTreeMap<&'static str, String>) {
    let resource = starved.signal.resource();
    let mut msg = format!("The node was low on resource: {resource}. ");
    if let Some(o) = obs.get(&starved.signal) {
        msg.push_str(&format!(
            "Threshold quantity: {}, available: {}. ",
            format_amount(starved.value.of(o.capacity), starved.binary),
            format_amount(o.available, starved.signal.in_bytes())
        ));
    }
    let mut annotations = BTreeMap::new();
    let Some(stats) = &pod.stats else {
        return (msg, annotations);
    };
    let mut names = Vec::new();
    let mut usages = Vec::new();
    for c in &stats.containers {
        let (used, request) = match resource {
            Resource::Memory => (c.working_set, c.memory_request),
            Resource::EphemeralStorage => (c.disk_used, c.ephemeral_request),
            // kubelet has no per-container figure for inodes or PIDs
            Resource::Inodes | Resource::Pids => (None, 0),
        };
        let Some(used) = used else { continue };
        if used > request {
            msg.push_str(&format!(
                "Container {} was using {}, request is {}, has larger consumption of {resource}. ",
                c.name,
                format_amount(used, true),
                format_amount(request, true)
            ));
            names.push(c.name.clone());
            usages.push(format_amount(used, true));
        }
    }
    annotations.insert("offending_containers", names.join(","));
    annotations.insert("offending_containers_usage", usages.join(","));
    annotations.insert("starved_resource", resource.to_string());
    (msg, annotations)
}
