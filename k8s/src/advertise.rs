//! This node's batch resources on its Node (`kubernetes.batchResources`):
//! `kubernetes.io/batch-cpu` and `kubernetes.io/batch-memory` in
//! `status.capacity` and `status.allocatable`, as koord-manager writes them,
//! with no koord-manager.
//!
//! Each NodeMetric report's figures (published by the reporter, written or
//! not: the Node and the NodeMetric never disagree), the pods watch's view
//! and the Node as the node watch has it go through the one
//! [`crate::batch::explain`]. A write is a JSON merge patch of the status
//! subresource naming only the two keys (the rest of kubelet's status is
//! untouched) with the Node's `resourceVersion` as a precondition: a status
//! update of kubelet's in between is a 409, and the Node is read again and
//! the patch made again. Keys are removed (`null`), never written as 0, when
//! co-location is off or the figures are older than `degradeTimeMinutes`.
//! A 429 backs off; an API server that cannot be reached leaves what was
//! written in place (the next report tries again).
//!
//! Another writer (koord-manager, an operator's `kubectl patch`): while
//! another field manager owns the keys (`metadata.managedFields`), qoslet
//! does not write them, says so once in its log, as a Warning Event on the
//! Node and on `/metrics`, and never fights over them; removing the keys
//! hands them back. On an API server that keeps no field managers, keys
//! that change to values qoslet did not write stop it for good (until it
//! restarts). After a restart, nothing is written before the first figures
//! (a restart does not take the keys off the Node).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube::api::{Api, Patch, PatchParams};
use qoslet_colocation::strategy::ColocationConfig;
use qoslet_colocation::sync::Advertised;
use qoslet_colocation::{BATCH_CPU, BATCH_MEMORY};
use serde_json::{json, Value};
use tokio::sync::watch;
use tracing::{info, warn};

use crate::batch::{advertised, cluster_pod_input, explain, Explanation};
use crate::sloconfig::SloConfig;
use crate::view::NodeView;

/// `kubernetes.batchResources`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum BatchMode {
    /// Never write (the default: koord-manager's job where it runs).
    #[default]
    Off,
    /// Write whatever the colocation-config's `enable` says (its other
    /// fields still apply).
    On,
    /// Write when the colocation-config turns co-location on for this node.
    Auto,
}

/// What the advertiser did, for `/metrics`.
#[derive(Debug, Default)]
pub struct AdvertiseStatus {
    inner: Mutex<Shown>,
}

#[derive(Debug, Default, Clone)]
struct Shown {
    /// `waiting` (no Node or no figures yet), `advertising`, `removed`,
    /// `yielded` (another writer), `failing`.
    state: &'static str,
    written: Option<Advertised>,
    last_write: Option<i64>,
    /// Writes by why (`Due`'s reason), conflicts, 429s, failures.
    writes: std::collections::BTreeMap<&'static str, u64>,
    conflicts: u64,
    throttled: u64,
    failed: u64,
    /// The latest explanation (JSON) and the last write's reason.
    explanation: Option<Arc<String>>,
    last_reason: String,
}

