//! The Kubernetes Eviction API as the eviction room's [`Evictor`]: a
//! policy/v1 `Eviction` with the pod's UID as a precondition and its grace
//! period; the API server deletes the pod gracefully and kubelet stops it,
//! so the pod is gone for good (a CRI stop only kills a sandbox kubelet
//! recreates) and PodDisruptionBudgets are honoured: a refusal (429) is
//! answered `Refused`, counted and recorded, and the loop tries the next
//! candidate. A pod a PDB protects is never killed through CRI. Each
//! eviction and refusal is a Kubernetes Event on the pod.
//!
//! The request is built here, not with `kube::Api::evict`: kube 5 sends the
//! delete options under `delete_options`, a key the API server ignores, so
//! neither the UID precondition nor the grace period would reach it.
//!
//! A pod the cluster view does not hold (a static pod's sandbox, an orphan,
//! a name that is no Kubernetes name) cannot be protected by a budget and is
//! stopped through the runtime. A pod the API server cannot decide on (no
//! answer within [`API_TIMEOUT`], 5xx, 403, a 429 that is its own
//! throttling) is never stopped through CRI (a budget may protect it): the
//! eviction fails, the loop passes the pod over for a while and takes the
//! next candidate, and asks again later. Events are sent off the loop, at
//! most one per pod and reason every [`EVENT_EVERY`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use kube::api::{Api, PostParams};
use qoslet_eviction::evictor::{BoxFuture, EvictError, EvictRequest, Evicted, Evictor, Reclaimed};
use serde_json::json;
use tracing::{info, warn};

use crate::status::{ClusterStatus, EvictOutcome};

/// Who the Events say recorded them.
pub const COMPONENT: &str = "qoslet";
/// An Eviction API call (or an Event) not answered by then is given up.
pub const API_TIMEOUT: Duration = Duration::from_secs(10);
/// At most one Event per pod and reason this often.
pub const EVENT_EVERY: Duration = Duration::from_secs(600);

/// Evicts through the API server; disk reclaim, and pods the API server
/// cannot decide on, stay the runtime's (CRI).
pub struct ApiEvictor {
    client: kube::Client,
    node: String,
    runtime: Arc<dyn Evictor>,
    status: Arc<ClusterStatus>,
    store: qoslet_state::Store,
    /// (pod UID, reason) -> when its last Event was sent.
    events: Arc<Mutex<HashMap<(String, &'static str), Instant>>>,
}

/// A Kubernetes namespace (a DNS label) and pod name (a DNS subdomain):
/// what may go into the URL.
fn is_kube_name(namespace: &str, name: &str) -> bool {
    let label = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && l.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    label(namespace) && !name.is_empty() && name.len() <= 253 && name.split('.').all(label)
}

/// Whether a 429 is a PodDisruptionBudget's (the API server's own
/// throttling answers 429 too).
fn is_budget(s: &kube::core::Status) -> bool {
    s.details
        .as_ref()
        .is_some_and(|d| d.causes.iter().any(|c| c.reason == "DisruptionBudget"))
        || s.message.contains("disruption budget")
}

/// `s` cut to at most `max` bytes, on a character boundary.
fn cut(s: &str, max: usize) -> String {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_string()
}

impl ApiEvictor {
    /// `runtime`: the CRI evictor (disk reclaim, and the fallback);
    /// `store`: the cluster view (which pods the API server has).
    pub fn new(
        client: kube::Client,
        node: String,
        runtime: Arc<dyn Evictor>,
        status: Arc<ClusterStatus>,
        store: qoslet_state::Store,
    ) -> Self {
        Self {
            client,
            node,
            runtime,
            status,
            store,
            events: Arc::default(),
        }
    }

    /// The eviction's body, as kubectl drain sends it. The grace period is at
    /// least 1 s: 0 through the API is a force deletion (the object goes
    /// before kubelet has stopped anything), not kubelet's immediate kill.
    pub fn body(req: &EvictRequest) -> serde_json::Value {
        json!({
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": req.name, "namespace": req.namespace},
            "deleteOptions": {
                "gracePeriodSeconds": req.grace_seconds.max(1),
                "preconditions": {"uid": req.uid},
            },
        })
    }

    async fn post(&self, req: &EvictRequest) -> Result<(), kube::Error> {
        crate::limited().await;
        let path = format!(
            "/api/v1/namespaces/{}/pods/{}/eviction",
            req.namespace, req.name
        );
        let body = serde_json::to_vec(&Self::body(req)).map_err(kube::Error::SerdeError)?;
        let http = http::Request::post(path)
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(body)
            .map_err(kube::Error::HttpError)?;
        let _: serde_json::Value = self.client.request(http).await?;
        Ok(())
    }

