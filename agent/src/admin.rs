//! The admin gRPC API (`qoslet.admin.v1.Admin`) over the store, the running
//! front end's counters and the agent's loops (metrics, engine), plus the gRPC
//! health service and server reflection (v1 and v1alpha), on its own socket.

use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use qoslet_proto::admin::{self, admin_server::Admin};
use tokio::net::UnixListener;
use tokio::sync::watch;
use tonic::{Request, Response, Status};
use tracing::warn;

use crate::front::FrontEnds;
use crate::QosletError;
use qoslet_state::store::{ContainerRecord, PodRecord, Resources, Store};

/// qoslet's version, as reported by GetStatus.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The agent's loops as the admin API sees them: set once each has started
/// (metrics may be off by configuration, or not started on a host without
/// cgroups; the engine follows metrics).
pub struct Views {
    /// Whether the configuration turns metrics on at all.
    metrics_on: bool,
    metrics: OnceLock<Arc<qoslet_metrics::service::Metrics>>,
    engine: OnceLock<Arc<qoslet_qos_engine::runner::Shared>>,
    eviction: OnceLock<Arc<crate::eviction::EvictionView>>,
    /// The cluster side (`None`: no cluster).
    cluster: OnceLock<Arc<dyn ClusterView>>,
}

/// What the cluster side shows: its `/metrics` lines and, for `qoslet
/// status`, each watch's state.
/// The advertiser in a line, for `qoslet status`.
fn batch_line(b: &BatchView) -> String {
    let mut line = b.state.clone();
    if b.last_write_unix > 0 {
        let ago = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64)
            .saturating_sub(b.last_write_unix);
        line.push_str(&format!(
            "; last write {ago} s ago: {}",
            b.last_write_reason
        ));
    }
    line
}

pub trait ClusterView: Send + Sync {
    fn render(&self, out: &mut String);
    /// (watch, state, objects held)
    fn watches(&self) -> Vec<(&'static str, &'static str, u64)>;
    /// The batch-resource advertiser (`None`: off).
    fn batch(&self) -> Option<BatchView> {
        None
    }
}

/// What the batch-resource advertiser shows (`GetBatchResources`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BatchView {
    /// waiting, advertising, removed, yielded, failing.
    pub state: String,
    /// Its latest explanation as JSON (empty: none yet).
    pub explanation_json: String,
    /// The last write since start: Unix seconds (0: none) and why.
    pub last_write_unix: i64,
    pub last_write_reason: String,
}

impl From<BatchView> for admin::GetBatchResourcesResponse {
    fn from(b: BatchView) -> Self {
        Self {
            state: b.state,
            explanation_json: b.explanation_json,
            last_write_unix: b.last_write_unix,
            last_write_reason: b.last_write_reason,
        }
    }
}

impl Views {
    pub fn new(metrics_on: bool) -> Self {
        Self {
            metrics_on,
            metrics: OnceLock::new(),
            engine: OnceLock::new(),
            eviction: OnceLock::new(),
            cluster: OnceLock::new(),
        }
    }

    /// The cluster side, from now on.
    pub fn set_cluster(&self, c: Arc<dyn ClusterView>) {
        let _ = self.cluster.set(c);
    }

    /// The cluster side (`None`: no cluster).
    pub fn cluster(&self) -> Option<&Arc<dyn ClusterView>> {
        self.cluster.get()
    }

    pub fn set_eviction(&self, e: Arc<crate::eviction::EvictionView>) {
        let _ = self.eviction.set(e);
    }

    /// The eviction loop's view (`None`: eviction off).
    pub fn eviction(&self) -> Option<&Arc<crate::eviction::EvictionView>> {
        self.eviction.get()
    }

    pub fn set_metrics(&self, m: Arc<qoslet_metrics::service::Metrics>) {
        let _ = self.metrics.set(m);
    }

    pub fn set_engine(&self, e: Arc<qoslet_qos_engine::runner::Shared>) {
        let _ = self.engine.set(e);
    }

