//! Batch resources for this node, from the cluster's objects: the Node, its
//! pods and its NodeMetric turned into the calculation's inputs
//! (`qoslet-colocation`), and the one [`Explanation`] of a result: what the
//! node advertises or why it advertises nothing, every term, and whether a
//! write is due. `qoslet batch-resources` prints it offline from files.

use std::collections::BTreeMap;

use qoslet_colocation::batch::{
    self, Batch, HostAppMetric, MetricInput, NodeInput, PodInput, PodMetric,
};
use qoslet_colocation::strategy::{ColocationConfig, Resolved};
use qoslet_colocation::sync::{self, Advertised, Due};
use qoslet_colocation::{priority, Res, BATCH_CPU, BATCH_MEMORY};
use qoslet_hooks::quantity::Quantity;
use serde_json::{json, Value};

use crate::view::{NodeView, PodView, ResourceList};

fn milli(l: Option<&ResourceList>, name: &str) -> Option<i64> {
    Quantity::parse(l?.get(name)?.trim()).ok()?.milli_value()
}

fn whole(l: Option<&ResourceList>, name: &str) -> Option<i64> {
    Quantity::parse(l?.get(name)?.trim()).ok()?.value()
}

/// The Node's part of the inputs, and a note when its reservation
/// annotation cannot be read (it then counts as none, as in Koordinator).
pub fn node_input(n: &NodeView) -> (NodeInput, Option<String>) {
    let st = n.status.as_ref();
    let cap = st.and_then(|s| s.capacity.as_ref());
    let alloc = st.and_then(|s| s.allocatable.as_ref());
    let (reservation, note) = match batch::reservation_of(annotations(n)) {
        Ok(r) => (r, None),
        Err(e) => (None, Some(format!("ignored: {e}"))),
    };
    (
        NodeInput {
            capacity_cpu: milli(cap, "cpu"),
            capacity_memory: whole(cap, "memory"),
            allocatable_cpu: milli(alloc, "cpu"),
            allocatable_memory: whole(alloc, "memory"),
            reservation,
        },
        note,
    )
}

static EMPTY: BTreeMap<String, String> = BTreeMap::new();

fn labels(n: &NodeView) -> &BTreeMap<String, String> {
    n.metadata.labels.as_ref().unwrap_or(&EMPTY)
}

fn annotations(n: &NodeView) -> &BTreeMap<String, String> {
    n.metadata.annotations.as_ref().unwrap_or(&EMPTY)
}

/// What the Node advertises now (`status.allocatable`; batch-cpu is an
/// integer count of milli-cores).
pub fn advertised(n: &NodeView) -> Advertised {
    let alloc = n.status.as_ref().and_then(|s| s.allocatable.as_ref());
    Advertised {
        cpu: whole(alloc, BATCH_CPU),
        memory: whole(alloc, BATCH_MEMORY),
    }
}

/// A pod of the node's list as the calculation reads it.
pub fn pod_input(p: &PodView) -> PodInput {
    let (cpu, memory) = crate::pods::pod_requests(p);
    let l = p.metadata.labels.as_ref();
    let label = |k: &str| l.and_then(|l| l.get(k)).cloned();
    let status = p.status.as_ref();
    PodInput {
        namespace: p.metadata.namespace.clone().unwrap_or_default(),
        name: p.metadata.name.clone().unwrap_or_default(),
        phase: status.and_then(|s| s.phase.clone()),
        priority_label: label(priority::PRIORITY_LABEL),
        priority: p.spec.as_ref().and_then(|s| s.priority),
        qos_label: label(priority::QOS_LABEL),
        kube_qos: Some(
            status
                .and_then(|s| s.qos_class.clone())
                .unwrap_or_else(|| crate::pods::kube_qos(p).into()),
        ),
        request: Res::new(cpu, memory),
    }
}

fn usage_of(v: &Value) -> Res {
    let r = &v["resources"];
    let q = |name: &str, m: bool| {
        r[name]
            .as_str()
            .and_then(|s| Quantity::parse(s.trim()).ok())
            .and_then(|q| if m { q.milli_value() } else { q.value() })
            .unwrap_or(0)
    };
    Res::new(q("cpu", true), q("memory", false))
}

