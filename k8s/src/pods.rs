//! This node's Pods from the API server (`fieldSelector=spec.nodeName=<node>`,
//! as kubelet watches them), joined to the store by pod UID: what CRI cannot
//! tell (priority, priority class, Kubernetes QoS, requests and limits,
//! tolerations, grace period) reaches isolation, the engine and eviction
//! through the inventory. Only that extract is kept, never the object (a
//! pod's spec carries its author's env values, secrets' names, images).

use std::sync::Arc;

use futures_util::StreamExt;
use kube::api::Api;
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use qoslet_state::{ClusterPod, PodAmounts, Store};
use tokio::sync::watch;
use tracing::{debug, info, warn};

use crate::status::{ClusterStatus, WatchName};
use crate::view::{PodView, TolerationView};
use qoslet_kube_api::amount::{container_amount, containers, pod_amount, Which};

/// The taint kubelet sets under memory pressure: a BestEffort pod that
/// tolerates it is admitted anyway.
pub const MEMORY_PRESSURE_TAINT: &str = "node.kubernetes.io/memory-pressure";

/// What qoslet keeps of a pod (`None`: no UID, not a pod qoslet can join).
pub fn cluster_pod(p: &PodView) -> Option<ClusterPod> {
    let uid = p.metadata.uid.clone().filter(|u| !u.is_empty())?;
    let spec = p.spec.as_ref();
    let containers = containers(p);
    let amounts = |which: Which| PodAmounts {
        cpu_milli: pod_amount(p, which, "cpu"),
        memory: pod_amount(p, which, "memory"),
    };
    let tolerations = spec
        .and_then(|s| s.tolerations.as_deref())
        .unwrap_or_default();
    Some(ClusterPod {
        uid,
        namespace: p.metadata.namespace.clone().unwrap_or_default(),
        name: p.metadata.name.clone().unwrap_or_default(),
        priority: spec.and_then(|s| s.priority),
        priority_class: spec.and_then(|s| s.priority_class_name.clone()),
        qos_class: p.status.as_ref().and_then(|s| s.qos_class.clone()),
        requests: amounts(Which::Requests),
        limits: amounts(Which::Bound),
        grace_seconds: spec.and_then(|s| s.termination_grace_period_seconds),
        tolerates_memory_pressure: tolerations.iter().any(tolerates_memory_pressure),
        deleting: p.metadata.deletion_timestamp.is_some(),
        phase: p.status.as_ref().and_then(|s| s.phase.clone()),
        priority_label: bounded_label(p, qoslet_colocation::priority::PRIORITY_LABEL),
        qos_label: bounded_label(p, qoslet_colocation::priority::QOS_LABEL),
        batch: qoslet_hooks::batch::spec_json(containers.iter().map(|c| {
            let r = c.resources.as_ref();
            (
                c.name.as_deref().unwrap_or_default(),
                r.and_then(|r| r.requests.as_ref()),
                r.and_then(|r| r.limits.as_ref()),
            )
        })),
    })
}

/// A label's value, kept to 64 characters (a pod author's input: a longer
/// one names no class).
fn bounded_label(p: &PodView, key: &str) -> Option<String> {
    let v = p.metadata.labels.as_ref()?.get(key)?;
    (v.len() <= 64).then(|| v.clone())
}

/// A pod's CPU (millicores) and memory (bytes) requests as kubelet sums
/// them (`PodRequests`).
pub fn pod_requests(p: &PodView) -> (i64, i64) {
    (
        pod_amount(p, Which::Requests, "cpu"),
        pod_amount(p, Which::Requests, "memory"),
    )
}

