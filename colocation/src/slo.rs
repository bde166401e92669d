//! The `slo-controller-config` keys that make a NodeSLO spec, merged as
//! koord-manager merges them (`pkg/slo-controller/nodeslo/resource_strategy.go`):
//! per key, the manager's defaults ⊕ the cluster strategy, each node entry
//! merged over that, and for a node the **first** entry whose `nodeSelector`
//! matches its labels (else the cluster strategy). The result is the NodeSLO
//! spec koord-manager would write for the node; koordlet's own layer (its
//! defaults under the spec) is the spec's parser's, as for a real NodeSLO.
//!
//! JSON-level, as Go's decoder and `MergeCfg` (decode into koord-manager's
//! types, marshal the overlay omitting what is unset, unmarshal it over the
//! base): keys match field names in any letter case, fields no type
//! defines are dropped, `null`, absent or `""` keeps the base, scalars
//! replace, objects merge key by key, arrays merge element by element (then
//! take the overlay's length). A key given twice takes its last value. Types
//! are the parser's to check: the caller refuses a key any of whose entries
//! does not parse, and keeps its last good one.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use serde_json::{json, Map, Value};

use crate::strategy::selector_matches;

/// How a key lists its node entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// `{"clusterStrategy": {...}, "nodeStrategies": [{name, nodeSelector, ...fields}]}`.
    Strategies,
    /// `{"applications": [...], "nodeConfigs": [{name, nodeSelector, applications}]}`:
    /// a matching entry's list replaces the cluster's.
    Applications,
}

/// One key of the ConfigMap and the NodeSLO spec field it makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Key {
    pub name: &'static str,
    pub field: &'static str,
    pub shape: Shape,
}

/// The keys koord-manager turns into a NodeSLO spec, in its order.
pub const KEYS: [Key; 5] = [
    Key {
        name: "resource-threshold-config",
        field: "resourceUsedThresholdWithBE",
        shape: Shape::Strategies,
    },
    Key {
        name: "resource-qos-config",
        field: "resourceQOSStrategy",
        shape: Shape::Strategies,
    },
    Key {
        name: "cpu-burst-config",
        field: "cpuBurstStrategy",
        shape: Shape::Strategies,
    },
    Key {
        name: "system-config",
        field: "systemStrategy",
        shape: Shape::Strategies,
    },
    Key {
        name: "host-application-config",
        field: "hostApplications",
        shape: Shape::Applications,
    },
];

impl Key {
    /// koord-manager's defaults for the key (`DefaultSLOCfg`): what a
    /// missing key gives, and the base of the cluster strategy.
    pub fn defaults(&self) -> Value {
        match self.name {
            "resource-threshold-config" => json!({
                "enable": false, "cpuSuppressThresholdPercent": 65, "cpuSuppressPolicy": "cpuset",
                "memoryEvictThresholdPercent": 70, "cpuEvictPolicy": "evictByRealLimit"}),
            "cpu-burst-config" => json!({
                "policy": "none", "cpuBurstPercent": 1000, "cfsQuotaBurstPercent": 300,
                "cfsQuotaBurstPeriodSeconds": -1, "sharePoolThresholdPercent": 50}),
            "system-config" => json!({"totalNetworkBandwidth": "0"}),
            "host-application-config" => json!([]),
            _ => json!({}),
        }
    }
}

/// A node entry, merged over the cluster's.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeEntry {
    pub name: String,
    pub selector: Option<LabelSelector>,
    pub value: Value,
}

/// One key as koord-manager holds it after its merge.
#[derive(Debug, Clone, PartialEq)]
pub struct Merged {
    pub cluster: Value,
    pub nodes: Vec<NodeEntry>,
    /// Fields no Koordinator type defines, dropped as Go's decoder drops
    /// them (their paths, for the log).
    pub dropped: Vec<String>,
}

/// One key's value for a node, and how it was found.
#[derive(Debug, Clone, PartialEq)]
pub struct ForNode {
    pub value: Value,
    /// The node entry that matched, by name (`None`: the cluster's).
    pub matched: Option<String>,
    /// Entries skipped for a malformed selector.
    pub notes: Vec<String>,
}

/// JSON `MergeCfg`: `over` laid over `base`.
pub fn overlay(base: &mut Value, over: &Value) {
    match (base, over) {
        (_, Value::Null) => {}
        (Value::Object(b), Value::Object(o)) => {
            for (k, v) in o {
                match b.get_mut(k) {
                    Some(slot) => overlay(slot, v),
                    None if !v.is_null() => {
                        b.insert(k.clone(), v.clone());
                    }
                    None => {}
                }
            }
        }
        // Go decodes an array into the slice already there element by
        // element (then truncates it): objects merge by index
        (Value::Array(b), Value::Array(o)) => {
            b.truncate(o.len());
            for (i, v) in o.iter().enumerate() {
                match b.get_mut(i) {
                    Some(slot) => overlay(slot, v),
                    None => b.push(v.clone()),
                }
            }
        }
        (b, o) => *b = o.clone(),
    }
}

