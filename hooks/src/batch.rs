//! Batch resources: BE pods request `kubernetes.io/batch-cpu` (milli-cores) and
//! `kubernetes.io/batch-memory` (bytes) instead of cpu/memory; Koordinator's
//! webhook copies them into the pod annotation
//! `node.koordinator.sh/extended-resource-spec`:
//! `{"containers": {"<name>": {"requests": {...}, "limits": {...}}}}`.
//! Here they become what the runtime must apply: CFS shares and quota and a
//! memory limit.

use std::collections::BTreeMap;

use crate::warning::Warning;
use serde::Deserialize;

pub const ANNOTATION_EXTENDED_RESOURCE_SPEC: &str = "node.koordinator.sh/extended-resource-spec";
pub const BATCH_CPU: &str = "kubernetes.io/batch-cpu";
pub const BATCH_MEMORY: &str = "kubernetes.io/batch-memory";
/// An extended-resource-spec annotation longer than this is refused unread
/// (one entry per container is a few hundred bytes).
pub const MAX_ANNOTATION_BYTES: usize = 64 << 10;

/// Where a pod's batch resources were read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Source {
    /// Koordinator's `extended-resource-spec` annotation (its webhook's, or
    /// written by hand).
    Annotation,
    /// The pod spec's `kubernetes.io/batch-*` requests and limits, as the
    /// cluster view has them: what Koordinator's webhook would have written
    /// into the annotation, read without the webhook.
    PodSpec,
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Source::Annotation => "extended-resource-spec annotation",
            Source::PodSpec => "pod spec",
        })
    }
}

/// What the cluster view says of a pod's batch resources.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpecBatch<'a> {
    /// No cluster, or a pod it does not know (yet).
    Unknown,
    /// The pod spec asks for none.
    None,
    /// The pod spec's, in the annotation's JSON shape ([`spec_json`]).
    Some(&'a str),
}

impl<'a> SpecBatch<'a> {
    /// From the cluster view: `None`, a pod it does not know; `Some(None)`,
    /// one whose spec asks for no batch resources.
    pub fn of(known: Option<Option<&'a str>>) -> Self {
        match known {
            None => SpecBatch::Unknown,
            Some(None) => SpecBatch::None,
            Some(Some(s)) => SpecBatch::Some(s),
        }
    }
}

/// A pod's batch resources in the annotation's JSON shape, and where they
/// came from. The spec wins, as with Koordinator, whose webhook rewrites the
/// annotation from the spec whenever they differ; without a spec (no
/// cluster view of the pod, or a spec that asks for none) the annotation is
/// read (the caller decides whether the latter may be used: the webhook
/// would have cleared it).
pub fn source<'a>(
    annotations: &'a BTreeMap<String, String>,
    spec: SpecBatch<'a>,
) -> Option<(&'a str, Source)> {
    match spec {
        SpecBatch::Some(s) => Some((s, Source::PodSpec)),
        SpecBatch::None | SpecBatch::Unknown => annotations
            .get(ANNOTATION_EXTENDED_RESOURCE_SPEC)
            .map(|a| (a.as_str(), Source::Annotation)),
    }
}

/// The annotation Koordinator's webhook would write for a pod whose
/// containers (`(name, requests, limits)`) ask for batch resources: only
/// `kubernetes.io/batch-cpu` and `batch-memory` of the regular containers
/// (the webhook counts no init container), the quantities as written.
/// `None`: no container names one.
pub fn spec_json<'a>(
    containers: impl IntoIterator<Item = (&'a str, Option<&'a Quantities>, Option<&'a Quantities>)>,
) -> Option<String> {
    let mut out = serde_json::Map::new();
    for (name, requests, limits) in containers {
        let pick = |m: Option<&Quantities>| -> serde_json::Map<String, serde_json::Value> {
            [BATCH_CPU, BATCH_MEMORY]
                .into_iter()
                .filter_map(|r| Some((r.to_string(), m?.get(r)?.clone().into())))
                .collect()
        };
        let (req, lim) = (pick(requests), pick(limits));
        if req.is_empty() && lim.is_empty() {
            continue;
        }
        let mut c = serde_json::Map::new();
        if !req.is_empty() {
            c.insert("requests".into(), req.into());
        }
        if !lim.is_empty() {
            c.insert("limits".into(), lim.into());
        }
        out.insert(name.to_string(), c.into());
    }
    (!out.is_empty()).then(|| serde_json::json!({ "containers": out }).to_string())
}

/// A resource list as a pod spec has it: name -> quantity text.
pub type Quantities = BTreeMap<String, String>;

/// Why an annotation was not used.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq, Hash)]
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

/// The annotation's per-container batch resources, and the quantities that
/// were left out because they are not valid (each one a warning; the rest of
/// the annotation still applies).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct ParsedSpec {
    pub containers: BTreeMap<String, Batch>,
    pub bad: Vec<BatchError>,
}