fn lock(m: &Mutex<Shown>) -> std::sync::MutexGuard<'_, Shown> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl AdvertiseStatus {
    /// What `GetBatchResources` answers.
    pub fn view(&self) -> qoslet_agent::admin::BatchView {
        let s = lock(&self.inner);
        qoslet_agent::admin::BatchView {
            state: match s.state {
                "" => "waiting",
                st => st,
            }
            .into(),
            explanation_json: s.explanation.as_deref().cloned().unwrap_or_default(),
            last_write_unix: s.last_write.unwrap_or(0),
            last_write_reason: s.last_reason.clone(),
        }
    }

    fn explained(&self, e: &Explanation) {
        let json = Arc::new(format!("{:#}", e.json()));
        lock(&self.inner).explanation = Some(json);
    }

    pub fn state(&self) -> &'static str {
        match lock(&self.inner).state {
            "" => "waiting",
            s => s,
        }
    }

    /// Prometheus lines.
    pub fn render(&self, o: &mut qoslet_metrics::prom::Out) {
        let s = lock(&self.inner).clone();
        o.family(
            "qoslet_batch_resources_state",
            "gauge",
            "1 for the batch-resource advertiser's state: waiting, advertising, removed, yielded (another writer owns the keys), failing.",
        );
        o.sample(
            "qoslet_batch_resources_state",
            &[("state", self.state())],
            1.0,
        );
        o.family(
            "qoslet_batch_resources_advertised",
            "gauge",
            "What qoslet last wrote to its Node: kubernetes.io/batch-cpu in milli-cores, batch-memory in bytes (absent: removed).",
        );
        if let Some(a) = s.written {
            for (r, v) in [(BATCH_CPU, a.cpu), (BATCH_MEMORY, a.memory)] {
                if let Some(v) = v {
                    o.sample(
                        "qoslet_batch_resources_advertised",
                        &[("resource", r)],
                        v as f64,
                    );
                }
            }
        }
        o.family(
            "qoslet_batch_resources_last_write_timestamp_seconds",
            "gauge",
            "When qoslet last wrote its Node's batch resources (Unix seconds).",
        );
        if let Some(t) = s.last_write {
            o.sample(
                "qoslet_batch_resources_last_write_timestamp_seconds",
                &[],
                t as f64,
            );
        }
        o.family(
            "qoslet_batch_resources_writes_total",
            "counter",
            "Writes of the Node's batch resources by why: firstWrite, expired (updateTimeThresholdSeconds), appeared, disappeared, moved (over resourceDiffThreshold).",
        );
        for why in ["firstWrite", "expired", "appeared", "disappeared", "moved"] {
            let n = s.writes.get(why).copied().unwrap_or(0);
            o.sample(
                "qoslet_batch_resources_writes_total",
                &[("reason", why)],
                n as f64,
            );
        }
        o.family(
            "qoslet_batch_resources_write_errors_total",
            "counter",
            "Failed writes of the Node's batch resources: conflict (read again, retried), throttled (429, backed off), failed.",
        );
        for (k, n) in [
            ("conflict", s.conflicts),
            ("throttled", s.throttled),
            ("failed", s.failed),
        ] {
            o.sample(
                "qoslet_batch_resources_write_errors_total",
                &[("kind", k)],
                n as f64,
            );
        }
    }
}

/// The inputs the advertiser follows.
pub struct Inputs {
    pub colocation: watch::Receiver<SloConfig>,
    pub figures: watch::Receiver<Option<Arc<Value>>>,
    pub node: watch::Receiver<Option<Arc<NodeView>>>,
    pub store: qoslet_state::Store,
}

/// The field manager qoslet writes as: the API server records it in
/// `metadata.managedFields`, so koord-manager (or anyone) sees who owns the
/// keys, and qoslet sees when someone else does.
pub const FIELD_MANAGER: &str = "qoslet";

/// The API server's merged entry for the oldest managers once an object has
/// more than 10 (`capmanagers.go`): qoslet's own entry may be among them.
const ANCIENT: &str = "ancient-changes";

/// Another field manager owning a batch key of the Node's status (an
/// `Update` of koord-manager's, a `kubectl patch`), if any.
pub fn other_owner(n: &NodeView) -> Option<String> {
    n.metadata.managed_fields.iter().flatten().find_map(|e| {
        let m = e.manager.as_deref().unwrap_or("");
        if m == FIELD_MANAGER || m == ANCIENT {
            return None;
        }
        let f = &e.fields_v1.as_ref()?.0["f:status"];
        let owns = ["f:capacity", "f:allocatable"].iter().any(|list| {
            [BATCH_CPU, BATCH_MEMORY]
                .iter()
                .any(|k| !f[*list][format!("f:{k}")].is_null())
        });
        owns.then(|| m.to_string())
    })
}

