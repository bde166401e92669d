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
use qoslet_hooks::quantity::Quantity;
use qoslet_state::{ClusterPod, PodAmounts, Store};
use tokio::sync::watch;
use tracing::{debug, info, warn};

use crate::status::{ClusterStatus, WatchName};
use crate::view::{ContainerView, PodView, ResourceList, ResourcesView, TolerationView};

/// The taint kubelet sets under memory pressure: a BestEffort pod that
/// tolerates it is admitted anyway.
pub const MEMORY_PRESSURE_TAINT: &str = "node.kubernetes.io/memory-pressure";

/// What qoslet keeps of a pod (`None`: no UID, not a pod qoslet can join).
pub fn cluster_pod(p: &PodView) -> Option<ClusterPod> {
    let uid = p.metadata.uid.clone().filter(|u| !u.is_empty())?;
    let spec = p.spec.as_ref();
    let parts = Parts::of(p);
    let containers = parts.containers;
    let amounts = |which: Which| PodAmounts {
        cpu_milli: parts.amount(which, "cpu"),
        memory: parts.amount(which, "memory"),
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
        limits: amounts(Which::Limits),
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
    let parts = Parts::of(p);
    (
        parts.amount(Which::Requests, "cpu"),
        parts.amount(Which::Requests, "memory"),
    )
}

/// The parts of a pod's spec its amounts are summed from.
struct Parts<'a> {
    containers: &'a [ContainerView],
    init: &'a [ContainerView],
    overhead: Option<&'a ResourceList>,
    level: Option<&'a ResourcesView>,
}

impl<'a> Parts<'a> {
    fn of(p: &'a PodView) -> Self {
        let spec = p.spec.as_ref();
        Parts {
            containers: spec
                .and_then(|s| s.containers.as_deref())
                .unwrap_or_default(),
            init: spec
                .and_then(|s| s.init_containers.as_deref())
                .unwrap_or_default(),
            overhead: spec.and_then(|s| s.overhead.as_ref()),
            level: spec.and_then(|s| s.resources.as_ref()),
        }
    }

    fn amount(&self, which: Which, name: &str) -> i64 {
        pod_amount(
            self.containers,
            self.init,
            self.overhead,
            self.level,
            which,
            name,
        )
    }
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

#[derive(Clone, Copy, PartialEq, Eq)]
enum Which {
    Requests,
    Limits,
}

/// A quantity of `name`: CPU in millicores, others in whole units.
fn amount(list: Option<&ResourceList>, name: &str) -> Option<i64> {
    let q = Quantity::parse(list?.get(name)?.trim()).ok()?;
    if name == "cpu" {
        q.milli_value()
    } else {
        q.value()
    }
}

/// A container's amount; a request missing where a limit is set is the
/// limit (the API server's defaulting: a pod read from a file may lack it).
fn container_amount(c: &ContainerView, which: Which, name: &str) -> Option<i64> {
    let r: Option<&ResourcesView> = c.resources.as_ref();
    let limit = || amount(r.and_then(|r| r.limits.as_ref()), name);
    match which {
        Which::Requests => amount(r.and_then(|r| r.requests.as_ref()), name).or_else(limit),
        Which::Limits => limit(),
    }
}

/// A pod's amount of `name` as kubelet counts it (`PodRequests` /
/// `PodLimits`): the regular containers summed with the sidecars (init
/// containers that keep running); each other init container runs alone with
/// the sidecars started before it, and the pod needs at least the most of
/// those; the overhead is added to a total that is not zero. A limit missing
/// on a regular container is none for the pod (0). Pod-level resources, when
/// set for the resource, are the pod's amount instead (plus the overhead).
fn pod_amount(
    containers: &[ContainerView],
    init: &[ContainerView],
    overhead: Option<&ResourceList>,
    level: Option<&ResourcesView>,
    which: Which,
    name: &str,
) -> i64 {
    // pod-level resources, when set for this resource, are the pod's (a
    // pod-level request missing where its limit is set is the limit)
    let pod_level = level.and_then(|r| {
        let limit = amount(r.limits.as_ref(), name);
        match which {
            Which::Requests => amount(r.requests.as_ref(), name).or(limit),
            Which::Limits => limit,
        }
    });
    if let Some(v) = pod_level.filter(|v| *v > 0) {
        return v.saturating_add(amount(overhead, name).unwrap_or(0));
    }
    if which == Which::Limits
        && containers
            .iter()
            .any(|c| container_amount(c, which, name).is_none())
    {
        return 0;
    }
    let of = |c: &ContainerView| container_amount(c, which, name).unwrap_or(0);
    let mut sidecars = 0i64;
    let mut init_max = 0i64;
    for c in init {
        if c.restart_policy.as_deref() == Some("Always") {
            sidecars = sidecars.saturating_add(of(c));
            init_max = init_max.max(sidecars);
        } else {
            init_max = init_max.max(sidecars.saturating_add(of(c)));
        }
    }
    let regular = containers
        .iter()
        .map(of)
        .fold(0i64, i64::saturating_add)
        .saturating_add(sidecars);
    let total = regular.max(init_max).max(0);
    if total == 0 {
        return 0;
    }
    total.saturating_add(amount(overhead, name).unwrap_or(0))
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
