//! The time-series cache: in memory, bounded, compact.
//!
//! Every series keeps its raw samples for the last [`RAW_SECS`] (10 minutes)
//! and, per minute, a rollup row (min, max, avg and a quantile sketch: p50,
//! p90, p99) for [`ROLLUP_SECS`] (24 hours). Both are stored as blocks of
//! delta-coded rows (see [`crate::codec`]): raw samples in one block per
//! minute, rollup rows in one block per 3 hours, so expiring old data drops
//! whole blocks from the front.
//!
//! Queries ([`Agg`]) over a window up to 10 minutes read the raw samples and
//! are exact (to the codec's 0.25 %); longer windows read the rollups (kept to
//! 1 %), where a
//! percentile is that of the mixture of the minutes' distributions (each minute
//! piecewise linear through its min, p50, p90, p99 and max).

use crate::codec::{
    decode, decode_at, encode, encode_at, get_varint, put_varint, unzigzag, zigzag, ROLLUP_LINEAR,
};
use crate::fasthash::FastMap;
use crate::metric::Metric;

/// Raw samples are kept this long (seconds).
pub const RAW_SECS: u32 = 600;
/// Per-minute rollups are kept this long (seconds).
pub const ROLLUP_SECS: u32 = 86_400;
/// Rollup rows are stored in blocks of this span: a block costs a header and
/// an absolute first row (about 19 bytes), and expires whole, so a series
/// holds up to 24 h plus one block. Three hours balances the two.
const ROLLUP_BLOCK_SECS: u32 = 3 * 3600;

/// Quantile positions of a rollup row's sketch.
const SKETCH: [f64; 5] = [0.0, 0.5, 0.9, 0.99, 1.0];

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

/// A block of rows of `N` codes, each at a timestamp, delta-coded.
///
/// Row tokens (a varint `t`, kind in its low two bits):
/// * `00`: the next row (previous + step); `t >> 2` is the first field's
///   zig-zag delta, the other `N - 1` deltas follow as varints;
/// * `01`: `t >> 2` rows equal to the previous one, each one step later;
/// * `10`: a row after a gap (previous + step + `unzigzag(t >> 2)`; the first
///   row of a block is at `start` + gap), all `N` deltas follow;
/// * `11` (`N` > 1): the next row with every delta packed in `t` itself: bit 2
///   picks 3-bit (-4..=3) or 4-bit (-8..=7) two's-complement fields.
///
/// Deltas are against the previous row (the first row against zeros).
#[derive(Debug, Clone, PartialEq)]
struct Block<const N: usize> {
    start: u32,
    rows: u32,
    prev_ts: u32,
    prev: [u32; N],
    run: u32,
    buf: Vec<u8>,
}

impl<const N: usize> Block<N> {
    fn new(start: u32) -> Self {
        Self {
            start,
            rows: 0,
            prev_ts: start,
            prev: [0; N],
            run: 0,
            buf: Vec::new(),
        }
    }

    fn push(&mut self, ts: u32, v: [u32; N], step: u32) {
        let next = self.rows > 0 && ts == self.prev_ts.wrapping_add(step);
        if next && v == self.prev {
            self.run += 1;
            self.rows += 1;
            self.prev_ts = ts;
            return;
        }
        self.flush_run();
        let mut d = [0i64; N];
        for i in 0..N {
            d[i] = v[i] as i64 - self.prev[i] as i64;
        }
        if next {
            let packed = |bits: u32| -> Option<u64> {
                let (lo, hi) = (-(1i64 << (bits - 1)), (1i64 << (bits - 1)) - 1);
                let mut p = 0u64;
                for (i, x) in d.iter().enumerate() {
                    if *x < lo || *x > hi {
                        return None;
                    }
                    p |= ((*x as u64) & ((1 << bits) - 1)) << (i as u32 * bits);
                }
                Some(p)
            };
            match (N > 1)
                .then(|| {
                    packed(3)
                        .map(|p| (p, 0))
                        .or_else(|| packed(4).map(|p| (p, 1)))
                })
                .flatten()
            {
                Some((p, w)) => put_varint(&mut self.buf, (p << 3) | (w << 2) | 0b11),
                None => {
                    put_varint(&mut self.buf, zigzag(d[0]) << 2);
                    for x in &d[1..] {
                        put_varint(&mut self.buf, zigzag(*x));
                    }
                }
            }
        } else {
            let base = if self.rows == 0 {
                self.start as i64
            } else {
                self.prev_ts as i64 + step as i64
            };
            put_varint(&mut self.buf, (zigzag(ts as i64 - base) << 2) | 0b10);
            for x in &d {
                put_varint(&mut self.buf, zigzag(*x));
            }
        }
        self.prev = v;
        self.prev_ts = ts;
        self.rows += 1;
    }

