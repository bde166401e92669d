//! This node's NodeMetric (`slo.koordinator.sh/v1alpha1`, cluster-scoped,
//! named after the node, status subresource): what load-aware scheduling
//! reads. qoslet writes its `status` with Koordinator's exact keys from the
//! metrics cache: the node's usage (the average over the spec's
//! `aggregateDurationSeconds`), its aggregated usages (avg, p50, p90, p95,
//! p99 over each of `nodeAggregatePolicy.durations`), the system's, and each
//! pod's usage with its priority class and QoS class, sorted by namespace
//! and name. One status write per report interval (jittered), retried on a
//! conflict and on failure with backoff within the interval, counted;
//! nothing between intervals. A missing NodeMetric is created only when
//! `kubernetes.createNodeMetric` is on (koord-manager creates it elsewhere);
//! otherwise reporting waits for it, as koordlet does.

use std::sync::Arc;
use std::time::Duration;

use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, PostParams};
use serde_json::{json, Map, Value};
use tokio::sync::watch;
use tracing::{debug, info, warn};

use crate::status::ClusterStatus;

/// Koordinator's NodeMetric as an API resource.
pub fn resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("slo.koordinator.sh", "v1alpha1", "NodeMetric"),
        "nodemetrics",
    )
}

/// The spec's `metricCollectPolicy`, with koordlet's defaults and minimums.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CollectPolicy {
    pub aggregate: Duration,
    pub report_interval: Duration,
    pub durations: Vec<Duration>,
    /// `nodeMemoryCollectPolicy: usageWithPageCache`: node memory is MemTotal
    /// − MemFree and pods' their cgroup usage (page cache included); else
    /// (`usageWithoutPageCache`, the default, and `usageWithHotPageCache`,
    /// as koordlet reads it without cold-page data) without page cache and
    /// pods' working set.
    pub with_page_cache: bool,
}

impl Default for CollectPolicy {
    fn default() -> Self {
        Self {
            aggregate: Duration::from_secs(300),
            report_interval: Duration::from_secs(60),
            durations: [300, 600, 1800].map(Duration::from_secs).to_vec(),
            with_page_cache: false,
        }
    }
}

/// The metrics cache keeps a day at most.
const MAX_WINDOW: Duration = Duration::from_secs(86_400);

impl CollectPolicy {
    /// From a colocation strategy, as koord-manager copies it into the
    /// NodeMetric's spec.
    pub fn of_strategy(s: &qoslet_colocation::strategy::Strategy) -> Self {
        let spec = json!({"metricCollectPolicy": {
            "aggregateDurationSeconds": s.metric_aggregate_duration_seconds,
            "reportIntervalSeconds": s.metric_report_interval_seconds,
            "nodeAggregatePolicy": {"durations": s.metric_aggregate_policy.as_ref().and_then(|p| p.durations.clone())},
            "nodeMemoryCollectPolicy": s.metric_memory_collect_policy,
        }});
        Self::of_spec(&spec)
    }

    /// From a NodeMetric's spec: a field missing or malformed takes its
    /// default; one under koordlet's minimum (aggregate 60 s, report 30 s) is
    /// raised to it, as koordlet does.
    pub fn of_spec(spec: &Value) -> Self {
        let d = Self::default();
        let p = &spec["metricCollectPolicy"];
        let secs = |v: &Value, min: u64, def: Duration| {
            v.as_u64()
                .filter(|s| *s > 0)
                .map(|s| Duration::from_secs(s.max(min)))
                .map_or(def, |s| s.min(MAX_WINDOW))
        };
        let durations: Vec<Duration> = p["nodeAggregatePolicy"]["durations"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|s| s.as_str().and_then(parse_go_duration))
                    .filter(|d| *d >= Duration::from_secs(1) && *d <= MAX_WINDOW)
                    .collect()
            })
            .unwrap_or_default();
        Self {
            aggregate: secs(&p["aggregateDurationSeconds"], 60, d.aggregate),
            report_interval: secs(&p["reportIntervalSeconds"], 30, d.report_interval),
            durations: if durations.is_empty() {
                d.durations
            } else {
                durations
            },
            with_page_cache: p["nodeMemoryCollectPolicy"].as_str() == Some("usageWithPageCache"),
        }
    }
}

pub use qoslet_colocation::parse_go_duration;

