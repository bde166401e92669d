//! The extender's two verbs over the cache: Filter and Prioritize, each a
//! request's JSON in and its answer's JSON out.

use std::sync::RwLock;

use qoslet_kube_api::view::NodeView;
use serde_json::value::RawValue;

use crate::args::Args;
use crate::cache::Cache;
use crate::estimate::{estimate, PodFacts};
use crate::facts::{node_facts, pod_facts};
use crate::load::Assigned;
use crate::rank::{extender_score, filter, score, NodeFacts};
use crate::wire::{self, ExtenderArgs, FilterResult, HostPriority, NodeListOut};

/// Why a node named in a request fails when the cache does not know it.
pub const UNKNOWN_NODE: &str = "node(s) not yet known to qoslet's scheduler extender";

/// How long the node a pod scored best on holds it, by default.
pub const DEFAULT_ASSUME_TTL_MS: i64 = 30_000;

/// At most this many nodes in a request (kube-scheduler's largest
/// clusters have 15,000): a request naming more is answered with an error,
/// not read into memory node by node.
pub const MAX_NODES: usize = 50_000;

/// The extender: LoadAware's args and the cache.
#[derive(Debug)]
pub struct Extender {
    pub args: Args,
    pub cache: RwLock<Cache>,
    /// How long a tentative assignment lasts (ms).
    pub assume_ttl_ms: i64,
    /// The tentative assignments' clock (monotonic: a wall clock set back
    /// must not keep them for good).
    started: std::time::Instant,
}