/// Parses the annotation into per-container batch resources. Quantities are
/// read as koordlet reads them (`Quantity.Value()`): batch-cpu in milli-cores
/// (`1k` = 1000 = one core; `500m` is half a milli-core, rounded up to 1),
/// batch-memory in bytes (`128Mi`, `1G`, `1e9`). A malformed document is an
/// error; one malformed or negative quantity only drops that value.
/// A pod author's text as a warning keeps it: at most 64 characters (serde's
/// messages quote the offending value whole).
fn cut(s: &str) -> String {
    if s.chars().count() <= 64 {
        s.to_string()
    } else {
        s.chars().take(63).chain(std::iter::once('…')).collect()
    }
}

pub fn parse_spec(annotation: &str) -> Result<ParsedSpec, BatchError> {
    if annotation.len() > MAX_ANNOTATION_BYTES {
        return Err(BatchError::TooLarge(annotation.len()));
    }
    let v: serde_json::Value =
        serde_json::from_str(annotation).map_err(|e| BatchError::Malformed(cut(&e.to_string())))?;
    if !v.is_object() {
        return Err(BatchError::Malformed("not a JSON object".into()));
    }
    let spec: Spec =
        serde_json::from_value(v).map_err(|e| BatchError::Malformed(cut(&e.to_string())))?;
    let mut out = ParsedSpec::default();
    for (name, r) in spec.containers {
        let mut q = |m: &BTreeMap<String, serde_json::Value>, res: &str| -> Option<u64> {
            let v = m.get(res)?;
            let s = match v {
                serde_json::Value::String(s) => s.clone(),
                serde_json::Value::Number(n) => n.to_string(),
                other => other.to_string(),
            };
            match crate::quantity::parse_value(&s) {
                // koordlet treats zero as unset (MilliCPUToQuota gives -1: no limit)
                Ok(0) => None,
                Ok(v) if v <= MAX_AMOUNT => Some(v),
                _ => {
                    out.bad.push(BatchError::BadQuantity {
                        container: cut(&name),
                        resource: res.into(),
                        value: s.chars().take(64).collect(),
                    });
                    None
                }
            }
        };
        let b = Batch {
            cpu_request_milli: q(&r.requests, BATCH_CPU),
            cpu_limit_milli: q(&r.limits, BATCH_CPU),
            memory_request: q(&r.requests, BATCH_MEMORY),
            memory_limit: q(&r.limits, BATCH_MEMORY),
        };
        out.containers.insert(name, b);
    }
    Ok(out)
}

