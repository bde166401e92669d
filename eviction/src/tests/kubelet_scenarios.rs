//! kubelet's eviction manager scenarios (eviction_manager_test.go, v1.28):
//! step by step, the clock, what is observed, the condition, the pod killed
//! and its grace period, and admission. One difference, on purpose: a hard
//! eviction's grace is 1 s (later kubelets' "immediate"), where v1.28 passed
//! 0 and its pod workers then gave the pod its whole grace period.

use std::time::Duration;

use qoslet_hooks::class::KubeQos;

use super::*;
use crate::kubelet::{admit, Kubelet, Observation, Observations, Settings};
use crate::signal::{Condition, Signal};
use crate::threshold::{Amount, Threshold};

fn th(signal: Signal, v: i64, grace_s: u64, min: Option<i64>) -> Threshold {
    Threshold {
        signal,
        value: Amount::Quantity(v),
        grace: Duration::from_secs(grace_s),
        min_reclaim: min.map(Amount::Quantity),
        binary: true,
    }
}

fn kubelet(thresholds: Vec<Threshold>) -> Kubelet {
    Kubelet::new(Settings {
        thresholds,
        transition: Duration::from_secs(300),
        max_pod_grace_seconds: 5,
        dedicated_imagefs: false,
    })
}

/// `makeMemoryStats(x)`: available x of a capacity 2x, for both memory signals.
fn memory(x: i64) -> Observations {
    let o = Observation {
        available: x,
        capacity: 2 * x,
        at: None,
    };
    [
        (Signal::MemoryAvailable, o),
        (Signal::AllocatableMemoryAvailable, o),
    ]
    .into()
}

/// `makeDiskStats(root, image)`.
fn disk(root: i64, image: i64) -> Observations {
    let o = |x| Observation {
        available: x,
        capacity: 2 * x,
        at: None,
    };
    [
        (Signal::NodefsAvailable, o(root)),
        (Signal::ImagefsAvailable, o(image)),
    ]
    .into()
}

/// What one synchronize did: the conditions, whether node-level reclaim
/// ran, and the pod killed with its grace period.
struct Step {
    pressure: Vec<Condition>,
    gc: bool,
    killed: Option<(String, i64)>,
}

fn sync(
    k: &mut Kubelet,
    now: u64,
    obs: &Observations,
    after_gc: Option<&Observations>,
    pods: &[Pod],
) -> Step {
    let p = k.observe(Duration::from_secs(now), obs);
    let mut step = Step {
        pressure: p.conditions.clone(),
        gc: false,
        killed: None,
    };
    let Some(starved) = p.starved.clone() else {
        return step;
    };
    if p.node_reclaim_first(k.settings().dedicated_imagefs) {
        step.gc = true;
        if k.reclaimed_enough(after_gc.unwrap_or(obs)) {
            return step;
        }
    }
    step.killed = k
        .victims(&starved, pods, obs)
        .first()
        .map(|v| (pods[v.index].name.clone(), v.grace_seconds));
    step
}

fn kube_qos(p: Pod, q: KubeQos) -> Pod {
    Pod {
        kube_qos: Some(q),
        ..p
    }
}

/// TestMemoryPressure's pods, in kubelet's order.
fn memory_pods() -> Vec<Pod> {
    vec![
        mem_pod("guaranteed-low-priority-high-usage", -1, GI, 900 * MI),
        mem_pod("burstable-below-requests", 0, 100 * MI, 50 * MI),
        mem_pod("burstable-above-requests", 0, 100 * MI, 400 * MI),
        mem_pod("best-effort-high-priority-high-usage", 1, 0, 400 * MI),
        mem_pod("best-effort-low-priority-low-usage", -1, 0, 100 * MI),
    ]
}

fn admits(k: &Kubelet) -> [bool; 2] {
    let best = kube_qos(pod("best-admit", 0), KubeQos::BestEffort);
    let burst = kube_qos(pod("burst-admit", 0), KubeQos::Burstable);
    [k.admit(&best).is_ok(), k.admit(&burst).is_ok()]
}

const MP: &[Condition] = &[Condition::MemoryPressure];
const DP: &[Condition] = &[Condition::DiskPressure];

