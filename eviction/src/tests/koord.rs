//! koordlet's BE eviction tests (memoryevict and cpuevict `_test.go`) as data:
//! the memory round with its six pods, the CPU satisfaction cases (count,
//! real limit, usage, request: average and current), the CPU sort, and the
//! round's bookkeeping (pods evicted earlier count, one task's pods count for
//! the others, cool-downs).

use std::time::Duration;

use super::*;
use crate::koord::*;

const G: i64 = 1_000_000_000;

fn be(name: &str, priority: Option<i32>, used: i64, labelled: bool) -> Pod {
    Pod {
        be_labelled: labelled,
        priority,
        stats: Some(PodStats {
            memory_used: Some(used),
            ..Default::default()
        }),
        ..pod(name, 0)
    }
}

/// koordlet's P6 pods with the U115 usage (used 115G of 120G: 95 %).
fn p6() -> Vec<Pod> {
    vec![
        be("test_lsr_pod", Some(1000), 40 * G, false),
        be("test_ls_pod", Some(500), 30 * G, false),
        be("test_noqos_pod", Some(100), 10 * G, false),
        be("test_be_pod_priority100_1", Some(100), 5 * G, true),
        be("test_be_pod_priority100_2", Some(100), 20 * G, true),
        be("test_be_pod_priority120", Some(120), 10 * G, true),
    ]
}

fn evicted_by_memory(policy: MemoryPolicy, used: i64) -> Vec<String> {
    let pods = p6();
    let node = NodeMemory {
        used,
        capacity: 120 * G,
    };
    let Some(task) = memory_task(policy, node, &pods) else {
        return vec![];
    };
    let mut out = vec![];
    execute(
        &[task],
        &pods,
        |_| false,
        |p, _| {
            out.push(p.name.clone());
            true
        },
    );
    out.sort();
    out
}

#[test]
fn memory_evict_rounds() {
    let pol = |t, l| MemoryPolicy::new(Some(t), Some(l)).unwrap();
    let (b1, b2, b120) = (
        "test_be_pod_priority100_1",
        "test_be_pod_priority100_2",
        "test_be_pod_priority120",
    );
    let cases: &[(&str, MemoryPolicy, i64, &[&str])] = &[
        ("below threshold", pol(80, 78), 80 * G, &[]),
        ("thr 82 (lower 80)", pol(82, 80), 115 * G, &[b2]),
        ("thr 80 (lower 78)", pol(80, 78), 115 * G, &[b1, b2]),
        ("thr 50 (lower 48)", pol(50, 48), 115 * G, &[b1, b2, b120]),
        ("thr 82, lower 78", pol(82, 78), 115 * G, &[b1, b2]),
        ("thr 82, lower 74", pol(82, 74), 115 * G, &[b1, b2, b120]),
    ];
    for (name, policy, used, want) in cases {
        assert_eq!(evicted_by_memory(*policy, *used), *want, "{name}");
    }
}

#[test]
fn memory_release_is_koordlets() {
    let node = NodeMemory {
        used: 115 * G,
        capacity: 120 * G,
    };
    let r =
        |t, l| memory_task(MemoryPolicy::new(Some(t), l).unwrap(), node, &[]).map(|t| t.release);
    // the lower bound defaults to the threshold − 2
    assert_eq!(r(80, None), Some(20_400_000_000));
    assert_eq!(r(82, Some(80)), Some(18_000_000_000));
    assert_eq!(
        memory_task(
            MemoryPolicy::new(Some(80), Some(78)).unwrap(),
            NodeMemory {
                used: 80 * G,
                capacity: 120 * G
            },
            &[]
        ),
        None
    );
}

#[test]
fn memory_sort_priority_then_usage_then_name() {
    let pods = vec![
        be("b-nouse", None, 0, true),
        be("a-nouse", None, 0, true),
        be("small", None, G, true),
        be("prio-low", Some(1), G, true),
        be("big", Some(5), 9 * G, true),
        be("ls", Some(0), 50 * G, false),
    ];
    let node = NodeMemory {
        used: 100,
        capacity: 100,
    };
    let task = memory_task(MemoryPolicy::new(Some(50), Some(48)).unwrap(), node, &pods).unwrap();
    let order: Vec<&str> = task.order.iter().map(|i| pods[*i].name.as_str()).collect();
    // lower priority first (unset is 0); then larger use first; both
    // without use: name descending; LS never a candidate
    assert!(!order.contains(&"ls"));
    assert_eq!(order, ["small", "b-nouse", "a-nouse", "prio-low", "big"]);
}

fn c0() -> CpuPolicy {
    CpuPolicy {
        lower_percent: 30,
        upper_percent: 40,
        usage_threshold_percent: 90,
        window: Duration::from_secs(1),
        policy: CpuEvictPolicy::ByRealLimit,
    }
}

