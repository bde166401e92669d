//! Rebuilding the store at start: the checkpoint (what qoslet knew and applied)
//! reconciled with what the runtime really has (ListPodSandbox/ListContainers,
//! then verbose status for entries the checkpoint does not know).
//!
//! Entries the runtime no longer has are dropped; entries the checkpoint lacks
//! are reconstructed from containerd's verbose status (`info.config`, the
//! original CRI config as JSON), marked [`Source::Runtime`].

use std::collections::{BTreeMap, HashMap};

use qoslet_proto::cri;
use serde_json::Value;
use tonic::transport::Channel;

use qoslet_state::store::{
    ContainerRecord, PodRecord, Resources, Snapshot, Source, ANNOTATION_APPLIED, ANNOTATION_CLASS,
    ANNOTATION_REQUESTED,
};

type Client = cri::runtime_service_client::RuntimeServiceClient<Channel>;

/// How long one verbose-status call may take before that entry is left for the next pass.
pub const STATUS_DEADLINE: std::time::Duration = std::time::Duration::from_secs(2);
/// Verbose-status calls in flight at once (a cold start without a checkpoint
/// makes one per pod and container: 2,000 at 500 pods / 1,500 containers,
/// about 0.3 s at 1 ms each, `restart_bench`; 8 at a time took 1 s).
pub const STATUS_CONCURRENCY: usize = 32;

/// Reconciles `checkpoint` with the runtime within `budget`. Errs only when the
/// runtime cannot be listed in that time: an entry whose verbose status fails,
/// takes longer than [`STATUS_DEADLINE`] or is not answered before the budget
/// ends is left out of this pass (the next resync, which sees it missing from
/// the store, asks again) while the others are rebuilt; the status calls run
/// [`STATUS_CONCURRENCY`] at a time. Entries the store knew are kept as long
/// as the runtime lists them, whether or not the budget ran out.
pub async fn reconcile(
    client: &mut Client,
    checkpoint: Snapshot,
    budget: std::time::Duration,
) -> Result<Rebuilt, tonic::Status> {
    let deadline = tokio::time::Instant::now() + budget;
    let late = |_| {
        tonic::Status::from(crate::QosletError::Late(
            "runtime listing took longer than the budget".into(),
        ))
    };
    let sandboxes = tokio::time::timeout_at(
        deadline,
        client.list_pod_sandbox(cri::ListPodSandboxRequest { filter: None }),
    )
    .await
    .map_err(late)??
    .into_inner()
    .items;
    let containers = tokio::time::timeout_at(
        deadline,
        client.list_containers(cri::ListContainersRequest { filter: None }),
    )
    .await
    .map_err(late)??
    .into_inner()
    .containers;
    let mut known_pods: HashMap<String, PodRecord> = checkpoint
        .pods
        .into_iter()
        .map(|p| (p.id.clone(), p))
        .collect();
    let mut known_ctrs: HashMap<String, ContainerRecord> = checkpoint
        .containers
        .into_iter()
        .map(|c| (c.id.clone(), c))
        .collect();
    let mut out = Snapshot::default();
    // known entries take the runtime's state; unknown ones are asked for, in parallel
    let mut ask = Vec::new();
    for (i, sb) in sandboxes.iter().enumerate() {
        match known_pods.remove(&sb.id) {
            Some(mut p) => {
                p.state = crate::records::pod_state(sb.state);
                out.pods.push(p);
            }
            None => ask.push((i, sb.id.clone())),
        }
    }
    let c = client.clone();
    let (answered, mut left_out) = statuses("pod", deadline, ask, move |id| {
        let mut c = c.clone();
        async move {
            c.pod_sandbox_status(cri::PodSandboxStatusRequest {
                pod_sandbox_id: id,
                verbose: true,
            })
            .await
            .map(|r| r.into_inner().info)
        }
    })
    .await;
    for (i, info) in answered {
        out.pods.push(pod_from_runtime(&sandboxes[i], &info));
    }
    use std::collections::HashSet;
    let listed: HashSet<&str> = sandboxes.iter().map(|s| s.id.as_str()).collect();
    let rebuilt: HashSet<String> = out.pods.iter().map(|p| p.id.clone()).collect();
    let mut ask = Vec::new();
    for (i, ct) in containers.iter().enumerate() {
        match known_ctrs.remove(&ct.id) {
            // known: kept while its pod is listed, even if the pod's status was cut
            Some(mut r) if listed.contains(ct.pod_sandbox_id.as_str()) => {
                r.state = crate::records::container_state(ct.state);
                out.containers.push(r);
            }
            Some(_) => {}
            None if rebuilt.contains(&ct.pod_sandbox_id) => ask.push((i, ct.id.clone())),
            // its pod was left for the next pass: so is the container
            None if listed.contains(ct.pod_sandbox_id.as_str()) => left_out += 1,
            None => {}
        }
    }
    let c = client.clone();
    let (answered, cut) = statuses("container", deadline, ask, move |id| {
        let mut c = c.clone();
        async move {
            c.container_status(cri::ContainerStatusRequest {
                container_id: id,
                verbose: true,
            })
            .await
            .map(|r| r.into_inner().info)
        }
    })
    .await;
    for (i, info) in answered {
        out.containers
            .push(container_from_runtime(&containers[i], &info));
    }
    left_out += cut;
    if left_out > 0 {
        tracing::warn!(
            left_out,
            "runtime entries whose status failed or did not come in time; left for the next resync"
        );
    }
    Ok(Rebuilt {
        snapshot: out,
        left_out,
    })
}

