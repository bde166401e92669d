//! LoadAware's Filter and Score (`load_aware.go`), over one node's
//! [`NodeLoad`], and the extender's 0-10 scale.

use std::collections::BTreeMap;

use qoslet_colocation::Res;
use serde::Deserialize;

use crate::args::{Aggregation, Args, PerResource};
use crate::estimate::{estimate, PodFacts};
use crate::load::NodeLoad;

/// The node annotation that overrides the thresholds for one node.
pub const USAGE_THRESHOLDS_ANNOTATION: &str = "scheduling.koordinator.sh/usage-thresholds";
/// A longer annotation is not read (a node's is a few hundred bytes).
pub const MAX_ANNOTATION_BYTES: usize = 16 << 10;

/// Why a node is filtered out (LoadAware's messages, kept word for word:
/// kube-scheduler shows them in the pod's FailedScheduling event).
pub const EXPIRED: &str = "node(s) nodeMetric expired";

/// The node as the filter and the score see it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeFacts {
    /// `status.allocatable` (or the `node.koordinator.sh/raw-allocatable`
    /// annotation's values, un-amplified), cpu in milli-cores.
    pub allocatable: Res,
    /// The `usage-thresholds` annotation's text, when set.
    pub thresholds_annotation: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Custom {
    #[serde(default)]
    usage_thresholds: BTreeMap<String, i64>,
    #[serde(default)]
    prod_usage_thresholds: BTreeMap<String, i64>,
    aggregated_usage: Option<CustomAggregated>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct CustomAggregated {
    #[serde(default)]
    usage_thresholds: BTreeMap<String, i64>,
    usage_aggregation_type: Option<String>,
    usage_aggregated_duration: Option<String>,
}

/// The thresholds in force on a node.
#[derive(Debug, Clone, PartialEq)]
struct Profile {
    usage: PerResource,
    prod: PerResource,
    aggregated: Option<(PerResource, Aggregation)>,
}

fn per(m: &BTreeMap<String, i64>) -> PerResource {
    PerResource {
        cpu: m.get("cpu").copied().unwrap_or(0),
        memory: m.get("memory").copied().unwrap_or(0),
    }
}

/// The args' thresholds, with the node's annotation over them field by
/// field (`generateUsageThresholdsFilterProfile`); an annotation that does
/// not parse is ignored, as koord-scheduler ignores it.
fn profile(args: &Args, node: &NodeFacts) -> Profile {
    let base = Profile {
        usage: args.usage_thresholds,
        prod: args.prod_usage_thresholds,
        aggregated: args.aggregated_thresholds.clone(),
    };
    let Some(text) = node
        .thresholds_annotation
        .as_deref()
        .filter(|t| t.len() <= MAX_ANNOTATION_BYTES)
    else {
        return base;
    };
    let Ok(c) = serde_json::from_str::<Custom>(text) else {
        return base;
    };
    let aggregated = c.aggregated_usage.and_then(|a| {
        let kind = a.usage_aggregation_type.filter(|k| !k.is_empty())?;
        if a.usage_thresholds.is_empty() {
            return None;
        }
        let duration = a
            .usage_aggregated_duration
            .as_deref()
            .and_then(qoslet_colocation::parse_go_duration)
            .map(|d| d.as_secs() as i64)
            .filter(|d| *d > 0);
        Some((per(&a.usage_thresholds), Aggregation { kind, duration }))
    });
    if c.usage_thresholds.is_empty() && c.prod_usage_thresholds.is_empty() && aggregated.is_none() {
        return base;
    }
    Profile {
        usage: if c.usage_thresholds.is_empty() {
            base.usage
        } else {
            per(&c.usage_thresholds)
        },
        prod: if c.prod_usage_thresholds.is_empty() {
            base.prod
        } else {
            per(&c.prod_usage_thresholds)
        },
        aggregated: aggregated.or(base.aggregated),
    }
}

/// Whether the NodeMetric is too old (`isNodeMetricExpired`): never
/// reported, or `now − updateTime ≥ nodeMetricExpirationSeconds`.
pub fn expired(load: &NodeLoad, args: &Args, now_ms: i64) -> bool {
    match load.metric().and_then(|m| m.update_time) {
        None => true,
        Some(t) => now_ms - t >= args.node_metric_expiration_seconds * 1000,
    }
}

/// LoadAware's Filter: `Ok` to pass, `Err` with its reason. `load`:
/// `None` for a node without NodeMetric or pods known.
pub fn filter(
    args: &Args,
    node: &NodeFacts,
    load: Option<&NodeLoad>,
    pod: &PodFacts,
    now_ms: i64,
) -> Result<(), String> {
    if pod.daemonset {
        return Ok(());
    }
    let p = profile(args, node);
    let prod = !p.prod.is_zero() && pod.is_prod();
    let (thresholds, agg) = if prod {
        (p.prod, None)
    } else if let Some((t, a)) = &p.aggregated {
        (*t, Some(a))
    } else {
        (p.usage, None)
    };
    if thresholds.is_zero() {
        return Ok(());
    }
    // no NodeMetric: load-aware placement is best effort
    let Some(load) = load.filter(|l| l.metric().is_some()) else {
        return Ok(());
    };
    if args.filter_expired_node_metrics && expired(load, args, now_ms) {
        return if args.enable_schedule_when_node_metrics_expired {
            Ok(())
        } else {
            Err(EXPIRED.into())
        };
    }
    if load.metric().is_some_and(|m| m.node_usage.is_none()) {
        return Ok(());
    }
    let Some(existing) = load.estimated(prod, agg) else {
        return Ok(());
    };
    let est = existing + estimate(pod, args.estimated_scaling_factors);
    for (name, threshold, used, total) in [
        ("cpu", thresholds.cpu, est.cpu, node.allocatable.cpu),
        (
            "memory",
            thresholds.memory,
            est.memory,
            node.allocatable.memory,
        ),
    ] {
        if threshold == 0 || total == 0 {
            continue;
        }
        let usage = (used as f64 / total as f64 * 100.0).round() as i64;
        if usage > threshold {
            return Err(if agg.is_some() {
                format!("node(s) {name} aggregated usage exceed threshold")
            } else {
                format!("node(s) {name} usage exceed threshold")
            });
        }
    }
    Ok(())
}

/// `(alloc − used) × 100 / alloc`, 0 when over or without allocatable.
fn least_used(used: i64, capacity: i64) -> i64 {
    if capacity == 0 || used > capacity {
        return 0;
    }
    (capacity - used) * 100 / capacity
}

/// LoadAware's Score, 0-100 (`loadAwareSchedulingScorer`): 0 without a
/// NodeMetric, with an expired one, or without `status.nodeMetric`.
pub fn score(
    args: &Args,
    node: &NodeFacts,
    load: Option<&NodeLoad>,
    pod: &PodFacts,
    now_ms: i64,
) -> i64 {
    let w = args.resource_weights;
    let d = args.dominant_resource_weight;
    if w.is_zero() && d == 0 {
        return 0;
    }
    let Some(load) = load.filter(|l| l.metric().is_some()) else {
        return 0;
    };
    if expired(load, args, now_ms) || load.metric().is_some_and(|m| m.node_usage.is_none()) {
        return 0;
    }
    let prod = args.score_according_prod_usage && pod.is_prod();
    let agg = args.score_aggregation.as_ref().filter(|_| !prod);
    let Some(existing) = load.estimated(prod, agg) else {
        return 0;
    };
    let used = existing + estimate(pod, args.estimated_scaling_factors);
    let cpu = least_used(used.cpu, node.allocatable.cpu);
    let memory = least_used(used.memory, node.allocatable.memory);
    let mut total = cpu * w.cpu + memory * w.memory;
    let mut weights = w.cpu + w.memory;
    if d != 0 {
        // the dominant (least free) resource weighs `d` more
        total += cpu.min(memory) * d;
        weights += d;
    }
    if weights <= 0 {
        return 0;
    }
    total / weights
}

/// LoadAware's 0-100 on the extender's 0-10 (`MaxExtenderPriority`),
/// rounded to the nearest: kube-scheduler multiplies it by 10 and the
/// extender's weight, the scale of a plugin's score.
pub fn extender_score(s: i64) -> i64 {
    ((s.clamp(0, 100) + 5) / 10).min(10)
}
