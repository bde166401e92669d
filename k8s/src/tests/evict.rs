//! Evictions through the Eviction API.

use super::*;

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
    let (fake, dir, client) = fake_with_client("evict").await;
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
