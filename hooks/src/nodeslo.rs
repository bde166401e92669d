//! Koordinator's NodeSLO spec (`apis/slo/v1alpha1` `NodeSLOSpec`), field by
//! field, and what qoslet does with each: so any valid NodeSLO can be used as
//! qoslet's `policy:` as it is. A field qoslet implements is parsed strictly
//! (a typo in it is an error naming its path); a field Koordinator defines and
//! qoslet does not implement is kept aside, reported once as "not implemented
//! by qoslet" and shown by `qoslet plan`, never an error; a field Koordinator
//! does not define either is a typo, and an error with the closest name.

use serde_json::{Map, Value};

/// What qoslet does with a NodeSLO field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Support {
    /// Parsed and in force.
    Implemented,
    /// Parsed and validated, but nothing acts on it yet (eviction, the next wave).
    Parsed,
    /// Koordinator's, not qoslet's: set aside (the whole subtree, when the path is an object).
    NotImplemented,
}

use Support::{Implemented as I, NotImplemented as N};

/// The fields of one class (`lsrClass`, ...), relative to the class.
const CLASS: &[(&str, Support)] = &[
    ("cpuQOS.enable", I),
    ("cpuQOS.groupIdentity", I),
    ("cpuQOS.schedIdle", I),
    ("cpuQOS.coreExpeller", N),
    ("memoryQOS.enable", I),
    ("memoryQOS.minLimitPercent", I),
    ("memoryQOS.lowLimitPercent", I),
    ("memoryQOS.throttlingPercent", I),
    ("memoryQOS.wmarkRatio", I),
    ("memoryQOS.wmarkScalePermill", I),
    ("memoryQOS.wmarkMinAdj", I),
    ("memoryQOS.priorityEnable", I),
    ("memoryQOS.priority", I),
    ("memoryQOS.oomKillGroup", I),
    ("memoryQOS.pageCacheEnable", N),
    ("memoryQOS.pageCacheLimitPercent", N),
    ("memoryQOS.pageCacheLimitSize", N),
    ("memoryQOS.pageCacheReclaimSync", N),
    ("resctrlQOS.enable", I),
    ("resctrlQOS.catRangeStartPercent", I),
    ("resctrlQOS.catRangeEndPercent", I),
    ("resctrlQOS.mbaPercent", I),
    ("blkioQOS.enable", I),
    ("blkioQOS.blocks[].name", I),
    ("blkioQOS.blocks[].type", I),
    ("blkioQOS.blocks[].ioCfg.readIOPS", I),
    ("blkioQOS.blocks[].ioCfg.writeIOPS", I),
    ("blkioQOS.blocks[].ioCfg.readBPS", I),
    ("blkioQOS.blocks[].ioCfg.writeBPS", I),
    ("blkioQOS.blocks[].ioCfg.ioWeightPercent", N),
    ("blkioQOS.blocks[].ioCfg.readLatency", N),
    ("blkioQOS.blocks[].ioCfg.writeLatency", N),
    ("blkioQOS.blocks[].ioCfg.readLatencyPercent", N),
    ("blkioQOS.blocks[].ioCfg.writeLatencyPercent", N),
    ("blkioQOS.blocks[].ioCfg.enableUserModel", N),
    ("blkioQOS.blocks[].ioCfg.modelReadBPS", N),
    ("blkioQOS.blocks[].ioCfg.modelWriteBPS", N),
    ("blkioQOS.blocks[].ioCfg.modelReadSeqIOPS", N),
    ("blkioQOS.blocks[].ioCfg.modelWriteSeqIOPS", N),
    ("blkioQOS.blocks[].ioCfg.modelReadRandIOPS", N),
    ("blkioQOS.blocks[].ioCfg.modelWriteRandIOPS", N),
    ("networkQOS", N),
];