/// Go's `Duration.String()` for whole seconds (`5m0s`, `1h0m0s`, `30s`).
pub fn go_duration(d: Duration) -> String {
    let s = d.as_secs();
    let (h, m, s) = (s / 3600, (s / 60) % 60, s % 60);
    if h > 0 {
        format!("{h}h{m}m{s}s")
    } else if m > 0 {
        format!("{m}m{s}s")
    } else {
        format!("{s}s")
    }
}

/// CPU (cores) and memory (bytes).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Usage {
    pub cpu: f64,
    pub memory: f64,
}

/// The five aggregations Koordinator reports, in its key order.
pub const AGGREGATIONS: [&str; 5] = ["avg", "p50", "p90", "p95", "p99"];

/// One pod's usage.
#[derive(Debug, Clone, PartialEq)]
pub struct PodUsage {
    pub namespace: String,
    pub name: String,
    pub usage: Usage,
    /// `koord-prod`, `koord-mid`, `koord-batch`, `koord-free` (`None`: none applies).
    pub priority: Option<&'static str>,
    /// `LSE`, `LSR`, `LS`, `BE`, `SYSTEM` (`None`: not known).
    pub qos: Option<&'static str>,
}

/// What one report says, read from the metrics cache.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Collected {
    pub node: Usage,
    /// Per duration: the five aggregations (`None`: the cache cannot answer one).
    pub node_aggregated: Vec<(Duration, [Option<Usage>; 5])>,
    pub system: Usage,
    pub system_aggregated: Vec<(Duration, [Option<Usage>; 5])>,
    pub pods: Vec<PodUsage>,
}

pub use qoslet_colocation::priority::{priority_class, priority_class_with_default};

/// A quantity of CPU as Kubernetes prints `NewMilliQuantity(v, DecimalSI)`:
/// `2350m`, `2`, `12k`.
pub fn cpu_quantity(cores: f64) -> String {
    let milli = (cores * 1000.0).round().max(0.0) as i64;
    if milli == 0 {
        return "0".into();
    }
    if milli % 1000 != 0 {
        return format!("{milli}m");
    }
    let mut v = milli / 1000;
    for suffix in ["", "k", "M", "G", "T", "P"] {
        if v % 1000 != 0 {
            return format!("{v}{suffix}");
        }
        v /= 1000;
    }
    format!("{v}E")
}

/// Bytes as Kubernetes prints `NewQuantity(v, BinarySI)`: the largest
/// binary suffix that divides it exactly (`10Gi`, `1536Mi`, `1000`).
pub fn memory_quantity(bytes: f64) -> String {
    let mut v = bytes.round().max(0.0) as i64;
    if v == 0 {
        return "0".into();
    }
    let mut suffix = "";
    for next in ["Ki", "Mi", "Gi", "Ti", "Pi", "Ei"] {
        if v % 1024 != 0 {
            break;
        }
        v /= 1024;
        suffix = next;
    }
    format!("{v}{suffix}")
}

fn resources(u: Usage) -> Value {
    json!({"resources": {"cpu": cpu_quantity(u.cpu), "memory": memory_quantity(u.memory)}})
}

fn aggregated(list: &[(Duration, [Option<Usage>; 5])]) -> Value {
    Value::Array(
        list.iter()
            .map(|(d, aggs)| {
                let mut usage = Map::new();
                for (name, u) in AGGREGATIONS.iter().zip(aggs) {
                    if let Some(u) = u {
                        usage.insert((*name).into(), resources(*u));
                    }
                }
                json!({"usage": usage, "duration": go_duration(*d)})
            })
            .collect(),
    )
}

/// The NodeMetric's `status` with Koordinator's keys (`updateTime` in RFC
/// 3339 seconds, UTC); pods sorted by namespace, then name.
pub fn status_json(c: &Collected, update_time: &str) -> Value {
    let mut pods = c.pods.clone();
    pods.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    let pods: Vec<Value> = pods
        .iter()
        .map(|p| {
            let mut o =
                json!({"namespace": p.namespace, "name": p.name, "podUsage": resources(p.usage)});
            if let Some(pr) = p.priority {
                o["priority"] = json!(pr);
            }
            if let Some(q) = p.qos {
                o["qos"] = json!(q);
            }
            o
        })
        .collect();
    // Go's omitempty: an empty list is left out
    let mut node = json!({"nodeUsage": resources(c.node), "systemUsage": resources(c.system)});
    if !c.node_aggregated.is_empty() {
        node["aggregatedNodeUsages"] = aggregated(&c.node_aggregated);
    }
    if !c.system_aggregated.is_empty() {
        node["aggregatedSystemUsages"] = aggregated(&c.system_aggregated);
    }
    let mut out = json!({"updateTime": update_time, "nodeMetric": node});
    if !pods.is_empty() {
        out["podsMetric"] = Value::Array(pods);
    }
    out
}

