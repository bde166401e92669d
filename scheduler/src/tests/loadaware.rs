//! LoadAware's own tables (`load_aware_test.go`: `TestFilterUsage`,
//! `TestFilterExpiredNodeMetric`, `TestScore`) as data: a node of 96 CPUs
//! and 512 GiB, default args unless a row says otherwise.

use std::collections::BTreeMap;

use qoslet_colocation::Res;

use crate::args::{AggregatedFile, Args, ArgsFile};
use crate::estimate::{estimate, PodFacts};
use crate::load::{name_key, uid_key, Assigned, MetricFacts, NodeLoad};
use crate::rank::{extender_score, filter, score, NodeFacts, EXPIRED};

const GI: i64 = 1 << 30;
const NOW: i64 = 1_796_000_000_000;

fn node() -> NodeFacts {
    NodeFacts {
        allocatable: Res::new(96_000, 512 * GI),
        thresholds_annotation: None,
    }
}

/// A NodeMetric reported `age_s` seconds ago (`None`: never) with this usage.
fn metric(age_s: Option<i64>, usage: Res) -> MetricFacts {
    MetricFacts {
        update_time: age_s.map(|a| NOW - a * 1000),
        report_interval_secs: 60,
        node_usage: Some(usage),
        ..Default::default()
    }
}

fn loaded(m: Option<MetricFacts>) -> NodeLoad {
    let mut l = NodeLoad::new(false);
    l.set_metric(m);
    l
}

/// The pod of `TestScore`: 16 CPUs and 32 GiB requested and limited.
fn big_pod() -> PodFacts {
    let r: BTreeMap<String, i64> =
        [("cpu".to_string(), 16_000), ("memory".to_string(), 32 * GI)].into();
    PodFacts {
        namespace: "default".into(),
        name: "test-pod-1".into(),
        uid: "u1".into(),
        requests: r.clone(),
        limits: r,
        ..Default::default()
    }
}

#[test]
fn the_estimator() {
    let f = Args::default().estimated_scaling_factors;
    // 16 CPUs x 85 %, 32 GiB x 70 %
    assert_eq!(
        estimate(&big_pod(), f),
        Res::new(13_600, (32.0 * GI as f64 * 0.7).round() as i64)
    );
    // nothing asked: 250m and 200 MiB
    assert_eq!(estimate(&PodFacts::default(), f), Res::new(250, 200 << 20));
    // capped at the limit: a request of 1 CPU under a limit of 1 CPU stays 850m; a limit
    // over the request estimates from the limit, capped at it
    let mut p = PodFacts::default();
    p.requests.insert("cpu".into(), 500);
    p.limits.insert("cpu".into(), 1_000);
    assert_eq!(estimate(&p, f).cpu, 850);
    // a batch pod is estimated from its batch resources
    let mut b = PodFacts {
        priority_class: Some("koord-batch"),
        ..Default::default()
    };
    b.requests
        .insert(qoslet_colocation::BATCH_CPU.into(), 16_000);
    b.requests
        .insert(qoslet_colocation::BATCH_MEMORY.into(), 32 * GI);
    b.limits = b.requests.clone();
    assert_eq!(estimate(&b, f), estimate(&big_pod(), f));
    // a free pod has no mapping: no estimate
    let free = PodFacts {
        priority_class: Some("koord-free"),
        ..Default::default()
    };
    assert_eq!(estimate(&free, f), Res::default());
}

/// `TestFilterUsage`: the incoming pod is an empty one (250m / 200 MiB).
#[test]
fn filter_usage() {
    let pod = PodFacts::default();
    let args = Args::default();
    for (what, usage, want) in [
        ("60 CPUs: 63 % <= 65", Res::new(60_000, 256 * GI), Ok(())),
        (
            "70 CPUs",
            Res::new(70_000, 256 * GI),
            Err("node(s) cpu usage exceed threshold"),
        ),
        (
            "500 GiB",
            Res::new(30_000, 500 * GI),
            Err("node(s) memory usage exceed threshold"),
        ),
    ] {
        let l = loaded(Some(metric(Some(0), usage)));
        assert_eq!(
            filter(&args, &node(), Some(&l), &pod, NOW),
            want.map_err(String::from),
            "{what}"
        );
    }
    // no NodeMetric: passes
    assert_eq!(filter(&args, &node(), None, &pod, NOW), Ok(()));
    assert_eq!(
        filter(&args, &node(), Some(&loaded(None)), &pod, NOW),
        Ok(())
    );
    // aggregated thresholds: p95 over 5 minutes at 70 CPUs, threshold 60
    let agg = Args::from_file(ArgsFile {
        aggregated: Some(AggregatedFile {
            usage_thresholds: [("cpu".to_string(), 60)].into(),
            usage_aggregation_type: Some("p95".into()),
            usage_aggregated_duration: Some("5m".into()),
            ..Default::default()
        }),
        ..Default::default()
    })
    .unwrap();
    let mut m = metric(Some(0), Res::new(30_000, 100 * GI));
    m.aggregated
        .insert(("p95".into(), 300), Res::new(70_000, 100 * GI));
    assert_eq!(
        filter(&agg, &node(), Some(&loaded(Some(m))), &pod, NOW),
        Err("node(s) cpu aggregated usage exceed threshold".to_string())
    );
    // a DaemonSet's pod always passes
    let ds = PodFacts {
        daemonset: true,
        ..Default::default()
    };
    let hot = loaded(Some(metric(Some(0), Res::new(95_000, 500 * GI))));
    assert_eq!(filter(&args, &node(), Some(&hot), &ds, NOW), Ok(()));
}