#[test]
fn memory_pressure() {
    let pods = memory_pods();
    let evictee = "best-effort-low-priority-low-usage";
    let mut k = kubelet(vec![
        th(Signal::MemoryAvailable, GI, 0, None),
        th(Signal::MemoryAvailable, 2 * GI, 120, None),
    ]);
    let mut t = 0;
    let s = sync(&mut k, t, &memory(2 * GI), None, &pods);
    assert!(s.pressure.is_empty() && s.killed.is_none());
    assert_eq!(admits(&k), [true, true]);
    // soft threshold met: pressure at once, no kill within the grace period
    t += 60;
    let s = sync(&mut k, t, &memory(1500 * MI), None, &pods);
    assert_eq!(s.pressure, MP);
    assert_eq!(s.killed, None);
    // grace period over: the lowest-priority exceeder goes, with the max pod grace
    t += 180;
    let s = sync(&mut k, t, &memory(1500 * MI), None, &pods);
    assert_eq!(s.killed, Some((evictee.into(), 5)));
    // relief long past the transition period
    t += 1200;
    let s = sync(&mut k, t, &memory(3 * GI), None, &pods);
    assert!(s.pressure.is_empty() && s.killed.is_none());
    // hard threshold: at once, immediate grace; BestEffort refused
    t += 60;
    let s = sync(&mut k, t, &memory(500 * MI), None, &pods);
    assert_eq!(s.pressure, MP);
    assert_eq!(s.killed, Some((evictee.into(), 1)));
    assert_eq!(admits(&k), [false, true]);
    // relief within the transition period: still MemoryPressure, no kill
    t += 60;
    let s = sync(&mut k, t, &memory(2 * GI), None, &pods);
    assert_eq!(s.pressure, MP);
    assert_eq!(s.killed, None);
    assert_eq!(admits(&k), [false, true]);
    // the transition period passed
    t += 300;
    let s = sync(&mut k, t, &memory(2 * GI), None, &pods);
    assert!(s.pressure.is_empty() && s.killed.is_none());
    assert_eq!(admits(&k), [true, true]);
}

#[test]
fn min_reclaim_keeps_a_threshold_met_until_reclaimed() {
    let pods = memory_pods();
    let evictee = Some(("best-effort-low-priority-low-usage".to_string(), 1));
    let mut k = kubelet(vec![th(Signal::MemoryAvailable, GI, 0, Some(500 * MI))]);
    let s = sync(&mut k, 0, &memory(2 * GI), None, &pods);
    assert!(s.pressure.is_empty());
    let s = sync(&mut k, 60, &memory(500 * MI), None, &pods);
    assert_eq!((s.pressure.as_slice(), s.killed), (MP, evictee.clone()));
    // 1.2 Gi is above the threshold but below threshold + min reclaim
    let s = sync(&mut k, 120, &memory(1229 * MI), None, &pods);
    assert_eq!((s.pressure.as_slice(), s.killed), (MP, evictee));
    let s = sync(&mut k, 180, &memory(2 * GI), None, &pods);
    assert_eq!((s.pressure.as_slice(), s.killed), (MP, None));
    let s = sync(&mut k, 480, &memory(2 * GI), None, &pods);
    assert!(s.pressure.is_empty() && s.killed.is_none());
}

fn disk_pods() -> Vec<Pod> {
    // requests are cpu/memory only: every pod's ephemeral-storage request is 0
    vec![
        disk_pod("low-priority-high-usage", -1, 0, [900 * MI, 0, 0]),
        disk_pod("below-requests", 0, 0, [0, 50 * MI, 0]),
        disk_pod("above-requests", 0, 0, [400 * MI, 0, 0]),
        disk_pod("high-priority-high-usage", 1, 0, [0, 0, 0]),
        disk_pod("low-priority-low-usage", -1, 0, [100 * MI, 0, 0]),
    ]
}

