//! The cluster side against the in-process fake API server (real HTTP/JSON
//! list and watch), with Koordinator's own default NodeSLO as the fixture.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::KubernetesConfig;
use qoslet_agent::hub::PolicyHub;
use qoslet_kube_fake::FakeApiServer;

const NODESLOS: &str = "/apis/slo.koordinator.sh/v1alpha1/nodeslos";

/// Koordinator's default NodeSLO (as its slo-controller writes it), for
/// `node`, with `cpuSuppressThresholdPercent` set to `pct`.
fn nodeslo(node: &str, pct: i64) -> Value {
    let mut o: Value = serde_json::from_str(include_str!(
        "../../../hooks/tests/fixtures/koordinator-default-nodeslo.json"
    ))
    .unwrap();
    o["metadata"] = json!({"name": node});
    o["spec"]["resourceUsedThresholdWithBE"]["cpuSuppressThresholdPercent"] = json!(pct);
    o
}

/// A fake API server, a scratch dir of the test's (`qoslet-kube-<tag>-<pid>`,
/// the test removes it) and a client of that server through a kubeconfig.
async fn fake_with_client(
    tag: &str,
) -> (
    std::sync::Arc<FakeApiServer>,
    std::path::PathBuf,
    kube::Client,
) {
    let fake = FakeApiServer::start().await;
    let dir = std::env::temp_dir().join(format!("qoslet-kube-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let kc = dir.join("kubeconfig");
    std::fs::write(&kc, fake.kubeconfig()).unwrap();
    let client = KubernetesConfig {
        enable: true,
        kubeconfig: Some(kc),
        node_name: Some("node-1".into()),
        ..Default::default()
    }
    .client()
    .await
    .unwrap();
    (fake, dir, client)
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

mod advertise;
mod crds;
mod evict;
mod node;
mod nodemetric;
mod nodeslo;
mod pods;

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
    // Koordinator's ConfigMap is read only where asked: named, or batch resources on
    use crate::advertise::BatchMode;
    assert_eq!(k.slo_config(BatchMode::Off), None);
    assert_eq!(k.slo_config(BatchMode::Auto), Some(Default::default()));
    let named: KubernetesConfig =
        serde_json::from_str(r#"{"sloConfig": "kube-system/slo"}"#).unwrap();
    let at = named.slo_config(BatchMode::Off).unwrap();
    assert_eq!(
        (at.namespace.as_str(), at.name.as_str()),
        ("kube-system", "slo")
    );
}

const PODS: &str = "/api/v1/pods";

fn fixture(name: &str) -> Value {
    let text = match name {
        "burstable" => include_str!("../../tests/fixtures/pod-burstable.json"),
        _ => include_str!("../../tests/fixtures/pod-daemonset-besteffort.json"),
    };
    serde_json::from_str(text).unwrap()
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
    let (fake, dir, client) = fake_with_client("minute").await;
    fake.apply(NODESLOS, nodeslo("node-1", 30));
    let web = fake.apply(PODS, fixture("burstable"));
    let web_uid = web["metadata"]["uid"].as_str().unwrap().to_string();
    let node: Value = serde_json::from_str(include_str!("../../tests/fixtures/node.json")).unwrap();
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
            tokio::sync::watch::channel(None).0,
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
                write: true,
                figures: None,
                colocation: None,
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

mod sloconfig;