/// A strategy's JSON as Go's decoder reads it into koord-manager's types
/// and `MergeCfg` writes it out again: keys matched to the NodeSLO field
/// names regardless of case (an exact match first), fields no type defines
/// dropped (named in `dropped`), and an empty string left out (`omitempty`:
/// it keeps the value under it). `path`: the NodeSLO spec field it is.
pub fn decoded(v: &Value, path: &str, dropped: &mut Vec<String>) -> Value {
    let fields = qoslet_hooks::nodeslo::fields();
    decode_at(v, path, &fields, dropped)
}

fn decode_at(
    v: &Value,
    path: &str,
    fields: &[(String, qoslet_hooks::nodeslo::Support)],
    dropped: &mut Vec<String>,
) -> Value {
    use qoslet_hooks::nodeslo::Support;
    // a whole subtree qoslet sets aside (systemStrategy, hostApplications, ...): as it is
    if fields
        .iter()
        .any(|(f, s)| f == path && *s == Support::NotImplemented)
    {
        return v.clone();
    }
    match v {
        Value::Object(m) => {
            // the names one level down, with whether each is a list of objects
            let mut names: Vec<&str> = Vec::new();
            for (f, _) in fields {
                if let Some(rest) = f.strip_prefix(path).and_then(|r| r.strip_prefix('.')) {
                    let name = rest.split(['.', '[']).next().unwrap_or(rest);
                    if !names.contains(&name) {
                        names.push(name);
                    }
                }
            }
            let mut out = Map::new();
            for (k, child) in m {
                let canonical = names
                    .iter()
                    .find(|n| **n == k)
                    .or_else(|| names.iter().find(|n| n.eq_ignore_ascii_case(k)));
                let Some(name) = canonical else {
                    dropped.push(format!("{path}.{k}"));
                    continue;
                };
                if matches!(child, Value::String(s) if s.is_empty()) || child.is_null() {
                    continue;
                }
                let sub = format!("{path}.{name}");
                let list = format!("{sub}[]");
                let value = match child {
                    Value::Array(items) if fields.iter().any(|(f, _)| f.starts_with(&list)) => {
                        Value::Array(
                            items
                                .iter()
                                .map(|i| decode_at(i, &list, fields, dropped))
                                .collect(),
                        )
                    }
                    other => decode_at(other, &sub, fields, dropped),
                };
                out.insert(name.to_string(), value);
            }
            Value::Object(out)
        }
        other => other.clone(),
    }
}

/// `map[key]` as Go's decoder finds a struct field: the exact name, else any
/// letter case.
fn get_ci<'a>(m: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    m.get(key).or_else(|| {
        m.iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(key))
            .map(|(_, v)| v)
    })
}

/// [`get_ci`], taking the value out.
fn take_ci(m: &mut Map<String, Value>, key: &str) -> Option<Value> {
    if let Some(v) = m.remove(key) {
        return Some(v);
    }
    let k = m.keys().find(|k| k.eq_ignore_ascii_case(key)).cloned()?;
    m.remove(&k)
}

