//! Thresholds as kubelet parses them (`ParseThresholdConfig`, v1.28): hard and
//! soft maps of signal → quantity or percentage, soft grace periods, minimum
//! reclaims, and the allocatable copy of a hard memory threshold. Every error
//! names the field it came from.

use std::collections::BTreeMap;
use std::time::Duration;

use qoslet_hooks::quantity::{Quantity, QuantityError};

use crate::signal::Signal;

/// A threshold's amount: a quantity, or a share of the signal's capacity
/// (kept as `f32`, as kubelet keeps it, so a percentage of a capacity rounds
/// as kubelet's does).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Amount {
    Quantity(i64),
    Percent(f32),
}

/// How a quantity was written, which is how kubelet prints it back: with a
/// binary suffix (`Mi`: BinarySI) or not (DecimalSI). A percentage's amount
/// prints in BinarySI.
pub fn written_binary(val: &str) -> bool {
    val.ends_with('%')
        || ["Ki", "Mi", "Gi", "Ti", "Pi", "Ei"]
            .iter()
            .any(|s| val.ends_with(s))
}

impl Amount {
    /// `GetThresholdQuantity`: the amount against a capacity.
    pub fn of(self, capacity: i64) -> i64 {
        match self {
            Self::Quantity(q) => q,
            Self::Percent(p) => (capacity as f64 * p as f64) as i64,
        }
    }
}

/// One eviction threshold: met while the signal's available amount is below
/// `value`. Hard when `grace` is zero (kubelet has no other flag).
#[derive(Debug, Clone, PartialEq)]
pub struct Threshold {
    pub signal: Signal,
    pub value: Amount,
    pub grace: Duration,
    pub min_reclaim: Option<Amount>,
    /// The value was written with a binary suffix or as a percentage (how
    /// kubelet prints it in an eviction message).
    pub binary: bool,
}

impl Threshold {
    pub fn is_hard(&self) -> bool {
        self.grace.is_zero()
    }

    /// kubelet's threshold equality (`mergeThresholds`): min reclaim ignored.
    pub fn same(&self, other: &Threshold) -> bool {
        self.signal == other.signal && self.value == other.value && self.grace == other.grace
    }
}

/// Why a threshold configuration is refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ThresholdError {
    #[error("{field}: unsupported eviction signal {signal:?}")]
    UnknownSignal { field: String, signal: String },
    #[error("{field}: eviction percentage threshold must be >= 0% and <= 100%: {value:?}")]
    PercentRange { field: String, value: String },
    #[error("{field}: {value:?} is not a percentage")]
    PercentSyntax { field: String, value: String },
    #[error("{field}: eviction threshold must be positive: {value:?}")]
    NotPositive { field: String, value: String },
    #[error("{field}: {source}")]
    Quantity {
        field: String,
        source: QuantityError,
    },
    #[error("{field}: {value:?} is not a duration (e.g. 90s, 1m30s, 5m)")]
    Duration { field: String, value: String },
    #[error("{field}: invalid eviction grace period {value:?}, must be a positive value")]
    NegativeGrace { field: String, value: String },
    #[error("eviction.evictionSoftGracePeriod: grace period must be specified for the soft eviction threshold {signal}")]
    MissingGrace { signal: Signal },
    #[error("{field}: eviction minimum reclaim must not be negative: {value:?}")]
    NegativeReclaim { field: String, value: String },
    #[error("eviction.evictionMinimumReclaim[{signal:?}]: the threshold plus its minimum reclaim is 100% of capacity or more: it could never clear")]
    ReclaimUnreachable { signal: String },
}

/// The four kubelet maps, as `KubeletConfiguration` spells them.
#[derive(Debug, Clone, Default, PartialEq, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ThresholdMaps {
    #[serde(default)]
    pub eviction_hard: BTreeMap<String, String>,
    #[serde(default)]
    pub eviction_soft: BTreeMap<String, String>,
    #[serde(default)]
    pub eviction_soft_grace_period: BTreeMap<String, String>,
    #[serde(default)]
    pub eviction_minimum_reclaim: BTreeMap<String, String>,
}

fn field(map: &str, key: &str) -> String {
    // a key is the config's text: bounded in what an error repeats
    let key: String = key.chars().take(64).collect();
    format!("eviction.{map}[{key:?}]")
}

fn signal(map: &str, key: &str) -> Result<Signal, ThresholdError> {
    Signal::parse(key).ok_or_else(|| ThresholdError::UnknownSignal {
        field: field(map, key),
        signal: key.chars().take(64).collect(),
    })
}

/// kubelet's `parsePercentage`: a float before trailing `%`s, over 100.
fn percent(f: &str, val: &str) -> Result<f32, ThresholdError> {
    let num = val.trim_end_matches('%');
    let p: f32 = num.parse().map_err(|_| ThresholdError::PercentSyntax {
        field: f.to_string(),
        value: val.chars().take(64).collect(),
    })?;
    if !p.is_finite() {
        return Err(ThresholdError::PercentSyntax {
            field: f.to_string(),
            value: val.chars().take(64).collect(),
        });
    }
    Ok(p / 100.0)
}

fn quantity(f: &str, val: &str) -> Result<i64, ThresholdError> {
    let q = Quantity::parse(val).map_err(|source| ThresholdError::Quantity {
        field: f.to_string(),
        source,
    })?;
    let v = q.value().ok_or_else(|| ThresholdError::Quantity {
        field: f.to_string(),
        source: QuantityError::Range(val.chars().take(64).collect()),
    })?;
    Ok(if q.is_negative() { -v.abs() } else { v })
}

/// `parseThresholdStatement`: `None` for `0%` and `100%` (how kubelet
/// disables a threshold).
type Statement = Option<(Signal, Amount, bool)>;

