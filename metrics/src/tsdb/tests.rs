use super::*;

const T0: u32 = 1_800_000_000; // a minute boundary (divisible by 60)

/// A rollup row: (minute, avg code, histogram).
type HistRow = (u32, u32, Vec<(u32, u32)>);

/// Every rollup row of a series.
fn rows(s: &Series) -> Vec<HistRow> {
    let mut out = Vec::new();
    s.rollups(Scale::of(Metric::CpuUsage), 0, u32::MAX, &mut |t, r| {
        if let Row::Hist(a, h) = r {
            out.push((t, a, h.to_vec()))
        }
    });
    out
}

#[test]
fn blocks_round_trip_with_runs_and_gaps() {
    let mut b = Block::<2>::new(100);
    let rows = [
        (100, [5, 7]),
        (101, [5, 7]),
        (102, [5, 7]),
        (103, [6, 7]),  // packed 3-bit
        (104, [13, 0]), // packed 4-bit
        (105, [5, 8]),  // full
        (110, [6, 7]),  // gap
        (111, [6, 7]),
        (112, [0, 1_000_000]),
        (113, [0, 1_000_000]),
    ];
    for (t, v) in rows {
        b.push(t, v, 1);
    }
    assert_eq!(b.rows_vec(1), rows.to_vec());
    let mut out = Vec::new();
    let _ = b.seal_into(&mut out);
    let got: Vec<_> = blocks(&out).collect();
    assert_eq!(got.len(), 1);
    assert_eq!((got[0].0, got[0].1, got[0].2), (100, 10, 113));
    let mut back = Vec::new();
    decode_rows::<2>(got[0].3, 100, 1, &mut |t, v| back.push((t, v)));
    assert_eq!(back, rows.to_vec());
    // single-field blocks (raw samples) and garbage
    let mut one = Block::<1>::new(7);
    let vals = [3u32, 3, 300, 299, 0, 70_000];
    for (i, v) in vals.iter().enumerate() {
        one.push(7 + i as u32, [*v], 1);
    }
    let got: Vec<u32> = one.rows_vec(1).into_iter().map(|(_, [v])| v).collect();
    assert_eq!(got, vals.to_vec());
    let mut n = 0;
    decode_rows::<6>(&[0xff, 0x00, 0x03, 0x80], 0, 60, &mut |_, _| n += 1);
    assert!(n <= 1, "garbage decodes to little, without a panic");
}

#[test]
fn steady_series_cost_almost_nothing() {
    let mut db = Tsdb::new(1);
    for i in 0..3600 {
        db.record("c", T0 + i, &[(Metric::MemoryUsage, 64.0 * 1048576.0)]);
    }
    assert!(db.data_bytes() < 400, "{} bytes", db.data_bytes());
}

#[test]
fn raw_window_queries_are_exact() {
    let mut db = Tsdb::new(1);
    for i in 0..300u32 {
        db.record("c", T0 + i, &[(Metric::CpuUsage, (i % 100) as f64 / 100.0)]);
    }
    let now = T0 + 299;
    let q = |w, a| db.query("c", Metric::CpuUsage, w, a, now).unwrap();
    // within the codec's 0.25 %
    let near = |got: f64, want: f64| (got - want).abs() <= want * 0.003 + 1e-9;
    assert!(near(q(10, Agg::Last), 0.99));
    assert!(near(q(100, Agg::Avg), 0.495), "{}", q(100, Agg::Avg));
    assert_eq!(q(100, Agg::Min), 0.0);
    assert!(near(q(100, Agg::Max), 0.99));
    assert!(near(q(100, Agg::Quantile(0.5)), 0.495));
    assert!(near(q(100, Agg::Quantile(0.99)), 0.9801));
    assert!(near(q(10, Agg::Quantile(0.1)), 0.909));
    assert!(
        near(q(50, Agg::Trend), 0.01),
        "rising 0.01/s: {}",
        q(50, Agg::Trend)
    );
    assert_eq!(
        db.query("c", Metric::MemoryUsage, 10, Agg::Avg, now),
        Err(QueryError::NoSeries("c".into(), "memory_usage"))
    );
    assert_eq!(
        db.query("x", Metric::CpuUsage, 10, Agg::Avg, now),
        Err(QueryError::NoEntity("x".into()))
    );
    assert_eq!(
        db.query("c", Metric::CpuUsage, 10, Agg::Avg, now + 100),
        Err(QueryError::Empty)
    );
    assert_eq!(
        db.query("c", Metric::CpuUsage, 0, Agg::Avg, now),
        Err(QueryError::BadWindow)
    );
}

