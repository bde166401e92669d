//! kubelet's ranking tests (helpers_test.go, v1.28): inputs and expected orders.

use std::cmp::Ordering;

use super::*;
use crate::kubelet::rank::{self, FsSet};
use crate::signal::{Resource, Signal};

fn sorted(pods: &[Pod], input: &[&str], cmp: impl Fn(&Pod, &Pod) -> Ordering) -> Vec<String> {
    let mut v: Vec<&Pod> = input
        .iter()
        .map(|n| pods.iter().find(|p| p.name == *n).unwrap())
        .collect();
    v.sort_by(|a, b| cmp(a, b));
    names(&v)
}

#[test]
fn ordered_by_exceeds_request_memory() {
    let pods = [
        mem_pod("below-requests", -1, 200 * MI, 199 * MI),
        mem_pod("exceeds-requests", 1, 100 * MI, 101 * MI),
    ];
    assert_eq!(
        sorted(
            &pods,
            &["below-requests", "exceeds-requests"],
            rank::by_exceeds_memory_request
        ),
        ["exceeds-requests", "below-requests"]
    );
}

#[test]
fn ordered_by_exceeds_request_disk() {
    let pods = [
        disk_pod("below-requests", -1, 200 * MI, [100 * MI, 99 * MI, 0]),
        disk_pod("exceeds-requests", 1, 100 * MI, [90 * MI, 11 * MI, 0]),
    ];
    let cmp = rank::by_exceeds_disk_request(FsSet::ALL, Resource::EphemeralStorage);
    assert_eq!(
        sorted(&pods, &["below-requests", "exceeds-requests"], cmp),
        ["exceeds-requests", "below-requests"]
    );
}

#[test]
fn ordered_by_priority() {
    let pods = [
        pod("low-priority", -134),
        pod("medium-priority", 1),
        pod("high-priority", 12534),
    ];
    assert_eq!(
        sorted(
            &pods,
            &["high-priority", "medium-priority", "low-priority"],
            rank::by_priority
        ),
        ["low-priority", "medium-priority", "high-priority"]
    );
}

#[test]
fn ordered_by_disk() {
    let pods = [
        disk_pod("best-effort-high", 0, 0, [50 * MI, 100 * MI, 150 * MI]),
        disk_pod("best-effort-low", 0, 0, [25 * MI, 25 * MI, 50 * MI]),
        disk_pod("burstable-high", 0, 100 * MI, [150 * MI, 150 * MI, 50 * MI]),
        disk_pod("burstable-low", 0, 100 * MI, [25 * MI, 35 * MI, 50 * MI]),
        disk_pod(
            "guaranteed-high",
            0,
            400 * MI,
            [225 * MI, 100 * MI, 50 * MI],
        ),
        disk_pod("guaranteed-low", 0, 400 * MI, [25 * MI, 45 * MI, 50 * MI]),
    ];
    let input: Vec<&str> = pods.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(
        sorted(
            &pods,
            &input,
            rank::by_disk(FsSet::ALL, Resource::EphemeralStorage)
        ),
        [
            "best-effort-high",
            "burstable-high",
            "best-effort-low",
            "burstable-low",
            "guaranteed-high",
            "guaranteed-low"
        ]
    );
}

#[test]
fn ordered_by_inodes() {
    let pods = [
        inode_pod("low", 0, [50000, 100000, 50000]),
        inode_pod("medium", 0, [100000, 150000, 50000]),
        inode_pod("high", 0, [200000, 150000, 50000]),
    ];
    assert_eq!(
        sorted(
            &pods,
            &["low", "medium", "high"],
            rank::by_disk(FsSet::ALL, Resource::Inodes)
        ),
        ["high", "medium", "low"]
    );
}

#[test]
fn ordered_by_priority_disk_is_rank_disk_pressure() {
    let pods = [
        disk_pod("pod1", -1, 0, [200 * MI, 100 * MI, 200 * MI]),
        disk_pod("pod2", -1, 0, [10 * MI, 10 * MI, 30 * MI]),
        disk_pod("pod3", 1, 100 * MI, [200 * MI, 150 * MI, 250 * MI]),
        disk_pod("pod4", 1, 100 * MI, [90 * MI, 50 * MI, 10 * MI]),
        disk_pod("pod5", -1, GI, [500 * MI, 200 * MI, 100 * MI]),
        disk_pod("pod6", -1, GI, [50 * MI, 100 * MI, 50 * MI]),
        disk_pod("pod7", 1, GI, [250 * MI, 500 * MI, 50 * MI]),
        disk_pod("pod8", 1, GI, [100 * MI, 60 * MI, 40 * MI]),
    ];
    let mut v: Vec<&Pod> = pods.iter().rev().collect();
    rank::rank(Signal::NodefsAvailable, &mut v, false);
    assert_eq!(
        names(&v),
        ["pod1", "pod2", "pod3", "pod4", "pod5", "pod6", "pod7", "pod8"]
    );
}