fn statement(map: &str, key: &str, val: &str) -> Result<Statement, ThresholdError> {
    let s = signal(map, key)?;
    let f = field(map, key);
    if val.ends_with('%') {
        if val == "0%" || val == "100%" {
            return Ok(None);
        }
        let p = percent(&f, val)?;
        if !(0.0..=1.0).contains(&p) {
            return Err(ThresholdError::PercentRange {
                field: f,
                value: val.chars().take(64).collect(),
            });
        }
        return Ok(Some((s, Amount::Percent(p), true)));
    }
    let q = quantity(&f, val)?;
    if q <= 0 {
        return Err(ThresholdError::NotPositive {
            field: f,
            value: val.chars().take(64).collect(),
        });
    }
    Ok(Some((s, Amount::Quantity(q), written_binary(val))))
}

/// A Go duration (`time.ParseDuration`): `300ms`, `1.5h`, `1m30s`, `-30s`, `0`.
/// Returns the magnitude and whether it was negative.
pub fn parse_go_duration(s: &str) -> Option<(Duration, bool)> {
    let (neg, mut rest) = match s.as_bytes().first()? {
        b'-' => (true, &s[1..]),
        b'+' => (false, &s[1..]),
        _ => (false, s),
    };
    if rest == "0" {
        return Some((Duration::ZERO, neg));
    }
    if rest.is_empty() || s.len() > 64 {
        return None;
    }
    let mut total: f64 = 0.0;
    while !rest.is_empty() {
        let n = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (num, tail) = rest.split_at(n);
        if num.is_empty() || num == "." {
            return None;
        }
        let v: f64 = num.parse().ok()?;
        let u = tail
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(tail.len());
        let (unit, next) = tail.split_at(u);
        let scale = match unit {
            "ns" => 1e-9,
            "us" | "µs" | "μs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return None,
        };
        total += v * scale;
        rest = next;
    }
    if !total.is_finite() || total > 1e9 {
        return None;
    }
    Some((Duration::from_secs_f64(total), neg))
}

/// A duration field that must not be negative.
pub fn duration_field(f: &str, val: &str) -> Result<Duration, ThresholdError> {
    match parse_go_duration(val) {
        None => Err(ThresholdError::Duration {
            field: f.to_string(),
            value: val.chars().take(64).collect(),
        }),
        Some((d, true)) if !d.is_zero() => Err(ThresholdError::NegativeGrace {
            field: f.to_string(),
            value: val.chars().take(64).collect(),
        }),
        Some((d, _)) => Ok(d),
    }
}

/// `ParseThresholdConfig`: hard thresholds, then soft ones (each needs its
/// grace period), minimum reclaims on both, and when the node enforces
/// allocatable for pods a hard `allocatableMemory.available` copy of each hard
/// `memory.available` threshold.
pub fn parse(
    maps: &ThresholdMaps,
    enforce_allocatable: bool,
) -> Result<Vec<Threshold>, ThresholdError> {
    let mut hard = Vec::new();
    for (k, v) in &maps.eviction_hard {
        if let Some((signal, value, binary)) = statement("evictionHard", k, v)? {
            hard.push(Threshold {
                signal,
                value,
                grace: Duration::ZERO,
                min_reclaim: None,
                binary,
            });
        }
    }
    let mut soft = Vec::new();
    for (k, v) in &maps.eviction_soft {
        if let Some(st) = statement("evictionSoft", k, v)? {
            soft.push(st);
        }
    }
    let mut grace = BTreeMap::new();
    for (k, v) in &maps.eviction_soft_grace_period {
        let s = signal("evictionSoftGracePeriod", k)?;
        grace.insert(s, duration_field(&field("evictionSoftGracePeriod", k), v)?);
    }
    let mut reclaim = BTreeMap::new();
    for (k, v) in &maps.eviction_minimum_reclaim {
        let s = signal("evictionMinimumReclaim", k)?;
        let f = field("evictionMinimumReclaim", k);
        let a = if v.ends_with('%') {
            let p = percent(&f, v)?;
            if p <= 0.0 {
                return Err(ThresholdError::NegativeReclaim {
                    field: f,
                    value: v.chars().take(64).collect(),
                });
            }
            Amount::Percent(p)
        } else {
            let q = quantity(&f, v)?;
            if q < 0 {
                return Err(ThresholdError::NegativeReclaim {
                    field: f,
                    value: v.chars().take(64).collect(),
                });
            }
            Amount::Quantity(q)
        };
        reclaim.insert(s, a);
    }
    let mut out = hard;
    for (signal, value, binary) in soft {
        let g = *grace
            .get(&signal)
            .ok_or(ThresholdError::MissingGrace { signal })?;
        out.push(Threshold {
            signal,
            value,
            grace: g,
            min_reclaim: None,
            binary,
        });
    }
    for t in &mut out {
        t.min_reclaim = reclaim.get(&t.signal).copied();
        // not kubelet's check: a threshold that needs more than all of the
        // capacity free to clear would evict a pod every cycle until none is left
        if let (Amount::Percent(v), Some(Amount::Percent(m))) = (t.value, t.min_reclaim) {
            if v + m >= 1.0 {
                return Err(ThresholdError::ReclaimUnreachable {
                    signal: t.signal.as_str().into(),
                });
            }
        }
    }
    if enforce_allocatable {
        let copies: Vec<Threshold> = out
            .iter()
            .filter(|t| t.signal == Signal::MemoryAvailable && t.is_hard())
            .map(|t| Threshold {
                signal: Signal::AllocatableMemoryAvailable,
                ..t.clone()
            })
            .collect();
        out.extend(copies);
    }
    Ok(out)
}
