//! This node's Node: kubelet's reserved CPU.

use super::*;

/// Issue 31: kubelet's reserved CPU from this node's Node (capacity −
/// allocatable) reaches the QoS engine's setting when the file has none;
/// the file's value wins; a change is followed, a deletion withdraws it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_nodes_allocatable_is_the_engines_reserved_cpu() {
    use qoslet_qos_engine::runner::Reserved;
    let node: Value = serde_json::from_str(include_str!("../../tests/fixtures/node.json")).unwrap();
    let n: crate::view::NodeView = serde_json::from_value(node.clone()).unwrap();
    assert_eq!(crate::node::reserved_cores(&n), Some(0.5));
    // the file's value wins
    let fixed = Reserved::from_file(Some(1.5));
    fixed.set_cluster(Some(0.5));
    assert_eq!(fixed.cores(), 1.5);

    let (fake, dir, client) = fake_with_client("node").await;
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
        tokio::sync::watch::channel(None).0,
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
