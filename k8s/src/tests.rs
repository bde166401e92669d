//! The cluster side against the in-process fake API server (real HTTP/JSON
//! list and watch), with Koordinator's own default NodeSLO as the fixture.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::fake::FakeApiServer;
use crate::KubernetesConfig;
use qoslet_agent::hub::PolicyHub;

const NODESLOS: &str = "/apis/slo.koordinator.sh/v1alpha1/nodeslos";

/// Koordinator's default NodeSLO (as its slo-controller writes it), for
/// `node`, with `cpuSuppressThresholdPercent` set to `pct`.
fn nodeslo(node: &str, pct: i64) -> Value {
    let mut o: Value = serde_json::from_str(include_str!(
        "../../hooks/tests/fixtures/koordinator-default-nodeslo.json"
    ))
    .unwrap();
    o["metadata"] = json!({"name": node});
    o["spec"]["resourceUsedThresholdWithBE"]["cpuSuppressThresholdPercent"] = json!(pct);
    o
}

async fn client_of(fake: &FakeApiServer, dir: &std::path::Path) -> kube::Client {
    let kc = dir.join("kubeconfig");
    std::fs::write(&kc, fake.kubeconfig()).unwrap();
    KubernetesConfig {
        enable: true,
        kubeconfig: Some(kc),
        node_name: Some("node-1".into()),
        ..Default::default()
    }
    .client()
    .await
    .unwrap()
}

fn suppress(hub: &PolicyHub) -> (i64, &'static str) {
    let p = hub.current();
    (
        p.policy
            .resource_used_threshold_with_be
            .cpu_suppress_threshold_percent,
        p.source,
    )
}

async fn until(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < limit, "timed out after {limit:?}: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn state(hub: &PolicyHub) -> String {
    hub.current()
        .sources
        .iter()
        .find(|s| s.source == "cluster")
        .map(|s| s.state.clone())
        .unwrap_or_default()
}