/// An RFC 3339 time (`2026-12-07T10:00:00Z`) in Unix seconds.
pub fn unix_seconds(t: &str) -> Option<i64> {
    t.parse::<k8s_openapi::jiff::Timestamp>()
        .ok()
        .map(|t| t.as_second())
}

/// A pod of the cluster view (the pods watch's extract) as the calculation
/// reads it.
pub fn cluster_pod_input(p: &qoslet_state::ClusterPod) -> PodInput {
    PodInput {
        namespace: p.namespace.clone(),
        name: p.name.clone(),
        phase: p.phase.clone(),
        priority_label: p.priority_label.clone(),
        priority: p.priority,
        qos_label: p.qos_label.clone(),
        kube_qos: p.qos_class.clone(),
        request: Res::new(p.requests.cpu_milli, p.requests.memory),
    }
}

/// A NodeMetric's `status` as the calculation reads it.
pub fn metric_input(status: &Value) -> MetricInput {
    let str_of = |v: &Value, k: &str| v[k].as_str().map(str::to_string);
    MetricInput {
        update_time: status["updateTime"].as_str().and_then(unix_seconds),
        system: usage_of(&status["nodeMetric"]["systemUsage"]),
        pods: status["podsMetric"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|m| PodMetric {
                namespace: str_of(m, "namespace").unwrap_or_default(),
                name: str_of(m, "name").unwrap_or_default(),
                usage: usage_of(&m["podUsage"]),
                priority: str_of(m, "priority"),
            })
            .collect(),
        host_apps: status["hostApplicationMetric"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|m| HostAppMetric {
                name: str_of(m, "name").unwrap_or_default(),
                usage: usage_of(&m["usage"]),
                priority: str_of(m, "priority"),
            })
            .collect(),
    }
}

/// What the node should advertise.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// batch-cpu (milli-cores) and batch-memory (bytes).
    Advertise(Res),
    /// Both keys removed, and why.
    Remove { reason: String, degraded: bool },
}

/// One calculation for one node, explained.
#[derive(Debug, Clone)]
pub struct Explanation {
    pub node: String,
    pub resolved: Resolved,
    /// The calculation (`None`: no NodeMetric to compute from).
    pub batch: Option<Batch>,
    pub outcome: Outcome,
    /// What the Node shows now.
    pub current: Advertised,
    /// Why a write is due now (`None`: none).
    pub due: Option<Due>,
    pub notes: Vec<String>,
}

impl Explanation {
    /// What the Node should show after a write.
    pub fn next(&self) -> Advertised {
        match &self.outcome {
            Outcome::Advertise(r) => Advertised {
                cpu: Some(r.cpu),
                memory: Some(r.memory),
            },
            Outcome::Remove { .. } => Advertised::NONE,
        }
    }
}

/// Explains this node's batch resources at `now` (Unix seconds), given the
/// age of the last write (`None`: none since start).
pub fn explain(
    cfg: &ColocationConfig,
    node: &NodeView,
    pods: &[PodInput],
    metric_status: Option<&Value>,
    now: i64,
    last_write_age: Option<i64>,
) -> Explanation {
    let resolved = cfg.resolve(labels(node), annotations(node));
    let (input, note) = node_input(node);
    let mut notes: Vec<String> = cfg.warnings.clone();
    notes.extend(resolved.notes.iter().cloned());
    notes.extend(note);
    let metric = metric_status.map(metric_input);
    let batch = metric
        .as_ref()
        .map(|m| batch::calculate(&resolved.strategy, &input, pods, m));
    let outcome = if !resolved.enabled() {
        let whose = if resolved.cluster_enabled {
            "this node's strategy"
        } else {
            "the cluster strategy"
        };
        Outcome::Remove {
            reason: format!(
                "co-location is off: colocation-config's enable is not true in {whose}"
            ),
            degraded: false,
        }
    } else if let Some(why) = sync::degraded(
        metric.as_ref().and_then(|m| m.update_time),
        now,
        &resolved.strategy,
    ) {
        Outcome::Remove {
            reason: if metric.is_none() {
                "no NodeMetric figures for this node".into()
            } else {
                why
            },
            degraded: true,
        }
    } else {
        let b = batch.as_ref().expect("a fresh NodeMetric was read");
        Outcome::Advertise(Res::new(b.cpu, b.memory))
    };
    let current = advertised(node);
    let mut e = Explanation {
        node: node.metadata.name.clone().unwrap_or_default(),
        resolved,
        batch,
        outcome,
        current,
        due: None,
        notes,
    };
    let next = e.next();
    e.due = if next == current && (last_write_age.is_none() || next == Advertised::NONE) {
        // nothing to change, and nothing of ours to refresh (absent keys
        // cannot go stale: koord-manager would write the removal again)
        None
    } else {
        sync::due(current, next, last_write_age, &e.resolved.strategy)
    };
    e
}