/// Whether the API server keeps field managers for this Node (every API
/// server since Kubernetes 1.18 does; without them qoslet can only compare
/// values).
fn has_managers(n: &NodeView) -> bool {
    n.metadata
        .managed_fields
        .as_ref()
        .is_some_and(|m| !m.is_empty())
}

/// A resourceVersion as a number (etcd's revision; `None`: not one).
fn rv(n: &NodeView) -> Option<u64> {
    n.metadata.resource_version.as_deref()?.parse().ok()
}

/// The newer of two views of the Node (`a`: the watch's): a view of another
/// Node object (deleted and created again: another UID) is not compared.
fn newer(a: Option<Arc<NodeView>>, b: Option<Arc<NodeView>>) -> Option<Arc<NodeView>> {
    match (a, b) {
        (Some(a), Some(b)) if a.metadata.uid == b.metadata.uid => match (rv(&a), rv(&b)) {
            (Some(x), Some(y)) if y > x => Some(b),
            // equal, older, or not numbers: the watch's is the one to trust
            _ => Some(a),
        },
        // the watch has no Node (deleted): nothing to write to
        (None, _) => None,
        (a, _) => a,
    }
}

/// The patch that makes the Node show `next`, conditional on `rv`.
pub fn patch_body(next: Advertised, rv: Option<&str>) -> Value {
    let v = |x: Option<i64>| x.map_or(Value::Null, |x| json!(x.to_string()));
    let keys = json!({BATCH_CPU: v(next.cpu), BATCH_MEMORY: v(next.memory)});
    let mut body = json!({"status": {"capacity": keys.clone(), "allocatable": keys}});
    if let Some(rv) = rv {
        body["metadata"] = json!({"resourceVersion": rv});
    }
    body
}

fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// The advertiser's memory between steps.
pub struct Advertiser {
    api: Api<NodeView>,
    client: kube::Client,
    node: String,
    mode: BatchMode,
    status: Arc<AdvertiseStatus>,
    /// The first step (Unix seconds): with no figures since, nothing is
    /// known until `degradeTimeMinutes` have passed.
    started: Option<i64>,
    /// What qoslet last wrote and when (Unix seconds), on the Node of this UID.
    last: Option<(i64, Advertised)>,
    /// The Node as qoslet last saw it (the watch's or a patch's answer).
    seen: Option<Arc<NodeView>>,
    /// Why qoslet stands back for good (an API server without field
    /// managers, where the keys changed to values qoslet did not write).
    yielded: Option<String>,
    /// Another field manager owning the keys now (said once while it lasts).
    other: Option<String>,
    /// The last error logged (one line per distinct error).
    logged: Option<String>,
}

impl Advertiser {
    pub fn new(
        client: kube::Client,
        node: String,
        mode: BatchMode,
        status: Arc<AdvertiseStatus>,
    ) -> Self {
        Self {
            api: Api::all(client.clone()),
            client,
            node,
            mode,
            status,
            started: None,
            last: None,
            seen: None,
            yielded: None,
            other: None,
            logged: None,
        }
    }

    /// The colocation-config in force for this mode (`None`: wait): `on`
    /// turns `enable` on everywhere, and takes Koordinator's defaults where
    /// the ConfigMap cannot be read; `auto` waits for a ConfigMap read.
    fn config(&self, c: &SloConfig) -> Option<ColocationConfig> {
        let mut c = match (c, self.mode) {
            (SloConfig::Read(c), _) => (**c).clone(),
            (SloConfig::Unreadable(_), BatchMode::On) => ColocationConfig::default(),
            _ => return None,
        };
        if self.mode == BatchMode::On {
            c.cluster.enable = Some(true);
            for n in &mut c.nodes {
                n.strategy.enable = Some(true);
            }
        }
        Some(c)
    }

    fn set_state(&self, state: &'static str) {
        lock(&self.status.inner).state = state;
    }

