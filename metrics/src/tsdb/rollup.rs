//! Per-minute rollups: log-scale histogram buckets, rollup blocks of 3
//! hours, and the quantiles and slopes read from them.

use super::*;

/// How a metric's values become codes: its unit and the linear limits of the
/// raw samples, the rollups' averages and the rollups' histogram buckets.
#[derive(Debug, Clone, Copy)]
pub(super) struct Scale {
    pub(super) unit: f64,
    pub(super) raw: f64,
    pub(super) avg: f64,
    /// `None`: the metric's rollups keep a summary (avg, min, max, samples),
    /// not a histogram (see [`Metric::rollup_quantiles`]).
    pub(super) hist: Option<f64>,
}

/// A linear limit no count reaches: codes are the values themselves.
pub(super) const EXACT: f64 = 4.0e9;

impl Scale {
    pub(super) fn of(m: Metric) -> Scale {
        let unit = m.unit();
        if m.exact() {
            return Scale {
                unit,
                raw: EXACT,
                avg: EXACT,
                hist: m.rollup_quantiles().then_some(EXACT),
            };
        }
        Scale {
            unit,
            raw: LINEAR,
            avg: ROLLUP_LINEAR,
            hist: m.rollup_quantiles().then_some(HIST_LINEAR),
        }
    }
}

/// Bucket codes of a minute's histogram are kept below this many per row
/// (a minute holds at most 60 samples; more is a corrupt stream).
pub(super) const MAX_BUCKETS: u64 = 4096;

/// A block of per-minute rollup rows: each row is the minute's average (on
/// the [`ROLLUP_LINEAR`] scale) and its histogram, (bucket code, samples) on the
/// [`HIST_LINEAR`] scale, in rising code order.
///
/// Row tokens (a varint `t`, kind in its low two bits):
/// * `00`: the next minute; `t >> 2` is the row's shape (buckets and kind);
/// * `01`: `t >> 2` rows equal to the previous one, each a minute later;
/// * `10`: a row after a gap (previous + 60 + `unzigzag(t >> 2)`; the first row
///   of a block is at `start` + gap); the shape follows as a varint;
/// * `11`: the next minute with both deltas in -8..=7: bits 2-5 and 6-9 are
///   the zig-zag deltas of the average and the first bucket, the shape above.
///
/// Then (but for `11`): the zig-zag deltas of the average code and of the
/// first bucket code against the previous row; then the buckets, dense or
/// sparse, whichever is shorter (see [`put_buckets`]). A steady series costs
/// a run token per block; a noisy one two bytes per row and half a byte per
/// bucket its samples span.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct RollBlock {
    pub(super) start: u32,
    pub(super) rows: u32,
    pub(super) prev_ts: u32,
    pub(super) prev_avg: u32,
    pub(super) prev_first: u32,
    /// Where the previous row's bucket bytes are in `buf` (offset, length), to
    /// see an unchanged row without decoding it.
    pub(super) prev_buckets: (u32, u32),
    pub(super) prev_shape: u32,
    pub(super) run: u32,
    pub(super) buf: Vec<u8>,
}

/// A rollup row: the minute's average code and either its histogram or a
/// summary (min and max codes on the average's scale, samples).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Row<'a> {
    Hist(u32, &'a [(u32, u32)]),
    Summary([u32; 4]),
}

/// Called per rollup row with its minute.
pub(super) type RowFn<'a> = dyn FnMut(u32, Row<'_>) + 'a;

/// The open block of a series' rollups.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Roll {
    Hist(RollBlock),
    /// Rows of (avg, min, max, samples).
    Summary(Block<4>),
}

impl Roll {
    pub(super) fn start(&self) -> u32 {
        match self {
            Roll::Hist(b) => b.start,
            Roll::Summary(b) => b.start,
        }
    }

    pub(super) fn capacity(&self) -> usize {
        match self {
            Roll::Hist(b) => b.buf.capacity(),
            Roll::Summary(b) => b.buf.capacity(),
        }
    }

    pub(super) fn seal_into(self, out: &mut Vec<u8>) -> Vec<u8> {
        match self {
            Roll::Hist(b) => b.seal_into(out),
            Roll::Summary(b) => b.seal_into(out),
        }
    }