/// Where a report's figures come from (the agent's metrics cache and
/// inventory; a table in tests). `None`: nothing to report yet (metrics
/// off, starting, or stale): no write.
pub trait MetricsSource: Send + Sync + 'static {
    fn collect(&self, policy: &CollectPolicy) -> Option<Collected>;
}

/// Each report's status (its `updateTime` the time its figures were
/// read), written or not: what the batch-resource advertiser computes from,
/// so that the Node and the NodeMetric never disagree.
pub type Figures = watch::Sender<Option<Arc<Value>>>;

/// The colocation-config as followed, and this Node as watched.
pub type ColocationInputs = (
    watch::Receiver<crate::sloconfig::SloConfig>,
    watch::Receiver<Option<Arc<crate::view::NodeView>>>,
);

/// Settings of the reporter.
#[derive(Debug, Clone, Default)]
pub struct ReportSettings {
    /// Create this node's NodeMetric when missing.
    pub create: bool,
    /// Overrides the spec's `reportIntervalSeconds`.
    pub interval: Option<Duration>,
    /// Write the NodeMetric's status (`kubernetes.reportNodeMetric`); off:
    /// the figures are only published.
    pub write: bool,
    /// Where each report's status is published (`None`: nowhere).
    pub figures: Option<Figures>,
    /// The colocation-config and this Node, whose collect policy applies
    /// when no NodeMetric spec sets one (no koord-manager to copy it there).
    pub colocation: Option<ColocationInputs>,
}

impl ReportSettings {
    /// The collect policy when no NodeMetric spec sets one: the
    /// colocation-config's for this node when it turns co-location on
    /// (koord-manager's `getNodeMetricCollectPolicy`), else the defaults.
    fn fallback_policy(&self) -> CollectPolicy {
        let Some((cfg, node)) = &self.colocation else {
            return CollectPolicy::default();
        };
        let crate::sloconfig::SloConfig::Read(c) = &*cfg.borrow() else {
            return CollectPolicy::default();
        };
        let empty = Default::default();
        let n = node.borrow();
        let (labels, annotations) = match n.as_deref() {
            Some(n) => (
                n.metadata.labels.as_ref().unwrap_or(&empty),
                n.metadata.annotations.as_ref().unwrap_or(&empty),
            ),
            None => (&empty, &empty),
        };
        let r = c.resolve(labels, annotations);
        if r.enabled() {
            CollectPolicy::of_strategy(&r.strategy)
        } else {
            CollectPolicy::default()
        }
    }

    /// The policy of a NodeMetric's spec, or the fallback when it sets none.
    fn policy_of(&self, spec: &Value) -> CollectPolicy {
        if spec["metricCollectPolicy"].is_object() {
            CollectPolicy::of_spec(spec)
        } else {
            self.fallback_policy()
        }
    }

    /// Publishes a report's status, collected with `policy`, when someone
    /// follows them; `false` when there are no figures.
    fn publish(&self, source: &dyn MetricsSource, policy: &CollectPolicy) -> Option<Value> {
        let figures = source.collect(policy)?;
        let status = status_json(&figures, &now_rfc3339());
        if let Some(f) = &self.figures {
            f.send_replace(Some(Arc::new(status.clone())));
        }
        Some(status)
    }
}

fn now_rfc3339() -> String {
    let now = k8s_openapi::jiff::Timestamp::now();
    format!("{}", now.strftime("%Y-%m-%dT%H:%M:%SZ"))
}

/// What a report attempt did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reported {
    Written,
    /// No NodeMetric and not ours to create.
    Missing,
    /// The API server has no NodeMetric resource (Koordinator's CRDs are
    /// not installed).
    NoResource,
    /// Nothing to report (metrics not ready).
    NoFigures,
    /// Figures published, no NodeMetric written (`kubernetes.reportNodeMetric` off).
    Published,
}