#[test]
fn disk_pressure_nodefs() {
    let pods = disk_pods();
    let evictee = "low-priority-high-usage";
    let best = kube_qos(pod("pod-to-admit", 0), KubeQos::BestEffort);
    let mut k = kubelet(vec![
        th(Signal::NodefsAvailable, GI, 0, None),
        th(Signal::NodefsAvailable, 2 * GI, 120, None),
    ]);
    let s = sync(&mut k, 0, &disk(16 * GI, 200 * GI), None, &pods);
    assert!(s.pressure.is_empty());
    assert!(k.admit(&best).is_ok());
    let s = sync(&mut k, 60, &disk(1536 * MI, 200 * GI), None, &pods);
    assert_eq!((s.pressure.as_slice(), s.killed), (DP, None));
    // garbage collection first; it frees nothing here, so a pod goes
    let s = sync(&mut k, 240, &disk(1536 * MI, 200 * GI), None, &pods);
    assert!(s.gc);
    assert_eq!(s.killed, Some((evictee.into(), 5)));
    let s = sync(&mut k, 1440, &disk(16 * GI, 200 * GI), None, &pods);
    assert!(s.pressure.is_empty());
    let s = sync(&mut k, 1500, &disk(500 * MI, 200 * GI), None, &pods);
    assert_eq!(s.killed, Some((evictee.into(), 1)));
    assert_eq!(
        k.admit(&best).unwrap_err().message,
        "The node had condition: [DiskPressure]. "
    );
    let s = sync(&mut k, 1560, &disk(16 * GI, 200 * GI), None, &pods);
    assert_eq!((s.pressure.as_slice(), s.killed), (DP, None));
    assert!(k.admit(&best).is_err());
    let s = sync(&mut k, 1860, &disk(16 * GI, 200 * GI), None, &pods);
    assert!(s.pressure.is_empty());
    assert!(k.admit(&best).is_ok());
}

#[test]
fn node_reclaim_funcs() {
    let pods = disk_pods();
    let mut k = kubelet(vec![th(Signal::NodefsAvailable, GI, 0, Some(500 * MI))]);
    let d = |x| disk(x, 200 * GI);
    let s = sync(&mut k, 0, &d(16 * GI), None, &pods);
    assert!(s.pressure.is_empty());
    // GC frees enough: no pod
    let s = sync(&mut k, 60, &d(922 * MI), Some(&d(16 * GI)), &pods);
    assert_eq!((s.pressure.as_slice(), s.gc, s.killed), (DP, true, None));
    let s = sync(&mut k, 1260, &d(16 * GI), None, &pods);
    assert!(s.pressure.is_empty());
    // GC frees some, not the minimum reclaim: a pod goes
    let s = sync(&mut k, 1320, &d(922 * MI), Some(&d(1126 * MI)), &pods);
    assert!(s.gc && s.killed.is_some());
    let s = sync(&mut k, 2520, &d(16 * GI), None, &pods);
    assert!(s.pressure.is_empty());
    let s = sync(&mut k, 2580, &d(400 * MI), Some(&d(400 * MI)), &pods);
    assert_eq!(s.killed, Some(("low-priority-high-usage".into(), 1)));
    let s = sync(&mut k, 2640, &d(16 * GI), None, &pods);
    assert_eq!((s.pressure.as_slice(), s.gc, s.killed), (DP, false, None));
    let s = sync(&mut k, 2940, &d(16 * GI), None, &pods);
    assert!(s.pressure.is_empty());
}

#[test]
fn inode_pressure_nodefs_inodes() {
    let pods: Vec<Pod> = [
        ("low-priority-high-usage", -1, 900),
        ("below-requests", 0, 50),
        ("above-requests", 0, 400),
        ("high-priority-high-usage", 1, 400),
        ("low-priority-low-usage", -1, 100),
    ]
    .into_iter()
    .map(|(n, p, i)| inode_pod(n, p, [i * MI, 0, 0]))
    .collect();
    let inodes = |free: i64| -> Observations {
        [(
            Signal::NodefsInodesFree,
            Observation {
                available: free,
                capacity: 4 * MI,
                at: None,
            },
        )]
        .into()
    };
    let mut k = kubelet(vec![
        th(Signal::NodefsInodesFree, MI, 0, None),
        th(Signal::NodefsInodesFree, 2 * MI, 120, None),
    ]);
    assert!(sync(&mut k, 0, &inodes(3 * MI), None, &pods)
        .pressure
        .is_empty());
    let s = sync(&mut k, 60, &inodes(3 * MI / 2), None, &pods);
    assert_eq!((s.pressure.as_slice(), s.killed), (DP, None));
    let s = sync(&mut k, 240, &inodes(3 * MI / 2), None, &pods);
    assert_eq!(s.killed, Some(("low-priority-high-usage".into(), 5)));
    let s = sync(&mut k, 1500, &inodes(MI / 2), None, &pods);
    assert_eq!(s.killed, Some(("low-priority-high-usage".into(), 1)));
}

