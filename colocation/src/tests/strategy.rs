//! The colocation-config's merge and per-node resolution, with
//! Koordinator's own cases (`sloconfig/colocation_config_test.go`) and its
//! sample ConfigMap's value as data.

use std::collections::BTreeMap;

use crate::strategy::*;

fn labels(l: &[(&str, &str)]) -> BTreeMap<String, String> {
    l.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

const NONE: &[(&str, &str)] = &[];

#[test]
fn koordinators_sample_value_merges_over_the_defaults() {
    // test/e2e/testing-manifests/slocontroller/slo-controller-config.yaml
    let c = ColocationConfig::parse(
        r#"{ "enable": true, "cpuReclaimThresholdPercent": 60, "memoryReclaimThresholdPercent": 65, "memoryCalculatePolicy": "usage" }"#,
    )
    .unwrap();
    let mut want = Strategy::defaults();
    want.enable = Some(true);
    assert_eq!(c.cluster, want);
    let r = c.resolve(&labels(NONE), &labels(NONE));
    assert!(r.enabled());
    assert_eq!(r.node_config, None);
}

#[test]
fn empty_is_the_defaults_and_off() {
    let c = ColocationConfig::parse("").unwrap();
    assert_eq!(c.cluster, Strategy::defaults());
    assert!(!c.resolve(&labels(NONE), &labels(NONE)).enabled());
}

#[test]
fn the_first_matching_node_config_wins() {
    // "get merged node strategy 2", plus a second entry that also matches
    let c = ColocationConfig::parse(
        r#"{"nodeConfigs": [
            {"name": "yyy", "nodeSelector": {"matchLabels": {"xxx": "yyy"}}, "enable": false},
            {"name": "zzz", "nodeSelector": {"matchLabels": {"xxx": "zzz"}}, "enable": true, "cpuReclaimThresholdPercent": 70},
            {"name": "any-zzz", "nodeSelector": {"matchExpressions": [{"key": "xxx", "operator": "Exists"}]}, "cpuReclaimThresholdPercent": 80}
        ], "enable": true}"#,
    )
    .unwrap();
    let r = c.resolve(&labels(&[("xxx", "zzz")]), &labels(NONE));
    assert_eq!(r.node_config.as_deref(), Some("zzz"));
    assert_eq!(r.strategy.cpu_reclaim_threshold_percent, Some(70));
    assert!(r.enabled());
    let r = c.resolve(&labels(&[("xxx", "yyy")]), &labels(NONE));
    assert!(!r.enabled(), "the node's entry turns it off");
    let r = c.resolve(&labels(&[("xxx", "other")]), &labels(NONE));
    assert_eq!(r.node_config.as_deref(), Some("any-zzz"));
    assert_eq!(r.strategy.cpu_reclaim_threshold_percent, Some(80));
    assert_eq!(c.resolve(&labels(NONE), &labels(NONE)).node_config, None);
}

#[test]
fn an_invalid_selector_is_skipped_and_no_selector_matches_nothing() {
    // "get merged node strategy and ignore invalid selector"
    let c = ColocationConfig::parse(
        r#"{"enable": true, "nodeConfigs": [
            {"name": "xxx-out-yyy", "nodeSelector": {"matchExpressions": [{"key": "xxx", "operator": "out", "values": ["yyy"]}]}, "enable": false},
            {"name": "no-selector", "enable": false},
            {"name": "in-nothing", "nodeSelector": {"matchExpressions": [{"key": "xxx", "operator": "In"}]}, "enable": false},
            {"name": "xxx-yyy", "nodeSelector": {"matchLabels": {"xxx": "yyy"}}, "cpuReclaimThresholdPercent": 50}
        ]}"#,
    )
    .unwrap();
    let r = c.resolve(&labels(&[("xxx", "yyy")]), &labels(NONE));
    assert_eq!(r.node_config.as_deref(), Some("xxx-yyy"));
    assert!(r.enabled());
    assert_eq!(
        r.notes.iter().filter(|n| n.contains("skipped")).count(),
        2,
        "{:?}",
        r.notes
    );
    // an empty selector matches every node
    let c = ColocationConfig::parse(
        r#"{"nodeConfigs": [{"name": "all", "nodeSelector": {}, "enable": true}]}"#,
    )
    .unwrap();
    assert_eq!(
        c.resolve(&labels(NONE), &labels(NONE))
            .node_config
            .as_deref(),
        Some("all")
    );
}

