//! Blocks of delta-coded rows: raw samples one block per minute (and the
//! row streams rollups are cut into), expired whole from the front.

use super::*;

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
pub(super) struct Block<const N: usize> {
    pub(super) start: u32,
    pub(super) rows: u32,
    pub(super) prev_ts: u32,
    pub(super) prev: [u32; N],
    pub(super) run: u32,
    pub(super) buf: Vec<u8>,
}

impl<const N: usize> Block<N> {
    pub(super) fn new(start: u32) -> Self {
        Self {
            start,
            rows: 0,
            prev_ts: start,
            prev: [0; N],
            run: 0,
            buf: Vec::new(),
        }
    }

    pub(super) fn push(&mut self, ts: u32, v: [u32; N], step: u32) {
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

    pub(super) fn flush_run(&mut self) {
        if self.run > 0 {
            put_varint(&mut self.buf, (u64::from(self.run) << 2) | 0b01);
            self.run = 0;
        }
    }

    /// Appends the sealed block to `out`: `[start][rows][end - start][len][payload]`
    /// (growing `out` exactly), and returns the emptied buffer for reuse.
    pub(super) fn seal_into(mut self, out: &mut Vec<u8>) -> Vec<u8> {
        self.flush_run();
        seal(out, self.start, self.rows, self.prev_ts, self.buf)
    }

    /// A new block writing into `buf` (a sealed block's, reused: no allocation churn).
    pub(super) fn with_buf(start: u32, buf: Vec<u8>) -> Self {
        Self {
            buf,
            ..Self::new(start)
        }
    }

    /// Calls `f` on each row of an open block.
    pub(super) fn each(&self, step: u32, f: &mut dyn FnMut(u32, [u32; N])) {
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
    pub(super) fn rows_vec(&self, step: u32) -> Vec<(u32, [u32; N])> {
        let mut out = Vec::with_capacity(self.rows as usize);
        self.each(step, &mut |ts, v| out.push((ts, v)));
        out
    }
}

/// Decodes a payload; stops quietly at a truncated or malformed stream.
pub(super) fn decode_rows<const N: usize>(
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
pub(super) fn next_block<'a>(
    stream: &'a [u8],
    pos: &mut usize,
) -> Option<(u32, u32, u32, &'a [u8])> {
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
pub(super) fn blocks(stream: &[u8]) -> impl Iterator<Item = (u32, u32, u32, &[u8])> {
    let mut pos = 0usize;
    std::iter::from_fn(move || next_block(stream, &mut pos))
}

/// Drops sealed blocks that end before `cutoff` from the front of `stream`.
pub(super) fn expire_blocks(stream: &mut Vec<u8>, cutoff: u32) {
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

/// Appends a sealed block, `[start][rows][end - start][len][payload]`, to
/// `out` (growing it exactly), and returns the payload's buffer emptied for
/// reuse: the one header format of raw and rollup blocks.
pub(super) fn seal(
    out: &mut Vec<u8>,
    start: u32,
    rows: u32,
    end: u32,
    mut buf: Vec<u8>,
) -> Vec<u8> {
    let mut head = Vec::with_capacity(20);
    put_varint(&mut head, start.into());
    put_varint(&mut head, rows.into());
    put_varint(&mut head, (end - start).into());
    put_varint(&mut head, buf.len() as u64);
    out.reserve_exact(head.len() + buf.len());
    out.extend_from_slice(&head);
    out.extend_from_slice(&buf);
    buf.clear();
    buf
}
