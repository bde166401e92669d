//! The NodeMetric report.

use super::*;
use crate::nodemetric::*;
use crate::status::ClusterStatus;
use std::sync::Arc;

const NODEMETRICS: &str = "/apis/slo.koordinator.sh/v1alpha1/nodemetrics";

#[test]
fn quantities_and_durations_as_kubernetes_prints_them() {
    assert_eq!(cpu_quantity(2.35), "2350m");
    assert_eq!(cpu_quantity(2.0), "2");
    assert_eq!(cpu_quantity(0.0004), "0");
    assert_eq!(cpu_quantity(12_000.0), "12k");
    assert_eq!(memory_quantity((10u64 << 30) as f64), "10Gi");
    assert_eq!(memory_quantity((1536u64 << 20) as f64), "1536Mi");
    assert_eq!(memory_quantity(1000.0), "1000");
    assert_eq!(memory_quantity(1025.0), "1025");
    assert_eq!(go_duration(Duration::from_secs(300)), "5m0s");
    assert_eq!(go_duration(Duration::from_secs(3600)), "1h0m0s");
    assert_eq!(go_duration(Duration::from_secs(45)), "45s");
    for (s, secs) in [
        ("5m0s", 300.0),
        ("10m", 600.0),
        ("1h30m", 5400.0),
        ("1.5h", 5400.0),
        ("90s", 90.0),
    ] {
        assert_eq!(
            parse_go_duration(s),
            Some(Duration::from_secs_f64(secs)),
            "{s}"
        );
    }
    for bad in ["", "5", "5x", "m", "-5m"] {
        assert_eq!(parse_go_duration(bad), None, "{bad}");
    }
    assert_eq!(priority_class(9500), Some("koord-prod"));
    assert_eq!(priority_class(5000), Some("koord-batch"));
    assert_eq!(priority_class(0), None);
}

#[test]
fn the_collect_policy_with_koordlets_defaults_and_minimums() {
    assert_eq!(CollectPolicy::of_spec(&json!({})), CollectPolicy::default());
    let p = CollectPolicy::of_spec(&json!({"metricCollectPolicy": {
        "aggregateDurationSeconds": 120, "reportIntervalSeconds": 45,
        "nodeAggregatePolicy": {"durations": ["1m0s", "15m0s", "bogus"]}}}));
    assert_eq!(p.aggregate, Duration::from_secs(120));
    assert_eq!(p.report_interval, Duration::from_secs(45));
    assert_eq!(
        p.durations,
        vec![Duration::from_secs(60), Duration::from_secs(900)]
    );
    // under koordlet's minimums: raised to them, as koordlet does
    let p = CollectPolicy::of_spec(&json!({"metricCollectPolicy": {
        "aggregateDurationSeconds": 10, "reportIntervalSeconds": 5,
        "nodeMemoryCollectPolicy": "usageWithPageCache"}}));
    assert_eq!(p.aggregate, Duration::from_secs(60));
    assert_eq!(p.report_interval, Duration::from_secs(30));
    assert!(p.with_page_cache);
    assert!(!CollectPolicy::default().with_page_cache);
    // koordlet's GetPodPriorityClassWithDefault
    assert_eq!(
        priority_class_with_default(Some("koord-mid"), Some(9000), Some("LS")),
        Some("koord-mid")
    );
    // a label naming no class is none (GetPodPriorityClassRaw does not look at
    // spec.priority once the label exists): the QoS class decides
    assert_eq!(
        priority_class_with_default(Some("bogus"), Some(5500), Some("LS")),
        Some("koord-prod")
    );
    assert_eq!(
        priority_class_with_default(None, Some(0), Some("LS")),
        Some("koord-prod")
    );
    assert_eq!(
        priority_class_with_default(None, None, Some("BE")),
        Some("koord-batch")
    );
    assert_eq!(priority_class_with_default(None, None, None), None);
}

