//! Compact encoding of metric values.
//!
//! A value becomes an integer *code* on a scale that is linear near zero and
//! logarithmic above it: `unit` is the smallest step a metric cares about (a
//! millicore, a byte, 0.01 %), values below [`LINEAR`] units are exact to one
//! unit, larger ones keep a relative precision of 1/[`LINEAR`] (0.25 % error at
//! most). Codes of consecutive samples differ little, so they are stored as
//! zig-zag varint deltas, and runs of unchanged values as one run-length
//! varint: a steady series costs about a byte per run, a noisy one one or
//! two bytes per sample.

/// Values up to this many units are coded linearly; above it, logarithmically
/// with ratio 1 + 1/LINEAR per code.
pub const LINEAR: f64 = 200.0;

/// The coarser scale of per-minute rollups (1 % error at most): long-window
/// statistics do not need the raw samples' precision, and coarser codes
/// differ less from minute to minute, so rows stay a byte per field.
pub const ROLLUP_LINEAR: f64 = 50.0;

/// The scale of the rollups' per-minute histogram buckets: linear up to 5
/// units, then buckets a factor 1.2 wide, so a bucket stands for its samples
/// within 9.5 % ([`HIST_ERROR`], DDSketch's relative accuracy). Coarse because
/// a noisy minute costs half a byte per bucket its samples span: at this width
/// 24 hours of histograms cost what the five-point sketch they replace did.
pub const HIST_LINEAR: f64 = 5.0;

/// The largest relative error of a value read back from a histogram bucket
/// above [`HIST_LINEAR`] units: half a bucket, `sqrt(1 + 1/HIST_LINEAR) - 1`.
pub const HIST_ERROR: f64 = 0.0955;

/// The code of `v` (negative and non-finite values code as 0).
pub fn encode(v: f64, unit: f64) -> u32 {
    encode_at(v, unit, LINEAR)
}

/// The value a code stands for.
pub fn decode(code: u32, unit: f64) -> f64 {
    decode_at(code, unit, LINEAR)
}

/// [`encode`] on a scale linear up to `linear` units.
pub fn encode_at(v: f64, unit: f64, linear: f64) -> u32 {
    if !v.is_finite() || v <= 0.0 {
        return 0;
    }
    let q = v / unit;
    if q < linear {
        return q.round() as u32;
    }
    let c = linear + ((q / linear).ln() / (1.0 + 1.0 / linear).ln()).round();
    c.min(u32::MAX as f64) as u32
}

/// [`decode`] on a scale linear up to `linear` units.
pub fn decode_at(code: u32, unit: f64, linear: f64) -> f64 {
    let c = code as f64;
    if c < linear {
        return c * unit;
    }
    linear * ((c - linear) * (1.0 + 1.0 / linear).ln()).exp() * unit
}

pub fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Reads a varint at `*pos`, advancing it; `None` on a truncated stream.
pub fn get_varint(buf: &[u8], pos: &mut usize) -> Option<u64> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let b = *buf.get(*pos)?;
        *pos += 1;
        v |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Some(v);
        }
    }
    None
}

pub fn zigzag(d: i64) -> u64 {
    ((d << 1) ^ (d >> 63)) as u64
}

pub fn unzigzag(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_exact_near_zero_and_relative_above() {
        assert_eq!(encode(0.0, 0.001), 0);
        assert_eq!(encode(-3.0, 1.0), 0);
        assert_eq!(encode(f64::NAN, 1.0), 0);
        assert_eq!(decode(encode(0.137, 0.001), 0.001), 0.137);
        for v in [0.5, 1.0, 3.7, 64.0 * 1048576.0, 1.0e12, 7.3e-3] {
            let unit = if v > 1000.0 { 1.0 } else { 0.001 };
            let back = decode(encode(v, unit), unit);
            assert!(
                ((back - v) / v).abs() <= 0.0026 || (back - v).abs() <= unit / 2.0,
                "{v} -> {back}"
            );
        }
        // monotonic
        let mut prev = 0;
        for i in 0..100_000 {
            let c = encode(i as f64 * 1.37, 1.0);
            assert!(c >= prev);
            prev = c;
        }
    }

    #[test]
    fn histogram_buckets_keep_their_stated_error() {
        assert!(((1.0 + 1.0 / HIST_LINEAR).sqrt() - 1.0 - HIST_ERROR).abs() < 1e-3);
        let mut worst: f64 = 0.0;
        for i in 0..100_000 {
            let v = 0.006 + i as f64 * 0.0137;
            let back = decode_at(encode_at(v, 0.001, HIST_LINEAR), 0.001, HIST_LINEAR);
            worst = worst.max(((back - v) / v).abs());
        }
        assert!(worst <= HIST_ERROR + 1e-9, "{worst}");
        assert!(worst > HIST_ERROR * 0.9, "the bound is tight: {worst}");
    }

    #[test]
    fn the_rollup_scale_is_within_one_percent() {
        for v in [0.049, 1.0, 3.7, 1e9] {
            let back = decode_at(encode_at(v, 0.001, ROLLUP_LINEAR), 0.001, ROLLUP_LINEAR);
            assert!(((back - v) / v).abs() <= 0.0101, "{v} -> {back}");
        }
    }

    #[test]
    fn varints_and_zigzag() {
        let mut b = Vec::new();
        for v in [0u64, 1, 127, 128, 300, u64::MAX] {
            put_varint(&mut b, v);
        }
        let mut p = 0;
        for v in [0u64, 1, 127, 128, 300, u64::MAX] {
            assert_eq!(get_varint(&b, &mut p), Some(v));
        }
        assert_eq!(get_varint(&b, &mut p), None);
        assert_eq!(get_varint(&[0x80], &mut 0), None, "truncated");
        for d in [0i64, -1, 1, -64, 63, i64::MIN, i64::MAX] {
            assert_eq!(unzigzag(zigzag(d)), d);
        }
        assert_eq!(zigzag(-1), 1);
        assert_eq!(zigzag(1), 2);
    }
}
