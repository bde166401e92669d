//! One node's load as LoadAware's assign cache keeps it
//! (`pod_assign_cache.go`): the NodeMetric's usage plus, for each pod
//! assigned to the node, what its estimate adds that the NodeMetric does not
//! show yet. Kept incrementally: a pod added or removed is O(1), a new
//! NodeMetric O(pods on the node).
//!
//! Small, as a cache of every pod of a cluster must be: a pod is keyed by
//! a 64-bit hash of its UID, and matched to the NodeMetric's pods by a hash
//! of its namespace and name, with a hasher seeded at random per process
//! (pod names are their authors' input: a collision cannot be aimed at).

use std::collections::{BTreeMap, HashMap};
use std::hash::BuildHasher;
use std::sync::OnceLock;

use qoslet_colocation::Res;

use crate::args::Aggregation;

fn hasher() -> &'static std::collections::hash_map::RandomState {
    static H: OnceLock<std::collections::hash_map::RandomState> = OnceLock::new();
    H.get_or_init(Default::default)
}

/// A pod's key in the cache: its UID's hash.
pub fn uid_key(uid: &str) -> u64 {
    hasher().hash_one(uid)
}

/// A pod's key in the NodeMetric's `podsMetric`: its namespace and name's hash.
pub fn name_key(namespace: &str, name: &str) -> u64 {
    hasher().hash_one((namespace, name))
}

/// What a NodeMetric says, as the load needs it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MetricFacts {
    /// `status.updateTime`, Unix milliseconds (`None`: never reported).
    pub update_time: Option<i64>,
    /// `spec.metricCollectPolicy.reportIntervalSeconds` (60 when unset).
    pub report_interval_secs: i64,
    /// `status.nodeMetric.nodeUsage` (`None`: `status.nodeMetric` is unset).
    pub node_usage: Option<Res>,
    /// `status.nodeMetric.systemUsage`.
    pub system_usage: Res,
    /// `status.nodeMetric.aggregatedNodeUsages`: (type, window seconds) -> usage.
    pub aggregated: BTreeMap<(String, i64), Res>,
    /// `status.podsMetric` with a usage: [`name_key`] -> (usage, reported as prod).
    pub pods: Reported,
}

/// The pods a NodeMetric reports: sorted by key, exactly as long as the
/// report (a hash map would keep a third more room for every node).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Reported(Vec<(u64, (Res, bool))>);

impl Reported {
    pub fn get(&self, key: &u64) -> Option<&(Res, bool)> {
        self.0
            .binary_search_by_key(key, |(k, _)| *k)
            .ok()
            .map(|i| &self.0[i].1)
    }

    pub fn contains_key(&self, key: &u64) -> bool {
        self.get(key).is_some()
    }

    /// Adds or replaces one (tests; a NodeMetric's are collected).
    pub fn insert(&mut self, key: u64, v: (Res, bool)) {
        match self.0.binary_search_by_key(&key, |(k, _)| *k) {
            Ok(i) => self.0[i].1 = v,
            Err(i) => self.0.insert(i, (key, v)),
        }
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl FromIterator<(u64, (Res, bool))> for Reported {
    /// The last of a key reported twice wins, as Go's map assignment.
    fn from_iter<I: IntoIterator<Item = (u64, (Res, bool))>>(it: I) -> Self {
        let mut v: Vec<_> = it.into_iter().collect();
        // stable: equal keys stay in order, and the last is kept
        v.sort_by_key(|(k, _)| *k);
        v.reverse();
        v.dedup_by_key(|(k, _)| *k);
        v.reverse();
        v.shrink_to_fit();
        Reported(v)
    }
}

impl std::ops::Index<&u64> for Reported {
    type Output = (Res, bool);
    fn index(&self, key: &u64) -> &(Res, bool) {
        self.get(key).expect("a reported pod")
    }
}

/// A pod assigned to the node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assigned {
    /// [`name_key`] of its namespace and name.
    pub name: u64,
    pub prod: bool,
    pub estimate: Res,
    /// When it was assigned (Unix ms): its `PodScheduled` condition's time,
    /// else when the cache first saw it bound.
    pub assigned_at: i64,
    /// Until then its estimate counts whatever the NodeMetric says (Unix
    /// ms; 0: no deadline).
    pub deadline: i64,
}

/// A pod in the load: whether its estimate counts now (the NodeMetric
/// does not show it yet).
#[derive(Debug, Clone)]
struct Entry {
    pod: Assigned,
    counted: bool,
}

/// One node's load.
#[derive(Debug, Clone, Default)]
pub struct NodeLoad {
    metric: Option<MetricFacts>,
    /// By [`uid_key`].
    pods: HashMap<u64, Entry>,
    /// Σ max(0, estimate − reported usage) of the pods the NodeMetric does
    /// not show yet.
    delta: Res,
    prod_delta: Res,
    /// Σ estimates of every assigned pod.
    estimated: Res,
    /// Σ usage of the pods that are prod both by their class and in the
    /// NodeMetric (+ system usage with `prodUsageIncludeSys`).
    prod_usage: Res,
    include_sys: bool,
}

/// `v += max(0, e − u)` per resource (`u`: `None` adds `e` whole).
fn add_delta(v: &mut Res, e: Res, u: Option<Res>, sign: i64) {
    let u = u.unwrap_or_default();
    let d = |e: i64, u: i64| (e - u).max(0) * sign;
    v.cpu += d(e.cpu, u.cpu);
    v.memory += d(e.memory, u.memory);
}

impl NodeLoad {
    pub fn new(include_sys: bool) -> Self {
        Self {
            include_sys,
            ..Default::default()
        }
    }