    fn flush_run(&mut self) {
        if self.run > 0 {
            put_varint(&mut self.buf, (u64::from(self.run) << 2) | 0b01);
            self.run = 0;
        }
    }

    /// Appends the sealed block to `out`: `[start][rows][end - start][len][payload]`
    /// (growing `out` exactly), and returns the emptied buffer for reuse.
    fn seal_into(mut self, out: &mut Vec<u8>) -> Vec<u8> {
        self.flush_run();
        let mut head = Vec::with_capacity(20);
        put_varint(&mut head, self.start.into());
        put_varint(&mut head, self.rows.into());
        put_varint(&mut head, (self.prev_ts - self.start).into());
        put_varint(&mut head, self.buf.len() as u64);
        out.reserve_exact(head.len() + self.buf.len());
        out.extend_from_slice(&head);
        out.extend_from_slice(&self.buf);
        self.buf.clear();
        self.buf
    }

    /// A new block writing into `buf` (a sealed block's, reused: no allocation churn).
    fn with_buf(start: u32, buf: Vec<u8>) -> Self {
        Self {
            buf,
            ..Self::new(start)
        }
    }

    /// Calls `f` on each row of an open block.
    fn each(&self, step: u32, f: &mut dyn FnMut(u32, [u32; N])) {
        let mut last = (self.start, [0; N]);
        decode_rows::<N>(&self.buf, self.start, step, &mut |ts, v| {
            last = (ts, v);
            f(ts, v)
        });
        for i in 1..=self.run {
            f(last.0 + i * step, last.1);
        }
    }

    /// The rows of an open block.
    fn rows_vec(&self, step: u32) -> Vec<(u32, [u32; N])> {
        let mut out = Vec::with_capacity(self.rows as usize);
        self.each(step, &mut |ts, v| out.push((ts, v)));
        out
    }
}

/// Decodes a payload; stops quietly at a truncated or malformed stream.
fn decode_rows<const N: usize>(
    buf: &[u8],
    start: u32,
    step: u32,
    f: &mut dyn FnMut(u32, [u32; N]),
) {
    let (mut pos, mut ts, mut prev, mut first) = (0usize, start as i64, [0u32; N], true);
    let add = |p: &mut u32, d: i64| *p = (*p as i64 + d).clamp(0, u32::MAX as i64) as u32;
    while pos < buf.len() {
        let Some(t) = get_varint(buf, &mut pos) else {
            return;
        };
        match t & 3 {
            0b01 => {
                for _ in 0..(t >> 2) {
                    ts += step as i64;
                    f(ts as u32, prev);
                }
                continue;
            }
            0b00 => {
                if first {
                    return;
                }
                ts += step as i64;
                add(&mut prev[0], unzigzag(t >> 2));
                for p in prev.iter_mut().skip(1) {
                    let Some(d) = get_varint(buf, &mut pos) else {
                        return;
                    };
                    add(p, unzigzag(d));
                }
            }
            0b10 => {
                let gap = unzigzag(t >> 2);
                ts = if first {
                    start as i64 + gap
                } else {
                    ts + step as i64 + gap
                };
                for p in prev.iter_mut() {
                    let Some(d) = get_varint(buf, &mut pos) else {
                        return;
                    };
                    add(p, unzigzag(d));
                }
            }
            _ => {
                if first || N < 2 {
                    return;
                }
                ts += step as i64;
                let bits = if (t >> 2) & 1 == 0 { 3 } else { 4 };
                let payload = t >> 3;
                for (i, p) in prev.iter_mut().enumerate() {
                    let raw = (payload >> (i as u32 * bits)) & ((1 << bits) - 1);
                    // sign-extend a `bits`-wide field
                    let d = ((raw << (64 - bits)) as i64) >> (64 - bits);
                    add(p, d);
                }
            }
        }
        first = false;
        f(ts as u32, prev);
    }
}

