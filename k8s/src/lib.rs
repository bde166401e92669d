//! The cluster side (`k8s/`, crate `qoslet-kube` so that its name does not
//! shadow the `kube` dependency): what CRI cannot tell qoslet, from the API
//! server. Off unless `kubernetes.enable`: without a cluster qoslet works
//! from its config file and the runtime's state exactly as before.
//!
//! * [`nodeslo`]: this node's NodeSLO, the policy hub's cluster source.
//! * [`node`]: this node's Node: kubelet's reserved CPU for the QoS engine.
//! * [`pods`]: this node's Pods, joined to the store by UID (priority,
//!   requests, tolerations).
//! * [`crd`]: Koordinator's NodeSLO and NodeMetric as Rust types, the CRDs
//!   `qoslet crd` prints.
//! * [`evict`]: the Eviction API as the eviction room's evictor, with
//!   Events on the pods.
//! * [`nodemetric`]: this node's NodeMetric status, reported from the
//!   metrics cache with Koordinator's keys.
//! * [`status`]: each watch ok or stale, the API's answers counted (`/metrics`).
//!
//! The tests run against an in-process fake API server speaking the real
//! HTTP/JSON list and watch protocol (crate `qoslet-kube-fake`, `k8s/fake/`).

use std::path::PathBuf;

use serde::Deserialize;

pub use qoslet_kube_api::{crd, view};

pub mod advertise;
pub mod batch;
pub mod evict;
pub mod limit;
pub mod node;
pub mod nodemetric;
pub mod nodeslo;
pub mod pods;
pub mod sloconfig;
pub mod status;

/// While a watch is stale, how often the API server is asked whether it is
/// back (a watch resumed from its resourceVersion says nothing until an
/// object changes).
pub const PROBE_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// The probe's clock: ticks missed while a watch was ok are not fired in a
/// burst when it goes stale.
fn probe_interval() -> tokio::time::Interval {
    let mut i = tokio::time::interval(PROBE_EVERY);
    i.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    i
}

/// Whether a probe of the API server was answered within 10 s.
async fn answers<T>(f: impl std::future::Future<Output = Result<T, kube::Error>>) -> bool {
    limited().await;
    matches!(tokio::time::timeout(evict::API_TIMEOUT, f).await, Ok(Ok(_)))
}

/// The limiter every cluster-side request waits on (set once at start; the
/// default, koordlet's QPS 20 burst 30, for the tests that set none).
static LIMITER: std::sync::OnceLock<std::sync::Arc<limit::Limiter>> = std::sync::OnceLock::new();

/// Sets the process's limiter (the first call wins).
pub fn set_limiter(l: std::sync::Arc<limit::Limiter>) -> std::sync::Arc<limit::Limiter> {
    LIMITER.get_or_init(|| l).clone()
}

/// Waits for the rate limit.
pub async fn limited() {
    LIMITER
        .get_or_init(|| std::sync::Arc::new(limit::Limiter::default()))
        .acquire()
        .await;
}

/// The `kubernetes:` section of the config file.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KubernetesConfig {
    /// Off by default: a node without a cluster behaves exactly as without
    /// this section.
    #[serde(default)]
    pub enable: bool,
    /// A kubeconfig file (`None`: the in-cluster service account).
    pub kubeconfig: Option<PathBuf>,
    /// This node's name (`None`: the `NODE_NAME` environment variable, as
    /// koordlet's DaemonSet sets it from `spec.nodeName`).
    pub node_name: Option<String>,
    /// Evictions through the Eviction API (PodDisruptionBudgets honoured,
    /// Events recorded); `false`: a CRI stop, as without a cluster.
    #[serde(default = "yes")]
    pub eviction_api: bool,
    /// Create this node's NodeMetric when it is missing (nodes without
    /// koord-manager); off: reporting waits for one, as koordlet does.
    #[serde(default)]
    pub create_node_metric: bool,
    /// Report NodeMetric status this often instead of the spec's
    /// `reportIntervalSeconds` (30 s to 150 s).
    #[serde(default, with = "opt_secs")]
    pub report_interval: Option<std::time::Duration>,
    /// Turn NodeMetric reporting off.
    #[serde(default = "yes")]
    pub report_node_metric: bool,
    /// qoslet's requests to the API server a second (client-go's token
    /// bucket; the watches are not counted), 0.1 to 1000.
    #[serde(default = "default_qps")]
    pub qps: f64,
    /// ... and at most this many at once (1 to 10000).
    #[serde(default = "default_burst")]
    pub burst: u32,
    /// This node's batch resources (`kubernetes.io/batch-cpu`,
    /// `batch-memory`) on its Node: `off` (koord-manager's job), `on`, or
    /// `auto` (when the colocation-config turns co-location on).
    #[serde(default)]
    pub batch_resources: advertise::BatchMode,
    /// Koordinator's `slo-controller-config` ConfigMap, `namespace/name`
    /// (`None`: `koordinator-system/slo-controller-config`). Naming it, or
    /// batch resources not `off`, has qoslet read it ([`Self::slo_config`]).
    #[serde(default)]
    pub slo_config: Option<sloconfig::SloConfigRef>,
}

fn default_qps() -> f64 {
    5.0
}

fn default_burst() -> u32 {
    10
}