    pub(super) fn each(&self, f: &mut RowFn) {
        match self {
            Roll::Hist(b) => b.each(f),
            Roll::Summary(b) => b.each(60, &mut |ts, r| f(ts, Row::Summary(r))),
        }
    }
}

/// Decodes a sealed rollup payload of either kind.
pub(super) fn decode_rollups(hist: bool, payload: &[u8], start: u32, f: &mut RowFn) {
    if hist {
        decode_roll(payload, start, f)
    } else {
        decode_rows::<4>(payload, start, 60, &mut |ts, r| f(ts, Row::Summary(r)))
    }
}

/// Encodes a histogram's buckets (relative to its first code) and returns
/// the row's shape: `(k << 1) | dense`. Dense: `k` codes from the first, two
/// 4-bit counts a byte (15 escapes to a varint of the rest after them);
/// sparse: `k` buckets, one varint `(gap << 6) | (n - 1)` each (63 escapes).
pub(super) fn put_buckets(out: &mut Vec<u8>, hist: &[(u32, u32)]) -> u64 {
    let (Some(first), Some(last)) = (hist.first(), hist.last()) else {
        return 0;
    };
    let varint_len = |v: u64| (64 - v.max(1).leading_zeros()).div_ceil(7) as u64;
    let sparse_word = |prev: Option<u32>, code: u32, n: u32| {
        let gap = prev.map_or(0, |p| code.saturating_sub(p).saturating_sub(1));
        let extra = n.saturating_sub(1);
        (
            (u64::from(gap) << 6) | u64::from(extra.min(63)),
            (extra >= 63).then(|| u64::from(extra - 63)),
        )
    };
    let mut sparse_len = 0u64;
    let mut prev = None;
    for &(code, n) in hist {
        let (w, more) = sparse_word(prev, code, n);
        sparse_len += varint_len(w) + more.map_or(0, varint_len);
        prev = Some(code);
    }
    let span = u64::from(last.0 - first.0) + 1;
    let dense_len = span.div_ceil(2)
        + hist
            .iter()
            .filter(|b| b.1 >= 15)
            .map(|b| varint_len(u64::from(b.1 - 15)))
            .sum::<u64>();
    if span <= MAX_BUCKETS && dense_len <= sparse_len {
        let at = out.len();
        out.resize(at + span.div_ceil(2) as usize, 0);
        for &(code, n) in hist {
            let i = (code - first.0) as usize;
            out[at + i / 2] |= (n.min(15) as u8) << (4 * (i % 2));
        }
        for b in hist.iter().filter(|b| b.1 >= 15) {
            put_varint(out, u64::from(b.1 - 15));
        }
        return (span << 1) | 1;
    }
    let mut prev = None;
    for &(code, n) in hist {
        let (w, more) = sparse_word(prev, code, n);
        put_varint(out, w);
        if let Some(m) = more {
            put_varint(out, m);
        }
        prev = Some(code);
    }
    (hist.len() as u64) << 1
}

