//! kubelet's threshold tests (helpers_test.go, v1.28): `ParseThresholdConfig`
//! (all 17 cases), `AddAllocatableThresholds`, `thresholdsMet` with quantities
//! and percentages, Go durations.

use std::collections::BTreeMap;
use std::time::Duration;

use super::*;
use crate::kubelet::{thresholds_met, Observation, Observations};
use crate::signal::Signal::{self, *};
use crate::threshold::{
    parse, parse_go_duration, Amount, Threshold, ThresholdError, ThresholdMaps,
};

fn m(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
    kv.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn t(signal: Signal, value: Amount, grace_s: u64, min: Option<Amount>) -> Threshold {
    Threshold {
        signal,
        value,
        grace: Duration::from_secs(grace_s),
        min_reclaim: min,
        binary: true,
    }
}

use Amount::{Percent as P, Quantity as Q};

type Maps<'a> = [&'a [(&'a str, &'a str)]; 4];

fn maps(x: Maps) -> ThresholdMaps {
    ThresholdMaps {
        eviction_hard: m(x[0]),
        eviction_soft: m(x[1]),
        eviction_soft_grace_period: m(x[2]),
        eviction_minimum_reclaim: m(x[3]),
    }
}

/// kubelet compares the results as unordered sets.
fn same_set(a: &[Threshold], b: &[Threshold]) -> bool {
    a.len() == b.len() && a.iter().all(|x| b.contains(x))
}

#[test]
fn parse_threshold_config() {
    let gp = &[("memory.available", "30s")][..];
    let disk_gp = &[("imagefs.available", "30s"), ("nodefs.available", "30s")][..];
    let inode_gp = &[("imagefs.inodesFree", "30s"), ("nodefs.inodesFree", "30s")][..];
    let cases: Vec<(&str, bool, Maps, Option<Vec<Threshold>>)> = vec![
        ("no values", false, [&[], &[], &[], &[]], Some(vec![])),
        (
            "all memory eviction values",
            true,
            [
                &[("memory.available", "150Mi")],
                &[("memory.available", "300Mi")],
                gp,
                &[("memory.available", "0")],
            ],
            Some(vec![
                t(AllocatableMemoryAvailable, Q(150 * MI), 0, Some(Q(0))),
                t(MemoryAvailable, Q(150 * MI), 0, Some(Q(0))),
                t(MemoryAvailable, Q(300 * MI), 30, Some(Q(0))),
            ]),
        ),
        (
            "all memory eviction values in percentages",
            false,
            [
                &[("memory.available", "10%")],
                &[("memory.available", "30%")],
                gp,
                &[("memory.available", "5%")],
            ],
            Some(vec![
                t(MemoryAvailable, P(0.1), 0, Some(P(0.05))),
                t(MemoryAvailable, P(0.3), 30, Some(P(0.05))),
            ]),
        ),
        (
            "disk eviction values",
            false,
            [
                &[
                    ("imagefs.available", "150Mi"),
                    ("nodefs.available", "100Mi"),
                ],
                &[
                    ("imagefs.available", "300Mi"),
                    ("nodefs.available", "200Mi"),
                ],
                disk_gp,
                &[("imagefs.available", "2Gi"), ("nodefs.available", "1Gi")],
            ],
            Some(vec![
                t(ImagefsAvailable, Q(150 * MI), 0, Some(Q(2 * GI))),
                t(NodefsAvailable, Q(100 * MI), 0, Some(Q(GI))),
                t(ImagefsAvailable, Q(300 * MI), 30, Some(Q(2 * GI))),
                t(NodefsAvailable, Q(200 * MI), 30, Some(Q(GI))),
            ]),
        ),
        (
            "disk eviction values in percentages",
            false,
            [
                &[("imagefs.available", "15%"), ("nodefs.available", "10.5%")],
                &[("imagefs.available", "30%"), ("nodefs.available", "20.5%")],
                disk_gp,
                &[("imagefs.available", "10%"), ("nodefs.available", "5%")],
            ],
            Some(vec![
                t(ImagefsAvailable, P(0.15), 0, Some(P(0.1))),
                t(NodefsAvailable, P(0.105), 0, Some(P(0.05))),
                t(ImagefsAvailable, P(0.3), 30, Some(P(0.1))),
                t(NodefsAvailable, P(0.205), 30, Some(P(0.05))),
            ]),
        ),
        (
            "inode eviction values",
            false,
            [
                &[
                    ("imagefs.inodesFree", "150Mi"),
                    ("nodefs.inodesFree", "100Mi"),
                ],
                &[
                    ("imagefs.inodesFree", "300Mi"),
                    ("nodefs.inodesFree", "200Mi"),
                ],
                inode_gp,
                &[("imagefs.inodesFree", "2Gi"), ("nodefs.inodesFree", "1Gi")],
            ],
            Some(vec![
                t(ImagefsInodesFree, Q(150 * MI), 0, Some(Q(2 * GI))),
                t(NodefsInodesFree, Q(100 * MI), 0, Some(Q(GI))),
                t(ImagefsInodesFree, Q(300 * MI), 30, Some(Q(2 * GI))),
                t(NodefsInodesFree, Q(200 * MI), 30, Some(Q(GI))),
            ]),
        ),
        (
            "disable via 0%",
            false,
            [
                &[("memory.available", "0%")],
                &[("memory.available", "0%")],
                &[],
                &[],
            ],
            Some(vec![]),
        ),
        (
            "disable via 100%",
            false,
            [
                &[("memory.available", "100%")],
                &[("memory.available", "100%")],
                &[],
                &[],
            ],
            Some(vec![]),
        ),
        (
            "invalid-signal",
            false,
            [&[("mem.available", "150Mi")], &[], &[], &[]],
            None,
        ),
        (
            "hard-signal-negative",
            false,
            [&[("memory.available", "-150Mi")], &[], &[], &[]],
            None,
        ),
        (
            "hard-signal-negative-percentage",
            false,
            [&[("memory.available", "-15%")], &[], &[], &[]],
            None,
        ),
        (
            "hard-signal-percentage-greater-than-100%",
            false,
            [&[("memory.available", "150%")], &[], &[], &[]],
            None,
        ),
        (
            "soft-signal-negative",
            false,
            [&[], &[("memory.available", "-150Mi")], &[], &[]],
            None,
        ),
        (
            "valid-and-invalid-signal",
            false,
            [
                &[("memory.available", "150Mi"), ("invalid.foo", "150Mi")],
                &[],
                &[],
                &[],
            ],
            None,
        ),
        (
            "soft-no-grace-period",
            false,
            [&[], &[("memory.available", "150Mi")], &[], &[]],
            None,
        ),
        (
            "soft-negative-grace-period",
            false,
            [
                &[],
                &[("memory.available", "150Mi")],
                &[("memory.available", "-30s")],
                &[],
            ],
            None,
        ),
        (
            "negative-reclaim",
            false,
            [&[], &[], &[], &[("memory.available", "-300Mi")]],
            None,
        ),
    ];
    assert_eq!(cases.len(), 17);
    for (name, alloc, x, want) in cases {
        let got = parse(&maps(x), alloc);
        match (got, want) {
            (Ok(g), Some(w)) => assert!(same_set(&g, &w), "{name}: {g:?} != {w:?}"),
            (Err(_), None) => {}
            (g, w) => panic!("{name}: got {g:?}, want {w:?}"),
        }
    }
}