/// No resource amount is above this (8 EiB of memory, 2^63 milli-cores).
const MAX_AMOUNT: u64 = i64::MAX as u64;

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
    /// `pod`: the bounds are the pod's own cgroup's (the warnings say so).
    pub fn bounded(&self, caps: &Caps, pod: bool) -> (Batch, Vec<Warning>) {
        use crate::warning::BatchField::*;
        let mut b = *self;
        let mut warnings = vec![];
        let mut cap = |field, v: &mut Option<u64>, max: Option<u64>| {
            if let (Some(x), Some(m)) = (*v, max) {
                if x > m {
                    warnings.push(Warning::BatchCapped {
                        pod,
                        field,
                        value: x,
                        bound: m,
                    });
                    *v = Some(m);
                }
            }
        };
        cap(CpuLimit, &mut b.cpu_limit_milli, caps.milli_cpu);
        cap(CpuRequest, &mut b.cpu_request_milli, caps.milli_cpu);
        cap(MemoryLimit, &mut b.memory_limit, caps.memory);
        cap(MemoryRequest, &mut b.memory_request, caps.memory);
        cap(CpuRequest, &mut b.cpu_request_milli, b.cpu_limit_milli);
        cap(MemoryRequest, &mut b.memory_request, b.memory_limit);
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
        let spec = parse_spec(a).unwrap().containers;
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
        // koordlet reads "500m" with Quantity.Value(): half a milli-core, rounded up to 1
        let side = spec["side"].resources();
        assert_eq!(
            (side.cpu_shares, side.cpu_quota, side.memory_limit),
            (Some(2), None, None)
        );
    }

    /// Issue 14: the webhook re-marshals quantities, so whole cores arrive in
    /// canonical form (`1k`); koordlet reads every quantity with
    /// `Quantity.Value()` (koordinator pkg/util/extended_resource.go,
    /// GetBatchMilliCPUFromResourceList / GetBatchMemoryFromResourceList).
    #[test]
    fn canonical_quantities_as_koordlet_reads_them() {
        // (batch-cpu, batch-memory, milli-cores, bytes)
        let table: &[(&str, &str, u64, u64)] = &[
            ("1k", "128Mi", 1000, 128 << 20),
            ("2k", "1Gi", 2000, 1 << 30),
            ("1500", "1G", 1500, 1_000_000_000),
            ("1.5k", "1e9", 1500, 1_000_000_000),
            ("500m", "1.5Gi", 1, 1_610_612_736),
            ("2", "512M", 2, 512_000_000),
        ];
        for (cpu, mem, milli, bytes) in table {
            let a = format!(
                r#"{{"containers":{{"c":{{"limits":{{"kubernetes.io/batch-cpu":"{cpu}","kubernetes.io/batch-memory":"{mem}"}}}}}}}}"#
            );
            let p = parse_spec(&a).unwrap();
            assert!(p.bad.is_empty(), "{cpu} {mem}: {:?}", p.bad);
            let c = p.containers["c"];
            assert_eq!(
                (c.cpu_limit_milli, c.memory_limit),
                (Some(*milli), Some(*bytes)),
                "{cpu} {mem}"
            );
        }
    }

    #[test]
    fn bad_annotations_are_errors_not_panics() {
        for bad in ["", "{", "[]", r#"{"containers":7}"#] {
            assert!(
                matches!(parse_spec(bad), Err(BatchError::Malformed(_))),
                "{bad:?}"
            );
        }
        // one bad quantity drops that value only; the rest of the annotation stands
        let p = parse_spec(r#"{"containers":{"a":{"limits":{"kubernetes.io/batch-memory":"lots","kubernetes.io/batch-cpu":"1k"}}}}"#)
            .unwrap();
        assert!(
            matches!(p.bad[0], BatchError::BadQuantity { .. }),
            "{:?}",
            p.bad
        );
        assert_eq!(p.containers["a"].cpu_limit_milli, Some(1000));
        assert_eq!(p.containers["a"].memory_limit, None);
        let p = parse_spec(r#"{"containers":{"a":{"limits":{"kubernetes.io/batch-cpu":"-5"}}}}"#)
            .unwrap();
        assert!(p.bad[0].to_string().contains("-5"), "{:?}", p.bad);
        let p = parse_spec(
            r#"{"containers":{"a":{"limits":{"kubernetes.io/batch-memory":"99999999999Ei"}}}}"#,
        )
        .unwrap();
        assert_eq!(p.bad.len(), 1, "overflow");
        assert_eq!(parse_spec("{}").unwrap().containers.len(), 0);
        // zero is unset, as koordlet reads it (never a 0-byte memory limit)
        let p = parse_spec(r#"{"containers":{"a":{"limits":{"kubernetes.io/batch-memory":"0","kubernetes.io/batch-cpu":"0m"}}}}"#)
            .unwrap();
        assert!(p.bad.is_empty());
        assert_eq!(p.containers["a"], Batch::default());
    }

    #[test]
    fn bounded_by_capacity_kubelet_and_limits() {
        let b = Batch {
            cpu_request_milli: Some(8_000),
            cpu_limit_milli: Some(4_000),
            memory_request: Some(4 << 30),
            memory_limit: Some(1 << 40),
        };
        let (x, w) = b.bounded(
            &Caps {
                milli_cpu: Some(2_000),
                memory: Some(2 << 30),
            },
            false,
        );
        assert_eq!(
            x,
            Batch {
                cpu_request_milli: Some(2_000),
                cpu_limit_milli: Some(2_000),
                memory_request: Some(2 << 30),
                memory_limit: Some(2 << 30),
            }
        );
        use crate::warning::BatchField::*;
        let capped: Vec<_> = w
            .iter()
            .map(|w| match w {
                Warning::BatchCapped { field, bound, .. } => (*field, *bound),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(
            capped,
            [
                (CpuLimit, 2_000),
                (CpuRequest, 2_000),
                (MemoryLimit, 2 << 30),
                (MemoryRequest, 2 << 30)
            ]
        );
        // no caps: only request <= limit
        let (x, w) = b.bounded(&Caps::default(), true);
        assert_eq!(x.cpu_request_milli, Some(4_000));
        assert_eq!(x.memory_limit, Some(1 << 40));
        assert_eq!(
            w,
            [Warning::BatchCapped {
                pod: true,
                field: CpuRequest,
                value: 8_000,
                bound: 4_000
            }]
        );
        // a huge annotation is refused before it is parsed
        let big = format!(
            r#"{{"containers":{{}},"x":"{}"}}"#,
            "a".repeat(MAX_ANNOTATION_BYTES)
        );
        assert!(matches!(parse_spec(&big), Err(BatchError::TooLarge(_))));
    }

    #[test]
    fn quantities_and_formulas() {
        assert_eq!(milli_to_shares(0), 2);
        assert_eq!(milli_to_shares(1), 2);
        assert_eq!(milli_to_shares(u64::MAX), 262_144);
        assert_eq!(milli_to_quota(1, 100_000), 1000);
        assert_eq!(milli_to_quota(1500, 100_000), 150_000);
    }
}