/// `TestFilterExpiredNodeMetric`, and the args that let it pass.
#[test]
fn filter_expired_node_metric() {
    let pod = PodFacts::default();
    let args = Args::default();
    let usage = Res::new(10_000, 10 * GI);
    for (age, want) in [
        (None, Err(EXPIRED.to_string())),
        (Some(180), Err(EXPIRED.to_string())),
        (Some(0), Ok(())),
    ] {
        let l = loaded(Some(metric(age, usage)));
        assert_eq!(filter(&args, &node(), Some(&l), &pod, NOW), want, "{age:?}");
    }
    let stale = loaded(Some(metric(Some(600), usage)));
    let keep = Args::from_file(ArgsFile {
        enable_schedule_when_node_metrics_expired: Some(true),
        ..Default::default()
    })
    .unwrap();
    assert_eq!(filter(&keep, &node(), Some(&stale), &pod, NOW), Ok(()));
    let off = Args::from_file(ArgsFile {
        filter_expired_node_metrics: Some(false),
        ..Default::default()
    })
    .unwrap();
    assert_eq!(filter(&off, &node(), Some(&stale), &pod, NOW), Ok(()));
}

/// `TestScore`.
#[test]
fn score_table() {
    let args = Args::default();
    let fresh = |usage: Res| loaded(Some(metric(Some(0), usage)));
    assert_eq!(
        score(
            &args,
            &node(),
            Some(&fresh(Res::default())),
            &big_pod(),
            NOW
        ),
        90
    );
    let busy = fresh(Res::new(32_000, 10 * GI));
    assert_eq!(score(&args, &node(), Some(&busy), &big_pod(), NOW), 72);
    // an identical pod assigned just now, not in the NodeMetric yet
    let mut busy = busy;
    busy.add_pod(
        uid_key("u0"),
        Assigned {
            name: name_key("default", "test-pod-0"),
            prod: false,
            estimate: estimate(&big_pod(), args.estimated_scaling_factors),
            assigned_at: NOW,
            deadline: 0,
        },
    );
    assert_eq!(score(&args, &node(), Some(&busy), &big_pod(), NOW), 63);
    // dominantResourceWeight 10, the weights not defaulted
    let dominant = Args::from_file(ArgsFile {
        dominant_resource_weight: Some(10),
        ..Default::default()
    })
    .unwrap();
    assert_eq!(
        score(
            &dominant,
            &node(),
            Some(&fresh(Res::default())),
            &big_pod(),
            NOW
        ),
        85
    );
    // a pod with no requests
    assert_eq!(
        score(
            &args,
            &node(),
            Some(&fresh(Res::default())),
            &PodFacts::default(),
            NOW
        ),
        99
    );
    // a batch pod (priority 5000) with batch-cpu 16000 and batch-memory 32 GiB
    let mut b = PodFacts {
        priority_class: Some("koord-batch"),
        ..Default::default()
    };
    b.requests
        .insert(qoslet_colocation::BATCH_CPU.into(), 16_000);
    b.requests
        .insert(qoslet_colocation::BATCH_MEMORY.into(), 32 * GI);
    b.limits = b.requests.clone();
    assert_eq!(
        score(&args, &node(), Some(&fresh(Res::default())), &b, NOW),
        90
    );
    // a NodeMetric updated 180 s ago, and none
    let old = loaded(Some(metric(Some(180), Res::default())));
    assert_eq!(score(&args, &node(), Some(&old), &big_pod(), NOW), 0);
    assert_eq!(score(&args, &node(), None, &big_pod(), NOW), 0);
    // on the extender's scale
    assert_eq!(
        [90, 72, 63, 85, 99, 0, 100, 4, 5].map(extender_score),
        [9, 7, 6, 9, 10, 0, 10, 0, 1]
    );
}