/// A sealed block's header and payload, at `*pos` of `stream` (advanced past it).
fn next_block<'a>(stream: &'a [u8], pos: &mut usize) -> Option<(u32, u32, u32, &'a [u8])> {
    if *pos >= stream.len() {
        return None;
    }
    let start = get_varint(stream, pos)? as u32;
    let rows = get_varint(stream, pos)? as u32;
    let end = start.wrapping_add(get_varint(stream, pos)? as u32);
    let len = get_varint(stream, pos)? as usize;
    let payload = stream.get(*pos..*pos + len)?;
    *pos += len;
    Some((start, rows, end, payload))
}

/// Walks sealed blocks: (start, rows, end, payload).
fn blocks(stream: &[u8]) -> impl Iterator<Item = (u32, u32, u32, &[u8])> {
    let mut pos = 0usize;
    std::iter::from_fn(move || next_block(stream, &mut pos))
}

/// Drops sealed blocks that end before `cutoff` from the front of `stream`.
fn expire_blocks(stream: &mut Vec<u8>, cutoff: u32) {
    let (mut pos, mut drop_to) = (0usize, 0usize);
    while let Some((_, _, end, _)) = next_block(stream, &mut pos) {
        if end >= cutoff {
            break;
        }
        drop_to = pos;
    }
    if drop_to > 0 {
        stream.drain(..drop_to);
        if stream.capacity() > 2 * stream.len() + 64 {
            stream.shrink_to_fit();
        }
    }
}

/// One minute (or a raw sample) as a distribution: weight, sketch knots (min,
/// p50, p90, p99, max), average, time.
#[derive(Debug, Clone, Copy)]
struct Dist {
    w: f64,
    k: [f64; 5],
    avg: f64,
    ts: u32,
}

impl Dist {
    fn cdf(&self, v: f64) -> f64 {
        let k = &self.k;
        if v < k[0] {
            return 0.0;
        }
        if v >= k[4] {
            return 1.0;
        }
        for i in 0..4 {
            if v < k[i + 1] {
                let span = k[i + 1] - k[i];
                return if span <= 0.0 {
                    SKETCH[i + 1]
                } else {
                    SKETCH[i] + (SKETCH[i + 1] - SKETCH[i]) * (v - k[i]) / span
                };
            }
        }
        1.0
    }
}

/// Quantile `q` of sorted `v` by linear interpolation between ranks.
fn quantile_sorted(v: &[f64], q: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let r = q.clamp(0.0, 1.0) * (v.len() - 1) as f64;
    let (lo, hi) = (r.floor() as usize, r.ceil() as usize);
    v[lo] + (v[hi] - v[lo]) * (r - lo as f64)
}

/// Least-squares slope of (t, v), weighted.
fn slope(points: impl Iterator<Item = (f64, f64, f64)>) -> Option<f64> {
    let (mut sw, mut st, mut sv, mut stt, mut stv) = (0.0, 0.0, 0.0, 0.0, 0.0);
    for (t, v, w) in points {
        sw += w;
        st += w * t;
        sv += w * v;
        stt += w * t * t;
        stv += w * t * v;
    }
    if sw <= 0.0 {
        return None;
    }
    let den = stt - st * st / sw;
    if den.abs() < 1e-9 {
        return None;
    }
    Some((stv - st * sv / sw) / den)
}

