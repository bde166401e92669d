//! Kubernetes resource quantities (`k8s.io/apimachinery/pkg/api/resource`),
//! parsed exactly: `1k`, `500m`, `128Mi`, `1.5Gi`, `1e3`, `2E`, `.5`, `100n`.
//!
//! Grammar: `<sign>? <digits>[.<digits>] <suffix>`, where the suffix is a
//! binary SI one (`Ki Mi Gi Ti Pi Ei`), a decimal SI one (`n u m "" k M G T P E`)
//! or a decimal exponent (`e3`, `E-2`). The value is kept as an exact
//! mantissa and powers of ten and two, so conversions round exactly as the Go
//! implementation does: [`Quantity::value`] is `Quantity.Value()` (rounded up
//! to a whole unit: `500m` is 1) and [`Quantity::milli_value`] is
//! `Quantity.MilliValue()`. Input is bounded: at most 64 bytes, 19
//! significant digits and 4 exponent digits (anything larger is no resource
//! amount; apimachinery accepts more); a value beyond `i64` has no
//! [`Quantity::value`] (apimachinery returns 0 or caps it). Negative values
//! round away from zero (apimachinery's exact-decimal path differs for some;
//! resources are never negative here).

/// Why a string is not a quantity.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    #[error("{0:?} is not a Kubernetes quantity")]
    Syntax(String),
    #[error("{0:?} is out of range")]
    Range(String),
}

/// A parsed quantity: `mantissa × 10^exp10 × 2^exp2`, with its sign.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quantity {
    negative: bool,
    mantissa: u64,
    exp10: i32,
    exp2: u32,
}

const MAX_LEN: usize = 64;

impl Quantity {
    pub fn parse(s: &str) -> Result<Self, QuantityError> {
        let syntax = || QuantityError::Syntax(s.chars().take(MAX_LEN).collect());
        if s.is_empty() || s.len() > MAX_LEN {
            return Err(syntax());
        }
        let b = s.as_bytes();
        let mut i = 0;
        let negative = match b[0] {
            b'-' => {
                i = 1;
                true
            }
            b'+' => {
                i = 1;
                false
            }
            _ => false,
        };
        // digits, with at most one '.', at least one digit
        let start = i;
        let mut digits: Vec<u8> = Vec::new();
        let mut frac = 0i32;
        let mut dot = false;
        while i < b.len() {
            match b[i] {
                c @ b'0'..=b'9' => {
                    digits.push(c - b'0');
                    if dot {
                        frac += 1;
                    }
                }
                b'.' if !dot => dot = true,
                _ => break,
            }
            i += 1;
        }
        // apimachinery reads an empty number ("k", ".", "-") as zero
        if digits.is_empty() {
            digits.push(0);
        }
        let _ = start;
        let (exp10, exp2) = match &s[i..] {
            "" => (0, 0),
            "n" => (-9, 0),
            "u" => (-6, 0),
            "m" => (-3, 0),
            "k" => (3, 0),
            "M" => (6, 0),
            "G" => (9, 0),
            "T" => (12, 0),
            "P" => (15, 0),
            "E" => (18, 0),
            "Ki" => (0, 10),
            "Mi" => (0, 20),
            "Gi" => (0, 30),
            "Ti" => (0, 40),
            "Pi" => (0, 50),
            "Ei" => (0, 60),
            e if e.starts_with(['e', 'E']) => {
                let n = &e[1..];
                let body = n.strip_prefix(['+', '-']).unwrap_or(n);
                if body.is_empty() || body.len() > 4 || !body.bytes().all(|c| c.is_ascii_digit()) {
                    return Err(syntax());
                }
                (n.parse::<i32>().map_err(|_| syntax())?, 0)
            }
            _ => return Err(syntax()),
        };
        // significant digits only: leading zeros dropped, trailing zeros into the exponent
        let first = digits.iter().position(|&d| d != 0);
        let Some(first) = first else {
            return Ok(Self {
                negative: false,
                mantissa: 0,
                exp10: 0,
                exp2: 0,
            });
        };
        let last = digits.iter().rposition(|&d| d != 0).unwrap_or(first);
        let sig = &digits[first..=last];
        if sig.len() > 19 {
            return Err(QuantityError::Range(s.into()));
        }
        let mantissa = sig.iter().fold(0u64, |m, &d| m * 10 + d as u64);
        let trailing = (digits.len() - 1 - last) as i32;
        Ok(Self {
            negative,
            mantissa,
            exp10: exp10 - frac + trailing,
            exp2,
        })
    }

    pub fn is_negative(&self) -> bool {
        self.negative && self.mantissa != 0
    }

