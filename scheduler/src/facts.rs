//! The API's objects as the core reads them: a Pod as [`PodFacts`] and its
//! assignment, a Node as [`NodeFacts`], a NodeMetric as [`MetricFacts`].
//! Pod authors write pods: every value read is bounded (quantities parsed,
//! a label or annotation over its limit ignored).

use std::collections::BTreeMap;

use qoslet_colocation::priority::{
    priority_class_with_default, qos_class_with_default, PRIORITY_LABEL, QOS_LABEL,
};
use qoslet_colocation::{Res, BATCH_CPU, BATCH_MEMORY};
use qoslet_hooks::quantity::Quantity;
use qoslet_kube_api::amount::{pod_amount, quantity, Which};
use qoslet_kube_api::crd::ResourceMap;
use qoslet_kube_api::view::NodeMetricView;
use qoslet_kube_api::view::{NodeView, PodView};
use serde_json::Value;

use crate::args::Args;
use crate::estimate::{estimate, PodFacts};
use crate::load::{name_key, Assigned, MetricFacts};
use crate::rank::{NodeFacts, MAX_ANNOTATION_BYTES, USAGE_THRESHOLDS_ANNOTATION};

/// Koordinator's un-amplified allocatable, when its node resource
/// amplification is on: LoadAware reads it in place of `status.allocatable`.
pub const RAW_ALLOCATABLE_ANNOTATION: &str = "node.koordinator.sh/raw-allocatable";

/// The resources the estimator reads.
const RESOURCES: [&str; 6] = [
    "cpu",
    "memory",
    BATCH_CPU,
    BATCH_MEMORY,
    "kubernetes.io/mid-cpu",
    "kubernetes.io/mid-memory",
];

/// An RFC 3339 time in Unix milliseconds.
pub fn unix_ms(t: &str) -> Option<i64> {
    t.parse::<k8s_openapi::jiff::Timestamp>()
        .ok()
        .map(|t| t.as_millisecond())
}

/// A pod as the estimator and the filter see it.
pub fn pod_facts(p: &PodView) -> PodFacts {
    let m = &p.metadata;
    let spec = p.spec.as_ref();
    let label = m
        .labels
        .as_ref()
        .and_then(|l| l.get(PRIORITY_LABEL))
        .filter(|v| v.len() <= 64);
    let qos_label = m
        .labels
        .as_ref()
        .and_then(|l| l.get(QOS_LABEL))
        .filter(|v| v.len() <= 64);
    // `GetPodPriorityClassWithDefault`: the label, spec.priority, then the
    // QoS class (its label, else the Kubernetes QoS class)
    let qos = qos_class_with_default(
        qos_label.map(String::as_str),
        p.status.as_ref().and_then(|s| s.qos_class.as_deref()),
    );
    let priority_class = priority_class_with_default(
        label.map(String::as_str),
        spec.and_then(|s| s.priority),
        qos,
    );
    let amounts = |which: Which| -> BTreeMap<String, i64> {
        RESOURCES
            .iter()
            .map(|r| (r.to_string(), pod_amount(p, which, r)))
            .filter(|(_, v)| *v > 0)
            .collect()
    };
    PodFacts {
        namespace: m.namespace.clone().unwrap_or_default(),
        name: m.name.clone().unwrap_or_default(),
        uid: m.uid.clone().unwrap_or_default(),
        priority_class,
        requests: amounts(Which::Requests),
        limits: amounts(Which::Limits),
        // any owner reference of kind DaemonSet (`isDaemonSetPod`)
        daemonset: m
            .owner_references
            .as_ref()
            .is_some_and(|o| o.iter().any(|r| r.kind == "DaemonSet")),
    }
}

/// When a pod turned `condition` true (Unix ms).
fn condition_time(p: &PodView, condition: &str) -> Option<i64> {
    p.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.kind.as_deref() == Some(condition) && c.status.as_deref() == Some("True"))?
        .last_transition_time
        .as_ref()
        .map(|t| t.0.as_millisecond())
}