/// The load kept incrementally equals the load made again from scratch, and
/// a pod the NodeMetric shows counts only what its estimate adds.
#[test]
fn the_load_is_incremental() {
    let args = Args::default();
    let f = args.estimated_scaling_factors;
    let assigned = |i: usize, at: i64| Assigned {
        name: name_key("default", &format!("p{i}")),
        prod: i.is_multiple_of(2),
        estimate: estimate(&big_pod(), f),
        assigned_at: at,
        deadline: 0,
    };
    let mut m = metric(Some(0), Res::new(20_000, 40 * GI));
    // p1 and p2 are reported using 10 CPUs; p1 was assigned within the last
    // report interval (its estimate adds what the report may not show yet),
    // p2 long ago (the report shows it: nothing added)
    for p in ["p1", "p2"] {
        m.pods
            .insert(name_key("default", p), (Res::new(10_000, 10 * GI), false));
    }
    let at = |i: usize| if i == 1 { NOW - 10_000 } else { NOW - 600_000 };
    let mut inc = NodeLoad::new(false);
    inc.set_metric(Some(m.clone()));
    for i in 0..4 {
        inc.add_pod(uid_key(&format!("u{i}")), assigned(i, at(i)));
    }
    inc.remove_pod(uid_key("u3"));
    let mut again = NodeLoad::new(false);
    for i in 0..3 {
        again.add_pod(uid_key(&format!("u{i}")), assigned(i, at(i)));
    }
    again.set_metric(Some(m));
    assert_eq!(inc.estimated(false, None), again.estimated(false, None));
    let e = estimate(&big_pod(), f);
    // p0 unreported (whole), p1 what its estimate adds, p2 nothing
    let want = Res::new(20_000, 40 * GI) + e + Res::new(e.cpu - 10_000, e.memory - 10 * GI);
    assert_eq!(inc.estimated(false, None), Some(want));
    assert_eq!(inc.pods_counted().count(), 2);
    // without a usage vector (an aggregation not reported): every estimate whole
    let missing = crate::args::Aggregation {
        kind: "p99".into(),
        duration: Some(600),
    };
    assert_eq!(inc.estimated(false, Some(&missing)), Some(e + e + e));
}

/// `SetDefaults_LoadAwareSchedulingArgs` and the validation, with the
/// args' own field names (a typo is refused, not ignored).
#[test]
fn args_defaults_and_validation() {
    let d = Args::default();
    assert!(d.filter_expired_node_metrics && !d.enable_schedule_when_node_metrics_expired);
    assert_eq!(d.node_metric_expiration_seconds, 180);
    assert_eq!(
        (d.usage_thresholds.cpu, d.usage_thresholds.memory),
        (65, 95)
    );
    assert_eq!((d.resource_weights.cpu, d.resource_weights.memory), (1, 1));
    assert_eq!(
        (
            d.estimated_scaling_factors.cpu,
            d.estimated_scaling_factors.memory
        ),
        (85, 70)
    );
    assert!(d.prod_usage_thresholds.is_zero() && d.aggregated_thresholds.is_none());
    // the repo's sample profile: filtering off, factors kept
    let sample = Args::from_value(serde_json::json!({
        "apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "LoadAwareSchedulingArgs",
        "filterExpiredNodeMetrics": false, "nodeMetricExpirationSeconds": 300,
        "usageThresholds": {"cpu": 0, "memory": 0},
        "resourceWeights": {"cpu": 1, "memory": 1},
        "estimatedScalingFactors": {"cpu": 85, "memory": 70}}))
    .unwrap();
    assert!(sample.usage_thresholds.is_zero() && !sample.filter_expired_node_metrics);
    for bad in [
        serde_json::json!({"usageThreshold": {"cpu": 65}}),
        serde_json::json!({"nodeMetricExpirationSeconds": 0}),
        serde_json::json!({"dominantResourceWeight": 101}),
        serde_json::json!({"usageThresholds": {"cpu": 120}}),
        serde_json::json!({"resourceWeights": {"gpu": 1}}),
        serde_json::json!({"allowCustomizeEstimation": true}),
        serde_json::json!({"aggregated": {"usageThresholds": {"cpu": 60}, "usageAggregationType": "p42"}}),
        serde_json::json!({"aggregated": {"usageThresholds": {"cpu": 60}, "usageAggregationType": "p95", "usageAggregatedDuration": "five minutes"}}),
    ] {
        assert!(Args::from_value(bad.clone()).is_err(), "{bad}");
    }
}
