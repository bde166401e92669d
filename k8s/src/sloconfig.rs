//! Koordinator's `slo-controller-config` ConfigMap
//! (`kubernetes.sloConfig`, default `koordinator-system/slo-controller-config`),
//! read as koord-manager reads it: its `colocation-config` key merged over
//! the defaults and resolved for this node by the advertiser; its policy keys
//! (`resource-threshold-config`, `resource-qos-config`, `cpu-burst-config`,
//! `system-config`, `host-application-config`) merged into the NodeSLO spec
//! koord-manager would write for this node ([`qoslet_colocation::slo`]) and
//! offered to the policy hub as its `configmap` source, below a real NodeSLO
//! and above the file. Followed with kube's watcher on that one object (a
//! namespaced Role to read it; without one, asked again every 5 minutes).
//!
//! A ConfigMap missing, or the key empty, is Koordinator's defaults
//! (co-location off); a key with bad JSON or an invalid cluster strategy
//! keeps the last good value and records a Warning Event on the ConfigMap
//! naming the key and the error (once per distinct error), as koord-manager
//! does; an API server that cannot be reached keeps the last good value.
//! Until a first good value is read the config is unknown, and
//! `batchResources: auto` waits, as koord-manager does with its cache
//! unavailable; a ConfigMap RBAC does not let qoslet read is `Unreadable`
//! (`on` then takes Koordinator's defaults, `auto` waits). The Warning Event
//! of a bad value has one name for the cluster (the ConfigMap's
//! resourceVersion): the first node records it, the others' are refused,
//! not 5,000 Events for one bad edit.

use std::collections::BTreeMap;
use std::sync::Arc;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, ObjectReference};
use kube::api::Api;
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use qoslet_agent::hub::{PolicyHub, Source};
use qoslet_colocation::slo;
use qoslet_colocation::strategy::ColocationConfig;
use qoslet_qos_engine::source::PolicyConfig;
use tokio::sync::watch;
use tracing::{info, warn};

/// The key koord-manager reads the colocation strategy from.
pub const COLOCATION_KEY: &str = "colocation-config";

/// How long a ConfigMap RBAC does not let qoslet read waits before it is
/// asked for again (not the watcher's 30 s back-off: 5,000 nodes without
/// the Role would ask 166 times a second).
const FORBIDDEN_RETRY: std::time::Duration = std::time::Duration::from_secs(300);

/// The ConfigMap's policy keys as this node reads them: each key's last
/// good merge (koord-manager keeps a key's last good value when a new one
/// does not parse), resolved for this node's labels into one policy.
#[derive(Debug, Default)]
pub struct PolicyKeys {
    good: [Option<slo::Merged>; 5],
    /// Per key, the error last reported (one Event per distinct error).
    refused: BTreeMap<&'static str, String>,
}