/// What a [`reconcile`] pass rebuilt, and how many listed entries it had to
/// leave for the next pass (their status failed or the budget ran out).
#[derive(Debug)]
pub struct Rebuilt {
    pub snapshot: Snapshot,
    pub left_out: usize,
}

/// Asks `call(id)` for each `(index, id)`, [`STATUS_CONCURRENCY`] at a time,
/// each within [`STATUS_DEADLINE`] and all by `deadline`; returns the answers
/// in index order and how many entries failed or were cut (logged at debug;
/// the caller logs one summary). An entry gone meanwhile (NotFound) is
/// dropped quietly. Once the deadline has passed nothing more is asked.
async fn statuses<F, Fut>(
    what: &'static str,
    deadline: tokio::time::Instant,
    ask: Vec<(usize, String)>,
    call: F,
) -> (Vec<(usize, HashMap<String, String>)>, usize)
where
    F: Fn(String) -> Fut,
    Fut: std::future::Future<Output = Result<HashMap<String, String>, tonic::Status>>
        + Send
        + 'static,
{
    use tokio::time::Instant;
    if Instant::now() >= deadline {
        return (Vec::new(), ask.len());
    }
    let limit = std::sync::Arc::new(tokio::sync::Semaphore::new(STATUS_CONCURRENCY));
    let mut set = tokio::task::JoinSet::new();
    for (i, id) in ask {
        let (limit, fut) = (limit.clone(), call(id.clone()));
        set.spawn(async move {
            let asked = async {
                let _slot = limit.acquire_owned().await;
                if Instant::now() >= deadline {
                    return None; // not sent: the pass is over
                }
                tokio::time::timeout(STATUS_DEADLINE, fut).await.ok()
            };
            // cut at its own deadline or the pass's, whichever comes first
            let r = tokio::time::timeout_at(deadline, asked)
                .await
                .ok()
                .flatten();
            (i, id, r)
        });
    }
    let (mut out, mut left_out) = (Vec::new(), 0);
    while let Some(j) = set.join_next().await {
        let Ok((i, id, r)) = j else {
            left_out += 1;
            continue;
        };
        match r {
            Some(Ok(info)) => out.push((i, info)),
            Some(Err(e)) if e.code() == tonic::Code::NotFound => {} // removed meanwhile
            Some(Err(e)) => {
                left_out += 1;
                tracing::debug!(kind = what, id = %id, error = %e, "status failed; left for the next resync")
            }
            None => {
                left_out += 1;
                tracing::debug!(kind = what, id = %id, "status not in time; left for the next resync")
            }
        }
    }
    out.sort_by_key(|(i, _)| *i);
    (out, left_out)
}

fn config_of(info: &HashMap<String, String>) -> Value {
    info.get("info")
        .and_then(|s| serde_json::from_str::<Value>(s).ok())
        .and_then(|mut v| v.get_mut("config").map(Value::take))
        .unwrap_or(Value::Null)
}

fn str_map(v: &Value) -> BTreeMap<String, String> {
    v.as_object()
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| v.as_str().map(|s| (k.clone(), s.to_string())))
                .collect()
        })
        .unwrap_or_default()
}

fn s(v: &Value, path: &[&str]) -> String {
    path.iter()
        .try_fold(v, |v, k| v.get(k))
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string()
}

fn i(v: &Value) -> i64 {
    v.as_i64()
        .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
        .unwrap_or(0)
}