    /// Records an Event on the pod off the loop (at most one per pod and
    /// reason every [`EVENT_EVERY`]; failures are logged and counted).
    fn record(&self, req: &EvictRequest, reason: &'static str, message: &str) {
        {
            let mut sent = self.events.lock().unwrap_or_else(|e| e.into_inner());
            sent.retain(|_, at| at.elapsed() < EVENT_EVERY);
            if sent.contains_key(&(req.uid.clone(), reason)) {
                return;
            }
            sent.insert((req.uid.clone(), reason), Instant::now());
        }
        let ev = self.event(req, reason, message);
        let (client, status, namespace) = (
            self.client.clone(),
            self.status.clone(),
            req.namespace.clone(),
        );
        let pod = format!("{}/{}", req.namespace, req.name);
        tokio::spawn(async move {
            let api: Api<Event> = Api::namespaced(client, &namespace);
            crate::limited().await;
            match tokio::time::timeout(API_TIMEOUT, api.create(&PostParams::default(), &ev)).await {
                Ok(Ok(_)) => status.count_event(true),
                Ok(Err(e)) => {
                    status.count_event(false);
                    warn!(pod = %pod, reason, error = %e, "event not recorded");
                }
                Err(_) => {
                    status.count_event(false);
                    warn!(pod = %pod, reason, "event not recorded: no answer in 10 s");
                }
            }
        });
    }

    /// The Event (core/v1, as kubelet records its evictions), within the
    /// API server's limits.
    pub fn event(&self, req: &EvictRequest, reason: &str, message: &str) -> Event {
        let now = jiff_now();
        let name = format!(
            "{}.{:x}",
            cut(&req.name, 200),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0)
        );
        Event {
            metadata: ObjectMeta {
                name: Some(name),
                namespace: Some(req.namespace.clone()),
                ..Default::default()
            },
            involved_object: ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                namespace: Some(req.namespace.clone()),
                name: Some(req.name.clone()),
                uid: Some(req.uid.clone()),
                ..Default::default()
            },
            reason: Some(reason.into()),
            // the API server caps an Event's message at 1 KiB
            message: Some(cut(message, 1024)),
            type_: Some("Warning".into()),
            source: Some(EventSource {
                component: Some(COMPONENT.into()),
                host: Some(self.node.clone()),
            }),
            first_timestamp: Some(Time(now)),
            last_timestamp: Some(Time(now)),
            event_time: Some(MicroTime(now)),
            count: Some(1),
            action: Some("Evict".into()),
            reporting_component: Some(COMPONENT.into()),
            // at most 128 characters
            reporting_instance: Some(cut(&self.node, 128)),
            ..Default::default()
        }
    }

    /// The runtime stops the pod instead (logged with why).
    async fn through_runtime(&self, req: &EvictRequest, why: &str) -> Result<Evicted, EvictError> {
        warn!(pod = %format!("{}/{}", req.namespace, req.name), why, "evicted through the runtime (CRI), not the Eviction API");
        self.runtime.evict(req).await
    }
}

fn jiff_now() -> k8s_openapi::jiff::Timestamp {
    k8s_openapi::jiff::Timestamp::now()
}

impl Evictor for ApiEvictor {
    fn name(&self) -> &'static str {
        "kubernetes"
    }

    fn evict<'a>(&'a self, req: &'a EvictRequest) -> BoxFuture<'a, Result<Evicted, EvictError>> {
        Box::pin(async move {
            let pod = format!("{}/{}", req.namespace, req.name);
            let known = self
                .store
                .cluster_pod(&req.uid)
                .is_some_and(|c| c.namespace == req.namespace && c.name == req.name);
            if !known || !is_kube_name(&req.namespace, &req.name) {
                return self
                    .through_runtime(req, "the API server's view of this node has no such pod (no budget can protect it)")
                    .await;
            }
            let answer = match tokio::time::timeout(API_TIMEOUT, self.post(req)).await {
                Ok(a) => a,
                Err(_) => {
                    self.status.count_eviction(EvictOutcome::Failed);
                    return Err(EvictError {
                        pod,
                        reason: "the Eviction API did not answer in 10 s".into(),
                    });
                }
            };
            match answer {
                Ok(()) => {
                    self.status.count_eviction(EvictOutcome::Evicted);
                    info!(pod = %pod, reason = req.model.as_str(), "evicted through the Eviction API");
                    self.record(req, "Evicted", &req.message);
                    // the API server deletes it; kubelet stops it
                    Ok(Evicted::Stopping)
                }
                Err(kube::Error::Api(s)) if s.code == 429 && is_budget(&s) => {
                    self.status.count_eviction(EvictOutcome::Refused);
                    let why = format!("the Eviction API refused: {}", s.message);
                    warn!(pod = %pod, message = %s.message, "eviction refused (a PodDisruptionBudget); the next candidate is tried");
                    self.record(
                        req,
                        "EvictionRefused",
                        &format!("{why} (qoslet wanted to evict it: {})", req.message),
                    );
                    Ok(Evicted::Refused(why))
                }
                // no such pod, or a pod of that name with another UID: the
                // one chosen is gone
                Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {
                    self.status.count_eviction(EvictOutcome::Gone);
                    info!(pod = %pod, code = s.code, message = %s.message, "pod gone before its eviction");
                    Ok(Evicted::Gone)
                }
                // the API server cannot decide (throttled, failing, no
                // permission, unreachable): a budget may protect the pod, so
                // no CRI stop; tried again after the loop's backoff
                Err(e) => {
                    self.status.count_eviction(EvictOutcome::Failed);
                    Err(EvictError {
                        pod,
                        reason: format!("the Eviction API: {e}"),
                    })
                }
            }
        })
    }

    fn reclaim_disk(&self) -> Option<BoxFuture<'_, Reclaimed>> {
        self.runtime.reclaim_disk()
    }

    fn writable_layers(
        &self,
    ) -> Option<BoxFuture<'_, std::collections::HashMap<String, qoslet_eviction::FsUse>>> {
        self.runtime.writable_layers()
    }
}