/// A duration such as `60s`, `5m` or `1h` (Go's spelling).
mod opt_secs {
    use serde::{Deserialize, Deserializer};

    pub fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<std::time::Duration>, D::Error> {
        let Some(s) = Option::<String>::deserialize(d)? else {
            return Ok(None);
        };
        let v = crate::nodemetric::parse_go_duration(&s).ok_or_else(|| {
            serde::de::Error::custom(format!("{s:?} is not a duration (60s, 5m, 1h)"))
        })?;
        // koordlet's minimum; and under the scheduler's default
        // nodeMetricExpirationSeconds (180) with room for the jitter
        if !(std::time::Duration::from_secs(30)..=std::time::Duration::from_secs(150)).contains(&v)
        {
            return Err(serde::de::Error::custom(format!(
                "{s:?}: 30s to 150s (koordlet's minimum; the scheduler takes a NodeMetric older than 180 s as expired)"
            )));
        }
        Ok(Some(v))
    }
}

fn yes() -> bool {
    true
}

/// The cluster side once started: what the rest of the agent uses of it.
#[derive(Clone)]
pub struct Cluster {
    pub client: kube::Client,
    pub node: String,
    pub status: std::sync::Arc<status::ClusterStatus>,
    pub eviction_api: bool,
}

impl Default for KubernetesConfig {
    fn default() -> Self {
        Self {
            enable: false,
            kubeconfig: None,
            node_name: None,
            eviction_api: true,
            create_node_metric: false,
            report_interval: None,
            report_node_metric: true,
            qps: default_qps(),
            burst: default_burst(),
            batch_resources: Default::default(),
            slo_config: Default::default(),
        }
    }
}

/// Why the cluster side cannot start.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("kubernetes.nodeName is unset and NODE_NAME is not in the environment")]
    NoNodeName,
    #[error("kubernetes.nodeName {0:?} is not a node name (a DNS subdomain: lower-case alphanumerics, '-' and '.', at most 253)")]
    BadNodeName(String),
    #[error(transparent)]
    Connect(#[from] qoslet_kube_api::connect::ConnectError),
    #[error("{0}")]
    Limit(String),
    #[error("QOSLET_BATCH_RESOURCES={0:?}: off, on or auto")]
    BatchMode(String),
}

impl KubernetesConfig {
    /// The ConfigMap qoslet reads, when it reads one: only where asked
    /// (`sloConfig` named, or `batchResources` not `off`, as the colocation
    /// component sets it with the Role to read it). Without a Role the API
    /// server refuses the list: a node agent that was not asked to read the
    /// ConfigMap must not fill its log with 403s, nor put Koordinator's
    /// policy over the file's on an upgrade.
    pub fn slo_config(&self, batch: advertise::BatchMode) -> Option<sloconfig::SloConfigRef> {
        match (&self.slo_config, batch) {
            (Some(r), _) => Some(r.clone()),
            (None, advertise::BatchMode::Off) => None,
            (None, _) => Some(Default::default()),
        }
    }

    /// The rate limit, checked.
    pub fn limiter(&self) -> Result<limit::Limiter, ClusterError> {
        if !(0.1..=1000.0).contains(&self.qps) {
            return Err(ClusterError::Limit(format!(
                "kubernetes.qps {} is not within 0.1 and 1000",
                self.qps
            )));
        }
        if !(1..=10_000).contains(&self.burst) {
            return Err(ClusterError::Limit(format!(
                "kubernetes.burst {} is not within 1 and 10000",
                self.burst
            )));
        }
        Ok(limit::Limiter::new(self.qps, self.burst))
    }

    /// `batchResources`, or the `QOSLET_BATCH_RESOURCES` environment variable
    /// when it is set (how `components/colocation` turns it on without
    /// replacing the config file).
    pub fn batch_mode(&self) -> Result<advertise::BatchMode, ClusterError> {
        match std::env::var("QOSLET_BATCH_RESOURCES") {
            Ok(v) => match v.as_str() {
                "off" => Ok(advertise::BatchMode::Off),
                "on" => Ok(advertise::BatchMode::On),
                "auto" => Ok(advertise::BatchMode::Auto),
                _ => Err(ClusterError::BatchMode(v.chars().take(32).collect())),
            },
            Err(_) => Ok(self.batch_resources),
        }
    }

    /// This node's name, checked (it goes into field selectors and names).
    pub fn node(&self) -> Result<String, ClusterError> {
        let n = match &self.node_name {
            Some(n) => n.clone(),
            None => std::env::var("NODE_NAME").map_err(|_| ClusterError::NoNodeName)?,
        };
        let ok = !n.is_empty()
            && n.len() <= 253
            && n.split('.').all(|label| {
                !label.is_empty()
                    && label.len() <= 63
                    && label
                        .bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                    && !label.starts_with('-')
                    && !label.ends_with('-')
            });
        if ok {
            Ok(n)
        } else {
            Err(ClusterError::BadNodeName(n.chars().take(64).collect()))
        }
    }

    /// A client of the API server this section names.
    pub async fn client(&self) -> Result<kube::Client, ClusterError> {
        Ok(qoslet_kube_api::connect::client(self.kubeconfig.as_deref()).await?)
    }
}

#[cfg(test)]
mod tests;
