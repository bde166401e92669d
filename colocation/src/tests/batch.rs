//! Koordinator's own cases (`plugins/batchresource/plugin_test.go:
//! TestPluginCalculate`, COLOCATION.md A.10) as data.

use std::collections::BTreeMap;

use crate::batch::*;
use crate::strategy::Strategy;
use crate::Res;

const G: i64 = 1_000_000_000;

fn cores(c: i64, g: i64) -> Res {
    Res::new(c * 1000, g * G)
}

fn pod(
    ns: &str,
    name: &str,
    phase: &str,
    labels: &[(&str, &str)],
    kube_qos: &str,
    req: Res,
) -> PodInput {
    let l: BTreeMap<&str, &str> = labels.iter().copied().collect();
    PodInput {
        namespace: ns.into(),
        name: name.into(),
        phase: Some(phase.into()),
        priority_label: l
            .get("koordinator.sh/priority-class")
            .map(|s| s.to_string()),
        priority: None,
        qos_label: l.get("koordinator.sh/qosClass").map(|s| s.to_string()),
        kube_qos: Some(kube_qos.into()),
        request: req,
    }
}

fn metric(ns: &str, name: &str, usage: Res) -> PodMetric {
    PodMetric {
        namespace: ns.into(),
        name: name.into(),
        usage,
        priority: None,
    }
}

/// The shared fixture: podA LS 20/20G used 11/11G, podB BE used 10/10G,
/// podC Guaranteed (no labels, Pending) 20/40G used 22/22G, podD BE Succeeded.
fn fixture() -> (Vec<PodInput>, MetricInput) {
    let pods = vec![
        pod(
            "test",
            "podA",
            "Running",
            &[("koordinator.sh/qosClass", "LS")],
            "Guaranteed",
            cores(20, 20),
        ),
        pod(
            "test",
            "podB",
            "Running",
            &[("koordinator.sh/qosClass", "BE")],
            "BestEffort",
            Res::default(),
        ),
        pod("test", "podC", "Pending", &[], "Guaranteed", cores(20, 40)),
        pod(
            "test",
            "podD",
            "Succeeded",
            &[("koordinator.sh/qosClass", "BE")],
            "BestEffort",
            Res::default(),
        ),
    ];
    let m = MetricInput {
        update_time: Some(1_000),
        system: cores(7, 12),
        pods: vec![
            metric("test", "podA", cores(11, 11)),
            metric("test", "podB", cores(10, 10)),
            metric("test", "podC", cores(22, 22)),
        ],
        host_apps: vec![],
    };
    (pods, m)
}

fn node(cap: Res, alloc: Res) -> NodeInput {
    NodeInput {
        capacity_cpu: Some(cap.cpu),
        capacity_memory: Some(cap.memory),
        allocatable_cpu: Some(alloc.cpu),
        allocatable_memory: Some(alloc.memory),
        reservation: None,
    }
}

fn strategy(cpu: i64, mem: i64) -> Strategy {
    let mut s = Strategy::defaults();
    s.enable = Some(true);
    s.cpu_reclaim_threshold_percent = Some(cpu);
    s.memory_reclaim_threshold_percent = Some(mem);
    s
}

struct Case {
    name: &'static str,
    strategy: Strategy,
    node: NodeInput,
    pods: Option<Vec<PodInput>>,
    metric: Option<MetricInput>,
    cpu: i64,
    memory: i64,
}

