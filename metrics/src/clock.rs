//! Series time: whole seconds that never go back.
//!
//! The cache's timestamps come from a monotonic clock anchored to the wall
//! clock once, when collection starts (and never before the newest sample of
//! a loaded snapshot). A wall clock that steps (NTP, a VM restored, a
//! snapshot written while the clock was ahead) changes nothing in the cache:
//! no sample is dropped as out of order, `Last` stays current, and expiry is
//! by the samples' real age. The step is reported so the caller can log it.

use std::time::Duration;

/// A wall clock moving by more than this against the monotonic clock between
/// two stamps is a step (rounding alone moves it by up to 2 s).
pub const STEP_TOLERANCE_SECS: i64 = 5;

/// One tick's timestamp.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    /// Series time (Unix seconds at the anchor, plus monotonic seconds since).
    pub ts: u32,
    /// The wall clock stepped by this many seconds since the last stamp.
    pub step: Option<i64>,
    /// How far the wall clock is from series time now (wall - series, seconds).
    pub offset: i64,
}

/// Hands out series time.
#[derive(Debug, Clone)]
pub struct SeriesClock {
    anchor: u32,
    last: u32,
    offset: i64,
}

impl SeriesClock {
    /// `wall`: Unix seconds now; `floor`: the newest timestamp already held (a
    /// loaded snapshot's), so series time continues after it even when the
    /// wall clock is now behind it. Monotonic time counts from here.
    pub fn new(wall: u32, floor: u32) -> Self {
        Self::resume(wall, floor, None)
    }

    /// [`SeriesClock::new`] going on from a snapshot's own timeline: `series_now`
    /// is what its clock would read now (its newest sample plus the real time
    /// since it was written). Series time then stays on that timeline even
    /// when the wall clock stepped while the snapshot's writer ran.
    pub fn resume(wall: u32, floor: u32, series_now: Option<u32>) -> Self {
        let anchor = series_now.unwrap_or(wall).max(floor.saturating_add(1));
        Self {
            anchor,
            last: anchor.saturating_sub(1),
            offset: i64::from(wall) - i64::from(anchor),
        }
    }

    /// The wall clock is this far behind the anchor (a snapshot from a clock
    /// that was ahead); 0 normally.
    pub fn behind_at_start(&self) -> i64 {
        (-self.offset).max(0)
    }

    /// The stamp of a tick read `mono` after the clock was made, when the wall
    /// clock says `wall`; always after the previous stamp (two ticks in one
    /// second get two seconds).
    pub fn stamp(&mut self, mono: Duration, wall: u32) -> Stamp {
        let ts = self.at(mono).max(self.last.saturating_add(1));
        let offset = i64::from(wall) - i64::from(ts);
        let moved = offset - self.offset;
        self.offset = offset;
        self.last = ts;
        Stamp {
            ts,
            step: (moved.abs() > STEP_TOLERANCE_SECS).then_some(moved),
            offset,
        }
    }

    /// Series time `mono` after the clock was made (for queries): never
    /// before the last stamp.
    pub fn now(&self, mono: Duration) -> u32 {
        self.at(mono).max(self.last)
    }

