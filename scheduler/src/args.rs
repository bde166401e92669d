//! `LoadAwareSchedulingArgs` with koord-scheduler's own field names and
//! defaults (`pkg/scheduler/apis/config/v1/defaults.go`,
//! `SetDefaults_LoadAwareSchedulingArgs`) and its validation
//! (`validation_pluginargs.go`).

use std::collections::BTreeMap;

use serde::Deserialize;

/// The args as a config file writes them (every field optional).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ArgsFile {
    pub filter_expired_node_metrics: Option<bool>,
    pub node_metric_expiration_seconds: Option<i64>,
    pub enable_schedule_when_node_metrics_expired: Option<bool>,
    #[serde(default)]
    pub resource_weights: BTreeMap<String, i64>,
    pub dominant_resource_weight: Option<i64>,
    #[serde(default)]
    pub usage_thresholds: BTreeMap<String, i64>,
    #[serde(default)]
    pub prod_usage_thresholds: BTreeMap<String, i64>,
    pub prod_usage_include_sys: Option<bool>,
    pub score_according_prod_usage: Option<bool>,
    pub estimator: Option<String>,
    #[serde(default)]
    pub estimated_scaling_factors: BTreeMap<String, i64>,
    pub estimated_seconds_after_pod_scheduled: Option<i64>,
    pub estimated_seconds_after_initialized: Option<i64>,
    pub allow_customize_estimation: Option<bool>,
    pub aggregated: Option<AggregatedFile>,
    #[serde(default)]
    pub supported_resources: Vec<String>,
    // the fields every plugin args object carries
    pub api_version: Option<String>,
    pub kind: Option<String>,
}

/// `aggregated:` as written.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AggregatedFile {
    #[serde(default)]
    pub usage_thresholds: BTreeMap<String, i64>,
    pub usage_aggregation_type: Option<String>,
    pub usage_aggregated_duration: Option<String>,
    pub score_aggregation_type: Option<String>,
    pub score_aggregated_duration: Option<String>,
}

/// CPU and memory: the resources the NodeMetric reports and LoadAware weighs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PerResource {
    pub cpu: i64,
    pub memory: i64,
}

impl PerResource {
    fn of(m: &BTreeMap<String, i64>) -> Self {
        Self {
            cpu: m.get("cpu").copied().unwrap_or(0),
            memory: m.get("memory").copied().unwrap_or(0),
        }
    }

    /// All zero: the check is off.
    pub fn is_zero(&self) -> bool {
        self.cpu == 0 && self.memory == 0
    }
}

/// An aggregation of the NodeMetric's `aggregatedNodeUsages` to read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Aggregation {
    /// `avg`, `p50`, `p90`, `p95`, `p99`.
    pub kind: String,
    /// Seconds (`None`: the longest window reported for the type).
    pub duration: Option<i64>,
}

/// The args in force, defaulted and validated.
#[derive(Debug, Clone, PartialEq)]
pub struct Args {
    pub filter_expired_node_metrics: bool,
    pub node_metric_expiration_seconds: i64,
    pub enable_schedule_when_node_metrics_expired: bool,
    pub resource_weights: PerResource,
    pub dominant_resource_weight: i64,
    pub usage_thresholds: PerResource,
    pub prod_usage_thresholds: PerResource,
    pub prod_usage_include_sys: bool,
    pub score_according_prod_usage: bool,
    /// Percent.
    pub estimated_scaling_factors: PerResource,
    pub estimated_seconds_after_pod_scheduled: Option<i64>,
    pub estimated_seconds_after_initialized: Option<i64>,
    /// The filter's aggregated thresholds and the aggregation they read.
    pub aggregated_thresholds: Option<(PerResource, Aggregation)>,
    /// The aggregation scores read (`None`: the NodeMetric's `nodeUsage`).
    pub score_aggregation: Option<Aggregation>,
}

impl Default for Args {
    fn default() -> Self {
        Args::from_file(ArgsFile::default()).expect("the defaults are valid")
    }
}

const AGGREGATION_TYPES: [&str; 5] = ["avg", "p50", "p90", "p95", "p99"];