fn cases() -> Vec<Case> {
    let n100 = node(cores(100, 120), cores(100, 120));
    let mut c2 = strategy(70, 80);
    c2.memory_calculate_policy = Some("request".into());
    let mut c3 = c2.clone();
    c3.cpu_calculate_policy = Some("maxUsageRequest".into());
    let mut n4 = n100.clone();
    let anno = BTreeMap::from([(
        RESERVATION_ANNOTATION.to_string(),
        r#"{"reservedCPUs":"0-19"}"#.to_string(),
    )]);
    n4.reservation = reservation_of(&anno).unwrap();
    let mut n5 = node(cores(100, 120), cores(90, 100));
    let anno = BTreeMap::from([(
        RESERVATION_ANNOTATION.to_string(),
        r#"{"resources":{"cpu":"2","memory":"5G"}}"#.to_string(),
    )]);
    n5.reservation = reservation_of(&anno).unwrap();
    // case 6: custom pods
    let mut lse = pod(
        "test",
        "lse",
        "Running",
        &[("koordinator.sh/qosClass", "LSE")],
        "Guaranteed",
        cores(10, 10),
    );
    lse.priority = Some(9999);
    let mut prod = pod("test", "prod", "Running", &[], "Burstable", cores(10, 10));
    prod.priority = Some(9999);
    let be = pod(
        "test",
        "be",
        "Running",
        &[("koordinator.sh/qosClass", "BE")],
        "BestEffort",
        Res::default(),
    );
    let mut mid = pod(
        "test",
        "mid",
        "Pending",
        &[("koordinator.sh/qosClass", "BE")],
        "Burstable",
        cores(20, 40),
    );
    mid.priority = Some(7000);
    let m6 = MetricInput {
        update_time: Some(1_000),
        system: cores(7, 12),
        pods: vec![
            metric("test", "lse", cores(5, 5)),
            metric("test", "prod", cores(6, 6)),
            metric("test", "be", cores(10, 10)),
            metric("test", "mid", cores(22, 22)),
        ],
        host_apps: vec![],
    };
    // case 7: system 4/6G plus a host application
    let (_, mut m7) = fixture();
    m7.system = cores(4, 6);
    m7.host_apps = vec![HostAppMetric {
        name: "app".into(),
        usage: cores(3, 6),
        priority: Some("koord-prod".into()),
    }];
    let mut m7b = m7.clone();
    m7b.host_apps[0].priority = Some("koord-batch".into());
    let mut c8 = strategy(150, 120);
    c8.cpu_calculate_policy = Some("maxUsageRequest".into());
    c8.memory_calculate_policy = Some("request".into());
    let mut c8b = c8.clone();
    c8b.batch_cpu_threshold_percent = Some(100);
    vec![
        Case {
            name: "1 default policies",
            strategy: strategy(65, 65),
            node: n100.clone(),
            pods: None,
            metric: None,
            cpu: 25_000,
            memory: 33 * G,
        },
        Case {
            name: "2 memory by request",
            strategy: c2,
            node: n100.clone(),
            pods: None,
            metric: None,
            cpu: 30_000,
            memory: 36 * G,
        },
        Case {
            name: "3 cpu maxUsageRequest",
            strategy: c3,
            node: n100.clone(),
            pods: None,
            metric: None,
            cpu: 21_000,
            memory: 36 * G,
        },
        Case {
            name: "4 reservedCPUs 0-19",
            strategy: strategy(65, 65),
            node: n4,
            pods: None,
            metric: None,
            cpu: 12_000,
            memory: 33 * G,
        },
        Case {
            name: "5 kubelet and annotation reserve",
            strategy: strategy(65, 65),
            node: n5,
            pods: None,
            metric: None,
            cpu: 22_000,
            memory: 25 * G,
        },
        Case {
            name: "6 LSE, prod, BE, mid pods",
            strategy: strategy(65, 65),
            node: n100.clone(),
            pods: Some(vec![lse, prod, be, mid]),
            metric: Some(m6),
            cpu: 20_000,
            memory: 33 * G,
        },
        Case {
            name: "7 prod host application",
            strategy: strategy(65, 65),
            node: n100.clone(),
            pods: None,
            metric: Some(m7),
            cpu: 25_000,
            memory: 33 * G,
        },
        Case {
            name: "7b batch host application",
            strategy: strategy(65, 65),
            node: n100.clone(),
            pods: None,
            metric: Some(m7b),
            cpu: 28_000,
            memory: 39 * G,
        },
        Case {
            name: "8 reclaim over 100",
            strategy: c8,
            node: n100.clone(),
            pods: None,
            metric: None,
            cpu: 101_000,
            memory: 84 * G,
        },
        Case {
            name: "8b capped at 100 %",
            strategy: c8b,
            node: n100,
            pods: None,
            metric: None,
            cpu: 100_000,
            memory: 84 * G,
        },
    ]
}