#[test]
fn long_windows_read_rollups_and_old_data_expires() {
    let mut db = Tsdb::new(1);
    // 3 hours: first hour at 1 core, then 2 cores with a 10 % spike minute every 10 minutes
    let hours = 3 * 3600;
    for i in 0..hours {
        let v = if i < 3600 {
            1.0
        } else if (i / 60) % 10 == 0 {
            4.0
        } else {
            2.0
        };
        db.record("n", T0 + i, &[(Metric::CpuUsage, v)]);
    }
    let now = T0 + hours - 1;
    let q = |w, a| db.query("n", Metric::CpuUsage, w, a, now).unwrap();
    let avg = q(2 * 3600, Agg::Avg);
    // averages keep 1 %, histogram buckets 2 %
    let near = |got: f64, want: f64| (got - want).abs() <= want * 0.011;
    let in_bucket = |got: f64, want: f64| (got - want).abs() <= want * ROLLUP_BOUND;
    assert!(near(avg, 2.2), "{avg}");
    assert!(in_bucket(q(3 * 3600, Agg::Min), 1.0));
    assert!(
        in_bucket(q(3 * 3600, Agg::Max), 4.0),
        "{}",
        q(3 * 3600, Agg::Max)
    );
    let p50 = q(2 * 3600, Agg::Quantile(0.5));
    assert!(in_bucket(p50, 2.0), "{p50}");
    let p95 = q(2 * 3600, Agg::Quantile(0.95));
    assert!(in_bucket(p95, 4.0), "{p95}");
    let p90 = q(3 * 3600, Agg::Quantile(0.2));
    assert!(
        (p90 - 1.0).abs() < 0.05,
        "a third of the time at 1 core: {p90}"
    );
    let trend = q(3 * 3600, Agg::Trend);
    assert!(trend > 0.0, "rising: {trend}");
    // raw data older than 10 minutes is gone, rollups stay
    let s = db.series("n", Metric::CpuUsage).unwrap();
    let raw = s.raw_samples(Scale::of(Metric::CpuUsage), 0, u32::MAX, 1);
    assert!(raw.len() <= 660 && raw.len() >= 600, "{}", raw.len());
    assert!(rows(s).len() >= 179);

    // a day later, the old hours are gone too
    for i in 0..120u32 {
        db.record(
            "n",
            T0 + 86_400 + 2 * 3600 + i * 60,
            &[(Metric::CpuUsage, 3.0)],
        );
    }
    let s = db.series("n", Metric::CpuUsage).unwrap();
    assert!(
        rows(s).iter().all(|r| r.0 >= T0 + 3600),
        "first hours expired"
    );
}

#[test]
fn idle_entities_are_forgotten_and_bad_samples_skipped() {
    let mut db = Tsdb::new(1);
    db.record("gone", T0, &[(Metric::CpuUsage, 1.0)]);
    db.record("here", T0 + 1000, &[(Metric::CpuUsage, f64::NAN)]);
    db.record("here", T0 + 1000, &[(Metric::MemoryUsage, 1.0)]);
    db.record("here", T0 + 999, &[(Metric::MemoryUsage, 5.0)]); // out of order
    db.expire(T0 + 1000);
    assert_eq!(db.entities().collect::<Vec<_>>(), vec!["here"]);
    assert_eq!(db.metrics_of("here"), vec![Metric::MemoryUsage]);
    assert_eq!(db.last("here", Metric::MemoryUsage), Some((T0 + 1000, 1.0)));
}

