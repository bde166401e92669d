//! Batch resources: BE pods request `kubernetes.io/batch-cpu` (milli-cores) and
//! `kubernetes.io/batch-memory` (bytes) instead of cpu/memory; Koordinator's
//! webhook copies them into the pod annotation
//! `node.koordinator.sh/extended-resource-spec`:
//! `{"containers": {"<name>": {"requests": {...}, "limits": {...}}}}`.
//! Here they become what the runtime must apply: CFS shares and quota and a
//! memory limit.

use std::collections::BTreeMap;

use serde::Deserialize;

pub const ANNOTATION_EXTENDED_RESOURCE_SPEC: &str = "node.koordinator.sh/extended-resource-spec";
pub const BATCH_CPU: &str = "kubernetes.io/batch-cpu";
pub const BATCH_MEMORY: &str = "kubernetes.io/batch-memory";
/// An extended-resource-spec annotation longer than this is refused unread
/// (one entry per container is a few hundred bytes).
pub const MAX_ANNOTATION_BYTES: usize = 64 << 10;

/// Why an annotation was not used.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BatchError {
    #[error("{ANNOTATION_EXTENDED_RESOURCE_SPEC} is not valid JSON of the expected shape: {0}")]
    Malformed(String),
    #[error("{ANNOTATION_EXTENDED_RESOURCE_SPEC} is {0} bytes, over the {MAX_ANNOTATION_BYTES}-byte cap; not read")]
    TooLarge(usize),
    #[error("{resource} {value:?} of container {container} is not a valid quantity")]
    BadQuantity {
        container: String,
        resource: String,
        value: String,
    },
}

#[derive(Debug, Deserialize)]
struct Spec {
    #[serde(default)]
    containers: BTreeMap<String, Requirements>,
}

#[derive(Debug, Default, Deserialize)]
struct Requirements {
    #[serde(default)]
    requests: BTreeMap<String, serde_json::Value>,
    #[serde(default)]
    limits: BTreeMap<String, serde_json::Value>,
}

/// One container's batch resources.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Batch {
    pub cpu_request_milli: Option<u64>,
    pub cpu_limit_milli: Option<u64>,
    pub memory_request: Option<u64>,
    pub memory_limit: Option<u64>,
}

/// What the runtime should apply for a container's batch resources.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BatchResources {
    /// cpu.shares (from the batch-cpu request; kubelet's formula).
    pub cpu_shares: Option<u64>,
    /// CFS quota in µs per `cpu_period` (from the batch-cpu limit).
    pub cpu_quota: Option<u64>,
    pub cpu_period: u64,
    /// memory limit in bytes (from the batch-memory limit).
    pub memory_limit: Option<u64>,
}

/// Parses the annotation into per-container batch resources.
pub fn parse_spec(annotation: &str) -> Result<BTreeMap<String, Batch>, BatchError> {
    if annotation.len() > MAX_ANNOTATION_BYTES {
        return Err(BatchError::TooLarge(annotation.len()));
    }
    let v: serde_json::Value =
        serde_json::from_str(annotation).map_err(|e| BatchError::Malformed(e.to_string()))?;
    if !v.is_object() {
        return Err(BatchError::Malformed("not a JSON object".into()));
    }
    let spec: Spec = serde_json::from_value(v).map_err(|e| BatchError::Malformed(e.to_string()))?;
    let mut out = BTreeMap::new();
    for (name, r) in spec.containers {
        let q = |m: &BTreeMap<String, serde_json::Value>,
                 res: &str,
                 cpu: bool|
         -> Result<Option<u64>, BatchError> {
            let Some(v) = m.get(res) else { return Ok(None) };
            let s = match v {
                serde_json::Value::String(s) => s.clone(),
                serde_json::Value::Number(n) => n.to_string(),
                other => other.to_string(),
            };
            let parsed = if cpu {
                parse_milli(&s)
            } else {
                parse_bytes(&s)
            };
            parsed.map(Some).ok_or_else(|| BatchError::BadQuantity {
                container: name.clone(),
                resource: res.into(),
                value: s,
            })
        };
        out.insert(
            name.clone(),
            Batch {
                cpu_request_milli: q(&r.requests, BATCH_CPU, true)?,
                cpu_limit_milli: q(&r.limits, BATCH_CPU, true)?,
                memory_request: q(&r.requests, BATCH_MEMORY, false)?,
                memory_limit: q(&r.limits, BATCH_MEMORY, false)?,
            },
        );
    }
    Ok(out)
}

/// batch-cpu is counted in milli-cores as a plain integer ("1000" = 1 core);
/// a Kubernetes CPU quantity ("500m", "2") is accepted too. Absurd values are refused.
pub fn parse_milli(s: &str) -> Option<u64> {
    let s = s.trim();
    let v = if let Some(m) = s.strip_suffix('m') {
        m.parse::<u64>().ok()?
    } else {
        s.parse::<u64>().ok()?
    };
    (v <= 1_000_000_000).then_some(v)
}