/// A bound pod's assignment (`now_ms`: when the cache sees it, its assign
/// time when its `PodScheduled` condition has none), as LoadAware's assign
/// cache records it.
pub fn assigned(p: &PodView, facts: &PodFacts, args: &Args, now_ms: i64) -> Assigned {
    let assigned_at = condition_time(p, "PodScheduled").unwrap_or(now_ms);
    let after_scheduled = args
        .estimated_seconds_after_pod_scheduled
        .filter(|s| *s > 0)
        .map(|s| assigned_at + s * 1000);
    let after_initialized = args
        .estimated_seconds_after_initialized
        .filter(|s| *s > 0)
        .and_then(|s| Some(condition_time(p, "Initialized")? + s * 1000));
    Assigned {
        name: name_key(&facts.namespace, &facts.name),
        prod: facts.is_prod(),
        estimate: estimate(facts, args.estimated_scaling_factors),
        assigned_at,
        // once initialized, the time after initialization wins (init
        // containers may take long: `shouldEstimatePodDeadline`)
        deadline: after_initialized.or(after_scheduled).unwrap_or(0),
    }
}

/// A node as the filter and the score see it: `status.allocatable`, or the
/// raw allocatable annotation's values where it is set and differs.
pub fn node_facts(n: &NodeView) -> NodeFacts {
    let allocatable = n.status.as_ref().and_then(|s| s.allocatable.as_ref());
    let mut res = Res::new(
        quantity(allocatable, "cpu").unwrap_or(0),
        quantity(allocatable, "memory").unwrap_or(0),
    );
    let annotations = n.metadata.annotations.as_ref();
    let annotation = |k: &str| {
        annotations
            .and_then(|a| a.get(k))
            .filter(|v| v.len() <= MAX_ANNOTATION_BYTES)
    };
    if let Some(raw) = annotation(RAW_ALLOCATABLE_ANNOTATION)
        .and_then(|t| serde_json::from_str::<BTreeMap<String, Value>>(t).ok())
    {
        let raw = resources(&raw);
        if raw.cpu > 0 {
            res.cpu = raw.cpu;
        }
        if raw.memory > 0 {
            res.memory = raw.memory;
        }
    }
    NodeFacts {
        allocatable: res,
        thresholds_annotation: annotation(USAGE_THRESHOLDS_ANNOTATION).cloned(),
    }
}

/// CPU (milli-cores) and memory (bytes) of a resource list whose quantities
/// are strings or numbers.
fn resources(r: &BTreeMap<String, Value>) -> Res {
    let q = |name: &str, milli: bool| {
        let q = match r.get(name) {
            Some(Value::String(s)) => Quantity::parse(s.trim()).ok(),
            Some(Value::Number(n)) => Quantity::parse(&n.to_string()).ok(),
            _ => None,
        };
        q.and_then(|q| if milli { q.milli_value() } else { q.value() })
            .unwrap_or(0)
    };
    Res::new(q("cpu", true), q("memory", false))
}

/// A usage; `None` for a missing or empty list (Go skips those: the pod or
/// the window has no usage).
fn usage(m: &Option<ResourceMap>) -> Option<Res> {
    m.as_ref()
        .filter(|m| !m.resources.is_empty())
        .map(|m| resources(&m.resources))
}

/// What a NodeMetric says, as the load needs it.
pub fn metric_facts(m: &NodeMetricView) -> MetricFacts {
    let status = m.status.clone().unwrap_or_default();
    let info = status.node_metric.as_ref();
    let mut aggregated = BTreeMap::new();
    for a in info
        .map(|i| i.aggregated_node_usages.as_slice())
        .unwrap_or_default()
    {
        let Some(secs) = a
            .duration
            .as_deref()
            .and_then(qoslet_colocation::parse_go_duration)
            .map(|d| d.as_secs() as i64)
        else {
            continue;
        };
        for (kind, u) in &a.usage {
            if !u.resources.is_empty() {
                aggregated.insert((kind.clone(), secs), resources(&u.resources));
            }
        }
    }
    MetricFacts {
        update_time: status.update_time.as_deref().and_then(unix_ms),
        report_interval_secs: m
            .spec
            .metric_collect_policy
            .as_ref()
            .and_then(|p| p.report_interval_seconds)
            .unwrap_or(60),
        // Go's `nodeUsage` is a struct, never nil: with `status.nodeMetric`
        // set, a missing one is zero (`None` only without `status.nodeMetric`)
        node_usage: info.map(|i| usage(&i.node_usage).unwrap_or_default()),
        system_usage: info
            .and_then(|i| usage(&i.system_usage))
            .unwrap_or_default(),
        aggregated,
        pods: status
            .pods_metric
            .iter()
            .filter_map(|p| {
                let u = usage(&p.pod_usage)?;
                let prod = p.priority.as_deref() == Some("koord-prod");
                Some((name_key(&p.namespace, &p.name), (u, prod)))
            })
            .collect(),
    }
}
