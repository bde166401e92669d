//! The ConfigMap's policy keys merged as koord-manager merges them, with
//! cases of Koordinator's own `resource_strategy_test.go` as data.

use std::collections::BTreeMap;

use serde_json::json;

use crate::slo::{merge, node_spec, overlay, spec_of_data, Merged, KEYS};

fn key(name: &str) -> &'static crate::slo::Key {
    KEYS.iter().find(|k| k.name == name).unwrap()
}

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// `Test_calculateResourceThresholdCfgMerged`: a missing key is the
/// defaults, bad JSON an error (the last good value stays), the cluster
/// strategy over the defaults, each node entry over the merged cluster.
#[test]
fn threshold_config_merged_as_koordinators_table() {
    let k = key("resource-threshold-config");
    let defaults = json!({"enable": false, "cpuSuppressThresholdPercent": 65, "cpuSuppressPolicy": "cpuset",
        "memoryEvictThresholdPercent": 70, "cpuEvictPolicy": "evictByRealLimit"});
    // config contents is empty, then use default
    assert_eq!(
        merge(k, None).unwrap(),
        Merged {
            cluster: defaults.clone(),
            nodes: vec![],
            dropped: vec![]
        }
    );
    // throw error for configmap unmarshal failed (also "": only absent is the defaults)
    assert!(merge(k, Some("invalid_content")).is_err());
    assert!(merge(k, Some("")).is_err());
    // only cluster config
    let m = merge(
        k,
        Some(r#"{"clusterStrategy": {"enable": true, "cpuSuppressThresholdPercent": 60}}"#),
    )
    .unwrap();
    let mut cluster = defaults.clone();
    cluster["enable"] = json!(true);
    cluster["cpuSuppressThresholdPercent"] = json!(60);
    assert_eq!(m.cluster, cluster);
    // node config: each entry the merged cluster strategy with its own fields
    let m = merge(
        k,
        Some(
            r#"{"clusterStrategy": {"enable": true, "cpuSuppressThresholdPercent": 60},
            "nodeStrategies": [
              {"nodeSelector": {"matchLabels": {"xxx": "yyy"}}, "cpuSuppressThresholdPercent": 40},
              {"nodeSelector": {"matchLabels": {"zzz": "zzz"}}, "cpuSuppressThresholdPercent": 50}]}"#,
        ),
    )
    .unwrap();
    assert_eq!(m.nodes.len(), 2);
    let mut n0 = cluster.clone();
    n0["cpuSuppressThresholdPercent"] = json!(40);
    let mut n1 = cluster.clone();
    n1["cpuSuppressThresholdPercent"] = json!(50);
    assert_eq!((&m.nodes[0].value, &m.nodes[1].value), (&n0, &n1));
    // getResourceThresholdSpec: node empty, use cluster config; get node config correctly
    assert_eq!(m.for_node(&labels(&[])).value, cluster);
    assert_eq!(m.for_node(&labels(&[("zzz", "zzz")])).value, n1);
    let f = m.for_node(&labels(&[("xxx", "yyy"), ("zzz", "zzz")]));
    assert_eq!(f.value, n0, "the first match wins");
}

/// `Test_getResourceQOSSpec` "get firstly-matched node config", and the
/// overlay's rules: maps merge by key, slices replace, null keeps the base.
#[test]
fn resource_qos_first_match_wins_maps_merge_slices_replace() {
    let k = key("resource-qos-config");
    let m = merge(
        k,
        Some(
            r#"{"clusterStrategy": {"beClass": {"cpuQOS": {"enable": true, "groupIdentity": -1},
                  "blkioQOS": {"enable": true, "blocks": [{"name": "/dev/sda", "type": "device"}, {"name": "/dev/sdb", "type": "device"}]}}},
                "nodeStrategies": [
                  {"name": "a", "nodeSelector": {"matchLabels": {"pool": "batch"}},
                   "beClass": {"cpuQOS": {"enable": false, "groupIdentity": null},
                               "blkioQOS": {"blocks": [{"name": "/dev/nvme0n1", "type": "device"}]}}},
                  {"name": "b", "nodeSelector": {"matchExpressions": [{"key": "pool", "operator": "Exists"}]},
                   "beClass": {"cpuQOS": {"enable": true}}}]}"#,
        ),
    )
    .unwrap();
    let f = m.for_node(&labels(&[("pool", "batch")]));
    assert_eq!(f.matched.as_deref(), Some("a"));
    assert_eq!(
        f.value,
        json!({"beClass": {"cpuQOS": {"enable": false, "groupIdentity": -1},
            "blkioQOS": {"enable": true, "blocks": [{"name": "/dev/nvme0n1", "type": "device"}]}}})
    );
    assert_eq!(
        m.for_node(&labels(&[("pool", "online")]))
            .matched
            .as_deref(),
        Some("b")
    );
    let f = m.for_node(&labels(&[]));
    assert_eq!((f.matched, f.value), (None, m.cluster.clone()));
}