#[test]
fn errors_name_their_field() {
    let e = parse(
        &maps([&[("memory.available", "150%")], &[], &[], &[]]),
        false,
    )
    .unwrap_err();
    assert!(
        e.to_string()
            .starts_with("eviction.evictionHard[\"memory.available\"]"),
        "{e}"
    );
    let e = parse(
        &maps([&[], &[("memory.available", "1Gi")], &[], &[]]),
        false,
    )
    .unwrap_err();
    assert_eq!(
        e,
        ThresholdError::MissingGrace {
            signal: MemoryAvailable
        }
    );
    let e = parse(
        &maps([&[], &[], &[("nodefs.available", "soon")], &[]]),
        false,
    )
    .unwrap_err();
    assert!(
        e.to_string()
            .contains("evictionSoftGracePeriod[\"nodefs.available\"]"),
        "{e}"
    );
    // a hostile key is cut in what the error repeats
    let long = "x".repeat(10_000);
    let e = parse(&maps([&[(long.as_str(), "1Gi")], &[], &[], &[]]), false).unwrap_err();
    assert!(e.to_string().len() < 300, "{}", e.to_string().len());
}

#[test]
fn add_allocatable_thresholds() {
    let hard = |v, min| t(MemoryAvailable, Q(v), 0, Some(Q(min)));
    let alloc = |v, min| t(AllocatableMemoryAvailable, Q(v), 0, Some(Q(min)));
    // non-memory signal and a soft memory threshold get no copy
    let got = parse(
        &maps([
            &[("imagefs.available", "150Mi")],
            &[],
            &[],
            &[("imagefs.available", "0")],
        ]),
        true,
    )
    .unwrap();
    assert_eq!(got, vec![t(ImagefsAvailable, Q(150 * MI), 0, Some(Q(0)))]);
    let got = parse(
        &maps([
            &[],
            &[("memory.available", "150Mi")],
            &[("memory.available", "10s")],
            &[],
        ]),
        true,
    )
    .unwrap();
    assert_eq!(got.len(), 1);
    let got = parse(
        &maps([
            &[("memory.available", "150Mi")],
            &[],
            &[],
            &[("memory.available", "0")],
        ]),
        true,
    )
    .unwrap();
    assert!(same_set(&got, &[alloc(150 * MI, 0), hard(150 * MI, 0)]));
}

