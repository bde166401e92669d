//! The admin gRPC API (`qoslet.admin.v1.Admin`) over the store and counters,
//! plus the gRPC health service and server reflection (v1 and v1alpha).

use crate::QosletError;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use qoslet_proto::admin::{self, admin_server::Admin};
use qoslet_proto::cri;
use tonic::{Request, Response, Status};

use crate::backend::Backend;
use crate::forward::ProxyStats;
use crate::pipeline::Pipeline;
use qoslet_state::store::{ContainerRecord, PodRecord, Resources, Store};

/// qoslet's version, as reported by GetStatus.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// What the agent's loops show the admin API (the metrics cache, the QoS
/// engine's plan), provided by the binary: the proxy crate depends on neither.
pub trait AgentView: Send + Sync + 'static {
    fn query(&self, req: admin::QueryMetricsRequest)
        -> Result<admin::QueryMetricsResponse, Status>;
    fn node_summary(&self) -> admin::NodeSummaryResponse;
    /// The QoS engine's latest tick.
    fn plan(&self, _req: admin::GetPlanRequest) -> Result<admin::GetPlanResponse, Status> {
        Err(QosletError::Off("the QoS engine is off in this qoslet".into()).into())
    }
}

/// The admin service implementation.
pub struct AdminService {
    pub(crate) metrics: Option<Arc<dyn AgentView>>,
    pub(crate) store: Store,
    pub(crate) stats: Arc<ProxyStats>,
    pub(crate) pipeline: Pipeline,
    pub(crate) backend: Backend,
    pub(crate) started: Instant,
    pub(crate) listen: String,
    pub(crate) state_dir: String,
}

#[tonic::async_trait]
impl Admin for AdminService {
    async fn get_status(
        &self,
        _: Request<admin::GetStatusRequest>,
    ) -> Result<Response<admin::GetStatusResponse>, Status> {
        let mut backend = admin::Backend {
            endpoint: self.backend.endpoint().to_string(),
            ..Default::default()
        };
        let mut client = self.backend.runtime();
        match tokio::time::timeout(
            Duration::from_secs(2),
            client.version(cri::VersionRequest {
                version: String::new(),
            }),
        )
        .await
        {
            Ok(Ok(v)) => {
                let v = v.into_inner();
                backend.reachable = true;
                backend.runtime_name = v.runtime_name;
                backend.runtime_version = v.runtime_version;
                backend.runtime_api_version = v.runtime_api_version;
            }
            Ok(Err(s)) => backend.error = format!("{}: {}", s.code(), s.message()),
            Err(_) => backend.error = "Version timed out after 2s".into(),
        }
        let (pods, containers) = self.store.counts();
        let s = &self.stats;
        let h = self.pipeline.counters();
        let l = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        Ok(Response::new(admin::GetStatusResponse {
            version: VERSION.into(),
            mode: "proxy".into(),
            backend: Some(backend),
            uptime_seconds: self.started.elapsed().as_secs(),
            listen: self.listen.clone(),
            state_dir: self.state_dir.clone(),
            counters: Some(admin::Counters {
                pods: pods as u64,
                containers: containers as u64,
                calls_total: l(&s.calls_total),
                calls_passthrough: l(&s.calls_passthrough),
                calls_intercepted: l(&s.calls_intercepted),
                backend_unavailable: l(&s.backend_unavailable),
                backend_resets: l(&s.backend_resets),
                calls_in_flight: l(&s.calls_in_flight),
                hook_errors: l(&h.errors),
                hook_timeouts: l(&h.timeouts),
                hook_panics: l(&h.panics),
                calls_refused: l(&s.calls_refused),
                oversized_messages: l(&s.oversized_messages),
                undecodable_messages: l(&s.undecodable_messages),
                connections_terminated: l(&s.connections_terminated),
                ..Default::default()
            }),
        }))
    }

    async fn query_metrics(
        &self,
        req: Request<admin::QueryMetricsRequest>,
    ) -> Result<Response<admin::QueryMetricsResponse>, Status> {
        let m = self.metrics.clone().ok_or_else(metrics_off)?;
        // the cache's lock and decoding stay off the thread that relays CRI
        let req = req.into_inner();
        tokio::task::spawn_blocking(move || m.query(req))
            .await
            .map_err(|_| QosletError::Internal("the metrics query failed (panicked)".into()))?
            .map(Response::new)
    }

    async fn node_summary(
        &self,
        _: Request<admin::NodeSummaryRequest>,
    ) -> Result<Response<admin::NodeSummaryResponse>, Status> {
        let m = self.metrics.as_ref().ok_or_else(metrics_off)?;
        Ok(Response::new(m.node_summary()))
    }

    async fn get_plan(
        &self,
        req: Request<admin::GetPlanRequest>,
    ) -> Result<Response<admin::GetPlanResponse>, Status> {
        let m = self.metrics.as_ref().ok_or_else(|| {
            QosletError::Off(
                "the QoS engine needs metrics, and metrics are off in this qoslet".into(),
            )
        })?;
        m.plan(req.into_inner()).map(Response::new)
    }

    async fn list_pods(
        &self,
        req: Request<admin::ListPodsRequest>,
    ) -> Result<Response<admin::ListPodsResponse>, Status> {
        let ns = req.into_inner().namespace;
        let snap = self.store.snapshot();
        let pods = snap
            .pods
            .iter()
            .filter(|p| ns.is_empty() || p.namespace == ns)
            .map(|p| pod_to_proto(p, snap.containers.iter().filter(|c| c.pod_id == p.id)))
            .collect();
        Ok(Response::new(admin::ListPodsResponse { pods }))
    }
}

fn metrics_off() -> QosletError {
    QosletError::Off("metrics collection is off in this qoslet (metricsInterval 0)".into())
}

fn res(r: &Resources) -> admin::Resources {
    admin::Resources {
        cpu_period: r.cpu_period,
        cpu_quota: r.cpu_quota,
        cpu_shares: r.cpu_shares,
        memory_limit_in_bytes: r.memory_limit_in_bytes,
        cpuset_cpus: r.cpuset_cpus.clone(),
        cpuset_mems: r.cpuset_mems.clone(),
        unified: r.unified.clone().into_iter().collect(),
        oom_score_adj: r.oom_score_adj,
    }
}

fn pod_to_proto<'a>(
    p: &PodRecord,
    containers: impl Iterator<Item = &'a ContainerRecord>,
) -> admin::Pod {
    admin::Pod {
        id: p.id.clone(),
        name: p.name.clone(),
        namespace: p.namespace.clone(),
        uid: p.uid.clone(),
        attempt: p.attempt,
        state: p.state.as_str().into(),
        labels: p.labels.clone().into_iter().collect(),
        annotations: p.annotations.clone().into_iter().collect(),
        cgroup_parent: p.cgroup_parent.clone(),
        created_at: p.created_at,
        applied: p.applied.clone().into_iter().collect(),
        resources: p.resources.as_ref().map(res),
        runtime_handler: p.runtime_handler.clone(),
        containers: containers
            .map(|c| admin::Container {
                id: c.id.clone(),
                name: c.name.clone(),
                attempt: c.attempt,
                image: c.image.clone(),
                state: c.state.as_str().into(),
                labels: c.labels.clone().into_iter().collect(),
                annotations: c.annotations.clone().into_iter().collect(),
                requested: c.requested.as_ref().map(res),
                applied: c.applied.clone().into_iter().collect(),
                created_at: c.created_at,
            })
            .collect(),
    }
}
