//! This node's pods: what qoslet keeps of each, from the API server's JSON.

use super::*;

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
    let (fake, dir, client) = fake_with_client("pods").await;
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
    // (the watch is marked ok just after the listing reaches the store)
    until("the listed pod in the store", s, || {
        store.cluster_pod(&web_uid).is_some()
            && status.state(crate::status::WatchName::Pods) == "ok"
    })
    .await;
    assert_eq!(
        store.cluster_pods(),
        1,
        "another node's pod is not this node's"
    );
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

/// Issue 46: a pod's batch resources in its spec become the annotation
/// Koordinator's webhook would write: only the two resources, only the
/// containers naming one (no init container, as the webhook), quantities as
/// written; a pod without them has none.
#[test]
fn batch_resources_of_the_spec_in_the_annotations_shape() {
    let p: crate::view::PodView = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "b", "namespace": "ns", "uid": "u-b"},
        "spec": {
            "initContainers": [{"name": "init", "resources": {"limits": {"kubernetes.io/batch-cpu": "9"}}}],
            "containers": [
                {"name": "work", "resources": {
                    "requests": {"kubernetes.io/batch-cpu": "500", "kubernetes.io/batch-memory": "64Mi", "example.com/foo": "1"},
                    "limits": {"kubernetes.io/batch-cpu": "1k", "kubernetes.io/batch-memory": "128Mi"}}},
                {"name": "side", "resources": {}},
                {"name": "mem", "resources": {"limits": {"kubernetes.io/batch-memory": "1Gi"}}}
            ]},
        "status": {"qosClass": "BestEffort"}
    }))
    .unwrap();
    let c = crate::pods::cluster_pod(&p).unwrap();
    let v: serde_json::Value = serde_json::from_str(c.batch.as_deref().unwrap()).unwrap();
    assert_eq!(
        v,
        serde_json::json!({"containers": {
            "work": {"requests": {"kubernetes.io/batch-cpu": "500", "kubernetes.io/batch-memory": "64Mi"},
                     "limits": {"kubernetes.io/batch-cpu": "1k", "kubernetes.io/batch-memory": "128Mi"}},
            "mem": {"limits": {"kubernetes.io/batch-memory": "1Gi"}}}})
    );
    // read as the annotation is read
    let parsed = qoslet_hooks::batch::parse_spec(c.batch.as_deref().unwrap()).unwrap();
    assert_eq!(parsed.containers["work"].cpu_limit_milli, Some(1000));
    assert_eq!(parsed.containers["mem"].memory_limit, Some(1 << 30));
    let p: crate::view::PodView = serde_json::from_value(fixture("burstable")).unwrap();
    assert_eq!(crate::pods::cluster_pod(&p).unwrap().batch, None);
}