fn obs(kv: &[(Signal, i64, i64)]) -> Observations {
    kv.iter()
        .map(|(s, a, c)| {
            (
                *s,
                Observation {
                    available: *a,
                    capacity: *c,
                    at: None,
                },
            )
        })
        .collect()
}

#[test]
fn thresholds_met_with_quantities() {
    let hard = t(MemoryAvailable, Q(GI), 0, Some(Q(500 * MI)));
    let cases: &[(&str, bool, bool, i64, bool)] = &[
        ("threshold-met-memory", false, true, 500 * MI, true),
        ("threshold-not-met", false, true, 2 * GI, false),
        (
            "threshold-met-with-min-reclaim",
            true,
            true,
            1075 * MI,
            true,
        ),
        (
            "threshold-not-met-with-min-reclaim",
            true,
            true,
            2 * GI,
            false,
        ),
    ];
    assert!(thresholds_met(&[], &obs(&[]), false).is_empty());
    for (name, enforce, _, avail, met) in cases {
        let got = thresholds_met(
            std::slice::from_ref(&hard),
            &obs(&[(MemoryAvailable, *avail, 0)]),
            *enforce,
        );
        assert_eq!(!got.is_empty(), *met, "{name}");
    }
}

#[test]
fn percentage_thresholds_met() {
    let t0 = t(MemoryAvailable, P(0.2), 0, Some(P(0.05)));
    let t1 = t(NodefsAvailable, P(0.3), 0, None);
    let both = [t0.clone(), t1.clone()];
    type Case = (&'static str, bool, Vec<(Signal, i64, i64)>, Vec<Threshold>);
    let cases: Vec<Case> = vec![
        (
            "BothMet",
            false,
            vec![
                (MemoryAvailable, 100 * MI, 1000 * MI),
                (NodefsAvailable, 100 * GI, 1000 * GI),
            ],
            both.to_vec(),
        ),
        (
            "NoneMet",
            false,
            vec![
                (MemoryAvailable, 300 * MI, 1000 * MI),
                (NodefsAvailable, 400 * GI, 1000 * GI),
            ],
            vec![],
        ),
        (
            "DiskMet",
            false,
            vec![
                (MemoryAvailable, 300 * MI, 1000 * MI),
                (NodefsAvailable, 100 * GI, 1000 * GI),
            ],
            vec![t1.clone()],
        ),
        (
            "MemoryMet",
            false,
            vec![
                (MemoryAvailable, 100 * MI, 1000 * MI),
                (NodefsAvailable, 400 * GI, 1000 * GI),
            ],
            vec![t0.clone()],
        ),
        (
            "MemoryMetWithMinReclaim",
            true,
            vec![(MemoryAvailable, 225 * MI, 1000 * MI)],
            vec![t0.clone()],
        ),
        (
            "MemoryNotMetWithMinReclaim",
            true,
            vec![(MemoryAvailable, 300 * MI, 1000 * MI)],
            vec![],
        ),
    ];
    for (name, enforce, o, want) in cases {
        assert_eq!(thresholds_met(&both, &obs(&o), enforce), want, "{name}");
    }
}

#[test]
fn parse_percentage_and_durations() {
    let p = |v: &str| parse(&maps([&[("memory.available", v)], &[], &[], &[]]), false);
    assert_eq!(p("25.5%").unwrap()[0].value, P(0.255));
    for bad in ["blah%", "foo%", "12%345", "%", "NaN%", "inf%"] {
        assert!(p(bad).is_err(), "{bad}");
    }
    // "0.0%" is not the literal "0%": a threshold that is never met
    assert_eq!(p("0.0%").unwrap()[0].value, P(0.0));
    let d = |s: &str| parse_go_duration(s);
    assert_eq!(d("90s"), Some((Duration::from_secs(90), false)));
    assert_eq!(d("1m30s"), Some((Duration::from_secs(90), false)));
    assert_eq!(d("1.5h"), Some((Duration::from_secs(5400), false)));
    assert_eq!(d("300ms"), Some((Duration::from_millis(300), false)));
    assert_eq!(d("-30s"), Some((Duration::from_secs(30), true)));
    assert_eq!(d("0"), Some((Duration::ZERO, false)));
    for bad in ["", "30", "s", "1x", "1m30", ".s", "1e3s", "--1s"] {
        assert_eq!(d(bad), None, "{bad}");
    }
}