/// A hint goes straight to its entity while nothing moved, and is never
/// followed to another entity after a removal moved the entries (expiry,
/// eviction), in this cache or in a clone of it.
#[test]
fn hints_never_lead_to_another_entity() {
    let mut db = Tsdb::new(1).with_max_series(3);
    let (mut a, mut b, mut c) = (Hint::default(), Hint::default(), Hint::default());
    db.record_hinted(&mut a, "a", T0, &[(Metric::CpuUsage, 1.0)]);
    db.record_hinted(&mut b, "b", T0, &[(Metric::CpuUsage, 2.0)]);
    db.record_hinted(&mut c, "c", T0 + 700, &[(Metric::CpuUsage, 3.0)]);
    assert!(a.0.is_some() && b.0.is_some() && c.0.is_some());
    // copies that only grow: a hint taken in one never fits the other
    let mut one = Tsdb::new(1);
    one.record("a", T0, &[(Metric::CpuUsage, 1.0)]);
    let mut copy = one.clone();
    let mut x = Hint::default();
    one.record_hinted(&mut x, "x", T0, &[(Metric::CpuUsage, 2.5)]);
    copy.record("y", T0, &[(Metric::CpuUsage, 3.5)]);
    copy.record_hinted(&mut x, "x", T0 + 1, &[(Metric::CpuUsage, 9.0)]);
    assert_eq!(copy.last("y", Metric::CpuUsage), Some((T0, 3.5)));
    assert_eq!(copy.last("x", Metric::CpuUsage), Some((T0 + 1, 9.0)));
    let kept = db.clone();
    // a and b expire; c moves to the front of the entries
    db.expire(T0 + 700);
    assert_eq!(db.entities().collect::<Vec<_>>(), ["c"]);
    db.record_hinted(&mut c, "c", T0 + 701, &[(Metric::CpuUsage, 4.0)]);
    assert_eq!(db.last("c", Metric::CpuUsage), Some((T0 + 701, 4.0)));
    // a comes back: a new entity, after c
    db.record_hinted(&mut a, "a", T0 + 701, &[(Metric::CpuUsage, 5.0)]);
    assert_eq!(db.last("a", Metric::CpuUsage), Some((T0 + 701, 5.0)));
    assert_eq!(db.last("c", Metric::CpuUsage), Some((T0 + 701, 4.0)));
    // the clone kept its own entries: c's fresh hint does not fit there
    let mut kept = kept;
    kept.expire(T0 + 1);
    db.record_hinted(&mut c, "c", T0 + 702, &[(Metric::CpuUsage, 6.0)]);
    kept.record_hinted(&mut c, "c", T0 + 702, &[(Metric::CpuUsage, 7.0)]);
    assert_eq!(kept.last("c", Metric::CpuUsage), Some((T0 + 702, 7.0)));
    assert_eq!(kept.last("a", Metric::CpuUsage), Some((T0, 1.0)));
    assert_eq!(db.last("c", Metric::CpuUsage), Some((T0 + 702, 6.0)));
    // an eviction under the cap moves entries too
    let mut d = Hint::default();
    db.record_hinted(&mut d, "d", T0 + 800, &[(Metric::CpuUsage, 8.0)]);
    db.record_hinted(&mut d, "d", T0 + 800, &[(Metric::MemoryUsage, 1.0)]);
    assert_eq!(db.entities().collect::<Vec<_>>(), ["c", "d"], "a evicted");
    db.record_hinted(&mut c, "c", T0 + 801, &[(Metric::CpuUsage, 9.0)]);
    db.record_hinted(&mut d, "d", T0 + 801, &[(Metric::CpuUsage, 10.0)]);
    assert_eq!(db.last("c", Metric::CpuUsage), Some((T0 + 801, 9.0)));
    assert_eq!(db.last("d", Metric::CpuUsage), Some((T0 + 801, 10.0)));
    assert_eq!(db.last("d", Metric::MemoryUsage), Some((T0 + 800, 1.0)));
    assert_eq!(db.series_count(), 3);
}

#[test]
fn aggregation_names() {
    assert_eq!(Agg::parse("p99"), Some(Agg::Quantile(0.99)));
    assert_eq!(Agg::parse("p50"), Some(Agg::Quantile(0.5)));
    assert_eq!(Agg::parse("trend"), Some(Agg::Trend));
    assert_eq!(Agg::parse("p0"), None);
    assert_eq!(Agg::parse("p101"), None);
    assert_eq!(Agg::parse("median"), None);
}

fn node(machine: &str, boot: &str) -> NodeIdentity {
    NodeIdentity {
        machine_id: machine.into(),
        boot_id: boot.into(),
        uptime_secs: None,
    }
}

