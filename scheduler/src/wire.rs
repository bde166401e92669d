//! kube-scheduler's extender API, v1 (`k8s.io/kube-scheduler/extender/v1`):
//! its types have no JSON tags, so Go writes the field names as they are
//! (`Pod`, `Nodes`, `NodeNames`, `FailedNodes`, `Host`, `Score`) and reads
//! them in any case; `null` for a nil pointer. A request's keys are read
//! here in any case too (the types' own compatibility test sends lower-case
//! ones).

use std::collections::BTreeMap;
use std::fmt;

use qoslet_kube_api::view::PodView;
use serde::de::{IgnoredAny, MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::value::RawValue;

/// `ExtenderArgs`: the pod, and the nodes as full objects (`Nodes`, when
/// the extender is not `nodeCacheCapable`) or as names (`NodeNames`).
#[derive(Debug, Default)]
pub struct ExtenderArgs {
    pub pod: Option<PodView>,
    /// The `items` of `Nodes`, each kept as sent: a filter answers with
    /// the ones that pass, unchanged.
    pub nodes: Option<Vec<Box<RawValue>>>,
    pub node_names: Option<Vec<String>>,
}

/// A `v1.NodeList` as far as the extender reads it.
#[derive(Debug, Default, Deserialize)]
struct NodeList {
    #[serde(default, alias = "Items")]
    items: Option<Vec<Box<RawValue>>>,
}

impl<'de> Deserialize<'de> for ExtenderArgs {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = ExtenderArgs;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an ExtenderArgs object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<ExtenderArgs, A::Error> {
                let mut out = ExtenderArgs::default();
                while let Some(k) = m.next_key::<String>()? {
                    // Go's decoder: a key matches a field in any case; the
                    // last of duplicates wins
                    if k.eq_ignore_ascii_case("pod") {
                        out.pod = m.next_value()?;
                    } else if k.eq_ignore_ascii_case("nodes") {
                        out.nodes = m.next_value::<Option<NodeList>>()?.and_then(|l| l.items);
                        // `"Nodes": {"items": null}` is a list, empty
                        out.nodes.get_or_insert_with(Vec::new);
                    } else if k.eq_ignore_ascii_case("nodenames") {
                        out.node_names = m.next_value()?;
                    } else {
                        m.next_value::<IgnoredAny>()?;
                    }
                }
                Ok(out)
            }
        }
        d.deserialize_map(V)
    }
}

/// Decodes a request body; a clear error for what is not one.
pub fn decode(body: &[u8]) -> Result<ExtenderArgs, String> {
    serde_json::from_slice(body).map_err(|e| format!("not an ExtenderArgs object: {e}"))
}

/// `ExtenderFilterResult`.
#[derive(Debug, Default, Serialize)]
pub struct FilterResult<'a> {
    #[serde(rename = "Nodes")]
    pub nodes: Option<NodeListOut<'a>>,
    #[serde(rename = "NodeNames")]
    pub node_names: Option<Vec<&'a str>>,
    #[serde(rename = "FailedNodes")]
    pub failed_nodes: BTreeMap<&'a str, String>,
    #[serde(rename = "FailedAndUnresolvableNodes")]
    pub failed_and_unresolvable_nodes: BTreeMap<&'a str, String>,
    #[serde(rename = "Error")]
    pub error: String,
}

/// The nodes that pass, as they were sent.
#[derive(Debug, Serialize)]
pub struct NodeListOut<'a> {
    pub items: Vec<&'a RawValue>,
}

/// A `HostPriority`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostPriority {
    #[serde(rename = "Host")]
    pub host: String,
    #[serde(rename = "Score")]
    pub score: i64,
}

/// An error as a filter result (kube-scheduler shows `Error` in its log).
pub fn filter_error(msg: String) -> FilterResult<'static> {
    FilterResult {
        error: msg,
        ..Default::default()
    }
}
