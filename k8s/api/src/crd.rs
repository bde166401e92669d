//! Koordinator's two CRDs qoslet uses, as Rust types from which `qoslet crd`
//! generates the CustomResourceDefinitions (`deploy/kubernetes/crds/`; a test
//! keeps the committed files current). Schema-compatible with Koordinator's
//! own (`slo.koordinator.sh/v1alpha1`, cluster-scoped, the status
//! subresource, the same field names): every object Koordinator's CRD
//! accepts, these accept. A cluster that has Koordinator's CRDs keeps them
//! (docs/deploy.md: the CRDs are applied only where they are missing).
//!
//! NodeMetric's status is typed to the key (qoslet writes it: the reporter's
//! output is checked against these types); NodeSLO's spec sections are
//! objects whose fields are Koordinator's many strategies, kept open
//! (`x-kubernetes-preserve-unknown-fields`): qoslet reads them leniently and
//! validates what it uses, so a newer Koordinator's fields are not pruned.

use std::collections::BTreeMap;

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

fn open_object(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({"type": "object", "x-kubernetes-preserve-unknown-fields": true})
}

fn open_objects(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({"type": "array", "items": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}})
}

/// A Kubernetes ResourceList: name -> quantity (`2350m`, `10Gi`, or a number).
fn resource_list(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "additionalProperties": {
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "pattern": "^(\\+|-)?(([0-9]+(\\.[0-9]*)?)|(\\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\\+|-)?(([0-9]+(\\.[0-9]*)?)|(\\.[0-9]+))))?$",
            "x-kubernetes-int-or-string": true
        }
    })
}

fn date_time(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({"type": "string", "format": "date-time"})
}

/// NodeSLO: the SLO an operator (through koord-manager) sets for one node.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, JsonSchema)]
#[kube(
    group = "slo.koordinator.sh",
    version = "v1alpha1",
    kind = "NodeSLO",
    plural = "nodeslos",
    status = "NodeSLOStatus"
)]
#[serde(rename_all = "camelCase")]
pub struct NodeSLOSpec {
    /// BE suppression and eviction thresholds.
    #[serde(
        rename = "resourceUsedThresholdWithBE",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(schema_with = "open_object")]
    pub resource_used_threshold_with_be: Option<Value>,
    /// The QoS classes' CPU, memory, resctrl, blkio and network strategies.
    #[serde(
        rename = "resourceQOSStrategy",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(schema_with = "open_object")]
    pub resource_qos_strategy: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "open_object")]
    pub cpu_burst_strategy: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "open_object")]
    pub system_strategy: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "open_object")]
    pub extensions: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "open_objects")]
    pub host_applications: Option<Vec<Value>>,
}

/// NodeSLO's status (an empty struct in Koordinator).
#[derive(Serialize, Deserialize, Clone, Debug, Default, JsonSchema)]
pub struct NodeSLOStatus {}

/// NodeMetric: how loaded one node is, for the scheduler.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, JsonSchema)]
#[kube(
    group = "slo.koordinator.sh",
    version = "v1alpha1",
    kind = "NodeMetric",
    plural = "nodemetrics",
    status = "NodeMetricStatus"
)]
#[serde(rename_all = "camelCase")]
pub struct NodeMetricSpec {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metric_collect_policy: Option<MetricCollectPolicy>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MetricCollectPolicy {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub aggregate_duration_seconds: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub report_interval_seconds: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_aggregate_policy: Option<AggregatePolicy>,
    /// `usageWithoutPageCache` (default), `usageWithHotPageCache`, `usageWithPageCache`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_memory_collect_policy: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct AggregatePolicy {
    /// Go durations (`5m0s`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub durations: Vec<String>,
}

/// A resource map: `{"resources": {...}, "devices": [...]}`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct ResourceMap {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "resource_list")]
    pub resources: BTreeMap<String, Value>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "open_objects")]
    pub devices: Vec<Value>,
}

/// Aggregations: `avg`, `p50`, `p90`, `p95`, `p99`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct AggregatedUsage {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub usage: BTreeMap<String, ResourceMap>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub duration: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeMetricInfo {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_usage: Option<ResourceMap>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub aggregated_node_usages: Vec<AggregatedUsage>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub system_usage: Option<ResourceMap>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub aggregated_system_usages: Vec<AggregatedUsage>,
    /// Koordinator main's per-NUMA usage (not in v1.8.0): kept open.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "open_objects")]
    pub numa_usages: Vec<Value>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodMetricInfo {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub namespace: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod_usage: Option<ResourceMap>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub priority: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub qos: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "open_object")]
    pub extensions: Option<Value>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HostApplicationMetricInfo {
    #[serde(default)]
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<ResourceMap>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub priority: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub qos: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct ReclaimableMetric {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resource: Option<ResourceMap>,
}

/// NodeMetric's status, with Koordinator's keys.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeMetricStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "date_time")]
    pub update_time: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_metric: Option<NodeMetricInfo>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pods_metric: Vec<PodMetricInfo>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub host_application_metric: Vec<HostApplicationMetricInfo>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prod_reclaimable_metric: Option<ReclaimableMetric>,
    /// Koordinator main's peak prediction (not in v1.8.0): kept open.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "open_object")]
    pub prod_peak_metric: Option<Value>,
}

/// The CRDs as YAML documents (what `qoslet crd` prints), in a fixed order.
pub fn crds_yaml() -> String {
    use kube::CustomResourceExt;
    let mut out = String::from(
        "# Generated by `qoslet crd` from k8s/api/src/crd.rs: do not edit (a test checks it is current).\n\
         # Koordinator's NodeSLO and NodeMetric (slo.koordinator.sh/v1alpha1), schema-compatible with\n\
         # Koordinator's own: apply only where they are missing (docs/deploy.md).\n",
    );
    for mut crd in [NodeSLO::crd(), NodeMetric::crd()] {
        // Koordinator's objects may omit spec (every field is omitempty):
        // required here, they would be refused
        for v in &mut crd.spec.versions {
            if let Some(s) = v
                .schema
                .as_mut()
                .and_then(|s| s.open_api_v3_schema.as_mut())
            {
                s.required = None;
            }
        }
        out.push_str("---\n");
        out.push_str(&serde_saphyr::to_string(&crd).unwrap_or_default());
    }
    out
}
