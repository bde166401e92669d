//! koord-manager's BatchResource calculation (`plugins/batchresource`,
//! `plugins/util`): what a node can lend to batch and free pods, with every
//! term kept so that `qoslet batch-resources` can say why a value is what it
//! is.
//!
//! ```text
//! margin      = capacity × (100 − reclaim percent) / 100     (a reclaim percent over 100: negative)
//! reserved    = max(kubelet's capacity − allocatable, the node's reservation annotation)
//! system      = the NodeMetric's system usage + host applications above batch priority
//! usage            batch = capacity − margin − max(system, reserved) − high-priority used
//! request (memory) batch = capacity − margin − reserved − high-priority requested
//! maxUsageRequest  batch = capacity − margin − max(system, reserved) − Σ max(request, used)
//! then min(capacity × batch*ThresholdPercent / 100, batch) when set, and at least 0
//! ```
//!
//! High priority: Running and Pending pods whose priority class is not
//! `koord-batch` or `koord-free`. A pod without a metric counts its request as
//! used (and nothing in `maxUsageRequest`); an LSE pod counts its CPU request
//! (it does not give CPU back); a pod metric with no pod in the list counts
//! as used unless its own priority is batch or free. Arithmetic as
//! Koordinator's: milli-cores and bytes, products truncated toward zero.

use std::collections::{BTreeMap, HashSet};

use serde::Serialize;

use crate::priority::{
    is_above_batch, is_low_priority, priority_class_with_default, qos_class_with_default,
};
use crate::strategy::Strategy;
use crate::Res;

/// A node annotation longer than this is not read (its JSON is a few
/// hundred bytes).
pub const MAX_JSON: usize = 16 << 10;

/// `node.koordinator.sh/reservation`.
pub const RESERVATION_ANNOTATION: &str = "node.koordinator.sh/reservation";

/// The Node's part: its capacity and allocatable (cpu, memory; `None`: the
/// Node does not list it) and its reservation annotation.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NodeInput {
    pub capacity_cpu: Option<i64>,
    pub capacity_memory: Option<i64>,
    pub allocatable_cpu: Option<i64>,
    pub allocatable_memory: Option<i64>,
    /// The annotation's reservation (`None`: none, or unreadable).
    pub reservation: Option<Res>,
}

impl NodeInput {
    pub fn capacity(&self) -> Res {
        Res::new(
            self.capacity_cpu.unwrap_or(0),
            self.capacity_memory.unwrap_or(0),
        )
    }

    /// `GetNodeReservationFromKubelet`: capacity − allocatable, at least 0
    /// (a resource the Node has no allocatable for is all reserved).
    pub fn kubelet_reserved(&self) -> Res {
        let one = |cap: Option<i64>, alloc: Option<i64>| match (cap, alloc) {
            (Some(c), Some(a)) => c.saturating_sub(a).max(0),
            (Some(c), None) => c.max(0),
            (None, _) => 0,
        };
        Res::new(
            one(self.capacity_cpu, self.allocatable_cpu),
            one(self.capacity_memory, self.allocatable_memory),
        )
    }
}

/// Reads the `node.koordinator.sh/reservation` annotation
/// (`{"resources": {"cpu": .., "memory": ..}, "reservedCPUs": "0-5"}`):
/// `reservedCPUs` sets the CPU to that many cores. `Ok(None)`: no annotation.
pub fn reservation_of(annotations: &BTreeMap<String, String>) -> Result<Option<Res>, String> {
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Raw {
        #[serde(default)]
        resources: Option<BTreeMap<String, serde_json::Value>>,
        #[serde(default, rename = "reservedCPUs")]
        reserved_cpus: Option<String>,
    }
    let Some(s) = annotations
        .get(RESERVATION_ANNOTATION)
        .filter(|s| !s.is_empty())
    else {
        return Ok(None);
    };
    if s.len() > MAX_JSON {
        return Err(format!("{RESERVATION_ANNOTATION}: over {MAX_JSON} bytes"));
    }
    let raw: Raw = serde_json::from_str(s).map_err(|e| format!("{RESERVATION_ANNOTATION}: {e}"))?;
    let q = |name: &str, milli: bool| -> Result<i64, String> {
        let v = match raw.resources.as_ref().and_then(|r| r.get(name)) {
            None | Some(serde_json::Value::Null) => return Ok(0),
            // a quantity is a string or, as Go's Quantity also reads it, a number
            Some(serde_json::Value::String(s)) => s.clone(),
            Some(serde_json::Value::Number(n)) => n.to_string(),
            Some(other) => {
                return Err(format!(
                    "{RESERVATION_ANNOTATION}: resources.{name} {other} is not a quantity"
                ))
            }
        };
        let q = qoslet_hooks::quantity::Quantity::parse(v.trim())
            .map_err(|e| format!("{RESERVATION_ANNOTATION}: resources.{name}: {e}"))?;
        let v = if milli { q.milli_value() } else { q.value() };
        v.ok_or_else(|| format!("{RESERVATION_ANNOTATION}: resources.{name} {v:?} is out of range"))
    };
    let mut r = Res::new(q("cpu", true)?, q("memory", false)?);
    if let Some(cpus) = raw.reserved_cpus.as_deref().filter(|c| !c.is_empty()) {
        let set = qoslet_cgroups::cpulist::parse_cpu_list(cpus).ok_or_else(|| {
            format!("{RESERVATION_ANNOTATION}: reservedCPUs {cpus:?} is not a CPU list")
        })?;
        r.cpu = set.len() as i64 * 1000;
    }
    Ok(Some(r))
}

