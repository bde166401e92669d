//! The scheduler's own cache of the cluster (seed 001): every node's facts,
//! its NodeMetric, the pods assigned to it with their estimates, and the
//! tentative assignments the extender made itself. Fed by the watches
//! (`watch.rs`) one event at a time, each in O(1) of the cluster's size (a
//! new NodeMetric: O(pods on its node)); read by every request, which never
//! calls the API server.
//!
//! kube-scheduler tells an extender nothing of its choice (there is no
//! Reserve for extenders): between a pod's scoring and its binding showing
//! on the pod watch, the next pods would be scored as if it were nowhere.
//! So the node a pod scored best on holds it tentatively, until the pod
//! watch shows where it was bound, or the TTL ends, or the pod comes to be
//! filtered again (its last cycle failed).

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use crate::load::{uid_key, Assigned, MetricFacts, NodeLoad};
use crate::rank::NodeFacts;

/// The cache.
#[derive(Debug, Default)]
pub struct Cache {
    include_sys: bool,
    nodes: HashMap<String, NodeFacts>,
    /// By node name: a node's NodeMetric and pods may come before its Node.
    loads: HashMap<Arc<str>, NodeLoad>,
    metrics: usize,
    /// Pods bound (in the loads, less the tentative ones). No map from a
    /// pod to its node: a pod's node never changes, and its deletion
    /// names it (the map would cost a fifth of the cache).
    pods: usize,
    /// Tentative assignments: [`uid_key`] -> (node, until: a monotonic ms).
    tentative: HashMap<u64, (Arc<str>, i64)>,
    /// The tentative assignments by expiry (one TTL for all: in order).
    expiries: VecDeque<(i64, u64)>,
}

/// How many of each the cache holds (`/metrics`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Sizes {
    pub nodes: usize,
    pub node_metrics: usize,
    pub pods: usize,
    pub tentative: usize,
}

impl Cache {
    /// `include_sys`: `prodUsageIncludeSys`.
    pub fn new(include_sys: bool) -> Self {
        Self {
            include_sys,
            ..Default::default()
        }
    }

    pub fn sizes(&self) -> Sizes {
        Sizes {
            nodes: self.nodes.len(),
            node_metrics: self.metrics,
            pods: self.pods,
            tentative: self.tentative.len(),
        }
    }

    /// A node's facts (from the Node) and load (NodeMetric and pods).
    pub fn node(&self, name: &str) -> Option<&NodeFacts> {
        self.nodes.get(name)
    }

    pub fn load(&self, name: &str) -> Option<&NodeLoad> {
        self.loads.get(name)
    }

    fn load_mut(&mut self, node: &str) -> &mut NodeLoad {
        if !self.loads.contains_key(node) {
            self.loads
                .insert(Arc::from(node), NodeLoad::new(self.include_sys));
        }
        self.loads.get_mut(node).expect("inserted above")
    }

    /// The load's own name (shared by the pods bound to it).
    fn name_of(&self, node: &str) -> Arc<str> {
        self.loads
            .get_key_value(node)
            .map_or_else(|| Arc::from(node), |(k, _)| k.clone())
    }

    /// Drops a node's load once nothing is left in it.
    fn tidy(&mut self, node: &str) {
        if self.loads.get(node).is_some_and(NodeLoad::is_empty) {
            self.loads.remove(node);
        }
    }

    pub fn set_node(&mut self, name: String, facts: NodeFacts) {
        self.nodes.insert(name, facts);
    }

    /// A Node deleted: its facts go; its NodeMetric and pods follow their
    /// own deletions.
    pub fn remove_node(&mut self, name: &str) {
        self.nodes.remove(name);
    }

    /// A relist of the Nodes.
    pub fn replace_nodes(&mut self, nodes: Vec<(String, NodeFacts)>) {
        self.nodes = nodes.into_iter().collect();
    }

    /// A NodeMetric (one without `updateTime` is expired, as Go judges the
    /// object it has).
    pub fn set_metric(&mut self, node: &str, m: MetricFacts) {
        let l = self.load_mut(node);
        if l.metric().is_none() {
            self.metrics += 1;
        }
        self.load_mut(node).set_metric(Some(m));
    }

    pub fn remove_metric(&mut self, node: &str) {
        if let Some(l) = self.loads.get_mut(node) {
            if l.metric().is_some() {
                self.metrics -= 1;
                l.set_metric(None);
            }
        }
        self.tidy(node);
    }

    /// A relist of the NodeMetrics.
    pub fn replace_metrics(&mut self, metrics: Vec<(String, MetricFacts)>) {
        let listed: std::collections::HashSet<&str> =
            metrics.iter().map(|(n, _)| n.as_str()).collect();
        let gone: Vec<String> = self
            .loads
            .iter()
            .filter(|(n, l)| l.metric().is_some() && !listed.contains(&***n))
            .map(|(n, _)| n.to_string())
            .collect();
        for n in gone {
            self.remove_metric(&n);
        }
        for (n, m) in metrics {
            self.set_metric(&n, m);
        }
    }