/// The cases Go's decoder refuses whole (the last good value stays), an
/// entry with no selector (matches no node), a malformed selector (skipped).
#[test]
fn wrong_shapes_are_errors_and_bad_selectors_are_skipped() {
    let k = key("cpu-burst-config");
    for bad in [
        "[]",
        r#"{"clusterStrategy": []}"#,
        r#"{"nodeStrategies": {}}"#,
        r#"{"nodeStrategies": [1]}"#,
        r#"{"nodeStrategies": [{"name": 3}]}"#,
        r#"{"nodeStrategies": [{"nodeSelector": "pool=batch"}]}"#,
    ] {
        assert!(merge(k, Some(bad)).is_err(), "{bad}");
    }
    let m = merge(
        k,
        Some(
            r#"{"clusterStrategy": {"policy": "auto"}, "nodeStrategies": [
                {"name": "none", "policy": "cpuBurstOnly"},
                {"name": "bad", "nodeSelector": {"matchExpressions": [{"key": "pool", "operator": "In"}]}, "policy": "cfsQuotaBurstOnly"},
                {"name": "all", "nodeSelector": {}, "cpuBurstPercent": 500}]}"#,
        ),
    )
    .unwrap();
    assert_eq!(m.cluster["policy"], "auto");
    assert_eq!(m.cluster["sharePoolThresholdPercent"], 50, "defaults under");
    let f = m.for_node(&labels(&[("pool", "x")]));
    assert_eq!(
        f.matched.as_deref(),
        Some("all"),
        "an empty selector matches every node"
    );
    assert_eq!(f.value["policy"], "auto");
    assert_eq!(f.value["cpuBurstPercent"], 500);
    assert_eq!(f.notes.len(), 1, "{:?}", f.notes);
    // a repeated key takes its last value, as Go's decoder
    let m = merge(
        k,
        Some(r#"{"clusterStrategy": {"policy": "auto", "policy": "none"}}"#),
    )
    .unwrap();
    assert_eq!(m.cluster["policy"], "none");
}

/// host-application-config: a matching entry's applications replace the
/// cluster's list; system-config's defaults.
#[test]
fn host_applications_replace_and_the_whole_spec() {
    let data: BTreeMap<String, String> = [
        (
            "host-application-config".to_string(),
            r#"{"applications": [{"name": "nginx", "priority": "koord-prod", "qos": "LS"}],
                "nodeConfigs": [{"name": "gw", "nodeSelector": {"matchLabels": {"role": "gw"}},
                                 "applications": [{"name": "envoy", "qos": "LS"}]}]}"#
                .to_string(),
        ),
        (
            "resource-threshold-config".to_string(),
            r#"{"clusterStrategy": {"enable": true}}"#.to_string(),
        ),
    ]
    .into();
    let spec = spec_of_data(&data, &labels(&[("role", "gw")])).unwrap();
    assert_eq!(
        spec["hostApplications"],
        json!([{"name": "envoy", "qos": "LS"}])
    );
    assert_eq!(spec["resourceUsedThresholdWithBE"]["enable"], true);
    assert_eq!(
        spec["resourceUsedThresholdWithBE"]["cpuSuppressThresholdPercent"],
        65
    );
    assert_eq!(
        spec["systemStrategy"],
        json!({"totalNetworkBandwidth": "0"})
    );
    assert_eq!(spec["resourceQOSStrategy"], json!({}));
    assert_eq!(spec["cpuBurstStrategy"]["policy"], "none");
    let spec = spec_of_data(&data, &labels(&[])).unwrap();
    assert_eq!(spec["hostApplications"][0]["name"], "nginx");
    let mut bad = data.clone();
    bad.insert("system-config".into(), "{".into());
    let e = spec_of_data(&bad, &labels(&[])).unwrap_err();
    assert!(e.starts_with("system-config: "), "{e}");
}

