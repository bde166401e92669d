//! The `colocation-config` key of Koordinator's `slo-controller-config`
//! ConfigMap: `ColocationStrategy` with Koordinator's JSON names, its
//! defaults (`DefaultColocationStrategy`), its validation
//! (`IsColocationStrategyValid`), the manager's merge (defaults ⊕ the cluster
//! strategy, each `nodeConfigs` entry ⊕ the merged cluster strategy, an
//! invalid entry replaced by the cluster strategy) and the resolution for one
//! node (`GetNodeColocationStrategy`: the first entry whose `nodeSelector`
//! matches the node's labels, then the node's
//! `node.koordinator.sh/colocation-strategy` annotation, then its
//! `node.koordinator.sh/{cpu,memory}-reclaim-ratio` labels).
//!
//! "Merge" is Koordinator's `MergeCfg`: the overriding strategy's fields that
//! are set replace the base's (a `null` is unset), a list replaces a list.
//! Deliberate differences: JSON keys are matched exactly (Go's decoder also
//! takes them in any letter case), and a reclaim ratio label that is not a
//! finite number is ignored (Go turns `NaN` into an undefined integer).

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use serde::{Deserialize, Serialize};

/// `node.koordinator.sh/colocation-strategy`: a strategy merged over the
/// node's resolved one.
pub const STRATEGY_ANNOTATION: &str = "node.koordinator.sh/colocation-strategy";
/// `node.koordinator.sh/cpu-reclaim-ratio`: `cpuReclaimThresholdPercent` ÷ 100.
pub const CPU_RECLAIM_LABEL: &str = "node.koordinator.sh/cpu-reclaim-ratio";
/// `node.koordinator.sh/memory-reclaim-ratio`.
pub const MEMORY_RECLAIM_LABEL: &str = "node.koordinator.sh/memory-reclaim-ratio";

/// `metricAggregatePolicy`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AggregatePolicy {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub durations: Option<Vec<String>>,
}

/// Koordinator's `ColocationStrategy`: every field optional, as in the
/// ConfigMap; [`Strategy::defaults`] sets all that have a default.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Strategy {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enable: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metric_aggregate_duration_seconds: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metric_report_interval_seconds: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metric_aggregate_policy: Option<AggregatePolicy>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metric_memory_collect_policy: Option<String>,
    #[serde(
        default,
        rename = "cpuReclaimThresholdPercent",
        skip_serializing_if = "Option::is_none"
    )]
    pub cpu_reclaim_threshold_percent: Option<i64>,
    #[serde(
        default,
        rename = "cpuCalculatePolicy",
        skip_serializing_if = "Option::is_none"
    )]
    pub cpu_calculate_policy: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_reclaim_threshold_percent: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_calculate_policy: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub degrade_time_minutes: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub update_time_threshold_seconds: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_diff_threshold: Option<f64>,
    #[serde(
        default,
        rename = "batchCPUThresholdPercent",
        skip_serializing_if = "Option::is_none"
    )]
    pub batch_cpu_threshold_percent: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch_memory_threshold_percent: Option<i64>,
    // the mid tier: not used for batch, validated as Koordinator validates it
    #[serde(
        default,
        rename = "midCPUThresholdPercent",
        skip_serializing_if = "Option::is_none"
    )]
    pub mid_cpu_threshold_percent: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mid_memory_threshold_percent: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mid_unallocated_percent: Option<i64>,
    #[serde(
        default,
        rename = "midStaticCPUReservedPercent",
        skip_serializing_if = "Option::is_none"
    )]
    pub mid_static_cpu_reserved_percent: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mid_static_memory_reserved_percent: Option<i64>,
}

/// Fields `overlay` copies when set.
macro_rules! overlay_fields {
    ($self:ident, $o:ident: $($f:ident),*) => {
        $( if $o.$f.is_some() { $self.$f.clone_from(&$o.$f); } )*
    };
}

impl Strategy {
    /// Koordinator's `DefaultColocationStrategy` (co-location off).
    pub fn defaults() -> Self {
        Self {
            enable: Some(false),
            metric_aggregate_duration_seconds: Some(300),
            metric_report_interval_seconds: Some(60),
            metric_aggregate_policy: Some(AggregatePolicy {
                durations: Some(vec!["5m0s".into(), "10m0s".into(), "30m0s".into()]),
            }),
            metric_memory_collect_policy: Some("usageWithoutPageCache".into()),
            cpu_reclaim_threshold_percent: Some(60),
            cpu_calculate_policy: Some("usage".into()),
            memory_reclaim_threshold_percent: Some(65),
            memory_calculate_policy: Some("usage".into()),
            degrade_time_minutes: Some(15),
            update_time_threshold_seconds: Some(300),
            resource_diff_threshold: Some(0.1),
            batch_cpu_threshold_percent: None,
            batch_memory_threshold_percent: None,
            mid_cpu_threshold_percent: Some(100),
            mid_memory_threshold_percent: Some(100),
            mid_unallocated_percent: Some(0),
            mid_static_cpu_reserved_percent: Some(0),
            mid_static_memory_reserved_percent: Some(0),
        }
    }