#[test]
fn snapshots_round_trip_and_refuse_garbage_and_other_nodes() {
    let mut db = Tsdb::new(1);
    for i in 0..200u32 {
        db.record(
            "pod/a",
            T0 + i,
            &[
                (Metric::CpuUsage, f64::from(i % 7)),
                (Metric::MemoryUsage, 1e6),
            ],
        );
        db.record("node", T0 + i, &[(Metric::Load1, 0.5)]);
    }
    let here = node("m1", "b1");
    let snap = db.to_snapshot(&here);
    let back = Tsdb::from_snapshot(&snap, &here, 1).unwrap();
    assert_eq!(back.tsdb, db);
    assert!(!back.other_boot);
    let now = T0 + 199;
    assert_eq!(
        back.tsdb
            .query("pod/a", Metric::CpuUsage, 120, Agg::Quantile(0.9), now),
        db.query("pod/a", Metric::CpuUsage, 120, Agg::Quantile(0.9), now)
    );
    // streamed and in-memory snapshots are the same bytes
    let mut streamed = Vec::new();
    db.write_snapshot(&here, &mut streamed).unwrap();
    assert_eq!(streamed, snap);
    // the node rebooted: loaded, and said so
    assert!(
        Tsdb::from_snapshot(&snap, &node("m1", "b2"), 1)
            .unwrap()
            .other_boot
    );
    // another machine's, another interval's: refused
    assert!(matches!(
        Tsdb::from_snapshot(&snap, &node("m2", "b1"), 1),
        Err(SnapshotError::OtherNode { .. })
    ));
    assert!(matches!(
        Tsdb::from_snapshot(&snap, &here, 10),
        Err(SnapshotError::Interval { old: 1, new: 10 })
    ));
    // unknown identity on either side is not a mismatch
    assert!(Tsdb::from_snapshot(&snap, &NodeIdentity::default(), 1).is_ok());
    // another metric table: the table is recorded right after the identity
    let mut other = snap.clone();
    let at = snap.windows(9).position(|w| w == b"cpu_usage").unwrap();
    other[at] = b'C'; // a renamed metric
    let body = other.len() - 8;
    let sum = fnv(FNV0, &other[..body]).to_le_bytes();
    other[body..].copy_from_slice(&sum);
    assert_eq!(
        Tsdb::from_snapshot(&other, &here, 1).err(),
        Some(SnapshotError::MetricTable)
    );
    assert_eq!(
        Tsdb::from_snapshot(b"hello", &here, 1).err(),
        Some(SnapshotError::Foreign)
    );
    let mut old = snap.clone();
    old[..8].copy_from_slice(b"QSLTSDB2");
    assert_eq!(
        Tsdb::from_snapshot(&old, &here, 1).err(),
        Some(SnapshotError::Foreign),
        "the format before histograms"
    );
    let mut bad = snap.clone();
    let mid = bad.len() / 2;
    bad[mid] ^= 0xff;
    assert_eq!(
        Tsdb::from_snapshot(&bad, &here, 1).err(),
        Some(SnapshotError::Corrupt)
    );
    assert!(Tsdb::from_snapshot(&snap[..snap.len() - 3], &here, 1).is_err());
}