/// A quantity of milli-cores as a Kubernetes quantity.
fn cpu_q(m: i64) -> String {
    if m == 0 {
        "0".into()
    } else {
        format!("{m}m")
    }
}

fn res_json(r: Res) -> Value {
    json!({"cpu": cpu_q(r.cpu), "memory": r.memory.to_string()})
}

impl Explanation {
    /// `qoslet batch-resources -o json`.
    pub fn json(&self) -> Value {
        let mut allocatable = serde_json::Map::new();
        let (degraded, reason) = match &self.outcome {
            Outcome::Advertise(r) => {
                allocatable.insert(BATCH_CPU.into(), json!(r.cpu.to_string()));
                allocatable.insert(BATCH_MEMORY.into(), json!(r.memory.to_string()));
                (false, None)
            }
            Outcome::Remove { reason, degraded } => (*degraded, Some(reason.clone())),
        };
        let mut out = json!({
            "node": self.node,
            "allocatable": allocatable,
            "degraded": degraded,
            "enabled": self.resolved.enabled(),
            "strategy": self.resolved.strategy,
            "current": adv_json(self.current),
            "write": match &self.due {
                Some(d) => json!({"due": true, "why": d.to_string(), "reason": d}),
                None => json!({"due": false}),
            },
        });
        if let Some(r) = reason {
            out["reason"] = json!(r);
        }
        if let Some(n) = &self.resolved.node_config {
            out["nodeConfig"] = json!(n);
        }
        if !self.notes.is_empty() {
            out["notes"] = json!(self.notes);
        }
        if let Some(b) = &self.batch {
            let t = &b.terms;
            out["terms"] = json!({
                "capacity": res_json(t.capacity),
                "cpuReclaimThresholdPercent": t.cpu_reclaim_percent,
                "memoryReclaimThresholdPercent": t.memory_reclaim_percent,
                "margin": res_json(t.margin),
                "kubeletReserved": res_json(t.kubelet_reserved),
                "annotationReserved": t.annotation_reserved.map(res_json),
                "reserved": res_json(t.reserved),
                "systemUsage": res_json(t.system_usage),
                "hostApplications": res_json(t.host_apps),
                "system": res_json(t.system),
                "systemOrReserved": res_json(t.system_or_reserved),
                "highPriorityRequested": res_json(t.high_priority_requested),
                "highPriorityUsed": res_json(t.high_priority_used),
                "highPriorityMaxUsedRequested": res_json(t.high_priority_max_used_requested),
                "metricsWithoutPod": res_json(t.metrics_without_pod),
                "cpuPolicy": t.cpu_policy,
                "memoryPolicy": t.memory_policy,
                "cpuCap": t.cpu_cap.map(cpu_q),
                "memoryCap": t.memory_cap.map(|m| m.to_string()),
                "cpuByPolicy": cpu_q(t.cpu_by_policy),
                "memoryByPolicy": t.memory_by_policy.to_string(),
                "cpuFormula": b.cpu_formula(),
                "memoryFormula": b.memory_formula(),
                "pods": {
                    "highPriority": t.pods_high_priority,
                    "lowPriority": t.pods_low_priority,
                    "inactive": t.pods_inactive,
                    "withoutMetric": t.pods_without_metric,
                },
                "highPriorityPods": b.pods.iter().map(|p| json!({
                    "pod": p.pod,
                    "priority": p.priority,
                    "qos": p.qos,
                    "request": res_json(p.request),
                    "usage": p.usage.map(res_json),
                    "used": res_json(p.used),
                    "maxUsedRequest": res_json(p.max_used_request),
                    "countedAs": p.counted_as,
                })).collect::<Vec<_>>(),
            });
        }
        out
    }

    /// `qoslet batch-resources`, for people (the JSON form rendered).
    pub fn text(&self) -> String {
        text_of_json(&self.json()).unwrap_or_default()
    }
}