/// One series.
#[derive(Debug, Clone, PartialEq)]
struct Series {
    last: f64,
    last_ts: u32,
    /// The code of `last` (an unchanged value is not encoded again).
    last_code: u32,
    /// The last sealed raw block's buffer, kept for the next minute.
    spare: Vec<u8>,
    raw: Vec<u8>,
    raw_open: Option<Block<1>>,
    roll: Vec<u8>,
    roll_open: Option<Block<6>>,
}

impl Series {
    fn new() -> Self {
        Self {
            last: f64::NAN,
            last_ts: 0,
            last_code: 0,
            spare: Vec::new(),
            raw: Vec::new(),
            raw_open: None,
            roll: Vec::new(),
            roll_open: None,
        }
    }

    fn push(&mut self, unit: f64, interval: u32, ts: u32, v: f64) {
        if self.last_ts != 0 && ts <= self.last_ts {
            return; // out of order: ignored
        }
        let code = if v == self.last {
            self.last_code
        } else {
            encode(v, unit)
        };
        self.last = v;
        self.last_ts = ts;
        self.last_code = code;
        if self
            .raw_open
            .as_ref()
            .is_some_and(|b| b.start / 60 != ts / 60)
        {
            self.close_minute(unit, ts);
        }
        if self.raw_open.is_none() {
            self.raw_open = Some(Block::with_buf(ts, std::mem::take(&mut self.spare)));
        }
        if let Some(b) = self.raw_open.as_mut() {
            b.push(ts, [code], interval);
        }
    }

    /// Seals the open minute: its rollup row is added, its raw block kept for 10 minutes.
    fn close_minute(&mut self, unit: f64, now: u32) {
        let Some(block) = self.raw_open.take() else {
            return;
        };
        // a minute holds at most 60 samples (timestamps are whole, increasing seconds)
        let mut buf = [0f64; 64];
        let mut n = 0usize;
        block.each(1, &mut |_, [c]| {
            if n < buf.len() {
                buf[n] = decode(c, unit);
                n += 1;
            }
        });
        let vals = &mut buf[..n];
        let minute = block.start / 60 * 60;
        self.spare = block.seal_into(&mut self.raw);
        if !vals.is_empty() {
            vals.sort_by(f64::total_cmp);
            let avg = vals.iter().sum::<f64>() / vals.len() as f64;
            let row = [
                vals[0],
                vals[vals.len() - 1],
                avg,
                quantile_sorted(vals, 0.5),
                quantile_sorted(vals, 0.9),
                quantile_sorted(vals, 0.99),
            ]
            .map(|v| encode_at(v, unit, ROLLUP_LINEAR));
            if self
                .roll_open
                .as_ref()
                .is_some_and(|b| b.start / ROLLUP_BLOCK_SECS != minute / ROLLUP_BLOCK_SECS)
            {
                if let Some(b) = self.roll_open.take() {
                    let buf = b.seal_into(&mut self.roll);
                    self.roll_open = Some(Block::with_buf(minute, buf));
                }
            }
            self.roll_open
                .get_or_insert_with(|| Block::new(minute))
                .push(minute, row, 60);
        }
        expire_blocks(&mut self.raw, now.saturating_sub(RAW_SECS));
        expire_blocks(&mut self.roll, now.saturating_sub(ROLLUP_SECS));
    }

    fn raw_samples(&self, unit: f64, from: u32, interval: u32) -> Vec<(u32, f64)> {
        let mut out = Vec::new();
        let mut keep = |ts: u32, [c]: [u32; 1]| {
            if ts >= from {
                out.push((ts, decode(c, unit)));
            }
        };
        for (start, _, end, payload) in blocks(&self.raw) {
            if end >= from {
                decode_rows::<1>(payload, start, interval, &mut keep);
            }
        }
        if let Some(b) = &self.raw_open {
            for (ts, c) in b.rows_vec(interval) {
                keep(ts, c);
            }
        }
        out
    }