    pub fn metrics(&self) -> Option<&Arc<qoslet_metrics::service::Metrics>> {
        self.metrics.get()
    }

    pub fn engine(&self) -> Option<&Arc<qoslet_qos_engine::runner::Shared>> {
        self.engine.get()
    }

    fn metrics_or_why(&self) -> Result<Arc<qoslet_metrics::service::Metrics>, QosletError> {
        if !self.metrics_on {
            return Err(metrics_off());
        }
        self.metrics.get().cloned().ok_or_else(|| {
            QosletError::Off(
                "metrics are not collected (starting, or no cgroups on this host)".into(),
            )
        })
    }
}

/// The answer of a metrics query, each cache error with its code.
fn answer_error(e: qoslet_metrics::service::AnswerError) -> QosletError {
    use qoslet_metrics::service::AnswerError as A;
    use qoslet_metrics::QueryError as Q;
    match e {
        A::BadRequest(m) => QosletError::BadRequest(m),
        A::Query(Q::BadWindow) => {
            QosletError::BadRequest("window_seconds must be 1 to 86400".into())
        }
        A::Query(e @ Q::NoQuantiles(_)) => QosletError::Unanswerable(e.to_string()),
        A::Query(e) => QosletError::NotFound(e.to_string()),
    }
}

/// The admin service implementation.
pub struct AdminService {
    pub(crate) views: Arc<Views>,
    pub(crate) store: Store,
    pub(crate) front: FrontEnds,
    pub(crate) started: Instant,
    pub(crate) state_dir: String,
    pub(crate) hub: Arc<crate::hub::PolicyHub>,
}

impl AdminService {
    /// The policy hub's sources as they stand.
    fn policy_sources(&self) -> (String, Vec<admin::PolicySource>) {
        let p = self.hub.current();
        let sources = p
            .sources
            .iter()
            .map(|s| admin::PolicySource {
                source: s.source.clone(),
                state: s.state.clone(),
                error: s.error.clone(),
                in_force: s.in_force,
            })
            .collect();
        (p.source.to_string(), sources)
    }
}

#[tonic::async_trait]
impl Admin for AdminService {
    async fn get_status(
        &self,
        _: Request<admin::GetStatusRequest>,
    ) -> Result<Response<admin::GetStatusResponse>, Status> {
        let front = self.front.get();
        let backend = match &front {
            Some(f) => Some(f.runtime().await),
            None => None,
        };
        let (pods, containers) = self.store.counts();
        let mut counters = admin::Counters {
            pods: pods as u64,
            containers: containers as u64,
            ..Default::default()
        };
        if let Some(f) = &front {
            f.counters(&mut counters);
        }
        let (policy_source, policy_sources) = self.policy_sources();
        Ok(Response::new(admin::GetStatusResponse {
            policy_source,
            policy_sources,
            version: VERSION.into(),
            // the front end that serves the runtime's calls ("none": the agent alone)
            mode: front.as_ref().map_or("none", |f| f.mode()).into(),
            backend,
            uptime_seconds: self.started.elapsed().as_secs(),
            listen: front.as_ref().map(|f| f.listen()).unwrap_or_default(),
            state_dir: self.state_dir.clone(),
            counters: Some(counters),
            cluster: self
                .views
                .cluster()
                .map(|c| c.watches())
                .unwrap_or_default()
                .into_iter()
                .map(|(watch, state, objects)| admin::ClusterWatch {
                    watch: watch.into(),
                    state: state.into(),
                    objects,
                })
                .collect(),
            batch_resources: self
                .views
                .cluster()
                .and_then(|c| c.batch())
                .map(|b| batch_line(&b))
                .unwrap_or_default(),
        }))
    }

    async fn query_metrics(
        &self,
        req: Request<admin::QueryMetricsRequest>,
    ) -> Result<Response<admin::QueryMetricsResponse>, Status> {
        let m = self.views.metrics_or_why()?;
        // the cache's lock and decoding stay off the thread that relays CRI
        let req = req.into_inner();
        tokio::task::spawn_blocking(move || m.query(req))
            .await
            .map_err(|_| QosletError::Internal("the metrics query failed (panicked)".into()))?
            .map(Response::new)
            .map_err(|e| answer_error(e).into())
    }

