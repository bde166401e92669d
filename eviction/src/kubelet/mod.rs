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

/// The model's state between cycles.
#[derive(Debug, Clone, Default)]
pub struct Kubelet {
    settings: Settings,
    first_observed: Vec<(Threshold, Duration)>,
    met: Vec<Threshold>,
    conditions_seen: BTreeMap<Condition, Duration>,
    conditions: Vec<Condition>,
    last_obs: BTreeMap<Signal, Option<Duration>>,
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
    /// (when each was first met, whether it is met) is kept.
    pub fn reconfigure(&mut self, settings: Settings) {
        let keep = |t: &Threshold| settings.thresholds.iter().any(|n| n.same(t));
        self.first_observed.retain(|(t, _)| keep(t));
        self.met.retain(|t| keep(t));
        self.settings = settings;
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
        // memory signals first (a stable partition: kubelet's byEvictionPriority)
        fresh.sort_by_key(|t| !t.signal.is_memory());
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
                let grace_seconds = if starved.is_hard() {
                    HARD_EVICTION_GRACE_SECONDS
                } else if self.settings.max_pod_grace_seconds > 0 {
                    self.settings.max_pod_grace_seconds
                } else {
                    p.grace_seconds.unwrap_or(DEFAULT_POD_GRACE_SECONDS).max(1)
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
        let bytes = starved.signal.in_bytes();
        msg.push_str(&format!(
            "Threshold quantity: {}, available: {}. ",
            format_amount(starved.value.of(o.capacity), bytes),
            format_amount(o.available, bytes)
        ));
    }
    let mut annotations = BTreeMap::new();
    let Some(stats) = &pod.stats else {
        return (msg, annotations);
    };
    let mut names = Vec::new();
    let mut usages = Vec::new();
    if resource == Resource::Memory {
        for c in &stats.containers {
            let Some(ws) = c.working_set else { continue };
            if ws > c.memory_request {
                msg.push_str(&format!(
                    "Container {} was using {}, request is {}, has larger consumption of {resource}. ",
                    c.name,
                    format_amount(ws, true),
                    format_amount(c.memory_request, true)
                ));
                names.push(c.name.clone());
                usages.push(format_amount(ws, true));
            }
        }
    }
    annotations.insert("offending_containers", names.join(","));
    annotations.insert("offending_containers_usage", usages.join(","));
    annotations.insert("starved_resource", resource.to_string());
    (msg, annotations)
}