    fn at(&self, mono: Duration) -> u32 {
        let secs = mono.as_secs_f64().round().min(f64::from(u32::MAX)) as u32;
        self.anchor.saturating_add(secs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Agg, Metric, Tsdb};

    const WALL0: u32 = 1_800_000_000;

    /// Ticks every second for `n` seconds from `*t`, the wall clock at
    /// `wall(t)`; records a value that changes every tick into "c" (and into
    /// "gone" up to `gone_until`).
    fn run(
        db: &mut Tsdb,
        clock: &mut SeriesClock,
        t: &mut u64,
        n: u64,
        wall: impl Fn(u64) -> u32,
        steps: &mut Vec<i64>,
    ) -> u32 {
        let mut ts = 0;
        for _ in 0..n {
            *t += 1;
            let s = clock.stamp(Duration::from_millis(*t * 1000 + 7), wall(*t));
            steps.extend(s.step);
            ts = s.ts;
            db.record("c", ts, &[(Metric::CpuUsage, (*t % 1000) as f64 / 1000.0)]);
            db.expire(ts);
        }
        ts
    }

    #[test]
    fn a_wall_clock_stepping_back_an_hour_loses_nothing() {
        let (mut db, mut clock) = (Tsdb::new(1), SeriesClock::new(WALL0, 0));
        let (mut t, mut steps) = (0u64, Vec::new());
        db.record("gone", WALL0 + 1, &[(Metric::CpuUsage, 1.0)]);
        run(
            &mut db,
            &mut clock,
            &mut t,
            900,
            |t| WALL0 + t as u32,
            &mut steps,
        );
        assert!(steps.is_empty());
        // the clock steps back an hour; collection goes on for 15 minutes
        let now = run(
            &mut db,
            &mut clock,
            &mut t,
            900,
            |t| WALL0 + t as u32 - 3600,
            &mut steps,
        );
        assert_eq!(steps, vec![-3600], "the step is seen once");
        assert_eq!(now, WALL0 + 1800, "series time went on");
        let q = |w, a| {
            db.query(
                "c",
                Metric::CpuUsage,
                w,
                a,
                clock.now(Duration::from_secs(t)),
            )
        };
        // every sample of the last 10 minutes is there, Last is the newest
        let n = db.query("c", Metric::CpuUsage, 600, Agg::Avg, now).unwrap();
        let want: f64 = (t - 599..=t)
            .map(|i| (i % 1000) as f64 / 1000.0)
            .sum::<f64>()
            / 600.0;
        assert!((n - want).abs() < want * 0.003, "{n} vs {want}");
        assert_eq!(
            q(10, Agg::Last).unwrap(),
            (t % 1000) as f64 / 1000.0,
            "Last is not frozen"
        );
        // expiry went by age: "gone" was last seen 30 minutes ago
        assert!(!db.entities().any(|e| e == "gone"));
        // a window over the whole half hour sees both sides of the step
        let all = db
            .query("c", Metric::CpuUsage, 1800, Agg::Max, now)
            .unwrap();
        assert!(all > 0.999 * (1.0 - crate::codec::HIST_ERROR), "{all}");
    }

    #[test]
    fn a_wall_clock_stepping_forward_a_day_expires_nothing() {
        let (mut db, mut clock) = (Tsdb::new(1), SeriesClock::new(WALL0, 0));
        let (mut t, mut steps) = (0u64, Vec::new());
        run(
            &mut db,
            &mut clock,
            &mut t,
            3600,
            |t| WALL0 + t as u32,
            &mut steps,
        );
        db.record("idle", WALL0 + 3600, &[(Metric::CpuUsage, 1.0)]);
        let now = run(
            &mut db,
            &mut clock,
            &mut t,
            120,
            |t| WALL0 + t as u32 + 86_400,
            &mut steps,
        );
        assert_eq!(steps, vec![86_400]);
        assert_eq!(now, WALL0 + 3720);
        // the hour before the step is still an hour old, not a day
        let avg = db
            .query("c", Metric::CpuUsage, 3600, Agg::Avg, now)
            .unwrap();
        assert!(avg > 0.4 && avg < 0.6, "{avg}");
        assert!(
            db.entities().any(|e| e == "idle"),
            "2 minutes idle, not a day"
        );
        assert!(db.query("c", Metric::CpuUsage, 10, Agg::Last, now).is_ok());
    }

    #[test]
    fn ticks_in_one_second_get_their_own_seconds_and_queries_never_see_the_future() {
        let mut clock = SeriesClock::new(WALL0, 0);
        let a = clock.stamp(Duration::from_millis(10_200), WALL0 + 10);
        let b = clock.stamp(Duration::from_millis(10_400), WALL0 + 10);
        assert_eq!((a.ts, b.ts), (WALL0 + 10, WALL0 + 11));
        let mut db = Tsdb::new(1);
        db.record("c", a.ts, &[(Metric::CpuUsage, 0.1)]);
        db.record("c", b.ts, &[(Metric::CpuUsage, 0.15)]);
        let now = clock.now(Duration::from_millis(10_500));
        assert_eq!(now, b.ts, "now is never before the last stamp");
        assert_eq!(db.query("c", Metric::CpuUsage, 5, Agg::Max, now), Ok(0.15));
        // asked as of the first tick, the second is in the future
        assert_eq!(db.query("c", Metric::CpuUsage, 5, Agg::Max, a.ts), Ok(0.1));
        assert_eq!(
            db.query("c", Metric::CpuUsage, 5, Agg::Last, a.ts),
            Err(crate::QueryError::Empty)
        );
    }

    #[test]
    fn after_a_snapshot_from_a_clock_that_was_ahead_time_goes_on_from_it() {
        let (mut db, mut clock) = (Tsdb::new(1), SeriesClock::new(WALL0 + 3600, 0));
        let (mut t, mut steps) = (0u64, Vec::new());
        let last = run(
            &mut db,
            &mut clock,
            &mut t,
            300,
            |t| WALL0 + 3600 + t as u32,
            &mut steps,
        );
        // restarted with the wall clock an hour behind what the snapshot holds
        let mut clock = SeriesClock::new(WALL0 + 310, db.newest());
        assert_eq!(clock.behind_at_start(), 3600 - 10 + 1);
        let s = clock.stamp(Duration::from_secs(1), WALL0 + 311);
        assert!(s.ts > last && s.step.is_none(), "{s:?}");
        db.record("c", s.ts, &[(Metric::CpuUsage, 0.5)]);
        assert_eq!(
            db.last("c", Metric::CpuUsage),
            Some((s.ts, 0.5)),
            "not dropped"
        );
    }

    /// The wall clock stepped a day forward while the writer ran (its series
    /// time stayed on the real timeline); restarted on the same boot, series
    /// time goes on from the snapshot's timeline, so the cache is not a day
    /// old at once, and later wall-clock readings are no step.
    #[test]
    fn a_restart_after_a_forward_step_keeps_the_snapshots_timeline() {
        use crate::NodeIdentity;
        let (mut db, mut clock) = (Tsdb::new(1), SeriesClock::new(WALL0, 0));
        let (mut t, mut steps) = (0u64, Vec::new());
        let day = 86_400;
        run(
            &mut db,
            &mut clock,
            &mut t,
            300,
            |t| {
                if t > 100 {
                    WALL0 + day + t as u32
                } else {
                    WALL0 + t as u32
                }
            },
            &mut steps,
        );
        assert_eq!(steps, vec![i64::from(day)]);
        let id = |uptime| NodeIdentity {
            machine_id: "m".into(),
            boot_id: "b".into(),
            uptime_secs: Some(uptime),
        };
        let snap = db.to_snapshot(&id(1000));
        // 20 s later, same boot
        let l = Tsdb::from_snapshot(&snap, &id(1020), 1).unwrap();
        assert_eq!(l.series_now, Some(db.newest() + 20));
        let wall = WALL0 + day + 320;
        let mut clock = SeriesClock::resume(wall, l.tsdb.newest(), l.series_now);
        let mut db = l.tsdb;
        let s = clock.stamp(Duration::from_secs(1), wall + 1);
        assert_eq!((s.ts, s.step), (db.newest() + 21, None));
        db.expire(s.ts);
        let now = clock.now(Duration::from_secs(1));
        assert_eq!(
            db.query("c", Metric::CpuUsage, 600, Agg::Avg, now)
                .map(|_| ()),
            Ok(()),
            "the last 5 minutes are still there"
        );
        // another boot: no timeline to go on from (uptimes do not compare)
        let other = NodeIdentity {
            boot_id: "b2".into(),
            ..id(5)
        };
        assert_eq!(
            Tsdb::from_snapshot(&snap, &other, 1).unwrap().series_now,
            None
        );
    }
}