/// The Kubernetes QoS class the API server gives a pod (`GetPodQOS`), for a
/// pod read from a file without `status.qosClass`.
pub fn kube_qos(p: &PodView) -> &'static str {
    let spec = p.spec.as_ref();
    let all = spec
        .and_then(|s| s.containers.as_deref())
        .unwrap_or_default()
        .iter()
        .chain(
            spec.and_then(|s| s.init_containers.as_deref())
                .unwrap_or_default(),
        );
    let (mut any, mut guaranteed) = (false, true);
    for c in all {
        for r in ["cpu", "memory"] {
            let lim = container_amount(c, Which::Limits, r).filter(|v| *v != 0);
            let req = container_amount(c, Which::Requests, r).filter(|v| *v != 0);
            any |= req.is_some() || lim.is_some();
            guaranteed &= lim.is_some() && req == lim;
        }
    }
    match (any, guaranteed) {
        (false, _) => "BestEffort",
        (true, true) => "Guaranteed",
        (true, false) => "Burstable",
    }
}

/// Whether a toleration tolerates kubelet's memory-pressure NoSchedule taint
/// (the taint has no value: `Equal` matches only an empty one).
fn tolerates_memory_pressure(t: &TolerationView) -> bool {
    let effect_ok = t
        .effect
        .as_deref()
        .is_none_or(|e| e.is_empty() || e == "NoSchedule");
    let key = t.key.as_deref().unwrap_or("");
    let op = t.operator.as_deref().unwrap_or("Equal");
    effect_ok
        && match op {
            "Exists" => key.is_empty() || key == MEMORY_PRESSURE_TAINT,
            "Equal" => key == MEMORY_PRESSURE_TAINT && t.value.as_deref().unwrap_or("").is_empty(),
            _ => false,
        }
}

/// Follows this node's pods into `store` until `shutdown`.
pub async fn follow(
    client: kube::Client,
    node: String,
    store: Store,
    status: Arc<ClusterStatus>,
    mut shutdown: watch::Receiver<bool>,
) {
    let api: Api<PodView> = Api::all(client);
    let fields = format!("spec.nodeName={node}");
    let cfg = watcher::Config::default().fields(&fields);
    let stream = watcher::watcher(api.clone(), cfg).default_backoff();
    futures_util::pin_mut!(stream);
    // the pods of a (re)list, put in place when it is done
    let mut listing: Vec<ClusterPod> = Vec::new();
    let mut probe = crate::probe_interval();
    loop {
        let ev = tokio::select! {
            ev = stream.next() => ev,
            _ = shutdown.changed() => return,
            _ = probe.tick(), if status.state(WatchName::Pods) == "stale" => {
                let lp = kube::api::ListParams::default().fields(&fields).limit(1);
                if crate::answers(api.list_metadata(&lp)).await {
                    info!("the API server answers again: the pods watch resumes");
                    status.ok(WatchName::Pods, store.cluster_pods() as u64);
                }
                continue;
            }
        };
        let Some(ev) = ev else { return };
        match ev {
            Ok(Event::Init) => listing.clear(),
            Ok(Event::InitApply(p)) => listing.extend(cluster_pod(&p)),
            Ok(Event::InitDone) => {
                let n = listing.len();
                store.replace_cluster_pods(std::mem::take(&mut listing));
                status.ok(WatchName::Pods, n as u64);
                info!(node = %node, pods = n, "this node's pods listed from the API server");
            }
            Ok(Event::Apply(p)) => {
                if let Some(c) = cluster_pod(&p) {
                    debug!(pod = %format!("{}/{}", c.namespace, c.name), "pod from the API server");
                    store.upsert_cluster_pod(c);
                }
                status.ok(WatchName::Pods, store.cluster_pods() as u64);
            }
            Ok(Event::Delete(p)) => {
                if let Some(uid) = p.metadata.uid.as_deref() {
                    store.remove_cluster_pod(uid);
                }
                status.ok(WatchName::Pods, store.cluster_pods() as u64);
            }
            Err(e) => {
                warn!(error = %e, "pods watch failed (retried with backoff); the last pods listed stay");
                if status.state(WatchName::Pods) != "stale" {
                    probe.reset();
                }
                status.stale(WatchName::Pods);
            }
        }
    }
}