#[test]
fn admit_under_node_conditions() {
    let guaranteed = kube_qos(pod("guaranteed-pod", 0), KubeQos::Guaranteed);
    let burstable = kube_qos(pod("burstable-pod", 0), KubeQos::Burstable);
    let best = kube_qos(pod("best-effort-pod", 0), KubeQos::BestEffort);
    let cases: &[(&[Condition], [bool; 3])] = &[
        (&[], [true, true, true]),
        (MP, [true, true, false]),
        (
            &[Condition::MemoryPressure, Condition::DiskPressure],
            [false, false, false],
        ),
    ];
    for (conds, want) in cases {
        let got = [&guaranteed, &burstable, &best].map(|p| admit(conds, p).is_ok());
        assert_eq!(got, *want, "{conds:?}");
    }
    // a BestEffort pod that tolerates memory pressure, and critical pods
    let tolerant = Pod {
        tolerates_memory_pressure: true,
        ..best.clone()
    };
    assert!(admit(MP, &tolerant).is_ok());
    let critical = Pod {
        priority: Some(2_000_000_000),
        ..best.clone()
    };
    assert!(admit(
        &[Condition::DiskPressure, Condition::PidPressure],
        &critical
    )
    .is_ok());
    let err = admit(&[Condition::MemoryPressure, Condition::DiskPressure], &best).unwrap_err();
    assert_eq!(
        err.message,
        "The node had condition: [MemoryPressure DiskPressure]. "
    );
}

#[test]
fn static_critical_pods_are_not_evicted() {
    let mut critical = mem_pod("critical", 2_000_000_000, GI, 800 * MI);
    let mut k = kubelet(vec![
        th(Signal::MemoryAvailable, GI, 0, None),
        th(Signal::MemoryAvailable, 2 * GI, 120, None),
    ]);
    let s = sync(
        &mut k,
        60,
        &memory(1500 * MI),
        None,
        std::slice::from_ref(&critical),
    );
    assert_eq!((s.pressure.as_slice(), s.killed), (MP, None));
    let s = sync(
        &mut k,
        240,
        &memory(1500 * MI),
        None,
        std::slice::from_ref(&critical),
    );
    assert_eq!((s.pressure.as_slice(), s.killed), (MP, None));
    // no priority, but static: still critical
    critical.priority = None;
    critical.critical = true;
    let s = sync(
        &mut k,
        1500,
        &memory(500 * MI),
        None,
        std::slice::from_ref(&critical),
    );
    assert_eq!((s.pressure.as_slice(), s.killed), (MP, None));
}

#[test]
fn memory_pressure_message_is_kubelets() {
    let pods = vec![
        mem_pod("below-requests", 0, GI, 900 * MI),
        mem_pod("above-requests", 0, 100 * MI, 700 * MI),
    ];
    let mut k = kubelet(vec![th(Signal::MemoryAvailable, 2 * GI, 0, None)]);
    let obs = memory(1500 * MI);
    let p = k.observe(Duration::from_secs(1), &obs);
    let v = k.victims(p.starved.as_ref().unwrap(), &pods, &obs);
    assert_eq!(pods[v[0].index].name, "above-requests");
    assert_eq!(
        v[0].message,
        "The node was low on resource: memory. Threshold quantity: 2Gi, available: 1500Mi. "
    );
    // with container figures: the containers over their requests are named
    let mut p2 = pods[1].clone();
    p2.stats.as_mut().unwrap().containers = vec![
        crate::pod::ContainerStats {
            name: "app".into(),
            working_set: Some(600 * MI),
            memory_request: 100 * MI,
            ..Default::default()
        },
        crate::pod::ContainerStats {
            name: "sidecar".into(),
            working_set: Some(10 * MI),
            memory_request: 50 * MI,
            ..Default::default()
        },
    ];
    let (msg, ann) = crate::kubelet::message(p.starved.as_ref().unwrap(), &p2, &obs);
    assert!(
        msg.ends_with(
            "Container app was using 600Mi, request is 100Mi, has larger consumption of memory. "
        ),
        "{msg}"
    );
    assert_eq!(ann["offending_containers"], "app");
    assert_eq!(ann["offending_containers_usage"], "600Mi");
    assert_eq!(ann["starved_resource"], "memory");
}