    /// The amount times `10^scale`, rounded up to a whole number (away from
    /// zero, as Go's `ScaledValue` rounds); `None` beyond `i64`.
    fn scaled_ceil(&self, scale: i32) -> Option<i64> {
        if self.mantissa == 0 {
            return Some(0);
        }
        let m = (self.mantissa as i128).checked_mul(1i128 << self.exp2)?;
        let e = self.exp10 + scale;
        let v: i128 = if e >= 0 {
            m.checked_mul(10i128.checked_pow(e as u32)?)?
        } else if -e > 38 {
            1 // a positive amount below one unit rounds up to one
        } else {
            let d = 10i128.pow((-e) as u32);
            (m + d - 1) / d
        };
        let v = i64::try_from(v).ok()?;
        Some(if self.negative { -v } else { v })
    }

    /// `Quantity.Value()`: whole units, rounded up (`500m` -> 1, `1k` -> 1000).
    pub fn value(&self) -> Option<i64> {
        self.scaled_ceil(0)
    }

    /// `Quantity.MilliValue()`: thousandths, rounded up (`500m` -> 500, `2` -> 2000).
    pub fn milli_value(&self) -> Option<i64> {
        self.scaled_ceil(3)
    }
}

/// A non-negative resource amount in whole units (`Quantity.Value()`), as
/// koordlet reads batch resources; a negative or oversized one is an error.
pub fn parse_value(s: &str) -> Result<u64, QuantityError> {
    let q = Quantity::parse(s.trim())?;
    if q.is_negative() {
        return Err(QuantityError::Range(s.into()));
    }
    q.value()
        .map(|v| v as u64)
        .ok_or_else(|| QuantityError::Range(s.into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (input, Value(), MilliValue()), as apimachinery computes them
    /// (`resource.MustParse(s).Value()` / `.MilliValue()`; `None` where
    /// apimachinery's int64 overflows).
    #[test]
    fn values_as_kubernetes_computes_them() {
        let table: &[(&str, i64, i64)] = &[
            ("0", 0, 0),
            ("1", 1, 1000),
            ("2", 2, 2000),
            ("1k", 1000, 1_000_000),
            ("500m", 1, 500),
            ("1500m", 2, 1500),
            ("0.5", 1, 500),
            (".5", 1, 500),
            ("5.", 5, 5000),
            ("1.5", 2, 1500),
            ("100n", 1, 1),
            ("1u", 1, 1),
            ("128Mi", 128 << 20, (128i64 << 20) * 1000),
            ("1.5Gi", 1_610_612_736, 1_610_612_736_000),
            ("1Ki", 1024, 1_024_000),
            ("1e3", 1000, 1_000_000),
            ("1E3", 1000, 1_000_000),
            ("1e-3", 1, 1),
            ("2.5e2", 250, 250_000),
            ("1M", 1_000_000, 1_000_000_000),
            ("1G", 1_000_000_000, 1_000_000_000_000),
            ("1E", 1_000_000_000_000_000_000, i64::MAX),
            ("1Ei", 1 << 60, i64::MAX),
            ("+3", 3, 3000),
            ("0.000000000000000000000000000000000000001", 1, 1),
            ("0001.2000", 2, 1200),
            ("-1", -1, -1000),
            // apimachinery reads an empty number as zero
            ("k", 0, 0),
            (".", 0, 0),
            ("Mi", 0, 0),
        ];
        for (s, v, mv) in table {
            let q = Quantity::parse(s).unwrap_or_else(|e| panic!("{s}: {e}"));
            assert_eq!(q.value(), Some(*v), "{s} Value()");
            let got = q.milli_value();
            if *mv == i64::MAX {
                assert_eq!(got, None, "{s} MilliValue() overflows i64");
            } else {
                assert_eq!(got, Some(*mv), "{s} MilliValue()");
            }
        }
    }

    #[test]
    fn malformed_and_out_of_range() {
        for bad in [
            "", " ", "1 k", "1kb", "1.2.3", "1Ki5", "0x10", "1e", "1e+", "1ee3", "--1", "1m2",
            "1,5", "1e99999", "NaN", "∞", "1Mi ",
        ] {
            assert!(Quantity::parse(bad).is_err(), "{bad:?}");
        }
        assert!(matches!(
            Quantity::parse("12345678901234567890123"),
            Err(QuantityError::Range(_))
        ));
        assert!(Quantity::parse(&"1".repeat(100)).is_err(), "length capped");
        assert_eq!(
            Quantity::parse("9999E").unwrap().value(),
            None,
            "beyond i64"
        );
        assert!(parse_value("-5").is_err());
        assert_eq!(parse_value(" 2k ").unwrap(), 2000);
    }

    /// Every string this parser accepts round-trips the amounts of a few
    /// forms it can take; random bytes never panic.
    #[test]
    fn random_input_never_panics() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let alphabet = b"0123456789.+-eEkKmMGgTPiunx ";
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let len = (x % 12) as usize;
            let s: String = (0..len)
                .map(|i| alphabet[((x >> (i * 5)) % alphabet.len() as u64) as usize] as char)
                .collect();
            if let Ok(q) = Quantity::parse(&s) {
                let _ = (q.value(), q.milli_value());
            }
        }
    }
}