/// Reads key `key`'s value (`None`: the key is absent: the defaults) as
/// koord-manager does. An error is bad JSON or a wrong shape: the caller
/// keeps the key's last good value.
pub fn merge(key: &Key, value: Option<&str>) -> Result<Merged, String> {
    let Some(text) = value else {
        return Ok(Merged {
            cluster: key.defaults(),
            nodes: Vec::new(),
            dropped: Vec::new(),
        });
    };
    if text.len() > MAX_KEY_BYTES {
        return Err(format!(
            "{} bytes, over the {MAX_KEY_BYTES}-byte cap",
            text.len()
        ));
    }
    // Go's json.Unmarshal of "" fails too: only an absent key is the defaults
    let v: Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
    let top = match v {
        Value::Object(m) => m,
        Value::Null => Map::new(),
        other => return Err(format!("not a JSON object: {}", kind(&other))),
    };
    let (cluster_key, list_key) = match key.shape {
        Shape::Strategies => ("clusterStrategy", "nodeStrategies"),
        Shape::Applications => ("applications", "nodeConfigs"),
    };
    let mut dropped = Vec::new();
    let mut cluster = key.defaults();
    match (key.shape, get_ci(&top, cluster_key)) {
        (_, None | Some(Value::Null)) => {}
        (Shape::Strategies, Some(o @ Value::Object(_))) => {
            overlay(&mut cluster, &decoded(o, key.field, &mut dropped))
        }
        (Shape::Applications, Some(a @ Value::Array(_))) => cluster = a.clone(),
        (_, Some(other)) => return Err(format!("{cluster_key}: unexpected {}", kind(other))),
    }
    let entries = match get_ci(&top, list_key) {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(a)) => a.clone(),
        Some(other) => return Err(format!("{list_key}: unexpected {}", kind(other))),
    };
    let mut nodes = Vec::with_capacity(entries.len());
    for (i, e) in entries.into_iter().enumerate() {
        let Value::Object(mut fields) = e else {
            if e.is_null() {
                continue;
            }
            return Err(format!("{list_key}[{i}]: unexpected {}", kind(&e)));
        };
        let name = match take_ci(&mut fields, "name") {
            None | Some(Value::Null) => String::new(),
            Some(Value::String(s)) => s,
            Some(other) => {
                return Err(format!("{list_key}[{i}].name: unexpected {}", kind(&other)))
            }
        };
        let selector = match take_ci(&mut fields, "nodeSelector") {
            None | Some(Value::Null) => None,
            Some(s) => Some(
                serde_json::from_value::<LabelSelector>(s)
                    .map_err(|e| format!("{list_key}[{i}].nodeSelector: {e}"))?,
            ),
        };
        let value = match key.shape {
            Shape::Strategies => {
                let mut m = cluster.clone();
                overlay(
                    &mut m,
                    &decoded(&Value::Object(fields), key.field, &mut dropped),
                );
                m
            }
            // an entry without applications is an empty list, as Go's nil slice
            Shape::Applications => match take_ci(&mut fields, "applications") {
                None | Some(Value::Null) => json!([]),
                Some(a @ Value::Array(_)) => a,
                Some(other) => {
                    return Err(format!(
                        "{list_key}[{i}].applications: unexpected {}",
                        kind(&other)
                    ))
                }
            },
        };
        nodes.push(NodeEntry {
            name,
            selector,
            value,
        });
    }
    Ok(Merged {
        cluster,
        nodes,
        dropped,
    })
}

/// A key's value is read at most this large (a ConfigMap holds 1 MiB in all).
pub const MAX_KEY_BYTES: usize = 1 << 20;

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

impl Merged {
    /// The value for the node with `labels`: the first entry whose selector
    /// matches (an entry with no selector matches no node; a malformed one is
    /// skipped, as koord-manager skips it), else the cluster's.
    pub fn for_node(&self, labels: &BTreeMap<String, String>) -> ForNode {
        let mut notes = Vec::new();
        for e in &self.nodes {
            match selector_matches(e.selector.as_ref(), labels) {
                Ok(true) => {
                    return ForNode {
                        value: e.value.clone(),
                        matched: Some(e.name.clone()),
                        notes,
                    }
                }
                Ok(false) => {}
                Err(why) => notes.push(format!("{:?} skipped: its nodeSelector {why}", e.name)),
            }
        }
        ForNode {
            value: self.cluster.clone(),
            matched: None,
            notes,
        }
    }
}

/// Whether `data` (a ConfigMap's) names any key of [`KEYS`].
pub fn has_policy_keys(data: &BTreeMap<String, String>) -> bool {
    KEYS.iter().any(|k| data.contains_key(k.name))
}

/// The NodeSLO spec koord-manager would write for a node with `labels`
/// from `merged` (one per key of [`KEYS`], in that order).
pub fn node_spec(merged: &[Merged; 5], labels: &BTreeMap<String, String>) -> (Value, Vec<String>) {
    let mut spec = Map::new();
    let mut notes = Vec::new();
    for (key, m) in KEYS.iter().zip(merged) {
        let f = m.for_node(labels);
        if let Some(name) = &f.matched {
            notes.push(format!(
                "{}: node entry {name:?} matches this node",
                key.name
            ));
        }
        notes.extend(f.notes.into_iter().map(|n| format!("{}: {n}", key.name)));
        spec.insert(key.field.to_string(), f.value);
    }
    (Value::Object(spec), notes)
}

/// A whole ConfigMap (`data`) read at once, each key as [`merge`] reads it,
/// for a node with `labels` (a policy file holding the ConfigMap: no last
/// good value to keep, so a bad key is an error).
pub fn spec_of_data(
    data: &BTreeMap<String, String>,
    labels: &BTreeMap<String, String>,
) -> Result<Value, String> {
    let mut merged = Vec::with_capacity(KEYS.len());
    for k in &KEYS {
        merged.push(
            merge(k, data.get(k.name).map(String::as_str))
                .map_err(|e| format!("{}: {e}", k.name))?,
        );
    }
    let merged: [Merged; 5] = merged.try_into().expect("one per key");
    Ok(node_spec(&merged, labels).0)
}