/// A Kubernetes memory quantity in bytes ("1Gi", "512Mi", "1G", "1048576"). Absurd values are refused.
pub fn parse_bytes(s: &str) -> Option<u64> {
    let s = s.trim();
    let units: [(&str, u64); 12] = [
        ("Ki", 1 << 10),
        ("Mi", 1 << 20),
        ("Gi", 1 << 30),
        ("Ti", 1 << 40),
        ("Pi", 1 << 50),
        ("Ei", 1 << 60),
        ("k", 1_000),
        ("M", 1_000_000),
        ("G", 1_000_000_000),
        ("T", 1_000_000_000_000),
        ("P", 1_000_000_000_000_000),
        ("E", 1_000_000_000_000_000_000),
    ];
    for (suffix, mul) in units {
        if let Some(n) = s.strip_suffix(suffix) {
            return n.parse::<u64>().ok()?.checked_mul(mul);
        }
    }
    s.parse::<u64>().ok()
}

/// kubelet's shares formula: milli * 1024 / 1000, at least 2, at most 262144.
pub fn milli_to_shares(milli: u64) -> u64 {
    (milli.saturating_mul(1024) / 1000).clamp(2, 262_144)
}

/// CFS quota for `milli` cores per `period` µs, at least 1000 µs (kubelet's minimum).
pub fn milli_to_quota(milli: u64, period: u64) -> u64 {
    (milli.saturating_mul(period) / 1000).max(1000)
}

/// Upper bounds for batch resources: the node's capacity and, for one
/// container, the limits kubelet set (a pod author's annotation may narrow
/// what kubelet gave, never widen it). `None`: no bound.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Caps {
    pub milli_cpu: Option<u64>,
    pub memory: Option<u64>,
}

impl Batch {
    /// Within `caps`, and requests no larger than limits; what was cut is
    /// returned as warnings.
    pub fn bounded(&self, caps: &Caps) -> (Batch, Vec<String>) {
        let mut b = *self;
        let mut warnings = vec![];
        let mut cap = |what: &str, v: &mut Option<u64>, max: Option<u64>| {
            if let (Some(x), Some(m)) = (*v, max) {
                if x > m {
                    warnings.push(format!("{what} {x} above the bound {m}; capped"));
                    *v = Some(m);
                }
            }
        };
        cap(
            "batch-cpu limit (milli)",
            &mut b.cpu_limit_milli,
            caps.milli_cpu,
        );
        cap(
            "batch-cpu request (milli)",
            &mut b.cpu_request_milli,
            caps.milli_cpu,
        );
        cap("batch-memory limit", &mut b.memory_limit, caps.memory);
        cap("batch-memory request", &mut b.memory_request, caps.memory);
        cap(
            "batch-cpu request (milli)",
            &mut b.cpu_request_milli,
            b.cpu_limit_milli,
        );
        cap(
            "batch-memory request",
            &mut b.memory_request,
            b.memory_limit,
        );
        (b, warnings)
    }

    /// What the runtime should apply (CFS period 100 ms, as kubelet's default).
    pub fn resources(&self) -> BatchResources {
        let period = 100_000;
        BatchResources {
            cpu_shares: self.cpu_request_milli.map(milli_to_shares),
            cpu_quota: self.cpu_limit_milli.map(|m| milli_to_quota(m, period)),
            cpu_period: period,
            memory_limit: self.memory_limit,
        }
    }
}

