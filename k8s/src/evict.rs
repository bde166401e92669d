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

use std::sync::Arc;

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use kube::api::{Api, PostParams};
use qoslet_eviction::evictor::{BoxFuture, EvictError, EvictRequest, Evicted, Evictor, Reclaimed};
use serde_json::json;
use tracing::{info, warn};

use crate::status::{ClusterStatus, EvictOutcome};

/// Who the Events say recorded them.
pub const COMPONENT: &str = "qoslet";

/// Evicts through the API server; disk reclaim stays the runtime's (CRI).
pub struct ApiEvictor {
    client: kube::Client,
    node: String,
    runtime: Arc<dyn Evictor>,
    status: Arc<ClusterStatus>,
}

impl ApiEvictor {
    /// `runtime`: the CRI evictor, kept for node-level disk reclaim.
    pub fn new(
        client: kube::Client,
        node: String,
        runtime: Arc<dyn Evictor>,
        status: Arc<ClusterStatus>,
    ) -> Self {
        Self {
            client,
            node,
            runtime,
            status,
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

    /// Records an Event on the pod (failures are logged and counted, never
    /// in the way of the eviction).
    pub async fn record(&self, req: &EvictRequest, reason: &str, message: &str) {
        let now = jiff_now();
        let name = format!(
            "{}.{:x}",
            req.name,
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0)
        );
        let ev = Event {
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
            message: Some(message.chars().take(1024).collect()),
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
            reporting_instance: Some(self.node.clone()),
            ..Default::default()
        };
        let api: Api<Event> = Api::namespaced(self.client.clone(), &req.namespace);
        match api.create(&PostParams::default(), &ev).await {
            Ok(_) => self.status.count_event(true),
            Err(e) => {
                self.status.count_event(false);
                warn!(pod = %format!("{}/{}", req.namespace, req.name), reason, error = %e, "event not recorded");
            }
        }
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
            match self.post(req).await {
                Ok(()) => {
                    self.status.count_eviction(EvictOutcome::Evicted);
                    info!(pod = %pod, reason = req.model.as_str(), "evicted through the Eviction API");
                    self.record(req, "Evicted", &req.message).await;
                    // the API server deletes it; kubelet stops it
                    Ok(Evicted::Stopping)
                }
                Err(kube::Error::Api(s)) if s.code == 429 => {
                    self.status.count_eviction(EvictOutcome::Refused);
                    let why = format!("the Eviction API refused: {}", s.message);
                    warn!(pod = %pod, message = %s.message, "eviction refused (a PodDisruptionBudget); the next candidate is tried");
                    self.record(
                        req,
                        "EvictionRefused",
                        &format!("{why} (qoslet wanted to evict it: {})", req.message),
                    )
                    .await;
                    Ok(Evicted::Refused(why))
                }
                // no such pod, or a pod of that name with another UID: the
                // one chosen is gone
                Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {
                    self.status.count_eviction(EvictOutcome::Gone);
                    info!(pod = %pod, code = s.code, message = %s.message, "pod gone before its eviction");
                    Ok(Evicted::Gone)
                }
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
}