    async fn node_summary(
        &self,
        _: Request<admin::NodeSummaryRequest>,
    ) -> Result<Response<admin::NodeSummaryResponse>, Status> {
        if !self.views.metrics_on {
            return Err(metrics_off().into());
        }
        // starting: an empty summary, as before the first tick
        Ok(Response::new(
            self.views
                .metrics()
                .map(|m| m.node_summary())
                .unwrap_or_default(),
        ))
    }

    async fn get_plan(
        &self,
        req: Request<admin::GetPlanRequest>,
    ) -> Result<Response<admin::GetPlanResponse>, Status> {
        if !self.views.metrics_on {
            return Err(QosletError::Off(
                "the QoS engine needs metrics, and metrics are off in this qoslet".into(),
            )
            .into());
        }
        match self.views.engine() {
            Some(e) => {
                let mut plan = e.plan(&req.into_inner());
                // the sources as they stand now (the plan is the last tick's)
                (plan.policy_source, plan.policy_sources) = self.policy_sources();
                Ok(Response::new(plan))
            }
            None => Err(QosletError::Off(
                "the QoS engine is not running (qosEngine.enable false, metrics off, or no cgroups)"
                    .into(),
            )
            .into()),
        }
    }

    async fn get_batch_resources(
        &self,
        _req: Request<admin::GetBatchResourcesRequest>,
    ) -> Result<Response<admin::GetBatchResourcesResponse>, Status> {
        match self.views.cluster().and_then(|c| c.batch()) {
            Some(b) => Ok(Response::new(b.into())),
            None => Err(QosletError::Off(
                "batch resources are off (kubernetes.batchResources, with kubernetes.enable)"
                    .into(),
            )
            .into()),
        }
    }

    async fn list_evictions(
        &self,
        req: Request<admin::ListEvictionsRequest>,
    ) -> Result<Response<admin::ListEvictionsResponse>, Status> {
        let Some(v) = self.views.eviction() else {
            return Ok(Response::new(admin::ListEvictionsResponse::default()));
        };
        let req = req.into_inner();
        Ok(Response::new(v.list(&req.namespace, &req.name)))
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

/// Serves the admin API on `listener` until `shutdown` turns true.
pub(crate) async fn serve(
    listener: UnixListener,
    admin: AdminService,
    mut shutdown: watch::Receiver<bool>,
) {
    let (health_reporter, health) = tonic_health::server::health_reporter();
    health_reporter
        .set_serving::<admin::admin_server::AdminServer<AdminService>>()
        .await;
    let v1 = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(qoslet_proto::ADMIN_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()
        .expect("admin descriptors are valid");
    let v1alpha = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(qoslet_proto::ADMIN_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1alpha()
        .expect("admin descriptors are valid");
    let incoming = tokio_stream::StreamExt::map(
        tokio_stream::wrappers::UnixListenerStream::new(listener),
        |r| r.map(qoslet_wire::AuthorityFix::new),
    );
    let r = tonic::transport::Server::builder()
        // the header limits of the CRI server (qoslet_wire::limits), so the
        // :authority filter in front of it judges what h2 will take; and a
        // malformed request's stand-in is reset however many come
        .http2_max_header_list_size(qoslet_wire::limits::MAX_HEADER_LIST as u32)
        .http2_max_local_error_reset_streams(None)
        .add_service(admin::admin_server::AdminServer::new(admin))
        .add_service(health)
        .add_service(v1)
        .add_service(v1alpha)
        .serve_with_incoming_shutdown(incoming, async move {
            let _ = shutdown.wait_for(|v| *v).await;
        })
        .await;
    if let Err(e) = r {
        warn!(error = %e, "admin server failed");
    }
}

/// The counters every front end adds to the status, read from atomics.
pub fn load(a: &std::sync::atomic::AtomicU64) -> u64 {
    a.load(Ordering::Relaxed)
}