/// The rest of the spec (class fields come from [`CLASS`]).
const SPEC: &[(&str, Support)] = &[
    ("resourceQOSStrategy.policies.cpuPolicy", I),
    ("resourceQOSStrategy.policies.netQOSPolicy", N),
    ("resourceQOSStrategy.cgroupRoot", N),
    ("resourceUsedThresholdWithBE.enable", I),
    ("resourceUsedThresholdWithBE.cpuSuppressThresholdPercent", I),
    ("resourceUsedThresholdWithBE.cpuSuppressPolicy", I),
    ("resourceUsedThresholdWithBE.cpuSuppressMinPercent", I),
    ("resourceUsedThresholdWithBE.memoryEvictThresholdPercent", I),
    ("resourceUsedThresholdWithBE.memoryEvictLowerPercent", I),
    (
        "resourceUsedThresholdWithBE.memoryAllocatableEvictThresholdPercent",
        N,
    ),
    (
        "resourceUsedThresholdWithBE.memoryAllocatableEvictLowerPercent",
        N,
    ),
    (
        "resourceUsedThresholdWithBE.cpuEvictBESatisfactionUpperPercent",
        I,
    ),
    (
        "resourceUsedThresholdWithBE.cpuEvictBESatisfactionLowerPercent",
        I,
    ),
    (
        "resourceUsedThresholdWithBE.cpuEvictBEUsageThresholdPercent",
        I,
    ),
    ("resourceUsedThresholdWithBE.cpuEvictTimeWindowSeconds", I),
    ("resourceUsedThresholdWithBE.cpuEvictThresholdPercent", N),
    ("resourceUsedThresholdWithBE.cpuEvictLowerPercent", N),
    (
        "resourceUsedThresholdWithBE.cpuAllocatableEvictThresholdPercent",
        N,
    ),
    (
        "resourceUsedThresholdWithBE.cpuAllocatableEvictLowerPercent",
        N,
    ),
    ("resourceUsedThresholdWithBE.cpuEvictPolicy", I),
    (
        "resourceUsedThresholdWithBE.evictEnabledPriorityThreshold",
        N,
    ),
    (
        "resourceUsedThresholdWithBE.allocatableEvictPriorityThreshold",
        N,
    ),
    ("cpuBurstStrategy.policy", I),
    ("cpuBurstStrategy.cpuBurstPercent", I),
    ("cpuBurstStrategy.cfsQuotaBurstPercent", I),
    ("cpuBurstStrategy.cfsQuotaBurstPeriodSeconds", I),
    ("cpuBurstStrategy.sharePoolThresholdPercent", I),
    ("systemStrategy", N),
    ("extensions", N),
    ("hostApplications", N),
];

const CLASSES: [&str; 4] = ["lsrClass", "lsClass", "beClass", "systemClass"];

/// Every field path with its support.
pub fn fields() -> Vec<(String, Support)> {
    let mut out: Vec<(String, Support)> = SPEC.iter().map(|(p, s)| (p.to_string(), *s)).collect();
    for c in CLASSES {
        for (p, s) in CLASS {
            out.push((format!("resourceQOSStrategy.{c}.{p}"), *s));
        }
    }
    out
}

/// A NodeSLO spec split: what qoslet parses, and what it sets aside.
#[derive(Debug, Clone, PartialEq)]
pub struct Split {
    /// The spec without the fields qoslet does not implement.
    pub spec: Value,
    /// Fields Koordinator defines that qoslet does not act on (`path = value`).
    pub not_implemented: Vec<String>,
}

/// Why a NodeSLO spec is refused before its values are parsed: a field
/// name neither qoslet nor Koordinator defines, with its path.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NodeSloError {
    /// A key with `.`, `[` or `]` in it, or an empty one (`path`: its parent).
    #[error("field name {name:?}{} is not a NodeSLO field name (nest the keys instead of joining them with '.')", at(path))]
    JoinedName { name: String, path: String },
    /// A field nobody defines, and the closest sibling when one is near.
    #[error("unknown field {path} ({})", hint(suggestion, known))]
    Unknown {
        path: String,
        /// The sibling it is most likely a misspelling of (whole path).
        suggestion: Option<String>,
        /// The names defined beside it.
        known: Vec<String>,
    },
}

