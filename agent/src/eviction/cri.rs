//! The CRI evictor: stops an evicted pod at the runtime, as kubelet's kill
//! does, in proxy and NRI mode alike: each running container with the pod's
//! grace period (StopContainer's timeout), then the sandbox. kubelet sees a
//! dead sandbox and recreates it; admission keeps a BE pod off the node while
//! the pressure lasts.

use std::path::PathBuf;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use qoslet_eviction::evictor::{BoxFuture, EvictError, EvictRequest, Evicted, Evictor};
use qoslet_proto::cri;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};

type Client = cri::runtime_service_client::RuntimeServiceClient<Channel>;

/// Evicts through the runtime's CRI socket.
pub struct CriEvictor {
    client: Client,
    socket: PathBuf,
}

impl CriEvictor {
    /// A client of the runtime at `socket` (connected on first use).
    pub fn new(socket: PathBuf) -> Self {
        let p = socket.clone();
        let channel = Endpoint::from_static("http://localhost")
            .connect_timeout(Duration::from_secs(2))
            .connect_with_connector_lazy(tower::service_fn(move |_: Uri| {
                let p = p.clone();
                async move { UnixStream::connect(&p).await.map(TokioIo::new) }
            }));
        Self {
            client: Client::new(channel),
            socket,
        }
    }

    /// Stops every running container with the grace period (all of them,
    /// to the end: an error or a slow one never cancels the others), then
    /// the sandbox, which force-stops whatever is left.
    async fn stop(client: Client, req: EvictRequest) -> Result<Evicted, tonic::Status> {
        let mut c = client.clone();
        let listed = c
            .list_containers(cri::ListContainersRequest {
                filter: Some(cri::ContainerFilter {
                    pod_sandbox_id: req.sandbox_id.clone(),
                    ..Default::default()
                }),
            })
            .await;
        let grace = req.grace_seconds.max(0);
        let mut stops = tokio::task::JoinSet::new();
        for ctr in listed
            .map(|l| l.into_inner().containers)
            .unwrap_or_default()
        {
            if ctr.state != cri::ContainerState::ContainerRunning as i32 {
                continue;
            }
            let mut c = client.clone();
            stops.spawn(async move {
                let r = c
                    .stop_container(cri::StopContainerRequest {
                        container_id: ctr.id.clone(),
                        timeout: grace,
                    })
                    .await;
                (ctr.id, r)
            });
        }
        while let Some(r) = stops.join_next().await {
            if let Ok((id, Err(st))) = r {
                if st.code() != tonic::Code::NotFound {
                    tracing::warn!(container = %id, error = %st.message(), "StopContainer failed; StopPodSandbox follows");
                }
            }
        }
        match c
            .stop_pod_sandbox(cri::StopPodSandboxRequest {
                pod_sandbox_id: req.sandbox_id.clone(),
            })
            .await
        {
            Ok(_) => Ok(Evicted::Stopped),
            Err(st) if st.code() == tonic::Code::NotFound => Ok(Evicted::Gone),
            Err(st) => Err(st),
        }
    }
}

impl Evictor for CriEvictor {
    fn name(&self) -> &'static str {
        "cri"
    }

    fn evict<'a>(&'a self, req: &'a EvictRequest) -> BoxFuture<'a, Result<Evicted, EvictError>> {
        Box::pin(async move {
            // the stop runs to its end on its own task: past the deadline it
            // is reported as still stopping, never cancelled halfway
            let deadline = Duration::from_secs(req.grace_seconds.max(0) as u64 + 10);
            let mut task = tokio::spawn(Self::stop(self.client.clone(), req.clone()));
            match tokio::time::timeout(deadline, &mut task).await {
                Ok(Ok(Ok(e))) => Ok(e),
                Ok(Ok(Err(st))) => Err(EvictError {
                    pod: format!("{}/{}", req.namespace, req.name),
                    reason: format!(
                        "{} ({}): {}",
                        self.socket.display(),
                        st.code(),
                        st.message()
                    ),
                }),
                Ok(Err(_)) => Err(EvictError {
                    pod: format!("{}/{}", req.namespace, req.name),
                    reason: "the stop failed (panicked)".into(),
                }),
                Err(_) => Ok(Evicted::Stopping),
            }
        })
    }
}