/// A snapshot altered anywhere (its checksum made right again, as a
/// crafted file would) loads as an error or as a cache that answers every
/// query, snapshots again and keeps recording: never a panic, a hang or a
/// huge allocation.
#[test]
fn crafted_snapshots_never_panic() {
    let mut db = Tsdb::new(1);
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for i in 0..(2 * 3600 + 700u32) {
        let spike = if i % 60 == 7 { 5.0 } else { 0.5 };
        db.record(
            "pod/a",
            T0 + i,
            &[
                (Metric::CpuUsage, spike * (1.0 + 0.1 * rng.gauss())),
                (Metric::IoReadBytes, if i % 97 < 3 { 1e6 } else { 0.0 }),
                (Metric::OomKills, f64::from(i / 1000)),
            ],
        );
        if i % 5 != 0 {
            db.record("node", T0 + i, &[(Metric::MemoryUsage, 1e9)]);
        }
    }
    let here = node("m", "b");
    let snap = db.to_snapshot(&here);
    let now = T0 + 2 * 3600 + 699;
    let aggs = [
        Agg::Last,
        Agg::Avg,
        Agg::Max,
        Agg::Quantile(0.99),
        Agg::Trend,
    ];
    let mut loaded = 0;
    for round in 0..1500 {
        let mut b = snap[..snap.len() - 8].to_vec();
        for _ in 0..1 + round % 3 {
            let at = MAGIC.len() + (rng.f() * (b.len() - MAGIC.len()) as f64) as usize;
            match round % 6 {
                0 => b[at] ^= 1 << (rng.f() * 8.0) as u32,
                1 => b[at] = 0xff,
                2 => b[at] = 0x00,
                3 => b[at] = (rng.f() * 256.0) as u8,
                // bytes gone or added shift every field after them
                4 => {
                    b.remove(at);
                }
                _ => b.insert(at, (rng.f() * 256.0) as u8),
            }
        }
        let sum = fnv(FNV0, &b);
        b.extend_from_slice(&sum.to_le_bytes());
        let Ok(l) = Tsdb::from_snapshot(&b, &here, 1) else {
            continue;
        };
        loaded += 1;
        let mut t = l.tsdb;
        let names: Vec<String> = t.entities().map(str::to_string).collect();
        for e in &names {
            for m in t.metrics_of(e) {
                for w in [60, 3600, 86_400] {
                    let _ = t.query_many(e, m, w, &aggs, now);
                }
            }
        }
        let _ = t.to_snapshot(&here);
        t.record("pod/a", now + 1, &[(Metric::CpuUsage, 1.0)]);
        t.expire(now + 1);
    }
    // most alterations land in sample data and load (then answer)
    assert!(loaded > 100, "only {loaded} of 1500 loaded");
}

/// Headers no writer of this cache makes are refused at load (the cases
/// that would panic, loop for hours or allocate without bound later).
#[test]
fn crafted_block_headers_are_refused() {
    let here = node("m", "b");
    let mut db = Tsdb::new(1);
    for i in 0..150u32 {
        db.record("pod/x1", T0 + i, &[(Metric::CpuUsage, f64::from(i % 7))]);
        db.record("pod/x2", T0 + i, &[(Metric::CpuUsage, 1.0)]);
    }
    let load = |db: &Tsdb| Tsdb::from_snapshot(&db.to_snapshot(&here), &here, 1).err();
    assert_eq!(load(&db), None);
    type Craft = fn(&mut Series);
    let crafts: [(&str, Craft); 7] = [
        ("time runs back", |s| {
            let b = s.raw_open.as_mut().unwrap();
            b.prev_ts = b.start - 1;
        }),
        ("a huge run", |s| {
            s.raw_open.as_mut().unwrap().run = u32::MAX
        }),
        ("huge rows", |s| {
            s.raw_open.as_mut().unwrap().rows = u32::MAX
        }),
        ("rows without bytes", |s| {
            s.raw_open.as_mut().unwrap().buf.clear();
        }),
        ("a sealed block longer than its stream", |s| {
            s.raw.clear();
            for v in [u64::from(T0), 10, 9, u64::MAX >> 1] {
                put_varint(&mut s.raw, v);
            }
            s.raw.push(1);
        }),
        ("a sealed block ending before it starts", |s| {
            s.raw.clear();
            for v in [u64::from(T0), 10, u64::from(u32::MAX), 1] {
                put_varint(&mut s.raw, v);
            }
            s.raw.push(1);
        }),
        ("a histogram shape past the bucket limit", |s| {
            if let Some(Roll::Hist(r)) = s.roll_open.as_mut() {
                r.prev_shape = u32::MAX;
            }
        }),
    ];
    for (what, craft) in crafts {
        let mut bad = db.clone();
        let e = bad.entities.get_mut("pod/x1").unwrap();
        craft(&mut e.series[0].1);
        assert_eq!(load(&bad), Some(SnapshotError::Corrupt), "{what}");
    }
    // the same entity twice
    let mut snap = db.to_snapshot(&here);
    let at = snap.windows(6).position(|w| w == b"pod/x2").unwrap();
    snap[at + 5] = b'1';
    let body = snap.len() - 8;
    let sum = fnv(FNV0, &snap[..body]).to_le_bytes();
    snap[body..].copy_from_slice(&sum);
    assert_eq!(
        Tsdb::from_snapshot(&snap, &here, 1).err(),
        Some(SnapshotError::Corrupt)
    );
    // a sealed payload whose run token claims 2^61 rows answers at once
    let mut odd = db.clone();
    let s = &mut odd.entities.get_mut("pod/x2").unwrap().series[0].1;
    let mut payload = Vec::new();
    put_varint(&mut payload, (zigzag(0) << 2) | 0b10);
    put_varint(&mut payload, zigzag(500));
    put_varint(&mut payload, (1u64 << 61) << 2 | 0b01);
    s.raw.clear();
    for v in [u64::from(T0), 60, 59, payload.len() as u64] {
        put_varint(&mut s.raw, v);
    }
    s.raw.extend_from_slice(&payload);
    let t = Tsdb::from_snapshot(&odd.to_snapshot(&here), &here, 1).unwrap();
    let _ = t
        .tsdb
        .query("pod/x2", Metric::CpuUsage, 600, Agg::Avg, T0 + 149);
}