/// One report: read the NodeMetric (its spec is the policy), write its
/// status; a conflict reads it again and retries (3 times). Returns the
/// policy read (for the next interval).
pub async fn report_once(
    api: &Api<DynamicObject>,
    node: &str,
    source: &dyn MetricsSource,
    settings: &ReportSettings,
    status: &ClusterStatus,
) -> Result<(Reported, CollectPolicy), kube::Error> {
    if !settings.write {
        let policy = settings.fallback_policy();
        return Ok(match settings.publish(source, &policy) {
            Some(_) => (Reported::Published, policy),
            None => (Reported::NoFigures, policy),
        });
    }
    for attempt in 0..4u32 {
        crate::limited().await;
        let found = match api.get(node).await {
            Ok(o) => Some(o),
            // a 404 naming the object: no such NodeMetric; one naming
            // nothing: no such resource (the CRD is not installed)
            Err(kube::Error::Api(s)) if s.code == 404 => {
                if s.details.as_ref().is_none_or(|d| d.name.is_empty()) {
                    let policy = settings.fallback_policy();
                    settings.publish(source, &policy);
                    return Ok((Reported::NoResource, policy));
                }
                None
            }
            Err(e) => return Err(e),
        };
        let current = match found {
            Some(o) => o,
            None if settings.create => {
                let mut o = DynamicObject::new(node, &resource());
                o.data = json!({"spec": {}});
                crate::limited().await;
                match api.create(&PostParams::default(), &o).await {
                    Ok(o) => {
                        info!(node, "NodeMetric created (kubernetes.createNodeMetric)");
                        o
                    }
                    // created meanwhile (koord-manager): read it next time round
                    Err(kube::Error::Api(s)) if s.code == 409 => continue,
                    Err(e) => return Err(e),
                }
            }
            None => {
                let policy = settings.fallback_policy();
                settings.publish(source, &policy);
                return Ok((Reported::Missing, policy));
            }
        };
        let policy = settings.policy_of(&current.data["spec"]);
        let Some(status_now) = settings.publish(source, &policy) else {
            return Ok((Reported::NoFigures, policy));
        };
        let mut next = current.clone();
        next.data["status"] = status_now;
        crate::limited().await;
        match api
            .replace_status(node, &PostParams::default(), &next)
            .await
        {
            Ok(_) => {
                status.count_report("written");
                return Ok((Reported::Written, policy));
            }
            Err(kube::Error::Api(s)) if s.code == 409 && attempt < 3 => {
                status.count_report("conflict");
                debug!(node, "NodeMetric changed meanwhile: read again");
                tokio::time::sleep(Duration::from_millis(100 << attempt)).await;
            }
            Err(e) => return Err(e),
        }
    }
    Err(kube::Error::Api(Box::new(kube::core::Status::failure(
        "NodeMetric: conflicts on every attempt",
        "Conflict",
    ))))
}

/// Reports this node's NodeMetric status once per interval until `shutdown`.
pub async fn report(
    client: kube::Client,
    node: String,
    source: Arc<dyn MetricsSource>,
    settings: ReportSettings,
    status: Arc<ClusterStatus>,
    mut shutdown: watch::Receiver<bool>,
) {
    let api: Api<DynamicObject> = Api::all_with(client, &resource());
    let mut interval = settings
        .interval
        .unwrap_or(CollectPolicy::default().report_interval);
    let mut warned_missing = false;
    let mut policy_seen: Option<CollectPolicy> = None;
    loop {
        // jittered: thousands of nodes do not write in step
        let jitter = interval.mul_f64(0.1 * jitter_fraction());
        tokio::select! {
            _ = tokio::time::sleep(interval + jitter) => {}
            _ = shutdown.changed() => return,
        }
        // failures are retried with backoff within the interval
        let mut backoff = Duration::from_secs(1);
        let deadline = tokio::time::Instant::now() + interval;
        loop {
            match report_once(&api, &node, source.as_ref(), &settings, &status).await {
                Ok((r, policy)) => {
                    if policy_seen.as_ref() != Some(&policy) {
                        info!(node = %node, ?policy, "NodeMetric collect policy");
                        policy_seen = Some(policy.clone());
                    }
                    interval = settings.interval.unwrap_or(policy.report_interval);
                    match r {
                        Reported::Missing if !warned_missing => {
                            warned_missing = true;
                            info!(node = %node, "no NodeMetric for this node: reporting waits for it (koord-manager creates it; or kubernetes.createNodeMetric)");
                        }
                        Reported::Missing => {}
                        Reported::NoResource if !warned_missing => {
                            warned_missing = true;
                            info!(node = %node, "the API server has no NodeMetric resource (Koordinator's CRDs are not installed): no report");
                        }
                        Reported::NoResource => {}
                        _ => warned_missing = false,
                    }
                    break;
                }
                Err(e) => {
                    status.count_report("failed");
                    warn!(node = %node, error = %e, "NodeMetric status not written; retried");
                    if tokio::time::Instant::now() + backoff >= deadline {
                        break;
                    }
                    tokio::select! {
                        _ = tokio::time::sleep(backoff) => {}
                        _ = shutdown.changed() => return,
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(30));
                }
            }
        }
    }
}

