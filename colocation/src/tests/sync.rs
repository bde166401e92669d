//! koord-manager's degrade and sync cases (`TestPlugin_isDegradeNeeded`,
//! `Test_isNodeResourceSyncNeeded`) as data.

use crate::strategy::Strategy;
use crate::sync::*;

const G: i64 = 1_000_000_000;

#[test]
fn degrade() {
    let mut s = Strategy::defaults();
    s.degrade_time_minutes = Some(10);
    let now = 100_000;
    assert!(degraded(None, now, &s).is_some(), "never updated");
    assert!(
        degraded(Some(now - 11 * 60), now, &s).is_some(),
        "11 minutes old"
    );
    assert!(
        degraded(Some(now - 10 * 60), now, &s).is_none(),
        "exactly 10 minutes: not after"
    );
    assert!(degraded(Some(now - 30), now, &s).is_none());
}

#[test]
fn sync_needed() {
    let s = Strategy::defaults();
    let a = |cpu: i64, mem: i64| Advertised {
        cpu: Some(cpu),
        memory: Some(mem * G),
    };
    let cases: [(&str, Advertised, Advertised, Option<i64>, bool); 8] = [
        ("cpu 20 -> 15", a(20_000, 40), a(15_000, 40), Some(10), true),
        (
            "memory 40G -> 70G",
            a(20_000, 40),
            a(20_000, 70),
            Some(10),
            true,
        ),
        (
            "identical, synced just now",
            a(20_000, 40),
            a(20_000, 40),
            Some(0),
            false,
        ),
        (
            "identical, synced 10 min ago",
            a(20_000, 40),
            a(20_000, 40),
            Some(600),
            true,
        ),
        ("never synced", a(20_000, 40), a(20_000, 40), None, true),
        (
            "exactly 10 %: not more",
            a(20_000, 40),
            a(22_000, 40),
            Some(10),
            false,
        ),
        ("appears", Advertised::NONE, a(1, 1), Some(10), true),
        ("disappears", a(1, 1), Advertised::NONE, Some(10), true),
    ];
    for (name, old, new, age, want) in cases {
        assert_eq!(due(old, new, age, &s).is_some(), want, "{name}");
    }
    assert_eq!(
        due(a(20_000, 40), a(15_000, 40), Some(10), &s),
        Some(Due::Moved {
            resource: crate::BATCH_CPU,
            old: 20_000,
            new: 15_000
        })
    );
    assert_eq!(
        due(a(20_000, 40), a(15_000, 40), Some(10), &s)
            .unwrap()
            .to_string(),
        "kubernetes.io/batch-cpu moves from 20000 to 15000 (-25.0%, over resourceDiffThreshold)"
    );
    // from 0: any value is a move
    assert!(due(a(0, 0), a(1, 0), Some(1), &s).is_some());
    assert!(due(a(0, 0), a(0, 0), Some(1), &s).is_none());
}