/// Deterministic noise.
struct Rng(u64);
impl Rng {
    fn f(&mut self) -> f64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }
    fn gauss(&mut self) -> f64 {
        let (u, v) = (self.f().max(1e-12), self.f());
        (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()
    }
}

/// Relative error bound of a quantile or extreme read through rollups:
/// the histogram bucket on top of the raw code (0.25 %)...
const ROLLUP_BOUND: f64 = crate::codec::HIST_ERROR + 0.0026;
/// ...plus, in units, the raw code's rounding to a unit below 200 units
/// (half a unit, widened by the bucket on top of it).
const ROLLUP_BOUND_UNITS: f64 = 0.55;

#[test]
fn quantiles_stay_within_the_stated_error_against_exact_ones() {
    let hours = 2u32;
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    type Shape = Box<dyn Fn(u32, &mut Rng) -> f64>;
    let shapes: [(&str, Shape); 4] = [
        // a 1 s spike to 10 cores each minute on a 1-core baseline
        (
            "spikes",
            Box::new(|i, _| if i % 60 == 17 { 10.0 } else { 1.0 }),
        ),
        ("lognormal", Box::new(|_, r| (r.gauss() * 1.0).exp())),
        // a few millicores to a core, mostly 5-200 units (raw codes
        // there are exact to a unit, not relative)
        ("small", Box::new(|_, r| (r.gauss() * 1.0).exp() * 0.03)),
        (
            "bimodal",
            Box::new(|i, r| if (i / 60) % 10 < 3 { 4.0 } else { 0.5 } * (1.0 + 0.05 * r.gauss())),
        ),
    ];
    let mut table = String::from("shape      window   q      exact    cache    error\n");
    for (name, f) in &shapes {
        let mut db = Tsdb::new(1);
        let vals: Vec<f64> = (0..hours * 3600).map(|i| f(i, &mut rng)).collect();
        for (i, v) in vals.iter().enumerate() {
            db.record("c", T0 + i as u32, &[(Metric::CpuUsage, *v)]);
        }
        let now = T0 + hours * 3600 - 1;
        let s = db.series("c", Metric::CpuUsage).unwrap();
        let raw_from = s.raw_from().unwrap();
        for window in [60u32, 300, 600, 601, 660, 900, 3600, 7200] {
            let from = now + 1 - window;
            // the documented window: raw seconds from `from`, or whole
            // minutes at least half inside it before the raw samples
            let start = if from >= raw_from {
                from
            } else {
                (from - 30).div_ceil(60) * 60
            };
            let mut exact: Vec<f64> = vals[(start - T0) as usize..].to_vec();
            exact.sort_by(f64::total_cmp);
            for q in [0.5, 0.9, 0.95, 0.99, 1.0] {
                let want = quantile_sorted(&exact, q);
                let got = db
                    .query("c", Metric::CpuUsage, window, Agg::Quantile(q), now)
                    .unwrap();
                let err = (got - want).abs() / want;
                let unit = Metric::CpuUsage.unit();
                table.push_str(&format!(
                    "{name:<10} {window:>6} {q:>5} {want:>8.3} {got:>8.3} {:>7.2}%\n",
                    err * 100.0
                ));
                assert!(
                    (got - want).abs() <= ROLLUP_BOUND * want + ROLLUP_BOUND_UNITS * unit,
                    "{name} p{} over {window} s: exact {want}, cache {got}",
                    q * 100.0
                );
            }
            let avg = exact.iter().sum::<f64>() / exact.len() as f64;
            let got = db
                .query("c", Metric::CpuUsage, window, Agg::Avg, now)
                .unwrap();
            assert!(
                (got - avg).abs() <= avg * 0.0126 + 0.5 * Metric::CpuUsage.unit(),
                "{name} avg over {window} s: exact {avg}, cache {got}"
            );
        }
    }
    // the case: p99 over 600 s and 601 s (raw / rollup edge) agree
    eprintln!("{table}");
}