/// What one read of the ConfigMap's data gives the policy hub.
#[derive(Debug)]
pub struct PolicyRead {
    /// `None`: the ConfigMap names no policy key (the source is withdrawn:
    /// a ConfigMap kept only for `colocation-config` does not override the
    /// file's policy with Koordinator's defaults).
    pub policy: Option<Result<PolicyConfig, String>>,
    /// Keys newly refused (name, error): each one Warning Event.
    pub refused: Vec<(&'static str, String)>,
    /// How the node's entries were chosen (for the log).
    pub notes: Vec<String>,
}

impl PolicyKeys {
    /// Reads `data` for a node with `labels`: each key merged, and refused
    /// (its last good value kept, or the defaults) when it is bad JSON or
    /// of a wrong shape, or when any of its values (the cluster's and every
    /// node entry's, as Go's decoder fails a key on any entry) does not
    /// parse as its NodeSLO field; then the spec they make for this node,
    /// parsed whole. While a key present in `data` has never been good, the
    /// policy is refused (not Koordinator's defaults in force over the file).
    pub fn read(
        &mut self,
        data: &BTreeMap<String, String>,
        labels: &BTreeMap<String, String>,
    ) -> PolicyRead {
        if !slo::has_policy_keys(data) {
            self.good = Default::default();
            self.refused.clear();
            return PolicyRead {
                policy: None,
                refused: Vec::new(),
                notes: Vec::new(),
            };
        }
        let mut refused = Vec::new();
        let mut notes = Vec::new();
        let mut never_good = Vec::new();
        for (i, k) in slo::KEYS.iter().enumerate() {
            let checked = slo::merge(k, data.get(k.name).map(String::as_str)).and_then(|m| {
                let entries = std::iter::once(("the cluster's".to_string(), &m.cluster)).chain(
                    m.nodes
                        .iter()
                        .map(|e| (format!("node entry {:?}", e.name), &e.value)),
                );
                for (which, v) in entries {
                    PolicyConfig::try_from(serde_json::json!({ k.field: v }))
                        .map_err(|e| format!("{which}: {e}"))?;
                }
                Ok(m)
            });
            match checked {
                Ok(m) => {
                    if !m.dropped.is_empty() {
                        notes.push(format!(
                            "{}: fields no Koordinator type defines, dropped as koord-manager drops them: {}",
                            k.name,
                            m.dropped.join(", ")
                        ));
                    }
                    self.good[i] = Some(m);
                    self.refused.remove(k.name);
                }
                Err(e) => {
                    let e: String = e.chars().take(512).collect();
                    if self.good[i].is_none() {
                        never_good.push(format!("{}: {e}", k.name));
                    }
                    if self.refused.get(k.name) != Some(&e) {
                        self.refused.insert(k.name, e.clone());
                        refused.push((k.name, e));
                    }
                }
            }
        }
        let (policy, more) = self.resolve(labels);
        notes.extend(more);
        let policy = if never_good.is_empty() {
            policy
        } else {
            Err(format!(
                "slo-controller-config: {} (no good value read yet)",
                never_good.join("; ")
            ))
        };
        PolicyRead {
            policy: Some(policy),
            refused,
            notes,
        }
    }

    /// The policy of the last good keys for a node with `labels` (a key
    /// never good: koord-manager's defaults).
    pub fn resolve(
        &self,
        labels: &BTreeMap<String, String>,
    ) -> (Result<PolicyConfig, String>, Vec<String>) {
        let merged: [slo::Merged; 5] = std::array::from_fn(|i| {
            self.good[i]
                .clone()
                .unwrap_or_else(|| slo::merge(&slo::KEYS[i], None).expect("the defaults merge"))
        });
        let (spec, notes) = slo::node_spec(&merged, labels);
        (
            PolicyConfig::try_from(spec).map_err(|e| format!("slo-controller-config: {e}")),
            notes,
        )
    }
}

/// Where the ConfigMap is: `namespace/name`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SloConfigRef {
    pub namespace: String,
    pub name: String,
}

impl Default for SloConfigRef {
    fn default() -> Self {
        Self {
            namespace: "koordinator-system".into(),
            name: "slo-controller-config".into(),
        }
    }
}

impl std::str::FromStr for SloConfigRef {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let dns = |p: &str, max: usize| {
            !p.is_empty()
                && p.len() <= max
                && p.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
                && !p.starts_with(['-', '.'])
                && !p.ends_with(['-', '.'])
        };
        match s.split_once('/') {
            Some((ns, name)) if dns(ns, 63) && !ns.contains('.') && dns(name, 253) => Ok(Self {
                namespace: ns.into(),
                name: name.into(),
            }),
            _ => Err(format!("{s:?} is not namespace/name")),
        }
    }
}

