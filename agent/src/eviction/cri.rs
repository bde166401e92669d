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

    async fn stop(&self, req: &EvictRequest) -> Result<Evicted, tonic::Status> {
        let mut c = self.client.clone();
        let listed = c
            .list_containers(cri::ListContainersRequest {
                filter: Some(cri::ContainerFilter {
                    pod_sandbox_id: req.sandbox_id.clone(),
                    ..Default::default()
                }),
            })
            .await?
            .into_inner();
        let grace = req.grace_seconds.max(0);
        let mut stops = tokio::task::JoinSet::new();
        for ctr in listed.containers {
            if ctr.state != cri::ContainerState::ContainerRunning as i32 {
                continue;
            }
            let mut c = self.client.clone();
            stops.spawn(async move {
                c.stop_container(cri::StopContainerRequest {
                    container_id: ctr.id,
                    timeout: grace,
                })
                .await
            });
        }
        while let Some(r) = stops.join_next().await {
            if let Ok(Err(st)) = r {
                if st.code() != tonic::Code::NotFound {
                    return Err(st);
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
            let deadline = Duration::from_secs(req.grace_seconds.max(0) as u64 + 10);
            match tokio::time::timeout(deadline, self.stop(req)).await {
                Ok(Ok(e)) => Ok(e),
                Ok(Err(st)) => Err(EvictError {
                    pod: format!("{}/{}", req.namespace, req.name),
                    reason: format!(
                        "{} ({}): {}",
                        self.socket.display(),
                        st.code(),
                        st.message()
                    ),
                }),
                Err(_) => Err(EvictError {
                    pod: format!("{}/{}", req.namespace, req.name),
                    reason: format!("the runtime did not stop it within {deadline:?}"),
                }),
            }
        })
    }
}
