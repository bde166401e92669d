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

use crate::load::{Assigned, MetricFacts, NodeLoad};
use crate::rank::NodeFacts;

/// The cache.
#[derive(Debug, Default)]
pub struct Cache {
    include_sys: bool,
    nodes: HashMap<String, NodeFacts>,
    /// By node name: a node's NodeMetric and pods may come before its Node.
    loads: HashMap<String, NodeLoad>,
    metrics: usize,
    /// Bound pods: UID -> node.
    bound: HashMap<String, String>,
    /// Tentative assignments: UID -> (node, until Unix ms).
    tentative: HashMap<String, (String, i64)>,
    /// The tentative assignments by expiry (one TTL for all: in order).
    expiries: VecDeque<(i64, String)>,
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
            pods: self.bound.len(),
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
        let sys = self.include_sys;
        self.loads
            .entry(node.to_string())
            .or_insert_with(|| NodeLoad::new(sys))
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
            .filter(|(n, l)| l.metric().is_some() && !listed.contains(n.as_str()))
            .map(|(n, _)| n.clone())
            .collect();
        for n in gone {
            self.remove_metric(&n);
        }
        for (n, m) in metrics {
            self.set_metric(&n, m);
        }
    }

    /// A pod bound to `node` (its binding, or a change to a bound pod).
    pub fn set_pod(&mut self, uid: &str, node: &str, a: Assigned) {
        self.forget(uid);
        // bound elsewhere before (a pod deleted and made again keeps no UID,
        // but a relist may carry a move the watch missed)
        if let Some(old) = self.bound.get(uid).filter(|n| *n != node).cloned() {
            if let Some(l) = self.loads.get_mut(&old) {
                l.remove_pod(uid);
            }
            self.tidy(&old);
        }
        self.load_mut(node).add_pod(uid, a);
        self.bound.insert(uid.to_string(), node.to_string());
    }

    /// A pod deleted, finished, or not bound.
    pub fn remove_pod(&mut self, uid: &str) {
        if let Some(node) = self.bound.remove(uid) {
            if let Some(l) = self.loads.get_mut(&node) {
                l.remove_pod(uid);
            }
            self.tidy(&node);
        }
        self.forget(uid);
    }

    /// A relist of the bound pods.
    pub fn replace_pods(&mut self, pods: Vec<(String, String, Assigned)>) {
        let listed: std::collections::HashSet<&str> =
            pods.iter().map(|(u, _, _)| u.as_str()).collect();
        let gone: Vec<String> = self
            .bound
            .keys()
            .filter(|u| !listed.contains(u.as_str()))
            .cloned()
            .collect();
        for u in gone {
            self.remove_pod(&u);
        }
        for (uid, node, a) in pods {
            self.set_pod(&uid, &node, a);
        }
    }

    pub fn is_bound(&self, uid: &str) -> bool {
        self.bound.contains_key(uid)
    }

    /// The extender's own guess: `uid` will be bound to `node` (its best
    /// score), counted there until `until_ms` unless the watch shows it
    /// first. A pod already bound is not assumed.
    pub fn assume(&mut self, uid: &str, node: &str, a: Assigned, until_ms: i64) {
        if uid.is_empty() || self.is_bound(uid) {
            return;
        }
        self.forget(uid);
        self.load_mut(node).add_pod(uid, a);
        self.tentative
            .insert(uid.to_string(), (node.to_string(), until_ms));
        self.expiries.push_back((until_ms, uid.to_string()));
    }

    /// Where `uid` is tentatively assigned.
    pub fn assumed(&self, uid: &str) -> Option<&str> {
        self.tentative.get(uid).map(|(n, _)| n.as_str())
    }

    /// Takes back a tentative assignment.
    pub fn forget(&mut self, uid: &str) {
        if let Some((node, _)) = self.tentative.remove(uid) {
            if let Some(l) = self.loads.get_mut(&node) {
                l.remove_pod(uid);
            }
            self.tidy(&node);
        }
    }

    /// Whether a tentative assignment's time is over at `now_ms`.
    pub fn has_expired(&self, now_ms: i64) -> bool {
        self.expiries.front().is_some_and(|(t, _)| *t <= now_ms)
    }

    /// Ends the tentative assignments whose time is over.
    pub fn expire(&mut self, now_ms: i64) {
        while let Some((t, uid)) = self.expiries.front().cloned() {
            if t > now_ms {
                break;
            }
            self.expiries.pop_front();
            // (a later assumption of the same pod has a later time)
            if self
                .tentative
                .get(&uid)
                .is_some_and(|(_, until)| *until == t)
            {
                self.forget(&uid);
            }
        }
    }
}