/// The text form of an explanation's JSON (the running qoslet's, over the
/// admin API, or one made here); `None` when it is not one.
pub fn text_of_json(v: &Value) -> Option<String> {
    use std::fmt::Write;
    let node = v["node"].as_str()?;
    let str_of = |v: &Value| v.as_str().unwrap_or("-").to_string();
    let res = |r: &Value| {
        let mem = r["memory"]
            .as_str()
            .and_then(|m| m.parse::<i64>().ok())
            .map_or("-".into(), gib);
        format!("{} / {}", str_of(&r["cpu"]), mem)
    };
    let mut s = String::new();
    let _ = writeln!(s, "node {node}");
    let alloc = &v["allocatable"];
    let advertising = alloc.as_object().is_some_and(|o| !o.is_empty());
    if advertising {
        let _ = writeln!(
            s,
            "  {BATCH_CPU}: {} (milli-cores)",
            str_of(&alloc[BATCH_CPU])
        );
        let mem = str_of(&alloc[BATCH_MEMORY]);
        let g = mem
            .parse::<i64>()
            .map_or(String::new(), |m| format!(", {}", gib(m)));
        let _ = writeln!(s, "  {BATCH_MEMORY}: {mem} (bytes{g})");
    } else {
        let _ = writeln!(s, "  no batch resources: {}", str_of(&v["reason"]));
    }
    let t = &v["terms"];
    if t.is_object() {
        let prefix = if advertising { "" } else { "were it on: " };
        let _ = writeln!(
            s,
            "  {prefix}batch-cpu    ({} policy) {}",
            str_of(&t["cpuPolicy"]),
            str_of(&t["cpuFormula"])
        );
        let _ = writeln!(
            s,
            "  {prefix}batch-memory ({} policy) {}",
            str_of(&t["memoryPolicy"]),
            str_of(&t["memoryFormula"])
        );
        let anno = if t["annotationReserved"].is_null() {
            "none".to_string()
        } else {
            res(&t["annotationReserved"])
        };
        let _ = writeln!(
            s,
            "  reserved = max(kubelet's capacity - allocatable {}, annotation {anno}); system = usage {} + host applications {}",
            res(&t["kubeletReserved"]),
            res(&t["systemUsage"]),
            res(&t["hostApplications"])
        );
        let p = &t["pods"];
        let _ = writeln!(
            s,
            "  pods: {} high priority ({} without a metric: request counted), {} batch or free, {} neither Running nor Pending",
            p["highPriority"], p["withoutMetric"], p["lowPriority"], p["inactive"]
        );
        let pods = t["highPriorityPods"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default();
        for p in pods.iter().take(10) {
            let _ = writeln!(
                s,
                "    {:<40} {:<11} {:<6} used {} ({})",
                str_of(&p["pod"]),
                str_of(&p["priority"]),
                str_of(&p["qos"]),
                res(&p["used"]),
                str_of(&p["countedAs"])
            );
        }
        if pods.len() > 10 {
            let _ = writeln!(
                s,
                "    ... {} more (-o json lists them all)",
                pods.len() - 10
            );
        }
    }
    let cur = &v["current"];
    let shown = |k: &str| cur[k].as_str().unwrap_or("absent").to_string();
    let _ = writeln!(
        s,
        "  on the Node now: batch-cpu {}, batch-memory {}",
        shown(BATCH_CPU),
        shown(BATCH_MEMORY)
    );
    let _ = if v["write"]["due"] == true {
        writeln!(s, "  a write is due: {}", str_of(&v["write"]["why"]))
    } else {
        writeln!(
            s,
            "  no write due (within resourceDiffThreshold of the Node's values)"
        )
    };
    for n in v["notes"].as_array().into_iter().flatten() {
        let _ = writeln!(s, "  note: {}", str_of(n));
    }
    Some(s)
}

fn adv_json(a: Advertised) -> Value {
    let mut m = serde_json::Map::new();
    if let Some(c) = a.cpu {
        m.insert(BATCH_CPU.into(), json!(c.to_string()));
    }
    if let Some(v) = a.memory {
        m.insert(BATCH_MEMORY.into(), json!(v.to_string()));
    }
    Value::Object(m)
}

fn gib(b: i64) -> String {
    format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64)
}
