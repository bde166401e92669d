//! When batch resources are written to the Node, and when they are removed
//! (koord-manager's `isDegradeNeeded`, `isNodeResourceSyncNeeded` and the
//! BatchResource plugin's `NeedSync`).
//!
//! * **Removed** (the keys deleted, never written as 0) while co-location is
//!   off for the node, or the NodeMetric has not been updated for
//!   `degradeTimeMinutes` (or never was).
//! * **Written** when nothing was written since start, when the last write is
//!   older than `updateTimeThresholdSeconds`, or when a key appears,
//!   disappears or moves by more than `resourceDiffThreshold` of its old value
//!   (compared in milli-units, strictly greater).

use serde::Serialize;

use crate::strategy::Strategy;
use crate::{BATCH_CPU, BATCH_MEMORY};

/// The two keys as a Node shows them (`None`: absent).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Advertised {
    pub cpu: Option<i64>,
    pub memory: Option<i64>,
}

impl Advertised {
    pub const NONE: Self = Self {
        cpu: None,
        memory: None,
    };
}

/// Why the NodeMetric cannot be trusted (`None`: it can).
pub fn degraded(update_time: Option<i64>, now: i64, s: &Strategy) -> Option<String> {
    let Some(t) = update_time else {
        return Some("the NodeMetric has never been updated".into());
    };
    let limit = s.degrade_minutes().saturating_mul(60);
    let age = now.saturating_sub(t);
    (age > limit).then(|| {
        format!(
            "the NodeMetric was last updated {age} s ago, more than degradeTimeMinutes ({} min)",
            s.degrade_minutes()
        )
    })
}

/// Why a write is due.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "reason", rename_all = "camelCase")]
pub enum Due {
    /// Nothing written since this writer started.
    FirstWrite,
    /// The last write is older than `updateTimeThresholdSeconds`.
    Expired {
        age_seconds: i64,
    },
    /// A key is on one side only.
    Appeared {
        resource: &'static str,
    },
    Disappeared {
        resource: &'static str,
    },
    /// A key moved by more than `resourceDiffThreshold` of its old value.
    Moved {
        resource: &'static str,
        old: i64,
        new: i64,
    },
}

impl std::fmt::Display for Due {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::FirstWrite => write!(f, "nothing written since start"),
            Self::Expired { age_seconds } => write!(
                f,
                "the last write was {age_seconds} s ago (updateTimeThresholdSeconds)"
            ),
            Self::Appeared { resource } => write!(f, "{resource} appears"),
            Self::Disappeared { resource } => write!(f, "{resource} disappears"),
            Self::Moved { resource, old, new } => {
                let pct = if *old == 0 {
                    f64::INFINITY
                } else {
                    (*new - *old) as f64 * 100.0 / *old as f64
                };
                write!(
                    f,
                    "{resource} moves from {old} to {new} ({pct:+.1}%, over resourceDiffThreshold)"
                )
            }
        }
    }
}

/// `IsQuantityDiff`: |new − old| > old × threshold, in milli-units.
fn moved(old: i64, new: i64, threshold: f64) -> bool {
    let (o, n) = (old as f64 * 1000.0, new as f64 * 1000.0);
    (n - o).abs() > o * threshold
}

/// Whether `next` must be written over what the Node shows (`current`),
/// given the age of this writer's last write (`None`: none since start).
pub fn due(
    current: Advertised,
    next: Advertised,
    last_write_age: Option<i64>,
    s: &Strategy,
) -> Option<Due> {
    let Some(age) = last_write_age else {
        return Some(Due::FirstWrite);
    };
    if age > s.update_seconds() {
        return Some(Due::Expired { age_seconds: age });
    }
    for (resource, old, new) in [
        (BATCH_CPU, current.cpu, next.cpu),
        (BATCH_MEMORY, current.memory, next.memory),
    ] {
        match (old, new) {
            (None, Some(_)) => return Some(Due::Appeared { resource }),
            (Some(_), None) => return Some(Due::Disappeared { resource }),
            (Some(old), Some(new)) if moved(old, new, s.diff_threshold()) => {
                return Some(Due::Moved { resource, old, new })
            }
            _ => {}
        }
    }
    None
}
