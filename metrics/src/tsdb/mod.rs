//! The time-series cache: in memory, bounded, compact.
//!
//! Every series keeps its raw samples for the last [`RAW_SECS`] (10 minutes)
//! and, per minute, a rollup row (the average and a histogram of the minute's
//! samples over log-scale buckets, with counts) for [`ROLLUP_SECS`] (24
//! hours). Both are stored as blocks of delta-coded rows (see
//! [`crate::codec`]): raw samples in one block per minute, rollup rows in one
//! block per 3 hours, so expiring old data drops whole blocks from the front.
//!
//! Queries ([`Agg`]) read raw samples for the last 10 minutes (exact to the
//! codec's 0.25 %) and rollups before that. Histograms merge without loss, so a
//! quantile over any window is within the buckets' 2 % (plus the raw 0.25 %)
//! of the exact one over the same samples, and every sample weighs the same
//! (a minute with 12 samples counts 12, not 1). Values below the linear part
//! of a scale are exact to a unit. Counts ([`Metric::exact`]) are stored
//! exactly at every size.
//!
//! The cache holds at most a configured number of series (evicting the entity
//! seen longest ago first) and forgets an entity 10 minutes after it was last
//! seen.
//!
//! * here: [`Tsdb`] (entities, the series cap, recording, expiry, queries).
//! * `block`: delta-coded row blocks (raw samples, row streams).
//! * `rollup`: per-minute rollups, histogram buckets, quantiles and slopes.
//! * `series`: one series (its raw block and rollups) and [`QueryError`].
//! * `snapshot`: the on-disk snapshot and [`NodeIdentity`].

use crate::codec::{
    decode_at, encode_at, get_varint, put_varint, unzigzag, zigzag, HIST_LINEAR, LINEAR,
    ROLLUP_LINEAR,
};
use crate::fasthash::FastState;
use crate::metric::Metric;

/// Raw samples are kept this long (seconds).
pub const RAW_SECS: u32 = 600;
/// Per-minute rollups are kept this long (seconds).
pub const ROLLUP_SECS: u32 = 86_400;
/// Rollup rows are stored in blocks of this span: a block costs a header and
/// an absolute first row (about 19 bytes), and expires whole, so a series
/// holds up to 24 h plus one block. Three hours balances the two.
const ROLLUP_BLOCK_SECS: u32 = 3 * 3600;

/// An aggregation over a window.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Agg {
    Last,
    Avg,
    Min,
    Max,
    /// A quantile in (0, 1] (`p50` = 0.5).
    Quantile(f64),
    /// Least-squares slope, units per second.
    Trend,
}

impl Agg {
    /// `last`, `avg`, `min`, `max`, `p50`, `p90`, `p95`, `p99`, `trend`.
    pub fn parse(s: &str) -> Option<Agg> {
        Some(match s {
            "last" => Agg::Last,
            "avg" => Agg::Avg,
            "min" => Agg::Min,
            "max" => Agg::Max,
            "trend" => Agg::Trend,
            p if p.starts_with('p') => {
                let n: f64 = p[1..].parse().ok()?;
                if !(n > 0.0 && n <= 100.0) {
                    return None;
                }
                Agg::Quantile(n / 100.0)
            }
            _ => return None,
        })
    }
}

mod block;
mod rollup;
mod series;
mod snapshot;
#[cfg(test)]
mod tests;

use block::*;
use rollup::*;
pub use series::*;
pub use snapshot::*;

#[derive(Debug, Clone, PartialEq)]
struct Entity {
    last_seen: u32,
    series: Vec<(Metric, Series)>,
}

/// Series held at most unless configured otherwise: about 4,000 containers'
/// worth (each has 12 series), tens of MiB at full retention.
pub const DEFAULT_MAX_SERIES: usize = 50_000;

/// The cache: series per entity (`node`, `pod/<id>`, `container/<id>`, ...).
///
/// Time is the caller's *series time*: whole seconds that never go back (see
/// [`crate::clock::SeriesClock`]); a sample not after its series' last one is
/// ignored.
#[derive(Debug)]
pub struct Tsdb {
    interval: u32,
    max_series: usize,
    series: usize,
    evicted: u64,
    /// New series refused: the cap was full of entities still being recorded.
    refused: u64,
    /// In the order they were first recorded (the collector's order), so a
    /// tick's recording walks them front to back.
    entities: Entities,
    /// Bumped whenever an entity is removed (the positions behind it move):
    /// a [`Hint`] taken before is stale.
    layout: u64,
}