/// The nodes of a request: names with the Node's facts (`None`: unknown),
/// from the request's objects or the cache.
enum Nodes<'a> {
    Names(&'a [String]),
    Objects(Vec<(String, NodeFacts, &'a RawValue)>),
}

impl<'a> Nodes<'a> {
    fn of(req: &'a ExtenderArgs) -> Self {
        match (&req.node_names, &req.nodes) {
            (Some(n), _) => Nodes::Names(n),
            (None, Some(items)) => Nodes::Objects(objects(items)),
            (None, None) => Nodes::Names(&[]),
        }
    }

    /// How many nodes a request names.
    fn count(req: &ExtenderArgs) -> usize {
        match (&req.node_names, &req.nodes) {
            (Some(n), _) => n.len(),
            (None, Some(items)) => items.len(),
            (None, None) => 0,
        }
    }

    fn len(&self) -> usize {
        match self {
            Nodes::Names(n) => n.len(),
            Nodes::Objects(o) => o.len(),
        }
    }

    fn name(&self, i: usize) -> &str {
        match self {
            Nodes::Names(n) => &n[i],
            Nodes::Objects(o) => &o[i].0,
        }
    }
}

fn objects(items: &[Box<RawValue>]) -> Vec<(String, NodeFacts, &RawValue)> {
    items
        .iter()
        .filter_map(|raw| {
            let n: NodeView = serde_json::from_str(raw.get()).ok()?;
            let name = n.metadata.name.clone().filter(|n| !n.is_empty())?;
            Some((name, node_facts(&n), &**raw))
        })
        .collect()
}

impl Extender {
    pub fn new(args: Args) -> Self {
        Self {
            cache: RwLock::new(Cache::new(args.prod_usage_include_sys)),
            args,
            assume_ttl_ms: DEFAULT_ASSUME_TTL_MS,
            started: std::time::Instant::now(),
        }
    }

    /// The tentative assignments' clock, ms.
    fn clock(&self) -> i64 {
        self.started.elapsed().as_millis() as i64
    }

    /// A new cycle for `pod`: tentative assignments whose time is over end
    /// (the write lock only when one is due), and the pod's own ends (it is
    /// being placed again: its last cycle did not bind it where it scored
    /// best).
    fn begin(&self, pod: &PodFacts) {
        let now = self.clock();
        let due = self
            .cache
            .read()
            .is_ok_and(|c| c.has_expired(now) || c.assumed(&pod.uid).is_some());
        if due {
            if let Ok(mut c) = self.cache.write() {
                c.expire(now);
                c.forget(&pod.uid);
            }
        }
    }

    fn facts<'c, 'n>(
        cache: &'c Cache,
        nodes: &'n Nodes,
        i: usize,
    ) -> (&'n str, Option<&'c NodeFacts>)
    where
        'n: 'c,
    {
        match nodes {
            Nodes::Names(n) => (n[i].as_str(), cache.node(&n[i])),
            Nodes::Objects(o) => (o[i].0.as_str(), Some(&o[i].1)),
        }
    }

    fn assume(&self, pod: &PodFacts, node: &str, now_ms: i64) {
        let a = Assigned {
            name: crate::load::name_key(&pod.namespace, &pod.name),
            prod: pod.is_prod(),
            estimate: estimate(pod, self.args.estimated_scaling_factors),
            assigned_at: now_ms,
            deadline: 0,
        };
        if let Ok(mut c) = self.cache.write() {
            // (the time taken under the lock: the expiry queue stays in order)
            let until = self.clock() + self.assume_ttl_ms;
            c.assume(&pod.uid, node, a, until);
        }
    }

    /// `POST /filter`: the JSON answer.
    pub fn filter(&self, req: &ExtenderArgs, now_ms: i64) -> Vec<u8> {
        let Some(pod) = req.pod.as_ref() else {
            return json(&wire::filter_error("the request has no Pod".into()));
        };
        let pod = pod_facts(pod);
        if Nodes::count(req) > MAX_NODES {
            return json(&wire::filter_error(format!(
                "the request names more than {MAX_NODES} nodes"
            )));
        }
        self.begin(&pod);
        let nodes = Nodes::of(req);
        let count = nodes.len();
        let mut out = FilterResult::default();
        let mut passed = Vec::with_capacity(count);
        {
            let Ok(cache) = self.cache.read() else {
                return json(&wire::filter_error("the cache is poisoned".into()));
            };
            for i in 0..count {
                let (name, facts) = Self::facts(&cache, &nodes, i);
                let Some(facts) = facts else {
                    // a DaemonSet's pod passes everywhere, a node just added too
                    if pod.daemonset {
                        passed.push(i);
                    } else {
                        out.failed_nodes.insert(name, UNKNOWN_NODE.into());
                    }
                    continue;
                };
                match filter(&self.args, facts, cache.load(name), &pod, now_ms) {
                    Ok(()) => passed.push(i),
                    Err(why) => {
                        out.failed_nodes.insert(name, why);
                    }
                }
            }
        }
        // one node left: kube-scheduler binds it without asking for scores
        if let [only] = passed[..] {
            let name = nodes.name(only).to_string();
            self.assume(&pod, &name, now_ms);
        }
        match &nodes {
            Nodes::Names(n) => {
                out.node_names = Some(passed.iter().map(|i| n[*i].as_str()).collect())
            }
            Nodes::Objects(o) => {
                out.nodes = Some(NodeListOut {
                    items: passed.iter().map(|i| o[*i].2).collect(),
                })
            }
        }
        json(&out)
    }

    /// `POST /prioritize`: the JSON answer (a `HostPriorityList`).
    pub fn prioritize(&self, req: &ExtenderArgs, now_ms: i64) -> Vec<u8> {
        let Some(pod) = req.pod.as_ref() else {
            return b"[]".to_vec();
        };
        let pod = pod_facts(pod);
        if Nodes::count(req) > MAX_NODES {
            return b"[]".to_vec();
        }
        self.begin(&pod);
        let nodes = Nodes::of(req);
        let count = nodes.len();
        let mut out = Vec::with_capacity(count);
        // LoadAware's own 0-100: the best node is found on it (the 0-10 the
        // extender answers ties far more often)
        let mut best: Option<(i64, usize, bool)> = None;
        {
            let Ok(cache) = self.cache.read() else {
                return b"[]".to_vec();
            };
            for i in 0..count {
                let (name, facts) = Self::facts(&cache, &nodes, i);
                let s = facts.map_or(0, |f| score(&self.args, f, cache.load(name), &pod, now_ms));
                best = match best {
                    Some((b, j, tied)) if s < b => Some((b, j, tied)),
                    Some((b, j, _)) if s == b => Some((b, j, true)),
                    _ => Some((s, i, false)),
                };
                out.push(HostPriority {
                    host: name.to_string(),
                    score: extender_score(s),
                });
            }
        }
        // the best node, when one is best and it is worth something, holds
        // the pod until the watch shows where it went; not when its 0-10
        // (what kube-scheduler sees) is shared: kube-scheduler's other
        // scores decide between those
        let shared = |i: usize| out.iter().filter(|h| h.score == out[i].score).count() > 1;
        if let Some((_, i, false)) = best.filter(|(s, i, _)| *s > 0 && !shared(*i)) {
            let host = out[i].host.clone();
            self.assume(&pod, &host, now_ms);
        }
        json(&out)
    }
}

fn json<T: serde::Serialize>(v: &T) -> Vec<u8> {
    serde_json::to_vec(v).unwrap_or_else(|e| format!(r#"{{"Error":"{e}"}}"#).into_bytes())
}
