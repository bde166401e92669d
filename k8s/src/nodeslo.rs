//! This node's NodeSLO (`slo.koordinator.sh/v1alpha1`, cluster-scoped, named
//! after the node) as the policy hub's cluster source: watched with kube's
//! watcher (list, then watch from its resourceVersion; bookmarks; a watch
//! that ends or a 410 relists; errors back off as client-go's), read
//! leniently (real NodeSLOs carry fields qoslet does not use: set aside and
//! listed, never an error), validated inside parsing, and offered whole. A
//! spec that fails validation is refused (the last good one stays, logged,
//! shown by `qoslet plan` and `/metrics`); a deleted NodeSLO withdraws the
//! source (the file's policy, else the defaults, is in force); an API server
//! that cannot be reached makes the source stale (the last good policy
//! stays).

use std::sync::Arc;

use futures_util::StreamExt;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use qoslet_agent::hub::{PolicyHub, Source};
use qoslet_qos_engine::source::PolicyConfig;
use tokio::sync::watch;
use tracing::{info, warn};

/// Koordinator's NodeSLO as an API resource.
pub fn resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("slo.koordinator.sh", "v1alpha1", "NodeSLO"),
        "nodeslos",
    )
}

/// A NodeSLO's spec as qoslet's policy: Koordinator's field names, what
/// qoslet does not implement set aside, every value validated.
pub fn policy_of(o: &DynamicObject) -> Result<PolicyConfig, String> {
    let spec = o
        .data
        .get("spec")
        .cloned()
        .unwrap_or_else(|| serde_json::json!({}));
    PolicyConfig::try_from(spec).map_err(|e| {
        let name = o.metadata.name.as_deref().unwrap_or("?");
        let rv = o.metadata.resource_version.as_deref().unwrap_or("?");
        format!("NodeSLO {name} (resourceVersion {rv}): {e}")
    })
}

/// Follows the NodeSLO named `node` into `hub` until `shutdown`.
pub async fn follow(
    client: kube::Client,
    node: String,
    hub: Arc<PolicyHub>,
    mut shutdown: watch::Receiver<bool>,
) {
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource());
    let fields = format!("metadata.name={node}");
    let cfg = watcher::Config::default().fields(&fields);
    let stream = watcher::watcher(api.clone(), cfg).default_backoff();
    futures_util::pin_mut!(stream);
    // during a (re)list: whether the NodeSLO was among the objects listed
    let mut listed = false;
    // the NodeSLO in force (offered again once a stale API server answers)
    let mut last: Option<DynamicObject> = None;
    let mut stale = false;
    let mut no_crd = false;
    // the last refusal sent as an Event
    let mut refused: Option<String> = None;
    let mut probe = crate::probe_interval();
    loop {
        let ev = tokio::select! {
            ev = stream.next() => ev,
            _ = shutdown.changed() => return,
            _ = probe.tick(), if stale => {
                let lp = kube::api::ListParams::default().fields(&fields).limit(1);
                if crate::answers(api.list_metadata(&lp)).await {
                    info!("the API server answers again: the NodeSLO watch resumes");
                    stale = false;
                    match &last {
                        Some(o) => offer(&hub, o),
                        None => hub.withdraw(Source::Cluster),
                    }
                }
                continue;
            }
        };
        let Some(ev) = ev else { return };
        if ev.is_ok() {
            stale = false;
        }
        match ev {
            Ok(Event::Init) => listed = false,
            Ok(Event::InitApply(o)) | Ok(Event::Apply(o)) => {
                listed = true;
                offer(&hub, &o);
                // a refusal is an Event on the node, once per distinct reason
                match policy_of(&o) {
                    Err(e) if refused.as_ref() != Some(&e) => {
                        node_event(&client, &node, "NodeSLORefused", &format!("qoslet refused this node's NodeSLO; the last good policy stays: {e}"));
                        refused = Some(e);
                    }
                    Err(_) => {}
                    Ok(_) => refused = None,
                }
                last = Some(o);
            }
            Ok(Event::InitDone) => {
                if !listed {
                    info!(node = %node, "no NodeSLO for this node: the file's policy (or the defaults) in force");
                    hub.withdraw(Source::Cluster);
                    last = None;
                }
            }
            Ok(Event::Delete(_)) => {
                info!(node = %node, "NodeSLO deleted: the file's policy (or the defaults) in force");
                hub.withdraw(Source::Cluster);
                last = None;
            }
            // no NodeSLO resource in this cluster (Koordinator's CRDs not
            // installed): no NodeSLO, not an API server gone
            Err(watcher::Error::InitialListFailed(kube::Error::Api(s))) if s.code == 404 => {
                if !no_crd {
                    info!("the API server has no NodeSLO resource (Koordinator's CRDs are not installed): the file's policy (or the defaults) in force");
                    no_crd = true;
                }
                hub.withdraw(Source::Cluster);
                last = None;
            }
            Err(e) => {
                if !stale {
                    probe.reset();
                }
                stale = true;
                warn!(error = %e, "NodeSLO watch failed (retried with backoff); the last good policy stays");
                hub.stale(Source::Cluster, &format!("the API server: {e}"));
            }
        }
    }
}