type Entities = indexmap::IndexMap<String, Entity, FastState>;

/// Layouts are drawn from one counter, so that no two caches (or one cache
/// before and after a change) ever share a layout a hint could match.
static LAYOUTS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

fn new_layout() -> u64 {
    LAYOUTS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// A copy has a layout of its own: a hint kept for one never fits the other.
impl Clone for Tsdb {
    fn clone(&self) -> Self {
        Self {
            interval: self.interval,
            max_series: self.max_series,
            series: self.series,
            evicted: self.evicted,
            refused: self.refused,
            entities: self.entities.clone(),
            layout: new_layout(),
        }
    }
}

/// The same samples and settings (the order of entities and the layout are
/// not the content).
impl PartialEq for Tsdb {
    fn eq(&self, o: &Self) -> bool {
        self.interval == o.interval
            && self.max_series == o.max_series
            && self.series == o.series
            && self.evicted == o.evicted
            && self.refused == o.refused
            && self.entities == o.entities
    }
}

/// Where an entity was found when it was last recorded: the next record of
/// the *same* entity goes straight there while nothing was removed from the
/// cache since, without hashing and comparing its name (cold in cache a
/// second later). A hint belongs to one entity name; its holder keeps it so.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Hint(Option<(u64, u32)>);

impl Tsdb {
    /// `interval`: the collection interval in seconds (1-600).
    pub fn new(interval: u32) -> Self {
        Self {
            interval: interval.clamp(1, 600),
            max_series: DEFAULT_MAX_SERIES,
            series: 0,
            evicted: 0,
            refused: 0,
            entities: Entities::default(),
            layout: new_layout(),
        }
    }

    /// At most `n` series (at least 1): a new one beyond it evicts the entity
    /// seen longest ago.
    /// Sets the series cap; a cache loaded above it (a snapshot written
    /// under a larger cap) drops the entities seen longest ago to fit.
    pub fn with_max_series(mut self, n: usize) -> Self {
        self.max_series = n.max(1);
        let over = self.series.saturating_sub(self.max_series);
        if over > 0 {
            let mut by_age: Vec<(u32, String, usize)> = self
                .entities
                .iter()
                .map(|(k, e)| (e.last_seen, k.clone(), e.series.len()))
                .collect();
            by_age.sort();
            let mut freed = 0;
            for (_, k, n) in by_age {
                if freed >= over {
                    break;
                }
                self.entities.swap_remove(&k);
                self.layout = new_layout();
                freed += n;
                self.evicted += 1;
            }
            self.series -= freed;
            self.entities.shrink_to_fit();
            tracing::warn!(
                max_series = self.max_series,
                dropped_series = freed,
                "metrics cache loaded above its series cap; the entities seen longest ago were dropped"
            );
        }
        self
    }

    pub fn interval(&self) -> u32 {
        self.interval
    }

    /// Entities evicted by the series cap so far.
    pub fn evicted(&self) -> u64 {
        self.evicted
    }

    /// New series refused so far because every series under the cap was live.
    pub fn refused(&self) -> u64 {
        self.refused
    }

    /// Records one tick's samples of an entity at `ts` (series time).
    ///
    /// A new series needs room under the cap: entities not recorded within
    /// the last two intervals are evicted, the one seen longest ago first.
    /// Live entities are never evicted for it (a cap below the live set would
    /// otherwise evict one live entity per new one, every tick): the new
    /// series is refused instead, counted, and logged.
    pub fn record(&mut self, entity: &str, ts: u32, samples: &[(Metric, f64)]) {
        self.record_hinted(&mut Hint::default(), entity, ts, samples);
    }

    /// [`Tsdb::record`], found through `hint` (which it updates) where that
    /// is still good: `hint` must be one kept for `entity` (or the default).
    pub fn record_hinted(
        &mut self,
        hint: &mut Hint,
        entity: &str,
        ts: u32,
        samples: &[(Metric, f64)],
    ) {
        let interval = self.interval;
        let at = match hint.0 {
            Some((layout, i)) if layout == self.layout && (i as usize) < self.entities.len() => {
                Some(i as usize)
            }
            _ => self.entities.get_index_of(entity),
        };
        // an entity that has a series for each of its samples (nearly every
        // call)
        if let Some((i, (name, e))) = at.and_then(|i| Some((i, self.entities.get_index_mut(i)?))) {
            debug_assert_eq!(name, entity, "a hint kept for another entity");
            // each metric's series index (an entity has one series per metric)
            let mut at = [0u8; 64];
            let all = samples.iter().all(|(m, v)| {
                !v.is_finite()
                    || e.series.iter().position(|(x, _)| x == m).is_some_and(|i| {
                        at[*m as usize % 64] = i as u8;
                        true
                    })
            });
            if all {
                e.last_seen = e.last_seen.max(ts);
                for &(m, v) in samples {
                    if v.is_finite() {
                        e.series[usize::from(at[m as usize % 64])].1.push(
                            Scale::of(m),
                            interval,
                            ts,
                            v,
                        );
                    }
                }
                *hint = Hint(Some((self.layout, i as u32)));
                return;
            }
        }
        self.record_new(entity, ts, samples);
        *hint = Hint(
            self.entities
                .get_index_of(entity)
                .map(|i| (self.layout, i as u32)),
        );
    }

    /// Records samples some of which need a new series (or a new entity).
    fn record_new(&mut self, entity: &str, ts: u32, samples: &[(Metric, f64)]) {
        let interval = self.interval;
        // the metrics this adds a series for (each once)
        let fresh = |e: Option<&Entity>| {
            samples
                .iter()
                .filter(|(m, v)| {
                    v.is_finite() && !e.is_some_and(|e| e.series.iter().any(|(x, _)| x == m))
                })
                .fold(0u64, |mask, (m, _)| mask | 1 << (*m as u8))
                .count_ones() as usize
        };
        let new = fresh(self.entities.get(entity));
        if new > 0 && !self.make_room(new, entity, ts) {
            self.refused += new as u64;
            if self.refused.is_power_of_two() {
                tracing::warn!(
                    max_series = self.max_series,
                    refused = self.refused,
                    entity,
                    "metrics cache full of live series; new series are not recorded (raise metricsMaxSeries)"
                );
            }
            // what the entity already has is still recorded
            let Some(e) = self.entities.get_mut(entity) else {
                return;
            };
            e.last_seen = e.last_seen.max(ts);
            for &(m, v) in samples {
                if let Some(i) = e.series.iter().position(|(x, _)| *x == m) {
                    if v.is_finite() {
                        e.series[i].1.push(Scale::of(m), interval, ts, v);
                    }
                }
            }
            return;
        }
        let e = match self.entities.get_mut(entity) {
            Some(e) => e,
            None => self.entities.entry(entity.to_string()).or_insert(Entity {
                last_seen: ts,
                series: Vec::with_capacity(new),
            }),
        };
        e.last_seen = e.last_seen.max(ts);
        for &(m, v) in samples {
            if !v.is_finite() {
                continue;
            }
            let s = match e.series.iter().position(|(x, _)| *x == m) {
                Some(i) => &mut e.series[i].1,
                None => {
                    e.series.push((m, Series::new()));
                    &mut e.series.last_mut().expect("just pushed").1
                }
            };
            s.push(Scale::of(m), interval, ts, v);
        }
        self.series += new;
    }

    /// Evicts the entities seen longest ago (never `keep`, never one recorded
    /// within the last two intervals before `now`) until `want` more series
    /// fit under the cap; false when they do not.
    fn make_room(&mut self, want: usize, keep: &str, now: u32) -> bool {
        let live_since = now.saturating_sub(2 * self.interval);
        while self.series + want > self.max_series {
            let Some(victim) = self
                .entities
                .iter()
                .filter(|(k, e)| k.as_str() != keep && e.last_seen < live_since)
                .min_by_key(|(_, e)| e.last_seen)
                .map(|(k, _)| k.clone())
            else {
                return false;
            };
            if let Some(e) = self.entities.swap_remove(&victim) {
                self.layout = new_layout();
                self.series -= e.series.len();
                self.evicted += 1;
                if self.evicted.is_power_of_two() {
                    tracing::warn!(
                        max_series = self.max_series,
                        evicted = self.evicted,
                        entity = %victim,
                        "metrics cache at its series cap; the entity seen longest ago is dropped"
                    );
                }
            }
        }
        true
    }

    /// Forgets entities not seen for the raw window (at least two intervals):
    /// a removed container's series go 10 minutes after it, whatever the
    /// interval. Cheap enough to run every tick.
    pub fn expire(&mut self, now: u32) {
        let keep = RAW_SECS.max(2 * self.interval);
        let before = self.entities.len();
        let mut dropped = 0;
        self.entities.retain(|_, e| {
            let live = e.last_seen.saturating_add(keep) >= now;
            if !live {
                dropped += e.series.len();
            }
            live
        });
        self.series -= dropped;
        if self.entities.len() < before {
            self.layout = new_layout();
        }
        if self.entities.len() < before && self.entities.capacity() > 2 * self.entities.len() + 64 {
            self.entities.shrink_to_fit();
        }
    }

    pub fn entities(&self) -> impl Iterator<Item = &str> {
        self.entities.keys().map(String::as_str)
    }

    pub fn metrics_of(&self, entity: &str) -> Vec<Metric> {
        self.entities
            .get(entity)
            .map(|e| e.series.iter().map(|(m, _)| *m).collect())
            .unwrap_or_default()
    }

    /// The latest value and its time.
    pub fn last(&self, entity: &str, metric: Metric) -> Option<(u32, f64)> {
        let s = self.series(entity, metric).ok()?;
        s.last.is_finite().then_some((s.last_ts, s.last))
    }

    /// The newest timestamp of any sample (0 when empty).
    pub fn newest(&self) -> u32 {
        self.entities
            .values()
            .flat_map(|e| e.series.iter())
            .map(|(_, s)| s.newest())
            .max()
            .unwrap_or(0)
    }

    fn series(&self, entity: &str, metric: Metric) -> Result<&Series, QueryError> {
        let e = self
            .entities
            .get(entity)
            .ok_or_else(|| QueryError::NoEntity(entity.into()))?;
        e.series
            .iter()
            .find(|(m, _)| *m == metric)
            .map(|(_, s)| s)
            .ok_or_else(|| QueryError::NoSeries(entity.into(), metric.name()))
    }

    /// `agg` of `metric` of `entity` over the `window` seconds up to `now`
    /// (nothing after `now` counts).
    ///
    /// The last 10 minutes (at least) are answered from raw samples; older
    /// minutes from their rollups, a minute counting when at least half of it
    /// is in the window. Every sample weighs the same, raw or rolled up.
    pub fn query(
        &self,
        entity: &str,
        metric: Metric,
        window: u32,
        agg: Agg,
        now: u32,
    ) -> Result<f64, QueryError> {
        self.query_many(entity, metric, window, &[agg], now)?
            .pop()
            .expect("one answer per aggregation")
    }

    /// Several aggregations of one window, its samples decoded once: the
    /// series and window errors are the outer `Err`, each aggregation's own
    /// (empty, no quantiles) its inner one.
    pub fn query_many(
        &self,
        entity: &str,
        metric: Metric,
        window: u32,
        aggs: &[Agg],
        now: u32,
    ) -> Result<Vec<Result<f64, QueryError>>, QueryError> {
        if window == 0 || window > ROLLUP_SECS {
            return Err(QueryError::BadWindow);
        }
        let s = self.series(entity, metric)?;
        let from = now.saturating_sub(window).saturating_add(1);
        let sc = Scale::of(metric);
        let last = || {
            if s.last.is_finite() && s.last_ts >= from && s.last_ts <= now {
                Ok(s.last)
            } else {
                Err(QueryError::Empty)
            }
        };
        if aggs.iter().all(|a| *a == Agg::Last) {
            return Ok(aggs.iter().map(|_| last()).collect());
        }
        let raw_from = s.raw_from().unwrap_or(u32::MAX);
        let raw = s.raw_samples(sc, from.max(raw_from), now, self.interval);
        // closed minutes before the raw samples, at least half in the window
        let (roll_from, roll_to) = (
            from.saturating_sub(30),
            raw_from.min(now.saturating_sub(59)),
        );
        let with_rollups = roll_from < roll_to;
        let value = |code: u32, linear: f64| decode_at(code, sc.unit, linear);
        let hist_linear = sc.hist.unwrap_or(sc.avg);
        // (sum, samples) of the window
        let (mut sum, mut n) = (raw.iter().map(|p| p.1).sum::<f64>(), raw.len() as u64);
        let (mut lo, mut hi) = raw.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |a, p| {
            (a.0.min(p.1), a.1.max(p.1))
        });
        let mut minutes: Vec<(u32, f64, u64)> = Vec::new();
        let mut buckets: Vec<(u32, u32)> = Vec::new();
        let want_buckets = aggs.iter().any(|a| matches!(a, Agg::Quantile(_)));
        let mut summaries = false;
        if with_rollups {
            s.rollups(sc, roll_from, roll_to, &mut |ts, row| {
                let (a, k) = match row {
                    Row::Hist(avg, h) => {
                        // no row this cache writes is empty; a crafted one is skipped
                        let (Some(first), Some(last)) = (h.first(), h.last()) else {
                            return;
                        };
                        lo = lo.min(value(first.0, hist_linear));
                        hi = hi.max(value(last.0, hist_linear));
                        if want_buckets {
                            buckets.extend_from_slice(h);
                        }
                        (avg, h.iter().map(|b| u64::from(b.1)).sum::<u64>())
                    }
                    Row::Summary([avg, min, max, k]) => {
                        summaries = true;
                        lo = lo.min(value(min, sc.avg));
                        hi = hi.max(value(max, sc.avg));
                        (avg, u64::from(k))
                    }
                };
                let a = value(a, sc.avg);
                sum += a * k as f64;
                n += k;
                minutes.push((ts + 30, a, k));
            });
        }
        // the window's values with their weights, sorted (for quantiles)
        let sorted = (want_buckets && !summaries).then(|| {
            let mut v: Vec<(f64, u64)> = merge_buckets(&mut buckets)
                .map(|(c, w)| (value(c, hist_linear), w))
                .collect();
            v.extend(raw.iter().map(|p| (p.1, 1)));
            v.sort_by(|a, b| a.0.total_cmp(&b.0));
            v
        });
        Ok(aggs
            .iter()
            .map(|agg| {
                if *agg == Agg::Last {
                    return last();
                }
                if n == 0 {
                    return Err(QueryError::Empty);
                }
                Ok(match *agg {
                    Agg::Avg => sum / n as f64,
                    Agg::Min => lo,
                    Agg::Max => hi,
                    Agg::Quantile(q) => match &sorted {
                        Some(v) => quantile_weighted(v, q),
                        None => return Err(QueryError::NoQuantiles(metric.name())),
                    },
                    Agg::Trend => {
                        let t0 = minutes
                            .first()
                            .map(|m| m.0)
                            .or(raw.first().map(|p| p.0))
                            .unwrap_or(0);
                        let pts = minutes
                            .iter()
                            .map(|&(t, a, k)| (f64::from(t) - f64::from(t0), a, k as f64))
                            .chain(
                                raw.iter()
                                    .map(|&(t, v)| (f64::from(t) - f64::from(t0), v, 1.0)),
                            );
                        slope(pts).unwrap_or(0.0)
                    }
                    Agg::Last => unreachable!("answered above"),
                })
            })
            .collect())
    }

    /// Number of series held.
    pub fn series_count(&self) -> usize {
        self.series
    }

    /// Bytes of sample data per metric: (metric, series, raw bytes, rollup bytes).
    pub fn bytes_by_metric(&self) -> Vec<(Metric, usize, usize, usize)> {
        let mut out: Vec<(Metric, usize, usize, usize)> =
            Metric::ALL.iter().map(|m| (*m, 0, 0, 0)).collect();
        for (m, s) in self.entities.values().flat_map(|e| e.series.iter()) {
            let o = &mut out[*m as usize];
            o.1 += 1;
            o.2 += s.raw.capacity()
                + s.spare.capacity()
                + s.raw_open.as_ref().map_or(0, |b| b.buf.capacity());
            o.3 += s.roll.capacity() + s.roll_open.as_ref().map_or(0, Roll::capacity);
        }
        out.retain(|o| o.1 > 0);
        out
    }

    /// Bytes the cache holds on the heap: its table, names, series and data.
    pub fn memory_bytes(&self) -> usize {
        // entries (hash, name, entity) and the index table (position, control byte)
        let table = self.entities.capacity()
            * (std::mem::size_of::<(u64, String, Entity)>() + std::mem::size_of::<usize>() + 1);
        let per_entity: usize = self
            .entities
            .iter()
            .map(|(k, e)| {
                k.capacity()
                    + e.series.capacity() * std::mem::size_of::<(Metric, Series)>()
                    + e.series.iter().map(|(_, s)| s.heap_bytes()).sum::<usize>()
            })
            .sum();
        table + per_entity
    }

    /// Bytes of sample data held on the heap (excluding map overheads).
    pub fn data_bytes(&self) -> usize {
        self.entities
            .values()
            .flat_map(|e| e.series.iter())
            .map(|(_, s)| s.heap_bytes())
            .sum()
    }
}
