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
    // ... and said on the node, once
    until("an Event on the node", s, || {
        fake.list("/api/v1/events").iter().any(|e| {
            e["reason"] == "NodeSLORefused"
                && e["involvedObject"]["kind"] == "Node"
                && e["involvedObject"]["name"] == "node-1"
                && e["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("cpuSuppressThresholdPercent"))
        })
    })
    .await;
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
    let p: crate::view::PodView = serde_json::from_value(fixture("burstable")).unwrap();
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

    let p: crate::view::PodView = serde_json::from_value(fixture("daemonset")).unwrap();
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
        let p: crate::view::PodView = serde_json::from_value(o).unwrap();
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
    let p: crate::view::PodView = serde_json::from_value(o).unwrap();
    assert!(crate::pods::cluster_pod(&p).is_none());
}

/// The views read what k8s-openapi's whole `Pod` and `Node` read, field for
/// field, on the fixtures and on the shapes the fixtures lack (null lists, no
/// spec, no status); and an object k8s-openapi refuses for a field qoslet
/// keeps is refused by the view too.
#[test]
fn the_views_read_what_k8s_openapi_reads() {
    use k8s_openapi::api::core::v1::{Node, Pod};
    fn rl(
        l: Option<
            &std::collections::BTreeMap<
                String,
                k8s_openapi::apimachinery::pkg::api::resource::Quantity,
            >,
        >,
    ) -> Option<Vec<(String, String)>> {
        l.map(|l| l.iter().map(|(k, v)| (k.clone(), v.0.clone())).collect())
    }
    fn rv(l: Option<&crate::view::ResourceList>) -> Option<Vec<(String, String)>> {
        l.map(|l| l.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
    }
    fn same_pod(o: Value) {
        let full: Pod = serde_json::from_value(o.clone()).unwrap();
        let view: crate::view::PodView = serde_json::from_value(o.clone()).unwrap();
        assert_eq!(full.metadata, view.metadata, "{o}");
        let (fs, vs) = (full.spec.as_ref(), view.spec.as_ref());
        assert_eq!(fs.is_some(), vs.is_some());
        if let (Some(f), Some(v)) = (fs, vs) {
            assert_eq!(f.priority, v.priority);
            assert_eq!(f.priority_class_name, v.priority_class_name);
            assert_eq!(
                f.termination_grace_period_seconds,
                v.termination_grace_period_seconds
            );
            assert_eq!(rl(f.overhead.as_ref()), rv(v.overhead.as_ref()));
            let fc = |cs: &[k8s_openapi::api::core::v1::Container]| {
                cs.iter()
                    .map(|c| {
                        let r = c.resources.as_ref();
                        (
                            c.name.clone(),
                            c.restart_policy.clone(),
                            rl(r.and_then(|r| r.requests.as_ref())),
                            rl(r.and_then(|r| r.limits.as_ref())),
                        )
                    })
                    .collect::<Vec<_>>()
            };
            let vc = |cs: &[crate::view::ContainerView]| {
                cs.iter()
                    .map(|c| {
                        let r = c.resources.as_ref();
                        (
                            c.name.clone().unwrap_or_default(),
                            c.restart_policy.clone(),
                            rv(r.and_then(|r| r.requests.as_ref())),
                            rv(r.and_then(|r| r.limits.as_ref())),
                        )
                    })
                    .collect::<Vec<_>>()
            };
            assert_eq!(
                fc(&f.containers),
                vc(v.containers.as_deref().unwrap_or_default())
            );
            assert_eq!(
                fc(f.init_containers.as_deref().unwrap_or_default()),
                vc(v.init_containers.as_deref().unwrap_or_default())
            );
            let ft: Vec<_> = f
                .tolerations
                .iter()
                .flatten()
                .map(|t| {
                    (
                        t.key.clone(),
                        t.operator.clone(),
                        t.effect.clone(),
                        t.value.clone(),
                    )
                })
                .collect();
            let vt: Vec<_> = v
                .tolerations
                .iter()
                .flatten()
                .map(|t| {
                    (
                        t.key.clone(),
                        t.operator.clone(),
                        t.effect.clone(),
                        t.value.clone(),
                    )
                })
                .collect();
            assert_eq!(ft, vt);
        }
        assert_eq!(
            full.status.as_ref().and_then(|s| s.qos_class.clone()),
            view.status.as_ref().and_then(|s| s.qos_class.clone())
        );
    }
    for name in ["burstable", "daemonset"] {
        let o = fixture(name);
        same_pod(o.clone());
        for (path, v) in [
            ("tolerations", json!(null)),
            ("initContainers", json!(null)),
            ("overhead", json!(null)),
            ("priority", json!(null)),
        ] {
            let mut o = o.clone();
            o["spec"][path] = v;
            same_pod(o);
        }
        let mut o2 = o.clone();
        o2.as_object_mut().unwrap().remove("status");
        same_pod(o2);
        // a kept field of the wrong type: both refuse the object
        let mut bad = o.clone();
        bad["spec"]["priority"] = json!("high");
        assert!(serde_json::from_value::<Pod>(bad.clone()).is_err());
        assert!(serde_json::from_value::<crate::view::PodView>(bad).is_err());
    }
    let node = json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "n1", "uid": "u1", "resourceVersion": "7", "labels": {"a": "b"}},
        "spec": {"podCIDR": "10.0.0.0/24"},
        "status": {
            "capacity": {"cpu": "8", "memory": "32Gi", "pods": "110"},
            "allocatable": {"cpu": "7500m", "memory": "31Gi", "pods": "110"},
            "images": [{"names": ["busybox"], "sizeBytes": 1}],
            "conditions": [{"type": "Ready", "status": "True"}]
        }
    });
    let full: Node = serde_json::from_value(node.clone()).unwrap();
    let view: crate::view::NodeView = serde_json::from_value(node).unwrap();
    assert_eq!(full.metadata, view.metadata);
    let (fs, vs) = (full.status.clone().unwrap(), view.status.unwrap());
    assert_eq!(rl(fs.capacity.as_ref()), rv(vs.capacity.as_ref()));
    assert_eq!(rl(fs.allocatable.as_ref()), rv(vs.allocatable.as_ref()));
    assert_eq!(crate::node::reserved_cores(&view_of(&full)), Some(0.5));
    fn view_of(n: &Node) -> crate::view::NodeView {
        serde_json::from_value(serde_json::to_value(n).unwrap()).unwrap()
    }
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