    pub fn metric(&self) -> Option<&MetricFacts> {
        self.metric.as_ref()
    }

    pub fn pods(&self) -> usize {
        self.pods.len()
    }

    /// Nothing left to know of the node.
    pub fn is_empty(&self) -> bool {
        self.metric.is_none() && self.pods.is_empty()
    }

    /// The pods whose estimate is in the load now (not yet shown by the NodeMetric).
    pub fn pods_counted(&self) -> impl Iterator<Item = &Assigned> {
        self.pods.values().filter(|e| e.counted).map(|e| &e.pod)
    }

    /// The pod keyed `uid` ([`uid_key`]).
    pub fn pod(&self, uid: u64) -> Option<&Assigned> {
        self.pods.get(&uid).map(|e| &e.pod)
    }

    /// A pod's part, added (`sign` 1) or taken out (-1); whether its
    /// estimate counts.
    fn account(&mut self, p: &Assigned, sign: i64) -> bool {
        let m = self.metric.as_ref();
        let reported = m.and_then(|m| m.pods.get(&p.name));
        let u = reported.map(|(u, _)| *u);
        let active_prod = p.prod && reported.is_some_and(|(_, prod)| *prod);
        if active_prod {
            let u = u.unwrap_or_default();
            self.prod_usage.cpu += u.cpu * sign;
            self.prod_usage.memory += u.memory * sign;
        }
        let update = m.and_then(|m| m.update_time).unwrap_or(0);
        let interval_ms = m.map_or(60, |m| m.report_interval_secs) * 1000;
        // not reported, assigned within the last report interval, or estimated until later
        let should = u.is_none()
            || p.assigned_at > update - interval_ms
            || (p.deadline != 0 && p.deadline > update);
        if should {
            add_delta(&mut self.delta, p.estimate, u, sign);
        }
        self.estimated.cpu += p.estimate.cpu * sign;
        self.estimated.memory += p.estimate.memory * sign;
        if p.prod {
            // a prod pod the NodeMetric does not call prod counts whole
            let (u, should) = if !active_prod && u.is_some() {
                (None, true)
            } else {
                (u, should)
            };
            if should {
                add_delta(&mut self.prod_delta, p.estimate, u, sign);
            }
        }
        should
    }

    /// A pod assigned (or its assignment changed), keyed by [`uid_key`];
    /// whether it replaced one.
    pub fn add_pod(&mut self, uid: u64, p: Assigned) -> bool {
        let replaced = self.remove_pod(uid).is_some();
        let counted = self.account(&p, 1);
        self.pods.insert(uid, Entry { pod: p, counted });
        replaced
    }

    /// The pods' keys.
    pub fn keys(&self) -> impl Iterator<Item = u64> + '_ {
        self.pods.keys().copied()
    }

    /// A pod gone from the node (deleted, finished, or its tentative
    /// assignment over).
    pub fn remove_pod(&mut self, uid: u64) -> Option<Assigned> {
        let e = self.pods.remove(&uid)?;
        self.account(&e.pod, -1);
        Some(e.pod)
    }

    /// A new NodeMetric (`None`: deleted): the pods' parts again.
    pub fn set_metric(&mut self, m: Option<MetricFacts>) {
        self.metric = m;
        self.delta = Res::default();
        self.prod_delta = Res::default();
        self.estimated = Res::default();
        self.prod_usage = match (&self.metric, self.include_sys) {
            (Some(m), true) => m.system_usage,
            _ => Res::default(),
        };
        let mut pods = std::mem::take(&mut self.pods);
        for e in pods.values_mut() {
            e.counted = self.account(&e.pod, 1);
        }
        self.pods = pods;
    }

    /// What the node is estimated to use, before the incoming pod
    /// (`GetNodeMetricAndEstimatedOfExisting`): `None` without a NodeMetric.
    /// `prod`: the prod usage (a prod pod under prod thresholds); `agg`: an
    /// aggregated usage in place of `nodeUsage` (a missing one: the sum of
    /// every assigned pod's estimate).
    pub fn estimated(&self, prod: bool, agg: Option<&Aggregation>) -> Option<Res> {
        let m = self.metric.as_ref()?;
        if prod {
            return Some(self.prod_usage + self.prod_delta);
        }
        let usage = match agg {
            None => m.node_usage,
            Some(a) => match a.duration {
                Some(d) => m.aggregated.get(&(a.kind.clone(), d)).copied(),
                // no window asked: the longest reported, else nodeUsage
                None => m
                    .aggregated
                    .iter()
                    .filter(|((k, _), _)| *k == a.kind)
                    .max_by_key(|((_, d), _)| *d)
                    .map(|(_, u)| *u)
                    .or(m.node_usage),
            },
        };
        Some(match usage {
            Some(u) => u + self.delta,
            None => self.estimated,
        })
    }
}