    fn rollup_rows(&self, unit: f64, from: u32) -> Vec<Dist> {
        let mut out = Vec::new();
        let mut keep = |ts: u32, r: [u32; 6]| {
            if ts >= from {
                let d = r.map(|c| decode_at(c, unit, ROLLUP_LINEAR));
                out.push(Dist {
                    w: 1.0,
                    k: [d[0], d[3], d[4], d[5], d[1]],
                    avg: d[2],
                    ts: ts + 30,
                });
            }
        };
        for (start, _, end, payload) in blocks(&self.roll) {
            if end.saturating_add(60) >= from {
                decode_rows::<6>(payload, start, 60, &mut keep);
            }
        }
        if let Some(b) = &self.roll_open {
            for (ts, r) in b.rows_vec(60) {
                keep(ts, r);
            }
        }
        out
    }

    fn heap_bytes(&self) -> usize {
        self.raw.capacity()
            + self.roll.capacity()
            + self.spare.capacity()
            + self.raw_open.as_ref().map_or(0, |b| b.buf.capacity())
            + self.roll_open.as_ref().map_or(0, |b| b.buf.capacity())
    }
}

/// Why a query has no answer.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum QueryError {
    #[error("no such entity {0:?}")]
    NoEntity(String),
    #[error("entity {0:?} has no series {1}")]
    NoSeries(String, &'static str),
    #[error("no samples in the window")]
    Empty,
    #[error("window must be 1 s to 24 h")]
    BadWindow,
}

#[derive(Debug, Clone, PartialEq)]
struct Entity {
    last_seen: u32,
    series: Vec<(Metric, Series)>,
}

/// The cache: series per entity (`node`, `pod/<id>`, `container/<id>`, ...).
#[derive(Debug, Clone, PartialEq)]
pub struct Tsdb {
    interval: u32,
    entities: FastMap<String, Entity>,
}

impl Tsdb {
    /// `interval`: the collection interval in seconds (1-600).
    pub fn new(interval: u32) -> Self {
        Self {
            interval: interval.clamp(1, 600),
            entities: FastMap::default(),
        }
    }

    pub fn interval(&self) -> u32 {
        self.interval
    }

    /// Records one tick's samples of an entity at `ts` (Unix seconds).
    pub fn record(&mut self, entity: &str, ts: u32, samples: &[(Metric, f64)]) {
        let e = match self.entities.get_mut(entity) {
            Some(e) => e,
            None => self.entities.entry(entity.to_string()).or_insert(Entity {
                last_seen: ts,
                series: Vec::new(),
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
                    &mut e.series.last_mut().unwrap().1
                }
            };
            s.push(m.unit(), self.interval, ts, v);
        }
    }