/// `Test_CPUEvict_calculateMilliReleaseByBESatisfaction`: (count, realLimit,
/// used, request) average and current, the batch-cpu allocatable, the release.
#[test]
fn cpu_release_by_satisfaction() {
    let c1 = CpuPolicy {
        usage_threshold_percent: 50,
        ..c0()
    };
    let c2 = CpuPolicy {
        policy: CpuEvictPolicy::ByAllocatable,
        ..c1
    };
    type S = (usize, i64, i64, i64);
    type Case = (&'static str, CpuPolicy, i64, S, Option<S>, i64);
    let cases: &[Case] = &[
        ("realLimit zero", c0(), 30000, (59, 0, 20000, 0), None, 0),
        (
            "usage not enough",
            c0(),
            30000,
            (59, 20000, 10000, 0),
            None,
            0,
        ),
        ("request zero", c0(), 30000, (59, 20000, 19000, 0), None, 0),
        (
            "satisfaction enough",
            c0(),
            30000,
            (59, 20000, 19000, 40000),
            None,
            0,
        ),
        (
            "current invalid",
            c0(),
            30000,
            (59, 10000, 9500, 50000),
            Some((1, 0, 0, 0)),
            0,
        ),
        (
            "current usage low",
            c0(),
            30000,
            (59, 10000, 9500, 50000),
            Some((1, 10000, 5000, 50000)),
            0,
        ),
        (
            "avg > current",
            c0(),
            30000,
            (59, 10000, 9500, 50000),
            Some((1, 14000, 13000, 50000)),
            6000,
        ),
        (
            "avg < current",
            c0(),
            30000,
            (59, 13000, 12000, 50000),
            Some((1, 11000, 10000, 50000)),
            7000,
        ),
        (
            "thr50 avg usage low",
            c1,
            30000,
            (59, 20000, 9000, 0),
            None,
            0,
        ),
        (
            "thr50 current usage low",
            c1,
            30000,
            (59, 10000, 6000, 50000),
            Some((1, 10000, 4000, 50000)),
            0,
        ),
        (
            "thr50 avg > current",
            c1,
            30000,
            (59, 10000, 6000, 50000),
            Some((1, 14000, 8000, 50000)),
            6000,
        ),
        (
            "realLimit ignores allocatable",
            c1,
            8000,
            (59, 10000, 6000, 50000),
            Some((1, 10000, 4000, 50000)),
            0,
        ),
        (
            "by allocatable 8000",
            c2,
            8000,
            (59, 10000, 6000, 50000),
            Some((1, 10000, 4000, 50000)),
            12000,
        ),
        (
            "by allocatable 0 is 1",
            c2,
            0,
            (59, 10000, 6000, 50000),
            Some((1, 10000, 4000, 50000)),
            19999,
        ),
    ];
    let s = |x: S| BeCpuF {
        real_limit: x.1 as f64,
        usage: x.2 as f64,
        request: x.3 as f64,
    };
    for (name, policy, alloc, avg, cur, want) in cases {
        let w = CpuWindow {
            avg: s(*avg),
            count: avg.0,
            current: s(cur.unwrap_or(*avg)),
        };
        let got = cpu_task(policy, &w, 0, Some(*alloc), &[]).unwrap();
        assert_eq!(got.map(|t| t.release).unwrap_or(0), *want, "{name}");
    }
    // too few samples in the window (koordlet: count × interval < window / 3)
    let w = CpuWindow {
        avg: s((10, 10000, 9500, 50000)),
        count: 10,
        current: s((10, 10000, 9500, 50000)),
    };
    assert_eq!(cpu_task(&c0(), &w, 20, None, &[]).unwrap(), None);
}

#[test]
fn cpu_policy_checks_are_koordlets() {
    let p = |l, u| CpuPolicy {
        lower_percent: l,
        upper_percent: u,
        ..c0()
    };
    assert_eq!(p(0, 40).check(), Err(CpuPolicyError::Lower(0)));
    assert_eq!(p(61, 80).check(), Err(CpuPolicyError::Lower(61)));
    assert_eq!(p(30, 100).check(), Err(CpuPolicyError::Upper(100)));
    assert_eq!(p(30, 0).check(), Err(CpuPolicyError::Upper(0)));
    assert_eq!(
        p(40, 30).check(),
        Err(CpuPolicyError::Order {
            lower: 40,
            upper: 30
        })
    );
    assert_eq!(p(30, 30).check(), Ok(()));
    assert_eq!(p(60, 99).check(), Ok(()));
}

#[test]
fn cpu_sort_priority_then_usage_over_request() {
    let cpu = |name: &str, prio: i32, used: i64, labelled| Pod {
        be_labelled: labelled,
        requests: Requests {
            batch_cpu_milli: 16000,
            ..Default::default()
        },
        stats: Some(PodStats {
            cpu_milli: Some(used),
            ..Default::default()
        }),
        ..pod(name, prio)
    };
    let pods = vec![
        cpu("pod_lsr", 0, 12000, false),
        cpu("pod_ls", 0, 12000, false),
        cpu("pod_be_1_priority100", 100, 3000, true),
        cpu("pod_be_2_priority100", 100, 4000, true),
        cpu("pod_be_3_priority10", 10, 4000, true),
    ];
    let b = BeCpuF {
        real_limit: 10000.0,
        request: 50000.0,
        usage: 9500.0,
    };
    let w = CpuWindow {
        avg: b,
        count: 1,
        current: b,
    };
    let t = cpu_task(&c0(), &w, 0, None, &pods).unwrap().unwrap();
    let order: Vec<&str> = t.order.iter().map(|i| pods[*i].name.as_str()).collect();
    assert_eq!(
        order,
        [
            "pod_be_3_priority10",
            "pod_be_2_priority100",
            "pod_be_1_priority100"
        ]
    );
    // 50000 × (0.40 − 0.20) = 10000m: one pod's 16000m request is enough
    let mut gone = vec![];
    let round = execute(
        &[t],
        &pods,
        |_| false,
        |p, _| {
            gone.push(p.name.clone());
            true
        },
    );
    assert_eq!(gone, ["pod_be_3_priority10"]);
    assert_eq!(round.released[&Feature::BeCpu], 16000);
    assert!(round.short.is_empty());
}

#[test]
fn a_pod_evicted_before_counts_and_is_not_evicted_again() {
    let pods = p6();
    let node = NodeMemory {
        used: 115 * G,
        capacity: 120 * G,
    };
    let task = memory_task(MemoryPolicy::new(Some(80), Some(78)).unwrap(), node, &pods).unwrap();
    // be100_2 (20G) was evicted last round and is still listed: 20G of 20.4G
    let mut gone = vec![];
    let round = execute(
        &[task],
        &pods,
        |p| p.name == "test_be_pod_priority100_2",
        |p, _| {
            gone.push(p.name.clone());
            true
        },
    );
    assert_eq!(gone, ["test_be_pod_priority100_1"]);
    assert_eq!(round.evicted.len(), 1);
    assert_eq!(round.released[&Feature::BeMemory], 25 * G);
}

#[test]
fn a_refused_eviction_moves_on_and_a_short_round_is_reported() {
    let pods = p6();
    let task = memory_task(
        MemoryPolicy::new(Some(50), Some(10)).unwrap(),
        NodeMemory {
            used: 115 * G,
            capacity: 120 * G,
        },
        &pods,
    )
    .unwrap();
    let round = execute(
        &[task],
        &pods,
        |_| false,
        |p, _| p.name != "test_be_pod_priority100_2",
    );
    assert_eq!(round.evicted.len(), 2);
    assert_eq!(round.short, [Feature::BeMemory]);
}

#[test]
fn cool_downs_and_remembered_pods() {
    let t0 = Duration::from_secs(100);
    let mut k = Koord::new(t0);
    assert!(!k.memory_cooling(t0));
    assert!(
        k.cpu_cooling(t0 + Duration::from_secs(19)),
        "CPU cools from the start"
    );
    assert!(!k.cpu_cooling(t0 + Duration::from_secs(20)));
    let pods = p6();
    let round = Round {
        evicted: vec![(4, Feature::BeMemory)],
        ..Default::default()
    };
    let t1 = Duration::from_secs(200);
    k.record(t1, &round, &pods);
    assert!(k.memory_cooling(t1 + Duration::from_secs(3)));
    assert!(!k.memory_cooling(t1 + Duration::from_secs(4)));
    assert!(k.was_evicted("test_be_pod_priority100_2", t1 + Duration::from_secs(119)));
    assert!(!k.was_evicted("test_be_pod_priority100_2", t1 + Duration::from_secs(120)));
    assert!(!k.was_evicted("test_be_pod_priority100_1", t1));
}

#[test]
fn cpu_history_windows() {
    let mut h = CpuHistory::default();
    let s = |u| BeCpu {
        real_limit: 1000,
        request: 2000,
        usage: u,
    };
    for i in 0..10u64 {
        h.push(
            Duration::from_secs(i),
            s(i as i64 * 100),
            Duration::from_secs(60),
        );
    }
    let w = h
        .window(Duration::from_secs(9), Duration::from_secs(3))
        .unwrap();
    assert_eq!(w.count, 4);
    assert_eq!(w.avg.usage, 750.0);
    assert_eq!(w.current.usage, 900.0);
    h.push(Duration::from_secs(100), s(0), Duration::from_secs(60));
    assert_eq!(
        h.window(Duration::from_secs(100), Duration::from_secs(60))
            .unwrap()
            .count,
        1
    );
    assert!(CpuHistory::default()
        .window(Duration::ZERO, Duration::from_secs(1))
        .is_none());
}

#[test]
fn memory_policy_checks_are_koordlets() {
    assert_eq!(MemoryPolicy::new(None, None), Err(MemoryPolicyError::Unset));
    assert_eq!(
        MemoryPolicy::new(Some(-1), None),
        Err(MemoryPolicyError::Threshold(-1))
    );
    assert_eq!(
        MemoryPolicy::new(Some(80), Some(90)),
        Err(MemoryPolicyError::Lower {
            lower: 90,
            threshold: 80
        })
    );
    assert!(MemoryPolicy::new(Some(80), Some(80)).is_err());
    assert_eq!(
        MemoryPolicy::new(Some(80), None).unwrap().lower_percent(),
        78
    );
    assert!(
        MemoryPolicy::new(Some(1), None).is_err(),
        "lower would be negative"
    );
}

/// The float mean: (10001 + 10000) / 2 = 10000.5, and 9000 / 10000.5 is under
/// 90 %: koordlet evicts nothing (an integer mean said 90 % and evicted).
#[test]
fn the_window_mean_is_a_float_mean() {
    let mut h = CpuHistory::default();
    let keep = Duration::from_secs(60);
    for (t, limit) in [(1, 10001), (2, 10000)] {
        h.push(
            Duration::from_secs(t),
            BeCpu {
                real_limit: limit,
                request: 50000,
                usage: 9000,
            },
            keep,
        );
    }
    let w = h
        .window(Duration::from_secs(2), Duration::from_secs(10))
        .unwrap();
    assert_eq!(w.avg.real_limit, 10000.5);
    assert_eq!(cpu_task(&c0(), &w, 0, None, &[]).unwrap(), None);
}

#[test]
fn the_eviction_policy_annotation() {
    let p = |v| EvictionPolicy::parse(v);
    assert!(p(None).allows(Feature::BeMemory));
    assert!(p(Some(r#"["BECPUEvict"]"#)).allows(Feature::BeCpu));
    assert!(!p(Some(r#"["BECPUEvict"]"#)).allows(Feature::BeMemory));
    assert!(p(Some(r#"[ "BEMemoryEvict" , "BECPUEvict" ]"#)).allows(Feature::BeMemory));
    for none in [
        "[]",
        "",
        "not json",
        r#""BEMemoryEvict""#,
        r#"["BEMemoryEvict"#,
    ] {
        assert!(!p(Some(none)).allows(Feature::BeMemory), "{none}");
    }
    // a pod that opted out of memory eviction is no candidate
    let mut pods = p6();
    pods[4].eviction_policy = p(Some(r#"["BECPUEvict"]"#));
    let task = memory_task(
        MemoryPolicy::new(Some(82), Some(80)).unwrap(),
        NodeMemory {
            used: 115 * G,
            capacity: 120 * G,
        },
        &pods,
    )
    .unwrap();
    assert!(!task.order.contains(&4));
}

/// A restart restores what a previous run evicted: the pod is remembered
/// (counted as pending release, not evicted again) and its feature cools
/// down from when it was evicted, not from the restart.
#[test]
fn restored_evictions_are_remembered_and_cool_down() {
    let s = Duration::from_secs;
    let mut k = Koord::new(s(900));
    k.remember_evicted("a".into(), Feature::BeMemory, s(898));
    k.remember_evicted("b".into(), Feature::BeCpu, s(890));
    assert!(k.was_evicted("a", s(900)) && k.was_evicted("b", s(900)));
    assert!(!k.was_evicted("c", s(900)));
    // memory: 4 s from 898
    assert!(k.memory_cooling(s(901)));
    assert!(!k.memory_cooling(s(902)));
    // CPU: the start's cool-down (900 + 20) is the later one
    assert!(k.cpu_cooling(s(919)));
    assert!(!k.cpu_cooling(s(920)));
    // remembered for 2 min from the eviction, not from the restart
    assert!(k.was_evicted("a", s(1017)));
    assert!(!k.was_evicted("a", s(1018)));
}

/// A pod whose eviction failed is forgotten: a candidate again, and no
/// longer counted as released.
#[test]
fn a_failed_eviction_is_forgotten() {
    let s = Duration::from_secs;
    let mut k = Koord::new(s(0));
    k.remember_evicted("a".into(), Feature::BeMemory, s(10));
    assert!(k.was_evicted("a", s(11)));
    k.forget("a");
    assert!(!k.was_evicted("a", s(11)));
    // the cool-down of the round stays (koordlet's round did evict)
    assert!(k.memory_cooling(s(12)));
}