/// One pod of the node's list.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PodInput {
    pub namespace: String,
    pub name: String,
    /// `status.phase` (only Running and Pending pods count).
    pub phase: Option<String>,
    pub priority_label: Option<String>,
    pub priority: Option<i32>,
    pub qos_label: Option<String>,
    /// `status.qosClass`, or what Kubernetes would make of the spec.
    pub kube_qos: Option<String>,
    /// CPU and memory as kubelet sums them (`PodRequests`).
    pub request: Res,
}

/// One pod metric of the NodeMetric.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PodMetric {
    pub namespace: String,
    pub name: String,
    pub usage: Res,
    /// The metric's own `priority` (`koord-batch`, ...; `None`: none).
    pub priority: Option<String>,
}

/// One host application's metric.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HostAppMetric {
    pub name: String,
    pub usage: Res,
    pub priority: Option<String>,
}

/// The NodeMetric's status: what the node, its system and its pods used.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MetricInput {
    /// `status.updateTime`, Unix seconds (`None`: never reported).
    pub update_time: Option<i64>,
    pub system: Res,
    pub pods: Vec<PodMetric>,
    pub host_apps: Vec<HostAppMetric>,
}

/// How one pod was counted.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PodTerm {
    pub pod: String,
    pub priority: Option<&'static str>,
    pub qos: Option<&'static str>,
    pub request: Res,
    /// Its metric (`None`: none reported).
    pub usage: Option<Res>,
    /// What it added to high-priority used.
    pub used: Res,
    /// What it added to Σ max(request, used).
    pub max_used_request: Res,
    /// `usage`, `request (no metric)`, `LSE: CPU request, memory usage`,
    /// `metric only (not in the pod list)`.
    pub counted_as: &'static str,
}

/// Every term of the calculation.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Terms {
    pub capacity: Res,
    pub cpu_reclaim_percent: i64,
    pub memory_reclaim_percent: i64,
    /// capacity × (100 − reclaim) / 100.
    pub margin: Res,
    pub kubelet_reserved: Res,
    pub annotation_reserved: Option<Res>,
    /// max(kubelet's, the annotation's).
    pub reserved: Res,
    /// The NodeMetric's system usage.
    pub system_usage: Res,
    /// Host applications above batch priority.
    pub host_apps: Res,
    /// system usage + host applications.
    pub system: Res,
    /// max(system, reserved).
    pub system_or_reserved: Res,
    pub high_priority_requested: Res,
    pub high_priority_used: Res,
    pub high_priority_max_used_requested: Res,
    /// Pod metrics of pods not in the list, counted as used.
    pub metrics_without_pod: Res,
    pub cpu_policy: &'static str,
    pub memory_policy: &'static str,
    /// capacity × batch*ThresholdPercent / 100 (`None`: no cap).
    pub cpu_cap: Option<i64>,
    pub memory_cap: Option<i64>,
    /// Before the cap and the clamp at 0.
    pub cpu_by_policy: i64,
    pub memory_by_policy: i64,
    pub pods_high_priority: usize,
    pub pods_low_priority: usize,
    /// Pods neither Running nor Pending.
    pub pods_inactive: usize,
    pub pods_without_metric: usize,
}