/// Koordinator's e2e sample ConfigMap's data
/// (`tests/fixtures/slo-controller-config.yaml`): its threshold key gives the
/// spec koord-manager would write; the colocation key is not a policy key.
#[test]
fn koordinators_sample_configmap() {
    let data: BTreeMap<String, String> = [
        (
            "colocation-config".to_string(),
            r#"{"enable": true}"#.to_string(),
        ),
        (
            "resource-threshold-config".to_string(),
            "{\n  \"clusterStrategy\": {\n    \"enable\": false\n  }\n}\n".to_string(),
        ),
    ]
    .into();
    assert!(crate::slo::has_policy_keys(&data));
    let merged: Vec<Merged> = KEYS
        .iter()
        .map(|k| merge(k, data.get(k.name).map(String::as_str)).unwrap())
        .collect();
    let (spec, notes) = node_spec(&merged.try_into().unwrap(), &labels(&[("pool", "batch")]));
    assert!(notes.is_empty(), "{notes:?}");
    assert_eq!(spec["resourceUsedThresholdWithBE"]["enable"], false);
    assert_eq!(
        spec["resourceUsedThresholdWithBE"]["memoryEvictThresholdPercent"],
        70
    );
    let only_colocation: BTreeMap<String, String> =
        [("colocation-config".to_string(), "{}".to_string())].into();
    assert!(!crate::slo::has_policy_keys(&only_colocation));
}

#[test]
fn overlay_is_mergecfg() {
    let mut b = json!({"a": 1, "m": {"x": 1, "y": 2}, "s": [1, 2], "keep": true});
    overlay(
        &mut b,
        &json!({"a": 2, "m": {"y": 3, "z": null}, "s": [3], "keep": null, "new": "n"}),
    );
    assert_eq!(
        b,
        json!({"a": 2, "m": {"x": 1, "y": 3}, "s": [3], "keep": true, "new": "n"})
    );
}

/// Go's decoder under koord-manager's merge: keys in any letter case, fields
/// no type defines dropped, `""` keeping the value under it (`omitempty`),
/// list elements merged by index (the review's cases).
#[test]
fn go_decoding_rules() {
    let k = key("resource-threshold-config");
    let m = merge(
        k,
        Some(
            r#"{"ClusterStrategy": {"Enable": true, "cpuSuppressPolicy": "cfsQuota", "fromTheFuture": 1},
                "NodeStrategies": [{"Name": "a", "NodeSelector": {"matchLabels": {"pool": "batch"}},
                                    "cpuSuppressPolicy": "", "CPUSUPPRESSTHRESHOLDPERCENT": 30}]}"#,
        ),
    )
    .unwrap();
    assert_eq!(m.cluster["enable"], true);
    assert_eq!(m.cluster["cpuSuppressPolicy"], "cfsQuota");
    assert!(m.cluster.get("fromTheFuture").is_none());
    assert_eq!(m.dropped, ["resourceUsedThresholdWithBE.fromTheFuture"]);
    let f = m.for_node(&labels(&[("pool", "batch")]));
    assert_eq!(f.matched.as_deref(), Some("a"));
    assert_eq!(
        f.value["cpuSuppressPolicy"], "cfsQuota",
        "\"\" keeps the cluster's"
    );
    assert_eq!(f.value["cpuSuppressThresholdPercent"], 30);
    // blkio blocks: the node's first block merged over the cluster's first
    let m = merge(
        key("resource-qos-config"),
        Some(
            r#"{"clusterStrategy": {"beClass": {"blkioQOS": {"enable": true, "blocks": [
                   {"name": "/dev/sda", "type": "device", "ioCfg": {"readIOPS": 1000}},
                   {"name": "/dev/sdb", "type": "device"}]}}},
                "nodeStrategies": [{"nodeSelector": {}, "beClass": {"blkioQOS": {"blocks": [
                   {"name": "/dev/sdc", "ioCfg": {"readBPS": 1048576}}]}}}]}"#,
        ),
    )
    .unwrap();
    assert_eq!(
        m.nodes[0].value["beClass"]["blkioQOS"]["blocks"],
        json!([{"name": "/dev/sdc", "type": "device", "ioCfg": {"readIOPS": 1000, "readBPS": 1048576}}])
    );
}