    /// Forgets entities not seen for the raw window (a removed container's
    /// series go 10 minutes after it), and closes minutes of idle series.
    pub fn expire(&mut self, now: u32) {
        self.entities
            .retain(|_, e| e.last_seen.saturating_add(RAW_SECS) >= now);
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

    /// `agg` of `metric` of `entity` over the `window` seconds up to `now`.
    pub fn query(
        &self,
        entity: &str,
        metric: Metric,
        window: u32,
        agg: Agg,
        now: u32,
    ) -> Result<f64, QueryError> {
        if window == 0 || window > ROLLUP_SECS {
            return Err(QueryError::BadWindow);
        }
        let s = self.series(entity, metric)?;
        let from = now.saturating_sub(window).saturating_add(1);
        let unit = metric.unit();
        if agg == Agg::Last {
            return if s.last.is_finite() && s.last_ts >= from {
                Ok(s.last)
            } else {
                Err(QueryError::Empty)
            };
        }
        if window <= RAW_SECS {
            let pts = s.raw_samples(unit, from, self.interval);
            if pts.is_empty() {
                return Err(QueryError::Empty);
            }
            let vals = || pts.iter().map(|p| p.1);
            return match agg {
                Agg::Avg => Ok(vals().sum::<f64>() / pts.len() as f64),
                Agg::Min => Ok(vals().fold(f64::INFINITY, f64::min)),
                Agg::Max => Ok(vals().fold(f64::NEG_INFINITY, f64::max)),
                Agg::Quantile(q) => {
                    let mut v: Vec<f64> = vals().collect();
                    v.sort_by(f64::total_cmp);
                    Ok(quantile_sorted(&v, q))
                }
                Agg::Trend => Ok(
                    slope(pts.iter().map(|(t, v)| ((*t - pts[0].0) as f64, *v, 1.0)))
                        .unwrap_or(0.0),
                ),
                Agg::Last => unreachable!(),
            };
        }
        // rollups for closed minutes, raw samples for the open one
        let mut d = s.rollup_rows(unit, from);
        let open_from = s.raw_open.as_ref().map(|b| b.start).unwrap_or(u32::MAX);
        let w = f64::from(self.interval) / 60.0;
        for (ts, v) in s.raw_samples(unit, open_from.max(from), self.interval) {
            d.push(Dist {
                w,
                k: [v; 5],
                avg: v,
                ts,
            });
        }
        if d.is_empty() {
            return Err(QueryError::Empty);
        }
        let sw: f64 = d.iter().map(|x| x.w).sum();
        Ok(match agg {
            Agg::Avg => d.iter().map(|x| x.w * x.avg).sum::<f64>() / sw,
            Agg::Min => d.iter().map(|x| x.k[0]).fold(f64::INFINITY, f64::min),
            Agg::Max => d.iter().map(|x| x.k[4]).fold(f64::NEG_INFINITY, f64::max),
            Agg::Quantile(q) => {
                let (mut lo, mut hi) = (
                    d.iter().map(|x| x.k[0]).fold(f64::INFINITY, f64::min),
                    d.iter().map(|x| x.k[4]).fold(f64::NEG_INFINITY, f64::max),
                );
                let cdf = |v: f64| d.iter().map(|x| x.w * x.cdf(v)).sum::<f64>() / sw;
                if cdf(lo) >= q {
                    return Ok(lo);
                }
                for _ in 0..64 {
                    let mid = (lo + hi) / 2.0;
                    if cdf(mid) >= q {
                        hi = mid;
                    } else {
                        lo = mid;
                    }
                    if hi - lo <= unit * 1e-3 {
                        break;
                    }
                }
                hi
            }
            Agg::Trend => {
                let t0 = d[0].ts;
                slope(d.iter().map(|x| ((x.ts - t0) as f64, x.avg, x.w))).unwrap_or(0.0)
            }
            Agg::Last => unreachable!(),
        })
    }

    /// Number of series held.
    pub fn series_count(&self) -> usize {
        self.entities.values().map(|e| e.series.len()).sum()
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
            o.3 += s.roll.capacity() + s.roll_open.as_ref().map_or(0, |b| b.buf.capacity());
        }
        out.retain(|o| o.1 > 0);
        out
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

/// Why a snapshot was not loaded.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SnapshotError {
    #[error("not a qoslet metrics snapshot")]
    Foreign,
    #[error("snapshot is truncated or corrupt")]
    Corrupt,
}

const MAGIC: &[u8; 8] = b"QSLTSDB1";

fn fnv(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    put_varint(out, b.len() as u64);
    out.extend_from_slice(b);
}

fn put_block<const N: usize>(out: &mut Vec<u8>, b: &Option<Block<N>>) {
    let Some(b) = b else {
        out.push(0);
        return;
    };
    out.push(1);
    for v in [b.start, b.rows, b.prev_ts] {
        put_varint(out, v.into());
    }
    for v in b.prev {
        put_varint(out, v.into());
    }
    put_varint(out, b.run.into());
    put_bytes(out, &b.buf);
}

struct Reader<'a> {
    b: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn varint(&mut self) -> Result<u64, SnapshotError> {
        get_varint(self.b, &mut self.pos).ok_or(SnapshotError::Corrupt)
    }
    fn u32(&mut self) -> Result<u32, SnapshotError> {
        u32::try_from(self.varint()?).map_err(|_| SnapshotError::Corrupt)
    }
    fn take(&mut self, n: usize) -> Result<&'a [u8], SnapshotError> {
        let s = self
            .b
            .get(self.pos..self.pos.checked_add(n).ok_or(SnapshotError::Corrupt)?)
            .ok_or(SnapshotError::Corrupt)?;
        self.pos += n;
        Ok(s)
    }
    fn bytes(&mut self) -> Result<Vec<u8>, SnapshotError> {
        let n = self.varint()? as usize;
        Ok(self.take(n)?.to_vec())
    }
    fn block<const N: usize>(&mut self) -> Result<Option<Block<N>>, SnapshotError> {
        match self.take(1)?[0] {
            0 => Ok(None),
            1 => {
                let (start, rows, prev_ts) = (self.u32()?, self.u32()?, self.u32()?);
                let mut prev = [0u32; N];
                for p in prev.iter_mut() {
                    *p = self.u32()?;
                }
                Ok(Some(Block {
                    start,
                    rows,
                    prev_ts,
                    prev,
                    run: self.u32()?,
                    buf: self.bytes()?,
                }))
            }
            _ => Err(SnapshotError::Corrupt),
        }
    }
}