/// Issue 31: a NodeSLO changed mid-run reaches the policy hub; one that
/// fails validation is refused whole (the last good stays, the source says
/// invalid); a watch that ends, a 410 (compacted history) and injected 5xx
/// are recovered from; the API server gone makes the source stale with the
/// last good policy in force, and its return resumes; the NodeSLO deleted
/// puts the file's policy back. Other nodes' NodeSLOs are never seen.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nodeslo_drives_the_policy_through_every_api_server_mishap() {
    let fake = FakeApiServer::start().await;
    let dir = std::env::temp_dir().join(format!("qoslet-kube-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let client = client_of(&fake, &dir).await;
    let file: qoslet_qos_engine::source::PolicyConfig = serde_json::from_value(json!({
        "resourceUsedThresholdWithBE": {"enable": true, "cpuSuppressThresholdPercent": 40}
    }))
    .unwrap();
    let hub = PolicyHub::new(Some(file));
    let (stop, stopped) = tokio::sync::watch::channel(false);
    fake.apply(NODESLOS, nodeslo("node-2", 11));
    fake.apply(NODESLOS, nodeslo("node-1", 30));
    let task = tokio::spawn(crate::nodeslo::follow(
        client,
        "node-1".into(),
        hub.clone(),
        stopped,
    ));
    let s = Duration::from_secs(10);
    until("the listed NodeSLO in force", s, || {
        suppress(&hub) == (30, "cluster")
    })
    .await;
    // what qoslet does not implement is set aside and listed, not refused
    assert!(hub
        .current()
        .policy
        .not_implemented
        .iter()
        .any(|f| f.starts_with("systemStrategy")));
    // changed mid-run: watched
    fake.apply(NODESLOS, nodeslo("node-1", 25));
    until("the change in force", s, || {
        suppress(&hub) == (25, "cluster")
    })
    .await;
    // another node's NodeSLO is not this node's
    fake.apply(NODESLOS, nodeslo("node-2", 12));
    // invalid: refused whole, the last good stays
    fake.apply(NODESLOS, nodeslo("node-1", 150));
    until("the invalid NodeSLO refused", s, || {
        state(&hub) == "invalid"
    })
    .await;
    assert_eq!(suppress(&hub), (25, "cluster"));
    assert!(hub
        .current()
        .error
        .as_deref()
        .is_some_and(|e| e.contains("cpuSuppressThresholdPercent")));
    // the watch ends (the API server's timeout): the watcher goes on
    fake.end_watches();
    fake.apply(NODESLOS, nodeslo("node-1", 20));
    until("after a watch ended", s, || {
        suppress(&hub) == (20, "cluster")
    })
    .await;
    assert_eq!(state(&hub), "ok");
    // history compacted and the watch ended: 410 Expired, a relist
    fake.compact();
    fake.end_watches();
    tokio::time::sleep(Duration::from_millis(200)).await;
    fake.apply(NODESLOS, nodeslo("node-1", 21));
    until("after a 410 relist", Duration::from_secs(20), || {
        suppress(&hub) == (21, "cluster")
    })
    .await;
    // 5xx: retried with backoff
    fake.fail_next(3, 500);
    fake.end_watches();
    fake.apply(NODESLOS, nodeslo("node-1", 22));
    until("after 5xx", Duration::from_secs(20), || {
        suppress(&hub) == (22, "cluster")
    })
    .await;
    // the API server gone: stale, the last good policy in force
    fake.go_down();
    until(
        "stale while the API server is gone",
        Duration::from_secs(20),
        || state(&hub) == "stale",
    )
    .await;
    assert_eq!(suppress(&hub), (22, "cluster"));
    fake.apply(NODESLOS, nodeslo("node-1", 23));
    fake.come_back().await;
    until("back with the API server", Duration::from_secs(60), || {
        suppress(&hub) == (23, "cluster") && state(&hub) == "ok"
    })
    .await;
    // deleted: the file's policy
    fake.delete(NODESLOS, "node-1");
    until("the file's policy after the delete", s, || {
        suppress(&hub) == (40, "file")
    })
    .await;
    // only this node's NodeSLO was ever asked for
    let seen = fake.seen();
    assert!(seen
        .iter()
        .filter(|r| r.path == NODESLOS)
        .all(|r| r.query.contains("fieldSelector=metadata.name%3Dnode-1")));
    assert!(seen.iter().any(|r| r.query.contains("watch=true")));
    stop.send(true).unwrap();
    let _ = tokio::time::timeout(Duration::from_secs(5), task).await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_node_name_is_checked() {
    let c = |n: &str| KubernetesConfig {
        node_name: Some(n.into()),
        ..Default::default()
    };
    assert_eq!(c("node-1.example").node().unwrap(), "node-1.example");
    for bad in ["", "Node", "a/b", "-a", "a..b", &"x".repeat(254), "a b"] {
        assert!(c(bad).node().is_err(), "{bad:?}");
    }
}

#[test]
fn the_section_is_off_unless_enabled() {
    let k: KubernetesConfig = serde_json::from_str("{}").unwrap();
    assert!(!k.enable);
    assert!(
        k.eviction_api,
        "in a cluster evictions go through the API by default"
    );
    assert!(serde_json::from_str::<KubernetesConfig>(r#"{"enabel":true}"#).is_err());
}

const PODS: &str = "/api/v1/pods";

fn fixture(name: &str) -> Value {
    let text = match name {
        "burstable" => include_str!("../tests/fixtures/pod-burstable.json"),
        _ => include_str!("../tests/fixtures/pod-daemonset-besteffort.json"),
    };
    serde_json::from_str(text).unwrap()
}

/// What qoslet keeps of a pod, from the pods as Kubernetes 1.33 serves
/// them: requests as the scheduler counts them (containers and the sidecar
/// summed, at least the plain init container's, plus the overhead), no pod
/// limit when a container has none, the DaemonSet's memory-pressure
/// toleration, and nothing of the spec's env.
#[test]
fn a_pod_as_the_api_server_serves_it() {
    let p: k8s_openapi::api::core::v1::Pod = serde_json::from_value(fixture("burstable")).unwrap();
    let c = crate::pods::cluster_pod(&p).unwrap();
    assert_eq!(c.uid, "3b0e8f5c-6a59-4f63-9f7a-1d4e2c9b8a01");
    assert_eq!(
        (c.namespace.as_str(), c.name.as_str()),
        ("shop", "web-7d9c5b7f6b-x2kqp")
    );
    assert_eq!(c.priority, Some(9000));
    assert_eq!(c.priority_class.as_deref(), Some("koord-prod"));
    assert_eq!(c.qos_class.as_deref(), Some("Burstable"));
    // max(500m + 250m + 100m sidecar, 1500m init) + 50m overhead
    assert_eq!(c.requests.cpu_milli, 1550);
    // max(256 + 128 + 64 Mi, 768 Mi) + 32 Mi
    assert_eq!(c.requests.memory, 800 << 20);
    // `cache` has no limit: the pod has none
    assert_eq!(c.limits, qoslet_state::PodAmounts::default());
    assert_eq!(c.grace_seconds, Some(45));
    assert!(!c.tolerates_memory_pressure);
    assert!(!c.deleting);
    assert!(!format!("{c:?}").contains("DB_PASSWORD"));

    let p: k8s_openapi::api::core::v1::Pod = serde_json::from_value(fixture("daemonset")).unwrap();
    let c = crate::pods::cluster_pod(&p).unwrap();
    assert_eq!(c.qos_class.as_deref(), Some("BestEffort"));
    assert_eq!(c.requests, qoslet_state::PodAmounts::default());
    assert!(c.tolerates_memory_pressure);
    assert_eq!(c.priority, Some(0));

    // tolerations: Exists with no key tolerates every taint; Equal needs the
    // taint's (empty) value; NoExecute is another effect
    let tol = |t: Value| {
        let mut o = fixture("burstable");
        o["spec"]["tolerations"] = json!([t]);
        let p: k8s_openapi::api::core::v1::Pod = serde_json::from_value(o).unwrap();
        crate::pods::cluster_pod(&p)
            .unwrap()
            .tolerates_memory_pressure
    };
    assert!(tol(json!({"operator": "Exists"})));
    assert!(tol(
        json!({"key": "node.kubernetes.io/memory-pressure", "operator": "Equal", "effect": "NoSchedule"})
    ));
    assert!(!tol(
        json!({"key": "node.kubernetes.io/memory-pressure", "operator": "Equal", "value": "x"})
    ));
    assert!(!tol(
        json!({"key": "node.kubernetes.io/memory-pressure", "operator": "Exists", "effect": "NoExecute"})
    ));
    assert!(!tol(
        json!({"key": "node.kubernetes.io/disk-pressure", "operator": "Exists"})
    ));
    // no UID: nothing to join
    let mut o = fixture("burstable");
    o["metadata"]["uid"] = json!(null);
    let p: k8s_openapi::api::core::v1::Pod = serde_json::from_value(o).unwrap();
    assert!(crate::pods::cluster_pod(&p).is_none());
}

/// Issue 31: this node's pods join the store by UID (other nodes' never),
/// a change and a deletion are followed, the API server gone keeps the last
/// pods and marks the watch stale, its return lists them again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn this_nodes_pods_join_the_store_by_uid() {
    let fake = FakeApiServer::start().await;
    let dir = std::env::temp_dir().join(format!("qoslet-kube-pods-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let client = client_of(&fake, &dir).await;
    let store = qoslet_state::Store::new();
    let status = std::sync::Arc::new(crate::status::ClusterStatus::default());
    let web = fake.apply(PODS, fixture("burstable"));
    let web_uid = web["metadata"]["uid"].as_str().unwrap().to_string();
    let mut elsewhere = fixture("daemonset");
    elsewhere["metadata"]["name"] = json!("node-exporter-zz9");
    elsewhere["metadata"]["uid"] = json!("uid-elsewhere");
    elsewhere["spec"]["nodeName"] = json!("node-2");
    fake.apply(PODS, elsewhere);
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let task = tokio::spawn(crate::pods::follow(
        client,
        "node-1".into(),
        store.clone(),
        status.clone(),
        stopped,
    ));
    let s = Duration::from_secs(10);
    until("the listed pod in the store", s, || {
        store.cluster_pod(&web_uid).is_some()
    })
    .await;
    assert_eq!(
        store.cluster_pods(),
        1,
        "another node's pod is not this node's"
    );
    assert_eq!(status.state(crate::status::WatchName::Pods), "ok");
    // a new pod and a change
    let ds = fake.apply(PODS, fixture("daemonset"));
    let ds_uid = ds["metadata"]["uid"].as_str().unwrap().to_string();
    let mut changed = web.clone();
    changed["spec"]["priority"] = json!(777);
    fake.apply(PODS, changed);
    until("the new pod and the change", s, || {
        store.cluster_pod(&ds_uid).is_some()
            && store.cluster_pod(&web_uid).and_then(|p| p.priority) == Some(777)
    })
    .await;
    // a status-only change is no new generation (nothing kept changed)
    let g = store.generation();
    let mut st = ds.clone();
    st["status"]["podIP"] = json!("10.0.0.12");
    fake.apply(PODS, st);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(store.generation(), g);
    // deleted
    fake.delete(PODS, "monitoring/node-exporter-4kx7d");
    until("the deleted pod gone", s, || {
        store.cluster_pod(&ds_uid).is_none()
    })
    .await;
    // the API server gone: stale, the pods stay
    fake.go_down();
    until(
        "stale while the API server is gone",
        Duration::from_secs(20),
        || status.state(crate::status::WatchName::Pods) == "stale",
    )
    .await;
    assert!(store.cluster_pod(&web_uid).is_some());
    fake.come_back().await;
    until("ok again", Duration::from_secs(30), || {
        status.state(crate::status::WatchName::Pods) == "ok"
    })
    .await;
    let mut text = String::new();
    status.render(&mut text);
    assert!(
        text.contains("qoslet_cluster_watch_state{watch=\"pods\",state=\"ok\"} 1"),
        "{text}"
    );
    assert!(fake
        .seen()
        .iter()
        .filter(|r| r.path == PODS)
        .all(|r| r.query.contains("fieldSelector=spec.nodeName%3Dnode-1")));
    stop.send(true).unwrap();
    let _ = tokio::time::timeout(Duration::from_secs(5), task).await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// A runtime evictor that must not be called (the Eviction API evicts).
struct NoRuntime;

impl qoslet_eviction::evictor::Evictor for NoRuntime {
    fn name(&self) -> &'static str {
        "cri"
    }
    fn evict<'a>(
        &'a self,
        req: &'a qoslet_eviction::evictor::EvictRequest,
    ) -> qoslet_eviction::evictor::BoxFuture<
        'a,
        Result<qoslet_eviction::evictor::Evicted, qoslet_eviction::evictor::EvictError>,
    > {
        panic!("a CRI stop of {}", req.name)
    }
}

fn request(p: &Value, grace: i64) -> qoslet_eviction::evictor::EvictRequest {
    qoslet_eviction::evictor::EvictRequest {
        sandbox_id: "sandbox".into(),
        uid: p["metadata"]["uid"].as_str().unwrap().into(),
        namespace: p["metadata"]["namespace"].as_str().unwrap().into(),
        name: p["metadata"]["name"].as_str().unwrap().into(),
        grace_seconds: grace,
        model: qoslet_eviction::evictor::Model::Kubelet,
        signal: Some(qoslet_eviction::Signal::MemoryAvailable),
        observed: Some(100 << 20),
        threshold: Some(300 << 20),
        message:
            "The node was low on resource: memory. Threshold quantity: 300Mi, available: 100Mi."
                .into(),
    }
}

/// Issue 31: the Eviction API evictor: policy/v1 Eviction with the UID
/// precondition and the grace period (201: the pod deleted gracefully, an
/// Evicted Event); a PodDisruptionBudget's 429 is Refused (an
/// EvictionRefused Event, counted) and the pod is never stopped through
/// CRI; a pod gone (404) or replaced (409, another UID) is Gone; a 5xx
/// fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evictions_go_through_the_eviction_api_and_respect_budgets() {
    use qoslet_eviction::evictor::{Evicted, Evictor};
    let fake = FakeApiServer::start().await;
    let dir = std::env::temp_dir().join(format!("qoslet-kube-evict-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let client = client_of(&fake, &dir).await;
    let status = std::sync::Arc::new(crate::status::ClusterStatus::default());
    let ev = crate::evict::ApiEvictor::new(
        client,
        "node-1".into(),
        std::sync::Arc::new(NoRuntime),
        status.clone(),
    );
    let web = fake.apply(PODS, fixture("burstable"));
    let ds = fake.apply(PODS, fixture("daemonset"));
    fake.protect("shop", "web-7d9c5b7f6b-x2kqp");
    // protected: refused, not stopped
    let r = ev.evict(&request(&web, 45)).await.unwrap();
    assert!(
        matches!(&r, Evicted::Refused(m) if m.contains("disruption budget")),
        "{r:?}"
    );
    assert!(fake.evictions().is_empty());
    assert!(
        fake.get(PODS, "shop/web-7d9c5b7f6b-x2kqp").unwrap()["metadata"]["deletionTimestamp"]
            .is_null()
    );
    // the other: evicted with its UID and grace period
    let r = ev.evict(&request(&ds, 7)).await.unwrap();
    assert_eq!(r, Evicted::Stopping);
    let bodies = fake.evictions();
    assert_eq!(bodies.len(), 1);
    assert_eq!(
        bodies[0]["deleteOptions"]["preconditions"]["uid"],
        ds["metadata"]["uid"]
    );
    assert_eq!(bodies[0]["deleteOptions"]["gracePeriodSeconds"], json!(7));
    assert_eq!(bodies[0]["metadata"]["name"], json!("node-exporter-4kx7d"));
    assert!(
        !fake.get(PODS, "monitoring/node-exporter-4kx7d").unwrap()["metadata"]["deletionTimestamp"]
            .is_null()
    );
    // the Events, on each pod
    let events = fake.list("/api/v1/events");
    let reasons: Vec<(String, String)> = events
        .iter()
        .map(|e| {
            (
                e["involvedObject"]["name"]
                    .as_str()
                    .unwrap_or("")
                    .to_string(),
                e["reason"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    assert!(
        reasons.contains(&("web-7d9c5b7f6b-x2kqp".into(), "EvictionRefused".into())),
        "{reasons:?}"
    );
    assert!(
        reasons.contains(&("node-exporter-4kx7d".into(), "Evicted".into())),
        "{reasons:?}"
    );
    let evicted = events.iter().find(|e| e["reason"] == "Evicted").unwrap();
    assert_eq!(evicted["involvedObject"]["uid"], ds["metadata"]["uid"]);
    assert_eq!(evicted["type"], "Warning");
    assert_eq!(evicted["source"]["component"], "qoslet");
    assert_eq!(evicted["source"]["host"], "node-1");
    assert!(evicted["message"].as_str().unwrap().contains("memory"));
    // a pod of that name with another UID (recreated): gone
    let mut other = request(&ds, 7);
    other.uid = "someone-else".into();
    assert_eq!(ev.evict(&other).await.unwrap(), Evicted::Gone);
    // no such pod: gone
    let mut missing = request(&ds, 7);
    missing.name = "nope".into();
    assert_eq!(ev.evict(&missing).await.unwrap(), Evicted::Gone);
    // the API server failing: an error (the loop passes the pod over, then retries)
    fake.fail_next(1, 503);
    assert!(ev.evict(&request(&web, 45)).await.is_err());
    use crate::status::EvictOutcome::*;
    assert_eq!(
        [Evicted, Refused, Gone, Failed].map(|o| status.evictions(o)),
        [1, 1, 2, 1]
    );
    let _ = std::fs::remove_dir_all(&dir);
}