#[test]
fn a_node_entry_on_when_the_cluster_is_off_is_off() {
    let c = ColocationConfig::parse(
        r#"{"enable": false, "nodeConfigs": [{"name": "on", "nodeSelector": {"matchLabels": {"a": "b"}}, "enable": true}]}"#,
    )
    .unwrap();
    let r = c.resolve(&labels(&[("a", "b")]), &labels(NONE));
    assert!(r.strategy.enabled() && !r.enabled());
}

#[test]
fn node_labels_and_annotation() {
    // "get strategy merged with node ratios" / "... parse node reclaim ratios failed"
    let c = ColocationConfig::parse(
        r#"{"cpuReclaimThresholdPercent": 65, "memoryReclaimThresholdPercent": 65}"#,
    )
    .unwrap();
    let r = c.resolve(
        &labels(&[(CPU_RECLAIM_LABEL, "0.7"), (MEMORY_RECLAIM_LABEL, "0.75")]),
        &labels(NONE),
    );
    assert_eq!(
        (r.strategy.cpu_reclaim(), r.strategy.memory_reclaim()),
        (70, 75)
    );
    let r = c.resolve(
        &labels(&[
            (CPU_RECLAIM_LABEL, "-1"),
            (MEMORY_RECLAIM_LABEL, "invalidField"),
        ]),
        &labels(NONE),
    );
    assert_eq!(
        (r.strategy.cpu_reclaim(), r.strategy.memory_reclaim()),
        (65, 65)
    );
    // Go's int64(0.29 * 100) truncates to 28
    let r = c.resolve(&labels(&[(CPU_RECLAIM_LABEL, "0.29")]), &labels(NONE));
    assert_eq!(r.strategy.cpu_reclaim(), 28);
    // "get strategy merged with node strategy on annotations"; the labels apply after it
    let anno = labels(&[(
        STRATEGY_ANNOTATION,
        r#"{"enable": true, "cpuReclaimThresholdPercent": 80, "memoryCalculatePolicy": "request"}"#,
    )]);
    let r = c.resolve(&labels(&[(CPU_RECLAIM_LABEL, "0.5")]), &anno);
    assert_eq!(r.strategy.cpu_reclaim(), 50);
    assert_eq!(r.strategy.memory_policy(), "request");
    assert!(
        !r.enabled(),
        "the annotation cannot turn on what the cluster keeps off"
    );
    let r = c.resolve(&labels(NONE), &labels(&[(STRATEGY_ANNOTATION, "{bad")]));
    assert_eq!(r.strategy, c.cluster);
    assert!(r.notes.iter().any(|n| n.contains("ignored")));
}

#[test]
fn merge_rules() {
    // lists replace, nested structs merge, null keeps the base
    let c = ColocationConfig::parse(
        r#"{"metricAggregatePolicy": {"durations": ["1m"]}, "degradeTimeMinutes": null, "cpuCalculatePolicy": "maxUsageRequest",
            "nodeConfigs": [{"name": "n", "nodeSelector": {"matchLabels": {"a": "b"}}, "metricAggregatePolicy": {}}]}"#,
    )
    .unwrap();
    assert_eq!(
        c.cluster
            .metric_aggregate_policy
            .as_ref()
            .unwrap()
            .durations,
        Some(vec!["1m".into()])
    );
    assert_eq!(c.cluster.degrade_time_minutes, Some(15));
    assert_eq!(c.cluster.cpu_policy(), "maxUsageRequest");
    assert_eq!(
        c.nodes[0].strategy.metric_aggregate_policy,
        c.cluster.metric_aggregate_policy
    );
    // unknown fields are ignored, as Go's decoder ignores them
    assert!(
        ColocationConfig::parse(r#"{"enable": true, "extensions": {}, "someFutureField": 1}"#)
            .is_ok()
    );
}