impl<'de> serde::Deserialize<'de> for SloConfigRef {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// The colocation-config as the follower has it.
#[derive(Debug, Clone, Default, PartialEq)]
pub enum SloConfig {
    /// Not listed yet, or only bad values so far.
    #[default]
    Unknown,
    /// The API server refuses to show it (RBAC: no Role in its namespace).
    Unreadable(String),
    /// Read (Koordinator's defaults when the ConfigMap or its key is missing).
    Read(Arc<ColocationConfig>),
}

/// The colocation-config in a ConfigMap's data, as koord-manager reads it:
/// `Ok` to use (the defaults when the key is absent or empty), `Err` to
/// keep the last good one.
pub fn colocation_of(cm: Option<&ConfigMap>) -> Result<ColocationConfig, String> {
    let value = cm
        .and_then(|c| c.data.as_ref())
        .and_then(|d| d.get(COLOCATION_KEY))
        .map(String::as_str)
        .unwrap_or("");
    ColocationConfig::parse(value).map_err(|e| e.to_string())
}

/// Follows the ConfigMap into `out` (its colocation-config) and `hub` (its
/// policy keys, resolved with the labels of `node_view`'s Node) until
/// `shutdown`.
pub async fn follow(
    client: kube::Client,
    node: String,
    at: SloConfigRef,
    out: watch::Sender<SloConfig>,
    hub: Arc<PolicyHub>,
    mut node_view: watch::Receiver<Option<Arc<crate::view::NodeView>>>,
    mut shutdown: watch::Receiver<bool>,
) {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &at.namespace);
    let fields = format!("metadata.name={}", at.name);
    let stream =
        watcher::watcher(api, watcher::Config::default().fields(&fields)).default_backoff();
    futures_util::pin_mut!(stream);
    let mut listed = false;
    // the last error sent as an Event
    let mut refused: Option<String> = None;
    let mut failing = false;
    let mut keys = PolicyKeys::default();
    // the ConfigMap's data as last read (`None`: none), and the labels its
    // policy was resolved with
    let mut data: Option<BTreeMap<String, String>> = None;
    let labels_of = |v: &Option<Arc<crate::view::NodeView>>| {
        v.as_ref()
            .and_then(|n| n.metadata.labels.clone())
            .unwrap_or_default()
    };
    // `None` until the Node is first seen: the policy waits for its labels
    // (the cluster strategy would not be this node's when an entry matches it)
    let first = node_view.borrow_and_update().clone();
    let mut labels = first.as_ref().map(|_| labels_of(&first));
    let mut node_gone = false;
    // after a 403: the watch is not polled again until then
    let mut resume: Option<tokio::time::Instant> = None;
    let cm_name = format!("{}/{}", at.namespace, at.name);
    loop {
        let ev = tokio::select! {
            ev = stream.next(), if resume.is_none() => ev,
            _ = tokio::time::sleep_until(resume.unwrap_or_else(tokio::time::Instant::now)), if resume.is_some() => {
                resume = None;
                continue;
            }
            _ = shutdown.changed() => return,
            changed = node_view.changed(), if !node_gone => {
                if changed.is_err() {
                    // no node follower: the labels stay as they are
                    node_gone = true;
                    if labels.is_none() {
                        warn!(configmap = %cm_name, "this node's labels are unknown (no Node followed): the ConfigMap's policy is not used");
                    }
                    continue;
                }
                // a Node gone from the view keeps the labels last seen
                let seen = node_view.borrow_and_update().clone();
                let Some(now) = seen.as_ref().map(|_| labels_of(&seen)) else {
                    continue;
                };
                if labels.as_ref() != Some(&now) {
                    labels = Some(now);
                    if let (Some(d), Some(l)) = (&data, &labels) {
                        let read = keys.read(d, l);
                        place(&hub, &cm_name, read.policy, &read.notes);
                    }
                }
                continue;
            }
        };
        let Some(ev) = ev else { return };
        if ev.is_ok() {
            failing = false;
        }
        let cm = match ev {
            Ok(Event::Init) => {
                listed = false;
                continue;
            }
            Ok(Event::InitApply(c)) | Ok(Event::Apply(c)) => {
                listed = true;
                Some(c)
            }
            Ok(Event::InitDone) if listed => continue,
            Ok(Event::InitDone) | Ok(Event::Delete(_)) => None,
            Err(e) => {
                if !failing {
                    warn!(configmap = %cm_name, error = %e, "slo-controller-config watch failed (retried with backoff); the last good colocation-config and policy stay");
                    failing = true;
                }
                // refused outright (no Role where the ConfigMap is): say so,
                // unless a good value was read before, and ask again later
                if let watcher::Error::InitialListFailed(kube::Error::Api(s)) = &e {
                    if s.code == 403 {
                        if !matches!(*out.borrow(), SloConfig::Read(_)) {
                            out.send_replace(SloConfig::Unreadable(
                                s.message.chars().take(256).collect(),
                            ));
                        }
                        match &data {
                            None => hub.withdraw(Source::ConfigMap),
                            Some(d) if slo::has_policy_keys(d) => hub.stale(
                                Source::ConfigMap,
                                "the API server refuses to show the ConfigMap (403)",
                            ),
                            Some(_) => {}
                        }
                        resume = Some(tokio::time::Instant::now() + FORBIDDEN_RETRY);
                        continue;
                    }
                }
                if data.as_ref().is_some_and(slo::has_policy_keys) {
                    hub.stale(Source::ConfigMap, &format!("the API server: {e}"));
                }
                continue;
            }
        };
        // the policy keys
        let now: BTreeMap<String, String> = cm
            .as_ref()
            .and_then(|c| c.data.clone())
            .map(|d| d.into_iter().collect())
            .unwrap_or_default();
        let read = keys.read(&now, labels.as_ref().unwrap_or(&BTreeMap::new()));
        for (key, e) in &read.refused {
            warn!(configmap = %cm_name, key, error = %e, "slo-controller-config key refused; its last good value stays");
            if let Some(cm) = &cm {
                event(
                    &client,
                    &node,
                    &at,
                    cm,
                    key,
                    "SLOCfgUnmarshalFailed",
                    &format!("qoslet on {node} keeps its last good {key}: {e}"),
                );
            }
        }
        if read.policy.is_none() && data.as_ref().is_none_or(slo::has_policy_keys) {
            info!(configmap = %cm_name, present = cm.is_some(), "slo-controller-config has no policy key: not a policy source");
        }
        if labels.is_some() || read.policy.is_none() {
            place(&hub, &cm_name, read.policy, &read.notes);
        } else {
            info!(configmap = %cm_name, "slo-controller-config read; its policy waits for this node's labels (the Node)");
        }
        data = Some(now);
        // the colocation-config
        match colocation_of(cm.as_ref()) {
            Ok(c) => {
                refused = None;
                if !matches!(&*out.borrow(), SloConfig::Read(o) if **o == c) {
                    info!(configmap = %cm_name, present = cm.is_some(), enable = ?c.cluster.enable, node_configs = c.nodes.len(), "colocation-config");
                    for w in &c.warnings {
                        warn!("colocation-config: {w}");
                    }
                    out.send_replace(SloConfig::Read(Arc::new(c)));
                }
            }
            Err(e) => {
                if refused.as_ref() != Some(&e) {
                    warn!(error = %e, "colocation-config refused; the last good one stays");
                    if let Some(cm) = &cm {
                        event(
                            &client,
                            &node,
                            &at,
                            cm,
                            COLOCATION_KEY,
                            "ColocationCfgUnmarshalFailed",
                            &format!("qoslet on {node} keeps its last good {COLOCATION_KEY}: {e}"),
                        );
                    }
                    refused = Some(e);
                }
            }
        }
    }
}