/// The runtime's evictor: counts the pods it is asked to stop.
#[derive(Default)]
struct Runtime(std::sync::Mutex<Vec<String>>);

impl qoslet_eviction::evictor::Evictor for Runtime {
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
        self.0.lock().unwrap().push(req.name.clone());
        Box::pin(async { Ok(qoslet_eviction::evictor::Evicted::Stopped) })
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
/// EvictionRefused Event, once per 10 min, counted) and the pod is never
/// stopped through CRI; a pod gone (404) or replaced (409, another UID) is
/// Gone. The API server unable to decide (5xx, its own throttling's 429):
/// an error, never a CRI stop; a pod it does not have: the runtime stops it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evictions_go_through_the_eviction_api_and_respect_budgets() {
    use qoslet_eviction::evictor::{Evicted, Evictor};
    let fake = FakeApiServer::start().await;
    let dir = std::env::temp_dir().join(format!("qoslet-kube-evict-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let client = client_of(&fake, &dir).await;
    let status = std::sync::Arc::new(crate::status::ClusterStatus::default());
    let runtime = std::sync::Arc::new(Runtime::default());
    let store = qoslet_state::Store::new();
    let ev = crate::evict::ApiEvictor::new(
        client,
        "node-1".into(),
        runtime.clone(),
        status.clone(),
        store.clone(),
    );
    let web = fake.apply(PODS, fixture("burstable"));
    let ds = fake.apply(PODS, fixture("daemonset"));
    // the cluster view (the pods watch) has both
    for o in [&web, &ds] {
        let p: crate::view::PodView = serde_json::from_value(o.clone()).unwrap();
        store.upsert_cluster_pod(crate::pods::cluster_pod(&p).unwrap());
    }
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
    // refused again: no second Event within 10 min
    assert!(matches!(
        ev.evict(&request(&web, 45)).await.unwrap(),
        Evicted::Refused(_)
    ));
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
    // the Events, on each pod (sent off the loop)
    until("two events", Duration::from_secs(10), || {
        fake.list("/api/v1/events").len() >= 2
    })
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
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
    assert_eq!(
        reasons.len(),
        2,
        "one Event per pod and reason: {reasons:?}"
    );
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
    // the view has a pod of that name with an older UID (recreated): 409, gone
    let mut other = request(&ds, 7);
    other.uid = "someone-else".into();
    store.upsert_cluster_pod(qoslet_state::ClusterPod {
        uid: "someone-else".into(),
        namespace: other.namespace.clone(),
        name: other.name.clone(),
        ..Default::default()
    });
    assert_eq!(ev.evict(&other).await.unwrap(), Evicted::Gone);
    // the view has it, the API server no more: 404, gone
    let mut missing = request(&ds, 7);
    missing.name = "nope".into();
    missing.uid = "uid-nope".into();
    store.upsert_cluster_pod(qoslet_state::ClusterPod {
        uid: "uid-nope".into(),
        namespace: missing.namespace.clone(),
        name: "nope".into(),
        ..Default::default()
    });
    assert_eq!(ev.evict(&missing).await.unwrap(), Evicted::Gone);
    assert!(
        runtime.0.lock().unwrap().is_empty(),
        "nothing stopped through CRI yet"
    );
    // a pod the cluster view does not have (a static pod's sandbox): the runtime
    let mut unknown = request(&ds, 7);
    unknown.uid = "uid-static".into();
    unknown.name = "etcd-node-1".into();
    assert_eq!(ev.evict(&unknown).await.unwrap(), Evicted::Stopped);
    // the API server failing, or throttling (a 429 without a budget): an
    // error, never a CRI stop (a budget may protect the pod)
    fake.fail_next(1, 503);
    assert!(ev.evict(&request(&web, 45)).await.is_err());
    fake.fail_next(1, 429);
    assert!(ev.evict(&request(&ds, 7)).await.is_err());
    assert_eq!(*runtime.0.lock().unwrap(), vec!["etcd-node-1".to_string()]);
    // never the protected pod
    assert!(!runtime
        .0
        .lock()
        .unwrap()
        .iter()
        .any(|n| n.starts_with("web")));
    use crate::status::EvictOutcome::*;
    assert_eq!(
        [Evicted, Refused, Gone, Failed].map(|o| status.evictions(o)),
        [1, 2, 2, 2]
    );
    let _ = std::fs::remove_dir_all(&dir);
}

mod nodemetric {
    use super::*;
    use crate::nodemetric::*;
    use crate::status::ClusterStatus;
    use std::sync::Arc;

    const NODEMETRICS: &str = "/apis/slo.koordinator.sh/v1alpha1/nodemetrics";

    #[test]
    fn quantities_and_durations_as_kubernetes_prints_them() {
        assert_eq!(cpu_quantity(2.35), "2350m");
        assert_eq!(cpu_quantity(2.0), "2");
        assert_eq!(cpu_quantity(0.0004), "0");
        assert_eq!(cpu_quantity(12_000.0), "12k");
        assert_eq!(memory_quantity((10u64 << 30) as f64), "10Gi");
        assert_eq!(memory_quantity((1536u64 << 20) as f64), "1536Mi");
        assert_eq!(memory_quantity(1000.0), "1000");
        assert_eq!(memory_quantity(1025.0), "1025");
        assert_eq!(go_duration(Duration::from_secs(300)), "5m0s");
        assert_eq!(go_duration(Duration::from_secs(3600)), "1h0m0s");
        assert_eq!(go_duration(Duration::from_secs(45)), "45s");
        for (s, secs) in [
            ("5m0s", 300.0),
            ("10m", 600.0),
            ("1h30m", 5400.0),
            ("1.5h", 5400.0),
            ("90s", 90.0),
        ] {
            assert_eq!(
                parse_go_duration(s),
                Some(Duration::from_secs_f64(secs)),
                "{s}"
            );
        }
        for bad in ["", "5", "5x", "m", "-5m"] {
            assert_eq!(parse_go_duration(bad), None, "{bad}");
        }
        assert_eq!(priority_class(9500), Some("koord-prod"));
        assert_eq!(priority_class(5000), Some("koord-batch"));
        assert_eq!(priority_class(0), None);
    }

    #[test]
    fn the_collect_policy_with_koordlets_defaults_and_minimums() {
        assert_eq!(CollectPolicy::of_spec(&json!({})), CollectPolicy::default());
        let p = CollectPolicy::of_spec(&json!({"metricCollectPolicy": {
            "aggregateDurationSeconds": 120, "reportIntervalSeconds": 45,
            "nodeAggregatePolicy": {"durations": ["1m0s", "15m0s", "bogus"]}}}));
        assert_eq!(p.aggregate, Duration::from_secs(120));
        assert_eq!(p.report_interval, Duration::from_secs(45));
        assert_eq!(
            p.durations,
            vec![Duration::from_secs(60), Duration::from_secs(900)]
        );
        // under koordlet's minimums: raised to them, as koordlet does
        let p = CollectPolicy::of_spec(&json!({"metricCollectPolicy": {
            "aggregateDurationSeconds": 10, "reportIntervalSeconds": 5,
            "nodeMemoryCollectPolicy": "usageWithPageCache"}}));
        assert_eq!(p.aggregate, Duration::from_secs(60));
        assert_eq!(p.report_interval, Duration::from_secs(30));
        assert!(p.with_page_cache);
        assert!(!CollectPolicy::default().with_page_cache);
        // koordlet's GetPodPriorityClassWithDefault
        assert_eq!(
            priority_class_with_default(Some("koord-mid"), Some(9000), Some("LS")),
            Some("koord-mid")
        );
        assert_eq!(
            priority_class_with_default(Some("bogus"), Some(5500), Some("LS")),
            Some("koord-batch")
        );
        assert_eq!(
            priority_class_with_default(None, Some(0), Some("LS")),
            Some("koord-prod")
        );
        assert_eq!(
            priority_class_with_default(None, None, Some("BE")),
            Some("koord-batch")
        );
        assert_eq!(priority_class_with_default(None, None, None), None);
    }

    pub(super) fn figures() -> Collected {
        let u = |cpu: f64, gib: u64| Usage {
            cpu,
            memory: (gib << 30) as f64,
        };
        Collected {
            node: u(2.35, 10),
            node_aggregated: vec![(
                Duration::from_secs(300),
                [
                    Some(u(2.0, 9)),
                    Some(u(2.0, 9)),
                    Some(u(3.0, 10)),
                    Some(u(3.5, 10)),
                    None,
                ],
            )],
            system: Usage {
                cpu: 0.3,
                memory: (1u64 << 30) as f64,
            },
            system_aggregated: vec![],
            pods: vec![
                PodUsage {
                    namespace: "shop".into(),
                    name: "web-1".into(),
                    usage: Usage {
                        cpu: 0.5,
                        memory: (512u64 << 20) as f64,
                    },
                    priority: Some("koord-prod"),
                    qos: Some("LS"),
                },
                PodUsage {
                    namespace: "batch".into(),
                    name: "job-1".into(),
                    usage: Usage {
                        cpu: 1.25,
                        memory: (2u64 << 30) as f64,
                    },
                    priority: None,
                    qos: Some("BE"),
                },
            ],
        }
    }

    /// Koordinator's status keys exactly, pods sorted by namespace and name,
    /// an aggregation the cache cannot answer left out (omitempty).
    #[test]
    fn the_status_has_koordinators_keys() {
        let got = status_json(&figures(), "2026-12-04T10:00:00Z");
        let want = json!({
            "updateTime": "2026-12-04T10:00:00Z",
            "nodeMetric": {
                "nodeUsage": {"resources": {"cpu": "2350m", "memory": "10Gi"}},
                "aggregatedNodeUsages": [{"usage": {
                    "avg": {"resources": {"cpu": "2", "memory": "9Gi"}},
                    "p50": {"resources": {"cpu": "2", "memory": "9Gi"}},
                    "p90": {"resources": {"cpu": "3", "memory": "10Gi"}},
                    "p95": {"resources": {"cpu": "3500m", "memory": "10Gi"}}},
                    "duration": "5m0s"}],
                "systemUsage": {"resources": {"cpu": "300m", "memory": "1Gi"}}
            },
            "podsMetric": [
                {"namespace": "batch", "name": "job-1", "podUsage": {"resources": {"cpu": "1250m", "memory": "2Gi"}}, "qos": "BE"},
                {"namespace": "shop", "name": "web-1", "podUsage": {"resources": {"cpu": "500m", "memory": "512Mi"}}, "priority": "koord-prod", "qos": "LS"}
            ]
        });
        assert_eq!(got, want);
    }

    pub(super) struct Table(pub(super) Option<Collected>);

    impl MetricsSource for Table {
        fn collect(&self, _: &CollectPolicy) -> Option<Collected> {
            self.0.clone()
        }
    }

    fn nodemetric(spec: Value) -> Value {
        json!({"apiVersion": "slo.koordinator.sh/v1alpha1", "kind": "NodeMetric",
               "metadata": {"name": "node-1"}, "spec": spec})
    }

    /// Issue 31: a report reads the NodeMetric (its spec is the policy) and
    /// writes its status once; a conflict reads it again and retries; a
    /// missing NodeMetric waits unless createNodeMetric; no figures, no write.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_report_writes_the_status_once_and_retries_conflicts() {
        let fake = FakeApiServer::start().await;
        let dir = std::env::temp_dir().join(format!("qoslet-kube-nm-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let client = client_of(&fake, &dir).await;
        let api: kube::Api<kube::api::DynamicObject> = kube::Api::all_with(client, &resource());
        let status = ClusterStatus::default();
        let source = Table(Some(figures()));
        let wait = ReportSettings {
            create: false,
            interval: None,
        };
        // missing: waits, writes nothing
        let (r, _) = report_once(&api, "node-1", &source, &wait, &status)
            .await
            .unwrap();
        assert_eq!(r, Reported::Missing);
        assert!(fake.status_writes().is_empty());
        // created when asked
        let create = ReportSettings {
            create: true,
            interval: None,
        };
        let (r, p) = report_once(&api, "node-1", &source, &create, &status)
            .await
            .unwrap();
        assert_eq!((r, p), (Reported::Written, CollectPolicy::default()));
        let stored = fake.get(NODEMETRICS, "node-1").unwrap();
        assert_eq!(
            stored["status"]["nodeMetric"]["nodeUsage"]["resources"]["cpu"],
            "2350m"
        );
        assert_eq!(stored["status"]["podsMetric"][0]["name"], "job-1");
        // the spec is the policy; a conflict is read again and retried
        let mut o = stored.clone();
        o["spec"] = json!({"metricCollectPolicy": {"reportIntervalSeconds": 90}});
        fake.apply(NODEMETRICS, o);
        fake.conflict_next(1);
        let (r, p) = report_once(&api, "node-1", &source, &wait, &status)
            .await
            .unwrap();
        assert_eq!(r, Reported::Written);
        assert_eq!(p.report_interval, Duration::from_secs(90));
        assert_eq!(status.reports("conflict"), 1);
        assert_eq!(status.reports("written"), 2);
        assert_eq!(fake.status_writes().len(), 2);
        // the spec as stored is kept
        assert_eq!(
            fake.get(NODEMETRICS, "node-1").unwrap()["spec"]["metricCollectPolicy"]
                ["reportIntervalSeconds"],
            90
        );
        // no figures (metrics off or stale): no write
        let (r, _) = report_once(&api, "node-1", &Table(None), &wait, &status)
            .await
            .unwrap();
        assert_eq!(r, Reported::NoFigures);
        assert_eq!(fake.status_writes().len(), 2);
        // no NodeMetric resource at all (the CRDs not installed): nothing
        // created, nothing written
        fake.unserve(NODEMETRICS);
        let (r, _) = report_once(&api, "node-1", &source, &create, &status)
            .await
            .unwrap();
        assert_eq!(r, Reported::NoResource);
        assert_eq!(fake.status_writes().len(), 2);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// The reporter writes once per interval (jitter under 10 %) and never
    /// between, and survives the API server failing.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_reporter_writes_at_the_interval_and_not_between() {
        let fake = FakeApiServer::start().await;
        let dir = std::env::temp_dir().join(format!("qoslet-kube-nm2-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let client = client_of(&fake, &dir).await;
        fake.apply(NODEMETRICS, nodemetric(json!({})));
        let status = Arc::new(ClusterStatus::default());
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let every = Duration::from_millis(1000);
        let task = tokio::spawn(report(
            client,
            "node-1".into(),
            Arc::new(Table(Some(figures()))),
            ReportSettings {
                create: false,
                interval: Some(every),
            },
            status.clone(),
            stopped,
        ));
        tokio::time::sleep(Duration::from_millis(4_600)).await;
        let writes = fake.status_writes();
        assert!(
            (3..=4).contains(&writes.len()),
            "{} writes in 4.6 s at 1 s",
            writes.len()
        );
        for w in writes.windows(2) {
            let gap = w[1].0 - w[0].0;
            assert!(
                gap >= Duration::from_millis(950) && gap <= Duration::from_millis(1_250),
                "{gap:?}"
            );
        }
        // the API server failing: counted, retried, and writing resumes
        fake.fail_next(2, 500);
        tokio::time::sleep(Duration::from_millis(3_500)).await;
        assert!(status.reports("failed") >= 1);
        let n = fake.status_writes().len();
        assert!(n > writes.len(), "no write after the failures");
        stop.send(true).unwrap();
        let _ = tokio::time::timeout(Duration::from_secs(5), task).await;
        let _ = std::fs::remove_dir_all(&dir);
    }
}

mod crds {
    use super::*;

    /// The committed CRDs are what `qoslet crd` prints now (regenerate:
    /// `qoslet crd > deploy/kubernetes/crds/koordinator-slo.yaml`).
    #[test]
    fn the_committed_crds_are_current() {
        let want = crate::crd::crds_yaml();
        let have = include_str!("../../deploy/kubernetes/crds/koordinator-slo.yaml");
        if have != want {
            let _ = std::fs::write(std::env::temp_dir().join("qoslet-crds.yaml"), &want);
            panic!("deploy/kubernetes/crds/koordinator-slo.yaml is stale: `qoslet crd` prints otherwise (written to $TMPDIR/qoslet-crds.yaml)");
        }
    }

    /// Koordinator's objects are accepted by the types: the default NodeSLO,
    /// the status example of KUBE.md, and the status qoslet's reporter writes.
    #[test]
    fn koordinators_objects_fit_the_types() {
        let slo = nodeslo("node-1", 65);
        let o: crate::crd::NodeSLO = serde_json::from_value(slo).unwrap();
        assert!(o.spec.resource_qos_strategy.is_some());
        let example = json!({"updateTime":"2026-07-24T06:52:45Z",
         "nodeMetric":{"nodeUsage":{"resources":{"cpu":"2350m","memory":"10Gi"}},
           "aggregatedNodeUsages":[{"usage":{"avg":{"resources":{"cpu":"2","memory":"9Gi"}},"p50":{"resources":{}},
              "p90":{"resources":{}},"p95":{"resources":{}},"p99":{"resources":{}}},"duration":"5m0s"}],
           "systemUsage":{"resources":{"cpu":"300m","memory":"1Gi"}},
           "aggregatedSystemUsages":[{"usage":{"avg":{"resources":{}}},"duration":"5m0s"}]},
         "podsMetric":[{"name":"web-0","namespace":"default","podUsage":{"resources":{"cpu":"500m","memory":"512Mi"}},
           "priority":"koord-prod","qos":"LS"}],
         "hostApplicationMetric":[{"name":"nginx","usage":{"resources":{}},"priority":"koord-prod","qos":"LS"}],
         "prodReclaimableMetric":{"resource":{"resources":{"cpu":"1","memory":"2Gi"}}}});
        let s: crate::crd::NodeMetricStatus = serde_json::from_value(example).unwrap();
        assert_eq!(s.pods_metric[0].qos.as_deref(), Some("LS"));
        // what the reporter writes fits Koordinator's status exactly: read
        // into the types and written again, nothing lost or added
        let mut c = crate::nodemetric::Collected::default();
        c.pods.push(crate::nodemetric::PodUsage {
            namespace: "a".into(),
            name: "b".into(),
            usage: Default::default(),
            priority: Some("koord-batch"),
            qos: Some("BE"),
        });
        c.node_aggregated
            .push((Duration::from_secs(300), [Some(Default::default()); 5]));
        let written = crate::nodemetric::status_json(&c, "2026-12-04T10:00:00Z");
        let s: crate::crd::NodeMetricStatus = serde_json::from_value(written.clone()).unwrap();
        assert_eq!(serde_json::to_value(&s).unwrap(), written);
        // the CRDs: cluster-scoped, the status subresource, served and stored v1alpha1
        use kube::CustomResourceExt;
        for crd in [crate::crd::NodeSLO::crd(), crate::crd::NodeMetric::crd()] {
            assert_eq!(crd.spec.scope, "Cluster");
            assert_eq!(crd.spec.group, "slo.koordinator.sh");
            let v = &crd.spec.versions[0];
            assert!(v.served && v.storage && v.subresources.as_ref().unwrap().status.is_some());
        }
    }
}

/// Issue 31: kubelet's reserved CPU from this node's Node (capacity −
/// allocatable) reaches the QoS engine's setting when the file has none;
/// the file's value wins; a change is followed, a deletion withdraws it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_nodes_allocatable_is_the_engines_reserved_cpu() {
    use qoslet_qos_engine::runner::Reserved;
    let node: Value = serde_json::from_str(include_str!("../tests/fixtures/node.json")).unwrap();
    let n: crate::view::NodeView = serde_json::from_value(node.clone()).unwrap();
    assert_eq!(crate::node::reserved_cores(&n), Some(0.5));
    // the file's value wins
    let fixed = Reserved::from_file(Some(1.5));
    fixed.set_cluster(Some(0.5));
    assert_eq!(fixed.cores(), 1.5);

    let fake = FakeApiServer::start().await;
    let dir = std::env::temp_dir().join(format!("qoslet-kube-node-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let client = client_of(&fake, &dir).await;
    let mut other = node.clone();
    other["metadata"]["name"] = json!("node-2");
    other["status"]["allocatable"]["cpu"] = json!("1");
    fake.apply("/api/v1/nodes", other);
    fake.apply("/api/v1/nodes", node.clone());
    let reserved = Reserved::from_file(None);
    assert_eq!(reserved.cores(), 0.0);
    let status = std::sync::Arc::new(crate::status::ClusterStatus::default());
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let task = tokio::spawn(crate::node::follow(
        client,
        "node-1".into(),
        reserved.clone(),
        status.clone(),
        stopped,
    ));
    let s = Duration::from_secs(10);
    until("the Node's reserved CPU", s, || reserved.cores() == 0.5).await;
    let mut changed = node.clone();
    changed["status"]["allocatable"]["cpu"] = json!("2750m");
    fake.apply("/api/v1/nodes", changed);
    until("the change", s, || reserved.cores() == 1.25).await;
    fake.delete("/api/v1/nodes", "node-1");
    until("withdrawn", s, || reserved.cores() == 0.0).await;
    assert_eq!(status.state(crate::status::WatchName::Node), "ok");
    stop.send(true).unwrap();
    let _ = tokio::time::timeout(Duration::from_secs(5), task).await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 31: the API server gone for a minute and back, with every
/// cluster-side follower running: while it is gone, each watch says stale,
/// the last NodeSLO, pods, reserved CPU stay in force and NodeMetric writes
/// fail (counted); once it is back, all are ok again, status writes resume
/// and a NodeSLO changed meanwhile is followed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_server_gone_for_a_minute_and_back() {
    use crate::status::WatchName;
    use std::sync::Arc;
    let fake = FakeApiServer::start().await;
    let dir = std::env::temp_dir().join(format!("qoslet-kube-minute-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let client = client_of(&fake, &dir).await;
    fake.apply(NODESLOS, nodeslo("node-1", 30));
    let web = fake.apply(PODS, fixture("burstable"));
    let web_uid = web["metadata"]["uid"].as_str().unwrap().to_string();
    let node: Value = serde_json::from_str(include_str!("../tests/fixtures/node.json")).unwrap();
    fake.apply("/api/v1/nodes", node);
    fake.apply(
        "/apis/slo.koordinator.sh/v1alpha1/nodemetrics",
        json!({"apiVersion": "slo.koordinator.sh/v1alpha1", "kind": "NodeMetric",
               "metadata": {"name": "node-1"}, "spec": {}}),
    );
    let hub = PolicyHub::new(None);
    let store = qoslet_state::Store::new();
    let reserved = qoslet_qos_engine::runner::Reserved::from_file(None);
    let status = Arc::new(crate::status::ClusterStatus::default());
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let tasks = vec![
        tokio::spawn(crate::nodeslo::follow(
            client.clone(),
            "node-1".into(),
            hub.clone(),
            stopped.clone(),
        )),
        tokio::spawn(crate::pods::follow(
            client.clone(),
            "node-1".into(),
            store.clone(),
            status.clone(),
            stopped.clone(),
        )),
        tokio::spawn(crate::node::follow(
            client.clone(),
            "node-1".into(),
            reserved.clone(),
            status.clone(),
            stopped.clone(),
        )),
        tokio::spawn(crate::nodemetric::report(
            client,
            "node-1".into(),
            Arc::new(nodemetric::Table(Some(nodemetric::figures()))),
            crate::nodemetric::ReportSettings {
                create: false,
                interval: Some(Duration::from_secs(2)),
            },
            status.clone(),
            stopped,
        )),
    ];
    let s = Duration::from_secs(10);
    until("everything followed", s, || {
        suppress(&hub) == (30, "cluster")
            && store.cluster_pod(&web_uid).is_some()
            && reserved.cores() == 0.5
            && !fake.status_writes().is_empty()
    })
    .await;
    fake.go_down();
    let gone = Instant::now();
    until("stale while gone", Duration::from_secs(40), || {
        state(&hub) == "stale"
            && status.state(WatchName::Pods) == "stale"
            && status.state(WatchName::Node) == "stale"
            && status.reports("failed") >= 1
    })
    .await;
    // the last good view in force
    assert_eq!(suppress(&hub), (30, "cluster"));
    assert!(store.cluster_pod(&web_uid).is_some());
    assert_eq!(reserved.cores(), 0.5);
    let writes = fake.status_writes().len();
    tokio::time::sleep(Duration::from_secs(60).saturating_sub(gone.elapsed())).await;
    // changed while the API server was away (etcd keeps it)
    fake.apply(NODESLOS, nodeslo("node-1", 22));
    fake.come_back().await;
    until("all back", Duration::from_secs(60), || {
        suppress(&hub) == (22, "cluster")
            && state(&hub) == "ok"
            && status.state(WatchName::Pods) == "ok"
            && status.state(WatchName::Node) == "ok"
            && fake.status_writes().len() > writes
    })
    .await;
    stop.send(true).unwrap();
    for t in tasks {
        let _ = tokio::time::timeout(Duration::from_secs(5), t).await;
    }
    let _ = std::fs::remove_dir_all(&dir);
}