#[test]
fn a_stale_observation_is_not_acted_on_twice() {
    // kubelet's thresholdsUpdatedStats: same reading time → no action
    let mut k = kubelet(vec![th(Signal::MemoryAvailable, GI, 0, None)]);
    let mut o = memory(500 * MI);
    for v in o.values_mut() {
        v.at = Some(Duration::from_secs(10));
    }
    let p = k.observe(Duration::from_secs(10), &o);
    assert!(p.starved.is_some());
    let p = k.observe(Duration::from_secs(11), &o);
    assert!(p.starved.is_none(), "the same reading twice");
    assert_eq!(p.conditions, MP);
    for v in o.values_mut() {
        v.at = Some(Duration::from_secs(12));
    }
    assert!(k.observe(Duration::from_secs(12), &o).starved.is_some());
}

#[test]
fn memory_is_reclaimed_before_disk_and_soft_waits_are_reported() {
    let mut k = kubelet(vec![
        th(Signal::NodefsAvailable, GI, 0, None),
        th(Signal::MemoryAvailable, GI, 0, None),
        th(Signal::PidAvailable, 100, 30, None),
    ]);
    let mut o = disk(500 * MI, 200 * GI);
    o.extend(memory(500 * MI));
    o.insert(
        Signal::PidAvailable,
        Observation {
            available: 50,
            capacity: 4096,
            at: None,
        },
    );
    let p = k.observe(Duration::from_secs(5), &o);
    assert_eq!(p.starved.as_ref().unwrap().signal, Signal::MemoryAvailable);
    assert_eq!(p.met.len(), 2);
    assert_eq!(p.waiting.len(), 1);
    assert_eq!(p.waiting[0].1, Duration::from_secs(30));
    assert_eq!(
        p.conditions,
        [
            Condition::MemoryPressure,
            Condition::DiskPressure,
            Condition::PidPressure
        ]
    );
}

#[test]
fn a_met_hard_memory_threshold_is_reclaimed_for_before_a_soft_one() {
    let pods = memory_pods();
    let mut k = kubelet(vec![
        th(Signal::MemoryAvailable, 500 * MI, 30, None),
        th(Signal::AllocatableMemoryAvailable, 100 * MI, 0, None),
    ]);
    let mut o = memory(400 * MI);
    o.get_mut(&Signal::AllocatableMemoryAvailable)
        .unwrap()
        .available = 50 * MI;
    k.observe(Duration::ZERO, &o);
    let p = k.observe(Duration::from_secs(30), &o);
    assert_eq!(p.met.len(), 2);
    let starved = p.starved.unwrap();
    assert!(starved.is_hard(), "{starved:?}");
    assert_eq!(k.victims(&starved, &pods, &o)[0].grace_seconds, 1);
}

#[test]
fn no_second_victim_while_the_first_is_cleaned_up() {
    let pods = memory_pods();
    let mut k = kubelet(vec![th(Signal::MemoryAvailable, GI, 0, None)]);
    let t = Duration::from_secs;
    assert!(!k.cleaning_up(t(0), &pods));
    k.evicted("best-effort-low-priority-low-usage", t(0));
    assert!(k.cleaning_up(t(10), &pods), "still listed");
    assert!(!k.cleaning_up(t(30), &pods), "waited long enough");
    k.evicted("best-effort-low-priority-low-usage", t(40));
    let gone: Vec<Pod> = pods[..4].to_vec();
    assert!(!k.cleaning_up(t(41), &gone), "no longer listed");
}