#[test]
fn averages_weigh_every_sample_the_same() {
    // 4 cores for the first 2 s of a minute, 0.5 after that, for an hour
    let mut db = Tsdb::new(1);
    let t0 = T0 + 58;
    for i in 0..3600u32 {
        let v = if i < 2 { 4.0 } else { 0.5 };
        db.record("c", t0 + i, &[(Metric::CpuUsage, v)]);
    }
    let now = t0 + 3599;
    let want = (2.0 * 4.0 + 3598.0 * 0.5) / 3600.0;
    let got = db
        .query("c", Metric::CpuUsage, 3660, Agg::Avg, now)
        .unwrap();
    assert!((got - want).abs() <= want * 0.011, "{got} vs {want}");
    // at a 10 s interval, a minute's 6 samples count 6
    let mut db = Tsdb::new(10);
    for i in 0..360u32 {
        let v = if i % 6 == 0 { 3.0 } else { 1.0 };
        db.record("c", T0 + i * 10, &[(Metric::CpuUsage, v)]);
    }
    let got = db
        .query("c", Metric::CpuUsage, 3600, Agg::Avg, T0 + 3599)
        .unwrap();
    assert!((got - 4.0 / 3.0).abs() <= 0.02, "{got}");
    let p90 = db
        .query("c", Metric::CpuUsage, 3600, Agg::Quantile(0.9), T0 + 3599)
        .unwrap();
    assert!((p90 - 3.0).abs() <= 3.0 * ROLLUP_BOUND, "{p90}");
}

#[test]
fn counts_are_stored_exactly() {
    let mut db = Tsdb::new(1);
    for i in 0..1800u32 {
        db.record("c", T0 + i, &[(Metric::OomKills, f64::from(195 + i / 5))]);
    }
    let now = T0 + 1799;
    assert_eq!(db.last("c", Metric::OomKills), Some((now, 554.0)));
    assert_eq!(
        db.query("c", Metric::OomKills, 1800, Agg::Max, now),
        Ok(554.0)
    );
    assert_eq!(
        db.query("c", Metric::OomKills, 1800, Agg::Min, now),
        Ok(195.0)
    );
    assert_eq!(
        db.query("c", Metric::OomKills, 300, Agg::Quantile(0.5), now),
        Ok(524.5)
    );
    // 201 is not 200, in raw samples and in rollups
    let mut db = Tsdb::new(1);
    for i in 0..900u32 {
        db.record(
            "c",
            T0 + i,
            &[(Metric::OomKills, if i < 60 { 200.0 } else { 201.0 })],
        );
    }
    let q = |a| db.query("c", Metric::OomKills, 900, a, T0 + 899).unwrap();
    assert_eq!((q(Agg::Min), q(Agg::Max)), (200.0, 201.0));
}

#[test]
fn the_series_cap_evicts_the_entity_seen_longest_ago() {
    let mut db = Tsdb::new(1).with_max_series(10);
    let two = [(Metric::CpuUsage, 1.0), (Metric::MemoryUsage, 1.0)];
    for (i, e) in ["a", "b", "c", "d", "e"].iter().enumerate() {
        db.record(e, T0 + i as u32, &two);
    }
    assert_eq!(db.series_count(), 10);
    db.record("a", T0 + 10, &two); // a is fresh again: b is the oldest now
    db.record("f", T0 + 11, &two);
    let mut left: Vec<&str> = db.entities().collect();
    left.sort();
    assert_eq!(left, vec!["a", "c", "d", "e", "f"]);
    assert_eq!((db.series_count(), db.evicted()), (10, 1));
    // a new series of an entity also needs room, never at its own cost
    db.record("f", T0 + 12, &[(Metric::Load1, 1.0)]);
    assert!(db.entities().any(|e| e == "f") && !db.entities().any(|e| e == "c"));
    assert_eq!(db.series_count(), 9);
    // expiry keeps the count true
    db.expire(T0 + 10_000);
    assert_eq!((db.series_count(), db.entities().count()), (0, 0));
}