fn at(path: &str) -> String {
    if path.is_empty() {
        String::new()
    } else {
        format!(" in {path}")
    }
}

fn hint(suggestion: &Option<String>, known: &[String]) -> String {
    match suggestion {
        Some(s) => format!("did you mean {s}?"),
        None => format!(
            "neither qoslet nor Koordinator's NodeSLO has it; known here: {}",
            known.join(", ")
        ),
    }
}

impl NodeSloError {
    /// The field's path.
    pub fn path(&self) -> &str {
        match self {
            NodeSloError::JoinedName { path, .. } | NodeSloError::Unknown { path, .. } => path,
        }
    }

    /// The same error at the `i`th item of the list `list` (walked as `list[]`).
    fn at_item(mut self, list: &str, i: usize) -> Self {
        let (from, to) = (format!("{list}[]"), format!("{list}[{i}]"));
        match &mut self {
            NodeSloError::JoinedName { path, .. } => *path = path.replacen(&from, &to, 1),
            NodeSloError::Unknown {
                path, suggestion, ..
            } => {
                *path = path.replacen(&from, &to, 1);
                if let Some(s) = suggestion {
                    *s = s.replacen(&from, &to, 1);
                }
            }
        }
        self
    }
}

/// Splits a NodeSLO spec (or a whole NodeSLO object: its `spec` is used).
/// `Err` names a field neither qoslet nor Koordinator defines.
pub fn split(value: &Value) -> Result<Split, NodeSloError> {
    let spec = match value {
        Value::Object(m) if m.get("kind").and_then(Value::as_str) == Some("NodeSLO") => {
            m.get("spec").cloned().unwrap_or(Value::Object(Map::new()))
        }
        Value::Null => Value::Object(Map::new()),
        v => v.clone(),
    };
    let fields = fields();
    let mut not_implemented = Vec::new();
    let spec = walk(&spec, "", &fields, &mut not_implemented)?;
    Ok(Split {
        spec,
        not_implemented,
    })
}

fn walk(
    v: &Value,
    path: &str,
    fields: &[(String, Support)],
    out: &mut Vec<String>,
) -> Result<Value, NodeSloError> {
    let m = match v {
        Value::Object(m) => m,
        // an empty YAML section (`resourceQOSStrategy:`) is an unset one, as in Go
        Value::Null if !path.is_empty() => return Ok(Value::Object(Map::new())),
        _ => return Ok(v.clone()), // a value's type is checked by the parser
    };
    let mut kept = Map::new();
    for (k, child) in m {
        if k.contains(['.', '[', ']']) || k.is_empty() {
            return Err(NodeSloError::JoinedName {
                name: k.clone(),
                path: path.to_string(),
            });
        }
        let p = if path.is_empty() {
            k.clone()
        } else {
            format!("{path}.{k}")
        };
        let leaf = fields.iter().find(|(f, _)| *f == p).map(|(_, s)| *s);
        let object = fields.iter().any(|(f, _)| f.starts_with(&format!("{p}.")));
        let list = fields
            .iter()
            .any(|(f, _)| f.starts_with(&format!("{p}[].")));
        match leaf {
            Some(Support::NotImplemented) => {
                out.push(format!("{p} = {}", short(child)));
                continue;
            }
            Some(Support::Parsed) => {
                out.push(format!(
                    "{p} = {} (read and validated; no effect yet)",
                    short(child)
                ));
                kept.insert(k.clone(), child.clone());
                continue;
            }
            Some(Support::Implemented) => {
                kept.insert(k.clone(), child.clone());
                continue;
            }
            None => {}
        }
        if object {
            kept.insert(k.clone(), walk(child, &p, fields, out)?);
        } else if list {
            let items = match child {
                Value::Array(a) => a
                    .iter()
                    .enumerate()
                    .map(|(i, item)| {
                        walk(item, &format!("{p}[]"), fields, out).map_err(|e| e.at_item(&p, i))
                    })
                    .collect::<Result<Vec<_>, _>>()?,
                other => {
                    // not a list: the parser reports the type
                    kept.insert(k.clone(), other.clone());
                    continue;
                }
            };
            kept.insert(k.clone(), Value::Array(items));
        } else {
            return Err(unknown(&p, path, fields));
        }
    }
    Ok(Value::Object(kept))
}