/// Resources from containerd's JSON rendering of `LinuxContainerResources`.
pub fn resources_from_json(v: &Value) -> Option<Resources> {
    if !v.is_object() {
        return None;
    }
    Some(Resources {
        cpu_period: i(&v["cpu_period"]),
        cpu_quota: i(&v["cpu_quota"]),
        cpu_shares: i(&v["cpu_shares"]),
        memory_limit_in_bytes: i(&v["memory_limit_in_bytes"]),
        memory_swap_limit_in_bytes: i(&v["memory_swap_limit_in_bytes"]),
        oom_score_adj: i(&v["oom_score_adj"]),
        cpuset_cpus: s(v, &["cpuset_cpus"]),
        cpuset_mems: s(v, &["cpuset_mems"]),
        unified: str_map(&v["unified"]),
    })
}

/// A pod reconstructed from the runtime's listing and verbose status.
pub fn pod_from_runtime(sb: &cri::PodSandbox, info: &HashMap<String, String>) -> PodRecord {
    let cfg = config_of(info);
    let md = sb.metadata.clone().unwrap_or_default();
    PodRecord {
        id: sb.id.clone(),
        name: md.name,
        namespace: md.namespace,
        uid: md.uid,
        attempt: md.attempt,
        labels: crate::records::sorted(&sb.labels),
        annotations: crate::records::sorted(&sb.annotations),
        cgroup_parent: s(&cfg, &["linux", "cgroup_parent"]),
        runtime_handler: sb.runtime_handler.clone(),
        overhead: resources_from_json(&cfg["linux"]["overhead"]),
        resources: resources_from_json(&cfg["linux"]["resources"]),
        state: crate::records::pod_state(sb.state),
        created_at: sb.created_at,
        priority: None,
        source: Source::Runtime,
        applied: BTreeMap::new(),
    }
}

/// A container reconstructed from the runtime's listing and verbose status.
pub fn container_from_runtime(
    c: &cri::Container,
    info: &HashMap<String, String>,
) -> ContainerRecord {
    let cfg = config_of(info);
    let md = c.metadata.clone().unwrap_or_default();
    ContainerRecord {
        id: c.id.clone(),
        pod_id: c.pod_sandbox_id.clone(),
        name: md.name,
        attempt: md.attempt,
        image: crate::records::image(&c.image),
        labels: crate::records::sorted(&c.labels),
        annotations: crate::records::sorted(&c.annotations),
        // kubelet's own request where qoslet patched it (the runtime keeps the patched one)
        requested: c
            .annotations
            .get(ANNOTATION_REQUESTED)
            .filter(|v| v.len() <= MAX_RECORD_ANNOTATION)
            .and_then(|v| serde_json::from_str::<Resources>(v).ok())
            .or_else(|| resources_from_json(&cfg["linux"]["resources"])),
        state: crate::records::container_state(c.state),
        created_at: c.created_at,
        source: Source::Runtime,
        applied: applied_from_annotations(&c.annotations),
    }
}

/// The longest qoslet annotation read back (what qoslet writes is far smaller).
const MAX_RECORD_ANNOTATION: usize = 16 << 10;