/// A cap below the live set refuses the new series instead of evicting a
/// live entity for each (which would chain every tick); a smaller cap on
/// a loaded cache trims it to fit.
#[test]
fn a_cap_below_the_live_set_refuses_and_never_churns() {
    let mut db = Tsdb::new(1).with_max_series(6);
    let two = [(Metric::CpuUsage, 1.0), (Metric::MemoryUsage, 1.0)];
    for t in 0..20u32 {
        for e in ["a", "b", "c", "d"] {
            db.record(e, T0 + t, &two);
        }
    }
    let mut left: Vec<&str> = db.entities().collect();
    left.sort();
    assert_eq!(left, vec!["a", "b", "c"]);
    assert_eq!((db.evicted(), db.refused(), db.series_count()), (0, 40, 6));
    // c's series keep their samples
    let avg = db
        .query("c", Metric::CpuUsage, 20, Agg::Avg, T0 + 19)
        .unwrap();
    assert!((avg - 1.0).abs() < 0.01, "{avg}");
    // an entity gone for two intervals makes room again
    for t in 20..23u32 {
        for e in ["a", "b", "d"] {
            db.record(e, T0 + t, &two);
        }
    }
    assert!(db.entities().any(|e| e == "d") && !db.entities().any(|e| e == "c"));
    assert_eq!(db.evicted(), 1);
    // trimmed to a smaller cap: the entity seen longest ago goes first
    db.record("a", T0 + 30, &two);
    let db = db.with_max_series(2);
    assert_eq!(db.entities().collect::<Vec<_>>(), vec!["a"]);
    assert_eq!(db.series_count(), 2);
}

#[test]
fn expiry_is_by_time_at_any_interval() {
    let mut db = Tsdb::new(600);
    db.record("gone", T0, &[(Metric::CpuUsage, 1.0)]);
    for k in 1..=3u32 {
        db.record("here", T0 + 600 * k, &[(Metric::CpuUsage, 1.0)]);
        db.expire(T0 + 600 * k);
    }
    // two intervals unseen at a 600 s interval
    assert_eq!(db.entities().collect::<Vec<_>>(), vec!["here"]);
}

#[test]
fn rollup_rows_round_trip_with_runs_gaps_and_big_counts() {
    let mut b = RollBlock::new(T0, Vec::new());
    let rows: Vec<HistRow> = vec![
        (T0, 100, vec![(50, 60)]),
        (T0 + 60, 100, vec![(50, 60)]), // run
        (T0 + 120, 100, vec![(50, 60)]),
        (T0 + 180, 90, vec![(40, 1), (41, 2), (60, 57)]),
        (T0 + 600, 7, vec![(0, 100), (1_000_000, 1)]), // gap, count above 63
        (T0 + 660, 7, vec![(0, 100), (1_000_000, 1)]),
        // dense (contiguous), counts escaping their nibble, packed deltas
        (
            T0 + 720,
            9,
            vec![(10, 1), (11, 3), (12, 20), (13, 30), (15, 6)],
        ),
        (T0 + 780, 12, vec![(9, 1), (10, 15), (11, 44)]),
        (T0 + 840, 12, vec![(9, 1), (10, 15), (11, 44)]),
    ];
    for (t, a, h) in &rows {
        b.push(*t, *a, h);
    }
    let mut got = Vec::new();
    fn push_hist(out: &mut Vec<HistRow>, t: u32, r: Row<'_>) {
        if let Row::Hist(a, h) = r {
            out.push((t, a, h.to_vec()))
        }
    }
    b.each(&mut |t, r| push_hist(&mut got, t, r));
    assert_eq!(got, rows);
    let mut sealed = Vec::new();
    let _ = b.seal_into(&mut sealed);
    let (start, n, end, payload) = blocks(&sealed).next().unwrap();
    assert_eq!((start, n, end), (T0, 9, T0 + 840));
    let mut back = Vec::new();
    decode_roll(payload, start, &mut |t, r| push_hist(&mut back, t, r));
    assert_eq!(back, rows);
    // garbage never panics
    for g in [
        &[0x01u8][..],
        &[0x02, 0x00, 0x00, 0x00],
        &[0x00],
        &[0xff, 0xff, 0x03],
    ] {
        decode_roll(g, 0, &mut |_, _| {});
    }
}
