//! One series: its raw block and rollups, what a sample does to them, and
//! what a query reads.

use super::*;

/// One series.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Series {
    pub(super) last: f64,
    pub(super) last_ts: u32,
    /// The code of `last` (an unchanged value is not encoded again).
    pub(super) last_code: u32,
    /// The last sealed raw block's buffer, kept for the next minute.
    pub(super) spare: Vec<u8>,
    pub(super) raw: Vec<u8>,
    pub(super) raw_open: Option<Block<1>>,
    pub(super) roll: Vec<u8>,
    pub(super) roll_open: Option<Roll>,
}

impl Series {
    pub(super) fn new() -> Self {
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

    pub(super) fn push(&mut self, sc: Scale, interval: u32, ts: u32, v: f64) {
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
    pub(super) fn close_minute(&mut self, sc: Scale, now: u32) {
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
    pub(super) fn raw_from(&self) -> Option<u32> {
        blocks(&self.raw)
            .next()
            .map(|b| b.0)
            .or(self.raw_open.as_ref().map(|b| b.start))
            .map(|t| t / 60 * 60)
    }

    /// Raw samples in `from..=to`.
    pub(super) fn raw_samples(
        &self,
        sc: Scale,
        from: u32,
        to: u32,
        interval: u32,
    ) -> Vec<(u32, f64)> {
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
    pub(super) fn rollups(&self, sc: Scale, from: u32, to: u32, f: &mut RowFn) {
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

    pub(super) fn heap_bytes(&self) -> usize {
        self.raw.capacity()
            + self.roll.capacity()
            + self.spare.capacity()
            + self.raw_open.as_ref().map_or(0, |b| b.buf.capacity())
            + self.roll_open.as_ref().map_or(0, Roll::capacity)
    }

    /// The newest timestamp held.
    pub(super) fn newest(&self) -> u32 {
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