#[test]
fn ordered_by_priority_inodes() {
    let pods = [
        inode_pod("pod1", -1, [50000, 100000, 250000]),
        inode_pod("pod2", -1, [60000, 30000, 10000]),
        inode_pod("pod3", 1, [150000, 150000, 50000]),
        inode_pod("pod4", 1, [10000, 40000, 100000]),
    ];
    let disk = rank::by_disk(FsSet::ALL, Resource::Inodes);
    let input = ["pod4", "pod3", "pod2", "pod1"];
    assert_eq!(
        sorted(&pods, &input, |a, b| rank::by_priority(a, b)
            .then_with(|| disk(a, b))),
        ["pod1", "pod2", "pod3", "pod4"]
    );
    // and through the rank function (every pod exceeds its zero inode request)
    let mut v: Vec<&Pod> = pods.iter().rev().collect();
    rank::rank(Signal::NodefsInodesFree, &mut v, false);
    assert_eq!(names(&v), ["pod1", "pod2", "pod3", "pod4"]);
}

#[test]
fn ordered_by_memory() {
    let pods = [
        mem_pod("pod1", 0, 0, 500 * MI),
        mem_pod("pod2", 0, 0, 300 * MI),
        mem_pod("pod3", 0, 100 * MI, 800 * MI),
        mem_pod("pod4", 0, 100 * MI, 300 * MI),
        mem_pod("pod5", 0, GI, 800 * MI),
        mem_pod("pod6", 0, GI, 200 * MI),
    ];
    let input = ["pod1", "pod2", "pod3", "pod4", "pod5", "pod6"];
    assert_eq!(
        sorted(&pods, &input, rank::by_memory),
        ["pod3", "pod1", "pod2", "pod4", "pod5", "pod6"]
    );
}

#[test]
fn ordered_by_priority_memory_is_rank_memory_pressure() {
    let pods = [
        mem_pod("pod1", -1, 0, 500 * MI),
        mem_pod("pod2", -1, 0, 50 * MI),
        mem_pod("pod3", 1, 100 * MI, 600 * MI),
        mem_pod("pod4", 1, 100 * MI, 150 * MI),
        mem_pod("pod5", -1, GI, 800 * MI),
        mem_pod("pod6", -1, GI, 200 * MI),
        mem_pod("pod7", 1, GI, 800 * MI),
        mem_pod("pod8", 1, GI, 200 * MI),
    ];
    for signal in [Signal::MemoryAvailable, Signal::AllocatableMemoryAvailable] {
        let mut v: Vec<&Pod> = pods.iter().rev().collect();
        rank::rank(signal, &mut v, false);
        assert_eq!(
            names(&v),
            ["pod1", "pod2", "pod3", "pod4", "pod5", "pod6", "pod7", "pod8"]
        );
    }
}

#[test]
fn ordered_by_priority_process_is_rank_pid_pressure() {
    let p = |name: &str, prio, n| Pod {
        stats: Some(PodStats {
            processes: Some(n),
            ..Default::default()
        }),
        ..pod(name, prio)
    };
    let pods = [
        p("pod1", -1, 20),
        p("pod2", -1, 6),
        p("pod3", 1, 20),
        p("pod4", 1, 5),
    ];
    let mut v: Vec<&Pod> = pods.iter().rev().collect();
    rank::rank(Signal::PidAvailable, &mut v, false);
    assert_eq!(names(&v), ["pod1", "pod2", "pod3", "pod4"]);
}

/// Not in kubelet's tests, but its comparators say so: a pod without stats
/// sorts first in every stats comparator; priority unset is 0.
#[test]
fn a_pod_without_stats_goes_first_and_unset_priority_is_zero() {
    let mut nostats = pod("no-stats", 5);
    nostats.stats = None;
    let mut unset = mem_pod("unset", 0, 0, 10 * MI);
    unset.priority = None;
    let pods = [mem_pod("big", -1, 0, 900 * MI), unset, nostats];
    let mut v: Vec<&Pod> = pods.iter().collect();
    rank::rank(Signal::MemoryAvailable, &mut v, false);
    assert_eq!(names(&v), ["no-stats", "big", "unset"]);
}

#[test]
fn a_dedicated_imagefs_splits_what_each_signal_measures() {
    // root only on imagefs; logs + volumes on nodefs
    let pods = [
        disk_pod("writes-layers", 0, 0, [500 * MI, 0, 0]),
        disk_pod("writes-logs", 0, 0, [0, 400 * MI, 0]),
    ];
    let mut v: Vec<&Pod> = pods.iter().collect();
    rank::rank(Signal::ImagefsAvailable, &mut v, true);
    assert_eq!(names(&v), ["writes-layers", "writes-logs"]);
    let mut v: Vec<&Pod> = pods.iter().collect();
    rank::rank(Signal::NodefsAvailable, &mut v, true);
    assert_eq!(names(&v), ["writes-logs", "writes-layers"]);
}