/// A Warning Event on this node (in `default`, where kubelet records its
/// node's Events), sent off the watch with a timeout.
pub(crate) fn node_event(client: &kube::Client, node: &str, reason: &'static str, message: &str) {
    let involved = k8s_openapi::api::core::v1::ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Node".into()),
        name: Some(node.into()),
        // kubelet's convention for its node's Events (`kubectl describe
        // node` finds them by this uid)
        uid: Some(node.into()),
        ..Default::default()
    };
    warning_event(client, node, "default", involved, None, reason, message);
}

/// A Warning Event on `involved` (recorded in `namespace`) from this node's
/// qoslet, sent off the caller's task with a timeout. `name`: one name for
/// the same Event from every node (the first node's is recorded, the others'
/// answered 409); `None`: this node's own.
pub(crate) fn warning_event(
    client: &kube::Client,
    node: &str,
    namespace: &str,
    involved: k8s_openapi::api::core::v1::ObjectReference,
    name: Option<String>,
    reason: &'static str,
    message: &str,
) {
    use k8s_openapi::api::core::v1::{Event, EventSource};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
    let now = k8s_openapi::jiff::Timestamp::now();
    let mut msg = message.to_string();
    let mut end = msg.len().min(1024);
    while !msg.is_char_boundary(end) {
        end -= 1;
    }
    msg.truncate(end);
    let ev = Event {
        metadata: ObjectMeta {
            name: Some(name.unwrap_or_else(|| {
                format!(
                    "{}.{:x}",
                    node.chars().take(200).collect::<String>(),
                    now.as_nanosecond()
                )
            })),
            namespace: Some(namespace.into()),
            ..Default::default()
        },
        involved_object: involved,
        reason: Some(reason.into()),
        message: Some(msg),
        type_: Some("Warning".into()),
        source: Some(EventSource {
            component: Some(crate::evict::COMPONENT.into()),
            host: Some(node.into()),
        }),
        first_timestamp: Some(Time(now)),
        last_timestamp: Some(Time(now)),
        event_time: Some(MicroTime(now)),
        count: Some(1),
        action: Some("ApplyPolicy".into()),
        reporting_component: Some(crate::evict::COMPONENT.into()),
        reporting_instance: Some(node.chars().take(128).collect()),
        ..Default::default()
    };
    let api: Api<Event> = Api::namespaced(client.clone(), namespace);
    tokio::spawn(async move {
        let pp = kube::api::PostParams::default();
        crate::limited().await;
        match tokio::time::timeout(crate::evict::API_TIMEOUT, api.create(&pp, &ev)).await {
            Ok(Ok(_)) => {}
            // another node recorded this same Event
            Ok(Err(kube::Error::Api(s))) if s.code == 409 => {}
            Ok(Err(e)) => warn!(reason, error = %e, "event not recorded"),
            Err(_) => warn!(reason, "event not recorded: no answer in 10 s"),
        }
    });
}

fn offer(hub: &PolicyHub, o: &DynamicObject) {
    let p = policy_of(o);
    match &p {
        Ok(_) => info!(
            name = o.metadata.name.as_deref().unwrap_or(""),
            resource_version = o.metadata.resource_version.as_deref().unwrap_or(""),
            "NodeSLO received"
        ),
        Err(e) => warn!(error = %e, "NodeSLO refused; the last good policy stays"),
    }
    hub.offer(Source::Cluster, p);
}