/// The result: batch-cpu in milli-cores, batch-memory in bytes.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Batch {
    pub cpu: i64,
    pub memory: i64,
    pub terms: Terms,
    /// The high-priority pods and metrics, largest CPU used first.
    pub pods: Vec<PodTerm>,
}

/// `int64(float64(v) * ratio)`: Koordinator's MultiplyQuant.
fn times(v: i64, ratio: f64) -> i64 {
    (v as f64 * ratio) as i64
}

/// The calculation for one node (no degrade check: see [`crate::sync`]).
pub fn calculate(s: &Strategy, node: &NodeInput, pods: &[PodInput], metric: &MetricInput) -> Batch {
    let by_key: BTreeMap<(&str, &str), &PodMetric> = metric
        .pods
        .iter()
        .map(|m| ((m.namespace.as_str(), m.name.as_str()), m))
        .collect();
    let mut seen: HashSet<(&str, &str)> = HashSet::new();
    let (mut hp_req, mut hp_used, mut hp_max) = (Res::default(), Res::default(), Res::default());
    let (mut n_hp, mut n_low, mut n_inactive, mut n_no_metric) = (0, 0, 0, 0);
    let mut terms = Vec::new();
    for p in pods {
        if !matches!(p.phase.as_deref(), Some("Running" | "Pending")) {
            n_inactive += 1;
            continue;
        }
        let key = (p.namespace.as_str(), p.name.as_str());
        let m = by_key.get(&key).copied();
        if m.is_some() {
            seen.insert(key);
        }
        let qos = qos_class_with_default(p.qos_label.as_deref(), p.kube_qos.as_deref());
        let prio = priority_class_with_default(p.priority_label.as_deref(), p.priority, qos);
        if is_low_priority(prio) {
            n_low += 1;
            continue;
        }
        n_hp += 1;
        hp_req = hp_req + p.request;
        let (used, max, counted_as) = match m {
            None => {
                n_no_metric += 1;
                (p.request, Res::default(), "request (no metric)")
            }
            Some(m) if qos == Some("LSE") => (
                Res::new(p.request.cpu, m.usage.memory),
                p.request.max(m.usage),
                "LSE: CPU request, memory usage",
            ),
            Some(m) => (m.usage, p.request.max(m.usage), "usage"),
        };
        hp_used = hp_used + used;
        hp_max = hp_max + max;
        terms.push(PodTerm {
            pod: format!("{}/{}", p.namespace, p.name),
            priority: prio,
            qos,
            request: p.request,
            usage: m.map(|m| m.usage),
            used,
            max_used_request: max,
            counted_as,
        });
    }
    // metrics of pods not in the list: counted unless their own priority is low
    let mut dangling = Res::default();
    for m in &metric.pods {
        if seen.contains(&(m.namespace.as_str(), m.name.as_str()))
            || is_low_priority(m.priority.as_deref())
        {
            continue;
        }
        dangling = dangling + m.usage;
        terms.push(PodTerm {
            pod: format!("{}/{}", m.namespace, m.name),
            priority: None,
            qos: None,
            request: Res::default(),
            usage: Some(m.usage),
            used: m.usage,
            max_used_request: m.usage,
            counted_as: "metric only (not in the pod list)",
        });
    }
    hp_used = hp_used + dangling;
    hp_max = hp_max + dangling;
    terms.sort_by(|a, b| b.used.cpu.cmp(&a.used.cpu).then_with(|| a.pod.cmp(&b.pod)));

    let capacity = node.capacity();
    let (cpu_reclaim, mem_reclaim) = (s.cpu_reclaim(), s.memory_reclaim());
    let margin = Res::new(
        times(
            capacity.cpu,
            100i64.saturating_sub(cpu_reclaim) as f64 / 100.0,
        ),
        times(
            capacity.memory,
            100i64.saturating_sub(mem_reclaim) as f64 / 100.0,
        ),
    );
    let host_apps = metric
        .host_apps
        .iter()
        .filter(|h| is_above_batch(h.priority.as_deref()))
        .fold(Res::default(), |a, h| a + h.usage);
    let system = metric.system + host_apps;
    let kubelet = node.kubelet_reserved();
    let reserved = node.reservation.map_or(kubelet, |a| kubelet.max(a));
    let sys_or_res = system.max(reserved);
    let base = capacity - margin;
    let by_usage = base - sys_or_res - hp_used;
    let by_request = base - reserved - hp_req;
    let by_max = base - sys_or_res - hp_max;
    let (cpu_policy, memory_policy) = (s.cpu_policy(), s.memory_policy());
    let cpu_by_policy = if cpu_policy == "maxUsageRequest" {
        by_max.cpu
    } else {
        by_usage.cpu
    };
    let memory_by_policy = match memory_policy {
        "request" => by_request.memory,
        "maxUsageRequest" => by_max.memory,
        _ => by_usage.memory,
    };
    let cpu_cap = s
        .batch_cpu_threshold_percent
        .map(|p| times(capacity.cpu, p as f64 / 100.0));
    let memory_cap = s
        .batch_memory_threshold_percent
        .map(|p| times(capacity.memory, p as f64 / 100.0));
    let cpu = cpu_by_policy.max(0).min(cpu_cap.unwrap_or(i64::MAX));
    let memory = memory_by_policy.max(0).min(memory_cap.unwrap_or(i64::MAX));
    Batch {
        cpu,
        memory,
        terms: Terms {
            capacity,
            cpu_reclaim_percent: cpu_reclaim,
            memory_reclaim_percent: mem_reclaim,
            margin,
            kubelet_reserved: kubelet,
            annotation_reserved: node.reservation,
            reserved,
            system_usage: metric.system,
            host_apps,
            system,
            system_or_reserved: sys_or_res,
            high_priority_requested: hp_req,
            high_priority_used: hp_used,
            high_priority_max_used_requested: hp_max,
            metrics_without_pod: dangling,
            cpu_policy,
            memory_policy,
            cpu_cap,
            memory_cap,
            cpu_by_policy,
            memory_by_policy,
            pods_high_priority: n_hp,
            pods_low_priority: n_low,
            pods_inactive: n_inactive,
            pods_without_metric: n_no_metric,
        },
        pods: terms,
    }
}