/// The error for a field nobody defines, with the closest sibling name.
fn unknown(p: &str, parent: &str, fields: &[(String, Support)]) -> NodeSloError {
    let name = p.rsplit('.').next().unwrap_or(p);
    let prefix = if parent.is_empty() {
        String::new()
    } else {
        format!("{parent}.")
    };
    let siblings: std::collections::BTreeSet<&str> = fields
        .iter()
        .filter_map(|(f, _)| f.strip_prefix(&prefix))
        .map(|rest| rest.split(['.', '[']).next().unwrap_or(rest))
        .collect();
    let best = siblings
        .iter()
        .map(|s| (distance(&s.to_lowercase(), &name.to_lowercase()), *s))
        .min();
    NodeSloError::Unknown {
        path: p.to_string(),
        suggestion: best
            .filter(|(d, _)| *d <= 3)
            .map(|(_, s)| format!("{prefix}{s}")),
        known: siblings.into_iter().map(str::to_string).collect(),
    }
}

fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = (prev + usize::from(ca != *cb)).min(row[j] + 1).min(cur + 1);
            prev = cur;
        }
    }
    row[b.len()]
}

fn short(v: &Value) -> String {
    let s = v.to_string();
    if s.len() > 80 {
        format!("{}…", s.chars().take(80).collect::<String>())
    } else {
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn implemented_kept_koordinators_set_aside_typos_refused() {
        let v: Value = serde_json::json!({
            "resourceQOSStrategy": {
                "policies": {"cpuPolicy": "groupIdentity", "netQOSPolicy": "tc"},
                "beClass": {
                    "cpuQOS": {"enable": true, "groupIdentity": -1, "coreExpeller": false},
                    "memoryQOS": {"enable": false, "priority": 0, "pageCacheLimitPercent": 50},
                    "blkioQOS": {"enable": false, "blocks": [{"name": "/dev/vda", "type": "device", "ioCfg": {"readBPS": 1, "ioWeightPercent": 50}}]},
                    "networkQOS": {"enable": false, "ingressLimit": "100M"}
                },
                "cgroupRoot": {"blkioQOS": {"enable": false}}
            },
            "resourceUsedThresholdWithBE": {"enable": true, "cpuEvictPolicy": "evictByRealLimit", "memoryEvictThresholdPercent": 70},
            "systemStrategy": {"minFreeKbytesFactor": 100},
            "extensions": {"anything": {"at": "all"}}
        });
        let s = split(&v).unwrap();
        let be = &s.spec["resourceQOSStrategy"]["beClass"];
        assert_eq!(
            be["cpuQOS"],
            serde_json::json!({"enable": true, "groupIdentity": -1})
        );
        assert_eq!(
            be["blkioQOS"]["blocks"][0]["ioCfg"],
            serde_json::json!({"readBPS": 1})
        );
        assert!(be.get("networkQOS").is_none());
        assert!(s.spec.get("systemStrategy").is_none());
        assert_eq!(
            s.spec["resourceUsedThresholdWithBE"]["memoryEvictThresholdPercent"], 70,
            "implemented (BE memory eviction): kept for the parser"
        );
        let listed = s.not_implemented.join("\n");
        assert!(
            !listed.contains("memoryEvictThresholdPercent") && !listed.contains("cpuEvictPolicy"),
            "implemented now, not listed: {listed}"
        );
        for f in [
            "resourceQOSStrategy.policies.netQOSPolicy = \"tc\"",
            "resourceQOSStrategy.beClass.cpuQOS.coreExpeller = false",
            "resourceQOSStrategy.beClass.memoryQOS.pageCacheLimitPercent = 50",
            "resourceQOSStrategy.beClass.blkioQOS.blocks[].ioCfg.ioWeightPercent = 50",
            "resourceQOSStrategy.beClass.networkQOS",
            "resourceQOSStrategy.cgroupRoot",
            "systemStrategy",
            "extensions",
        ] {
            assert!(listed.contains(f), "{f} missing from:\n{listed}");
        }
        // typos in what qoslet implements are errors naming the path and the right name
        for (bad, want) in [
            (
                serde_json::json!({"resourceQOSStrategy": {"beClass": {"cpuQos": {}}}}),
                "resourceQOSStrategy.beClass.cpuQos (did you mean resourceQOSStrategy.beClass.cpuQOS?)",
            ),
            (
                serde_json::json!({"resourceUsedThresholdWithBE": {"cpuEvictBeSatisfactionLowerPercent": 1}}),
                "did you mean resourceUsedThresholdWithBE.cpuEvictBESatisfactionLowerPercent?",
            ),
            (
                serde_json::json!({"resourceQOSStrategy": {"beClass": {"blkioQOS": {"blocks": [{"name": "x"}, {"nmae": "y"}]}}}}),
                "blkioQOS.blocks[1].nmae",
            ),
            (serde_json::json!({"bogus": 1}), "unknown field bogus"),
            (
                serde_json::json!({"cpuBurstStrategy.policy": "auto"}),
                "nest the keys",
            ),
        ] {
            let e = split(&bad).unwrap_err().to_string();
            assert!(e.contains(want), "{e}");
        }
        // the error is typed: the path of the bad field, and the suggestion
        let bad = serde_json::json!({"resourceQOSStrategy": {"beClass": {"blkioQOS": {"blocks": [{"name": "x"}, {"nmae": "y"}]}}}});
        match split(&bad).unwrap_err() {
            NodeSloError::Unknown {
                path, suggestion, ..
            } => {
                assert_eq!(path, "resourceQOSStrategy.beClass.blkioQOS.blocks[1].nmae");
                assert_eq!(
                    suggestion.as_deref(),
                    Some("resourceQOSStrategy.beClass.blkioQOS.blocks[1].name")
                );
            }
            other => panic!("{other:?}"),
        }
    }

    /// The compatibility table (docs/koordinator.md) lists every field the parser knows.
    #[test]
    fn the_compatibility_doc_lists_every_field() {
        let readme = include_str!("../../docs/koordinator.md");
        for (f, support) in fields() {
            let mut g = f.clone();
            for c in CLASSES {
                g = g.replace(&format!(".{c}."), ".<class>.");
            }
            let key = format!("| `{g}` |");
            let Some(at) = readme.find(&key) else {
                panic!("docs/koordinator.md lacks {g}");
            };
            // and says what the parser does with it
            let row = readme[at + key.len()..].lines().next().unwrap_or("");
            let said = if row.contains("not implemented") {
                N
            } else if row.contains("no effect yet") {
                Support::Parsed
            } else {
                I
            };
            assert_eq!(said, support, "docs/koordinator.md row of {g}:{row}");
        }
    }

    /// Review of issue 14: a non-list `blocks` keeps its siblings (the parser
    /// then names the type error); an empty YAML section is an unset one.
    #[test]
    fn odd_shapes_are_left_to_the_parser() {
        let v = serde_json::json!({"resourceQOSStrategy": {"beClass": {"blkioQOS": {"enable": true, "blocks": {}}}}, "cpuBurstStrategy": null});
        let s = split(&v).unwrap();
        assert_eq!(
            s.spec["resourceQOSStrategy"]["beClass"]["blkioQOS"],
            serde_json::json!({"enable": true, "blocks": {}})
        );
        assert_eq!(s.spec["cpuBurstStrategy"], serde_json::json!({}));
    }

    #[test]
    fn a_whole_nodeslo_object_uses_its_spec() {
        let v = serde_json::json!({"apiVersion": "slo.koordinator.sh/v1alpha1", "kind": "NodeSLO",
            "metadata": {"name": "n1"}, "spec": {"cpuBurstStrategy": {"policy": "auto"}}});
        let s = split(&v).unwrap();
        assert_eq!(
            s.spec,
            serde_json::json!({"cpuBurstStrategy": {"policy": "auto"}})
        );
    }
}