#[test]
fn koordinators_table() {
    for c in cases() {
        let (fp, fm) = fixture();
        let pods = c.pods.unwrap_or(fp);
        let m = c.metric.unwrap_or(fm);
        let b = calculate(&c.strategy, &c.node, &pods, &m);
        assert_eq!(
            (b.cpu, b.memory),
            (c.cpu, c.memory),
            "case {}: {:#?}",
            c.name,
            b.terms
        );
    }
}

#[test]
fn the_fixtures_sums_are_koordinators() {
    let (pods, m) = fixture();
    let b = calculate(
        &strategy(65, 65),
        &node(cores(100, 120), cores(100, 120)),
        &pods,
        &m,
    );
    assert_eq!(b.terms.high_priority_used, cores(33, 33));
    assert_eq!(b.terms.high_priority_requested, cores(40, 60));
    assert_eq!(b.terms.high_priority_max_used_requested, cores(42, 60));
    assert_eq!(
        (
            b.terms.pods_high_priority,
            b.terms.pods_low_priority,
            b.terms.pods_inactive
        ),
        (2, 1, 1)
    );
    assert!(b.cpu_formula().contains("capacity 100000 - margin 35000 (35% of capacity: cpuReclaimThresholdPercent 65) - max(system 7000, reserved 0) - high-priority used 33000 = 25000"), "{}", b.cpu_formula());
    assert_eq!(b.pods[0].pod, "test/podC");
}

#[test]
fn a_pod_without_a_metric_counts_its_request_and_a_dangling_metric_its_usage() {
    let pods = vec![pod("ns", "new", "Pending", &[], "Burstable", cores(4, 8))];
    let m = MetricInput {
        update_time: Some(1),
        system: Res::default(),
        pods: vec![
            metric("ns", "gone", cores(3, 3)),
            PodMetric {
                priority: Some("koord-batch".into()),
                ..metric("ns", "gone-batch", cores(50, 50))
            },
        ],
        host_apps: vec![],
    };
    let b = calculate(
        &strategy(100, 100),
        &node(cores(10, 20), cores(10, 20)),
        &pods,
        &m,
    );
    // 10 - 0 - 0 - (4 requested + 3 dangling)
    assert_eq!((b.cpu, b.memory), (3_000, 9 * G));
    assert_eq!(b.terms.metrics_without_pod, cores(3, 3));
    assert_eq!(b.terms.pods_without_metric, 1);
    // maxUsageRequest: the pod without a metric adds nothing, the dangling metric its usage
    let mut s = strategy(100, 100);
    s.cpu_calculate_policy = Some("maxUsageRequest".into());
    assert_eq!(
        calculate(&s, &node(cores(10, 20), cores(10, 20)), &pods, &m).cpu,
        7_000
    );
}

#[test]
fn results_are_clamped_at_zero_and_a_missing_capacity_lends_nothing() {
    let (pods, m) = fixture();
    let b = calculate(
        &strategy(65, 65),
        &node(cores(10, 10), cores(10, 10)),
        &pods,
        &m,
    );
    assert_eq!((b.cpu, b.memory), (0, 0));
    assert!(b.terms.cpu_by_policy < 0);
    assert!(b.cpu_formula().contains("below 0: 0"));
    let b = calculate(&strategy(65, 65), &NodeInput::default(), &pods, &m);
    assert_eq!((b.cpu, b.memory), (0, 0));
}