/// A pod's batch resources: requests add up (a container without one adds 0);
/// a limit exists only when every container has one (one unlimited container
/// leaves the pod unlimited).
pub fn pod_total(spec: &BTreeMap<String, Batch>) -> Batch {
    let req = |f: fn(&Batch) -> Option<u64>| {
        spec.values()
            .filter_map(f)
            .fold(None, |acc: Option<u64>, v| {
                Some(acc.unwrap_or(0).saturating_add(v))
            })
    };
    let lim = |f: fn(&Batch) -> Option<u64>| {
        if spec.is_empty() {
            return None;
        }
        spec.values()
            .map(f)
            .try_fold(0u64, |acc, v| v.map(|v| acc.saturating_add(v)))
    };
    Batch {
        cpu_request_milli: req(|b| b.cpu_request_milli),
        cpu_limit_milli: lim(|b| b.cpu_limit_milli),
        memory_request: req(|b| b.memory_request),
        memory_limit: lim(|b| b.memory_limit),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_totals() {
        let b = |cr, cl, mr, ml| Batch {
            cpu_request_milli: cr,
            cpu_limit_milli: cl,
            memory_request: mr,
            memory_limit: ml,
        };
        let spec: BTreeMap<String, Batch> = [
            (
                "a".to_string(),
                b(Some(500), Some(1000), Some(1 << 20), Some(2 << 20)),
            ),
            ("b".to_string(), b(Some(250), Some(500), None, None)),
        ]
        .into();
        let t = pod_total(&spec);
        assert_eq!(t.cpu_request_milli, Some(750));
        assert_eq!(t.cpu_limit_milli, Some(1500));
        assert_eq!(t.memory_request, Some(1 << 20));
        assert_eq!(
            t.memory_limit, None,
            "one container without a limit: pod unlimited"
        );
        assert_eq!(pod_total(&BTreeMap::new()), Batch::default());
    }

    #[test]
    fn koordinator_annotation_to_runtime_settings() {
        let a = r#"{"containers":{"app":{"requests":{"kubernetes.io/batch-cpu":"1000","kubernetes.io/batch-memory":"1Gi"},
                    "limits":{"kubernetes.io/batch-cpu":2000,"kubernetes.io/batch-memory":"2Gi"}},
                    "side":{"requests":{"kubernetes.io/batch-cpu":"500m"}}}}"#;
        let spec = parse_spec(a).unwrap();
        let app = spec["app"].resources();
        assert_eq!(
            app,
            BatchResources {
                cpu_shares: Some(1024),
                cpu_quota: Some(200_000),
                cpu_period: 100_000,
                memory_limit: Some(2 << 30)
            }
        );
        let side = spec["side"].resources();
        assert_eq!(
            (side.cpu_shares, side.cpu_quota, side.memory_limit),
            (Some(512), None, None)
        );
    }

    #[test]
    fn bad_annotations_are_errors_not_panics() {
        for bad in ["", "{", "[]", r#"{"containers":7}"#] {
            assert!(
                matches!(parse_spec(bad), Err(BatchError::Malformed(_))),
                "{bad:?}"
            );
        }
        let e =
            parse_spec(r#"{"containers":{"a":{"limits":{"kubernetes.io/batch-memory":"lots"}}}}"#)
                .unwrap_err();
        assert!(matches!(e, BatchError::BadQuantity { .. }), "{e}");
        let e = parse_spec(r#"{"containers":{"a":{"limits":{"kubernetes.io/batch-cpu":"-5"}}}}"#)
            .unwrap_err();
        assert!(e.to_string().contains("-5"), "{e}");
        assert!(
            parse_spec(
                r#"{"containers":{"a":{"limits":{"kubernetes.io/batch-memory":"99999999999Ei"}}}}"#
            )
            .is_err(),
            "overflow"
        );
        assert_eq!(parse_spec("{}").unwrap().len(), 0);
    }

    #[test]
    fn bounded_by_capacity_kubelet_and_limits() {
        let b = Batch {
            cpu_request_milli: Some(8_000),
            cpu_limit_milli: Some(4_000),
            memory_request: Some(4 << 30),
            memory_limit: Some(1 << 40),
        };
        let (x, w) = b.bounded(&Caps {
            milli_cpu: Some(2_000),
            memory: Some(2 << 30),
        });
        assert_eq!(
            x,
            Batch {
                cpu_request_milli: Some(2_000),
                cpu_limit_milli: Some(2_000),
                memory_request: Some(2 << 30),
                memory_limit: Some(2 << 30),
            }
        );
        assert_eq!(w.len(), 4, "{w:?}");
        // no caps: only request <= limit
        let (x, w) = b.bounded(&Caps::default());
        assert_eq!(x.cpu_request_milli, Some(4_000));
        assert_eq!(x.memory_limit, Some(1 << 40));
        assert_eq!(w.len(), 1);
        // a huge annotation is refused before it is parsed
        let big = format!(
            r#"{{"containers":{{}},"x":"{}"}}"#,
            "a".repeat(MAX_ANNOTATION_BYTES)
        );
        assert!(matches!(parse_spec(&big), Err(BatchError::TooLarge(_))));
    }

    #[test]
    fn quantities_and_formulas() {
        assert_eq!(parse_bytes("512Mi"), Some(512 << 20));
        assert_eq!(parse_bytes("1G"), Some(1_000_000_000));
        assert_eq!(parse_bytes("1048576"), Some(1 << 20));
        assert_eq!(parse_bytes("1.5Gi"), None);
        assert_eq!(parse_milli("250m"), Some(250));
        assert_eq!(parse_milli("99999999999999"), None, "absurd");
        assert_eq!(milli_to_shares(0), 2);
        assert_eq!(milli_to_shares(1), 2);
        assert_eq!(milli_to_shares(u64::MAX), 262_144);
        assert_eq!(milli_to_quota(1, 100_000), 1000);
        assert_eq!(milli_to_quota(1500, 100_000), 150_000);
    }
}