/// What qoslet applied at CreateContainer, as its annotations on the
/// container record it (`qoslet.io/qos-class`, `qoslet.io/applied`: the
/// settings CRI carried, a JSON object). Settings written to the cgroup at
/// start are not in it (their outcome was the store's only); the QoS engine's
/// reconcile writes them again.
fn applied_from_annotations(a: &HashMap<String, String>) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    if let Some(c) = a.get(ANNOTATION_CLASS).filter(|c| c.len() <= 16) {
        out.insert("class".to_string(), c.clone());
    }
    let settings = a
        .get(ANNOTATION_APPLIED)
        .filter(|v| v.len() <= MAX_RECORD_ANNOTATION)
        .and_then(|v| serde_json::from_str::<BTreeMap<String, String>>(v).ok())
        .unwrap_or_default();
    for (k, v) in settings.into_iter().take(64) {
        out.insert(k, format!("{v} (from the runtime's record)"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use qoslet_state::store::{ContainerState, PodState};

    /// containerd 1.6.20's verbose PodSandboxStatus `info` (trimmed), as seen on this testbed.
    const POD_INFO: &str = r#"{"pid":4711,"processStatus":"running","config":{"metadata":{"name":"x","uid":"u1","namespace":"default"},"log_directory":"/tmp/x","labels":{"a":"b"},"annotations":{"k":"v"},"linux":{"cgroup_parent":"/qoslet-test/podu1","resources":{"cpu_shares":102,"memory_limit_in_bytes":67108864},"security_context":{"namespace_options":{"network":2,"pid":1}}}},"runtimeHandler":""}"#;
    const CTR_INFO: &str = r#"{"sandboxID":"sb","pid":1,"config":{"metadata":{"name":"w"},"image":{"image":"busybox"},"envs":[{"key":"A","value":"1"}],"linux":{"resources":{"cpu_shares":300,"cpu_quota":50000,"cpu_period":100000,"memory_limit_in_bytes":67108864,"unified":{"memory.high":"1000"}}}}}"#;

    /// Issue 15 item 4: a container rebuilt from the runtime takes kubelet's
    /// own request from qoslet's annotation (containerd keeps only the patched
    /// config) and what qoslet applied from its record annotations.
    #[test]
    fn container_from_runtime_reads_qoslets_annotations() {
        let info: HashMap<String, String> = [("info".to_string(), CTR_INFO.to_string())].into();
        let mut c = cri::Container {
            id: "c".into(),
            pod_sandbox_id: "sb".into(),
            ..Default::default()
        };
        let plain = container_from_runtime(&c, &info);
        assert_eq!(
            plain.requested.unwrap().cpu_quota,
            50000,
            "the runtime's config"
        );
        assert!(plain.applied.is_empty());
        c.annotations.insert(ANNOTATION_CLASS.into(), "BE".into());
        c.annotations.insert(
            ANNOTATION_APPLIED.into(),
            r#"{"cpu.cfs_quota_us":"50000","cpuset.cpus":"0-3,8-11"}"#.into(),
        );
        c.annotations.insert(
            ANNOTATION_REQUESTED.into(),
            r#"{"cpu_period":100000,"cpu_shares":2}"#.into(),
        );
        let r = container_from_runtime(&c, &info);
        let req = r.requested.unwrap();
        assert_eq!(
            (req.cpu_quota, req.cpu_shares),
            (0, 2),
            "kubelet's, not the patch"
        );
        assert_eq!(r.applied["class"], "BE");
        assert!(r.applied["cpu.cfs_quota_us"].starts_with("50000"));
        assert!(
            r.applied["cpuset.cpus"].starts_with("0-3,8-11"),
            "a list with commas whole"
        );
        // a malformed record falls back to the runtime's config
        c.annotations
            .insert(ANNOTATION_REQUESTED.into(), "{".into());
        assert_eq!(
            container_from_runtime(&c, &info)
                .requested
                .unwrap()
                .cpu_quota,
            50000
        );
    }

    #[test]
    fn pod_from_containerd_verbose_info() {
        let sb = cri::PodSandbox {
            id: "sb".into(),
            metadata: Some(cri::PodSandboxMetadata {
                name: "x".into(),
                uid: "u1".into(),
                namespace: "default".into(),
                attempt: 0,
            }),
            state: cri::PodSandboxState::SandboxReady as i32,
            ..Default::default()
        };
        let info = [("info".to_string(), POD_INFO.to_string())].into();
        let p = pod_from_runtime(&sb, &info);
        assert_eq!(p.cgroup_parent, "/qoslet-test/podu1");
        assert_eq!(p.resources.unwrap().cpu_shares, 102);
        assert_eq!((p.state, p.source), (PodState::Ready, Source::Runtime));
        // no info at all: still a record, with what the listing says
        let p = pod_from_runtime(&sb, &HashMap::new());
        assert_eq!((p.name.as_str(), p.cgroup_parent.as_str()), ("x", ""));
        // garbage info: same
        let p = pod_from_runtime(&sb, &[("info".to_string(), "{not json".to_string())].into());
        assert!(p.resources.is_none());
    }

    #[test]
    fn container_from_containerd_verbose_info() {
        let c = cri::Container {
            id: "c".into(),
            pod_sandbox_id: "sb".into(),
            state: cri::ContainerState::ContainerRunning as i32,
            ..Default::default()
        };
        let info = [("info".to_string(), CTR_INFO.to_string())].into();
        let r = container_from_runtime(&c, &info);
        let res = r.requested.clone().unwrap();
        assert_eq!(
            (
                res.cpu_shares,
                res.cpu_quota,
                res.cpu_period,
                res.memory_limit_in_bytes
            ),
            (300, 50000, 100000, 64 << 20)
        );
        assert_eq!(res.unified["memory.high"], "1000");
        assert!(!serde_json::to_string(&r).unwrap().contains("envs"));
        assert_eq!(r.state, ContainerState::Running);
    }
}