    /// `MergeCfg(self, o)`: `o`'s set fields replace this one's.
    pub fn overlay(&mut self, o: &Strategy) {
        overlay_fields!(self, o: enable, metric_aggregate_duration_seconds,
            metric_report_interval_seconds, metric_memory_collect_policy,
            cpu_reclaim_threshold_percent, cpu_calculate_policy,
            memory_reclaim_threshold_percent, memory_calculate_policy, degrade_time_minutes,
            update_time_threshold_seconds, resource_diff_threshold, batch_cpu_threshold_percent,
            batch_memory_threshold_percent, mid_cpu_threshold_percent,
            mid_memory_threshold_percent, mid_unallocated_percent,
            mid_static_cpu_reserved_percent, mid_static_memory_reserved_percent);
        // a pointer to a struct: its set fields merge into the base's
        if let Some(p) = &o.metric_aggregate_policy {
            let base = self
                .metric_aggregate_policy
                .get_or_insert_with(Default::default);
            if p.durations.is_some() {
                base.durations.clone_from(&p.durations);
            }
        }
    }

    /// `IsColocationStrategyValid`: the first rule broken, named.
    pub fn check(&self) -> Result<(), String> {
        fn rule<T: Copy + std::fmt::Display>(
            v: Option<T>,
            name: &str,
            ok: impl Fn(T) -> bool,
            what: &str,
        ) -> Result<(), String> {
            match v {
                Some(x) if !ok(x) => Err(format!("{name} {x}: {what}")),
                _ => Ok(()),
            }
        }
        let pct = |x: i64| (0..=100).contains(&x);
        rule(
            self.metric_aggregate_duration_seconds,
            "metricAggregateDurationSeconds",
            |x| x > 0,
            "must be > 0",
        )?;
        rule(
            self.metric_report_interval_seconds,
            "metricReportIntervalSeconds",
            |x| x > 0,
            "must be > 0",
        )?;
        rule(
            self.cpu_reclaim_threshold_percent,
            "cpuReclaimThresholdPercent",
            |x| x >= 0,
            "must be >= 0",
        )?;
        rule(
            self.memory_reclaim_threshold_percent,
            "memoryReclaimThresholdPercent",
            |x| x >= 0,
            "must be >= 0",
        )?;
        rule(
            self.mid_static_cpu_reserved_percent,
            "midStaticCPUReservedPercent",
            |x| x >= 0,
            "must be >= 0",
        )?;
        rule(
            self.mid_static_memory_reserved_percent,
            "midStaticMemoryReservedPercent",
            |x| x >= 0,
            "must be >= 0",
        )?;
        rule(
            self.degrade_time_minutes,
            "degradeTimeMinutes",
            |x| x > 0,
            "must be > 0",
        )?;
        rule(
            self.update_time_threshold_seconds,
            "updateTimeThresholdSeconds",
            |x| x > 0,
            "must be > 0",
        )?;
        rule(
            self.resource_diff_threshold,
            "resourceDiffThreshold",
            |x: f64| x > 0.0,
            "must be > 0",
        )?;
        if self.metric_memory_collect_policy.as_deref() == Some("") {
            return Err("metricMemoryCollectPolicy is empty".into());
        }
        rule(
            self.mid_cpu_threshold_percent,
            "midCPUThresholdPercent",
            pct,
            "must be 0 to 100",
        )?;
        rule(
            self.mid_memory_threshold_percent,
            "midMemoryThresholdPercent",
            pct,
            "must be 0 to 100",
        )?;
        rule(
            self.mid_unallocated_percent,
            "midUnallocatedPercent",
            pct,
            "must be 0 to 100",
        )?;
        rule(
            self.batch_cpu_threshold_percent,
            "batchCPUThresholdPercent",
            |x| x >= 0,
            "must be >= 0",
        )?;
        rule(
            self.batch_memory_threshold_percent,
            "batchMemoryThresholdPercent",
            |x| x >= 0,
            "must be >= 0",
        )?;
        Ok(())
    }

    /// Go's `metav1.Duration` refuses a duration it cannot parse, and with
    /// it the whole value.
    fn check_durations(&self) -> Result<(), String> {
        for d in self
            .metric_aggregate_policy
            .iter()
            .flat_map(|p| p.durations.iter().flatten())
        {
            if crate::parse_go_duration(d).is_none() {
                return Err(format!(
                    "metricAggregatePolicy.durations: {d:?} is not a duration"
                ));
            }
        }
        Ok(())
    }