pub(super) fn figures() -> Collected {
    let u = |cpu: f64, gib: u64| Usage {
        cpu,
        memory: (gib << 30) as f64,
    };
    Collected {
        node: u(2.35, 10),
        node_aggregated: vec![(
            Duration::from_secs(300),
            [
                Some(u(2.0, 9)),
                Some(u(2.0, 9)),
                Some(u(3.0, 10)),
                Some(u(3.5, 10)),
                None,
            ],
        )],
        system: Usage {
            cpu: 0.3,
            memory: (1u64 << 30) as f64,
        },
        system_aggregated: vec![],
        pods: vec![
            PodUsage {
                namespace: "shop".into(),
                name: "web-1".into(),
                usage: Usage {
                    cpu: 0.5,
                    memory: (512u64 << 20) as f64,
                },
                priority: Some("koord-prod"),
                qos: Some("LS"),
            },
            PodUsage {
                namespace: "batch".into(),
                name: "job-1".into(),
                usage: Usage {
                    cpu: 1.25,
                    memory: (2u64 << 30) as f64,
                },
                priority: None,
                qos: Some("BE"),
            },
        ],
    }
}

/// Koordinator's status keys exactly, pods sorted by namespace and name,
/// an aggregation the cache cannot answer left out (omitempty).
#[test]
fn the_status_has_koordinators_keys() {
    let got = status_json(&figures(), "2026-12-04T10:00:00Z");
    let want = json!({
        "updateTime": "2026-12-04T10:00:00Z",
        "nodeMetric": {
            "nodeUsage": {"resources": {"cpu": "2350m", "memory": "10Gi"}},
            "aggregatedNodeUsages": [{"usage": {
                "avg": {"resources": {"cpu": "2", "memory": "9Gi"}},
                "p50": {"resources": {"cpu": "2", "memory": "9Gi"}},
                "p90": {"resources": {"cpu": "3", "memory": "10Gi"}},
                "p95": {"resources": {"cpu": "3500m", "memory": "10Gi"}}},
                "duration": "5m0s"}],
            "systemUsage": {"resources": {"cpu": "300m", "memory": "1Gi"}}
        },
        "podsMetric": [
            {"namespace": "batch", "name": "job-1", "podUsage": {"resources": {"cpu": "1250m", "memory": "2Gi"}}, "qos": "BE"},
            {"namespace": "shop", "name": "web-1", "podUsage": {"resources": {"cpu": "500m", "memory": "512Mi"}}, "priority": "koord-prod", "qos": "LS"}
        ]
    });
    assert_eq!(got, want);
}

pub(super) struct Table(pub(super) Option<Collected>);

impl MetricsSource for Table {
    fn collect(&self, _: &CollectPolicy) -> Option<Collected> {
        self.0.clone()
    }
}

fn nodemetric(spec: Value) -> Value {
    json!({"apiVersion": "slo.koordinator.sh/v1alpha1", "kind": "NodeMetric",
           "metadata": {"name": "node-1"}, "spec": spec})
}

