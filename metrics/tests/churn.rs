//! The cache's memory comes back after container churn: 1,000 new container
//! ids a minute for 10 simulated minutes, then their expiry. Measured as the
//! cache's own allocations (`Tsdb::memory_bytes`: tables, keys, series, data).
//! And the series cap holds under that churn without evicting live pods.

use qoslet_metrics::{Metric, Tsdb};

const T0: u32 = 1_800_000_000;
const STEADY: usize = 50;

fn container(id: usize, t: u32) -> [(Metric, f64); 4] {
    let wobble = f64::from(t % 7) / 100.0;
    [
        (Metric::CpuUsage, 0.1 + (id % 10) as f64 / 10.0 + wobble),
        (Metric::MemoryWorkingSet, 64e6 + id as f64 * 4096.0),
        (Metric::MemoryUsage, 80e6 + id as f64 * 4096.0),
        (Metric::OomKills, 0.0),
    ]
}

/// 31 simulated minutes at 1 s: `STEADY` long-lived pods throughout; with
/// `churn`, from minute 1 to 11 every second brings 17 new container ids
/// (about 1,000 a minute), each living 60 s. Returns (peak series, peak
/// bytes, bytes at the end).
fn run(churn: bool, cap: usize) -> (usize, usize, usize) {
    let mut db = Tsdb::new(1).with_max_series(cap);
    let (mut peak_series, mut peak) = (0usize, 0usize);
    let mut next_id = 0usize;
    let mut live: Vec<(String, usize, u32)> = Vec::new();
    for t in T0..T0 + 31 * 60 {
        for i in 0..STEADY {
            db.record(&format!("pod/steady-{i}"), t, &container(i, t));
        }
        if churn && (T0 + 60..T0 + 11 * 60).contains(&t) {
            for _ in 0..17 {
                live.push((format!("container/{next_id:064x}"), next_id, t));
                next_id += 1;
            }
        }
        live.retain(|(_, _, born)| t < born + 60);
        for (name, id, _) in &live {
            db.record(name, t, &container(*id, t));
        }
        db.expire(t);
        peak_series = peak_series.max(db.series_count());
        peak = peak.max(db.memory_bytes());
    }
    if churn {
        assert!(next_id >= 10_000, "{next_id} ids churned");
    }
    for i in 0..STEADY {
        assert!(
            db.last(&format!("pod/steady-{i}"), Metric::CpuUsage)
                .is_some(),
            "live pods are never what the cap evicts"
        );
    }
    (peak_series, peak, db.memory_bytes())
}

#[test]
fn memory_comes_back_after_churn() {
    let (_, _, steady) = run(false, qoslet_metrics::tsdb::DEFAULT_MAX_SERIES);
    let (peak_series, peak, churned) = run(true, qoslet_metrics::tsdb::DEFAULT_MAX_SERIES);
    eprintln!(
        "steady only: {steady} bytes at the end; with churn: peak {peak_series} series, {peak} bytes, {churned} bytes at the end"
    );
    assert!(
        peak_series > 4_000,
        "the churn really happened: {peak_series}"
    );
    assert!(peak > 3 * steady, "and cost memory while it ran: {peak}");
    assert!(
        churned <= steady + steady / 10 + 64 * 1024,
        "after expiry the cache is back to its steady size: {churned} vs {steady}"
    );
}

#[test]
fn the_series_cap_holds_under_churn() {
    let (peak_series, peak, _) = run(true, 6_000);
    assert!(peak_series <= 6_000, "{peak_series}");
    let (_, uncapped, _) = run(true, qoslet_metrics::tsdb::DEFAULT_MAX_SERIES);
    assert!(
        peak * 4 < uncapped,
        "capped {peak} bytes, uncapped {uncapped}"
    );
}