impl Args {
    /// koord-scheduler's defaults over `f`, then its validation.
    pub fn from_file(f: ArgsFile) -> Result<Self, String> {
        let dominant = f.dominant_resource_weight.unwrap_or(0);
        if !(0..=100).contains(&dominant) {
            return Err(format!(
                "dominantResourceWeight {dominant}: must be 0 to 100"
            ));
        }
        let mut weights = f.resource_weights;
        // defaulted only when empty and no dominant weight
        if weights.is_empty() && dominant == 0 {
            weights = [("cpu".into(), 1), ("memory".into(), 1)].into();
        }
        for (r, w) in &weights {
            if !(0..=100).contains(w) {
                return Err(format!("resourceWeights[{r}] {w}: must be 0 to 100"));
            }
        }
        let mut thresholds = f.usage_thresholds;
        if thresholds.is_empty() {
            thresholds = [("cpu".into(), 65), ("memory".into(), 95)].into();
        }
        let mut factors = f.estimated_scaling_factors;
        for (r, d) in [("cpu", 85), ("memory", 70)] {
            factors.entry(r.to_string()).or_insert(d);
        }
        for (what, m) in [
            ("usageThresholds", &thresholds),
            ("prodUsageThresholds", &f.prod_usage_thresholds),
            ("estimatedScalingFactors", &factors),
        ] {
            for (r, v) in m {
                if !(0..=100).contains(v) {
                    return Err(format!("{what}[{r}] {v}: must be 0 to 100"));
                }
            }
        }
        for (r, w) in &weights {
            if *w > 0 && !factors.contains_key(r) {
                return Err(format!(
                    "resourceWeights[{r}] has no estimatedScalingFactors entry"
                ));
            }
        }
        let expiration = f.node_metric_expiration_seconds.unwrap_or(180);
        if expiration <= 0 {
            return Err(format!(
                "nodeMetricExpirationSeconds {expiration}: must be above 0"
            ));
        }
        if let Some(e) = &f.estimator {
            if !e.is_empty() && e != "defaultEstimator" {
                return Err(format!("estimator {e:?}: only defaultEstimator is known"));
            }
        }
        if f.allow_customize_estimation == Some(true) {
            return Err("allowCustomizeEstimation is not supported (pod annotations are not trusted for the estimate)".into());
        }
        for r in &f.supported_resources {
            if r != "cpu" && r != "memory" {
                return Err(format!(
                    "supportedResources {r:?}: only cpu and memory are reported by qoslet's NodeMetric"
                ));
            }
        }
        for (what, v) in [
            (
                "estimatedSecondsAfterPodScheduled",
                f.estimated_seconds_after_pod_scheduled,
            ),
            (
                "estimatedSecondsAfterInitialized",
                f.estimated_seconds_after_initialized,
            ),
        ] {
            if v.is_some_and(|s| s <= 0) {
                return Err(format!("{what}: must be above 0"));
            }
        }
        let aggregation = |kind: &Option<String>, dur: &Option<String>, what: &str| {
            let Some(kind) = kind.as_deref().filter(|k| !k.is_empty()) else {
                return Ok(None);
            };
            if !AGGREGATION_TYPES.contains(&kind) {
                return Err(format!(
                    "aggregated.{what}AggregationType {kind:?}: one of avg, p50, p90, p95, p99"
                ));
            }
            let duration = match dur.as_deref().filter(|d| !d.is_empty()) {
                None => None,
                Some(d) => Some(
                    qoslet_colocation::parse_go_duration(d)
                        .map(|d| d.as_secs() as i64)
                        .ok_or_else(|| {
                            format!("aggregated.{what}AggregatedDuration {d:?}: not a duration")
                        })?,
                ),
            };
            Ok(Some(Aggregation {
                kind: kind.to_string(),
                duration: duration.filter(|d| *d > 0),
            }))
        };
        let (aggregated_thresholds, score_aggregation) = match &f.aggregated {
            None => (None, None),
            Some(a) => {
                for (r, v) in &a.usage_thresholds {
                    if !(0..=100).contains(v) {
                        return Err(format!(
                            "aggregated.usageThresholds[{r}] {v}: must be 0 to 100"
                        ));
                    }
                }
                let usage = aggregation(
                    &a.usage_aggregation_type,
                    &a.usage_aggregated_duration,
                    "usage",
                )?;
                let score = aggregation(
                    &a.score_aggregation_type,
                    &a.score_aggregated_duration,
                    "score",
                )?;
                // thresholds with no type (or a type with no thresholds) filter nothing
                let t = PerResource::of(&a.usage_thresholds);
                (
                    usage
                        .filter(|_| !a.usage_thresholds.is_empty())
                        .map(|u| (t, u)),
                    score,
                )
            }
        };
        Ok(Args {
            filter_expired_node_metrics: f.filter_expired_node_metrics.unwrap_or(true),
            node_metric_expiration_seconds: expiration,
            enable_schedule_when_node_metrics_expired: f
                .enable_schedule_when_node_metrics_expired
                .unwrap_or(false),
            resource_weights: PerResource::of(&weights),
            dominant_resource_weight: dominant,
            usage_thresholds: PerResource::of(&thresholds),
            prod_usage_thresholds: PerResource::of(&f.prod_usage_thresholds),
            prod_usage_include_sys: f.prod_usage_include_sys.unwrap_or(false),
            score_according_prod_usage: f.score_according_prod_usage.unwrap_or(false),
            estimated_scaling_factors: PerResource::of(&factors),
            estimated_seconds_after_pod_scheduled: f.estimated_seconds_after_pod_scheduled,
            estimated_seconds_after_initialized: f.estimated_seconds_after_initialized,
            aggregated_thresholds,
            score_aggregation,
        })
    }

    /// Reads a config file's args (JSON or YAML is the caller's to parse
    /// into a JSON value).
    pub fn from_value(v: serde_json::Value) -> Result<Self, String> {
        let f: ArgsFile = serde_json::from_value(v).map_err(|e| e.to_string())?;
        Self::from_file(f)
    }
}