/// Issue 31: a report reads the NodeMetric (its spec is the policy) and
/// writes its status once; a conflict reads it again and retries; a
/// missing NodeMetric waits unless createNodeMetric; no figures, no write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_report_writes_the_status_once_and_retries_conflicts() {
    let (fake, dir, client) = fake_with_client("nm").await;
    let api: kube::Api<kube::api::DynamicObject> = kube::Api::all_with(client, &resource());
    let status = ClusterStatus::default();
    let source = Table(Some(figures()));
    let wait = ReportSettings {
        create: false,
        interval: None,
        write: true,
        figures: None,
        colocation: None,
    };
    // missing: waits, writes nothing
    let (r, _) = report_once(&api, "node-1", &source, &wait, &status)
        .await
        .unwrap();
    assert_eq!(r, Reported::Missing);
    assert!(fake.status_writes().is_empty());
    // created when asked
    let create = ReportSettings {
        create: true,
        interval: None,
        write: true,
        figures: None,
        colocation: None,
    };
    let (r, p) = report_once(&api, "node-1", &source, &create, &status)
        .await
        .unwrap();
    assert_eq!((r, p), (Reported::Written, CollectPolicy::default()));
    let stored = fake.get(NODEMETRICS, "node-1").unwrap();
    assert_eq!(
        stored["status"]["nodeMetric"]["nodeUsage"]["resources"]["cpu"],
        "2350m"
    );
    assert_eq!(stored["status"]["podsMetric"][0]["name"], "job-1");
    // the spec is the policy; a conflict is read again and retried
    let mut o = stored.clone();
    o["spec"] = json!({"metricCollectPolicy": {"reportIntervalSeconds": 90}});
    fake.apply(NODEMETRICS, o);
    fake.conflict_next(1);
    let (r, p) = report_once(&api, "node-1", &source, &wait, &status)
        .await
        .unwrap();
    assert_eq!(r, Reported::Written);
    assert_eq!(p.report_interval, Duration::from_secs(90));
    assert_eq!(status.reports("conflict"), 1);
    assert_eq!(status.reports("written"), 2);
    assert_eq!(fake.status_writes().len(), 2);
    // the spec as stored is kept
    assert_eq!(
        fake.get(NODEMETRICS, "node-1").unwrap()["spec"]["metricCollectPolicy"]
            ["reportIntervalSeconds"],
        90
    );
    // no figures (metrics off or stale): no write
    let (r, _) = report_once(&api, "node-1", &Table(None), &wait, &status)
        .await
        .unwrap();
    assert_eq!(r, Reported::NoFigures);
    assert_eq!(fake.status_writes().len(), 2);
    // no NodeMetric resource at all (the CRDs not installed): nothing
    // created, nothing written
    fake.unserve(NODEMETRICS);
    let (r, _) = report_once(&api, "node-1", &source, &create, &status)
        .await
        .unwrap();
    assert_eq!(r, Reported::NoResource);
    assert_eq!(fake.status_writes().len(), 2);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The reporter writes once per interval and never between (the gaps'
/// lower bound; the reporter's jitter is under 10 %, the upper bound leaves
/// room for a loaded machine), and survives the API server failing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reporter_writes_at_the_interval_and_not_between() {
    let (fake, dir, client) = fake_with_client("nm2").await;
    fake.apply(NODEMETRICS, nodemetric(json!({})));
    let status = Arc::new(ClusterStatus::default());
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let every = Duration::from_millis(1000);
    let task = tokio::spawn(report(
        client,
        "node-1".into(),
        Arc::new(Table(Some(figures()))),
        ReportSettings {
            create: false,
            interval: Some(every),
            write: true,
            figures: None,
            colocation: None,
        },
        status.clone(),
        stopped,
    ));
    tokio::time::sleep(Duration::from_millis(4_600)).await;
    let writes = fake.status_writes();
    // (the lower bounds are the point: never between; the upper ones leave
    // room for a loaded machine's late timers and slow round trips)
    assert!(
        (2..=5).contains(&writes.len()),
        "{} writes in 4.6 s at 1 s",
        writes.len()
    );
    for w in writes.windows(2) {
        let gap = w[1].0 - w[0].0;
        assert!(
            gap >= Duration::from_millis(950) && gap <= Duration::from_millis(1_600),
            "{gap:?}"
        );
    }
    // the API server failing: counted, retried, and writing resumes
    fake.fail_next(2, 500);
    until("a failed report", Duration::from_secs(10), || {
        status.reports("failed") >= 1
    })
    .await;
    let after_failure = fake.status_writes().len();
    until(
        "a write after the failures",
        Duration::from_secs(10),
        || fake.status_writes().len() > after_failure,
    )
    .await;
    stop.send(true).unwrap();
    let _ = tokio::time::timeout(Duration::from_secs(5), task).await;
    let _ = std::fs::remove_dir_all(&dir);
}