    /// Whether this strategy turns co-location on.
    pub fn enabled(&self) -> bool {
        self.enable == Some(true)
    }

    /// `cpuReclaimThresholdPercent` (its default when unset).
    pub fn cpu_reclaim(&self) -> i64 {
        self.cpu_reclaim_threshold_percent.unwrap_or(60)
    }
    pub fn memory_reclaim(&self) -> i64 {
        self.memory_reclaim_threshold_percent.unwrap_or(65)
    }
    /// `maxUsageRequest` or `usage` (any other value is `usage`).
    pub fn cpu_policy(&self) -> &'static str {
        match self.cpu_calculate_policy.as_deref() {
            Some("maxUsageRequest") => "maxUsageRequest",
            _ => "usage",
        }
    }
    /// `request`, `maxUsageRequest` or `usage`.
    pub fn memory_policy(&self) -> &'static str {
        match self.memory_calculate_policy.as_deref() {
            Some("request") => "request",
            Some("maxUsageRequest") => "maxUsageRequest",
            _ => "usage",
        }
    }
    pub fn degrade_minutes(&self) -> i64 {
        self.degrade_time_minutes.unwrap_or(15)
    }
    pub fn update_seconds(&self) -> i64 {
        self.update_time_threshold_seconds.unwrap_or(300)
    }
    pub fn diff_threshold(&self) -> f64 {
        self.resource_diff_threshold.unwrap_or(0.1)
    }
}

/// A `nodeConfigs` entry as written.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct NodeEntryRaw {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    node_selector: Option<LabelSelector>,
    #[serde(flatten)]
    strategy: Strategy,
}

/// The `colocation-config` value as written.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ConfigRaw {
    #[serde(flatten)]
    strategy: Strategy,
    #[serde(default)]
    node_configs: Option<Vec<NodeEntryRaw>>,
}

/// A `nodeConfigs` entry, merged over the cluster strategy.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeEntry {
    pub name: String,
    pub selector: Option<LabelSelector>,
    pub strategy: Strategy,
}

/// Why a `colocation-config` value is refused (the last good one stays).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConfigError {
    #[error("colocation-config is not valid JSON for a ColocationStrategy: {0}")]
    Json(String),
    #[error("colocation-config's cluster strategy is invalid: {0}")]
    Invalid(String),
}

/// The `colocation-config` as koord-manager holds it after its merge.
#[derive(Debug, Clone, PartialEq)]
pub struct ColocationConfig {
    /// Defaults ⊕ the cluster strategy.
    pub cluster: Strategy,
    pub nodes: Vec<NodeEntry>,
    /// Entries replaced by the cluster strategy, and why.
    pub warnings: Vec<String>,
}

impl Default for ColocationConfig {
    fn default() -> Self {
        Self {
            cluster: Strategy::defaults(),
            nodes: Vec::new(),
            warnings: Vec::new(),
        }
    }
}

impl ColocationConfig {
    /// Reads the key's value as koord-manager does: empty is the defaults
    /// (co-location off); bad JSON or an invalid cluster strategy is an
    /// error (the caller keeps its last good config); an invalid node entry
    /// becomes the cluster strategy, with a warning.
    pub fn parse(value: &str) -> Result<Self, ConfigError> {
        // koord-manager: only an empty key is the defaults (whitespace is a
        // JSON error)
        if value.is_empty() {
            return Ok(Self::default());
        }
        let raw: ConfigRaw = from_json(value).map_err(ConfigError::Json)?;
        raw.strategy.check_durations().map_err(ConfigError::Json)?;
        for e in raw.node_configs.iter().flatten() {
            e.strategy.check_durations().map_err(ConfigError::Json)?;
        }
        let mut cluster = Strategy::defaults();
        cluster.overlay(&raw.strategy);
        cluster.check().map_err(ConfigError::Invalid)?;
        let mut warnings = Vec::new();
        let nodes = raw
            .node_configs
            .unwrap_or_default()
            .into_iter()
            .enumerate()
            .map(|(i, e)| {
                let name = e.name.unwrap_or_default();
                let mut merged = cluster.clone();
                merged.overlay(&e.strategy);
                let strategy = match merged.check() {
                    Ok(()) => merged,
                    Err(why) => {
                        warnings.push(format!(
                            "nodeConfigs[{i}] ({name:?}) is invalid ({why}): the cluster strategy applies to its nodes"
                        ));
                        cluster.clone()
                    }
                };
                NodeEntry {
                    name,
                    selector: e.node_selector,
                    strategy,
                }
            })
            .collect();
        Ok(Self {
            cluster,
            nodes,
            warnings,
        })
    }