    /// Says once, while it lasts, that another writer keeps the keys.
    fn stand_back(&mut self, why: String, for_good: bool) {
        if self.other.as_ref() != Some(&why) {
            let msg = if for_good {
                format!("another writer keeps this Node's batch resources ({why}): qoslet does not write them until it restarts")
            } else {
                format!("another writer keeps this Node's batch resources ({why}): qoslet does not write them while it does (remove the keys to hand them back)")
            };
            warn!(node = %self.node, "{msg}");
            crate::nodeslo::node_event(&self.client, &self.node, "BatchResourcesYielded", &msg);
            self.other = Some(why.clone());
        }
        if for_good {
            self.yielded = Some(why);
        }
        self.set_state("yielded");
    }

    /// The Node read again (after a 409), by name with a list (the verbs
    /// the node watch already has).
    async fn read_node(&self) -> Option<NodeView> {
        let lp = kube::api::ListParams::default().fields(&format!("metadata.name={}", self.node));
        crate::limited().await;
        match tokio::time::timeout(crate::evict::API_TIMEOUT, self.api.list(&lp)).await {
            Ok(Ok(l)) => l.items.into_iter().next(),
            _ => None,
        }
    }

    /// One look at the inputs at `now` (Unix seconds), and a write when one
    /// is due. Returns the explanation it acted on (`None`: no Node, no
    /// figures or no colocation-config yet, or another writer's keys).
    pub async fn step(
        &mut self,
        colocation: &SloConfig,
        figures: Option<Arc<Value>>,
        node: Option<Arc<NodeView>>,
        pods: &[qoslet_colocation::batch::PodInput],
        now: i64,
    ) -> Option<Explanation> {
        let e = self.step_inner(colocation, figures, node, pods, now).await;
        if let Some(e) = &e {
            self.status.explained(e);
        }
        e
    }

    async fn step_inner(
        &mut self,
        colocation: &SloConfig,
        figures: Option<Arc<Value>>,
        node: Option<Arc<NodeView>>,
        pods: &[qoslet_colocation::batch::PodInput],
        now: i64,
    ) -> Option<Explanation> {
        if self.yielded.is_some() || self.mode == BatchMode::Off {
            return None;
        }
        let started = *self.started.get_or_insert(now);
        let before = self.seen.as_ref().map(|n| n.metadata.uid.clone());
        self.seen = newer(node, self.seen.take());
        let Some(mut current) = self.seen.clone() else {
            self.set_state("waiting");
            return None;
        };
        if before.is_some_and(|u| u != current.metadata.uid) {
            // the Node was created again: nothing of ours is on it
            self.last = None;
        }
        let Some(cfg) = self.config(colocation) else {
            self.set_state("waiting");
            return None;
        };
        // no figures since start: nothing is known yet (a restart must not
        // take the keys off), until degradeTimeMinutes have passed
        if figures.is_none() {
            let s = cfg.resolve(
                current
                    .metadata
                    .labels
                    .as_ref()
                    .unwrap_or(&Default::default()),
                current
                    .metadata
                    .annotations
                    .as_ref()
                    .unwrap_or(&Default::default()),
            );
            if now.saturating_sub(started) <= s.strategy.degrade_minutes().saturating_mul(60) {
                self.set_state("waiting");
                return None;
            }
        }
        for attempt in 0..4u32 {
            // another writer: another field manager owns the keys (while it
            // does), or, on an API server that keeps no field managers, the
            // keys moved to values qoslet did not write (for good)
            if let Some(m) = other_owner(&current) {
                self.stand_back(format!("field manager {m:?} owns them"), false);
                return None;
            }
            self.other = None;
            if !has_managers(&current) {
                if let Some((_, ours)) = self.last {
                    let shown = advertised(&current);
                    if shown != ours {
                        self.stand_back(
                            format!("they changed to {shown:?}, and qoslet wrote {ours:?}"),
                            true,
                        );
                        return None;
                    }
                }
            }
            let age = self.last.map(|(t, _)| now - t);
            let e = explain(&cfg, &current, pods, figures.as_deref(), now, age);
            let Some(due) = e.due.clone() else {
                self.set_state(match e.next() {
                    Advertised::NONE => "removed",
                    _ => "advertising",
                });
                return Some(e);
            };
            let next = e.next();
            let body = patch_body(next, current.metadata.resource_version.as_deref());
            crate::limited().await;
            let pp = PatchParams {
                field_manager: Some(FIELD_MANAGER.into()),
                ..Default::default()
            };
            let r = tokio::time::timeout(
                crate::evict::API_TIMEOUT,
                self.api.patch_status(&self.node, &pp, &Patch::Merge(&body)),
            )
            .await;
            match r {
                Ok(Ok(n)) => {
                    let mut s = lock(&self.status.inner);
                    *s.writes.entry(due_kind(&due)).or_default() += 1;
                    s.written = Some(next);
                    s.last_write = Some(now);
                    s.last_reason = due.to_string();
                    s.state = if next == Advertised::NONE {
                        "removed"
                    } else {
                        "advertising"
                    };
                    drop(s);
                    info!(node = %self.node, cpu = ?next.cpu, memory = ?next.memory, why = %due, "batch resources written to the Node");
                    self.last = Some((now, next));
                    self.seen = newer(self.seen.take(), Some(Arc::new(n)));
                    self.logged = None;
                    return Some(e);
                }
                Ok(Err(kube::Error::Api(s))) if s.code == 409 && attempt < 3 => {
                    lock(&self.status.inner).conflicts += 1;
                    tokio::time::sleep(Duration::from_millis(100 << attempt)).await;
                    match self.read_node().await {
                        Some(n) => {
                            current = Arc::new(n);
                            self.seen = Some(current.clone());
                        }
                        None => {
                            self.failed("the Node could not be read again after a conflict");
                            return Some(e);
                        }
                    }
                }
                Ok(Err(kube::Error::Api(s))) if s.code == 429 && attempt < 3 => {
                    lock(&self.status.inner).throttled += 1;
                    tokio::time::sleep(Duration::from_secs(1 << attempt)).await;
                }
                Ok(Err(err)) => {
                    self.failed(&err.to_string());
                    return Some(e);
                }
                Err(_) => {
                    self.failed("no answer in 10 s");
                    return Some(e);
                }
            }
        }
        self.failed("conflicts or throttling on every attempt");
        None
    }