#[test]
fn a_priority_label_and_spec_priority_decide_before_the_qos() {
    // BE by QoS, but labelled prod: high priority
    let mut p = pod(
        "ns",
        "a",
        "Running",
        &[
            ("koordinator.sh/qosClass", "BE"),
            ("koordinator.sh/priority-class", "koord-prod"),
        ],
        "BestEffort",
        Res::default(),
    );
    let m = MetricInput {
        update_time: Some(1),
        pods: vec![metric("ns", "a", cores(2, 2))],
        ..Default::default()
    };
    let n = node(cores(10, 10), cores(10, 10));
    assert_eq!(
        calculate(&strategy(100, 100), &n, &[p.clone()], &m).cpu,
        8_000
    );
    // Burstable but priority 5500 (batch range): low priority
    p.priority_label = None;
    p.qos_label = None;
    p.kube_qos = Some("Burstable".into());
    p.priority = Some(5500);
    assert_eq!(
        calculate(&strategy(100, 100), &n, &[p.clone()], &m).cpu,
        10_000
    );
    // a plain BestEffort pod on a vanilla cluster is batch
    p.priority = Some(0);
    p.kube_qos = Some("BestEffort".into());
    assert_eq!(calculate(&strategy(100, 100), &n, &[p], &m).cpu, 10_000);
}

#[test]
fn reservation_annotation() {
    let a = |s: &str| BTreeMap::from([(RESERVATION_ANNOTATION.to_string(), s.to_string())]);
    assert_eq!(reservation_of(&BTreeMap::new()), Ok(None));
    assert_eq!(
        reservation_of(&a(r#"{"resources":{"cpu":"1500m","memory":"1Gi"}}"#)),
        Ok(Some(Res::new(1500, 1 << 30)))
    );
    assert_eq!(
        reservation_of(&a(r#"{"resources":{"cpu":"8"},"reservedCPUs":"0-1,4"}"#)),
        Ok(Some(Res::new(3000, 0)))
    );
    assert!(reservation_of(&a("{")).is_err());
    assert!(reservation_of(&a(r#"{"reservedCPUs":"x-y"}"#)).is_err());
    assert!(reservation_of(&a(r#"{"resources":{"cpu":"lots"}}"#)).is_err());
}

#[test]
fn koordinators_label_and_host_application_rules() {
    // a priority-class label naming no class is none: the QoS decides, not spec.priority
    let mut p = pod(
        "ns",
        "a",
        "Running",
        &[("koordinator.sh/priority-class", "batch")],
        "Burstable",
        cores(4, 4),
    );
    p.priority = Some(5500);
    let m = MetricInput {
        update_time: Some(1),
        pods: vec![metric("ns", "a", cores(3, 3))],
        ..Default::default()
    };
    let n = node(cores(10, 10), cores(10, 10));
    assert_eq!(
        calculate(&strategy(100, 100), &n, &[p], &m).cpu,
        7_000,
        "Burstable: prod"
    );
    // a host application with no priority is not above batch (case 7 with the priority left out)
    let (pods, mut m7) = fixture();
    m7.system = cores(4, 6);
    m7.host_apps = vec![HostAppMetric {
        name: "app".into(),
        usage: cores(3, 6),
        priority: None,
    }];
    let b = calculate(
        &strategy(65, 65),
        &node(cores(100, 120), cores(100, 120)),
        &pods,
        &m7,
    );
    assert_eq!((b.cpu, b.memory), (28_000, 39 * G));
    m7.host_apps[0].priority = Some("koord-mid".into());
    let b = calculate(
        &strategy(65, 65),
        &node(cores(100, 120), cores(100, 120)),
        &pods,
        &m7,
    );
    assert_eq!((b.cpu, b.memory), (25_000, 33 * G));
}

#[test]
fn reservation_quantities_may_be_numbers() {
    let a = BTreeMap::from([(
        RESERVATION_ANNOTATION.to_string(),
        r#"{"resources":{"cpu":2,"memory":1073741824}}"#.to_string(),
    )]);
    assert_eq!(reservation_of(&a), Ok(Some(Res::new(2000, 1 << 30))));
    let big = BTreeMap::from([(
        RESERVATION_ANNOTATION.to_string(),
        format!("{{\"reservedCPUs\":\"{}\"}}", "0,".repeat(10_000)),
    )]);
    assert!(reservation_of(&big).is_err(), "over the size bound");
}
