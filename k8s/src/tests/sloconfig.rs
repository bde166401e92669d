//! Koordinator's `slo-controller-config` as the policy hub's `configmap`
//! source: the manager's merge for this node's labels, a bad key keeping
//! its last good value with a Warning Event naming it, a NodeSLO above it,
//! the file below it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};

use super::{fake_with_client, nodeslo, suppress, until, NODESLOS};
use crate::sloconfig::{PolicyKeys, SloConfig};
use qoslet_agent::hub::PolicyHub;

const CONFIGMAPS: &str = "/api/v1/namespaces/koordinator-system/configmaps";
const NODES: &str = "/api/v1/nodes";

fn configmap(data: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap",
           "metadata": {"name": "slo-controller-config", "namespace": "koordinator-system"},
           "data": data})
}

/// A threshold key: 40 for the cluster, 30 for `pool=batch` nodes.
fn thresholds(cluster: i64) -> String {
    json!({"clusterStrategy": {"enable": true, "cpuSuppressThresholdPercent": cluster},
           "nodeStrategies": [{"name": "batch", "nodeSelector": {"matchLabels": {"pool": "batch"}},
                               "cpuSuppressThresholdPercent": 30}]})
    .to_string()
}

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// The keys read, each bad one refused alone (bad JSON, or a value of the
/// wrong type for its NodeSLO field) keeping its last good value; a
/// ConfigMap without policy keys is no policy.
#[test]
fn each_key_keeps_its_last_good_value() {
    let mut k = PolicyKeys::default();
    let data = |t: &str, burst: &str| -> BTreeMap<String, String> {
        [
            ("resource-threshold-config".to_string(), t.to_string()),
            ("cpu-burst-config".to_string(), burst.to_string()),
        ]
        .into()
    };
    let burst = r#"{"clusterStrategy": {"policy": "auto"}}"#;
    let r = k.read(&data(&thresholds(40), burst), &labels(&[("pool", "batch")]));
    assert!(r.refused.is_empty());
    let p = r.policy.unwrap().unwrap();
    assert_eq!(
        p.resource_used_threshold_with_be
            .cpu_suppress_threshold_percent,
        30
    );
    assert_eq!(
        p.cpu_burst_strategy.policy,
        qoslet_qos_engine::burst::BurstPolicy::Auto
    );
    // bad JSON in one key, a wrong type in the other: both keep their last good
    let r = k.read(
        &data("{", r#"{"clusterStrategy": {"policy": "sometimes"}}"#),
        &labels(&[]),
    );
    let refused: Vec<&str> = r.refused.iter().map(|(key, _)| *key).collect();
    assert_eq!(refused, ["resource-threshold-config", "cpu-burst-config"]);
    let p = r.policy.unwrap().unwrap();
    assert_eq!(
        p.resource_used_threshold_with_be
            .cpu_suppress_threshold_percent,
        40,
        "the last good key, for this node's labels"
    );
    assert_eq!(
        p.cpu_burst_strategy.policy,
        qoslet_qos_engine::burst::BurstPolicy::Auto
    );
    // the same errors again: no new refusal (one Event per distinct error)
    let r = k.read(
        &data("{", r#"{"clusterStrategy": {"policy": "sometimes"}}"#),
        &labels(&[]),
    );
    assert!(r.refused.is_empty());
    // a bad value in an entry this node does not match refuses the key
    // too (Go's decoder fails the key on any entry): the last good stays
    let entry_bad = json!({"clusterStrategy": {"enable": true, "cpuSuppressThresholdPercent": 50},
        "nodeStrategies": [{"nodeSelector": {"matchLabels": {"pool": "gpu"}}, "cpuSuppressThresholdPercent": "x"}]})
    .to_string();
    let r = k.read(&data(&entry_bad, burst), &labels(&[]));
    assert_eq!(r.refused.len(), 1, "{:?}", r.refused);
    assert!(r.refused[0].1.contains("node entry"), "{:?}", r.refused);
    let p = r.policy.unwrap().unwrap();
    assert_eq!(
        p.resource_used_threshold_with_be
            .cpu_suppress_threshold_percent,
        40
    );
    // a key present but never good: the policy is refused (not Koordinator's
    // defaults in force over the file), until it is good
    let mut fresh = PolicyKeys::default();
    let r = fresh.read(&data("{", burst), &labels(&[]));
    let e = r.policy.unwrap().unwrap_err();
    assert!(
        e.contains("resource-threshold-config") && e.contains("no good value read yet"),
        "{e}"
    );
    let r = fresh.read(&data(&thresholds(45), burst), &labels(&[]));
    let p = r.policy.unwrap().unwrap();
    assert_eq!(
        p.resource_used_threshold_with_be
            .cpu_suppress_threshold_percent,
        45
    );
    // only colocation-config: not a policy source
    let only: BTreeMap<String, String> =
        [("colocation-config".to_string(), "{}".to_string())].into();
    assert!(fresh.read(&only, &labels(&[])).policy.is_none());
}

/// Against the fake API server: the ConfigMap's policy for this node's
/// labels is in force over the file's; a label change picks another entry; a
/// bad key keeps its last good value with one Warning Event naming the key;
/// a NodeSLO is above it; a ConfigMap without policy keys hands back to the file.
#[tokio::test]
async fn the_configmap_is_a_policy_source_between_the_file_and_the_nodeslo() {
    let (fake, dir, client) = fake_with_client("sloconfig-policy").await;
    fake.apply(
        NODES,
        json!({"apiVersion": "v1", "kind": "Node",
               "metadata": {"name": "node-1", "labels": {"pool": "batch"}}, "status": {}}),
    );
    fake.apply(
        CONFIGMAPS,
        configmap(json!({"resource-threshold-config": thresholds(40)})),
    );
    let file = qoslet_qos_engine::source::PolicyConfig::try_from(
        json!({"resourceUsedThresholdWithBE": {"cpuSuppressThresholdPercent": 50}}),
    )
    .unwrap();
    let hub = PolicyHub::new(Some(file));
    assert_eq!(suppress(&hub), (50, "file"));
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let (node_cache, node_view) = tokio::sync::watch::channel(None);
    let (colocation, _colocation_rx) = tokio::sync::watch::channel(SloConfig::Unknown);
    let status = Arc::new(crate::status::ClusterStatus::default());
    let tasks = vec![
        tokio::spawn(crate::node::follow(
            client.clone(),
            "node-1".into(),
            qoslet_qos_engine::runner::Reserved::from_file(None),
            node_cache,
            status.clone(),
            stopped.clone(),
        )),
        tokio::spawn(crate::sloconfig::follow(
            client.clone(),
            "node-1".into(),
            Default::default(),
            colocation,
            hub.clone(),
            node_view,
            stopped.clone(),
        )),
        tokio::spawn(crate::nodeslo::follow(
            client.clone(),
            "node-1".into(),
            hub.clone(),
            stopped.clone(),
        )),
    ];
    let s = Duration::from_secs(10);
    until("the pool=batch entry in force", s, || {
        suppress(&hub) == (30, "configmap")
    })
    .await;
    // the node leaves the pool: the cluster strategy
    fake.apply(
        NODES,
        json!({"apiVersion": "v1", "kind": "Node",
               "metadata": {"name": "node-1", "labels": {"pool": "online"}}, "status": {}}),
    );
    until("the cluster strategy", s, || {
        suppress(&hub) == (40, "configmap")
    })
    .await;
    // a bad key: the last good stays, one Warning Event names it
    fake.apply(
        CONFIGMAPS,
        configmap(json!({"resource-threshold-config": "{\"clusterStrategy\": {"})),
    );
    until("the Warning Event naming the key", s, || {
        fake.list("/api/v1/events").iter().any(|e| {
            e["reason"] == "SLOCfgUnmarshalFailed"
                && e["involvedObject"]["kind"] == "ConfigMap"
                && e["metadata"]["name"]
                    .as_str()
                    .is_some_and(|n| n.ends_with(".resource-threshold-config"))
                && e["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("resource-threshold-config"))
        })
    })
    .await;
    assert_eq!(suppress(&hub), (40, "configmap"));
    // a NodeSLO is above the ConfigMap; deleted, the ConfigMap is back
    fake.apply(NODESLOS, nodeslo("node-1", 22));
    until("the NodeSLO", s, || suppress(&hub) == (22, "cluster")).await;
    fake.delete(NODESLOS, "node-1");
    until("the ConfigMap again", s, || {
        suppress(&hub) == (40, "configmap")
    })
    .await;
    // only colocation-config left: the file's policy
    fake.apply(
        CONFIGMAPS,
        configmap(json!({"colocation-config": "{\"enable\": true}"})),
    );
    until("the file again", s, || suppress(&hub) == (50, "file")).await;
    let _ = stop.send(true);
    for t in tasks {
        let _ = tokio::time::timeout(Duration::from_secs(5), t).await;
    }
    let _ = std::fs::remove_dir_all(dir);
}
