//! This node's NodeSLO as the policy hub's cluster source.

use super::*;

/// Issue 31: a NodeSLO changed mid-run reaches the policy hub; one that
/// fails validation is refused whole (the last good stays, the source says
/// invalid); a watch that ends, a 410 (compacted history) and injected 5xx
/// are recovered from; the API server gone makes the source stale with the
/// last good policy in force, and its return resumes; the NodeSLO deleted
/// puts the file's policy back. Other nodes' NodeSLOs are never seen.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nodeslo_drives_the_policy_through_every_api_server_mishap() {
    let (fake, dir, client) = fake_with_client("nodeslo").await;
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