impl Tsdb {
    /// The whole cache as bytes (for `--state-dir`, so a restart does not blind the engine).
    pub fn to_snapshot(&self) -> Vec<u8> {
        let mut out = MAGIC.to_vec();
        put_varint(&mut out, self.interval.into());
        put_varint(&mut out, self.entities.len() as u64);
        for (name, e) in &self.entities {
            put_bytes(&mut out, name.as_bytes());
            put_varint(&mut out, e.last_seen.into());
            put_varint(&mut out, e.series.len() as u64);
            for (m, s) in &e.series {
                out.push(*m as u8);
                out.extend_from_slice(&s.last.to_le_bytes());
                put_varint(&mut out, s.last_ts.into());
                put_bytes(&mut out, &s.raw);
                put_block(&mut out, &s.raw_open);
                put_bytes(&mut out, &s.roll);
                put_block(&mut out, &s.roll_open);
            }
        }
        let sum = fnv(&out);
        out.extend_from_slice(&sum.to_le_bytes());
        out
    }

    /// Loads a snapshot; a foreign, truncated or corrupt one is an error (the
    /// caller starts empty).
    pub fn from_snapshot(b: &[u8]) -> Result<Tsdb, SnapshotError> {
        if b.len() < MAGIC.len() + 8 || &b[..MAGIC.len()] != MAGIC {
            return Err(SnapshotError::Foreign);
        }
        let (body, sum) = b.split_at(b.len() - 8);
        if fnv(body).to_le_bytes() != sum {
            return Err(SnapshotError::Corrupt);
        }
        let mut r = Reader {
            b: body,
            pos: MAGIC.len(),
        };
        let mut db = Tsdb::new(r.u32()?);
        let n = r.varint()?;
        for _ in 0..n {
            let name = String::from_utf8(r.bytes()?).map_err(|_| SnapshotError::Corrupt)?;
            let last_seen = r.u32()?;
            let ns = r.varint()?;
            let mut series = Vec::new();
            for _ in 0..ns {
                let m = Metric::from_id(r.take(1)?[0]).ok_or(SnapshotError::Corrupt)?;
                let last =
                    f64::from_le_bytes(r.take(8)?.try_into().map_err(|_| SnapshotError::Corrupt)?);
                series.push((
                    m,
                    Series {
                        last,
                        last_code: encode(last, m.unit()),
                        spare: Vec::new(),
                        last_ts: r.u32()?,
                        raw: r.bytes()?,
                        raw_open: r.block()?,
                        roll: r.bytes()?,
                        roll_open: r.block()?,
                    },
                ));
            }
            db.entities.insert(name, Entity { last_seen, series });
        }
        if r.pos != body.len() {
            return Err(SnapshotError::Corrupt);
        }
        Ok(db)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: u32 = 1_800_000_000; // a minute boundary (divisible by 60)

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
        // rollups keep 1 %
        let near = |got: f64, want: f64| (got - want).abs() <= want * 0.011;
        assert!(near(avg, 2.2), "{avg}");
        assert!(near(q(3 * 3600, Agg::Min), 1.0));
        assert!(
            near(q(3 * 3600, Agg::Max), 4.0),
            "{}",
            q(3 * 3600, Agg::Max)
        );
        let p50 = q(2 * 3600, Agg::Quantile(0.5));
        assert!(near(p50, 2.0), "{p50}");
        let p95 = q(2 * 3600, Agg::Quantile(0.95));
        assert!((p95 - 4.0).abs() < 0.05, "{p95}");
        let p90 = q(3 * 3600, Agg::Quantile(0.2));
        assert!(
            (p90 - 1.0).abs() < 0.05,
            "a third of the time at 1 core: {p90}"
        );
        let trend = q(3 * 3600, Agg::Trend);
        assert!(trend > 0.0, "rising: {trend}");
        // raw data older than 10 minutes is gone, rollups stay
        let s = db.series("n", Metric::CpuUsage).unwrap();
        let raw = s.raw_samples(Metric::CpuUsage.unit(), 0, 1);
        assert!(raw.len() <= 660 && raw.len() >= 600, "{}", raw.len());
        assert!(s.rollup_rows(Metric::CpuUsage.unit(), 0).len() >= 179);

        // a day later, the old hours are gone too
        for i in 0..120u32 {
            db.record(
                "n",
                T0 + 86_400 + 2 * 3600 + i * 60,
                &[(Metric::CpuUsage, 3.0)],
            );
        }
        let s = db.series("n", Metric::CpuUsage).unwrap();
        let rows = s.rollup_rows(Metric::CpuUsage.unit(), 0);
        assert!(
            rows.iter().all(|r| r.ts >= T0 + 3600),
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

    #[test]
    fn aggregation_names() {
        assert_eq!(Agg::parse("p99"), Some(Agg::Quantile(0.99)));
        assert_eq!(Agg::parse("p50"), Some(Agg::Quantile(0.5)));
        assert_eq!(Agg::parse("trend"), Some(Agg::Trend));
        assert_eq!(Agg::parse("p0"), None);
        assert_eq!(Agg::parse("p101"), None);
        assert_eq!(Agg::parse("median"), None);
    }

    #[test]
    fn snapshots_round_trip_and_refuse_garbage() {
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
        let snap = db.to_snapshot();
        let back = Tsdb::from_snapshot(&snap).unwrap();
        assert_eq!(back, db);
        let now = T0 + 199;
        assert_eq!(
            back.query("pod/a", Metric::CpuUsage, 120, Agg::Quantile(0.9), now),
            db.query("pod/a", Metric::CpuUsage, 120, Agg::Quantile(0.9), now)
        );
        assert_eq!(Tsdb::from_snapshot(b"hello"), Err(SnapshotError::Foreign));
        let mut bad = snap.clone();
        let mid = bad.len() / 2;
        bad[mid] ^= 0xff;
        assert_eq!(Tsdb::from_snapshot(&bad), Err(SnapshotError::Corrupt));
        assert!(Tsdb::from_snapshot(&snap[..snap.len() - 3]).is_err());
    }
}