/// A fraction in [0, 1) that differs between nodes and reports.
fn jitter_fraction() -> f64 {
    let n = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0)
        ^ std::process::id().wrapping_mul(2_654_435_761);
    f64::from(n % 10_000) / 10_000.0
}

/// The agent's metrics cache and inventory as a [`MetricsSource`].
pub struct AgentMetrics {
    pub views: Arc<qoslet_agent::admin::Views>,
    pub inventory: Arc<qoslet_state::Inventories>,
}

impl MetricsSource for AgentMetrics {
    fn collect(&self, policy: &CollectPolicy) -> Option<Collected> {
        use qoslet_metrics::{Agg, Metric};
        let m = self.views.metrics()?;
        let secs = |d: Duration| d.as_secs().clamp(1, MAX_WINDOW.as_secs()) as u32;
        let aggregate = policy_window(policy);
        let avg = |entity: &str, mem: Metric| -> Option<Usage> {
            let cpu = m.aggregate(entity, Metric::CpuUsage, aggregate, &[Agg::Avg])[0]?;
            let memory = m.aggregate(entity, mem, aggregate, &[Agg::Avg])[0]?;
            Some(Usage { cpu, memory })
        };
        let aggs = [
            Agg::Avg,
            Agg::Quantile(0.5),
            Agg::Quantile(0.9),
            Agg::Quantile(0.95),
            Agg::Quantile(0.99),
        ];
        let spread = |entity: &str, mem: Metric| -> Vec<(Duration, [Option<Usage>; 5])> {
            policy
                .durations
                .iter()
                .map(|d| {
                    let cpu = m.aggregate(entity, Metric::CpuUsage, secs(*d), &aggs);
                    let memory = m.aggregate(entity, mem, secs(*d), &aggs);
                    let mut out = [None; 5];
                    for (i, slot) in out.iter_mut().enumerate() {
                        *slot = cpu[i]
                            .zip(memory[i])
                            .map(|(cpu, memory)| Usage { cpu, memory });
                    }
                    (*d, out)
                })
                .collect()
        };
        // the node's memory without page cache (koordlet's default
        // usageWithoutPageCache), the system's and pods' working set; with
        // page cache: the node's used + cache, pods' cgroup usage
        let pod_memory = if policy.with_page_cache {
            Metric::MemoryUsage
        } else {
            Metric::MemoryWorkingSet
        };
        let mut node = avg("node", Metric::MemoryUsage)?;
        if policy.with_page_cache {
            node.memory +=
                m.aggregate("node", Metric::MemoryCache, aggregate, &[Agg::Avg])[0].unwrap_or(0.0);
        }
        let system = avg("system", Metric::MemoryWorkingSet).unwrap_or_default();
        let inv = self.inventory.current();
        let pods = inv
            .pods
            .iter()
            .filter_map(|p| {
                let usage = avg(&format!("pod/{}", p.id), pod_memory)?;
                let qos = p.class.map(|c| c.class.as_str());
                Some(PodUsage {
                    namespace: p.namespace.clone(),
                    name: p.name.clone(),
                    usage,
                    priority: priority_class_with_default(
                        p.labels
                            .get("koordinator.sh/priority-class")
                            .map(String::as_str),
                        p.priority,
                        qos,
                    ),
                    qos,
                })
            })
            .collect();
        Some(Collected {
            node,
            node_aggregated: spread("node", Metric::MemoryUsage),
            system,
            system_aggregated: spread("system", Metric::MemoryWorkingSet),
            pods,
        })
    }
}

fn policy_window(p: &CollectPolicy) -> u32 {
    p.aggregate.as_secs().clamp(1, MAX_WINDOW.as_secs()) as u32
}