impl Batch {
    /// The formula of batch-cpu with its numbers (milli-cores).
    pub fn cpu_formula(&self) -> String {
        let t = &self.terms;
        let last = if t.cpu_policy == "maxUsageRequest" {
            format!(
                "Σ max(request, used) {}",
                t.high_priority_max_used_requested.cpu
            )
        } else {
            format!("high-priority used {}", t.high_priority_used.cpu)
        };
        let f = format!(
            "capacity {} - margin {} ({}% of capacity: cpuReclaimThresholdPercent {}) - max(system {}, reserved {}) - {last} = {}",
            t.capacity.cpu,
            t.margin.cpu,
            100i64.saturating_sub(t.cpu_reclaim_percent),
            t.cpu_reclaim_percent,
            t.system.cpu,
            t.reserved.cpu,
            t.cpu_by_policy
        );
        capped(
            f,
            t.cpu_by_policy,
            t.cpu_cap,
            "batchCPUThresholdPercent",
            self.cpu,
        )
    }

    /// The formula of batch-memory with its numbers (bytes).
    pub fn memory_formula(&self) -> String {
        let t = &self.terms;
        let (sys, last) = match t.memory_policy {
            "request" => (
                format!("reserved {}", t.reserved.memory),
                format!(
                    "high-priority requested {}",
                    t.high_priority_requested.memory
                ),
            ),
            "maxUsageRequest" => (
                format!(
                    "max(system {}, reserved {})",
                    t.system.memory, t.reserved.memory
                ),
                format!(
                    "Σ max(request, used) {}",
                    t.high_priority_max_used_requested.memory
                ),
            ),
            _ => (
                format!(
                    "max(system {}, reserved {})",
                    t.system.memory, t.reserved.memory
                ),
                format!("high-priority used {}", t.high_priority_used.memory),
            ),
        };
        let f = format!(
            "capacity {} - margin {} ({}% of capacity: memoryReclaimThresholdPercent {}) - {sys} - {last} = {}",
            t.capacity.memory,
            t.margin.memory,
            100i64.saturating_sub(t.memory_reclaim_percent),
            t.memory_reclaim_percent,
            t.memory_by_policy
        );
        capped(
            f,
            t.memory_by_policy,
            t.memory_cap,
            "batchMemoryThresholdPercent",
            self.memory,
        )
    }
}

fn capped(mut f: String, by_policy: i64, cap: Option<i64>, cap_name: &str, result: i64) -> String {
    if by_policy < 0 {
        f.push_str("; below 0: 0");
    }
    if let Some(c) = cap {
        f.push_str(&format!("; capped at {c} by {cap_name}"));
    }
    f.push_str(&format!(" -> {result}"));
    f
}