    /// A pod bound to `node` (its binding, or a change to a bound pod: a
    /// pod's node never changes once set). A pod the cache had on that node
    /// keeps its assign time (when its `PodScheduled` condition gives none,
    /// each event would say "now").
    pub fn set_pod(&mut self, uid: &str, node: &str, mut a: Assigned) {
        self.forget(uid);
        let key = uid_key(uid);
        if let Some(before) = self.loads.get(node).and_then(|l| l.pod(key)) {
            a.assigned_at = a.assigned_at.min(before.assigned_at);
        }
        if !self.load_mut(node).add_pod(key, a) {
            self.pods += 1;
        }
    }

    /// A pod deleted or finished (`node`: where it was bound, as its last
    /// state says; none: it never was).
    pub fn remove_pod(&mut self, uid: &str, node: Option<&str>) {
        self.forget(uid);
        if let Some(node) = node {
            self.unbind(uid_key(uid), node);
        }
    }

    fn unbind(&mut self, key: u64, node: &str) {
        if let Some(l) = self.loads.get_mut(node) {
            if l.remove_pod(key).is_some() {
                self.pods -= 1;
            }
        }
        self.tidy(node);
    }

    /// A relist of the bound pods: those not in it are gone (the
    /// tentative assignments stay).
    pub fn replace_pods(&mut self, pods: Vec<(String, String, Assigned)>) {
        let listed: std::collections::HashSet<u64> =
            pods.iter().map(|(u, _, _)| uid_key(u)).collect();
        let gone: Vec<(u64, String)> = self
            .loads
            .iter()
            .flat_map(|(n, l)| l.keys().map(move |k| (k, n)))
            // (a pod tentative there is not a bound one)
            .filter(|(k, n)| {
                !listed.contains(k) && self.tentative.get(k).is_none_or(|(t, _)| t != *n)
            })
            .map(|(k, n)| (k, n.to_string()))
            .collect();
        for (key, node) in gone {
            self.unbind(key, &node);
        }
        for (uid, node, a) in pods {
            self.set_pod(&uid, &node, a);
        }
    }

    /// Whether the cache has `uid` bound to `node` (counted there, and not
    /// as a tentative assignment there: a late answer may have assumed the
    /// bound pod on another node meanwhile).
    pub fn is_bound(&self, uid: &str, node: &str) -> bool {
        let key = uid_key(uid);
        self.loads.get(node).is_some_and(|l| l.pod(key).is_some())
            && self.tentative.get(&key).is_none_or(|(t, _)| &**t != node)
    }

    /// The extender's own guess: `uid` will be bound to `node` (its best
    /// score), counted there until `until` (a monotonic clock's ms) unless
    /// the watch shows it first. A pod already bound there is not assumed
    /// (bound elsewhere, it cannot be filtered: kube-scheduler places only
    /// pods without a node).
    pub fn assume(&mut self, uid: &str, node: &str, a: Assigned, until: i64) {
        if uid.is_empty() || self.is_bound(uid, node) {
            return;
        }
        self.forget(uid);
        let key = uid_key(uid);
        self.load_mut(node).add_pod(key, a);
        let name = self.name_of(node);
        self.tentative.insert(key, (name, until));
        self.expiries.push_back((until, key));
    }

    /// A tentative assignment made whatever the cache holds (a request
    /// answered late, after the pod's binding showed).
    #[cfg(test)]
    pub fn tentative_for_test(&mut self, uid: &str, node: &str, a: Assigned, until: i64) {
        let key = uid_key(uid);
        self.load_mut(node).add_pod(key, a);
        let name = self.name_of(node);
        self.tentative.insert(key, (name, until));
        self.expiries.push_back((until, key));
    }

    /// Where `uid` is tentatively assigned.
    pub fn assumed(&self, uid: &str) -> Option<&str> {
        self.tentative.get(&uid_key(uid)).map(|(n, _)| &**n)
    }

    /// Takes back a tentative assignment.
    pub fn forget(&mut self, uid: &str) {
        self.forget_key(uid_key(uid));
    }

    fn forget_key(&mut self, key: u64) {
        if let Some((node, _)) = self.tentative.remove(&key) {
            if let Some(l) = self.loads.get_mut(&node) {
                l.remove_pod(key);
            }
            self.tidy(&node);
        }
    }

    /// Whether a tentative assignment's time is over at `now` (monotonic ms).
    pub fn has_expired(&self, now: i64) -> bool {
        self.expiries.front().is_some_and(|(t, _)| *t <= now)
    }

    /// Ends the tentative assignments whose time is over.
    pub fn expire(&mut self, now: i64) {
        while let Some((t, key)) = self.expiries.front().copied() {
            if t > now {
                break;
            }
            self.expiries.pop_front();
            // (a later assumption of the same pod has a later time)
            if self
                .tentative
                .get(&key)
                .is_some_and(|(_, until)| *until == t)
            {
                self.forget_key(key);
            }
        }
    }
}