    fn failed(&mut self, why: &str) {
        let mut s = lock(&self.status.inner);
        s.failed += 1;
        s.state = "failing";
        drop(s);
        if self.logged.as_deref() != Some(why) {
            warn!(node = %self.node, error = why, "batch resources not written (the Node keeps what it shows; retried at the next report)");
            self.logged = Some(why.to_string());
        }
    }
}

/// How often the advertiser looks again without new figures (a removal
/// when they stop coming is due within a minute of `degradeTimeMinutes`).
pub const RECHECK: Duration = Duration::from_secs(60);

/// Advertises this node's batch resources until `shutdown`.
pub async fn advertise(mut a: Advertiser, mut inputs: Inputs, mut shutdown: watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(RECHECK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            r = inputs.figures.changed() => if r.is_err() { return },
            r = inputs.colocation.changed() => if r.is_err() { return },
            _ = shutdown.changed() => return,
        }
        let cfg = inputs.colocation.borrow_and_update().clone();
        let figures = inputs.figures.borrow_and_update().clone();
        let node = inputs.node.borrow().clone();
        let pods: Vec<_> = inputs
            .store
            .cluster_pod_list()
            .iter()
            .map(|p| cluster_pod_input(p))
            .collect();
        tokio::select! {
            _ = a.step(&cfg, figures, node, &pods, unix_now()) => {}
            _ = shutdown.changed() => return,
        }
    }
}

fn due_kind(d: &qoslet_colocation::sync::Due) -> &'static str {
    use qoslet_colocation::sync::Due;
    match d {
        Due::FirstWrite => "firstWrite",
        Due::Expired { .. } => "expired",
        Due::Appeared { .. } => "appeared",
        Due::Disappeared { .. } => "disappeared",
        Due::Moved { .. } => "moved",
    }
}
