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
            f(last.0.saturating_add(i.saturating_mul(step)), last.1);
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
                // no block holds more rows than a day of seconds
                for _ in 0..(t >> 2).min(u64::from(ROLLUP_SECS)) {
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
    let len = usize::try_from(get_varint(stream, pos)?).ok()?;
    let payload = stream.get(*pos..pos.checked_add(len)?)?;
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

/// How a metric's values become codes: its unit and the linear limits of the
/// raw samples, the rollups' averages and the rollups' histogram buckets.
#[derive(Debug, Clone, Copy)]
struct Scale {
    unit: f64,
    raw: f64,
    avg: f64,
    /// `None`: the metric's rollups keep a summary (avg, min, max, samples),
    /// not a histogram (see [`Metric::rollup_quantiles`]).
    hist: Option<f64>,
}

/// A linear limit no count reaches: codes are the values themselves.
const EXACT: f64 = 4.0e9;

impl Scale {
    fn of(m: Metric) -> Scale {
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
const MAX_BUCKETS: u64 = 4096;

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
struct RollBlock {
    start: u32,
    rows: u32,
    prev_ts: u32,
    prev_avg: u32,
    prev_first: u32,
    /// Where the previous row's bucket bytes are in `buf` (offset, length), to
    /// see an unchanged row without decoding it.
    prev_buckets: (u32, u32),
    prev_shape: u32,
    run: u32,
    buf: Vec<u8>,
}

/// A rollup row: the minute's average code and either its histogram or a
/// summary (min and max codes on the average's scale, samples).
#[derive(Debug, Clone, Copy, PartialEq)]
enum Row<'a> {
    Hist(u32, &'a [(u32, u32)]),
    Summary([u32; 4]),
}

/// Called per rollup row with its minute.
type RowFn<'a> = dyn FnMut(u32, Row<'_>) + 'a;

/// The open block of a series' rollups.
#[derive(Debug, Clone, PartialEq)]
enum Roll {
    Hist(RollBlock),
    /// Rows of (avg, min, max, samples).
    Summary(Block<4>),
}

impl Roll {
    fn start(&self) -> u32 {
        match self {
            Roll::Hist(b) => b.start,
            Roll::Summary(b) => b.start,
        }
    }

    fn capacity(&self) -> usize {
        match self {
            Roll::Hist(b) => b.buf.capacity(),
            Roll::Summary(b) => b.buf.capacity(),
        }
    }

    fn seal_into(self, out: &mut Vec<u8>) -> Vec<u8> {
        match self {
            Roll::Hist(b) => b.seal_into(out),
            Roll::Summary(b) => b.seal_into(out),
        }
    }

    fn each(&self, f: &mut RowFn) {
        match self {
            Roll::Hist(b) => b.each(f),
            Roll::Summary(b) => b.each(60, &mut |ts, r| f(ts, Row::Summary(r))),
        }
    }
}

/// Decodes a sealed rollup payload of either kind.
fn decode_rollups(hist: bool, payload: &[u8], start: u32, f: &mut RowFn) {
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
fn put_buckets(out: &mut Vec<u8>, hist: &[(u32, u32)]) -> u64 {
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
fn get_buckets(
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
    fn new(start: u32, buf: Vec<u8>) -> Self {
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
    fn push(&mut self, ts: u32, avg: u32, hist: &[(u32, u32)]) {
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

    fn push_encoded(&mut self, ts: u32, avg: u32, first: u32, shape: u64, buckets: &[u8]) {
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

    fn flush_run(&mut self) {
        if self.run > 0 {
            put_varint(&mut self.buf, (u64::from(self.run) << 2) | 0b01);
            self.run = 0;
        }
    }

    /// Appends the sealed block to `out` (the raw blocks' header format) and
    /// returns the emptied buffer for reuse.
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

    /// Calls `f` on each row of an open block.
    fn each(&self, f: &mut RowFn) {
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
fn decode_roll(buf: &[u8], start: u32, f: &mut RowFn) {
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
fn quantile_sorted(v: &[f64], q: f64) -> f64 {
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
fn merge_buckets(b: &mut [(u32, u32)]) -> impl Iterator<Item = (u32, u64)> {
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
fn quantile_weighted(v: &[(f64, u64)], q: f64) -> f64 {
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
    roll_open: Option<Roll>,
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

    fn push(&mut self, sc: Scale, interval: u32, ts: u32, v: f64) {
        if self.last_ts != 0 && ts <= self.last_ts {
            return; // not after the last sample: the caller's clock never does this
        }
        let code = if v == self.last {
            self.last_code
        } else {
            encode_at(v, sc.unit, sc.raw)
        };
        self.last = v;
        self.last_ts = ts;
        self.last_code = code;
        if self
            .raw_open
            .as_ref()
            .is_some_and(|b| b.start / 60 != ts / 60)
        {
            self.close_minute(sc, ts);
        }
        if self.raw_open.is_none() {
            self.raw_open = Some(Block::with_buf(ts, std::mem::take(&mut self.spare)));
        }
        if let Some(b) = self.raw_open.as_mut() {
            b.push(ts, [code], interval);
        }
    }

    /// Seals the open minute: its rollup row is added, its raw block kept for 10 minutes.
    fn close_minute(&mut self, sc: Scale, now: u32) {
        let Some(block) = self.raw_open.take() else {
            return;
        };
        // a minute holds at most 60 samples (timestamps are whole, increasing seconds)
        let mut vals = [0f64; 64];
        let mut n = 0usize;
        block.each(1, &mut |_, [c]| {
            if n < vals.len() {
                vals[n] = decode_at(c, sc.unit, sc.raw);
                n += 1;
            }
        });
        let minute = block.start / 60 * 60;
        self.spare = block.seal_into(&mut self.raw);
        if n > 0 {
            let vals = &vals[..n];
            let avg = encode_at(vals.iter().sum::<f64>() / n as f64, sc.unit, sc.avg);
            let seal = self
                .roll_open
                .as_ref()
                .is_some_and(|b| b.start() / ROLLUP_BLOCK_SECS != minute / ROLLUP_BLOCK_SECS);
            let reuse = if seal {
                self.roll_open.take().map(|b| b.seal_into(&mut self.roll))
            } else {
                None
            };
            match sc.hist {
                Some(linear) => {
                    let mut codes = [0u32; 64];
                    for (c, v) in codes.iter_mut().zip(vals) {
                        *c = encode_at(*v, sc.unit, linear);
                    }
                    let codes = &mut codes[..n];
                    codes.sort_unstable();
                    let mut buckets = [(0u32, 0u32); 64];
                    let mut k = 0usize;
                    for &c in codes.iter() {
                        if k > 0 && buckets[k - 1].0 == c {
                            buckets[k - 1].1 += 1;
                        } else {
                            buckets[k] = (c, 1);
                            k += 1;
                        }
                    }
                    let hist = &buckets[..k];
                    let open = self.roll_open.get_or_insert_with(|| {
                        Roll::Hist(RollBlock::new(minute, reuse.unwrap_or_default()))
                    });
                    if let Roll::Hist(b) = open {
                        b.push(minute, avg, hist);
                    }
                }
                None => {
                    let (lo, hi) = vals
                        .iter()
                        .fold((f64::INFINITY, 0f64), |a, v| (a.0.min(*v), a.1.max(*v)));
                    let row = [
                        avg,
                        encode_at(lo, sc.unit, sc.avg),
                        encode_at(hi, sc.unit, sc.avg),
                        n as u32,
                    ];
                    let open = self.roll_open.get_or_insert_with(|| {
                        Roll::Summary(Block::with_buf(minute, reuse.unwrap_or_default()))
                    });
                    if let Roll::Summary(b) = open {
                        b.push(minute, row, 60);
                    }
                }
            }
        }
        expire_blocks(&mut self.raw, now.saturating_sub(RAW_SECS));
        expire_blocks(&mut self.roll, now.saturating_sub(ROLLUP_SECS));
    }

    /// Where the raw samples begin (the minute of the oldest raw block).
    fn raw_from(&self) -> Option<u32> {
        blocks(&self.raw)
            .next()
            .map(|b| b.0)
            .or(self.raw_open.as_ref().map(|b| b.start))
            .map(|t| t / 60 * 60)
    }

    /// Raw samples in `from..=to`.
    fn raw_samples(&self, sc: Scale, from: u32, to: u32, interval: u32) -> Vec<(u32, f64)> {
        let mut out = Vec::new();
        let mut keep = |ts: u32, [c]: [u32; 1]| {
            if ts >= from && ts <= to {
                out.push((ts, decode_at(c, sc.unit, sc.raw)));
            }
        };
        for (start, _, end, payload) in blocks(&self.raw) {
            if end >= from && start <= to {
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

    /// Rollup rows of the minutes starting in `from..to`.
    fn rollups(&self, sc: Scale, from: u32, to: u32, f: &mut RowFn) {
        let mut keep = |ts: u32, r: Row<'_>| {
            if ts >= from && ts < to {
                f(ts, r)
            }
        };
        for (start, _, end, payload) in blocks(&self.roll) {
            if end >= from && start < to {
                decode_rollups(sc.hist.is_some(), payload, start, &mut keep);
            }
        }
        if let Some(b) = &self.roll_open {
            b.each(&mut keep);
        }
    }

    fn heap_bytes(&self) -> usize {
        self.raw.capacity()
            + self.roll.capacity()
            + self.spare.capacity()
            + self.raw_open.as_ref().map_or(0, |b| b.buf.capacity())
            + self.roll_open.as_ref().map_or(0, Roll::capacity)
    }

    /// The newest timestamp held.
    fn newest(&self) -> u32 {
        self.last_ts
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
    #[error(
        "{0} keeps no quantiles beyond the last 10 minutes (its rollups keep avg, min and max)"
    )]
    NoQuantiles(&'static str),
}

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

/// Which node and boot a snapshot was written on (`/etc/machine-id`,
/// `/proc/sys/kernel/random/boot_id`; empty when unknown).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeIdentity {
    pub machine_id: String,
    pub boot_id: String,
    /// Seconds since boot (suspend included, `/proc/uptime`) when the
    /// snapshot is written: on the same boot, the reader knows how much real
    /// time passed since, whatever the wall clock did.
    pub uptime_secs: Option<u64>,
}

impl NodeIdentity {
    /// This host's: `/etc/machine-id` (or `/var/lib/dbus/machine-id`) and
    /// `<proc_root>/sys/kernel/random/boot_id`.
    pub fn of_host(proc_root: &std::path::Path) -> NodeIdentity {
        let read = |p: &std::path::Path| {
            std::fs::read_to_string(p)
                .ok()
                .map(|s| s.trim().chars().take(64).collect::<String>())
                .filter(|s| !s.is_empty())
        };
        NodeIdentity {
            machine_id: read(std::path::Path::new("/etc/machine-id"))
                .or_else(|| read(std::path::Path::new("/var/lib/dbus/machine-id")))
                .unwrap_or_default(),
            boot_id: read(&proc_root.join("sys/kernel/random/boot_id")).unwrap_or_default(),
            uptime_secs: uptime_secs(proc_root),
        }
    }
}

/// Whole seconds since boot, suspend included (`<proc_root>/uptime`).
pub fn uptime_secs(proc_root: &std::path::Path) -> Option<u64> {
    let s = std::fs::read_to_string(proc_root.join("uptime")).ok()?;
    let v: f64 = s.split_whitespace().next()?.parse().ok()?;
    (v.is_finite() && v >= 0.0).then_some(v as u64)
}

/// Why a snapshot was not loaded.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SnapshotError {
    #[error("not a qoslet metrics snapshot (or one of an older format)")]
    Foreign,
    #[error("snapshot is truncated or corrupt")]
    Corrupt,
    #[error(
        "snapshot was written on another machine (machine id {snapshot:?}, this one {here:?})"
    )]
    OtherNode { snapshot: String, here: String },
    #[error("snapshot was written with another metric table")]
    MetricTable,
    #[error("snapshot was written at a {old} s interval, collection is every {new} s")]
    Interval { old: u32, new: u32 },
}

/// A loaded snapshot.
#[derive(Debug)]
pub struct Loaded {
    pub tsdb: Tsdb,
    /// The boot id differs: the node restarted since it was written.
    pub other_boot: bool,
    /// Series time now, as the snapshot's clock would give it: its newest
    /// sample plus the real time since it was written (same boot, both
    /// uptimes known). A wall clock that stepped forward while the writer
    /// ran then does not age the whole cache at the restart.
    pub series_now: Option<u32>,
}

const MAGIC: &[u8; 8] = b"QSLTSDB3";

/// FNV-1a, continued from `h`.
fn fnv(h: u64, data: &[u8]) -> u64 {
    data.iter()
        .fold(h, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3))
}
const FNV0: u64 = 0xcbf2_9ce4_8422_2325;

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    put_varint(out, b.len() as u64);
    out.extend_from_slice(b);
}

/// The metric table a snapshot records: ids and names, in id order.
fn metric_table() -> Vec<u8> {
    let mut out = Vec::new();
    put_varint(&mut out, Metric::ALL.len() as u64);
    for m in Metric::ALL {
        out.push(m as u8);
        put_bytes(&mut out, m.name().as_bytes());
        // how its values are coded: a change of unit or scale is another table
        let sc = Scale::of(m);
        for x in [sc.unit, sc.raw, sc.avg, sc.hist.unwrap_or(-1.0)] {
            out.extend_from_slice(&x.to_le_bytes());
        }
    }
    out
}

fn put_block<const N: usize>(out: &mut Vec<u8>, b: &Block<N>) {
    for v in [b.start, b.rows, b.prev_ts] {
        put_varint(out, v.into());
    }
    for v in b.prev {
        put_varint(out, v.into());
    }
    put_varint(out, b.run.into());
    put_bytes(out, &b.buf);
}

fn put_raw_block(out: &mut Vec<u8>, b: &Option<Block<1>>) {
    match b {
        None => out.push(0),
        Some(b) => {
            out.push(1);
            put_block(out, b);
        }
    }
}

fn put_roll(out: &mut Vec<u8>, b: &Option<Roll>) {
    match b {
        None => out.push(0),
        Some(Roll::Hist(b)) => {
            out.push(1);
            for v in [
                b.start,
                b.rows,
                b.prev_ts,
                b.prev_avg,
                b.prev_first,
                b.prev_buckets.0,
                b.prev_buckets.1,
                b.prev_shape,
                b.run,
            ] {
                put_varint(out, v.into());
            }
            put_bytes(out, &b.buf);
        }
        Some(Roll::Summary(b)) => {
            out.push(2);
            put_block(out, b);
        }
    }
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
    fn bytes(&mut self) -> Result<&'a [u8], SnapshotError> {
        let n = usize::try_from(self.varint()?).map_err(|_| SnapshotError::Corrupt)?;
        self.take(n)
    }
    fn string(&mut self) -> Result<String, SnapshotError> {
        String::from_utf8(self.bytes()?.to_vec()).map_err(|_| SnapshotError::Corrupt)
    }
    /// An entity record follows (1) or the list ends (0).
    fn present(&mut self) -> Result<bool, SnapshotError> {
        match self.take(1)?[0] {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(SnapshotError::Corrupt),
        }
    }
    fn block<const N: usize>(&mut self) -> Result<Block<N>, SnapshotError> {
        let (start, rows, prev_ts) = (self.u32()?, self.u32()?, self.u32()?);
        let mut prev = [0u32; N];
        for p in prev.iter_mut() {
            *p = self.u32()?;
        }
        let (run, buf) = (self.u32()?, self.bytes()?);
        open_block_sane(start, rows, prev_ts, run, buf)?;
        Ok(Block {
            start,
            rows,
            prev_ts,
            prev,
            run,
            buf: buf.to_vec(),
        })
    }
    /// A stream of sealed blocks that walks to its end, each block's header
    /// within what this cache writes.
    fn sealed(&mut self) -> Result<Vec<u8>, SnapshotError> {
        let stream = self.bytes()?;
        let mut pos = 0;
        while pos < stream.len() {
            let (start, rows, end, payload) =
                next_block(stream, &mut pos).ok_or(SnapshotError::Corrupt)?;
            if end < start || end - start > ROLLUP_SECS || rows > ROLLUP_SECS || payload.is_empty()
            {
                return Err(SnapshotError::Corrupt);
            }
        }
        Ok(stream.to_vec())
    }
    fn raw_block(&mut self) -> Result<Option<Block<1>>, SnapshotError> {
        match self.take(1)?[0] {
            0 => Ok(None),
            1 => Ok(Some(self.block()?)),
            _ => Err(SnapshotError::Corrupt),
        }
    }
    /// The open rollup block, of the kind `hist` says the metric keeps.
    fn roll(&mut self, hist: bool) -> Result<Option<Roll>, SnapshotError> {
        match (self.take(1)?[0], hist) {
            (0, _) => Ok(None),
            (1, true) => {
                let mut v = [0u32; 9];
                for x in v.iter_mut() {
                    *x = self.u32()?;
                }
                let buf = self.bytes()?;
                let [start, rows, prev_ts, prev_avg, prev_first, at, len, prev_shape, run] = v;
                open_block_sane(start, rows, prev_ts, run, buf)?;
                if u64::from(at) + u64::from(len) > buf.len() as u64
                    || u64::from(prev_shape >> 1) > MAX_BUCKETS
                {
                    return Err(SnapshotError::Corrupt);
                }
                let buf = buf.to_vec();
                Ok(Some(Roll::Hist(RollBlock {
                    start,
                    rows,
                    prev_ts,
                    prev_avg,
                    prev_first,
                    prev_buckets: (at, len),
                    prev_shape,
                    run,
                    buf,
                })))
            }
            (2, false) => Ok(Some(Roll::Summary(self.block()?))),
            _ => Err(SnapshotError::Corrupt),
        }
    }
}

/// An open block's header as this cache writes it: time runs forward within
/// a day, repeats are rows, and rows have bytes (or there are none).
fn open_block_sane(
    start: u32,
    rows: u32,
    prev_ts: u32,
    run: u32,
    buf: &[u8],
) -> Result<(), SnapshotError> {
    let sane = prev_ts >= start
        && prev_ts - start <= ROLLUP_SECS
        && rows <= ROLLUP_SECS
        && run <= rows
        && (rows == 0) == buf.is_empty();
    if sane {
        Ok(())
    } else {
        Err(SnapshotError::Corrupt)
    }
}

/// Writes through `w`, keeping the checksum of what passed.
struct Summed<'a> {
    w: &'a mut dyn std::io::Write,
    sum: u64,
}

impl Summed<'_> {
    fn put(&mut self, b: &[u8]) -> std::io::Result<()> {
        self.sum = fnv(self.sum, b);
        self.w.write_all(b)
    }
}

/// Entities encoded per lock in [`write_snapshot_locked`].
const SNAPSHOT_BATCH: usize = 64;

fn put_entity(out: &mut Vec<u8>, name: &str, e: &Entity) {
    out.push(1);
    put_bytes(out, name.as_bytes());
    put_varint(out, e.last_seen.into());
    put_varint(out, e.series.len() as u64);
    for (m, s) in &e.series {
        out.push(*m as u8);
        out.extend_from_slice(&s.last.to_le_bytes());
        put_varint(out, s.last_ts.into());
        put_bytes(out, &s.raw);
        put_raw_block(out, &s.raw_open);
        put_bytes(out, &s.roll);
        put_roll(out, &s.roll_open);
    }
}

/// The one snapshot writer: header, then each of `names` that `encode` still
/// finds (entity records, each after a 1), then a 0 and the checksum.
fn write_entities(
    id: &NodeIdentity,
    interval: u32,
    names: &[String],
    w: &mut dyn std::io::Write,
    encode: &mut dyn FnMut(&[String], &mut Vec<u8>),
) -> std::io::Result<()> {
    let mut out = Summed { w, sum: FNV0 };
    let mut head = MAGIC.to_vec();
    put_bytes(&mut head, id.machine_id.as_bytes());
    put_bytes(&mut head, id.boot_id.as_bytes());
    put_varint(&mut head, id.uptime_secs.map_or(0, |u| u.saturating_add(1)));
    put_bytes(&mut head, &metric_table());
    put_varint(&mut head, interval.into());
    out.put(&head)?;
    let mut buf = Vec::new();
    for batch in names.chunks(SNAPSHOT_BATCH) {
        buf.clear();
        encode(batch, &mut buf);
        out.put(&buf)?;
    }
    out.put(&[0])?;
    let sum = out.sum;
    out.w.write_all(&sum.to_le_bytes())
}

/// Writes a snapshot of the cache behind `db`, holding its lock only while a
/// batch of entities is encoded (never while writing), so collection and
/// queries go on; each entity is consistent, the whole is as of its batch.
pub fn write_snapshot_locked(
    db: &std::sync::Mutex<Tsdb>,
    id: &NodeIdentity,
    w: &mut dyn std::io::Write,
) -> std::io::Result<()> {
    let lock = || db.lock().unwrap_or_else(|e| e.into_inner());
    let (interval, names) = {
        let g = lock();
        (g.interval, g.entities.keys().cloned().collect::<Vec<_>>())
    };
    write_entities(id, interval, &names, w, &mut |batch, out| {
        let g = lock();
        for name in batch {
            if let Some(e) = g.entities.get(name) {
                put_entity(out, name, e);
            }
        }
    })
}

impl Tsdb {
    /// Writes the whole cache (for `--state-dir`, so a restart does not blind
    /// the engine) with the node's identity and the metric table.
    pub fn write_snapshot(
        &self,
        id: &NodeIdentity,
        w: &mut dyn std::io::Write,
    ) -> std::io::Result<()> {
        let names: Vec<String> = self.entities.keys().cloned().collect();
        write_entities(id, self.interval, &names, w, &mut |batch, out| {
            for name in batch {
                if let Some(e) = self.entities.get(name) {
                    put_entity(out, name, e);
                }
            }
        })
    }

    /// [`Tsdb::write_snapshot`] into memory.
    pub fn to_snapshot(&self, id: &NodeIdentity) -> Vec<u8> {
        let mut out = Vec::new();
        let _ = self.write_snapshot(id, &mut out);
        out
    }

    /// Loads a snapshot written on this machine (`here`; an empty machine id
    /// on either side is not checked) with this metric table and `interval`.
    pub fn from_snapshot(
        b: &[u8],
        here: &NodeIdentity,
        interval: u32,
    ) -> Result<Loaded, SnapshotError> {
        if b.len() < MAGIC.len() + 8 || &b[..MAGIC.len()] != MAGIC {
            return Err(SnapshotError::Foreign);
        }
        let (body, sum) = b.split_at(b.len() - 8);
        if fnv(FNV0, body).to_le_bytes() != sum {
            return Err(SnapshotError::Corrupt);
        }
        let mut r = Reader {
            b: body,
            pos: MAGIC.len(),
        };
        let (machine, boot) = (r.string()?, r.string()?);
        let uptime = r.varint()?.checked_sub(1);
        if !machine.is_empty() && !here.machine_id.is_empty() && machine != here.machine_id {
            return Err(SnapshotError::OtherNode {
                snapshot: machine,
                here: here.machine_id.clone(),
            });
        }
        if r.bytes()? != metric_table() {
            return Err(SnapshotError::MetricTable);
        }
        let old = r.u32()?;
        if old != interval.clamp(1, 600) {
            return Err(SnapshotError::Interval { old, new: interval });
        }
        let mut db = Tsdb::new(old);
        while r.present()? {
            let name = r.string()?;
            let last_seen = r.u32()?;
            let ns = r.varint()?;
            if ns > Metric::ALL.len() as u64 {
                return Err(SnapshotError::Corrupt);
            }
            let mut series: Vec<(Metric, Series)> = Vec::new();
            for _ in 0..ns {
                let m = Metric::from_id(r.take(1)?[0]).ok_or(SnapshotError::Corrupt)?;
                if series.iter().any(|(x, _)| *x == m) {
                    return Err(SnapshotError::Corrupt);
                }
                let last =
                    f64::from_le_bytes(r.take(8)?.try_into().map_err(|_| SnapshotError::Corrupt)?);
                let sc = Scale::of(m);
                series.push((
                    m,
                    Series {
                        last,
                        last_code: encode_at(last, sc.unit, sc.raw),
                        spare: Vec::new(),
                        last_ts: r.u32()?,
                        raw: r.sealed()?,
                        raw_open: r.raw_block()?,
                        roll: r.sealed()?,
                        roll_open: r.roll(sc.hist.is_some())?,
                    },
                ));
            }
            db.series += series.len();
            if db
                .entities
                .insert(name, Entity { last_seen, series })
                .is_some()
            {
                return Err(SnapshotError::Corrupt);
            }
        }
        if r.pos != body.len() {
            return Err(SnapshotError::Corrupt);
        }
        let same_boot = !boot.is_empty() && boot == here.boot_id;
        let series_now = match (same_boot, uptime, here.uptime_secs) {
            (true, Some(then), Some(now)) if now >= then && db.newest() > 0 => Some(
                u32::try_from(u64::from(db.newest()).saturating_add(now - then))
                    .unwrap_or(u32::MAX),
            ),
            _ => None,
        };
        Ok(Loaded {
            tsdb: db,
            other_boot: !boot.is_empty() && !here.boot_id.is_empty() && boot != here.boot_id,
            series_now,
        })
    }
}

#[cfg(test)]
mod tests {
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
                Box::new(
                    |i, r| if (i / 60) % 10 < 3 { 4.0 } else { 0.5 } * (1.0 + 0.05 * r.gauss()),
                ),
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
        // the issue's case: p99 over 600 s and 601 s (raw / rollup edge) agree
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
}