thread_local! {
    /// Where a row's buckets are encoded before they are compared with the
    /// previous row's (no allocation per row).
    static SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Decodes buckets written by [`put_buckets`] into `hist`; `None` when the
/// stream ends early.
pub(super) fn get_buckets(
    buf: &[u8],
    pos: &mut usize,
    first: i64,
    shape: u64,
    hist: &mut Vec<(u32, u32)>,
) -> Option<()> {
    let code = |x: i64| x.clamp(0, u32::MAX as i64) as u32;
    let k = shape >> 1;
    hist.clear();
    if shape & 1 == 1 {
        let bytes = buf.get(*pos..*pos + k.div_ceil(2) as usize)?;
        *pos += bytes.len();
        for i in 0..k {
            let b = bytes[(i / 2) as usize];
            let mut n = u64::from(if i % 2 == 0 { b & 15 } else { b >> 4 });
            if n == 15 {
                n = n.saturating_add(get_varint(buf, pos)?);
            }
            if n > 0 {
                hist.push((code(first + i as i64), n.min(u32::MAX as u64) as u32));
            }
        }
        return Some(());
    }
    let mut c = first;
    for i in 0..k {
        let v = get_varint(buf, pos)?;
        let mut extra = v & 63;
        if extra == 63 {
            extra = extra.saturating_add(get_varint(buf, pos)?);
        }
        if i > 0 {
            c = c.saturating_add((v >> 6).min(u32::MAX as u64) as i64 + 1);
        }
        hist.push((code(c), extra.saturating_add(1).min(u32::MAX as u64) as u32));
    }
    Some(())
}

impl RollBlock {
    pub(super) fn new(start: u32, buf: Vec<u8>) -> Self {
        Self {
            start,
            rows: 0,
            prev_ts: start,
            prev_avg: 0,
            prev_first: 0,
            prev_buckets: (0, 0),
            prev_shape: 0,
            run: 0,
            buf,
        }
    }

    /// Adds a minute; `hist` is non-empty, in rising code order.
    pub(super) fn push(&mut self, ts: u32, avg: u32, hist: &[(u32, u32)]) {
        let Some(&(first, _)) = hist.first() else {
            return;
        };
        SCRATCH.with(|b| {
            let mut b = b.borrow_mut();
            b.clear();
            let shape = put_buckets(&mut b, hist);
            self.push_encoded(ts, avg, first, shape, &b);
        })
    }

    pub(super) fn push_encoded(
        &mut self,
        ts: u32,
        avg: u32,
        first: u32,
        shape: u64,
        buckets: &[u8],
    ) {
        let next = self.rows > 0 && ts == self.prev_ts.wrapping_add(60);
        let (at, len) = self.prev_buckets;
        let same = next
            && avg == self.prev_avg
            && first == self.prev_first
            && u64::from(self.prev_shape) == shape
            && self.buf.get(at as usize..(at + len) as usize) == Some(buckets);
        if same {
            self.run += 1;
            self.rows += 1;
            self.prev_ts = ts;
            return;
        }
        self.flush_run();
        let (da, df) = (
            avg as i64 - self.prev_avg as i64,
            first as i64 - self.prev_first as i64,
        );
        let small = |d: i64| (-8..=7).contains(&d);
        if next && small(da) && small(df) {
            put_varint(
                &mut self.buf,
                (shape << 10) | (zigzag(df) << 6) | (zigzag(da) << 2) | 0b11,
            );
        } else if next {
            put_varint(&mut self.buf, shape << 2);
        } else {
            let base = if self.rows == 0 {
                self.start as i64
            } else {
                self.prev_ts as i64 + 60
            };
            put_varint(&mut self.buf, (zigzag(ts as i64 - base) << 2) | 0b10);
            put_varint(&mut self.buf, shape);
        }
        if !(next && small(da) && small(df)) {
            put_varint(&mut self.buf, zigzag(da));
            put_varint(&mut self.buf, zigzag(df));
        }
        self.prev_buckets = (self.buf.len() as u32, buckets.len() as u32);
        self.prev_shape = shape as u32;
        self.buf.extend_from_slice(buckets);
        self.prev_avg = avg;
        self.prev_first = first;
        self.prev_ts = ts;
        self.rows += 1;
    }

    pub(super) fn flush_run(&mut self) {
        if self.run > 0 {
            put_varint(&mut self.buf, (u64::from(self.run) << 2) | 0b01);
            self.run = 0;
        }
    }

    /// Appends the sealed block to `out` (the raw blocks' header format) and
    /// returns the emptied buffer for reuse.
    pub(super) fn seal_into(mut self, out: &mut Vec<u8>) -> Vec<u8> {
        self.flush_run();
        seal(out, self.start, self.rows, self.prev_ts, self.buf)
    }

    /// Calls `f` on each row of an open block.
    pub(super) fn each(&self, f: &mut RowFn) {
        let mut last: (u32, u32, Vec<(u32, u32)>) = (self.start, 0, Vec::new());
        decode_roll(&self.buf, self.start, &mut |ts, r| {
            if let Row::Hist(avg, h) = r {
                last = (ts, avg, h.to_vec());
            }
            f(ts, r)
        });
        for i in 1..=self.run {
            f(
                last.0.saturating_add(i.saturating_mul(60)),
                Row::Hist(last.1, &last.2),
            );
        }
    }
}

/// Decodes a rollup payload; stops quietly at a truncated or malformed stream.
pub(super) fn decode_roll(buf: &[u8], start: u32, f: &mut RowFn) {
    let (mut pos, mut ts, mut avg, mut first) = (0usize, start as i64, 0i64, 0i64);
    let mut started = false;
    let mut hist: Vec<(u32, u32)> = Vec::new();
    let code = |x: i64| x.clamp(0, u32::MAX as i64) as u32;
    while pos < buf.len() {
        let Some(t) = get_varint(buf, &mut pos) else {
            return;
        };
        let mut packed = None;
        let shape = match t & 3 {
            0b01 => {
                if !started {
                    return;
                }
                for _ in 0..(t >> 2).min(u64::from(ROLLUP_SECS)) {
                    ts += 60;
                    f(code(ts), Row::Hist(code(avg), &hist));
                }
                continue;
            }
            0b00 => {
                if !started {
                    return;
                }
                ts += 60;
                t >> 2
            }
            0b10 => {
                let gap = unzigzag(t >> 2);
                ts = if started {
                    ts + 60 + gap
                } else {
                    start as i64 + gap
                };
                let Some(shape) = get_varint(buf, &mut pos) else {
                    return;
                };
                shape
            }
            _ => {
                if !started {
                    return;
                }
                ts += 60;
                packed = Some(((t >> 2) & 15, (t >> 6) & 15));
                t >> 10
            }
        };
        if shape >> 1 == 0 || shape >> 1 > MAX_BUCKETS {
            return;
        }
        let (da, df) = match packed {
            Some(d) => d,
            None => {
                let (Some(da), Some(df)) = (get_varint(buf, &mut pos), get_varint(buf, &mut pos))
                else {
                    return;
                };
                (da, df)
            }
        };
        avg = avg.saturating_add(unzigzag(da));
        first = first.saturating_add(unzigzag(df));
        if get_buckets(buf, &mut pos, first, shape, &mut hist).is_none() || hist.is_empty() {
            return;
        }
        started = true;
        f(code(ts), Row::Hist(code(avg), &hist));
    }
}

/// Quantile `q` of sorted `v` by linear interpolation between ranks.
#[cfg(test)]
pub(super) fn quantile_sorted(v: &[f64], q: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let r = q.clamp(0.0, 1.0) * (v.len() - 1) as f64;
    let (lo, hi) = (r.floor() as usize, r.ceil() as usize);
    v[lo] + (v[hi] - v[lo]) * (r - lo as f64)
}

/// Bucket counts summed per code, in rising code order: counted in place
/// over the codes' range when it is small (the usual case: one series'
/// values span a few hundred codes), sorted otherwise.
pub(super) fn merge_buckets(b: &mut [(u32, u32)]) -> impl Iterator<Item = (u32, u64)> {
    let (lo, hi) = b
        .iter()
        .fold((u32::MAX, 0), |a, x| (a.0.min(x.0), a.1.max(x.0)));
    let mut out: Vec<(u32, u64)> = Vec::new();
    if !b.is_empty() && hi - lo < 1 << 16 {
        let mut dense = vec![0u64; (hi - lo + 1) as usize];
        for &(c, w) in b.iter() {
            dense[(c - lo) as usize] += u64::from(w);
        }
        out.extend(
            dense
                .into_iter()
                .enumerate()
                .filter(|x| x.1 > 0)
                .map(|(i, w)| (lo + i as u32, w)),
        );
    } else {
        b.sort_unstable();
        for &(c, w) in b.iter() {
            match out.last_mut() {
                Some(last) if last.0 == c => last.1 += u64::from(w),
                _ => out.push((c, u64::from(w))),
            }
        }
    }
    out.into_iter()
}

/// Quantile `q` of samples given as (value, how many), sorted by value, by
/// linear interpolation between ranks (as of the samples themselves).
pub(super) fn quantile_weighted(v: &[(f64, u64)], q: f64) -> f64 {
    let n: u64 = v.iter().map(|x| x.1).sum();
    if n == 0 {
        return f64::NAN;
    }
    let r = q.clamp(0.0, 1.0) * (n - 1) as f64;
    let (lo, hi) = (r.floor() as u64, r.ceil() as u64);
    let at = |rank: u64| {
        let mut seen = 0u64;
        for &(x, w) in v {
            seen += w;
            if seen > rank {
                return x;
            }
        }
        v[v.len() - 1].0
    };
    let (a, b) = (at(lo), at(hi));
    a + (b - a) * (r - lo as f64)
}

/// Least-squares slope of (t, v), weighted.
pub(super) fn slope(points: impl Iterator<Item = (f64, f64, f64)>) -> Option<f64> {
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