#[test]
fn a_soft_eviction_never_gives_more_than_the_pods_own_grace() {
    let mut pods = memory_pods();
    pods[4].grace_seconds = Some(3);
    let mut k = kubelet(vec![th(Signal::MemoryAvailable, 2 * GI, 60, None)]);
    let o = memory(1500 * MI);
    k.observe(Duration::ZERO, &o);
    let p = k.observe(Duration::from_secs(60), &o);
    let v = k.victims(p.starved.as_ref().unwrap(), &pods, &o);
    assert_eq!(
        (pods[v[0].index].name.as_str(), v[0].grace_seconds),
        ("best-effort-low-priority-low-usage", 3)
    );
    // evictionMaxPodGracePeriod 0 (kubelet's default): killed at once, never
    // the pod's own period (an hour would hold every other eviction)
    pods[4].grace_seconds = Some(3600);
    let mut k = Kubelet::new(Settings {
        max_pod_grace_seconds: 0,
        ..k.settings().clone()
    });
    k.observe(Duration::ZERO, &o);
    let p = k.observe(Duration::from_secs(60), &o);
    let v = k.victims(p.starved.as_ref().unwrap(), &pods, &o);
    assert_eq!(v[0].grace_seconds, 1);
}

#[test]
fn a_reconfigured_minimum_reclaim_applies_at_once() {
    let pods = memory_pods();
    let mut k = kubelet(vec![th(Signal::MemoryAvailable, GI, 0, Some(GI))]);
    assert!(k
        .observe(Duration::ZERO, &memory(500 * MI))
        .starved
        .is_some());
    let mut s = k.settings().clone();
    s.thresholds = vec![th(Signal::MemoryAvailable, GI, 0, Some(0))];
    k.reconfigure(s);
    // 1.5 Gi: met with the old reclaim (2 Gi), not with the new one
    let p = k.observe(Duration::from_secs(1), &memory(1536 * MI));
    assert!(p.starved.is_none(), "{p:?}");
    let _ = pods;
    // a condition no threshold can raise any more is dropped
    let mut s = k.settings().clone();
    s.thresholds = vec![th(Signal::NodefsAvailable, GI, 0, None)];
    k.reconfigure(s);
    assert!(k
        .observe(Duration::from_secs(2), &memory(100 * MI))
        .conditions
        .is_empty());
}

#[test]
fn an_unreachable_minimum_reclaim_is_refused() {
    let maps = crate::threshold::ThresholdMaps {
        eviction_hard: [("memory.available".to_string(), "10%".to_string())].into(),
        eviction_minimum_reclaim: [("memory.available".to_string(), "95%".to_string())].into(),
        ..Default::default()
    };
    let e = crate::threshold::parse(&maps, false).unwrap_err();
    assert!(e.to_string().contains("could never clear"), "{e}");
}

#[test]
fn messages_print_amounts_as_kubelet() {
    // inodes: DecimalSI as written ("1M"), available as a count (500k)
    let maps = crate::threshold::ThresholdMaps {
        eviction_hard: [("nodefs.inodesFree".to_string(), "1M".to_string())].into(),
        ..Default::default()
    };
    let t = crate::threshold::parse(&maps, false).unwrap().remove(0);
    let obs: Observations = [(
        Signal::NodefsInodesFree,
        Observation {
            available: 500_000,
            capacity: 4_000_000,
            at: None,
        },
    )]
    .into();
    let (msg, _) = crate::kubelet::message(&t, &inode_pod("p", 0, [1, 0, 0]), &obs);
    assert_eq!(
        msg,
        "The node was low on resource: inodes. Threshold quantity: 1M, available: 500k. "
    );
    // ephemeral storage: the containers over their request are named
    let mut p = disk_pod("p", 0, 0, [300 * MI, 0, 0]);
    p.stats.as_mut().unwrap().containers = vec![crate::pod::ContainerStats {
        name: "writer".into(),
        disk_used: Some(300 * MI),
        ephemeral_request: 100 * MI,
        ..Default::default()
    }];
    let t = th(Signal::NodefsAvailable, GI, 0, None);
    let (msg, ann) = crate::kubelet::message(&t, &p, &disk(500 * MI, 10 * GI));
    assert!(msg.ends_with("Container writer was using 300Mi, request is 100Mi, has larger consumption of ephemeral-storage. "), "{msg}");
    assert_eq!(ann["starved_resource"], "ephemeral-storage");
}