    /// The strategy of the node with these labels and annotations.
    pub fn resolve(
        &self,
        labels: &BTreeMap<String, String>,
        annotations: &BTreeMap<String, String>,
    ) -> Resolved {
        let mut notes = Vec::new();
        let mut strategy = self.cluster.clone();
        let mut matched = None;
        for (i, e) in self.nodes.iter().enumerate() {
            match selector_matches(e.selector.as_ref(), labels) {
                Ok(true) => {
                    strategy.overlay(&e.strategy);
                    notes.push(format!("nodeConfigs[{i}] ({:?}) matches this node", e.name));
                    matched = Some(e.name.clone());
                    break;
                }
                Ok(false) => {}
                Err(why) => notes.push(format!(
                    "nodeConfigs[{i}] ({:?}) skipped: its nodeSelector {why}",
                    e.name
                )),
            }
        }
        if let Some(s) = annotations.get(STRATEGY_ANNOTATION) {
            let merged = if s.len() > crate::batch::MAX_JSON {
                Err(format!("over {} bytes", crate::batch::MAX_JSON))
            } else {
                from_json::<Strategy>(s).and_then(|o| {
                    o.check_durations()?;
                    let mut m = strategy.clone();
                    m.overlay(&o);
                    // deliberately stricter than koord-manager, which takes
                    // the annotation unchecked: a node's value cannot make the
                    // calculation overflow
                    m.check().map(|()| m)
                })
            };
            match merged {
                Ok(m) => {
                    strategy = m;
                    notes.push(format!("annotation {STRATEGY_ANNOTATION} merged"));
                }
                Err(e) => notes.push(format!("annotation {STRATEGY_ANNOTATION} ignored: {e}")),
            }
        }
        for (label, field) in [
            (
                CPU_RECLAIM_LABEL,
                &mut strategy.cpu_reclaim_threshold_percent,
            ),
            (
                MEMORY_RECLAIM_LABEL,
                &mut strategy.memory_reclaim_threshold_percent,
            ),
        ] {
            let Some(v) = labels.get(label) else { continue };
            match v.trim().parse::<f64>() {
                // at most 100 (10,000 %): a ratio over 1 makes a negative margin,
                // one over 100 is no ratio anyone means
                Ok(r) if r.is_finite() && (0.0..=100.0).contains(&r) => {
                    // Go's int64(v * 100): truncated
                    *field = Some((r * 100.0) as i64);
                    notes.push(format!("label {label}={v} sets the reclaim percent"));
                }
                _ => notes.push(format!(
                    "label {label}={v:?} ignored: not a ratio from 0 to 100"
                )),
            }
        }
        Resolved {
            cluster_enabled: self.cluster.enabled(),
            strategy,
            node_config: matched,
            notes,
        }
    }
}

/// One node's strategy and how it was made.
#[derive(Debug, Clone, PartialEq)]
pub struct Resolved {
    /// The cluster strategy's `enable` (co-location is on only when it and
    /// the node's are).
    pub cluster_enabled: bool,
    pub strategy: Strategy,
    /// The `nodeConfigs` entry that matched, by name.
    pub node_config: Option<String>,
    pub notes: Vec<String>,
}

impl Resolved {
    /// `isColocationCfgDisabled`, negated: on only when both the cluster's
    /// `enable` and the node's are true.
    pub fn enabled(&self) -> bool {
        self.cluster_enabled && self.strategy.enabled()
    }
}

/// JSON as Go's decoder reads it into a struct: a key given twice takes
/// its last value (serde's derive would refuse it).
fn from_json<T: serde::de::DeserializeOwned>(s: &str) -> Result<T, String> {
    let v: serde_json::Value = serde_json::from_str(s).map_err(|e| e.to_string())?;
    serde_json::from_value(v).map_err(|e| e.to_string())
}

/// `metav1.LabelSelectorAsSelector(sel).Matches(labels)`: no selector
/// matches nothing, an empty one everything; a malformed one is an error.
pub fn selector_matches(
    sel: Option<&LabelSelector>,
    labels: &BTreeMap<String, String>,
) -> Result<bool, String> {
    use kube_core::SelectorExt;
    let Some(sel) = sel else { return Ok(false) };
    for r in sel.match_expressions.iter().flatten() {
        let n = r.values.as_ref().map_or(0, Vec::len);
        match r.operator.as_str() {
            "In" | "NotIn" if n == 0 => {
                return Err(format!("{} {}: needs values", r.key, r.operator))
            }
            "Exists" | "DoesNotExist" if n > 0 => {
                return Err(format!("{} {}: takes no values", r.key, r.operator))
            }
            "In" | "NotIn" | "Exists" | "DoesNotExist" => {}
            op => return Err(format!("{}: unknown operator {op:?}", r.key)),
        }
    }
    let s = kube_core::Selector::try_from(sel.clone()).map_err(|e| e.to_string())?;
    Ok(s.matches(labels))
}
