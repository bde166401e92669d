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
    assert!(serde_json::from_str::<KubernetesConfig>(r#"{"enabel":true}"#).is_err());
}
