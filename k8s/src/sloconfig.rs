//! Koordinator's `slo-controller-config` ConfigMap
//! (`kubernetes.sloConfig`, default `koordinator-system/slo-controller-config`),
//! read as koord-manager reads it: its `colocation-config` key merged over
//! the defaults and resolved for this node by the advertiser. Followed with
//! kube's watcher on that one object (a namespaced Role to read it).
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

use std::sync::Arc;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, ObjectReference};
use kube::api::Api;
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use qoslet_colocation::strategy::ColocationConfig;
use tokio::sync::watch;
use tracing::{info, warn};

/// The key koord-manager reads the colocation strategy from.
pub const COLOCATION_KEY: &str = "colocation-config";

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

/// Follows the ConfigMap into `out` until `shutdown`.
pub async fn follow(
    client: kube::Client,
    node: String,
    at: SloConfigRef,
    out: watch::Sender<SloConfig>,
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
    loop {
        let ev = tokio::select! {
            ev = stream.next() => ev,
            _ = shutdown.changed() => return,
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
                    warn!(configmap = %format!("{}/{}", at.namespace, at.name), error = %e, "slo-controller-config watch failed (retried with backoff); the last good colocation-config stays");
                    failing = true;
                }
                // refused outright (no Role where the ConfigMap is): say so,
                // unless a good value was read before
                if let watcher::Error::InitialListFailed(kube::Error::Api(s)) = &e {
                    if s.code == 403 && !matches!(*out.borrow(), SloConfig::Read(_)) {
                        out.send_replace(SloConfig::Unreadable(
                            s.message.chars().take(256).collect(),
                        ));
                    }
                }
                continue;
            }
        };
        match colocation_of(cm.as_ref()) {
            Ok(c) => {
                refused = None;
                if !matches!(&*out.borrow(), SloConfig::Read(o) if **o == c) {
                    info!(configmap = %format!("{}/{}", at.namespace, at.name), present = cm.is_some(), enable = ?c.cluster.enable, node_configs = c.nodes.len(), "colocation-config");
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
                        let involved = ObjectReference {
                            api_version: Some("v1".into()),
                            kind: Some("ConfigMap".into()),
                            namespace: cm.metadata.namespace.clone(),
                            name: cm.metadata.name.clone(),
                            uid: cm.metadata.uid.clone(),
                            ..Default::default()
                        };
                        // one Event for the cluster, whichever node records it first
                        let name = format!(
                            "{}.{}.colocation-config",
                            at.name,
                            cm.metadata.resource_version.as_deref().unwrap_or("0")
                        );
                        crate::nodeslo::warning_event(
                            &client,
                            &node,
                            &at.namespace,
                            involved,
                            Some(name.chars().take(253).collect()),
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