#[test]
fn refusals() {
    assert!(matches!(
        ColocationConfig::parse("{"),
        Err(ConfigError::Json(_))
    ));
    assert!(matches!(
        ColocationConfig::parse(r#"{"cpuReclaimThresholdPercent": "65"}"#),
        Err(ConfigError::Json(_))
    ));
    assert!(matches!(
        ColocationConfig::parse(r#"{"cpuReclaimThresholdPercent": 65.5}"#),
        Err(ConfigError::Json(_))
    ));
    assert_eq!(
        ColocationConfig::parse(r#"{"degradeTimeMinutes": 0}"#),
        Err(ConfigError::Invalid(
            "degradeTimeMinutes 0: must be > 0".into()
        ))
    );
    assert!(matches!(
        ColocationConfig::parse(r#"{"batchCPUThresholdPercent": -1}"#),
        Err(ConfigError::Invalid(_))
    ));
    // an invalid entry becomes the cluster strategy
    let c = ColocationConfig::parse(
        r#"{"enable": true, "nodeConfigs": [{"name": "bad", "nodeSelector": {"matchLabels": {"a": "b"}}, "resourceDiffThreshold": -0.5, "enable": false}]}"#,
    )
    .unwrap();
    assert_eq!(c.nodes[0].strategy, c.cluster);
    assert_eq!(c.warnings.len(), 1);
    assert!(c.resolve(&labels(&[("a", "b")]), &labels(NONE)).enabled());
}

#[test]
fn validation_table() {
    // sloconfig's IsColocationStrategyValid cases
    let with = |f: &dyn Fn(&mut Strategy)| {
        let mut s = Strategy::defaults();
        f(&mut s);
        s.check().is_ok()
    };
    assert!(with(&|_| {}));
    assert!(!with(&|s| s.mid_cpu_threshold_percent = Some(-1)));
    assert!(!with(&|s| s.mid_cpu_threshold_percent = Some(101)));
    assert!(!with(&|s| s.mid_memory_threshold_percent = Some(101)));
    assert!(!with(&|s| s.mid_unallocated_percent = Some(-1)));
    assert!(
        with(&|s| s.batch_cpu_threshold_percent = Some(150)),
        "over 100 is valid (a cap above capacity)"
    );
    assert!(!with(&|s| s.batch_memory_threshold_percent = Some(-1)));
    assert!(with(&|s| s.cpu_reclaim_threshold_percent = Some(150)));
    assert!(!with(
        &|s| s.metric_memory_collect_policy = Some(String::new())
    ));
    assert!(
        with(&|s| *s = Strategy::default()),
        "a partial strategy is valid"
    );
}

#[test]
fn go_decoder_semantics() {
    // a key given twice: the last value (Go), not an error
    let c = ColocationConfig::parse(
        r#"{"enable": true, "cpuReclaimThresholdPercent": 50, "enable": false}"#,
    )
    .unwrap();
    assert_eq!(c.cluster.enable, Some(false));
    // whitespace is not empty: a JSON error, the last good value stays
    assert!(matches!(
        ColocationConfig::parse("  \n"),
        Err(ConfigError::Json(_))
    ));
    // a duration metav1.Duration cannot parse refuses the value
    assert!(matches!(
        ColocationConfig::parse(r#"{"metricAggregatePolicy": {"durations": ["5 minutes"]}}"#),
        Err(ConfigError::Json(_))
    ));
    assert!(ColocationConfig::parse(
        r#"{"metricAggregatePolicy": {"durations": ["5m", "1h30m"]}}"#
    )
    .is_ok());
}

#[test]
fn a_nodes_values_are_bounded() {
    let c = ColocationConfig::parse(r#"{"enable": true}"#).unwrap();
    // a ratio over 100 (10,000 %) is ignored, not saturated
    let r = c.resolve(&labels(&[(CPU_RECLAIM_LABEL, "1e300")]), &labels(NONE));
    assert_eq!(r.strategy.cpu_reclaim(), 60);
    let r = c.resolve(&labels(&[(CPU_RECLAIM_LABEL, "1.5")]), &labels(NONE));
    assert_eq!(
        r.strategy.cpu_reclaim(),
        150,
        "Koordinator's case 8: over 100 % is a negative margin"
    );
    // an annotation that would fail validation is ignored whole
    let anno = labels(&[(
        STRATEGY_ANNOTATION,
        r#"{"cpuReclaimThresholdPercent": -9223372036854775808, "memoryCalculatePolicy": "request"}"#,
    )]);
    let r = c.resolve(&labels(NONE), &anno);
    assert_eq!(
        (r.strategy.cpu_reclaim(), r.strategy.memory_policy()),
        (60, "usage")
    );
    assert!(
        r.notes.iter().any(|n| n.contains("ignored")),
        "{:?}",
        r.notes
    );
}