/// Tells the hub what the ConfigMap's policy is now (`None`: no policy
/// key, the source is withdrawn).
fn place(hub: &PolicyHub, cm: &str, p: Option<Result<PolicyConfig, String>>, notes: &[String]) {
    match p {
        None => hub.withdraw(Source::ConfigMap),
        Some(p) => {
            match &p {
                Ok(_) => {
                    info!(configmap = %cm, notes = ?notes, "slo-controller-config policy read")
                }
                Err(e) => {
                    warn!(configmap = %cm, error = %e, "slo-controller-config policy refused; the last good one stays")
                }
            }
            hub.offer(Source::ConfigMap, p);
        }
    }
}

/// A Warning Event on the ConfigMap about `key`, one for the whole cluster:
/// its name is the ConfigMap's resourceVersion and the key (the first node
/// records it, the others' are refused with 409), not 5,000 Events for one
/// bad edit.
fn event(
    client: &kube::Client,
    node: &str,
    at: &SloConfigRef,
    cm: &ConfigMap,
    key: &str,
    reason: &'static str,
    message: &str,
) {
    let involved = ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("ConfigMap".into()),
        namespace: cm.metadata.namespace.clone(),
        name: cm.metadata.name.clone(),
        uid: cm.metadata.uid.clone(),
        ..Default::default()
    };
    let name = format!(
        "{}.{}.{key}",
        at.name,
        cm.metadata.resource_version.as_deref().unwrap_or("0")
    );
    crate::nodeslo::warning_event(
        client,
        node,
        &at.namespace,
        involved,
        Some(name.chars().take(253).collect()),
        reason,
        message,
    );
}
